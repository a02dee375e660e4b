"""The drop-in entry points: `posformers.enable()` (transformers' Auto classes build posformers' models for
transformers' DeBERTa, DeBERTa-v2 and RoFormer checkpoints) and `posformers.optimize(model)` (a model already built
runs on posformers, in place). The reference is transformers' own class on the same weights, always."""

from __future__ import annotations

import json
import logging

import peft
import pytest
import torch
import transformers
from helpers.modeling import max_diff, packing_calls
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

import posformers
from posformers import dropin

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
# transformers' config classes and fields of each architecture the drop-in takes (the shapes of the published
# checkpoints: DeBERTa v1, DeBERTa-v2 with its convolution, DeBERTa-v3, RoFormer)
FAMILIES = {
    "v1": ("Deberta", dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=64)),
    "v2": (
        "DebertaV2",
        dict(
            relative_attention=True,
            pos_att_type="p2c|c2p",
            position_buckets=32,
            max_relative_positions=64,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
            conv_kernel_size=3,
            conv_act="gelu",
        ),
    ),
    "v3": (
        "DebertaV2",
        dict(
            relative_attention=True,
            pos_att_type="p2c|c2p",
            position_buckets=32,
            max_relative_positions=64,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
        ),
    ),
    "roformer": ("RoFormer", dict(type_vocab_size=2)),
}
HEADS = ("Model", "ForSequenceClassification", "ForTokenClassification", "ForMaskedLM", "ForMultipleChoice")
# Sequence-level heads read position 0, a padding token in a left-padded row, whose state transformers computes from
# padding and posformers leaves at zero: their answers on such rows are compared on right-padded batches only.
SEQUENCE_HEADS = ("ForSequenceClassification", "ForMultipleChoice")
PARITY_CASES = [
    pytest.param(family, head, side, id=f"{family}-{head}-{side}")
    for family in FAMILIES
    for head in HEADS
    for side in ("right", "left")
    if not (side == "left" and head in SEQUENCE_HEADS)
    and hasattr(transformers, FAMILIES[family][0] + head)  # transformers' DeBERTa v1 has no multiple choice
]
TOL = 1e-5


def reference(family: str, head: str, **overrides):
    """transformers' class for `family` and `head` with random weights (seeded), in eval mode."""
    prefix, fields = FAMILIES[family]
    if prefix.startswith("Deberta") and head == "ForMaskedLM":
        overrides = {"legacy": False, **overrides}  # the legacy head has its own test
    config = getattr(transformers, f"{prefix}Config")(**{**TINY, **fields, "num_labels": 3, **overrides})
    torch.manual_seed(0)
    return getattr(transformers, prefix + head)(config).eval()


def batch(head: str, padding_side: str = "right", labels: bool = True) -> tuple[dict, torch.Tensor]:
    """Inputs with padding (on `padding_side`) and labels for `head`; the 2D mask of its real tokens."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 99, (3, 17), generator=generator)
    mask = torch.ones_like(input_ids)
    for row, length in ((1, 11), (2, 6)):
        if padding_side == "right":
            mask[row, length:] = 0
        else:
            mask[row, : 17 - length] = 0
    input_ids = input_ids.masked_fill(mask == 0, 0)
    inputs = dict(input_ids=input_ids, attention_mask=mask, token_type_ids=(torch.arange(17) >= 8).long().expand(3, 17))
    if labels and head == "ForSequenceClassification":
        inputs["labels"] = torch.tensor([0, 2, 1])
    elif labels and head in ("ForTokenClassification", "ForMaskedLM"):
        classes = 3 if head == "ForTokenClassification" else 99
        inputs["labels"] = torch.randint(0, classes, (3, 17), generator=generator).masked_fill(mask == 0, -100)
    if head == "ForMultipleChoice":
        inputs = {name: tensor[None].expand(2, *tensor.shape).contiguous() for name, tensor in inputs.items()}
        inputs["labels"] = torch.tensor([1, 2]) if labels else None
        mask = inputs["attention_mask"].reshape(6, 17)
    return inputs, mask


def saved(model, folder) -> str:
    model.save_pretrained(folder)
    return str(folder)


def auto_class(model) -> type:
    """The Auto class transformers maps `model`'s class to."""
    for name in dropin.AUTO_CLASSES:
        if getattr(transformers, name)._model_mapping.get(type(model.config), None) is type(model):
            return getattr(transformers, name)
    raise AssertionError(f"no Auto class maps to {type(model).__name__}")


