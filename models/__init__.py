"""posformers: RoFormer, DeBERTa and LittleBird encoders for the Hugging Face ecosystem.

Importing the package registers every config and model with transformers' Auto classes, so
`AutoModel.from_pretrained(dir)` finds posformers models saved anywhere.
"""

from . import _registry
from .deberta import AUTO_MAP as _DEBERTA_AUTO_MAP
from .deberta import (
    DebertaConfig,
    DebertaForMaskedLM,
    DebertaForMultipleChoice,
    DebertaForQuestionAnswering,
    DebertaForReplacedTokenDetection,
    DebertaForSequenceClassification,
    DebertaForTokenClassification,
    DebertaModel,
    DebertaPreTrainedModel,
)
from .deberta import modeling_deberta as _modeling_deberta
from .littlebird import AUTO_MAP as _LITTLEBIRD_AUTO_MAP
from .littlebird import (
    LittleBirdConfig,
    LittleBirdForMaskedLM,
    LittleBirdForMultipleChoice,
    LittleBirdForQuestionAnswering,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    LittleBirdModel,
    LittleBirdPreTrainedModel,
)
from .littlebird import modeling_littlebird as _modeling_littlebird
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
_registry.register(DebertaConfig, _DEBERTA_AUTO_MAP, _modeling_deberta)
_registry.register(LittleBirdConfig, _LITTLEBIRD_AUTO_MAP, _modeling_littlebird)

__all__ = [
    "DebertaConfig",
    "DebertaForMaskedLM",
    "DebertaForMultipleChoice",
    "DebertaForQuestionAnswering",
    "DebertaForReplacedTokenDetection",
    "DebertaForSequenceClassification",
    "DebertaForTokenClassification",
    "DebertaModel",
    "DebertaPreTrainedModel",
    "LittleBirdConfig",
    "LittleBirdForMaskedLM",
    "LittleBirdForMultipleChoice",
    "LittleBirdForQuestionAnswering",
    "LittleBirdForSequenceClassification",
    "LittleBirdForTokenClassification",
    "LittleBirdModel",
    "LittleBirdPreTrainedModel",
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
