"""The end of every fine-tuning script (finetune/reporting.py finish_run): training_curves.png and a model card whose
model-index names the task, the dataset and the evaluated metrics, for posformers-glue, -qa, -pretrain, -ner and
-mc; a note instead of a crash without matplotlib; the pushed card is the written one."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import QUIET, tiny_model_args
from helpers import python_env, run_python
from helpers.data import DATA_DIR

from posformers.finetune import run_glue, run_mc, run_ner, run_pretrain, run_qa
from posformers.finetune.reporting import curve_metrics, plot_training_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = ["--max_steps", "4", "--eval_strategy", "steps", "--eval_steps", "2", "--logging_steps", "1"]


def glue_args(tmp_path):
    data = ["--task_name", "sst2", "--train_file", str(DATA_DIR / "glue" / "sst2" / "dev.tsv")]
    data += ["--validation_file", str(DATA_DIR / "glue" / "sst2" / "dev.tsv"), "--max_eval_samples", "32"]
    return run_glue.main, [*tiny_model_args(), *data, "--max_train_samples", "32"]


def qa_args(tmp_path):
    sample = str(DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json")
    data = ["--train_file", sample, "--validation_file", sample, "--max_seq_length", "128", "--doc_stride", "32"]
    return run_qa.main, [*tiny_model_args(), *data, "--max_train_samples", "16", "--max_eval_samples", "16"]


def pretrain_args(tmp_path, corpus):
    data = ["--train_file", str(corpus["train"]), "--validation_file", str(corpus["validation"])]
    data += ["--max_seq_length", "32", "--max_eval_samples", "20", "--max_train_samples", "64"]
    return run_pretrain.main, ["--objective", "mlm", *tiny_model_args(), *data]


def ner_args(tmp_path):
    conll = DATA_DIR / "ner" / "conll2003"
    data = ["--train_file", str(conll / "train.txt"), "--validation_file", str(conll / "valid.txt")]
    return run_ner.main, [*tiny_model_args(), *data, "--max_train_samples", "32", "--max_eval_samples", "20"]


def mc_args(tmp_path):
    csqa = DATA_DIR / "mc" / "commonsenseqa"
    data = [
        "--train_file",
        str(csqa / "train_rand_split.jsonl"),
        "--validation_file",
        str(csqa / "dev_rand_split.jsonl"),
    ]
    return run_mc.main, [*tiny_model_args(), *data, "--max_train_samples", "16", "--max_eval_samples", "16"]


# script: (arguments, model-index task type, dataset name in the card, metrics the model-index must carry)
SCRIPTS = {
    "glue": (glue_args, "text-classification", "GLUE SST2", ["accuracy"]),
    "qa": (qa_args, "question-answering", "custom data", ["exact_match", "f1"]),
    "pretrain": (pretrain_args, "fill-mask", "custom data", ["mlm_accuracy", "mlm_perplexity"]),
    "ner": (ner_args, "token-classification", "train.txt, valid.txt", ["precision", "recall", "f1", "accuracy"]),
    "mc": (mc_args, "multiple-choice", "train_rand_split.jsonl, dev_rand_split.jsonl", ["accuracy"]),
}


def front_matter(readme: Path) -> tuple[dict, str]:
    _, header, body = readme.read_text(encoding="utf-8").split("---\n", 2)
    return yaml.safe_load(header), body


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_every_script_writes_curves_and_a_card_with_a_model_index(script, tmp_path, corpus):
    make_args, task, dataset, metric_names = SCRIPTS[script]
    main, args = make_args(tmp_path, corpus) if script == "pretrain" else make_args(tmp_path)
    out = tmp_path / "out"
    results = main([*args, *QUIET, *STEPS, "--output_dir", str(out), "--do_train", "--do_eval"])

    assert (out / "training_curves.png").read_bytes().startswith(PNG_MAGIC)
    metadata, body = front_matter(out / "README.md")
    (entry,) = metadata["model-index"]
    (result,) = entry["results"]
    assert result["task"]["type"] == task
    assert result["dataset"]["name"] == dataset
    values = {metric["type"]: metric["value"] for metric in result["metrics"]}
    for name in metric_names:
        assert values[name] == pytest.approx(results[f"eval_{name}"]), name
    assert "loss" not in values and not any("runtime" in name for name in values)
    # A table a person reads, and the curves
    assert "| split | metric | value |" in body
    assert f"| evaluation | {metric_names[0]} | {results[f'eval_{metric_names[0]}']:.4f} |" in body
    assert "![loss and evaluation metrics against the step](training_curves.png)" in body
    assert metadata["library_name"] == "transformers" and "generated_from_trainer" in metadata["tags"]
    # Trainer's "Training results": a row per evaluation (steps 2 and 4). transformers reads the first log entry
    # holding train_runtime as the end of training, so only the final summary may hold it.
    results_table = body.split("### Training results", 1)[1].split("###", 1)[0]
    steps = [row.split("|")[3].strip() for row in results_table.strip().splitlines()[2:]]
    assert steps == ["2", "4"], results_table


def test_curves_pick_the_quality_metrics(tmp_path):
    history = [
        {"loss": 2.0, "step": 1},
        {"loss": 1.5, "step": 2},
        {"eval_loss": 1.4, "eval_f1": 0.3, "eval_PER_f1": 0.1, "eval_runtime": 0.5, "eval_samples_per_second": 9.0,
         "eval_accuracy": 0.8, "eval_PER_number": 14, "step": 2},
        {"loss": 1.0, "step": 3},
        {"eval_loss": 1.1, "eval_f1": 0.5, "eval_accuracy": 0.85, "step": 4},
    ]  # fmt: skip
    assert curve_metrics(history) == ["eval_f1", "eval_accuracy"]
    path = plot_training_curves(history, tmp_path / "curves.png")
    assert path.read_bytes().startswith(PNG_MAGIC)
    assert plot_training_curves([{"train_runtime": 1.0}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_without_matplotlib_a_note_instead_of_a_crash(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if it were not installed
    main, args = ner_args(tmp_path)
    out = tmp_path / "out"
    main(
        [
            *args,
            *QUIET,
            "--log_level",
            "warning",
            "--output_dir",
            str(out),
            "--do_train",
            "--do_eval",
            "--max_steps",
            "2",
        ]
    )
    assert not (out / "training_curves.png").exists()
    notes = [r.message for r in caplog.records if "matplotlib is not installed" in r.message]
    assert notes == [
        "matplotlib is not installed: no training_curves.png (the plots extra: "
        "pip install -e '.[plots]' in a clone, or pip install 'posformers[plots]' once released)"
    ]
    metadata, body = front_matter(out / "README.md")
    assert metadata["model-index"][0]["results"][0]["task"]["type"] == "token-classification"
    assert "training_curves.png" not in body


PUSH = """
from posformers.finetune import run_mc, run_ner
for script, argv in ARGS["runs"].items():
    {"ner": run_ner, "mc": run_mc}[script].main(argv)
