"""posformers-glue (finetune/run_glue.py): every GLUE task's files, custom tables, bad-data errors before training,
learning, predictions in GLUE's submission format, resuming, the output folder's safety and push_to_hub."""

import json
import logging
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import QUIET, TOKENIZER_DIR, tiny_model_args
from helpers import python_env, run_python
from helpers.sample_log import sample_log_trainer
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer, EvalPrediction

import posformers
from posformers.finetune import run_glue
from posformers.finetune.errors import BadExamples, DataError
from posformers.finetune.glue_data import GLUE_TASKS, read_files

# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


def write_tsv(path: Path, header: str | None, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(([header] if header else []) + rows) + "\n", encoding="utf-8")
    return path


def tables_of(tmp_path: Path | None = None, skip_bad: bool = False, **data_args):
    """run_glue.load_tables with DataTrainingArguments(**data_args)."""
    return run_glue.load_tables(run_glue.DataTrainingArguments(**data_args), skip_bad, None)[1]


def rows_of(table) -> list[tuple]:
    """(texts, label, idx) per example."""
    labels = table.labels if table.labels is not None else [None] * len(table)
    return [(example.texts, label, example.idx) for example, label in zip(table.examples, labels)]


def glue_main(tmp_path: Path, *args: str, model: list[str] | None = None) -> dict:
    return run_glue.main([*(model or tiny_model_args()), *QUIET, "--output_dir", str(tmp_path / "out"), *args])


# ---------------------------------------------------------------------------------------------------------------------
# Loading: the real files of SST-2, MRPC and CoLA
# ---------------------------------------------------------------------------------------------------------------------


def test_sst2_real_files(glue_dir):
    tables = tables_of(task_name="sst2", data_dir=str(glue_dir / "sst2"))
    assert sorted(tables) == ["train", "validation"]
    # tests/data keeps the first 20,400 of the 67,349 training rows and the whole dev set (tests/data/PROVENANCE.md)
    assert (len(tables["train"]), len(tables["validation"])) == (20400, 872)
    assert rows_of(tables["validation"])[:2] == [
        (("it 's a charming and often affecting journey . ",), 1, 0),
        (("unflinchingly bleak and desperate ",), 0, 1),
    ]
    assert tables["train"].label_names == ("0", "1")


def test_mrpc_real_files_keep_quotes_and_drop_the_bom(glue_dir):
    tables = tables_of(task_name="mrpc", data_dir=str(glue_dir / "mrpc"))
    # The first 1,000 train and 200 test rows of MRPC, and the whole dev set (tests/data/PROVENANCE.md)
    assert {split: len(table) for split, table in tables.items()} == {"train": 1000, "validation": 408, "test": 200}
    texts, label, idx = rows_of(tables["train"])[0]
    assert (
        texts[0] == 'Amrozi accused his brother, whom he called "the witness", of deliberately distorting his evidence.'
    )
    assert (label, idx) == (1, 0)
    # An unbalanced quote: a CSV reader would run this field into the next lines.
    texts, label, _ = rows_of(tables["validation"])[0]
    assert texts[1] == '"The foodservice pie business does not fit our long-term growth strategy.'
    assert label == 1
    assert sum(tables["validation"].labels) == 279  # MRPC dev: 68% paraphrases
    test_rows = rows_of(tables["test"])
    assert test_rows[1][0][0].startswith("The world's two largest automakers said")
    assert [row[2] for row in test_rows[:3]] == [0, 1, 2] and test_rows[0][1] is None


def test_cola_real_files_without_header(glue_dir):
    tables = tables_of(task_name="cola", data_dir=str(glue_dir / "cola"))
    # The first 2,000 of CoLA's 8,551 training rows and the whole dev set (tests/data/PROVENANCE.md)
    assert (len(tables["train"]), len(tables["validation"])) == (2000, 1043)
    assert rows_of(tables["validation"])[0] == (("The sailors rode the breeze clear of the rocks.",), 1, 0)
    assert 0 < sum(tables["train"].labels) < 2000  # both labels occur


# ---------------------------------------------------------------------------------------------------------------------
# Loading: the other six tasks from files in GLUE's layouts, written here
# ---------------------------------------------------------------------------------------------------------------------

QQP_HEADER = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
MNLI_PREFIX = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
MNLI_HEADER = MNLI_PREFIX + "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
PAIR_HEADER = "index\tsentence1\tsentence2"


