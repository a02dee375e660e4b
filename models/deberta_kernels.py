"""DeBERTa's speed code, beside `modeling_deberta.py`: the plan one pass builds once (`AttentionPlan`), the attention
kernels (eager, sdpa, fused FlexAttention) and the dispatch between padded, packed and fused passes, the gathers that
read the position scores, the caches inference reuses, and the convolution of a packed row.

The c2p and p2c scores are computed per layer as two small (L x R) tables (R: the relative rows the length reaches),
gathered into an additive (L x L) bias. A packed pass attends per length group of sequences, each at the relative
positions of its width; the fused kernel runs over the whole packed row, sequences kept apart by a block mask.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import is_torchdynamo_compiling, logging

from .attention import FLEX_BACKWARD_DEVICES, flex_attention_kernel
from .packing import AttentionGroup, PackedBatch, run_in_groups

logger = logging.get_logger(__name__)


@dataclass
class RelativePositions:
    """Which rows of the relative embedding table a length-L self-attention uses, and where: rows `first_row ..
    first_row + num_rows - 1` of the (2k, hidden) table are the only ones any query/key pair reaches.

    distance_rows: (2L - 1,) long, the row `r(d)` (counted from `first_row`) of distance d = i - j at index d + L - 1;
    c2p_index: (L, L) long, `num_rows - 1 - r(i, j)`: the column of the content-to-position table, whose rows run in
        reverse so that each query reads its table row front to back;
    p2c_index: (L, L) long, `r(i, j)`: the row of the position-to-content table for query i and key j;
    cache: in inference, what the layers reuse (`InferenceCache`), else None.
    """

    distance_rows: torch.Tensor
    first_row: int
    num_rows: int
    cache: "InferenceCache | None" = None

    @property
    def length(self) -> int:
        return (self.distance_rows.shape[0] + 1) // 2

    @functools.cached_property
    def p2c_index(self) -> torch.Tensor:
        positions = torch.arange(self.length, device=self.distance_rows.device)
        return self.distance_rows[positions[:, None] - positions[None, :] + (self.length - 1)]

    @functools.cached_property
    def c2p_index(self) -> torch.Tensor:
        return (self.num_rows - 1) - self.p2c_index

    @functools.cached_property
    def p2c_flat_index(self) -> torch.Tensor:
        """(L, L) long, `r(i, j) * L + j`: where p2c[i, j] sits in one head's flattened (R x L) p2c table. A gather
        along the last dimension of the flattened table is faster on CPU than the gather along rows it replaces."""
        return self.p2c_index * self.length + torch.arange(self.length, device=self.distance_rows.device)


@dataclass
class AttentionPlan:
    """What every attention layer of one pass reads, built once per pass (`DebertaEncoder.attention_plan`).

    token_mask, pair_mask: a padded pass's (B, L) bool (True at real tokens) and bool broadcastable to (B, H, L, L)
        (True = attend), None when nothing is masked; packing: a packed pass's `PackedBatch`, else None;
    positions: those of L, or of a packed pass's longest sequence; positions_of(width) builds them (None for both
        without relative attention).
    """

    token_mask: torch.Tensor | None = None
    pair_mask: torch.Tensor | None = None
    packing: PackedBatch | None = None
    positions: RelativePositions | None = None
    positions_of: Callable[[int], RelativePositions] | None = None
    _group_positions: dict[int, RelativePositions] = field(default_factory=dict, repr=False)

    def group_positions(self, width: int) -> RelativePositions | None:
        """The RelativePositions of a packed pass's length group of `width`, built once per pass."""
        if self.positions is not None and width == self.positions.length:
            return self.positions
        if self.positions_of is not None and width not in self._group_positions:
            self._group_positions[width] = self.positions_of(width)
        return self._group_positions.get(width)

    @functools.cached_property
    def document_mask(self):
        """The packed row's `document_block_mask`, built by the first fused layer."""
        return document_block_mask(self.packing.cu_seqlens, self.packing.num_tokens)


