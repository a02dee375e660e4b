"""posformers-mc (finetune/run_mc.py): SWAG csv, CommonsenseQA and ARC JSON lines, a Hub-style dataset folder,
accuracy against the predictions file, a LittleBird reading a long passage shared by the choices (padded and unpadded
alike), bad data with file and line, and the output folder's safety."""

import json
import logging
from pathlib import Path

import datasets
import pytest
from conftest import QUIET, TINY_ROFORMER, TOKENIZER_DIR, tiny_model_args
from helpers.data import DATA_DIR
from helpers.pretrain_corpus import TINY
from transformers import AutoTokenizer

from posformers.finetune import run_mc
from posformers.finetune.demo import DEMO_DATA
from posformers.finetune.mc_data import read_split_files

SWAG = DATA_DIR / "mc" / "swag_sample"
CSQA = DATA_DIR / "mc" / "commonsenseqa"
DEMO_QA = DEMO_DATA / "qa"
NO_DROPOUT = ",hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
FAST = ["--learning_rate", "5e-3", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8"]


def mc_main(out: Path, *args: str, model: list[str] | None = None) -> dict:
    return run_mc.main([*(model or tiny_model_args()), *QUIET, "--output_dir", str(out), *FAST, *args])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def test_swag_csv():
    splits = read_split_files({"train": SWAG / "train.csv", "test": SWAG / "test.csv"}, skip_bad=False)
    first = splits["train"][0]
    assert first["first"] == "Members of the procession walk down the street holding small horn brass instruments."
    assert first["seconds"][0] == "A drum line passes by walking down the street playing their instruments."
    assert first["seconds"][3] == "A drum line turns the lead singer watches the performance."
    assert (first["id"], first["label"], first["line"], first["choice_labels"]) == ("0", 0, 2, ["0", "1", "2", "3"])
    assert [q["label"] for q in splits["train"]] == [0, 3, 1, 3]
    assert [q["label"] for q in splits["test"]] == [None] * 4


def test_commonsenseqa_jsonl():
    splits = read_split_files(
        {
            "train": CSQA / "train_rand_split.jsonl",
            "validation": CSQA / "dev_rand_split.jsonl",
            "test": CSQA / "test_rand_split_no_answers.jsonl",
        },
        skip_bad=False,
    )
    assert {split: len(questions) for split, questions in splits.items()} == {
        "train": 200,
        "validation": 100,
        "test": 20,
    }
    question = splits["validation"][0]
    assert question["first"].startswith("A revolving door is convenient for two direction travel")
    assert question["seconds"] == ["bank", "library", "department store", "mall", "new york"]
    assert (question["id"], question["label"], question["choice_labels"]) == (
        "1afa02df02c908a558b4036e80242fac",
        0,
        ["A", "B", "C", "D", "E"],
    )
    assert all(q["label"] is None for q in splits["test"])


def test_choices_cut_to_max_seq_length_are_counted(caplog):
    caplog.set_level(logging.WARNING, logger="posformers")
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    questions = read_split_files({"train": SWAG / "train.csv"}, skip_bad=False)["train"]
    features = run_mc.to_features(questions, tokenizer, max_length=16, pad_to_max_length=False)
    assert max(len(ids) for row in features["input_ids"] for ids in row) == 16
    assert any("of 16 choices were cut to max_seq_length=16" in record.message for record in caplog.records)


def test_arc_style_numbered_choices_and_a_passage(tmp_path):
    path = tmp_path / "arc.jsonl"
    record = {
        "id": "Mercury_7175875",
        "question": {
            "stem": "An astronomer observes that a planet rotates faster after a meteorite impact. Which is the most "
            "likely effect of this increase in rotation?",
            "choices": [
                {"text": "Planetary density will decrease.", "label": "1"},
                {"text": "Planetary years will become longer.", "label": "2"},
                {"text": "Planetary days will become shorter.", "label": "3"},
                {"text": "Planetary gravity will become stronger.", "label": "4"},
            ],
        },
        "answerKey": "3",
    }
    with_passage = {**record, "id": "p", "passage": "A day is one rotation of a planet."}
    path.write_text(json.dumps(record) + "\n" + json.dumps(with_passage) + "\n")
    plain, passage = read_split_files({"train": path}, skip_bad=False)["train"]
    assert plain["label"] == passage["label"] == 2
    assert plain["seconds"][2] == "Planetary days will become shorter."
    assert passage["first"] == "A day is one rotation of a planet."
    assert passage["seconds"][2] == record["question"]["stem"] + " Planetary days will become shorter."


def test_hub_layout_reads_as_the_official_files(tmp_path):
    # The Hub's commonsense_qa rows: question a string, choices {"label": [...], "text": [...]}
    official = [json.loads(line) for line in (CSQA / "dev_rand_split.jsonl").read_text().splitlines()[:24]]
    rows = {
        "id": [r["id"] for r in official],
        "question": [r["question"]["stem"] for r in official],
        "question_concept": [r["question"]["question_concept"] for r in official],
        "choices": [
            {
                "label": [c["label"] for c in r["question"]["choices"]],
                "text": [c["text"] for c in r["question"]["choices"]],
            }
            for r in official
        ],
        "answerKey": [r["answerKey"] for r in official],
    }
    folder = tmp_path / "commonsense_qa"
    for split in ("train", "validation"):
        datasets.Dataset.from_dict(rows).to_parquet(folder / "data" / f"{split}.parquet")
    metrics = mc_main(tmp_path / "out", "--dataset_name", str(folder), "--do_train", "--do_eval", "--max_steps", "2")
    assert metrics["eval_samples"] == 24
    hub = run_mc.load_splits(
        run_mc.McDataArguments(dataset_name=str(folder)), run_mc.TrainingArguments("x", do_train=True), False, None
    )["validation"]
    files = read_split_files({"validation": CSQA / "dev_rand_split.jsonl"}, skip_bad=False)["validation"][:24]
    keys = ("id", "first", "seconds", "choice_labels", "label")
    assert [{k: q[k] for k in keys} for q in hub] == [{k: q[k] for k in keys} for q in files]


# ---------------------------------------------------------------------------------------------------------------------
# Training, accuracy and predictions
# ---------------------------------------------------------------------------------------------------------------------


def test_commonsenseqa_trains_and_accuracy_matches_the_predictions_file(tmp_path):
    out = tmp_path / "out"
    metrics = mc_main(
        out,
        "--train_file",
        str(CSQA / "train_rand_split.jsonl"),
        "--validation_file",
        str(CSQA / "dev_rand_split.jsonl"),
        "--test_file",
        str(CSQA / "test_rand_split_no_answers.jsonl"),
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "40",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--num_train_epochs",
        "24",
        "--logging_steps",
        "4",
    )
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert losses[-1] < losses[0] * 0.7, losses  # it fits its 16 training questions (from ln 5 = 1.61)
    predictions = read_jsonl(out / "eval_predictions.jsonl")
    answers = [json.loads(line)["answerKey"] for line in (CSQA / "dev_rand_split.jsonl").read_text().splitlines()[:40]]
    assert [p["id"] for p in predictions] == [
        json.loads(line)["id"] for line in (CSQA / "dev_rand_split.jsonl").read_text().splitlines()[:40]
    ]
    assert metrics["eval_accuracy"] == pytest.approx(
        sum(p["prediction"] == a for p, a in zip(predictions, answers)) / 40, abs=1e-9
    )
    assert all(len(p["probabilities"]) == 5 and abs(sum(p["probabilities"]) - 1) < 1e-5 for p in predictions)
    test_predictions = read_jsonl(out / "predictions.jsonl")
    assert len(test_predictions) == 20 and {p["prediction"] for p in test_predictions} <= set("ABCDE")
    assert "predict_accuracy" not in metrics  # the test questions have no answers


def test_swag_csv_trains_and_predicts(tmp_path):
    metrics = mc_main(
        tmp_path / "out",
        "--train_file",
        str(SWAG / "train.csv"),
        "--validation_file",
        str(SWAG / "val.csv"),
        "--test_file",
        str(SWAG / "test.csv"),
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--max_steps",
        "2",
    )
    assert metrics["eval_samples"] == 4 and metrics["eval_accuracy"] in (0, 0.25, 0.5, 0.75, 1)
    assert [p["id"] for p in read_jsonl(tmp_path / "out" / "predictions.jsonl")] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("model_type", list(TINY))
def assert_padding_changes_nothing(tmp_path: Path, data: list[str], model: list[str], *more_modes: str) -> None:
    """Train `model` a few steps, then evaluate it with the padding skipped inside (auto) and computed on (false),
    and in `more_modes` (e.g. "max_length": every choice padded to --max_seq_length 64 and computed on): the same
    loss and probabilities."""
    mc_main(tmp_path / "model", *data, "--do_train", "--max_steps", "2", model=model)
    options = {"auto": ["--padding_free", "auto"], "false": ["--padding_free", "false"]}
    options["max_length"] = ["--padding_free", "false", "--pad_to_max_length", "--max_seq_length", "64"]
    results = {}
    for mode in ("auto", "false", *more_modes):
        trained = ["--model_name_or_path", str(tmp_path / "model")]
        results[mode] = mc_main(tmp_path / mode, *data, "--do_eval", *options[mode], model=trained)
    for mode in ("auto", *more_modes):
        assert results[mode]["eval_loss"] == pytest.approx(results["false"]["eval_loss"], abs=1e-5), mode
        for a, b in zip(*(read_jsonl(tmp_path / m / "eval_predictions.jsonl") for m in (mode, "false"))):
            assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-5), mode


