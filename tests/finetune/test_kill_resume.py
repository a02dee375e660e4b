"""Crashes and pre-emption (finetune/checkpoints.py): posformers-glue, -qa and -pretrain killed at seeded moments,
in the middle of writing a checkpoint too, and resumed each time, end with the weights and metrics of a run that was
never interrupted; SIGTERM saves a checkpoint and exits with PREEMPTED_EXIT_STATUS; a half-written checkpoint is set
aside with a message naming it and what it lacks, never resumed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_args
from helpers import REPO_ROOT, python_env
from helpers.data import DATA_DIR
from safetensors.torch import load_file
from transformers import TrainingArguments

from posformers.finetune.checkpoints import PREEMPTED_EXIT_STATUS, checkpoint_problems

KILL_POINTS = REPO_ROOT / "tests" / "helpers" / "kill_points.py"
SAVE_STEPS, MAX_STEPS, KILLS = 4, 12, 10
TRAINING = [
    "--do_train", "--do_eval", "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVE_STEPS),
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--learning_rate", "1e-3",
    "--seed", "5", "--report_to", "none", "--disable_tqdm", "True", "--log_level", "warning",
    "--dataloader_pin_memory", "False",
]  # fmt: skip
# Metrics that measure the run's speed, not its result.
TIMING_KEYS = ("runtime", "per_second", "tokens_per_second")


def script_argv(script: str, corpus: dict[str, Path]) -> list[str]:
    """A tiny RoFormer (dropout on: resuming must restore the RNG state too) on real data for each script."""
    glue = DATA_DIR / "glue" / "mrpc"
    squad = DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json"
    data = {
        "run_glue": ["--task_name", "mrpc", "--train_file", str(glue / "train.tsv"), "--max_train_samples", "64",
                     "--validation_file", str(glue / "dev.tsv"), "--max_eval_samples", "32", "--max_seq_length", "64"],
        "run_qa": ["--train_file", str(squad), "--validation_file", str(squad), "--max_train_samples", "48",
                   "--max_eval_samples", "16", "--max_seq_length", "128", "--doc_stride", "32"],
        "run_pretrain": ["--objective", "mlm", "--train_file", str(corpus["train"]),
                         "--validation_file", str(corpus["validation"]), "--max_seq_length", "32",
                         "--max_eval_samples", "32"],
    }[script]  # fmt: skip
    return [*tiny_model_args(), *data, *TRAINING]


def run_chain(tmp_path: Path, script: str, argv: list[str], seed: int) -> tuple[dict, list[dict]]:
    """tests/helpers/kill_points.py: the uninterrupted run's report, and the chain's (killed runs, then the last)."""
    plan = tmp_path / "plan" / "plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_text(
        json.dumps(
            {
                "script": script, "argv": argv, "reference_dir": str(tmp_path / "reference"),
                "chain_dir": str(tmp_path / "chain"), "max_steps": MAX_STEPS, "seed": seed, "kills": KILLS,
            }
        )
    )  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(KILL_POINTS), str(plan)],
        env=python_env(tmp_path / "hf-home", PYTHONPATH=str(REPO_ROOT / "tests")),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    reference, *chain = json.loads(result.stdout.strip().splitlines()[-1])
    assert reference["status"] == 0, reference["log"][-3000:]
    return reference, chain


def final_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k.startswith("eval_") and not k.endswith(TIMING_KEYS)}


@pytest.mark.slow
@pytest.mark.parametrize("script", ["run_glue", "run_qa", "run_pretrain"])
def test_killed_and_resumed_runs_end_like_an_uninterrupted_one(script, corpus, tmp_path):
    reference, chain = run_chain(tmp_path, script, script_argv(script, corpus), seed=sum(map(ord, script)))
    chain_dir = tmp_path / "chain"
    kills = [report["kill"] for report in chain[:-1]]
    assert len(kills) == KILLS + 1 and chain[-1]["kill"] is None
    assert sum(kill["signal"] == "KILL" and kill["write"] >= 1 for kill in kills) == KILLS // 2  # in a file's write

    for index, report in enumerate(chain):
        kill, previous = report["kill"], chain[index - 1]["kill"] if index else None
        expected_status = {None: 0, "KILL": -signal.SIGKILL, "TERM": PREEMPTED_EXIT_STATUS}[kill and kill["signal"]]
        assert report["status"] == expected_status, (kill, report["log"][-3000:])
        if kill and kill["signal"] == "TERM":  # a checkpoint of the step SIGTERM came in, complete
            saved = chain_dir / f"checkpoint-{kill['step']}"
            assert f"pre-empted: saved {saved}" in report["log"]
            assert checkpoint_problems(saved, TrainingArguments("unused")) == []
        if previous and previous["signal"] == "KILL" and previous["write"] >= 1:
            # The previous run died in the middle of a file of checkpoint-N: this one says so and sets it aside.
            step = previous["step"]
            assert f"checkpoint-{step} is incomplete (" in report["log"], report["log"][-3000:]
            assert f"moved to incomplete-checkpoint-{step}" in report["log"]

    expected = load_file(tmp_path / "reference" / "model.safetensors")
    actual = load_file(chain_dir / "model.safetensors")
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert final_metrics(chain[-1]["metrics"]) == final_metrics(reference["metrics"]) != {}
