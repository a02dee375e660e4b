"""PyTorch RoFormer (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding").

Reads top to bottom in the order data flows: rotary math, embeddings, attention, layer, encoder, pre-trained base,
base model, heads; then `convert_rope_layout`, a tool on whole models. Parameter names are those of transformers'
RoFormer, so HF-format checkpoints load unchanged.

This file imports only torch, transformers and its sibling `configuration_roformer.py`: `save_pretrained` copies both
to the Hub for `trust_remote_code` users.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import CrossEntropyLoss
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
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_torchdynamo_compiling, logging

from .configuration_roformer import RoFormerConfig
from .loading import check_loaded_dtypes, explain_load_error

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Rotary position embedding: small pure functions
# ---------------------------------------------------------------------------------------------------------------------


def rope_inverse_frequencies(config: RoFormerConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies `theta_i` (float64, shape `(rotary_dim // 2,)`) and the factor cos/sin are scaled by.

    `rope_scaling` follows transformers' rope utilities: "linear" divides the frequencies by `factor` (position
    interpolation); "dynamic" raises the base once `seq_len` exceeds `max_position_embeddings` (dynamic NTK);
    "yarn" blends interpolated and extrapolated frequencies along a ramp and scales cos/sin by `attention_factor`.
    """
    dim = config.rope_dim
    base = float(config.rope_theta)
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type")
    factor = float(scaling.get("factor", 1.0))
    if rope_type == "dynamic":
        seq_len = max(seq_len or 0, config.max_position_embeddings)
        base = base * ((factor * seq_len / config.max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = base**-exponents
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    if rope_type == "yarn":
        return _yarn_inverse_frequencies(inv_freq, scaling, dim, base)
    return inv_freq, 1.0


def _yarn_inverse_frequencies(inv_freq, scaling, dim, base) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, ramp in between (transformers' formula)."""
    factor = float(scaling["factor"])
    original_max = scaling["original_max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention_factor = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    def correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(scaling.get("beta_fast") or 32), correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
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
    """Lay the (..., r/2) tables out over the r rotated features, with the sign of each rotation folded into sin.

    Done once per forward so that each projection pays one swap, one multiply and one fused multiply-add.
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
    GPT-NeoX and LLaMA do:
    x'_a = x_a cos - x_b sin, x'_b = x_b cos + x_a sin for each pair (a, b).
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


def rope_layout_permutation(head_dim: int, rotary_dim: int, source: str, target: str) -> torch.Tensor:
    """Index `p` with `x_target = x_source[..., p]` for one head: moves rotation pairs between layouts.

    interleaved -> half puts the even features of the rotary part first, then the odd ones; half -> interleaved is
    the inverse. Features past `rotary_dim` are left in place.
    """
    if source == target:
        return torch.arange(head_dim)
    to_half = torch.cat((torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)))
    perm = to_half if target == "half" else torch.argsort(to_half)
    return torch.cat((perm, torch.arange(rotary_dim, head_dim)))


class RoFormerRotaryEmbedding(nn.Module):
    """cos/sin tables for the rotary embedding.

    Positions up to `max_position_embeddings` come from a cached, non-persistent table (rebuilt in `_init_weights`,
    so a model created on the meta device by `from_pretrained` gets correct values); longer inputs and dynamic NTK
    scaling compute theirs on the fly.
    """

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.config = config
        self.dynamic = (config.rope_scaling or {}).get("rope_type") == "dynamic"
        shape = (config.max_position_embeddings, config.rope_dim // 2)
        self.register_buffer("cos_cached", torch.empty(shape), persistent=False)
        self.register_buffer("sin_cached", torch.empty(shape), persistent=False)

    def compute_tables(self, positions: torch.Tensor, seq_len: int | None = None):
        inv_freq, scale = rope_inverse_frequencies(self.config, seq_len)
        return rope_cos_sin(positions, inv_freq, scale)

    def reset_tables(self):
        positions = torch.arange(self.config.max_position_embeddings, device=self.cos_cached.device)
        cos, sin = self.compute_tables(positions)
        init.copy_(self.cos_cached, cos)
        init.copy_(self.sin_cached, sin)

    @torch.no_grad()
    def forward(
        self,
        position_ids: torch.Tensor,
        total_length: int,
        dtype: torch.dtype,
        from_table: bool = True,
        scaling_length: int | None = None,
    ):
        """position_ids: (B or 1, L) -> cos, sin of shape (B or 1, L, 1, rotary_dim) in `dtype`, laid out for
        `apply_rotary` in the config's current `rope_layout`.

        total_length: one past the largest position, padding included (the table serves positions below
        max_position_embeddings). `from_table=False` computes the values instead: position_ids a caller chose may lie
        anywhere (negative, or past the table however short the input), and the values are the same.
        `scaling_length` (default `total_length`): the length dynamic NTK scaling sizes its base for, that of the
        longest real sequence where padding makes `total_length` longer.
        """
        max_cached = self.config.max_position_embeddings
        # An exported graph (ONNX) must serve every length: it computes the tables, never branching on the length.
        exporting = torch.compiler.is_exporting()
        if not exporting and total_length > max_cached and not self.dynamic and not self.config.rope_scaling:
            logger.warning_once(
                f"Input of {total_length} positions is longer than max_position_embeddings={max_cached} and no "
                "rope_scaling is configured: rotary positions extrapolate beyond what the model was trained on."
            )
        if not from_table or exporting or total_length > max_cached or self.cos_cached.device.type == "meta":
            cos, sin = self.compute_tables(position_ids, seq_len=scaling_length or total_length)
        else:
            cos, sin = self.cos_cached[position_ids], self.sin_cached[position_ids]
        cos, sin = expand_cos_sin(cos[:, :, None].to(dtype), sin[:, :, None].to(dtype), self.config.rope_layout)
        return cos, sin


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


class RoFormerEmbeddings(nn.Module):
    """Word and token-type embeddings; positions enter through rotation inside attention, not here."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        self.LayerNorm = make_norm(config, config.embedding_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, inputs_embeds=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


# ---------------------------------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------------
# Padding-free execution: the real tokens of a batch as one (1, N) row, attention per sequence
# ---------------------------------------------------------------------------------------------------------------------

UNPAD_MODES = ("auto", "always", "never")


@dataclass
class PackedBatch:
    """Where the N real tokens of a batch live, for running a model on (1, N, ...) tensors instead of (B, L, ...).

    Two inputs give one: a padded batch with a right-padded 2D attention mask (`pack_padded`), or a flattened batch in
    transformers' padding-free format, one row whose `position_ids` restart at 0 for every sequence (`pack_flattened`,
    as `DataCollatorWithFlattening` builds it). Either way the packed row holds the sequences one after another, and
    `indices` says where each token sits in the `(rows, width)` grid of the padded layout.

    indices: (N,) long, flat position `row * width + column` of every real token in the grid.
    cu_seqlens: (rows + 1,) int32, where each sequence starts in the packed row (flash-attention's varlen layout).
    lengths: the rows' lengths as Python ints (0 for a row that is all padding).
    flattened: the input came flattened, so outputs stay (1, N, ...) instead of going back to (rows, width, ...).
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: list[int]
    width: int
    flattened: bool = False

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.indices.shape[0])

    def position_ids(self) -> torch.Tensor:
        """(1, N) position of every token within its own sequence: 0, 1, 2, ... restarting per sequence."""
        return (self.indices % self.width)[None]

    def varlen_kwargs(self) -> dict:
        """The keyword arguments transformers' flash-attention integration reads for a packed (1, N) batch."""
        return {
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_seqlen,
            "max_length_k": self.max_seqlen,
        }

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """(rows, width, ...) grid -> (1, N, ...) real tokens. A flattened batch's tensors are already packed."""
        if self.flattened:
            return tensor
        return tensor.flatten(0, 1).index_select(0, self.indices)[None]

    def unpack(self, tensor: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(1, N, ...) -> (rows, width, ...), `fill` at padded positions (differentiable)."""
        grid = tensor.new_full((self.rows * self.width, *tensor.shape[2:]), fill)
        return grid.index_copy(0, self.indices, tensor[0]).view(self.rows, self.width, *tensor.shape[2:])

    def restore(self, tensor: torch.Tensor) -> torch.Tensor:
        """(1, N, ...) -> the layout the input came in: (1, N, ...) for a flattened batch, else the padded grid with
        zeros at padded positions."""
        return tensor if self.flattened else self.unpack(tensor)

    def first_tokens(self, tensor: torch.Tensor) -> torch.Tensor:
        """(1, N, ...) -> (rows, ...): each sequence's first token; zeros for a row that is all padding."""
        starts = self.cu_seqlens[:-1].long().clamp_max(max(self.num_tokens - 1, 0))
        first = tensor[0].index_select(0, starts)
        if 0 in self.lengths:
            empty = torch.tensor([n == 0 for n in self.lengths], device=tensor.device)
            first = first.masked_fill(empty.view(-1, *[1] * (first.dim() - 1)), 0.0)
        return first

    def groups(self, multiple_of: int = 1) -> list["AttentionGroup"]:
        """The sequences in groups of similar length, each to be attended as a (group rows, group width) padded batch;
        cached per `multiple_of`."""
        cache = self.__dict__.setdefault("_groups", {})
        if multiple_of not in cache:
            cache[multiple_of] = attention_groups(self, multiple_of)
        return cache[multiple_of]


@dataclass
class AttentionGroup:
    """Sequences of similar length attended together as a padded (rows, width) batch.

    gather: (rows * width,) long, the packed token at each grid slot (padding slots repeat a real token; the key mask
    hides them and their outputs are dropped).
    key_mask: (rows, width) bool, True at real tokens.
    slots: (n,) long, the grid slots of this group's real tokens, in packed order.
    tokens: (n,) long, the packed positions of those tokens.
    """

    rows: int
    width: int
    gather: torch.Tensor
    key_mask: torch.Tensor
    slots: torch.Tensor
    tokens: torch.Tensor


# Cost model of one group for `attention_groups`, in units of one query-key pair: every slot of the padded group costs
# its width (scores) plus a constant (projections into and out of the group), and each group a fixed overhead (kernel
# launches, gathers): small on a CPU, where a pair costs tens of nanoseconds, large on a GPU, where a launch costs
# what ~10^5 pairs do. Only the split depends on it; any split gives the same outputs.
GROUP_SLOT_COST = 64
GROUP_OVERHEAD = {"cpu": 4096}
GROUP_OVERHEAD_ACCELERATOR = 262144


def attention_groups(packing: PackedBatch, multiple_of: int = 1) -> list[AttentionGroup]:
    """Split the non-empty sequences into length groups (sorted by length, cut where the cost model says padding to
    one width wastes more than another group costs) and index each group's padded layout. Widths are rounded up to
    `multiple_of` (a block size)."""
    device = packing.indices.device
    overhead = GROUP_OVERHEAD.get(device.type, GROUP_OVERHEAD_ACCELERATOR)
    order = sorted((i for i, n in enumerate(packing.lengths) if n > 0), key=lambda i: -packing.lengths[i])
    widths = [-(-packing.lengths[i] // multiple_of) * multiple_of for i in order]
    # best[j]: cheapest cost of the first j sequences; cut[j]: where its last group starts.
    best, cut = [0.0] + [math.inf] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            width = widths[start]
            cost = best[start] + (end - start) * width * (width + GROUP_SLOT_COST) + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    bounds, end = [], len(order)
    while end > 0:
        bounds.append((cut[end], end))
        end = cut[end]
    lengths = torch.tensor(packing.lengths, device=device)
    groups = []
    for start, end in reversed(bounds):
        members, width = torch.tensor(order[start:end], device=device), widths[start]
        columns = torch.arange(width, device=device)
        key_mask = columns < lengths[members, None]
        gather = packing.cu_seqlens[members, None].long() + torch.where(key_mask, columns, 0)
        slots = key_mask.flatten().nonzero().squeeze(-1)
        groups.append(
            AttentionGroup(
                rows=len(members),
                width=width,
                gather=gather.flatten(),
                key_mask=key_mask,
                slots=slots,
                tokens=gather.flatten().index_select(0, slots),
            )
        )
    return groups


def grouped_attention(
    packing: PackedBatch,
    attend: Callable[..., torch.Tensor],
    *tensors: torch.Tensor,
    multiple_of: int = 1,
) -> torch.Tensor:
    """Run `attend(group, *padded)` on every length group and put its outputs back in packed order.

    tensors: (1, N, ...) packed; `attend` gets each as a (group.rows, group.width, ...) padded batch, with
    `group.key_mask`, and returns (group.rows, group.width, ...). Returns (1, N, ...). One group holding every
    sequence at the batch's own width is exactly the padded computation.
    """
    outputs, token_order = [], []
    for group in packing.groups(multiple_of):
        padded = [t[0].index_select(0, group.gather).view(group.rows, group.width, *t.shape[2:]) for t in tensors]
        output = attend(group, *padded)
        outputs.append(output.flatten(0, 1).index_select(0, group.slots))
        token_order.append(group.tokens)
    if not outputs:  # every row is padding
        return tensors[0].new_zeros((1, 0, *tensors[0].shape[2:]))
    if len(outputs) == 1:
        output, tokens = outputs[0], token_order[0]
    else:
        output, tokens = torch.cat(outputs), torch.cat(token_order)
    inverse = torch.empty_like(tokens)
    inverse[tokens] = torch.arange(tokens.numel(), device=tokens.device)
    return output.index_select(0, inverse)[None]


def pack_padded(attention_mask: torch.Tensor) -> PackedBatch:
    """The packing of a right-padded batch from its (B, L) attention mask (1 = real token). The caller checks that the
    mask is right-padded (`is_right_padded`)."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    indices = mask.flatten().nonzero().squeeze(-1)
    return PackedBatch(indices=indices, cu_seqlens=cu_seqlens, lengths=lengths.tolist(), width=mask.shape[1])


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of a (B, L) mask is real tokens followed by padding only (no left padding, no holes)."""
    mask = attention_mask.bool()
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def flattened_restarts(position_ids: torch.Tensor | None, input_rows: int) -> bool:
    """Whether the input is a flattened batch: one row whose position_ids restart at 0 after its first token (a 0
    that does not follow -1: positions counting up through 0, as shifted ones may, are one sequence)."""
    return (
        position_ids is not None
        and input_rows == 1
        and position_ids.dim() == 2
        and position_ids.shape[1] > 1
        and bool(((position_ids[0, 1:] == 0) & (position_ids[0, :-1] != -1)).any())
    )


def pack_flattened(position_ids: torch.Tensor, attention_mask=None, cu_seq_lens=None) -> PackedBatch:
    """The packing of a flattened batch from its (1, N) position_ids, which must count 0, 1, 2, ... within every
    sequence. An attention mask, if given, must be all ones, and `cu_seq_lens` (cu_seq_lens_q/k) must agree."""
    positions = position_ids[0]
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError(
            "position_ids restart at 0 (a flattened batch), but attention_mask marks padding: a flattened batch has "
            "no padding; pass either a padded batch with attention_mask or a flattened one with position_ids"
        )
    starts = (positions == 0).nonzero().squeeze(-1)
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("position_ids of a flattened batch must start at 0 for its first sequence")
    sequence = torch.cumsum(positions == 0, 0) - 1
    expected = torch.arange(positions.numel(), device=positions.device) - starts[sequence]
    wrong = (positions != expected).nonzero()
    if wrong.numel():
        index = int(wrong[0])
        raise ValueError(
            f"position_ids of a flattened batch must count 0, 1, 2, ... within each sequence and restart at 0; "
            f"got {int(positions[index])} at index {index} where {int(expected[index])} was expected"
        )
    cu_seqlens = F.pad(starts.to(torch.int32), (0, 1), value=positions.numel())
    if cu_seq_lens is not None and not torch.equal(cu_seq_lens.to(cu_seqlens), cu_seqlens):
        raise ValueError(
            f"cu_seq_lens_q/cu_seq_lens_k {cu_seq_lens.tolist()} contradict the sequence starts in position_ids "
            f"{cu_seqlens.tolist()}"
        )
    lengths = cu_seqlens.diff().tolist()
    width = max(lengths)
    indices = sequence * width + positions
    return PackedBatch(indices=indices, cu_seqlens=cu_seqlens, lengths=lengths, width=width, flattened=True)


def plan_packing(
    config,
    shape: tuple[int, int],
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cu_seq_lens: torch.Tensor | None = None,
    blocker: str | None = None,
    device: torch.device | None = None,
) -> PackedBatch | None:
    """How this forward pass runs: a PackedBatch for the padding-free path, or None for the padded one.

    A flattened batch (`position_ids` restarting at 0 in a single row, or `cu_seq_lens_q` given) is always packed: no
    other reading of it keeps its sequences apart. A padded batch follows `config.unpad_inputs`: "never" keeps the
    padded path; "auto" packs when the 2D mask holds padding and nothing rules packing out; "always" packs every pass
    and raises when something does. `blocker` names what in this pass rules it out (a KV cache, output_attentions...).
    """
    if cu_seq_lens is not None or flattened_restarts(position_ids, shape[0]):
        if blocker is not None:
            raise ValueError(
                f"position_ids restart at 0 (a flattened batch), which this forward pass cannot take: {blocker}"
            )
        if position_ids is None:
            raise ValueError(
                "cu_seq_lens_q describes a flattened batch; pass its position_ids too (0, 1, 2, ... per sequence)"
            )
        return pack_flattened(position_ids, attention_mask, cu_seq_lens)
    mode = config.unpad_inputs
    if mode == "never":
        return None
    if attention_mask is not None and attention_mask.dim() != 2:
        blocker = blocker or "a 4D attention_mask (pass the 2D padding mask to run padding-free)"
    elif attention_mask is not None and not is_right_padded(attention_mask):
        blocker = blocker or "attention_mask is not right-padded (left padding or holes); pad on the right"
    if mode == "always":
        if blocker is not None:
            raise ValueError(f"config.unpad_inputs='always' but this forward pass cannot run padding-free: {blocker}")
        if attention_mask is None:
            return pack_padded(torch.ones(shape, dtype=torch.bool, device=device))
        return pack_padded(attention_mask)
    if blocker is not None or attention_mask is None or bool(attention_mask.bool().all()):
        return None
    return pack_padded(attention_mask)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
):
    """Plain softmax attention. query: (B, H, Lq, D), key/value: (B, H, Lk, D) -> ((B, Lq, H, D), (B, H, Lq, Lk)).

    Accepts the masks built for "eager" (additive float) and for "sdpa" (boolean, or None for causal attention:
    `is_causal`, else the module's), so `output_attentions=True` can fall back to it whatever the configured backend
    is.
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    min_value = torch.finfo(scores.dtype).min
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, min_value)
    elif attention_mask is not None:
        scores = scores + attention_mask
    elif (is_causal if is_causal is not None else getattr(module, "is_causal", False)) and query.shape[2] > 1:
        q_len, k_len = query.shape[2], key.shape[2]
        future = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).triu(k_len - q_len + 1)
        scores = scores.masked_fill(future, min_value)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, the feature map of the RoFormer paper's linear attention (Katharopoulos et al.)."""
    return F.elu(x) + 1.0


def linear_attention(
    query_features, key_features, rotated_query, rotated_key, value, key_padding_mask, causal, need_weights
):
    """RoFormer eq. (19): sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n / sum_n phi(q_m)^T phi(k_n).

    The rotation enters the numerator only; the denominator uses the unrotated (positive) features, so it stays > 0.
    *_features / rotated_*: (B, H, L, D); value: (B, H, Lk, D); key_padding_mask: (B, Lk) bool or None (True = real).
    Without a causal mask the cost is linear in length (keys summarised into a D x D state); a causal or
    weight-returning call uses the equivalent quadratic form. Returns ((B, Lq, H, D), weights or None).
    """
    if key_padding_mask is not None:
        keep = key_padding_mask[:, None, :, None].to(key_features.dtype)
        key_features, rotated_key, value = key_features * keep, rotated_key * keep, value * keep
    if not causal and not need_weights:
        kv_state = torch.einsum("bhld,bhle->bhde", rotated_key, value)  # (B, H, D, D)
        numerator = torch.matmul(rotated_query, kv_state)
        denominator = torch.matmul(query_features, key_features.sum(dim=2, keepdim=True).transpose(2, 3))
        output = numerator / denominator.clamp_min(torch.finfo(denominator.dtype).tiny)
        return output.transpose(1, 2).contiguous(), None
    numerator_scores = torch.matmul(rotated_query, rotated_key.transpose(2, 3))
    denominator_scores = torch.matmul(query_features, key_features.transpose(2, 3))
    if causal:
        q_len, k_len = query_features.shape[2], key_features.shape[2]
        visible = torch.ones(q_len, k_len, dtype=torch.bool, device=query_features.device).tril(k_len - q_len)
        numerator_scores = numerator_scores * visible
        denominator_scores = denominator_scores * visible
    denominator = denominator_scores.sum(-1, keepdim=True).clamp_min(torch.finfo(denominator_scores.dtype).tiny)
    weights = numerator_scores / denominator
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, (weights if need_weights else None)


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

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        key_padding_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        is_causal: bool | None = None,
        packing: PackedBatch | None = None,
        **kwargs,
    ):
        """hidden_states: (B, L, hidden), or (1, N, hidden) packed tokens when `packing` is given (padding-free path:
        rotation from the packed position_ids, then attention per sequence)."""
        batch_size, seq_len, _ = hidden_states.shape
        is_causal = self.is_causal if is_causal is None else is_causal
        head_shape = (batch_size, seq_len, self.num_heads, self.head_dim)
        # Rotation runs in the projections' (B, L, H, D) layout; the attention kernels get (B, H, L, D) views of it,
        # the strides sdpa's CPU kernel is fastest with.
        query = self.query(hidden_states).view(head_shape)
        key = self.key(hidden_states).view(head_shape)
        value = self.value(hidden_states).view(head_shape)
        cos, sin = position_embeddings

        if self.linear_kernel:
            if packing is not None:
                return self._packed_linear_forward(query, key, value, cos, sin, packing), None
            return self._linear_forward(
                query, key, value, cos, sin, key_padding_mask, past_key_values, output_attentions, is_causal
            )

        query = apply_rotary(query, cos, sin, self.config.rope_layout).transpose(1, 2)  # (B, H, L, D)
        key = apply_rotary(key, cos, sin, self.config.rope_layout).transpose(1, 2)
        if self.rotary_value:
            value = apply_rotary(value, cos, sin, self.config.rope_layout)
        value = value.transpose(1, 2)
        if packing is not None:
            return self._packed_forward(query, key, value, packing, **kwargs), None
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)

        implementation = self.config._attn_implementation
        if output_attentions and implementation != "eager":
            if implementation not in ("sdpa", None):
                raise ValueError(
                    f"output_attentions=True needs attn_implementation 'eager' or 'sdpa', not {implementation!r}"
                )
            implementation = "eager"  # the masks built for sdpa are understood by eager_attention_forward
        attention_interface: Callable = eager_attention_forward
        if implementation not in (None, "eager"):
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        context, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            is_causal=is_causal,
            **kwargs,
        )
        return context.reshape(batch_size, seq_len, -1), weights

    def _packed_forward(self, query, key, value, packing: PackedBatch, **kwargs) -> torch.Tensor:
        """Softmax attention of each sequence over its own tokens. query/key/value: (1, H, N, D) packed, rotated ->
        (1, N, H * D). A flash-attention implementation takes the packed row with the sequences' boundaries
        (varlen); the others attend length groups of sequences as padded batches with a boolean key mask (sdpa
        kernels where the implementation is not eager)."""
        implementation = self.config._attn_implementation or "eager"
        dropout = self.attention_dropout if self.training else 0.0
        if "flash" in implementation:
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
            context, _ = attention_interface(
                self,
                query,
                key,
                value,
                None,
                scaling=self.scaling,
                dropout=dropout,
                is_causal=False,
                **packing.varlen_kwargs(),
                **kwargs,
            )
            return context.reshape(1, query.shape[2], -1)
        attention_interface = eager_attention_forward
        if implementation != "eager":
            attention_interface = ALL_ATTENTION_FUNCTIONS["sdpa"]

        def attend(group, group_query, group_key, group_value):  # (rows, width, H, D) each
            context, _ = attention_interface(
                self,
                group_query.transpose(1, 2),
                group_key.transpose(1, 2),
                group_value.transpose(1, 2),
                group.key_mask[:, None, None, :],
                scaling=self.scaling,
                dropout=dropout,
                is_causal=False,
            )
            return context.flatten(-2)

        return grouped_attention(packing, attend, *(t.transpose(1, 2) for t in (query, key, value)))

    def _packed_linear_forward(self, query, key, value, cos, sin, packing: PackedBatch) -> torch.Tensor:
        """Linear attention of each sequence over its own tokens: the key summary of eq. (19) is per sequence, so
        each length group is attended as a padded batch with its key mask. (1, N, H, D) packed -> (1, N, H * D)."""
        query_features, key_features = elu_feature_map(query), elu_feature_map(key)
        rotated_query = apply_rotary(query_features, cos, sin, self.config.rope_layout)
        rotated_key = apply_rotary(key_features, cos, sin, self.config.rope_layout)
        if self.rotary_value:
            value = apply_rotary(value, cos, sin, self.config.rope_layout)

        def attend(group, *padded):  # (rows, width, H, D) each
            context, _ = linear_attention(
                *(t.transpose(1, 2) for t in padded), group.key_mask, causal=False, need_weights=False
            )
            return context.flatten(-2)

        return grouped_attention(packing, attend, query_features, key_features, rotated_query, rotated_key, value)

    def _linear_forward(
        self, query, key, value, cos, sin, key_padding_mask, past_key_values, output_attentions, is_causal
    ):
        batch_size, seq_len, _, head_dim = query.shape
        query_features, key_features = elu_feature_map(query), elu_feature_map(key)
        rotated_query = apply_rotary(query_features, cos, sin, self.config.rope_layout)
        rotated_key = apply_rotary(key_features, cos, sin, self.config.rope_layout)
        if self.rotary_value:
            value = apply_rotary(value, cos, sin, self.config.rope_layout)
        query_features, key_features, rotated_query, rotated_key, value = (
            t.transpose(1, 2) for t in (query_features, key_features, rotated_query, rotated_key, value)
        )
        if past_key_values is not None:
            # The cache keeps rotated and plain key features side by side: the numerator needs one, the denominator
            # the other.
            both, value = past_key_values.update(torch.cat((rotated_key, key_features), -1), value, self.layer_idx)
            rotated_key, key_features = both.split(head_dim, dim=-1)
        context, weights = linear_attention(
            query_features,
            key_features,
            rotated_query,
            rotated_key,
            value,
            key_padding_mask,
            causal=is_causal and seq_len > 1,
            need_weights=output_attentions,
        )
        return context.reshape(batch_size, seq_len, -1), weights


class RoFormerSelfOutput(nn.Module):
    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        self.LayerNorm = make_norm(config, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class RoFormerAttention(nn.Module):
    def __init__(self, config: RoFormerConfig, layer_idx: int | None = None):
        super().__init__()
        self.self = RoFormerSelfAttention(config, layer_idx=layer_idx)
        self.output = RoFormerSelfOutput(config)

    def forward(self, hidden_states, attention_mask, position_embeddings, **kwargs):
        context, weights = self.self(hidden_states, attention_mask, position_embeddings, **kwargs)
        return self.output(context, hidden_states), weights


# ---------------------------------------------------------------------------------------------------------------------
# Layer and encoder
# ---------------------------------------------------------------------------------------------------------------------


class RoFormerIntermediate(nn.Module):
    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class RoFormerOutput(nn.Module):
    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.LayerNorm = make_norm(config, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class RoFormerLayer(GradientCheckpointingLayer):
    def __init__(self, config: RoFormerConfig, layer_idx: int | None = None):
        super().__init__()
        self.attention = RoFormerAttention(config, layer_idx=layer_idx)
        self.intermediate = RoFormerIntermediate(config)
        self.output = RoFormerOutput(config)

    def forward(self, hidden_states, attention_mask, position_embeddings, **kwargs):
        attention_output, weights = self.attention(hidden_states, attention_mask, position_embeddings, **kwargs)
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
        attention_mask,
        position_embeddings,
        output_attentions=False,
        output_hidden_states=False,
        **kwargs,
    ) -> BaseModelOutput:
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer_module in self.layer:
            hidden_states, weights = layer_module(
                hidden_states, attention_mask, position_embeddings, output_attentions=output_attentions, **kwargs
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (weights,)
        return BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions
        )


# ---------------------------------------------------------------------------------------------------------------------
# Pre-trained base and base model
# ---------------------------------------------------------------------------------------------------------------------


class RoFormerPreTrainedModel(PreTrainedModel):
    config_class = RoFormerConfig
    config: RoFormerConfig
    base_model_prefix = "roformer"
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

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' `from_pretrained`; weights that are not what they claim (a truncated or corrupted safetensors
        file, a shard index naming a missing shard, a tensor of the wrong shape or dtype, a pickle that would run code)
        end in one `CheckpointError` (an OSError) naming the file and the problem, not in a traceback from inside
        safetensors or torch."""
        try:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except Exception as error:
            if (problem := explain_load_error(cls, pretrained_model_name_or_path, kwargs, error)) is None:
                raise
            raise problem from None
        check_loaded_dtypes(loaded[0] if isinstance(loaded, tuple) else loaded, pretrained_model_name_or_path, kwargs)
        return loaded

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, RoFormerRotaryEmbedding):
            module.reset_tables()
        elif isinstance(module, RoFormerLMPredictionHead) and hasattr(module, "bias"):
            init.zeros_(module.bias)


def _input_shape(input_ids, inputs_embeds, embedding_size: int) -> tuple[int, int]:
    """(batch, seq_len) of exactly one of input_ids (B, L) or inputs_embeds (B, L, width); else a clear error."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(
            "Pass exactly one of input_ids or inputs_embeds (got both)"
            if input_ids is not None
            else "Pass exactly one of input_ids or inputs_embeds (got neither)"
        )
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
        shape = tuple(input_ids.shape)
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != embedding_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, seq_len, {embedding_size}), got {tuple(inputs_embeds.shape)}"
            )
        shape = tuple(inputs_embeds.shape[:2])
    if shape[1] == 0:
        raise ValueError("The input sequence is empty (seq_len = 0)")
    return shape


