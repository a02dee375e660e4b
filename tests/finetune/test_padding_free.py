"""--padding_free of posformers-glue, posformers-qa and posformers-pretrain (finetune/padding_free.py).

A run fed flattened batches (`--padding_free true`) must train and evaluate as the padded run that computes on its
padding (`--padding_free false`, unpad_inputs="never"): the same loss at every step and the same metrics, on real
SST-2, MRPC (sentence pairs: token_type_ids) and SQuAD data and on MLM pre-training. The run-time unpad_inputs never
reaches a saved config.json.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import GLUE_DIR, QUIET, TOKENIZER_DIR, tiny_model_args
from helpers.data import DATA_DIR
from transformers import (
    AutoConfig,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    TrainingArguments,
)

from posformers.finetune import padding_free, pretrain_data, run_glue, run_pretrain, run_qa
from posformers.finetune.arguments import RunArguments
from posformers.finetune.errors import ArgumentError
from posformers.finetune.padding_free import FlatteningCollator, flatten_batch, plan_padding_free
from posformers.finetune.pretrain_data import MaskingCollator
from posformers.roformer import modeling_roformer

# Dropout off: the two layouts draw dropout masks of different shapes.
TINY = (
    "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,max_position_embeddings=256,"
    "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
)
STEPS = 20
TOLERANCE = 1e-5
SQUAD_DEV = DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json"
# What differs between two runs that compute the same thing.
TIMING = ("runtime", "per_second", "preparation_time")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def sentence_pairs(tokenizer, count: int = 6) -> list[dict]:
    """Features of the first MRPC training pairs, with their labels."""
    lines = (GLUE_DIR / "mrpc" / "train.tsv").read_text(encoding="utf-8-sig").splitlines()[1 : count + 1]
    rows = [line.split("\t") for line in lines]
    encoded = tokenizer([row[3] for row in rows], [row[4] for row in rows], truncation=True, max_length=64)
    return [{**{key: encoded[key][i] for key in encoded}, "labels": int(row[0])} for i, row in enumerate(rows)]


class ForwardSpy:
    """Records, for every RoFormerModel forward, the config's unpad_inputs and whether the batch came flattened."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, bool, int]] = []
        forward = modeling_roformer.RoFormerModel.forward

        def spy(model, input_ids=None, *args, **kwargs):
            flattened = "cu_seq_lens_q" in kwargs and kwargs.get("position_ids") is not None
            self.calls.append((model.config.unpad_inputs, flattened, input_ids.shape[0]))
            return forward(model, input_ids, *args, **kwargs)

        monkeypatch.setattr(modeling_roformer.RoFormerModel, "forward", spy)

    def layouts(self) -> set[tuple[str, bool]]:
        return {(mode, flattened) for mode, flattened, _ in self.calls}


def log_losses(output_dir: Path) -> np.ndarray:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return np.array([entry["loss"] for entry in history if "loss" in entry])


def assert_same_run(padded: tuple[dict, Path], flattened: tuple[dict, Path]) -> None:
    """Per-step training losses within TOLERANCE, evaluation metrics equal (the loss within TOLERANCE)."""
    (padded_metrics, padded_dir), (flat_metrics, flat_dir) = padded, flattened
    padded_losses, flat_losses = log_losses(padded_dir), log_losses(flat_dir)
    assert len(padded_losses) == len(flat_losses) == STEPS
    assert np.abs(padded_losses - flat_losses).max() <= TOLERANCE
    evaluated = {key for key in padded_metrics if key.startswith("eval_") and not key.endswith(TIMING)}
    assert evaluated == {key for key in flat_metrics if key.startswith("eval_") and not key.endswith(TIMING)}
    assert len(evaluated) >= 3
    for key in evaluated:
        if key == "eval_loss":
            assert abs(padded_metrics[key] - flat_metrics[key]) <= TOLERANCE
        else:
            assert padded_metrics[key] == flat_metrics[key], key


def saved_unpad_inputs(folder: Path) -> str:
    return AutoConfig.from_pretrained(folder).unpad_inputs


