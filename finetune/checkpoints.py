"""Checkpoints that a crash cannot leave half-written behind, and pre-emption (SIGTERM, Ctrl-C) at a step boundary.

    checkpoint = last_complete_checkpoint(output_dir, training_args)   # `--resume_from_checkpoint True`
    problems = checkpoint_problems(folder, training_args)              # [] when `folder` can be resumed
    preemption = PreemptionCallback(); trainer.add_callback(preemption) ... trainer.train()
    preemption.exit_if_preempted(trainer)                              # SystemExit(PREEMPTED_EXIT_STATUS)

A process killed while Trainer writes `checkpoint-N` leaves a folder holding some of its files, some of them cut
short. Trainer writes trainer_state.json last, but a folder that has it can still miss files (a checkpoint being
deleted by `save_total_limit` when the kill came), so a checkpoint is resumed only when every file Trainer needs is
there and whole: trainer_state.json (JSON, with this folder's step), the weights, and unless --save_only_model the
optimizer, the scheduler and each process's RNG state. "Whole" is checked without loading anything: JSON parses,
a safetensors file is exactly as long as its header says, a torch.save file has its zip directory (written last).

`--resume_from_checkpoint True` takes the newest complete checkpoint-N. A newer incomplete one is renamed to
`incomplete-checkpoint-N` (nothing is deleted; Trainer's rotation and get_last_checkpoint do not see that name) with
one line saying which and why, so that the resumed run writes checkpoint-N afresh instead of into leftovers.

SIGTERM (what Slurm, Kubernetes and spot pre-emption send) or SIGINT (Ctrl-C) during training sets a flag; at the end
of the current optimizer step the scripts save a checkpoint and exit with status PREEMPTED_EXIT_STATUS (75, sysexits'
EX_TEMPFAIL: "try again"). Rerunning the same command with `--resume_from_checkpoint True` continues from that
checkpoint. A second Ctrl-C stops at once (KeyboardInterrupt), for when the step's end is too far. Under torchrun the
processes agree on the step (the flag is reduced over them at every step), so all save the same one.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import struct
import zipfile
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_STATUS = 75  # os.EX_TEMPFAIL: a checkpoint was saved on SIGTERM or SIGINT; rerun to resume
PREEMPTING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
INCOMPLETE_PREFIX = "incomplete-"
CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")

# Names Trainer gives each part (transformers' trainer.py, modeling_utils.py and the FSDP / DeepSpeed savers).
WEIGHT_PREFIXES = ("model.safetensors", "model-", "pytorch_model", "adapter_model", "global_step")
OPTIMIZER_PREFIXES = ("optimizer", "global_step")  # DeepSpeed keeps optimizer and scheduler in global_step*/
SCHEDULER_PREFIXES = ("scheduler.pt", "global_step")
JIT_SENTINEL = "checkpoint-is-incomplete.txt"  # transformers' --enable_jit_checkpoint marks a save in progress


# ---------------------------------------------------------------------------------------------------------------------
# Is a checkpoint whole?
# ---------------------------------------------------------------------------------------------------------------------


def unreadable_reason(path: Path) -> str | None:
    """Why the file at `path` is not whole (None: it is, or its format is not one checked here)."""
    try:
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix == ".safetensors":
            with open(path, "rb") as file:
                (header_length,) = struct.unpack("<Q", file.read(8))
                header = json.loads(file.read(header_length))
            data_end = max(
                (entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0
            )
            size, expected = path.stat().st_size, 8 + header_length + data_end
            if size != expected:
                return f"truncated ({size} bytes, its header describes {expected})"
        elif path.suffix in (".pt", ".pth", ".bin"):
            with zipfile.ZipFile(path):  # torch.save writes a zip whose directory comes last
                pass
    except (OSError, ValueError, KeyError, TypeError, struct.error, zipfile.BadZipFile):
        return "truncated or corrupt"
    return None


def checkpoint_problems(folder, args: TrainingArguments) -> list[str]:
    """What keeps `folder` from being resumed with `args` ("no trainer_state.json", "optimizer.pt truncated", ...);
    an empty list when it is complete."""
    folder = Path(folder)
    names = {entry.name for entry in folder.iterdir()} if folder.is_dir() else set()
    problems = []
    if JIT_SENTINEL in names:
        problems.append(f"{JIT_SENTINEL} (a save in progress)")
    if "trainer_state.json" not in names:
        problems.append("no trainer_state.json")
    wanted = {"weights": WEIGHT_PREFIXES}
    if not args.save_only_model:
        wanted.update(optimizer=OPTIMIZER_PREFIXES, scheduler=SCHEDULER_PREFIXES)
    problems += [f"no {part}" for part, prefixes in wanted.items() if not any(n.startswith(prefixes) for n in names)]
    if not args.save_only_model:
        problems += missing_rng_states(names, args.world_size)
    for name in sorted(names):
        reason = unreadable_reason(folder / name)
        if reason is not None:
            problems.append(f"{name} {reason}")
    index = folder / "model.safetensors.index.json"
    if "model.safetensors.index.json" in names and unreadable_reason(index) is None:
        shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        problems += [f"no {shard} (named by model.safetensors.index.json)" for shard in sorted(shards - names)]
    if "trainer_state.json" in names and not problems:
        step = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8")).get("global_step")
        match = CHECKPOINT_NAME.match(folder.name)
        if match and step != int(match.group(1)):
            problems.append(f"trainer_state.json is at step {step}")
    return problems


def missing_rng_states(names: set[str], world_size: int) -> list[str]:
    """Each process writes its own RNG state (rng_state_<rank>.pth) and nothing waits for the others' before
    trainer_state.json: a distributed run needs all of them. One process resuming a distributed run takes any."""
    if world_size > 1:
        return [f"no rng_state_{rank}.pth" for rank in range(world_size) if f"rng_state_{rank}.pth" not in names]
    return [] if any(name.startswith("rng_state") for name in names) else ["no rng_state.pth"]


def set_aside(folder: Path) -> Path:
    """Rename an incomplete checkpoint to incomplete-checkpoint-N (incomplete-checkpoint-N.2, ... if taken)."""
    target = folder.with_name(INCOMPLETE_PREFIX + folder.name)
    copy = 1
    while target.exists():
        copy += 1
        target = folder.with_name(f"{INCOMPLETE_PREFIX}{folder.name}.{copy}")
    folder.rename(target)
    return target


def last_complete_checkpoint(output_dir, args: TrainingArguments) -> str | None:
    """The newest checkpoint-N in `output_dir` that `checkpoint_problems` finds complete (None: there is none).

    Newer incomplete ones are set aside (renamed, by the main process only) with a warning naming each and what it
    lacks; older ones are not looked at.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    folders = [entry for entry in output_dir.iterdir() if entry.is_dir() and CHECKPOINT_NAME.match(entry.name)]
    for folder in sorted(folders, key=lambda entry: int(CHECKPOINT_NAME.match(entry.name).group(1)), reverse=True):
        problems = checkpoint_problems(folder, args)
        if not problems:
            return str(folder)
        what = f"{folder} is incomplete ({', '.join(problems)}), probably written by a run that was killed"
        if args.process_index == 0:
            logger.warning("%s: moved to %s; resuming from an earlier checkpoint", what, set_aside(folder).name)
        else:
            logger.warning("%s: skipped", what)
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Pre-emption
# ---------------------------------------------------------------------------------------------------------------------


