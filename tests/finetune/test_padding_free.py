"""--padding_free of posformers-glue, posformers-qa and posformers-pretrain (finetune/padding_free.py).

A run fed flattened batches (`--padding_free true`) must train and evaluate as the padded run that computes on its
padding (`--padding_free false`, unpad_inputs="never"): the same loss at every step and the same metrics, on real
SST-2, MRPC (sentence pairs: token_type_ids) and SQuAD data and on MLM pre-training. The run-time unpad_inputs never
reaches a saved config.json.
"""

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import GLUE_DIR, QUIET, TOKENIZER_DIR, tiny_model_args
from helpers.data import DATA_DIR
from helpers.pretrain_corpus import TINY as TINY_MODELS
from transformers import (
    AutoConfig,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    TrainingArguments,
)

from posformers import modeling_deberta, modeling_littlebird, modeling_roformer
from posformers.finetune import padding_free, pretrain_data, run_glue, run_pretrain, run_qa
from posformers.finetune.arguments import RunArguments
from posformers.finetune.errors import ArgumentError
from posformers.finetune.padding_free import FlatteningCollator, flatten_batch, plan_padding_free
from posformers.finetune.pretrain_data import MaskingCollator, train_tokenizer

# Dropout off: the two layouts draw dropout masks of different shapes.
NO_DROPOUT = ",hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
TINY = {model_type: overrides + NO_DROPOUT for model_type, overrides in TINY_MODELS.items()}
BASE_MODELS = {
    "posformers-roformer": modeling_roformer.RoFormerModel,
    "posformers-deberta": modeling_deberta.DebertaModel,
    "littlebird": modeling_littlebird.LittleBirdModel,
}
ROFORMER = "posformers-roformer"
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
    """Records, for every forward of a model family's base model, the config's unpad_inputs, whether the batch came
    flattened and its number of rows."""

    def __init__(self, monkeypatch, model_type: str = ROFORMER):
        self.calls: list[tuple[str, bool, int]] = []
        base_model = BASE_MODELS[model_type]
        forward = base_model.forward

        def spy(model, input_ids=None, *args, **kwargs):
            # a head hands its base model the plan it made (`packing=`), a bare model gets the collator's keywords
            packing = kwargs.get("packing")
            flattened = packing.flattened if packing is not None else "cu_seq_lens_q" in kwargs
            flattened = flattened and kwargs.get("position_ids") is not None
            rows = (input_ids if input_ids is not None else kwargs["inputs_embeds"]).shape[0]
            self.calls.append((model.config.unpad_inputs, flattened, rows))
            return forward(model, input_ids, *args, **kwargs)

        monkeypatch.setattr(base_model, "forward", spy)

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
        if key.endswith(("loss", "perplexity")):  # float sums over the tokens, in another order
            assert flat_metrics[key] == pytest.approx(padded_metrics[key], rel=TOLERANCE, abs=TOLERANCE), key
        else:  # accuracies, F1, exact match: counts
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


def test_left_padding_flattens_alike_and_holes_are_refused(tokenizer):
    features = sentence_pairs(tokenizer, 4)
    right = flatten_batch(dict(DataCollatorWithPadding(tokenizer)(features)), ("input_ids", "token_type_ids"))
    tokenizer.padding_side = "left"
    try:
        left = DataCollatorWithPadding(tokenizer)(features)
    finally:
        tokenizer.padding_side = "right"
    assert not left["attention_mask"][:, 0].all()  # really left-padded
    flat = flatten_batch(dict(left), ("input_ids", "token_type_ids"))
    assert flat.keys() == right.keys()
    for key, value in flat.items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(right[key])), key
    holes = dict(left)
    holes["attention_mask"] = left["attention_mask"].clone()
    holes["attention_mask"][0, -2] = 0
    with pytest.raises(ValueError, match="attention_mask: a row has padding between its tokens"):
        flatten_batch(holes, ("input_ids", "token_type_ids"))


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


