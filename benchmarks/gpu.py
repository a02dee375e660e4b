"""The GPU suite: posformers' fused attention against the fastest encoders, every row in one run.

    python -m benchmarks.gpu --device cuda --dtype bfloat16          # everything, on one GPU
    python -m benchmarks.gpu --device cpu --smoke --output /tmp/gpu.json   # tiny sizes: proves the script runs

Writes benchmarks/results/gpu.json and gpu.md (or --output and its .md), with the device's name, torch and
transformers versions, every measurement and the suite's targets, each met, missed or not measured.

Sections (all models random-initialised, dropout 0 so that the training step runs the same kernels as inference):

- encoders: DeBERTa-v3-base and RoFormer-base, forward and forward+backward, at 512, 2048 and 8192 tokens, batch
  16384 // length (about 16k tokens per batch, no padding). Rows: posformers' DeBERTa with "posformers_fused" and
  with "sdpa" (its CPU default); transformers' DebertaV2Model (its default attention); `flashdeberta`'s
  FlashDebertaV2Model and transformers' DebertaV2 with `disentangled_flash.optimize_deberta`, each only where the
  package imports (else skipped with the reason printed); posformers' RoFormer (its default); transformers' BERT with
  "sdpa"; transformers' ModernBERT (width 768, 12 layers, 12 heads, its GLU MLP 2048 wide: BERT-base's parameter
  count, its default attention). Time is the median of the timed runs; peak memory is CUDA's peak allocation over
  one step beyond what was allocated before it.
- realbatch: mixed-length real batches, the realbatch workload (SST-2, MRPC and SQuAD windows from tests/data,
  tokenized and batched as benchmarks/realbatch.py does, in random order), real tokens per second of forward and of
  forward+backward for posformers' DeBERTa-v3-base (fused, padding-free), RoFormer-base (padding-free), transformers'
  DebertaV2, BERT-sdpa and ModernBERT-base, all fed the same padded batches.
- long: LittleBird-base against transformers' BigBird (block-sparse) and Longformer (window 512) at 4096 to 32768
  tokens, batch 1, forward and forward+backward, time and peak memory (a cell that runs out of memory says so); then
  the longest input LittleBird trains on (one forward+backward at batch 1), doubling from 4096 until memory runs out.

On CPU (`--smoke`) every model is tiny and the lengths are short: the numbers mean nothing, only that every row runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    BertConfig,
    BertModel,
    BigBirdConfig,
    BigBirdModel,
    DebertaV2Config,
    DebertaV2Model,
    LongformerConfig,
    LongformerModel,
    ModernBertConfig,
    ModernBertModel,
)

import posformers

from . import littlebird, realbatch
from .harness import RESULTS_DIR, SharedWeights, environment

TOKENS_PER_BATCH = 16384
ENCODER_LENGTHS = (512, 2048, 8192)
LONG_LENGTHS = (4096, 8192, 16384, 32768)
LONGEST_CAP = 1 << 20
REAL_WORKLOADS = ("sst2", "mrpc", "squad")
SMOKE_SIZE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
SMOKE = dict(tokens_per_batch=64, encoder_lengths=(16, 32), long_lengths=(64, 128), longest_cap=512)
WORKLOADS = ("forward", "train")
# Where the targets read their numbers: (section, row, length or workload, workload).
DEBERTA_FUSED, DEBERTA_HF, DISENTANGLED_FLASH = (
    "DeBERTa-v3 posformers_fused",
    "DeBERTa-v3 transformers",
    ("DeBERTa-v3 disentangled-flash"),
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


def no_dropout(fields: dict[str, Any], smoke: bool) -> dict[str, Any]:
    return dict(fields, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **(SMOKE_SIZE if smoke else {}))


def deberta_config(smoke: bool) -> DebertaV2Config:
    return DebertaV2Config(**no_dropout(realbatch.deberta.V3_BASE, smoke))


def with_attention(model: nn.Module, implementation: str) -> nn.Module:
    model.set_attn_implementation(implementation)
    if model.config._attn_implementation != implementation:
        raise RuntimeError(f"{type(model).__name__} runs {model.config._attn_implementation!r}, not {implementation!r}")
    return model


def posformers_deberta(implementation: str, smoke: bool) -> Callable[[], nn.Module]:
    def build():
        config = posformers.DebertaConfig(**deberta_config(smoke).to_dict())
        return with_attention(posformers.DebertaModel(config), implementation)

    return build


def flashdeberta(smoke: bool) -> Callable[[], nn.Module]:
    from flashdeberta import FlashDebertaV2Model

    return lambda: FlashDebertaV2Model(deberta_config(smoke))


def disentangled_flash(smoke: bool, lengths) -> Callable[[], nn.Module]:
    from disentangled_flash import optimize_deberta

    def build():
        model = DebertaV2Model(deberta_config(smoke)).eval()  # its default inference mode prepares eval models only
        optimize_deberta(model, sequence_lengths=sorted(set(lengths)))
        return model

    return build


def roformer_base(smoke: bool, max_length: int) -> Callable[[], nn.Module]:
    fields = no_dropout(realbatch.roformer.BASE, smoke)
    return lambda: posformers.RoFormerModel(posformers.RoFormerConfig(**fields, max_position_embeddings=max_length))


def bert_sdpa(smoke: bool, max_length: int) -> Callable[[], nn.Module]:
    fields = no_dropout(dict(realbatch.roformer.BASE, vocab_size=30522), smoke)
    config = BertConfig(**fields, max_position_embeddings=max_length)
    return lambda: with_attention(BertModel(config, add_pooling_layer=False), "sdpa")


def modernbert_base(smoke: bool, max_length: int) -> Callable[[], nn.Module]:
    size = SMOKE_SIZE if smoke else dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)
    # ModernBERT's MLP is a GLU (two input projections): 2048 wide it has BERT-base's 3072-wide MLP's parameters.
    intermediate = size.get("intermediate_size", 2048)
    config = ModernBertConfig(
        **dict(size, intermediate_size=intermediate),
        vocab_size=50368,
        max_position_embeddings=max_length,
        attention_dropout=0.0,
        embedding_dropout=0.0,
        mlp_dropout=0.0,
    )
    return lambda: ModernBertModel(config)


def optional_rows(smoke: bool, lengths) -> tuple[dict[str, Callable[[], nn.Module]], dict[str, str]]:
    """The rows of packages that may be missing: (name -> builder, name -> why skipped)."""
    rows, skipped = {}, {}
    for name, make in (
        ("DeBERTa-v3 flashdeberta", lambda: flashdeberta(smoke)),
        (DISENTANGLED_FLASH, lambda: disentangled_flash(smoke, lengths)),
    ):
        try:
            rows[name] = make()
        except ImportError as error:
            skipped[name] = f"not importable here ({error})"
            log(f"skipping {name}: {skipped[name]}")
    return rows, skipped


def encoder_rows(smoke: bool, lengths) -> tuple[dict[str, Callable[[], nn.Module]], dict[str, str]]:
    longest = max(lengths)
    rows = {
        DEBERTA_FUSED: posformers_deberta("posformers_fused", smoke),
        "DeBERTa-v3 posformers sdpa": posformers_deberta("sdpa", smoke),
        DEBERTA_HF: lambda: DebertaV2Model(deberta_config(smoke)),
    }
    optional, skipped = optional_rows(smoke, lengths)
    rows.update(optional)
    rows.update(
        {
            "RoFormer posformers": roformer_base(smoke, longest),
            "BERT sdpa": bert_sdpa(smoke, longest),
            "ModernBERT": modernbert_base(smoke, longest),
        }
    )
    return rows, skipped


def long_rows(smoke: bool, max_length: int) -> dict[str, Callable[[], nn.Module]]:
    fields = no_dropout(littlebird.BASE, smoke)
    block = 16 if smoke else 64
    window = 32 if smoke else 512

    def littlebird_model():
        return posformers.LittleBirdModel(posformers.LittleBirdConfig(**fields, block_size=block, pack_length=block))

    def bigbird_model():
        config = BigBirdConfig(
            **fields,
            attention_type="block_sparse",
            block_size=block,
            num_random_blocks=1 if smoke else 3,
            max_position_embeddings=max_length,
        )
        return BigBirdModel(config, add_pooling_layer=False)

    def longformer_model():
        config = LongformerConfig(**fields, attention_window=window, max_position_embeddings=max_length + 2)
        return LongformerModel(config, add_pooling_layer=False)

    return {"LittleBird posformers": littlebird_model, "BigBird": bigbird_model, "Longformer": longformer_model}


# ---------------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_function(model: nn.Module, workload: str) -> Callable[[dict], None]:
    """One forward (inference mode) or forward+backward of the mean square of the last hidden states."""

    def forward(inputs):
        with torch.inference_mode():
            model(**inputs)

    def train(inputs):
        model.zero_grad(set_to_none=True)
        hidden = model(**inputs)[0]
        hidden.float().pow(2).mean().backward()

    return forward if workload == "forward" else train


def measure(model: nn.Module, workload: str, batches: list[dict], device, repeats: int, warmup: int) -> dict[str, Any]:
    """Median seconds per batch over `repeats` passes through `batches` (after `warmup` untimed ones), and on CUDA
    the peak memory of one step on the first batch. Running out of memory is a result, not a failure."""
    model.train(workload == "train")
    step = step_function(model, workload)
    try:
        for _ in range(warmup):
            for inputs in batches:
                step(inputs)
        times = []
        for _ in range(repeats):
            for inputs in batches:
                synchronize(device)
                start = time.perf_counter()
                step(inputs)
                synchronize(device)
                times.append(time.perf_counter() - start)
        result = {"median_ms": sorted(times)[len(times) // 2] * 1e3, "total_s": sum(times) / repeats}
        if device.type == "cuda":
            model.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            step(batches[0])
            synchronize(device)
            result["peak_mib"] = (torch.cuda.max_memory_allocated(device) - before) / 2**20
        return result
    except torch.cuda.OutOfMemoryError:
        return {"error": "out of memory"}
    finally:
        model.zero_grad(set_to_none=True)
        release(None, device)


def random_batch(batch: int, length: int, vocab_size: int, device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, min(vocab_size, 30000), (batch, length), generator=generator)
    return {"input_ids": input_ids.to(device), "attention_mask": torch.ones_like(input_ids, device=device)}


def on_device(build: Callable[[], nn.Module], device, dtype) -> nn.Module:
    torch.manual_seed(0)
    return build().to(device=device, dtype=dtype)


def release(model: nn.Module | None, device) -> None:
    """Let the caching allocator give `model`'s memory back before the next row (CUDA only: on CPU the memory goes
    with the last reference, and a full collection costs seconds in a process that holds a test suite)."""
    del model
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def fused_equivalence(options: argparse.Namespace, device, dtype) -> dict[str, float]:
    """posformers' fused DeBERTa against transformers' DebertaV2 on the same weights, before anything is timed: the
    relative error (in norm) of the last hidden states at real tokens, on a padded batch and run padding-free."""
    torch.manual_seed(0)
    reference = DebertaV2Model(deberta_config(options.smoke))
    ours = posformers.DebertaModel(posformers.DebertaConfig(**reference.config.to_dict()))
    ours = with_attention(SharedWeights(lambda: reference).load_into(ours), "posformers_fused")
    reference, ours = (model.to(device=device, dtype=dtype).eval() for model in (reference, ours))
    length = options.encoder_lengths[0]
    inputs = random_batch(2, length, reference.config.vocab_size, device)
    inputs["attention_mask"][1, length // 2 :] = 0
    real = inputs["attention_mask"].bool()
    errors = {}
    with torch.inference_mode():
        expected = reference(**inputs).last_hidden_state[real].float()
        for unpad in ("never", "always"):
            ours.config.unpad_inputs = unpad
            actual = ours(**inputs).last_hidden_state[real].float()
            errors[f"unpad_inputs={unpad}"] = ((actual - expected).norm() / expected.norm()).item()
    release(ours, device)
    log(f"fused DeBERTa vs transformers' DebertaV2, relative error: {errors}")
    return errors


def run_encoders(options: argparse.Namespace, device, dtype) -> dict[str, Any]:
    lengths = options.encoder_lengths
    equivalence = fused_equivalence(options, device, dtype)
    rows, skipped = encoder_rows(options.smoke, lengths)
    cells = []
    for name, build in rows.items():
        log(f"encoders: {name}")
        model = on_device(build, device, dtype)
        for length in lengths:
            inputs = random_batch(max(options.tokens_per_batch // length, 1), length, model.config.vocab_size, device)
            for workload in WORKLOADS:
                result = measure(model, workload, [inputs], device, options.repeats, options.warmup)
                cells.append(dict(row=name, length=length, batch=inputs["input_ids"].shape[0], workload=workload))
                cells[-1].update(result)
                log(f"  {length} {workload}: {result}")
        release(model, device)
    return {"equivalence": equivalence, "cells": cells, "skipped": skipped}


def real_batches(options: argparse.Namespace, device) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Each workload's timed batches (benchmarks/realbatch.py's random-order plan), padded, on the device."""
    specs = realbatch.QUICK_WORKLOADS if options.smoke else realbatch.WORKLOADS
    tokenizer = realbatch.wordpiece_tokenizer()
    batches = {}
    for name in REAL_WORKLOADS:
        features = realbatch.read_workload(specs[name], tokenizer)
        plan = realbatch.plan_batches(features, specs[name], grouped=False, token_types=False)
        batches[name] = [{key: value.to(device) for key, value in batch.inputs.items()} for batch in plan.timed]
    return batches


