"""posformers: RoFormer, DeBERTa and LittleBird encoders for the Hugging Face ecosystem.

Importing the package registers every config and model with transformers' Auto classes, so
`AutoModel.from_pretrained(dir)` finds posformers models saved anywhere.
"""

import transformers as _transformers

from . import _registry
from . import modeling_deberta as _modeling_deberta
from . import modeling_littlebird as _modeling_littlebird
from . import modeling_roformer as _modeling_roformer
from .configuration_deberta import AUTO_MAP as _DEBERTA_AUTO_MAP
from .configuration_deberta import DebertaConfig
from .configuration_littlebird import AUTO_MAP as _LITTLEBIRD_AUTO_MAP
from .configuration_littlebird import LittleBirdConfig
from .configuration_roformer import AUTO_MAP as _ROFORMER_AUTO_MAP
from .configuration_roformer import RoFormerConfig
from .modeling_deberta import (
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
from .modeling_littlebird import (
    LittleBirdForMaskedLM,
    LittleBirdForMultipleChoice,
    LittleBirdForQuestionAnswering,
    LittleBirdForQuestionSpanSelection,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    LittleBirdModel,
    LittleBirdPreTrainedModel,
)
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
    convert_rope_layout,
)

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
