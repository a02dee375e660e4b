"""`posformers-convert deberta --from {hf,original}` on checkpoints in Microsoft's exact layouts, random weights.

hf v1: microsoft/deberta-base (pytorch_model.bin in fp16: fused `in_proj`, the absolute position table, the
    `lm_predictions` head; GPT-2 BPE vocab.json + merges.txt from tests/data/vocab/gpt2).
hf v2: microsoft/deberta-v2-xlarge (log buckets, the convolution layer, `lm_predictions`; spm.model).
hf v3: microsoft/deberta-v3-* (model.safetensors in fp16 with both `lm_predictions` and `mask_predictions`; spm.model).
original v1 / v3: the microsoft/DeBERTa release assets (pytorch.model.bin + model_config.json + bpe_encoder.bin;
    pytorch_model.bin carrying its config + spm.model; the RTD classifier spelled `classifer`).
fine-tuned: microsoft/deberta-large-mnli and deberta-v2-xlarge-mnli (config.json with `architectures` and
    `id2label`, `pooler.dense.*` + `classifier.*`), and token classification / QA fine-tunes of v3 (`classifier.*`,
    `qa_outputs.*`), one with the `word_embeddings._weight` alias some safetensors files carry.
The SentencePiece models are trained here on tests/data/glue/sst2 text.
"""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.data import DATA_DIR
from safetensors.torch import save_file

import posformers

from .conftest import (
    VOCAB_DIR,
    ConvertResult,
    check_overwrite_behaviour,
    cli_failure,
    convert_in_process,
    load_all_with_remote_code,
    load_with_remote_code,
    run_in_process,
)

VERIFY_TOLERANCE = 1e-5
TEXT = "the movie was not as good as the book"
COMMON = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "layer_norm_eps": 1e-7,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "type_vocab_size": 0,
    "vocab_size": 128,
}
# The config.json files of the Hub checkpoints, at tiny sizes.
V1_CONFIG = {"model_type": "deberta", **COMMON, "pos_att_type": "c2p|p2c"}
V3_CONFIG = {
    "model_type": "deberta-v2",
    **COMMON,
    "pos_att_type": "p2c|c2p",
    "position_buckets": 16,
    "share_att_key": True,
    "norm_rel_ebd": "layer_norm",
    "pad_token_id": 0,
}
V2_CONFIG = {**V3_CONFIG, "conv_kernel_size": 3, "conv_act": "gelu", "attention_head_size": 8}


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    """A SentencePiece model with DeBERTa's special pieces ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3), on SST-2 text."""
    import sentencepiece  # a dev dependency (pyproject [dev]); imported here so that other tests need not have it

    directory = tmp_path_factory.mktemp("spm")
    lines = (DATA_DIR / "glue" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:3001]
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(line.split("\t")[0] for line in lines), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(directory / "spm"),
        vocab_size=120,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_piece="[PAD]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        unk_piece="[UNK]",
        user_defined_symbols=["[MASK]"],
        minloglevel=2,
    )
    return directory / "spm.model"


def random_encoder(config: dict) -> dict[str, torch.Tensor]:
    """transformers' DebertaModel / DebertaV2Model for `config` (official fields), every parameter random, as
    `deberta.*` tensors, plus the absolute position table every official checkpoint carries."""
    fields = {key: value for key, value in config.items() if key != "model_type"}
    prefix = "Deberta" if config["model_type"] == "deberta" else "DebertaV2"
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}Model")(getattr(transformers, f"{prefix}Config")(**fields))
    generator = torch.Generator().manual_seed(1)
    state = {}
    for key, value in model.state_dict().items():
        offset = 1.0 if "LayerNorm.weight" in key else 0.0
        state[f"deberta.{key}"] = torch.randn(value.shape, generator=generator) * 0.2 + offset
    state["deberta.embeddings.position_embeddings.weight"] = torch.randn(512, 32, generator=generator) * 0.2
    return state


def random_head(prefix: str, names: dict[str, tuple], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        f"{prefix}.{name}": torch.randn(shape, generator=generator) * 0.2 + (1.0 if "LayerNorm.weight" in name else 0.0)
        for name, shape in names.items()
    }


def lm_head(vocab_size=128, hidden=32):
    shapes = {"dense.weight": (hidden, hidden), "dense.bias": (hidden,), "LayerNorm.weight": (hidden,)}
    shapes.update({"LayerNorm.bias": (hidden,), "bias": (vocab_size,)})
    return random_head("lm_predictions.lm_head", shapes, seed=2)


def rtd_head(classifier_name="classifier", hidden=32):
    shapes = {"dense.weight": (hidden, hidden), "dense.bias": (hidden,), "LayerNorm.weight": (hidden,)}
    shapes.update(
        {"LayerNorm.bias": (hidden,), f"{classifier_name}.weight": (1, hidden), f"{classifier_name}.bias": (1,)}
    )
    return random_head("mask_predictions", shapes, seed=3)


