"""Export posformers models to ONNX (docs/integrations.md, "ONNX"): `posformers-export onnx MODEL_DIR OUT_DIR`, or
`to_onnx(model, out_dir)`, with dynamic axes, checked by onnxruntime against PyTorch at another length than traced.

How it exports: `torch.onnx.export(dynamo=True)`, traced under `torch.no_grad()` (torch's TorchScript exporter fails
on LittleBird's attention and mis-broadcasts RoFormer's at other lengths; optimum's requires transformers < 4.58). The
model runs its padded path (`unpad_inputs="never"`: packing decides shapes from the mask's values, which a graph for
every length cannot) with eager attention (torch.export cannot decompose DeBERTa's SDPA output reshape with symbolic
strides); both settings are put back on a model passed in. Where the models branch on a length (RoFormer's cached
rotary table, DeBERTa's relative-position rows, LittleBird's attention chunks), `torch.compiler.is_exporting()` picks
the branch that serves every length. `optimize` and `quantize` are `onnx_runtime`'s (docs/deploying.md).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, GenerationMixin, PretrainedConfig, PreTrainedModel

import posformers

ONNX_FILE = "model.onnx"
# Files a model folder's tokenizer may consist of; those present are copied next to the graph.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spm.model",
    "bpe_encoder.bin",
)
DEFAULT_OPSET = 18
DEFAULT_ATOL = 1e-4
# torch's ONNX exporter looks up torchvision's detection operators (nms, roi_align, ...) on every export and logs a
# warning for each when torchvision is not installed; no text model uses them.
_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"


def _not_about_torchvision(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("torchvision is not installed")


@contextlib.contextmanager
def _without_torchvision_notes():
    logger = logging.getLogger(_REGISTRATION_LOGGER)
    logger.addFilter(_not_about_torchvision)
    try:
        yield
    finally:
        logger.removeFilter(_not_about_torchvision)


def _posformers_class(config: PretrainedConfig, source) -> type[PreTrainedModel]:
    architectures = config.architectures or []
    model_class = getattr(posformers, architectures[0], None) if architectures else None
    if not (isinstance(model_class, type) and issubclass(model_class, PreTrainedModel)):
        raise ValueError(
            f"model: {source} has architectures={architectures}, not one posformers model class "
            "(save it with a posformers model's save_pretrained)"
        )
    return model_class


def load_for_export(source: str | Path) -> PreTrainedModel:
    """The posformers model saved in `source` (a folder or Hub id), as its `config.architectures` names it."""
    if not Path(source).exists() and (os.sep in str(source) or str(source).startswith(".")):
        raise ValueError(f"model: {source}: no such folder")
    config = AutoConfig.from_pretrained(source)
    return _posformers_class(config, source).from_pretrained(source).eval()


def input_names(config: PretrainedConfig) -> list[str]:
    """The graph's inputs: token types only where the model has a token-type table."""
    names = ["input_ids", "attention_mask"]
    return [*names, "token_type_ids"] if getattr(config, "type_vocab_size", 0) > 0 else names


def is_multiple_choice(model: PreTrainedModel) -> bool:
    return type(model).__name__.endswith("ForMultipleChoice")


