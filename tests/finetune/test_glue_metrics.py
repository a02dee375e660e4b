"""GLUE metrics (finetune/glue_metrics.py, numpy only) against scikit-learn and scipy on known inputs."""

import math

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from posformers.finetune import glue_metrics as gm

RNG = np.random.default_rng(0)
BINARY_CASES = {
    "random": (RNG.integers(0, 2, 500), RNG.integers(0, 2, 500)),
    "all_correct": (np.array([0, 1, 1, 0, 1]), np.array([0, 1, 1, 0, 1])),
    "all_wrong": (np.array([1, 0, 0, 1]), np.array([0, 1, 1, 0])),
    "one_class_predicted": (np.ones(10, dtype=int), np.array([0, 1] * 5)),
    "no_positives_at_all": (np.zeros(6, dtype=int), np.zeros(6, dtype=int)),
    "skewed": (np.array([1] * 90 + [0] * 10), np.array([1] * 80 + [0] * 20)),
}


@pytest.mark.parametrize("case", sorted(BINARY_CASES))
def test_accuracy_f1_and_matthews_match_sklearn(case):
    predictions, labels = BINARY_CASES[case]
    assert gm.accuracy(predictions, labels) == pytest.approx(sk.accuracy_score(labels, predictions), abs=1e-12)
    assert gm.f1_binary(predictions, labels) == pytest.approx(
        sk.f1_score(labels, predictions, zero_division=0.0), abs=1e-12
    )
    assert gm.matthews_correlation(predictions, labels) == pytest.approx(
        sk.matthews_corrcoef(labels, predictions), abs=1e-12
    )


def test_matthews_multiclass_matches_sklearn():
    labels, predictions = RNG.integers(0, 3, 300), RNG.integers(0, 3, 300)
    predictions[:150] = labels[:150]  # some signal, so the value is not ~0
    assert gm.matthews_correlation(predictions, labels) == pytest.approx(
        sk.matthews_corrcoef(labels, predictions), abs=1e-12
    )


CONTINUOUS_CASES = {
    "random": (RNG.normal(size=200), RNG.normal(size=200)),
    "correlated": (np.arange(50.0), np.arange(50.0) ** 2 + RNG.normal(size=50)),
    "ties": (np.array([1.0, 2, 2, 3, 3, 3, 4, 5, 5, 0]), np.array([0.5, 1, 4, 2, 2, 5, 1, 3, 3, 3])),
    "stsb_like": (np.round(RNG.uniform(0, 5, 300), 1), np.round(RNG.uniform(0, 5, 300) * 2) / 2),
}


@pytest.mark.parametrize("case", sorted(CONTINUOUS_CASES))
def test_pearson_and_spearman_match_scipy(case):
    x, y = CONTINUOUS_CASES[case]
    assert gm.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert gm.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    np.testing.assert_allclose(gm.average_ranks(x), stats.rankdata(x), atol=0)


def test_correlations_of_a_constant_are_nan_like_scipy():
    x, y = np.ones(5), np.arange(5.0)
    with pytest.warns(stats.ConstantInputWarning):
        assert math.isnan(stats.pearsonr(x, y)[0])
    assert math.isnan(gm.pearson(x, y))
    assert math.isnan(gm.spearman(x, y))


@pytest.mark.parametrize(
    ("task", "expected_keys"),
    [
        ("cola", {"matthews_correlation"}),
        ("sst2", {"accuracy"}),
        ("mrpc", {"accuracy", "f1", "combined_score"}),
        ("qqp", {"accuracy", "f1", "combined_score"}),
        ("stsb", {"pearson", "spearmanr", "combined_score"}),
        ("mnli", {"accuracy"}),
        ("qnli", {"accuracy"}),
        ("rte", {"accuracy"}),
        ("wnli", {"accuracy"}),
    ],
)
def test_glue_metrics_per_task(task, expected_keys):
    if task == "stsb":
        predictions, labels = CONTINUOUS_CASES["stsb_like"]
        reference = {
            "pearson": stats.pearsonr(predictions, labels)[0],
            "spearmanr": stats.spearmanr(predictions, labels)[0],
        }
    else:
        predictions, labels = BINARY_CASES["random"]
        reference = {
            "accuracy": sk.accuracy_score(labels, predictions),
            "f1": sk.f1_score(labels, predictions),
            "matthews_correlation": sk.matthews_corrcoef(labels, predictions),
        }
    result = gm.glue_metrics(task, predictions, labels)
    assert set(result) == expected_keys
    for key in expected_keys - {"combined_score"}:
        assert result[key] == pytest.approx(reference[key], abs=1e-12), key
    if "combined_score" in result:
        assert result["combined_score"] == pytest.approx(
            np.mean([result[k] for k in expected_keys - {"combined_score"}])
        )


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="unknown GLUE task 'sst3'"):
        gm.glue_metrics("sst3", [0], [0])
