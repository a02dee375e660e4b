"""PEFT (LoRA and the other adapters) for the posformers models: which modules to target, and `get_peft_model`
(docs/integrations.md, "PEFT").

PEFT picks default LoRA targets by `model_type` from a table that does not know `posformers-roformer`,
`posformers-deberta` or `littlebird`, and has no public API to add to it: `target_modules(model)` names them, and
`get_peft_model` is peft's, except that a config without `target_modules` stops with one line naming the modules to
pass. This module imports peft: the model folders never do.
"""

from __future__ import annotations

import re

import peft
from torch import nn

# Module-name suffixes per model_type (peft matches `name == suffix or name.endswith("." + suffix)`).
# "attention": the query and value projections, as peft's defaults for BERT ("query", "value") and DeBERTa
# ("in_proj"; "query_proj", "value_proj"). DeBERTa v2/v3 (share_att_key) project their relative-position table with
# the same query_proj/key_proj, so those adapt the position terms too; v1 and non-shared layouts have their own
# position projections (pos_proj/pos_q_proj, pos_key_proj/pos_query_proj), which "all-linear" includes.
# LittleBird's "query"/"value" cover both its pack attention and its block-sparse attention.
# "all-linear": every linear of the encoder layers (attention, attention output, feed-forward); the heads and the
# pooler stay out: fine-tuning trains them whole (`head_modules`).
TARGET_MODULES = {
    "posformers-roformer": {
        "attention": ["query", "value"],
        "all-linear": ["query", "key", "value", "output.dense", "intermediate.dense"],
    },
    "posformers-deberta": {
        "attention": ["in_proj", "query_proj", "value_proj"],
        "all-linear": [
            "in_proj",
            "pos_proj",
            "pos_q_proj",
            "query_proj",
            "key_proj",
            "value_proj",
            "pos_key_proj",
            "pos_query_proj",
            "output.dense",
            "intermediate.dense",
        ],
    },
    "littlebird": {
        "attention": ["query", "value"],
        "all-linear": ["query", "key", "value", "dense"],
    },
}


def _model_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None)


def target_modules(model: nn.Module, scope: str = "attention") -> str:
    """A regular expression (what `LoraConfig(target_modules=...)` full-matches module names against) for the
    linears of `model`'s encoder layers that `scope`, "attention" or "all-linear", adapts (see `TARGET_MODULES`).
    Only the encoder's layers: "dense" must not reach the classifier's or the pooler's."""
    model_type = _model_type(model)
    if model_type not in TARGET_MODULES:
        raise ValueError(
            f"model: target_modules knows the posformers model types {sorted(TARGET_MODULES)}, not {model_type!r}"
        )
    if scope not in TARGET_MODULES[model_type]:
        raise ValueError(f"scope must be one of {sorted(TARGET_MODULES[model_type])}, not {scope!r}")
    suffixes = "|".join(re.escape(suffix) for suffix in TARGET_MODULES[model_type][scope])
    return rf"(.*\.)?encoder\.layer\.\d+\.(.*\.)?({suffixes})"


def head_modules(model: nn.Module) -> list[str]:
    """The top-level modules with parameters outside the base model (classifier, DeBERTa's pooler, qa_outputs...):
    what fine-tuning a head with adapters trains whole (`LoraConfig(modules_to_save=...)`)."""
    base = getattr(model, "base_model_prefix", None)
    return [
        name
        for name, child in model.named_children()
        if name != base and any(True for _ in child.parameters(recurse=True))
    ]


def get_peft_model(model: nn.Module, peft_config: peft.PeftConfig, **kwargs):
    """`peft.get_peft_model(model, peft_config, **kwargs)`; a posformers model whose config names no target_modules
    (and no target_parameters) is refused with the names to pass."""
    model_type = _model_type(model)
    missing = getattr(peft_config, "target_modules", ()) is None and not getattr(peft_config, "target_parameters", None)
    if model_type in TARGET_MODULES and missing:
        raise ValueError(
            f"{type(peft_config).__name__}.target_modules is missing and peft has no default for model_type "
            f"{model_type!r}: pass target_modules=posformers.integrations.peft.target_modules(model) (the query and "
            f"value projections: {TARGET_MODULES[model_type]['attention']}), "
            f"target_modules=posformers.integrations.peft.target_modules(model, 'all-linear') (every encoder linear), "
            f"or module names of your own"
        )
    return peft.get_peft_model(model, peft_config, **kwargs)


def add_lora(
    model: nn.Module, r: int, *, alpha: float | None = None, dropout: float = 0.0, targets="attention", task_type=None
):
    """`model` wrapped by peft with LoRA adapters of rank `r` (scaled by `alpha / r`, alpha defaulting to 2r) and its
    head trained whole (`head_modules`): what the fine-tuning scripts' --lora_* flags do.

    targets: "attention" or "all-linear" (`target_modules`; for a model type peft knows, "attention" is peft's own
    default), or comma-separated module names.
    """
    model_type = _model_type(model)
    if targets in ("attention", "all-linear"):
        if model_type in TARGET_MODULES:
            targets = target_modules(model, targets)
        elif targets == "attention":
            targets = None  # peft's default for the model types it knows (and its own error otherwise)
    else:
        targets = [name.strip() for name in targets.split(",") if name.strip()]
    config = peft.LoraConfig(
        r=r,
        lora_alpha=2 * r if alpha is None else alpha,
        lora_dropout=dropout,
        target_modules=targets,
        modules_to_save=head_modules(model),
        task_type=task_type,
    )
    return get_peft_model(model, config)