@pytest.mark.parametrize("model_type", list(TINY))
def test_each_model_family_scores_the_same_with_and_without_padding(model_type, tmp_path):
    data = [
        "--train_file",
        str(CSQA / "train_rand_split.jsonl"),
        "--validation_file",
        str(CSQA / "dev_rand_split.jsonl"),
    ]
    data += ["--max_train_samples", "16", "--max_eval_samples", "16"]
    # RoFormer's default summary (the last position, as transformers') reads a padding token: the mean does not
    summary = ",summary_type=mean" if model_type == "posformers-roformer" else ""
    tiny = tiny_model_args(model_type, TINY[model_type] + NO_DROPOUT + summary)
    assert_padding_changes_nothing(tmp_path, data, tiny, "max_length")


def test_roformer_last_position_summary_is_flagged(tmp_path, caplog):
    args = ["--train_file", str(SWAG / "train.csv"), "--do_train", "--max_steps", "1", "--log_level", "warning"]
    mc_main(tmp_path / "last", *args)
    assert any("summary_type='last'" in record.message for record in caplog.records)
    caplog.clear()
    mc_main(tmp_path / "mean", *args, model=tiny_model_args(overrides=TINY_ROFORMER + ",summary_type=mean"))
    assert not any("summary_type" in record.message for record in caplog.records)