# ---------------------------------------------------------------------------------------------------------------------
# The collator
# ---------------------------------------------------------------------------------------------------------------------


def test_flattened_batch_is_transformers_format_with_every_key(tokenizer):
    features = sentence_pairs(tokenizer)
    padded = DataCollatorWithPadding(tokenizer)(features)
    flat = flatten_batch(dict(padded), ("input_ids", "token_type_ids"))
    reference = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": feature["input_ids"]} for feature in features]
    )
    for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(flat[key], reference[key].to(flat[key].dtype)), key
    assert flat["max_length_q"] == flat["max_length_k"] == reference["max_length_q"]
    # what transformers' collator drops: the segments of each pair, and one label per sequence
    assert flat["token_type_ids"].tolist() == [[t for feature in features for t in feature["token_type_ids"]]]
    assert 0 < int(flat["token_type_ids"].sum()) < flat["token_type_ids"].numel()
    assert flat["labels"].tolist() == [feature["labels"] for feature in features]
    assert "attention_mask" not in flat


def test_flattening_refuses_left_padding(tokenizer):
    features = sentence_pairs(tokenizer, 3)
    left = DataCollatorWithPadding(tokenizer)(features)
    left = {key: value.flip(-1) if value.dim() == 2 else value for key, value in left.items()}
    with pytest.raises(ValueError, match="attention_mask: a flattened batch is built from right-padded rows"):
        flatten_batch(left, ("input_ids", "token_type_ids"))


def test_mlm_masks_the_same_tokens_in_both_layouts(tokenizer):
    """A seeded MaskingCollator selects and replaces the same tokens whether its batch is then flattened or not."""
    texts = [line.split("\t")[0] for line in (GLUE_DIR / "sst2" / "dev.tsv").read_text().splitlines()[1:9]]
    features = [{"input_ids": ids} for ids in tokenizer(texts)["input_ids"]]
    padded = MaskingCollator(tokenizer, seed=5)(features)
    flat = FlatteningCollator(MaskingCollator(tokenizer, seed=5), run_pretrain.MLM_TOKEN_KEYS)(features)
    real = padded["attention_mask"].bool()
    assert torch.equal(flat["input_ids"][0], padded["input_ids"][real])
    assert torch.equal(flat["labels"][0], padded["labels"][real])
    assert int((flat["labels"] != -100).sum()) > len(features)  # something was masked in every sequence


# ---------------------------------------------------------------------------------------------------------------------
# Fine-tuning and pre-training: flattened == padded
# ---------------------------------------------------------------------------------------------------------------------


def glue_run(tmp_path: Path, task: str, mode: str) -> tuple[dict, Path]:
    output_dir = tmp_path / mode
    metrics = run_glue.main(
        [
            *tiny_model_args(overrides=TINY), *QUIET, "--output_dir", str(output_dir), "--padding_free", mode,
            "--task_name", task, "--data_dir", str(GLUE_DIR / task), "--do_train", "--do_eval",
            "--max_steps", str(STEPS), "--logging_steps", "1", "--max_eval_samples", "40",
            "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--learning_rate", "5e-3",
            "--seed", "3",
        ]
    )  # fmt: skip
    return metrics, output_dir


@pytest.mark.parametrize("task", ["sst2", "mrpc"])
def test_glue_trains_the_same_flattened_and_padded(task, tmp_path, monkeypatch):
    spy = ForwardSpy(monkeypatch)
    padded = glue_run(tmp_path, task, "false")
    assert spy.layouts() == {("never", False)}
    spy.calls.clear()
    flattened = glue_run(tmp_path, task, "true")
    assert spy.layouts() == {("auto", True)} and {rows for *_, rows in spy.calls} == {1}
    assert_same_run(padded, flattened)
    assert saved_unpad_inputs(tmp_path / "false") == saved_unpad_inputs(tmp_path / "true") == "auto"


