"""posformers: RoFormer, DeBERTa and LittleBird encoders for the Hugging Face ecosystem.

Importing the package registers every config and model with transformers' Auto classes, so
`AutoModel.from_pretrained(dir)` finds posformers models saved anywhere.
"""

import transformers as _transformers

from . import (
    _registry,
    configuration_deberta,
    configuration_littlebird,
    configuration_roformer,
    modeling_deberta,
    modeling_littlebird,
    modeling_roformer,
)
from .configuration_deberta import DebertaConfig
from .configuration_littlebird import LittleBirdConfig
from .configuration_roformer import RoFormerConfig
from .dropin import disable, enable, enabled, is_enabled, optimize, runs_on_posformers
from .modeling_deberta import *  # noqa: F403 (each modeling file's __all__: its model classes)
from .modeling_littlebird import *  # noqa: F403
from .modeling_roformer import *  # noqa: F403

__version__ = "0.1.0"

_MODELS = (
    (configuration_roformer, modeling_roformer),
    (configuration_deberta, modeling_deberta),
    (configuration_littlebird, modeling_littlebird),
)
for _configuration, _modeling in _MODELS:
    _config_class = getattr(_configuration, _configuration.AUTO_MAP["AutoConfig"].rsplit(".", 1)[1])
    _registry.register(_config_class, _configuration.AUTO_MAP, _modeling)
# The span-selection models (Splinter's QASS) are pre-training models, as transformers files SplinterForPreTraining:
# saving one writes its AutoModelForPreTraining entry and copies the model files for trust_remote_code users. DeBERTa's
# AutoModelForPreTraining in this process stays DebertaForReplacedTokenDetection (its AUTO_MAP).
for _config, _span_selection in (
    (RoFormerConfig, modeling_roformer.RoFormerForQuestionSpanSelection),
    (DebertaConfig, modeling_deberta.DebertaForQuestionSpanSelection),
    (LittleBirdConfig, modeling_littlebird.LittleBirdForQuestionSpanSelection),
):
    _span_selection.register_for_auto_class("AutoModelForPreTraining")
    if _config is not DebertaConfig:
        _transformers.AutoModelForPreTraining.register(_config, _span_selection, exist_ok=True)

__all__ = [
    "DebertaConfig",
    "LittleBirdConfig",
    "RoFormerConfig",
    *modeling_deberta.__all__,
    *modeling_littlebird.__all__,
    *modeling_roformer.__all__,
    "disable",
    "enable",
    "enabled",
    "is_enabled",
    "optimize",
    "runs_on_posformers",
]
