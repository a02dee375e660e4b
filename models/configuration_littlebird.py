"""LittleBird configuration.

LittleBird (Lee, Han, Shin, EMNLP 2022, arXiv 2210.11870) is a long-input encoder: pack/unpack attention (LUNA-style)
carries global information, block sliding-window attention with a global first block carries local information, and
BiALiBi biases are the only position signal, so there is no maximum length. Field names follow BERT's where they apply;
the architecture, with every decision marked, is described in `modeling_littlebird.py`.
"""

import contextlib
import math

from .configuration_common import BASE, LARGE, EncoderConfig, auto_map, check_integer

# The Auto classes this model's heads are registered with (`auto_map`).
AUTO_MAP = auto_map("littlebird", "LittleBird")

BIALIBI_INITS = ("alibi",)

# The paper's two sizes (Table 1); block and pack length 64 for both.
PRESETS = {
    "littlebird-base": {**BASE},
    "littlebird-large": {**LARGE},
}


class LittleBirdConfig(EncoderConfig):
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
    """

    model_type = "littlebird"
    presets = PRESETS
    default_auto_map = AUTO_MAP

    block_size: int = 64
    pack_length: int = 64
    bialibi_init: str | float = "alibi"
    global_prefix_length: int = 1
    is_decoder: bool = False
    add_cross_attention: bool = False

    def validate_fields(self):
        super().validate_fields()
        for name in ("block_size", "pack_length", "global_prefix_length"):
            check_integer(self, name)
        if self.global_prefix_length > self.block_size:
            raise ValueError(
                f"LittleBirdConfig.global_prefix_length ({self.global_prefix_length}) must be at most block_size "
                f"({self.block_size}): the distance-free prefix must lie in block 0, which every query block attends"
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


__all__ = ["AUTO_MAP", "PRESETS", "LittleBirdConfig"]
