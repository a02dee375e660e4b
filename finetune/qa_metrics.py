"""Exact match and F1 for extractive question answering, computed locally as the official evaluation scripts do.

- SQuAD v1.1 (`evaluate-v1.1.py`): lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace; EM and
  F1 (token-bag overlap) are the best over the gold answers; a question without a prediction scores 0.
- SQuAD v2.0 (`evaluate-v2.0.py`): the same normalisation; a question without gold answers is unanswerable, gold
  answers that normalise to "" are scored as ""; the empty prediction means "no answer". With the null odds
  (score of "no answer" minus the best span's) it also reports the HasAns/NoAns breakdown and the null threshold
  that would have scored best.
- TriviaQA (`triviaqa_evaluation.py`): underscores and punctuation (with the typographic quotes) become spaces instead
  of being dropped, then articles go and whitespace collapses; scored against every alias of the answer.

Metric names follow the scripts: v1 and TriviaQA report `exact_match` and `f1`, v2 reports `exact`, `f1`, `total`,
`HasAns_*`, `NoAns_*` and `best_exact`, `best_exact_thresh`, `best_f1`, `best_f1_thresh`. All scores are percentages.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_SQUAD_PUNCTUATION = frozenset(string.punctuation)
_TRIVIAQA_PUNCTUATION = frozenset(string.punctuation + "‘’´`")


def normalize_squad(text: str) -> str:
    """SQuAD's normalize_answer: 'The  Eiffel-Tower!' -> 'eiffeltower'."""
    text = "".join(ch for ch in text.lower() if ch not in _SQUAD_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def normalize_triviaqa(text: str) -> str:
    """TriviaQA's normalize_answer: 'The  Eiffel-Tower!' -> 'eiffel tower'."""
    text = text.replace("_", " ").lower()
    text = "".join(" " if ch in _TRIVIAQA_PUNCTUATION else ch for ch in text)
    return " ".join(_ARTICLES.sub(" ", text).split())


NORMALIZERS: dict[str, Callable[[str], str]] = {"squad": normalize_squad, "triviaqa": normalize_triviaqa}


def exact_score(prediction: str, gold: str, normalize: Callable[[str], str] = normalize_squad) -> float:
    return float(normalize(prediction) == normalize(gold))


def f1_score(prediction: str, gold: str, normalize: Callable[[str], str] = normalize_squad) -> float:
    """Token-bag F1 of the normalised strings. Two empty strings agree (1.0), one empty one scores 0 (v2's rule;
    v1 gives 0 there too because its gold answers are never empty)."""
    prediction_tokens, gold_tokens = normalize(prediction).split(), normalize(gold).split()
    if not prediction_tokens or not gold_tokens:
        return float(prediction_tokens == gold_tokens)
    common = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(prediction_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(score: Callable, prediction: str, golds: Sequence[str], normalize) -> float:
    return max(score(prediction, gold, normalize) for gold in golds)


def squad_v1(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]], normalizer="squad") -> dict:
    """EM and F1 over every question of `references` (id -> gold texts); missing predictions score 0."""
    normalize = NORMALIZERS[normalizer]
    exact = f1 = 0.0
    for qid, golds in references.items():
        if qid not in predictions:
            continue
        exact += best_over_golds(exact_score, predictions[qid], golds, normalize)
        f1 += best_over_golds(f1_score, predictions[qid], golds, normalize)
    total = max(len(references), 1)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def _raw_scores(predictions, references) -> tuple[dict, dict, dict]:
    """Per question: EM, F1 and whether it has an answer, with v2's treatment of empty gold answers."""
    exact, f1, has_answer = {}, {}, {}
    for qid, golds in references.items():
        has_answer[qid] = bool(golds)
        golds = [gold for gold in golds if normalize_squad(gold)] or [""]
        if qid not in predictions:
            continue
        exact[qid] = best_over_golds(exact_score, predictions[qid], golds, normalize_squad)
        f1[qid] = best_over_golds(f1_score, predictions[qid], golds, normalize_squad)
    return exact, f1, has_answer


def _with_null_threshold(scores: dict, null_odds: Mapping[str, float], has_answer: dict, threshold: float) -> dict:
    """Questions whose null odds exceed `threshold` are answered "no answer": right exactly when they have none."""
    return {
        qid: float(not has_answer[qid]) if null_odds.get(qid, 0.0) > threshold else score
        for qid, score in scores.items()
    }


def _mean(scores: dict, qids) -> dict:
    qids = list(qids)
    return {"value": 100.0 * sum(scores[qid] for qid in qids) / len(qids), "total": len(qids)}


def best_null_threshold(predictions, scores: dict, null_odds, has_answer: dict) -> tuple[float, float]:
    """The threshold on the null odds maximising the total score (v2's find_best_thresh): start from answering
    "no answer" everywhere and switch questions to their span in increasing order of null odds."""
    current = best = sum(1 for qid in has_answer if not has_answer[qid])
    best_threshold = 0.0
    for qid in sorted(null_odds, key=lambda k: null_odds[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_threshold = current, null_odds[qid]
    return 100.0 * best / len(scores), best_threshold


def squad_v2(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    null_odds: Mapping[str, float] | None = None,
    null_threshold: float = 1.0,
) -> dict:
    """SQuAD v2.0's metrics. `predictions` hold "" for "no answer"; `null_odds` (id -> null score minus best span
    score; all 0 when not given) give the best-threshold metrics; `null_threshold` is the script's --na-prob-thresh."""
    null_odds = dict(null_odds) if null_odds is not None else {qid: 0.0 for qid in predictions}
    exact_raw, f1_raw, has_answer = _raw_scores(predictions, references)
    exact = _with_null_threshold(exact_raw, null_odds, has_answer, null_threshold)
    f1 = _with_null_threshold(f1_raw, null_odds, has_answer, null_threshold)
    # The official script divides by the number of questions it scored (those with a prediction).
    scored = [qid for qid in references if qid in exact]
    if not scored:
        raise ValueError("no prediction for any question of the references")
    metrics = {"exact": _mean(exact, scored)["value"], "f1": _mean(f1, scored)["value"], "total": len(scored)}
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid in scored if has_answer[qid] is wanted]
        if qids:
            metrics[f"{name}_exact"] = _mean(exact, qids)["value"]
            metrics[f"{name}_f1"] = _mean(f1, qids)["value"]
            metrics[f"{name}_total"] = len(qids)
    metrics["best_exact"], metrics["best_exact_thresh"] = best_null_threshold(
        predictions, exact_raw, null_odds, has_answer
    )
    metrics["best_f1"], metrics["best_f1_thresh"] = best_null_threshold(predictions, f1_raw, null_odds, has_answer)
    return metrics


__all__ = [
    "NORMALIZERS",
    "best_null_threshold",
    "exact_score",
    "f1_score",
    "normalize_squad",
    "normalize_triviaqa",
    "squad_v1",
    "squad_v2",
]
