"""The three models as one registry, for the contracts every model and head keeps (tests/models/test_contracts.py,
tests/models/test_contract_properties.py).

An entry says how to build a tiny model of each head its AUTO_MAP registers and how to feed it: a mixed-length,
right-padded batch with labels for the head's loss, as transformers' ModelTesterMixin does per model. `CASES` are the
batch layouts the padding-free contracts compare on, `VARIANTS` the model-specific configurations they run as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

import posformers
from posformers import configuration_deberta, configuration_littlebird, configuration_roformer

from .modeling import tiny_config

# Rows of 17, 11 and 5 real tokens right-padded to 17 (LittleBird's tiny blocks of 4: several blocks, a partial one).
LENGTHS, WIDTH = (17, 11, 5), 17
CHOICES = 2
# What each head needs on top of the tiny config.
HEAD_FIELDS = {
    "AutoModel": {},
    "AutoModelForMaskedLM": {},
    "AutoModelForCausalLM": {"is_decoder": True},
    "AutoModelForPreTraining": {},
    "AutoModelForSequenceClassification": {"num_labels": 3},
    "AutoModelForTokenClassification": {"num_labels": 5},
    "AutoModelForQuestionAnswering": {},
    "AutoModelForMultipleChoice": {},
}
# Heads whose labels are one per token (-100 at padding) and the number of classes they take.
TOKEN_LABELS = {
    "AutoModelForMaskedLM": 99,
    "AutoModelForCausalLM": 99,
    "AutoModelForPreTraining": 2,
    "AutoModelForTokenClassification": 5,
}
# Per-token outputs (B, L, ...) that padding must not leak into; other outputs are per row.
PER_TOKEN_OUTPUTS = ("last_hidden_state", "logits", "start_logits", "end_logits")
# Right-padded batches as (row lengths, width): real tokens first, padding after. On and off LittleBird's tiny blocks
# of 4, rows of padding only, a batch of one, rows of one token, an input of one column, beyond DeBERTa's relative
# span of 8 and its position buckets.
CASES = {
    "mixed-lengths": ((17, 11, 5, 2), 17),
    "no-padding": ((7, 7, 7), 7),
    "row-of-padding": ((13, 0, 6), 13),
    "batch-of-one": ((9,), 12),
    "length-one": ((1, 6, 1), 6),
    "one-column": ((1, 0), 1),
    "block-boundaries": ((16, 15, 17, 8, 9, 3, 4), 19),
    "long-and-short": ((41, 3), 41),
}
# DeBERTa's three generations at the tiny size. Relative distances of 17 tokens reach 16: beyond max_relative_positions
# (v1: 6) and beyond the log buckets' exact window (v2/v3: 4 buckets over 8 positions).
DEBERTA_VERSIONS = {
    "v1": dict(
        projection_layout="fused",
        position_biased_input=True,
        position_buckets=-1,
        max_relative_positions=6,
        share_att_key=False,
        norm_rel_ebd="none",
        pos_att_type="c2p|p2c",
        type_vocab_size=2,
        conv_kernel_size=0,
    ),
    "v2": dict(position_buckets=4, max_relative_positions=8, conv_kernel_size=3, conv_act="gelu"),
    "v3": dict(position_buckets=4, max_relative_positions=8, pos_att_type="c2p|p2c", conv_kernel_size=0),
}
# Model-specific configurations the contracts run on besides each model's tiny default: variant -> (model, the heads
# it changes, overrides).
BASE_AND_MASKED_LM = ("AutoModel", "AutoModelForMaskedLM")
VARIANTS = {
    "roformer-half-rotary-value": ("roformer", BASE_AND_MASKED_LM, {"rope_layout": "half", "rotary_value": True}),
    "roformer-partial-rotary": ("roformer", BASE_AND_MASKED_LM, {"rotary_dim": 4}),
    "roformer-linear-kernel": ("roformer", BASE_AND_MASKED_LM, {"attention_kernel": "linear"}),
    "roformer-v2": ("roformer", BASE_AND_MASKED_LM, {"norm_type": "rms_norm", "use_bias": False}),
    "roformer-factorised-embeddings": ("roformer", BASE_AND_MASKED_LM, {"embedding_size": 16}),
    "roformer-pooler": ("roformer", ("AutoModel",), {"add_pooling_layer": True}),
    "roformer-first-token-choice": ("roformer", ("AutoModelForMultipleChoice",), {"summary_type": "first"}),
    **{f"deberta-{version}": ("deberta", BASE_AND_MASKED_LM, fields) for version, fields in DEBERTA_VERSIONS.items()},
    "deberta-absolute": ("deberta", ("AutoModel",), {"relative_attention": False, "position_biased_input": True}),
    # More pack states than a block holds tokens (the tiny default has 3 in blocks of 4).
    "littlebird-long-pack": ("littlebird", ("AutoModel",), {"pack_length": 6}),
}
# (variant, model, head, overrides) of every head a variant changes.
VARIANT_HEADS = [
    (variant, name, auto_name, overrides)
    for variant, (name, auto_names, overrides) in VARIANTS.items()
    for auto_name in auto_names
]


def distinct_bialibi_slopes(model, seed: int = 0) -> None:
    """LittleBird's alpha, beta and gamma moved off their initial values by a seeded random amount in [0, 0.5): distinct
    per head and layer, so that mixing up heads, layers or examples cannot go unseen."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, slope in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("alpha", "beta", "gamma"):
                slope.add_(torch.rand(slope.shape, generator=generator) * 0.5)


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One model: its config class, AUTO_MAP, what its tiny config adds (`fields`), what a freshly built model gets
    (`prepare(model, seed)`), the rank of the attention mask it takes besides the (batch, seq_len) padding mask
    (`dense_mask`), whether it reads a left-padded batch (`left_padding`) and the attention implementations that must
    agree on every input (`attn_implementations`, the first the reference; the opt-in fused kernels are compared
    with them in their own tests)."""

    name: str
    config_class: type
    auto_map: dict[str, str]
    fields: dict = dataclasses.field(default_factory=dict)
    prepare: Callable | None = None
    dense_mask: int | None = None
    left_padding: bool = True
    attn_implementations: tuple[str, ...] = ("eager", "sdpa")

    @property
    def heads(self) -> dict[str, type]:
        """{Auto class name: model class} of every head the AUTO_MAP registers."""
        return {
            auto_name: getattr(posformers, target.rsplit(".", 1)[1])
            for auto_name, target in self.auto_map.items()
            if auto_name != "AutoConfig"
        }

    def config(self, auto_name: str = "AutoModel", **overrides):
        return tiny_config(self.config_class, **{**self.fields, **HEAD_FIELDS[auto_name], **overrides})

    def build(self, auto_name: str, seed: int = 0, **overrides):
        """A tiny model of the head, seeded, in eval mode."""
        torch.manual_seed(seed)
        model = self.heads[auto_name](self.config(auto_name, **overrides)).eval()
        if self.prepare is not None:
            self.prepare(model, seed)
        return model


REGISTRY = {
    # A (batch, 1, q_len, kv_len) mask, as transformers' BERT takes.
    "roformer": ModelEntry("roformer", posformers.RoFormerConfig, configuration_roformer.AUTO_MAP, dense_mask=4),
    # The convolution beside the first layer, so that the remote-code and padding contracts run through it too; a
    # (batch, seq_len, seq_len) mask, as the official code takes.
    "deberta": ModelEntry(
        "deberta", posformers.DebertaConfig, configuration_deberta.AUTO_MAP, {"conv_kernel_size": 3}, dense_mask=3
    ),
    # Block 0 is global: the first token must be real. USWAttn's one implementation besides the fused kernel is its
    # block-sparse products ("eager").
    "littlebird": ModelEntry(
        "littlebird",
        posformers.LittleBirdConfig,
        configuration_littlebird.AUTO_MAP,
        prepare=distinct_bialibi_slopes,
        left_padding=False,
        attn_implementations=("eager",),
    ),
}
# (model, head) pairs, and their pytest ids ("roformer-AutoModelForMaskedLM").
MODEL_HEADS = [(name, auto_name) for name, entry in REGISTRY.items() for auto_name in entry.heads]
MODEL_HEAD_IDS = [f"{name}-{auto_name}" for name, auto_name in MODEL_HEADS]


def padded_inputs(auto_name: str, lengths=LENGTHS, width: int = WIDTH, seed: int = 0, labels: bool = True) -> dict:
    """The head's inputs: random input_ids (0 at padding), attention_mask and token_type_ids (1 from the middle on)
    of rows with `lengths` real tokens right-padded to `width`, (rows, CHOICES, width) for multiple choice; with
    `labels`, the labels of the head's loss."""
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    input_ids = torch.randint(1, 99, mask.shape, generator=generator) * mask
    token_type_ids = (torch.arange(width) >= width // 2).long().expand_as(mask) * mask
    inputs = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": token_type_ids}
    if auto_name == "AutoModelForMultipleChoice":
        inputs = {key: value[:, None].repeat(1, CHOICES, 1) for key, value in inputs.items()}
        inputs["input_ids"][:, 1] = (inputs["input_ids"][:, 1] + 1) % 98 * mask + mask  # choices differ
    if labels:
        inputs.update(head_labels(auto_name, mask, generator))
    return inputs


def head_labels(auto_name: str, mask: torch.Tensor, generator: torch.Generator) -> dict:
    """Labels for the head's loss on a (rows, width) batch of real-token `mask`; none for the base model."""
    rows = mask.shape[0]
    if auto_name in TOKEN_LABELS:
        labels = torch.randint(0, TOKEN_LABELS[auto_name], mask.shape, generator=generator)
        return {"labels": labels.masked_fill(mask == 0, -100)}
    if auto_name == "AutoModelForSequenceClassification":
        return {"labels": torch.randint(0, 3, (rows,), generator=generator)}
    if auto_name == "AutoModelForMultipleChoice":
        return {"labels": torch.randint(0, CHOICES, (rows,), generator=generator)}
    if auto_name == "AutoModelForQuestionAnswering":
        lengths = mask.sum(1)
        start = (torch.rand(rows, generator=generator) * lengths).long()
        return {"start_positions": start, "end_positions": torch.minimum(start + 2, lengths - 1)}
    return {}


def per_token(auto_name: str, key: str) -> bool:
    """Whether the head's output `key` holds one entry per token, (B, L, ...); the others hold one per row."""
    return key in PER_TOKEN_OUTPUTS and (key != "logits" or auto_name in TOKEN_LABELS)


def real_tokens(inputs: dict) -> torch.Tensor:
    """The (rows, width) bool mask of real tokens of `padded_inputs` (the first choice's, for multiple choice)."""
    mask = inputs["attention_mask"]
    return (mask[:, 0] if mask.dim() == 3 else mask).bool()


def training_loss(output) -> torch.Tensor:
    """The head's loss, or for the base model (no labels) a loss that reads every output it returns."""
    if output.get("loss") is not None:
        return output.loss
    return sum(value.float().sum() for value in output.values() if isinstance(value, torch.Tensor))
