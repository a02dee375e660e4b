"""A look inside the processes of a training run, for tests: which examples each process trained on, the weights it
ended with, whether it took part in pushing to the Hub. Nothing of this is in the scripts: it wraps the Trainer class
a script builds.

    monkeypatch.setattr(run_glue, "Trainer", sample_log_trainer(run_glue.Trainer, log_dir))   # in this process
    python -m torch.distributed.run ... tests/helpers/sample_log.py <log_dir> run_glue <posformers-glue arguments>

Each process writes, into log_dir:
- rank<R>.txt (with log_ids, i.e. run_glue's data with its "idx" column): the example ids of every training batch, one
  line per batch. Only training batches are logged, so the log holds exactly the examples each process trained on;
- rank<R>-final.json when training ends: its global step and a SHA-256 of its weights;
- rank<R>-push when it enters Trainer.push_to_hub (which saves on every process, then uploads from process 0).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

ID_COLUMN = "idx"
LABEL_KEYS = frozenset({"label", "labels", "label_ids"})


def weights_digest(model) -> str:
    """SHA-256 over the model's state dict (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class ModelInputs:
    """Wraps a collator: drops what the model does not take (Trainer's remove_unused_columns, which is off so that the
    ids reach here) and, with `log`, first appends the batch's example ids to that file."""

    def __init__(self, collator, model, log: Path | None = None):
        self.collator, self.log = collator, log
        self.accepted = set(inspect.signature(model.forward).parameters) | LABEL_KEYS

    def __call__(self, features: list[dict]):
        if self.log is not None:
            with open(self.log, "a", encoding="utf-8") as log:
                log.write(" ".join(str(feature[ID_COLUMN]) for feature in features) + "\n")
        return self.collator([{k: v for k, v in feature.items() if k in self.accepted} for feature in features])


class ProcessReport(TrainerCallback):
    """Writes this process's global step and weights digest when training ends, and a mark when it starts pushing."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir

    def on_train_end(self, args, state, control, model=None, **kwargs):
        report = {"rank": args.process_index, "global_step": state.global_step, "weights_sha256": weights_digest(model)}
        (self.log_dir / f"rank{args.process_index}-final.json").write_text(json.dumps(report), encoding="utf-8")

    def on_push_begin(self, args, state, control, **kwargs):
        (self.log_dir / f"rank{args.process_index}-push").touch()


def sample_log_trainer(trainer_class, log_dir, log_ids: bool = True):
    """A subclass of `trainer_class` that keeps the sample log in `log_dir` (the batches' ids only with `log_ids`)."""
    log_dir = Path(log_dir)

    class SampleLogTrainer(trainer_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(ProcessReport(log_dir))
            if log_ids:
                self.args.remove_unused_columns = False  # ModelInputs drops the columns, after reading the ids
                self.data_collator = ModelInputs(self.data_collator, self.model)

        def get_train_dataloader(self):
            if not log_ids:
                return super().get_train_dataloader()
            evaluation = self.data_collator
            log = log_dir / f"rank{self.args.process_index}.txt"
            self.data_collator = ModelInputs(evaluation.collator, self.model, log)
            try:
                return super().get_train_dataloader()
            finally:
                self.data_collator = evaluation

    return SampleLogTrainer


if __name__ == "__main__":  # sample_log.py <log_dir> run_glue|run_pretrain <the script's arguments>
    import importlib

    log_dir, script, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    module = importlib.import_module(f"posformers.finetune.{script}")
    module.Trainer = sample_log_trainer(module.Trainer, log_dir, log_ids=script == "run_glue")
    module.main(argv)
