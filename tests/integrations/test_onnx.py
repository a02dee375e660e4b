"""ONNX export (`posformers.integrations.export`, `posformers-export onnx`): every head of the three models, run in
onnxruntime at lengths other than the traced one, with padding, against the PyTorch model as users run
it (padding-free by default)."""

from __future__ import annotations

import logging

import onnxruntime
import pytest
import torch
from helpers.data import DATA_DIR
from helpers.modeling import make_batch, max_diff, tiny_config
from helpers.remote import auto_heads

import posformers
from posformers.integrations import export

# Lengths the graphs (traced at 13 tokens) are run at: RoFormer beyond its 64 positions; DeBERTa past its 8 buckets and
# 16 relative positions; LittleBird (blocks of 4) at 2, 6 and 11 blocks.
SHORT_BUCKETS = dict(position_buckets=8, max_relative_positions=16)
MODELS = {
    "roformer": (posformers.RoFormerConfig, posformers.configuration_roformer.AUTO_MAP, {}, (6, 90)),
    "deberta": (posformers.DebertaConfig, posformers.configuration_deberta.AUTO_MAP, SHORT_BUCKETS, (6, 40)),
    "littlebird": (posformers.LittleBirdConfig, posformers.configuration_littlebird.AUTO_MAP, {}, (6, 23, 41)),
}
HEADS = [(family, name) for family, (_, auto_map, _, _) in MODELS.items() for name in auto_heads(auto_map).values()]
TOLERANCE = 1e-4


def build(family: str, class_name: str, **overrides):
    config_class, _, fields, _ = MODELS[family]
    if class_name.endswith("ForCausalLM"):
        overrides["is_decoder"] = True
    torch.manual_seed(0)
    return getattr(posformers, class_name)(tiny_config(config_class, **{**fields, **overrides})).eval()


