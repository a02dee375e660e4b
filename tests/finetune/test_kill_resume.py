"""Crashes and pre-emption (finetune/checkpoints.py): posformers-glue, -qa and -pretrain killed at seeded moments,
in the middle of writing a checkpoint too, and resumed each time, end with the weights and metrics of a run that was
never interrupted; SIGTERM saves a checkpoint and exits with PREEMPTED_EXIT_STATUS; a half-written checkpoint is set
aside with a message naming it and what it lacks, never resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model_args
from helpers import REPO_ROOT, python_env
from helpers.data import DATA_DIR
from safetensors.torch import load_file, save_file
from transformers import TrainerControl, TrainerState, TrainingArguments

from posformers.finetune.arguments import prepare_output_dir
from posformers.finetune.checkpoints import (
    PREEMPTED_EXIT_STATUS,
    PreemptionCallback,
    checkpoint_problems,
    last_complete_checkpoint,
)
from posformers.finetune.errors import OutputDirError

KILL_POINTS = REPO_ROOT / "tests" / "helpers" / "kill_points.py"
SAVE_STEPS, MAX_STEPS, KILLS = 4, 12, 6
TRAINING = [
    "--do_train", "--do_eval", "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVE_STEPS),
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--learning_rate", "1e-3",
    "--seed", "5", "--report_to", "none", "--disable_tqdm", "True", "--log_level", "warning",
    "--dataloader_pin_memory", "False",
]  # fmt: skip
# Metrics that measure the run's speed, not its result.
TIMING_KEYS = ("runtime", "per_second", "tokens_per_second")


# posformers-qa trains a LittleBird: its blocks and pack states are in the runs that resume too.
TINY_LITTLEBIRD = (
    "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,block_size=16,pack_length=4"
)


def script_argv(script: str, corpus: dict[str, Path]) -> list[str]:
    """A tiny RoFormer, or LittleBird for posformers-qa (dropout on: resuming must restore the RNG state too), on real
    data for each script."""
    # fmt: off
    if script == "run_glue":
        glue = DATA_DIR / "glue" / "mrpc"
        data = ["--task_name", "mrpc", "--train_file", str(glue / "train.tsv"), "--max_train_samples", "64",
                "--validation_file", str(glue / "dev.tsv"), "--max_eval_samples", "32", "--max_seq_length", "64"]
    elif script == "run_qa":
        squad = DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json"
        data = ["--train_file", str(squad), "--validation_file", str(squad), "--max_train_samples", "48",
                "--max_eval_samples", "16", "--max_seq_length", "128", "--doc_stride", "32"]
    else:
        data = ["--objective", "mlm", "--train_file", str(corpus["train"]), "--validation_file",
                str(corpus["validation"]), "--max_seq_length", "32", "--max_eval_samples", "32"]
    # fmt: on
    model = tiny_model_args("littlebird", TINY_LITTLEBIRD) if script == "run_qa" else tiny_model_args()
    return [*model, *data, *TRAINING]


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


# ---------------------------------------------------------------------------------------------------------------------
# What makes a checkpoint complete, and what --resume_from_checkpoint does with one that is not
# ---------------------------------------------------------------------------------------------------------------------

# The files Trainer writes into checkpoint-N, in its order (trainer_state.json last).
CHECKPOINT_FILES = (
    "config.json", "model.safetensors", "training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth",
    "trainer_state.json",
)  # fmt: skip


def write_checkpoint(output_dir: Path, step: int) -> Path:
    """A checkpoint-N folder with the files Trainer writes, each in its real format."""
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "posformers-roformer"}))
    save_file({"weight": torch.arange(1000.0)}, folder / "model.safetensors")
    for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": torch.ones(5), "name": name}, folder / name)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return folder


def cut(path: Path) -> None:
    """Leave the first half of a file, as a process killed while writing it does."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def args(output_dir: Path, **kwargs) -> TrainingArguments:
    return TrainingArguments(str(output_dir), report_to="none", **kwargs)


