"""DeBERTa configuration: v1, v2 and v3 in one config.

Field names and meanings are those of the official `config.json` files (and of transformers' `DebertaConfig` /
`DebertaV2Config`, which use the same names), so an official config file loads as it is, whether it says model_type
"deberta" or "deberta-v2"; the fields posformers adds are documented on `DebertaConfig`.

`model_type` is "posformers-deberta": transformers already registers "deberta" and "deberta-v2", and a folder saved
under either name would silently load as transformers' classes.
"""

from transformers.utils import logging

from .configuration_common import (
    BASE,
    LARGE,
    SMALL,
    XLARGE,
    EncoderConfig,
    auto_map,
    check_activation,
    check_choice,
    check_flags,
    check_integer,
    check_probability,
)

logger = logging.get_logger(__name__)

# The Auto classes this model's heads are registered with (`auto_map`).
AUTO_MAP = auto_map("deberta", "Deberta", AutoModelForPreTraining="DebertaForReplacedTokenDetection")


# What a field means when an official / transformers config.json leaves it out: the defaults of transformers'
# DebertaConfig / DebertaV2Config and of the official code's `getattr(config, name, default)` calls. posformers' own
# defaults are deberta-v3-base, so without this a v1 file lacking `position_buckets` would get 256 buckets.
OFFICIAL_COMMON_DEFAULTS = dict(
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    type_vocab_size=0,
    initializer_range=0.02,
    layer_norm_eps=1e-7,
    relative_attention=False,
    max_relative_positions=-1,
    position_biased_input=True,
    pos_att_type=None,
    position_buckets=-1,
    share_att_key=False,
    norm_rel_ebd="none",
    conv_kernel_size=0,
    conv_act="tanh",
    conv_groups=1,
    pooler_dropout=0.0,
    pooler_hidden_act="gelu",
)
OFFICIAL_DEFAULTS = {
    "deberta": dict(OFFICIAL_COMMON_DEFAULTS, vocab_size=50265, **BASE, projection_layout="fused"),
    "deberta-v2": dict(OFFICIAL_COMMON_DEFAULTS, vocab_size=128100, **XLARGE, projection_layout="separate"),
}

_V1 = dict(
    vocab_size=50265,
    relative_attention=True,
    pos_att_type="c2p|p2c",
    max_relative_positions=-1,
    position_biased_input=False,
    position_buckets=-1,
    share_att_key=False,
    norm_rel_ebd="none",
    projection_layout="fused",
)
# v2 changed from v1: the vocabulary (SentencePiece), log-bucketed positions, a key projection shared with the
# positions, a LayerNorm on the relative embeddings, separate q/k/v projections
_V2 = dict(
    _V1,
    vocab_size=128100,
    pos_att_type="p2c|c2p",
    position_buckets=256,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    projection_layout="separate",
)
_V2_CONV = dict(_V2, conv_kernel_size=3, conv_act="gelu")
_V3 = dict(_V2, conv_kernel_size=0)

# Sizes and options of the published checkpoints (microsoft/deberta-*, deberta-v2-*, deberta-v3-*, mdeberta-v3-base).
PRESETS = {
    "deberta-base": {**_V1, **BASE},
    "deberta-large": {**_V1, **LARGE},
    "deberta-xlarge": {**_V1, **LARGE, "num_hidden_layers": 48},
    "deberta-v2-xlarge": {**_V2_CONV, **XLARGE},
    "deberta-v2-xxlarge": {**_V2_CONV, **XLARGE, "num_hidden_layers": 48},
    "deberta-v3-xsmall": {**_V3, **SMALL, "num_hidden_layers": 12},
    "deberta-v3-small": {**_V3, **BASE, "num_hidden_layers": 6},
    "deberta-v3-base": {**_V3, **BASE},
    "deberta-v3-large": {**_V3, **LARGE},
    "mdeberta-v3-base": {**_V3, **BASE, "vocab_size": 251000},
}


POS_ATT_TYPES = ("c2p", "p2c")