def _check_per_token(name: str, tensor: torch.Tensor | None, shape: tuple[int, int]) -> None:
    """A per-token input (token_type_ids, position_ids) must have shape (batch or 1, seq_len)."""
    if tensor is not None and (
        tensor.dim() != 2 or tensor.shape[1] != shape[1] or tensor.shape[0] not in (1, shape[0])
    ):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} but the input has shape {shape}")


def _check_index_ranges(checks) -> None:
    """Each `(name, ids or None, size)` of `checks` must hold indices in [0, size). Not while compiling: reading the
    values back is a data-dependent branch."""
    if is_torchdynamo_compiling():
        return
    for name, tensor, size in checks:
        if tensor is None or not tensor.numel():
            continue
        low, high = (int(v) for v in torch.aminmax(tensor))  # one pass, one device sync
        if low < 0 or high >= size:
            raise ValueError(f"{name} must lie in [0, {size}) for this config, got values in [{low}, {high}]")


def _check_input_types(inputs: dict, dtype: torch.dtype) -> None:
    """Every given input (`inputs`: the forward arguments by name) is a tensor; ids (input_ids, token_type_ids,
    position_ids) are torch.long or torch.int, what embeddings and the rotary tables index with; inputs_embeds have
    the model's dtype `dtype` (any floating dtype under autocast, which casts them)."""
    for name, tensor in inputs.items():
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    for name in ("input_ids", "token_type_ids", "position_ids"):
        ids = inputs[name]
        if ids is not None and ids.dtype not in (torch.long, torch.int):
            raise TypeError(f"{name} must hold integers (torch.long or torch.int), got {ids.dtype}")
    embeds = inputs["inputs_embeds"]
    autocast = embeds is not None and embeds.is_floating_point() and torch.is_autocast_enabled(embeds.device.type)
    if embeds is not None and embeds.dtype != dtype and not autocast:
        raise TypeError(f"inputs_embeds must have the model's dtype {dtype}, got {embeds.dtype}")


