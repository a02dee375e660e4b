"""SQuAD v2.0 metrics for `evaluate`, computed by posformers.finetune.qa_metrics (the official evaluate-v2.0.py
rules): the empty prediction means "no answer", and each prediction's no_answer_probability (any score where more
means "no answer"; posformers-qa passes its null odds) gives the best-threshold metrics.

    squad_v2 = evaluate.load(posformers.finetune.metrics.path("squad_v2"))
    squad_v2.compute(predictions=[{"id": "q1", "prediction_text": "", "no_answer_probability": 0.9}],
                     references=[{"id": "q1", "answers": {"text": [], "answer_start": []}}])
"""

import datasets
import evaluate

from posformers.finetune.metrics import metric_info, squad_references
from posformers.finetune.qa_metrics import squad_v2

_DESCRIPTION = "SQuAD v2.0: exact match and F1 with unanswerable questions, their HasAns/NoAns breakdown and the "
_DESCRIPTION += "no-answer threshold that would have scored best."

_INPUTS = """
Args:
    predictions: [{"id": str, "prediction_text": str ("" for no answer), "no_answer_probability": float}]
    references: [{"id": str, "answers": {"text": [str], "answer_start": [int]}}]  (no text: unanswerable)
    no_answer_threshold: answer "no answer" where no_answer_probability exceeds it (evaluate-v2.0.py's
        --na-prob-thresh, default 1.0).
Returns: exact, f1, total, HasAns_exact/f1/total, NoAns_exact/f1/total, best_exact(_thresh), best_f1(_thresh).
"""

_CITATION = """@inproceedings{rajpurkar-etal-2018-know,
  title={Know What You Don't Know: Unanswerable Questions for {SQ}u{AD}},
  author={Rajpurkar, Pranav and Jia, Robin and Liang, Percy},
  booktitle={Proceedings of ACL},
  year={2018}
}"""


class SquadV2(evaluate.Metric):
    def _info(self):
        prediction = {
            "id": datasets.Value("string"),
            "prediction_text": datasets.Value("string"),
            "no_answer_probability": datasets.Value("float64"),
        }
        url = "https://rajpurkar.github.io/SQuAD-explorer/"
        return metric_info(_DESCRIPTION, _CITATION, _INPUTS, prediction, squad_references(), url)

    def _compute(self, predictions, references, no_answer_threshold: float = 1.0):
        answers = {p["id"]: p["prediction_text"] for p in predictions}
        null_odds = {p["id"]: p["no_answer_probability"] for p in predictions}
        golds = {r["id"]: r["answers"]["text"] for r in references}
        return squad_v2(answers, golds, null_odds, null_threshold=no_answer_threshold)
