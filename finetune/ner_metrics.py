"""Entity-level NER scores, exactly as `seqeval` computes them in its default mode (conlleval's chunking rules).

    ner_metrics(references, predictions)
    # {"precision": ..., "recall": ..., "f1": ..., "accuracy": ...,
    #  "PER_precision": ..., "PER_recall": ..., "PER_f1": ..., "PER_number": ..., ...}

references, predictions: one list of tag strings per sentence ("B-PER", "I-ORG", "O", also IOBES tags). An entity is
a (type, first word, last word) chunk found by `entities`; precision, recall and F1 are micro-averaged over all entity
types (seqeval's `precision_score`, `recall_score`, `f1_score`), `accuracy` is per word (`accuracy_score`), and every
type gets its own precision, recall, F1 and number of true entities (`classification_report`). A score whose
denominator is zero is 0.0, as seqeval's default `zero_division` gives. tests/finetune/test_ner_metrics.py checks all
of it against the seqeval package.
"""

from __future__ import annotations

from collections import Counter

# seqeval's default (non-strict) chunking: which (previous tag, tag) pairs end the running chunk before this word,
# and which start a new one at this word. A change of type ends and starts a chunk too (except around "O" and ".").
_ENDS_AFTER = {"E", "S"}
_END_PAIRS = {("B", "B"), ("B", "S"), ("B", "O"), ("I", "B"), ("I", "S"), ("I", "O")}
_STARTS_AT = {"B", "S"}
_START_PAIRS = {("E", "E"), ("E", "I"), ("S", "E"), ("S", "I"), ("O", "E"), ("O", "I")}
_NO_TYPE = {"O", "."}
OVERALL = ("precision", "recall", "f1", "accuracy")


def split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '_'); a tag without a type gets the type '_' (seqeval's reading)."""
    return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """The (type, first, last) chunks of one sentence's tags, as seqeval's `get_entities` finds them."""
    chunks = []
    prev_tag, prev_type, begin = "O", "", 0
    for position, full_tag in enumerate([*tags, "O"]):
        tag, type_ = split_tag(full_tag)
        type_changed = prev_type != type_
        if prev_tag in _ENDS_AFTER or (prev_tag, tag) in _END_PAIRS or (prev_tag not in _NO_TYPE and type_changed):
            chunks.append((prev_type, begin, position - 1))
        if tag in _STARTS_AT or (prev_tag, tag) in _START_PAIRS or (tag not in _NO_TYPE and type_changed):
            begin = position
        prev_tag, prev_type = tag, type_
    return chunks


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def check_lengths(references: list[list[str]], predictions: list[list[str]]) -> None:
    if len(references) != len(predictions):
        raise ValueError(f"predictions: {len(predictions)} sentences for {len(references)} references")
    for index, (gold, predicted) in enumerate(zip(references, predictions)):
        if len(gold) != len(predicted):
            raise ValueError(f"predictions: sentence {index} has {len(predicted)} tags for {len(gold)} words")


def ner_metrics(references: list[list[str]], predictions: list[list[str]]) -> dict[str, float]:
    """Overall precision/recall/F1 (micro), word accuracy, and per-type scores, as seqeval's default mode."""
    check_lengths(references, predictions)
    gold = {(index, *chunk) for index, tags in enumerate(references) for chunk in entities(tags)}
    found = {(index, *chunk) for index, tags in enumerate(predictions) for chunk in entities(tags)}
    words = sum(len(tags) for tags in references)
    correct_words = sum(g == p for tags, pred in zip(references, predictions) for g, p in zip(tags, pred))
    precision, recall = _ratio(len(gold & found), len(found)), _ratio(len(gold & found), len(gold))
    scores = {"precision": precision, "recall": recall, "f1": _f1(precision, recall)}
    scores["accuracy"] = _ratio(correct_words, words)
    gold_types, found_types = Counter(c[1] for c in gold), Counter(c[1] for c in found)
    right_types = Counter(c[1] for c in gold & found)
    for type_ in sorted(set(gold_types) | set(found_types)):
        type_precision = _ratio(right_types[type_], found_types[type_])
        type_recall = _ratio(right_types[type_], gold_types[type_])
        scores[f"{type_}_precision"] = type_precision
        scores[f"{type_}_recall"] = type_recall
        scores[f"{type_}_f1"] = _f1(type_precision, type_recall)
        scores[f"{type_}_number"] = gold_types[type_]
    return scores
