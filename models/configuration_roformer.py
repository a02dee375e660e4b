"""RoFormer configuration.

Field names and meanings follow transformers' `RoFormerConfig`, so a `config.json` written for transformers' RoFormer
(or published with the junnyu/roformer_* checkpoints) loads as it is; the fields posformers adds (rotary options,
RoFormer-v2's, linear attention) are documented on `RoFormerConfig`.

`model_type` is "posformers-roformer", not "roformer": transformers already registers "roformer", and a folder saved
with that name would silently load as transformers' class.
"""

from transformers.utils import logging

from .configuration_common import (
    BASE,
    LARGE,
    SMALL,
    EncoderConfig,
    auto_map,
    check_activation,
    check_choice,
    check_flags,
    check_integer,
    check_number,
)

logger = logging.get_logger(__name__)

# The Auto classes this model's heads are registered with (`auto_map`).
AUTO_MAP = auto_map("roformer", "RoFormer", AutoModelForCausalLM="RoFormerForCausalLM")

ROPE_THETA = 10000.0
# Keys each `rope_parameters["rope_type"]` takes besides rope_type, rope_theta and partial_rotary_factor, as in
# transformers' rope utilities: (required, optional).
ROPE_TYPE_KEYS = {
    "default": (set(), set()),
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

# RoFormer-v2: a smaller vocabulary and context, parameter-free RMS norm, no biases, relu.
_V2 = dict(vocab_size=12000, max_position_embeddings=512, norm_type="rms_norm", use_bias=False, hidden_act="relu")
# Sizes of the published RoFormer checkpoints (ZhuiyiTechnology/roformer, roformer-v2).
PRESETS = {
    "roformer-chinese-small": {**SMALL},
    "roformer-chinese-base": {**BASE},
    "roformer-v2-chinese-char-small": {**_V2, **SMALL},
    "roformer-v2-chinese-char-base": {**_V2, **BASE},
    "roformer-v2-chinese-char-large": {**_V2, **LARGE},
}


def rope_parameters_dict(value) -> dict:
    """A copy of `rope_parameters` (None: an empty dict), refusing anything but a dict."""
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"RoFormerConfig.rope_parameters must be a dict or None, got {type(value).__name__}")
    return dict(value or {})


