"""Question-answering data: SQuAD v1.1/v2.0, KorQuAD 2.x and TriviaQA files turned into one example layout.

Every loader returns a list of examples, dicts with the columns of the Hub's `squad` dataset:

    {"id": str, "title": str, "question": str, "context": str,
     "answers": {"text": [str, ...], "answer_start": [int, ...]}}

plus, for TriviaQA, "aliases": every accepted answer string (what evaluation scores against). Answer offsets are
character offsets into `context` and are checked against it: `context[start:start + len(text)] == text`. An example
whose data is broken raises a `DataError` naming the file and the example id, or is counted and skipped when the
`BadExamples` collector skips (`--skip_bad_examples`).

Formats (`data_format`, "auto" tells them apart by their layout):
- squad: the official nested JSON (data[].paragraphs[].qas[], v2's `is_impossible`), or flat records
  {id, question, context, answers} as a JSON list, `{"data": [...]}`, or JSON lines (the Hub's `squad` layout).
- korquad2: KorQuAD 2.x files (data[] of Wikipedia pages with `raw_html`, `context` and qas[].answer). The page is
  converted to text (qa_html.py) and the answer's HTML span is mapped into it; `korquad_mode` chooses the source:
  "html" uses `raw_html` + `html_answer_start` / `html_answer_text`, "context" the cleaned `context` +
  `answer_start` / `text`.
- triviaqa: the reading-comprehension release (qa/*.json question files + evidence/{wikipedia,web}/ documents).
  One example per (question, evidence document), with TriviaQA's id "QuestionId--Filename". The answer spans are the
  occurrences of the answer's aliases in the document (case-insensitive, on word boundaries), as TriviaQA's own
  conversion to SQuAD format finds them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from .errors import BadExamples, DataError
from .qa_html import html_to_text
from .text_files import read_text

logger = logging.getLogger(__name__)

DATA_FORMATS = ("auto", "squad", "korquad2", "triviaqa")
KORQUAD_MODES = ("html", "context")


# ---------------------------------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------------------------------


def read_json(path: Path, encoding: str | None = None):
    """A .json file, or a .jsonl file as a list of records; errors name the file and line. `encoding`: --encoding
    (finetune/text_files.py)."""
    if not path.is_file():
        raise DataError("no such file", path=path)
    text = read_text(path, encoding)
    if not text.strip():
        raise DataError("the file is empty", path=path)
    if path.suffix == ".jsonl":
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise DataError(f"not valid JSON: {error.msg}", path=path, row=number) from None
        return records
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"not valid JSON: {error.msg} (column {error.colno})", path=path, row=error.lineno) from None


def detect_format(data, path: Path) -> str:
    """'squad', 'korquad2' or 'triviaqa' from the layout of a parsed file."""
    if isinstance(data, dict) and "Data" in data:
        return "triviaqa"
    records = data.get("data") if isinstance(data, dict) else data
    if isinstance(records, list) and records and isinstance(records[0], dict):
        first = records[0]
        if "raw_html" in first or ("qas" in first and "paragraphs" not in first):
            return "korquad2"
        if "paragraphs" in first or {"question", "context", "answers"} & first.keys():
            return "squad"
    if isinstance(records, list) and not records:
        raise DataError("the file holds no examples", path=path)
    raise DataError(
        "unrecognised layout: expected SQuAD (data[].paragraphs[].qas[]), records {id, question, context, answers}, "
        "KorQuAD 2 (data[] with raw_html/context and qas[]) or TriviaQA (Data[]); or pass --data_format",
        path=path,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Checking examples
# ---------------------------------------------------------------------------------------------------------------------


def _field(record: dict, name: str, kind: type, where: str, path: Path):
    if not isinstance(record, dict) or name not in record:
        raise DataError(f"{where} has no {name!r} field", path=path, column=name)
    value = record[name]
    if not isinstance(value, kind) or (kind is str and not value.strip() and name != "title"):
        raise DataError(f"{where}: {name!r} must be a non-empty {kind.__name__}, got {value!r}", path=path, column=name)
    return value


def _answers_of(record: dict, where: str, path: Path) -> tuple[list[str], list[int]]:
    """Answers as SQuAD gives them (list of {text, answer_start}) or as the Hub does ({text: [], answer_start: []})."""
    answers = record.get("answers", [])
    if isinstance(answers, dict):
        texts, starts = answers.get("text"), answers.get("answer_start")
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise DataError(f"{where}: 'answers' needs lists 'text' and 'answer_start' of one length", path=path)
        return texts, starts
    if not isinstance(answers, list):
        raise DataError(f"{where}: 'answers' must be a list of {{text, answer_start}}", path=path, column="answers")
    texts, starts = [], []
    for answer in answers:
        if not isinstance(answer, dict) or "text" not in answer or "answer_start" not in answer:
            raise DataError(f"{where}: every answer needs 'text' and 'answer_start'", path=path, column="answers")
        texts.append(answer["text"])
        starts.append(answer["answer_start"])
    return texts, starts


def check_answers(example: dict, path, require_answers: bool, allow_unanswerable: bool) -> None:
    """Raise DataError unless every answer of `example` sits in its context at its offset."""
    where = f"example {example['id']!r}"
    texts, starts = example["answers"]["text"], example["answers"]["answer_start"]
    for text, start in zip(texts, starts):
        if not isinstance(text, str) or not text or not isinstance(start, int) or isinstance(start, bool):
            raise DataError(
                f"{where}: answer {text!r} at {start!r}: need a non-empty text and an integer offset", path=path
            )
        found = example["context"][start : start + len(text)]
        if found != text:
            raise DataError(
                f"{where}: answer {text!r} does not match the context at answer_start {start} "
                f"(the context has {found!r} there)",
                path=path,
                column="answer_start",
            )
    if not texts and require_answers and not allow_unanswerable:
        raise DataError(
            f"{where} has no answer; pass --version_2_with_negative for data with unanswerable questions",
            path=path,
            column="answers",
        )


def make_example(qid, title, question, context, texts, starts) -> dict:
    return {
        "id": str(qid),
        "title": title or "",
        "question": question,
        "context": context,
        "answers": {"text": list(texts), "answer_start": list(starts)},
    }


def check_examples(examples: Iterable, path, bad: BadExamples, require_answers: bool, allow_unanswerable: bool) -> list:
    """Examples that pass `check_answers` and have unique ids; each failure goes to `bad` (raise or skip)."""
    kept, seen = [], set()
    for example in examples:
        if isinstance(example, DataError):
            bad.add(example)
            continue
        try:
            if example["id"] in seen:
                raise DataError(f"example id {example['id']!r} appears twice (predictions are keyed by id)", path=path)
            check_answers(example, path, require_answers, allow_unanswerable)
        except DataError as error:
            bad.add(error)
            continue
        seen.add(example["id"])
        kept.append(example)
    return kept


# ---------------------------------------------------------------------------------------------------------------------
# SQuAD (nested and flat) and the Hub's layout
# ---------------------------------------------------------------------------------------------------------------------


def _squad_record(record: dict, index: int, path: Path, title: str = "", context: str | None = None):
    """One question as an example, or the DataError that says what is wrong with it."""
    where = f"question #{index}" + (f" (id {record['id']!r})" if isinstance(record, dict) and "id" in record else "")
    try:
        qid = _field(record, "id", (str, int), where, path)
        question = _field(record, "question", str, where, path)
        if context is None:
            context = _field(record, "context", str, where, path)
        texts, starts = _answers_of(record, where, path)
        if record.get("is_impossible"):
            texts, starts = [], []  # v2 keeps the "plausible answers" elsewhere; the gold answer is "none"
        return make_example(qid, record.get("title", title), question, context, texts, starts)
    except DataError as error:
        return error


def squad_examples(data, path: Path) -> list:
    """Examples (or DataErrors) of a SQuAD file, nested or flat."""
    records = data.get("data") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise DataError("expected a list of articles or records under 'data'", path=path, column="data")
    examples, index = [], 0
    for article in records:
        if not isinstance(article, dict) or "paragraphs" not in article:
            examples.append(_squad_record(article, index, path))
            index += 1
            continue
        for paragraph in article["paragraphs"]:
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str) or not context.strip():
                raise DataError(f"a paragraph of article {article.get('title')!r} has no context", path=path)
            for record in paragraph.get("qas", []):
                examples.append(_squad_record(record, index, path, article.get("title", ""), context))
                index += 1
    return examples


def hub_examples(dataset, name: str) -> list:
    """Examples of a Hub dataset split in the `squad` layout (id, question, context, answers)."""
    missing = [column for column in ("id", "question", "context") if column not in dataset.column_names]
    if missing:
        raise DataError(
            f"dataset {name!r} has no column(s) {missing}: run_qa reads the squad layout "
            "(id, title, question, context, answers) from the Hub; convert other layouts to files first"
        )
    return [_squad_record(record, index, Path(name)) for index, record in enumerate(dataset)]


# ---------------------------------------------------------------------------------------------------------------------
# KorQuAD 2.x
# ---------------------------------------------------------------------------------------------------------------------

_KORQUAD_FIELDS = {
    # mode: (page field, answer offset field, answer source-text field)
    "html": ("raw_html", "html_answer_start", "html_answer_text"),
    "context": ("context", "answer_start", "text"),
}


def _korquad_question(record, page, page_text, mode: str, title: str, index: int, path: Path):
    page_field, start_field, text_field = _KORQUAD_FIELDS[mode]
    where = f"question #{index}" + (f" (id {record['id']!r})" if isinstance(record, dict) and "id" in record else "")
    try:
        qid = _field(record, "id", (str, int), where, path)
        question = _field(record, "question", str, where, path)
        answer = record.get("answer")
        if answer is None:
            return make_example(qid, title, question, page_text.text, [], [])
        source_start = _field(answer, start_field, int, where, path)
        source_answer = _field(answer, text_field, str, where, path)
        found = page[source_start : source_start + len(source_answer)]
        if found != source_answer:
            raise DataError(
                f"example {str(qid)!r}: answer {source_answer[:80]!r} does not match {page_field!r} at {start_field} "
                f"{source_start} (the page has {found[:80]!r} there)",
                path=path,
                column=start_field,
            )
        span = page_text.span_to_text(source_start, source_start + len(source_answer))
        if span is None:
            raise DataError(f"example {str(qid)!r}: the answer {source_answer[:80]!r} holds no text", path=path)
        start, end = span
        return make_example(qid, title, question, page_text.text, [page_text.text[start:end]], [start])
    except DataError as error:
        return error


def korquad2_examples(data, path: Path, mode: str) -> list:
    """Examples (or DataErrors) of a KorQuAD 2.x file, its pages turned into text (`mode`: "html" or "context")."""
    if mode not in KORQUAD_MODES:
        raise DataError(f"korquad_mode must be one of {KORQUAD_MODES}, got {mode!r}")
    page_field = _KORQUAD_FIELDS[mode][0]
    pages = data.get("data") if isinstance(data, dict) else data
    examples, index = [], 0
    for number, page in enumerate(pages):
        if not isinstance(page, dict) or not isinstance(page.get(page_field), str) or not page[page_field].strip():
            raise DataError(
                f"page #{number} has no {page_field!r} (korquad_mode={mode!r})", path=path, column=page_field
            )
        page_text = html_to_text(page[page_field])
        for record in page.get("qas", []):
            examples.append(
                _korquad_question(record, page[page_field], page_text, mode, page.get("title", ""), index, path)
            )
            index += 1
    return examples


# ---------------------------------------------------------------------------------------------------------------------
# TriviaQA
# ---------------------------------------------------------------------------------------------------------------------


def alias_spans(document: str, aliases: Iterable[str]) -> list[tuple[int, str]]:
    """(start, text) of every occurrence of an alias in `document`, case-insensitive, on word boundaries, in document
    order; where two overlap the longer alias wins."""
    taken: list[tuple[int, int]] = []
    for alias in sorted({a.strip() for a in aliases if a and a.strip()}, key=len, reverse=True):
        for match in re.finditer(rf"(?<!\w){re.escape(alias)}(?!\w)", document, flags=re.IGNORECASE):
            start, end = match.span()
            if not any(start < other_end and other_start < end for other_start, other_end in taken):
                taken.append((start, end))
    return [(start, document[start:end]) for start, end in sorted(taken)]


def _trivia_documents(record: dict, evidence_dir: Path) -> list[tuple[str, str, Path]]:
    """(filename as TriviaQA names it, title, file) of each evidence document of a question."""
    documents = []
    for page in record.get("EntityPages", []):
        documents.append((page["Filename"], page.get("Title", ""), evidence_dir / "wikipedia" / page["Filename"]))
    for result in record.get("SearchResults", []):
        documents.append((result["Filename"], result.get("Title", ""), evidence_dir / "web" / result["Filename"]))
    return documents


def triviaqa_examples(data, path: Path, evidence_dir: Path | None, split: str, encoding: str | None = None) -> list:
    """Examples (or DataErrors) of a TriviaQA question file: one per (question, evidence document). In training, a
    document in which no alias occurs teaches nothing and is left out (counted in the log)."""
    evidence_dir = Path(evidence_dir) if evidence_dir else path.parent.parent / "evidence"
    if not evidence_dir.is_dir():
        raise DataError(f"no evidence folder {evidence_dir} (pass --triviaqa_evidence_dir)", path=path)
    records = data.get("Data")
    if not isinstance(records, list):
        raise DataError("'Data' must be a list of questions", path=path, column="Data")
    examples, without_answer, texts = [], 0, {}
    for index, record in enumerate(records):
        where = f"question #{index}" + (f" (id {record.get('QuestionId')!r})" if isinstance(record, dict) else "")
        try:
            qid = _field(record, "QuestionId", str, where, path)
            question = _field(record, "Question", str, where, path)
            answer = record.get("Answer")
            aliases = []
            if answer is not None:
                aliases = list(dict.fromkeys(answer.get("Aliases", []) + answer.get("NormalizedAliases", [])))
                if not aliases:
                    raise DataError(f"{where}: the answer has no Aliases", path=path, column="Answer")
            for filename, title, file in _trivia_documents(record, evidence_dir):
                if file not in texts:
                    if not file.is_file():
                        raise DataError(f"{where}: evidence document {file} does not exist", path=path)
                    texts[file] = read_text(file, encoding)
                spans = alias_spans(texts[file], aliases)
                if answer is not None and not spans and split == "train":
                    without_answer += 1
                    continue
                example = make_example(
                    f"{qid}--{filename}", title, question, texts[file], [t for _, t in spans], [s for s, _ in spans]
                )
                example["aliases"] = aliases
                examples.append(example)
        except DataError as error:
            examples.append(error)
    if without_answer:
        logger.info("%s: %d (question, document) pairs whose document holds no alias left out", path, without_answer)
    return examples


# ---------------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------------


def load_qa_file(
    path,
    split: str,
    bad: BadExamples,
    data_format: str = "auto",
    korquad_mode: str = "html",
    evidence_dir=None,
    version_2_with_negative: bool = False,
    encoding: str | None = None,
) -> list[dict]:
    """The checked examples of one file. `split` "test" needs no answers; the others need one per question unless
    `version_2_with_negative` (or TriviaQA, where a document may hold no alias at evaluation)."""
    if data_format not in DATA_FORMATS:
        raise DataError(f"data_format must be one of {DATA_FORMATS}, got {data_format!r}")
    path = Path(path)
    data = read_json(path, encoding)
    kind = detect_format(data, path) if data_format == "auto" else data_format
    if kind == "squad":
        examples = squad_examples(data, path)
    elif kind == "korquad2":
        examples = korquad2_examples(data, path, korquad_mode)
    else:
        examples = triviaqa_examples(data, path, evidence_dir, split, encoding)
    require_answers = split != "test"
    allow_unanswerable = version_2_with_negative or (kind == "triviaqa" and split != "train")
    kept = check_examples(examples, path, bad, require_answers, allow_unanswerable)
    if not kept:
        raise DataError(f"no usable {split} examples", path=path)
    logger.info("%s: %d %s examples (%s)", path, len(kept), split, kind)
    return kept


__all__ = [
    "DATA_FORMATS",
    "KORQUAD_MODES",
    "alias_spans",
    "check_answers",
    "check_examples",
    "detect_format",
    "hub_examples",
    "korquad2_examples",
    "load_qa_file",
    "make_example",
    "read_json",
    "squad_examples",
    "triviaqa_examples",
]