def _check_attention_mask(attention_mask, shape: tuple[int, int], past_length: int | None, num_heads: int) -> None:
    """A 2D mask is (batch, cached + new tokens); a 4D one (batch or 1, 1 or heads, new tokens, keys): with a cache
    (`past_length` not None) at least cached + new keys, as a static cache's mask spans its whole length; without
    one exactly the new tokens."""
    if attention_mask is None:
        return
    keys = (past_length or 0) + shape[1]
    if attention_mask.dim() == 2:
        if tuple(attention_mask.shape) != (shape[0], keys):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but the input needs {(shape[0], keys)} "
                f"(batch, cached + new tokens)"
            )
    elif attention_mask.dim() != 4:
        raise ValueError(
            f"attention_mask must be 2D (batch, seq_len) or 4D (batch, 1, q_len, kv_len), got "
            f"{tuple(attention_mask.shape)}"
        )
    elif (
        attention_mask.shape[0] not in (1, shape[0])
        or attention_mask.shape[1] not in (1, num_heads)
        or attention_mask.shape[2] != shape[1]
        or attention_mask.shape[3] < keys
        or (past_length is None and attention_mask.shape[3] != keys)
    ):
        kv_len = f"kv_len >= {keys}" if past_length is not None else f"kv_len={keys}"
        raise ValueError(
            f"a 4D attention_mask must have shape (batch={shape[0]} or 1, 1 or heads={num_heads}, "
            f"q_len={shape[1]}, {kv_len}), got {tuple(attention_mask.shape)}"
        )


