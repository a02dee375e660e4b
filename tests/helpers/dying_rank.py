"""A training run in which one process dies or hangs, for tests: torchrun runs a script through this file, and the
process of the given rank, at the end of the given optimizer step, first writes the time into <mark> and then
- kill: kills itself with SIGKILL (no cleanup, no exception: what the kernel's OOM killer does);
- stop: stops itself with SIGSTOP (alive but silent for good: a hung process, or a node whose network went away).

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/dying_rank.py kill|stop <rank> <step> <mark> \
        run_glue|run_pretrain <the script's arguments>

The other processes are left to find out by themselves: what they do next is what the test looks at.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


class DieAtStep(TrainerCallback):
    """Process `rank` marks the time in `mark`, then sends itself `signum` at the end of optimizer step `step`."""

    def __init__(self, signum: int, rank: int, step: int, mark: Path):
        self.signum, self.rank, self.step, self.mark = signum, rank, step, mark

    def on_step_end(self, args, state, control, **kwargs):
        if args.process_index == self.rank and state.global_step == self.step:
            self.mark.write_text(repr(time.time()), encoding="utf-8")
            os.kill(os.getpid(), self.signum)


def dying_trainer(trainer_class, callback: DieAtStep):
    """A subclass of `trainer_class` with `callback`."""

    class DyingTrainer(trainer_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(callback)

    return DyingTrainer


if __name__ == "__main__":
    how, rank, step, mark, script, argv = (
        sys.argv[1],
        *map(int, sys.argv[2:4]),
        Path(sys.argv[4]),
        *sys.argv[5:6],
        sys.argv[6:],
    )
    module = importlib.import_module(f"posformers.finetune.{script}")
    module.Trainer = dying_trainer(module.Trainer, DieAtStep(SIGNALS[how], rank, step, mark))
    module.main(argv)