def fp16(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Microsoft stores its Hub checkpoints in fp16."""
    return {key: value.half().contiguous() for key, value in state.items()}


def write_hf_v1(directory, edit=None):
    directory.mkdir(parents=True)
    state = fp16({**random_encoder(V1_CONFIG), **lm_head()})
    if edit:
        edit(state)
    torch.save(state, directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps(V1_CONFIG))
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(VOCAB_DIR / "gpt2" / name, directory / name)
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "gpt2"}))
    return state


def write_hf_v2(directory, spm_model):
    directory.mkdir(parents=True)
    state = fp16({**random_encoder(V2_CONFIG), **lm_head()})
    assert "deberta.encoder.conv.conv.weight" in state
    torch.save(state, directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps(V2_CONFIG))
    shutil.copy(spm_model, directory / "spm.model")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "spm"}))
    return state


def write_hf_v3(directory, spm_model):
    directory.mkdir(parents=True)
    state = fp16({**random_encoder(V3_CONFIG), **lm_head(), **rtd_head()})
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(V3_CONFIG))
    shutil.copy(spm_model, directory / "spm.model")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "spm"}))
    return state


def original_config(config: dict) -> dict:
    """The repository's model_config.json: no model_type, `padding_idx`, fields in its own spelling."""
    fields = {key: value for key, value in config.items() if key not in ("model_type", "pad_token_id")}
    return {**fields, "padding_idx": 0}


def write_bpe_encoder(path):
    """The repository's bpe_encoder.bin from GPT-2's files: GPT-2's `encoder`, its merges as pairs (`vocab`) and a
    fairseq dictionary (`dict_map`) listing GPT-2 ids by (made-up) frequency, i.e. not in id order."""
    encoder = json.loads((VOCAB_DIR / "gpt2" / "vocab.json").read_text(encoding="utf-8"))
    merges = (VOCAB_DIR / "gpt2" / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    order = torch.randperm(len(encoder), generator=torch.Generator().manual_seed(4)).tolist()
    dict_map = [(str(gpt2_id), 1000 - rank) for rank, gpt2_id in enumerate(order)]
    torch.save({"encoder": encoder, "vocab": [tuple(m.split()) for m in merges if m], "dict_map": dict_map}, path)
    return {gpt2_id: 4 + rank for rank, gpt2_id in enumerate(order)}  # GPT-2 id -> DeBERTa id


def write_original_v1(directory, edit=None):
    directory.mkdir(parents=True)
    state = {**random_encoder(V1_CONFIG), **lm_head()}
    if edit:
        edit(state)
    torch.save(state, directory / "pytorch.model.bin")
    (directory / "model_config.json").write_text(json.dumps(original_config(V1_CONFIG)))
    return state, write_bpe_encoder(directory / "bpe_encoder.bin")


def write_original_v3(directory, spm_model):
    """An RTD release whose config travels inside the state (the repository's `load_model_state` reads it there)."""
    directory.mkdir(parents=True)
    state = {**random_encoder(V3_CONFIG), **rtd_head("classifer")}
    torch.save({**state, "config": original_config(V3_CONFIG)}, directory / "pytorch_model.bin")
    shutil.copy(spm_model, directory / "spm.model")
    return state


def assert_verified(result, *expected_rows) -> dict[str, float]:
    table = result.verification()
    assert all(diff <= VERIFY_TOLERANCE for diff in table.values()), table
    for row in expected_rows:
        assert any(name.startswith(row) for name in table), (row, table)
    return table


def assert_weights_equal(model, state: dict[str, torch.Tensor], pairs: dict[str, str]):
    ours = model.state_dict()
    for our_key, source_key in pairs.items():
        assert torch.equal(ours[our_key], state[source_key].float()), our_key


def test_hf_v1_converts_with_the_enhanced_mask_decoder(workdir, convert, convert_here):
    source, output = workdir / "deberta-base", workdir / "out"
    state = write_hf_v1(source)
    args = ["deberta", "--from", "hf", "--source", source, "--output", output]
    result = convert(*args).check()
    assert_verified(result, "hidden states", "last hidden state", "MLM logits (Enhanced Mask Decoder, 2 steps)")
    model = transformers.AutoModelForMaskedLM.from_pretrained(output)
    assert isinstance(model, posformers.DebertaForMaskedLM) and model.config.projection_layout == "fused"
    assert next(model.parameters()).dtype == torch.float32  # fp16 storage, fp32 output by default
    assert_weights_equal(
        model,
        state,
        {
            key: key
            for key in (
                "deberta.embeddings.position_embeddings.weight",
                "deberta.encoder.layer.1.attention.self.in_proj.weight",
                "lm_predictions.lm_head.bias",
            )
        },
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert tokenizer.tokenize(TEXT) == transformers.AutoTokenizer.from_pretrained(source).tokenize(TEXT)
    check_overwrite_behaviour(convert_here, args, output)


def test_hf_v2_with_convolution_and_bfloat16_output(workdir, convert_here, spm_model):
    source, output = workdir / "deberta-v2-xlarge", workdir / "out"
    state = write_hf_v2(source, spm_model)
    result = convert_here(
        "deberta", "--from", "hf", "--source", source, "--output", output, "--dtype", "bfloat16"
    ).check()
    assert_verified(result, "hidden states", "MLM logits (Enhanced Mask Decoder")
    model = posformers.DebertaForMaskedLM.from_pretrained(output)
    assert model.config.conv_kernel_size == 3 and next(model.parameters()).dtype == torch.bfloat16
    conv = model.deberta.encoder.conv.conv.weight
    assert torch.equal(conv, state["deberta.encoder.conv.conv.weight"].float().to(torch.bfloat16))
    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert tokenizer(TEXT)["input_ids"] == transformers.AutoTokenizer.from_pretrained(source)(TEXT)["input_ids"]


def test_hf_v3_discriminator_gives_rtd_and_loads_with_remote_code(workdir, convert_here, spm_model, capsys):
    source, output = workdir / "deberta-v3", workdir / "out"
    state = write_hf_v3(source, spm_model)
    result = convert_here("deberta", "--from", "hf", "--source", source, "--output", output).check()
    assert_verified(result, "hidden states", "RTD logits")
    assert "MLM head (lm_predictions)" in result.stdout and "absolute position table" in result.stdout
    model = transformers.AutoModelForPreTraining.from_pretrained(output).eval()
    assert isinstance(model, posformers.DebertaForReplacedTokenDetection)
    assert model.config.clip_relative_positions is False  # transformers' arithmetic, as the verification's
    assert_weights_equal(model, state, {"mask_predictions.classifier.weight": "mask_predictions.classifier.weight"})
    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    inputs = dict(tokenizer([TEXT, "good"], padding=True, return_tensors="pt"))
    assert int(inputs["input_ids"].max()) < model.config.vocab_size
    with torch.no_grad():
        expected = model(**inputs).logits
    remote = load_with_remote_code(output, "AutoModelForPreTraining", inputs, workdir)
    assert (remote["logits"] - expected).abs().max().item() <= VERIFY_TOLERANCE

    # the MLM head of the same checkpoint, on request: verified through the Enhanced Mask Decoder
    code, printed = run_in_process(
        capsys, "deberta", "--from", "hf", "--source", source, "--output", workdir / "mlm", "--head", "masked-lm"
    )
    assert code == 0, printed
    assert "MLM logits (Enhanced Mask Decoder" in printed and "replaced token detection head" in printed


def convert_once(tmp_path_factory, name: str, source, extra_args=()):
    """Run the conversion once per module on `source` into a directory `name`: (args, output, result)."""
    base = tmp_path_factory.mktemp(name)
    output = base / name
    args = ["deberta", "--from", "original" if "original" in name else "hf", "--source", source, "--output", output]
    args += list(extra_args)
    return args, output, convert_in_process(args).check()


@pytest.fixture(scope="module")
def original_v1_converted(tmp_path_factory):
    source = tmp_path_factory.mktemp("sources") / "deberta-base-original"
    state, deberta_id = write_original_v1(source)
    return (*convert_once(tmp_path_factory, "deberta-base-from-original", source), state, deberta_id)


@pytest.fixture(scope="module")
def original_v3_converted(tmp_path_factory, spm_model):
    source = tmp_path_factory.mktemp("sources") / "deberta-v3-original"
    state = write_original_v3(source, spm_model)
    return (*convert_once(tmp_path_factory, "deberta-v3-from-original", source / "pytorch_model.bin"), state)


def test_original_v1_release_with_bpe_encoder(original_v1_converted):
    _, output, result, state, deberta_id = original_v1_converted
    assert_verified(result, "hidden states", "MLM logits (Enhanced Mask Decoder, 2 steps)")
    model = posformers.DebertaForMaskedLM.from_pretrained(output)
    key = "deberta.encoder.layer.0.attention.self.pos_q_proj.bias"
    assert_weights_equal(model, state, {key: key})
    # bpe_encoder.bin became vocab.json + merges.txt with the repository's ids: [CLS] 1, [SEP] 2, words remapped
    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    gpt2 = transformers.GPT2Tokenizer(str(VOCAB_DIR / "gpt2" / "vocab.json"), str(VOCAB_DIR / "gpt2" / "merges.txt"))
    words = [deberta_id[i] for i in gpt2(TEXT)["input_ids"]]
    assert tokenizer(TEXT)["input_ids"] == [1, *words, 2]
    assert tokenizer.convert_tokens_to_ids("[MASK]") == 4 + len(deberta_id)


def test_original_v3_release_with_config_inside_the_state(original_v3_converted):
    _, output, result, state = original_v3_converted
    assert_verified(result, "hidden states", "RTD logits")
    assert "config" in result.stdout  # the non-tensor entry is reported, not loaded as a weight
    model = posformers.DebertaForReplacedTokenDetection.from_pretrained(output)
    assert model.config.position_buckets == 16 and model.config.share_att_key
    assert model.config.clip_relative_positions is True  # the repository's arithmetic
    assert_weights_equal(model, state, {"mask_predictions.classifier.bias": "mask_predictions.classifer.bias"})
    assert transformers.AutoTokenizer.from_pretrained(output).tokenize(TEXT)


# ---------------------------------------------------------------------------------------------------------------------
# Fine-tuned checkpoints: classification, token classification and QA heads
# ---------------------------------------------------------------------------------------------------------------------

MNLI_LABELS = {"0": "CONTRADICTION", "1": "NEUTRAL", "2": "ENTAILMENT"}
# microsoft/deberta-large-mnli's config.json fields beyond the encoder's, at a tiny size
MNLI_FIELDS = {
    "architectures": ["DebertaForSequenceClassification"],
    "id2label": MNLI_LABELS,
    "label2id": {label: int(i) for i, label in MNLI_LABELS.items()},
    "pooler_dropout": 0,
    "pooler_hidden_act": "gelu",
    "pooler_hidden_size": 32,
}
TASK_TENSORS = {
    "sequence": {"pooler.dense.weight": (32, 32), "pooler.dense.bias": (32,), "classifier.weight": (3, 32)},
    "token": {"classifier.weight": (5, 32), "classifier.bias": (5,)},
    "qa": {"qa_outputs.weight": (2, 32), "qa_outputs.bias": (2,)},
}
TASK_TENSORS["sequence"]["classifier.bias"] = (3,)


def random_batch(vocab_size: int = 128) -> dict[str, torch.Tensor]:
    """Two rows of ids inside the tiny vocabulary (the GPT-2 tokenizer's ids are not), the second one half padding."""
    input_ids = torch.randint(4, vocab_size, (2, 10), generator=torch.Generator().manual_seed(6))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def write_finetuned(directory, config: dict, task: str, spm_model=None, edit=None):
    """A fine-tuned checkpoint as transformers' DeBERTa task classes save it: encoder + the task head, fp16,
    pytorch_model.bin for v1 (with GPT-2 BPE files), model.safetensors for v2/v3 (with spm.model)."""
    directory.mkdir(parents=True)
    state = fp16({**random_encoder(config), **random_head("", TASK_TENSORS[task], seed=5)})
    state = {key.removeprefix("."): value for key, value in state.items()}
    if edit:
        edit(state)
    (directory / "config.json").write_text(json.dumps(config))
    if config["model_type"] == "deberta":
        torch.save(state, directory / "pytorch_model.bin")
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(VOCAB_DIR / "gpt2" / name, directory / name)
    else:
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(spm_model, directory / "spm.model")
    return state


@pytest.fixture(scope="module")
def mnli_converted(tmp_path_factory):
    """microsoft/deberta-large-mnli in miniature, converted by the console command."""
    source = tmp_path_factory.mktemp("sources") / "deberta-large-mnli"
    write_finetuned(source, {**V1_CONFIG, **MNLI_FIELDS}, "sequence")
    return (*convert_once(tmp_path_factory, "deberta-large-mnli-posformers", source), source)


def test_mnli_checkpoint_becomes_sequence_classification_with_its_labels(mnli_converted):
    _, output, result, source = mnli_converted
    table = assert_verified(result, "hidden states", "sequence classification logits")
    assert "absolute position table" in result.stdout  # dropped: position_biased_input is false
    model = transformers.AutoModelForSequenceClassification.from_pretrained(output).eval()
    assert isinstance(model, posformers.DebertaForSequenceClassification)
    assert model.config.id2label == {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}, model.config.id2label
    # transformers' own class on the source directory, independently of the converter's verification
    reference = transformers.DebertaForSequenceClassification.from_pretrained(source, dtype=torch.float32).eval()
    assert transformers.AutoTokenizer.from_pretrained(output).tokenize(TEXT)
    inputs = random_batch()
    with torch.no_grad():
        diff = (model(**inputs).logits - reference(**inputs).logits).abs().max().item()
    assert diff <= VERIFY_TOLERANCE and table["sequence classification logits"] <= VERIFY_TOLERANCE, diff


def test_v2_mnli_safetensors_with_word_embeddings_alias_and_no_labels(workdir, spm_model, capsys):
    """deberta-v2-xlarge-mnli's layout in safetensors carrying `word_embeddings._weight` beside the table; no
    id2label in config.json, so the classifier's three rows decide num_labels."""
    source, output = workdir / "deberta-v2-xlarge-mnli", workdir / "out"
    alias = "deberta.embeddings.word_embeddings._weight"
    config = {**V2_CONFIG, "architectures": ["DebertaV2ForSequenceClassification"]}
    write_finetuned(
        source, config, "sequence", spm_model, edit=lambda s: s.__setitem__(alias, s[alias.replace("._", ".")].clone())
    )
    code, printed = run_in_process(capsys, "deberta", "--from", "hf", "--source", source, "--output", output)
    assert code == 0, printed
    assert f"dropped {alias}: second name of the word embeddings" in printed
    assert_verified(ConvertResult(code, printed, ""), "hidden states", "sequence classification logits")
    model = posformers.DebertaForSequenceClassification.from_pretrained(output)
    assert model.config.num_labels == 3 and model.config.conv_kernel_size == 3

    # an alias that differs from the table it names is an inconsistent checkpoint: refused with both keys named
    shutil.rmtree(source)
    write_finetuned(
        source, config, "sequence", spm_model, edit=lambda s: s.__setitem__(alias, s[alias.replace("._", ".")] + 1)
    )
    printed = cli_failure(capsys, "deberta", "--from", "hf", "--source", source, "--output", workdir / "o2")
    assert f"{alias} differs from deberta.embeddings.word_embeddings.weight" in printed, printed


@pytest.mark.parametrize(
    ("task", "architectures", "rows", "class_name"),
    [
        ("token", None, ["token classification logits"], "DebertaForTokenClassification"),
        ("qa", ["DebertaV2ForQuestionAnswering"], ["QA start logits", "QA end logits"], "DebertaForQuestionAnswering"),
    ],
)
def test_v3_token_classification_and_qa_fine_tunes(task, architectures, rows, class_name, workdir, spm_model, capsys):
    """Token classification inferred from the tensors (`classifier.*` without a pooler, no `architectures`); QA from
    `architectures`; the QA checkpoint keeps its word embeddings only under the `_weight` alias."""
    source, output = workdir / f"deberta-v3-{task}", workdir / "out"
    config = {**V3_CONFIG, **({"architectures": architectures} if architectures else {})}
    alias = "deberta.embeddings.word_embeddings._weight"
    edit = (lambda s: s.__setitem__(alias, s.pop(alias.replace("._", ".")))) if task == "qa" else None
    state = write_finetuned(source, config, task, spm_model, edit)
    code, printed = run_in_process(capsys, "deberta", "--from", "hf", "--source", source, "--output", output)
    assert code == 0, printed
    table = assert_verified(ConvertResult(code, printed, ""), "hidden states", *rows)
    assert {*rows} <= set(table), table
    model = getattr(posformers, class_name).from_pretrained(output)
    head = "qa_outputs" if task == "qa" else "classifier"
    assert torch.equal(model.state_dict()[f"{head}.weight"], state[f"{head}.weight"].float())
    if task == "token":
        assert model.config.num_labels == 5
    else:
        assert "used as deberta.embeddings.word_embeddings.weight" in printed
        assert torch.equal(model.deberta.embeddings.word_embeddings.weight, state[alias].float())


def test_architectures_decides_the_head(workdir, spm_model, capsys):
    """config.json names the token classifier, but the weights hold a pooler too: the pooler is named, not silently
    taken as a sequence classifier; `--head model` keeps the encoder and drops the head with the reason."""
    source = workdir / "deberta-v3-ner"
    write_finetuned(source, {**V3_CONFIG, "architectures": ["DebertaV2ForTokenClassification"]}, "sequence", spm_model)
    printed = cli_failure(capsys, "deberta", "--from", "hf", "--source", source, "--output", workdir / "o")
    assert "pooler.dense.weight" in printed, printed
    args = ["deberta", "--from", "hf", "--source", source, "--output", workdir / "o", "--head", "model"]
    code, printed = run_in_process(capsys, *args)
    assert code == 0 and "fine-tuned task head: not part of the DebertaModel output" in printed, printed


def test_original_and_finetuned_outputs_load_with_remote_code_and_respect_overwrite(
    original_v1_converted, original_v3_converted, mnli_converted, workdir, convert_here
):
    """The three outputs in one fresh process without posformers (trust_remote_code); then --overwrite on the
    --from original output."""
    outputs = {
        "AutoModelForMaskedLM": original_v1_converted[1],
        "AutoModelForPreTraining": original_v3_converted[1],
        "AutoModelForSequenceClassification": mnli_converted[1],
    }
    jobs, expected = [], []
    for auto_name, output in outputs.items():
        model = getattr(transformers, auto_name).from_pretrained(output).eval()
        inputs = random_batch()
        with torch.no_grad():
            expected.append(model(**inputs).logits)
        jobs.append((output, auto_name, inputs))
    for remote, logits in zip(load_all_with_remote_code(jobs, workdir), expected, strict=True):
        assert (remote["logits"] - logits).abs().max().item() <= VERIFY_TOLERANCE
    args, output, *_ = original_v1_converted
    check_overwrite_behaviour(convert_here, args, output)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s: s.__setitem__("deberta.encoder.layer.1.attention.self.extra_bias", torch.ones(2)), "extra_bias"),
        (lambda s: s.pop("deberta.encoder.layer.0.attention.self.pos_proj.weight"), "pos_proj.weight"),
    ],
    ids=["extra", "missing"],
)
def test_original_accounting_stops_with_the_key_named(edit, named, workdir, capsys):
    source, output = workdir / "deberta-base-original", workdir / "out"
    write_original_v1(source, edit)
    printed = cli_failure(capsys, "deberta", "--from", "original", "--source", source, "--output", output)
    assert named in printed, printed


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda s: s.__setitem__("deberta.encoder.layer.0.attention.self.extra.weight", torch.ones(2).half()),
            "deberta.encoder.layer.0.attention.self.extra.weight",
        ),
        (lambda s: s.pop("deberta.encoder.rel_embeddings.weight"), "deberta.encoder.rel_embeddings.weight"),
        (lambda s: s.__setitem__("pooler.dense.weight", torch.ones(2, 2).half()), "pooler.dense.weight"),
        (
            lambda s: s.__setitem__("deberta.embeddings.position_embeddings.weight", torch.ones(7, 32).half()),
            "deberta.embeddings.position_embeddings.weight: expected (512, 32), found (7, 32)",
        ),
    ],
    ids=["extra", "missing", "unknown-head", "shape"],
)
def test_accounting_stops_with_the_key_named(edit, named, workdir, capsys):
    source, output = workdir / "deberta-base", workdir / "out"
    write_hf_v1(source, edit)
    printed = cli_failure(capsys, "deberta", "--from", "hf", "--source", source, "--output", output)
    assert named in printed, printed