def _check_inputs(
    config: RoFormerConfig,
    input_ids,
    inputs_embeds,
    attention_mask,
    token_type_ids,
    position_ids,
    past_length: int | None,
    dtype: torch.dtype,
):
    """Clear errors for malformed inputs (the model's dtype `dtype`; `past_length` None without a cache), before they
    reach an index or a reshape deep inside torch; returns the input's (batch, seq_len)."""
    _check_input_types(
        dict(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
        ),
        dtype,
    )
    shape = _input_shape(input_ids, inputs_embeds, config.embedding_size)
    if shape[0] == 0:
        raise ValueError(
            f"{'input_ids' if input_ids is not None else 'inputs_embeds'} holds an empty batch (batch = 0)"
        )
    _check_attention_mask(attention_mask, shape, past_length, config.num_attention_heads)
    if config.attention_kernel == "linear" and attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            "attention_kernel='linear' takes a 2D attention_mask (batch, seq_len) of real tokens; a 4D mask "
            "cannot be applied to linear attention"
        )
    _check_per_token("token_type_ids", token_type_ids, shape)
    _check_per_token("position_ids", position_ids, shape)
    _check_index_ranges(
        [("input_ids", input_ids, config.vocab_size), ("token_type_ids", token_type_ids, config.type_vocab_size)]
    )
    return shape


