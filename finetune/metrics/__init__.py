"""posformers' metrics as `evaluate` modules, shipped inside the package and loaded offline.

    from posformers.finetune import metrics
    glue = metrics.load("glue", config_name="mrpc")            # config_name: the GLUE task
    glue.compute(predictions=[1, 0, 1], references=[1, 1, 1])  # {"accuracy": ..., "f1": ..., "combined_score": ...}
    squad = metrics.load("squad")                              # config_name "triviaqa": TriviaQA's normalisation
    squad.compute(predictions=[{"id": "q1", "prediction_text": "Denver Broncos"}],
                  references=[{"id": "q1", "answers": {"text": ["Denver Broncos"], "answer_start": [177]}}])
    squad_v2 = metrics.load("squad_v2")     # predictions also carry "no_answer_probability" (posformers-qa: null odds)
    seqeval = metrics.load("seqeval")       # NER entity scores: predictions / references are lists of tags per sentence

`metrics.load(name, ...)` is `evaluate.load(metrics.path(name), ...)`: a local path, which `evaluate` loads without
the network (it copies the script into its modules cache, HF_MODULES_CACHE). Inputs are those of the `evaluate`
metrics of the same name; the numbers are computed by finetune/glue_metrics.py, finetune/qa_metrics.py and
finetune/ner_metrics.py.

| name | config_name | metrics |
|---|---|---|
| glue | cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli | as glue_metrics.TASK_METRICS (+ combined_score) |
| squad | default (SQuAD v1.1), triviaqa | exact_match, f1 |
| squad_v2 | default | exact, f1, total, HasAns_*, NoAns_*, best_exact(_thresh), best_f1(_thresh) |
| seqeval | default | per entity type {precision, recall, f1, number}, overall_precision/recall/f1/accuracy |
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import evaluate

METRICS_DIR = Path(__file__).resolve().parent
NAMES = ("glue", "squad", "squad_v2", "seqeval")


def path(name: str) -> str:
    """The folder of metric `name` inside the installed package (what `evaluate.load` takes)."""
    if name not in NAMES:
        raise ValueError(f"unknown posformers metric {name!r}; known: {', '.join(NAMES)}")
    return str(METRICS_DIR / name)


def load(name: str, config_name: str | None = None, **kwargs) -> evaluate.EvaluationModule:
    """`evaluate.load` of posformers' metric `name`; kept in memory unless `keep_in_memory=False` is passed (nothing is
    written under evaluate's cache, and every process of a distributed run computes on its own)."""
    import evaluate  # here, not at the top: it costs the scripts a second of start-up (`--help` included)

    kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(path(name), config_name, **kwargs)


def metric_info(description: str, citation: str, inputs: str, predictions, references, url: str):
    """The `evaluate.MetricInfo` of one of these modules: its texts, the features of one prediction and of one
    reference, and where the metric is defined."""
    import datasets
    import evaluate

    return evaluate.MetricInfo(
        description=description,
        citation=citation,
        inputs_description=inputs,
        features=datasets.Features({"predictions": predictions, "references": references}),
        reference_urls=[url],
    )


def squad_references() -> dict:
    """The feature of one SQuAD reference (squad and squad_v2): its id and gold answers."""
    import datasets

    answers = datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")})
    return {"id": datasets.Value("string"), "answers": answers}