def mnli_row(i: int, premise: str, hypothesis: str, labels: list[str]) -> str:
    return "\t".join(
        [
            str(i),
            "31193",
            f"{i}n",
            "fiction",
            "( ( x ) )",
            "( y )",
            "(ROOT x)",
            "(ROOT y)",
            premise,
            hypothesis,
            *labels,
        ]
    )


def write_glue_task(root: Path, task: str) -> Path:
    """A GLUE task folder with two examples per split, in the official layout."""
    folder = root / task
    if task == "qqp":
        write_tsv(
            folder / "train.tsv",
            QQP_HEADER,
            ['7\t15\t16\tHow do I "learn"?\tHow can I learn?\t1', "8\t17\t18\tA?\tB?\t0"],
        )
        write_tsv(folder / "dev.tsv", QQP_HEADER, ["9\t19\t20\tC?\tD?\t0", "10\t21\t22\tE?\tE!\t1"])
        write_tsv(folder / "test.tsv", "id\tquestion1\tquestion2", ["0\tF?\tG?", "1\tH?\tI?"])
    elif task == "stsb":
        meta = "main-captions\tMSRvid\t2012test\t0001\tnone\tnone"
        write_tsv(
            folder / "train.tsv",
            STSB_HEADER + "\tscore",
            [f"0\t{meta}\tA plane.\tAn airplane.\t5.000", f"1\t{meta}\tA man.\tA dog.\t0.5"],
        )
        write_tsv(
            folder / "dev.tsv",
            STSB_HEADER + "\tscore",
            [f"0\t{meta}\tA cat.\tA kitten.\t4.2", f"1\t{meta}\tX.\tY.\t1.0"],
        )
        write_tsv(folder / "test.tsv", STSB_HEADER, [f"0\t{meta}\tP.\tQ.", f"1\t{meta}\tR.\tS."])
    elif task == "mnli":
        write_tsv(
            folder / "train.tsv",
            MNLI_HEADER + "\tlabel1\tgold_label",
            [
                mnli_row(0, "He ran.", "He moved.", ["entailment"] * 2),
                mnli_row(1, "It's red.", 'It is "blue".', ["contradiction"] * 2),
            ],
        )
        dev_labels = ["\t".join(["label1", "label2", "label3", "label4", "label5", "gold_label"])]
        for name in ("dev_matched", "dev_mismatched"):
            write_tsv(
                folder / f"{name}.tsv",
                MNLI_HEADER + "\t" + dev_labels[0],
                [
                    mnli_row(0, "A.", "B.", ["neutral"] * 6),
                    mnli_row(1, "C.", "D.", ["entailment"] * 5 + ["contradiction"]),
                ],
            )
        for name in ("test_matched", "test_mismatched"):
            write_tsv(folder / f"{name}.tsv", MNLI_HEADER, [mnli_row(0, "E.", "F.", []), mnli_row(1, "G.", "H.", [])])
    elif task == "qnli":
        write_tsv(
            folder / "train.tsv",
            "index\tquestion\tsentence\tlabel",
            ["0\tWho?\tHe did.\tentailment", "1\tWhy?\tNo.\tnot_entailment"],
        )
        write_tsv(
            folder / "dev.tsv",
            "index\tquestion\tsentence\tlabel",
            ["0\tWhen?\tToday.\tentailment", "1\tHow?\tSo.\tnot_entailment"],
        )
        write_tsv(folder / "test.tsv", "index\tquestion\tsentence", ["0\tWhat?\tThat.", "1\tWhere?\tHere."])
    elif task in ("rte", "wnli"):
        labels = ("entailment", "not_entailment") if task == "rte" else ("1", "0")
        write_tsv(
            folder / "train.tsv", PAIR_HEADER + "\tlabel", [f"0\tA b.\tA.\t{labels[0]}", f"1\tC d.\tE.\t{labels[1]}"]
        )
        write_tsv(folder / "dev.tsv", PAIR_HEADER + "\tlabel", [f"0\tF.\tG.\t{labels[1]}", f"1\tH.\tH!\t{labels[0]}"])
        write_tsv(folder / "test.tsv", PAIR_HEADER, ["0\tI.\tJ.", "1\tK.\tL."])
    return folder


