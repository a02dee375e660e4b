"""What the three configurations share: `EncoderConfig`, their base, with the fields every posformers encoder has,
their checks (one-line errors naming the field) and the loading classmethods (`from_pretrained`, `from_dict`,
`from_preset`).

A sibling of the configuration files: `save_pretrained` copies it with them for `trust_remote_code` users, so it
imports only the standard library and transformers.
"""

import math
import os
from typing import ClassVar

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

UNPAD_MODES = ("auto", "always", "never")
QA_HEADS = ("linear", "span_selection")
# Sizes every config has; its `validate_fields` checks each is a positive integer.
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
# BERT's sizes, which the published RoFormer, DeBERTa and LittleBird checkpoints reuse (the feed-forward block is
# 4 x hidden_size wide in all of them). A preset copies one and overrides what differs, e.g.
# {**LARGE, "num_hidden_layers": 48}; none holds one of these dicts itself.
SMALL = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536)
BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
XLARGE = dict(hidden_size=1536, num_hidden_layers=24, num_attention_heads=24, intermediate_size=6144)


# The heads every posformers model has, by the Auto class each is registered with.
ENCODER_HEADS = {
    "AutoModelForMaskedLM": "ForMaskedLM",
    "AutoModelForSequenceClassification": "ForSequenceClassification",
    "AutoModelForTokenClassification": "ForTokenClassification",
    "AutoModelForQuestionAnswering": "ForQuestionAnswering",
    "AutoModelForMultipleChoice": "ForMultipleChoice",
}


def auto_map(model: str, prefix: str, **more_heads: str) -> dict[str, str]:
    """A model's AUTO_MAP: {Auto class: "module.Class"} for its config, its base model, the `ENCODER_HEADS` (named
    `<prefix>For...`) and `more_heads` (Auto class=class name). `save_pretrained` writes it into config.json, so that
    `AutoModel*.from_pretrained(dir, trust_remote_code=True)` works where posformers is not installed, and
    `import posformers` registers the same classes with the Auto factories."""
    modeling = f"modeling_{model}."
    heads = {auto_class: modeling + prefix + suffix for auto_class, suffix in ENCODER_HEADS.items()}
    heads.update({auto_class: modeling + name for auto_class, name in more_heads.items()})
    return {"AutoConfig": f"configuration_{model}.{prefix}Config", "AutoModel": f"{modeling}{prefix}Model", **heads}


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
        if minimum == 0 and not inclusive:
            raise ValueError(f"{label} must be positive and finite, got {value!r}")
        bound = f"a number >= {minimum:g}" if inclusive else f"a number > {minimum:g}"
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


def check_activation(config: PreTrainedConfig, name: str) -> None:
    """`config.<name>` must name an activation of transformers' `ACT2FN`."""
    value = getattr(config, name)
    if not isinstance(value, str) or value not in ACT2FN:
        raise ValueError(
            f"{type(config).__name__}.{name} must be the name of an activation in transformers' ACT2FN, got {value!r}"
        )


def check_flags(config: PreTrainedConfig, names) -> None:
    """Each `config.<name>` of `names` must be True or False: a string "false" from a hand-written config.json would
    read as true."""
    for name in names:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{type(config).__name__}.{name} must be True or False, got {getattr(config, name)!r}")


def config_file_error(name_or_path, kwargs: dict, error: Exception) -> Exception:
    """`error`, raised reading the config.json of `name_or_path` (a folder, a file or a Hub repo), as a ValueError
    whose message starts with the file: who loads a checkpoint knows its folder, not the config class's fields."""
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path):
        name_or_path = os.path.join(name_or_path, kwargs.get("subfolder") or "", "config.json")
    if str(error).startswith(name_or_path):
        return error
    return ValueError(f"{name_or_path}: {error}")


class EncoderConfig(PreTrainedConfig):
    r"""
    The base of the three posformers configs: the fields every posformers encoder has (BERT's, with BERT's meanings,
    plus the ones below), checked on creation and again when a model is built, and the loading classmethods. A
    subclass sets `model_type`, `presets` (its published sizes: name -> field overrides), `default_auto_map` (its
    AUTO_MAP, which `save_pretrained` writes into config.json for `trust_remote_code` users), its own fields
    (redeclaring a field changes its default) and `validate_fields` for them.

    Args (beyond BERT's):
        unpad_inputs (`str`, defaults to `"auto"`): padding-free execution of padded batches. `"auto"` runs the
            embeddings, projections, feed-forward blocks and norms on the real tokens only when the 2D attention_mask
            holds padding and nothing in the pass rules it out (output_attentions, a left-padded or 3D mask; each
            model's config says what else); `"always"` packs every pass and raises where it cannot; `"never"` keeps
            the padded path. Outputs at real tokens are the same in every mode; padded positions of per-token outputs
            hold zeros on every path. A flattened batch (transformers' `DataCollatorWithFlattening`: one row,
            position_ids restarting at 0 per sequence) is always run padding-free, one sequence at a time.
        question_token_id (`int`, *optional*): the `[QUESTION]` token of question-aware span selection (Splinter's
            QASS head, the model's `...ForQuestionSpanSelection`, and the recurring span selection pre-training of
            `posformers-pretrain --objective rss`, which adds the token to the tokenizer and sets this field).
        qa_head (`str`, defaults to `"linear"`): the head of the model's `...ForQuestionAnswering`. `"linear"`: start
            and end logits from a linear layer on every token. `"span_selection"`: the QASS head of
            `...ForQuestionSpanSelection`, under the same name, so a span-selection checkpoint fine-tunes with every
            head weight; each example then holds exactly one `question_token_id` token, after the question (as in
            Splinter), whose state asks for the answer span.
    """

    presets: ClassVar[dict] = {}
    default_auto_map: ClassVar[dict] = {}

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    tie_word_embeddings: bool = True
    unpad_inputs: str = "auto"
    question_token_id: int | None = None
    qa_head: str = "linear"

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.validate_fields()
        self.auto_map = {**self.default_auto_map, **(getattr(self, "auto_map", None) or {})}

    def validate_fields(self):
        """Check every field; runs on creation and again when a model is built (fields may change in between). A
        subclass checks its own fields after these."""
        name = type(self).__name__
        for size in SIZE_FIELDS:
            check_integer(self, size)
        check_integer(self, "type_vocab_size", 0)
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"{name}.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        for dropout in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_probability(self, dropout)
        for token in ("pad_token_id", "question_token_id"):
            check_token_id(self, token)
        # a zero epsilon divides by zero on a constant row (a padded position); a negative std initialises nothing
        check_number(f"{name}.layer_norm_eps", self.layer_norm_eps)
        check_number(f"{name}.initializer_range", self.initializer_range, inclusive=True)
        check_activation(self, "hidden_act")
        check_choice(self, "unpad_inputs", UNPAD_MODES)
        check_choice(self, "qa_head", QA_HEADS)

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
