"""EM / F1 against hand-checked applications of the official SQuAD v1.1, v2.0 and TriviaQA evaluation rules."""

import math

import pytest

from posformers.finetune.qa_metrics import (
    exact_score,
    f1_score,
    normalize_squad,
    normalize_triviaqa,
    squad_v1,
    squad_v2,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Eiffel-Tower!", "eiffeltower"),  # punctuation is deleted, not replaced by a space
        ("An apple a day", "apple day"),
        ("theatre and them", "theatre and them"),  # articles only as whole words
        ("  Denmark,\tIceland and Norway. ", "denmark iceland and norway"),
        ("the", ""),
    ],
)
def test_squad_normalisation(text, expected):
    assert normalize_squad(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Eiffel-Tower!", "eiffel tower"),  # TriviaQA turns punctuation into spaces
        ("Guns_N'_Roses", "guns n roses"),
        ("Sunset Blvd.", "sunset blvd"),
        ("‘Rock’ music´s `best`", "rock music s best"),
    ],
)
def test_triviaqa_normalisation(text, expected):
    assert normalize_triviaqa(text) == expected


def test_f1_by_hand():
    # normalised: [cat, sat, on, mat] vs [cat, on, mat]: 3 common, precision 3/4, recall 1 -> 2 * .75 / 1.75
    assert f1_score("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    # repeated tokens count as often as they occur in both: [a? no] [new, new, york] vs [new, york] -> P 2/3, R 1
    assert f1_score("new new york", "New York") == pytest.approx(0.8)
    assert f1_score("Paris", "London") == 0.0
    assert f1_score("", "") == 1.0
    assert f1_score("", "France") == 0.0
    assert exact_score("the  France.", "France") == 1.0
    assert exact_score("Eiffel Tower", "Eiffel-Tower") == 0.0  # SQuAD deletes the hyphen: 'eiffeltower'
    assert exact_score("Eiffel Tower", "Eiffel-Tower", normalize_triviaqa) == 1.0


def test_squad_v1_best_gold_and_missing_predictions():
    references = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["1990s", "the 1990s"], "q3": ["Seven"]}
    predictions = {"q1": "denver broncos!", "q2": "late 1990s"}  # q3 has no prediction: it scores 0
    metrics = squad_v1(predictions, references)
    assert metrics["exact_match"] == pytest.approx(100 * 1 / 3)
    # q2: [late, 1990s] vs [1990s]: P 1/2, R 1 -> F1 2/3
    assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert squad_v1({"q": "sunset boulevard"}, {"q": ["Sunset Blvd.", "Sunset Boulevard"]}, "triviaqa") == {
        "exact_match": 100.0,
        "f1": 100.0,
    }


def test_squad_v2_breakdown_and_best_threshold_by_hand():
    references = {"a1": ["France"], "a2": ["10th century"], "n1": [], "n2": []}
    predictions = {"a1": "France", "a2": "the 10th", "n1": "", "n2": "Rollo"}
    null_odds = {"a1": -3.0, "a2": 0.5, "n1": 2.0, "n2": -1.0}
    metrics = squad_v2(predictions, references, null_odds, null_threshold=1.0)
    # threshold 1.0: n1 (odds 2.0) is answered "no answer" -> right; the others keep their prediction.
    # EM: a1 1, a2 0, n1 1, n2 0 -> 50; F1: a2 [10th] vs [10th, century] -> 2/3.
    assert metrics["exact"] == pytest.approx(50.0)
    assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 0) / 4)
    assert metrics["total"] == 4
    assert (metrics["HasAns_exact"], metrics["HasAns_total"]) == (pytest.approx(50.0), 2)
    assert metrics["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert (metrics["NoAns_exact"], metrics["NoAns_f1"], metrics["NoAns_total"]) == (50.0, 50.0, 2)
    # Best threshold (EM): start with "no answer" everywhere = 2 right; in increasing odds a1 (-3) +1 -> 3 (best,
    # thresh -3), n2 (-1) predicted "Rollo" -1 -> 2, a2 (0.5) +0 -> 2, n1 (2.0) predicted "" +0 -> 2.
    assert metrics["best_exact"] == pytest.approx(75.0)
    assert metrics["best_exact_thresh"] == -3.0
    # F1: same walk with a2 adding 2/3: 2 -> 3 (a1) -> 2 (n2) -> 2 2/3 (a2) -> 2 2/3: best stays 3 at -3.
    assert metrics["best_f1"] == pytest.approx(75.0)
    assert metrics["best_f1_thresh"] == -3.0


def test_squad_v2_empty_gold_texts_and_default_odds():
    # A gold answer that normalises to "" is scored as "", like an unanswerable question (official rule).
    metrics = squad_v2({"q": ""}, {"q": ["the"]})
    assert metrics["exact"] == 100.0
    assert metrics["HasAns_total"] == 1  # it still counts as "has answer": its answer list is not empty
    assert math.isclose(metrics["best_f1"], 100.0)
    with pytest.raises(ValueError, match="no prediction"):
        squad_v2({}, {"q": ["x"]})