def test_qqp_files(tmp_path):
    tables = tables_of(task_name="qqp", data_dir=str(write_glue_task(tmp_path, "qqp")))
    assert rows_of(tables["train"]) == [(('How do I "learn"?', "How can I learn?"), 1, 0), (("A?", "B?"), 0, 1)]
    assert rows_of(tables["validation"])[1] == (("E?", "E!"), 1, 1)
    assert rows_of(tables["test"]) == [(("F?", "G?"), None, 0), (("H?", "I?"), None, 1)]


def test_stsb_files_are_regression(tmp_path):
    tables = tables_of(task_name="stsb", data_dir=str(write_glue_task(tmp_path, "stsb")))
    assert tables["train"].label_names is None
    assert rows_of(tables["train"]) == [(("A plane.", "An airplane."), 5.0, 0), (("A man.", "A dog."), 0.5, 1)]
    assert tables["validation"].labels == [4.2, 1.0]
    assert rows_of(tables["test"])[1] == (("R.", "S."), None, 1)


def test_mnli_files_matched_and_mismatched(tmp_path):
    tables = tables_of(task_name="mnli", data_dir=str(write_glue_task(tmp_path, "mnli")))
    assert sorted(tables) == ["test_matched", "test_mismatched", "train", "validation_matched", "validation_mismatched"]
    # Label ids of the Hub dataset nyu-mll/glue: entailment 0, neutral 1, contradiction 2.
    assert rows_of(tables["train"]) == [(("He ran.", "He moved."), 0, 0), (("It's red.", 'It is "blue".'), 2, 1)]
    assert tables["validation_matched"].labels == [1, 2]  # gold_label is the last column of the dev files
    assert tables["validation_mismatched"].labels == [1, 2]
    assert rows_of(tables["test_mismatched"]) == [(("E.", "F."), None, 0), (("G.", "H."), None, 1)]


@pytest.mark.parametrize(
    ("task", "train_labels", "dev_labels"),
    [("qnli", [0, 1], [0, 1]), ("rte", [0, 1], [1, 0]), ("wnli", [1, 0], [0, 1])],
)
def test_qnli_rte_wnli_files(tmp_path, task, train_labels, dev_labels):
    tables = tables_of(task_name=task, data_dir=str(write_glue_task(tmp_path, task)))
    assert tables["train"].labels == train_labels
    assert tables["validation"].labels == dev_labels
    assert [row[1:] for row in rows_of(tables["test"])] == [(None, 0), (None, 1)]
    assert tables["train"].label_names == GLUE_TASKS[task].label_names


def test_explicit_files_override_and_name_mnli_splits(tmp_path):
    folder = write_glue_task(tmp_path, "mnli")
    tables = tables_of(
        task_name="mnli",
        train_file=str(folder / "train.tsv"),
        validation_file=str(folder / "dev_mismatched.tsv"),
        validation_mismatched_file=str(folder / "dev_matched.tsv"),
    )
    assert sorted(tables) == ["train", "validation_matched", "validation_mismatched"]


# ---------------------------------------------------------------------------------------------------------------------
# Loading: custom tables
# ---------------------------------------------------------------------------------------------------------------------


def test_custom_csv_json_jsonl_tables(tmp_path):
    (tmp_path / "train.csv").write_text('id,premise,hypothesis,label\n3,"A, b.",C.,yes\n4,D.,"E ""f""",no\n')
    (tmp_path / "dev.jsonl").write_text(
        '{"premise": "G.", "hypothesis": "H.", "label": "no"}\n\n'
        '{"premise": "I.", "hypothesis": "J.", "label": "yes"}\n'
    )
    (tmp_path / "test.json").write_text(json.dumps({"data": [{"premise": "K.", "hypothesis": "L."}]}))
    tables = tables_of(
        train_file=str(tmp_path / "train.csv"),
        validation_file=str(tmp_path / "dev.jsonl"),
        test_file=str(tmp_path / "test.json"),
    )
    assert tables["train"].label_names == ("no", "yes")  # sorted labels of the training file
    assert rows_of(tables["train"]) == [(("A, b.", "C."), 1, 3), (("D.", 'E "f"'), 0, 4)]
    assert rows_of(tables["validation"]) == [(("G.", "H."), 0, 0), (("I.", "J."), 1, 1)]
    assert rows_of(tables["test"]) == [(("K.", "L."), None, 0)]


