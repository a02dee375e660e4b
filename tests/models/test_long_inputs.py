"""Long inputs: RoFormer at 4x its max_position_embeddings, DeBERTa at 4,096 tokens and LittleBird
at 32,768 tokens, batch 1 of real text (SST-2 train sentences run together) at small widths.

For each: the inference forward agrees with a second path computing the same function (RoFormer and DeBERTa: the
eager kernel against SDPA; LittleBird: the chunked SDPA inference path against the lean training attention), and one
masked-LM training step, in float32 and under bfloat16 autocast, gives a finite loss and finite gradients, and an SGD
step along them lowers the loss. The process's peak resident memory during each step is measured (VmHWM, reset
through /proc/self/clear_refs) and bounded: the machine running the suite is shared.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from helpers.data import DATA_DIR
from helpers.modeling import max_diff, tiny_config

from posformers import (
    DebertaConfig,
    DebertaForMaskedLM,
    LittleBirdConfig,
    LittleBirdForMaskedLM,
    RoFormerConfig,
    RoFormerForMaskedLM,
)

PAD_ID, MASK_ID = 0, 103  # BERT uncased's [PAD] and [MASK]
ROFORMER_MAX_POSITIONS = RoFormerConfig().max_position_embeddings  # 1,536, RoFormer's default table
PEAK_LIMIT_MIB = 3 * 1024  # growth of the process's peak resident memory during one step
SMALL = dict(hidden_size=32, num_attention_heads=2, intermediate_size=37)

# (model class, config class, length, config fields, second inference path). DeBERTa's EMD adds absolute positions to
# the queries of its last layer, so its table must reach the length (mDeBERTa's stops at 512, as the official one).
CASES = {
    "roformer": (
        RoFormerForMaskedLM,
        RoFormerConfig,
        4 * ROFORMER_MAX_POSITIONS,
        dict(max_position_embeddings=ROFORMER_MAX_POSITIONS),
        "eager",
    ),
    "deberta": (DebertaForMaskedLM, DebertaConfig, 4096, dict(max_position_embeddings=4096), "eager"),
    "littlebird": (LittleBirdForMaskedLM, LittleBirdConfig, 32768, dict(block_size=64, pack_length=64), "training"),
}


@functools.cache
def long_text(length: int) -> tuple[torch.Tensor, int]:
    """(1, length) BERT uncased ids of SST-2 train sentences run together (each with its [CLS] ... [SEP]), renumbered
    densely over the tokens used ([PAD] and [MASK] included), and that vocabulary's size."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    ids: list[int] = []
    with open(DATA_DIR / "glue" / "sst2" / "train.tsv") as rows:
        next(rows)
        for row in rows:
            ids += tokenizer(row.split("\t")[0])["input_ids"]
            if len(ids) >= length:
                break
    assert len(ids) >= length, "tests/data's SST-2 train split is too short"
    used = sorted({PAD_ID, MASK_ID, *ids[:length]})
    renumber = {token: index for index, token in enumerate(used)}
    return torch.tensor([[renumber[token] for token in ids[:length]]]), len(used)


def masked_lm_batch(input_ids: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """15% of the tokens replaced by [MASK] (renumbered: `MASK_ID`'s index) and labelled."""
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.rand(input_ids.shape, generator=generator) < 0.15
    mask_index = 1  # [PAD] (0) and [MASK] (103) are the two smallest ids used
    return {"input_ids": input_ids.masked_fill(chosen, mask_index), "labels": torch.where(chosen, input_ids, -100)}


def peak_rss_mib() -> float:
    """The process's peak resident memory since the last `reset_peak_rss` (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> float:
    """Reset VmHWM to the current resident memory (Linux' clear_refs 5) and return it, in MiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return peak_rss_mib()


def build(name: str):
    model_class, config_class, length, fields, _ = CASES[name]
    input_ids, vocab_size = long_text(length)
    config = tiny_config(config_class, vocab_size=vocab_size, pad_token_id=PAD_ID, **{**SMALL, **fields})
    torch.manual_seed(0)
    return model_class(config), masked_lm_batch(input_ids)


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_long_input_inference_agrees_across_paths(name):
    model, batch = build(name)
    second_path = CASES[name][4]
    model.eval()
    with torch.no_grad():
        logits = model(batch["input_ids"]).logits
    assert torch.isfinite(logits).all()
    if second_path == "training":  # the lean attention runs where a graph is built
        model.train()
        reference = model(batch["input_ids"]).logits.detach()
    else:
        model.set_attn_implementation(second_path)
        with torch.no_grad():
            reference = model(batch["input_ids"]).logits
    assert max_diff(logits, reference) <= 1e-4


# bfloat16 where its range matters most: RoFormer's rotary angles and LittleBird's BiALiBi distances at 32,768 tokens
# (DeBERTa's buckets stop at 256 distances; its float32 step alone takes a minute on the shared machine).
TRAINING_CASES = [("roformer", None), ("roformer", torch.bfloat16), ("deberta", None), ("littlebird", None)]
TRAINING_CASES += [("littlebird", torch.bfloat16)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "dtype"), TRAINING_CASES, ids=lambda value: str(value or "float32").removeprefix("torch.")
)
def test_long_input_training_step_is_finite_and_descends(name, dtype, record_property):
    model, batch = build(name)
    model.train()
    baseline = reset_peak_rss()
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(**batch).loss
    loss.backward()
    peak = peak_rss_mib() - baseline
    record_property("peak_rss_growth_mib", round(peak))
    print(f"{name} {CASES[name][2]} tokens {dtype}: loss {loss.item():.4f}, peak RSS growth {peak:.0f} MiB")
    assert torch.isfinite(loss)
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), parameter_name
    assert peak < PEAK_LIMIT_MIB
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.grad is not None:
                parameter -= 0.05 * parameter.grad
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            assert model(**batch).loss < loss
