"""PyTorch RoFormer (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding").

In the order of transformers' modeling_roformer.py: embeddings, rotary embedding, attention, layer, encoder, pre-trained
base, base model, heads, then `convert_rope_layout`. Parameter names are transformers' RoFormer's, so its checkpoints
load unchanged. The attention computations, padded or padding-free, are in roformer_kernels.py.
"""

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask, create_masks_for_generate
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    MultipleChoiceModelOutput,
)
from transformers.utils import is_torchdynamo_compiling, logging
from transformers.utils.generic import can_return_tuple

from .configuration_roformer import RoFormerConfig
from .heads import (
    EncoderForMaskedLM,
    EncoderForQuestionAnswering,
    EncoderForQuestionSpanSelection,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
    OnlyMLMHead,
    choice_loss,
    first_token_states,
    flatten_choice_batch,
    head_output,
    refuse_flattened,
    replace_decoder,
)
from .hub_methods import HubMethods
from .inputs import check_inputs
from .layers import Intermediate, ResidualOutput, TokenEmbeddings
from .packing import UNPLANNED, PackedBatch, keep_states, pass_inputs, plan_packing, state_shower, zero_padding
from .roformer_kernels import linear_attention_forward, softmax_attention

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------------------------------


class RoFormerRMSNorm(nn.Module):
    """RoFormer-v2's norm: x / sqrt(mean(x^2) + eps), with no learnable gain or bias."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        return (hidden_states.float() * torch.rsqrt(variance + self.eps)).to(hidden_states.dtype)


def make_norm(config: RoFormerConfig, size: int) -> nn.Module:
    if config.norm_type == "rms_norm":
        return RoFormerRMSNorm(config.layer_norm_eps)
    return nn.LayerNorm(size, eps=config.layer_norm_eps, bias=config.use_bias)


class RoFormerEmbeddings(TokenEmbeddings):
    """Word and token-type embeddings; positions enter through rotation inside attention, not here."""

    def __init__(self, config: RoFormerConfig):
        super().__init__(config, config.embedding_size, make_norm(config, config.embedding_size))


# ---------------------------------------------------------------------------------------------------------------------
# Rotary position embedding: pure functions, and the module holding the cos/sin tables
# ---------------------------------------------------------------------------------------------------------------------


def rope_inverse_frequencies(config: RoFormerConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies `theta_i` (float64, shape `(rotary_dim // 2,)`) and the factor cos/sin are scaled by.

    `rope_parameters` follows transformers' rope utilities: "linear" divides the frequencies by `factor` (position
    interpolation); "dynamic" raises the base once `seq_len` exceeds `max_position_embeddings` (dynamic NTK);
    "yarn" blends interpolated and extrapolated frequencies along a ramp and scales cos/sin by `attention_factor`.
    """
    dim = config.rope_dim
    parameters = config.rope_parameters
    base = float(parameters["rope_theta"])
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    rope_type = parameters["rope_type"]
    factor = float(parameters.get("factor", 1.0))
    if rope_type == "dynamic":
        seq_len = max(seq_len or 0, config.max_position_embeddings)
        base = base * ((factor * seq_len / config.max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = base**-exponents
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    if rope_type == "yarn":
        original_max = parameters.get("original_max_position_embeddings") or config.max_position_embeddings
        return _yarn_inverse_frequencies(inv_freq, parameters, dim, base, original_max)
    return inv_freq, 1.0


def _yarn_inverse_frequencies(inv_freq, parameters, dim, base, original_max) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, ramp in between (transformers' formula)."""
    factor = float(parameters["factor"])

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = parameters.get("attention_factor")
    if attention_factor is None:
        if parameters.get("mscale") and parameters.get("mscale_all_dim"):
            attention_factor = mscale(factor, parameters["mscale"]) / mscale(factor, parameters["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    def correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(parameters.get("beta_fast") or 32), correction_dim(parameters.get("beta_slow") or 1)
    if parameters.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    blended = (inv_freq / factor) * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
    return blended, float(attention_factor)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0):
    """cos and sin of `positions * inv_freq`, computed in float64 (float32 angles lose ~1e-4 at position 1000).

    positions: (..., L) integer or float; inv_freq: (r/2,) -> two tensors of shape (..., L, r/2), float32.
    """
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float64)
    return (angles.cos() * scale).float(), (angles.sin() * scale).float()


def expand_cos_sin(cos: torch.Tensor, sin: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Lay the (..., r/2) tables out over the r rotated features, with the sign of each rotation folded into sin, so
    that each projection pays one swap, one multiply and one fused multiply-add.

    "interleaved": cos -> [c0, c0, c1, c1, ...], sin -> [-s0, s0, -s1, s1, ...];
    "half":        cos -> [c0 .. c_{r/2-1}, c0 .. c_{r/2-1}], sin -> [-s0 .. -s_{r/2-1}, s0 .. s_{r/2-1}].
    """
    if layout == "interleaved":
        return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate the first `r = cos.shape[-1]` features of each head of `x`; the rest pass through.

    x: (B, L, H, D), the projection's own layout; cos, sin: (B or 1, L, 1, r) from `expand_cos_sin`.
    "interleaved" rotates feature pairs (2i, 2i+1), as RoFormer and GPT-J do; "half" rotates (i, i + r/2), as
    GPT-NeoX and LLaMA do: x'_a = x_a cos - x_b sin, x'_b = x_b cos + x_a sin for each pair (a, b).
    """
    r = cos.shape[-1]
    rot = x[..., :r]
    if layout == "interleaved":
        pairs = rot.unflatten(-1, (r // 2, 2))  # (B, L, H, r/2, 2)
        swapped = torch.stack((pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        swapped = torch.cat((rot[..., r // 2 :], rot[..., : r // 2]), dim=-1)
    rotated = torch.addcmul(rot * cos, swapped, sin)
    if r == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., r:]), dim=-1)


class RoFormerRotaryEmbedding(nn.Module):
    """cos/sin tables for the rotary embedding. Positions below `max_position_embeddings` read a non-persistent table,
    built here and again in `_init_weights` (a model created on the meta device by `from_pretrained` gets real values);
    longer inputs and dynamic NTK scaling compute theirs. `rotary_emb(x, position_ids)` is transformers' rotary call
    (`inv_freq` follows it as transformers' modules do); the model calls `for_pass`."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.config = config
        self.dynamic = config.rope_parameters["rope_type"] == "dynamic"
        cos, sin = self.compute_tables(torch.arange(config.max_position_embeddings))
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)
        self.register_buffer("inv_freq", rope_inverse_frequencies(config)[0].float(), persistent=False)
        self.longest_seen = config.max_position_embeddings

    def compute_tables(self, positions: torch.Tensor, seq_len: int | None = None):
        inv_freq, scale = rope_inverse_frequencies(self.config, seq_len)
        return rope_cos_sin(positions, inv_freq, scale)

    def reset_tables(self):
        positions = torch.arange(self.config.max_position_embeddings, device=self.cos_cached.device)
        cos, sin = self.compute_tables(positions)
        init.copy_(self.cos_cached, cos)
        init.copy_(self.sin_cached, sin)
        init.copy_(self.inv_freq, rope_inverse_frequencies(self.config)[0].float())

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at `position_ids` (B or 1, L), each (B or 1, L, rotary_dim) in x's dtype, every frequency
        repeated over the pair of features it rotates in `rope_layout`, YaRN's attention factor included."""
        total_length = int(position_ids.max()) + 1 if position_ids.numel() else 0
        cos, sin = self.half_tables(position_ids.to(x.device), total_length, from_table=False)
        if self.dynamic and total_length > self.longest_seen:  # transformers' dynamic modules grow theirs likewise
            self.longest_seen = total_length
            self.inv_freq = rope_inverse_frequencies(self.config, total_length)[0].float().to(x.device)
        if self.config.rope_layout == "interleaved":
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        else:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        return cos.to(x.dtype), sin.to(x.dtype)

    @torch.no_grad()
    def rotation(
        self, position_ids, total_length: int, dtype, from_table: bool = True, scaling_length: int | None = None
    ):
        """position_ids: (B or 1, L) -> cos, sin (B or 1, L, 1, rotary_dim) in `dtype`, laid out for `apply_rotary`.
        total_length: one past the largest position, padding included. `from_table=False` computes the values (as
        position_ids a caller chose may lie anywhere). scaling_length (default total_length): the length dynamic NTK
        scaling sizes its base for, the longest real sequence's where padding makes total_length longer."""
        cos, sin = self.half_tables(position_ids, total_length, from_table, scaling_length)
        return expand_cos_sin(cos[:, :, None].to(dtype), sin[:, :, None].to(dtype), self.config.rope_layout)

    def half_tables(self, position_ids, total_length: int, from_table: bool = True, scaling_length: int | None = None):
        """cos, sin (B or 1, L, rotary_dim / 2) in float32: from the cached table where it serves, else computed."""
        max_cached = self.config.max_position_embeddings
        # An exported graph (ONNX) must serve every length: it computes the tables, never branching on the length.
        exporting = torch.compiler.is_exporting()
        scaled = self.config.rope_parameters["rope_type"] != "default"
        if not exporting and total_length > max_cached and not scaled:
            logger.warning_once(
                f"Input of {total_length} positions is longer than max_position_embeddings={max_cached} and "
                "rope_parameters configure no scaling: rotary positions extrapolate beyond the trained length."
            )
        if not from_table or exporting or total_length > max_cached or self.cos_cached.device.type == "meta":
            return self.compute_tables(position_ids, seq_len=scaling_length or total_length)
        return self.cos_cached[position_ids], self.sin_cached[position_ids]

    def for_pass(self, hidden_states, position_ids, attention_mask, past_length: int, packing):
        """`rotation` for a pass's tokens, hidden_states (B, L, d) or (1, N, d) packed. Default positions follow the
        cache (each sequence's own when packed) and come from the table. Dynamic NTK scaling sizes its base for the
        longest real sequence, read from the real tokens (not while compiling or exporting, which read no values)."""
        seq_len = hidden_states.shape[1]
        from_table = position_ids is None
        if position_ids is None and packing is not None:
            position_ids = packing.position_ids()
        elif position_ids is None:
            position_ids = torch.arange(past_length, past_length + seq_len, device=hidden_states.device)[None]
        total_length = scaling_length = packing.width if packing is not None else past_length + seq_len
        if self.dynamic and not (is_torchdynamo_compiling() or torch.compiler.is_exporting()):
            real_positions = position_ids
            if packing is None and attention_mask is not None and attention_mask.dim() == 2:
                real_tokens = attention_mask[:, -seq_len:].bool()
                real_positions = position_ids.expand_as(real_tokens)[real_tokens.to(position_ids.device)]
            if real_positions.numel():
                scaling_length = int(real_positions.max()) + 1
        return self.rotation(position_ids, total_length, hidden_states.dtype, from_table, scaling_length)


# ---------------------------------------------------------------------------------------------------------------------
# Attention, layer and encoder
# ---------------------------------------------------------------------------------------------------------------------


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, the feature map of the RoFormer paper's linear attention (Katharopoulos et al.)."""
    return nn.functional.elu(x) + 1.0


class RoFormerSelfAttention(nn.Module):
    def __init__(self, config: RoFormerConfig, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        self.key = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        self.value = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        # The sdpa integration reads `is_causal` from the module and treats a missing attribute as causal; a forward
        # pass may override it (`bidirectional_prompt`).
        self.is_causal = config.is_decoder
        self.rotary_value = config.rotary_value
        self.linear_kernel = config.attention_kernel == "linear"
        self.layer_idx = layer_idx

    def forward(self, hidden_states, attention_plan, position_embeddings, is_causal=None, **kwargs):
        """hidden_states: (B, L, hidden), or (1, N, hidden) packed tokens where `attention_plan` is the packing, else
        the padded pass's mask (`padded_attention_mask`) -> context (B, L, hidden), weights or None."""
        is_causal = self.is_causal if is_causal is None else is_causal
        head_shape = (*hidden_states.shape[:2], self.num_heads, self.head_dim)
        # Rotation runs in the projections' (B, L, H, D) layout; the kernels get (B, H, L, D) views of it, the strides
        # sdpa's CPU kernel is fastest with.
        query = self.query(hidden_states).view(head_shape)
        key = self.key(hidden_states).view(head_shape)
        value = self.value(hidden_states).view(head_shape)
        cos, sin = position_embeddings
        layout = self.config.rope_layout
        if self.rotary_value:
            value = apply_rotary(value, cos, sin, layout)
        if self.linear_kernel:  # eq. (19): the rotation enters the numerator's features only
            query, key = elu_feature_map(query), elu_feature_map(key)
            states = (query, key, apply_rotary(query, cos, sin, layout), apply_rotary(key, cos, sin, layout), value)
        else:
            states = (apply_rotary(query, cos, sin, layout), apply_rotary(key, cos, sin, layout), value)
        attention = linear_attention_forward if self.linear_kernel else softmax_attention
        states = (t.transpose(1, 2) for t in states)
        context, weights = attention(self, *states, attention_plan, is_causal=is_causal, **kwargs)
        return context.flatten(2), weights


class RoFormerAttention(nn.Module):
    def __init__(self, config: RoFormerConfig, layer_idx: int | None = None):
        super().__init__()
        self.self = RoFormerSelfAttention(config, layer_idx=layer_idx)
        self.output = ResidualOutput(config, config.hidden_size, config.use_bias, make_norm(config, config.hidden_size))

    def forward(self, hidden_states, attention_plan, position_embeddings, **kwargs):
        context, weights = self.self(hidden_states, attention_plan, position_embeddings, **kwargs)
        return self.output(context, hidden_states), weights


class RoFormerLayer(GradientCheckpointingLayer):
    def __init__(self, config: RoFormerConfig, layer_idx: int | None = None):
        super().__init__()
        self.attention = RoFormerAttention(config, layer_idx=layer_idx)
        self.intermediate = Intermediate(config, bias=config.use_bias)
        self.output = ResidualOutput(
            config, config.intermediate_size, config.use_bias, make_norm(config, config.hidden_size)
        )

    def forward(self, hidden_states, attention_plan, position_embeddings, **kwargs):
        attention_output, weights = self.attention(hidden_states, attention_plan, position_embeddings, **kwargs)
        layer_output = self.output(self.intermediate(attention_output), attention_output)
        return layer_output, weights


class RoFormerEncoder(nn.Module):
    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([RoFormerLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)])

    def forward(
        self,
        hidden_states,
        attention_plan,
        position_embeddings,
        output_attentions=False,
        output_hidden_states=False,
        show_states=keep_states,
        **kwargs,
    ) -> BaseModelOutput:
        """show_states: how the hidden states are handed back (`state_shower`)."""
        all_hidden_states = None
        if output_hidden_states:
            shown, hidden_states = show_states(hidden_states)
            all_hidden_states = (shown,)
        all_attentions = () if output_attentions else None
        for layer_module in self.layer:
            hidden_states, weights = layer_module(
                hidden_states, attention_plan, position_embeddings, output_attentions=output_attentions, **kwargs
            )
            if output_hidden_states:
                shown, hidden_states = show_states(hidden_states)
                all_hidden_states += (shown,)
            if output_attentions:
                all_attentions += (weights,)
        return BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions
        )


# ---------------------------------------------------------------------------------------------------------------------
# Pre-trained base and base model
# ---------------------------------------------------------------------------------------------------------------------


class RoFormerPreTrainedModel(HubMethods, PreTrainedModel):
    config_class = RoFormerConfig
    config: RoFormerConfig
    base_model_prefix = "roformer"
    _input_embed_layer = "word_embeddings"  # transformers' get/set_input_embeddings find embeddings.word_embeddings
    # Flattened batches (DataCollatorWithFlattening: position_ids restarting per sequence) run per sequence; only
    # multiple choice and the causal LM refuse them.
    accepts_flattened_batches = True
    supports_gradient_checkpointing = True
    _no_split_modules = ["RoFormerLayer"]
    # With device_map="auto", accelerate's hooks must hand the KV cache object to each layer as it is, not move it.
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # transformers' RoFormer saves its frozen sinusoidal table; ours is computed, so the saved one is ignored.
    _keys_to_ignore_on_load_unexpected = [r"embed_positions\.weight"]

    @property
    def base_model_class(self) -> type:
        return RoFormerModel

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        return True  # attention reads config._attn_implementation on every pass, as FusedKernelChoice says

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, RoFormerRotaryEmbedding):
            module.reset_tables()
        elif isinstance(module, RoFormerLMPredictionHead) and hasattr(module, "bias"):
            init.zeros_(module.bias)


def check_attention_mask(attention_mask, shape: tuple[int, int], *, past_length: int | None, config) -> None:
    """RoFormer's mask rule: 2D (batch, cached + new tokens), or 4D (batch or 1, 1 or heads, new tokens, keys) with
    exactly the new tokens' keys without a cache, at least cached + new ones with one (`past_length` not None: a static
    cache's mask spans its whole length). Linear attention takes the 2D mask only."""
    keys, num_heads, size = (past_length or 0) + shape[1], config.num_attention_heads, tuple(attention_mask.shape)
    if len(size) == 2 and size != (shape[0], keys):
        raise ValueError(
            f"attention_mask has shape {size} but the input needs {(shape[0], keys)} (batch, cached + new tokens)"
        )
    if len(size) not in (2, 4):
        raise ValueError(f"attention_mask must be 2D (batch, seq_len) or 4D (batch, 1, q_len, kv_len), got {size}")
    if len(size) == 4 and (
        size[0] not in (1, shape[0])
        or size[1] not in (1, num_heads)
        or size[2] != shape[1]
        or size[3] < keys
        or (past_length is None and size[3] != keys)
    ):
        kv_len = f"kv_len >= {keys}" if past_length is not None else f"kv_len={keys}"
        raise ValueError(
            f"a 4D attention_mask must have shape (batch={shape[0]} or 1, 1 or heads={num_heads}, "
            f"q_len={shape[1]}, {kv_len}), got {size}"
        )
    if len(size) == 4 and config.attention_kernel == "linear":
        raise ValueError(
            "attention_kernel='linear' takes a 2D attention_mask (batch, seq_len) of real tokens; a 4D mask "
            "cannot be applied to linear attention"
        )


# Newer transformers name the KV cache of masking and generation functions, model inputs and outputs `cache` (the old
# `past_key_values` warns): the masks take it positionally, and inputs and outputs use the installed version's name.
_OUTPUT_FIELDS = BaseModelOutputWithPastAndCrossAttentions.__dataclass_fields__
CACHE_FIELD = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"


def kv_cache(kwargs: dict, default: Cache | None = None, pop: bool = False) -> Cache | None:
    """The cache in `kwargs` under either name (`default` when there is none); `pop` removes both names."""
    take = kwargs.pop if pop else kwargs.get
    cache, legacy = take("cache", None), take("past_key_values", None)
    return next((c for c in (cache, legacy) if c is not None), default)


def is_causal_pass(config: RoFormerConfig, past_length: int) -> bool:
    """Whether this forward pass attends causally: always for a decoder, except, with `bidirectional_prompt`
    (junnyu's RoFormerForCausalLM), a pass with nothing cached yet, which reads its tokens bidirectionally."""
    return config.is_decoder and not (config.bidirectional_prompt and past_length == 0)


def padded_attention_mask(config: RoFormerConfig, hidden_states, attention_mask, past_key_values, causal: bool):
    """The mask a padded pass's attention kernel takes: for linear attention the (B, keys) bool padding mask (or
    None), for softmax attention the mask transformers' masking utilities build for the configured implementation,
    causal or not as `causal` says."""
    if config.attention_kernel == "linear":
        return None if attention_mask is None else attention_mask.to(device=hidden_states.device, dtype=torch.bool)
    if causal:
        return create_causal_mask(config, hidden_states, attention_mask, past_key_values)
    return prompt_mask(config, hidden_states, attention_mask, past_key_values)


def prompt_mask(config: RoFormerConfig, embeddings, attention_mask, past_key_values):
    """The bidirectional mask over `embeddings` (B, L, ...), the only tokens there are. With a cache, over its key
    length: a static cache is longer than the prompt, and its empty slots must be masked, so a missing mask becomes
    one of ones for the prompt."""
    if past_key_values is not None and attention_mask is None:
        attention_mask = torch.ones(embeddings.shape[:2], dtype=torch.long, device=embeddings.device)
    return create_bidirectional_mask(config, embeddings, attention_mask, None, past_key_values)


@dataclass
class RoFormerModelOutput(BaseModelOutputWithPastAndCrossAttentions):
    """transformers' RoFormer output plus `pooler_output` (batch, hidden_size), None unless the model has a pooler:
    last, so that `to_tuple()` without a pooler is transformers' RoFormer tuple."""

    pooler_output: torch.FloatTensor | None = None


class RoFormerPooler(nn.Module):
    """The first token's final hidden state through a dense layer and `config.pooler_activation` (BERT's pooler).
    RoFormer-sim's sentence vector is this output with `pooler_activation="linear"`."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.pooler_activation]

    def forward(self, first_token_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(first_token_states))


class RoFormerModel(RoFormerPreTrainedModel):
    """The bare RoFormer encoder (or decoder-only stack when `config.is_decoder`), outputting hidden states, and the
    pooled first token (`pooler_output`) when `config.add_pooling_layer` is set."""

    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        config.validate_fields()  # fields may have been changed since the config was created
        self.embeddings = RoFormerEmbeddings(config)
        if config.embedding_size != config.hidden_size:
            # Always with a bias, whatever use_bias says: junnyu's RoFormer (v2 included) builds it so, and so does
            # bert4keras' Embedding-Mapping layer.
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        self.rotary_emb = RoFormerRotaryEmbedding(config)
        self.encoder = RoFormerEncoder(config)
        self.pooler = RoFormerPooler(config) if config.add_pooling_layer else None
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        packing: PackedBatch | None = UNPLANNED,
        **kwargs,
    ) -> RoFormerModelOutput:
        """Padded batches run padding-free as `config.unpad_inputs` says (`packing_for`); a flattened batch always
        runs per sequence and returns (1, N, d). A decoder reads and extends `past_key_values`. Per-token outputs hold
        zeros at the 2D mask's padded positions on every path, unless `keep_padding_states=True` is passed: that pass
        runs padded and returns the states it computes there (transformers' RoFormer multiple choice reads them).
        `packing`: the plan of this pass (a head's `packing_for`; None: the padded path), else planned here."""
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        past_key_values = kv_cache(kwargs, past_key_values, pop=True)
        use_cache = config.is_decoder and (use_cache if use_cache is not None else config.use_cache)
        if not config.is_decoder:
            past_key_values = None  # an encoder has no KV cache
        elif use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=config)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else None
        # the mask's rule depends on the KV cache's length
        check_mask = functools.partial(check_attention_mask, past_length=past_length, config=config)
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        shape = check_inputs(config, self.dtype, *inputs, embedding_size=config.embedding_size, check_mask=check_mask)
        if packing is UNPLANNED:
            packing = self.packing_for(
                input_ids, inputs_embeds, attention_mask, position_ids, output_attentions, kwargs
            )
        keep_padding_states = kwargs.pop("keep_padding_states", False)
        past_length = past_length or 0
        if packing is not None:  # the real tokens, one sequence after another in a (1, N) row
            inputs = (input_ids, inputs_embeds, token_type_ids, position_ids)
            input_ids, inputs_embeds, token_type_ids, position_ids = map(packing.pack_input, inputs)

        hidden_states = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
        if hasattr(self, "embeddings_project"):
            hidden_states = self.embeddings_project(hidden_states)
        position_embeddings = self.rotary_emb.for_pass(
            hidden_states, position_ids, attention_mask, past_length, packing
        )
        causal = is_causal_pass(config, past_length)
        if packing is not None:
            attention_plan, restore = packing, packing.restore
        else:
            attention_plan = padded_attention_mask(config, hidden_states, attention_mask, past_key_values, causal)
            new_tokens = None  # zeros at padded positions, as the packed path leaves them
            if attention_mask is not None and attention_mask.dim() == 2 and not keep_padding_states:
                new_tokens = attention_mask[:, -shape[1] :]
            restore = functools.partial(zero_padding, attention_mask=new_tokens)
        encoder_outputs = self.encoder(
            hidden_states,
            attention_plan,
            position_embeddings,
            is_causal=causal,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            show_states=state_shower(restore, packing),
            **kwargs,
        )
        all_hidden_states = encoder_outputs.hidden_states  # in the input's layout already
        sequence_output = all_hidden_states[-1] if output_hidden_states else restore(encoder_outputs.last_hidden_state)
        pooler_output = self.pooler(first_token_states(sequence_output, packing)) if self.pooler is not None else None
        return RoFormerModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=pooler_output,
            **{CACHE_FIELD: past_key_values if use_cache else None},
            hidden_states=all_hidden_states,
            attentions=encoder_outputs.attentions,
        )

    def packing_for(
        self, input_ids, inputs_embeds, attention_mask, position_ids, output_attentions, kwargs
    ) -> PackedBatch | None:
        """This pass's `plan_packing`, with what rules packing out for RoFormer: pops the flattened-batch keywords
        (`cu_seq_lens_q/k`, `max_length_q/k`) from `kwargs` and reads `keep_padding_states` there. A decoder runs
        padded (None), and refuses a flattened batch."""
        config = self.config
        reference, cu_seq_lens = pass_inputs(input_ids, inputs_embeds, attention_mask, position_ids, kwargs)
        if reference is None:
            return None
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        blocker = None
        if config.is_decoder:
            # A decoder reads restarting position_ids of a padded row as given (`generate` numbers left padding so);
            # an exported graph (ONNX) cannot branch on the mask's values and runs padded.
            if attention_mask is not None and (torch.compiler.is_exporting() or not bool(attention_mask.bool().all())):
                return None
            blocker = "a decoder (config.is_decoder) runs padded"
        elif output_attentions:
            blocker = "output_attentions=True returns padded (batch, heads, L, L) weights"
        elif (
            kwargs.get("keep_padding_states")
            and config.unpad_inputs != "never"
            and attention_mask is not None
            and not bool(attention_mask.bool().all())
        ):
            blocker = "keep_padding_states=True returns the states of padded positions, which only the padded path has"
        shape = tuple(reference.shape[:2])
        return plan_packing(config, shape, attention_mask, position_ids, cu_seq_lens, blocker, reference.device)


# ---------------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------------


class RoFormerPredictionHeadTransform(nn.Module):
    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size, bias=config.use_bias)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = make_norm(config, config.embedding_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class RoFormerLMPredictionHead(nn.Module):
    """RoFormer-v1 head: transform (dense, activation, LayerNorm) then the decoder tied to the word embeddings.
    RoFormer-v2 (`norm_type="rms_norm"`) predicts with the tied decoder alone, as its release does."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        if config.norm_type == "layer_norm":
            self.transform = RoFormerPredictionHeadTransform(config)
        elif config.embedding_size != config.hidden_size:
            # Without the transform nothing maps the final hidden states to the width of the tied word embeddings.
            raise ValueError(
                f"RoFormerConfig.embedding_size ({config.embedding_size}) must equal hidden_size "
                f"({config.hidden_size}) for a language-model head with norm_type='rms_norm' (RoFormer-v2 predicts "
                "with the tied word embeddings alone, without a transform from hidden_size to embedding_size)"
            )
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size, bias=config.use_bias)
        if config.use_bias:
            self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "transform"):
            hidden_states = self.transform(hidden_states)
        return self.decoder(hidden_states)


@property
def _lm_tied_weights_keys(self) -> dict[str, str]:
    """The decoder is the word embeddings; its bias, where the model has biases, the head's `bias`."""
    tied = {"cls.predictions.decoder.weight": "roformer.embeddings.word_embeddings.weight"}
    if self.config.use_bias:
        tied["cls.predictions.decoder.bias"] = "cls.predictions.bias"
    return tied


class RoFormerForMaskedLM(EncoderForMaskedLM, RoFormerPreTrainedModel):
    prediction_head_class = RoFormerLMPredictionHead
    _tied_weights_keys = _lm_tied_weights_keys

    def __init__(self, config: RoFormerConfig):
        if config.is_decoder:
            raise ValueError("RoFormerForMaskedLM needs bidirectional attention: set config.is_decoder=False")
        super().__init__(config)


class RoFormerForCausalLM(RoFormerPreTrainedModel, GenerationMixin):
    _tied_weights_keys = _lm_tied_weights_keys

    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        if not config.is_decoder:
            raise ValueError(
                "RoFormerForCausalLM needs causal attention: set config.is_decoder=True "
                "(e.g. from_pretrained(path, is_decoder=True))"
            )
        self.roformer = RoFormerModel(config)
        self.cls = OnlyMLMHead(RoFormerLMPredictionHead(config))
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        replace_decoder(self.cls.predictions, new_embeddings)

    def prepare_inputs_for_generation(self, input_ids, *args, **kwargs):
        model_inputs = super().prepare_inputs_for_generation(input_ids, *args, **kwargs)
        new_ids = model_inputs.get("input_ids")
        cache = kv_cache(model_inputs)
        cached = cache is not None and cache.get_seq_length() > 0
        if self.config.bidirectional_prompt and cached and new_ids is not None:
            # junnyu's RoFormer-sim generation: what follows the prompt is segment B, token type 1
            model_inputs["token_type_ids"] = torch.ones_like(new_ids)
        return model_inputs

    def create_masks_for_generate(self, config, inputs_embeds, attention_mask, *cache, **kwargs):
        """The 4D mask `generate` builds ahead for a static cache: bidirectional over a prompt that
        `bidirectional_prompt` reads so, causal otherwise."""
        cache = cache[0] if cache else kv_cache(kwargs, pop=True)
        cached = cache.get_seq_length() if cache is not None else 0
        if is_causal_pass(config, cached):
            return create_masks_for_generate(config, inputs_embeds, attention_mask, cache, **kwargs)
        return prompt_mask(config, inputs_embeds, attention_mask, cache)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithCrossAttentions:
        refuse_flattened(self, position_ids, attention_mask, kwargs)
        outputs = self.roformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            past_key_values=kv_cache(kwargs, past_key_values, pop=True),
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.cls(hidden_states[:, keep, :])
        if attention_mask is not None and attention_mask.dim() == 2:
            logits = zero_padding(logits, attention_mask[:, -hidden_states.shape[1] :][:, keep])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class RoFormerForSequenceClassification(EncoderForSequenceClassification, RoFormerPreTrainedModel):
    classifier_activation = "hidden_act"  # transformers' RoFormer classifies with the model's activation


class RoFormerSequenceSummary(nn.Module):
    """The vector multiple choice classifies: the last token (transformers' RoFormer), the first, or the mean."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.summary_type = config.summary_type

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if self.summary_type == "first":
            return hidden_states[:, 0]
        if self.summary_type == "last":
            return hidden_states[:, -1]
        if attention_mask is None:
            return hidden_states.mean(dim=1)
        weights = attention_mask.to(hidden_states.dtype)[..., None]
        return (hidden_states * weights).sum(1) / weights.sum(1).clamp_min(1.0)


class RoFormerForMultipleChoice(RoFormerPreTrainedModel):
    """Multiple choice on each choice's `RoFormerSequenceSummary` (`config.summary_type`)."""

    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        self.roformer = RoFormerModel(config)
        self.sequence_summary = RoFormerSequenceSummary(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> MultipleChoiceModelOutput | tuple:
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        num_choices, choices = flatten_choice_batch(self, *inputs, output_attentions, output_hidden_states, kwargs)
        # the last position of a padded choice is a padding token, whose state transformers' RoFormer classifies
        outputs = self.roformer(**choices, keep_padding_states=self.config.summary_type == "last")
        summary = self.sequence_summary(outputs.last_hidden_state, choices["attention_mask"])
        logits = self.classifier(summary).view(-1, num_choices)
        loss = choice_loss(logits, labels, kwargs.get("num_items_in_batch"))
        return head_output(MultipleChoiceModelOutput, outputs, self.config, return_dict, loss=loss, logits=logits)


class RoFormerForTokenClassification(EncoderForTokenClassification, RoFormerPreTrainedModel): ...


class RoFormerForQuestionAnswering(EncoderForQuestionAnswering, RoFormerPreTrainedModel): ...


class RoFormerForQuestionSpanSelection(EncoderForQuestionSpanSelection, RoFormerPreTrainedModel): ...


def rope_layout_permutation(head_dim: int, rotary_dim: int, source: str, target: str) -> torch.Tensor:
    """Index `p` with `x_target = x_source[..., p]` for one head: interleaved -> half puts the even rotary features
    first, then the odd ones; half -> interleaved is the inverse; features past `rotary_dim` stay in place."""
    if source == target:
        return torch.arange(head_dim)
    to_half = torch.cat((torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)))
    perm = to_half if target == "half" else torch.argsort(to_half)
    return torch.cat((perm, torch.arange(rotary_dim, head_dim)))


def convert_rope_layout(model: RoFormerPreTrainedModel, target_layout: str) -> RoFormerPreTrainedModel:
    """Convert a RoFormer model in place between the "interleaved" and "half" rotary layouts; outputs are unchanged.

    Rotation acts on feature pairs; the layouts only differ in which features form a pair. Permuting the output rows
    of the query and key projections (per head) moves every pair to its place in the other layout, and q.k is the
    same sum in another order. With `rotary_value=True` the value rows are permuted too, and the input columns of the
    attention output projection with them, so the context vectors are read back in their original order.
    """
    config = model.config
    if target_layout not in ("interleaved", "half"):
        raise ValueError(f"target_layout must be 'interleaved' or 'half', got {target_layout!r}")
    perm_one_head = rope_layout_permutation(config.head_dim, config.rope_dim, config.rope_layout, target_layout)
    heads = torch.arange(config.num_attention_heads)[:, None] * config.head_dim
    perm = (heads + perm_one_head[None, :]).flatten()
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, RoFormerAttention):
                continue
            attention = module.self
            for linear in [attention.query, attention.key] + ([attention.value] if config.rotary_value else []):
                linear.weight.copy_(linear.weight[perm])
                if linear.bias is not None:
                    linear.bias.copy_(linear.bias[perm])
            if config.rotary_value:
                module.output.dense.weight.copy_(module.output.dense.weight[:, perm])
    config.rope_layout = target_layout
    return model


# The names the posformers package exports from this file.
__all__ = [
    "RoFormerForCausalLM",
    "RoFormerForMaskedLM",
    "RoFormerForMultipleChoice",
    "RoFormerForQuestionAnswering",
    "RoFormerForQuestionSpanSelection",
    "RoFormerForSequenceClassification",
    "RoFormerForTokenClassification",
    "RoFormerModel",
    "RoFormerPreTrainedModel",
    "convert_rope_layout",
]