def per_token(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`tensor`'s rows at real tokens, where posformers and transformers agree (padded positions hold zeros in
    posformers)."""
    return (
        tensor.reshape(*mask.shape, *tensor.shape[-(tensor.dim() - 2) :])[mask.bool()] if tensor.dim() > 2 else tensor
    )


def assert_same_outputs(expected, actual, mask) -> None:
    for field in ("last_hidden_state", "logits"):
        if field in expected:
            diff = max_diff(per_token(expected[field], mask), per_token(actual[field], mask))
            assert diff <= TOL, f"{field}: {diff}"
    if expected.get("loss") is not None:
        assert abs(expected.loss.item() - actual.loss.item()) <= TOL
    for states in ("hidden_states",):
        for theirs, ours in zip(expected[states], actual[states], strict=True):
            assert max_diff(per_token(theirs, mask), per_token(ours, mask)) <= TOL
    for theirs, ours in zip(expected.attentions, actual.attentions, strict=True):
        real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
        assert max_diff(theirs.masked_fill(~real, 0), ours.masked_fill(~real, 0)) <= TOL


@pytest.fixture
def enabled():
    with posformers.enabled():
        yield


@pytest.mark.parametrize(("family", "head", "padding_side"), PARITY_CASES)
def test_enabled_auto_classes_build_posformers_with_transformers_answers(family, head, padding_side, tmp_path):
    """Every head the Auto classes map to, from a transformers folder: posformers' class under transformers' name,
    the same outputs, hidden states, attentions and loss at real tokens, and the same gradients."""
    theirs = reference(family, head)
    folder, auto = saved(theirs, tmp_path), auto_class(theirs)
    with posformers.enabled():
        ours = auto.from_pretrained(folder).eval()
    if type(theirs) in dropin.HEAD_OVER_ENCODER:  # DeBERTa's MLM: transformers' head, posformers' encoder
        assert type(ours) is type(theirs) and type(ours.base_model).__module__ == "posformers.dropin"
    else:
        assert type(ours).__module__ == "posformers.dropin" and type(ours).__name__ == type(theirs).__name__
    inputs, mask = batch(head, padding_side)
    flags = dict(output_hidden_states=True, output_attentions=True)
    expected, actual = theirs(**inputs, **flags), ours(**inputs, **flags)
    assert_same_outputs(expected, actual, mask)
    loss = (lambda out: out.loss) if "labels" in inputs else (lambda out: per_token(out.last_hidden_state, mask).sum())
    loss(expected).backward()
    loss(actual).backward()
    gradients = dict(ours.named_parameters())
    for name, parameter in theirs.named_parameters():
        if parameter.grad is not None:
            scale = parameter.grad.abs().max().clamp_min(1.0)
            assert max_diff(parameter.grad, gradients[name].grad) <= TOL * scale, name


@pytest.mark.parametrize("family", ["v3", "roformer"])
def test_return_dict_off_gives_transformers_tuple(family, tmp_path, enabled):
    theirs = reference(family, "ForSequenceClassification")
    ours = AutoModelForSequenceClassification.from_pretrained(saved(theirs, tmp_path / "a")).eval()
    inputs, _ = batch("ForSequenceClassification")
    expected, actual = theirs(**inputs, return_dict=False), ours(**inputs, return_dict=False)
    assert isinstance(actual, tuple) and len(actual) == len(expected)
    assert max_diff(expected[1], actual[1]) <= TOL and abs(expected[0].item() - actual[0].item()) <= TOL


@pytest.mark.parametrize("family", ["v1", "v3", "roformer"])
def test_saved_folder_is_transformers_own(family, tmp_path):
    """A model built while enabled, trained a step and saved, is a transformers folder: the same config.json as
    transformers' class writes, no auto_map, no code, and without posformers it loads as transformers' class with the
    same outputs."""
    theirs = reference(family, "ForSequenceClassification")
    with posformers.enabled():
        ours = AutoModelForSequenceClassification.from_pretrained(saved(theirs, tmp_path / "theirs"))
    ours.config.id2label = {0: "neg", 1: "neutral", 2: "pos"}
    ours.config.label2id = {"neg": 0, "neutral": 1, "pos": 2}
    inputs, _ = batch("ForSequenceClassification")
    ours.train()
    ours(**inputs).loss.backward()
    torch.optim.SGD(ours.parameters(), lr=0.1).step()
    ours.eval()
    folder = saved(ours, tmp_path / "ours")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["config.json", "model.safetensors"]
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    theirs.config.id2label, theirs.config.label2id = ours.config.id2label, ours.config.label2id
    theirs.config.problem_type = ours.config.problem_type  # set by the first loss
    theirs.save_pretrained(tmp_path / "reference")
    assert written == json.loads((tmp_path / "reference" / "config.json").read_text())
    assert "auto_map" not in written and written["model_type"] == theirs.config.model_type
    assert not posformers.is_enabled()
    reloaded = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(reloaded) is type(theirs)
    assert reloaded.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    assert max_diff(reloaded(**inputs).logits, ours(**inputs).logits) <= TOL


@pytest.mark.parametrize("family", ["v3", "roformer"])
def test_from_config_builds_posformers_and_saves_transformers_files(family, tmp_path, enabled):
    prefix, fields = FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(**TINY, **fields)
    model = AutoModel.from_config(config)
    assert type(model).__module__ == "posformers.dropin"
    folder = saved(model, tmp_path)
    written = AutoConfig.from_pretrained(folder).to_dict()
    expected = config.to_dict() | {"architectures": [type(model).__name__], "dtype": "float32"}
    expected.pop("_name_or_path", None)
    assert {key: value for key, value in written.items() if key != "_name_or_path"} == expected
    posformers.disable()
    theirs = AutoModel.from_pretrained(folder).eval()
    inputs, mask = batch("Model", labels=False)
    with torch.no_grad():
        assert max_diff(per_token(theirs(**inputs)[0], mask), per_token(model.eval()(**inputs)[0], mask)) <= TOL


def test_enable_and_disable_restore_transformers_mapping_exactly():
    mappings = [getattr(transformers, name)._model_mapping for name in dropin.AUTO_CLASSES]
    before = [dict(mapping._extra_content) for mapping in mappings]
    posformers.enable()
    posformers.enable()  # twice: harmless
    assert posformers.is_enabled()
    assert AutoModel._model_mapping[transformers.DebertaV2Config].__module__ == "posformers.dropin"
    assert AutoModel._model_mapping[transformers.RoFormerConfig].__name__ == "RoFormerModel"
    assert AutoModel._model_mapping[transformers.BertConfig] is transformers.BertModel  # others untouched
    posformers.disable()
    posformers.disable()
    assert [dict(mapping._extra_content) for mapping in mappings] == before
    assert AutoModel._model_mapping[transformers.DebertaV2Config] is transformers.DebertaV2Model


def test_the_context_manager_restores_the_state_before_it():
    with posformers.enabled():
        assert posformers.is_enabled()
        with posformers.enabled():
            pass
        assert posformers.is_enabled()  # the inner block found it enabled and leaves it so
    assert not posformers.is_enabled()
    posformers.enable()
    try:
        with posformers.enabled():
            pass
        assert posformers.is_enabled()
    finally:
        posformers.disable()


def test_tokenizers_and_configs_are_untouched(enabled, tmp_path):
    theirs = reference("v3", "Model")
    config = AutoConfig.from_pretrained(saved(theirs, tmp_path))
    assert type(config) is transformers.DebertaV2Config


@pytest.mark.parametrize("family", ["v1", "v3", "roformer"])
def test_question_answering_stays_transformers_with_one_warning(family, tmp_path, enabled, caplog):
    theirs = reference(family, "ForQuestionAnswering")
    with caplog.at_level(logging.WARNING, logger="posformers.dropin"):
        model = transformers.AutoModelForQuestionAnswering.from_pretrained(saved(theirs, tmp_path))
    assert type(model) is type(theirs)
    warnings = [record.getMessage() for record in caplog.records if record.name == "posformers.dropin"]
    assert warnings == [
        f"posformers: {type(theirs).__name__} stays transformers' class: its span loss reads the logits transformers "
        "computes at padded positions, which posformers does not compute"
    ]


def test_a_config_posformers_cannot_honour_stays_transformers(tmp_path, enabled, caplog):
    theirs = reference("roformer", "Model", is_decoder=True, add_cross_attention=True)
    caplog.clear()  # the reference, built by name while enabled, has its own warning line
    with caplog.at_level(logging.WARNING, logger="posformers.dropin"):
        model = AutoModel.from_pretrained(saved(theirs, tmp_path))
    assert type(model) is transformers.RoFormerModel
    (warning,) = [record.getMessage() for record in caplog.records if record.name == "posformers.dropin"]
    assert (
        warning.startswith("posformers: RoFormerModel stays transformers' class: ") and "add_cross_attention" in warning
    )


def test_a_deberta_without_position_information_stays_transformers(tmp_path, enabled, caplog):
    """posformers refuses a DeBERTa that cannot see word order; transformers builds it, so its class stays."""
    theirs = reference("v3", "Model", relative_attention=False)
    caplog.clear()  # the reference, built by name while enabled, has its own warning line
    with caplog.at_level(logging.WARNING, logger="posformers.dropin"):
        model = AutoModel.from_pretrained(saved(theirs, tmp_path))
    assert type(model) is transformers.DebertaV2Model
    (warning,) = [record.getMessage() for record in caplog.records if record.name == "posformers.dropin"]
    assert warning.startswith("posformers: DebertaV2Model stays transformers' class: ")
    assert "position_biased_input and relative_attention are both false" in warning


@pytest.mark.parametrize("family", ["v1", "v3"])
def test_deberta_mlm_keeps_transformers_head_over_posformers_encoder(family, tmp_path, enabled):
    """transformers' default DeBERTa MLM head (legacy, cls.predictions.*): transformers' class, posformers' encoder,
    the same logits at real tokens and the same state_dict keys."""
    theirs = reference(family, "ForMaskedLM", legacy=True)
    model = AutoModelForMaskedLM.from_pretrained(saved(theirs, tmp_path)).eval()
    assert type(model) is type(theirs) and list(model.state_dict()) == list(theirs.state_dict())
    assert type(model.deberta).__module__ == "posformers.dropin"
    inputs, mask = batch("ForMaskedLM")
    expected, actual = theirs(**inputs), model(**inputs)
    assert max_diff(per_token(expected.logits, mask), per_token(actual.logits, mask)) <= TOL
    assert abs(expected.loss.item() - actual.loss.item()) <= TOL


# ---------------------------------------------------------------------------------------------------------------------
# optimize
# ---------------------------------------------------------------------------------------------------------------------


class Wrapper(nn.Module):
    """A client library's module holding a transformers encoder (as GLiNER2 and sentence-transformers do)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.scorer = nn.Linear(encoder.config.hidden_size, 1)

    def forward(self, **inputs):
        return self.scorer(self.encoder(**inputs).last_hidden_state).squeeze(-1)


