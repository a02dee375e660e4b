"""posformers: RoFormer, DeBERTa and LittleBird encoders for the Hugging Face ecosystem.

Importing the package registers every config and model with transformers' Auto classes, so
`AutoModel.from_pretrained(dir)` finds posformers models saved anywhere.
"""

import transformers as _transformers

from . import _registry
from .deberta import AUTO_MAP as _DEBERTA_AUTO_MAP
from .deberta import (
    DebertaConfig,
    DebertaForMaskedLM,
    DebertaForMultipleChoice,
    DebertaForQuestionAnswering,
    DebertaForQuestionSpanSelection,
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
    LittleBirdForQuestionSpanSelection,
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
    RoFormerForQuestionSpanSelection,
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
# The span-selection models (Splinter's QASS) are pre-training models, as transformers files SplinterForPreTraining:
# saving one writes its AutoModelForPreTraining entry and copies the model files for trust_remote_code users. DeBERTa's
# AutoModelForPreTraining in this process stays DebertaForReplacedTokenDetection (its AUTO_MAP).
for _config, _span_selection in (
    (RoFormerConfig, RoFormerForQuestionSpanSelection),
    (DebertaConfig, DebertaForQuestionSpanSelection),
    (LittleBirdConfig, LittleBirdForQuestionSpanSelection),
):
    _span_selection.register_for_auto_class("AutoModelForPreTraining")
    if _config is not DebertaConfig:
        _transformers.AutoModelForPreTraining.register(_config, _span_selection, exist_ok=True)

__all__ = [
    "DebertaConfig",
    "DebertaForMaskedLM",
    "DebertaForMultipleChoice",
    "DebertaForQuestionAnswering",
    "DebertaForQuestionSpanSelection",
    "DebertaForReplacedTokenDetection",
    "DebertaForSequenceClassification",
    "DebertaForTokenClassification",
    "DebertaModel",
    "DebertaPreTrainedModel",
    "LittleBirdConfig",
    "LittleBirdForMaskedLM",
    "LittleBirdForMultipleChoice",
    "LittleBirdForQuestionAnswering",
    "LittleBirdForQuestionSpanSelection",
    "LittleBirdForSequenceClassification",
    "LittleBirdForTokenClassification",
    "LittleBirdModel",
    "LittleBirdPreTrainedModel",
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
    "convert_rope_layout",
]
