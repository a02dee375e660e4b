"""Kill a fine-tuning script at chosen moments, for tests: a chain of runs of one script in which each run is killed at
its kill point and the next resumes, as a user rerunning the command after a crash would.

    python tests/helpers/kill_points.py <plan.json>      # prints a JSON list: one report per run
    torchrun --nproc_per_node 2 tests/helpers/kill_points.py --sigterm <rank> <step> <script> <its arguments>
                                                         # SIGTERM to one process only, while step <step> runs
    python tests/helpers/kill_points.py --signal INT <step> <script> <its arguments>
                                                         # SIGINT (as Ctrl-C) or TERM while step <step> runs

The plan (see main) names the script, its arguments, two output folders, a seed and a number of kill points. The
script runs once uninterrupted; kill points are drawn (seeded) from what that run did: SIGKILL at the end of a step,
SIGKILL in the n-th file written after a step (among the files of checkpoint folders), and one SIGTERM during a step.
Then a chain of runs: each is killed at its kill point and the next reruns the command, with
--resume_from_checkpoint True once a checkpoint folder exists; the last has no kill point. Each report: "status"
(exit status, or -signal), "log" (what the run printed), "kill", "writes" ([[step, n, path], ...]: every file written
through torch.save, safetensors' save_file, a config's to_json_file or TrainerState.save_to_json, numbered from 1
after each step's end), "metrics" (what main returned, for runs that end) and "seconds".

"In the n-th file written" means: that file is written whole, then cut to half its length, then the process SIGKILLs
itself, which is what a kill in the middle of the write leaves on disk. Nothing of this is in the scripts: the writers
and Trainer.train are wrapped in the child process only.

To keep the many runs of a script cheap, this process imports the script once and forks one child per run (the parent
never runs torch, so the children fork from a quiet process); every wait has a timeout.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

RUN_TIMEOUT_S = 240


def instrument(kill: dict | None, writes: list, report_path: Path | None = None) -> None:
    """Wrap the writers and Trainer.train of this (child) process so that it records every write and dies at `kill`
    (writing `report_path` first)."""
    import safetensors.torch
    import torch
    import transformers
    from transformers import TrainerCallback, modeling_utils
    from transformers.configuration_utils import PreTrainedConfig
    from transformers.trainer_callback import TrainerState

    current = {"step": 0, "writes": 0}

    def die(signum: int) -> None:
        if report_path is not None:
            report_path.write_text(json.dumps({"metrics": None, "writes": writes}), encoding="utf-8")
        sys.stdout.flush(), sys.stderr.flush()
        os.kill(os.getpid(), signum)

    def written(path) -> None:
        current["writes"] += 1
        writes.append([current["step"], current["writes"], str(path)])
        if (
            kill
            and kill["signal"] == "KILL"
            and (kill["step"], kill.get("write", 0))
            == (
                current["step"],
                current["writes"],
            )
        ):
            size = os.path.getsize(path)
            os.truncate(path, size // 2)
            die(signal.SIGKILL)

    def counted(writer, path_of):
        @functools.wraps(writer)
        def write(*args, **kwargs):
            result = writer(*args, **kwargs)
            path = path_of(*args, **kwargs)
            if isinstance(path, (str, os.PathLike)):
                written(path)
            return result

        return write

    torch.save = counted(torch.save, lambda obj, f, *a, **k: f)
    modeling_utils.safe_save_file = counted(modeling_utils.safe_save_file, lambda tensors, filename, **k: filename)
    safetensors.torch.save_file = counted(safetensors.torch.save_file, lambda tensors, filename, **k: filename)
    PreTrainedConfig.to_json_file = counted(PreTrainedConfig.to_json_file, lambda self, path, *a, **k: path)
    TrainerState.save_to_json = counted(TrainerState.save_to_json, lambda self, path: path)

    class KillPoint(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if kill and kill["signal"] in ("TERM", "INT") and kill["step"] == state.global_step + 1:
                # arrives while the step runs; the script's handler takes it
                os.kill(os.getpid(), getattr(signal, f"SIG{kill['signal']}"))

        def on_step_end(self, args, state, control, **kwargs):
            current.update(step=state.global_step, writes=0)
            if kill and kill["signal"] == "KILL" and (kill["step"], kill.get("write", 0)) == (state.global_step, 0):
                die(signal.SIGKILL)

    train = transformers.Trainer.train

    @functools.wraps(train)
    def train_with_kill_point(self, *args, **kwargs):
        self.add_callback(KillPoint())
        return train(self, *args, **kwargs)

    transformers.Trainer.train = train_with_kill_point


def run_then_exit(module, argv: list[str], kill: dict | None, report_path: Path | None = None) -> None:
    """Run the script with its kill point, write the report (with `report_path`) and leave with os._exit and the
    script's exit status: no interpreter teardown in a forked child, nor in a torchrun process (gloo's process group
    can deadlock in its destructor at exit). Never returns."""
    writes: list = []
    status, metrics = 1, None
    try:
        instrument(kill, writes, report_path)
        metrics = module.main(argv)
        status = 0
    except SystemExit as error:  # the scripts' one-line errors (1) and pre-emption (75)
        print(error.code if isinstance(error.code, str) else "", flush=True)
        status = error.code if isinstance(error.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        if report_path is not None:
            report_path.write_text(json.dumps({"metrics": metrics, "writes": writes}), encoding="utf-8")
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(status)


def child(module, argv: list[str], kill: dict | None, report_path: Path) -> None:
    """Run the script in this forked child, its output into report_path's .log; never returns."""
    with open(report_path.with_suffix(".log"), "w", encoding="utf-8") as log:
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        run_then_exit(module, argv, kill, report_path)


