"""LittleBird configuration.

LittleBird (Lee, Han, Shin, EMNLP 2022, arXiv 2210.11870) is a long-input encoder: pack/unpack attention (LUNA-style)
carries global information, block sliding-window attention with a global first block carries local information, and
BiALiBi biases are the only position signal, so there is no maximum length. Field names follow BERT's where they apply;
the architecture, with every decision marked, is described in `modeling_littlebird.py`.
"""

import contextlib
import math

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .configuration_common import QA_HEADS, UNPAD_MODES, PresetConfigMixin, check_common_fields, check_integer

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

# The paper's two sizes (Table 1); block and pack length 64 for both.
PRESETS = {
    "littlebird-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "littlebird-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def check_finite_number(config: PreTrainedConfig, name: str, positive: bool = False) -> None:
    """`config.<name>` must be a finite number (not a bool), > 0 with `positive`, else >= 0; the error names the field.
    A NaN epsilon or initializer_range would otherwise reach the LayerNorms or torch's init as it is."""
    value = getattr(config, name)
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not is_number or value < 0 or (positive and value == 0):
        kind = "positive and finite" if positive else "a finite number >= 0"
        raise ValueError(f"{type(config).__name__}.{name} must be {kind}, got {value!r}")


class LittleBirdConfig(PresetConfigMixin, PreTrainedConfig):
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
    presets = PRESETS

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

    def validate_fields(self):
        """Check every field; runs on creation and again when a model is built (fields may change in between)."""
        check_common_fields(self)
        for name in ("block_size", "pack_length", "global_prefix_length"):
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
        check_finite_number(self, "layer_norm_eps", positive=True)
        check_finite_number(self, "initializer_range")
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
        if self.is_decoder or self.add_cross_attention:
            raise ValueError(
                "LittleBirdConfig.is_decoder / add_cross_attention must be False: LittleBird is a bidirectional "
                "encoder without cross-attention"
            )


__all__ = ["AUTO_MAP", "PRESETS", "QA_HEADS", "UNPAD_MODES", "LittleBirdConfig"]
