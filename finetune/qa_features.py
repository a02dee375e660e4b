"""From examples to model windows and back: windowing with the fast tokenizer, gold token positions, and the n-best
span post-processing that turns start/end logits of windows into one answer per example.

A document longer than `max_seq_length` becomes several windows ("features") of the form
`[CLS] question [SEP] context piece [SEP]`; consecutive pieces overlap by `doc_stride` tokens (the tokenizer's
`stride`, as in transformers' run_qa), so an answer cut by one window's edge lies whole in the next. Each feature
remembers its example (`example_id`), its context tokens' character offsets (`offset_mapping`, None for question and
special tokens) and its `cls_index`, which is where "no answer in this window" points.

A model whose span-selection head answers (`qa_head="span_selection"`, Splinter's QASS) reads windows of the form
`[CLS] question [QUESTION] [SEP] context piece [SEP]`: the question token closes the question segment, as in Splinter,
and its state asks for the answer span.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CONTEXT_SEQUENCE = 1  # the context is the second sequence of the pair; truncation="only_second" cuts only it
POSTPROCESS_COLUMNS = ("example_id", "offset_mapping", "cls_index")


def context_token_range(sequence_ids: list) -> tuple[int, int]:
    """First and last token index of the context in one window (the tokenizer's sequence_ids)."""
    first = sequence_ids.index(CONTEXT_SEQUENCE)
    last = len(sequence_ids) - 1 - sequence_ids[::-1].index(CONTEXT_SEQUENCE)
    return first, last


def answer_token_positions(offsets, sequence_ids, answers: dict, cls_index: int) -> tuple[int, int]:
    """Token (start, end) of the first answer lying whole in this window's context, else (cls_index, cls_index).

    offsets: (L, 2) character offsets of the window's tokens; answers: {"text": [...], "answer_start": [...]}.
    """
    first, last = context_token_range(sequence_ids)
    window_start, window_end = offsets[first][0], offsets[last][1]
    for text, start_char in zip(answers["text"], answers["answer_start"]):
        end_char = start_char + len(text)
        if start_char < window_start or end_char > window_end:
            continue
        start = first
        while start <= last and offsets[start][1] <= start_char:  # first token ending after the answer starts
            start += 1
        end = last
        while end >= first and offsets[end][0] >= end_char:  # last token starting before the answer ends
            end -= 1
        if start <= end:
            return start, end
    return cls_index, cls_index


def prepare_features(
    examples: dict,
    tokenizer,
    max_seq_length: int,
    doc_stride: int,
    pad_to_max_length: bool = False,
    with_labels: bool = True,
    for_postprocessing: bool = False,
    question_token: str | None = None,
) -> dict:
    """Windows of a batch of examples (a `datasets.map(batched=True)` function).

    with_labels: add `start_positions` / `end_positions` (the gold tokens, or cls_index where the window holds no
    answer). for_postprocessing: add `example_id`, `offset_mapping` (None outside the context) and `cls_index`.
    question_token: an added special token (the span-selection head's [QUESTION]) put right after each question.
    """
    questions = [question.lstrip() for question in examples["question"]]  # leading spaces would waste window room
    if question_token is not None:
        questions = [f"{question} {question_token}" for question in questions]
    encoded = tokenizer(
        questions,
        examples["context"],
        truncation="only_second",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
    )
    sample_of_feature = encoded.pop("overflow_to_sample_mapping")
    offset_mappings = encoded.pop("offset_mapping")
    columns = collections.defaultdict(list)
    for i, offsets in enumerate(offset_mappings):
        sequence_ids = encoded.sequence_ids(i)
        input_ids = encoded["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
        example = sample_of_feature[i]
        if with_labels:
            start, end = answer_token_positions(offsets, sequence_ids, examples["answers"][example], cls_index)
            columns["start_positions"].append(start)
            columns["end_positions"].append(end)
        if for_postprocessing:
            columns["example_id"].append(examples["id"][example])
            columns["offset_mapping"].append(
                [list(o) if s == CONTEXT_SEQUENCE else None for o, s in zip(offsets, sequence_ids)]
            )
            columns["cls_index"].append(cls_index)
    return {**encoded, **columns}


# ---------------------------------------------------------------------------------------------------------------------
# Post-processing
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class QAPredictions:
    """One answer per example id ("" = no answer), the n best candidates, and (v2) the null odds:
    score of "no answer" minus the best span's score."""

    predictions: dict[str, str]
    nbest: dict[str, list[dict]]
    null_odds: dict[str, float] | None = field(default=None)

    def write(self, output_dir, prefix: str) -> list[Path]:
        """<prefix>_predictions.json, <prefix>_nbest_predictions.json and (v2) <prefix>_null_odds.json."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        files = {"predictions": self.predictions, "nbest_predictions": self.nbest, "null_odds": self.null_odds}
        written = []
        for name, content in files.items():
            if content is None:
                continue
            path = output_dir / f"{prefix}_{name}.json"
            path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            written.append(path)
        return written


def _window_candidates(start_logits, end_logits, offsets, n_best_size: int, max_answer_length: int) -> list[dict]:
    """Valid spans among the window's n_best starts x n_best ends: inside the context, end >= start, at most
    max_answer_length tokens. start_logits, end_logits: (L,), possibly padded past len(offsets)."""
    candidates = []
    top_starts = np.argsort(start_logits)[::-1][:n_best_size]
    top_ends = np.argsort(end_logits)[::-1][:n_best_size]
    for start in top_starts:
        for end in top_ends:
            if start >= len(offsets) or end >= len(offsets) or offsets[start] is None or offsets[end] is None:
                continue
            if end < start or end - start + 1 > max_answer_length:
                continue
            candidates.append(
                {
                    "offsets": (offsets[start][0], offsets[end][1]),
                    "score": float(start_logits[start] + end_logits[end]),
                    "start_logit": float(start_logits[start]),
                    "end_logit": float(end_logits[end]),
                }
            )
    return candidates


def _softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - scores.max())
    return exp / exp.sum()


def postprocess_predictions(
    examples,
    features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    version_2_with_negative: bool = False,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
) -> QAPredictions:
    """Best answer of each example over all its windows.

    examples: rows with "id" and "context"; features: columns `POSTPROCESS_COLUMNS` (one row per window);
    start_logits, end_logits: (n_features, L). With version_2_with_negative the answer is "" when the null score
    (the lowest over the windows of start + end logit at cls_index) beats the best span by more than the threshold.
    """
    if len(start_logits) != len(features):
        raise ValueError(f"{len(start_logits)} rows of logits for {len(features)} features")
    windows = collections.defaultdict(list)
    for index, example_id in enumerate(features["example_id"]):
        windows[example_id].append(index)
    offset_mappings, cls_indices = features["offset_mapping"], features["cls_index"]

    predictions, nbest, null_odds = {}, {}, {} if version_2_with_negative else None
    for example in examples:
        candidates, null = [], None
        for index in windows[example["id"]]:
            start, end, cls_index = start_logits[index], end_logits[index], cls_indices[index]
            null_score = float(start[cls_index] + end[cls_index])
            if null is None or null_score < null["score"]:
                null = {"offsets": (0, 0), "score": null_score, "start_logit": float(start[cls_index])}
                null["end_logit"] = float(end[cls_index])
            candidates += _window_candidates(start, end, offset_mappings[index], n_best_size, max_answer_length)
        best = sorted(candidates, key=lambda c: c["score"], reverse=True)[:n_best_size]
        for candidate in best:
            candidate["text"] = example["context"][candidate["offsets"][0] : candidate["offsets"][1]]
        if version_2_with_negative and null is not None:
            best.append({**null, "text": ""})
        if not best:
            best = [{"offsets": (0, 0), "score": 0.0, "start_logit": 0.0, "end_logit": 0.0, "text": ""}]
        best.sort(key=lambda c: c["score"], reverse=True)
        probabilities = _softmax(np.array([c["score"] for c in best]))
        nbest[example["id"]] = [
            {
                "text": c["text"],
                "answer_start": int(c["offsets"][0]),
                "probability": float(p),
                "start_logit": c["start_logit"],
                "end_logit": c["end_logit"],
            }
            for c, p in zip(best, probabilities)
        ]
        spans = [c for c in best if c["text"]]
        if not version_2_with_negative:
            predictions[example["id"]] = spans[0]["text"] if spans else ""
            continue
        if not spans:  # no valid span in any window: "no answer" is the only candidate
            null_odds[example["id"]], predictions[example["id"]] = float("inf"), ""
            continue
        odds = null["score"] - spans[0]["score"]
        null_odds[example["id"]] = odds
        predictions[example["id"]] = "" if odds > null_score_diff_threshold else spans[0]["text"]
    return QAPredictions(predictions, nbest, null_odds)


__all__ = [
    "POSTPROCESS_COLUMNS",
    "QAPredictions",
    "answer_token_positions",
    "context_token_range",
    "postprocess_predictions",
    "prepare_features",
]
