"""PyTorch DeBERTa v1, v2 and v3 (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention";
He et al. 2023, "DeBERTaV3").

Reads top to bottom in the order data flows: relative positions, embeddings, disentangled attention and its kernels,
layer, convolution, encoder, pre-trained base, base model, heads. Parameter names are those of the official
checkpoints in Hugging Face format (`deberta.*`, `lm_predictions.lm_head.*`, `mask_predictions.*`, `pooler.*`,
`classifier.*`), so they load unchanged; v1 checkpoints keep their fused `in_proj` layout
(`config.projection_layout="fused"`).

Speed: the content-to-position and position-to-content scores are computed per layer as two small (L x 2k) tables,
gathered once into an additive (L x L) bias (one index per query/key pair) and handed to
`scaled_dot_product_attention`; nothing is repeated per batch element and relative positions are built once per
forward. Only the rows of the relative embedding table that the sequence length can reach are used. In inference the
projections of that table (weights only) are cached per layer and the position buffers are shared by the layers
(`InferenceCache`).

Padding-free (`config.unpad_inputs`, flattened batches): the real tokens run as one packed (1, N) row through the
embeddings, projections, FFN and norms; attention runs per length group of sequences (`grouped_attention`), each group
with the relative positions of its own width (memoised on the `PackedBatch` for the pass), the position projections
computed once per layer for the longest sequence and sliced per group; the v2 convolution runs per sequence. The heads
plan the same packing from their inputs (`heads.run_base_model`). Per-token outputs hold zeros at padded positions on
either path.

This file imports only torch, transformers and its sibling modules (configuration, packing, inputs, heads, attention,
layers, loading): `save_pretrained` copies them to the Hub for `trust_remote_code` users.
"""

import copy
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput, is_torchdynamo_compiling, logging

from .attention import FLEX_BACKWARD_DEVICES, FusedKernelChoice, flex_attention_kernel, flex_attention_refusal
from .configuration_deberta import DebertaConfig, parse_norm_rel_ebd
from .heads import (
    GenericForMaskedLM,
    GenericForMultipleChoice,
    GenericForQuestionAnswering,
    GenericForQuestionSpanSelection,
    GenericForSequenceClassification,
    GenericForTokenClassification,
    LabelledHead,
    per_item_loss,
)
from .inputs import EncoderForward
from .layers import Intermediate, ResidualOutput
from .loading import CheckedLoadingMixin, checkpoint_names
from .packing import (
    AttentionGroup,
    PackedBatch,
    grouped_attention,
    keep_states,
    plan_packing,
    pop_cu_seq_lens,
    state_shower,
    zero_padding,
)

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Relative positions: small pure functions
# ---------------------------------------------------------------------------------------------------------------------


