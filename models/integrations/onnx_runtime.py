"""Run, optimize and quantize a folder written by `posformers-export onnx` with ONNX Runtime on the CPU
(docs/deploying.md).

`OnnxModel(folder)(texts)` sorts the texts by token count, runs them in padded batches of similar length and gives
one {output name: array} per text, in input order, per-token outputs cut to the text's tokens: what posformers'
PyTorch models do without padding. `optimize(folder)` saves onnxruntime's extended graph optimizations into
`model.onnx`; `quantize(folder)` writes `model_int8.onnx` (weight MatMuls in int8, `quantize_dynamic`);
`check_int8(folder, texts)` compares the two graphs on real texts and writes `int8_check.json`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .export import ONNX_FILE, TOKENIZER_FILES

INT8_FILE = "model_int8.onnx"
INT8_CHECK_FILE = "int8_check.json"
QUANTIZE_TYPES = ("int8",)
# MatMuls by constants only (quantize_dynamic's default MatMulConstBOnly): onnxruntime's dynamic quantization has no
# integer Gemm, and quantizing Gather (the embedding tables) shrinks the file but changes every token's input.
QUANTIZED_OPS = ("MatMul",)


def _onnx_file(folder: str | Path, file: str = ONNX_FILE) -> Path:
    path = Path(folder) / file
    if not path.is_file():
        raise ValueError(f"folder: {folder} holds no {file} (not a posformers-export onnx folder)")
    return path


def _session_options(threads: int | None = None):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return options


def optimize(folder: str | Path) -> Path:
    """Replace `folder/model.onnx` (and its weights file) by the graph onnxruntime optimizes it to at
    ORT_ENABLE_EXTENDED, the highest level that is independent of the CPU it runs on; return its path."""
    import onnxruntime

    onnx_file = _onnx_file(folder)
    with tempfile.TemporaryDirectory(dir=onnx_file.parent) as scratch:
        options = _session_options()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(scratch) / ONNX_FILE)
        # Weights go to a file beside the graph, as torch's exporter writes them: a graph over 2 GiB cannot hold them.
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{ONNX_FILE}.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        onnxruntime.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        (onnx_file.parent / f"{ONNX_FILE}.data").unlink(missing_ok=True)
        for written in Path(scratch).iterdir():
            shutil.move(written, onnx_file.parent / written.name)
    return onnx_file


def check_quantize_type(to: str) -> None:
    if to not in QUANTIZE_TYPES:
        raise ValueError(f"quantize: unknown type {to!r}; choose one of {', '.join(QUANTIZE_TYPES)}")


def quantize(folder: str | Path, to: str = "int8") -> Path:
    """Write `folder/model_int8.onnx`: `folder/model.onnx` with its weight MatMuls dynamically quantized to int8 (per
    tensor); return its path."""
    check_quantize_type(to)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx_file = _onnx_file(folder)
    int8_file = onnx_file.parent / INT8_FILE
    quantize_dynamic(
        onnx_file, int8_file, op_types_to_quantize=list(QUANTIZED_OPS), per_channel=False,
        weight_type=QuantType.QInt8,
    )  # fmt: skip
    return int8_file


def read_texts(path: str | Path) -> list[str]:
    """Texts from a file: one per line, or from a .tsv (GLUE's layout) or .csv file the first column after its header
    row."""
    content = Path(path).read_text(encoding="utf-8")
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":  # quoted fields may hold commas, quotes and line breaks
        rows = list(csv.reader(io.StringIO(content)))[1:]
        return _non_empty([row[0] for row in rows if row and row[0].strip()], path)
    lines = [line for line in content.splitlines() if line.strip()]
    if suffix == ".tsv":
        lines = [line.split("\t")[0] for line in lines[1:]]
    return _non_empty(lines, path)


def _non_empty(lines: list[str], path) -> list[str]:
    if not lines:
        raise ValueError(f"texts: {path} holds no text")
    return lines


def tokenize(tokenizer, texts, text_pairs=None, names=("input_ids", "attention_mask"), max_length=None) -> list[dict]:
    """One feature dict (the inputs in `names`, unpadded) per text (and pair), truncated to `max_length`."""
    encoding = tokenizer(list(texts), text_pairs and list(text_pairs), truncation=True, max_length=max_length)
    return [{name: encoding[name][i] for name in names} for i in range(len(texts))]


def length_sorted_batches(features: Sequence[dict], batch_size: int) -> list[list[int]]:
    """Indices of `features` in batches of `batch_size`, by increasing token count: padded to their longest, the
    batches carry little padding."""
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class OnnxModel:
    """An exported folder's graph in an onnxruntime CPU session, with the folder's tokenizer.

    folder: written by `posformers-export onnx` (graph, config, tokenizer files).
    file: the graph to run, `model.onnx` (float32) or `model_int8.onnx` (after `--quantize int8`).
    threads: onnxruntime's intra-op threads (default: onnxruntime's, one per physical core).
    """

    def __init__(self, folder: str | Path, *, file: str = ONNX_FILE, threads: int | None = None, tokenizer=None):
        import onnxruntime
        from transformers import AutoTokenizer

        self.session = onnxruntime.InferenceSession(
            str(_onnx_file(folder, file)), _session_options(threads), providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        if len(self.session.get_inputs()[0].shape) != 2:
            raise ValueError(f"folder: {folder} holds a multiple-choice graph; run it with onnxruntime directly")
        if tokenizer is None and not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"folder: {folder} holds no tokenizer files; pass tokenizer= (or export from a folder)")
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(folder)
        # An output has a sequence axis when its second dimension follows the input's length.
        short, long = (self._run({name: np.ones((1, n), dtype=np.int64) for name in self.input_names}) for n in (3, 4))
        self.per_token = {n for n in self.output_names if short[n].ndim > 1 and short[n].shape[1] != long[n].shape[1]}

    def _run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(self.output_names, feed)))

    def run_features(self, features: Sequence[dict]) -> dict[str, np.ndarray]:
        """The graph's outputs on `features` (see `tokenize`) right-padded to one batch."""
        batch = self.tokenizer.pad(
            [{name: f[name] for name in self.input_names} for f in features], return_tensors="np"
        )
        return self._run({name: batch[name].astype(np.int64) for name in self.input_names})

    def __call__(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        *,
        batch_size: int = 32,
        max_length: int | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """The graph's outputs for each text (and pair), in input order; per-token outputs cut to the text's tokens.

        The texts are tokenized (truncated to `max_length`, default the tokenizer's), sorted by token count and run
        in right-padded batches of `batch_size`.
        """
        features = tokenize(self.tokenizer, texts, text_pairs, self.input_names, max_length)
        results: list[dict[str, np.ndarray]] = [{} for _ in features]
        for rows in length_sorted_batches(features, batch_size):
            outputs = self.run_features([features[i] for i in rows])
            for row, i in enumerate(rows):
                length = len(features[i]["input_ids"])
                results[i] = {
                    name: value[row, :length] if name in self.per_token else value[row]
                    for name, value in outputs.items()
                }
        return results


def _softmax(scores: np.ndarray) -> np.ndarray:
    exponentials = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def compare(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]) -> dict[str, dict]:
    """Per output, how far `candidate`'s outputs are from `reference`'s (lists of `OnnxModel` results): the largest
    absolute difference and, for scores (`*logits`), the share of equal predictions (argmax over the last axis, per
    token for per-token outputs) and the largest difference of softmax probabilities."""
    report = {}
    for name in reference[0]:
        expected = [r[name] for r in reference]
        actual = [c[name] for c in candidate]
        entry = {"max_abs_difference": max(float(np.abs(e - a).max()) for e, a in zip(expected, actual))}
        if name.endswith("logits"):
            same = [e.argmax(-1) == a.argmax(-1) for e, a in zip(expected, actual)]
            entry["label_agreement"] = float(np.concatenate([np.ravel(s) for s in same]).mean())
            entry["max_score_difference"] = max(
                float(np.abs(_softmax(e) - _softmax(a)).max()) for e, a in zip(expected, actual)
            )
        report[name] = entry
    return report