class PreemptionCallback(TrainerCallback):
    """On SIGTERM or SIGINT (Ctrl-C) during training: save a checkpoint at the end of the current step and stop
    training; a second SIGINT raises KeyboardInterrupt at once.

    The handlers are installed when training begins and the previous ones restored when it ends (outside training,
    the signals end the process as usual). `preempted_at` is the step of the checkpoint it saved, or None.
    """

    def __init__(self):
        self.requested = False
        self.preempted_at: int | None = None
        self.previous_handlers: dict = {}

    def request(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:  # Ctrl-C again: the user will not wait for the step's end
            raise KeyboardInterrupt
        self.requested = True
        how = "Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
        logger.warning(
            "%s: saving a checkpoint at the end of this step, then exiting%s",
            signal.Signals(signum).name,
            f" ({how})" if how else "",
        )

    def on_train_begin(self, args, state, control, **kwargs):
        try:
            for signum in PREEMPTING_SIGNALS:
                self.previous_handlers[signum] = signal.signal(signum, self.request)
        except ValueError:  # not the main thread (a script run from a thread): signals cannot be caught there
            logger.warning("not the main thread: SIGTERM and Ctrl-C will end training without a checkpoint")

    def on_step_end(self, args, state, control, **kwargs):
        if agreed(self.requested, args):
            control.should_save = True
            control.should_training_stop = True
            self.preempted_at = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        for signum, handler in self.previous_handlers.items():
            if handler is not None:  # None: a handler not installed from Python, which cannot be put back
                signal.signal(signum, handler)
        self.previous_handlers = {}

    def exit_if_preempted(self, trainer) -> None:
        """After trainer.train(): end the process with PREEMPTED_EXIT_STATUS if training stopped for SIGTERM or
        SIGINT."""
        if self.preempted_at is None:
            return
        output_dir = Path(trainer.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.preempted_at}"
        logger.warning(
            "pre-empted: saved %s; rerun the same command with --resume_from_checkpoint True to continue (exit status "
            "%d)",
            output_dir,
            PREEMPTED_EXIT_STATUS,
        )
        raise SystemExit(PREEMPTED_EXIT_STATUS)


def agreed(flag: bool, args: TrainingArguments) -> bool:
    """`flag` or'ed over the processes of a distributed run (each may get the signal in a different step)."""
    if args.world_size <= 1 or not torch.distributed.is_initialized():
        return flag
    tensor = torch.tensor([int(flag)], device=args.device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return bool(tensor.item())
