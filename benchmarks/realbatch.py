"""Padding-free execution on real mixed-length batches: tokens per second of posformers' padding-free path
(`unpad_inputs="auto"`) and padded path (`"never"`) against transformers' model of the same family, fed batches in
random order and in the length-grouped order of transformers' `LengthGroupedSampler` (`group_by_length=True`); against
the floor, the model's dense matmuls alone on the real tokens; and, for DeBERTa, against disentangled-flash's PyTorch
backend on transformers' model.

    python -m benchmarks.run --suite realbatch [--quick] [--families roformer deberta littlebird]

Cells: family x workload x mode x variant.

- Families, base size, float32, every model built with dropout 0: RoFormer (posformers.RoFormerModel vs transformers'
  RoFormerModel), DeBERTa-v3-base (posformers.DebertaModel vs transformers' DebertaV2Model), both pairs on the same
  weights (harness.SharedWeights); LittleBird (posformers.LittleBirdModel vs transformers' BigBirdModel with
  block_sparse attention, as in the littlebird suite: different architectures, so different weights).
- Workloads, read from tests/data and tokenized with the bert-base-uncased WordPiece vocabulary there (every model
  gets the same token lengths; ids fit all three vocabularies): SST-2 dev sentences (batch 32), MRPC dev sentence pairs
  (batch 32), SQuAD v1.1 dev question + context windows at max length 384 / stride 128 (batch 16) for RoFormer and
  DeBERTa; long documents for LittleBird (batch 4): the SQuAD dev articles, paragraphs joined and cut at paragraph
  boundaries into documents of at most 4096 tokens (tests/data keeps 4 articles, 6,235 to 10,356 tokens long:
  truncated at 4096 they would make one batch without padding; cut, they make 9 documents of 1,547 to 4,072 tokens).
- Batches are padded on the right to their longest member (a padding collator). An epoch's order is random
  (`torch.randperm` with a fixed seed, what `RandomSampler` does) for every variant but "transformers-grouped", which
  takes `LengthGroupedSampler`'s order with the same seed; incomplete last batches are dropped.
- The floor (every family): per layer the query, key, value and attention output projections and the feed-forward up
  and down projections of the model's size (`DenseFloor`), nothing else, on a (real tokens, hidden) matrix of the
  padding-free variant's batches, same dtype and threads; its training step is those matmuls' forward and backward
  (gradients of inputs and weights), no loss, no optimizer step. Its FLOPs: `floor_flops`.
- disentangled-flash (DeBERTa, when the package is installed; else one line says how to install it and the column is
  left out): transformers' DebertaV2Model on the same weights after `optimize_deberta(model, backend="torch")` (the
  training step: `inference=False`, as the library asks before an optimizer is built), fed the random-order padded
  batches through the model call; its inference path runs prepared sequence lengths only, so every batch width of the
  run is prepared when the model is built and selected (`activate_shape`) before each step, untimed.
- Modes: inference (eval, `torch.no_grad` forward) and one training step (train mode with dropout 0, so both paths run
  the same kernels: forward, loss, backward, fused AdamW step, as Trainer's default optim). The loss is the mean
  square of last_hidden_state over real tokens, identical for every variant.
- Measure: after one untimed warm-up batch per variant (a few rows of the order's batch with the fewest padded
  tokens, cut to a few columns: it triggers lazy initialisation and AdamW's state at the least cost), a fixed number
  of batches spread evenly over the epoch are timed, the variants alternating batch by batch. tokens/s counts real
  tokens only. Peak memory (harness' CPU allocator profile) is measured for both posformers variants on the first
  timed batch. Where LengthGroupedSampler cannot group (fewer than 8 batches in the epoch: its mega-batches are single
  batches), "transformers-grouped" reports the "transformers" measurement.

Ratios compare time per real token: padding-free / transformers, padding-free / transformers-grouped, padding-free /
floor, padding-free / disentangled-flash; "padding cost" is padding-free time / (real-token fraction x padded time),
1.0 when padding costs nothing, and memory is padding-free / padded. Before timing, outputs at real tokens are compared
once per workload: padding-free vs padded vs transformers (vs disentangled-flash, both of its paths).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import BertTokenizerFast, BigBirdConfig, BigBirdModel, DebertaV2Config, DebertaV2Model
from transformers import RoFormerConfig as HFRoFormerConfig
from transformers import RoFormerModel as HFRoFormerModel
from transformers.trainer_pt_utils import LengthGroupedSampler

import posformers

from . import deberta, littlebird, roformer
from .harness import (
    MEMORY_METHODS,
    REPO_ROOT,
    RESULTS_DIR,
    ForeignCpuMeter,
    SharedWeights,
    _cpu_peak_bytes,
    _last_hidden_state,
    _log,
    environment,
    flash_available,
    flash_missing,
    run_and_write,
)

DATA_DIR = REPO_ROOT / "tests" / "data"
VOCAB = DATA_DIR / "vocab" / "bert-base-uncased" / "vocab.txt"
SEED = 0
FLOOR, FLASH = "floor", "disentangled-flash"
VARIANTS = ("padding-free", "padded", "transformers", "transformers-grouped", FLOOR, FLASH)
MODES = ("inference", "train")
KINDS = ("posformers", "transformers")
# Largest |difference| at real tokens for outputs called equal (float32, 12 layers).
EQUIVALENCE_TOLERANCE = 1e-4
MAX_PADDING_COST = 1.15
MAX_MEMORY_RATIO = 1.0
# (family, workload, reference variant, largest padding-free / reference ratio of time per real token), both modes.
TIME_TARGETS = (
    ("roformer", "sst2", "transformers", 0.55),
    ("deberta", "sst2", "transformers", 0.45),
    ("roformer", "sst2", "transformers-grouped", 0.85),
    ("deberta", "sst2", "transformers-grouped", 0.60),
    ("littlebird", "documents", "transformers", 0.35),
)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


# ---------------------------------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    description: str
    batch_size: int
    timed_batches: int
    max_length: int = 512
    stride: int = 0
    limit: int | None = None  # examples (questions, documents) read, None: all
    # The warm-up batch: the first warmup_rows examples of the epoch's cheapest batch, cut to warmup_width tokens.
    warmup_rows: int = 4
    warmup_width: int = 128
    # What the workload is timed for: inference, a training step, or both.
    modes: tuple[str, ...] = MODES


WORKLOADS = {
    "sst2": WorkloadSpec("sst2", "SST-2 dev sentences (tests/data/glue/sst2/dev.tsv)", 32, 4),
    "mrpc": WorkloadSpec("mrpc", "MRPC dev sentence pairs (tests/data/glue/mrpc/dev.tsv)", 32, 2),
    "squad": WorkloadSpec(
        "squad", "SQuAD v1.1 dev question + context windows, max length 384, stride 128", 16, 2, 384, 128
    ),
    "documents": WorkloadSpec(
        "documents",
        "SQuAD v1.1 dev articles, paragraphs joined, cut at paragraph boundaries into documents of <= 4096 tokens",
        4,
        1,
        4096,
        # BigBird's training step on 2 x 4096 tokens needs more than a 24 GiB machine has (it was killed for memory);
        # LittleBird's training is timed by the littlebird-train suite.
        modes=("inference",),
    ),
}
QUICK_WORKLOADS = {
    "sst2": WorkloadSpec("sst2", WORKLOADS["sst2"].description, 4, 1, limit=16),
    "mrpc": WorkloadSpec("mrpc", WORKLOADS["mrpc"].description, 4, 1, limit=16),
    "squad": WorkloadSpec("squad", "SQuAD v1.1 dev windows, max length 96, stride 32", 4, 1, 96, 32, limit=8),
    "documents": WorkloadSpec(
        "documents",
        "SQuAD v1.1 dev articles cut into documents of <= 128 tokens",
        4,
        1,
        128,
        limit=16,
        modes=WORKLOADS["documents"].modes,
    ),
}

Feature = dict[str, list[int]]


def _features(encoding) -> list[Feature]:
    return [
        {"input_ids": ids, "token_type_ids": types}
        for ids, types in zip(encoding["input_ids"], encoding["token_type_ids"])
    ]


def _squad_articles() -> list[dict]:
    return json.loads((DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json").read_text())["data"]


def read_workload(spec: WorkloadSpec, tokenizer) -> list[Feature]:
    """The workload's tokenized examples, in file order."""
    if spec.name == "sst2":
        lines = (DATA_DIR / "glue" / "sst2" / "dev.tsv").read_text().splitlines()[1:]
        return _features(tokenizer([line.rsplit("\t", 1)[0] for line in lines[: spec.limit]]))
    if spec.name == "mrpc":
        lines = (DATA_DIR / "glue" / "mrpc" / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
        rows = [line.split("\t") for line in lines[: spec.limit]]
        return _features(tokenizer([row[3] for row in rows], [row[4] for row in rows]))
    if spec.name == "squad":
        pairs = [
            (qa["question"].lstrip(), paragraph["context"])
            for article in _squad_articles()
            for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]
        ][: spec.limit]
        encoding = tokenizer(
            [question for question, _ in pairs],
            [context for _, context in pairs],
            truncation="only_second",
            max_length=spec.max_length,
            stride=spec.stride,
            return_overflowing_tokens=True,
        )
        return _features(encoding)
    if spec.name == "documents":
        documents = [
            document
            for article in _squad_articles()
            for document in cut_article([p["context"] for p in article["paragraphs"]], tokenizer, spec.max_length)
        ]
        return [{"input_ids": ids, "token_type_ids": [0] * len(ids)} for ids in documents[: spec.limit]]
    raise ValueError(f"Unknown workload {spec.name!r}; choose one of {sorted(WORKLOADS)}")