def wait(pid: int, timeout: float) -> int:
    """The child's exit status (-N: killed by signal N); SIGKILLs it past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -999
        time.sleep(0.05)


def seeded_kill_points(reference_writes: list, max_steps: int, seed: int, count: int) -> list[dict]:
    """`count` distinct SIGKILL points in run order, half of them inside a checkpoint write (among the files the
    uninterrupted run wrote into checkpoint-N folders), half at the end of a step; then one SIGTERM during a step that
    no kill point uses, in its place (after it the run resumes from that step's checkpoint, so the order matters)."""
    rng = random.Random(seed)
    checkpoint_writes = sorted({(step, n) for step, n, path in reference_writes if in_checkpoint(path)})
    points = set(rng.sample(checkpoint_writes, count // 2))
    while len(points) < count:
        points.add((rng.randrange(1, max_steps + 1), 0))
    kills = [{"signal": "KILL", "step": step, "write": n} for step, n in points]
    term_step = rng.choice([step for step in range(2, max_steps) if step not in {s for s, _ in points}])
    kills.append({"signal": "TERM", "step": term_step, "write": 0})
    return sorted(kills, key=lambda kill: (kill["step"], kill["write"]))


def in_checkpoint(path: str) -> str | None:
    """The checkpoint-N folder a written file lies in (None: elsewhere)."""
    parent = Path(path).parent.name
    return parent if parent.startswith("checkpoint-") else None


def run(module, argv: list[str], kill: dict | None, report_path: Path) -> dict:
    """One run of the script in a forked child: its report (status, log, writes, metrics, seconds)."""
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(module, argv, kill, report_path)
    status = wait(pid, RUN_TIMEOUT_S)
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else {}
    report.update(status=status, log=report_path.with_suffix(".log").read_text(encoding="utf-8"), kill=kill)
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def has_checkpoint(output_dir: Path) -> bool:
    return output_dir.is_dir() and any(entry.name.startswith("checkpoint-") for entry in output_dir.iterdir())


def main(plan_path: str) -> None:
    """plan: {"script", "argv", "reference_dir", "chain_dir", "max_steps", "seed", "kills"}: an uninterrupted run into
    reference_dir, then the chain into chain_dir, each run resuming (--resume_from_checkpoint True) once a checkpoint
    folder exists, as a user would. Prints the reports: the reference's first."""
    plan = json.loads(Path(plan_path).read_text(encoding="utf-8"))
    module = importlib.import_module(f"posformers.finetune.{plan['script']}")
    import torch

    torch.set_num_threads(1)  # tiny models; a second thread only contends with the other test processes
    folder = Path(plan_path).parent
    reference = run(module, [*plan["argv"], "--output_dir", plan["reference_dir"]], None, folder / "reference.json")
    reports = [reference]
    if reference["status"] == 0:
        kills = seeded_kill_points(reference["writes"], plan["max_steps"], plan["seed"], plan["kills"])
        chain_dir = Path(plan["chain_dir"])
        for index, kill in enumerate([*kills, None]):
            argv = [*plan["argv"], "--output_dir", str(chain_dir)]
            if has_checkpoint(chain_dir):
                argv += ["--resume_from_checkpoint", "True"]
            reports.append(run(module, argv, kill, folder / f"run{index}.json"))
    print(json.dumps(reports))


def sigterm_one_process(rank: int, step: int, script: str, argv: list[str]) -> None:
    """One process of a torchrun: the script, with SIGTERM during `step` in process `rank` only."""
    module = importlib.import_module(f"posformers.finetune.{script}")
    run_then_exit(module, argv, {"signal": "TERM", "step": step} if int(os.environ["RANK"]) == rank else None)


def signal_during_step(name: str, step: int, script: str, argv: list[str]) -> None:
    """One run of the script, with SIG`name` (TERM or INT) to itself while step `step` runs; never returns."""
    module = importlib.import_module(f"posformers.finetune.{script}")
    import torch

    torch.set_num_threads(1)
    run_then_exit(module, argv, {"signal": name, "step": step})


if __name__ == "__main__":
    if sys.argv[1] == "--sigterm":  # kill_points.py --sigterm <rank> <step> <script> <its arguments>, under torchrun
        sigterm_one_process(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])
    if sys.argv[1] == "--signal":  # kill_points.py --signal <TERM|INT> <step> <script> <its arguments>
        signal_during_step(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:])
    main(sys.argv[1])