def test_a_complete_checkpoint_has_no_problems(tmp_path):
    assert checkpoint_problems(write_checkpoint(tmp_path, 4), args(tmp_path)) == []


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_file_cut_short_is_named(tmp_path, name):
    folder = write_checkpoint(tmp_path, 4)
    whole = (folder / name).stat().st_size
    cut(folder / name)
    (problem,) = checkpoint_problems(folder, args(tmp_path))
    # safetensors: the header survives the cut, and its offsets say how much is missing
    expected = f"truncated ({whole // 2} bytes, its header describes {whole})" if name == "model.safetensors" else None
    assert problem == f"{name} {expected or 'truncated or corrupt'}"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("model.safetensors", "no weights"),
        ("optimizer.pt", "no optimizer"),
        ("scheduler.pt", "no scheduler"),
        ("rng_state.pth", "no rng_state.pth"),
        ("trainer_state.json", "no trainer_state.json"),
    ],
)
def test_a_missing_file_is_named(tmp_path, name, problem):
    folder = write_checkpoint(tmp_path, 4)
    (folder / name).unlink()
    assert checkpoint_problems(folder, args(tmp_path)) == [problem]


def test_save_only_model_needs_the_weights_and_the_state_only(tmp_path):
    folder = write_checkpoint(tmp_path, 4)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (folder / name).unlink()
    assert checkpoint_problems(folder, args(tmp_path, save_only_model=True)) == []
    assert checkpoint_problems(folder, args(tmp_path)) == ["no optimizer", "no scheduler", "no rng_state.pth"]


def test_sharded_weights_a_foreign_state_and_a_jit_save_in_progress(tmp_path):
    folder = write_checkpoint(tmp_path, 4)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert checkpoint_problems(folder, args(tmp_path)) == [
        "no model-00002-of-00002.safetensors (named by model.safetensors.index.json)"
    ]
    other = write_checkpoint(tmp_path, 8)
    (other / "trainer_state.json").write_text(json.dumps({"global_step": 6}))  # copied from another checkpoint
    assert checkpoint_problems(other, args(tmp_path)) == ["trainer_state.json is at step 6"]
    (other / "checkpoint-is-incomplete.txt").write_text("in progress")  # transformers' --enable_jit_checkpoint
    assert checkpoint_problems(other, args(tmp_path))[0] == "checkpoint-is-incomplete.txt (a save in progress)"


def test_resume_true_sets_incomplete_checkpoints_aside_and_takes_the_newest_complete(tmp_path, caplog):
    write_checkpoint(tmp_path, 4)
    cut(write_checkpoint(tmp_path, 8) / "optimizer.pt")
    (write_checkpoint(tmp_path, 12) / "trainer_state.json").unlink()
    with caplog.at_level("WARNING", logger="posformers"):
        assert last_complete_checkpoint(tmp_path, args(tmp_path)) == str(tmp_path / "checkpoint-4")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-4", "incomplete-checkpoint-12", "incomplete-checkpoint-8",
    ]  # fmt: skip
    assert [record.getMessage() for record in caplog.records] == [
        f"{tmp_path / 'checkpoint-12'} is incomplete (no trainer_state.json), probably written by a run that was "
        "killed: moved to incomplete-checkpoint-12; resuming from an earlier checkpoint",
        f"{tmp_path / 'checkpoint-8'} is incomplete (optimizer.pt truncated or corrupt), probably written by a run "
        "that was killed: moved to incomplete-checkpoint-8; resuming from an earlier checkpoint",
    ]
    (write_checkpoint(tmp_path, 8) / "rng_state.pth").unlink()  # killed at checkpoint-8 again: nothing overwritten
    assert last_complete_checkpoint(tmp_path, args(tmp_path)) == str(tmp_path / "checkpoint-4")
    assert (tmp_path / "incomplete-checkpoint-8.2" / "optimizer.pt").exists()
    assert len((tmp_path / "incomplete-checkpoint-8" / "optimizer.pt").read_bytes()) > 0


def test_the_scripts_resume_the_newest_complete_checkpoint_or_refuse_an_incomplete_path(tmp_path, caplog):
    output_dir = tmp_path / "out"
    write_checkpoint(output_dir, 4)
    cut(write_checkpoint(output_dir, 8) / "scheduler.pt")
    resume = args(output_dir, do_train=True, resume_from_checkpoint="True")
    assert prepare_output_dir(resume) == str(output_dir / "checkpoint-4")
    cut(write_checkpoint(output_dir, 16) / "model.safetensors")
    explicit = args(output_dir, do_train=True, resume_from_checkpoint=str(output_dir / "checkpoint-16"))
    with pytest.raises(OutputDirError, match=r"^--resume_from_checkpoint .*checkpoint-16: incomplete \(model"):
        prepare_output_dir(explicit)
    # Killed while writing its first checkpoint: nothing to resume, and nothing of the user's in the way.
    only_incomplete = tmp_path / "first"
    (write_checkpoint(only_incomplete, 2) / "trainer_state.json").unlink()
    with caplog.at_level("WARNING", logger="posformers"):
        assert prepare_output_dir(args(only_incomplete, do_train=True, resume_from_checkpoint="True")) is None
    assert "no complete checkpoint in" in caplog.text and "training from the start" in caplog.text
    assert [p.name for p in only_incomplete.iterdir()] == ["incomplete-checkpoint-2"]