def parse_pos_att_type(value) -> list[str]:
    """ "c2p|p2c" (official files), ["c2p", "p2c"] (transformers) or None -> a lower-case list, order kept. "none"
    (the official experiment configs' spelling of "no position terms", e.g. bert_base.json) adds no entry."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split("|")
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"DebertaConfig.pos_att_type must be a string such as 'p2c|c2p', a list of entries or None, got {value!r}"
        )
    entries = (str(entry).strip().lower() for entry in value)
    return [entry for entry in entries if entry and entry != "none"]


def pooler_fields(config: dict, repository_format: bool) -> dict:
    """The official `pooling` section of a config dict (`{"hidden_size", "dropout", "hidden_act"}`, written by the
    microsoft/DeBERTa repository's fine-tuning) as posformers' `pooler_*` fields: `config` without the section, plus
    the fields. The official `PoolConfig` (deberta/pooling.py) reads a missing entry of the section as dropout 0 and
    "gelu", and a missing section as the model config itself: the model's own `hidden_act`, dropout 0. That fallback
    applies to the repository's files (`repository_format`); in a config.json, transformers reads `pooler_*` fields
    and ignores the section, so fields stated there win and a missing section leaves transformers' defaults."""
    config = dict(config)
    pooling = config.pop("pooling", None)
    if pooling is None and not repository_format:
        return config
    if pooling is None:
        pooling = {"hidden_act": config.get("hidden_act", "gelu")}
    if not isinstance(pooling, dict):
        raise ValueError(f"the config's `pooling` section must be a dict, got {pooling!r}")
    fields = {
        "pooler_hidden_size": pooling.get("hidden_size", config.get("hidden_size")),
        "pooler_dropout": pooling.get("dropout", 0),
        "pooler_hidden_act": pooling.get("hidden_act", "gelu"),
    }
    if not repository_format:
        fields = {name: value for name, value in fields.items() if name not in config}
    return {**config, **{name: value for name, value in fields.items() if value is not None}}


NORM_REL_EBD = ("none", "layer_norm")


def parse_norm_rel_ebd(value) -> list[str]:
    """ "layer_norm", "none" or "none|layer_norm" (official syntax) -> the list of entries."""
    return [entry.strip().lower() for entry in str(value or "none").split("|") if entry.strip()]


class DebertaConfig(EncoderConfig):
    r"""
    Configuration of a posformers DeBERTa model (v1, v2 or v3). Defaults give microsoft/deberta-v3-base;
    `DebertaConfig.from_preset(name)` gives the other published sizes.

    Args (names and meanings of the official config files):
        relative_attention (`bool`, defaults to `True`): disentangled attention with relative position embeddings.
        max_relative_positions (`int`, defaults to `-1`): relative distances are clipped to this span; below 1 it
            means `max_position_embeddings`.
        position_buckets (`int`, defaults to `256` with `relative_attention`, else `-1`): number of log buckets for
            relative distances (v2/v3); `-1` (or 0) uses the distances themselves (v1). A value set without
            `relative_attention` is ignored (set to -1, with a logged note), as the official code ignores it.
        pos_att_type (`str` or `list[str]`, defaults to `["p2c", "c2p"]`): which position terms enter the attention
            scores: "c2p" (content-to-position), "p2c" (position-to-content). Official files write "p2c|c2p". The
            scores are scaled by `1 / sqrt(head_dim * (1 + len(pos_att_type)))`, as in the official code. "none" (the
            official experiment configs' spelling) means no position term.
        share_att_key (`bool`, defaults to `True`): project relative embeddings with the content query/key
            projections (v2/v3) instead of separate position projections.
        norm_rel_ebd (`str`, defaults to `"layer_norm"`): `"layer_norm"` normalises the relative embedding table
            (v2/v3); `"none"` does not.
        position_biased_input (`bool`, defaults to `False`): add absolute position embeddings to the input
            embeddings (BERT style). When `False` (every official DeBERTa), absolute positions enter only in the
            Enhanced Mask Decoder of `DebertaForMaskedLM`. A config with neither this nor `relative_attention` (with
            at least one `pos_att_type` term) is refused: its encoder would not see word order at all.
        conv_kernel_size (`int`, defaults to `0`): kernel of the convolution layer applied after the first
            transformer layer (v2: 3); 0 disables it. `conv_act` (defaults to `"tanh"`, v2 checkpoints use "gelu")
            and `conv_groups` (defaults to 1) configure it.
        attention_head_size (`int`, *optional*): size of each head; must equal hidden_size / num_attention_heads
            (official v2/v3 files state it).
        embedding_size (`int`, *optional*): width of the word embeddings when it differs from `hidden_size` (a
            bias-free `embed_proj` maps it up).
        pooler_hidden_size, pooler_dropout, pooler_hidden_act: the context pooler of the classification heads
            (dense on the first token, then activation). `cls_dropout`: dropout before the classifier (defaults to
            `hidden_dropout_prob`). A config.json carrying the official `pooling` section maps it (`pooler_fields`).

    `talking_head` (early official releases) is not supported: a config enabling it is refused.

    Args (posformers):
        projection_layout (`str`, defaults to `"separate"`): `"separate"` stores v2/v3 projections
            (`query_proj`, `key_proj`, `value_proj`, `pos_key_proj`, `pos_query_proj`); `"fused"` stores v1 ones
            (`in_proj` without bias, `q_bias`, `v_bias`, `pos_proj` without bias, `pos_q_proj`). Loading an official
            file sets it from model_type ("deberta" -> fused, "deberta-v2" -> separate).
        emd_steps (`int`, defaults to `2`): how many times the Enhanced Mask Decoder of `DebertaForMaskedLM` applies
            the last encoder layer (the official code: 2). 0 turns the EMD off (the LM head reads the encoder output,
            as transformers' DebertaForMaskedLM does). The EMD exists only when `position_biased_input` is `False`,
            as in the official code.
        clip_relative_positions (`bool`, defaults to `True`): with `position_buckets`, which arithmetic maps a
            distance beyond `max_relative_positions` (else `max_position_embeddings`) to a relative row. `True`: the
            microsoft/DeBERTa repository's, distances clipped to `±(max_relative_positions - 1)` before the log
            bucket, so every pair reads a row training at that length reached. `False`: transformers' port's, op for
            op (PyPI `deberta` 0.1.12 does not clip either): far buckets run past the table and the row index clamps
            at its ends (a key far after its query reads row 0). Without buckets both are the same. The drop-in
            (`posformers.enable()`, `posformers.optimize`) sets `False`, so weights fine-tuned with transformers get
            transformers' answers at every length.
    """

    model_type = "posformers-deberta"
    presets = PRESETS
    default_auto_map = AUTO_MAP

    vocab_size: int = 128100
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    relative_attention: bool = True
    max_relative_positions: int = -1
    # None: 256 (deberta-v3-base) with relative attention, -1 without, so that only a value the user or the file set
    # draws the "ignored" note
    position_buckets: int | None = None
    pos_att_type: str | list[str] | None = "p2c|c2p"
    share_att_key: bool = True
    norm_rel_ebd: str = "layer_norm"
    position_biased_input: bool = False
    conv_kernel_size: int = 0
    conv_act: str = "tanh"
    conv_groups: int = 1
    attention_head_size: int | None = None
    embedding_size: int | None = None
    pooler_hidden_size: int | None = None
    pooler_dropout: float | int = 0.0
    pooler_hidden_act: str = "gelu"
    cls_dropout: float | int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    projection_layout: str = "separate"
    emd_steps: int = 2
    clip_relative_positions: bool = True

    def __post_init__(self, **kwargs):
        kwargs.pop("model_type", None)  # an official "deberta" / "deberta-v2" config.json becomes ours
        self.pos_att_type = parse_pos_att_type(self.pos_att_type)
        if self.position_buckets is None:
            self.position_buckets = 256 if self.relative_attention is True else -1
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.pooler_hidden_size is None:
            self.pooler_hidden_size = self.hidden_size
        super().__post_init__(**kwargs)

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        # Official checkpoints (and folders written by transformers' DeBERTa) say model_type "deberta" or
        # "deberta-v2". They load here unchanged: fields they leave out take the value transformers / the official
        # code would give them, and the projection layout follows the version.
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        official = config_dict.get("model_type")
        if official in OFFICIAL_DEFAULTS:
            config_dict = pooler_fields(config_dict, repository_format=False)
            config_dict = {**OFFICIAL_DEFAULTS[official], **config_dict, "model_type": cls.model_type}
            if config_dict.get("pos_att_type") is None:
                config_dict["pos_att_type"] = []
        return config_dict, kwargs

    @property
    def head_dim(self) -> int:
        return self.attention_head_size or self.hidden_size // self.num_attention_heads

    @property
    def relative_span(self) -> int:
        """Half the number of relative embedding rows: `position_buckets` if bucketed, else the clipping distance."""
        if self.position_buckets > 0:
            return self.position_buckets
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def max_relative_distance(self) -> int:
        """The `max_position` of the log buckets: `max_relative_positions`, else `max_position_embeddings`."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def uses_emd(self) -> bool:
        """Whether `DebertaForMaskedLM` runs the Enhanced Mask Decoder (official: only without absolute input bias)."""
        return not self.position_biased_input and self.emd_steps > 0

    def validate_fields(self):
        super().validate_fields()
        for name in ("max_position_embeddings", "embedding_size", "pooler_hidden_size"):
            check_integer(self, name)
        if getattr(self, "talking_head", False):
            raise ValueError(
                "DebertaConfig.talking_head is not supported: the talking-heads projections of early official DeBERTa "
                "releases (head_logits_proj, head_weights_proj) are not implemented; set talking_head to false"
            )
        for name in ("conv_kernel_size", "emd_steps"):
            check_integer(self, name, 0)
        check_integer(self, "max_relative_positions", -1)
        check_integer(self, "position_buckets", -1)
        if self.attention_head_size is not None:
            check_integer(self, "attention_head_size")
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ValueError(
                f"DebertaConfig: num_attention_heads ({self.num_attention_heads}) x attention_head_size "
                f"({self.head_dim}) must equal hidden_size ({self.hidden_size})"
            )
        check_probability(self, "pooler_dropout")
        if self.cls_dropout is not None:  # None means hidden_dropout_prob
            check_probability(self, "cls_dropout")
        check_flags(self, ("relative_attention", "share_att_key", "position_biased_input", "clip_relative_positions"))
        check_activation(self, "pooler_hidden_act")
        check_activation(self, "conv_act")
        check_choice(self, "projection_layout", ("separate", "fused"))
        self._validate_relative_attention()
        self._validate_position_information()
        if self.conv_kernel_size > 0:
            if self.conv_kernel_size % 2 == 0:
                raise ValueError(
                    f"DebertaConfig.conv_kernel_size must be odd (the official padding (k - 1) // 2 keeps the length "
                    f"only for odd kernels), got {self.conv_kernel_size}"
                )
            if not isinstance(self.conv_groups, int) or self.conv_groups < 1 or self.hidden_size % self.conv_groups:
                raise ValueError(
                    f"DebertaConfig.conv_groups must be a positive divisor of hidden_size ({self.hidden_size}), "
                    f"got {self.conv_groups!r}"
                )

    def _validate_position_information(self):
        # Without absolute positions at the input and without a relative position term, the encoder's attention is
        # blind to word order: reversing the input reverses the outputs, and nothing says so.
        if self.position_biased_input:
            return
        if not self.relative_attention:
            raise ValueError(
                "DebertaConfig has no position information: position_biased_input and relative_attention are both "
                "false; set relative_attention=True (DeBERTa's relative positions) or position_biased_input=True "
                "(absolute positions at the input)"
            )
        if not self.pos_att_type:
            raise ValueError(
                "DebertaConfig has no position information: position_biased_input is false and pos_att_type names no "
                "relative position term; set pos_att_type='p2c|c2p' or position_biased_input=True"
            )

    def _validate_relative_attention(self):
        entries = parse_pos_att_type(self.pos_att_type)
        if "p2p" in entries:
            raise ValueError(
                "DebertaConfig.pos_att_type: 'p2p' is not supported. The official code never computes it (v1 only "
                "counts it in the scale, v2/v3 fail on it) and no published checkpoint uses it; choose from "
                f"{POS_ATT_TYPES}"
            )
        if unknown := [entry for entry in entries if entry not in POS_ATT_TYPES]:
            raise ValueError(
                f"DebertaConfig.pos_att_type has unknown entries {unknown}; allowed: {POS_ATT_TYPES} (a list, or a "
                "string such as 'p2c|c2p')"
            )
        if len(set(entries)) != len(entries):
            raise ValueError(f"DebertaConfig.pos_att_type lists an entry twice: {entries}")
        self.pos_att_type = entries
        norms = parse_norm_rel_ebd(self.norm_rel_ebd)
        if unknown := [entry for entry in norms if entry not in NORM_REL_EBD]:
            raise ValueError(f"DebertaConfig.norm_rel_ebd has unknown entries {unknown}; allowed: {NORM_REL_EBD}")
        if self.position_buckets == 0:
            self.position_buckets = -1  # 0 and -1 both mean "no buckets" in the official code
        if self.position_buckets > 0 and not self.relative_attention:
            # The official code reads position_buckets only with relative attention; its own bert_base.json sets 256
            # with relative_attention false.
            logger.warning(
                f"DebertaConfig.position_buckets={self.position_buckets} is ignored: relative_attention is false "
                "(as in the official code); set to -1"
            )
            self.position_buckets = -1
        if self.position_buckets > 0:
            if not self.relative_attention:
                raise ValueError(
                    f"DebertaConfig.position_buckets={self.position_buckets} needs relative_attention=True (buckets "
                    "index relative position embeddings); set position_buckets=-1 for a model without them"
                )
            if self.position_buckets < 2 or self.position_buckets // 2 >= self.max_relative_distance - 1:
                raise ValueError(
                    f"DebertaConfig.position_buckets ({self.position_buckets}) must be at least 2 and its half must "
                    f"be below max_relative_positions - 1 (here {self.max_relative_distance - 1}; "
                    "max_relative_positions < 1 means max_position_embeddings)"
                )


__all__ = ["AUTO_MAP", "OFFICIAL_COMMON_DEFAULTS", "OFFICIAL_DEFAULTS", "PRESETS", "DebertaConfig", "pooler_fields"]
