"""RoFormer configuration.

Field names and meanings follow transformers' `RoFormerConfig`, so a `config.json` written for transformers' RoFormer
(or published with the junnyu/roformer_* checkpoints) loads as it is. On top of them:

* rotary position options: `rope_theta`, `rotary_dim` / `partial_rotary_factor`, `rope_layout`, `rope_scaling`;
* RoFormer-v2 options: `norm_type`, `use_bias`;
* `attention_kernel`: softmax attention or the RoFormer paper's linear attention.

`model_type` is "posformers-roformer", not "roformer": transformers already registers "roformer", and a folder saved
with that name would silently load as transformers' class.
"""

import math
import os

from transformers import PreTrainedConfig

# Heads and the Auto class each is registered with. `save_pretrained` writes this map into config.json so that
# `AutoModel*.from_pretrained(dir, trust_remote_code=True)` works where posformers is not installed, and
# `import posformers` registers the same classes with the Auto factories.
AUTO_MAP = {
    "AutoConfig": "configuration_roformer.RoFormerConfig",
    "AutoModel": "modeling_roformer.RoFormerModel",
    "AutoModelForMaskedLM": "modeling_roformer.RoFormerForMaskedLM",
    "AutoModelForCausalLM": "modeling_roformer.RoFormerForCausalLM",
    "AutoModelForSequenceClassification": "modeling_roformer.RoFormerForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_roformer.RoFormerForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_roformer.RoFormerForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_roformer.RoFormerForMultipleChoice",
}

ROPE_LAYOUTS = ("interleaved", "half")
UNPAD_MODES = ("auto", "always", "never")
NORM_TYPES = ("layer_norm", "rms_norm")
ATTENTION_KERNELS = ("softmax", "linear")
SUMMARY_TYPES = ("last", "first", "mean")
QA_HEADS = ("linear", "span_selection")
# Keys each rope_scaling type accepts, as in transformers' rope utilities (required, optional).
ROPE_SCALING_KEYS = {
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor"}, set()),
    "yarn": (
        {"factor"},
        {
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        },
    ),
}

# Sizes of the published RoFormer checkpoints (ZhuiyiTechnology/roformer, roformer-v2).
PRESETS = {
    "roformer-chinese-small": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536),
    "roformer-chinese-base": dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    ),
    "roformer-v2-chinese-char-small": dict(
        vocab_size=12000,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=6,
        intermediate_size=1536,
        max_position_embeddings=512,
        norm_type="rms_norm",
        use_bias=False,
        hidden_act="relu",
    ),
    "roformer-v2-chinese-char-base": dict(
        vocab_size=12000,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        norm_type="rms_norm",
        use_bias=False,
        hidden_act="relu",
    ),
    "roformer-v2-chinese-char-large": dict(
        vocab_size=12000,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        max_position_embeddings=512,
        norm_type="rms_norm",
        use_bias=False,
        hidden_act="relu",
    ),
}


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


def check_number(label: str, value, minimum: float = 0.0, inclusive: bool = False) -> None:
    """`value` must be a finite real number (not a bool or a string) above `minimum`, or equal to it when `inclusive`;
    the error names `label` (e.g. "RoFormerConfig.rope_theta")."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < minimum
        or (value == minimum and not inclusive)
    ):
        bound = f"a number >= {minimum:g}" if inclusive else "positive" if minimum == 0 else f"a number > {minimum:g}"
        raise ValueError(f"{label} must be {bound} (a finite int or float), got {value!r}")


def config_file_error(name_or_path, kwargs: dict, error: Exception) -> Exception:
    """`error`, raised reading the config.json of `name_or_path` (a folder, a file or a Hub repo), as a ValueError
    whose message starts with the file: who loads a checkpoint knows its folder, not the config class's fields."""
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path):
        name_or_path = os.path.join(name_or_path, kwargs.get("subfolder") or "", "config.json")
    if str(error).startswith(name_or_path):
        return error
    return ValueError(f"{name_or_path}: {error}")


