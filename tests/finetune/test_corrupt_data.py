"""The scripts on files that are not what they claim: an empty or truncated data file (csv / tsv / json / jsonl for
posformers-glue and posformers-pretrain, SQuAD json for posformers-qa), and a broken checkpoint, config.json or
tokenizer folder. Each is one `error (...)` line naming the file and the problem, before any training: exit status 1
and nothing written to --output_dir.

The data is real: SST-2 rows and a SQuAD sample from tests/data, written in each format and then cut.
"""

from __future__ import annotations

import csv
import json
import re
import shutil

import pytest
from conftest import GLUE_DIR, QUIET, TOKENIZER_DIR, tiny_model_args
from helpers.corrupt import config_not_json, truncate
from helpers.data import DATA_DIR

import posformers
from posformers.finetune import run_glue, run_pretrain, run_qa

ROWS = 60  # of SST-2's training file
FORMATS = ("csv", "tsv", "json", "jsonl")


def sst2_rows() -> list[dict]:
    # split on "\n" only: some sentences hold other line-break characters, which str.splitlines would split on
    lines = (GLUE_DIR / "sst2" / "train.tsv").read_text(encoding="utf-8").split("\n")[1 : ROWS + 1]
    return [{"sentence": sentence, "label": int(label)} for sentence, label in (line.split("\t") for line in lines)]


def write_table(path, rows: list[dict], text_column: str = "sentence") -> None:
    """`rows` as a table of `path`'s format, the text under `text_column`."""
    rows = [{text_column if key == "sentence" else key: value for key, value in row.items()} for row in rows]
    suffix = path.suffix.lstrip(".")
    if suffix == "json":
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    elif suffix == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    else:
        with open(path, "w", encoding="utf-8", newline="") as file:
            if suffix == "csv":
                writer = csv.DictWriter(file, fieldnames=list(rows[0]), quoting=csv.QUOTE_ALL)
            else:  # GLUE's TSVs: no quoting
                writer = csv.DictWriter(file, fieldnames=list(rows[0]), delimiter="\t", quoting=csv.QUOTE_NONE)
            writer.writeheader()
            writer.writerows(rows)


