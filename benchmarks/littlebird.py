"""LittleBird base (12 x 768 x 12 heads, block 64, pack 64) vs transformers' long-input encoders of the same size:
BigBirdModel (block_sparse, block 64, 3 random blocks) and LongformerModel (window 512), with BERT (sdpa, dense
attention) as the yardstick of an encoder this size. The models do not compute the same function (no shared weights):
the comparison is the cost of reading a long document.

`littlebird-scaling` times LittleBird alone from 1024 to 16384 tokens, to check that the cost grows linearly.

`littlebird-train` is the training step (forward + backward, run it with `--workloads train`) at 4096 tokens:
LittleBird as it trains by default (the memory-lean attention, `LeanUnpackSlidingWindow`) and with activation
checkpointing, against BigBird and BERT-sdpa. `littlebird-train-scaling` runs both LittleBird rows from 1024 to 16384
tokens; `python -m benchmarks.littlebird longest` reads its JSON and reports the longest input that trains in 16 GiB.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BigBirdConfig, BigBirdModel, LongformerConfig, LongformerModel

import posformers

from .harness import RESULTS_DIR, ModelEntry, Suite, Target, random_token_inputs

BASE = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
)
DEFAULT_SEQ_LENS = (4096,)


def _littlebird():
    torch.manual_seed(0)
    return posformers.LittleBirdModel(posformers.LittleBirdConfig(**BASE, block_size=64, pack_length=64))


class CheckpointedLittleBird(posformers.LittleBirdModel):
    """LittleBird with activation checkpointing (each layer recomputed in backward), held in training mode: transformers
    checkpoints only in training mode, and the harness runs the train workload in eval mode (no dropout), so dropout
    is set to 0 instead, and the step computes what the other rows compute."""

    def train(self, mode: bool = True):
        return super().train(True)


def _littlebird_checkpointed():
    torch.manual_seed(0)
    no_dropout = {**BASE, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model = CheckpointedLittleBird(posformers.LittleBirdConfig(**no_dropout, block_size=64, pack_length=64))
    model.activation_checkpointing_enable()
    return model


# ids from 5 up: past the special tokens of a BERT vocabulary
_make_inputs = random_token_inputs(BASE["vocab_size"], first_id=5)


def build_suite(max_seq_len: int) -> Suite:
    entries = _entries(max_seq_len)
    return Suite(
        name="littlebird",
        models=[entries[name] for name in ("posformers", "hf-bigbird", "hf-longformer", "hf-bert-sdpa")],
        candidate="posformers",
        references=["hf-bigbird", "hf-longformer", "hf-bert-sdpa"],
        make_inputs=_make_inputs,
        config=BASE,
        targets=[
            Target("forward", 4096, "hf-bigbird", 0.50),
            Target("forward", 4096, "hf-longformer", 0.60),
            Target("forward", 4096, "hf-bigbird", 0.70, metric="memory"),
        ],
        notes=[
            "Inputs: random input_ids and an all-ones attention_mask; different weights per model (no shared "
            "architecture), so outputs are not compared."
        ],
    )


TRAIN_NOTES = [
    "The train workload: forward + backward of the sum of last_hidden_state, dropout off, weight gradients included "
    "in the peak memory. posformers trains with the memory-lean attention (block scores recomputed in backward) and "
    "the feed-forward activation recomputed from its input; posformers-checkpointing also recomputes every layer "
    "(transformers' activation checkpointing, non-reentrant).",
]


def build_train_suite(max_seq_len: int) -> Suite:
    entries = _entries(max_seq_len)
    return Suite(
        name="littlebird-train",
        models=[entries[name] for name in ("posformers", "posformers-checkpointing", "hf-bigbird", "hf-bert-sdpa")],
        candidate="posformers",
        references=["posformers-checkpointing", "hf-bigbird", "hf-bert-sdpa"],
        make_inputs=_make_inputs,
        config=BASE,
        targets=[
            Target("train", 4096, "hf-bert-sdpa", 0.50, metric="memory"),
            Target("train", 4096, "hf-bigbird", 0.30, metric="memory"),
            Target("train", 4096, "hf-bigbird", 0.45),
        ],
        notes=[
            *TRAIN_NOTES,
            "Targets are checked for posformers (default training); the checkpointing row's ratios are in the table.",
        ],
    )


def build_train_scaling_suite(max_seq_len: int) -> Suite:
    entries = _entries(max_seq_len)
    return Suite(
        name="littlebird-train-scaling",
        models=[entries["posformers"], entries["posformers-checkpointing"]],
        candidate="posformers",
        references=["posformers-checkpointing"],
        make_inputs=_make_inputs,
        config=BASE,
        targets=[Target("train", 8192, "posformers", 2.3, metric="memory", reference_seq_len=4096)],
        notes=[*TRAIN_NOTES, "Linear memory: the training peak at 8192 tokens should stay within 2.3x that at 4096."],
    )


def _entries(max_seq_len: int) -> dict[str, ModelEntry]:
    """Every model of the LittleBird suites by name; the transformers models' position tables sized to the run."""
    positions = max(4096, max_seq_len)

    def bigbird():
        torch.manual_seed(0)
        config = BigBirdConfig(
            **BASE, attention_type="block_sparse", block_size=64, num_random_blocks=3, max_position_embeddings=positions
        )
        return BigBirdModel(config, add_pooling_layer=False)

    def longformer():
        torch.manual_seed(0)
        config = LongformerConfig(**BASE, attention_window=512, max_position_embeddings=positions + 2, pad_token_id=1)
        return LongformerModel(config, add_pooling_layer=False)

    def bert_sdpa():
        torch.manual_seed(0)
        config = BertConfig(**BASE, max_position_embeddings=positions, attn_implementation="sdpa")
        return BertModel(config, add_pooling_layer=False)

    entries = [
        ModelEntry("posformers", _littlebird, "posformers.LittleBirdModel (block 64, pack 64)"),
        ModelEntry(
            "posformers-checkpointing",
            _littlebird_checkpointed,
            "posformers.LittleBirdModel (block 64, pack 64), activation_checkpointing_enable(), dropout 0, train mode",
        ),
        ModelEntry("hf-bigbird", bigbird, "transformers.BigBirdModel, block_sparse, block 64, 3 random blocks"),
        ModelEntry("hf-longformer", longformer, "transformers.LongformerModel, attention_window 512"),
        ModelEntry("hf-bert-sdpa", bert_sdpa, "transformers.BertModel, sdpa (dense attention), no pooler"),
    ]
    return {entry.name: entry for entry in entries}


