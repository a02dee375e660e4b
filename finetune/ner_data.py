"""posformers-ner's data: CoNLL files, JSON lines and Hub datasets, read into sentences of words and IOB2 tags.

    sentences = read_conll("eng.train")   # [{"id": 0, "tokens": [...], "ner_tags": ["B-ORG", ...], "line": 3}, ...]
    splits = read_split_files({"train": "train.txt", "validation": "valid.jsonl"}, skip_bad=False)
    splits = read_hub("conll2003", None, cache_dir=None)   # or a local dataset folder (parquet, json) in that layout

Formats:
- CoNLL: one word per line, its tag in the last column (`EU NNP B-NP B-ORG`, or just `EU B-ORG`), a blank line
  between sentences, `-DOCSTART-` lines skipped; the last sentence may lack its closing blank line. Both layouts of
  CoNLL-2003 load: the original `eng.*` files tag in IOB1 (an entity starts with I-, B- only between two adjacent
  entities of one type) and the `train/valid/test.txt` of the Hub's conll2003 in IOB2; IOB1 is turned into IOB2 on
  reading, so the two give the same sentences and tags (tests/finetune/test_ner.py checks it).
- JSON lines (.jsonl, or .json holding one object per line or a list of objects) and Hub / local `datasets` folders:
  a `tokens` column of word lists and a `ner_tags` column of tag lists (other names: --text_column_name,
  --label_column_name). Tags are strings, or ids with the dataset's ClassLabel names (the Hub's conll2003: 0 = "O",
  1 = "B-PER", ...); ids without names keep their numbers as names, as transformers' run_ner does.

Bad data stops the run with file and line (row for datasets): a word line without a tag, a tag that is not O nor
B-/I-/E-/S- plus a type, a sentence whose tags do not match its words in number, a file without sentences.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import datasets

from .errors import BadExamples, DataError
from .text_files import open_text, read_text

logger = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"
TAG_PREFIXES = ("B-", "I-", "E-", "S-")


def check_tag(tag: str, path, row: int | None, column: str | None = None) -> str:
    if tag != "O" and not (tag.startswith(TAG_PREFIXES) and len(tag) > 2):
        raise DataError(
            f"{tag!r} is not a NER tag (O, or B-/I-/E-/S- and a type such as B-PER)", path=path, row=row, column=column
        )
    return tag


def to_iob2(tags: list[str]) -> list[str]:
    """IOB1 -> IOB2: an I- tag that starts an entity (after O, or after another type) becomes B-. IOB2 (and IOBES)
    tags are left as they are."""
    converted = []
    for position, tag in enumerate(tags):
        previous = tags[position - 1] if position else "O"
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
    return converted


def read_conll(path, bad: BadExamples | None = None, encoding: str | None = None) -> list[dict]:
    """The sentences of a CoNLL file (see the module docstring); tags in IOB2. `encoding`: finetune/text_files.py."""
    path = Path(path)
    bad = BadExamples(skip=False, split=path.name) if bad is None else bad
    sentences, tokens, tags, first_line, broken = [], [], [], None, None

    def close():
        if tokens and broken is None:
            sentences.append(
                {"id": len(sentences), "tokens": list(tokens), "ner_tags": to_iob2(tags), "line": first_line}
            )
        elif broken is not None:
            bad.add(broken)

    with open_text(path, encoding) as lines:
        for number, line in enumerate(lines, start=1):
            fields = line.split()
            if not fields or fields[0] == DOCSTART:
                close()
                tokens, tags, first_line, broken = [], [], None, None
                continue
            first_line = first_line or number
            if broken is not None:
                continue
            try:
                if len(fields) < 2:
                    raise DataError(
                        f"the word {fields[0]!r} has no tag (expected `word ... tag`)", path=path, row=number
                    )
                tags.append(check_tag(fields[-1], path, number))
                tokens.append(fields[0])
            except DataError as error:
                broken = error
    close()
    if not sentences:
        raise DataError(
            "no sentences (expected one `word ... tag` line per word, blank lines between sentences)", path=path
        )
    return sentences


def _json_records(path: Path, encoding: str | None = None) -> list[tuple[int, dict]]:
    """(line, object) pairs of a JSON-lines file, or of a .json file holding a list of objects (line: its index)."""
    text = read_text(path, encoding)
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            return list(enumerate(json.loads(text), start=1))
        except json.JSONDecodeError as error:
            raise DataError(f"not valid JSON: {error}", path=path) from error
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                raise DataError(f"not a JSON object: {error.msg}", path=path, row=number) from error
    return records


def make_sentence(index, tokens, tags, where, row, columns: tuple[str, str], tag_names=None) -> dict:
    """One checked sentence: words and IOB2 tag strings (ids mapped through `tag_names` where given)."""
    text_column, label_column = columns
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        raise DataError(f"{text_column!r} must be a list of words", path=where, row=row, column=text_column)
    if not isinstance(tags, list):
        raise DataError(f"{label_column!r} must be a list of tags", path=where, row=row, column=label_column)
    if len(tokens) != len(tags):
        raise DataError(f"{len(tokens)} words but {len(tags)} tags", path=where, row=row, column=label_column)
    if tag_names is not None:
        tags = [tag_names[tag] if isinstance(tag, int) and 0 <= tag < len(tag_names) else tag for tag in tags]
    tags = [str(tag) for tag in tags]
    if not all(tag.isdigit() for tag in tags):  # numbered tags without names have no scheme to check
        tags = to_iob2([check_tag(tag, where, row, label_column) for tag in tags])
    return {"id": index, "tokens": tokens, "ner_tags": tags, "line": row}


def read_json_split(path: Path, columns: tuple[str, str], bad: BadExamples, encoding: str | None = None) -> list[dict]:
    sentences = []
    for number, record in _json_records(path, encoding):
        try:
            if not isinstance(record, dict) or any(column not in record for column in columns):
                raise DataError(f"needs the keys {columns[0]!r} and {columns[1]!r}", path=path, row=number)
            sentences.append(
                make_sentence(len(sentences), record[columns[0]], record[columns[1]], path, number, columns)
            )
        except DataError as error:
            bad.add(error)
    return sentences


def read_splits(files: dict[str, str], skip_bad: bool, read: Callable[[Path, BadExamples], list]) -> dict[str, list]:
    """{split: file name} -> {split: read(path, bad)}: each file must exist and give examples; the bad examples that
    `read` hands to `bad` stop the run, or with skip_bad are skipped and counted in one warning per split."""
    splits = {}
    for split, name in files.items():
        path = Path(name)
        if not path.is_file():
            raise DataError("no such file", path=path)
        bad = BadExamples(skip_bad, split)
        splits[split] = read(path, bad)
        if not splits[split]:
            raise DataError("no examples", path=path)
        if len(bad):
            logger.warning(bad.summary())
    return splits


def read_split_files(
    files: dict[str, str], columns: tuple[str, str], skip_bad: bool, encoding: str | None = None
) -> dict[str, list[dict]]:
    """{split: file} -> {split: sentences}; the format follows the file's suffix (.json/.jsonl, else CoNLL); files
    are read in `encoding` (--encoding, default UTF-8)."""

    def read(path: Path, bad: BadExamples) -> list[dict]:
        json_lines = path.suffix in (".json", ".jsonl")
        return read_json_split(path, columns, bad, encoding) if json_lines else read_conll(path, bad, encoding)

    return read_splits(files, skip_bad, read)


def tag_names_of(feature) -> list[str] | None:
    """The ClassLabel names of a `ner_tags` feature (a Sequence / List of ClassLabel), if it has them."""
    inner = getattr(feature, "feature", None)
    return list(inner.names) if isinstance(inner, datasets.ClassLabel) else None


def read_hub(name: str, config_name: str | None, columns: tuple[str, str], cache_dir) -> tuple[dict, list | None]:
    """A Hub dataset (or a local folder `datasets` reads: parquet, json) with words and tags per row ->
    ({split: sentences}, the ClassLabel tag names or None)."""
    where = name + (f" ({config_name})" if config_name else "")
    try:
        dataset = datasets.load_dataset(name, config_name, cache_dir=cache_dir)
    except Exception as error:
        raise DataError(f"cannot load the dataset {where}: {type(error).__name__}: {error}") from error
    splits, declared = {}, None
    for split, part in dataset.items():
        missing = [column for column in columns if column not in part.column_names]
        if missing:
            raise DataError(
                f"split {split!r} has no {', '.join(map(repr, missing))} column; columns: "
                f"{', '.join(part.column_names)} (choose others with --text_column_name / --label_column_name)",
                path=where,
            )
        names = tag_names_of(part.features[columns[1]])
        declared = names or declared
        splits[split] = [
            make_sentence(index, tokens, tags, where, index, columns, names)
            for index, (tokens, tags) in enumerate(zip(part[columns[0]], part[columns[1]]))
        ]
    return splits, declared


def label_list(splits: dict[str, list[dict]], declared: list[str] | None = None) -> list[str]:
    """The tag set: the dataset's ClassLabel order where it has one (tags it lacks appended), else sorted as
    transformers' run_ner sorts them."""
    found = {tag for sentences in splits.values() for sentence in sentences for tag in sentence["ner_tags"]}
    if declared:
        return list(declared) + sorted(found - set(declared))
    return sorted(found)