def token_and_pair_masks(attention_mask: torch.Tensor | None, device) -> tuple:
    """A padded pass's (token_mask, pair_mask) from a user mask, 1 = attend: a (B, L) mask masks keys; a (B, L, L)
    mask is used as it is, the tokens any query attends being the token mask (the official rule). None, None when
    nothing is masked, so that the kernels skip masking."""
    if attention_mask is None:
        return None, None
    mask = attention_mask.to(device=device, dtype=torch.bool)
    if not is_torchdynamo_compiling() and bool(mask.all()):
        return None, None
    if mask.dim() == 2:
        return mask, mask[:, None, None, :]
    return mask.any(dim=-2), mask[:, None]


def sequence_convolution(conv: nn.Conv1d, hidden_states: torch.Tensor, plan: AttentionPlan) -> torch.Tensor:
    """`conv` over each sequence alone: (B, L, hidden), or a packed (1, N, hidden) row laid out with `conv.padding`
    zeros between its sequences, the zeros each sequence has at its ends on the padded path."""
    if plan.packing is None:
        return conv(hidden_states.transpose(1, 2)).transpose(1, 2)
    packing, gap = plan.packing, conv.padding[0]
    slots = torch.arange(packing.num_tokens, device=hidden_states.device) + packing.indices // packing.width * gap
    row = hidden_states.new_zeros(packing.num_tokens + packing.rows * gap, hidden_states.shape[-1])
    row = row.index_copy(0, slots, hidden_states[0])
    return conv(row.T[None])[0].T.index_select(0, slots)[None]


def position_score_tables(query, key, pos_key, pos_query) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """c2p_table (B, H, L, R) = query . pos_key and p2c_table (B, H, R, L) = pos_query . key, or None where the term
    is off. pos_key, pos_query: (H, R, D) scaled projections of the R used relative rows, pos_key in reverse order."""
    c2p_table = torch.matmul(query, pos_key.transpose(-1, -2)) if pos_key is not None else None
    p2c_table = torch.matmul(pos_query, key.transpose(-1, -2)) if pos_query is not None else None
    return c2p_table, p2c_table


def gather_position_bias(c2p_table, p2c_table, positions: RelativePositions, out=None, scratch=None):
    """The (B, H, L, L) additive bias `c2p + p2c`: `c2p[i, j] = c2p_table[i, c2p_index[i, j]]`, `p2c[i, j] =
    p2c_table[p2c_index[i, j], j]`, both terms at the same relative row, as the official code's shared `c2p_pos`.
    The (L, L) indices broadcast over batch and heads without a copy; `out` / `scratch` receive the bias and p2c."""
    reference = c2p_table if c2p_table is not None else p2c_table
    batch, heads, length = reference.shape[0], reference.shape[1], positions.length
    shape = (batch, heads, length, length)
    if torch.compiler.is_exporting():
        return flat_position_bias(c2p_table, p2c_table, positions, shape)
    bias = None
    if c2p_table is not None:
        bias = torch.gather(c2p_table, -1, positions.c2p_index.expand(shape), out=out)
    if p2c_table is not None:
        target = out if bias is None else scratch
        if p2c_table.requires_grad:
            p2c = torch.gather(p2c_table, -2, positions.p2c_index.expand(shape), out=target)
        else:
            # Every query row reads the whole flattened (R x L) table of its head: an expanded (stride 0) view, which
            # gather accepts as input but could not take a gradient into.
            rows = p2c_table.shape[-2]
            flat_table = p2c_table.reshape(batch, heads, 1, rows * length).expand(batch, heads, length, rows * length)
            p2c = torch.gather(flat_table, -1, positions.p2c_flat_index.expand(shape), out=target)
        bias = p2c if bias is None else bias.add_(p2c)
    return bias


