"""`make demo`: fine-tune a small RoFormer from scratch on real SST-2 with posformers-glue, reload it with
AutoModelForSequenceClassification and classify two sentences; then answer questions about a long document with a
small LittleBird through posformers-qa. Offline, on a CPU, on data shipped in posformers/demo_data.

    python -m posformers.finetune.demo [--output-dir demo_output/finetune] [--epochs 2] [--train-samples 30000] \
        [--skip-qa]

The SST-2 part trains a 2-layer, 128-wide RoFormer (4.2M parameters, 3.9M of them the 30,522-word embedding
table) on 30,000 real SST-2 training rows for 2 epochs and scores it on the 872 official dev sentences. What it reaches,
and why pretrained encoders do better, is stated once, in README.md, "The demo".
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

DEMO_DATA = Path(__file__).resolve().parent / "demo_data"
MARKER = ".posformers-demo"
ROFORMER = ",".join(
    [
        "hidden_size=128",
        "num_hidden_layers=2",
        "num_attention_heads=4",
        "intermediate_size=256",
        "max_position_embeddings=128",
    ]
)
PROBES = (
    "a gorgeous , witty , seductive movie .",
    "the plot is tedious and the acting is even worse .",
)


def prepare_output_dir(path: Path) -> None:
    """Refuse to write into a folder the demo did not create: nothing of the user's is overwritten."""
    if path.exists() and any(path.iterdir()) and not (path / MARKER).exists():
        raise SystemExit(f"{path} exists and was not made by this demo; pass another --output-dir")
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).touch()


def run_options(output_dir: Path, epochs: float, seed: int, logging_steps: int) -> list[str]:
    """What both steps' command lines share: training and evaluation into the demo's own folder, no checkpoints."""
    return [
        "--do_train", "--do_eval",
        "--output_dir", str(output_dir),
        "--overwrite_output_dir",  # the folder is the demo's own (checked by prepare_output_dir)
        "--num_train_epochs", str(epochs),
        "--save_strategy", "no",
        "--logging_steps", str(logging_steps),
        "--report_to", "none",
        "--seed", str(seed),
    ]  # fmt: skip


def glue_arguments(args, output_dir: Path) -> list[str]:
    """posformers-glue's command line for the SST-2 step (a new model: --model_type and --config_overrides)."""
    return [
        "--model_type", "posformers-roformer",
        "--config_overrides", ROFORMER,
        "--tokenizer_name", str(DEMO_DATA / "tokenizer"),
        "--task_name", "sst2",
        "--train_file", str(DEMO_DATA / "sst2" / "train.tsv"),
        "--validation_file", str(DEMO_DATA / "sst2" / "dev.tsv"),
        "--max_train_samples", str(args.train_samples),
        "--per_device_train_batch_size", "32",
        "--per_device_eval_batch_size", "64",
        "--learning_rate", "1e-3",
        "--warmup_steps", "50",
        "--weight_decay", "0.01",
        "--max_seq_length", "64",
        *run_options(output_dir, args.epochs, args.seed, logging_steps=50),
    ]  # fmt: skip


def run_step(title: str, main: Callable[[list[str]], dict], argv: list[str]) -> tuple[dict, float]:
    """Print the step's title and run a script's `main` on `argv`; its metrics and the seconds it took."""
    print(f"== {title} ==")
    start = time.perf_counter()
    results = main(argv)
    return results, time.perf_counter() - start


def classify(model_dir: Path) -> None:
    """Reload the fine-tuned model through the Auto class and label two sentences it has never seen."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    print(f"reloaded with AutoModelForSequenceClassification as {type(model).__module__}.{type(model).__name__}")
    with torch.no_grad():
        probabilities = model(**tokenizer(list(PROBES), padding=True, return_tensors="pt")).logits.softmax(-1)
    for sentence, row in zip(PROBES, probabilities):  # id2label holds SST-2's class names (posformers-glue)
        print(f"  {sentence!r} -> {model.config.id2label[int(row.argmax())]} ({row.max().item():.2f})")


def sst2_step(args, output_dir: Path) -> None:
    title = "1. SST-2: fine-tune a small RoFormer from scratch with posformers-glue"
    from posformers.finetune import run_glue

    results, seconds = run_step(title, run_glue.main, glue_arguments(args, output_dir))
    accuracy = results["eval_accuracy"]
    print(f"SST-2 dev accuracy {accuracy:.3f} (majority class: 0.509) after {seconds:.0f}s; saved to {output_dir}")
    classify(output_dir)


def qa_arguments(args, output_dir: Path) -> list[str]:
    """posformers-qa's command line for the long-document step, as finetune/run_qa.py's "Demo" section gives it.

    The validation file is the training file on purpose (run_qa.py explains): a model this small, trained from scratch
    for two minutes on 24 questions, can only learn to find the answers it was shown in a 1,848-token document.
    """
    return [
        "--config_name", str(DEMO_DATA / "qa" / "littlebird-qa.json"),
        "--tokenizer_name", str(DEMO_DATA / "tokenizer"),
        "--train_file", str(DEMO_DATA / "qa" / "train.json"),
        "--validation_file", str(DEMO_DATA / "qa" / "train.json"),
        "--learning_rate", "5e-3",
        "--warmup_steps", "10",
        "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "8",
        *run_options(output_dir, args.qa_epochs, args.qa_seed, logging_steps=20),
    ]  # fmt: skip


def qa_step(args, output_dir: Path) -> None:
    title = "2. Long-document QA: a small LittleBird from scratch with posformers-qa"
    from posformers.finetune import run_qa

    results, seconds = run_step(title, run_qa.main, qa_arguments(args, output_dir))
    exact_match, f1 = results["eval_exact_match"], results["eval_f1"]
    print(
        f"QA on the questions it trained on: exact match {exact_match:.1f}, F1 {f1:.1f} after {seconds:.0f}s; saved "
        f"to {output_dir}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("demo_output/finetune"))
    parser.add_argument("--epochs", type=float, default=2.0, help="SST-2 training epochs")
    parser.add_argument("--train-samples", type=int, default=30000, help="SST-2 training rows used (at most 30000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-qa", action="store_true", help="run only the SST-2 step")
    # 24 questions and 300 steps from scratch: the result depends on the seed (README, "The demo")
    parser.add_argument("--qa-seed", type=int, default=42, help="seed of the QA step")
    parser.add_argument("--qa-epochs", type=float, default=50.0, help="QA training epochs")
    args = parser.parse_args(argv)

    prepare_output_dir(args.output_dir)
    # These models are small: one intra-op thread trains them at ~650 samples/s, while on a busy machine a second
    # thread's spin-waiting made the SST-2 step 20 times slower (8,000 rows x 3 epochs: 36 s vs 13 min, measured).
    torch.set_num_threads(1)
    sst2_step(args, args.output_dir / "sst2-roformer")
    if not args.skip_qa:
        qa_step(args, args.output_dir / "qa-littlebird")


if __name__ == "__main__":
    main()
