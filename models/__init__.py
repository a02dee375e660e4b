"""posformers: RoFormer, DeBERTa and LittleBird encoders for the Hugging Face ecosystem.

Importing the package registers every config and model with transformers' Auto classes, so
`AutoModel.from_pretrained(dir)` finds posformers models saved anywhere.
"""

from . import _registry
from .roformer import AUTO_MAP as _ROFORMER_AUTO_MAP
from .roformer import (
    RoFormerConfig,
    RoFormerForCausalLM,
    RoFormerForMaskedLM,
    RoFormerForMultipleChoice,
    RoFormerForQuestionAnswering,
    RoFormerForSequenceClassification,
    RoFormerForTokenClassification,
    RoFormerModel,
    RoFormerPreTrainedModel,
    convert_rope_layout,
)
from .roformer import modeling_roformer as _modeling_roformer

__version__ = "0.1.0"

_registry.register(RoFormerConfig, _ROFORMER_AUTO_MAP, _modeling_roformer)

__all__ = [
    "RoFormerConfig",
    "RoFormerForCausalLM",
    "RoFormerForMaskedLM",
    "RoFormerForMultipleChoice",
    "RoFormerForQuestionAnswering",
    "RoFormerForSequenceClassification",
    "RoFormerForTokenClassification",
    "RoFormerModel",
    "RoFormerPreTrainedModel",
    "convert_rope_layout",
]
