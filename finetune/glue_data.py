"""GLUE data: the nine tasks from GLUE's TSV files as distributed, from the Hub dataset, or from custom tables.

    tables = load_glue_tables(task, files, skip_bad_examples=False)   # {split: Table}, validated, no tokenizer yet

A `Table` holds the texts (`text`, and `text_pair` for sentence-pair tasks), labels as ids (or floats for STS-B /
regression), the example ids `idx`, and the label names; `Table.to_dataset()` turns it into a `datasets.Dataset`.

Reading rules, learned from GLUE's distribution (and transformers' old `glue` processors, whose layouts these are):

* GLUE TSVs are read with quoting disabled: MRPC, QQP and MNLI have unbalanced `"` inside fields, which a CSV reader
  would swallow across lines. A UTF-8 BOM (MRPC has one) is dropped. Every row is checked; a bad row is reported with
  its file and line (or skipped with `--skip_bad_examples`).
* Columns by position, per task and split, as below; CoLA's train/dev have no header, every other file has one; test
  files have the example index in column 0 and no label.
* Label ids follow the Hub dataset `nyu-mll/glue` (MNLI: entailment 0, neutral 1, contradiction 2; QNLI and RTE:
  entailment 0, not_entailment 1), so a model trained on either source predicts the same ids.
* A .tsv whose header has a `label` column, and any .csv / .json / .jsonl file, is a table read by column name (SST-2,
  QNLI, RTE and WNLI's own headers qualify, with the same result). Text columns are the task's (`sentence`,
  `sentence1`/`sentence2`, `question`/`sentence`, `question1`/`question2`, `premise`/`hypothesis`); without a task,
  the first known pair found, else the first one or two columns that are not the label or an id. Labels may be label
  names or ids. Without a task, the label set is the sorted set of training labels; float labels mean regression.
* A training label that looks like a typo of another (rare, and close to a much more frequent label: see
  `suspicious_labels`) stops the run with its file and line, as a label outside the set does in a validation file;
  declared labels (--label_names) make the check exact: every split's labels must be among them.
* Files are read with finetune/text_files.py: --encoding (default UTF-8), a byte-order mark dropped.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
from collections import Counter
from pathlib import Path

import datasets

from .errors import BadExamples, DataError
from .text_files import open_text, read_text

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TsvLayout:
    """Where a GLUE TSV keeps its fields: column positions (negative counts from the end), and whether a header row
    comes first. `index` is the example-id column of test files (None: the row order)."""

    text: tuple[int, ...]
    label: int | None
    header: bool = True
    index: int | None = None


@dataclasses.dataclass(frozen=True)
class GlueTask:
    name: str
    columns: tuple[str, ...]  # text column names in the Hub dataset
    label_names: tuple[str, ...] | None  # None: regression
    train_layout: TsvLayout  # train and dev files
    submission: str  # file stem of the GLUE submission (test predictions)
    matched_mismatched: bool = False
    # What the labels mean where the files write numbers (the class names of the Hub's nyu-mll/glue): the fine-tuned
    # model's id2label, so that a pipeline answers "positive" rather than "1". Files and submissions keep the numbers.
    class_names: tuple[str, ...] | None = None
    test_text: tuple[int, ...] | None = None  # the test files' text columns, where not those of train_layout

    @property
    def test_layout(self) -> TsvLayout:
        """Test files: the example index in column 0, a header, no label."""
        return TsvLayout(text=self.test_text or self.train_layout.text, label=None, index=0)

    def split_files(self) -> dict[str, str]:
        """Split name -> official file name in a GLUE task folder."""
        if self.matched_mismatched:
            return {
                "train": "train.tsv",
                "validation_matched": "dev_matched.tsv",
                "validation_mismatched": "dev_mismatched.tsv",
                "test_matched": "test_matched.tsv",
                "test_mismatched": "test_mismatched.tsv",
            }
        return {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}


BINARY = ("0", "1")
NLI_BINARY = ("entailment", "not_entailment")
PAIR_1_2 = TsvLayout(text=(1, 2), label=-1)

GLUE_TASKS = {
    task.name: task
    for task in (
        GlueTask(
            "cola", ("sentence",), BINARY, TsvLayout(text=(3,), label=1, header=False), "CoLA",
            class_names=("unacceptable", "acceptable"), test_text=(1,),
        ),
        GlueTask(
            "sst2", ("sentence",), BINARY, TsvLayout(text=(0,), label=1), "SST-2", class_names=("negative", "positive"),
            test_text=(1,),
        ),
        GlueTask(
            "mrpc", ("sentence1", "sentence2"), BINARY, TsvLayout(text=(3, 4), label=0), "MRPC",
            class_names=("not_equivalent", "equivalent"),
        ),
        GlueTask(
            "qqp", ("question1", "question2"), BINARY, TsvLayout(text=(3, 4), label=5), "QQP",
            class_names=("not_duplicate", "duplicate"), test_text=(1, 2),
        ),
        GlueTask("stsb", ("sentence1", "sentence2"), None, TsvLayout(text=(7, 8), label=-1), "STS-B"),
        GlueTask(
            "mnli", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
            TsvLayout(text=(8, 9), label=-1), "MNLI", matched_mismatched=True,
        ),
        GlueTask("qnli", ("question", "sentence"), NLI_BINARY, PAIR_1_2, "QNLI"),
        GlueTask("rte", ("sentence1", "sentence2"), NLI_BINARY, PAIR_1_2, "RTE"),
        GlueTask(
            "wnli", ("sentence1", "sentence2"), BINARY, PAIR_1_2, "WNLI", class_names=("not_entailment", "entailment")
        ),
    )
}  # fmt: skip

# Text column names a custom table may use, in the order they are looked for.
KNOWN_TEXT_COLUMNS = (
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("sentence",),
    ("text",),
)
ID_COLUMNS = ("idx", "index", "id", "guid")
LABEL_COLUMN = "label"


def rename_labels(names, source, target):
    """`names` with each replaced by its counterpart (same position) in `target`, where `names` are exactly `source`'s
    in some order; otherwise `names` as they are. Between a GLUE task's file labels and its class names."""
    if not source or not target or not names or sorted(names) != sorted(source):
        return names
    return tuple(target[source.index(name)] for name in names)