def long_passage_questions(path: Path, count: int) -> Path:
    """Questions on the demo's 1,848-token Amazon rainforest document: the answer and three other questions'
    answers as choices, the document as a passage shared by all four."""
    article = json.loads((DEMO_QA / "train.json").read_text())["data"][0]["paragraphs"][0]
    questions = article["qas"]
    lines = []
    for i, question in enumerate(questions[:count]):
        texts = [questions[(i + shift) % len(questions)]["answers"][0]["text"] for shift in range(4)]
        rotation = i % 4  # the answer moves through the four places
        texts = texts[-rotation:] + texts[:-rotation] if rotation else texts
        choices = [{"label": "ABCD"[k], "text": text} for k, text in enumerate(texts)]
        record = {"id": question["id"], "context": article["context"], "answerKey": "ABCD"[rotation]}
        lines.append(json.dumps({**record, "question": {"stem": question["question"], "choices": choices}}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_littlebird_reads_a_long_passage_shared_by_the_choices(tmp_path):
    data = long_passage_questions(tmp_path / "amazon.jsonl", 4)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    questions = read_split_files({"train": data}, skip_bad=False)["train"]
    features = run_mc.to_features(questions, tokenizer, max_length=4096, pad_to_max_length=False)
    lengths = [len(ids) for row in features["input_ids"] for ids in row]
    passage_tokens = len(tokenizer(questions[0]["first"])["input_ids"])
    assert passage_tokens > 1800 and min(lengths) > passage_tokens  # every choice holds the whole passage
    littlebird = ["--config_name", str(DEMO_QA / "littlebird-qa.json"), "--tokenizer_name", str(TOKENIZER_DIR)]
    data = ["--train_file", str(data), "--validation_file", str(data), "--per_device_eval_batch_size", "4"]
    assert_padding_changes_nothing(tmp_path, data, littlebird)


# ---------------------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------------------

SWAG_HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
SWAG_ROW = "0,v,1,A man sits. He,A man sits.,He,gold,stands.,runs.,sleeps.,eats.,{label}\n"
CSQA_LINE = json.dumps(
    {
        "id": "q",
        "question": {"stem": "Where?", "choices": [{"label": "A", "text": "here"}, {"label": "B", "text": "x"}]},
        "answerKey": "{key}",
    }
)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("train.csv", SWAG_HEADER + SWAG_ROW.format(label=0) + SWAG_ROW.format(label=4), r"line 3, column 'label'"),
        ("train.csv", SWAG_HEADER + SWAG_ROW.format(label="x"), r"line 2, column 'label': label 'x' is not"),
        ("train.jsonl", CSQA_LINE.replace("{key}", "C") + "\n", r"line 1, column 'answerKey': answerKey 'C'"),
        ("train.jsonl", CSQA_LINE.replace("{key}", "A") + "\n{not json\n", r"line 2: not a JSON object"),
        (
            "train.jsonl",
            CSQA_LINE.replace("{key}", "A")
            + "\n"
            + CSQA_LINE.replace("{key}", "A").replace(
                ', {"label": "B", "text": "x"}', ', {"label": "B", "text": "x"}, {"label": "C", "text": "y"}'
            )
            + "\n",
            r"line 2, column 'choices': 3 choices where the split's first question has 2",
        ),
        (
            "train.jsonl",
            CSQA_LINE.replace("{key}", "A") + "\n" + CSQA_LINE.replace("{key}", "") + "\n",
            r"line 2: no answer",
        ),
    ],
)
def test_bad_data_stops_with_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SystemExit, match=r"^error \(data\): .*" + message):
        mc_main(tmp_path / "out", "--train_file", str(path), "--do_train", "--max_steps", "1")