def real_position_extent(position_ids: torch.Tensor, real_tokens: torch.Tensor | None, fallback: int) -> int:
    """One past the largest position a real token holds: the sequence length dynamic NTK scaling sizes its base for,
    read from the real tokens so that padding columns do not change the outputs. position_ids: (B or 1, L);
    real_tokens: (B, L) bool, or None when every token is real. `fallback` while compiling or exporting (no values
    are read) or when no token is real."""
    if is_torchdynamo_compiling() or torch.compiler.is_exporting():
        return fallback
    if real_tokens is not None:
        position_ids = position_ids.expand_as(real_tokens)[real_tokens.to(position_ids.device)]
    return int(position_ids.max()) + 1 if position_ids.numel() else fallback


def is_causal_pass(config: RoFormerConfig, past_length: int) -> bool:
    """Whether this forward pass attends causally: always for a decoder, except, with `bidirectional_prompt`
    (junnyu's RoFormerForCausalLM), a pass with nothing cached yet, which reads its tokens bidirectionally."""
    return config.is_decoder and not (config.bidirectional_prompt and past_length == 0)


def attention_masks(config: RoFormerConfig, hidden_states, attention_mask, past_key_values, causal: bool):
    """The mask the softmax kernels take (causal or not as `causal` says, built by transformers' masking utilities
    for the configured attention implementation) and the (B, L) bool key padding mask linear attention takes, or
    None."""
    key_padding_mask = None
    if attention_mask is not None and attention_mask.dim() == 2:
        key_padding_mask = attention_mask.to(device=hidden_states.device, dtype=torch.bool)
    if causal:
        mask = create_causal_mask(
            config=config, inputs_embeds=hidden_states, attention_mask=attention_mask, past_key_values=past_key_values
        )
    else:
        mask = prompt_mask(config, hidden_states, attention_mask, past_key_values)
    return mask, key_padding_mask


def prompt_mask(config: RoFormerConfig, embeddings, attention_mask, past_key_values):
    """The bidirectional mask over `embeddings` (B, L, ...), the only tokens there are. With a cache, over its key
    length: a static cache is longer than the prompt, and its empty slots must be masked, so a missing mask becomes
    one of ones for the prompt."""
    if past_key_values is not None and attention_mask is None:
        attention_mask = torch.ones(embeddings.shape[:2], dtype=torch.long, device=embeddings.device)
    return create_bidirectional_mask(
        config=config, inputs_embeds=embeddings, attention_mask=attention_mask, past_key_values=past_key_values
    )


@dataclass
class RoFormerModelOutput(BaseModelOutputWithPastAndCrossAttentions):
    """transformers' RoFormer output plus `pooler_output` (batch, hidden_size), None unless the model has a pooler.

    `pooler_output` comes last, so `to_tuple()` without a pooler is exactly transformers' RoFormer tuple. The
    model also sets a `packing` attribute, not a field (so tuples and keys are unchanged): the `PackedBatch` this
    pass ran on, or None on the padded path; the heads read it to run their projections on real tokens only.
    """

    pooler_output: torch.FloatTensor | None = None


class RoFormerPooler(nn.Module):
    """The first token's final hidden state through a dense layer and `config.pooler_activation` (BERT's pooler).

    RoFormer-sim's sentence vector is this output with `pooler_activation="linear"`.
    """

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.pooler_activation]

    def forward(self, first_token_states: torch.Tensor) -> torch.Tensor:
        """first_token_states: (batch or sequences, hidden), as `first_token_states` reads them."""
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

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> RoFormerModelOutput | tuple:
        """Padded batches run padding-free as `config.unpad_inputs` says; a flattened batch (position_ids restarting
        at 0 in one row, optionally with DataCollatorWithFlattening's cu_seq_lens_q/k and max_length_q/k) always
        runs per sequence and returns (1, N, d). `unpad_blocker` (a kwarg, for heads) names what keeps this pass
        padded."""
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        return_dict = return_dict if return_dict is not None else config.return_dict
        use_cache = config.is_decoder and (use_cache if use_cache is not None else config.use_cache)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=config)
        if not use_cache and not config.is_decoder:
            past_key_values = None
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        shape = _check_inputs(
            config,
            input_ids,
            inputs_embeds,
            attention_mask,
            token_type_ids,
            position_ids,
            past_length if past_key_values is not None else None,
            self.dtype,
        )
        cu_seq_lens = kwargs.pop("cu_seq_lens_q", None)
        cu_seq_lens_k = kwargs.pop("cu_seq_lens_k", None)
        for name in ("max_length_q", "max_length_k"):
            kwargs.pop(name, None)  # recomputed from the packing
        if cu_seq_lens is not None and cu_seq_lens_k is not None and not torch.equal(cu_seq_lens, cu_seq_lens_k):
            raise ValueError("cu_seq_lens_q and cu_seq_lens_k differ; RoFormer self-attention needs them equal")
        cu_seq_lens = cu_seq_lens if cu_seq_lens is not None else cu_seq_lens_k
        blocker = kwargs.pop("unpad_blocker", None)
        if config.is_decoder or past_key_values is not None:
            blocker = "a decoder (config.is_decoder) or KV-cache pass runs padded"
        elif output_attentions:
            blocker = "output_attentions=True returns padded (batch, heads, L, L) weights"
        device = (input_ids if input_ids is not None else inputs_embeds).device
        positions_given = position_ids is not None
        packing = None
        # a decoder reads restarting position_ids of a padded row as given (`generate` numbers left padding so); an
        # exported graph (ONNX) cannot branch on the mask's values and runs padded
        decoder_padding = (
            config.is_decoder
            and attention_mask is not None
            and (torch.compiler.is_exporting() or not bool(attention_mask.bool().all()))
        )
        if not decoder_padding:
            packing = plan_packing(config, shape, attention_mask, position_ids, cu_seq_lens, blocker, device)
        if packing is not None:
            input_ids, inputs_embeds, token_type_ids, position_ids = (
                packing.pack(t.expand(*shape, *t.shape[2:])) if t is not None else None
                for t in (input_ids, inputs_embeds, token_type_ids, position_ids)
            )
            if position_ids is None:
                position_ids = packing.position_ids()

        hidden_states = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
        if hasattr(self, "embeddings_project"):
            hidden_states = self.embeddings_project(hidden_states)
        seq_len = hidden_states.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past_length, past_length + seq_len, device=hidden_states.device)[None]
        total_length = packing.width if packing is not None else past_length + seq_len
        scaling_length = None
        if self.rotary_emb.dynamic:
            real_tokens = None
            if packing is None and attention_mask is not None and attention_mask.dim() == 2:
                real_tokens = attention_mask[:, -seq_len:].bool()
            scaling_length = real_position_extent(position_ids, real_tokens, total_length)
        position_embeddings = self.rotary_emb(
            position_ids,
            total_length,
            hidden_states.dtype,
            from_table=not positions_given,
            scaling_length=scaling_length,
        )

        causal = is_causal_pass(config, past_length)
        if packing is None:
            mask, key_padding_mask = attention_masks(config, hidden_states, attention_mask, past_key_values, causal)
        else:
            mask, key_padding_mask, kwargs["packing"] = None, None, packing
        encoder_output = self.encoder(
            hidden_states,
            mask,
            position_embeddings,
            key_padding_mask=key_padding_mask,
            is_causal=causal,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        sequence_output = encoder_output.last_hidden_state
        all_hidden_states = encoder_output.hidden_states
        if packing is not None:
            sequence_output = packing.restore(sequence_output)
            if all_hidden_states is not None:
                all_hidden_states = tuple(packing.restore(h) for h in all_hidden_states)
        pooler_output = None
        if self.pooler is not None:
            pooler_output = self.pooler(first_token_states(sequence_output, packing))
        output = RoFormerModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=pooler_output,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=all_hidden_states,
            attentions=encoder_output.attentions,
        )
        output.packing = packing
        return output if return_dict else output.to_tuple()


