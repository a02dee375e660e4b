"""CPU deployment of exported folders (`posformers.integrations.onnx_runtime`, `posformers-export onnx --optimize
--quantize int8`): the optimized graph still equals PyTorch, the int8 graph agrees with it on real SST-2 text, and the
length-sorted runner returns the PyTorch model's outputs in input order."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from helpers.data import DATA_DIR
from helpers.modeling import tiny_config
from transformers import AutoTokenizer

import posformers
from posformers.integrations import export, onnx_runtime

SST2_DEV = DATA_DIR / "glue" / "sst2" / "dev.tsv"
TOKENIZER = DATA_DIR.parents[1] / "finetune" / "demo_data" / "tokenizer"
TOLERANCE = 1e-4
# One head per model, so that the runner meets pooled (sequence classification), per-token (token classification)
# and per-position (question answering) outputs.
HEADS = {
    "roformer": (posformers.RoFormerConfig, posformers.RoFormerForTokenClassification),
    "deberta": (posformers.DebertaConfig, posformers.DebertaForSequenceClassification),
    "littlebird": (posformers.LittleBirdConfig, posformers.LittleBirdForQuestionAnswering),
}


def sst2_sentences(count: int | None = None) -> list[str]:
    return [line.split("\t")[0] for line in SST2_DEV.read_text().splitlines()[1:]][:count]


def saved_model(family: str, folder):
    """A tiny model of `family`'s head with the bert-base-uncased tokenizer, saved to `folder`."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    config_class, model_class = HEADS[family]
    torch.manual_seed(0)
    model = model_class(tiny_config(config_class, vocab_size=tokenizer.vocab_size, num_labels=2)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def pytorch_outputs(model, tokenizer, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """`model`'s tensor outputs on each text alone (no padding), as the runner returns them."""
    results = []
    with torch.no_grad():
        for text in texts:
            inputs = tokenizer(text, return_tensors="pt")
            outputs = export.tensor_outputs(
                model, {k: v for k, v in inputs.items() if k in export.input_names(model.config)}
            )
            results.append({name: value[0].numpy() for name, value in outputs.items()})
    return results


@pytest.mark.slow
@pytest.mark.parametrize("family", HEADS)
def test_optimized_and_int8_export_on_real_text(family, tmp_path, capsys):
    """`posformers-export onnx --optimize --quantize int8 --texts dev.tsv`: the optimized float32 graph, run by the
    length-sorted runner on SST-2 sentences, gives the PyTorch model's outputs in input order; the int8 graph is
    smaller, agrees with PyTorch's predictions, and its check on the 872 dev sentences is printed and written."""
    model, tokenizer = saved_model(family, tmp_path / "model")
    out = tmp_path / "onnx"
    argv = ["onnx", str(tmp_path / "model"), str(out), "--optimize", "--quantize", "int8", "--texts", str(SST2_DEV)]
    assert export.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == [f"wrote {out / 'model.onnx'} (optimized)", f"wrote {out / 'model_int8.onnx'}"]
    assert printed[-1] == f"wrote {out / 'int8_check.json'}"
    check = json.loads((out / "int8_check.json").read_text())
    assert check["texts"] == 872 and check["quantized_ops"] == ["MatMul"]
    output_names = [o.name for o in onnx.load(out / "model.onnx", load_external_data=False).graph.output]
    assert set(check["outputs"]) == set(output_names)
    for name, entry in check["outputs"].items():
        assert entry["label_agreement"] >= 0.95 and entry["max_score_difference"] < 0.05, (name, entry)
        assert printed[2 + output_names.index(name)].startswith(
            f"int8 vs float32 on 872 texts, {name}: label agreement"
        )
    # every MatMul by a weight became an integer MatMul; attention's query x key and probabilities x value did not
    fp32, int8 = (onnx.load(out / name, load_external_data=False).graph for name in ("model.onnx", "model_int8.onnx"))
    weights = {initializer.name for initializer in fp32.initializer}
    weight_matmuls = [n for n in fp32.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert len(weight_matmuls) >= 6 * model.config.num_hidden_layers
    assert sum(n.op_type == "MatMulInteger" for n in int8.node) >= len(weight_matmuls)
    assert sum(n.op_type in ("MatMul", "FusedMatMul") for n in int8.node) >= 2 * model.config.num_hidden_layers

    texts = sst2_sentences(40)
    expected = pytorch_outputs(model, tokenizer, texts)
    runner = onnx_runtime.OnnxModel(out)
    actual = runner(texts, batch_size=8)
    lengths = [len(tokenizer(text)["input_ids"]) for text in texts]
    assert lengths != sorted(lengths)  # the runner reorders, and must put the outputs back
    for got, want in zip(actual, expected, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].shape == want[name].shape, name
            assert np.abs(got[name] - want[name]).max() <= TOLERANCE, name
    int8 = onnx_runtime.OnnxModel(out, file=onnx_runtime.INT8_FILE)(texts, batch_size=8)
    # A tiny random model's scores nearly tie (answer positions most), so a few predictions may flip; probabilities
    # stay close.
    for name in expected[0]:
        same = np.concatenate([np.ravel(g[name].argmax(-1) == w[name].argmax(-1)) for g, w in zip(int8, expected)])
        assert same.mean() >= 0.9, name
        for got, want in zip(int8, expected):
            probabilities = (torch.from_numpy(x[name]).softmax(-1) for x in (got, want))
            assert (next(probabilities) - next(probabilities)).abs().max() < 0.05, name


@pytest.mark.slow
def test_optimize_rewrites_the_graph_and_keeps_its_outputs(tmp_path):
    """`optimize` replaces model.onnx by a graph of fewer nodes that still equals PyTorch within the export's
    tolerance on padded inputs at another length than the traced one."""
    model, _ = saved_model("roformer", tmp_path / "model")
    onnx_file = export.to_onnx(tmp_path / "model", tmp_path / "onnx")
    before = len(onnx.load(onnx_file, load_external_data=False).graph.node)
    onnx_runtime.optimize(tmp_path / "onnx")
    assert len(onnx.load(onnx_file, load_external_data=False).graph.node) < before
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir() if p.name.startswith("model")) == [
        "model.onnx",
        "model.onnx.data",
    ]
    model.config.unpad_inputs = "never"
    assert export.max_difference(model, onnx_file, export.example_inputs(model, 30, batch=3)) <= TOLERANCE


def test_texts_files_leave_out_a_header_row(tmp_path):
    """--texts: a .csv (quoted fields may hold commas) or .tsv file's first column after its header; else every line."""
    (tmp_path / "texts.csv").write_text('sentence,label\n"a gripping, funny film",1\ndull,0\n', encoding="utf-8")
    assert onnx_runtime.read_texts(tmp_path / "texts.csv") == ["a gripping, funny film", "dull"]
    (tmp_path / "texts.tsv").write_text("sentence\tlabel\na gripping, funny film\t1\n", encoding="utf-8")
    assert onnx_runtime.read_texts(tmp_path / "texts.tsv") == ["a gripping, funny film"]
    (tmp_path / "texts.txt").write_text("a gripping, funny film\n\ndull\n", encoding="utf-8")
    assert onnx_runtime.read_texts(tmp_path / "texts.txt") == ["a gripping, funny film", "dull"]
    (tmp_path / "header.csv").write_text("sentence,label\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no text"):
        onnx_runtime.read_texts(tmp_path / "header.csv")


def test_bad_input_stops_with_one_line(tmp_path, capsys):
    (tmp_path / "model.safetensors").write_bytes(b"not a graph")
    with pytest.raises(ValueError, match=r"^folder: .* holds no model\.onnx \(not a posformers-export onnx folder\)$"):
        onnx_runtime.quantize(tmp_path)
    with pytest.raises(ValueError, match=r"^folder: .* holds no model\.onnx"):
        onnx_runtime.OnnxModel(tmp_path)
    with pytest.raises(ValueError, match=r"^quantize: unknown type 'int4'; choose one of int8$"):
        onnx_runtime.quantize(tmp_path, "int4")
    with pytest.raises(ValueError, match=r"^quantize: unknown type 'int4'; choose one of int8$"):
        export.to_onnx(tmp_path, tmp_path / "out", quantize="int4")

    with pytest.raises(SystemExit) as exit_info:
        export.main(["onnx", str(tmp_path), str(tmp_path / "out"), "--quantize", "int4"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "posformers-export onnx: error: argument --quantize: invalid choice: 'int4' (choose from 'int8')"
    )
    assert export.main(["onnx", str(tmp_path), str(tmp_path / "out"), "--quantize", "int8"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: quantize: the int8 graph is checked on real text; pass texts (--texts FILE) or verify=False"
    )
    (tmp_path / "empty.txt").write_text("\n")
    assert export.main(["onnx", str(tmp_path), str(tmp_path / "out"), "--texts", str(tmp_path / "empty.txt")]) == 1
    assert capsys.readouterr().err.strip() == f"error: texts: {tmp_path / 'empty.txt'} holds no text"
