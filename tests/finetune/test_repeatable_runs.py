"""Interrupted and repeated runs: Ctrl-C (SIGINT) during training saves a checkpoint and exits with
PREEMPTED_EXIT_STATUS as SIGTERM does (finetune/checkpoints.py); the same text trains the same tokenizer, ids and all
(finetune/pretrain_data.py), so the same command and seed train the same model; two evaluations of the same RTD
weights draw the same replacements (finetune/pretrain_rtd.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import datasets
import pytest
import torch
from conftest import QUIET, TINY_ROFORMER, TOKENIZER_DIR, tiny_model_args
from helpers import REPO_ROOT, python_env
from helpers.modeling import tiny_config
from safetensors.torch import load_file
from transformers import AutoTokenizer, TrainerControl, TrainerState, TrainingArguments

from posformers.configuration_deberta import DebertaConfig
from posformers.finetune import run_pretrain
from posformers.finetune.checkpoints import PREEMPTED_EXIT_STATUS, PreemptionCallback, checkpoint_problems
from posformers.finetune.pretrain_data import MaskingCollator, fix_masks, pack_batch, train_tokenizer
from posformers.finetune.pretrain_rtd import (
    RTDArguments,
    RTDTrainer,
    build_rtd_model,
    preprocess_rtd_logits,
    rtd_metrics,
)

KILL_POINTS = REPO_ROOT / "tests" / "helpers" / "kill_points.py"
TIMING_KEYS = ("runtime", "per_second")


def pretrain_argv(corpus, output_dir, *extra: str, model: list[str] | None = None) -> list[str]:
    return [
        *(model or tiny_model_args()), "--objective", "mlm", "--train_file", str(corpus["train"]),
        "--max_train_samples", "200", "--max_seq_length", "32", "--do_train", "--max_steps", "6",
        "--per_device_train_batch_size", "8", "--seed", "3", "--output_dir", str(output_dir), *QUIET, *extra,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------------------------------------


def test_ctrl_c_during_training_asks_for_a_checkpoint_then_an_exit_and_twice_stops_at_once(tmp_path):
    preemption, args = PreemptionCallback(), TrainingArguments(str(tmp_path), report_to="none")
    control, state = TrainerControl(), TrainerState(global_step=4)
    before = signal.getsignal(signal.SIGINT)
    preemption.on_train_begin(args, state, control)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # handled: the test process goes on
        preemption.on_step_end(args, state, control)
    except KeyboardInterrupt:
        pytest.fail("SIGINT during training ended it without a checkpoint")
    finally:
        assert preemption.requested
    assert control.should_save and control.should_training_stop and preemption.preempted_at == 4
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: the user will not wait for the step's end
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0)  # let the handler run
    preemption.on_train_end(args, state, control)
    assert signal.getsignal(signal.SIGINT) == before
    with pytest.raises(SystemExit) as exit_:
        preemption.exit_if_preempted(SimpleNamespace(args=args))
    assert exit_.value.code == PREEMPTED_EXIT_STATUS


@pytest.mark.slow
def test_ctrl_c_during_posformers_pretrain_saves_exits_75_and_resumes(corpus, tmp_path):
    """SIGINT to the script while its third step runs (tests/helpers/kill_points.py), as Ctrl-C in a terminal."""
    output_dir, env = tmp_path / "out", python_env(tmp_path / "hf-home", PYTHONPATH=str(REPO_ROOT / "tests"))
    argv = pretrain_argv(corpus, output_dir, "--log_level", "warning")
    stopped = subprocess.run(
        [sys.executable, str(KILL_POINTS), "--signal", "INT", "3", "run_pretrain", *argv],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    printed = stopped.stdout + stopped.stderr
    assert stopped.returncode == PREEMPTED_EXIT_STATUS, printed[-3000:]
    assert "SIGINT: saving a checkpoint at the end of this step, then exiting (Ctrl-C again to stop at once)" in printed
    assert f"pre-empted: saved {output_dir / 'checkpoint-3'}; rerun the same command" in printed
    assert "Traceback" not in printed and "KeyboardInterrupt" not in printed
    assert checkpoint_problems(output_dir / "checkpoint-3", TrainingArguments(str(tmp_path), report_to="none")) == []
    run_pretrain.main([*argv, "--resume_from_checkpoint", "True"])  # the same command, resumed
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and [entry["step"] for entry in state["log_history"]][-1] == 6


# ---------------------------------------------------------------------------------------------------------------------
# Trained tokenizers
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_the_same_text_trains_the_same_tokenizer(kind, corpus):
    """The tokenizers trainers iterate hash maps seeded at random in each process and for each map."""
    text = datasets.Dataset.from_dict({"text": corpus["train"].read_text(encoding="utf-8").splitlines()[:600]})
    first, second = (train_tokenizer(text, kind, 500) for _ in range(2))
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    encoded = first("The Normans gave their name to Normandy.")["input_ids"]
    assert first.unk_token_id not in encoded and (first.pad_token_id, first.unk_token_id) == (0, 1)


def test_the_same_command_and_seed_pretrain_the_same_model_with_a_trained_unigram_tokenizer(corpus, tmp_path):
    model = ["--model_type", "posformers-roformer", "--config_overrides", TINY_ROFORMER]
    tokenizer = ["--train_tokenizer", "unigram", "--tokenizer_vocab_size", "400"]
    for run in ("first", "second"):
        run_pretrain.main([*pretrain_argv(corpus, tmp_path / run, "--max_steps", "3", model=model), *tokenizer])
    first, second = ((tmp_path / run / "tokenizer.json").read_text() for run in ("first", "second"))
    assert first == second
    first, second = (load_file(tmp_path / run / "model.safetensors") for run in ("first", "second"))
    assert first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


# ---------------------------------------------------------------------------------------------------------------------
# RTD evaluation
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rtd_setup(corpus):
    """A tiny RTD pair on the real uncased vocabulary, and held-out chunks masked once (as the script's)."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    config = tiny_config(
        DebertaConfig, vocab_size=len(tokenizer), position_buckets=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_rtd_model(config, RTDArguments(), eval_seed=5)
    documents = corpus["validation"].read_text(encoding="utf-8").splitlines()[:12]
    held_out = fix_masks(datasets.Dataset.from_dict(pack_batch(documents, tokenizer, 32, word_starts=False)), 5)
    collator = MaskingCollator(tokenizer, mask_replace_prob=1.0, random_replace_prob=0.0, seed=5)
    return model, held_out, collator


def test_two_evaluations_of_the_same_rtd_weights_give_the_same_metrics(rtd_setup, tmp_path):
    model, held_out, collator = rtd_setup
    args = TrainingArguments(
        str(tmp_path), report_to="none", per_device_eval_batch_size=8, remove_unused_columns=False, use_cpu=True
    )
    trainer = RTDTrainer(
        model=model, args=args, eval_dataset=held_out, data_collator=collator, compute_metrics=rtd_metrics,
        preprocess_logits_for_metrics=preprocess_rtd_logits,
    )  # fmt: skip
    first, second = trainer.evaluate(), trainer.evaluate()
    results = [{key: value for key, value in m.items() if not key.endswith(TIMING_KEYS)} for m in (first, second)]
    assert results[0] == results[1] and 0 < results[0]["eval_rtd_replaced_fraction"] < 1


def test_evaluation_draws_each_sequence_alike_in_any_batch(rtd_setup):
    """A held-out sequence's replacements depend on it alone: not on its batch, its place there, nor torch's RNG."""
    model, held_out, collator = rtd_setup
    model.eval()
    batch = collator([held_out[i] for i in range(8)])
    reversed_batch = {key: value.flip(0) for key, value in batch.items()}
    with torch.no_grad():
        together = model(**batch).rtd_input_ids
        torch.manual_seed(123)
        apart = torch.cat(
            [model(**{k: v[i : i + 3] for k, v in reversed_batch.items()}).rtd_input_ids for i in (0, 3, 6)]
        )
    assert torch.equal(together, apart.flip(0))
    model.train()
    torch.manual_seed(0)
    trained = model(**batch).rtd_input_ids
    assert not torch.equal(trained, together)  # training draws from torch's RNG (restored when a run resumes)