def cut_mid_row(path) -> None:
    """Cut the file inside its text two thirds of the way in, as an interrupted copy or download leaves it."""
    data = path.read_bytes()
    cut = data.index(b"e", len(data) * 2 // 3)  # a letter, so inside a sentence
    path.write_bytes(data[:cut])


def data_file(tmp_path, suffix: str, kind: str, text_column: str = "sentence"):
    """train.<suffix> of SST-2 rows: "intact", "truncated" (cut mid-row) or "empty"."""
    path = tmp_path / f"train.{suffix}"
    path.write_text("")
    if kind != "empty":
        write_table(path, sst2_rows(), text_column)
    if kind == "truncated":
        cut_mid_row(path)
    return path


# What each script says (the reader's own words, after the file name and, where it knows it, the line).
GLUE_PROBLEMS = {
    ("empty", "csv"): r": no examples \(empty file\)$",
    ("empty", "tsv"): r": no examples \(empty file\)$",
    ("empty", "json"): r": no examples \(empty file\)$",
    ("empty", "jsonl"): r": no examples \(empty file\)$",
    ("truncated", "csv"): r", line \d+: 1 fields where the header has 2$",
    ("truncated", "tsv"): r", line \d+: 1 fields where the header has 2$",
    ("truncated", "json"): r", line \d+: not valid JSON: Unterminated string",
    ("truncated", "jsonl"): r", line \d+: not valid JSON: Unterminated string",
}
PRETRAIN_PROBLEMS = {
    "empty": r": no text: the file is empty or holds only blank lines$",
    "truncated": r": not a readable (csv|json|jsonl) file \(truncated or malformed\?\): .+",
}


def assert_refused(run, argv, tmp_path, file, problem: str, kind: str = "data") -> None:
    with pytest.raises(SystemExit) as refusal:
        run(argv)
    message = str(refusal.value.code)
    assert "\n" not in message, message
    assert message.startswith(f"error ({kind}): {file}"), message
    assert re.search(problem, message), message
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_the_intact_tables_are_read(tmp_path):
    """The same writer's files, uncut, load with every row (so the refusals below are about the cut alone)."""
    for suffix in FORMATS:
        path = data_file(tmp_path, suffix, "intact")
        tables = run_glue.load_tables(run_glue.DataTrainingArguments(train_file=str(path)), False, None)[1]
        assert len(tables["train"]) == ROWS, suffix


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("kind", ["empty", "truncated"])
def test_glue_refuses_an_empty_or_truncated_file(tmp_path, kind, suffix):
    path = data_file(tmp_path, suffix, kind)
    argv = [*tiny_model_args(), *QUIET, "--output_dir", str(tmp_path / "out"), "--do_train", "--train_file", str(path)]
    assert_refused(run_glue.main, argv, tmp_path, path, GLUE_PROBLEMS[kind, suffix])


@pytest.mark.parametrize("suffix", ["csv", "json", "jsonl"])
@pytest.mark.parametrize("kind", ["empty", "truncated"])
def test_pretrain_refuses_an_empty_or_truncated_file(tmp_path, kind, suffix):
    path = data_file(tmp_path, suffix, kind, text_column="text")
    argv = [*tiny_model_args(), *QUIET, "--output_dir", str(tmp_path / "out"), "--do_train", "--max_steps", "1",
            "--max_seq_length", "32", "--train_file", str(path), "--cache_dir", str(tmp_path / "cache")]  # fmt: skip
    assert_refused(run_pretrain.main, argv, tmp_path, path, PRETRAIN_PROBLEMS[kind])


@pytest.mark.parametrize("kind", ["empty", "truncated"])
def test_qa_refuses_an_empty_or_truncated_file(tmp_path, kind):
    path = tmp_path / "train.json"
    shutil.copy(DATA_DIR / "qa" / "fixtures" / "sample.json", path)
    if kind == "empty":
        path.write_text("")
    else:
        cut_mid_row(path)
    problem = r": the file is empty$" if kind == "empty" else r", line \d+: not valid JSON: .+"
    argv = [*tiny_model_args(), *QUIET, "--output_dir", str(tmp_path / "out"), "--do_train", "--train_file", str(path)]
    assert_refused(run_qa.main, argv, tmp_path, path, problem)


# ---------------------------------------------------------------------------------------------------------------------
# A broken checkpoint, config.json or tokenizer folder given to a script
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny RoFormer classifier with the demo tokenizer, as a run's output folder holds it."""
    folder = tmp_path_factory.mktemp("checkpoint") / "model"
    config = posformers.RoFormerConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    posformers.RoFormerForSequenceClassification(config).save_pretrained(folder)
    for file in TOKENIZER_DIR.iterdir():
        shutil.copy(file, folder / file.name)
    return folder


def glue_argv(tmp_path, *model: str) -> list[str]:
    train = tmp_path / "train.jsonl"
    write_table(train, sst2_rows())
    return [*model, *QUIET, "--output_dir", str(tmp_path / "out"), "--do_train", "--max_steps", "1",
            "--train_file", str(train)]  # fmt: skip


def test_glue_trains_from_the_intact_checkpoint(tmp_path, checkpoint):
    metrics = run_glue.main(glue_argv(tmp_path, "--model_name_or_path", str(checkpoint)))
    assert metrics is not None and (tmp_path / "out" / "model.safetensors").is_file()


def remove_the_vocabulary(folder):
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)
    return folder


@pytest.mark.parametrize(
    "corrupt, problem",
    [
        (truncate, r"model\.safetensors: truncated safetensors file"),
        (config_not_json, r"config\.json' is not a valid JSON file"),
        (remove_the_vocabulary, r"the tokenizer's files are missing \(no tokenizer\.json, no vocab\.txt\)"),
    ],
    ids=["truncated weights", "config not JSON", "tokenizer without vocabulary"],
)
def test_glue_refuses_a_broken_model_folder(tmp_path, checkpoint, corrupt, problem):
    folder = tmp_path / "model"
    shutil.copytree(checkpoint, folder)
    corrupt(folder)
    argv = glue_argv(tmp_path, "--model_name_or_path", str(folder))
    with pytest.raises(SystemExit) as refusal:
        run_glue.main(argv)
    message = str(refusal.value.code)
    assert "\n" not in message and message.startswith("error (arguments): "), message
    assert str(folder) in message and re.search(problem, message), message
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_config_file_that_is_not_json_is_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "posformers-roformer", "hidden_size": 3')
    argv = glue_argv(tmp_path, "--config_name", str(config), "--tokenizer_name", str(TOKENIZER_DIR))
    with pytest.raises(SystemExit, match=rf"^error \(arguments\): --config_name {re.escape(str(config))}: not a JSON"):
        run_glue.main(argv)
