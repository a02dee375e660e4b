"""posformers-mc's data: SWAG csv, CommonsenseQA / ARC JSON lines and Hub datasets, read into questions with choices.

    questions = read_split_files({"train": "train.csv", "validation": "dev_rand_split.jsonl"}, skip_bad=False)
    # {"train": [{"id": "0", "first": "Members of the procession ...", "seconds": ["A drum line passes by ...", ...],
    #             "choice_labels": ["0", "1", "2", "3"], "label": 0, "line": 2}, ...], ...}
    questions = read_hub("commonsense_qa", None, cache_dir=None)   # or a local folder datasets reads

Each choice is scored as the pair (first, second), as transformers' run_swag builds it:
- SWAG (csv with `sent1`, `sent2`, `ending0`..`ending3`, `label`; the Hub's swag has the same columns):
  first = sent1, second = sent2 + " " + ending.
- CommonsenseQA and ARC (`{"id", "question": {"stem", "choices": [{"label", "text"}, ...]}, "answerKey"}` per line;
  the Hub's commonsense_qa / ai2_arc rows: `question` a string, `choices` {"label": [...], "text": [...]}):
  first = the question, second = the choice.
- Either JSON layout with a passage (`context`, `passage` or `article`, beside `question`): first = the passage,
  shared by every choice, second = question + " " + choice. LittleBird reads passages of thousands of tokens whole.

The answer is `label` (an index) or `answerKey` (a choice label: "A".."E", "1".."4"); a test split may have none.
Every question of a split needs the same number of choices (the model scores them as one (choices, tokens) block).
Bad data stops the run with file and line (row for datasets), or is skipped with --skip_bad_examples.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import datasets

from .errors import BadExamples, DataError
from .ner_data import read_splits
from .text_files import open_text

logger = logging.getLogger(__name__)

PASSAGE_KEYS = ("context", "passage", "article")
SWAG_COLUMNS = ("sent1", "sent2")


def _text(record: dict, key: str, where, row) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{key!r} must be a non-empty string", path=where, row=row, column=key)
    return value


def swag_question(record: dict, where, row) -> dict:
    """A SWAG row: sent1 as the first segment, sent2 + ending as each choice's second."""
    endings = sorted(
        (key for key in record if key.startswith("ending") and key[6:].isdigit()), key=lambda k: int(k[6:])
    )
    if len(endings) < 2:
        raise DataError("a SWAG row needs ending0, ending1, ... columns", path=where, row=row)
    first, start = _text(record, "sent1", where, row), record.get("sent2") or ""
    seconds = [f"{start} {_text(record, key, where, row)}".strip() for key in endings]
    label = record.get("label")
    if label in (None, "", -1):  # the Hub's swag test split has label -1
        label = None
    else:
        try:
            label = int(label)
        except (TypeError, ValueError):
            raise DataError(f"label {label!r} is not an ending number", path=where, row=row, column="label") from None
        if not 0 <= label < len(seconds):
            raise DataError(
                f"label {label} is not one of the {len(seconds)} endings", path=where, row=row, column="label"
            )
    qid = record.get("id") or record.get("") or record.get("video-id") or str(row)
    return {
        "id": str(qid),
        "first": first,
        "seconds": seconds,
        "choice_labels": [str(i) for i in range(len(seconds))],
        "label": label,
        "line": row,
    }


def _choices(record: dict, question, where, row) -> tuple[list[str], list[str]]:
    """(labels, texts) of the choices: a list of {"label", "text"} (official files) or {"label": [...], "text": [...]}
    (the Hub)."""
    choices = question.get("choices") if isinstance(question, dict) else record.get("choices")
    if isinstance(choices, dict) and isinstance(choices.get("text"), list):
        texts = choices["text"]
        labels = choices.get("label") or [chr(ord("A") + i) for i in range(len(texts))]
    elif isinstance(choices, list) and all(isinstance(choice, dict) and "text" in choice for choice in choices):
        texts = [choice["text"] for choice in choices]
        labels = [str(choice.get("label", chr(ord("A") + i))) for i, choice in enumerate(choices)]
    else:
        raise DataError(
            'needs "choices": a list of {"label", "text"} or {"label": [...], "text": [...]}',
            path=where,
            row=row,
            column="choices",
        )
    if len(texts) < 2 or not all(isinstance(text, str) and text.strip() for text in texts):
        raise DataError("needs at least two choices, each a non-empty string", path=where, row=row, column="choices")
    return [str(label) for label in labels], texts