def describe(entry: dict) -> str:
    """One line of a `compare` entry."""
    parts = [f"max |difference| {entry['max_abs_difference']:.3g}"]
    if "label_agreement" in entry:
        parts = [f"label agreement {100 * entry['label_agreement']:.2f}%",
                 f"max score difference {entry['max_score_difference']:.3g}", *parts]  # fmt: skip
    return ", ".join(parts)


def check_int8(folder: str | Path, texts: Sequence[str]) -> dict:
    """Run the float32 and int8 graphs of `folder` on `texts`, write their agreement (see `compare`) to
    `folder/int8_check.json` and return it."""
    reference = OnnxModel(folder)
    fp32 = reference(texts)
    int8 = OnnxModel(folder, file=INT8_FILE, tokenizer=reference.tokenizer)(texts)
    report = {
        "reference": ONNX_FILE,
        "quantized": INT8_FILE,
        "texts": len(texts),
        "quantized_ops": list(QUANTIZED_OPS),
        "per_channel": False,
        "outputs": compare(fp32, int8),
    }
    path = Path(folder) / INT8_CHECK_FILE
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def file_size(folder: str | Path, file: str = ONNX_FILE) -> int:
    """Bytes of a graph and its external weights file."""
    path = Path(folder) / file
    data = Path(f"{path}.data")
    return os.path.getsize(path) + (os.path.getsize(data) if data.is_file() else 0)