def run_realbatch(options: argparse.Namespace, device, dtype) -> dict[str, Any]:
    batches = real_batches(options, device)
    longest = max(b["input_ids"].shape[1] for workload in batches.values() for b in workload)
    rows = {
        DEBERTA_FUSED: posformers_deberta("posformers_fused", options.smoke),
        DEBERTA_HF: lambda: DebertaV2Model(deberta_config(options.smoke)),
        "RoFormer posformers": roformer_base(options.smoke, longest),
        "BERT sdpa": bert_sdpa(options.smoke, longest),
        "ModernBERT": modernbert_base(options.smoke, longest),
    }
    cells = []
    for name, build in rows.items():
        log(f"realbatch: {name}")
        model = on_device(build, device, dtype)
        for workload_name, workload_batches in batches.items():
            real_tokens = sum(int(b["attention_mask"].sum()) for b in workload_batches)
            for workload in WORKLOADS:
                result = measure(model, workload, workload_batches, device, options.repeats, options.warmup)
                if "total_s" in result:
                    result["tokens_per_s"] = real_tokens / result["total_s"]
                cells.append(dict(row=name, data=workload_name, workload=workload, real_tokens=real_tokens, **result))
                log(f"  {workload_name} {workload}: {result}")
        release(model, device)
    return {"cells": cells}


