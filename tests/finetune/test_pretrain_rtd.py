"""DeBERTa-v3 replaced token detection (posformers-pretrain --objective rtd): gradient-disentangled embedding sharing,
sampling, the saved discriminator, held-out loss on real text, and resuming."""

from __future__ import annotations

import shutil

import datasets
import pytest
import torch
from conftest import QUIET
from helpers.modeling import tiny_config
from helpers.pretrain_corpus import SST2_TRAIN, TINY, eval_history
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

from posformers.configuration_deberta import DebertaConfig
from posformers.finetune import run_glue, run_pretrain
from posformers.finetune.errors import ArgumentError
from posformers.finetune.pretrain_data import MaskingCollator, pack_batch, train_tokenizer
from posformers.finetune.pretrain_rtd import (
    DELTA_FILE,
    GDESEmbedding,
    RTDArguments,
    build_rtd_model,
    corrupt,
    generator_config,
    load_rtd,
    save_rtd,
)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    documents = corpus["train"].read_text(encoding="utf-8").splitlines()[:800]
    return train_tokenizer(datasets.Dataset.from_dict({"text": documents}), "unigram", 500)


def rtd_config(vocab_size: int, **overrides) -> DebertaConfig:
    """The shared tiny DeBERTa with a real tokenizer's vocabulary, 2 heads and 16 buckets over 64 positions."""
    fields = dict(num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    return tiny_config(DebertaConfig, vocab_size=vocab_size, position_buckets=16, **{**fields, **overrides})


def rtd_batch(tokenizer, corpus, count=8):
    documents = corpus["validation"].read_text(encoding="utf-8").splitlines()
    packed = pack_batch(documents[:count], tokenizer, 32, word_starts=False)
    collator = MaskingCollator(tokenizer, mask_replace_prob=1.0, random_replace_prob=0.0)
    return collator([{"input_ids": ids} for ids in packed["input_ids"][:count]])


# ---------------------------------------------------------------------------------------------------------------------
# GDES
# ---------------------------------------------------------------------------------------------------------------------


def test_gdes_gradients_after_one_step(tokenizer, corpus):
    torch.manual_seed(0)
    model = build_rtd_model(rtd_config(len(tokenizer)), RTDArguments(rtd_weight=50.0))
    model.eval()  # no dropout: the generator's loss can be recomputed exactly
    shared = model.generator.deberta.embeddings.word_embeddings
    view = model.discriminator.deberta.embeddings.word_embeddings
    assert isinstance(view, GDESEmbedding) and torch.count_nonzero(view.delta) == 0
    assert model.generator.config.num_hidden_layers == 1  # half the discriminator's two layers
    batch = rtd_batch(tokenizer, corpus)

    output = model(**batch)
    total_shared, total_delta = torch.autograd.grad(output.loss, [shared.weight, view.delta])

    # the generator's embedding gradient is that of its MLM loss alone
    mlm_loss = model.generator(**batch).loss
    assert torch.allclose(mlm_loss, output.mlm_loss)
    (mlm_shared,) = torch.autograd.grad(mlm_loss, [shared.weight])
    assert torch.allclose(total_shared, mlm_shared, atol=1e-7, rtol=0)

    # the difference gets the discriminator's gradient (weighted), which is not zero
    rtd = model.discriminator(
        input_ids=output.rtd_input_ids, attention_mask=batch["attention_mask"], labels=output.rtd_labels
    )
    assert torch.allclose(rtd.loss, output.rtd_loss)
    (rtd_delta,) = torch.autograd.grad(50.0 * rtd.loss, [view.delta])
    assert rtd_delta.abs().sum() > 0
    assert torch.allclose(total_delta, rtd_delta, atol=1e-7, rtol=0)

    # one optimizer step: the effective embedding is the generator's plus the (now non-zero) difference
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(**batch).loss.backward()
    optimizer.step()
    assert torch.count_nonzero(view.delta) > 0
    assert torch.equal(view.weight, shared.weight + view.delta)
    assert torch.equal(model.discriminator.get_input_embeddings().weight, shared.weight + view.delta)


def test_saved_discriminator_is_a_normal_deberta_with_the_effective_embedding(tokenizer, corpus, tmp_path):
    torch.manual_seed(0)
    model = build_rtd_model(rtd_config(len(tokenizer)), RTDArguments())
    view = model.discriminator.deberta.embeddings.word_embeddings
    with torch.no_grad():
        view.delta.normal_(std=0.02)
    save_rtd(model, tmp_path)
    effective = view.shared.weight + view.delta
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    assert torch.equal(classifier.deberta.embeddings.word_embeddings.weight, effective)
    assert set(load_file(str(tmp_path / DELTA_FILE))) == {"deberta.embeddings.word_embeddings.delta"}

    torch.manual_seed(1)
    restored = build_rtd_model(rtd_config(len(tokenizer)), RTDArguments())
    load_rtd(restored, tmp_path)
    for (name, tensor), (_, again) in zip(model.state_dict().items(), restored.state_dict().items()):
        assert torch.equal(tensor, again), name


def test_replacements_are_sampled_from_the_generator():
    input_ids = torch.tensor([[2, 4, 4, 9, 3]])  # [CLS] [MASK] [MASK] token [SEP]
    labels = torch.tensor([[-100, 7, 8, -100, -100]])
    logits = torch.full((1, 5, 12), -1e4)
    logits[0, 1, 7] = logits[0, 2, 5] = 0.0  # certain: the original at position 1, another token at position 2
    corrupted, replaced = corrupt(input_ids, labels, logits)
    assert corrupted.tolist() == [[2, 7, 5, 9, 3]] and replaced.tolist() == [[0, 0, 1, 0, 0]]
    flat = torch.zeros(1, 5, 12)  # uniform: samples spread over the vocabulary
    draws = torch.stack([corrupt(input_ids, labels, flat)[0][0, 1] for _ in range(200)])
    assert len(draws.unique()) > 8


def test_generator_size_options():
    config = rtd_config(100, num_hidden_layers=4)
    assert generator_config(config, RTDArguments()).num_hidden_layers == 2
    assert generator_config(config, RTDArguments(generator_num_hidden_layers=3)).num_hidden_layers == 3
    narrow = generator_config(config, RTDArguments(generator_hidden_size=16, generator_config_overrides="emd_steps=0"))
    assert (narrow.hidden_size, narrow.embedding_size, narrow.num_attention_heads) == (16, 32, 1)
    with pytest.raises(ArgumentError, match="emd_steps=0"):
        generator_config(config, RTDArguments(generator_hidden_size=16))


# ---------------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------------


def rtd_argv(corpus, output, steps=30, save_steps=None):
    saving = ["--save_strategy", "steps", "--save_steps", str(save_steps)] if save_steps else []
    return [
        "--objective", "rtd", "--model_type", "posformers-deberta", "--config_overrides", TINY["posformers-deberta"],
        "--train_tokenizer", "unigram", "--tokenizer_vocab_size", "500", "--whole_word_masking",
        "--train_file", str(corpus["train"]), "--validation_file", str(corpus["validation"]),
        "--max_seq_length", "32", "--max_eval_samples", "60", "--do_train", "--do_eval", "--max_steps", str(steps),
        "--per_device_train_batch_size", "16", "--learning_rate", "5e-3", "--warmup_steps", "3", "--seed", "11",
        "--output_dir", str(output), *QUIET, *saving,
    ]  # fmt: skip


def test_rtd_trains_and_the_discriminator_fine_tunes(corpus, tmp_path):
    output = tmp_path / "rtd"
    metrics = run_pretrain.main([*rtd_argv(corpus, output), "--eval_on_start"])
    start = {key: eval_history(output, f"eval_{key}")[0] for key in ("loss", "mlm_loss", "rtd_loss")}
    print("RTD held-out", {key: (round(start[key], 3), round(metrics[f"eval_{key}"], 3)) for key in start})
    assert metrics["eval_loss"] < 0.8 * start["loss"]
    assert metrics["eval_mlm_loss"] < start["mlm_loss"] - 0.3 and metrics["eval_rtd_loss"] < start["rtd_loss"]
    assert metrics["eval_rtd_accuracy"] > 1 - metrics["eval_rtd_replaced_fraction"] - 0.02  # not below "all original"
    assert (output / "generator" / "config.json").is_file() and (output / DELTA_FILE).is_file()
    # The trained tokenizer's length limit is the model's positions (TINY: 64), not the tokenizers library's 1e30.
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert tokenizer.model_max_length == 64
    # generator/ is a fill-mask model with the run's tokenizer: a pipeline on it reads the vocabulary trained
    fill = pipeline("fill-mask", model=str(output / "generator"))
    assert fill.tokenizer.get_vocab() == tokenizer.get_vocab()
    predictions = fill(f"the film is {fill.tokenizer.mask_token} .", top_k=3)
    assert {tokenizer.convert_ids_to_tokens(prediction["token"]) for prediction in predictions} <= set(
        tokenizer.get_vocab()
    )

    glue = tmp_path / "glue"
    glue_metrics = run_glue.main(
        ["--model_name_or_path", str(output), "--task_name", "sst2", "--data_dir", str(SST2_TRAIN.parent),
         "--do_train", "--do_eval", "--max_train_samples", "32", "--max_eval_samples", "32", "--max_steps", "2",
         "--max_seq_length", "32", "--output_dir", str(glue), *QUIET]
    )  # fmt: skip
    assert 0 <= glue_metrics["eval_accuracy"] <= 1
    classifier = AutoModelForSequenceClassification.from_pretrained(output, num_labels=2)
    generator = load_file(str(output / "generator" / "model.safetensors"))["deberta.embeddings.word_embeddings.weight"]
    delta = load_file(str(output / DELTA_FILE))["deberta.embeddings.word_embeddings.delta"]
    assert torch.equal(classifier.deberta.embeddings.word_embeddings.weight, generator + delta)


def test_resumed_rtd_run_ends_like_an_uninterrupted_one(corpus, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    expected = run_pretrain.main(rtd_argv(corpus, whole, steps=6, save_steps=3))
    # the interrupted run: what it left after step 3 is the uninterrupted run's checkpoint-3
    resumed.mkdir()
    shutil.copytree(whole / "checkpoint-3", resumed / "checkpoint-3")
    metrics = run_pretrain.main([*rtd_argv(corpus, resumed, steps=6, save_steps=3), "--resume_from_checkpoint", "True"])
    for part in ("model.safetensors", "generator/model.safetensors", DELTA_FILE):
        before, after = load_file(str(whole / part)), load_file(str(resumed / part))
        assert before.keys() == after.keys()
        for key in before:
            assert torch.equal(before[key], after[key]), (part, key)
    for key in ("eval_loss", "eval_mlm_loss", "eval_rtd_loss", "eval_rtd_accuracy"):
        assert metrics[key] == expected[key], key
