"""SQuAD v1.1 exact match and F1 for `evaluate`, computed by posformers.finetune.qa_metrics (the official
evaluate-v1.1.py rules). config_name "triviaqa" scores with TriviaQA's normalisation instead (gold texts: the aliases).

    squad = evaluate.load(posformers.finetune.metrics.path("squad"))
    squad.compute(predictions=[{"id": "q1", "prediction_text": "Denver Broncos"}],
                  references=[{"id": "q1", "answers": {"text": ["Denver Broncos"], "answer_start": [177]}}])
"""

import datasets
import evaluate

from posformers.finetune.metrics import metric_info, squad_references
from posformers.finetune.qa_metrics import NORMALIZERS, squad_v1

_DESCRIPTION = "SQuAD v1.1: exact match and token-bag F1 (percentages), the best over each question's gold answers."

_INPUTS = """
Args:
    predictions: [{"id": str, "prediction_text": str}]
    references: [{"id": str, "answers": {"text": [str], "answer_start": [int]}}]  (answer_start is not used)
Returns: {"exact_match": float, "f1": float}, in percent.
"""

_CITATION = """@inproceedings{rajpurkar-etal-2016-squad,
  title={{SQ}u{AD}: 100,000+ Questions for Machine Comprehension of Text},
  author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle={Proceedings of EMNLP},
  year={2016}
}"""


class Squad(evaluate.Metric):
    def _info(self):
        if self.config_name not in ("default", *NORMALIZERS):
            raise KeyError(f"config_name must be one of default, {', '.join(NORMALIZERS)}; got {self.config_name!r}")
        prediction = {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")}
        url = "https://rajpurkar.github.io/SQuAD-explorer/"
        return metric_info(_DESCRIPTION, _CITATION, _INPUTS, prediction, squad_references(), url)

    def _compute(self, predictions, references):
        normalizer = "squad" if self.config_name == "default" else self.config_name
        answers = {p["id"]: p["prediction_text"] for p in predictions}
        golds = {r["id"]: r["answers"]["text"] for r in references}
        return squad_v1(answers, golds, normalizer)