def run_long(options: argparse.Namespace, device, dtype) -> dict[str, Any]:
    lengths = options.long_lengths
    rows = long_rows(options.smoke, max(max(lengths), options.longest_cap))
    cells = []
    for name, build in rows.items():
        log(f"long: {name}")
        model = on_device(build, device, dtype)
        for length in lengths:
            inputs = random_batch(1, length, model.config.vocab_size, device)
            for workload in WORKLOADS:
                result = measure(model, workload, [inputs], device, options.repeats, options.warmup)
                cells.append(dict(row=name, length=length, workload=workload, **result))
                log(f"  {length} {workload}: {result}")
        if name == "LittleBird posformers":
            longest = longest_training_input(model, device, options)
        release(model, device)
    return {"cells": cells, "longest_littlebird_training_input": longest}


def longest_training_input(model: nn.Module, device, options: argparse.Namespace) -> dict[str, Any]:
    """The longest input (batch 1, doubling from the first long length) whose forward+backward fits in memory."""
    length, fits, limit = options.long_lengths[0], None, "cap"
    while length <= options.longest_cap:
        inputs = random_batch(1, length, model.config.vocab_size, device)
        result = measure(model, "train", [inputs], device, repeats=1, warmup=0)
        log(f"  longest: {length}: {result}")
        if "error" in result:
            limit = result["error"]
            break
        fits = dict(length=length, **result)
        length *= 2
    return {"fits": fits, "stopped_by": limit, "cap": options.longest_cap}


