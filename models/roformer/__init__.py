"""RoFormer: rotary position embedding encoder (posformers model_type "posformers-roformer")."""

from .configuration_roformer import AUTO_MAP, PRESETS, RoFormerConfig
from .modeling_roformer import (
    RoFormerForCausalLM,
    RoFormerForMaskedLM,
    RoFormerForMultipleChoice,
    RoFormerForQuestionAnswering,
    RoFormerForQuestionSpanSelection,
    RoFormerForSequenceClassification,
    RoFormerForTokenClassification,
    RoFormerModel,
    RoFormerPreTrainedModel,
    apply_rotary,
    convert_rope_layout,
    rope_inverse_frequencies,
)

__all__ = [
    "AUTO_MAP",
    "PRESETS",
    "RoFormerConfig",
    "RoFormerForCausalLM",
    "RoFormerForMaskedLM",
    "RoFormerForMultipleChoice",
    "RoFormerForQuestionAnswering",
    "RoFormerForQuestionSpanSelection",
    "RoFormerForSequenceClassification",
    "RoFormerForTokenClassification",
    "RoFormerModel",
    "RoFormerPreTrainedModel",
    "apply_rotary",
    "convert_rope_layout",
    "rope_inverse_frequencies",
]