print(json.dumps({"done": True}))
"""


@pytest.fixture(scope="module")
def pushed_runs(tmp_path_factory, hub_server):
    """posformers-ner and posformers-mc with --push_to_hub, one after the other in one child (HF_ENDPOINT is read
    at import): {script: (output folder, repo)}."""
    work = tmp_path_factory.mktemp("push")
    runs, argvs = {}, {}
    for script in ("ner", "mc"):
        _, args = SCRIPTS[script][0](work / script)
        out, repo = work / script / "out", f"user/tiny-{script}"
        argvs[script] = [*args, *QUIET, "--output_dir", str(out), "--do_train", "--do_eval", "--max_steps", "2"]
        argvs[script] += ["--push_to_hub", "--hub_model_id", repo]
        runs[script] = out, repo
    run_python(PUSH, {"runs": argvs}, env=python_env(work / "hf-home", endpoint=hub_server.url), cwd=work)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("script", ["ner", "mc"])
def test_push_to_hub_uploads_the_written_card(script, pushed_runs, hub_server):
    out, repo = pushed_runs[script]
    files = set(hub_server.list_files(repo))
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "training_curves.png"} <= files, files
    assert hub_server.read_file(repo, "README.md") == (out / "README.md").read_bytes()
    metadata, _ = front_matter(out / "README.md")
    assert metadata["model-index"][0]["results"][0]["task"]["type"] == SCRIPTS[script][1]
    pushed_config = json.loads(hub_server.read_file(repo, "config.json"))
    assert pushed_config["architectures"][0].endswith(
        "ForTokenClassification" if script == "ner" else "ForMultipleChoice"
    )


def test_a_lora_run_card_keeps_peft_metadata_and_the_model_index(tmp_path):
    # A local base model (not a Hub id): the card names it in the text, PEFT adds library_name and base_model
    main, args = glue_args(tmp_path)
    main([*args, *QUIET, "--output_dir", str(tmp_path / "base"), "--do_train", "--max_steps", "1"])
    data = args[args.index("--task_name") :]
    lora = ["--lora_r", "4", "--lora_target_modules", "all-linear"]
    out = tmp_path / "lora"
    results = main(["--model_name_or_path", str(tmp_path / "base"), *data, *QUIET, *lora, "--output_dir", str(out),
                    "--do_train", "--do_eval", "--max_steps", "2"])  # fmt: skip
    assert (out / "adapter_model.safetensors").is_file()
    metadata, body = front_matter(out / "README.md")
    assert metadata["library_name"] == "peft" and metadata["base_model"] == str(tmp_path / "base")
    (result,) = metadata["model-index"][0]["results"]
    assert result["metrics"] == [
        {"type": "accuracy", "value": pytest.approx(results["eval_accuracy"]), "name": "Accuracy"}
    ]
    assert f"This model is a fine-tuned version of `{tmp_path / 'base'}` on the GLUE SST2 dataset." in body
