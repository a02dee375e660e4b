"""The end of every fine-tuning script, written once: train and save, evaluate, predict, push to the Hub.

    results = run_stages(
        trainer, checkpoint,
        train_samples=len(train_dataset),                  # None: not known (a streamed corpus)
        evaluate=lambda: {**trainer.evaluate(), "eval_samples": len(eval_dataset)},
        predict=lambda: {...},                             # the script's own predictions files; metrics or {}
        card={"finetuned_from": ..., "tasks": "text-classification"},   # Trainer.create_model_card's arguments
    )

Each stage runs when its TrainingArguments flag asks for it (`--do_train`, `--do_eval`, `--do_predict`,
`--push_to_hub`) and reports its metrics through `report_metrics` (<split>_results.json, all_results.json and a
table); the metrics of all stages come back in one dict. Before pushing, `finish_run` writes training_curves.png and
the model card (README.md, with a model-index) into the output folder.

SIGTERM or SIGINT (Ctrl-C) during training saves a checkpoint at the end of the current step and ends the process with
status `checkpoints.PREEMPTED_EXIT_STATUS` (75) before the other stages; rerun with `--resume_from_checkpoint True`.

Every stage runs on every process: under torchrun each one is a collective somewhere (evaluation gathers the
predictions; under FSDP or DeepSpeed ZeRO-3, saving gathers the sharded weights, and `Trainer.push_to_hub` saves before
process 0 uploads), so a stage skipped on some processes leaves the others waiting forever. What only process 0 may
do (write a file, upload) is decided inside Trainer, or by the script's own `predict`.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import Trainer

from .checkpoints import PreemptionCallback
from .reporting import finish_run, report_metrics


def run_stages(
    trainer: Trainer,
    checkpoint: str | None = None,
    *,
    train_samples: int | None = None,
    evaluate: Callable[[], dict] | None = None,
    predict: Callable[[], dict] | None = None,
    card: dict | None = None,
) -> dict:
    """Run the stages `trainer.args` asks for and return every metric they reported.

    checkpoint: the folder to resume training from (`prepare_output_dir`'s answer). train_samples: reported as
    `train_samples`. evaluate / predict: the script's evaluation and prediction, returning their metrics (a stage
    without one is skipped; predict's metrics are reported only when it returns some). card: keyword arguments of
    `Trainer.push_to_hub` for the model card; empty values are left out.
    """
    args = trainer.args
    results: dict = {}
    if args.do_train:
        preemption = PreemptionCallback()  # SIGTERM, Ctrl-C: a checkpoint at the step's end, PREEMPTED_EXIT_STATUS
        trainer.add_callback(preemption)
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        preemption.exit_if_preempted(trainer)
        trainer.save_model()  # the model and the tokenizer
        metrics = dict(train_result.metrics)
        if train_samples is not None:
            metrics["train_samples"] = train_samples
        report_metrics(trainer, "train", metrics)
        trainer.save_state()
        results.update(metrics)
    if args.do_eval and evaluate is not None:
        metrics = evaluate()
        report_metrics(trainer, "eval", metrics)
        results.update(metrics)
    if args.do_predict and predict is not None:
        metrics = predict()
        if metrics:
            report_metrics(trainer, "predict", metrics)
            results.update(metrics)
    finish_run(trainer, results, card)  # training_curves.png and the model card
    if args.push_to_hub:
        trainer.push_to_hub(**{key: value for key, value in (card or {}).items() if value})
    return results