def flat_position_bias(c2p_table, p2c_table, positions: RelativePositions, shape) -> torch.Tensor:
    """`gather_position_bias` for an exported graph, where the expanded (B, H, L, L) index of each gather would be
    materialised in every layer: each table is flattened per head and read with one (L * L) index instead."""
    bias = None
    if c2p_table is not None:
        rows = torch.arange(shape[-1], device=c2p_table.device)[:, None] * c2p_table.shape[-1]
        bias = c2p_table.flatten(2).index_select(2, (rows + positions.c2p_index).flatten()).view(shape)
    if p2c_table is not None:
        p2c = p2c_table.flatten(2).index_select(2, positions.p2c_flat_index.flatten()).view(shape)
        bias = p2c if bias is None else bias + p2c
    return bias


def disentangled_bias(query, key, pos_key, pos_query, positions: RelativePositions | None) -> torch.Tensor | None:
    """The (B, H, L, L) position bias (scaled), through `positions.cache` in inference; None without the terms."""
    if positions is None or (pos_key is None and pos_query is None):
        return None
    if positions.cache is not None:
        return positions.cache.position_bias(query, key, pos_key, pos_query, positions)
    return gather_position_bias(*position_score_tables(query, key, pos_key, pos_query), positions)


def position_rows_within(pos_key, pos_query, first_row: int, num_rows: int, inner: RelativePositions):
    """The position keys and queries of the rows `inner` uses, sliced from those of the rows `first_row ..
    first_row + num_rows - 1`, which include them. pos_key: (H, num_rows, D) in reverse row order, or None;
    pos_query: (H, num_rows, D), or None."""
    start = inner.first_row - first_row
    end = first_row + num_rows - inner.first_row  # counted from the end of the reversed keys
    if pos_key is not None:
        pos_key = pos_key[:, end - inner.num_rows : end]
    if pos_query is not None:
        pos_query = pos_query[:, start : start + inner.num_rows]
    return pos_key, pos_query


def parameters_key(*tensors) -> tuple:
    """Identity of the current values of some parameters: storage, in-place version, dtype, device and shape."""
    return tuple(
        (t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape)) if t is not None else None for t in tensors
    )


def projects_with_weights_only(module: nn.Module) -> bool:
    """Whether the parameters alone decide an attention module's projections (plain `nn.Linear`s without hooks): a
    wrapped one (LoRA, whose adapters switch without touching a parameter; a quantized linear) is never cached."""
    return all(
        type(projection) is nn.Linear
        and not (projection._forward_hooks or projection._forward_pre_hooks or "forward" in projection.__dict__)
        for name in module._PROJECTIONS
        if (projection := getattr(module, name, None)) is not None
    )