def cut_article(paragraphs: list[str], tokenizer, max_length: int) -> list[list[int]]:
    """An article's paragraphs joined into documents of at most max_length tokens ([CLS] ... [SEP]), cut at paragraph
    boundaries (a paragraph longer than a document is truncated)."""
    room = max_length - 2
    documents: list[list[int]] = [[]]
    for ids in tokenizer(paragraphs, add_special_tokens=False)["input_ids"]:
        if documents[-1] and len(documents[-1]) + len(ids) > room:
            documents.append([])
        documents[-1] += ids[: room - len(documents[-1])]
    return [[tokenizer.cls_token_id, *ids, tokenizer.sep_token_id] for ids in documents]


@dataclass
class Batch:
    inputs: dict[str, torch.Tensor]
    real_tokens: int
    padded_tokens: int
    examples: frozenset[int] = frozenset()  # indices of the workload's examples in this batch


def collate(features: list[Feature], token_types: bool, width: int | None = None) -> Batch:
    """Right-pad to the longest feature (pad id 0), as a padding collator does; `width` cuts longer features."""
    features = [{key: ids[:width] for key, ids in feature.items()} for feature in features]
    width = max(len(feature["input_ids"]) for feature in features)
    input_ids = torch.zeros(len(features), width, dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for row, feature in enumerate(features):
        length = len(feature["input_ids"])
        input_ids[row, :length] = torch.tensor(feature["input_ids"])
        token_type_ids[row, :length] = torch.tensor(feature["token_type_ids"])
        attention_mask[row, :length] = 1
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_types:
        inputs["token_type_ids"] = token_type_ids
    return Batch(inputs, int(attention_mask.sum()), input_ids.numel())


def epoch_order(lengths: list[int], batch_size: int, grouped: bool) -> list[int]:
    """The example order of one epoch: RandomSampler's (a seeded permutation) or LengthGroupedSampler's."""
    generator = torch.Generator().manual_seed(SEED)
    if grouped:
        return list(LengthGroupedSampler(batch_size, lengths=lengths, generator=generator))
    return torch.randperm(len(lengths), generator=generator).tolist()


def spread(count: int, total: int) -> list[int]:
    """`count` indices in range(total) spread evenly: the middle of `count` equal slices."""
    if not 1 <= count <= total:
        raise ValueError(f"timed_batches must be between 1 and the {total} batches of the epoch, got {count}")
    return [int((i + 0.5) * total / count) for i in range(count)]


@dataclass
class Plan:
    """The batches one variant runs in one workload: a warm-up batch and the timed ones."""

    warmup: Batch
    timed: list[Batch]
    # The variant whose measurement stands for this one, when both would run the same work: that variant's
    # measurement is reported instead of running it twice.
    same_as: str | None = None


def plan_batches(features: list[Feature], spec: WorkloadSpec, grouped: bool, token_types: bool) -> Plan:
    order = epoch_order([len(feature["input_ids"]) for feature in features], spec.batch_size, grouped)
    groups = [order[i : i + spec.batch_size] for i in range(0, len(order) - spec.batch_size + 1, spec.batch_size)]
    timed_positions = spread(spec.timed_batches, len(groups))
    rest = [group for position, group in enumerate(groups) if position not in timed_positions] or groups
    warmup = min(rest, key=lambda group: len(group) * max(len(features[i]["input_ids"]) for i in group))
    return Plan(
        collate([features[i] for i in warmup[: spec.warmup_rows]], token_types, spec.warmup_width),
        [_batch(features, groups[position], token_types) for position in timed_positions],
    )


def _batch(features: list[Feature], group: list[int], token_types: bool) -> Batch:
    batch = collate([features[i] for i in group], token_types)
    batch.examples = frozenset(group)
    return batch


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Family:
    """A posformers model and its transformers counterpart, built by `build(quick)` -> (posformers, reference, size)."""

    name: str
    posformers: str
    reference: str
    workloads: tuple[str, ...]
    token_types: bool
    same_weights: bool
    build: Callable[[bool], tuple[nn.Module, nn.Module, dict[str, Any]]]
    # For the run-time estimate printed before a run only: seconds per 1000 tokens processed (padding included where
    # it is processed) by ("posformers" | "transformers", mode) at base size, and seconds per AdamW step, from the
    # model suites' results on the 2-core CPU these benchmarks run on.
    seconds_per_ktoken: dict[tuple[str, str], float] = field(default_factory=dict)
    optimizer_step_s: float = 0.0
    # The reference is a transformers DeBERTa-v2/v3 that disentangled-flash's optimize_deberta takes.
    flash: bool = False


def _sized(base: dict[str, Any], quick: bool) -> dict[str, Any]:
    return dict(base, **NO_DROPOUT, **(TINY if quick else {}))


def _roformer_models(quick: bool):
    size = _sized(roformer.BASE, quick)
    torch.manual_seed(SEED)
    reference = roformer._expect_attention(HFRoFormerModel(HFRoFormerConfig(**size)), "eager")
    model = posformers.RoFormerModel(posformers.RoFormerConfig(**size))
    model = SharedWeights(lambda: reference).load_into(model, allowed_unexpected=roformer.HF_ROFORMER_ONLY)
    return roformer._expect_attention(model, "sdpa"), reference, size


def _deberta_models(quick: bool):
    size = _sized(deberta.V3_BASE, quick)
    torch.manual_seed(SEED)
    reference = DebertaV2Model(DebertaV2Config(**size))
    # The config goes through config.json as a user's official file would, as in the deberta suite.
    with tempfile.TemporaryDirectory() as folder:
        reference.config.save_pretrained(folder)
        config = posformers.DebertaConfig.from_pretrained(folder)
    return SharedWeights(lambda: reference).load_into(posformers.DebertaModel(config)), reference, size


def _littlebird_models(quick: bool):
    size = _sized(littlebird.BASE, quick)
    block = 16 if quick else 64
    torch.manual_seed(SEED)
    model = posformers.LittleBirdModel(posformers.LittleBirdConfig(**size, block_size=block, pack_length=block))
    bigbird = BigBirdConfig(
        **size,
        attention_type="block_sparse",
        block_size=block,
        num_random_blocks=1 if quick else 3,
        max_position_embeddings=4096,
    )
    return model, BigBirdModel(bigbird, add_pooling_layer=False), dict(size, block_size=block)


def _per_ktoken(inference: tuple[float, float], train: tuple[float, float]) -> dict[tuple[str, str], float]:
    """Family.seconds_per_ktoken from (posformers, transformers) costs per mode."""
    return {(kind, mode): cost for mode, costs in zip(MODES, (inference, train)) for kind, cost in zip(KINDS, costs)}


FAMILIES = {
    "roformer": Family(
        "roformer",
        "posformers.RoFormerModel (sdpa)",
        "transformers.RoFormerModel (eager), same weights",
        ("sst2", "mrpc", "squad"),
        token_types=True,
        same_weights=True,
        build=_roformer_models,
        seconds_per_ktoken=_per_ktoken(inference=(1.0, 1.1), train=(3.0, 3.2)),
        optimizer_step_s=0.7,
    ),
    "deberta": Family(
        "deberta",
        "posformers.DebertaModel (sdpa), DeBERTa-v3-base config",
        "transformers.DebertaV2Model (eager), same weights",
        ("sst2", "mrpc", "squad"),
        token_types=False,  # DeBERTa-v3 has no token types (type_vocab_size 0)
        same_weights=True,
        build=_deberta_models,
        seconds_per_ktoken=_per_ktoken(inference=(1.15, 1.9), train=(3.5, 5.5)),
        optimizer_step_s=1.0,
        flash=True,
    ),
    "littlebird": Family(
        "littlebird",
        "posformers.LittleBirdModel (block 64, pack 64)",
        "transformers.BigBirdModel (block_sparse, block 64, 3 random blocks), its own weights",
        ("documents",),
        token_types=False,
        same_weights=False,
        build=_littlebird_models,
        seconds_per_ktoken=_per_ktoken(inference=(1.1, 2.1), train=(4.3, 7.3)),
        optimizer_step_s=0.6,
    ),
}


def supports_unpadding(model: nn.Module) -> bool:
    return hasattr(model.config, "unpad_inputs")


FLASH_MISSING = flash_missing("DeBERTa's disentangled-flash column")


def flash_models(reference: nn.Module, sequence_lengths: set[int]) -> dict[str, nn.Module]:
    """Copies of transformers' DeBERTa `reference` on disentangled-flash's PyTorch backend, by mode: the inference path
    with `sequence_lengths` prepared, and the training path (`inference=False`, its differentiable encoder)."""
    from disentangled_flash import optimize_deberta

    inference = optimize_deberta(
        copy.deepcopy(reference).eval(), backend="torch", sequence_lengths=sorted(sequence_lengths)
    )
    return {
        "inference": inference,
        "train": optimize_deberta(copy.deepcopy(reference), backend="torch", inference=False),
    }


# ---------------------------------------------------------------------------------------------------------------------
# The floor
# ---------------------------------------------------------------------------------------------------------------------


class DenseFloor(nn.Module):
    """The dense matmuls of an encoder of a given size and nothing else: per layer the query, key, value and attention
    output projections (hidden x hidden) and the feed-forward up (hidden x intermediate) and down projections, on the
    real tokens of a batch. The floor under any implementation's time: what a model adds to it (embeddings, attention
    scores, softmax, layer norms, activations, the loss, the optimizer step) is what the ratio to it measures."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_hidden_layers: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "query": nn.Linear(hidden_size, hidden_size),
                    "key": nn.Linear(hidden_size, hidden_size),
                    "value": nn.Linear(hidden_size, hidden_size),
                    "attention_output": nn.Linear(hidden_size, hidden_size),
                    "intermediate": nn.Linear(hidden_size, intermediate_size),
                    "output": nn.Linear(intermediate_size, hidden_size),
                }
            )
            for _ in range(num_hidden_layers)
        )
        # With no normalisation between the matmuls, weights that shrink the activations would take them, after a
        # few layers, to subnormal floats, which a CPU multiplies many times slower: std 1/sqrt(fan_in) keeps their
        # scale.
        generator = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            for linear in self.modules():
                if isinstance(linear, nn.Linear):
                    linear.weight.normal_(0.0, linear.in_features**-0.5, generator=generator)
                    linear.bias.zero_()

    @classmethod
    def of_size(cls, size: dict[str, Any]) -> DenseFloor:
        return cls(size["hidden_size"], size["intermediate_size"], size["num_hidden_layers"])

    def forward(self, hidden_states: torch.Tensor) -> list[torch.Tensor]:
        """hidden_states: (real tokens, hidden) -> every layer's query and key projections and the last layer's
        output, each (real tokens, hidden): what a backward starts from, so that it reaches every matmul."""
        ends = []
        for layer in self.layers:
            ends += [layer["query"](hidden_states), layer["key"](hidden_states)]
            # Attention itself is not part of the floor: the values go straight to the output projection.
            attention_output = layer["attention_output"](layer["value"](hidden_states))
            hidden_states = layer["output"](layer["intermediate"](attention_output))
        return [*ends, hidden_states]


def floor_flops(size: dict[str, Any], real_tokens: int, mode: str) -> int:
    """FLOPs (2 per multiply-add) of the floor on `real_tokens` tokens: per layer and token 4 hidden^2 (query, key,
    value, attention output) + 2 hidden x intermediate (feed-forward), times 2; a training step adds the gradients of
    the matmuls' inputs and of their weights, each as many FLOPs as the forward."""
    hidden, intermediate = size["hidden_size"], size["intermediate_size"]
    forward = 2 * real_tokens * size["num_hidden_layers"] * (4 * hidden * hidden + 2 * hidden * intermediate)
    return forward * (3 if mode == "train" else 1)


@dataclass
class FloorRunner:
    """How the floor runs a batch: its matmuls on a (batch.real_tokens, hidden) matrix; in train mode (the floor's
    `training` flag) forward and backward."""

    model: DenseFloor
    unpad: None = None  # no posformers model: no unpad mode, no memory measurement

    def steps(self, batch: Batch) -> tuple[Callable[[], None], Callable[[], None]]:
        """(prepare, step): `prepare` runs untimed before each `step`."""
        model, training = self.model, self.model.training
        generator = torch.Generator().manual_seed(SEED)
        hidden_states = torch.randn(batch.real_tokens, model.hidden_size, generator=generator)
        if not training:

            def forward_step():
                with torch.no_grad():
                    model(hidden_states)

            return (lambda: None), forward_step

        # The first layer's input needs its gradient, as a model's embeddings do.
        hidden_states.requires_grad_(True)
        output_grad = torch.randn(batch.real_tokens, model.hidden_size, generator=generator)

        def prepare():
            model.zero_grad(set_to_none=True)
            hidden_states.grad = None

        def train_step():
            outputs = model(hidden_states)
            torch.autograd.backward(outputs, [output_grad] * len(outputs))

        return prepare, train_step


# ---------------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------------


def real_token_loss(output: Any, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean square of last_hidden_state over real tokens: the same number whatever a model leaves at padding."""
    hidden = _last_hidden_state(output).float()
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).pow(2).sum() / (mask.sum() * hidden.shape[-1])


@dataclass
class Runner:
    """How one variant runs a batch: its model, its unpad mode (None: a transformers model) and, in train mode, the
    optimizer (one per model, shared by both posformers variants)."""

    model: nn.Module
    unpad: str | None
    optimizer: torch.optim.Optimizer | None = None
    # disentangled-flash's inference path, which runs only the sequence lengths prepared for it.
    prepared_lengths: bool = False

    def set_mode(self) -> None:
        """Switch the (shared) posformers model to this variant's unpad mode."""
        if self.unpad is not None and supports_unpadding(self.model):
            self.model.config.unpad_inputs = self.unpad

    def ready(self, batch: Batch) -> None:
        """Untimed, before the model runs `batch`: select its prepared length where the model needs that."""
        if self.prepared_lengths:
            self.model.encoder.activate_shape(batch.inputs["input_ids"].shape[1])

    def steps(self, batch: Batch) -> tuple[Callable[[], None], Callable[[], None]]:
        """(prepare, step): `prepare` runs untimed before each `step`."""
        model, inputs, optimizer = self.model, batch.inputs, self.optimizer
        if optimizer is None:

            def forward_step():
                self.set_mode()
                with torch.no_grad():
                    model(**inputs)

            return (lambda: self.ready(batch)), forward_step

        def train_step():
            self.set_mode()
            real_token_loss(model(**inputs), inputs["attention_mask"]).backward()
            optimizer.step()

        def prepare():
            self.ready(batch)
            optimizer.zero_grad(set_to_none=True)

        return prepare, train_step


def check_equivalence(family: Family, runners: dict[str, Runner], batch: Batch) -> dict[str, Any]:
    """Largest |difference| at real tokens between the variants' outputs on one batch, and whether the padding-free
    variant really ran padding-free (zeros at every padded position, as the packed path restores them). `runners`
    may add disentangled-flash's paths (FLASH and f"{FLASH} train"), on the transformers model's weights."""
    names = ["padding-free", "padded"] + (["transformers"] if family.same_weights else [])
    flash_names = [name for name in (FLASH, f"{FLASH} train") if name in runners]
    outputs = {}
    with torch.no_grad():
        for name in names + flash_names:
            runner = runners[name]
            runner.model.eval()
            runner.set_mode()
            runner.ready(batch)
            outputs[name] = _last_hidden_state(runner.model(**batch.inputs)).float()
    real = batch.inputs["attention_mask"].bool()
    diffs = {
        f"{name} vs {first}": float((outputs[name] - outputs[first])[real].abs().max())
        for i, first in enumerate(names)
        for name in names[i + 1 :]
    }
    for name in flash_names:
        diffs[f"{name} vs transformers"] = float((outputs[name] - outputs["transformers"])[real].abs().max())
    padded = ~real
    return {
        "max_abs_diff": diffs,
        "agree": all(diff <= EQUIVALENCE_TOLERANCE for diff in diffs.values()),
        "batch_has_padding": bool(padded.any()),
        "padding_free_ran": bool(padded.any()) and bool((outputs["padding-free"][padded] == 0).all()),
    }


def run_cell(
    runners: dict[str, Runner], plans: dict[str, Plan], measure_memory: bool, max_foreign_cpu: float | None
) -> dict[str, Any]:
    """Warm up every variant, then time the plans' batches, the variants alternating batch by batch."""
    active = {name: runner for name, runner in runners.items() if plans[name].same_as is None}
    for name, runner in active.items():
        prepare, step = runner.steps(plans[name].warmup)
        prepare()
        step()
    stats = {name: {"time_s": 0.0, "batches": 0, "real_tokens": 0, "padded_tokens": 0} for name in active}
    meter = ForeignCpuMeter()
    for position in range(len(plans["padding-free"].timed)):
        if max_foreign_cpu is not None and meter.available:
            ForeignCpuMeter.wait_until_quiet(max_foreign_cpu, timeout_s=5.0)
        for name, runner in active.items():
            batch = plans[name].timed[position]
            prepare, step = runner.steps(batch)
            prepare()
            gc.collect()
            with meter.measure():
                begin = time.perf_counter()
                step()
                elapsed = time.perf_counter() - begin
            cell = stats[name]
            cell["time_s"] += elapsed
            cell["batches"] += 1
            cell["real_tokens"] += batch.real_tokens
            cell["padded_tokens"] += batch.padded_tokens
    for name, cell in stats.items():
        cell["tokens_per_s"] = cell["real_tokens"] / cell["time_s"]
        cell["peak_mem_mib"] = None
        if measure_memory and runners[name].unpad is not None:
            peak = _cpu_peak_bytes(*runners[name].steps(plans[name].timed[0]))
            cell["peak_mem_mib"] = None if peak is None else peak / 2**20
    for name in runners.keys() - active.keys():
        stats[name] = dict(stats[plans[name].same_as], same_batches_as=plans[name].same_as)
    return {"variants": {name: stats[name] for name in runners}, "foreign_cpu_pct": meter.percent}


def cell_ratios(variants: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Ratios of time per real token (and of peak memory) of the padding-free variant to the others; None for a
    variant that did not run."""

    def per_token(name: str) -> float:
        return variants[name]["time_s"] / variants[name]["real_tokens"]

    def to(name: str) -> float | None:
        return per_token("padding-free") / per_token(name) if name in variants else None

    padded = variants["padded"]
    fraction = padded["real_tokens"] / padded["padded_tokens"]
    memories = variants["padding-free"]["peak_mem_mib"], padded["peak_mem_mib"]
    return {
        "padding-free / transformers": per_token("padding-free") / per_token("transformers"),
        "padding-free / transformers-grouped": per_token("padding-free") / per_token("transformers-grouped"),
        "padding cost": variants["padding-free"]["time_s"] / (fraction * padded["time_s"]),
        "memory padding-free / padded": None if None in memories or not memories[1] else memories[0] / memories[1],
        f"padding-free / {FLOOR}": to(FLOOR),
        f"padding-free / {FLASH}": to(FLASH),
    }


def cell_targets(family: str, workload: str, ratios: dict[str, float | None]) -> list[dict[str, Any]]:
    limits = [
        (f"padding-free / {reference}", limit)
        for target_family, target_workload, reference, limit in TIME_TARGETS
        if (target_family, target_workload) == (family, workload)
    ]
    limits += [("padding cost", MAX_PADDING_COST), ("memory padding-free / padded", MAX_MEMORY_RATIO)]
    return [
        {"ratio": name, "value": ratios[name], "limit": limit, "met": ratios[name] <= limit}
        for name, limit in limits
        if ratios[name] is not None
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Options:
    quick: bool = False
    families: tuple[str, ...] = tuple(FAMILIES)
    threads: int | None = None
    measure_memory: bool = True
    # Before each round of timed batches, wait (up to 5 s) until other processes use at most this share (%) of the
    # CPU; None: do not wait.
    max_foreign_cpu: float | None = 10.0
    workloads: dict[str, WorkloadSpec] = field(default_factory=dict)

    def specs(self) -> dict[str, WorkloadSpec]:
        return self.workloads or (QUICK_WORKLOADS if self.quick else WORKLOADS)


def estimate_seconds(
    family: Family, plans: dict[str, Plan], measure_memory: bool = True, modes: tuple[str, ...] = MODES
) -> float:
    """A rough run time of one workload of a base-size family (a memory step counts 1.2 timed steps)."""
    total = 0.0
    for name, plan in plans.items():
        # The floor's matmuls are a fraction of a model's time; disentangled-flash counts as transformers.
        if plan.same_as is not None or name == FLOOR or (name == FLASH and not family.flash):
            continue
        kind = "transformers" if name.startswith("transformers") or name == FLASH else "posformers"
        steps = [(plan.warmup, 1.0)] + [(batch, 1.0) for batch in plan.timed]
        if measure_memory and kind == "posformers":
            steps.append((plan.timed[0], 1.2))
        for batch, weight in steps:
            ktokens = (batch.real_tokens if name == "padding-free" else batch.padded_tokens) / 1000
            per_ktoken = sum(family.seconds_per_ktoken[kind, mode] for mode in modes)
            total += weight * (per_ktoken * ktokens + family.optimizer_step_s)
    return total


def workload_summary(spec: WorkloadSpec, features: list[Feature], plans: dict[str, Plan]) -> dict[str, Any]:
    timed = plans["padded"].timed
    return {
        "description": spec.description,
        "examples": len(features),
        "batch_size": spec.batch_size,
        "batches_per_epoch": len(features) // spec.batch_size,
        "timed_batches": spec.timed_batches,
        "tokens_per_example_mean": sum(len(f["input_ids"]) for f in features) / len(features),
        "tokens_per_example_max": max(len(f["input_ids"]) for f in features),
        "real_token_fraction_timed": sum(b.real_tokens for b in timed) / sum(b.padded_tokens for b in timed),
        "real_token_fraction_grouped_timed": sum(b.real_tokens for b in plans["transformers-grouped"].timed)
        / sum(b.padded_tokens for b in plans["transformers-grouped"].timed),
    }


def _workload_plans(features: list[Feature], spec: WorkloadSpec, token_types: bool) -> dict[str, Plan]:
    random_plan = plan_batches(features, spec, grouped=False, token_types=token_types)
    grouped_plan = plan_batches(features, spec, grouped=True, token_types=token_types)
    if len(features) // (spec.batch_size * 4) <= 1:
        # LengthGroupedSampler's mega-batches are then one batch each: it sorts inside batches and groups nothing.
        grouped_plan.same_as = "transformers"
    return {name: grouped_plan if name == "transformers-grouped" else random_plan for name in VARIANTS}


def wordpiece_tokenizer() -> BertTokenizerFast:
    """bert-base-uncased's WordPiece from tests/data. `vocab=`, not `vocab_file=`: transformers 5 ignores `vocab_file`
    and builds a 5-token vocabulary that maps every word to [UNK]."""
    return BertTokenizerFast(vocab=str(VOCAB), do_lower_case=True)


def run_realbatch(options: Options, on_cell: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every cell; `on_cell(report)` after each one, so a run that dies leaves the cells it finished."""
    device, dtype = torch.device("cpu"), torch.float32
    threads = options.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    started = time.perf_counter()
    with_flash = flash_available()
    if not with_flash and any(FAMILIES[name].flash for name in options.families):
        _log(FLASH_MISSING)
    tokenizer = wordpiece_tokenizer()
    specs = options.specs()
    features = {name: read_workload(spec, tokenizer) for name, spec in specs.items()}
    report: dict[str, Any] = {
        "suite": "realbatch",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment(device, dtype, threads),
        "options": {
            "quick": options.quick,
            "families": list(options.families),
            "measure_memory": options.measure_memory,
            "max_foreign_cpu": options.max_foreign_cpu,
            "seed": SEED,
        },
        "variants": {
            "padding-free": "posformers, unpad_inputs='auto', random order",
            "padded": "posformers, unpad_inputs='never', random order",
            "transformers": "transformers' model of the family, random order",
            "transformers-grouped": "transformers' model, LengthGroupedSampler order (group_by_length=True)",
            FLOOR: "the model's dense matmuls alone (query, key, value, attention output, feed-forward up and down, "
            "per layer) on the padding-free variant's real tokens",
            FLASH: "DeBERTa only: transformers' model with disentangled-flash's optimize_deberta(model, "
            "backend='torch'), random order",
        },
        "flash_available": with_flash,
        "memory_method": MEMORY_METHODS["cpu"] if options.measure_memory else None,
        "families": {},
        "workloads": {},
        "equivalence": [],
        "cells": [],
        "notes": [
            "Every model is built with dropout 0, so train mode runs the same kernels as eval mode in every variant.",
            "Ratios are of time per real token; padding cost = padding-free time / (real-token fraction x padded "
            "time), the real-token fraction taken over the same timed batches.",
            "The transformers-grouped variant is timed on the batches at the same positions of its own epoch order.",
            "BigBird switches to full attention for batches shorter than (5 + 2 x random blocks) x block size tokens "
            "(704 at base size), as transformers does.",
            "The floor is 2 x layers x (4 hidden^2 + 2 hidden x intermediate) FLOPs per real token for inference, 3 "
            "times that for a training step (forward and backward of those matmuls, no loss, no optimizer step); "
            "everything a model adds to it (embeddings, attention, layer norms, activations, the loss and, in a "
            "training step, the AdamW step) is what padding-free / floor measures.",
            "A training step's optimizer is torch's fused AdamW, which Trainer's default optim (adamw_torch_fused) "
            "builds.",
            "disentangled-flash runs the padded batches through the model call, its inference path with every batch "
            "width of the run prepared beforehand (optimize_deberta's sequence_lengths) and selected before each "
            "step, untimed; its training step uses optimize_deberta(..., inference=False).",
            "The documents workload is timed for inference only: BigBird's training step on 2 x 4096 tokens needs "
            "more memory than a 24 GiB machine has. LittleBird's training is timed by the littlebird-train suite.",
        ]
        + ([] if with_flash else [FLASH_MISSING]),
    }
    plans = {
        (family, workload): _workload_plans(features[workload], specs[workload], FAMILIES[family].token_types)
        for family in options.families
        for workload in FAMILIES[family].workloads
    }
    for (_, workload), workload_plans in plans.items():
        report["workloads"].setdefault(workload, workload_summary(specs[workload], features[workload], workload_plans))
    if not options.quick:
        estimate = sum(
            estimate_seconds(FAMILIES[family], workload_plans, options.measure_memory, specs[workload].modes)
            for (family, workload), workload_plans in plans.items()
        )
        report["estimated_s"] = estimate
        _log(
            f"estimated run time: {estimate / 60:.0f} min from the token counts (per-token costs of batch-1 runs, "
            "likely high for batches of short sentences), plus 1-2 min building models and comparing outputs"
        )
    # The gc.collect() before each timed step then skips the long-lived objects (the libraries, the workloads).
    gc.collect()
    gc.freeze()
    try:
        for family_name in options.families:
            _run_family(FAMILIES[family_name], plans, options, report, started, on_cell, with_flash)
    finally:
        gc.unfreeze()
    report["environment"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["wall_s"] = time.perf_counter() - started
    return report


def _run_family(
    family: Family,
    plans: dict[tuple[str, str], dict[str, Plan]],
    options: Options,
    report: dict[str, Any],
    started: float,
    on_cell: Callable[[dict[str, Any]], None] | None = None,
    with_flash: bool = True,
) -> None:
    model, reference, size = family.build(options.quick)
    report["families"][family.name] = {
        "posformers": family.posformers,
        "reference": family.reference,
        "config": size,
        "unpad_inputs_supported": supports_unpadding(model),
    }
    if not supports_unpadding(model):
        _log(f"{family.name}: this posformers build has no unpad_inputs; both posformers variants run padded")
    runners = {
        "padding-free": Runner(model, "auto"),
        "padded": Runner(model, "never"),
        "transformers": Runner(reference, None),
        "transformers-grouped": Runner(reference, None),
        FLOOR: FloorRunner(DenseFloor.of_size(size)),
    }
    flash = {}
    if family.flash and with_flash:
        inference_batches = [
            batch
            for workload in family.workloads
            for batch in (plans[family.name, workload][FLASH].warmup, *plans[family.name, workload][FLASH].timed)
        ]
        flash = flash_models(reference, {batch.inputs["input_ids"].shape[1] for batch in inference_batches})
    flash_runners = (
        {FLASH: Runner(flash["inference"], None, prepared_lengths=True), f"{FLASH} train": Runner(flash["train"], None)}
        if flash
        else {}
    )
    checked = dict(runners, **flash_runners)
    for workload in family.workloads:
        equivalence = check_equivalence(family, checked, plans[family.name, workload]["padded"].timed[0])
        report["equivalence"].append({"family": family.name, "workload": workload, **equivalence})
        _log(f"{family.name} {workload}: max |diff| at real tokens {equivalence['max_abs_diff']}")
    del checked, flash_runners
    specs = options.specs()
    for mode in MODES:
        workloads = [workload for workload in family.workloads if mode in specs[workload].modes]
        if not workloads:
            continue
        if flash:
            # Each mode's model once it is needed: the inference one is freed before the training step's optimizers.
            runners[FLASH] = Runner(flash.pop(mode), None, prepared_lengths=mode == "inference")
        optimizers = {}
        for name, runner in runners.items():
            runner.model.train(mode == "train")
            if mode == "train" and name != FLOOR:
                if id(runner.model) not in optimizers:
                    # fused: the AdamW that Trainer's default optim ("adamw_torch_fused") builds
                    optimizers[id(runner.model)] = torch.optim.AdamW(runner.model.parameters(), 1e-5, fused=True)
                runner.optimizer = optimizers[id(runner.model)]
        for workload in workloads:
            cell = run_cell(runners, plans[family.name, workload], options.measure_memory, options.max_foreign_cpu)
            floor = cell["variants"][FLOOR]
            floor["flops"] = floor_flops(size, floor["real_tokens"], mode)
            floor["gflop_per_s"] = floor["flops"] / floor["time_s"] / 1e9
            ratios = cell_ratios(cell["variants"])
            report["cells"].append(
                {
                    "family": family.name,
                    "workload": workload,
                    "mode": mode,
                    **cell,
                    "ratios": ratios,
                    "targets": cell_targets(family.name, workload, ratios),
                }
            )
            _log(f"[{time.perf_counter() - started:6.0f}s] {family.name} {workload} {mode} done")
            if on_cell is not None:
                on_cell(report)
        for name, runner in runners.items():
            if name != FLOOR:
                runner.optimizer = None
        del optimizers
    del model, reference, runners
    gc.collect()


# ---------------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------------


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _rate(variant: dict[str, Any] | None) -> str:
    if variant is None:
        return "n/a"
    return f"{variant['tokens_per_s']:.0f}{' (=)' * ('same_batches_as' in variant)}"


def format_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "## realbatch: padding-free vs padded, transformers, the floor and disentangled-flash on real batches",
        "",
        f"{env['device_name']} ({env['device']}), {env['dtype']}, torch threads {env['torch_threads']}, "
        f"torch {env['torch']}, transformers {env['transformers']}, commit {env['git_commit']}"
        + (" (models/ modified)" if env.get("models_dir_modified") else "")
        + (", QUICK (tiny models)" if report["options"]["quick"] else ""),
        "",
        "| workload | examples | batch | timed batches | mean / max tokens | real-token fraction (random / grouped) |",
        "|---|---|---|---|---|---|",
    ]
    for name, workload in report["workloads"].items():
        lines.append(
            f"| {name}: {workload['description']} | {workload['examples']} | {workload['batch_size']}" + " | "
            f"{workload['timed_batches']} of {workload['batches_per_epoch']} | "
            f"{workload['tokens_per_example_mean']:.0f} / {workload['tokens_per_example_max']} | "
            f"{workload['real_token_fraction_timed']:.2f} / {workload['real_token_fraction_grouped_timed']:.2f} |"
        )
    header = ["model", "workload", "mode", *(f"{v} tok/s" for v in VARIANTS)]
    header += ["pf / hf", "pf / hf-grouped", f"pf / {FLOOR}", f"pf / {FLASH}", "padding cost"]
    header += ["memory pf / padded", "pf / padded MiB", "floor GFLOP/s", "other CPU %"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for cell in report["cells"]:
        variants, ratios = cell["variants"], cell["ratios"]
        memories = [variants[name]["peak_mem_mib"] for name in ("padding-free", "padded")]
        foreign = cell["foreign_cpu_pct"]
        row = [cell["family"], cell["workload"], cell["mode"]]
        row += [_rate(variants.get(name)) for name in VARIANTS]
        row += [
            _ratio(ratios["padding-free / transformers"]),
            _ratio(ratios["padding-free / transformers-grouped"]),
            _ratio(ratios.get(f"padding-free / {FLOOR}")),
            _ratio(ratios.get(f"padding-free / {FLASH}")),
            _ratio(ratios["padding cost"]),
            _ratio(ratios["memory padding-free / padded"]),
            " / ".join("n/a" if memory is None else f"{memory:.0f}" for memory in memories),
            f"{variants[FLOOR]['gflop_per_s']:.0f}" if FLOOR in variants else "n/a",
            "n/a" if foreign is None else f"{foreign:.0f}",
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| model | workload | mode | target | ratio | limit | met |", "|---|---|---|---|---|---|---|"]
    for cell in report["cells"]:
        for target in cell["targets"]:
            lines.append(
                f"| {cell['family']} | {cell['workload']} | {cell['mode']} | {target['ratio']} | "
                f"{target['value']:.2f}x | <= {target['limit']:.2f}x | {'yes' if target['met'] else 'NO'} |"
            )
    lines.append("")
    for name, family in report["families"].items():
        support = "" if family["unpad_inputs_supported"] else " (no unpad_inputs in this build: both variants padded)"
        lines.append(f"- {name}: {family['posformers']}{support} vs {family['reference']}")
    for check in report["equivalence"]:
        diffs = ", ".join(f"{label} {diff:.2g}" for label, diff in check["max_abs_diff"].items())
        ran = "yes" if check["padding_free_ran"] else "NO" if check["batch_has_padding"] else "no padding in the batch"
        verdict = "agree" if check["agree"] else "DIFFER"
        lines.append(
            f"- outputs at real tokens, {check['family']} {check['workload']}: max |diff| {diffs} "
            f"({verdict} within {EQUIVALENCE_TOLERANCE:g}); padding-free path ran: {ran}"
        )
    lines += [f"- {note}" for note in report["notes"]]
    if any("same_batches_as" in cell["variants"]["transformers-grouped"] for cell in report["cells"]):
        lines.append(
            "- (=): LengthGroupedSampler groups nothing in this workload (fewer than 8 batches per epoch), so the "
            "transformers measurement is reported."
        )
    if report.get("memory_method"):
        lines.append(f"- Peak memory: {report['memory_method']}")
    lines.append(f"- Wall time of the run: {report['wall_s'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _quiet_transformers():
    """BigBird logs its switch to full attention on every short batch."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)


def main(options: Options, json_path: Path | None = None) -> tuple[dict[str, Any], dict[str, Path | str]]:
    """Run the benchmark and write its outputs (`harness.run_and_write`): (report, the paths written)."""
    from .plot import plot_realbatch

    with _quiet_transformers():
        return run_and_write(
            lambda on_cell: run_realbatch(options, on_cell),
            json_path or RESULTS_DIR / "realbatch.json",
            format_markdown,
            plot_realbatch,
        )