def test_custom_tables_pick_text_columns_and_regression(tmp_path, caplog):
    (tmp_path / "train.tsv").write_text("label\treview\tsource\n0.5\tGood.\tweb\n2\tBad.\tweb\n")
    with caplog.at_level(logging.INFO, logger="posformers.finetune.glue_data"):
        tables = tables_of(train_file=str(tmp_path / "train.tsv"))
    assert tables["train"].label_names is None  # non-integer numbers: regression
    assert rows_of(tables["train"]) == [(("Good.", "web"), 0.5, 0), (("Bad.", "web"), 2.0, 1)]
    # a guess is said, with the way to choose
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        ("WARNING", f"{tmp_path / 'train.tsv'}: text column(s) guessed: review, source (--text_columns chooses others)")
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="posformers.finetune.glue_data"):
        tables = tables_of(train_file=str(tmp_path / "train.tsv"), text_columns="review")
    assert rows_of(tables["train"])[0] == (("Good.",), 0.5, 0)
    assert not caplog.records


def test_hub_dataset_offline_says_so(tmp_path):
    with pytest.raises(DataError, match=r"nyu-mll/glue \(sst2\): the Hub is offline .* --data_dir"):
        tables_of(task_name="sst2")


# ---------------------------------------------------------------------------------------------------------------------
# Bad data: one clear error each, before any training
# ---------------------------------------------------------------------------------------------------------------------


def assert_script_error(tmp_path, pattern: str, *args: str, model: list[str] | None = None) -> None:
    with pytest.raises(SystemExit, match=pattern) as error:
        glue_main(tmp_path, "--do_train", *args, model=model)
    assert str(error.value).startswith("error (")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_unknown_task(tmp_path):
    assert_script_error(
        tmp_path, r"^error \(data\): --task_name 'sst5': unknown task; GLUE tasks: cola, sst2", "--task_name", "sst5"
    )


def test_missing_text_column(tmp_path):
    path = write_tsv(tmp_path / "train.csv", "sentence1,label", ["a,1"])
    path.write_text(path.read_text().replace("\t", ","))
    assert_script_error(
        tmp_path,
        r"train.csv: missing text column\(s\) 'sentence2' for task mrpc",
        "--task_name",
        "mrpc",
        "--train_file",
        str(path),
    )


def test_missing_label_column(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"sentence": "fine"}\n')
    assert_script_error(tmp_path, r"train.jsonl: no 'label' column; the file has: sentence", "--train_file", str(path))


def test_label_outside_the_task_label_set(tmp_path):
    path = write_tsv(tmp_path / "train.tsv", "sentence\tlabel", ["good .\t1", "bad .\t0", "meh .\t2"])
    assert_script_error(
        tmp_path,
        r"train.tsv, line 4, column 'label': label '2' is not one of 0, 1",
        "--task_name",
        "sst2",
        "--train_file",
        str(path),
    )


def test_labels_not_matching_a_fine_tuned_head(tmp_path):
    config = posformers.RoFormerConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=3
    )
    posformers.RoFormerForSequenceClassification(config).save_pretrained(tmp_path / "mnli-model")
    path = write_tsv(tmp_path / "train.tsv", "sentence\tlabel", ["good .\t1", "bad .\t0"])
    model = ["--model_name_or_path", str(tmp_path / "mnli-model"), "--tokenizer_name", str(TOKENIZER_DIR)]
    assert_script_error(
        tmp_path,
        r"the data has 2 label\(s\) \(0, 1\) but .*mnli-model was fine-tuned with num_labels=3 "
        r".*--ignore_mismatched_sizes",
        "--task_name",
        "sst2",
        "--train_file",
        str(path),
        model=model,
    )


