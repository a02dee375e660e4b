"""DeBERTa v1, v2 and v3: disentangled attention encoder (posformers model_type "posformers-deberta")."""

from .configuration_deberta import AUTO_MAP, PRESETS, DebertaConfig
from .modeling_deberta import (
    LEGACY_MLM_KEY_MAPPING,
    DebertaForMaskedLM,
    DebertaForMultipleChoice,
    DebertaForQuestionAnswering,
    DebertaForQuestionSpanSelection,
    DebertaForReplacedTokenDetection,
    DebertaForReplacedTokenDetectionOutput,
    DebertaForSequenceClassification,
    DebertaForTokenClassification,
    DebertaModel,
    DebertaPreTrainedModel,
    gather_position_bias,
    log_bucket_position,
    position_score_tables,
    relative_positions,
)

__all__ = [
    "AUTO_MAP",
    "LEGACY_MLM_KEY_MAPPING",
    "PRESETS",
    "DebertaConfig",
    "DebertaForMaskedLM",
    "DebertaForMultipleChoice",
    "DebertaForQuestionAnswering",
    "DebertaForQuestionSpanSelection",
    "DebertaForReplacedTokenDetection",
    "DebertaForReplacedTokenDetectionOutput",
    "DebertaForSequenceClassification",
    "DebertaForTokenClassification",
    "DebertaModel",
    "DebertaPreTrainedModel",
    "gather_position_bias",
    "log_bucket_position",
    "position_score_tables",
    "relative_positions",
]