class InferenceCache:
    """What the layers reuse in inference (eval mode, no autograd, no autocast, not compiling; `for_pass`), made
    once per pass and keyed by the parameters of the relative table: each layer's projections of the whole table
    (weights only), kept on the attention module until the table or a parameter changes; and buffers the layers share
    for the score tables and the (B, H, L, L) bias, since fresh multi-megabyte allocations cost page faults."""

    def __init__(self, table_parameters):
        self.table_key = parameters_key(*table_parameters)
        self._buffers: dict[tuple, torch.Tensor] = {}

    @classmethod
    def for_pass(cls, module: nn.Module, table_parameters) -> "InferenceCache | None":
        device = table_parameters[0].device.type
        training = module.training or torch.is_grad_enabled() or torch.is_autocast_enabled(device)
        return None if training or is_torchdynamo_compiling() else cls(table_parameters)

    def buffer(self, name: str, shape, like: torch.Tensor) -> torch.Tensor:
        """A buffer kept across layers, one per name and shape (a packed pass attends groups of several widths)."""
        key = (name, tuple(shape))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self._buffers[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buffer

    def position_projections(self, module: nn.Module, rel_embeddings: torch.Tensor, positions: RelativePositions):
        """`module.project_positions` of the rows `positions` uses, sliced from those of the whole table."""
        key = (self.table_key, parameters_key(*module.parameters()))
        cached = getattr(module, "_position_cache", None)
        if cached is None or cached[0] != key:
            cached = module._position_cache = (key, module.project_positions(rel_embeddings.flip(0), rel_embeddings))
        return position_rows_within(*cached[1], 0, rel_embeddings.shape[0], positions)

    def position_bias(self, query, key, pos_key, pos_query, positions: RelativePositions) -> torch.Tensor:
        """`disentangled_bias`, one batch element at a time (half the heads at a time for a single sequence) into
        the shared buffers: the tables and the p2c term then take a fraction of the memory and stay in cache."""
        batch, heads, length = query.shape[:3]
        rows = (pos_key if pos_key is not None else pos_query).shape[1]
        bias = self.buffer("bias", (batch, heads, length, length), query)
        step = -(-heads // 2) if batch == 1 else heads
        for item in range(batch):
            for start in range(0, heads, step):
                chunk = slice(start, start + step)
                count = min(step, heads - start)
                c2p_table = p2c_table = None
                if pos_key is not None:
                    c2p_table = self.buffer(f"c2p{count}", (1, count, length, rows), query)
                    torch.matmul(query[item, chunk], pos_key[chunk].transpose(-1, -2), out=c2p_table[0])
                if pos_query is not None:
                    p2c_table = self.buffer(f"p2c{count}", (1, count, rows, length), query)
                    torch.matmul(pos_query[chunk], key[item, chunk].transpose(-1, -2), out=p2c_table[0])
                scratch = self.buffer(f"scratch{count}", (1, count, length, length), query)
                out = bias[item : item + 1, chunk]  # contiguous: one batch element, consecutive heads
                gather_position_bias(c2p_table, p2c_table, positions, out=out, scratch=scratch)
        return bias


# The kernels, one signature: transformers' attention interface (module, query, key, value, attention_mask: bool, True =
# attend, broadcastable to (B, H, L, L), or None; scaling, dropout) plus the position terms (pos_key, pos_query and the
# RelativePositions they index), returning ((B, L, H, D), weights or None). A table of DeBERTa's own rather than
# transformers' `AttentionInterface`, whose kernels would run without the c2p/p2c scores.


def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, *, pos_key, pos_query, positions):
    """Softmax attention with the position bias added to the scores; returns the weights too."""
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))
    bias = disentangled_bias(query, key, pos_key, pos_query, positions)
    if bias is not None:
        scores = scores + bias
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=dropout > 0)
    return torch.matmul(weights, value).transpose(1, 2), weights


def sdpa_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, *, pos_key, pos_query, positions):
    """`scaled_dot_product_attention` with the position bias as a float mask, padding filled with the dtype's minimum
    (a boolean mask would become -inf inside sdpa, and a row of padding only NaN)."""
    mask = disentangled_bias(query, key, pos_key, pos_query, positions)
    if attention_mask is not None:
        if mask is None:
            mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        mask = mask.masked_fill_(~attention_mask, torch.finfo(mask.dtype).min)
    context = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return context.transpose(1, 2), None


FLEX_BLOCK_SIZE = 128


