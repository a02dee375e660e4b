"""A Trainer for extractive question answering on transformers 5.x.

Evaluation runs the model over the windows (features), turns their start/end logits into one answer per example
(qa_features.postprocess_predictions), scores the answers (posformers' `evaluate` modules "squad" and "squad_v2",
finetune/metrics, computed by qa_metrics) and logs the scores with the `eval_` prefix,
so `eval_strategy=steps|epoch`, `metric_for_best_model="f1"` and `load_best_model_at_end` work as for any metric.
Unlike the old example subclass it overrides only `evaluate` and `predict` and leaves Trainer's own evaluation loop,
logging and callbacks in charge (the 5.x loop, accelerate's gathering across processes, speed metrics).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

from transformers import Trainer
from transformers.trainer_utils import PredictionOutput, speed_metrics

from . import metrics
from .qa_features import POSTPROCESS_COLUMNS, QAPredictions, postprocess_predictions
from .qa_metrics import NORMALIZERS


def references_of(examples) -> dict[str, list[str]]:
    """id -> accepted answer texts: the gold spans, or every alias where the data gives them (TriviaQA)."""
    has_aliases = "aliases" in getattr(examples, "column_names", [])
    return {e["id"]: (e["aliases"] if has_aliases and e["aliases"] else e["answers"]["text"]) for e in examples}


@functools.cache
def _metric(name: str, config_name: str | None = None):
    """One loaded `evaluate` module per kind, reused by every evaluation of the process."""
    return metrics.load(name, config_name)


def score_predictions(
    examples, predictions: QAPredictions, version_2_with_negative: bool, normalizer: str = "squad"
) -> dict:
    """SQuAD v1.1 metrics (exact_match, f1), or v2.0's (exact, f1, HasAns_/NoAns_, best thresholds); `normalizer`
    "triviaqa" scores v1 with TriviaQA's normalisation."""
    references = references_of(examples)
    golds = [  # the metrics read only the texts: answer_start is a placeholder (aliases have none)
        {"id": qid, "answers": {"text": list(texts), "answer_start": [-1] * len(texts)}}
        for qid, texts in references.items()
    ]
    if version_2_with_negative:
        null_odds = predictions.null_odds or {}
        answers = [
            {
                "id": qid,
                "prediction_text": predictions.predictions[qid],
                "no_answer_probability": null_odds.get(qid, 0.0),
            }
            for qid in references
        ]
        return _metric("squad_v2").compute(predictions=answers, references=golds)
    if normalizer not in NORMALIZERS:
        raise ValueError(f"normalizer must be one of {sorted(NORMALIZERS)}, got {normalizer!r}")
    answers = [{"id": qid, "prediction_text": predictions.predictions[qid]} for qid in references]
    return _metric("squad", None if normalizer == "squad" else normalizer).compute(
        predictions=answers, references=golds
    )


class QuestionAnsweringTrainer(Trainer):
    """Trainer whose evaluation scores answers, not windows.

    eval_examples: the examples behind `eval_dataset` (features made by `prepare_features(...,
    for_postprocessing=True)`); postprocess: features' logits -> QAPredictions (e.g. a functools.partial of
    `postprocess_predictions` with n_best_size etc.); score: (examples, QAPredictions) -> metrics without prefix.
    After each evaluation / prediction `last_predictions` holds the answers (for writing predictions files).
    """

    def __init__(
        self,
        *args,
        eval_examples=None,
        postprocess: Callable = postprocess_predictions,
        score: Callable | None = None,
        **kwargs,
    ):
        if kwargs.get("compute_metrics") is not None:
            raise ValueError("QuestionAnsweringTrainer scores answers with `score`, not `compute_metrics`")
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.postprocess = postprocess
        self.score = score
        self.last_predictions: QAPredictions | None = None

    def _answer(self, features, examples, description: str, ignore_keys, metric_key_prefix: str):
        """Run the model over `features` and post-process: (EvalLoopOutput, QAPredictions, seconds)."""
        model_inputs = features.remove_columns([c for c in POSTPROCESS_COLUMNS if c in features.column_names])
        dataloader = (
            self.get_eval_dataloader(model_inputs)
            if description == "Evaluation"
            else self.get_test_dataloader(model_inputs)
        )
        start_time = time.time()
        output = self.evaluation_loop(
            dataloader,
            description=description,
            prediction_loss_only=False,  # the logits are the point
            ignore_keys=ignore_keys,
            metric_key_prefix=metric_key_prefix,
        )
        start_logits, end_logits = output.predictions[:2]
        predictions = self.postprocess(examples, features, start_logits, end_logits)
        return output, predictions, start_time

    def _speed(self, output, start_time: float, metric_key_prefix: str) -> dict:
        if f"{metric_key_prefix}_model_preparation_time" in output.metrics:
            start_time += output.metrics[f"{metric_key_prefix}_model_preparation_time"]
        total_batch_size = self.args.eval_batch_size * self.args.world_size
        steps = math.ceil(output.num_samples / total_batch_size)
        return speed_metrics(metric_key_prefix, start_time, num_samples=output.num_samples, num_steps=steps)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", eval_examples=None):
        features = self.eval_dataset if eval_dataset is None else eval_dataset
        examples = self.eval_examples if eval_examples is None else eval_examples
        if isinstance(features, dict) or features is None or examples is None:
            raise ValueError("QuestionAnsweringTrainer.evaluate needs one features dataset and its examples")
        self._memory_tracker.start()
        output, predictions, start_time = self._answer(features, examples, "Evaluation", ignore_keys, metric_key_prefix)
        metrics = dict(output.metrics)
        if self.score is not None:
            metrics.update({f"{metric_key_prefix}_{k}": v for k, v in self.score(examples, predictions).items()})
        metrics.update(self._speed(output, start_time, metric_key_prefix))
        self.last_predictions = predictions
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return metrics

    def predict(self, test_dataset, test_examples=None, ignore_keys=None, metric_key_prefix: str = "test"):
        """Answers for `test_examples`; metrics (beyond speed) only when every example has gold answers."""
        if test_examples is None:
            raise ValueError("QuestionAnsweringTrainer.predict needs the examples behind the features")
        self._memory_tracker.start()
        output, predictions, start_time = self._answer(
            test_dataset, test_examples, "Prediction", ignore_keys, metric_key_prefix
        )
        metrics = dict(output.metrics)
        if self.score is not None and all(references_of(test_examples).values()):
            metrics.update({f"{metric_key_prefix}_{k}": v for k, v in self.score(test_examples, predictions).items()})
        metrics.update(self._speed(output, start_time, metric_key_prefix))
        self.last_predictions = predictions
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=metrics)


__all__ = ["QuestionAnsweringTrainer", "references_of", "score_predictions"]