# ---------------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------------


def _maybe_tuple(output, return_dict, config):
    """The head's `ModelOutput`, or its tuple when `return_dict` (else `config.return_dict`) is off."""
    return_dict = return_dict if return_dict is not None else config.return_dict
    return output if return_dict else output.to_tuple()


def _num_choices(head: nn.Module, input_ids, inputs_embeds) -> int:
    """The choice dimension of a multiple-choice input, or a clear error for an input without one."""
    reference = input_ids if input_ids is not None else inputs_embeds
    if reference is None or reference.dim() < 3:
        raise ValueError(
            f"{type(head).__name__} expects input_ids of shape (batch, num_choices, seq_len) or inputs_embeds of "
            "shape (batch, num_choices, seq_len, embedding width)"
        )
    return reference.shape[1]


def _flatten_choices(tensor: torch.Tensor | None, dims: int = 2) -> torch.Tensor | None:
    """(B, C, ...) -> (B * C, ...), a tensor of `dims` dimensions with the choices folded into the batch."""
    return tensor.reshape(-1, *tensor.shape[-dims + 1 :]) if tensor is not None else None


def run_on_real_tokens(head: Callable[[torch.Tensor], torch.Tensor], hidden_states: torch.Tensor, packing):
    """A token-level head on the real tokens only when the pass was packed: pack -> head -> unpack, zeros at padded
    positions (their labels are -100, so the loss is unchanged). hidden_states: the base model's
    `last_hidden_state`, (B, L, d) or (1, N, d) for a flattened batch; returns the head's output in that layout."""
    if packing is None or packing.flattened:
        return head(hidden_states)
    return packing.unpack(head(packing.pack(hidden_states)))


def first_token_states(hidden_states: torch.Tensor, packing) -> torch.Tensor:
    """Each sequence's first token, what sequence-level heads read: (B, L, d) -> (B, d) for a padded batch,
    (1, N, d) -> (num_sequences, d) for a flattened one."""
    if packing is not None and packing.flattened:
        return packing.first_tokens(hidden_states)
    return hidden_states[:, 0]


def span_logits(qa_outputs: nn.Module, hidden_states: torch.Tensor, attention_mask, packing):
    """Start and end logits of an extractive-QA head, `torch.finfo(dtype).min` wherever there is no real token, so
    padding never wins an argmax and the loss does not depend on padding.

    hidden_states: the base model's `last_hidden_state`. Padded batch: (B, L) logits, with the 2D attention_mask's
    padding masked whether or not the pass was packed. Flattened batch: (num_sequences, longest sequence) logits,
    each sequence's own, filled beyond its length.
    """
    if packing is not None:
        logits = qa_outputs(packing.pack(hidden_states))
        logits = packing.unpack(logits, fill=torch.finfo(logits.dtype).min)
    else:
        logits = qa_outputs(hidden_states)
        if attention_mask is not None and attention_mask.dim() == 2:
            padding = ~attention_mask.to(device=logits.device, dtype=torch.bool)
            logits = logits.masked_fill(padding[..., None], torch.finfo(logits.dtype).min)
    start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
    return start_logits, end_logits


def refuse_flattened(head: nn.Module, position_ids, attention_mask, kwargs: dict) -> None:
    """A head that cannot take a flattened batch (one row, position_ids restarting at 0 per sequence, no padding)
    says so. Restarting position_ids with padding in the mask are a padded row's (`generate` numbers a left-padded
    prompt so)."""
    # The mask is read only for a one-row batch with position_ids: an exported graph (ONNX) cannot branch on values.
    one_row = position_ids is not None and position_ids.dim() == 2 and position_ids.shape[0] == 1
    has_padding = one_row and attention_mask is not None and not bool(attention_mask.bool().all())
    if kwargs.get("cu_seq_lens_q") is not None or (one_row and not has_padding and flattened_restarts(position_ids, 1)):
        raise ValueError(
            f"{type(head).__name__} cannot take a flattened batch (position_ids restarting at 0 within a row); "
            "pass padded sequences with an attention_mask"
        )


def sequence_grid(tensor: torch.Tensor, packing, fill: float = 0.0) -> torch.Tensor:
    """A per-token tensor in its (sequences, width, ...) layout: a padded batch's (B, L, ...) as it is, a flattened
    batch's (1, N, ...) unpacked to one row per sequence with `fill` past each sequence's end."""
    if packing is not None and packing.flattened:
        return packing.unpack(tensor, fill=fill)
    return tensor


def real_token_mask(attention_mask, packing) -> torch.Tensor | None:
    """(sequences, width) bool, True at real tokens, for a 2D attention_mask or a flattened batch; else None (a 4D or
    no mask: every position counts)."""
    if packing is not None and packing.flattened:
        ones = torch.ones(1, packing.num_tokens, 1, dtype=torch.bool, device=packing.indices.device)
        return packing.unpack(ones, fill=False)[..., 0]
    if attention_mask is not None and attention_mask.dim() == 2:
        return attention_mask.bool()
    return None


def find_questions(input_ids: torch.Tensor, question_token_id: int, packing) -> torch.Tensor:
    """(sequences, Q) long: the position of every `question_token_id` token in each sequence, left-aligned, -1 where
    a sequence holds fewer than Q, the most any holds. input_ids: (B, L), or (1, N) for a flattened batch."""
    ids = sequence_grid(input_ids[..., None], packing, fill=-1)[..., 0]
    is_question = ids == question_token_id
    most = int(is_question.sum(-1).max()) if ids.numel() else 0
    width = ids.shape[1]
    columns = torch.arange(width, device=ids.device).expand_as(ids)
    positions = torch.where(is_question, columns, width).sort(-1).values[:, :most]
    return positions.masked_fill(positions == width, -1)


def _off_tokens(positions: torch.Tensor, real: torch.Tensor | None, width: int) -> torch.Tensor:
    """Where `positions` (sequences, Q) miss the real tokens of their sequence: outside [0, width) or on padding."""
    inside = (positions >= 0) & (positions < width)
    if real is not None:
        inside = inside & real.to(positions.device).gather(1, positions.clamp(0, width - 1))
    return ~inside