def test_wrong_format_and_missing_head_are_refused(workdir, capsys):
    source = workdir / "deberta-base"
    write_hf_v1(source)
    printed = cli_failure(capsys, "deberta", "--from", "original", "--source", source, "--output", workdir / "o")
    assert "no model_config.json" in printed, printed
    printed = cli_failure(
        capsys, "deberta", "--from", "hf", "--source", source, "--output", workdir / "o", "--head", "rtd"
    )
    assert "no mask_predictions" in printed, printed


@pytest.mark.parametrize(
    ("change", "failing_row"),
    [
        # query and value biases of the last layer swapped: every hidden state of that layer moves
        ("swap-biases", "hidden states"),
        # a model whose decoder ran the last layer once instead of the official twice: only the EMD row can see it
        ("one-emd-step", "MLM logits (Enhanced Mask Decoder"),
    ],
)
def test_verification_catches_what_the_mapping_or_config_gets_wrong(change, failing_row, workdir, capsys, monkeypatch):
    from posformers.conversion import deberta

    source, output = workdir / "deberta-base", workdir / "out"
    write_hf_v1(source)
    if change == "swap-biases":
        original_key_map = deberta.key_map

        def swapped(*args, **kwargs):
            keys = original_key_map(*args, **kwargs)
            swap = {"q_bias": "v_bias", "v_bias": "q_bias"}
            rule = (
                r"deberta\.encoder\.layer\.1\.attention\.self\.(q_bias|v_bias)",
                lambda match, tensor: {f"deberta.encoder.layer.1.attention.self.{swap[match[1]]}": tensor},
            )
            rules = [rule, *((pattern.pattern, replacement) for pattern, replacement in keys.rules)]
            return deberta.core.KeyMap(rules, {pattern.pattern: reason for pattern, reason in keys.dropped})

        monkeypatch.setattr(deberta, "key_map", swapped)
    else:
        original_config = deberta.posformers_config
        monkeypatch.setattr(
            deberta,
            "posformers_config",
            lambda official: original_config(official).__class__(
                **{**original_config(official).to_dict(), "emd_steps": 1}
            ),
        )
    printed = cli_failure(capsys, "deberta", "--from", "hf", "--source", source, "--output", output)
    assert "verification failed" in printed, printed
    failed = printed.split("verification failed:")[1]
    assert failing_row in failed and (change == "swap-biases" or "hidden states" not in failed), failed