def kernel_distance_rows(positions: RelativePositions) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The relative rows the fused kernel reads, padded to a power-of-two width P >= L so that nearby lengths reuse
    one compiled kernel: p2c_rows (2P - 1,), r(d) at index d + P - 1 (the edge rows repeated beyond L - 1, where no
    real pair reaches), c2p_columns (2P - 1,), `num_rows - 1 - r(d)`, and the offset P - 1."""
    length = positions.length
    width = 1 << max(length - 1, 0).bit_length()
    rows, extra = positions.distance_rows, width - length
    if extra:
        rows = torch.cat([rows[:1].expand(extra), rows, rows[-1:].expand(extra)])
    return rows, (positions.num_rows - 1) - rows, width - 1


def blocks_to_mask(partial: torch.Tensor, full: torch.Tensor, mask_mod, length: int, block_size: int):
    """A FlexAttention BlockMask from block flags. partial, full: (B, Q_blocks, K_blocks) bool, the key blocks each
    query block reads with `mask_mod` applied / in full; a block in neither is skipped."""
    from torch.nn.attention.flex_attention import BlockMask

    def listed(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = flags.sum(-1, dtype=torch.int32)[:, None]  # (B, 1, Q_blocks)
        order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]
        return counts, order  # the flagged blocks first, in order

    # kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices
    blocks = (*listed(partial), *listed(full))
    return BlockMask.from_kv_blocks(*blocks, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(length, length))


def key_padding_block_mask(key_mask: torch.Tensor, block_size: int = FLEX_BLOCK_SIZE):
    """The BlockMask of a (B, L) bool key mask (True = attend): all-padding key blocks skipped, all-real ones read
    without a mask, the others masked per key."""
    batch, length = key_mask.shape
    blocks = -(-length // block_size)
    padded = F.pad(key_mask, (0, blocks * block_size - length))  # the tail past L counts as padding
    per_block = padded.view(batch, blocks, block_size)
    full = per_block.all(-1)
    partial = per_block.any(-1) & ~full

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        return padded[batch_idx, kv_idx]

    expand = (batch, blocks, blocks)
    return blocks_to_mask(partial[:, None].expand(expand), full[:, None].expand(expand), mask_mod, length, block_size)


def document_block_mask(cu_seqlens: torch.Tensor, length: int, block_size: int = FLEX_BLOCK_SIZE):
    """The BlockMask of a packed row of `length` tokens whose sequences start at `cu_seqlens`: each token attends its
    own sequence; a block pair inside one sequence is read in full, one whose sequences cannot meet is skipped."""
    blocks = -(-length // block_size)
    tokens = torch.arange(blocks * block_size, device=cu_seqlens.device)
    document = torch.searchsorted(cu_seqlens[1:].long(), tokens, right=True)
    document = document.masked_fill(tokens >= length, -1)  # the tail past the row: no block holding it is full
    per_block = document.view(blocks, block_size)
    low, high = per_block.min(-1).values, per_block.max(-1).values
    meet = (low[:, None] <= high[None, :]) & (low[None, :] <= high[:, None])
    single = low == high
    full = meet & single[:, None] & single[None, :]

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        return document[q_idx] == document[kv_idx]

    return blocks_to_mask((meet & ~full)[None], full[None], mask_mod, length, block_size)


def fused_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, *, pos_key, pos_query, positions):
    """Disentangled attention in one FlexAttention kernel, the position scores read from their tables in its
    score_mod: score(i, j) + c2p_table[i, R - 1 - r(i - j)] + p2c_table[r(i - j), j]; no dropout. attention_mask: a
    key mask (as `key_padding_block_mask`) or a packed row's `document_block_mask`."""
    from torch.nn.attention.flex_attention import BlockMask

    c2p_table, p2c_table = position_score_tables(query, key, pos_key, pos_query)
    score_mod = None
    if positions is not None and (c2p_table is not None or p2c_table is not None):
        p2c_rows, c2p_columns, offset = kernel_distance_rows(positions)
        last = 2 * offset

        def score_mod(score, batch, head, q_idx, kv_idx):
            distance = (q_idx - kv_idx + offset).clamp(0, last)  # clamped: pairs across sequences are masked
            if c2p_table is not None:
                score = score + c2p_table[batch, head, q_idx, c2p_columns[distance]]
            if p2c_table is not None:
                score = score + p2c_table[batch, head, p2c_rows[distance], kv_idx]
            return score

    block_mask = attention_mask
    if attention_mask is not None and not isinstance(attention_mask, BlockMask):
        block_mask = key_padding_block_mask(attention_mask[:, 0, 0])
    context = flex_attention_kernel(query.device.type)(
        query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling
    )
    return context.transpose(1, 2), None