def qa_run(tmp_path: Path, mode: str) -> tuple[dict, Path]:
    output_dir = tmp_path / mode
    metrics = run_qa.main(
        [
            *tiny_model_args(overrides=TINY), *QUIET, "--output_dir", str(output_dir), "--padding_free", mode,
            "--train_file", str(SQUAD_DEV), "--validation_file", str(SQUAD_DEV), "--max_train_samples", "40",
            "--max_eval_samples", "24", "--max_seq_length", "192", "--doc_stride", "64", "--do_train", "--do_eval",
            "--max_steps", str(STEPS), "--logging_steps", "1", "--per_device_train_batch_size", "8",
            "--per_device_eval_batch_size", "16", "--learning_rate", "1e-3", "--seed", "3",
        ]
    )  # fmt: skip
    return metrics, output_dir


def test_qa_trains_and_answers_the_same_flattened_and_padded(tmp_path, monkeypatch):
    spy = ForwardSpy(monkeypatch)
    padded = qa_run(tmp_path, "false")
    assert spy.layouts() == {("never", False)}
    spy.calls.clear()
    flattened = qa_run(tmp_path, "true")
    assert spy.layouts() == {("auto", True)}
    assert_same_run(padded, flattened)
    assert {"eval_exact_match", "eval_f1"} <= set(flattened[0])
    # the answers themselves, not only their scores
    assert (tmp_path / "false" / "eval_predictions.json").read_text() == (
        tmp_path / "true" / "eval_predictions.json"
    ).read_text()
    assert saved_unpad_inputs(tmp_path / "true") == "auto"


def mlm_run(tmp_path: Path, corpus: dict, mode: str) -> tuple[dict, Path]:
    output_dir = tmp_path / mode
    metrics = run_pretrain.main(
        [
            "--model_type", "posformers-roformer", "--config_overrides", TINY, "--tokenizer_name", str(TOKENIZER_DIR),
            *QUIET, "--output_dir", str(output_dir), "--padding_free", mode, "--train_file", str(corpus["train"]),
            "--validation_file", str(corpus["validation"]), "--max_seq_length", "32", "--max_train_samples", "200",
            "--max_eval_samples", "20", "--do_train", "--do_eval", "--max_steps", str(STEPS), "--logging_steps", "1",
            "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8", "--learning_rate", "1e-3",
            "--seed", "3",
        ]
    )  # fmt: skip
    return metrics, output_dir


def test_mlm_pretraining_is_the_same_flattened_and_padded(tmp_path, corpus, monkeypatch):
    # One document per packing batch: each document ends in a short chunk, so batches hold sequences of many lengths.
    monkeypatch.setattr(pretrain_data, "PACK_BATCH_SIZE", 1)
    spy = ForwardSpy(monkeypatch)
    padded = mlm_run(tmp_path, corpus, "false")
    assert spy.layouts() == {("never", False)}
    spy.calls.clear()
    flattened = mlm_run(tmp_path, corpus, "true")
    assert spy.layouts() == {("auto", True)}
    assert_same_run(padded, flattened)
    assert saved_unpad_inputs(tmp_path / "true") == "auto"


# ---------------------------------------------------------------------------------------------------------------------
# The run-time setting and the saved config
# ---------------------------------------------------------------------------------------------------------------------


def test_saved_configs_keep_the_models_own_unpad_inputs(tmp_path, monkeypatch):
    """A model configured with unpad_inputs="always" trains with "never" under --padding_free false, and its
    checkpoints and final folder still say "always"."""
    spy = ForwardSpy(monkeypatch)
    output_dir = tmp_path / "out"
    run_glue.main(
        [
            *tiny_model_args(overrides=TINY + ",unpad_inputs=always"), "--report_to", "none", "--disable_tqdm", "True",
            "--log_level", "error", "--output_dir", str(output_dir), "--padding_free", "false", "--task_name", "sst2",
            "--data_dir", str(GLUE_DIR / "sst2"), "--do_train", "--do_eval", "--max_steps", "2", "--save_steps", "1",
            "--max_eval_samples", "8", "--per_device_train_batch_size", "4",
        ]
    )  # fmt: skip
    assert spy.layouts() == {("never", False)}
    for folder in (output_dir / "checkpoint-1", output_dir / "checkpoint-2", output_dir):
        assert saved_unpad_inputs(folder) == "always", folder