# ---------------------------------------------------------------------------------------------------------------------
# Files as the original code writes them: each output is compared with what that code computes
# ---------------------------------------------------------------------------------------------------------------------


def transformers_encoder(config: dict, state: dict[str, torch.Tensor]):
    """transformers' DebertaV2Model for `config` (official fields) holding the `deberta.*` tensors of `state`, fp32:
    the encoder the original code runs (they agree to ~5e-6); the parts in question are written out by each
    test."""
    fields = {key: value for key, value in config.items() if key not in ("model_type", "pooling", "padding_idx")}
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(**fields, legacy=False)).eval()
    encoder = {
        key.removeprefix("deberta."): value.float() for key, value in state.items() if key.startswith("deberta.")
    }
    if not fields.get("position_biased_input", True):
        encoder.pop("embeddings.position_embeddings.weight")
    model.load_state_dict(encoder, strict=True)
    return model


def write_original(directory, state: dict[str, torch.Tensor], config: dict, spm_model) -> None:
    """A repository release as its code writes it: pytorch_model.bin, model_config.json (`config`), spm.model."""
    directory.mkdir()
    torch.save(state, directory / "pytorch_model.bin")
    (directory / "model_config.json").write_text(json.dumps(config))
    shutil.copy(spm_model, directory / "spm.model")


