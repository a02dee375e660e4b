"""posformers' metrics as `evaluate` modules (finetune/metrics): they load from the package without the network, and
give scikit-learn's and scipy's numbers for GLUE and hand-computed ones for SQuAD v1.1 / v2.0 and TriviaQA, and
posformers-glue / posformers-qa score through them."""

import math
import socket

import evaluate
import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk
from transformers import EvalPrediction

from posformers.finetune import metrics, qa_trainer, run_glue
from posformers.finetune.glue_data import GLUE_TASKS
from posformers.finetune.qa_features import QAPredictions

RNG = np.random.default_rng(1)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test (HF_HUB_OFFLINE=1 is already set by tests/conftest.py)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("name", metrics.NAMES)
def test_loads_from_the_package_without_the_network(name, no_network):
    path = metrics.path(name)
    assert path.startswith(str(metrics.METRICS_DIR))
    config_name = "sst2" if name == "glue" else None
    module = evaluate.load(path, config_name)
    assert isinstance(module, evaluate.Metric)
    assert module.name == name


def test_unknown_metric_and_config_are_refused():
    with pytest.raises(ValueError, match="unknown posformers metric 'bleu'"):
        metrics.path("bleu")
    with pytest.raises(KeyError, match="GLUE task"):
        metrics.load("glue")  # evaluate's "default" config is no GLUE task
    with pytest.raises(KeyError, match="triviaqa"):
        metrics.load("squad", config_name="squad_v3")


# ---------------------------------------------------------------------------------------------------------------------
# GLUE against scikit-learn and scipy
# ---------------------------------------------------------------------------------------------------------------------


def sklearn_glue(task: str, predictions, labels) -> dict:
    """GLUE's definitions, from scikit-learn and scipy."""
    if task == "stsb":
        result = {
            "pearson": stats.pearsonr(predictions, labels)[0],
            "spearmanr": stats.spearmanr(predictions, labels)[0],
        }
    elif task == "cola":
        return {"matthews_correlation": sk.matthews_corrcoef(labels, predictions)}
    elif task in ("mrpc", "qqp"):
        result = {"accuracy": sk.accuracy_score(labels, predictions), "f1": sk.f1_score(labels, predictions)}
    else:
        return {"accuracy": sk.accuracy_score(labels, predictions)}
    return {**result, "combined_score": float(np.mean(list(result.values())))}


@pytest.mark.parametrize("task", ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"])
def test_glue_matches_sklearn_and_scipy(task):
    if task == "stsb":
        labels = np.round(RNG.uniform(0, 5, 300) * 5) / 5
        predictions = labels + RNG.normal(scale=1.0, size=300)
    else:
        classes = 3 if task == "mnli" else 2
        labels = RNG.integers(0, classes, 400)
        predictions = np.where(RNG.random(400) < 0.7, labels, RNG.integers(0, classes, 400))
    result = metrics.load("glue", config_name=task).compute(predictions=predictions, references=labels)
    expected = sklearn_glue(task, predictions, labels)
    assert set(result) == set(expected)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=1e-12), key


def test_glue_accepts_lists_and_batches():
    glue = metrics.load("glue", config_name="mrpc")
    glue.add_batch(predictions=[1, 0], references=[1, 1])
    glue.add_batch(predictions=[1, 1], references=[0, 1])
    # 2 of 4 right; TP 2, FP 1, FN 1 -> F1 = 4 / 6
    assert glue.compute() == pytest.approx({"accuracy": 0.5, "f1": 2 / 3, "combined_score": (0.5 + 2 / 3) / 2})


# ---------------------------------------------------------------------------------------------------------------------
# SQuAD v1.1, TriviaQA and SQuAD v2.0 on hand-computed cases
# ---------------------------------------------------------------------------------------------------------------------


def gold(qid: str, *texts: str) -> dict:
    return {"id": qid, "answers": {"text": list(texts), "answer_start": [0] * len(texts)}}


def test_squad_v1_hand_computed():
    predictions = [
        {"id": "exact", "prediction_text": "the Denver Broncos"},  # normalises to "denver broncos": EM 1
        {"id": "partial", "prediction_text": "cat sat on the mat"},  # 3 of 4 tokens right, all of gold's 3
        {"id": "second_gold", "prediction_text": "Santa Clara"},  # matches the second gold answer
        {"id": "wrong", "prediction_text": "Paris"},
    ]
    references = [
        gold("exact", "Denver Broncos"),
        gold("partial", "cat on mat"),
        gold("second_gold", "Levi's Stadium", "Santa Clara, California", "santa clara"),
        gold("wrong", "London"),
    ]
    result = metrics.load("squad").compute(predictions=predictions, references=references)
    # EM: exact and second_gold; F1: 1 + 2·(3/4·1)/(3/4+1) + 1 + 0 = 2 + 6/7
    assert result == pytest.approx({"exact_match": 50.0, "f1": 100 * (2 + 6 / 7) / 4})


def test_triviaqa_config_turns_punctuation_into_spaces():
    predictions = [{"id": "q", "prediction_text": "Guns N' Roses"}]
    references = [gold("q", "Guns_N'_Roses", "GnR")]
    # TriviaQA: "guns n roses" on both sides; SQuAD deletes punctuation, underscores included: "gunsnroses"
    assert metrics.load("squad", "triviaqa").compute(predictions=predictions, references=references) == {
        "exact_match": 100.0,
        "f1": 100.0,
    }
    assert metrics.load("squad").compute(predictions=predictions, references=references)["exact_match"] == 0.0