def example_inputs(model: PreTrainedModel, seq_len: int, batch: int = 2, choices: int = 2, seed: int = 0) -> dict:
    """Random int64 inputs of `model`'s graph: `batch` rows (with choices for multiple choice), row 1 right-padded
    from its middle on, token types switching to 1 halfway."""
    config = model.config
    shape = (batch, choices, seq_len) if is_multiple_choice(model) else (batch, seq_len)
    generator = torch.Generator().manual_seed(seed)
    # Ids from 5 on keep clear of the special tokens of the models' vocabularies; id 0 pads.
    input_ids = torch.randint(5, config.vocab_size, shape, generator=generator)
    attention_mask = torch.ones(shape, dtype=torch.long)
    if batch > 1:
        attention_mask[1, ..., max(1, seq_len // 2) :] = 0
        input_ids[1, ..., max(1, seq_len // 2) :] = 0
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "token_type_ids" in input_names(config):
        token_type_ids = torch.zeros_like(input_ids)
        token_type_ids[..., seq_len // 2 :] = 1
        inputs["token_type_ids"] = token_type_ids
    return inputs


def trace_length(config: PretrainedConfig) -> int:
    """The length the graph is traced at: several LittleBird blocks, and no special value (0, 1, a table size)."""
    return 3 * getattr(config, "block_size", 4) + 1


def _call_options(model: PreTrainedModel) -> dict:
    # A causal LM would build a generation cache; the graph has no cache inputs or outputs.
    return {"return_dict": True, "use_cache": False} if isinstance(model, GenerationMixin) else {"return_dict": True}


class _NamedOutputs(torch.nn.Module):
    """`model` with positional inputs and its tensor outputs as a tuple, in `output_names`' order."""

    def __init__(self, model: PreTrainedModel, input_names: list[str], output_names: list[str]):
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.model(**dict(zip(self.input_names, inputs)), **_call_options(self.model))
        return tuple(outputs[name] for name in self.output_names)


def tensor_outputs(model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensor outputs of `model(**inputs)` by name, in order: what the graph returns."""
    with torch.no_grad():
        outputs = model(**inputs, **_call_options(model))
    return {name: value for name, value in outputs.items() if isinstance(value, torch.Tensor)}


def _check_exportable(model: PreTrainedModel) -> None:
    if not isinstance(model, (posformers.RoFormerPreTrainedModel, posformers.DebertaPreTrainedModel,
                              posformers.LittleBirdPreTrainedModel)):  # fmt: skip
        raise ValueError(f"model must be a posformers model, got {type(model).__name__}")
    if type(model).__name__.endswith("ForQuestionSpanSelection"):
        raise ValueError("model: a span-selection (pre-training) model is not exported; export ForQuestionAnswering")
    rope_type = (getattr(model.config, "rope_parameters", None) or {}).get("rope_type")
    if rope_type == "dynamic":
        raise ValueError("model: dynamic NTK rope_parameters recompute frequencies per length and cannot be exported")


def to_onnx(
    model: PreTrainedModel | str | Path,
    output_dir: str | Path,
    *,
    opset_version: int = DEFAULT_OPSET,
    verify: bool = True,
    atol: float = DEFAULT_ATOL,
    optimize: bool = False,
    quantize: str | None = None,
    texts: list[str] | None = None,
) -> Path:
    """Export `model` (a posformers model, or a folder / Hub id holding one) to `output_dir/model.onnx` with dynamic
    batch and sequence axes, write its config (and, from a folder, its tokenizer files) beside it, and return the
    ONNX file's path.

    verify: run the graph in onnxruntime (if installed) at a length other than the traced one, with padding, and
    raise ValueError if an output differs from PyTorch's by more than `atol` on real tokens.
    optimize: save onnxruntime's graph optimizations into the graph (checked as above).
    quantize: "int8" also writes the int8 graph; with `verify`, it is compared with the float32 one on `texts` (which
    needs the tokenizer files in the folder: export from a folder) and the comparison written to int8_check.json.
    """
    from . import onnx_runtime

    if quantize is not None:
        onnx_runtime.check_quantize_type(quantize)
    if quantize and verify and not texts:
        raise ValueError("quantize: the int8 graph is checked on real text; pass texts (--texts FILE) or verify=False")
    source = None if isinstance(model, PreTrainedModel) else Path(model)
    if source is not None:
        model = load_for_export(model)
    _check_exportable(model)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    onnx_file = output_dir / ONNX_FILE

    saved = model.training, model.config.unpad_inputs, model.config._attn_implementation
    model.eval()
    model.config.unpad_inputs = "never"
    model.config._attn_implementation = "eager"  # read at run time; set_attn_implementation refuses these models
    try:
        names = input_names(model.config)
        inputs = example_inputs(model, trace_length(model.config))
        outputs = list(tensor_outputs(model, inputs))
        batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
        axes = (
            {0: batch, 1: torch.export.Dim("choices"), 2: sequence}
            if is_multiple_choice(model)
            else {0: batch, 1: sequence}
        )
        # Traced without autograd: the graph is for inference, and LittleBird's training kernel (a custom autograd
        # Function around torch's private fused CPU attention) does not export.
        with torch.no_grad(), _without_torchvision_notes():
            torch.onnx.export(
                _NamedOutputs(model, names, outputs).eval(),
                tuple(inputs[name] for name in names),
                str(onnx_file),
                input_names=names,
                output_names=outputs,
                dynamic_shapes=(tuple(axes for _ in names),),  # forward(*inputs): one argument, a tuple
                opset_version=opset_version,
                dynamo=True,
                verbose=False,
            )
        if optimize:
            onnx_runtime.optimize(output_dir)
        if verify and importlib.util.find_spec("onnxruntime") is not None:
            length = 2 * trace_length(model.config) + 3
            difference = max_difference(model, onnx_file, example_inputs(model, length, batch=3, seed=1))
            if difference > atol:
                raise ValueError(
                    f"onnxruntime differs from PyTorch by {difference:.3g} > atol={atol} at length {length}"
                )
    finally:
        model.config.unpad_inputs = saved[1]
        model.config._attn_implementation = saved[2]
        model.train(saved[0])
    model.config.save_pretrained(output_dir)
    if source is not None and source.is_dir():
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, output_dir / name)
    if quantize:
        onnx_runtime.quantize(output_dir, quantize)
        if verify:
            onnx_runtime.check_int8(output_dir, texts)
    return onnx_file


def run_onnx(onnx_file: str | Path, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The graph's outputs on `inputs` (those it takes), run in onnxruntime on the CPU, as tensors by name."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return {name: torch.from_numpy(value) for name, value in zip(names, session.run(names, feed))}


def max_difference(model: PreTrainedModel, onnx_file: str | Path, inputs: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between the graph's outputs and `model`'s (padded path) on the real tokens of
    `inputs`; outputs without a sequence axis are compared whole."""
    expected = tensor_outputs(model, inputs)
    actual = run_onnx(onnx_file, inputs)
    mask = inputs["attention_mask"].bool()
    difference = 0.0
    for name, value in expected.items():
        got = actual[name]
        if got.shape != value.shape:
            raise ValueError(f"onnxruntime output {name} has shape {tuple(got.shape)}, PyTorch {tuple(value.shape)}")
        if value.shape[: mask.dim()] == mask.shape:
            got, value = got[mask], value[mask]
        difference = max(difference, (got - value).abs().max().item())
    return difference


def build_parser() -> argparse.ArgumentParser:
    from . import onnx_runtime  # imports this module

    parser = argparse.ArgumentParser(prog="posformers-export", description="Export posformers models.")
    formats = parser.add_subparsers(dest="format", metavar="format", required=True)
    onnx = formats.add_parser("onnx", help="ONNX graph with dynamic batch and sequence axes (onnxruntime-checked)")
    onnx.add_argument("model_dir", metavar="MODEL_DIR", help="folder (or Hub id) of a saved posformers model")
    onnx.add_argument("output_dir", metavar="OUT_DIR", help="folder to write model.onnx, config and tokenizer to")
    onnx.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset version")
    onnx.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="tolerance of the onnxruntime check")
    onnx.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    onnx.add_argument("--optimize", action="store_true", help="save onnxruntime's graph optimizations into model.onnx")
    onnx.add_argument(
        "--quantize",
        choices=onnx_runtime.QUANTIZE_TYPES,
        help="also write model_int8.onnx: weight MatMuls dynamically quantized",
    )
    onnx.add_argument(
        "--texts",
        type=Path,
        help="real texts to check the int8 graph on: one per line, or the first column of a .tsv or .csv (after its "
        "header row)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import onnx_runtime

    try:
        texts = onnx_runtime.read_texts(args.texts) if args.texts else None
        onnx_file = to_onnx(args.model_dir, args.output_dir, opset_version=args.opset, verify=not args.no_verify,
                            atol=args.atol, optimize=args.optimize, quantize=args.quantize, texts=texts)  # fmt: skip
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {onnx_file}" + (" (optimized)" if args.optimize else ""))
    if args.quantize:
        print(f"wrote {onnx_file.parent / onnx_runtime.INT8_FILE}")
        check = onnx_file.parent / onnx_runtime.INT8_CHECK_FILE
        if not args.no_verify:
            for name, entry in json.loads(check.read_text())["outputs"].items():
                print(f"int8 vs float32 on {len(texts)} texts, {name}: " + onnx_runtime.describe(entry))
            print(f"wrote {check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