def convert_verified(capsys, source_format: str, source, output, *rows: str) -> str:
    """Convert in this process; the verification table has `hidden states` and `rows`, all within tolerance."""
    code, printed = run_in_process(capsys, "deberta", "--from", source_format, "--source", source, "--output", output)
    assert code == 0, printed
    assert_verified(ConvertResult(code, printed, ""), "hidden states", *rows)
    return printed


def assert_matches_on_real_tokens(ours: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> float:
    diff = (ours[mask.bool()] - reference[mask.bool()]).abs().max().item()
    assert diff <= VERIFY_TOLERANCE, diff
    return diff


POOLER_CASES = {
    # a fine-tune from the repository: model_config.json with its `pooling` section (tanh)
    "original-pooling-tanh": ("original", {"pooling": {"dropout": 0.1, "hidden_act": "tanh"}}, "tanh"),
    # no section: the official PoolConfig falls back to the model config, i.e. the model's own hidden_act
    "original-no-pooling": ("original", {"hidden_act": "relu"}, "relu"),
    # the repository's config copied into a config.json: transformers ignores `pooling`, the model ran it
    "hf-pooling-tanh": ("hf", {"pooling": {"dropout": 0.1, "hidden_act": "tanh"}}, "tanh"),
}


@pytest.mark.parametrize("case", list(POOLER_CASES))
def test_classifier_pooler_follows_the_official_pooling_section(case, workdir, spm_model, capsys):
    """Item 1: the official ContextPooler (dense on the first token, then PoolConfig's activation), written out."""
    source_format, fields, activation = POOLER_CASES[case]
    source, output = workdir / "fine-tuned", workdir / "out"
    config = {**V3_CONFIG, **fields}
    if source_format == "hf":
        state = {key: value.float() for key, value in write_finetuned(source, config, "sequence", spm_model).items()}
    else:
        state = {**random_encoder(config), **random_head("x", TASK_TENSORS["sequence"], seed=5)}
        state = {key.removeprefix("x."): value for key, value in state.items()}
        write_original(source, state, original_config(config), spm_model)
    convert_verified(capsys, source_format, source, output, "sequence classification logits")
    model = posformers.DebertaForSequenceClassification.from_pretrained(output).eval()
    batch = random_batch()
    with torch.no_grad():
        hidden = transformers_encoder(config, state)(**batch).last_hidden_state
        pooled = F.linear(hidden[:, 0], state["pooler.dense.weight"], state["pooler.dense.bias"])
        pooled = {"tanh": torch.tanh, "relu": torch.relu}[activation](pooled)
        expected = F.linear(pooled, state["classifier.weight"], state["classifier.bias"])
        diff = (model(**batch).logits - expected).abs().max().item()
    assert diff <= VERIFY_TOLERANCE, diff
    assert model.config.pooler_hidden_act == activation, model.config.pooler_hidden_act


def rtd_logits(hidden: torch.Tensor, state: dict[str, torch.Tensor], config: dict) -> torch.Tensor:
    """The official LMMaskPredictionHead (replaced_token_detection_model.py): LayerNorm(h + h[CLS]), dense,
    hidden_act, `classifer`."""
    head = {key.removeprefix("mask_predictions."): value for key, value in state.items()}
    states = F.layer_norm(
        hidden[:, :1] + hidden, (hidden.shape[-1],), head["LayerNorm.weight"], head["LayerNorm.bias"], 1e-7
    )
    states = transformers.activations.ACT2FN[config["hidden_act"]](
        F.linear(states, head["dense.weight"], head["dense.bias"])
    )
    return F.linear(states, head["classifer.weight"], head["classifer.bias"]).squeeze(-1)


def test_gdes_discriminator_from_the_official_rtd_trainer(workdir, spm_model, capsys):
    """Item 5: the repository's RTDModel with embedding_sharing "gdes" saves its discriminator with `_weight` (the
    residual) and `weight` (the buffer generator table + residual that its forward pre-hook sets and that the
    embeddings read), for the word and the position tables; model_config.json is rtd_base.json's discriminator."""
    source, output = workdir / "discriminator", workdir / "out"
    config = {key: value for key, value in V3_CONFIG.items() if key not in ("model_type", "pad_token_id")}
    config["attention_head_size"] = 8
    state = {**random_encoder(V3_CONFIG), **rtd_head("classifer")}
    generator = torch.Generator().manual_seed(7)
    for table in ("word_embeddings", "position_embeddings"):
        generator_table = torch.randn(state[f"deberta.embeddings.{table}.weight"].shape, generator=generator) * 0.2
        residual = torch.randn(generator_table.shape, generator=generator) * 0.2
        state[f"deberta.embeddings.{table}._weight"] = residual
        state[f"deberta.embeddings.{table}.weight"] = generator_table + residual
    write_original(source, state, config, spm_model)
    printed = convert_verified(capsys, "original", source, output, "RTD logits")
    assert "deberta.embeddings.position_embeddings._weight: GDES residual" in printed, printed
    model = posformers.DebertaForReplacedTokenDetection.from_pretrained(output).eval()
    batch = random_batch()
    with torch.no_grad():
        # the official discriminator's embeddings read `weight`; `_weight` only feeds the pre-hook that sets it
        ran = {key: value for key, value in state.items() if not key.endswith("._weight")}
        hidden = transformers_encoder(V3_CONFIG, ran)(**batch).last_hidden_state
        expected = rtd_logits(hidden, {k: v for k, v in state.items() if k.startswith("mask_predictions.")}, config)
        assert_matches_on_real_tokens(model(**batch).logits, expected, batch["attention_mask"])


def test_transformers_v3_mlm_folder_converts_with_emd_steps_0(workdir, spm_model, capsys):
    """Item 6: transformers' DebertaV2ForMaskedLM with the non-legacy head (`lm_predictions.lm_head.*`), saved by
    save_pretrained: no absolute position table. Its faithful conversion is the head transformers ran."""
    source, output = workdir / "deberta-v3-mlm", workdir / "out"
    fields = {key: value for key, value in V3_CONFIG.items() if key != "model_type"}
    torch.manual_seed(0)
    reference = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**fields, legacy=False)).eval()
    generator = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            offset = 1.0 if "LayerNorm.weight" in name else 0.0
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2 + offset)
    reference.save_pretrained(source)
    shutil.copy(spm_model, source / "spm.model")
    assert not any("position_embeddings" in key for key in reference.state_dict())

    printed = convert_verified(capsys, "hf", source, output, "MLM logits (emd_steps=0")
    assert "converted with emd_steps=0" in printed, printed
    model = posformers.DebertaForMaskedLM.from_pretrained(output).eval()
    assert model.config.emd_steps == 0
    batch = random_batch()
    with torch.no_grad():
        assert_matches_on_real_tokens(model(**batch).logits, reference(**batch).logits, batch["attention_mask"])