def test_sigterm_during_training_asks_for_a_checkpoint_then_an_exit(tmp_path):
    preemption = PreemptionCallback()
    control, state = TrainerControl(), TrainerState(global_step=6)
    before = signal.getsignal(signal.SIGTERM)
    preemption.on_train_begin(args(tmp_path), state, control)
    preemption.on_step_end(args(tmp_path), state, control)
    assert not (control.should_save or control.should_training_stop)
    os.kill(os.getpid(), signal.SIGTERM)  # handled: the test process goes on
    preemption.on_step_end(args(tmp_path), state, control)
    assert control.should_save and control.should_training_stop and preemption.preempted_at == 6
    preemption.on_train_end(args(tmp_path), state, control)
    assert signal.getsignal(signal.SIGTERM) == before
    with pytest.raises(SystemExit) as exit_:
        preemption.exit_if_preempted(SimpleNamespace(args=args(tmp_path)))
    assert exit_.value.code == PREEMPTED_EXIT_STATUS == 75


@pytest.mark.slow
def test_posformers_glue_on_sigterm_saves_a_checkpoint_exits_75_and_resumes(tmp_path, corpus):
    """The console script, signalled from outside as a scheduler does, while it trains."""
    command = [str(Path(sys.executable).with_name("posformers-glue")), *script_argv("run_glue", corpus)]
    command += ["--output_dir", str(tmp_path / "out"), "--logging_steps", "1"]
    env = python_env(tmp_path / "hf-home")
    log = tmp_path / "first.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [*command, "--max_steps", "100000"], stdout=output, stderr=subprocess.STDOUT, env=env
        )
        try:
            deadline = time.monotonic() + 300
            while "'loss'" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)  # training has begun once a step's loss is printed
            process.send_signal(signal.SIGTERM)
            status = process.wait(timeout=120)
        finally:
            process.kill()
    printed = log.read_text()
    assert status == PREEMPTED_EXIT_STATUS, printed[-3000:]
    step = max(int(path.name.removeprefix("checkpoint-")) for path in (tmp_path / "out").glob("checkpoint-*"))
    saved = tmp_path / "out" / f"checkpoint-{step}"
    assert f"pre-empted: saved {saved}; rerun the same command with --resume_from_checkpoint True" in printed
    assert checkpoint_problems(saved, args(tmp_path)) == []
    assert not (tmp_path / "out" / "model.safetensors").exists()  # it stopped: no final model, no evaluation
    resumed = subprocess.run(
        [*command, "--max_steps", str(step + 2), "--resume_from_checkpoint", "True"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == step + 2
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry][-3:] == [step, step + 1, step + 2]


@pytest.mark.slow
def test_sigterm_to_one_process_of_a_torchrun_stops_both_at_the_same_checkpoint(tmp_path, corpus):
    """Each process may get SIGTERM in another step (or only one gets it): they agree on the step, both write their
    part of that checkpoint and exit 75, and the rerun resumes there."""
    output_dir = tmp_path / "out"
    argv = [*script_argv("run_glue", corpus), "--output_dir", str(output_dir), "--ddp_backend", "gloo", "--use_cpu"]
    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")
    env = {k: v for k, v in python_env(tmp_path / "hf-home").items() if not k.startswith(launcher)}
    env.update(OMP_NUM_THREADS="1")

    def torchrun(*extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   str(KILL_POINTS), "--sigterm", *extra]  # fmt: skip
        return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)

    stopped = torchrun("1", "6", "run_glue", *argv)  # SIGTERM to process 1 only, during step 6 (of 12)
    printed = stopped.stdout + stopped.stderr
    assert stopped.returncode != 0 and printed.count(f"exitcode  : {PREEMPTED_EXIT_STATUS}") == 2, printed[-5000:]
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {path.name for path in (output_dir / "checkpoint-6").iterdir()}
    resumed = torchrun("-1", "0", "run_glue", *argv, "--resume_from_checkpoint", "True")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-5000:]
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