def padded_and_flattened(run, tmp_path: Path, monkeypatch, model_type: str = ROFORMER):
    """run(output_dir, padding_free) -> metrics, for --padding_free false and true; checks that the first computed on
    padded batches with unpad_inputs="never" and the second on flattened ones, and that both saved the model's own
    unpad_inputs. Returns ((metrics, output_dir), (metrics, output_dir))."""
    spy = ForwardSpy(monkeypatch, model_type)
    padded = run(tmp_path / "false", "false"), tmp_path / "false"
    assert spy.layouts() == {("never", False)}
    spy.calls.clear()
    flattened = run(tmp_path / "true", "true"), tmp_path / "true"
    assert spy.layouts() == {("auto", True)} and {rows for *_, rows in spy.calls} == {1}
    assert saved_unpad_inputs(tmp_path / "false") == saved_unpad_inputs(tmp_path / "true") == "auto"
    return padded, flattened


def run_args(output_dir: Path, padding_free: str, learning_rate: str = "5e-3") -> list[str]:
    return [
        *QUIET, "--output_dir", str(output_dir), "--padding_free", padding_free, "--do_train", "--do_eval",
        "--max_steps", str(STEPS), "--logging_steps", "1", "--per_device_train_batch_size", "8",
        "--per_device_eval_batch_size", "16", "--learning_rate", learning_rate, "--seed", "3",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "task, model_type",
    [("sst2", ROFORMER), ("mrpc", ROFORMER), ("mrpc", "posformers-deberta"), ("mrpc", "littlebird")],
)
def test_glue_trains_the_same_flattened_and_padded(task, model_type, tmp_path, monkeypatch):
    def run(output_dir, padding_free):
        return run_glue.main(
            [*tiny_model_args(model_type, TINY[model_type]), *run_args(output_dir, padding_free), "--task_name", task,
             "--data_dir", str(GLUE_DIR / task), "--max_seq_length", "64", "--max_train_samples", "160",
             "--max_eval_samples", "40"]
        )  # fmt: skip

    assert_same_run(*padded_and_flattened(run, tmp_path, monkeypatch, model_type))


def test_qa_trains_and_answers_the_same_flattened_and_padded(tmp_path, monkeypatch):
    def run(output_dir, padding_free):
        return run_qa.main(
            [*tiny_model_args(ROFORMER, TINY[ROFORMER]), *run_args(output_dir, padding_free, "1e-3"),
             "--train_file", str(SQUAD_DEV), "--validation_file", str(SQUAD_DEV), "--max_train_samples", "40",
             "--max_eval_samples", "24", "--max_seq_length", "64", "--doc_stride", "24"]
        )  # fmt: skip

    padded, flattened = padded_and_flattened(run, tmp_path, monkeypatch)
    assert_same_run(padded, flattened)
    assert {"eval_exact_match", "eval_f1"} <= set(flattened[0])
    # the answers themselves, not only their scores
    answers = [json.loads((folder / "eval_predictions.json").read_text()) for _, folder in (padded, flattened)]
    assert answers[0] == answers[1] and len(answers[0]) == 24


@pytest.fixture(scope="module")
def small_vocabulary(corpus, tmp_path_factory) -> Path:
    """A 500-piece WordPiece tokenizer of the corpus: the MLM heads' projections stay small."""
    documents = corpus["train"].read_text(encoding="utf-8").splitlines()[:800]
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(datasets.Dataset.from_dict({"text": documents}), "wordpiece", 500).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "objective, model_type",
    [("mlm", ROFORMER), ("mlm", "posformers-deberta"), ("mlm", "littlebird"), ("rtd", "posformers-deberta")],
)
def test_pretraining_is_the_same_flattened_and_padded(objective, model_type, corpus, small_vocabulary, tmp_path,
                                                      monkeypatch):  # fmt: skip
    # One document per packing batch: each document ends in a short chunk, so batches hold sequences of many lengths.
    monkeypatch.setattr(pretrain_data, "PACK_BATCH_SIZE", 1)

    def run(output_dir, padding_free):
        return run_pretrain.main(
            ["--objective", objective, "--model_type", model_type, "--config_overrides", TINY[model_type],
             "--tokenizer_name", str(small_vocabulary), *run_args(output_dir, padding_free, "1e-3"),
             "--train_file", str(corpus["train"]), "--validation_file", str(corpus["validation"]),
             "--max_seq_length", "32", "--max_train_samples", "200", "--max_eval_samples", "20"]
        )  # fmt: skip

    assert_same_run(*padded_and_flattened(run, tmp_path, monkeypatch, model_type))