def test_refusals_before_training(tmp_path):
    test_only = ["--validation_file", str(CSQA / "test_rand_split_no_answers.jsonl"), "--do_eval"]
    with pytest.raises(SystemExit, match=r"--do_eval: the validation split has no answers"):
        mc_main(tmp_path / "a", *test_only)
    with pytest.raises(SystemExit, match=r"cannot load the dataset nobody/no-such-dataset: "):
        mc_main(tmp_path / "d", "--dataset_name", "nobody/no-such-dataset", "--do_train")  # offline in the tests
    with pytest.raises(SystemExit, match=r"--padding_free true: a multiple-choice head scores padded"):
        mc_main(tmp_path / "b", "--train_file", str(SWAG / "train.csv"), "--do_train", "--padding_free", "true")
    args = ["--train_file", str(SWAG / "train.csv"), "--do_train", "--max_steps", "2"]
    mc_main(tmp_path / "c", *args, "--save_strategy", "steps", "--save_steps", "1")
    with pytest.raises(SystemExit, match="already holds a previous run"):
        mc_main(tmp_path / "c", *args)
    mc_main(tmp_path / "c", *args, "--max_steps", "3", "--resume_from_checkpoint", "True")
    assert json.loads((tmp_path / "c" / "trainer_state.json").read_text())["global_step"] == 3