class RoFormerConfig(PreTrainedConfig):
    r"""
    Configuration of a posformers RoFormer model. Defaults give junnyu/roformer_chinese_base.

    Args (beyond transformers' RoFormerConfig, whose fields keep their meaning):
        rope_theta (`float`, defaults to 10000.0): base of the rotary frequencies, `theta_i = rope_theta^(-2i/d)`.
        rotary_dim (`int`, *optional*): number of leading dimensions of each head that are rotated (even, at most the
            head dimension). Defaults to the whole head.
        partial_rotary_factor (`float`, *optional*): the same as a fraction of the head dimension; give one or the
            other (or both, agreeing).
        rope_layout (`str`, defaults to `"interleaved"`): `"interleaved"` rotates pairs `(2i, 2i+1)` (RoFormer, GPT-J
            and every official RoFormer checkpoint); `"half"` rotates `(i, i + d/2)` (GPT-NeoX, LLaMA).
            `modeling_roformer.convert_rope_layout` turns a model of one layout into the other with identical outputs.
        rope_scaling (`dict`, *optional*): for inputs longer than training, `{"rope_type": "linear" | "dynamic" |
            "yarn", "factor": float, ...}` with the keys and formulas of transformers' rope utilities.
        norm_type (`str`, defaults to `"layer_norm"`): `"rms_norm"` is RoFormer-v2's parameter-free RMS norm.
        use_bias (`bool`, defaults to `True`): `False` removes every bias (RoFormer-v2).
        attention_kernel (`str`, defaults to `"softmax"`): `"linear"` is the RoFormer paper's linear attention
            (eq. 19): elu+1 feature map, rotation applied in the numerator only.
        summary_type (`str`, defaults to `"last"`): the token `RoFormerForMultipleChoice` classifies: `"last"` (what
            transformers' RoFormer does, kept for checkpoint compatibility), `"first"` or `"mean"` (over real tokens).
        add_pooling_layer (`bool`, defaults to `False`): give `RoFormerModel` (and so every head built on it) a pooler,
            a dense layer (always with a bias, as in junnyu's RoFormer) on the first token's final hidden state
            followed by `pooler_activation`, returned as `pooler_output`. RoFormer-sim's sentence vector is this
            output (`bert/pooler/dense` / `roformer.pooler.dense` in its checkpoints). transformers' RoFormer has no
            pooler, hence off by default.
        pooler_activation (`str`, defaults to `"tanh"`): the pooler's activation, any name of
            `transformers.activations.ACT2FN`; `"linear"` is none (RoFormer-sim, bert4keras `with_pool='linear'`).
            The field and default are those of junnyu's RoFormer config.
        bidirectional_prompt (`bool`, defaults to `False`): how a decoder (`is_decoder=True`) reads its input.
            `False`: strictly causal everywhere, as transformers' RoFormerForCausalLM and any model trained as a
            left-to-right LM. `True`: junnyu's RoFormerForCausalLM, which RoFormer-sim was published for: a forward
            pass without cached tokens (the prompt, or a whole sequence) is bidirectional, tokens that follow cached
            ones attend causally, and `generate` gives the tokens it generates token type 1 (UniLM-style
            seq2seq generation). Set by `posformers-convert roformer` for RoFormer-sim checkpoints; no effect on an
            encoder.
        unpad_inputs (`str`, defaults to `"auto"`): padding-free execution. `"auto"` runs a batch whose 2D
            attention_mask holds padding on its real tokens only (projections, FFN and norms on the packed tokens,
            attention per sequence), and a batch without padding as it is; `"always"` packs every pass and raises
            where a pass cannot be packed (a decoder or KV-cache pass, output_attentions, a 4D or left-padded mask);
            `"never"` keeps the padded computation. Padded positions of `last_hidden_state` are zeros on the packed
            path. A flattened batch (transformers' `DataCollatorWithFlattening`: one row, position_ids restarting at
            0 per sequence) is always run per sequence, whatever this says.
        question_token_id (`int`, *optional*): the `[QUESTION]` token of question-aware span selection (Splinter's
            QASS head, `RoFormerForQuestionSpanSelection`, and the recurring span selection pre-training of
            `posformers-pretrain --objective rss`, which adds the token to the tokenizer and sets this field).
        qa_head (`str`, defaults to `"linear"`): the head of `RoFormerForQuestionAnswering`. `"linear"`: start and end
            logits from a linear layer on every token. `"span_selection"`: the QASS head of
            `RoFormerForQuestionSpanSelection`, under the same name, so a span-selection checkpoint fine-tunes with
            every head weight; each example then holds exactly one `question_token_id` token, after the question
            (as in Splinter), whose state asks for the answer span.
    """

    model_type = "posformers-roformer"

    vocab_size: int = 50000
    embedding_size: int | None = None
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 1536
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    rotary_value: bool = False
    use_cache: bool = True
    is_decoder: bool = False
    add_cross_attention: bool = False
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    rotary_dim: int | None = None
    partial_rotary_factor: float | None = None
    rope_layout: str = "interleaved"
    rope_scaling: dict | None = None
    norm_type: str = "layer_norm"
    use_bias: bool = True
    attention_kernel: str = "softmax"
    summary_type: str = "last"
    add_pooling_layer: bool = False
    pooler_activation: str = "tanh"
    bidirectional_prompt: bool = False
    unpad_inputs: str = "auto"
    question_token_id: int | None = None
    qa_head: str = "linear"

    def __post_init__(self, **kwargs):
        kwargs.pop("model_type", None)  # a transformers "roformer" config.json becomes ours, see get_config_dict
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        super().__post_init__(**kwargs)
        self.validate_fields()
        self.auto_map = {**AUTO_MAP, **(getattr(self, "auto_map", None) or {})}

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        # HF-format RoFormer checkpoints (transformers' RoFormer, junnyu/roformer_*) say model_type "roformer"; they
        # are meant to load here unchanged, so they are read as ours rather than warned about.
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == "roformer":
            config_dict["model_type"] = cls.model_type
        return config_dict, kwargs

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
    def from_preset(cls, name: str, **overrides) -> "RoFormerConfig":
        """A config of one of the sizes in `PRESETS`, with optional overrides."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r} for {cls.__name__}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate_fields(self):
        """Check every field; runs on creation and again when a model is built (fields may change in between)."""
        for name in (
            "vocab_size",
            "hidden_size",  # before embedding_size, which defaults to it
            "embedding_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            check_integer(self, name)
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"RoFormerConfig.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        check_integer(self, "type_vocab_size", 0)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_probability(self, name)
        check_pad_token_id(self)
        check_span_selection_fields(self)
        check_number("RoFormerConfig.rope_theta", self.rope_theta)
        check_number("RoFormerConfig.layer_norm_eps", self.layer_norm_eps, inclusive=True)
        check_number("RoFormerConfig.initializer_range", self.initializer_range, inclusive=True)
        for name, allowed in (
            ("rope_layout", ROPE_LAYOUTS),
            ("norm_type", NORM_TYPES),
            ("attention_kernel", ATTENTION_KERNELS),
            ("summary_type", SUMMARY_TYPES),
            ("unpad_inputs", UNPAD_MODES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"RoFormerConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("add_pooling_layer", "bidirectional_prompt", "use_bias", "rotary_value"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RoFormerConfig.{name} must be True or False, got {getattr(self, name)!r}")
        self._validate_activation("hidden_act", "'gelu'")
        self._validate_activation("pooler_activation", "'tanh', or 'linear' for none, as RoFormer-sim uses")
        if self.add_cross_attention:
            raise ValueError(
                "RoFormerConfig.add_cross_attention=True is not supported: posformers' RoFormer is an encoder "
                "(or a decoder-only causal LM), without cross-attention layers"
            )
        self.rope_scaling = self._validated_rope_scaling(self.rope_scaling)
        self._validate_rotary_dim()

    def _validate_activation(self, name: str, example: str):
        from transformers.activations import ACT2FN

        value = getattr(self, name)
        if not isinstance(value, str) or value not in ACT2FN:
            raise ValueError(
                f"RoFormerConfig.{name} must be the name of an activation in transformers' ACT2FN (e.g. {example}), "
                f"got {value!r}; known: {sorted(ACT2FN)}"
            )

    @property
    def rope_dim(self) -> int:
        """Number of rotated features per head: `rotary_dim`, else `partial_rotary_factor` x head_dim, else all."""
        if self.rotary_dim is not None:
            return self.rotary_dim
        if self.partial_rotary_factor is not None:
            return int(self.head_dim * self.partial_rotary_factor)
        return self.head_dim

    def _validate_rotary_dim(self):
        head_dim = self.head_dim
        if self.partial_rotary_factor is not None:
            factor = self.partial_rotary_factor
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0.0 < factor <= 1.0:
                raise ValueError(
                    f"RoFormerConfig.partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}"
                )
            from_factor = int(head_dim * self.partial_rotary_factor)
            if self.rotary_dim is not None and self.rotary_dim != from_factor:
                raise ValueError(
                    f"RoFormerConfig.rotary_dim ({self.rotary_dim}) disagrees with partial_rotary_factor "
                    f"({self.partial_rotary_factor} x head_dim {head_dim} = {from_factor}); give only one of them"
                )
        rope_dim = self.rope_dim
        if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim <= 0:
            raise ValueError(f"RoFormerConfig.rotary_dim must be a positive integer, got {rope_dim!r}")
        if rope_dim % 2 or rope_dim > head_dim:
            raise ValueError(
                f"RoFormerConfig.rotary_dim must be even and at most the head dimension ({head_dim}), got {rope_dim}"
            )
        if (self.rope_scaling or {}).get("rope_type") == "dynamic" and rope_dim <= 2:
            raise ValueError("RoFormerConfig: dynamic NTK scaling needs a rotary dimension above 2")

    def _validated_rope_scaling(self, scaling):
        if scaling is None:
            return None
        if not isinstance(scaling, dict):
            raise ValueError(f"RoFormerConfig.rope_scaling must be a dict or None, got {type(scaling).__name__}")
        scaling = dict(scaling)
        if "type" in scaling and "rope_type" not in scaling:  # legacy key, as in older transformers configs
            scaling["rope_type"] = scaling.pop("type")
        rope_type = scaling.get("rope_type")
        if rope_type in (None, "default"):
            return None
        if rope_type not in ROPE_SCALING_KEYS:
            raise ValueError(
                f"RoFormerConfig.rope_scaling['rope_type'] must be one of {sorted(ROPE_SCALING_KEYS)}, "
                f"got {rope_type!r}"
            )
        required, optional = ROPE_SCALING_KEYS[rope_type]
        given = set(scaling) - {"rope_type"}
        if missing := required - given:
            raise ValueError(f"RoFormerConfig.rope_scaling of type {rope_type!r} needs the key(s) {sorted(missing)}")
        if unknown := given - required - optional:
            raise ValueError(
                f"RoFormerConfig.rope_scaling of type {rope_type!r} does not take the key(s) {sorted(unknown)}; "
                f"allowed: {sorted(required | optional)}"
            )
        check_number("RoFormerConfig.rope_scaling['factor']", scaling["factor"], minimum=1.0, inclusive=True)
        if rope_type == "yarn":
            original = scaling.setdefault("original_max_position_embeddings", self.max_position_embeddings)
            if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
                raise ValueError(
                    "RoFormerConfig.rope_scaling['original_max_position_embeddings'] must be a positive integer, "
                    f"got {original!r}"
                )
            # The ramp and attention-factor formulas take logarithms of these: a string, 0 or a negative is an
            # error deep inside math.log otherwise. None means the key's default, as in transformers.
            for key in ("attention_factor", "beta_fast", "beta_slow"):
                if scaling.get(key) is not None:
                    check_number(f"RoFormerConfig.rope_scaling[{key!r}]", scaling[key])
            for key in ("mscale", "mscale_all_dim"):  # 0 means unset, as in transformers' formula
                if scaling.get(key) is not None:
                    check_number(f"RoFormerConfig.rope_scaling[{key!r}]", scaling[key], inclusive=True)
            if not isinstance(scaling.get("truncate", True), bool):
                raise ValueError(
                    f"RoFormerConfig.rope_scaling['truncate'] must be True or False, got {scaling['truncate']!r}"
                )
            if (scaling.get("beta_fast") or 32) < (scaling.get("beta_slow") or 1):
                raise ValueError("RoFormerConfig.rope_scaling['beta_fast'] must be >= beta_slow")
        return scaling


__all__ = ["AUTO_MAP", "PRESETS", "RoFormerConfig"]