def test_distillation_keeps_padded_batches_that_the_student_unpads_itself(corpus, small_vocabulary, tmp_path,
                                                                         monkeypatch):  # fmt: skip
    """auto: Padding Insertion's batches stay padded and the student (configured "never") runs with
    unpad_inputs="auto", its saved config still saying "never"."""
    teacher = modeling_roformer.RoFormerForMaskedLM(
        AutoConfig.for_model(ROFORMER, vocab_size=len(AutoTokenizer.from_pretrained(small_vocabulary)), hidden_size=32,
                             num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )  # fmt: skip
    teacher.save_pretrained(tmp_path / "teacher")
    spy = ForwardSpy(monkeypatch, "littlebird")
    run_pretrain.main(
        ["--objective", "distill", "--model_type", "littlebird", "--config_overrides",
         TINY["littlebird"] + ",unpad_inputs=never", "--tokenizer_name", str(small_vocabulary),
         "--teacher_name_or_path", str(tmp_path / "teacher"), "--train_file", str(corpus["train"]),
         "--max_train_samples", "40", "--max_seq_length", "32",
         "--padding_insertion_max_length", "48", *QUIET, "--output_dir", str(tmp_path / "out"), "--do_train",
         "--max_steps", "2", "--per_device_train_batch_size", "4"]
    )  # fmt: skip
    assert spy.layouts() == {("auto", False)}
    assert saved_unpad_inputs(tmp_path / "out") == "never"


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
            *tiny_model_args(ROFORMER, TINY[ROFORMER] + ",unpad_inputs=always"), "--report_to", "none",
            "--disable_tqdm", "True", "--log_level", "error", "--output_dir", str(output_dir),
            "--padding_free", "false", "--task_name", "sst2", "--data_dir", str(GLUE_DIR / "sst2"), "--do_train",
            "--do_eval", "--max_steps", "2", "--save_steps", "1", "--max_train_samples", "8", "--max_eval_samples", "8",
            "--per_device_train_batch_size", "4",
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
    bert = tiny_model_args("bert", TINY[ROFORMER])
    with pytest.raises(SystemExit, match=r"--padding_free true: BertForSequenceClassification does not accept"):
        run_glue.main(
            [*bert, *QUIET, "--output_dir", str(tmp_path / "out"), "--padding_free", "true", "--task_name", "sst2",
             "--data_dir", str(GLUE_DIR / "sst2"), "--do_train", "--max_steps", "1"]
        )  # fmt: skip
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_true_with_pad_to_max_length_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--padding_free true and --pad_to_max_length contradict each other"):
        run_qa.main(
            [*tiny_model_args(ROFORMER, TINY[ROFORMER]), *QUIET, "--output_dir", str(tmp_path / "out"),
             "--padding_free", "true", "--pad_to_max_length", "--doc_stride", "16", "--train_file", str(SQUAD_DEV),
             "--max_train_samples", "2", "--do_train", "--max_steps", "1"]
        )  # fmt: skip


def test_true_is_refused_for_distillation(corpus, small_vocabulary, tmp_path):
    """Padding Insertion puts padding into the student's batches on purpose: they stay padded."""
    with pytest.raises(
        SystemExit, match=r"--padding_free true: --objective distill with Padding Insertion inserts padding"
    ):
        run_pretrain.main(
            ["--objective", "distill", "--model_type", "littlebird", "--config_overrides", TINY["littlebird"],
             "--tokenizer_name", str(small_vocabulary), "--teacher_name_or_path", str(tmp_path / "never-loaded"),
             "--train_file", str(corpus["train"]), "--max_train_samples", "20", "--max_seq_length", "32",
             *run_args(tmp_path / "out", "true")]
        )  # fmt: skip
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_bad_values_are_named():
    with pytest.raises(ArgumentError, match=r"--padding_free must be one of auto, true, false, got 'yes'"):
        RunArguments(padding_free="yes")
    with pytest.raises(ArgumentError, match=r"--padding_free must be one of"):
        padding_free.check_padding_free("always")
