"""`--bf16` without a GPU that computes in bfloat16 (finetune/arguments.py's check_bf16_on_cpu): where there is no
GPU the scripts train on the CPU in bfloat16; a GPU without bf16 gets one line saying what to pass, not
TrainingArguments' traceback."""

import functools
import logging

import pytest
import torch
import transformers
from conftest import GLUE_DIR, QUIET, tiny_model_args

import posformers
from posformers.finetune import run_glue

SST2 = ["--task_name", "sst2", "--train_file", str(GLUE_DIR / "sst2" / "train.tsv"), "--max_train_samples", "16"]


def glue_main(tmp_path, *args: str) -> dict:
    return run_glue.main([*tiny_model_args(), *QUIET, "--output_dir", str(tmp_path / "out"), *SST2, *args])


def test_bf16_trains_in_bfloat16_where_there_is_no_gpu(tmp_path, monkeypatch, caplog):
    autocast = []  # the autocast dtype each forward pass of the model ran under
    forward = posformers.RoFormerForSequenceClassification.forward

    @functools.wraps(forward)  # Trainer keeps the dataset columns that forward's signature names
    def recording(self, *args, **kwargs):
        device = next(self.parameters()).device.type
        autocast.append(torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(posformers.RoFormerForSequenceClassification, "forward", recording)
    with caplog.at_level(logging.WARNING, logger="posformers"):
        metrics = glue_main(tmp_path, "--do_train", "--max_steps", "2", "--bf16")
    assert metrics["train_samples"] == 16 and autocast == [torch.bfloat16, torch.bfloat16]
    args = torch.load(tmp_path / "out" / "training_args.bin", weights_only=False)
    assert args.bf16 and args.mixed_precision == "bf16"
    if not torch.accelerator.is_available():
        assert args.use_cpu and "--bf16 without a GPU: training on the CPU in bfloat16" in caplog.text


def test_bf16_on_a_gpu_without_it_is_one_line_saying_what_to_pass(tmp_path, monkeypatch):
    # As on a GPU before NVIDIA Ampere: TrainingArguments finds no bf16 GPU, and there is an accelerator.
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    with pytest.raises(
        SystemExit,
        match=r"^error \(arguments\): --bf16 needs a GPU that computes in bfloat16 \(NVIDIA Ampere or newer\), and "
        r"this one does not: pass --fp16 instead, or --use_cpu --bf16 to train on the CPU$",
    ):
        glue_main(tmp_path, "--do_train", "--max_steps", "1", "--bf16")