@pytest.mark.parametrize("family", ["v1", "v2", "roformer"])
def test_optimize_in_place_keeps_parameters_keys_mode_and_answers(family):
    model = Wrapper(reference(family, "Model"))
    model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    model.train()
    inputs, mask = batch("Model", labels=False)
    torch.manual_seed(1)
    model.eval()
    with torch.no_grad():
        expected = model(**inputs)
    model.train()
    parameters = {name: parameter for name, parameter in model.named_parameters()}
    keys = list(model.state_dict())
    encoder = model.encoder
    assert posformers.optimize(model) is model
    assert model.encoder is encoder and type(encoder).__module__ == "posformers.dropin"
    assert list(model.state_dict()) == keys
    assert all(parameters[name] is parameter for name, parameter in model.named_parameters())
    assert len(dict(model.named_parameters())) == len(parameters)
    assert not encoder.embeddings.word_embeddings.weight.requires_grad
    assert model.training and encoder.training and encoder.encoder.layer[0].training
    model.eval()
    with torch.no_grad():
        assert max_diff(expected[mask.bool()], model(**inputs)[mask.bool()]) <= TOL
    assert posformers.optimize(model) is model  # twice: harmless


def test_optimize_keeps_the_optimizer_training_the_same_steps():
    """An optimizer built before `optimize` trains the converted model exactly as it trains transformers' model."""
    results = []
    for convert in (False, True):
        model = reference("v3", "ForSequenceClassification")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if convert:
            posformers.optimize(model)
        inputs, _ = batch("ForSequenceClassification")
        for _ in range(2):
            model(**inputs).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        results.append(model.state_dict())
    for name, tensor in results[0].items():
        assert max_diff(tensor, results[1][name]) <= TOL, name