ATTENTION_KERNELS = {"eager": eager_attention, "sdpa": sdpa_attention, "posformers_fused": fused_attention}


def choose_implementation(module: nn.Module, query: torch.Tensor, attention_mask, output_attentions: bool) -> str:
    """The kernel of this pass: the configured one, except "eager" for output_attentions (only it returns weights),
    and "sdpa" (noted once per reason) where the fused kernel cannot run: attention dropout, a (B, L, L) mask, a
    backward where FlexAttention has none, or a CPU graph being compiled (see `compiled_flex_attention`)."""
    implementation = module.config._attn_implementation or "eager"
    if output_attentions:
        return "eager"
    if implementation != "posformers_fused":
        return implementation
    if module.training and module.attention_dropout > 0:
        reason = "attention dropout (set attention_probs_dropout_prob=0 to train with the fused kernel)"
    elif attention_mask is not None and attention_mask.shape[-2] != 1:
        reason = "a (B, L, L) attention_mask (pass the 2D padding mask)"
    elif query.requires_grad and query.device.type not in FLEX_BACKWARD_DEVICES:
        reason = f"a backward pass on {query.device.type} (FlexAttention has a backward on {FLEX_BACKWARD_DEVICES})"
    elif query.device.type == "cpu" and is_torchdynamo_compiling():
        reason = "torch.compile on CPU (inductor's CPU FlexAttention kernel is not exact on every CPU)"
    else:
        return implementation
    logger.warning_once(f"The fused DeBERTa attention runs the sdpa kernel for {reason}.")
    return "sdpa"


def disentangled_attention(module, query, key, value, pos_key, pos_query, plan: AttentionPlan, output_attentions):
    """One layer's attention on `plan`: one kernel call over a padded batch or (fused) a packed row, else one per
    length group of the packed row, at the relative positions of its width. query, key, value: (B, H, L, D) or
    (1, H, N, D); pos_key, pos_query: (H, R, D) or None. Returns ((B, L, H * D), weights or None)."""
    implementation = choose_implementation(module, query, plan.pair_mask, output_attentions)
    kernel = ATTENTION_KERNELS[implementation]
    dropout = module.attention_dropout if module.training else 0.0
    positions = plan.positions
    if plan.packing is None or implementation == "posformers_fused":
        mask = plan.pair_mask if plan.packing is None else plan.document_mask
        context, weights = kernel(
            module, query, key, value, mask, module.scaling, dropout,
            pos_key=pos_key, pos_query=pos_query, positions=positions,
        )  # fmt: skip
        return context.flatten(2), weights

    def attend_group(group: AttentionGroup, group_query, group_key, group_value):
        group_positions, group_pos_key, group_pos_query = plan.group_positions(group.width), None, None
        if group_positions is not None:
            first, count = positions.first_row, positions.num_rows
            group_pos_key, group_pos_query = position_rows_within(pos_key, pos_query, first, count, group_positions)
        # a group of equal lengths has no padding: no mask, as the padded path without padding
        mask = None if group.rows * group.width == group.slots.numel() else group.key_mask[:, None, None, :]
        group_query, group_key, group_value = (t.transpose(1, 2) for t in (group_query, group_key, group_value))
        context, _ = kernel(
            module, group_query, group_key, group_value, mask, module.scaling, dropout,
            pos_key=group_pos_key, pos_query=group_pos_query, positions=group_positions,
        )  # fmt: skip
        return context  # (rows, width, H, D)

    # each group gets (rows, width, H, D) views of the (1, H, N, D) projections, attended as (rows, H, width, D)
    context = run_in_groups(plan.packing, attend_group, *(t.transpose(1, 2) for t in (query, key, value)))
    return context.flatten(2), None