def choice_question(record: dict, where, row) -> dict:
    """A CommonsenseQA / ARC record (official or Hub layout), with or without a shared passage."""
    question = record.get("question")
    stem = question.get("stem") if isinstance(question, dict) else question
    if not isinstance(stem, str) or not stem.strip():
        raise DataError('needs "question": a string or {"stem", "choices"}', path=where, row=row, column="question")
    labels, texts = _choices(record, question, where, row)
    passage = next((record[key] for key in PASSAGE_KEYS if isinstance(record.get(key), str)), None)
    if passage is not None:
        first, seconds = passage, [f"{stem} {text}" for text in texts]
    else:
        first, seconds = stem, list(texts)
    answer = record.get("answerKey", record.get("label"))
    label = None
    if answer not in (None, ""):
        if str(answer) not in labels:
            raise DataError(
                f"answerKey {answer!r} is not a choice label ({', '.join(labels)})",
                path=where,
                row=row,
                column="answerKey",
            )
        label = labels.index(str(answer))
    qid = record.get("id", str(row))
    return {"id": str(qid), "first": first, "seconds": seconds, "choice_labels": labels, "label": label, "line": row}


def make_question(record: dict, where, row) -> dict:
    if not isinstance(record, dict):
        raise DataError("not a JSON object", path=where, row=row)
    if all(column in record for column in SWAG_COLUMNS) or "ending0" in record:
        return swag_question(record, where, row)
    return choice_question(record, where, row)


def _records(path: Path, encoding: str | None = None):
    """(line, record) pairs of a csv (line of the row's start) or JSON-lines file, read in `encoding`."""
    if path.suffix == ".csv":
        with open_text(path, encoding) as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None:  # reads the header
                raise DataError("an empty csv file", path=path)
            line = reader.line_num + 1
            for record in reader:
                yield line, record
                line = reader.line_num + 1
        return
    with open_text(path, encoding) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"not a JSON object: {error.msg}", path=path, row=number) from error


def check_split(questions: list[dict], where, bad: BadExamples) -> list[dict]:
    """One number of choices per split; answers on every question or on none."""
    if not questions:
        raise DataError("no questions", path=where)
    count = len(questions[0]["seconds"])
    kept = []
    for question in questions:
        if len(question["seconds"]) != count:
            bad.add(
                DataError(
                    f"{len(question['seconds'])} choices where the split's first question has {count}",
                    path=where,
                    row=question["line"],
                    column="choices",
                )
            )
            continue
        kept.append(question)
    answered = [question["label"] is not None for question in kept]
    if any(answered) and not all(answered):
        missing = kept[answered.index(False)]
        raise DataError("no answer, while other questions of the split have one", path=where, row=missing["line"])
    return kept


def read_questions(path: Path, bad: BadExamples, encoding: str | None = None) -> list[dict]:
    """The checked questions of one .csv or .jsonl file."""
    questions = []
    for row, record in _records(path, encoding):
        try:
            questions.append(make_question(record, path, row))
        except DataError as error:
            bad.add(error)
    return check_split(questions, path, bad)


def read_split_files(files: dict[str, str], skip_bad: bool, encoding: str | None = None) -> dict[str, list[dict]]:
    """{split: .csv or .jsonl file} -> {split: questions}; files read in `encoding` (--encoding, default UTF-8)."""
    return read_splits(files, skip_bad, lambda path, bad: read_questions(path, bad, encoding))


def read_hub(name: str, config_name: str | None, cache_dir) -> dict[str, list[dict]]:
    """A Hub dataset (swag, commonsense_qa, ai2_arc, ...) or a local folder `datasets` reads."""
    where = name + (f" ({config_name})" if config_name else "")
    try:
        dataset = datasets.load_dataset(name, config_name, cache_dir=cache_dir)
    except Exception as error:
        raise DataError(f"cannot load the dataset {where}: {type(error).__name__}: {error}") from error
    splits = {}
    for split, part in dataset.items():
        questions = [make_question(record, where, row) for row, record in enumerate(part)]
        splits[split] = check_split(questions, where, BadExamples(False, split))
    return splits
