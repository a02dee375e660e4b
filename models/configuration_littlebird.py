"""LittleBird configuration.

LittleBird (Lee, Han, Shin, EMNLP 2022, arXiv 2210.11870) is a long-input encoder: pack/unpack attention (LUNA-style)
carries global information, block sliding-window attention with a global first block carries local information, and
BiALiBi biases are the only position signal, so there is no maximum length. Field names follow BERT's where they apply;
the architecture, with every decision marked, is described in `modeling_littlebird.py`.
"""

import contextlib
import math
import os

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

# Heads and the Auto class each is registered with. `save_pretrained` writes this map into config.json so that
# `AutoModel*.from_pretrained(dir, trust_remote_code=True)` works where posformers is not installed, and
# `import posformers` registers the same classes with the Auto factories.
AUTO_MAP = {
    "AutoConfig": "configuration_littlebird.LittleBirdConfig",
    "AutoModel": "modeling_littlebird.LittleBirdModel",
    "AutoModelForMaskedLM": "modeling_littlebird.LittleBirdForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_littlebird.LittleBirdForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_littlebird.LittleBirdForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_littlebird.LittleBirdForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_littlebird.LittleBirdForMultipleChoice",
}

BIALIBI_INITS = ("alibi",)
UNPAD_MODES = ("auto", "always", "never")
QA_HEADS = ("linear", "span_selection")

# The paper's two sizes (Table 1); block and pack length 64 for both.
PRESETS = {
    "littlebird-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "littlebird-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


# Copied from posformers.configuration_roformer.check_integer
def check_integer(config: PreTrainedConfig, name: str, minimum: int = 1) -> None:
    """`config.<name>` must be an integer (not a bool) of at least `minimum`; the error names the field."""
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{type(config).__name__}.{name} must be {kind}, got {value!r}")


# Copied from posformers.configuration_roformer.check_probability
def check_probability(config: PreTrainedConfig, name: str) -> None:
    """`config.<name>` (a dropout probability) must be a number in [0, 1)."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{type(config).__name__}.{name} must be in [0, 1), got {value!r}")


# Copied from posformers.configuration_roformer.check_span_selection_fields
def check_span_selection_fields(config: PreTrainedConfig) -> None:
    """`config.question_token_id` must be None or a row of the word embeddings, `config.qa_head` one of QA_HEADS."""
    token = config.question_token_id
    if token is not None and (
        isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < config.vocab_size
    ):
        raise ValueError(
            f"{type(config).__name__}.question_token_id must be None or in [0, vocab_size={config.vocab_size}), "
            f"got {token!r}"
        )
    if config.qa_head not in QA_HEADS:
        raise ValueError(f"{type(config).__name__}.qa_head must be one of {QA_HEADS}, got {config.qa_head!r}")


# Copied from posformers.configuration_roformer.check_pad_token_id
def check_pad_token_id(config: PreTrainedConfig) -> None:
    """`config.pad_token_id` must be None or a row of the word embeddings (an integer, not a bool)."""
    token = config.pad_token_id
    if token is not None and (
        isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < config.vocab_size
    ):
        raise ValueError(
            f"{type(config).__name__}.pad_token_id ({token!r}) must be None or an integer in "
            f"[0, vocab_size={config.vocab_size})"
        )


def check_finite_number(config: PreTrainedConfig, name: str, positive: bool = False) -> None:
    """`config.<name>` must be a finite number (not a bool), > 0 with `positive`, else >= 0; the error names the field.
    A NaN epsilon or initializer_range would otherwise reach the LayerNorms or torch's init as it is."""
    value = getattr(config, name)
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not is_number or value < 0 or (positive and value == 0):
        kind = "positive and finite" if positive else "a finite number >= 0"
        raise ValueError(f"{type(config).__name__}.{name} must be {kind}, got {value!r}")


# Copied from posformers.configuration_roformer.config_file_error
def config_file_error(name_or_path, kwargs: dict, error: Exception) -> Exception:
    """`error`, raised reading the config.json of `name_or_path` (a folder, a file or a Hub repo), as a ValueError
    whose message starts with the file: who loads a checkpoint knows its folder, not the config class's fields."""
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path):
        name_or_path = os.path.join(name_or_path, kwargs.get("subfolder") or "", "config.json")
    if str(error).startswith(name_or_path):
        return error
    return ValueError(f"{name_or_path}: {error}")