def get_task(name: str) -> GlueTask:
    if name.lower() not in GLUE_TASKS:
        raise DataError(f"--task_name {name!r}: unknown task; GLUE tasks: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[name.lower()]


def submission_name(task: GlueTask, split: str) -> str:
    """GLUE's name for the predictions of `split`: SST-2, MNLI-m (test_matched), MNLI-mm (test_mismatched), ..."""
    if split.endswith("_mismatched"):
        return f"{task.submission}-mm"
    if split.endswith("_matched"):
        return f"{task.submission}-m"
    return task.submission


# ---------------------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Example:
    """One row as read: its texts, its label as written (None in a test file), its id and line (or JSON index)."""

    texts: tuple[str, ...]
    label: object
    idx: int
    line: int


@dataclasses.dataclass
class Table:
    """One split. After `encode_labels`, labels are ids into label_names (floats for regression; None: test split)."""

    examples: list[Example]
    path: Path | str
    has_labels: bool
    label_names: tuple[str, ...] | None = None
    labels: list | None = None

    def __len__(self) -> int:
        return len(self.examples)

    def to_dataset(self) -> datasets.Dataset:
        """Columns: text (and text_pair), label (when known), idx."""
        columns = {"text": [example.texts[0] for example in self.examples]}
        if self.examples and len(self.examples[0].texts) > 1:
            columns["text_pair"] = [example.texts[1] for example in self.examples]
        if self.labels is not None:
            columns["label"] = self.labels
        columns["idx"] = [example.idx for example in self.examples]
        return datasets.Dataset.from_dict(columns)


@dataclasses.dataclass
class RawRow:
    """A row of a custom table as read: fields by column name, and its line (or index in a JSON array)."""

    fields: dict
    line: int


def _lines(path: Path, encoding: str | None = None) -> list[tuple[int, str]]:
    """Non-blank lines of a text file with their 1-based numbers (finetune/text_files.py: --encoding, BOM)."""
    numbered = [(number, line.rstrip("\r\n")) for number, line in enumerate(open_text(path, encoding), start=1)]
    return [(number, line) for number, line in numbered if line.strip()]


def is_glue_layout(path: Path, encoding: str | None = None) -> bool:
    """A .tsv is read by GLUE's column positions unless its first line is a header with a `label` column."""
    lines = _lines(path, encoding)
    return not lines or LABEL_COLUMN not in [name.strip() for name in lines[0][1].split("\t")]


def read_glue_tsv(path: Path, task: GlueTask, split: str, bad: BadExamples, encoding: str | None = None) -> Table:
    """A GLUE TSV as distributed, fields by position (quoting disabled, see the module docstring)."""
    is_test = split.startswith("test")
    layout = task.test_layout if is_test else task.train_layout
    lines = _lines(path, encoding)
    header = lines[0][1].split("\t") if layout.header and lines else None
    body = lines[1:] if layout.header else lines
    width = 1 + max(p for p in (*layout.text, layout.label or 0, layout.index or 0) if p >= 0)
    examples = []
    for number, line in body:
        fields = line.split("\t")
        try:
            if len(fields) < width:
                raise DataError(f"{len(fields)} tab-separated fields, {task.name} needs {width}", path=path, row=number)
            idx = (
                len(examples) + len(bad)
                if layout.index is None
                else _int_field(fields, layout.index, header, path, number)
            )
            label = None if layout.label is None else fields[layout.label]
            examples.append(Example(tuple(fields[p] for p in layout.text), label, idx, number))
        except DataError as error:
            bad.add(error)
    return Table(examples, path, has_labels=not is_test)


def _int_field(fields: list[str], position: int, header, path, number) -> int:
    try:
        return int(fields[position])
    except ValueError as error:
        column = header[position] if header and position < len(header) else f"#{position}"
        raise DataError(
            f"expected an integer index, got {fields[position]!r}", path=path, row=number, column=column
        ) from error


def choose_text_columns(columns: list[str], task: GlueTask | None, requested: tuple[str, ...] | None, path) -> tuple:
    """The text columns of a custom table: requested ones, the task's, a known pair, or the first non-label ones."""
    if requested or task is not None:
        wanted = requested or task.columns
        missing = [name for name in wanted if name not in columns]
        if missing and task is not None and not requested:
            # GLUE's own header names for the same fields (QQP's question1/2 and MNLI's premise/hypothesis differ).
            for known in KNOWN_TEXT_COLUMNS:
                if len(known) == len(wanted) and all(name in columns for name in known):
                    return known
        if missing:
            raise DataError(
                f"missing text column(s) {', '.join(repr(m) for m in missing)}"
                + (f" for task {task.name}" if task else "")
                + f"; the file has: {', '.join(columns)}",
                path=path,
            )
        return tuple(wanted)
    for known in KNOWN_TEXT_COLUMNS:
        if all(name in columns for name in known):
            logger.info("%s: text column(s) %s (--text_columns chooses others)", path, ", ".join(known))
            return known
    others = [name for name in columns if name != LABEL_COLUMN and name.lower() not in ID_COLUMNS]
    if not others:
        raise DataError(f"no text column; the file has: {', '.join(columns)}", path=path)
    # no known name: the first columns are a guess that may read an id or a category as text, so it is shown
    logger.warning("%s: text column(s) guessed: %s (--text_columns chooses others)", path, ", ".join(others[:2]))
    return tuple(others[:2])


def read_custom_table(
    path: Path, task: GlueTask | None, split: str, text_columns, bad: BadExamples, encoding: str | None = None
) -> Table:
    """A table read by column name (csv, tsv with a header, json, jsonl)."""
    rows = read_table_rows(path, encoding)
    if not rows:
        return Table([], path, has_labels=False)
    columns = list(rows[0].fields)
    chosen = choose_text_columns(columns, task, text_columns, path)
    has_labels = LABEL_COLUMN in columns
    if not has_labels and not split.startswith("test"):
        raise DataError(f"no {LABEL_COLUMN!r} column; the file has: {', '.join(columns)}", path=path)
    id_column = next((name for name in columns if name.lower() in ID_COLUMNS), None)
    examples = []
    for row in rows:
        try:
            texts = tuple(_text_field(row, name, path) for name in chosen)
            label = row.fields.get(LABEL_COLUMN) if has_labels else None
            idx = len(examples) + len(bad)
            if id_column is not None and str(row.fields.get(id_column, "")).strip().lstrip("-").isdigit():
                idx = int(row.fields[id_column])
            examples.append(Example(texts, label, idx, row.line))
        except DataError as error:
            bad.add(error)
    return Table(examples, path, has_labels=has_labels)


def _text_field(row: RawRow, name: str, path) -> str:
    value = row.fields.get(name)
    if not isinstance(value, str) or not value.strip():
        raise DataError("missing or empty text", path=path, row=row.line, column=name)
    return value


def read_table_rows(path: Path, encoding: str | None = None) -> list[RawRow]:
    """Rows of a custom table by column name: .csv (standard quoting), .tsv with a header, .json (an array of
    objects, or an object with a "data" array), .jsonl (one object per line)."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        with open_text(path, encoding) as handle:
            if suffix == ".csv":
                reader = csv.reader(handle)
                records = [(reader.line_num, record) for record in reader]
            else:
                records = [(n, line.rstrip("\r\n").split("\t")) for n, line in enumerate(handle, start=1)]
        records = [(n, record) for n, record in records if any(field.strip() for field in record)]
        if not records:
            return []
        header = [name.strip() for name in records[0][1]]
        rows = []
        for number, record in records[1:]:
            if len(record) != len(header):
                raise DataError(f"{len(record)} fields where the header has {len(header)}", path=path, row=number)
            rows.append(RawRow(dict(zip(header, record)), number))
        return rows
    if suffix == ".jsonl":
        rows = []
        with open_text(path, encoding) as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    rows.append(RawRow(_json_object(line, path, number), number))
        return rows
    if suffix == ".json":
        text = read_text(path, encoding)
        if not text.strip():
            return []  # read_split: "no examples (empty file)", as for the other formats
        try:
            content = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"not valid JSON: {error.msg}", path=path, row=error.lineno) from error
        if isinstance(content, dict) and isinstance(content.get("data"), list):
            content = content["data"]
        if not isinstance(content, list) or not all(isinstance(item, dict) for item in content):
            raise DataError('expected a JSON array of objects (or {"data": [...]})', path=path)
        return [RawRow(item, index) for index, item in enumerate(content)]
    raise DataError(f"unsupported file type {suffix!r}: use .tsv, .csv, .json or .jsonl", path=path)


def _json_object(line: str, path: Path, number: int) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"not valid JSON: {error.msg}", path=path, row=number) from error
    if not isinstance(value, dict):
        raise DataError("expected a JSON object", path=path, row=number)
    return value


# ---------------------------------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------------------------------


def infer_label_names(table: Table) -> tuple[str, ...] | None:
    """A custom task's labels from its training table: None (regression) when they are numbers and not all integers,
    else the distinct labels as strings, sorted (numerically when they are integers)."""
    # Empty labels are no class: encode_labels reports them with their line.
    values = [str(example.label).strip() for example in table.examples if example.label is not None]
    values = [value for value in values if value]
    if not values:
        raise DataError("no labels to learn the label set from", path=table.path)
    numbers = [_as_float(value) for value in values]
    if all(number is not None for number in numbers):
        if not all(float(number).is_integer() for number in numbers):
            return None
        return tuple(str(n) for n in sorted({int(number) for number in numbers}))
    return tuple(sorted(set(values)))


def _as_float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def encode_label(value, label_names: tuple[str, ...] | None):
    """A label as written -> its id in label_names (a label name, or an id in range), or a float for regression."""
    text = "" if value is None else str(value).strip()
    if not text:
        raise DataError("empty label", column=LABEL_COLUMN)
    if label_names is None:
        number = _as_float(text)
        if number is None:
            raise DataError(f"label {text!r} is not a number (regression task)", column=LABEL_COLUMN)
        return number
    if text in label_names:
        return label_names.index(text)
    if text.isdigit() and int(text) < len(label_names):
        return int(text)
    raise DataError(f"label {text!r} is not one of {', '.join(label_names)}", column=LABEL_COLUMN)


def encode_labels(table: Table, label_names: tuple[str, ...] | None, bad: BadExamples) -> Table:
    """Fill `table.labels` (ids or floats) and `table.label_names`; rows with a bad label go to `bad`."""
    table.label_names = label_names
    if not table.has_labels:
        return table
    kept, labels = [], []
    for example in table.examples:
        try:
            labels.append(encode_label(example.label, label_names))
            kept.append(example)
        except DataError as error:
            bad.add(DataError(error.message, path=table.path, row=example.line, column=error.column))
    table.examples, table.labels = kept, labels
    return table


# ---------------------------------------------------------------------------------------------------------------------
# Sources: files, a GLUE folder, the Hub
# ---------------------------------------------------------------------------------------------------------------------


def split_files(task: GlueTask | None, data_dir, explicit: dict[str, str | None]) -> dict[str, Path]:
    """Split -> file: GLUE's official names found in `data_dir`, then the files given explicitly.

    explicit: {"train": ..., "validation": ..., "validation_mismatched": ..., "test": ..., "test_mismatched": ...};
    for MNLI "validation" and "test" mean the matched sets.
    """
    files = {}
    if data_dir is not None:
        if task is None:
            raise DataError("--data_dir needs --task_name (it says which GLUE files to look for)", path=data_dir)
        if not Path(data_dir).is_dir():
            raise DataError("no such folder", path=data_dir)
        for split, name in task.split_files().items():
            if (Path(data_dir) / name).is_file():
                files[split] = Path(data_dir) / name
    for split, path in explicit.items():
        if path is None:
            continue
        if task is not None and task.matched_mismatched and split in ("validation", "test"):
            split = f"{split}_matched"
        if not Path(path).is_file():
            raise DataError("no such file", path=path, column=f"--{split}_file")
        files[split] = Path(path)
    return files


def read_split(
    path: Path, task: GlueTask | None, split: str, text_columns, bad: BadExamples, encoding: str | None = None
) -> Table:
    """One split's file, as a GLUE TSV (by position) or as a table (by column name); an empty file is an error."""
    if task is not None and path.suffix.lower() == ".tsv" and is_glue_layout(path, encoding):
        table = read_glue_tsv(path, task, split, bad, encoding)
    else:
        table = read_custom_table(path, task, split, text_columns, bad, encoding)
    if not table.examples and not bad:
        raise DataError("no examples (empty file)", path=path)
    return table


def read_files(
    files: dict[str, Path],
    task: GlueTask | None,
    text_columns,
    skip_bad: bool,
    encoding: str | None = None,
    label_names: tuple[str, ...] | None = None,
) -> dict[str, Table]:
    """Read and validate every split of local files (`encoding`: --encoding; `label_names`: --label_names)."""
    bad = {split: BadExamples(skip_bad, split) for split in files}
    tables = {split: read_split(path, task, split, text_columns, bad[split], encoding) for split, path in files.items()}
    return finish_tables(tables, label_set(tables, task, label_names, skip_bad), bad)


def label_set(
    tables: dict[str, Table], task: GlueTask | None, declared=None, skip_bad: bool = False
) -> tuple[str, ...] | None:
    """The task's labels, else those declared (--label_names, or the source's ClassLabel), else those of the training
    (or first labelled) split, without the labels that look like typos of others (`suspicious_labels`): those stop
    the run, or with `skip_bad` their rows are skipped."""
    if task is not None:
        return task.label_names
    if declared is not None:
        return tuple(declared)
    labelled = [t for s, t in tables.items() if t.has_labels and s == "train"] or [
        t for t in tables.values() if t.has_labels
    ]
    if not labelled:
        raise DataError(
            "no split has a 'label' column, so the label set is unknown", path=next(iter(tables.values())).path
        )
    names = infer_label_names(labelled[0])
    suspicious = suspicious_labels(labelled[0], names)
    if not suspicious:
        return names
    kept = tuple(name for name in names if name not in suspicious)
    for rare, (frequent, counts) in suspicious.items():
        what = f"label {rare!r} ({_rows(counts[rare])}) looks like a typo of {frequent!r} ({_rows(counts[frequent])})"
        if not skip_bad:
            line = next(example.line for example in labelled[0].examples if _label_text(example) == rare)
            raise DataError(
                f"{what}: correct it, or declare the labels: --label_names {','.join(kept)} (other labels then stop "
                f"the run), or --label_names {','.join(names)} to train {rare!r} as a class",
                path=labelled[0].path,
                row=line,
                column=LABEL_COLUMN,
            )
        logger.warning("%s: %s, its rows are skipped (--skip_bad_examples)", labelled[0].path, what)
    return kept


# A training label is suspicious (a typo) when it is rare and close to a much more frequent label; see
# suspicious_labels. With --label_names the label set is exact instead.
RARE_ROWS, RARE_SHARE = 3, 0.01  # rare: at most max(RARE_ROWS, RARE_SHARE of the training rows)
FREQUENT_RATIO = 10  # the label it resembles has at least this many times its rows
MAX_EDITS, SHORT_LABEL = 2, 4  # close: at most MAX_EDITS edits apart, one for labels of up to SHORT_LABEL characters
MIN_PREFIX = 3  # ... or one starts with the other, of at least this many characters


def suspicious_labels(table: Table, names: tuple[str, ...] | None) -> dict[str, tuple[str, Counter]]:
    """Labels of a training table that look like typos: {rare label: (the label it resembles, the label counts)}.

    Rare: in at most max(RARE_ROWS, RARE_SHARE of the rows) rows. It resembles a label with at least FREQUENT_RATIO
    times its rows when, ignoring case, the two are at most MAX_EDITS edits apart (an edit: a character inserted,
    deleted, replaced, or two neighbours swapped), one edit where the shorter has at most SHORT_LABEL characters and
    none where it has one ("cow" is no typo of "cat", nor "B" of "A"), or when one starts with the other and the
    shorter has at least MIN_PREFIX characters ("pos" and "postive"). Numbers are not compared: every digit is one
    edit from every other.
    """
    if names is None:
        return {}
    counts = Counter(_label_text(example) for example in table.examples)
    counts.pop("", None)
    limit = max(RARE_ROWS, RARE_SHARE * sum(counts.values()))
    found = {}
    for rare, count in sorted(counts.items()):
        if count > limit or _as_float(rare) is not None:
            continue
        alike = [
            other
            for other, other_count in counts.items()
            if other_count >= FREQUENT_RATIO * count and _as_float(other) is None and looks_alike(rare, other)
        ]
        if alike:
            found[rare] = (max(alike, key=lambda other: (counts[other], other)), counts)
    return found


def looks_alike(a: str, b: str) -> bool:
    """Whether two labels could be one label mistyped (see suspicious_labels)."""
    a, b = a.casefold(), b.casefold()
    shorter = min(len(a), len(b))
    if shorter >= MIN_PREFIX and (a.startswith(b) or b.startswith(a)):
        return True
    allowed = 0 if shorter <= 1 else 1 if shorter <= SHORT_LABEL else MAX_EDITS
    return edit_distance(a, b, MAX_EDITS) <= allowed


def edit_distance(a: str, b: str, limit: int) -> int:
    """The edit distance of a and b (insertions, deletions, substitutions and swaps of neighbours: the optimal
    string alignment distance), or limit + 1 where it is larger (computed no further than that)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before, previous = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i]
        for j in range(1, len(b) + 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))
            if before is not None and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        if min(current) > limit:
            return limit + 1
        before, previous = previous, current
    return min(previous[-1], limit + 1)


def _label_text(example: Example) -> str:
    return "" if example.label is None else str(example.label).strip()


def _rows(count: int) -> str:
    return f"{count} row" + ("" if count == 1 else "s")


def finish_tables(tables: dict[str, Table], label_names, bad: dict[str, BadExamples]) -> dict[str, Table]:
    """Encode every split's labels, refuse splits left empty, and say what was skipped."""
    for split, table in tables.items():
        encode_labels(table, label_names, bad[split])
        if not table.examples:
            raise DataError(f"no usable examples ({bad[split].summary()})", path=table.path)
    _check_pair_columns(tables)
    for collected in bad.values():
        if len(collected):
            logger.warning(collected.summary())
    return tables


def _check_pair_columns(tables: dict[str, Table]) -> None:
    """Every split must have the same number of text fields (one sentence, or a pair)."""
    widths = {split: len(table.examples[0].texts) for split, table in tables.items()}
    if len(set(widths.values())) > 1:
        detail = ", ".join(f"{split}: {width}" for split, width in widths.items())
        raise DataError(
            f"splits disagree on the number of text columns ({detail})", path=next(iter(tables.values())).path
        )


def hub_is_offline() -> bool:
    return bool(datasets.config.HF_HUB_OFFLINE)


def read_hub(
    name: str, config_name: str | None, task: GlueTask | None, text_columns, cache_dir, label_names=None
) -> dict[str, Table]:
    """A Hub dataset (e.g. nyu-mll/glue, config sst2); test splits (labels -1) become unlabelled tables.
    `label_names` (--label_names) replaces the label names the dataset declares."""
    where = f"{name}" + (f" ({config_name})" if config_name else "")
    try:
        dataset = datasets.load_dataset(name, config_name, cache_dir=cache_dir)
    except Exception as error:
        # Offline or not, the way out is the same: local files.
        local_files = (
            "Give local files instead: --data_dir with GLUE's TSV files, or --train_file / --validation_file / "
            "--test_file"
        )
        if hub_is_offline():
            raise DataError(
                f"cannot load the Hub dataset {where}: the Hub is offline (HF_HUB_OFFLINE=1) and it is not in the "
                f"datasets cache. {local_files}"
            ) from error
        first_line = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise DataError(
            f"cannot load the Hub dataset {where}: {type(error).__name__}: {first_line}. {local_files}"
        ) from error
    tables, declared = {}, None
    for split, part in dataset.items():
        label_feature = part.features.get(LABEL_COLUMN)
        if label_feature is None:
            raise DataError(
                f"split {split!r} has no {LABEL_COLUMN!r} column; columns: {', '.join(part.column_names)}", path=where
            )
        declared = getattr(label_feature, "names", None) or declared
        chosen = choose_text_columns(part.column_names, task, text_columns, where)
        labels = part[LABEL_COLUMN]
        ids = part["idx"] if "idx" in part.column_names else list(range(len(part)))
        has_labels = not (split.startswith("test") and all(label == -1 for label in labels))
        examples = [
            Example(tuple(texts), label if has_labels else None, idx, row)
            for row, (idx, label, *texts) in enumerate(zip(ids, labels, *(part[column] for column in chosen)))
        ]
        tables[split] = Table(examples, where, has_labels=has_labels)
    bad = {split: BadExamples(False, split) for split in tables}
    return finish_tables(tables, label_set(tables, task, label_names or declared), bad)
