"""The three models as one registry, for the contracts every model and head keeps (tests/models/test_contracts.py).

An entry says how to build a tiny model of each head its AUTO_MAP registers and how to feed it: a mixed-length,
right-padded batch with labels for the head's loss, as transformers' ModelTesterMixin does per model.
"""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One model: its config class, AUTO_MAP and what its tiny config adds (`fields`)."""

    name: str
    config_class: type
    auto_map: dict[str, str]
    fields: dict = dataclasses.field(default_factory=dict)

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
        return self.heads[auto_name](self.config(auto_name, **overrides)).eval()


REGISTRY = {
    "roformer": ModelEntry("roformer", posformers.RoFormerConfig, configuration_roformer.AUTO_MAP),
    # The convolution beside the first layer, so that the remote-code and padding contracts run through it too.
    "deberta": ModelEntry("deberta", posformers.DebertaConfig, configuration_deberta.AUTO_MAP, {"conv_kernel_size": 3}),
    "littlebird": ModelEntry("littlebird", posformers.LittleBirdConfig, configuration_littlebird.AUTO_MAP),
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


def real_tokens(inputs: dict) -> torch.Tensor:
    """The (rows, width) bool mask of real tokens of `padded_inputs` (the first choice's, for multiple choice)."""
    mask = inputs["attention_mask"]
    return (mask[:, 0] if mask.dim() == 3 else mask).bool()


def training_loss(output) -> torch.Tensor:
    """The head's loss, or for the base model (no labels) a loss that reads every output it returns."""
    if output.get("loss") is not None:
        return output.loss
    return sum(value.float().sum() for value in output.values() if isinstance(value, torch.Tensor))