def test_squad_v2_hand_computed():
    predictions = [
        {"id": "has_right", "prediction_text": "1848", "no_answer_probability": -2.0},
        {"id": "has_half", "prediction_text": "New York City", "no_answer_probability": 0.5},
        {"id": "no_abstained", "prediction_text": "", "no_answer_probability": 3.0},
        {"id": "no_answered", "prediction_text": "Mars", "no_answer_probability": -1.0},
    ]
    references = [
        gold("has_right", "1848"),
        gold("has_half", "New York"),  # prediction 3 tokens, 2 right: F1 = 2·(2/3·1)/(2/3+1) = 0.8
        gold("no_abstained"),
        gold("no_answered"),
    ]
    result = metrics.load("squad_v2").compute(predictions=predictions, references=references)
    # No null odds above the threshold 1.0 except no_abstained's, which abstained anyway: scores as predicted.
    assert result["exact"] == pytest.approx(100 * 2 / 4)
    assert result["f1"] == pytest.approx(100 * (1 + 0.8 + 1 + 0) / 4)
    assert (result["total"], result["HasAns_total"], result["NoAns_total"]) == (4, 2, 2)
    assert result["HasAns_exact"] == pytest.approx(50.0) and result["HasAns_f1"] == pytest.approx(90.0)
    assert result["NoAns_exact"] == pytest.approx(50.0)
    # Best threshold: "no answer" everywhere gets the 2 unanswerable right; answering in increasing null odds,
    # has_right (-2.0) makes 3, no_answered (-1.0) loses one (2), has_half (0.5) adds EM 0 / F1 0.8 (2 / 2.8), and
    # no_abstained (3.0) answers "" anyway. Best: 3 of 4 at -2.0, for EM and F1 alike.
    assert result["best_exact"] == pytest.approx(75.0) and result["best_exact_thresh"] == -2.0
    assert result["best_f1"] == pytest.approx(75.0) and result["best_f1_thresh"] == -2.0


def test_squad_v2_threshold_turns_confident_nulls_into_no_answer():
    predictions = [{"id": "no", "prediction_text": "Mars", "no_answer_probability": 0.9}]
    references = [gold("no")]
    squad_v2 = metrics.load("squad_v2")
    assert squad_v2.compute(predictions=predictions, references=references)["exact"] == 0.0
    assert squad_v2.compute(predictions=predictions, references=references, no_answer_threshold=0.5)["exact"] == 100.0


def test_squad_v2_infinite_null_odds():
    """posformers-qa gives a question without any span candidate the null odds +inf."""
    predictions = [{"id": "q", "prediction_text": "", "no_answer_probability": math.inf}]
    result = metrics.load("squad_v2").compute(predictions=predictions, references=[gold("q", "Rhine")])
    assert result["exact"] == 0.0 and result["HasAns_total"] == 1


# ---------------------------------------------------------------------------------------------------------------------
# The scripts compute through these modules
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def loaded(monkeypatch):
    """The (name, config_name) of every metric the code under test loads through posformers.finetune.metrics."""
    calls, real_load = [], metrics.load

    def spy(name, config_name=None, **kwargs):
        calls.append((name, config_name))
        return real_load(name, config_name, **kwargs)

    monkeypatch.setattr(metrics, "load", spy)
    qa_trainer._metric.cache_clear()
    yield calls
    qa_trainer._metric.cache_clear()


def test_run_glue_scores_through_the_glue_module(loaded):
    compute = run_glue.make_compute_metrics(GLUE_TASKS["mrpc"], ("0", "1"))
    logits = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])  # predicts 1, 0, 1, 1
    result = compute(EvalPrediction(predictions=logits, label_ids=np.array([1, 1, 0, 1])))
    assert loaded == [("glue", "mrpc")]
    assert result == pytest.approx({"accuracy": 0.5, "f1": 2 / 3, "combined_score": (0.5 + 2 / 3) / 2})


@pytest.mark.parametrize(
    ("version_2", "normalizer", "module"),
    [
        (False, "squad", ("squad", None)),
        (False, "triviaqa", ("squad", "triviaqa")),
        (True, "squad", ("squad_v2", None)),
    ],
)
def test_run_qa_scores_through_the_squad_modules(loaded, version_2, normalizer, module):
    examples = [
        {"id": "a", "answers": {"text": ["Rhine"], "answer_start": [3]}},
        {"id": "b", "answers": {"text": ["two rivers"], "answer_start": [9]}},
    ]
    answers = QAPredictions(predictions={"a": "the Rhine", "b": "rivers"}, nbest={}, null_odds={"a": -1.0, "b": -2.0})
    result = qa_trainer.score_predictions(examples, answers, version_2, normalizer)
    assert loaded == [module]
    # a: exact; b: 1 of 1 predicted token in 2 gold ones, F1 = 2·(1·1/2)/(1+1/2) = 2/3
    assert result["exact" if version_2 else "exact_match"] == pytest.approx(50.0)
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
