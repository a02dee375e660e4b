"""Hub plumbing: what save_pretrained writes, loading with trust_remote_code where posformers is not installed, and
push_to_hub (model card included) through a local Hub-compatible server (helpers/hub_server.py).

Anything that talks to the Hub or must not see posformers runs in a child `python -I` (helpers.run_python):
huggingface_hub reads HF_ENDPOINT once, at import, so a child with its own environment is the robust way to point it at
the local server. Each child is shared by the tests of one fixture, so a failure names the exact property that broke.
"""

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
import transformers
from helpers import python_env, run_python
from helpers.modeling import assert_same_outputs, tensor_outputs, tiny_config
from helpers.remote import assert_loaded_remotely, assert_no_posformers, auto_heads, load_remote
from huggingface_hub import ModelCard
from safetensors import safe_open

import posformers
from posformers.configuration_roformer import AUTO_MAP
from posformers.hub_methods import HubMethods
from posformers.integrations import hub

HEADS = auto_heads(AUTO_MAP)
EXPECTED_PIPELINE_TAGS = {
    "AutoModel": "feature-extraction",
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForCausalLM": "text-generation",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
    "AutoModelForMultipleChoice": "multiple-choice",
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")

REPO_MLM = "posformers-test/tiny-roformer-mlm"
REPO_CLS = "posformers-test/tiny-roformer-cls"
REPO_DERIVED = "posformers-test/tiny-roformer-mlm-derived"
REPO_EDIT = "posformers-test/tiny-roformer-edited"
REPO_OPTIONS = "posformers-test/tiny-roformer-options"
REPO_NO_BASE = "posformers-test/tiny-roformer-no-base"
EXPLICIT_BASE = "posformers-test/some-base"
# The other two models go through the same push and load: (Auto class, repo, class, config fields, pipeline tag).
OTHER_MODELS = {
    "deberta": ("AutoModelForMaskedLM", "posformers-test/tiny-deberta-mlm", posformers.DebertaForMaskedLM,
                {"conv_kernel_size": 3}, "fill-mask"),
    "littlebird": ("AutoModelForQuestionAnswering", "posformers-test/tiny-littlebird-qa",
                   posformers.LittleBirdForQuestionAnswering, {}, "question-answering"),
}  # fmt: skip

USER_BODY = "\n# My RoFormer\n\nHand-written notes the next push must keep.\n"
PARTIAL_README = "---\nlicense: mit\ntags:\n- user-tag\n---\n" + USER_BODY
FULL_README = (
    "---\n"
    "# comments and layout of a complete card survive a push untouched\n"
    "library_name: transformers\n"
    "license: mit\n"
    "pipeline_tag: fill-mask\n"
    "tags: [posformers, roformer, user-tag]\n"
    "---\n" + USER_BODY
)
LOCAL_README = "# My classifier\n\nWritten next to the weights before save_pretrained(push_to_hub=True).\n"
STALE_FILE = "notes.txt"


def tiny_model(auto_name: str, seed: int = 0):
    config = tiny_config(posformers.RoFormerConfig, is_decoder=auto_name == "AutoModelForCausalLM")
    torch.manual_seed(seed)
    return getattr(posformers, HEADS[auto_name])(config).eval()


def tiny_inputs(auto_name: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    shape = (2, 3, 7) if auto_name == "AutoModelForMultipleChoice" else (2, 7)
    input_ids = torch.randint(1, 99, shape, generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, ..., 5:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[..., 4:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


@pytest.fixture(scope="module")
def scratch():
    """A temporary directory for a module's fixtures, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="posformers-test-hub-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tmp_dir():
    path = Path(tempfile.mkdtemp(prefix="posformers-test-hub-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------------
# save_pretrained and local loading
# ---------------------------------------------------------------------------------------------------------------------


def test_save_pretrained_writes_safetensors_config_and_code(tmp_dir):
    model = tiny_model("AutoModelForMaskedLM")
    model.save_pretrained(tmp_dir)

    files = {path.name for path in tmp_dir.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_roformer.py", "modeling_roformer.py"} <= files
    assert not [name for name in files if name.endswith(PICKLE_SUFFIXES)], files
    state = model.state_dict()
    with safe_open(tmp_dir / "model.safetensors", framework="pt") as weights:
        names = weights.keys()
        assert names, "no tensors saved"
        for key in names:
            assert torch.equal(weights.get_tensor(key), state[key]), key

    config = json.loads((tmp_dir / "config.json").read_text())
    assert config["model_type"] == "posformers-roformer"
    assert config["architectures"] == ["RoFormerForMaskedLM"]
    assert config["auto_map"] == AUTO_MAP
    assert set(config["auto_map"]) == {"AutoConfig", *EXPECTED_PIPELINE_TAGS}
    # The copied code is the package's own, so what trust_remote_code runs is what was tested.
    for name in ("configuration_roformer.py", "modeling_roformer.py"):
        assert (tmp_dir / name).read_bytes() == (Path(posformers.__file__).parent / name).read_bytes()
    assert "import posformers" not in (tmp_dir / "modeling_roformer.py").read_text()


def test_save_pretrained_without_push_writes_no_card(tmp_dir):
    tiny_model("AutoModel").save_pretrained(tmp_dir, license="mit")  # card options are accepted and ignored
    assert not (tmp_dir / "README.md").exists()


@pytest.mark.parametrize("auto_name", sorted(HEADS))
def test_auto_class_loads_posformers_class_in_process(auto_name, tmp_dir):
    model = tiny_model(auto_name)
    model.save_pretrained(tmp_dir)
    loaded = getattr(transformers, auto_name).from_pretrained(tmp_dir)
    assert type(loaded) is type(model)
    inputs = tiny_inputs(auto_name)
    assert_same_outputs(tensor_outputs(loaded, inputs), tensor_outputs(model, inputs))


def test_auto_model_loads_posformers_base_model_from_head_checkpoint(tmp_dir):
    tiny_model("AutoModelForMaskedLM").save_pretrained(tmp_dir)
    assert type(transformers.AutoModel.from_pretrained(tmp_dir)) is posformers.RoFormerModel


# ---------------------------------------------------------------------------------------------------------------------
# Model card pieces
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("auto_name", sorted(HEADS))
def test_card_metadata_per_head(auto_name):
    model = tiny_model(auto_name)
    metadata = hub.card_metadata(model)
    assert metadata == {
        "library_name": "transformers",
        "license": "apache-2.0",
        "pipeline_tag": EXPECTED_PIPELINE_TAGS[auto_name],
        "tags": ["posformers", "roformer"],
    }
    assert list(metadata) == ["library_name", "license", "pipeline_tag", "tags"]


def test_card_metadata_options_and_base_model_inference(tmp_dir):
    model = tiny_model("AutoModelForMaskedLM")
    metadata = hub.card_metadata(model, license="mit", base_model="org/base", tags=["extra", "posformers"])
    assert metadata["license"] == "mit"
    assert metadata["base_model"] == "org/base"
    assert metadata["tags"] == ["posformers", "roformer", "extra"]

    model.config._name_or_path = "junnyu/roformer_chinese_base"  # as after from_pretrained(repo id)
    assert hub.card_metadata(model)["base_model"] == "junnyu/roformer_chinese_base"
    assert "base_model" not in hub.card_metadata(model, base_model=False)
    assert "base_model" not in hub.card_metadata(model, "junnyu/roformer_chinese_base")  # pushing back to itself
    for local in (str(tmp_dir), "", "not a repo/x y", "a/b/c"):
        model.config._name_or_path = local
        assert "base_model" not in hub.card_metadata(model), local


def test_model_card_is_valid_and_tells_how_to_load():
    card = hub.model_card(tiny_model("AutoModelForSequenceClassification"), "org/tiny-cls")
    parsed = ModelCard(str(card))
    assert parsed.data.to_dict() == {
        "library_name": "transformers",
        "license": "apache-2.0",
        "pipeline_tag": "text-classification",
        "tags": ["posformers", "roformer"],
    }
    assert 'AutoModelForSequenceClassification.from_pretrained("org/tiny-cls", trust_remote_code=True)' in card.text
    assert "| hidden_size | `32` |" in card.text


def test_card_usage_loads_model_and_tokenizer_without_posformers_and_without_a_prompt(tmp_path):
    """The card's first block, run where posformers cannot be imported and stdin is closed: the model and its
    tokenizer load, and transformers neither asks (a bare AutoTokenizer asks whether to run the model's code, which
    config.json names, and hangs a notebook) nor warns about the model type."""
    import re

    folder = tmp_path / "model"
    model = tiny_model("AutoModelForSequenceClassification")
    model.save_pretrained(folder)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "tiny", "model"]) + "\n")
    transformers.BertTokenizer(str(vocab)).save_pretrained(folder)
    card = str(hub.model_card(model))
    usage = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace("path/to/model", str(folder))
    result = run_python(
        """
        import io, logging
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_warning()
        said = io.StringIO()
        transformers_logging.add_handler(logging.StreamHandler(said))
        captured, real_stdout = io.StringIO(), sys.stdout
        sys.stdout = captured  # input() writes its question here
        exec(ARGS["usage"])
        sys.stdout = real_stdout
        print(json.dumps({
            "posformers": POSFORMERS_FOUND, "model": type(model).__name__, "tokenizer": type(tokenizer).__name__,
            "ids": tokenizer("a tiny model")["input_ids"], "printed": captured.getvalue() + said.getvalue(),
        }))
        """,
        {"usage": usage},
        env=python_env(tmp_path / "hf-home"),
        cwd=tmp_path,
        without_posformers=True,
    )
    assert not result["posformers"]
    assert (result["model"], result["tokenizer"]) == ("RoFormerForSequenceClassification", "BertTokenizer")
    assert result["ids"] == [2, 5, 6, 7, 3]
    assert result["printed"] == "", result["printed"]


def test_merge_card_metadata_keeps_values_and_text():
    metadata = hub.card_metadata(tiny_model("AutoModelForMaskedLM"))
    merged = hub.merge_card_metadata(PARTIAL_README, metadata)
    card = ModelCard(merged)
    assert card.text == USER_BODY
    assert card.data.license == "mit"
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "fill-mask"
    assert card.data.tags == ["user-tag", "posformers", "roformer"]

    assert hub.merge_card_metadata(FULL_README, metadata) == FULL_README  # nothing missing: byte for byte
    no_yaml = hub.merge_card_metadata("Just text.\n", metadata)
    assert ModelCard(no_yaml).text == "Just text.\n"
    assert ModelCard(no_yaml).data.pipeline_tag == "fill-mask"


def test_every_base_class_names_the_card_mixin_in_its_class_line():
    for base in (
        posformers.RoFormerPreTrainedModel,
        posformers.DebertaPreTrainedModel,
        posformers.LittleBirdPreTrainedModel,
    ):
        assert HubMethods in base.__bases__, base.__bases__
    assert not issubclass(transformers.PreTrainedModel, HubMethods)


def test_without_posformers_the_card_mixin_is_transformers_push(monkeypatch, tmp_dir):
    """Where posformers cannot be imported (remote code), both methods are transformers' own, arguments unchanged."""
    monkeypatch.setattr(posformers.hub_methods, "card_code", lambda: None)
    calls = []
    monkeypatch.setattr(transformers.PreTrainedModel, "push_to_hub", lambda self, *args, **kwargs: calls.append(kwargs))
    model = tiny_model("AutoModel")
    model.push_to_hub("org/x", license="mit")
    assert calls == [{"license": "mit"}]
    model.save_pretrained(tmp_dir)
    assert (tmp_dir / "model.safetensors").is_file() and not (tmp_dir / "README.md").exists()


def test_save_pretrained_push_uploads_only_from_the_saving_rank(tmp_dir):
    # Not the main process: nothing is written, and nothing is uploaded (an upload would fail: tests run offline).
    tiny_model("AutoModel").save_pretrained(tmp_dir, is_main_process=False, push_to_hub=True, repo_id="org/x")
    assert list(tmp_dir.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------------
# The local Hub itself
# ---------------------------------------------------------------------------------------------------------------------


def _request(url: str, method: str = "GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_hub_server_resolve_headers_and_errors(hub_server):
    repo = "posformers-test/server-check"
    hub_server.create_repo(repo)
    commit = hub_server.write_file(repo, "dir/file.txt", b"hello")
    url = f"{hub_server.url}/{repo}/resolve/main/dir/file.txt"

    status, headers, body = _request(url, "HEAD")
    assert (status, body) == (200, b"")
    assert headers["X-Repo-Commit"] == commit
    assert headers["Content-Length"] == "5"
    assert headers["ETag"].strip('"') == "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0"  # git hash-object of "hello"
    assert _request(url)[2] == b"hello"
    assert _request(f"{hub_server.url}/{repo}/resolve/{commit}/dir/file.txt")[2] == b"hello"

    status, headers, _ = _request(f"{hub_server.url}/{repo}/resolve/main/missing.txt", "HEAD")
    assert (status, headers["X-Error-Code"], headers["X-Repo-Commit"]) == (404, "EntryNotFound", commit)
    status, headers, _ = _request(f"{hub_server.url}/{repo}/resolve/no-such-branch/dir/file.txt", "HEAD")
    assert (status, headers["X-Error-Code"]) == (404, "RevisionNotFound")
    status, headers, _ = _request(f"{hub_server.url}/posformers-test/no-such-repo/resolve/main/x", "HEAD")
    assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound")

    status, _, body = _request(f"{hub_server.url}/api/models/{repo}")
    info = json.loads(body)
    assert (status, info["id"], info["sha"]) == (200, repo, commit)
    assert sorted(s["rfilename"] for s in info["siblings"]) == [".gitattributes", "dir/file.txt"]


# ---------------------------------------------------------------------------------------------------------------------
# push_to_hub through the local Hub
# ---------------------------------------------------------------------------------------------------------------------

# Pushes as a posformers user would, in a child with HF_ENDPOINT set to the local Hub. Prints the commit of each step.
CHILD_PUSH = """
import torch
import posformers
import transformers
from huggingface_hub import HfApi
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

api = HfApi()
steps = {}
mlm = AutoModelForMaskedLM.from_pretrained(ARGS["mlm_dir"])
steps["push_mlm"] = mlm.push_to_hub(ARGS["repo_mlm"]).oid
steps["push_branch"] = mlm.push_to_hub(ARGS["repo_mlm"], revision="dev", commit_message="Push to a new branch").oid

cls = AutoModelForSequenceClassification.from_pretrained(ARGS["cls_dir"])
cls.save_pretrained(
    ARGS["cls_push_dir"], push_to_hub=True, repo_id=ARGS["repo_cls"], license="mit", base_model=ARGS["base"]
)

derived = AutoModelForMaskedLM.from_pretrained(ARGS["repo_mlm"])  # from the Hub, posformers imported
steps["derived_class"] = f"{type(derived).__module__}.{type(derived).__name__}"
steps["push_derived"] = derived.push_to_hub(ARGS["repo_derived"], tags=["my-tag"]).oid
options = {"license": "cc-by-4.0", "base_model": ARGS["base"], "tags": "one-tag"}  # overrides what derived infers
steps["push_options"] = derived.push_to_hub(ARGS["repo_options"], **options).oid
steps["push_no_base"] = derived.push_to_hub(ARGS["repo_no_base"], base_model=False).oid


def retrain(model):
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(0.5)


def user_writes_card(text, message):
    return api.upload_file(
        path_or_fileobj=text.encode(), path_in_repo="README.md", repo_id=ARGS["repo_edit"], commit_message=message
    ).oid


edit = ARGS["repo_edit"]
steps["edit_push"] = mlm.push_to_hub(edit).oid
steps["edit_user_partial"] = user_writes_card(ARGS["partial_readme"], "Write the card")
retrain(mlm)
steps["edit_repush_partial"] = mlm.push_to_hub(edit, commit_message="Retrain").oid
steps["edit_user_full"] = user_writes_card(ARGS["full_readme"], "Complete the card")
retrain(mlm)
steps["edit_repush_full"] = mlm.push_to_hub(edit, commit_message="Retrain again").oid
steps["edit_overwrite"] = mlm.push_to_hub(edit, overwrite_model_card=True, license="mit").oid

steps["others"] = {}
for folder, repo, auto_name in ARGS["others"]:
    model = getattr(transformers, auto_name).from_pretrained(folder)
    model.push_to_hub(repo)
    steps["others"][repo] = type(model).__name__
print(json.dumps(steps))
"""


@pytest.fixture(scope="module")
def pushed(hub_server, scratch):
    """Push tiny models to the local Hub, then load two RoFormers and a model of each other kind back in a child that
    cannot import posformers."""
    work = scratch / "push"
    work.mkdir()
    mlm, cls = tiny_model("AutoModelForMaskedLM", seed=1), tiny_model("AutoModelForSequenceClassification", seed=2)
    mlm.save_pretrained(work / "mlm")
    cls.save_pretrained(work / "cls")
    heads = {
        "mlm": ("AutoModelForMaskedLM", REPO_MLM, mlm),
        "cls": ("AutoModelForSequenceClassification", REPO_CLS, cls),
    }
    for name, (auto_name, repo, model_class, fields, _) in OTHER_MODELS.items():
        torch.manual_seed(3)
        heads[name] = (auto_name, repo, model_class(tiny_config(model_class.config_class, **fields)).eval())
        heads[name][2].save_pretrained(work / name)
    (work / "cls-push").mkdir()
    (work / "cls-push" / "README.md").write_text(LOCAL_README)
    (work / "cls-push" / STALE_FILE).write_text("Left in the folder by an earlier job; not part of this save.\n")
    args = {
        "mlm_dir": str(work / "mlm"),
        "cls_dir": str(work / "cls"),
        "cls_push_dir": str(work / "cls-push"),
        "repo_mlm": REPO_MLM,
        "repo_cls": REPO_CLS,
        "repo_derived": REPO_DERIVED,
        "repo_edit": REPO_EDIT,
        "repo_options": REPO_OPTIONS,
        "repo_no_base": REPO_NO_BASE,
        "base": EXPLICIT_BASE,
        "partial_readme": PARTIAL_README,
        "full_readme": FULL_README,
        "others": [[str(work / name), heads[name][1], heads[name][0]] for name in OTHER_MODELS],
    }
    steps = run_python(CHILD_PUSH, args, env=python_env(work / "hf-home-push", endpoint=hub_server.url), cwd=work)

    jobs = {name: (auto_name, repo, tiny_inputs(auto_name)) for name, (auto_name, repo, _) in heads.items()}
    requests_before = len(hub_server.requests)
    loaded = load_remote(jobs, env=python_env(work / "hf-home-load", endpoint=hub_server.url), cwd=work)
    expected = {
        name: (auto_name, tensor_outputs(model, jobs[name][2])) for name, (auto_name, _, model) in heads.items()
    }
    return {
        "steps": steps,
        "loaded": loaded,
        "expected": expected,
        "load_requests": hub_server.requests[requests_before:],
    }


def readme(hub_server, repo_id: str, revision: str = "main") -> ModelCard:
    content = hub_server.read_file(repo_id, "README.md", revision)
    assert content is not None, f"no README.md in {repo_id}@{revision}"
    return ModelCard(content.decode())


@pytest.mark.slow
def test_push_uploads_weights_config_code_and_card(pushed, hub_server):
    for repo in (REPO_MLM, REPO_CLS, REPO_DERIVED):
        files = set(hub_server.list_files(repo))
        assert {
            "README.md",
            "config.json",
            "model.safetensors",
            "configuration_roformer.py",
            "modeling_roformer.py",
        } <= files, repo
        assert not [name for name in files if name.endswith(PICKLE_SUFFIXES)], repo
        assert json.loads(hub_server.read_file(repo, "config.json"))["auto_map"] == AUTO_MAP


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlm", "cls"])
def test_pushed_model_loads_from_hub_without_posformers(pushed, name):
    assert_no_posformers(pushed["loaded"])
    auto_name, expected = pushed["expected"][name]
    assert_loaded_remotely(pushed["loaded"], name, HEADS[auto_name], expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHER_MODELS)
def test_deberta_and_littlebird_push_and_load_from_hub_without_posformers(pushed, hub_server, name):
    _, repo, model_class, _, pipeline_tag = OTHER_MODELS[name]
    assert pushed["steps"]["others"][repo] == model_class.__name__
    files = set(hub_server.list_files(repo))
    assert {"README.md", "config.json", "model.safetensors", f"configuration_{name}.py", f"modeling_{name}.py"} <= files
    auto_map = json.loads(hub_server.read_file(repo, "config.json"))["auto_map"]
    assert auto_map == getattr(posformers, f"configuration_{name}").AUTO_MAP
    card = readme(hub_server, repo).data
    assert card.pipeline_tag == pipeline_tag and card.tags == ["posformers", name]
    assert_no_posformers(pushed["loaded"])
    assert_loaded_remotely(pushed["loaded"], name, model_class.__name__, pushed["expected"][name][1])


@pytest.mark.slow
def test_load_from_hub_downloads_from_the_local_server(pushed):
    downloaded = {path.rsplit("/", 1)[-1] for method, path in pushed["load_requests"] if method == "GET"}
    assert {"config.json", "model.safetensors", "modeling_roformer.py", "configuration_roformer.py"} <= downloaded


@pytest.mark.slow
def test_pushed_model_loads_from_hub_as_posformers_class(pushed):
    assert pushed["steps"]["derived_class"] == "posformers.modeling_roformer.RoFormerForMaskedLM"


@pytest.mark.slow
def test_push_to_hub_writes_model_card(pushed, hub_server):
    card = readme(hub_server, REPO_MLM)
    # The pushed model was loaded from a folder without a model card: nothing says under which licence its weights are.
    assert card.data.to_dict() == {
        "library_name": "transformers",
        "license": "unknown",
        "pipeline_tag": "fill-mask",
        "tags": ["posformers", "roformer"],
    }
    assert f'AutoModelForMaskedLM.from_pretrained("{REPO_MLM}", trust_remote_code=True)' in card.text


@pytest.mark.slow
def test_push_to_new_branch_starts_from_the_default_branch_card(pushed, hub_server):
    assert hub_server.history(REPO_MLM, "dev")[0].oid == pushed["steps"]["push_branch"]
    assert hub_server.read_file(REPO_MLM, "README.md", "dev") == hub_server.read_file(REPO_MLM, "README.md")
    assert hub_server.list_files(REPO_MLM, "dev") == hub_server.list_files(REPO_MLM)


@pytest.mark.slow
def test_save_pretrained_push_keeps_local_card_and_takes_options(pushed, hub_server):
    card = readme(hub_server, REPO_CLS)
    assert card.data.to_dict() == {
        "library_name": "transformers",
        "license": "mit",
        "base_model": EXPLICIT_BASE,
        "pipeline_tag": "text-classification",
        "tags": ["posformers", "roformer"],
    }
    assert card.text == LOCAL_README


@pytest.mark.slow
def test_push_infers_base_model_and_adds_tags(pushed, hub_server):
    card = readme(hub_server, REPO_DERIVED)
    assert card.data.base_model == REPO_MLM  # the repo the weights were loaded from
    assert card.data.tags == ["posformers", "roformer", "my-tag"]


@pytest.mark.slow
def test_push_to_hub_card_options_reach_the_pushed_card(pushed, hub_server):
    assert readme(hub_server, REPO_OPTIONS).data.to_dict() == {
        "library_name": "transformers",
        "license": "cc-by-4.0",
        "base_model": EXPLICIT_BASE,
        "pipeline_tag": "fill-mask",
        "tags": ["posformers", "roformer", "one-tag"],
    }
    card = readme(hub_server, REPO_NO_BASE)
    assert "base_model" not in card.data.to_dict()
    assert "Base model:" not in card.text


@pytest.mark.slow
@pytest.mark.parametrize("repo_id", [REPO_MLM, REPO_CLS, REPO_OPTIONS])
def test_push_is_one_commit_with_weights_and_card(pushed, hub_server, repo_id):
    history = hub_server.history(repo_id)
    assert [commit.title for commit in history][1:] == ["initial commit"]
    assert {"README.md", "model.safetensors", "config.json"} <= set(history[0].files)
    if repo_id == REPO_MLM:
        assert history[0].oid == pushed["steps"]["push_mlm"]  # what push_to_hub returned


@pytest.mark.slow
def test_save_pretrained_push_uploads_only_what_it_wrote(pushed, hub_server):
    assert STALE_FILE not in hub_server.list_files(REPO_CLS)


@pytest.mark.slow
def test_repush_keeps_user_card_and_adds_missing_metadata(pushed, hub_server):
    steps = pushed["steps"]
    card = readme(hub_server, REPO_EDIT, steps["edit_repush_partial"])
    assert card.text == USER_BODY
    assert card.data.license == "mit"  # the user's value wins over the default
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "fill-mask"
    assert card.data.tags == ["user-tag", "posformers", "roformer"]
    weights = [
        hub_server.read_file(REPO_EDIT, "model.safetensors", steps[s]) for s in ("edit_push", "edit_repush_partial")
    ]
    assert weights[0] != weights[1], "the re-push did not upload the new weights"


@pytest.mark.slow
def test_repush_leaves_complete_user_card_byte_for_byte(pushed, hub_server):
    steps = pushed["steps"]
    assert hub_server.read_file(REPO_EDIT, "README.md", steps["edit_repush_full"]).decode() == FULL_README
    before, after = (
        hub_server.read_file(REPO_EDIT, "model.safetensors", steps[s]) for s in ("edit_user_full", "edit_repush_full")
    )
    assert before != after, "the re-push did not upload the new weights"


@pytest.mark.slow
def test_overwrite_model_card_replaces_user_card(pushed, hub_server):
    card = readme(hub_server, REPO_EDIT, pushed["steps"]["edit_overwrite"])
    assert "Hand-written notes" not in card.text
    assert "## Usage" in card.text
    assert card.data.license == "mit"
    assert card.data.tags == ["posformers", "roformer"]
    titles = [commit.title for commit in hub_server.history(REPO_EDIT)]
    assert titles[:5] == [
        "Upload RoFormerForMaskedLM",
        "Retrain again",
        "Complete the card",
        "Retrain",
        "Write the card",
    ]