def _check_span_selection(question_positions, start_positions, end_positions, real, shape) -> None:
    """question_positions (sequences, Q): a real token or -1; start/end_positions: given together, of the same shape,
    on real tokens wherever the question is asked. Values are not read while compiling."""
    rows, width = shape
    named = {
        "question_positions": question_positions,
        "start_positions": start_positions,
        "end_positions": end_positions,
    }
    if (start_positions is None) != (end_positions is None):
        raise ValueError("start_positions and end_positions must be given together")
    for name, positions in named.items():
        if positions is None:
            continue
        if positions.is_floating_point() or positions.dim() != 2 or positions.shape[0] != rows:
            raise ValueError(
                f"{name} must be an integer tensor of shape (batch, num_questions) with batch={rows} (one row per "
                f"sequence), got {positions.dtype} {tuple(positions.shape)}"
            )
        if positions.shape != question_positions.shape:
            raise ValueError(
                f"{name} must have the shape of question_positions {tuple(question_positions.shape)}, got "
                f"{tuple(positions.shape)}"
            )
    if is_torchdynamo_compiling():
        return
    asked = question_positions >= 0
    for name, positions in named.items():
        if positions is None:
            continue
        wrong = _off_tokens(positions, real, width) & (
            question_positions != -1 if positions is question_positions else asked
        )
        if bool(wrong.any()):
            row, column = (int(i) for i in wrong.nonzero()[0])
            hint = " (-1 marks an absent question)" if positions is question_positions else ""
            raise ValueError(
                f"{name}[{row}, {column}] = {int(positions[row, column])} is not a real token of sequence {row}{hint}"
            )


def question_span_logits(qass: nn.Module, hidden_states: torch.Tensor, question_positions, attention_mask, packing):
    """Start and end logits (sequences, Q, width) of the span each question token points at, `torch.finfo(dtype).min`
    wherever there is no real token and on the rows of absent questions (question_positions -1).

    hidden_states: the base model's `last_hidden_state`, (B, L, d), or (1, N, d) for a flattened batch (whose
    question_positions count within each sequence). On the padding-free path the head's token transforms run on the
    real tokens only.
    """
    states = sequence_grid(hidden_states, packing)  # (sequences, width, d)
    index = question_positions.to(states.device).clamp_min(0)
    question_states = states.gather(1, index[..., None].expand(-1, -1, states.shape[-1]))  # (sequences, Q, d)
    tokens = packing.pack(hidden_states) if packing is not None else hidden_states
    start_logits, end_logits = qass(tokens, question_states, packing)
    blocked = (question_positions < 0).to(states.device)[..., None]  # (sequences, Q, 1)
    real = real_token_mask(attention_mask, packing)
    if real is not None:
        blocked = blocked | ~real.to(states.device)[:, None, :]
    lowest = torch.finfo(start_logits.dtype).min
    return start_logits.masked_fill(blocked, lowest), end_logits.masked_fill(blocked, lowest)


def span_selection_loss(start_logits, end_logits, start_positions, end_positions, question_positions) -> torch.Tensor:
    """Mean over the asked questions (question_positions >= 0) of (CE(start) + CE(end)) / 2; logits (sequences, Q,
    width). A batch without a question gives 0, still attached to the graph."""
    asked = (question_positions >= 0).to(start_logits.device)
    start_loss = F.cross_entropy(start_logits[asked], start_positions.to(asked.device)[asked], reduction="sum")
    end_loss = F.cross_entropy(end_logits[asked], end_positions.to(asked.device)[asked], reduction="sum")
    return (start_loss + end_loss) / 2 / asked.sum().clamp_min(1)


def single_question_logits(qass: nn.Module, config, input_ids, hidden_states, attention_mask, packing):
    """Extractive QA from the span-selection head (`qa_head="span_selection"`): each sequence's one [QUESTION] token
    (`config.question_token_id`, placed after the question as Splinter does) points at the answer. Returns start and
    end logits (sequences, width)."""
    if config.question_token_id is None:
        raise ValueError(
            "config.qa_head='span_selection' needs config.question_token_id, the [QUESTION] token placed after "
            "each question; set it to the token's id"
        )
    if input_ids is None:
        raise ValueError("qa_head='span_selection' finds the [QUESTION] token in input_ids; pass input_ids")
    question_positions = find_questions(input_ids, config.question_token_id, packing)
    counts = (question_positions >= 0).sum(-1)
    if not is_torchdynamo_compiling() and bool((counts != 1).any()):
        example = int((counts != 1).nonzero()[0])
        raise ValueError(
            f"example {example} holds {int(counts[example])} [QUESTION] tokens (id {config.question_token_id}); "
            "qa_head='span_selection' needs exactly one per example, right after the question"
        )
    start_logits, end_logits = question_span_logits(
        qass, hidden_states, question_positions[:, :1], attention_mask, packing
    )
    return start_logits[:, 0], end_logits[:, 0]


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

    RoFormer-v2 (`norm_type="rms_norm"`) predicts with the tied decoder alone, as its release does.
    """

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


class RoFormerOnlyMLMHead(nn.Module):
    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.predictions = RoFormerLMPredictionHead(config)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.predictions(sequence_output)


def _lm_tied_weights_keys(config: RoFormerConfig) -> dict[str, str]:
    tied = {"cls.predictions.decoder.weight": "roformer.embeddings.word_embeddings.weight"}
    if config.use_bias:
        tied["cls.predictions.decoder.bias"] = "cls.predictions.bias"
    return tied


class RoFormerForMaskedLM(RoFormerPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "roformer.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        if config.is_decoder:
            raise ValueError("RoFormerForMaskedLM needs bidirectional attention: set config.is_decoder=False")
        self._tied_weights_keys = _lm_tied_weights_keys(config)
        self.roformer = RoFormerModel(config)
        self.cls = RoFormerOnlyMLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        if new_embeddings.bias is not None:
            self.cls.predictions.bias = new_embeddings.bias

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
    ) -> MaskedLMOutput | tuple:
        outputs = self.roformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = run_on_real_tokens(self.cls, outputs.last_hidden_state, outputs.packing)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        result = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


class RoFormerForCausalLM(RoFormerPreTrainedModel, GenerationMixin):
    _tied_weights_keys = RoFormerForMaskedLM._tied_weights_keys

    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        if not config.is_decoder:
            raise ValueError(
                "RoFormerForCausalLM needs causal attention: set config.is_decoder=True "
                "(e.g. from_pretrained(path, is_decoder=True))"
            )
        self._tied_weights_keys = _lm_tied_weights_keys(config)
        self.roformer = RoFormerModel(config)
        self.cls = RoFormerOnlyMLMHead(config)
        self.post_init()

    get_output_embeddings = RoFormerForMaskedLM.get_output_embeddings
    set_output_embeddings = RoFormerForMaskedLM.set_output_embeddings

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, **kwargs):
        model_inputs = super().prepare_inputs_for_generation(input_ids, past_key_values=past_key_values, **kwargs)
        new_ids = model_inputs.get("input_ids")
        cached = past_key_values is not None and past_key_values.get_seq_length() > 0
        if self.config.bidirectional_prompt and cached and new_ids is not None:
            # junnyu's RoFormer-sim generation: what follows the prompt is segment B, token type 1
            model_inputs["token_type_ids"] = torch.ones_like(new_ids)
        return model_inputs

    def create_masks_for_generate(self, config, inputs_embeds, attention_mask, past_key_values, **kwargs):
        """The 4D mask `generate` builds ahead for a static cache: bidirectional over a prompt that
        `bidirectional_prompt` reads so, causal otherwise."""
        cached = past_key_values.get_seq_length() if past_key_values is not None else 0
        if is_causal_pass(config, cached):
            return create_masks_for_generate(config, inputs_embeds, attention_mask, past_key_values, **kwargs)
        return prompt_mask(config, inputs_embeds, attention_mask, past_key_values)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        past_key_values=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithCrossAttentions | tuple:
        refuse_flattened(self, position_ids, attention_mask, kwargs)
        outputs = self.roformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.cls(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        result = CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _maybe_tuple(result, return_dict, self.config)


class RoFormerClassificationHead(nn.Module):
    """Dense + activation + projection on the first token, as transformers' RoFormer does; takes the first tokens'
    states, (sequences, hidden), as `first_token_states` reads them."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.dropout(features)
        x = self.dropout(self.act(self.dense(x)))
        return self.out_proj(x)