def test_optimize_keeps_half_precision_and_hooks():
    model = reference("roformer", "Model").to(torch.bfloat16)
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(type(module).__name__))
    posformers.optimize(model)
    inputs, _ = batch("Model", labels=False)
    output = model(**inputs).last_hidden_state
    assert output.dtype == torch.bfloat16 and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert calls == ["RoFormerModel"]


def test_optimize_takes_a_peft_wrapped_model():
    """LoRA placed by PEFT on transformers' model: the adapters stay in place and take part in the forward."""
    model = reference("v3", "ForSequenceClassification")
    config = peft.LoraConfig(
        r=4, target_modules=["query_proj", "value_proj"], task_type="SEQ_CLS", init_lora_weights=False
    )
    wrapped = peft.get_peft_model(model, config).eval()
    inputs, _ = batch("ForSequenceClassification")
    expected = wrapped(**inputs)
    keys = list(wrapped.state_dict())
    posformers.optimize(wrapped)
    assert list(wrapped.state_dict()) == keys
    assert type(wrapped.base_model.model).__module__ == "posformers.dropin"
    actual = wrapped(**inputs)
    assert max_diff(expected.logits, actual.logits) <= TOL
    expected.loss.backward()
    lora = {name: parameter.grad.clone() for name, parameter in wrapped.named_parameters() if "lora_" in name}
    wrapped.zero_grad()
    actual.loss.backward()
    assert lora and all(
        max_diff(grad, dict(wrapped.named_parameters())[name].grad) <= TOL for name, grad in lora.items()
    )


def test_optimize_refuses_what_it_cannot_take_in_one_line():
    bert = transformers.BertModel(transformers.BertConfig(**TINY))
    with pytest.raises(ValueError, match=r"^posformers.optimize cannot take BertModel: it holds no transformers"):
        posformers.optimize(bert)
    with pytest.raises(TypeError, match=r"takes a torch\.nn\.Module, got str"):
        posformers.optimize("microsoft/deberta-v3-base")
    wrapped = nn.DataParallel(reference("v3", "Model"))
    with pytest.raises(ValueError, match=r"wrapped by DataParallel; call posformers.optimize\(model\) before"):
        posformers.optimize(wrapped)