def log_bucket_position(relative_pos: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's log buckets (official `make_log_bucket_position`), elementwise on integer distances `i - j`.

    Distances up to `bucket_size // 2` are kept; farther ones share log-spaced buckets that reach `bucket_size - 1` at
    `max_position - 1`. As in the official code, distances are first clipped to `±(max_position - 1)`, so every
    bucket lies in `[-(bucket_size - 1), bucket_size - 1]` (transformers' port omits the clip and sends distances
    beyond `max_position` to bucket `-bucket_size`, a row the official model never uses). The float32 arithmetic is
    the official one, operation for operation, so bucket boundaries agree exactly.

    relative_pos: integer tensor of any shape -> long tensor of the same shape.
    """
    mid = bucket_size // 2
    relative_pos = relative_pos.long().clamp(-max_position + 1, max_position - 1)
    abs_pos = relative_pos.abs()
    # Inside the window the log is not used; any value >= mid keeps it finite.
    far = abs_pos.clamp_min(mid).to(torch.float32)
    log_pos = torch.ceil(torch.log(far / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos, log_pos.long() * relative_pos.sign())


def _farthest_bucket(distance: int, bucket_size: int, max_position: int) -> int:
    """An upper bound of `|log_bucket_position(d)|` over `|d| <= distance` (float64, one bucket of margin)."""
    mid = bucket_size // 2
    distance = min(distance, max_position - 1)
    if distance <= mid:
        return distance
    return math.ceil(math.log(distance / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid + 1


@dataclass
class RelativePositions:
    """Which rows of the relative embedding table a length-L self-attention uses, and where.

    Rows `first_row .. first_row + num_rows - 1` of the (2k, hidden) table are the only ones any query/key pair
    reaches, so only they are projected. The row depends on the distance i - j alone, so one (2L - 1) vector holds
    it; the (L, L) indices the gathers read are built from it on first use (the fused kernel reads the vector):

    distance_rows: (2L - 1,) long, `r(d)` for d = i - j = -(L - 1) .. L - 1 (at index d + L - 1): the row, counted
        from `first_row`, holding the embedding of a query d positions after its key;
    c2p_index: (L, L) long, `num_rows - 1 - r(i, j)`: the column of the content-to-position table, whose rows run in
        reverse so that each query reads its table row front to back (r(i, j) decreases along j);
    p2c_index: (L, L) long, `r(i, j)`: the row of the position-to-content table for query i and key j.
    cache: in inference, what the layers reuse instead of recomputing or reallocating (`InferenceCache`), else None.
    """

    distance_rows: torch.Tensor
    first_row: int
    num_rows: int
    cache: "InferenceCache | None" = None  # set by the encoder in inference
    _p2c_index: torch.Tensor | None = None
    _c2p_index: torch.Tensor | None = None
    _p2c_flat_index: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return (self.distance_rows.shape[0] + 1) // 2

    @property
    def p2c_index(self) -> torch.Tensor:
        if self._p2c_index is None:
            positions = torch.arange(self.length, device=self.distance_rows.device)
            self._p2c_index = self.distance_rows[positions[:, None] - positions[None, :] + (self.length - 1)]
        return self._p2c_index

    @property
    def c2p_index(self) -> torch.Tensor:
        if self._c2p_index is None:
            self._c2p_index = (self.num_rows - 1) - self.p2c_index
        return self._c2p_index

    @property
    def p2c_flat_index(self) -> torch.Tensor:
        """(L, L) long, `r(i, j) * L + j`: where p2c[i, j] sits in one head's flattened (R x L) p2c table, built once
        per forward. A gather along the last dimension of the flattened table is 3-4x faster on CPU than the gather
        along rows it replaces."""
        if self._p2c_flat_index is None:
            length = self.p2c_index.shape[-1]
            keys = torch.arange(length, device=self.p2c_index.device)
            self._p2c_flat_index = self.p2c_index * length + keys
        return self._p2c_flat_index


def relative_positions(length: int, config: DebertaConfig, device: torch.device) -> RelativePositions:
    """Relative position rows for every query/key pair, with the official clamping.

    The official code scores query i against key j with row `clamp(bucket(i - j) + k, 0, 2k - 1)` of the relative
    embedding table (k = `config.relative_span`; `bucket` is the identity without `position_buckets`). v1 slices its
    table to the span the length needs first; that selects the same rows, so one formula covers v1, v2 and v3.
    """
    span = config.relative_span
    buckets, max_position = config.position_buckets, config.max_relative_distance
    distances = torch.arange(-(length - 1), length, device=device)  # i - j, from -(L-1) to L-1
    if buckets > 0:
        distances = log_bucket_position(distances, buckets, max_position)
    rows = (distances + span).clamp(0, 2 * span - 1)  # (2L - 1,), non-decreasing in i - j
    if torch.compiler.is_exporting():
        farthest = span  # an exported graph (ONNX) serves every length: all rows, no Python math on the length
    else:
        farthest = _farthest_bucket(length - 1, buckets, max_position) if buckets > 0 else length - 1
    first_row = max(span - farthest, 0)
    num_rows = min(span + farthest, 2 * span - 1) - first_row + 1
    return RelativePositions(distance_rows=rows - first_row, first_row=first_row, num_rows=num_rows)


def position_score_tables(
    query: torch.Tensor, key: torch.Tensor, pos_key: torch.Tensor | None, pos_query: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The two small tables the disentangled scores are read from.

    query, key: (B, H, L, D); pos_key, pos_query: (H, R, D) projections of the R used relative embedding rows, already
    scaled, pos_key in reverse row order (or None when the term is off).
    Returns c2p_table (B, H, L, R) = query . pos_key (content-to-position: every query against every relative row)
    and p2c_table (B, H, R, L) = pos_query . key (position-to-content: every relative row against every key).
    """
    c2p_table = torch.matmul(query, pos_key.transpose(-1, -2)) if pos_key is not None else None
    p2c_table = torch.matmul(pos_query, key.transpose(-1, -2)) if pos_query is not None else None
    return c2p_table, p2c_table


def gather_position_bias(
    c2p_table: torch.Tensor | None,
    p2c_table: torch.Tensor | None,
    positions: RelativePositions,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The (B, H, L, L) additive score bias `c2p + p2c`, both read query-major with one index per query/key pair:
    `c2p[i, j] = c2p_table[i, c2p_index[i, j]]`, `p2c[i, j] = p2c_table[p2c_index[i, j], j]`.

    The (L, L) indices broadcast over batch and heads without a copy; both terms index the same relative row, as the
    official code's shared `c2p_pos` does. `out` / `scratch` optionally receive the bias and the p2c term.
    """
    reference = c2p_table if c2p_table is not None else p2c_table
    if reference is None:
        return None
    batch, heads, length = reference.shape[0], reference.shape[1], positions.c2p_index.shape[0]
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
    materialised in every layer (ONNX Runtime spent more than half of an int8 DeBERTa's time on those copies): each
    table is flattened per head and read with one (L * L) index instead."""
    bias = None
    if c2p_table is not None:
        rows = torch.arange(shape[-1], device=c2p_table.device)[:, None] * c2p_table.shape[-1]
        bias = c2p_table.flatten(2).index_select(2, (rows + positions.c2p_index).flatten()).view(shape)
    if p2c_table is not None:
        p2c = p2c_table.flatten(2).index_select(2, positions.p2c_flat_index.flatten()).view(shape)
        bias = p2c if bias is None else bias + p2c
    return bias


def position_bias(query, key, pos_key, pos_query, positions: RelativePositions) -> torch.Tensor | None:
    """`gather_position_bias(*position_score_tables(...))`, or in inference the same through `positions.cache`."""
    if positions.cache is not None and (pos_key is not None or pos_query is not None):
        return positions.cache.position_bias(query, key, pos_key, pos_query, positions)
    return gather_position_bias(*position_score_tables(query, key, pos_key, pos_query), positions)


def position_rows_within(pos_key, pos_query, outer: RelativePositions, inner: RelativePositions):
    """The position keys and queries of the rows `inner` uses, sliced from those of the rows `outer` uses (which
    include them: a shorter length reaches a sub-range of rows). pos_key: (H, R_outer, D) in reverse row order, or
    None; pos_query: (H, R_outer, D), or None."""
    start = inner.first_row - outer.first_row
    end = outer.first_row + outer.num_rows - inner.first_row  # counted from the end of the reversed keys
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


class InferenceCache:
    """What the layers reuse in inference (eval mode, no autograd, no autocast, not compiling) instead of recomputing
    or reallocating it. The encoder makes one per forward pass, from the parameters of its relative table.

    - Each layer's projections of the whole relative table depend on weights only: `position_projections` keeps them
      on the attention module until the table or a parameter of the module changes (in-place updates included).
    - The score tables and the (B, H, L, L) bias every layer writes go to buffers shared by the layers (`buffer`):
      fresh multi-megabyte allocations cost page faults on every layer otherwise.
    """

    def __init__(self, table_parameters):
        self.table_key = parameters_key(*table_parameters)
        self._buffers: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, shape, like: torch.Tensor) -> torch.Tensor:
        """A buffer kept across layers, one per name and shape (a packed batch attends groups of several widths in
        every layer), reallocated only when the dtype or device changes."""
        key = (name, tuple(shape))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self._buffers[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buffer

    def position_projections(self, module: nn.Module, rel_embeddings: torch.Tensor, project):
        """`project(rel_embeddings)`, computed once per value of the table and of `module`'s parameters."""
        key = (self.table_key, parameters_key(*module.parameters()))
        cached = getattr(module, "_position_cache", None)
        if cached is None or cached[0] != key:
            cached = module._position_cache = (key, project(rel_embeddings))
        return cached[1]

    def position_bias(self, query, key, pos_key, pos_query, positions: RelativePositions) -> torch.Tensor:
        """`position_bias`, one batch element at a time (half the heads at a time for a single sequence) into the
        shared buffers: the tables and the p2c term then take a fraction of the memory and stay closer to the cache."""
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


def relative_positions_of(
    length: int, config: DebertaConfig, device, packing: PackedBatch | None = None
) -> RelativePositions | None:
    """`relative_positions(length, ...)`, None without relative attention. With `packing` (a padding-free pass) built
    once per pass and width: the longest sequence's and each attention group's, shared by the layers."""
    if not config.relative_attention:
        return None
    if packing is None:
        return relative_positions(length, config, device)
    return packing.memo(("deberta relative positions", length), lambda: relative_positions(length, config, device))


# ---------------------------------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------------------------------


class DebertaEmbeddings(nn.Module):
    """Word (+ token type) (+ absolute position, when `position_biased_input`) embeddings, LayerNorm, padding zeroed.

    `position_embeddings` also exists when the Enhanced Mask Decoder needs absolute positions (`with_positions`);
    it is then not added here but read by `DebertaEnhancedMaskDecoder`.
    """

    def __init__(self, config: DebertaConfig, with_positions: bool = False):
        super().__init__()
        self.position_biased_input = config.position_biased_input
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        if config.position_biased_input or with_positions:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        if config.embedding_size != config.hidden_size:
            self.embed_proj = nn.Linear(config.embedding_size, config.hidden_size, bias=False)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, input_mask=None, inputs_embeds=None):
        """input_mask: (B, L) bool, True for real tokens, or None. Returns (B, L, hidden_size)."""
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.position_biased_input:
            embeddings = embeddings + self.position_embeddings(position_ids)
        if hasattr(self, "embed_proj"):
            embeddings = self.embed_proj(embeddings)
        embeddings = self.LayerNorm(embeddings)
        if input_mask is not None:
            embeddings = embeddings * input_mask[..., None].to(embeddings.dtype)  # official MaskedLayerNorm
        return self.dropout(embeddings)


# ---------------------------------------------------------------------------------------------------------------------
# Disentangled attention
# ---------------------------------------------------------------------------------------------------------------------


# The kernels, one signature: transformers' attention interface (module, query, key, value, attention_mask, scaling,
# dropout) plus the disentangled position terms (pos_key, pos_query and the RelativePositions they index), returning
# ((B, L, H, D), weights or None). A table of DeBERTa's own rather than transformers' `AttentionInterface`: its kernels
# would run without the c2p/p2c scores, and registering these there would offer them to every other model.
# attention_mask: bool, True = attend, broadcastable to (B, H, L, L), or None.


def disentangled_bias(query, key, pos_key, pos_query, positions) -> torch.Tensor | None:
    """The (B, H, L, L) position bias, scaled, or None without relative attention."""
    if positions is None or (pos_key is None and pos_query is None):
        return None
    return position_bias(query, key, pos_key, pos_query, positions)


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
    """The relative rows the fused kernel reads, padded to a power-of-two width P >= L so that batches of nearby
    lengths reuse one compiled kernel (the offset is a constant of the kernel).

    Returns p2c_rows (2P - 1,) long, the row r(d) for d = i - j at index d + P - 1 (distances beyond L - 1 repeat the
    edge rows: no real pair reaches them); c2p_columns (2P - 1,) long, `num_rows - 1 - r(d)`; and the offset P - 1.
    """
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

    kv_num_blocks, kv_indices = listed(partial)
    full_kv_num_blocks, full_kv_indices = listed(full)
    return BlockMask.from_kv_blocks(
        kv_num_blocks,
        kv_indices,
        full_kv_num_blocks,
        full_kv_indices,
        BLOCK_SIZE=block_size,
        mask_mod=mask_mod,
        seq_lengths=(length, length),
    )


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
    """The BlockMask of a packed row of `length` tokens holding sequences that start at `cu_seqlens` (the varlen
    layout): each token attends the tokens of its own sequence. A block pair is read in full when both blocks lie
    inside one sequence, skipped when their sequences cannot meet."""
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
    """Disentangled attention in one FlexAttention kernel, the position scores read from their tables
    (`position_score_tables`) in its score_mod: score(i, j) + c2p_table[i, R - 1 - r(i - j)] + p2c_table[r(i - j), j].
    No dropout (`DisentangledSelfAttention.implementation` sends a pass with dropout to sdpa). attention_mask: as the
    other kernels', or a BlockMask (a packed row's `document_block_mask`); a key mask becomes
    `key_padding_block_mask`. positions: those of L, or of the longest sequence of a packed row."""
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


class DisentangledSelfAttention(nn.Module):
    """Content-to-content plus content-to-position and position-to-content attention (DeBERTa eq. 4).

    Scores are scaled by `1 / sqrt(head_dim * (1 + len(pos_att_type)))` (the official scale). With
    `share_att_key` (v2/v3) the relative embeddings are projected by the content query/key projections; otherwise by
    their own position projections.
    """

    _PROJECTIONS = ("in_proj", "query_proj", "key_proj", "pos_proj", "pos_q_proj", "pos_key_proj", "pos_query_proj")

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        all_head_size = self.num_heads * self.head_dim
        self.fused = config.projection_layout == "fused"
        if self.fused:
            # v1: per head, rows [query, key, value] of one bias-free projection; the query and value biases apart.
            self.in_proj = nn.Linear(config.hidden_size, 3 * all_head_size, bias=False)
            self.q_bias = nn.Parameter(torch.zeros(all_head_size))
            self.v_bias = nn.Parameter(torch.zeros(all_head_size))
        else:
            self.query_proj = nn.Linear(config.hidden_size, all_head_size)
            self.key_proj = nn.Linear(config.hidden_size, all_head_size)
            self.value_proj = nn.Linear(config.hidden_size, all_head_size)
        self.pos_att_type = list(config.pos_att_type)
        self.scaling = (self.head_dim * (1 + len(self.pos_att_type))) ** -0.5
        self.relative_attention = config.relative_attention
        self.share_att_key = config.share_att_key
        if self.relative_attention:
            self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)
            if not self.share_att_key and "c2p" in self.pos_att_type:
                if self.fused:
                    self.pos_proj = nn.Linear(config.hidden_size, all_head_size, bias=False)
                else:
                    self.pos_key_proj = nn.Linear(config.hidden_size, all_head_size)
            if not self.share_att_key and "p2c" in self.pos_att_type:
                if self.fused:
                    self.pos_q_proj = nn.Linear(config.hidden_size, all_head_size)
                else:
                    self.pos_query_proj = nn.Linear(config.hidden_size, all_head_size)
        self.attention_dropout = config.attention_probs_dropout_prob

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(..., L, H * D) -> (..., H, L, D)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-2, -3)

    def _fused_parts(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`in_proj(states)` split into query, key and value (v1 interleaves them per head), each (..., H, L, D)."""
        qkv = self.in_proj(states).unflatten(-1, (self.num_heads, 3, self.head_dim))
        return tuple(part.transpose(-2, -3) for part in qkv.unbind(-2))

    def project_content(self, hidden_states: torch.Tensor, query_states: torch.Tensor | None):
        """Queries from `query_states` (default: `hidden_states`), keys and values from `hidden_states`.

        Returns query, key, value, each (B, H, L, D).
        """
        if not self.fused:
            query = self._heads(self.query_proj(hidden_states if query_states is None else query_states))
            return query, self._heads(self.key_proj(hidden_states)), self._heads(self.value_proj(hidden_states))
        query, key, value = self._fused_parts(hidden_states)
        if query_states is not None:  # the EMD: a second call, so that a wrapped in_proj (LoRA) adapts it too
            query = self._fused_parts(query_states)[0]
        query = query + self.q_bias.view(self.num_heads, 1, self.head_dim)
        value = value + self.v_bias.view(self.num_heads, 1, self.head_dim)
        return query, key, value

    def project_positions(self, key_rows: torch.Tensor, query_rows: torch.Tensor):
        """Scaled position keys of `key_rows` (for c2p) and position queries of `query_rows` (for p2c), each
        (H, R, D), or None when the term is off. Rows are relative embeddings, (R, hidden)."""
        pos_key = pos_query = None
        if "c2p" in self.pos_att_type:
            if self.share_att_key:
                pos_key = self._fused_parts(key_rows)[1] if self.fused else self._heads(self.key_proj(key_rows))
            else:
                pos_key = self._heads((self.pos_proj if self.fused else self.pos_key_proj)(key_rows))
            pos_key = pos_key * self.scaling
        if "p2c" in self.pos_att_type:
            if not self.share_att_key:
                pos_query = self._heads((self.pos_q_proj if self.fused else self.pos_query_proj)(query_rows))
            elif self.fused:
                pos_query = self._fused_parts(query_rows)[0] + self.q_bias.view(self.num_heads, 1, self.head_dim)
            else:
                pos_query = self._heads(self.query_proj(query_rows))
            pos_query = pos_query * self.scaling
        return pos_key, pos_query

    def position_projections(self, rel_embeddings: torch.Tensor, positions: RelativePositions):
        """Scaled position keys in reverse row order and position queries of the rows `positions` uses.

        rel_embeddings: the whole (2k, hidden) relative table. In inference (`positions.cache` set) the projections of
        the whole table come from the cache (they depend on weights only); otherwise only the used rows are projected.
        """
        first, count = positions.first_row, positions.num_rows
        cache = positions.cache if self._projects_with_weights_only() else None
        if cache is None:
            # A pass with autograd may be followed by an optimizer step that does not bump the parameters' in-place
            # version (fused AdamW, Trainer's default), which the cache key would then miss: drop the cached entry.
            self._position_cache = None
            rows = self.pos_dropout(rel_embeddings[first : first + count])
            return self.project_positions(rows.flip(0), rows)
        pos_key, pos_query = cache.position_projections(
            self, rel_embeddings, lambda table: self.project_positions(table.flip(0), table)
        )
        total = rel_embeddings.shape[0]
        if pos_key is not None:
            pos_key = pos_key[:, total - first - count : total - first]
        if pos_query is not None:
            pos_query = pos_query[:, first : first + count]
        return pos_key, pos_query

    def _projects_with_weights_only(self) -> bool:
        """Whether the position projections are plain `nn.Linear`s without hooks, so that the parameters alone decide
        their output. A wrapped projection (a LoRA layer, whose adapters can be disabled or switched without touching
        a parameter; a quantized linear) or a hooked one is called on every pass instead of being cached."""
        return all(
            type(module) is nn.Linear
            and not (module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__)
            for name in self._PROJECTIONS
            if (module := getattr(self, name, None)) is not None
        )

    def __setattr__(self, name, value):
        # Replacing a projection (peft wraps it, and unwraps it after merge_and_unload has added the adapters to the
        # weights through `.data`, which no version counter sees) drops the cached projections of the relative table.
        if name in self._PROJECTIONS:
            self.__dict__.pop("_position_cache", None)
        super().__setattr__(name, value)

    def forward(
        self,
        hidden_states: torch.Tensor,
        rel_embeddings: torch.Tensor | None,
        query_states: torch.Tensor | None = None,
        positions: RelativePositions | None = None,
        attention_mask: torch.Tensor | None = None,
        packing: PackedBatch | None = None,
        output_attentions: bool = False,
        **kwargs,
    ):
        """hidden_states (B, L, hidden), or with `packing` the packed (1, N, hidden) tokens, whose attention then runs
        per length group (the fused kernel: over the whole row, sequences kept apart by a block mask). positions: the
        RelativePositions of L (with `packing`: of the longest sequence), or None. `**kwargs` (e.g. the Trainer's
        `num_items_in_batch`) are accepted and unused: the kernels take none. Returns ((B, L, hidden), weights)."""
        query, key, value = self.project_content(hidden_states, query_states)
        pos_key = pos_query = None
        if rel_embeddings is not None and positions is not None and self.pos_att_type:
            pos_key, pos_query = self.position_projections(rel_embeddings, positions)
        implementation = self.implementation(query, attention_mask, output_attentions)
        kernel = ATTENTION_KERNELS[implementation]
        dropout = self.attention_dropout if self.training else 0.0
        if packing is None or implementation == "posformers_fused":
            if packing is not None:
                attention_mask = packing.memo(
                    "deberta document block mask", lambda: document_block_mask(packing.cu_seqlens, packing.num_tokens)
                )
            context, weights = kernel(
                self, query, key, value, attention_mask, self.scaling, dropout,
                pos_key=pos_key, pos_query=pos_query, positions=positions,
            )  # fmt: skip
            return context.flatten(2), weights

        def attend_group(group: AttentionGroup, group_query, group_key, group_value):
            group_positions, group_pos_key, group_pos_query = None, pos_key, pos_query
            if positions is not None:
                group_positions = relative_positions_of(group.width, self.config, query.device, packing)
                group_positions.cache = positions.cache
                if pos_key is not None or pos_query is not None:
                    group_pos_key, group_pos_query = position_rows_within(
                        pos_key, pos_query, positions, group_positions
                    )
            # a group of equal lengths has no padding: no mask, as the padded path without padding
            mask = None if group.rows * group.width == group.slots.numel() else group.key_mask[:, None, None, :]
            group_query, group_key, group_value = (t.transpose(1, 2) for t in (group_query, group_key, group_value))
            context, _ = kernel(
                self, group_query, group_key, group_value, mask, self.scaling, dropout,
                pos_key=group_pos_key, pos_query=group_pos_query, positions=group_positions,
            )  # fmt: skip
            return context  # (rows, width, H, D)

        # grouped_attention takes (1, N, H, D) views of the (1, H, N, D) projections; each group gets (rows, width,
        # H, D), attended as (rows, H, width, D)
        context = grouped_attention(packing, attend_group, *(t.transpose(1, 2) for t in (query, key, value)))
        return context.flatten(2), None

    def implementation(self, query: torch.Tensor, attention_mask, output_attentions: bool) -> str:
        """The kernel of this pass: the configured one, except "eager" for output_attentions (only it returns the
        weights), and "sdpa" (noted once per reason) where the fused kernel cannot run: attention dropout, a (B, L, L)
        mask (it reads key masks only), a backward where FlexAttention has none (`FLEX_BACKWARD_DEVICES`), or a CPU
        graph being compiled (inductor's CPU FlexAttention template, see `compiled_flex_attention`)."""
        implementation = self.config._attn_implementation or "eager"
        if output_attentions:
            return "eager"
        if implementation != "posformers_fused":
            return implementation
        if self.training and self.attention_dropout > 0:
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


class DebertaAttention(nn.Module):
    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = ResidualOutput(config, config.hidden_size)

    def forward(self, hidden_states, rel_embeddings, query_states=None, **kwargs):
        context, weights = self.self(hidden_states, rel_embeddings, query_states, **kwargs)
        residual = hidden_states if query_states is None else query_states
        return self.output(context, residual), weights


# ---------------------------------------------------------------------------------------------------------------------
# Layer, convolution and encoder
# ---------------------------------------------------------------------------------------------------------------------


class DebertaLayer(GradientCheckpointingLayer):
    """One transformer layer. Tensors that carry gradients are positional (`hidden_states`, `rel_embeddings`,
    `query_states`), as reentrant gradient checkpointing needs; positions and mask are keyword arguments."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.attention = DebertaAttention(config)
        self.intermediate = Intermediate(config)
        self.output = ResidualOutput(config, config.intermediate_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        rel_embeddings: torch.Tensor | None = None,
        query_states: torch.Tensor | None = None,
        positions: RelativePositions | None = None,
        attention_mask: torch.Tensor | None = None,
        packing: PackedBatch | None = None,
        output_attentions: bool = False,
        **kwargs,
    ):
        attention_output, weights = self.attention(
            hidden_states,
            rel_embeddings,
            query_states,
            positions=positions,
            attention_mask=attention_mask,
            packing=packing,
            output_attentions=output_attentions,
            **kwargs,
        )
        layer_output = self.output(self.intermediate(attention_output), attention_output)
        return layer_output, weights


class DebertaConvLayer(nn.Module):
    """DeBERTa-v2's convolution beside the first layer: LayerNorm(layer output + act(conv(layer input))).

    The convolution reads the encoder input (the embeddings), as the official code does, with padded positions set
    to zero before the activation and after the norm.
    """

    def __init__(self, config: DebertaConfig):
        super().__init__()
        kernel_size = config.conv_kernel_size
        self.conv = nn.Conv1d(
            config.hidden_size,
            config.hidden_size,
            kernel_size,
            padding=(kernel_size - 1) // 2,
            groups=config.conv_groups,
        )
        self.conv_act = ACT2FN[config.conv_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, residual_states, input_mask, packing: PackedBatch | None = None):
        """hidden_states: encoder input, residual_states: first layer output, both (B, L, hidden);
        input_mask: (B, L) bool or None. With `packing`, both are packed (1, N, hidden) and the convolution runs per
        sequence (per length group, padding zeroed), so that it never reads across a sequence boundary."""
        if packing is None:
            out = self.conv(hidden_states.transpose(1, 2)).transpose(1, 2)
        else:
            out = grouped_attention(packing, self._convolve_group, hidden_states)
        if input_mask is not None:
            out = out.masked_fill(~input_mask[..., None], 0.0)
        out = self.conv_act(self.dropout(out))
        output = self.LayerNorm(residual_states + out)
        if input_mask is not None:
            output = output * input_mask[..., None].to(output.dtype)
        return output

    def _convolve_group(self, group: AttentionGroup, hidden_states: torch.Tensor) -> torch.Tensor:
        """The convolution of one length group, (rows, width, hidden), its padding slots zeroed as padded tokens are."""
        hidden_states = hidden_states * group.key_mask[..., None].to(hidden_states.dtype)
        return self.conv(hidden_states.transpose(1, 2)).transpose(1, 2)


class DebertaEncoder(nn.Module):
    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([DebertaLayer(config) for _ in range(config.num_hidden_layers)])
        if config.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size)
        if config.relative_attention and "layer_norm" in parse_norm_rel_ebd(config.norm_rel_ebd):
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if config.conv_kernel_size > 0:
            self.conv = DebertaConvLayer(config)

    def relative_positions(self, hidden_states: torch.Tensor, packing: PackedBatch | None) -> RelativePositions | None:
        """Those of the input's length, or of a packed pass's longest sequence (which reach every row its groups
        use)."""
        length = hidden_states.shape[1] if packing is None else max(packing.max_seqlen, 1)
        return relative_positions_of(length, self.config, hidden_states.device, packing)

    def get_rel_embedding(self, positions: RelativePositions | None) -> torch.Tensor | None:
        """The relative embedding table, normalised when `norm_rel_ebd` says so: (2k, hidden), or None.

        In inference (eval mode, no autograd, no autocast, not compiling) it also gives `positions` an `InferenceCache`
        keyed by the table's parameters, which lets every layer reuse its projections of the table across calls.
        """
        if positions is None or not hasattr(self, "rel_embeddings"):
            return None
        table = self.rel_embeddings.weight
        norm = getattr(self, "LayerNorm", None)
        if norm is not None:
            table = norm(table)
        cacheable = not (
            self.training
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled(table.device.type)
            or is_torchdynamo_compiling()
        )
        if cacheable:
            parameters = (self.rel_embeddings.weight,) + ((norm.weight, norm.bias) if norm is not None else ())
            positions.cache = InferenceCache(parameters)
        return table

    def forward(
        self,
        hidden_states: torch.Tensor,
        input_mask: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        packing: PackedBatch | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        show_states=keep_states,
        **kwargs,
    ) -> BaseModelOutput:
        """hidden_states: the embeddings, (B, L, hidden), or with `packing` the packed (1, N, hidden) tokens;
        input_mask (B, L) bool and attention_mask (bool, broadcastable to (B, H, L, L)) from `attention_masks`;
        show_states: how the hidden states are handed back (`state_shower`)."""
        all_hidden_states = None
        if output_hidden_states:
            shown, hidden_states = show_states(hidden_states)
            all_hidden_states = (shown,)
        all_attentions = () if output_attentions else None
        positions = self.relative_positions(hidden_states, packing)
        rel_embeddings = self.get_rel_embedding(positions)
        embedding_output = hidden_states
        for i, layer_module in enumerate(self.layer):
            hidden_states, weights = layer_module(
                hidden_states,
                rel_embeddings,
                positions=positions,
                attention_mask=attention_mask,
                packing=packing,
                output_attentions=output_attentions,
                **kwargs,
            )
            if i == 0 and hasattr(self, "conv"):
                hidden_states = self.conv(embedding_output, hidden_states, input_mask, packing)
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


class DebertaPreTrainedModel(FusedKernelChoice, CheckedLoadingMixin, PreTrainedModel):
    """Kernels: transformers' choice ("sdpa" by default, on every device), plus "posformers_fused" (the fused kernel,
    `fused_attention`, opt-in: it has not been measured on a GPU)."""

    config_class = DebertaConfig
    config: DebertaConfig
    base_model_prefix = "deberta"
    _input_embed_layer = "word_embeddings"  # transformers' get/set_input_embeddings find embeddings.word_embeddings
    flex_attention_refusal = flex_attention_refusal("DeBERTa", "disentangled attention")
    # Flattened batches (DataCollatorWithFlattening: position_ids restarting per sequence) run per sequence; only
    # multiple choice refuses them.
    accepts_flattened_batches = True
    supports_gradient_checkpointing = True
    _no_split_modules = ["DebertaLayer"]
    _supports_sdpa = True
    # Official checkpoints carry the absolute position table (used by the EMD only) and the pre-training heads.
    # Without relative attention nothing reads the relative table's LayerNorm (norm_rel_ebd), so it is not built;
    # checkpoints that carry it still load.
    _keys_to_ignore_on_load_unexpected = [
        r"position_embeddings",
        r"^lm_predictions\.",
        r"^mask_predictions\.",
        r"(^|\.)encoder\.LayerNorm\.",
    ]

    @property
    def base_model_class(self) -> type:
        """The base model that heads.py's generic heads build under `base_model_prefix`."""
        return DebertaModel

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, DisentangledSelfAttention) and module.fused:
            init.zeros_(module.q_bias)
            init.zeros_(module.v_bias)
        elif isinstance(module, DebertaLMPredictionHead):
            init.zeros_(module.bias)


