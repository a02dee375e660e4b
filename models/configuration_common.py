"""What the three configurations share: field checks with one-line errors naming the field, and the loading
classmethods (`from_pretrained`, `from_dict`, `from_preset`) of `PresetConfigMixin`.

A sibling of the configuration files: `save_pretrained` copies it with them for `trust_remote_code` users, so it
imports only the standard library and transformers.
"""

import math
import os

from transformers import PreTrainedConfig

UNPAD_MODES = ("auto", "always", "never")
QA_HEADS = ("linear", "span_selection")
# Sizes every config has; its `validate_fields` checks each is a positive integer.
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def check_integer(config: PreTrainedConfig, name: str, minimum: int = 1) -> None:
    """`config.<name>` must be an integer (not a bool) of at least `minimum`; the error names the field."""
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{type(config).__name__}.{name} must be {kind}, got {value!r}")


def check_probability(config: PreTrainedConfig, name: str) -> None:
    """`config.<name>` (a dropout probability) must be a number in [0, 1)."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{type(config).__name__}.{name} must be in [0, 1), got {value!r}")


def check_number(label: str, value, minimum: float = 0.0, inclusive: bool = False) -> None:
    """`value` must be a finite real number (not a bool or a string) above `minimum`, or equal to it when `inclusive`;
    the error names `label` (e.g. "RoFormerConfig.rope_parameters['rope_theta']")."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < minimum
        or (value == minimum and not inclusive)
    ):
        bound = f"a number >= {minimum:g}" if inclusive else "positive" if minimum == 0 else f"a number > {minimum:g}"
        raise ValueError(f"{label} must be {bound} (a finite int or float), got {value!r}")


def check_token_id(config: PreTrainedConfig, name: str) -> None:
    """`config.<name>` (a special token) must be None or a row of the word embeddings (an integer, not a bool)."""
    token = getattr(config, name)
    if token is not None and (
        isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < config.vocab_size
    ):
        raise ValueError(
            f"{type(config).__name__}.{name} ({token!r}) must be None or an integer in "
            f"[0, vocab_size={config.vocab_size})"
        )


def check_choice(config: PreTrainedConfig, name: str, allowed: tuple) -> None:
    """`config.<name>` must be one of `allowed`."""
    if getattr(config, name) not in allowed:
        raise ValueError(f"{type(config).__name__}.{name} must be one of {allowed}, got {getattr(config, name)!r}")


def check_common_fields(config: PreTrainedConfig) -> None:
    """The fields every posformers config has: sizes, dropouts, special tokens, padding-free mode and QA head."""
    for name in SIZE_FIELDS:
        check_integer(config, name)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        check_probability(config, name)
    for name in ("pad_token_id", "question_token_id"):
        check_token_id(config, name)
    check_choice(config, "unpad_inputs", UNPAD_MODES)
    check_choice(config, "qa_head", QA_HEADS)


def config_file_error(name_or_path, kwargs: dict, error: Exception) -> Exception:
    """`error`, raised reading the config.json of `name_or_path` (a folder, a file or a Hub repo), as a ValueError
    whose message starts with the file: who loads a checkpoint knows its folder, not the config class's fields."""
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path):
        name_or_path = os.path.join(name_or_path, kwargs.get("subfolder") or "", "config.json")
    if str(error).startswith(name_or_path):
        return error
    return ValueError(f"{name_or_path}: {error}")


class PresetConfigMixin:
    """Loading for a posformers config: errors that name the config.json, model_types transformers does not know
    refused, and `from_preset`. A subclass sets `presets`, its published sizes (name -> field overrides)."""

    presets = {}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """transformers' `from_pretrained`; a config.json this config refuses (a field of the wrong type or value, an
        unknown model_type) is a ValueError whose message starts with the file."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except (ValueError, TypeError) as error:
            raise config_file_error(pretrained_model_name_or_path, kwargs, error) from None

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """transformers' `from_dict`, refusing a model_type that transformers does not know. The Auto classes pass
        `name_or_path`: an error then names the config.json the dict came from."""
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # at call time: the Auto module is big

        try:
            model_type = config_dict.get("model_type")
            if model_type is not None and model_type != cls.model_type and model_type not in CONFIG_MAPPING:
                raise ValueError(f"unknown model_type {model_type!r} ({cls.__name__} reads {cls.model_type!r})")
            return super().from_dict(config_dict, **kwargs)
        except (ValueError, TypeError) as error:
            if kwargs.get("name_or_path") is None:
                raise
            raise config_file_error(kwargs["name_or_path"], kwargs, error) from None

    @classmethod
    def from_preset(cls, name: str, **overrides):
        """A config of one of the sizes in `presets`, with optional overrides."""
        if name not in cls.presets:
            raise ValueError(f"Unknown preset {name!r} for {cls.__name__}; choose one of {sorted(cls.presets)}")
        return cls(**{**cls.presets[name], **overrides})

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