def test_optimize_refuses_a_ddp_wrapped_model(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(reference("roformer", "Model"))
        with pytest.raises(ValueError, match=r"wrapped by DistributedDataParallel; call posformers.optimize"):
            posformers.optimize(wrapped)
    finally:
        dist.destroy_process_group()


def test_optimize_leaves_question_answering_to_transformers_with_one_warning(caplog):
    model = reference("v3", "ForQuestionAnswering")
    with caplog.at_level(logging.WARNING, logger="posformers.dropin"):
        assert posformers.optimize(model) is model
    assert type(model) is transformers.DebertaV2ForQuestionAnswering
    assert type(model.deberta) is transformers.DebertaV2Model
    assert any("DebertaV2ForQuestionAnswering stays transformers' class" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------------------------------
# The Hub
# ---------------------------------------------------------------------------------------------------------------------

CHILD_PUSH_AND_LOAD = """
import posformers
import transformers

posformers.enable()
model = transformers.AutoModelForSequenceClassification.from_pretrained(ARGS["folder"])
model.push_to_hub(ARGS["repo"])
again = transformers.AutoModelForSequenceClassification.from_pretrained(ARGS["repo"])  # from the Hub, enabled
print(json.dumps({"pushed": type(model).__module__, "loaded": type(again).__module__}))
"""

CHILD_LOAD_WITHOUT_POSFORMERS = """
import torch
import transformers

model = transformers.AutoModelForSequenceClassification.from_pretrained(ARGS["repo"]).eval()
with torch.no_grad():
    logits = model(torch.tensor(ARGS["input_ids"]), attention_mask=torch.tensor(ARGS["attention_mask"])).logits
print(json.dumps({"class": type(model).__module__, "logits": logits.tolist(), "found": POSFORMERS_FOUND}))
"""


def test_from_the_hub_and_push_to_hub_keep_transformers_files(tmp_path, hub_server):
    """Enabled, a model loads from the Hub on posformers and `push_to_hub` uploads transformers' files (no code, no
    auto_map), which a process without posformers loads as transformers' class with the same outputs."""
    from helpers import python_env, run_python

    theirs = reference("v3", "ForSequenceClassification")
    repo = "posformers-test/dropin-deberta-v3"
    hub_server.create_repo(repo)
    args = {"folder": saved(theirs, tmp_path / "folder"), "repo": repo}
    env = python_env(tmp_path / "hf-home-push", endpoint=hub_server.url)
    steps = run_python(CHILD_PUSH_AND_LOAD, args, env=env, cwd=tmp_path)
    assert steps == {"pushed": "posformers.dropin", "loaded": "posformers.dropin"}
    files = set(hub_server.list_files(repo))
    assert {"config.json", "model.safetensors"} <= files and not [name for name in files if name.endswith(".py")]
    config = json.loads(hub_server.read_file(repo, "config.json"))
    assert config["model_type"] == "deberta-v2" and "auto_map" not in config
    inputs, mask = batch("ForSequenceClassification", labels=False)
    args = {"repo": repo, "input_ids": inputs["input_ids"].tolist(), "attention_mask": mask.tolist()}
    env = python_env(tmp_path / "hf-home-load", endpoint=hub_server.url)
    loaded = run_python(CHILD_LOAD_WITHOUT_POSFORMERS, args, env=env, cwd=tmp_path, without_posformers=True)
    assert loaded["class"] == "transformers.models.deberta_v2.modeling_deberta_v2" and not loaded["found"]
    with torch.no_grad():
        expected = theirs(inputs["input_ids"], attention_mask=mask).logits
    assert max_diff(torch.tensor(loaded["logits"]), expected) <= TOL


def test_a_drop_in_config_given_back_to_the_auto_classes_builds_posformers(tmp_path):
    """`AutoModel.from_config(model.config)` / `from_pretrained(..., config=model.config)` with an optimized model's
    config, enabled or not, and the config's round trip through its dict."""
    model = posformers.optimize(reference("v3", "ForSequenceClassification"))
    assert not posformers.is_enabled()
    assert type(AutoModelForSequenceClassification.from_config(model.config)) is type(model)
    reloaded = AutoModel.from_pretrained(saved(model, tmp_path), config=model.config)
    assert type(reloaded).__module__ == "posformers.dropin" and type(reloaded).__name__ == "DebertaV2Model"
    assert type(model.config).from_dict(model.config.to_dict()).to_dict() == model.config.to_dict()


def test_optimize_keeps_activation_checkpointing():
    model = reference("roformer", "Model")
    model.activation_checkpointing_enable()
    posformers.optimize(model)
    assert type(model).__module__ == "posformers.dropin" and model.is_activation_checkpointing


# ---------------------------------------------------------------------------------------------------------------------
# Inputs longer than max_position_embeddings: transformers' arithmetic (no clip of far distances)
# ---------------------------------------------------------------------------------------------------------------------

# DeBERTa-v3's relative positions (256 log buckets up to 512 distances, max_relative_positions unset) at a small width
V3_POSITIONS = dict(FAMILIES["v3"][1], position_buckets=256, max_relative_positions=-1, max_position_embeddings=512)
# and the drop-in families past their max_relative_positions (64); v1 adds absolute positions, a table of 1,024 here
LONG_FAMILIES = {
    "v3-positions": ("DebertaV2", V3_POSITIONS),
    "v1": ("Deberta", dict(FAMILIES["v1"][1], max_position_embeddings=1024)),
    **{name: FAMILIES[name] for name in ("v2", "v3")},
}
LONG_HEADS = ("Model", "ForSequenceClassification", "ForTokenClassification", "ForMultipleChoice", "ForMaskedLM")


def long_reference(family: str, head: str, spread: float = 0.1, **overrides):
    """transformers' class of a LONG_FAMILIES entry (random weights, seeded, moved off their initial values by noise of
    std `spread`, so that at a small width the scores are sharp enough for the one pair a 513-token input puts past
    512 to show), in eval mode."""
    prefix, fields = LONG_FAMILIES[family]
    if head == "ForMaskedLM":
        overrides = {"legacy": False, **overrides}
    config = getattr(transformers, f"{prefix}Config")(**{**TINY, **fields, "num_labels": 3, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, prefix + head)(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(spread * torch.randn_like(parameter))
    return model


def long_batch(head: str, length: int, padded: bool) -> tuple[dict, torch.Tensor]:
    """Two rows of `length` tokens: all real (a mask of ones: the padded path), or the second one right-padded from
    3/4 of the length on (the padding-free path); labels for `head`; the 2D mask of its real tokens."""
    generator = torch.Generator().manual_seed(length)
    input_ids = torch.randint(1, 99, (2, length), generator=generator)
    mask = torch.ones_like(input_ids)
    if not padded:
        mask[1, 3 * length // 4 :] = 0
    inputs = dict(input_ids=input_ids.masked_fill(mask == 0, 0), attention_mask=mask)
    if head == "ForSequenceClassification":
        inputs["labels"] = torch.tensor([0, 2])
    elif head in ("ForTokenClassification", "ForMaskedLM"):
        classes = 3 if head == "ForTokenClassification" else 99
        inputs["labels"] = torch.randint(0, classes, (2, length), generator=generator).masked_fill(mask == 0, -100)
    elif head == "ForMultipleChoice":  # one question, its two rows the choices
        inputs = {name: tensor[None] for name, tensor in inputs.items()} | {"labels": torch.tensor([1])}
    return inputs, mask


def assert_long_parity(theirs, ours, head: str, length: int, padded: bool, monkeypatch) -> None:
    """`ours` (a drop-in model) gives `theirs`' outputs and loss at real tokens, on the path `padded` names."""
    from posformers import modeling_deberta

    calls = packing_calls(monkeypatch, modeling_deberta)
    inputs, mask = long_batch(head, length, padded)
    with torch.no_grad():
        expected, actual = theirs(**inputs), ours(**inputs)
    assert calls and all((plan is None) == padded for plan in calls), "not the path under test"
    field = "last_hidden_state" if head == "Model" else "logits"
    diff = max_diff(per_token(expected[field], mask), per_token(actual[field], mask))
    assert diff <= TOL, f"{head} L={length} padded={padded} {field}: max abs diff {diff}"
    if "labels" in inputs:
        assert abs(expected.loss.item() - actual.loss.item()) <= TOL


LONG_CASES = [
    pytest.param("v3-positions", head, length, padded, id=f"v3-positions-{head}-{length}-{path}")
    for head in LONG_HEADS
    for length in (513, 1024)
    for padded, path in ((True, "padded"), (False, "padding-free"))
] + [
    pytest.param(family, "Model", 513, padded, id=f"{family}-Model-513-{path}")
    for family in ("v1", "v2", "v3")
    for padded, path in ((True, "padded"), (False, "padding-free"))
]


@pytest.mark.parametrize(("family", "head", "length", "padded"), LONG_CASES)
def test_long_inputs_give_transformers_answers(family, head, length, padded, tmp_path, monkeypatch):
    """Past max_relative_positions (512 for v3-positions, 64 for v1/v2/v3), the drop-in model reads the relative rows
    transformers reads (its log buckets are not clipped), on the padded path and the padding-free one."""
    theirs = long_reference(family, head)
    folder, auto = saved(theirs, tmp_path), auto_class(theirs)
    with posformers.enabled():
        ours = auto.from_pretrained(folder).eval()
    assert_long_parity(theirs, ours, head, length, padded, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "padding-free"])
def test_4096_tokens_give_transformers_answers(padded, monkeypatch):
    theirs = long_reference("v3-positions", "Model", num_attention_heads=2)
    ours = posformers.optimize(long_reference("v3-positions", "Model", num_attention_heads=2))
    assert_long_parity(theirs, ours, "Model", 4096, padded, monkeypatch)


@pytest.mark.parametrize("implementation", ["eager", "posformers_fused"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "padding-free"])
def test_long_inputs_give_transformers_answers_on_every_kernel(implementation, padded, monkeypatch):
    theirs = long_reference("v3-positions", "Model")
    ours = posformers.optimize(long_reference("v3-positions", "Model"))
    ours.set_attn_implementation(implementation)
    assert_long_parity(theirs, ours, "Model", 513, padded, monkeypatch)


@pytest.mark.slow
def test_base_size_at_1024_tokens_gives_transformers_answers(monkeypatch):
    """deberta-v3-base's width and heads (768, 12; 6 of its 12 layers), where the unclipped rows mattered most."""
    base = dict(hidden_size=768, num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072)
    theirs = long_reference("v3-positions", "Model", spread=0.02, **base)
    ours = posformers.optimize(long_reference("v3-positions", "Model", spread=0.02, **base))
    assert_long_parity(theirs, ours, "Model", 1024, True, monkeypatch)


def test_the_arithmetic_field_stays_out_of_transformers_files(tmp_path):
    """The drop-in runs transformers' arithmetic without writing `clip_relative_positions` into config.json, and the
    folder loads without posformers with the same answers at 513 tokens; posformers' own config writes the field."""
    model = posformers.optimize(long_reference("v3-positions", "Model"))
    assert model.config.clip_relative_positions is False
    folder = saved(model, tmp_path / "drop-in")
    assert "clip_relative_positions" not in json.loads((tmp_path / "drop-in" / "config.json").read_text())
    reloaded = AutoModel.from_pretrained(folder).eval()
    assert type(reloaded) is transformers.DebertaV2Model
    inputs, _ = long_batch("Model", 513, padded=True)
    with torch.no_grad():
        assert max_diff(reloaded(**inputs).last_hidden_state, model(**inputs).last_hidden_state) <= TOL
    posformers.DebertaConfig().save_pretrained(tmp_path / "own")
    assert json.loads((tmp_path / "own" / "config.json").read_text())["clip_relative_positions"] is True


# ---------------------------------------------------------------------------------------------------------------------
# optimize keeps hooks
# ---------------------------------------------------------------------------------------------------------------------

ATTENTION, LAYER = "deberta.encoder.layer.1.attention", "deberta.encoder.layer.0"


def register_every_hook(model, calls: list) -> dict:
    """One hook of every kind torch has, each recording (kind, the module it was called with, what it was given),
    on the model itself (forward, forward pre, both with kwargs, always_call), on an attention module transformers'
    model and posformers' both have at the same path (forward, forward pre, state_dict pre / post, load_state_dict pre
    / post) and on a layer (full backward, backward pre). The handles, by kind."""
    attention, layer = model.get_submodule(ATTENTION), model.get_submodule(LAYER)

    def record(kind):
        return lambda module, *rest: calls.append((kind, module, rest))

    return {
        "forward": model.register_forward_hook(record("forward")),
        "forward kwargs": model.register_forward_hook(record("forward kwargs"), with_kwargs=True),
        "forward always": model.register_forward_hook(record("forward always"), always_call=True),
        "forward pre": model.register_forward_pre_hook(record("forward pre")),
        "forward pre kwargs": model.register_forward_pre_hook(record("forward pre kwargs"), with_kwargs=True),
        "attention forward": attention.register_forward_hook(record("attention forward")),
        "attention forward pre": attention.register_forward_pre_hook(record("attention forward pre")),
        "state_dict pre": attention.register_state_dict_pre_hook(record("state_dict pre")),
        "state_dict": attention.register_state_dict_post_hook(record("state_dict")),
        "load_state_dict pre": attention.register_load_state_dict_pre_hook(record("load_state_dict pre")),
        "load_state_dict post": attention.register_load_state_dict_post_hook(record("load_state_dict post")),
        "backward": layer.register_full_backward_hook(record("backward")),
        "backward pre": layer.register_full_backward_pre_hook(record("backward pre")),
    }


def test_optimize_keeps_every_kind_of_hook_where_the_model_keeps_the_module():
    """Hooks of every kind, on the model and on modules posformers' model replaces by its own at the same path, fire
    after optimize as before it: on the converted modules, with the inputs and outputs the model computes, and their
    handles still remove them."""
    model = reference("v3", "ForSequenceClassification")
    inputs, _ = batch("ForSequenceClassification")
    with torch.no_grad():
        expected = model(**inputs).logits
    calls = []
    handles = register_every_hook(model, calls)
    posformers.optimize(model)
    assert type(model).__module__ == "posformers.dropin" and dropin.runs_on_posformers(model)
    attention, layer = model.get_submodule(ATTENTION), model.get_submodule(LAYER)

    output = model(**inputs)
    fired = {kind: (module, rest) for kind, module, rest in calls}
    assert list(fired) == [
        "forward pre", "forward pre kwargs", "attention forward pre", "attention forward", "forward",
        "forward kwargs", "forward always",
    ]  # fmt: skip
    assert all(fired[kind][0] is model for kind in fired if not kind.startswith("attention"))
    assert fired["attention forward"][0] is attention and fired["attention forward pre"][0] is attention
    args, kwargs = fired["forward pre kwargs"][1]
    assert args == () and torch.equal(kwargs["input_ids"], inputs["input_ids"])
    args, kwargs, hooked_output = fired["forward kwargs"][1]
    assert hooked_output is output and torch.equal(kwargs["attention_mask"], inputs["attention_mask"])
    assert max_diff(fired["forward"][1][1].logits, expected) <= TOL

    calls.clear()
    output.loss.backward()
    assert [kind for kind, *_ in calls] == ["backward pre", "backward"]
    assert all(module is layer for _, module, _ in calls)
    grad_output = calls[1][2][1]
    assert grad_output[0].shape == calls[0][2][0][0].shape and grad_output[0].abs().sum() > 0

    calls.clear()
    state = model.state_dict()
    model.load_state_dict(state)
    assert [kind for kind, *_ in calls] == [
        "state_dict pre",
        "state_dict",
        "load_state_dict pre",
        "load_state_dict post",
    ]
    assert all(module is attention for _, module, _ in calls)
    assert calls[0][2][0] == f"{ATTENTION}." and calls[2][2][1] == f"{ATTENTION}."  # the prefix

    for handle in handles.values():
        handle.remove()
    calls.clear()
    model(**inputs).loss.backward()
    model.load_state_dict(model.state_dict())
    assert calls == []


def test_optimize_refuses_a_hook_it_cannot_keep_and_leaves_the_model_as_it_was():
    """transformers' attention has a dropout module of its own that posformers' has not: a hook there is refused in
    one line naming the module and the kind of hook, before anything changes."""
    model = Wrapper(reference("v3", "Model"))
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append("kept"))
    model.encoder.encoder.layer[0].attention.self.dropout.register_forward_pre_hook(lambda *args: None)
    modules = dict(model.named_modules())
    with pytest.raises(ValueError) as refused:
        posformers.optimize(model)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "posformers.optimize: the module 'encoder.encoder.layer.0.attention.self.dropout' (StableDropout) has a "
        "forward pre hook"
    ) or message.startswith(
        "posformers.optimize: the module 'encoder.encoder.layer.0.attention.self.dropout' (Dropout) has a forward pre"
    ), message
    assert type(model.encoder) is transformers.DebertaV2Model and dict(model.named_modules()) == modules
    inputs, _ = batch("Model", labels=False)
    model(**inputs)
    assert calls == ["kept"]


def test_optimize_keeps_hooks_on_a_masked_lm_encoder():
    """DeBERTa's masked-LM: transformers' head stays, its encoder is converted; a hook on an encoder layer moves to
    posformers' layer."""
    model = reference("v3", "ForMaskedLM")
    calls = []
    model.deberta.encoder.layer[1].register_forward_hook(lambda module, args, output: calls.append(module))
    posformers.optimize(model)
    assert type(model) is transformers.DebertaV2ForMaskedLM and dropin.runs_on_posformers(model)
    inputs, _ = batch("ForMaskedLM")
    model(**inputs)
    assert calls == [model.deberta.encoder.layer[1]] and type(model.deberta).__module__ == "posformers.dropin"


# ---------------------------------------------------------------------------------------------------------------------
# optimize follows the modules a model holds
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["v1", "v3", "roformer"])
def test_optimize_builds_the_layers_the_model_holds_and_keeps_its_config(family):
    """A client that keeps the first k layers (BERTScore: `model.encoder.layer = ModuleList(layer[:k])`) leaves the
    config saying 12: optimize runs the k layers, as the cut transformers model does, and the config stays."""
    model = reference(family, "Model", num_hidden_layers=4)
    model.encoder.layer = nn.ModuleList(list(model.encoder.layer[:3]))
    inputs, mask = batch("Model", labels=False)
    with torch.no_grad():
        expected = model(**inputs, output_hidden_states=True, output_attentions=True)
    posformers.optimize(model)
    assert type(model).__module__ == "posformers.dropin" and len(model.encoder.layer) == 3
    assert model.config.num_hidden_layers == 4
    with torch.no_grad():
        actual = model(**inputs, output_hidden_states=True, output_attentions=True)
    assert len(actual.hidden_states) == len(expected.hidden_states) == 4
    assert_same_outputs(expected, actual, mask)


def test_optimize_refuses_a_module_of_another_shape_in_one_line_and_leaves_the_model():
    """A change posformers' model cannot follow from the config (a wider feed-forward here, pruned heads elsewhere)."""
    model = reference("roformer", "Model")
    model.encoder.layer[0].intermediate.dense = nn.Linear(32, 41)
    with pytest.raises(
        ValueError,
        match=r"^posformers.optimize: RoFormerModel's encoder.layer.0.intermediate.dense.weight"
        r" has shape \(41, 32\), its config gives \(37, 32\)$",
    ):
        posformers.optimize(model)
    assert type(model) is transformers.RoFormerModel


def test_runs_on_posformers_is_right_for_every_model(tmp_path):
    theirs = reference("v3", "ForMaskedLM")
    assert not dropin.runs_on_posformers(theirs)
    with posformers.enabled():
        ours = AutoModelForMaskedLM.from_pretrained(saved(theirs, tmp_path))
    assert type(ours).__module__ != "posformers.dropin" and dropin.runs_on_posformers(ours)
    assert dropin.runs_on_posformers(posformers.optimize(Wrapper(reference("roformer", "Model"))))
    assert not dropin.runs_on_posformers(Wrapper(reference("roformer", "Model")))
    assert dropin.runs_on_posformers(posformers.DebertaModel(posformers.DebertaConfig(**TINY)))
    assert not dropin.runs_on_posformers(reference("v3", "ForQuestionAnswering"))


def test_a_class_built_by_name_while_enabled_gets_one_warning_line_and_disable_stops_them(caplog):
    """Built by name (`RoFormerModel(config)`), a model stays transformers': while enabled one line per class says so
    and names optimize; built through the Auto classes, nothing is said; after disable(), nothing either."""
    config = transformers.RoFormerConfig(**TINY)
    with caplog.at_level(logging.WARNING, logger="posformers.dropin"):
        with posformers.enabled():
            first, second = transformers.RoFormerModel(config), transformers.RoFormerModel(config)
            head = transformers.RoFormerForSequenceClassification(config)  # its own line, not its encoder's again
            auto = AutoModel.from_config(config)
            kept = transformers.AutoModelForQuestionAnswering.from_config(config)
        transformers.DebertaV2Model(transformers.DebertaV2Config(**TINY))
    warnings = [record.getMessage() for record in caplog.records if record.name == "posformers.dropin"]
    assert warnings == [
        dropin.BUILT_BY_NAME_WARNING.format(name="RoFormerModel"),
        dropin.BUILT_BY_NAME_WARNING.format(name="RoFormerForSequenceClassification"),
        f"posformers: RoFormerForQuestionAnswering stays transformers' class: {dropin.QA_REASON}",
    ]
    assert not any(dropin.runs_on_posformers(model) for model in (first, second, head, kept))
    assert dropin.runs_on_posformers(auto)
