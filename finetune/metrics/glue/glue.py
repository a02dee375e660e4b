"""GLUE metrics for `evaluate`, computed by posformers.finetune.glue_metrics (numpy, as GLUE defines them).

glue = evaluate.load(posformers.finetune.metrics.path("glue"), "mrpc")
glue.compute(predictions=[1, 0, 1], references=[1, 1, 1])
"""

import datasets
import evaluate

from posformers.finetune.glue_metrics import TASK_METRICS, glue_metrics
from posformers.finetune.metrics import metric_info

_DESCRIPTION = "The GLUE metrics of each task: Matthews correlation (cola), accuracy, F1 (mrpc, qqp), Pearson and "
_DESCRIPTION += "Spearman correlation (stsb); combined_score is their mean where a task has two."

_INPUTS = """
Args:
    predictions: predicted class ids (stsb: scores).
    references: gold class ids (stsb: scores).
Returns: the task's metrics, e.g. {"accuracy": 0.66, "f1": 0.8, "combined_score": 0.73} for mrpc.
"""

_CITATION = """@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}"""


class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in TASK_METRICS:
            raise KeyError(
                f"config_name must be a GLUE task, one of {', '.join(TASK_METRICS)}; got {self.config_name!r}"
            )
        value = datasets.Value("float64" if self.config_name == "stsb" else "int64")
        return metric_info(_DESCRIPTION, _CITATION, _INPUTS, value, value, "https://gluebenchmark.com/")

    def _compute(self, predictions, references):
        return glue_metrics(self.config_name, predictions, references)