class LittleBirdConfig(PreTrainedConfig):
    r"""
    Configuration of a LittleBird model. Defaults give `littlebird-base`; `LittleBirdConfig.from_preset(name)` gives
    the other size.

    Args (beyond BERT's fields, which keep their meaning; there is no `max_position_embeddings`):
        block_size (`int`, defaults to 64): tokens per block `b` of the sliding-window attention. Each query block
            attends exactly 4 key blocks (block 0, its neighbours and itself), so every token sees `4 * b` tokens.
        pack_length (`int`, defaults to 64): number `s` of pack states (LUNA's projected length) carried through the
            layers; every token also attends the `s` unpacked keys.
        bialibi_init (`str` or `float`, defaults to `"alibi"`): initial value of the BiALiBi slopes alpha, beta and
            gamma of each head. `"alibi"` gives head `h = 1..H` the ALiBi slope `2^(-8h/H)`; a non-negative number
            gives every head that value.
        global_prefix_length (`int`, defaults to 1): the first `global_prefix_length` positions are distance-free
            like [CLS]: between a prefix position and any position outside the prefix, as query or as key, the
            BiALiBi bias is the constant alpha instead of beta or gamma times the distance; inside the prefix the
            distances stay (so a question keeps its word order), and position 0 keeps alpha everywhere. 1 is the
            paper's BiALiBi (only [CLS]); a larger value, up to `block_size` (the prefix must lie in block 0, the
            block every query block attends), lets distant context see a leading question without a distance
            penalty [choice: a posformers extension, off by default].

    The pack states P0 (`embeddings.pack_embeddings`) start from N(0, 1) [choice: the paper does not say]: at the
    scale of the token states (unit RMS after their LayerNorm), so that the s pack states enter layer 1 as s distinct
    slots. At N(0, initializer_range), the initialisation of every other embedding, P0 enters layer 1 at RMS 0.02
    against the tokens' 1.0, the pooled token context swamps it, and after layer 1 the s pack states are one state
    (at base size on 2048 tokens of SQuAD text: mean pairwise cosine 0.992, effective rank 2.8 of 64; with N(0, 1)
    0.05 and 61, see docs/littlebird.md and benchmarks/results/littlebird_pack.md).

    The last layer computes no pack update P' (nothing reads it): its pack attention has no LayerNorm, so every
    parameter gets a gradient and plain DDP (`find_unused_parameters=False`) works; the model's `pack_states` are the
    pack states the last layer read.
        unpad_inputs (`str`, defaults to `"auto"`): padding-free execution of padded batches. `"auto"` runs the
            embeddings, projections, feed-forward blocks and LayerNorms on the real tokens only when the 2D
            attention_mask holds right padding (the attentions stay per example: blocks, BiALiBi, pack states), and
            the padded path otherwise, or when `output_attentions` or padding between real tokens (Padding Insertion)
            rules packing out; `"always"` packs every pass and raises where it cannot; `"never"` keeps the padded
            path. Outputs at real tokens are the same in every mode. A flattened batch (DataCollatorWithFlattening:
            one row, position_ids restarting at 0 per sequence) is always run packed, one sequence at a time.
        question_token_id (`int`, *optional*): the `[QUESTION]` token of question-aware span selection (Splinter's
            QASS head, `LittleBirdForQuestionSpanSelection`, and the recurring span selection pre-training of
            `posformers-pretrain --objective rss`, which adds the token to the tokenizer and sets this field).
        qa_head (`str`, defaults to `"linear"`): the head of `LittleBirdForQuestionAnswering`. `"linear"`: start and end
            logits from a linear layer on every token. `"span_selection"`: the QASS head of
            `LittleBirdForQuestionSpanSelection`, under the same name, so a span-selection checkpoint fine-tunes with
            every head weight; each example then holds exactly one `question_token_id` token, after the question
            (as in Splinter), whose state asks for the answer span.
    """

    model_type = "littlebird"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    block_size: int = 64
    pack_length: int = 64
    bialibi_init: str | float = "alibi"
    global_prefix_length: int = 1
    unpad_inputs: str = "auto"
    tie_word_embeddings: bool = True
    is_decoder: bool = False
    add_cross_attention: bool = False
    question_token_id: int | None = None
    qa_head: str = "linear"

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.validate_fields()
        self.auto_map = {**AUTO_MAP, **(getattr(self, "auto_map", None) or {})}

    # Copied from posformers.configuration_roformer.RoFormerConfig.from_pretrained
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """transformers' `from_pretrained`; a config.json this config refuses (a field of the wrong type or value, an
        unknown model_type) is a ValueError whose message starts with the file."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except (ValueError, TypeError) as error:
            raise config_file_error(pretrained_model_name_or_path, kwargs, error) from None

    # Copied from posformers.configuration_roformer.RoFormerConfig.from_dict
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

    # Copied from posformers.configuration_roformer.RoFormerConfig.from_preset with RoFormer->LittleBird
    @classmethod
    def from_preset(cls, name: str, **overrides) -> "LittleBirdConfig":
        """A config of one of the sizes in `PRESETS`, with optional overrides."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r} for {cls.__name__}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    # Copied from posformers.configuration_roformer.RoFormerConfig.head_dim
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate_fields(self):
        """Check every field; runs on creation and again when a model is built (fields may change in between)."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "block_size",
            "pack_length",
            "global_prefix_length",
        ):
            check_integer(self, name)
        if self.global_prefix_length > self.block_size:
            raise ValueError(
                f"LittleBirdConfig.global_prefix_length ({self.global_prefix_length}) must be at most block_size "
                f"({self.block_size}): the distance-free prefix must lie in block 0, which every query block attends"
            )
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"LittleBirdConfig.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        check_integer(self, "type_vocab_size", 0)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_probability(self, name)
        check_finite_number(self, "layer_norm_eps", positive=True)
        check_finite_number(self, "initializer_range")
        check_pad_token_id(self)
        check_span_selection_fields(self)
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACT2FN:
            raise ValueError(
                f"LittleBirdConfig.hidden_act must be one of transformers' activations, got {self.hidden_act!r}"
            )
        init = self.bialibi_init
        if isinstance(init, str) and init not in BIALIBI_INITS:
            # "0.5" from a command line (--config_overrides bialibi_init=0.5) is the number it spells
            with contextlib.suppress(ValueError):
                init = self.bialibi_init = float(init)
        # An infinite slope makes the bias inf * 0 = NaN on the diagonal.
        is_number = isinstance(init, (int, float)) and not isinstance(init, bool) and math.isfinite(init)
        if not (init in BIALIBI_INITS or (is_number and init >= 0)):
            raise ValueError(
                f"LittleBirdConfig.bialibi_init must be one of {BIALIBI_INITS} or a finite number >= 0, got {init!r}"
            )
        if self.unpad_inputs not in UNPAD_MODES:
            raise ValueError(f"LittleBirdConfig.unpad_inputs must be one of {UNPAD_MODES}, got {self.unpad_inputs!r}")
        if self.is_decoder or self.add_cross_attention:
            raise ValueError(
                "LittleBirdConfig.is_decoder / add_cross_attention must be False: LittleBird is a bidirectional "
                "encoder without cross-attention"
            )


__all__ = ["AUTO_MAP", "PRESETS", "UNPAD_MODES", "LittleBirdConfig"]
