"""LittleBird: long-document encoder with pack/unpack and block sliding-window attention (model_type "littlebird")."""

from .configuration_littlebird import AUTO_MAP, PRESETS, LittleBirdConfig
from .modeling_littlebird import (
    BlockSparseLayout,
    LittleBirdForMaskedLM,
    LittleBirdForMultipleChoice,
    LittleBirdForQuestionAnswering,
    LittleBirdForQuestionSpanSelection,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    LittleBirdModel,
    LittleBirdModelOutput,
    LittleBirdPreTrainedModel,
    alibi_slopes,
    bialibi_distances,
    unpack_sliding_window_attention,
    window_key_blocks,
)

__all__ = [
    "AUTO_MAP",
    "PRESETS",
    "BlockSparseLayout",
    "LittleBirdConfig",
    "LittleBirdForMaskedLM",
    "LittleBirdForMultipleChoice",
    "LittleBirdForQuestionAnswering",
    "LittleBirdForQuestionSpanSelection",
    "LittleBirdForSequenceClassification",
    "LittleBirdForTokenClassification",
    "LittleBirdModel",
    "LittleBirdModelOutput",
    "LittleBirdPreTrainedModel",
    "alibi_slopes",
    "bialibi_distances",
    "unpack_sliding_window_attention",
    "window_key_blocks",
]