def check_mask(attention_mask: torch.Tensor, shape: tuple[int, int]) -> None:
    """DeBERTa's mask rule: a (batch, seq_len) padding mask, or a (batch, seq_len, seq_len) mask of query/key pairs."""
    if tuple(attention_mask.shape) not in (shape, (*shape, shape[1])):
        raise ValueError(
            f"attention_mask must have shape (batch, seq_len) = {shape} or (batch, seq_len, seq_len), got "
            f"{tuple(attention_mask.shape)}"
        )


def attention_masks(attention_mask: torch.Tensor | None, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(input_mask (B, L) bool, attention mask bool broadcastable to (B, H, L, L)) from a user mask, 1 = attend.

    A (B, L) mask masks keys; a (B, L, L) mask is used as it is, with the tokens any query attends as the input mask
    (the official rule). Both are None when nothing is masked, so that the kernels skip masking altogether.
    """
    if attention_mask is None:
        return None, None
    mask = attention_mask.to(device=device, dtype=torch.bool)
    if not is_torchdynamo_compiling() and bool(mask.all()):
        return None, None
    if mask.dim() == 2:
        return mask, mask[:, None, None, :]
    return mask.any(dim=-2), mask[:, None]


class DebertaModel(EncoderForward, DebertaPreTrainedModel):
    """The bare DeBERTa encoder, outputting hidden states.

    `with_positions` keeps the absolute position table even when it is not added to the input (the Enhanced Mask
    Decoder of `DebertaForMaskedLM` reads it).
    """

    def __init__(self, config: DebertaConfig, with_positions: bool = False):
        super().__init__(config)
        config.validate_fields()  # fields may have been changed since the config was created
        self.embeddings = DebertaEmbeddings(config, with_positions=with_positions)
        self.encoder = DebertaEncoder(config)
        self.post_init()

    def input_rules(self) -> dict:
        reads_positions = hasattr(self.embeddings, "position_embeddings")
        return dict(
            dtype=self.dtype,
            embedding_size=self.config.embedding_size,
            check_mask=check_mask,
            position_limit=self.config.max_position_embeddings if reads_positions else None,
        )

    def encode(self, shape, inputs, output_attentions, output_hidden_states, **kwargs) -> BaseModelOutput:
        config = self.config
        input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds = inputs
        device = input_ids.device if input_ids is not None else inputs_embeds.device
        packing = self.plan_packing(shape, attention_mask, position_ids, output_attentions, kwargs, device)
        if packing is not None:
            return self._packed_forward(
                packing, input_ids, token_type_ids, position_ids, inputs_embeds, output_hidden_states, **kwargs
            )

        seq_len = shape[1]
        if position_ids is None and config.position_biased_input:
            position_ids = torch.arange(seq_len, device=device)[None]
        input_mask, mask = attention_masks(attention_mask, device)
        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, input_mask, inputs_embeds)
        # zeros at padded positions, as the padding-free path leaves them
        restore = functools.partial(zero_padding, attention_mask=attention_mask)
        output = self.encoder(
            hidden_states,
            input_mask,
            mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            show_states=state_shower(restore, None),
            **kwargs,
        )
        output.last_hidden_state = (
            output.hidden_states[-1] if output_hidden_states else restore(output.last_hidden_state)
        )
        return output

    def plan_packing(
        self, shape, attention_mask, position_ids, output_attentions, kwargs, device
    ) -> PackedBatch | None:
        """`plan_packing` for this pass, with what rules packing out here; pops the flattened-batch keywords
        (`cu_seq_lens_q/k`, `max_length_q/k`, as `DataCollatorWithFlattening` emits them) from `kwargs`."""
        cu_seq_lens = pop_cu_seq_lens(kwargs)
        blocker = None
        if output_attentions:
            blocker = "output_attentions=True (attention weights exist only as a padded (B, H, L, L) tensor)"
        elif attention_mask is not None and attention_mask.dim() == 3:
            blocker = "a 3D attention_mask (pass the 2D padding mask to run padding-free)"
        return plan_packing(self.config, shape, attention_mask, position_ids, cu_seq_lens, blocker, device)

    def _packed_forward(
        self,
        packing: PackedBatch,
        input_ids,
        token_type_ids,
        position_ids,
        inputs_embeds,
        output_hidden_states,
        **kwargs,
    ) -> BaseModelOutput:
        """The encoder on the real tokens only, packed into one (1, N) row; outputs restored to the input's layout
        (`PackedBatch.restore`). A (1, L) token_type_ids or position_ids broadcast over the batch first."""
        grid = (packing.rows, packing.width)
        if token_type_ids is not None:
            token_type_ids = packing.pack(token_type_ids if packing.flattened else token_type_ids.expand(grid))
        if position_ids is not None:
            position_ids = packing.pack(position_ids if packing.flattened else position_ids.expand(grid))
        elif hasattr(self.embeddings, "position_embeddings"):
            position_ids = packing.position_ids()
        input_ids = packing.pack(input_ids) if input_ids is not None else None
        inputs_embeds = packing.pack(inputs_embeds) if inputs_embeds is not None else None
        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, None, inputs_embeds)
        output = self.encoder(
            hidden_states,
            None,
            None,
            packing,
            output_hidden_states=output_hidden_states,
            show_states=state_shower(packing.restore, packing),
            **kwargs,
        )
        hidden = output.hidden_states
        return BaseModelOutput(
            last_hidden_state=hidden[-1] if hidden is not None else packing.restore(output.last_hidden_state),
            hidden_states=hidden,
        )


# ---------------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------------


class DebertaLMPredictionHead(nn.Module):
    """The official MLM head (`lm_predictions.lm_head`): dense, activation, LayerNorm, then the decoder tied to the
    word embeddings plus a bias."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.transform_act_fn(self.dense(hidden_states))))


class DebertaEnhancedMaskDecoder(nn.Module):
    """The Enhanced Mask Decoder (DeBERTa section 3.2; official `EnhancedMaskDecoder`), then the LM head.

    Absolute positions enter here only: the last encoder layer is applied `emd_steps` times (shared weights) with
    keys and values from its own input (the hidden states after layer N-1) and queries starting from those states
    plus the absolute position embeddings, each step feeding the next. With `emd_steps=0`, or a model that already
    adds positions to its input, the LM head reads the encoder output.
    """

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.steps = config.emd_steps if config.uses_emd else 0
        self.lm_head = DebertaLMPredictionHead(config)

    def forward(
        self,
        sequence_output: torch.Tensor,
        deberta: "DebertaModel | None" = None,
        layer_input: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        packing: PackedBatch | None = None,
    ) -> torch.Tensor:
        """sequence_output: the encoder output (B, L, hidden). With the EMD on, also the base model whose last layer,
        absolute position table and relative positions it reuses, `layer_input` (the hidden states after layer N-1),
        and the user's attention mask and position ids. Returns the MLM logits (B, L, vocab).

        With `packing` (the pass ran padding-free), the decoder and the LM head run on the packed real tokens, with the
        same packing (attention per sequence), and the logits are restored to the input's layout (zeros at padding).
        """
        if packing is not None:
            return packing.restore(
                self._decode(packing.pack(sequence_output), deberta, layer_input, position_ids, packing)
            )
        logits = self._decode(sequence_output, deberta, layer_input, position_ids, attention_mask=attention_mask)
        return zero_padding(logits, attention_mask)

    def _decode(self, sequence_output, deberta, layer_input, position_ids, packing=None, attention_mask=None):
        """The decoder steps and the LM head on (B, L, hidden) states, or on packed (1, N, hidden) ones (`packing`)."""
        if self.steps:
            device, seq_len = sequence_output.device, sequence_output.shape[1]
            if packing is None:
                if position_ids is None:
                    position_ids = torch.arange(seq_len, device=device)[None]
                _, mask = attention_masks(attention_mask, device)
            else:
                layer_input = packing.pack(layer_input)
                if position_ids is None:
                    position_ids = packing.position_ids()
                elif not packing.flattened:
                    position_ids = packing.pack(position_ids.expand(packing.rows, packing.width))
                mask = None
            positions = deberta.encoder.relative_positions(sequence_output, packing)
            rel_embeddings = deberta.encoder.get_rel_embedding(positions)
            layer = deberta.encoder.layer[-1]
            query_states = layer_input + deberta.embeddings.position_embeddings(position_ids)
            for _ in range(self.steps):
                query_states, _ = layer(
                    layer_input, rel_embeddings, query_states, positions=positions, attention_mask=mask, packing=packing
                )
            sequence_output = query_states
        return self.lm_head(sequence_output)


# transformers' DeBERTa MLM heads default to `legacy=True`, a BERT-style head under `cls.predictions.*` with the same
# layers as the official one (dense, activation, LayerNorm, tied decoder, bias). `DebertaForMaskedLM.from_pretrained`
# recognises that layout in local safetensors files and loads it with this mapping and `emd_steps=0` (such models were
# trained without an Enhanced Mask Decoder); elsewhere pass `key_mapping=LEGACY_MLM_KEY_MAPPING, emd_steps=0`.
LEGACY_MLM_KEY_MAPPING = {
    r"^cls\.predictions\.transform\.": "lm_predictions.lm_head.",
    r"^cls\.predictions\.bias": "lm_predictions.lm_head.bias",
    r"^cls\.predictions\.decoder\.": "lm_predictions.lm_head.decoder.",
}


class DebertaForMaskedLM(GenericForMaskedLM, DebertaPreTrainedModel):
    _tied_weights_keys = {
        "lm_predictions.lm_head.decoder.weight": "deberta.embeddings.word_embeddings.weight",
        "lm_predictions.lm_head.decoder.bias": "lm_predictions.lm_head.bias",
    }

    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        if config.uses_emd and config.embedding_size != config.hidden_size:
            raise ValueError(
                "DebertaForMaskedLM: the Enhanced Mask Decoder adds absolute position embeddings to hidden states, "
                f"which needs embedding_size ({config.embedding_size}) == hidden_size ({config.hidden_size}); set "
                "emd_steps=0 to use the plain LM head"
            )
        self.deberta = DebertaModel(config, with_positions=config.uses_emd)
        self.lm_predictions = DebertaEnhancedMaskDecoder(config)
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        if "key_mapping" not in kwargs and any(
            name.startswith("cls.predictions.") for name in checkpoint_names(pretrained_model_name_or_path, kwargs)
        ):
            logger.warning(
                f"{pretrained_model_name_or_path}: transformers' legacy MLM head (cls.predictions.*), loaded with "
                "LEGACY_MLM_KEY_MAPPING and emd_steps=0"
            )
            kwargs["key_mapping"] = LEGACY_MLM_KEY_MAPPING
            if isinstance(config := kwargs.get("config"), DebertaConfig):
                kwargs["config"] = config = copy.deepcopy(config)
                config.emd_steps = 0
            else:
                kwargs.setdefault("emd_steps", 0)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    def prediction_head(self) -> nn.Module:
        return self.lm_predictions.lm_head

    @property
    def reads_hidden_states(self) -> bool:
        return bool(self.lm_predictions.steps)  # the Enhanced Mask Decoder starts from the last layer's input

    def head_logits(self, outputs, packing, attention_mask, position_ids) -> torch.Tensor:
        decoder, emd_inputs = self.lm_predictions, {}
        if decoder.steps:
            emd_inputs = dict(deberta=self.deberta, layer_input=outputs.hidden_states[-2], position_ids=position_ids)
        return decoder(outputs.last_hidden_state, attention_mask=attention_mask, packing=packing, **emd_inputs)


@dataclass
class DebertaForReplacedTokenDetectionOutput(ModelOutput):
    """Output of `DebertaForReplacedTokenDetection`: logits (B, L), one per token, > 0 meaning "replaced"."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class DebertaMaskPredictionHead(nn.Module):
    """DeBERTa-v3's discriminator head (official `mask_predictions`): LayerNorm(hidden + [CLS] hidden), dense,
    activation, one logit per token."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor, packing: PackedBatch | None = None, attention_mask=None):
        """hidden_states: (B, L, hidden) -> logits (B, L), zeros at the padding of a 2D `attention_mask`. With
        `packing` (the pass ran padding-free), only the real tokens are scored, each with its own sequence's first
        token (zeros at padding); a flattened batch's (1, N, hidden) gives (1, N)."""
        if packing is None:
            return zero_padding(self.score(hidden_states, hidden_states[:, :1]), attention_mask)
        tokens = packing.pack(hidden_states)
        sequence_starts = packing.cu_seqlens[:-1].long()[packing.indices // packing.width]  # (N,)
        return packing.restore(self.score(tokens, tokens[:, sequence_starts]))

    def score(self, hidden_states: torch.Tensor, first_token_states: torch.Tensor) -> torch.Tensor:
        states = self.LayerNorm(first_token_states + hidden_states)
        return self.classifier(self.transform_act_fn(self.dense(states))).squeeze(-1)


class DebertaForReplacedTokenDetection(LabelledHead, DebertaPreTrainedModel):
    """Replaced token detection (the ELECTRA-style objective of DeBERTa-v3): labels are 1 for replaced tokens, 0 for
    original ones; the loss is the mean binary cross-entropy over real (unpadded) tokens."""

    output_class = DebertaForReplacedTokenDetectionOutput

    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        self.deberta = DebertaModel(config)
        self.mask_predictions = DebertaMaskPredictionHead(config)
        self.post_init()

    def head_logits(self, outputs, packing, attention_mask, position_ids) -> torch.Tensor:
        return self.mask_predictions(outputs.last_hidden_state, packing, attention_mask)

    def head_loss(self, logits, labels, attention_mask, num_items_in_batch=None, **kwargs) -> torch.Tensor:
        labels = labels.to(logits.device)
        active = labels != -100
        if attention_mask is not None and attention_mask.dim() == 2:
            active = active & attention_mask.to(device=logits.device, dtype=torch.bool)
        loss = BCEWithLogitsLoss()(logits[active].float(), labels[active].float())
        return per_item_loss(loss, labels, num_items_in_batch)


class DebertaContextPooler(nn.Module):
    """The official pooler: dropout, dense and activation on the first token."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.pooler_hidden_size)
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.activation = ACT2FN[config.pooler_hidden_act]

    def forward(self, first_token_states: torch.Tensor) -> torch.Tensor:
        """first_token_states: (batch or sequences, hidden), as `first_token_states` reads them."""
        return self.activation(self.dense(self.dropout(first_token_states)))


def _sequence_classification_loss(config, logits, labels, num_labels):
    """The official DeBERTa loss (which transformers' DeBERTa heads keep, rather than its generic classification loss):
    regression for one label; cross-entropy over labels >= 0 (negative labels are ignored) for class indices;
    soft-label cross-entropy for a distribution per example; or the explicit `problem_type`."""
    labels = labels.to(logits.device)
    if config.problem_type is None:
        if num_labels == 1:
            return MSELoss()(logits.view(-1).to(labels.dtype), labels.view(-1))
        if labels.dim() == 1 or labels.size(-1) == 1:
            labels = labels.view(-1)
            keep = labels >= 0
            if not keep.any():
                return logits.sum() * 0.0
            return CrossEntropyLoss()(logits[keep].float(), labels[keep].long())
        return -(F.log_softmax(logits, dim=-1) * labels).sum(-1).mean()
    if config.problem_type == "regression":
        return MSELoss()(logits.squeeze(), labels.squeeze()) if num_labels == 1 else MSELoss()(logits, labels)
    if config.problem_type == "single_label_classification":
        return CrossEntropyLoss()(logits.view(-1, num_labels), labels.view(-1))
    return BCEWithLogitsLoss()(logits, labels)


class DebertaPooledClassifier:
    """The official head of the sequence-level tasks (classification, multiple choice): the context pooler on the
    first token, dropout (`cls_dropout`), a linear classifier."""

    def add_classifier(self, config: DebertaConfig, num_outputs: int) -> None:
        """Builds the base model and the head, then runs `post_init`."""
        self.deberta = DebertaModel(config)
        self.pooler = DebertaContextPooler(config)
        self.classifier = nn.Linear(config.pooler_hidden_size, num_outputs)
        dropout = config.cls_dropout if config.cls_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.post_init()

    def classify(self, first_token_states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(first_token_states)))


class DebertaForSequenceClassification(
    DebertaPooledClassifier, GenericForSequenceClassification, DebertaPreTrainedModel
):
    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.add_classifier(config, config.num_labels)

    def head_loss(self, logits, labels, attention_mask, num_items_in_batch=None, **kwargs) -> torch.Tensor:
        # not self.loss_function: DeBERTa's own loss ignores negative labels and takes soft labels
        loss = _sequence_classification_loss(self.config, logits, labels, self.num_labels)
        return per_item_loss(loss, labels, num_items_in_batch)


class DebertaForTokenClassification(GenericForTokenClassification, DebertaPreTrainedModel): ...


class DebertaForQuestionAnswering(GenericForQuestionAnswering, DebertaPreTrainedModel): ...


class DebertaForQuestionSpanSelection(GenericForQuestionSpanSelection, DebertaPreTrainedModel): ...


class DebertaForMultipleChoice(DebertaPooledClassifier, GenericForMultipleChoice, DebertaPreTrainedModel):
    """Multiple choice with the context pooler on each choice's first token, as transformers' DeBERTa-v2 does."""

    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        self.add_classifier(config, 1)


# The names the posformers package exports from this file.
__all__ = [
    "LEGACY_MLM_KEY_MAPPING",
    "DebertaForMaskedLM",
    "DebertaForMultipleChoice",
    "DebertaForQuestionAnswering",
    "DebertaForQuestionSpanSelection",
    "DebertaForReplacedTokenDetection",
    "DebertaForReplacedTokenDetectionOutput",
    "DebertaForSequenceClassification",
    "DebertaForTokenClassification",
    "DebertaModel",
    "DebertaPreTrainedModel",
]