# ---------------------------------------------------------------------------------------------------------------------
# Targets and report
# ---------------------------------------------------------------------------------------------------------------------


def cell(cells: list[dict], **where) -> dict | None:
    return next((c for c in cells if all(c.get(k) == v for k, v in where.items())), None)


def ratio(numerator: dict | None, denominator: dict | None, key: str) -> float | None:
    if not numerator or not denominator or key not in numerator or key not in denominator:
        return None
    return numerator[key] / denominator[key]


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets, each with its measured value (None: not measured in this run)."""
    found = []

    def target(name: str, value: float | None, bound: float, at_least: bool) -> None:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        found.append(dict(target=name, value=value, bound=bound, at_least=at_least, met=met))

    encoders = report["sections"].get("encoders", {}).get("cells", [])
    ours = lambda length, workload: cell(encoders, row=DEBERTA_FUSED, length=length, workload=workload)  # noqa: E731
    theirs = lambda length, workload: cell(encoders, row=DEBERTA_HF, length=length, workload=workload)  # noqa: E731
    for length, workload, bound in ((512, "forward", 2), (8192, "forward", 5), (512, "train", 1.5), (2048, "train", 3)):
        speedup = ratio(theirs(length, workload), ours(length, workload), "median_ms")
        target(f"DeBERTa-v3 {workload} at {length}: speed-up over transformers' DebertaV2", speedup, bound, True)
    memory = ratio(ours(8192, "forward"), theirs(8192, "forward"), "peak_mib")
    target("DeBERTa-v3 forward peak memory at 8192 / transformers' DebertaV2", memory, 0.10, False)
    for length in ENCODER_LENGTHS:
        for workload in WORKLOADS:
            other = cell(encoders, row=DISENTANGLED_FLASH, length=length, workload=workload)
            slower = ratio(ours(length, workload), other, "median_ms")
            target(f"DeBERTa-v3 {workload} at {length}: time / disentangled-flash's", slower, 1.10, False)

    real = report["sections"].get("realbatch", {}).get("cells", [])
    for row, bound in ((DEBERTA_FUSED, 0.8), ("RoFormer posformers", 1.0)):
        for workload in WORKLOADS:
            ours_total = [c for c in real if c["row"] == row and c["workload"] == workload]
            modern = [c for c in real if c["row"] == "ModernBERT" and c["workload"] == workload]
            value = None
            if ours_total and modern and all("total_s" in c for c in ours_total + modern):
                value = sum(c["total_s"] for c in modern) / sum(c["total_s"] for c in ours_total)
            target(f"{row} real batches {workload}: tokens/s / ModernBERT's", value, bound, True)

    long = report["sections"].get("long", {}).get("cells", [])
    little = cell(long, row="LittleBird posformers", length=4096, workload="train")
    bigbird = cell(long, row="BigBird", length=4096, workload="train")
    target("LittleBird-base train at 4096: time / BigBird's", ratio(little, bigbird, "median_ms"), 0.25, False)
    target("LittleBird-base train at 4096: peak memory / BigBird's", ratio(little, bigbird, "peak_mib"), 0.30, False)
    return found


def number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def result_text(c: dict | None, key: str) -> str:
    if c is None:
        return "—"
    return c.get("error", number(c.get(key), 1 if key != "tokens_per_s" else 0))


def length_table(title: str, cells: list[dict]) -> list[str]:
    """A markdown table of median ms (peak MiB) per row, workload and length."""
    lengths = sorted({c["length"] for c in cells})
    header = [f"{workload} {length}" for workload in WORKLOADS for length in lengths]
    lines = [f"## {title}", "", "| row | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for row in dict.fromkeys(c["row"] for c in cells):
        values = []
        for workload in WORKLOADS:
            for length in lengths:
                c = cell(cells, row=row, length=length, workload=workload)
                memory = f" ({number(c['peak_mib'], 0)})" if c and "peak_mib" in c else ""
                values.append(result_text(c, "median_ms") + memory)
        lines.append(f"| {row} | " + " | ".join(values) + " |")
    return lines


def format_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# GPU suite on {env['device_name']} ({env['dtype']})",
        "",
        f"torch {env['torch']}, transformers {env['transformers']}, commit {env['git_commit']}"
        + (" — SMOKE RUN: tiny models, numbers mean nothing" if report["smoke"] else ""),
        "",
    ]
    sections = report["sections"]
    if "encoders" in sections:
        encoders = sections["encoders"]
        lines += length_table("Encoders: median ms per batch (peak MiB)", encoders["cells"])
        lines += [f"- skipped {name}: {why}" for name, why in encoders["skipped"].items()]
        errors = ", ".join(f"{k}: {v:.1e}" for k, v in encoders["equivalence"].items())
        lines += [f"- fused DeBERTa vs transformers' DebertaV2 on the same weights, relative error: {errors}", ""]
    if "realbatch" in sections:
        real = sections["realbatch"]["cells"]
        data = list(dict.fromkeys(c["data"] for c in real))
        lines += ["## Mixed-length real batches: real tokens/s", ""]
        header = [f"{workload} {name}" for workload in WORKLOADS for name in data]
        lines += ["| row | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
        for row in dict.fromkeys(c["row"] for c in real):
            values = [
                result_text(cell(real, row=row, data=d, workload=w), "tokens_per_s") for w in WORKLOADS for d in data
            ]
            lines.append(f"| {row} | " + " | ".join(values) + " |")
        lines.append("")
    if "long" in sections:
        long = sections["long"]
        lines += length_table("Long inputs, batch 1: median ms (peak MiB)", long["cells"])
        longest = long["longest_littlebird_training_input"]
        fits = longest["fits"]
        lines += [
            "",
            f"Longest input LittleBird trains on (batch 1): {fits['length'] if fits else 'none'} tokens "
            f"(stopped by: {longest['stopped_by']}, cap {longest['cap']}).",
            "",
        ]
    lines += ["## Targets", "", "| target | measured | bound | met |", "|---|---|---|---|"]
    for t in report["targets"]:
        met = {True: "yes", False: "NO", None: "not measured"}[t["met"]]
        lines.append(
            f"| {t['target']} | {number(t['value'])} | {'>=' if t['at_least'] else '<='} {t['bound']} | {met} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------

SECTIONS = {"encoders": run_encoders, "realbatch": run_realbatch, "long": run_long}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --smoke)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--smoke", action="store_true", help="tiny models and lengths: checks that every row runs")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--repeats", type=int, help="timed passes per cell (default: 5; smoke: 1)")
    parser.add_argument("--warmup", type=int, help="untimed passes per cell first (default: 2; smoke: 1)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "gpu.json", help="JSON path; .md beside it")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (use --device cpu --smoke for a CPU check)")
    if device.type == "cpu" and not args.smoke:
        parser.error("--device cpu runs only with --smoke: the suite's sizes are for a GPU")
    sizes = (
        SMOKE
        if args.smoke
        else dict(
            tokens_per_batch=TOKENS_PER_BATCH,
            encoder_lengths=ENCODER_LENGTHS,
            long_lengths=LONG_LENGTHS,
            longest_cap=LONGEST_CAP,
        )
    )
    for key, value in sizes.items():
        setattr(args, key, value)
    args.repeats = args.repeats or (1 if args.smoke else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 2)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    report = {
        "environment": environment(device, dtype, torch.get_num_threads()),
        "smoke": args.smoke,
        "options": {k: v for k, v in vars(args).items() if k not in ("output",)},
        "sections": {},
    }
    for name in args.sections:
        report["sections"][name] = SECTIONS[name](args, device, dtype)
    report["targets"] = targets(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    markdown = format_markdown(report)
    args.output.with_suffix(".md").write_text(markdown)
    sys.stdout.write(markdown)
    print(f"\nJSON: {args.output}\nmarkdown: {args.output.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
