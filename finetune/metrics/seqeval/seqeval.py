"""Entity-level NER scores for `evaluate`, in the output format of evaluate's "seqeval" metric, computed by
posformers.finetune.ner_metrics (seqeval's default mode, tested against the seqeval package).

    seqeval = evaluate.load(posformers.finetune.metrics.path("seqeval"))
    seqeval.compute(predictions=[["B-PER", "I-PER", "O"]], references=[["B-PER", "I-PER", "O"]])
    # {"PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 1}, "overall_precision": 1.0, ...}
"""

import datasets
import evaluate

from posformers.finetune.metrics import metric_info
from posformers.finetune.ner_metrics import OVERALL, ner_metrics

_DESCRIPTION = "Entity-level precision, recall and F1 (micro over types, and per type) and word accuracy, as seqeval."

_INPUTS = """
Args:
    predictions: one list of tags per sentence ("B-PER", "I-ORG", "O", IOBES tags too).
    references: the gold tags, in the same shape.
Returns: {TYPE: {"precision", "recall", "f1", "number"}, ..., "overall_precision", "overall_recall", "overall_f1",
    "overall_accuracy"}, as evaluate's "seqeval" metric.
"""

_CITATION = """@misc{seqeval,
  title={{seqeval}: A Python framework for sequence labeling evaluation},
  url={https://github.com/chakki-works/seqeval},
  author={Hiroki Nakayama},
  year={2018}
}"""


class Seqeval(evaluate.Metric):
    def _info(self):
        tags = datasets.Sequence(datasets.Value("string"))
        return metric_info(_DESCRIPTION, _CITATION, _INPUTS, tags, tags, "https://github.com/chakki-works/seqeval")

    def _compute(self, predictions, references):
        scores = ner_metrics(references, predictions)
        result = {}
        for key, value in scores.items():
            if key in OVERALL:
                continue
            type_, name = key.rsplit("_", 1)
            result.setdefault(type_, {})[name] = value
        result.update({f"overall_{name}": scores[name] for name in OVERALL})
        return result
