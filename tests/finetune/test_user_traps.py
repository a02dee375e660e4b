"""What new users of posformers-glue ran into: each test replays one user's command and checks that it now ends
with one line naming the problem, or does what the user meant, instead of a traceback or a silently wrong model."""

import logging
from pathlib import Path

import datasets
import pytest
import yaml
from conftest import GLUE_DIR, QUIET, TOKENIZER_DIR, tiny_model_args

from posformers.finetune import run_glue

SST2_ROWS = (GLUE_DIR / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
TINY_BERT = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,max_position_embeddings=128"


def glue_main(tmp_path: Path, *args: str, model: list[str] | None = None) -> dict:
    return run_glue.main([*(model or tiny_model_args()), *QUIET, "--output_dir", str(tmp_path / "out"), *args])


def sst2_csv(path: Path, rows: list[str]) -> Path:
    """SST-2 rows ("sentence\\tlabel") as a CSV table with a header."""
    lines = ["sentence,label"] + ['"{}",{}'.format(*row.rsplit("\t", 1)) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def card_metadata(folder: Path) -> dict:
    return yaml.safe_load((folder / "README.md").read_text(encoding="utf-8").split("---\n")[1])


def test_an_empty_label_stops_before_training(tmp_path):
    rows = SST2_ROWS[:8]
    rows[4] = rows[4].rsplit("\t", 1)[0] + "\t"  # the label of the CSV's line 6 is empty
    data = sst2_csv(tmp_path / "data.csv", rows)
    with pytest.raises(SystemExit, match=r"^error \(data\): .*data.csv, line 6, column 'label': empty label$"):
        glue_main(tmp_path, "--train_file", str(data), "--do_train", "--max_steps", "1")
    assert not (tmp_path / "out" / "config.json").exists()


def test_an_empty_label_of_a_glue_task_says_so(tmp_path):
    rows = SST2_ROWS[:8]
    rows[2] = rows[2].rsplit("\t", 1)[0] + "\t"
    data = sst2_csv(tmp_path / "data.csv", rows)
    with pytest.raises(SystemExit, match=r"data.csv, line 4, column 'label': empty label$"):
        glue_main(tmp_path, "--task_name", "sst2", "--train_file", str(data), "--do_train", "--max_steps", "1")


def test_max_seq_length_beyond_the_model_positions_is_capped(tmp_path, caplog):
    # Texts of about 200 tokens, longer than the 128 positions of the model.
    long_rows = ["\t".join((" ".join(row.split("\t")[0] for row in SST2_ROWS[i : i + 40]), "1")) for i in (0, 40)]
    data = sst2_csv(tmp_path / "data.csv", long_rows + SST2_ROWS[100:106])
    model = ["--model_type", "bert", "--config_overrides", TINY_BERT, "--tokenizer_name", str(TOKENIZER_DIR)]
    with caplog.at_level(logging.WARNING, logger="posformers"):
        glue_main(
            tmp_path,
            *["--train_file", str(data), "--do_train", "--max_steps", "1", "--max_seq_length", "100000"],
            *["--per_device_train_batch_size", "8", "--log_level", "warning"],
            model=model,
        )
    assert "max_seq_length 100000 is more than the model's 128 positions: using 128" in caplog.text
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_a_transformers_run_glue_flag_is_one_line_naming_it(tmp_path):
    with pytest.raises(
        SystemExit, match=r"^error \(arguments\): unknown argument --use_fast_tokenizer: transformers 5 "
    ):
        glue_main(tmp_path, "--task_name", "sst2", "--use_fast_tokenizer", "False")


def test_an_unknown_flag_is_one_line_naming_it(tmp_path):
    with pytest.raises(
        SystemExit,
        match=r"^error \(arguments\): unknown argument --max_seq_lenght "
        r"\(did you mean --max_seq_length\?\); see --help$",
    ):
        glue_main(tmp_path, "--task_name", "sst2", "--max_seq_lenght", "64")


def test_a_mistyped_model_folder_is_no_such_folder(tmp_path, monkeypatch):
    (tmp_path / "my-roberta").mkdir()
    monkeypatch.chdir(tmp_path)
    data = sst2_csv(tmp_path / "data.csv", SST2_ROWS[:8])
    with pytest.raises(SystemExit, match=r"^error \(arguments\): --model_name_or_path ./my-robertaa: no such folder$"):
        glue_main(tmp_path, "--train_file", str(data), "--do_train", model=["--model_name_or_path", "./my-robertaa"])


def test_a_glue_task_without_network_says_how_to_pass_local_files(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(SystemExit) as error:
        glue_main(tmp_path, "--task_name", "sst2", "--do_train")
    message = str(error.value)
    assert message.startswith("error (data): cannot load the Hub dataset nyu-mll/glue (sst2): ConnectionError")
    assert "--data_dir" in message and "--train_file" in message and "\n" not in message


def test_fp16_on_cpu_warns_and_the_card_says_fp32(tmp_path, caplog):
    data = sst2_csv(tmp_path / "data.csv", SST2_ROWS[:8])
    with caplog.at_level(logging.WARNING, logger="posformers"):
        glue_main(tmp_path, "--train_file", str(data), "--do_train", "--max_steps", "1", "--fp16")
    assert "--fp16 needs a GPU" in caplog.text
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert "Native AMP" not in card


def test_a_card_takes_the_license_of_the_weights(tmp_path):
    data = sst2_csv(tmp_path / "data.csv", SST2_ROWS[:8])

    def card_license(name: str, *args: str, model: list[str] | None = None) -> str:
        glue_main(tmp_path / name, "--train_file", str(data), "--do_train", "--max_steps", "1", *args, model=model)
        return card_metadata(tmp_path / name / "out")["license"]

    assert card_license("scratch") == "apache-2.0"  # trained from scratch: the default (--license's help)
    assert card_license("chosen", "--license", "cc-by-4.0") == "cc-by-4.0"
    base = tmp_path / "scratch" / "out"
    (base / "README.md").write_text("---\nlicense: mit\n---\n# base\n", encoding="utf-8")
    assert card_license("finetuned", model=["--model_name_or_path", str(base)]) == "mit"
    (base / "README.md").unlink()
    assert card_license("unknown", model=["--model_name_or_path", str(base)]) == "unknown"  # not invented


def test_help_lists_the_scripts_own_options_first_and_help_all_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        run_glue.main(["--help"])
    assert done.value.code == 0
    short = capsys.readouterr().out
    titles = ["Which model, config and tokenizer", "What data to train and evaluate on", "Script options"]
    positions = [short.index(title) for title in titles]
    assert positions == sorted(positions), positions  # a group per dataclass, model first
    assert "--task_name" in short and "--eval_strategy" in short and "--help_all" in short
    assert "--adam_beta1" not in short and len(short.splitlines()) < 200
    with pytest.raises(SystemExit) as done:
        run_glue.main(["--help_all"])
    assert done.value.code == 0 and "--adam_beta1" in capsys.readouterr().out


def test_a_glue_model_answers_with_the_tasks_label_names(tmp_path):
    """SST-2 through the pipeline answered '1': the fine-tuned model now carries GLUE's class names, while the
    files it read and the submission it writes keep GLUE's numbers."""
    from transformers import pipeline

    glue_main(
        tmp_path,
        *["--task_name", "sst2", "--train_file", str(GLUE_DIR / "sst2" / "train.tsv"), "--max_train_samples", "16"],
        *["--test_file", str(GLUE_DIR / "sst2" / "dev.tsv"), "--max_predict_samples", "4"],
        *["--do_train", "--do_predict", "--max_steps", "1"],
    )
    classify = pipeline("text-classification", model=str(tmp_path / "out"))
    assert classify("a gorgeous , witty , seductive movie .")[0]["label"] in {"negative", "positive"}
    submission = (tmp_path / "out" / "SST-2.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction" and {line.split("\t")[1] for line in submission[1:]} <= {"0", "1"}