def padded_inputs(model, seq_len: int, with_token_types: bool) -> dict[str, torch.Tensor]:
    """Three rows, two of them right-padded (at different lengths), with choices for multiple choice."""
    choices = 2 if type(model).__name__.endswith("ForMultipleChoice") else None
    pad_from = (None, max(2, seq_len * 2 // 3), max(2, seq_len // 3))
    input_ids, attention_mask, token_type_ids = make_batch(3, seq_len, pad_from=pad_from, seed=seq_len, choices=choices)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    return {**inputs, "token_type_ids": token_type_ids} if with_token_types else inputs


def assert_matches_pytorch(model, onnx_file, inputs: dict[str, torch.Tensor]) -> None:
    """onnxruntime's outputs equal `model(**inputs)`'s (as configured: padding-free by default) within TOLERANCE, on
    real tokens for per-token outputs."""
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in session.get_inputs()) == sorted(inputs)
    names = [o.name for o in session.get_outputs()]
    actual = dict(zip(names, session.run(names, {k: v.numpy() for k, v in inputs.items()})))
    with torch.no_grad():
        expected = model(**inputs)
    tensors = {k for k, v in expected.items() if isinstance(v, torch.Tensor)}
    assert set(names) == tensors, (names, tensors)
    mask = inputs["attention_mask"]
    for name in names:
        value, got = expected[name], torch.from_numpy(actual[name])
        assert got.shape == value.shape, name
        assert max_diff(got, value, mask) <= TOLERANCE, (name, tuple(mask.shape), max_diff(got, value, mask))


@pytest.mark.slow
@pytest.mark.parametrize(("family", "class_name"), HEADS)
def test_every_head_exports_with_dynamic_axes(family, class_name, tmp_path):
    # The heads on a one-layer encoder (the export traces every layer, and they are all alike): the base models keep
    # the tiny config's layers, so a graph of several layers is checked for each model.
    model = build(family, class_name, **({} if class_name.endswith("Model") else {"num_hidden_layers": 1}))
    config = (model.config.unpad_inputs, model.config._attn_implementation, model.training)
    onnx_file = export.to_onnx(model, tmp_path, verify=False)
    # the model is left as it was: its padding-free path and attention kernel, in eval mode
    assert (model.config.unpad_inputs, model.config._attn_implementation, model.training) == config
    token_types = model.config.type_vocab_size > 0
    for seq_len in MODELS[family][3]:
        assert_matches_pytorch(model, onnx_file, padded_inputs(model, seq_len, token_types))
    # one graph for every batch size too
    assert_matches_pytorch(model, onnx_file, {k: v[:1] for k, v in padded_inputs(model, 9, token_types).items()})


def test_deberta_graph_reads_the_position_bias_without_a_batch_sized_index(tmp_path):
    """In PyTorch the relative-position gathers read an (L, L) index expanded over batch and heads without a copy; an
    exported graph would copy it to (B, H, L, L) int64 in every layer (ONNX Expand): most of an int8 DeBERTa's time
    in ONNX Runtime at batch 32. The graph gathers from flattened tables instead. (A DeBERTa without token types: its
    graph has two inputs.)"""
    import onnx

    model = build("deberta", "DebertaModel", type_vocab_size=0)
    onnx_file = export.to_onnx(model, tmp_path, verify=False)
    operators = {node.op_type for node in onnx.load(str(onnx_file)).graph.node}
    assert not operators & {"Expand", "GatherElements"}, operators
    assert_matches_pytorch(model, onnx_file, padded_inputs(model, 30, with_token_types=False))


@pytest.mark.slow
def test_cli_exports_a_saved_model_with_its_tokenizer_on_real_text(tmp_path, capsys):
    """`posformers-export onnx MODEL_DIR OUT_DIR` on a saved RoFormer with a BERT tokenizer: the folder it writes
    holds the graph, config and tokenizer; tokenized SST-2 sentences, padded, give the model's outputs."""
    from transformers import AutoConfig, AutoTokenizer, BertTokenizer

    model_dir, out_dir = tmp_path / "model", tmp_path / "onnx"
    tokenizer = BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    model = posformers.RoFormerForSequenceClassification(
        tiny_config(posformers.RoFormerConfig, vocab_size=tokenizer.vocab_size, num_labels=2)
    ).eval()
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    assert export.main(["onnx", str(model_dir), str(out_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out_dir / 'model.onnx'}"
    exported_config = AutoConfig.from_pretrained(out_dir).to_diff_dict()
    assert {**exported_config, "_name_or_path": ""} == {**model.config.to_diff_dict(), "_name_or_path": ""}
    sentences = [line.split("\t")[0] for line in (DATA_DIR / "glue/sst2/dev.tsv").read_text().splitlines()[1:6]]
    inputs = dict(AutoTokenizer.from_pretrained(out_dir)(sentences, padding=True, return_tensors="pt"))
    assert inputs["attention_mask"].float().mean() < 1  # padded
    assert_matches_pytorch(model, out_dir / "model.onnx", inputs)


def test_cli_refuses_what_it_cannot_export(tmp_path, capsys):
    from transformers import BertConfig, BertModel

    BertModel(tiny_config(BertConfig)).save_pretrained(tmp_path / "bert")
    capsys.readouterr()
    assert export.main(["onnx", str(tmp_path / "bert"), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"error: model: {tmp_path / 'bert'} has architectures=['BertModel'], not one posformers model class "
        "(save it with a posformers model's save_pretrained)"
    )
    assert export.main(["onnx", str(tmp_path / "missing"), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == f"error: model: {tmp_path / 'missing'}: no such folder"
    with pytest.raises(ValueError, match="span-selection"):
        export.to_onnx(build("roformer", "RoFormerForQuestionSpanSelection"), tmp_path / "out")
    with pytest.raises(ValueError, match="dynamic NTK rope_parameters"):
        export.to_onnx(
            build("roformer", "RoFormerModel", rope_parameters={"rope_type": "dynamic", "factor": 2.0}), tmp_path
        )


def test_export_says_nothing_about_torchvision(tmp_path):
    """torch's exporter warns, on every export, that torchvision is not installed, once per detection operator
    (nms, roi_align, ...); a text model uses none of them, so the export drops those lines."""
    records = []
    recorder = logging.Handler()
    recorder.emit = records.append
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    registration.addHandler(recorder)
    try:
        export.to_onnx(build("roformer", "RoFormerModel", num_hidden_layers=1), tmp_path, verify=False)
    finally:
        registration.removeHandler(recorder)
    assert not [record.getMessage() for record in records if "torchvision" in record.getMessage()]


def test_export_check_catches_a_wrong_graph(tmp_path):
    """The onnxruntime check after export compares against PyTorch: a graph of other weights fails it."""
    model = build("roformer", "RoFormerForTokenClassification", num_hidden_layers=1)
    onnx_file = export.to_onnx(model, tmp_path)
    assert export.max_difference(model, onnx_file, export.example_inputs(model, 20)) <= TOLERANCE
    other = build("roformer", "RoFormerForTokenClassification", num_hidden_layers=1)
    with torch.no_grad():
        other.classifier.bias.add_(0.1)
    assert export.max_difference(other, onnx_file, export.example_inputs(other, 20)) > 1e-2