def tiny_roformer(head):
    return head(AutoConfig.for_model("posformers-roformer", hidden_size=32, num_hidden_layers=1, num_attention_heads=2))


def test_auto_flattens_for_a_model_that_accepts_it_else_unpads_internally(tokenizer):
    model = tiny_roformer(modeling_roformer.RoFormerForSequenceClassification)
    plan = plan_padding_free("auto", model)
    assert plan.flatten and plan.unpad_inputs is None
    assert isinstance(plan.collator(DataCollatorWithPadding(tokenizer)), FlatteningCollator)
    plan = plan_padding_free("auto", model, pad_to_max_length=True)
    assert not plan.flatten and plan.unpad_inputs == "auto"
    plan = plan_padding_free("auto", model, flattenable=False, reason="inserted padding")
    assert not plan.flatten and plan.unpad_inputs == "auto"
    plan = plan_padding_free("false", model)
    assert not plan.flatten and plan.unpad_inputs == "never"
    bert = BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2))
    plan = plan_padding_free("auto", bert)  # a model without the contract: padded batches, left as they were
    assert not plan.flatten and plan.unpad_inputs is None and plan.configs == []


def test_flattened_batches_are_not_dispatched(tmp_path):
    """Accelerate dispatches an iterable dataset's batches by slicing them along dim 0, which a flattened batch does
    not have: flattening turns dispatching off, unless the user asked for it (then auto keeps padded batches)."""
    model = tiny_roformer(modeling_roformer.RoFormerForMaskedLM)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert args.accelerator_config.dispatch_batches is None
    assert plan_padding_free("auto", model, args).flatten
    assert args.accelerator_config.dispatch_batches is False
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", accelerator_config={"dispatch_batches": True})
    plan = plan_padding_free("auto", model, args)
    assert not plan.flatten and plan.unpad_inputs == "auto"
    with pytest.raises(ArgumentError, match=r"--padding_free true and accelerator_config dispatch_batches=True"):
        plan_padding_free("true", model, args)


# ---------------------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------------------


def test_true_is_refused_for_a_model_without_flattened_batches(tmp_path):
    bert = ["--model_type", "bert", "--config_overrides", TINY, "--tokenizer_name", str(TOKENIZER_DIR)]
    with pytest.raises(SystemExit, match=r"--padding_free true: BertForSequenceClassification does not accept"):
        run_glue.main(
            [*bert, *QUIET, "--output_dir", str(tmp_path / "out"), "--padding_free", "true", "--task_name", "sst2",
             "--data_dir", str(GLUE_DIR / "sst2"), "--do_train", "--max_steps", "1"]
        )  # fmt: skip
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_true_with_pad_to_max_length_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--padding_free true and --pad_to_max_length contradict each other"):
        run_qa.main(
            [*tiny_model_args(overrides=TINY), *QUIET, "--output_dir", str(tmp_path / "out"), "--padding_free", "true",
             "--pad_to_max_length", "--train_file", str(SQUAD_DEV), "--max_train_samples", "2", "--do_train",
             "--max_steps", "1"]
        )  # fmt: skip


def test_true_is_refused_for_distillation_and_bad_values_are_named():
    model = tiny_roformer(modeling_roformer.RoFormerForMaskedLM)
    with pytest.raises(ArgumentError, match=r"--padding_free true: .*inserts padding"):
        plan_padding_free(
            "true", model, flattenable=False, reason="--objective distill inserts padding into the student's batches"
        )
    with pytest.raises(ArgumentError, match=r"--padding_free must be one of auto, true, false, got 'yes'"):
        RunArguments(padding_free="yes")
    with pytest.raises(ArgumentError, match=r"--padding_free must be one of"):
        padding_free.check_padding_free("always")
