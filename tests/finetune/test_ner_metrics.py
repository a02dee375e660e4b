"""finetune/ner_metrics.py against the seqeval package (default mode): random tag sequences with every kind of
ill-formed chunk, the real CoNLL-2003 validation tags, and hand-checked cases."""

import random
import warnings

import pytest
from helpers.data import DATA_DIR
from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities

from posformers.finetune import metrics
from posformers.finetune.ner_data import read_conll
from posformers.finetune.ner_metrics import entities, ner_metrics

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "E-LOC", "S-MISC", "I-MISC", "B", "I", "E-PER", "S-PER", "."]


def seqeval_scores(references, predictions) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns about undefined scores and tags it does not know
        scores = {
            "precision": precision_score(references, predictions),
            "recall": recall_score(references, predictions),
            "f1": f1_score(references, predictions),
            "accuracy": accuracy_score(references, predictions),
        }
        report = classification_report(references, predictions, output_dict=True)
    for name, row in report.items():
        if " avg" not in name:
            scores.update({f"{name}_precision": row["precision"], f"{name}_recall": row["recall"]})
            scores.update({f"{name}_f1": row["f1-score"], f"{name}_number": row["support"]})
    return scores


def random_sentences(rng: random.Random, count: int) -> list[list[str]]:
    return [[rng.choice(TAGS) for _ in range(rng.randint(1, 12))] for _ in range(count)]


@pytest.mark.parametrize("seed", range(5))
def test_random_tag_sequences_score_as_seqeval(seed):
    rng = random.Random(seed)
    references = random_sentences(rng, 40)
    predictions = [[rng.choice([tag, rng.choice(TAGS)]) for tag in sentence] for sentence in references]
    ours = ner_metrics(references, predictions)
    assert ours == pytest.approx(seqeval_scores(references, predictions), abs=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sentence in references:
            assert entities(sentence) == get_entities(sentence), sentence


def test_real_conll_tags_score_as_seqeval():
    references = [e["ner_tags"] for e in read_conll(DATA_DIR / "ner" / "conll2003" / "valid.txt")]
    rng = random.Random(0)
    # Damage a third of the tags: split, merge, retype and invent entities.
    predictions = [[rng.choice(TAGS[:5]) if rng.random() < 0.3 else tag for tag in tags] for tags in references]
    ours = ner_metrics(references, predictions)
    assert ours == pytest.approx(seqeval_scores(references, predictions), abs=1e-12)
    assert {"LOC_f1", "MISC_f1", "ORG_f1", "PER_f1"} <= set(ours)
    assert ner_metrics(references, references)["f1"] == 1.0


def test_hand_checked_cases():
    # IOB1 reading: an I- tag after O starts an entity; a change of type ends one.
    assert entities(["I-PER", "I-PER", "O", "I-LOC", "I-ORG"]) == [("PER", 0, 1), ("LOC", 3, 3), ("ORG", 4, 4)]
    assert entities(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"]]
    scores = ner_metrics(gold, predicted)
    assert (scores["precision"], scores["recall"], scores["f1"], scores["accuracy"]) == (0.5, 0.5, 0.5, 0.75)
    assert (scores["LOC_recall"], scores["LOC_number"], scores["ORG_precision"], scores["ORG_number"]) == (0, 1, 0, 0)
    assert ner_metrics([["O"]], [["O"]])["f1"] == 0.0  # no entities anywhere: seqeval's zero_division 0


def test_lengths_must_match():
    with pytest.raises(ValueError, match="sentence 0 has 1 tags for 2 words"):
        ner_metrics([["O", "O"]], [["O"]])


def test_evaluate_module_gives_evaluates_seqeval_layout():
    references = [e["ner_tags"] for e in read_conll(DATA_DIR / "ner" / "conll2003" / "valid.txt")]
    rng = random.Random(1)
    predictions = [[rng.choice(TAGS[:5]) if rng.random() < 0.2 else tag for tag in tags] for tags in references]
    result = metrics.load("seqeval").compute(predictions=predictions, references=references)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = classification_report(references, predictions, output_dict=True)
        assert result["overall_f1"] == pytest.approx(f1_score(references, predictions), abs=1e-12)
        assert result["overall_accuracy"] == pytest.approx(accuracy_score(references, predictions), abs=1e-12)
    assert set(result) == {"LOC", "MISC", "ORG", "PER", "overall_precision", "overall_recall", "overall_f1",
                           "overall_accuracy"}  # fmt: skip
    for type_ in ("LOC", "MISC", "ORG", "PER"):
        assert result[type_]["f1"] == pytest.approx(report[type_]["f1-score"], abs=1e-12)
        assert result[type_]["number"] == report[type_]["support"]