class RoFormerForSequenceClassification(RoFormerPreTrainedModel):
    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roformer = RoFormerModel(config)
        self.classifier = RoFormerClassificationHead(config)
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
    ) -> SequenceClassifierOutput | tuple:
        outputs = self.roformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(first_token_states(outputs.last_hidden_state, outputs.packing))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config, **kwargs)
        result = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


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
        refuse_flattened(self, position_ids, attention_mask, kwargs)
        num_choices = _num_choices(self, input_ids, inputs_embeds)
        flat_mask = _flatten_choices(attention_mask)
        if (
            self.config.summary_type == "last"
            and self.config.unpad_inputs != "never"
            and flat_mask is not None
            and flat_mask.dim() == 2
            and not bool(flat_mask.bool()[:, -1].all())
        ):
            # the last position of a padded choice is a padding token, whose state only the padded pass computes
            kwargs["unpad_blocker"] = "summary_type='last' reads the last position, padding included"
        outputs = self.roformer(
            _flatten_choices(input_ids),
            attention_mask=flat_mask,
            token_type_ids=_flatten_choices(token_type_ids),
            position_ids=_flatten_choices(position_ids),
            inputs_embeds=_flatten_choices(inputs_embeds, dims=3),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        pooled = self.sequence_summary(outputs.last_hidden_state, flat_mask)
        logits = self.classifier(pooled).view(-1, num_choices)
        # transformers' loss mapping has no multiple-choice entry (its heads write this loss out too)
        loss = CrossEntropyLoss()(logits, labels.to(logits.device)) if labels is not None else None
        result = MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


class RoFormerForTokenClassification(RoFormerPreTrainedModel):
    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roformer = RoFormerModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
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
    ) -> TokenClassifierOutput | tuple:
        outputs = self.roformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = run_on_real_tokens(
            lambda states: self.classifier(self.dropout(states)), outputs.last_hidden_state, outputs.packing
        )
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        result = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


class SpanSelectionTransform(nn.Module):
    """Dense, activation, LayerNorm: one of the four token transforms of the question-aware span-selection head."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class QuestionAwareSpanSelectionHead(nn.Module):
    """Question-aware span selection (QASS; Ram et al. 2021, "Few-Shot Question Answering by Pretraining Span
    Selection", sec. 3.2, the head of Splinter): a question token q asks where its answer starts and ends, and a token
    i answers with

        start(q, i) = s(x_i) . W_s s_q(x_q)        end(q, i) = e(x_i) . W_e e_q(x_q)

    where s, s_q, e, e_q are transforms (dense, activation, LayerNorm) and W_s, W_e bias-free d x d matrices.
    """

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.query_start_transform = SpanSelectionTransform(config)
        self.query_end_transform = SpanSelectionTransform(config)
        self.start_transform = SpanSelectionTransform(config)
        self.end_transform = SpanSelectionTransform(config)
        self.start_classifier = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.end_classifier = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, token_states: torch.Tensor, question_states: torch.Tensor, packing=None):
        """token_states: (B, L, d), or the (1, N, d) real tokens of `packing`; question_states: (B, Q, d), B the
        sequences. Returns start and end scores (B, Q, L) (L: the packing's width), unmasked."""
        start_tokens = self.start_transform(token_states)
        end_tokens = self.end_transform(token_states)
        if packing is not None:
            start_tokens, end_tokens = packing.unpack(start_tokens), packing.unpack(end_tokens)  # (B, L, d)
        start_queries = self.start_classifier(self.query_start_transform(question_states))  # (B, Q, d)
        end_queries = self.end_classifier(self.query_end_transform(question_states))
        return start_queries @ start_tokens.transpose(1, 2), end_queries @ end_tokens.transpose(1, 2)


class RoFormerForQuestionAnswering(RoFormerPreTrainedModel):
    """Extractive QA: start and end logits per token. Where an attention_mask is given, the logits at padded
    positions are `torch.finfo(dtype).min` (in every `unpad_inputs` mode), so padding never wins and the loss does
    not depend on it. A flattened batch gets (num_sequences, longest sequence) logits, one row per sequence, and
    takes start/end_positions per sequence. With `config.qa_head="span_selection"` the logits come from the
    span-selection head of `RoFormerForQuestionSpanSelection` (same name, same weights), asked by each example's one
    `config.question_token_id` token."""

    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        self.roformer = RoFormerModel(config)
        if config.qa_head == "span_selection":
            self.qass = QuestionAwareSpanSelectionHead(config)
        else:
            self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        outputs = self.roformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        if self.config.qa_head == "span_selection":
            start_logits, end_logits = single_question_logits(
                self.qass, self.config, input_ids, outputs.last_hidden_state, attention_mask, outputs.packing
            )
        else:
            start_logits, end_logits = span_logits(
                self.qa_outputs, outputs.last_hidden_state, attention_mask, outputs.packing
            )
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        result = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _maybe_tuple(result, return_dict, self.config)


class RoFormerForQuestionSpanSelection(RoFormerPreTrainedModel):
    """Question-aware span selection (Splinter's QASS head), the model of recurring span selection pre-training: each
    [QUESTION] token of a passage points at the start and end of its answer span.

    question_positions (B, Q) long: the index of each question token, -1 where an example has fewer than Q. Without
    it, every token `config.question_token_id` is a question (left-aligned, -1 padded). start_positions /
    end_positions (B, Q): the answer's first and last token, ignored where the question is -1. Returns start and end
    logits (B, Q, L), `torch.finfo(dtype).min` at padding and on the rows of absent questions, and the loss: the
    mean over asked questions of (CE(start) + CE(end)) / 2. A flattened batch takes and gets the same per sequence
    (num_sequences, Q), positions counted within each sequence. `RoFormerForQuestionAnswering` with
    `config.qa_head="span_selection"` holds the same head under the same name and fine-tunes from this model's weights.
    """

    def __init__(self, config: RoFormerConfig):
        super().__init__(config)
        self.roformer = RoFormerModel(config)
        self.qass = QuestionAwareSpanSelectionHead(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        question_positions=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        if question_positions is None and (self.config.question_token_id is None or input_ids is None):
            raise ValueError(
                f"{type(self).__name__} needs question_positions, or input_ids and config.question_token_id (the "
                "[QUESTION] token) to find them"
            )
        outputs = self.roformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        packing, hidden_states = outputs.packing, outputs.last_hidden_state
        if question_positions is None:
            question_positions = find_questions(input_ids, self.config.question_token_id, packing)
        real = real_token_mask(attention_mask, packing)
        width = packing.width if packing is not None else hidden_states.shape[1]
        rows = packing.rows if packing is not None and packing.flattened else hidden_states.shape[0]
        _check_span_selection(question_positions, start_positions, end_positions, real, (rows, width))
        start_logits, end_logits = question_span_logits(
            self.qass, hidden_states, question_positions, attention_mask, packing
        )
        loss = None
        if start_positions is not None:
            loss = span_selection_loss(start_logits, end_logits, start_positions, end_positions, question_positions)
        result = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _maybe_tuple(result, return_dict, self.config)


# ---------------------------------------------------------------------------------------------------------------------
# Converting a model between rotary layouts
# ---------------------------------------------------------------------------------------------------------------------


def convert_rope_layout(model: "RoFormerPreTrainedModel", target_layout: str) -> "RoFormerPreTrainedModel":
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
            if not isinstance(module, RoFormerSelfAttention):
                continue
            projections = [module.query, module.key] + ([module.value] if config.rotary_value else [])
            for linear in projections:
                linear.weight.copy_(linear.weight[perm])
                if linear.bias is not None:
                    linear.bias.copy_(linear.bias[perm])
        if config.rotary_value:
            for module in model.modules():
                if isinstance(module, RoFormerAttention):
                    module.output.dense.weight.copy_(module.output.dense.weight[:, perm])
    config.rope_layout = target_layout
    return model


__all__ = [
    "RoFormerForCausalLM",
    "RoFormerForMaskedLM",
    "RoFormerForMultipleChoice",
    "RoFormerForQuestionAnswering",
    "RoFormerForQuestionSpanSelection",
    "RoFormerForSequenceClassification",
    "RoFormerForTokenClassification",
    "RoFormerModel",
    "RoFormerPooler",
    "RoFormerPreTrainedModel",
    "apply_rotary",
    "convert_rope_layout",
    "rope_inverse_frequencies",
]