def test_empty_file(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("\n")
    assert_script_error(
        tmp_path, r"train.tsv: no examples \(empty file\)", "--task_name", "cola", "--train_file", str(path)
    )


def test_malformed_row_reported_with_file_and_line(tmp_path, glue_dir):
    lines = (glue_dir / "mrpc" / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[:6]
    lines[3] = "\t".join(lines[3].split("\t")[:4])  # the second string is missing
    path = write_tsv(tmp_path / "dev.tsv", None, lines)
    assert_script_error(
        tmp_path,
        r"dev.tsv, line 4: 4 tab-separated fields, mrpc needs 5",
        "--task_name",
        "mrpc",
        "--train_file",
        str(path),
    )


def test_skip_bad_examples_counts_what_it_skipped(tmp_path):
    path = write_tsv(tmp_path / "train.tsv", "sentence\tlabel", ["good .\t1", "bad .\tx", "fine .\t1", "\t"])
    tables = read_files({"train": path}, GLUE_TASKS["sst2"], None, skip_bad=True)
    assert rows_of(tables["train"]) == [(("good .",), 1, 0), (("fine .",), 1, 2)]
    bad = BadExamples(skip=True, split="train")
    read_files({"train": path}, GLUE_TASKS["sst2"], None, skip_bad=True)  # a second read is independent
    bad.add(DataError("x", path=path, row=3))
    assert bad.summary() == f"train: skipped 1 bad example(s); first: {path}, line 3: x"


def test_output_dir_with_a_previous_run_is_not_overwritten(tmp_path, glue_dir):
    out = tmp_path / "out"
    out.mkdir()
    (out / "all_results.json").write_text('{"mine": 1}')
    args = ["--task_name", "cola", "--train_file", str(glue_dir / "cola" / "dev.tsv"), "--max_steps", "1"]
    assert_script_error(tmp_path, r"already holds a previous run \(all_results.json\).*--overwrite_output_dir", *args)
    assert (out / "all_results.json").read_text() == '{"mine": 1}'
    with pytest.raises(SystemExit, match=r"--resume_from_checkpoint True: no checkpoint-N folder"):
        glue_main(tmp_path, "--do_train", *args, "--resume_from_checkpoint", "True")
    glue_main(tmp_path, "--do_train", *args, "--overwrite_output_dir", "--max_train_samples", "8")
    assert (out / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------------------------------------
# Training, evaluation and predictions
# ---------------------------------------------------------------------------------------------------------------------


def test_learns_sst2_beyond_the_majority_baseline(tmp_path, glue_dir):
    rows = (glue_dir / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    train = write_tsv(tmp_path / "train.tsv", rows[0], rows[1:601])
    held_out = write_tsv(tmp_path / "held_out.tsv", rows[0], rows[20001:20401])
    labels = [int(row.rsplit("\t", 1)[1]) for row in rows[20001:20401]]
    majority = max(sum(labels), len(labels) - sum(labels)) / len(labels)
    training = ["--num_train_epochs", "6", "--learning_rate", "3e-3", "--per_device_train_batch_size", "16"]
    results = glue_main(
        tmp_path,
        *["--task_name", "sst2", "--train_file", str(train), "--validation_file", str(held_out)],
        *["--do_train", "--do_eval", "--max_seq_length", "40", "--seed", "0", *training],
    )
    # Seeds 0-3 give 0.64-0.70 against a majority baseline of 0.5875 on these 400 held-out rows.
    assert results["eval_accuracy"] > majority + 0.04, (results["eval_accuracy"], majority)
    saved = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert saved["eval_accuracy"] == results["eval_accuracy"]


def train_evaluate_predict(tmp_path: Path, task: str) -> dict:
    """Two training steps, evaluation and predictions on a GLUE task folder written by write_glue_task."""
    folder = write_glue_task(tmp_path, task)
    stages = ["--do_train", "--do_eval", "--do_predict", "--max_steps", "2"]
    return glue_main(tmp_path, "--task_name", task, "--data_dir", str(folder), *stages)


def test_mnli_evaluates_both_dev_sets_and_writes_both_submissions(tmp_path):
    results = train_evaluate_predict(tmp_path, "mnli")
    assert {"eval_accuracy", "eval_mm_accuracy", "eval_samples", "eval_mm_samples"} <= set(results)
    for name in ("MNLI-m", "MNLI-mm"):
        lines = (tmp_path / "out" / f"{name}.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction"
        assert [line.split("\t")[0] for line in lines[1:]] == ["0", "1"]
        assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "neutral", "contradiction"}


def test_stsb_regression_metrics_and_submission(tmp_path):
    results = train_evaluate_predict(tmp_path, "stsb")
    assert {"eval_pearson", "eval_spearmanr", "eval_combined_score"} <= set(results)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    lines = (tmp_path / "out" / "STS-B.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 3
    for line in lines[1:]:
        float(line.split("\t")[1])


@pytest.mark.parametrize("model_type", ["posformers-deberta", "littlebird"])
def test_other_model_families_train_and_predict(tmp_path, glue_dir, model_type):
    overrides = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64"
    overrides += (
        ",max_position_embeddings=128,position_buckets=32"
        if model_type != "littlebird"
        else ",block_size=8,pack_length=4"
    )
    write_tsv(tmp_path / "test.tsv", "index\tsentence", ["0\ta fine film .", "1\ta dull film ."])
    glue_main(
        tmp_path,
        "--task_name",
        "sst2",
        "--train_file",
        str(glue_dir / "sst2" / "dev.tsv"),
        "--test_file",
        str(tmp_path / "test.tsv"),
        "--do_train",
        "--do_predict",
        "--max_steps",
        "2",
        "--max_train_samples",
        "16",
        model=tiny_model_args(model_type, overrides),
    )
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.model_type == model_type
    assert model.config.vocab_size == 30522 and model.config.pad_token_id == 0  # from the tokenizer
    lines = (tmp_path / "out" / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and [line[:2] for line in lines[1:]] == ["0\t", "1\t"]


@pytest.mark.parametrize("model_type", ["roformer", "deberta-v2"])
def test_a_transformers_checkpoint_runs_on_posformers_and_stays_transformers_format(
    tmp_path, glue_dir, model_type, caplog
):
    """--model_name_or_path a folder in transformers' format (junnyu/roformer_*, microsoft/deberta-v3-*): the script
    runs posformers' implementation, says so in one line, and writes a transformers folder that transformers alone
    loads as its own class with the same outputs."""
    fields = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    if model_type == "roformer":
        config = transformers.RoFormerConfig(**fields, max_position_embeddings=128)
    else:
        config = transformers.DebertaV2Config(
            **fields, relative_attention=True, pos_att_type="p2c|c2p", position_buckets=32, share_att_key=True,
            norm_rel_ebd="layer_norm", position_biased_input=False, max_position_embeddings=128,
        )  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(tmp_path / "checkpoint")
    shutil.copytree(TOKENIZER_DIR, tmp_path / "checkpoint", dirs_exist_ok=True)
    with caplog.at_level(logging.WARNING, logger="posformers.finetune.loading"):
        glue_main(
            tmp_path,
            "--task_name", "sst2", "--train_file", str(glue_dir / "sst2" / "dev.tsv"), "--do_train",
            "--max_steps", "2", "--max_train_samples", "16",
            model=["--model_name_or_path", str(tmp_path / "checkpoint")],
        )  # fmt: skip
    (line,) = [record.getMessage() for record in caplog.records if "runs on posformers" in record.getMessage()]
    assert line.startswith(f"{tmp_path / 'checkpoint'} runs on posformers as transformers' ")
    out = tmp_path / "out"
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == model_type and "auto_map" not in written
    assert not list(out.glob("*.py"))
    assert not posformers.is_enabled()
    theirs = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(theirs).__module__.startswith("transformers.models.")
    with posformers.enabled():
        ours = AutoModelForSequenceClassification.from_pretrained(out).eval()
    batch = AutoTokenizer.from_pretrained(out)(
        ["a fine film .", "a dull and overlong film ."], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        assert (theirs(**batch).logits - ours(**batch).logits).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------------
# Resuming and the Hub
# ---------------------------------------------------------------------------------------------------------------------


def batches_logged(log_dir: Path) -> list[str]:
    """The training batches (example ids, one line per batch) the sample log recorded in this process."""
    return (log_dir / "rank0.txt").read_text().splitlines()


def test_resume_from_checkpoint_ends_like_an_uninterrupted_run(tmp_path, glue_dir, monkeypatch):
    args = [
        "--task_name", "mrpc", "--max_seq_length", "64",
        "--train_file", str(glue_dir / "mrpc" / "train.tsv"), "--max_train_samples", "64",
        "--validation_file", str(glue_dir / "mrpc" / "dev.tsv"), "--max_eval_samples", "32",
        "--do_train", "--do_eval", "--max_steps", "6", "--per_device_train_batch_size", "8",
        "--seed", "3", "--learning_rate", "1e-3", "--save_strategy", "steps", "--save_steps", "2",
    ]  # fmt: skip
    logs = {name: tmp_path / f"log-{name}" for name in ("full", "resumed")}
    for folder in logs.values():
        folder.mkdir()
    trainer_class = run_glue.Trainer
    monkeypatch.setattr(run_glue, "Trainer", sample_log_trainer(trainer_class, logs["full"]))
    full = glue_main(tmp_path / "full", *args)
    monkeypatch.setattr(run_glue, "Trainer", trainer_class)
    interrupted = tmp_path / "resumed" / "out"
    glue_main(tmp_path / "resumed", *args)
    for entry in interrupted.iterdir():  # keep only checkpoint-2: as if the run had died after step 2
        if entry.name != "checkpoint-2":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    monkeypatch.setattr(run_glue, "Trainer", sample_log_trainer(trainer_class, logs["resumed"]))
    resumed = glue_main(tmp_path / "resumed", *args, "--resume_from_checkpoint", "True")

    # It did resume: it trained steps 3-6 only, on the batches the uninterrupted run had at those steps.
    assert batches_logged(logs["resumed"]) == batches_logged(logs["full"])[2:]
    expected = load_file(tmp_path / "full" / "out" / "model.safetensors")
    actual = load_file(interrupted / "model.safetensors")
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=1e-6, msg=name)
    for key in ("eval_accuracy", "eval_f1", "eval_loss"):
        assert resumed[key] == pytest.approx(full[key], abs=1e-6), key


PUSH = """
from posformers.finetune import run_glue
run_glue.main(ARGS["argv"])
print(json.dumps({"done": True}))
"""


@pytest.mark.slow
def test_push_to_hub_uploads_the_fine_tuned_model(tmp_path, glue_dir, hub_server):
    argv = [
        *tiny_model_args(),
        *QUIET,
        "--output_dir",
        str(tmp_path / "out"),
        "--task_name",
        "sst2",
        "--train_file",
        str(glue_dir / "sst2" / "dev.tsv"),
        "--max_train_samples",
        "16",
        "--do_train",
        "--max_steps",
        "1",
        "--push_to_hub",
        "--hub_model_id",
        "user/tiny-sst2",
    ]
    run_python(PUSH, {"argv": argv}, env=python_env(tmp_path / "hf-home", endpoint=hub_server.url), cwd=tmp_path)
    files = set(hub_server.list_files("user/tiny-sst2"))
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "README.md"} <= files, files
    pushed = json.loads(hub_server.read_file("user/tiny-sst2", "config.json"))
    assert pushed["model_type"] == "posformers-roformer" and pushed["id2label"] == {"0": "negative", "1": "positive"}
    assert (
        hub_server.read_file("user/tiny-sst2", "model.safetensors")
        == (tmp_path / "out" / "model.safetensors").read_bytes()
    )


def test_training_logs_show_throughput_and_time_left(tmp_path, glue_dir, capsys):
    data = ["--task_name", "sst2", "--train_file", str(glue_dir / "sst2" / "dev.tsv"), "--max_train_samples", "32"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training = ["--do_train", "--max_steps", "4", "--logging_steps", "2", "--per_device_train_batch_size", "4"]
        glue_main(tmp_path, *data, *training)
    # pinned memory only serves an accelerator: on a CPU it only drew torch's warning
    assert not [str(warning.message) for warning in caught if "pin_memory" in str(warning.message)]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{'loss'")]
    assert len(lines) == 2, lines
    for line in lines:
        assert re.search(r"'samples_per_second': '[\d.]+'", line), line
        assert re.search(r"'eta_seconds': '[\d.]+', 'eta': '\d+:\d\d:\d\d'", line), line
    assert "'eta': '0:00:00'" in lines[-1]  # nothing left after the last step


def test_config_file_and_arguments_file(tmp_path, glue_dir):
    config = {"model_type": "posformers-roformer", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    arguments = {
        "config_name": str(tmp_path / "config.json"),
        "tokenizer_name": str(TOKENIZER_DIR),
        "task_name": "cola",
        "train_file": str(glue_dir / "cola" / "dev.tsv"),
        "max_train_samples": 16,
        "do_train": True,
        "max_steps": 1,
        "output_dir": str(tmp_path / "out"),
        "report_to": "none",
        "save_strategy": "no",
    }
    (tmp_path / "args.json").write_text(json.dumps(arguments))
    run_glue.main([str(tmp_path / "args.json")])
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (saved["model_type"], saved["hidden_size"], saved["embedding_size"]) == ("posformers-roformer", 32, 32)
    assert saved["finetuning_task"] == "cola" and saved["id2label"] == {"0": "unacceptable", "1": "acceptable"}
    assert saved["vocab_size"] == 30522  # the tokenizer's, not RoFormerConfig's default of 50000

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    (tmp_path / "args.json").write_text(json.dumps({**arguments, "output_dir": str(tmp_path / "out2")}))
    with pytest.raises(SystemExit, match=r"config.json: unknown model_type None"):
        run_glue.main([str(tmp_path / "args.json")])


def test_a_checkpoint_keeps_its_label_order(tmp_path):
    """An RTE model saved with not_entailment=0 evaluates and predicts in its own order, scored in GLUE's."""
    config = posformers.RoFormerConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    config.id2label, config.label2id = {0: "not_entailment", 1: "entailment"}, {"not_entailment": 0, "entailment": 1}
    model = posformers.RoFormerForSequenceClassification(config)
    model.save_pretrained(tmp_path / "rte-model")
    tables = tables_of(task_name="rte", data_dir=str(write_glue_task(tmp_path, "rte")))
    assert run_glue.align_with_checkpoint(model.config, tables, GLUE_TASKS["rte"].label_names, GLUE_TASKS["rte"]) == (
        "not_entailment",
        "entailment",
    )
    assert tables["train"].labels == [1, 0] and tables["validation"].labels == [0, 1]  # were [0, 1] and [1, 0]

    compute = run_glue.make_compute_metrics(GLUE_TASKS["rte"], ("not_entailment", "entailment"))
    logits = np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0]])  # predicts not_entailment, entailment, entailment
    labels = np.array([0, 1, 0])  # not_entailment, entailment, not_entailment
    assert compute(EvalPrediction(predictions=logits, label_ids=labels)) == {"accuracy": pytest.approx(2 / 3)}


def test_an_sst2_checkpoint_keeps_its_class_names_and_their_order(tmp_path):
    """A model fine-tuned on SST-2 carries "negative"/"positive" for the files' 0/1; one saved with positive=0 is
    fine-tuned further in its own order, its class names kept."""
    config = posformers.RoFormerConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    config.id2label, config.label2id = {0: "positive", 1: "negative"}, {"positive": 0, "negative": 1}
    posformers.RoFormerForSequenceClassification(config).save_pretrained(tmp_path / "sst2-model")
    write_tsv(tmp_path / "train.tsv", "sentence\tlabel", ["a fine film\t1", "dull\t0"])
    tables = tables_of(task_name="sst2", train_file=str(tmp_path / "train.tsv"))
    sst2 = GLUE_TASKS["sst2"]
    assert run_glue.align_with_checkpoint(config, tables, sst2.label_names, sst2) == ("1", "0")
    assert tables["train"].labels == [0, 1]  # positive is the model's 0
    model_args = run_glue.ModelArguments(model_name_or_path=str(tmp_path / "sst2-model"))
    assert run_glue.set_labels(config, ("1", "0"), sst2, model_args).id2label == {0: "positive", 1: "negative"}
    fresh = posformers.RoFormerConfig()
    assert run_glue.set_labels(fresh, sst2.label_names, sst2, run_glue.ModelArguments()).id2label == {
        0: "negative",
        1: "positive",
    }


def test_dataset_name_reads_a_datasets_folder_like_the_hub_layout(tmp_path):
    """--dataset_name goes through datasets.load_dataset (here a local folder, the Hub layout of nyu-mll/glue sst2:
    sentence, label, idx; the test split's labels are -1)."""
    folder = tmp_path / "sst2-hub-layout"
    folder.mkdir()
    rows = {
        "train": [("a fine film", 1, 0), ("dull", 0, 1)],
        "validation": [("great", 1, 0)],
        "test": [("so so", -1, 0), ("wow", -1, 1)],
    }
    for split, examples in rows.items():
        lines = [json.dumps({"sentence": s, "label": label, "idx": idx}) for s, label, idx in examples]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    tables = tables_of(task_name="sst2", dataset_name=str(folder))
    assert rows_of(tables["train"]) == [(("a fine film",), 1, 0), (("dull",), 0, 1)]
    assert rows_of(tables["validation"]) == [(("great",), 1, 0)]
    assert rows_of(tables["test"]) == [(("so so",), None, 0), (("wow",), None, 1)]


def test_dataset_name_without_a_task_learns_the_label_set(tmp_path):
    folder = tmp_path / "stars"
    folder.mkdir()
    lines = [json.dumps({"text": t, "label": label}) for t, label in [("meh", 3), ("great", 7), ("fine", 3)]]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    tables = tables_of(dataset_name=str(folder))
    assert tables["train"].label_names == ("3", "7")
    assert rows_of(tables["train"]) == [(("meh",), 0, 0), (("great",), 1, 1), (("fine",), 0, 2)]
