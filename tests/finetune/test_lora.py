"""posformers-glue and posformers-qa with --lora_*: they train adapters on a pretrained model, save peft's adapter
files, and LOAD_ADAPTER.md's code loads the run's model back (its evaluation reproduced)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import QUIET, TOKENIZER_DIR, tiny_model_args
from helpers.data import DATA_DIR
from helpers.modeling import tiny_config
from safetensors.torch import load_file
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

import posformers
from posformers.finetune import run_glue, run_qa

MASKED_LM = {
    "posformers-roformer": (posformers.RoFormerConfig, posformers.RoFormerForMaskedLM),
    "posformers-deberta": (posformers.DebertaConfig, posformers.DebertaForMaskedLM),
    "littlebird": (posformers.LittleBirdConfig, posformers.LittleBirdForMaskedLM),
}


def pretrained(folder: Path, model_type: str) -> Path:
    """A tiny masked-LM checkpoint with the bert-base-uncased tokenizer: the base model the adapters adapt."""
    config_class, model_class = MASKED_LM[model_type]
    torch.manual_seed(0)
    model_class(tiny_config(config_class, vocab_size=30522)).save_pretrained(folder)  # the uncased vocabulary
    AutoTokenizer.from_pretrained(TOKENIZER_DIR).save_pretrained(folder)
    return folder


def loading_code(output_dir: Path) -> list[str]:
    """The Python blocks of the run's LOAD_ADAPTER.md."""
    return re.findall(r"```python\n(.*?)```", (output_dir / "LOAD_ADAPTER.md").read_text(), flags=re.S)


def run_note(code: str, cwd: Path):
    """Run one block of LOAD_ADAPTER.md as a user would (from `cwd`) and return the `model` it builds."""
    namespace: dict = {}
    exec(compile(code, "LOAD_ADAPTER.md", "exec"), namespace)
    return namespace["model"].eval()


def assert_adapter_folder(output_dir: Path) -> dict:
    assert (output_dir / "adapter_model.safetensors").is_file()
    assert not (output_dir / "model.safetensors").exists(), "only the adapter is saved"
    return json.loads((output_dir / "adapter_config.json").read_text())


@pytest.mark.parametrize("model_type", list(MASKED_LM))
def test_glue_lora_trains_an_adapter_that_loads_back_as_the_note_says(tmp_path, glue_dir, model_type):
    base = pretrained(tmp_path / "base", model_type)
    rows = (glue_dir / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(rows[:161]) + "\n")
    (tmp_path / "dev.tsv").write_text("\n".join([rows[0], *rows[20001:20049]]) + "\n")
    output_dir = tmp_path / "out"
    results = run_glue.main(
        [
            *["--model_name_or_path", str(base), "--task_name", "sst2", *QUIET, "--output_dir", str(output_dir)],
            *["--train_file", str(tmp_path / "train.tsv"), "--validation_file", str(tmp_path / "dev.tsv")],
            *["--do_train", "--do_eval", "--max_steps", "10", "--learning_rate", "1e-2", "--seed", "0"],
            *["--per_device_train_batch_size", "16", "--lora_r", "4", "--lora_target_modules", "all-linear"],
            # Reentrant checkpointing of a frozen model: Trainer must make the embeddings' output require grad.
            *["--activation_checkpointing", "--activation_checkpointing_kwargs", '{"use_reentrant": true}'],
        ]
    )
    adapter = assert_adapter_folder(output_dir)
    weights = load_file(output_dir / "adapter_model.safetensors")
    lora_b = {key: value for key, value in weights.items() if ".lora_B." in key}
    assert lora_b and all(value.abs().sum() > 0 for value in lora_b.values()), "B starts at zero: training moved it"
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and adapter["base_model_name_or_path"] == str(base)
    assert adapter["modules_to_save"] and "classifier" in adapter["modules_to_save"]

    one_step, merged_code = loading_code(output_dir)
    with_adapter, merged = run_note(one_step, tmp_path), run_note(merged_code, tmp_path)
    assert with_adapter.config.id2label == {0: "negative", 1: "positive"}  # the run's label names, passed by the note
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    sentences = [row.rsplit("\t", 1) for row in rows[20001:20049]]
    batch = tokenizer([text for text, _ in sentences], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = with_adapter(**batch).logits
        assert (logits - merged(**batch).logits).abs().max() <= 1e-5
    labels = torch.tensor([int(label) for _, label in sentences])
    accuracy = (logits.argmax(-1) == labels).float().mean().item()
    assert accuracy == pytest.approx(results["eval_accuracy"], abs=1e-6)


def test_qa_lora_trains_an_adapter_that_loads_back(tmp_path):
    base = pretrained(tmp_path / "base", "posformers-deberta")
    squad = json.loads((DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json").read_text())
    paragraphs = squad["data"][0]["paragraphs"][:3]
    (tmp_path / "train.json").write_text(
        json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]})
    )
    output_dir = tmp_path / "out"
    results = run_qa.main(
        [
            *["--model_name_or_path", str(base), *QUIET, "--output_dir", str(output_dir)],
            *["--train_file", str(tmp_path / "train.json"), "--validation_file", str(tmp_path / "train.json")],
            *["--do_train", "--do_eval", "--max_steps", "4", "--max_seq_length", "256", "--lora_r", "2"],
        ]
    )
    assert "eval_f1" in results
    adapter = assert_adapter_folder(output_dir)
    assert adapter["modules_to_save"] and "qa_outputs" in adapter["modules_to_save"]
    model = run_note(loading_code(output_dir)[0], tmp_path)
    reference = AutoModelForQuestionAnswering.from_pretrained(base).eval()
    inputs = AutoTokenizer.from_pretrained(output_dir)(
        "Which team won?", "The Denver Broncos won.", return_tensors="pt"
    )
    with torch.no_grad():
        difference = (model(**inputs).start_logits - reference(**inputs).start_logits).abs().max()
    assert difference > 1e-4, "the loaded model should be the trained adapter and head, not the base"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lora_alpha", "16"], "--lora_alpha needs --lora_r"),
        (["--lora_target_modules", "all-linear"], "--lora_target_modules needs --lora_r"),
        (["--lora_r", "0"], "--lora_r must be a positive rank, got 0"),
        (["--lora_r", "4", "--lora_dropout", "1.5"], r"--lora_dropout must be in \[0, 1\), got 1.5"),
    ],
)
def test_bad_lora_flags_stop_with_one_line(tmp_path, glue_dir, flags, message):
    argv = ["--task_name", "sst2", "--data_dir", str(glue_dir / "sst2"), "--output_dir", str(tmp_path), *flags]
    with pytest.raises(SystemExit, match=rf"^error \(arguments\): {message}") as error:
        run_glue.main(argv)
    assert "\n" not in str(error.value)


def test_lora_on_a_model_from_scratch_is_refused(tmp_path, glue_dir):
    argv = [*tiny_model_args(), "--task_name", "sst2", "--data_dir", str(glue_dir / "sst2"), "--do_train"]
    with pytest.raises(SystemExit, match=r"^error \(arguments\): --lora_r needs --model_name_or_path: adapters"):
        run_glue.main([*argv, "--output_dir", str(tmp_path / "out"), "--lora_r", "4"])
    assert not (tmp_path / "out" / "LOAD_ADAPTER.md").exists()