# The repository's experiments/language_model/bert_base.json at a tiny size: a BERT-style DeBERTa (absolute positions,
# no relative attention) whose config still says position_buckets 256 and pos_att_type "none".
BERT_BASE_CONFIG = {
    **{key: value for key, value in COMMON.items() if key not in ("relative_attention", "position_biased_input")},
    "relative_attention": False,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": "none",
    "position_biased_input": True,
    "attention_head_size": 8,
}


def test_bert_base_experiment_config_is_accepted(workdir, spm_model, capsys):
    """Item 7: the official code ignores position_buckets without relative attention, and "none" names no position
    term (scale 1 / sqrt(head_dim)); the MLM it trains (MaskedLanguageModel) adds positions at the input, no EMD."""
    source, output = workdir / "bert-base", workdir / "out"
    state = {**random_encoder({"model_type": "deberta-v2", **BERT_BASE_CONFIG}), **lm_head()}
    assert "deberta.encoder.LayerNorm.weight" in state and "deberta.encoder.rel_embeddings.weight" not in state
    write_original(source, state, BERT_BASE_CONFIG, spm_model)
    convert_verified(capsys, "original", source, output, "MLM logits")
    model = posformers.DebertaForMaskedLM.from_pretrained(output).eval()
    assert model.config.pos_att_type == [] and model.config.position_buckets == -1
    # transformers parses "none" as the official code does (an entry that adds no term) and ignores the buckets
    reference = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**BERT_BASE_CONFIG, legacy=False))
    reference.load_state_dict(state, strict=True)
    batch = random_batch()
    with torch.no_grad():
        expected = reference.eval()(**batch).logits
        assert_matches_on_real_tokens(model(**batch).logits, expected, batch["attention_mask"])


def test_talking_head_config_is_refused_with_the_field_named(workdir, capsys):
    source = workdir / "talking-head"
    write_original_v1(source)
    config = json.loads((source / "model_config.json").read_text())
    (source / "model_config.json").write_text(json.dumps({**config, "talking_head": True}))
    printed = cli_failure(capsys, "deberta", "--from", "original", "--source", source, "--output", workdir / "o")
    assert "talking_head" in printed, printed