def build_scaling_suite(max_seq_len: int) -> Suite:
    return Suite(
        name="littlebird-scaling",
        models=[ModelEntry("posformers", _littlebird, "posformers.LittleBirdModel (block 64, pack 64)")],
        candidate="posformers",
        references=[],
        make_inputs=_make_inputs,
        config=BASE,
        targets=[Target("forward", 8192, "posformers", 4.6, reference_seq_len=2048)],
        notes=["Linear cost: the forward time at 8192 tokens should stay within 4.6x the time at 2048."],
    )


# ---------------------------------------------------------------------------------------------------------------------
# The longest input that trains in a memory budget
# ---------------------------------------------------------------------------------------------------------------------


def longest_trainable(report: dict, budget_mib: float) -> dict[str, dict]:
    """Per model of a train report (littlebird-train-scaling): the measured (tokens, peak MiB) points, the
    least-squares line through them, and the longest input whose peak fits in `budget_mib`: the longest measured
    length if a measured peak already exceeds the budget beyond it, else the line's value, extrapolated (the cost is
    linear in the length: a fixed window and pack per token)."""
    longest = {}
    for name in report["models"]:
        points = [
            (case["seq_len"], case["models"][name]["peak_mem_mib"])
            for case in report["results"]
            if case["workload"] == "train" and case["models"][name].get("peak_mem_mib") is not None
        ]
        if len(points) < 2:
            continue
        count = len(points)
        mean_x = sum(x for x, _ in points) / count
        mean_y = sum(y for _, y in points) / count
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
        intercept = mean_y - slope * mean_x
        fitting = [x for x, y in points if y <= budget_mib]
        over = [x for x, y in points if y > budget_mib]
        extrapolated = not over
        tokens = int((budget_mib - intercept) / slope) if extrapolated else max(fitting, default=0)
        longest[name] = {
            "points": points,
            "mib_per_token": slope,
            "mib_at_zero": intercept,
            "longest_tokens": tokens,
            "extrapolated": extrapolated,
        }
    return longest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.littlebird", description="LittleBird benchmark tools")
    parser.add_argument("command", choices=["longest"], help="longest: the longest input that trains in the budget")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "littlebird-train-scaling.json")
    parser.add_argument("--budget-gib", type=float, default=16.0)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "littlebird-train-longest.json")
    args = parser.parse_args(argv)
    report = json.loads(args.json.read_text())
    longest = longest_trainable(report, args.budget_gib * 1024)
    for name, fit in longest.items():
        how = "extrapolated linearly from the measured points" if fit["extrapolated"] else "measured"
        measured = ", ".join(f"{x}: {y:.0f} MiB" for x, y in fit["points"])
        print(
            f"{name}: {fit['longest_tokens']} tokens train in {args.budget_gib:g} GiB ({how}; "
            f"{fit['mib_per_token'] * 1024:.0f} MiB per 1024 tokens; measured {measured})"
        )
    args.output.write_text(json.dumps({"budget_gib": args.budget_gib, "source": str(args.json), "models": longest}))
    print(f"JSON: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