class RoFormerConfig(EncoderConfig):
    r"""
    Configuration of a posformers RoFormer model. Defaults give junnyu/roformer_chinese_base.

    Args (beyond transformers' RoFormerConfig, whose fields keep their meaning):
        rope_parameters (`dict`, *optional*): the rotary frequencies in transformers' format, `{"rope_type":
            "default" | "linear" | "dynamic" | "yarn", "rope_theta": float, "factor": float, ...}` with the keys and
            formulas of transformers' rope utilities. `rope_theta` (defaults to 10000.0) is the base,
            `theta_i = rope_theta^(-2i/d)`; the other types scale the frequencies for inputs longer than training.
            Defaults to `{"rope_type": "default", "rope_theta": 10000.0}`. The fields earlier posformers (and
            transformers 4) wrote instead, `rope_theta` and `rope_scaling`, are read into it.
        rotary_dim (`int`, *optional*): number of leading dimensions of each head that are rotated (even, at most the
            head dimension). Defaults to the whole head.
        partial_rotary_factor (`float`, *optional*): the same as a fraction of the head dimension; give one or the
            other (or both, agreeing). A `partial_rotary_factor` inside `rope_parameters` is moved here.
        rope_layout (`str`, defaults to `"interleaved"`): `"interleaved"` rotates pairs `(2i, 2i+1)` (RoFormer, GPT-J
            and every official RoFormer checkpoint); `"half"` rotates `(i, i + d/2)` (GPT-NeoX, LLaMA).
            `modeling_roformer.convert_rope_layout` turns a model of one layout into the other with identical outputs.
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
        unpad_inputs: as in `EncoderConfig`; a decoder or KV-cache pass also runs padded.
    """

    model_type = "posformers-roformer"
    presets = PRESETS
    default_auto_map = AUTO_MAP

    vocab_size: int = 50000
    embedding_size: int | None = None
    max_position_embeddings: int = 1536
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    rotary_value: bool = False
    use_cache: bool = True
    is_decoder: bool = False
    add_cross_attention: bool = False
    rope_parameters: dict | None = None
    rotary_dim: int | None = None
    partial_rotary_factor: float | None = None
    rope_layout: str = "interleaved"
    norm_type: str = "layer_norm"
    use_bias: bool = True
    attention_kernel: str = "softmax"
    summary_type: str = "last"
    add_pooling_layer: bool = False
    pooler_activation: str = "tanh"
    bidirectional_prompt: bool = False

    def __post_init__(self, **kwargs):
        kwargs.pop("model_type", None)  # a transformers "roformer" config.json becomes ours, see get_config_dict
        self._read_legacy_rope_fields(kwargs)
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        super().__post_init__(**kwargs)

    def _read_legacy_rope_fields(self, kwargs: dict):
        # config.json files of earlier posformers state `rope_theta` and `rope_scaling` (transformers 4's names);
        # transformers 5 holds both in `rope_parameters`. Read here, before transformers' own conversion, which
        # warns about `rope_scaling`: the file is not wrong, only older.
        theta, scaling = kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        if scaling is not None:
            if self.rope_parameters is not None:
                raise ValueError("RoFormerConfig: give rope_parameters or the older rope_scaling, not both")
            self.rope_parameters = scaling
        self.rope_parameters = rope_parameters_dict(self.rope_parameters)
        if theta is not None:
            self.rope_parameters = {"rope_theta": theta, **self.rope_parameters}

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        # HF-format RoFormer checkpoints (transformers' RoFormer, junnyu/roformer_*) say model_type "roformer"; they
        # are meant to load here unchanged, so they are read as ours rather than warned about.
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == "roformer":
            config_dict["model_type"] = cls.model_type
        return config_dict, kwargs

    def validate_fields(self):
        super().validate_fields()
        for name in ("embedding_size", "max_position_embeddings"):
            check_integer(self, name)
        for name, allowed in (
            ("rope_layout", ("interleaved", "half")),
            ("norm_type", ("layer_norm", "rms_norm")),
            ("attention_kernel", ("softmax", "linear")),
            ("summary_type", ("last", "first", "mean")),
        ):
            check_choice(self, name, allowed)
        check_flags(self, ("add_pooling_layer", "bidirectional_prompt", "use_bias", "rotary_value"))
        check_activation(self, "pooler_activation")  # "linear" is none, as RoFormer-sim uses
        if self.add_cross_attention:
            raise ValueError(
                "RoFormerConfig.add_cross_attention=True is not supported: posformers' RoFormer is an encoder "
                "(or a decoder-only causal LM), without cross-attention layers"
            )
        self.rope_parameters = self._validated_rope_parameters(self.rope_parameters)
        self._validate_rotary_dim()

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
        if self.rope_parameters["rope_type"] == "dynamic" and rope_dim <= 2:
            raise ValueError("RoFormerConfig: dynamic NTK scaling needs a rotary dimension above 2")

    def _validated_rope_parameters(self, parameters) -> dict:
        """`parameters` checked and completed as transformers' `standardize_rope_params` completes them: rope_type
        (legacy key "type"), rope_theta and YaRN's original_max_position_embeddings filled in."""
        parameters = rope_parameters_dict(parameters)
        if "type" in parameters:  # legacy key, as in older transformers configs
            parameters.setdefault("rope_type", parameters.pop("type"))
        parameters.setdefault("rope_type", "default")
        parameters.setdefault("rope_theta", ROPE_THETA)
        factor = parameters.pop("partial_rotary_factor", None)
        if factor is not None and self.partial_rotary_factor not in (None, factor):
            raise ValueError(
                f"RoFormerConfig.rope_parameters['partial_rotary_factor'] ({factor!r}) disagrees with "
                f"partial_rotary_factor ({self.partial_rotary_factor!r}); give only one of them"
            )
        if factor is not None:
            self.partial_rotary_factor = factor
        rope_type = parameters["rope_type"]
        if rope_type not in ROPE_TYPE_KEYS:
            raise ValueError(
                f"RoFormerConfig.rope_parameters['rope_type'] must be one of {sorted(ROPE_TYPE_KEYS)}, "
                f"got {rope_type!r}"
            )
        required, optional = ROPE_TYPE_KEYS[rope_type]
        given = set(parameters) - {"rope_type", "rope_theta"}
        if missing := required - given:
            raise ValueError(f"RoFormerConfig.rope_parameters of type {rope_type!r} needs the key(s) {sorted(missing)}")
        if unknown := given - required - optional:
            # transformers' rope validation warns and keeps them (its own tests write original_max_position_embeddings
            # into every type), and a config it accepts must load here too
            logger.warning(
                f"RoFormerConfig.rope_parameters of type {rope_type!r} ignores the key(s) {sorted(unknown)}; it reads "
                f"{sorted(required | optional | {'rope_theta', 'partial_rotary_factor'})}"
            )
        check_number("RoFormerConfig.rope_parameters['rope_theta']", parameters["rope_theta"])
        if "factor" in required:
            check_number("RoFormerConfig.rope_parameters['factor']", parameters["factor"], minimum=1.0, inclusive=True)
        if rope_type == "yarn":
            self._validate_yarn(parameters)
        return parameters

    def _validate_yarn(self, parameters: dict):
        original = parameters.setdefault("original_max_position_embeddings", self.max_position_embeddings)
        if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise ValueError(
                "RoFormerConfig.rope_parameters['original_max_position_embeddings'] must be a positive integer, "
                f"got {original!r}"
            )
        # The ramp and attention-factor formulas take logarithms of these: a string, 0 or a negative is an error deep
        # inside math.log otherwise. None means the key's default, as in transformers.
        for key in ("attention_factor", "beta_fast", "beta_slow"):
            if parameters.get(key) is not None:
                check_number(f"RoFormerConfig.rope_parameters[{key!r}]", parameters[key])
        for key in ("mscale", "mscale_all_dim"):  # 0 means unset, as in transformers' formula
            if parameters.get(key) is not None:
                check_number(f"RoFormerConfig.rope_parameters[{key!r}]", parameters[key], inclusive=True)
        if not isinstance(parameters.get("truncate", True), bool):
            raise ValueError(
                f"RoFormerConfig.rope_parameters['truncate'] must be True or False, got {parameters['truncate']!r}"
            )
        if (parameters.get("beta_fast") or 32) < (parameters.get("beta_slow") or 1):
            raise ValueError("RoFormerConfig.rope_parameters['beta_fast'] must be >= beta_slow")


__all__ = ["AUTO_MAP", "PRESETS", "RoFormerConfig"]
