"""A typo in a training label of posformers-glue (finetune/glue_data.py's suspicious_labels): a rare label close to a
frequent one stops the run with file, line and both labels, as a label outside the set does in a validation file;
--label_names declares the labels and makes the check exact; --skip_bad_examples skips the rows."""

import json
import re
from pathlib import Path

import pytest
from conftest import GLUE_DIR, QUIET, TOKENIZER_DIR, tiny_model_args

import posformers
from posformers.finetune import run_glue
from posformers.finetune.glue_data import Example, Table, looks_alike, suspicious_labels

SST2_ROWS = [row.rsplit("\t", 1) for row in (GLUE_DIR / "sst2" / "train.tsv").read_text().splitlines()[1:41]]


def reviews_csv(path: Path, names: tuple[str, str], typo: str = "postive", line: int = 8) -> Path:
    """40 SST-2 sentences labelled with `names` (0, 1), the label of the file's `line` replaced by `typo`."""
    lines = ["sentence,label"] + [f'"{text}",{names[int(label)]}' for text, label in SST2_ROWS]
    lines[line - 1] = lines[line - 1].rsplit(",", 1)[0] + f",{typo}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def glue_main(tmp_path: Path, *args: str, model: list[str] | None = None) -> dict:
    train = ["--do_train", "--max_steps", "1", "--per_device_train_batch_size", "8"]
    return run_glue.main([*(model or tiny_model_args()), *QUIET, "--output_dir", str(tmp_path / "out"), *train, *args])


@pytest.mark.parametrize(("names", "alike"), [(("neg", "pos"), "pos"), (("negative", "positive"), "positive")])
def test_a_typo_in_a_training_label_stops_with_file_line_and_both_labels(names, alike, tmp_path):
    data = reviews_csv(tmp_path / "train.csv", names)
    count = sum(names[int(label)] == alike for _, label in SST2_ROWS if _ != SST2_ROWS[6][0])
    expected = (
        f"error (data): {data}, line 8, column 'label': label 'postive' (1 row) looks like a typo of '{alike}' "
        f"({count} rows): correct it, or declare the labels: --label_names {','.join(names)} (other labels then stop "
        f"the run), or --label_names {','.join(sorted((*names, 'postive')))} to train 'postive' as a class"
    )
    with pytest.raises(SystemExit) as stopped:
        glue_main(tmp_path, "--train_file", str(data))
    assert stopped.value.code == expected
    assert not (tmp_path / "out" / "config.json").exists()


def test_from_a_fine_tuned_head_the_typo_is_named_before_the_head(tmp_path):
    """The user followed the head's error to --ignore_mismatched_sizes and trained a 3-class model."""
    config = posformers.RoFormerConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        id2label={0: "negative", 1: "positive"}, architectures=["RoFormerForSequenceClassification"],
    )  # fmt: skip
    posformers.RoFormerForSequenceClassification(config).save_pretrained(tmp_path / "classifier")
    model = ["--model_name_or_path", str(tmp_path / "classifier"), "--tokenizer_name", str(TOKENIZER_DIR)]
    data = reviews_csv(tmp_path / "train.csv", ("negative", "positive"))
    for extra in ([], ["--ignore_mismatched_sizes"]):
        with pytest.raises(SystemExit, match=r"line 8, column 'label': label 'postive' \(1 row\) looks like a typo"):
            glue_main(tmp_path, "--train_file", str(data), *extra, model=model)
    # A label the head lacks that is no typo (a new class): the head's error names it.
    data = reviews_csv(tmp_path / "three.csv", ("negative", "neutral"), typo="positive")
    with pytest.raises(SystemExit, match=r"num_labels=2 \(negative, positive\), without 'neutral'; pass --ignore_mis"):
        glue_main(tmp_path, "--train_file", str(data), "--label_names", "negative,neutral,positive", model=model)


def test_label_names_make_the_check_exact_and_set_the_ids(tmp_path):
    data = reviews_csv(tmp_path / "train.csv", ("negative", "positive"))
    with pytest.raises(SystemExit, match=rf"^error \(data\): {re.escape(str(data))}, line 8, column 'label': label "
                       r"'postive' is not one of positive, negative$"):  # fmt: skip
        glue_main(tmp_path, "--train_file", str(data), "--label_names", "positive,negative")
    # Declared, the rare label is a class; the declared order gives the ids.
    glue_main(tmp_path, "--train_file", str(data), "--label_names", "positive", "negative", "postive")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["id2label"] == {"0": "positive", "1": "negative", "2": "postive"}
    with pytest.raises(SystemExit, match=r"^error \(arguments\): --label_names pos: declare the labels of the data"):
        glue_main(tmp_path, "--train_file", str(data), "--label_names", "pos", "--overwrite_output_dir")
    with pytest.raises(SystemExit, match=r"^error \(arguments\): --label_names declares the labels of custom data; "):
        glue_main(tmp_path, "--task_name", "sst2", "--label_names", "0,1", "--overwrite_output_dir")


def test_skip_bad_examples_skips_the_rows_of_a_typo(tmp_path):
    data = reviews_csv(tmp_path / "train.csv", ("negative", "positive"))
    metrics = glue_main(tmp_path, "--train_file", str(data), "--skip_bad_examples")
    assert metrics["train_samples"] == len(SST2_ROWS) - 1
    assert json.loads((tmp_path / "out" / "config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}


def table(counts: dict[str, int]) -> Table:
    labels = [label for label, count in counts.items() for _ in range(count)]
    return Table([Example(("text",), label, i, i + 2) for i, label in enumerate(labels)], "train.csv", True)


@pytest.mark.parametrize(
    ("counts", "suspicious"),
    [
        ({"positive": 60, "negative": 50, "postive": 3}, {"postive": "positive"}),  # up to 3 rows
        ({"positive": 60, "negative": 50, "postive": 4}, {}),  # 4 of 114 rows: more than 3 and 1%
        ({"positive": 600, "negative": 500, "Positive": 11}, {"Positive": "positive"}),  # 1% of 1111 rows; case
        ({"positive": 20, "negative": 50, "postive": 3}, {}),  # positive has less than 10 times its rows
        ({"pos": 60, "neg": 50, "postive": 1}, {"postive": "pos"}),  # one starts with the other
        ({"sports": 60, "business": 50, "spots": 1}, {"spots": "sports"}),
        ({"A": 60, "B": 50, "C": 1}, {}),  # one edit, but as many edits as characters: letter grades
        ({"cat": 60, "dog": 50, "cow": 1}, {}),  # two edits from each, but only three characters: no typo
        ({"0": 60, "1": 50, "10": 1}, {}),  # numbers are not compared
    ],
)
def test_which_labels_are_suspicious(counts, suspicious):
    names = tuple(sorted(counts))
    assert {rare: alike for rare, (alike, _) in suspicious_labels(table(counts), names).items()} == suspicious


def test_labels_alike():
    assert looks_alike("postive", "positive") and looks_alike("neutral", "nuetral") and looks_alike("Neg", "neg")
    assert not looks_alike("entailment", "contradiction") and not looks_alike("yes", "no")
    assert not looks_alike("cow", "cat") and not looks_alike("a", "b") and looks_alike("no", "on")
