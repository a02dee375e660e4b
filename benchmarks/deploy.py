"""CPU deployment: time per sentence, peak memory and file size of a sentence classifier run five ways, and the
SST-2 accuracy that int8 quantization keeps.

    python -m benchmarks.run --suite deploy [--quick] [--threads N] [--output benchmarks/results/deploy.json]

Models: RoFormer base (benchmarks/roformer.py's size) and DeBERTa-v3-base (benchmarks/deberta.py's), each as a
two-label sequence classifier with seeded random weights (speed does not depend on the values). Variants, all on the
same weights:

- transformers: transformers' own classifier (RoFormerForSequenceClassification, DebertaV2ForSequenceClassification),
  PyTorch float32, padded batches;
- posformers: posformers' classifier, PyTorch float32, padding-free (its default);
- ort-fp32: the graph of `posformers-export onnx --optimize`, run by `posformers.integrations.onnx_runtime.OnnxModel`;
- ort-int8: the same export's `--quantize int8` graph (weight MatMuls int8, per tensor);
- torch-int8: posformers' classifier after `torch.ao.quantization.quantize_dynamic` (every nn.Linear, qint8).

Workload: SST-2 dev sentences (tests/data/glue/sst2/dev.tsv) tokenized with finetune/demo_data/tokenizer
(bert-base-uncased's WordPiece vocabulary; its ids fit both models' vocabularies). Batch 1 runs sentences one at a
time; batch 32 runs them in length-sorted batches (`onnx_runtime.length_sorted_batches`, what OnnxModel does), the
same batches for every variant. Each (model, variant) runs in its own process: it loads the model, runs one untimed
warm-up batch, then times the batch-1 sentences and the batch-32 batches. ms_per_sentence is wall time over sentences;
peak_mib is the process's peak resident memory (VmHWM, reset before each batch size) minus its resident memory before
the model was loaded: weights, runtime arenas and activations. file_mib is the size of what a deployment ships (the
safetensors weights; the ONNX graph and its weights file; torch.save of the quantized state dict).

Accuracy: a small classifier of each model (SMALL: hidden 128, 2 layers, 2 heads, trained from scratch for one epoch
on tests/data/glue/sst2/train.tsv) is fine-tuned once and cached (`--cache-dir`, default ~/.cache/posformers/deploy;
reruns skip training and export), exported the same way, and every variant's SST-2 dev accuracy is measured on all 872
sentences. Before timing, every variant's logits on the timed sentences are compared with posformers PyTorch's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, DebertaV2Config, DebertaV2ForSequenceClassification
from transformers import RoFormerConfig as HFRoFormerConfig
from transformers import RoFormerForSequenceClassification as HFRoFormerForSequenceClassification

import posformers
from posformers.integrations import export, onnx_runtime

from . import deberta, roformer
from .harness import REPO_ROOT, RESULTS_DIR, _log, environment, write_outputs

SST2 = REPO_ROOT / "tests" / "data" / "glue" / "sst2"
TOKENIZER = REPO_ROOT / "finetune" / "demo_data" / "tokenizer"
VARIANTS = ("transformers", "posformers", "ort-fp32", "ort-int8", "torch-int8")
BATCHES = (1, 32)
SEED = 0
# (model, batch, variant, reference variant, largest time-per-sentence ratio)
TIME_TARGETS = tuple(
    (model, batch, "ort-int8", "posformers", 0.6) for model in ("roformer", "deberta") for batch in BATCHES
) + tuple((model, 1, "ort-fp32", "posformers", 1.0) for model in ("roformer", "deberta"))
MAX_ACCURACY_DROP = 1.0  # points of SST-2 dev accuracy, int8 vs float32 (ONNX Runtime)
FAMILIES = {
    # name: (transformers config, transformers classifier, posformers classifier, base size)
    "roformer": (
        HFRoFormerConfig,
        HFRoFormerForSequenceClassification,
        posformers.RoFormerForSequenceClassification,
        dict(roformer.BASE, max_position_embeddings=512),
    ),
    "deberta": (
        DebertaV2Config,
        DebertaV2ForSequenceClassification,
        posformers.DebertaForSequenceClassification,
        deberta.V3_BASE,
    ),
}
# What the cached exports are built by: a change to any of these exports again.
CODE_FILES = {
    family: [f"models/modeling_{family}.py", f"models/configuration_{family}.py", "models/packing.py",
             "models/integrations/export.py"]
    for family in FAMILIES
}  # fmt: skip
SMALL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@dataclass(frozen=True)
class Options:
    quick: bool = False
    threads: int = os.cpu_count() or 1
    cache_dir: Path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "posformers" / "deploy"

    @property
    def timed_sentences(self) -> dict[int, int]:
        """Sentences timed per batch size."""
        return {1: 8, 32: 16} if self.quick else {1: 64, 32: 192}

    @property
    def train_sentences(self) -> int | None:
        return 256 if self.quick else None


def read_sst2(split: str) -> tuple[list[str], list[int]]:
    rows = [line.split("\t") for line in (SST2 / f"{split}.tsv").read_text().splitlines()[1:]]
    return [row[0] for row in rows], [int(row[1]) for row in rows]


# ---------------------------------------------------------------------------------------------------------------------
# Models: one posformers folder per model and size, with transformers' classifier and the ONNX export beside it
# ---------------------------------------------------------------------------------------------------------------------


def configs(family: str, size: dict) -> tuple:
    """(transformers config, posformers config) of a two-label classifier; the posformers one is read from the
    transformers one's config.json, as a user's official file would be."""
    hf_config_class, _, model_class, _ = FAMILIES[family]
    hf_config = hf_config_class(**size, num_labels=2)
    with tempfile.TemporaryDirectory() as folder:
        hf_config.save_pretrained(folder)
        return hf_config, model_class.config_class.from_pretrained(folder)


def transformers_classifier(family: str, folder: Path):
    """transformers' classifier of `family` (its config saved beside `folder`) on the weights of the posformers
    classifier saved in `folder`."""
    hf_config_class, hf_model_class, _, _ = FAMILIES[family]
    model = hf_model_class(hf_config_class.from_pretrained(folder.parent / "transformers")).eval()
    from safetensors.torch import load_file

    result = model.load_state_dict(load_file(folder / "model.safetensors"), strict=False)
    # transformers' RoFormer keeps its sinusoidal table as a weight; posformers computes it.
    missing = [k for k in result.missing_keys if not k.endswith("embed_positions.weight")]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"{hf_model_class.__name__}: missing {missing}, unexpected {result.unexpected_keys}")
    return model


def build_folders(family: str, size: dict, kind: str, train: tuple | None, options: Options) -> tuple[Path, Path]:
    """(model folder, ONNX folder): a posformers classifier saved with the tokenizer (seeded random weights, or
    fine-tuned on `train` = (texts, labels)) and transformers' config beside it, exported with --optimize --quantize
    int8. Both live in the cache directory, the model folder named after `kind`, the family and the size, the ONNX
    folder after a hash of the code that exports it too: reruns skip what is there."""
    digest = hashlib.sha256(json.dumps([size, train is not None, SEED]).encode()).hexdigest()[:12]
    folder = options.cache_dir / f"{kind}-{family}-{digest}"
    code = b"".join((REPO_ROOT / path).read_bytes() for path in CODE_FILES[family])
    model_dir, onnx_dir = folder / "posformers", folder / f"onnx-{hashlib.sha256(code).hexdigest()[:12]}"
    if not (model_dir / "model.safetensors").is_file():
        hf_config, config = configs(family, {**size, **NO_DROPOUT})
        hf_config.save_pretrained(folder / "transformers")
        torch.manual_seed(SEED)
        model = FAMILIES[family][2](config)
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
        torch.set_num_threads(options.threads)
        if train is not None:
            fine_tune(model, tokenizer, *train)
        model.eval().save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    if not (onnx_dir / onnx_runtime.INT8_CHECK_FILE).is_file():
        _log(f"{family}: exporting {model_dir} to {onnx_dir}")
        texts = read_sst2("dev")[0][: options.timed_sentences[1]]
        export.to_onnx(model_dir, onnx_dir, optimize=True, quantize="int8", texts=texts)
    return model_dir, onnx_dir


def fine_tune(model, tokenizer, texts: list[str], labels: list[int], batch_size: int = 32) -> None:
    """One epoch of plain AdamW with a linear decay, in length-sorted batches taken in random order."""
    features = onnx_runtime.tokenize(tokenizer, texts, max_length=64)
    batches = onnx_runtime.length_sorted_batches(features, batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / len(batches)))
    model.train()
    generator = torch.Generator().manual_seed(SEED)
    started = time.perf_counter()
    for step, b in enumerate(torch.randperm(len(batches), generator=generator).tolist()):
        rows = batches[b]
        inputs = dict(tokenizer.pad([features[i] for i in rows], return_tensors="pt"))
        loss = model(**inputs, labels=torch.tensor([labels[i] for i in rows])).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 100 == 0:
            _log(
                f"  fine-tune step {step}/{len(batches)}: loss {loss.item():.3f}, {time.perf_counter() - started:.0f} s"
            )


# ---------------------------------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------------------------------


def load_variant(family: str, variant: str, folders: tuple[Path, Path], threads: int):
    """(run, file bytes): `run(features, rows)` returns the logits of `features[rows]` as one padded batch."""
    model_dir, onnx_dir = folders
    if variant.startswith("ort"):
        file = export.ONNX_FILE if variant == "ort-fp32" else onnx_runtime.INT8_FILE
        model = onnx_runtime.OnnxModel(onnx_dir, file=file, threads=threads)

        def run(features, rows):
            return torch.from_numpy(model.run_features([features[i] for i in rows])["logits"])

        return run, onnx_runtime.file_size(onnx_dir, file)
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if variant == "transformers":
        model = transformers_classifier(family, model_dir)
    else:
        model = FAMILIES[family][2].from_pretrained(model_dir).eval()
    size = os.path.getsize(model_dir / "model.safetensors")
    if variant == "torch-int8":
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        with tempfile.TemporaryDirectory() as scratch:
            torch.save(model.state_dict(), Path(scratch) / "model.pt")
            size = os.path.getsize(Path(scratch) / "model.pt")
    names = export.input_names(model.config)

    def run(features, rows):
        batch = tokenizer.pad([{n: features[i][n] for n in names} for i in rows], return_tensors="pt")
        with torch.inference_mode():
            return model(**batch).logits

    return run, size


def _memory_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def _reset_peak_memory() -> None:
    # Writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current one.
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def run_cell(family: str, variant: str, folders: tuple[Path, Path], sentences: dict[int, int], threads: int) -> dict:
    """Load one variant and time it at every batch size; in a process of its own (see `main`)."""
    tokenizer = AutoTokenizer.from_pretrained(folders[0])
    texts = read_sst2("dev")[0]
    features = onnx_runtime.tokenize(tokenizer, texts, names=("input_ids", "attention_mask", "token_type_ids"))
    before = _memory_kib("VmRSS")
    _reset_peak_memory()
    run, size = load_variant(family, variant, folders, threads)
    results = {}
    for batch in BATCHES:
        chosen = features[: sentences[batch]]
        batches = [[i] for i in range(len(chosen))] if batch == 1 else onnx_runtime.length_sorted_batches(chosen, batch)
        run(chosen, batches[0])  # warm-up: lazy initialisation, allocator arenas
        logits = [None] * len(chosen)
        started = time.perf_counter()
        for rows in batches:
            for row, value in zip(rows, run(chosen, rows)):
                logits[row] = value.tolist()
        elapsed = time.perf_counter() - started
        results[batch] = {
            "ms_per_sentence": 1000 * elapsed / len(chosen),
            "peak_mib": (_memory_kib("VmHWM") - before) / 1024,
            "file_mib": size / 2**20,
            "logits": logits,
            "load_average": os.getloadavg()[0],
        }
        _reset_peak_memory()
    return results


def accuracy(family: str, variant: str, folders: tuple[Path, Path], threads: int) -> float:
    texts, labels = read_sst2("dev")
    tokenizer = AutoTokenizer.from_pretrained(folders[0])
    features = onnx_runtime.tokenize(tokenizer, texts, names=("input_ids", "attention_mask", "token_type_ids"))
    run, _ = load_variant(family, variant, folders, threads)
    correct = 0
    for rows in onnx_runtime.length_sorted_batches(features, 32):
        predictions = run(features, rows).argmax(-1).tolist()
        correct += sum(predictions[k] == labels[i] for k, i in enumerate(rows))
    return 100 * correct / len(texts)


# ---------------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------------


def _cell_in_subprocess(family: str, variant: str, folders: tuple[Path, Path], options: Options) -> dict:
    arguments = dict(family=family, variant=variant, folders=[str(f) for f in folders],
                     sentences=options.timed_sentences, threads=options.threads)  # fmt: skip
    command = [sys.executable, "-m", "benchmarks.deploy", json.dumps(arguments)]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if completed.returncode:
        raise RuntimeError(f"{family} {variant} failed:\n{completed.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(completed.stdout.splitlines()[-1]).items()}


def main(options: Options, output: Path | None = None) -> tuple[dict, dict[str, Path]]:
    size = TINY if options.quick else None
    train_texts, train_labels = read_sst2("train")
    limit = options.train_sentences
    train = (train_texts[:limit], train_labels[:limit])
    rows, checks = [], []
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_at_start = os.getloadavg()
    for family, (_, _, _, base) in FAMILIES.items():
        timed = build_folders(family, size or base, "tiny" if options.quick else "base", None, options)
        small = build_folders(family, size or SMALL, "tiny-trained" if options.quick else "small", train, options)
        accuracies = {}
        for variant in VARIANTS:
            accuracies[variant] = accuracy(family, variant, small, options.threads)
            _log(f"{family} {variant}: SST-2 dev accuracy {accuracies[variant]:.2f}")
        cells = {}
        for variant in VARIANTS:
            _log(f"{family} {variant}: timing")
            cells[variant] = _cell_in_subprocess(family, variant, timed, options)
        for batch in BATCHES:
            reference = torch.tensor(cells["posformers"][batch]["logits"])
            for variant in VARIANTS:
                cell = cells[variant][batch]
                logits = torch.tensor(cell.pop("logits"))
                same = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
                checks.append(dict(model=family, batch=batch, variant=variant, label_agreement=same,
                                   max_logit_difference=(logits - reference).abs().max().item()))  # fmt: skip
                rows.append(dict(model=family, batch=batch, variant=variant, **cell, accuracy=accuracies[variant]))
    report = {
        "suite": "deploy",
        "description": __doc__.split("\n\n")[0],
        "started": started,
        "quick": options.quick,
        "load_average_at_start": load_at_start,
        "environment": environment(torch.device("cpu"), torch.float32, options.threads),
        "onnxruntime": __import__("onnxruntime").__version__,
        "sizes": {"timed": "tiny" if options.quick else "base", "accuracy": "tiny" if options.quick else SMALL},
        "sentences": options.timed_sentences,
        "rows": rows,
        "equivalence": checks,
        "targets": evaluate_targets(rows),
    }
    output = output or RESULTS_DIR / ("deploy-quick.json" if options.quick else "deploy.json")
    return report, write_outputs(report, output, format_markdown, plot)


def _row(rows: list[dict], model: str, batch: int, variant: str) -> dict:
    return next(r for r in rows if (r["model"], r["batch"], r["variant"]) == (model, batch, variant))


def evaluate_targets(rows: list[dict]) -> list[dict]:
    targets = []
    for model, batch, variant, reference, limit in TIME_TARGETS:
        ratio = (
            _row(rows, model, batch, variant)["ms_per_sentence"]
            / _row(rows, model, batch, reference)["ms_per_sentence"]
        )
        targets.append(dict(target=f"{model} batch {batch}: {variant} / {reference} time <= {limit}",
                            value=round(ratio, 3), met=ratio <= limit))  # fmt: skip
    for model in FAMILIES:
        drop = _row(rows, model, 1, "ort-fp32")["accuracy"] - _row(rows, model, 1, "ort-int8")["accuracy"]
        targets.append(dict(target=f"{model}: SST-2 accuracy ort-fp32 - ort-int8 <= {MAX_ACCURACY_DROP} point",
                            value=round(drop, 2), met=drop <= MAX_ACCURACY_DROP))  # fmt: skip
    return targets


def format_markdown(report: dict) -> str:
    lines = [
        f"# Deploying on CPU ({'quick run, tiny models' if report['quick'] else 'base size'})",
        "",
        f"{report['environment'].get('device_name', '')}, {report['environment'].get('torch_threads')} threads, "
        f"load average at start {report['load_average_at_start'][0]:.2f}; onnxruntime {report['onnxruntime']}. "
        f"Accuracy: SST-2 dev (872 sentences), small fine-tuned classifier ({report['sizes']['accuracy']}).",
        "",
        "| model | batch | variant | ms / sentence | x posformers | peak MiB | file MiB | SST-2 acc. | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        base = _row(report["rows"], row["model"], row["batch"], "posformers")["ms_per_sentence"]
        lines.append(
            f"| {row['model']} | {row['batch']} | {row['variant']} | {row['ms_per_sentence']:.2f} | "
            f"{row['ms_per_sentence'] / base:.2f} | {row['peak_mib']:.0f} | {row['file_mib']:.0f} | "
            f"{row['accuracy']:.2f} | {row['load_average']:.1f} |"
        )
    lines += ["", "| target | value | met |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['value']} | {'yes' if t['met'] else 'no'} |" for t in report["targets"]]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("plot: needs matplotlib (pip install 'posformers[bench]')") from error
    figure, axes = plt.subplots(1, len(BATCHES), figsize=(11, 4))
    models = list(FAMILIES)
    width = 0.8 / len(VARIANTS)
    for axis, batch in zip(axes, BATCHES):
        for k, variant in enumerate(VARIANTS):
            values = [_row(report["rows"], m, batch, variant)["ms_per_sentence"] for m in models]
            axis.bar([i + k * width for i in range(len(models))], values, width, label=variant)
        axis.set_xticks([i + width * (len(VARIANTS) - 1) / 2 for i in range(len(models))], models)
        axis.set_title(f"batch {batch}")
        axis.set_ylabel("ms per sentence")
    axes[0].legend(fontsize=8)
    figure.suptitle("SST-2 dev sentences on CPU" + (" (quick, tiny models)" if report["quick"] else ", base size"))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


if __name__ == "__main__":
    # One (model, variant) cell, run by `_cell_in_subprocess`: its results as one JSON line.
    cell = json.loads(sys.argv[1])
    folders = tuple(Path(f) for f in cell["folders"])
    sentences = {int(k): v for k, v in cell["sentences"].items()}
    print(json.dumps(run_cell(cell["family"], cell["variant"], folders, sentences, cell["threads"])))
