"""PyTorch LittleBird (Lee, Han, Shin, "LittleBird: Efficient Faster & Longer Transformer for Question Answering",
EMNLP 2022, arXiv 2210.11870). No official code or weights exist; this is the architecture of posformers' design note
(`docs/littlebird.md` in the repository), whose tags are repeated here: [paper] from the paper, [recon] reconstructed
where the paper's text is cut off, [choice] a decision of posformers.

One layer, post-LN [paper], with token states X (B, L, d) and pack states P (B, s, d):

    Cp = PackAttn(P, X)        queries P, keys/values X; padded keys masked          (B, s, d)
    P' = LayerNorm(Cp + P)                                                           feeds the next layer (the
                                                                                     last layer computes none)
    Cx = USWAttn(X, Cp)        unpack + sliding window, one joint softmax            (B, L, d)
    A  = LayerNorm(Cx + X)
    X' = LayerNorm(FFN(A) + A)

USWAttn gives each query token one softmax over the `s` unpacked keys K(Cp) and the 4 key blocks of its query block
(block 0, which is global as keys only, and a band of 3 blocks), with BiALiBi biases instead of position embeddings.
It runs on a blocked layout: the key blocks of every query block are gathered through a per-example table, so the cost
and memory are O(B H L (s + 4b)) and no (L x L) tensor is ever built.

Padding-free execution (`config.unpad_inputs`, flattened batches): the embeddings, every projection, the feed-forward
blocks and the LayerNorms run on the real tokens only, packed into one (1, N, d) row; the attentions stay per example
(block pattern, BiALiBi, pack attention with per-example pack states), run on length groups of the examples, each
group padded to whole blocks (`group_layouts`, memoised on the `PackedBatch`; `LittleBirdLayer.packed_attention`).
Per-token outputs hold zeros at padded positions on both paths.

Reads top to bottom in the order data flows: block-sparse math (small pure functions), the kernels, embeddings,
attention, layer, encoder, pre-trained base, base model, heads. This file imports only torch, transformers and its
sibling modules (configuration_littlebird, packing, inputs, heads, attention, layers, loading): `save_pretrained`
copies them to the Hub for `trust_remote_code` users.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import is_torchdynamo_compiling, logging

from .attention import FLEX_BACKWARD_DEVICES, FusedKernelChoice, flex_attention_kernel, flex_attention_refusal
from .configuration_littlebird import LittleBirdConfig
from .heads import (
    ClassificationHead,
    GenericForMaskedLM,
    GenericForMultipleChoice,
    GenericForQuestionAnswering,
    GenericForQuestionSpanSelection,
    GenericForSequenceClassification,
    GenericForTokenClassification,
    OnlyMLMHead,
    SpanSelectionTransform,
)
from .inputs import EncoderForward, check_padding_mask, check_per_token
from .layers import Intermediate, ResidualOutput, TokenEmbeddings
from .loading import CheckedLoadingMixin
from .packing import (
    PackedBatch,
    grouped_attention,
    keep_states,
    plan_packing,
    pop_cu_seq_lens,
    state_shower,
    zero_padding,
)

logger = logging.get_logger(__name__)

# Every query block attends exactly this many key blocks [paper, Figure 2].
WINDOW_BLOCKS = 4


# ---------------------------------------------------------------------------------------------------------------------
# Block-sparse attention: small pure functions
# ---------------------------------------------------------------------------------------------------------------------


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's geometric slopes `2^(-8h/H)` for h = 1..H, float32 (H,): the initial BiALiBi alpha, beta, gamma [choice].

    The paper trains the slopes; U(0, 1) as in the public re-implementation saturates the softmax within 2 blocks.
    """
    heads = torch.arange(1, num_heads + 1, dtype=torch.float64)
    return (2.0 ** (-8.0 * heads / num_heads)).float()


def initial_slopes(config: LittleBirdConfig) -> torch.Tensor:
    """The value every BiALiBi slope (alpha, beta, gamma) starts from, per head (config.bialibi_init)."""
    if config.bialibi_init == "alibi":
        return alibi_slopes(config.num_attention_heads)
    return torch.full((config.num_attention_heads,), float(config.bialibi_init))


def window_key_blocks(real_blocks: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The 4 key blocks of every query block, per example [paper, Figure 2]. real_blocks: (B,) -> (B, n, 4) long.

    With `m` the number of blocks covering an example's real tokens (not the padded batch's `n`):

        query block 0 and 1   ->  0, 1, 2, 3
        query block 2 .. m-2  ->  0, q-1, q, q+1
        query block m-1       ->  0, m-3, m-2, m-1

    Every row is block 0 (global as keys only) plus a band of 3 blocks around `clamp(q, 2, m-2)`, which is how it is
    computed. A sequence of fewer than 4 blocks gets 0, 1, 2, 3: the blocks it does not have hold no real token and are
    masked (they may lie past `n`; callers clamp before gathering). Query blocks past `m` hold only padding and reuse
    the last row. Basing the rows on `m` keeps every real token's output independent of the padding in the batch.
    """
    query_blocks = torch.arange(num_blocks, device=real_blocks.device)
    last_center = (real_blocks - 2).clamp_min(2)[:, None]  # (B, 1)
    center = torch.minimum(query_blocks.clamp_min(2)[None, :], last_center)  # (B, n)
    return torch.stack((torch.zeros_like(center), center - 1, center, center + 1), dim=-1)


def bialibi_distances(
    query_positions: torch.Tensor, key_positions: torch.Tensor, global_prefix_length: int = 1
) -> torch.Tensor:
    """What each BiALiBi slope multiplies, for broadcastable integer positions i (queries) and j (keys).

    Returns float32 (3, *shape) with channels [j - i if j > i, i - j if j < i, 1 if distance-free], all zero where
    i == j. Distance-free pairs touch position 0 (the [CLS] token: alpha is a constant there, not scaled by distance
    [paper]) or join a position of the global prefix (i or j < `global_prefix_length`) with one outside it [choice,
    `LittleBirdConfig.global_prefix_length`; 1, the paper's rule, adds no pair]; their first two channels are zero.
    """
    after, before, touches_cls = bialibi_channels(query_positions, key_positions, global_prefix_length)
    return torch.stack(torch.broadcast_tensors(after, before, touches_cls.to(after.dtype))).float()


def bialibi_channels(query_positions, key_positions, global_prefix_length: int):
    """The three channels of `bialibi_distances` as (after, before, distance-free): integer, integer, bool.
    Elementwise only, so that the fused kernel's score_mod computes them per (query, key) pair."""
    offset = key_positions - query_positions
    in_prefix = (query_positions < global_prefix_length) != (key_positions < global_prefix_length)
    touches_cls = ((query_positions == 0) | (key_positions == 0) | in_prefix) & (offset != 0)
    after = torch.where(touches_cls, 0, offset.clamp_min(0))
    before = torch.where(touches_cls, 0, (-offset).clamp_min(0))
    return after, before, touches_cls


def bialibi_coefficients(alpha: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """(H,) slopes -> (H, 3), in the channel order of `bialibi_distances`: beta for keys after the query, gamma for
    keys before it, alpha for the [CLS] position. Which of beta/gamma is "after" is a fixed convention [recon].

    The BiALiBi bias subtracted from the logits is `coefficients @ distances` (H, *shape):
    bias(i, j) = 0 if i == j;  alpha if i == 0 or j == 0;  beta (j - i) if j > i;  gamma (i - j) if j < i.
    With a global prefix of g > 1 positions, also alpha if exactly one of i, j is < g.
    """
    return torch.stack((beta, gamma, alpha), dim=-1)


# Query blocks per chunk of the unpack + sliding-window attention: enough that a chunk's gathered keys hold about this
# many elements (4 MB in float32). Temporaries this small are reused by the CPU allocator, where ones of tens of MB are
# page-faulted in afresh on every call (an order of magnitude slower than the gather itself); peak memory stays small.
ATTENTION_CHUNK_ELEMENTS = 2**20
# The training path's chunks (`LeanUnpackSlidingWindow`) are larger: its forward and backward each do several products
# per chunk, which run markedly faster batched over more blocks (about 2x at base size, 4096 tokens), and its
# temporaries (a few (blocks, H, b, w) tensors, about 100 MB at base size) live only while their chunk is computed.
LEAN_ATTENTION_CHUNK_ELEMENTS = 2**22


@dataclass
class BlockSparseLayout:
    """What the unpack + sliding-window attention needs from the input's shape and attention mask; built once per
    forward pass and shared by every layer.

    Each query block of `b` tokens attends `w = np * b + 4 * b` keys: the `s` unpacked keys, stored as
    `np = ceil(s / b)` blocks (their padding masked), then its 4 window blocks. Keys are gathered from each example's
    stack of `(np + n) * b` key rows: the pack rows, then the tokens padded to whole blocks.

    key_index: (B * n, w) the key rows (of all examples' stacks, flattened) each query block attends.
    bias_features: (B * n, 4, b * w) for every (query, key) pair of a query block, the `bialibi_distances` channels
        and a fourth that is 1 for masked keys (padding, internal padding to a multiple of b, pack padding, blocks a
        short sequence lacks), whose other channels are 0. Unpacked keys have `b / 2` in both the "after" and "before"
        channels, which makes their bias `(beta + gamma) / 2 * b` [paper: D_p = ((beta + gamma) / 2) b J], as if the
        packed tokens sat one block away, with the window's beta and gamma [choice]. `bias_coefficients` weighs the
        channels into the additive bias.
    mask_value: the most negative finite value of the compute dtype, what masked keys get.
    pack_key_mask: (B, 1, 1, L) additive mask of the pack attention's keys (padding), or None without padding.
    real_blocks: (B,) long, each example's number of real blocks `m` (`window_key_blocks`).
    token_keys: (B, n * b) bool, which token positions are real keys (False for padding and past L).
    global_prefix_length: as in `bialibi_distances`.
    block_mask: the fused kernel's FlexAttention BlockMask (`unpack_sliding_window_block_mask`), built with the
        layout when the fused kernel is selected (`fused=True`), so every layer of the pass reuses it; else None.

    Padding may also sit between real tokens (Padding Insertion, a training recipe of the paper): such keys are
    masked like any padding, but they keep their positions, so they lengthen BiALiBi distances and move later tokens
    into later blocks. An example's extent (last real position + 1) then sets its number of real blocks `m`.
    """

    block_size: int
    num_blocks: int
    pack_length: int
    pack_blocks: int
    key_index: torch.Tensor
    bias_features: torch.Tensor
    mask_value: float
    pack_key_mask: torch.Tensor | None
    real_blocks: torch.Tensor
    token_keys: torch.Tensor
    global_prefix_length: int = 1
    block_mask: object | None = field(default=None, repr=False)

    @property
    def keys_per_block(self) -> int:
        return (self.pack_blocks + WINDOW_BLOCKS) * self.block_size

    @classmethod
    def build(
        cls,
        attention_mask: torch.Tensor | None,
        batch_size: int,
        seq_len: int,
        block_size: int,
        pack_length: int,
        dtype: torch.dtype,
        device: torch.device,
        global_prefix_length: int = 1,
        fused: bool = False,
    ) -> "BlockSparseLayout":
        """attention_mask: (B, L), 1 = real token, a real first token (right padding and inserted padding), or None
        (every token real). global_prefix_length: positions distance-free like [CLS] (`bialibi_distances`). fused:
        also build the fused kernel's block mask."""
        b, s = block_size, pack_length
        n, pack_blocks = math.ceil(seq_len / b), math.ceil(s / b)
        min_value = torch.finfo(dtype).min
        bias_dtype = torch.promote_types(dtype, torch.float32)  # half-precision models compute the bias in float32
        if attention_mask is None:
            lengths = torch.full((batch_size,), seq_len, device=device)
            pack_key_mask = None
        else:
            attention_mask = attention_mask.to(device=device, dtype=torch.bool)
            lengths = real_extent(attention_mask)
            pack_key_mask = torch.zeros(batch_size, 1, 1, seq_len, device=device, dtype=dtype)
            pack_key_mask = pack_key_mask.masked_fill(~attention_mask[:, None, None, :], min_value)
        real_blocks = ((lengths + b - 1) // b).clamp_min(1)
        key_blocks = window_key_blocks(real_blocks, n)  # (B, n, 4)

        offsets = torch.arange(b, device=device)
        query_positions = (torch.arange(n, device=device)[:, None] * b + offsets)[None, :, :, None]  # (1, n, b, 1)
        key_positions = (key_blocks[..., None] * b + offsets).flatten(-2)[:, :, None, :]  # (B, n, 1, 4b)
        window_distances = bialibi_distances(query_positions, key_positions, global_prefix_length)  # (3, B, n, b, 4b)
        window_distances = window_distances.to(bias_dtype)
        pack_distances = torch.tensor([b / 2, b / 2, 0.0], device=device, dtype=bias_dtype)[:, None, None, None, None]
        pack_distances = pack_distances.expand(3, batch_size, n, b, pack_blocks * b)
        distances = torch.cat((pack_distances, window_distances), dim=-1)  # (3, B, n, b, w)

        pack_attended = (torch.arange(pack_blocks * b, device=device) < s).expand(batch_size, n, 1, -1)
        if attention_mask is None:
            window_attended = key_positions < lengths[:, None, None, None]
        else:
            window_attended = real_keys(attention_mask, key_positions, max(n, WINDOW_BLOCKS) * b)
        masked = ~torch.cat((pack_attended, window_attended), dim=-1).expand(-1, -1, b, -1)  # (B, n, b, w)
        # Masked keys get exactly the mask value: no slope term may push it past the dtype's range.
        bias_features = torch.cat((distances.masked_fill(masked, 0), masked[None].to(bias_dtype)))  # (4, B, n, b, w)

        stack_starts = torch.arange(batch_size, device=device)[:, None, None] * ((pack_blocks + n) * b)
        pack_rows = torch.arange(pack_blocks * b, device=device).expand(batch_size, n, -1)
        window_rows = ((pack_blocks + key_blocks.clamp_max(n - 1))[..., None] * b + offsets).flatten(-2)
        key_index = stack_starts + torch.cat((pack_rows, window_rows), dim=-1)  # (B, n, w)
        layout = cls(
            block_size=b,
            num_blocks=n,
            pack_length=s,
            pack_blocks=pack_blocks,
            key_index=key_index.flatten(0, 1),
            bias_features=bias_features.permute(1, 2, 0, 3, 4).reshape(batch_size * n, 4, -1),
            mask_value=min_value,
            pack_key_mask=pack_key_mask,
            real_blocks=real_blocks,
            token_keys=F.pad(attention_mask, (0, n * b - seq_len))
            if attention_mask is not None
            else ((torch.arange(n * b, device=device) < seq_len).expand(batch_size, -1)),
            global_prefix_length=global_prefix_length,
        )
        if fused:
            layout.block_mask = unpack_sliding_window_block_mask(layout)
        return layout


def real_extent(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool -> (B,) the last real position + 1 (0 for a row of padding): the length with right padding, and the
    span the real tokens cover when padding was inserted between them."""
    positions = torch.arange(1, attention_mask.shape[-1] + 1, device=attention_mask.device)
    return (positions * attention_mask).amax(-1)


def real_keys(attention_mask: torch.Tensor, key_positions: torch.Tensor, padded_length: int) -> torch.Tensor:
    """Whether each window key is a real token. attention_mask: (B, L) bool; key_positions: (B, n, 1, 4b), which may
    point past L (blocks a short sequence lacks, up to `padded_length`) -> (B, n, 1, 4b) bool."""
    padded = F.pad(attention_mask, (0, padded_length - attention_mask.shape[-1]))
    return padded.gather(1, key_positions.flatten(1)).view(key_positions.shape)


def bias_coefficients(alpha, beta, gamma, layout: BlockSparseLayout) -> torch.Tensor:
    """(H,) slopes -> (H, 4) weights of `layout.bias_features`: minus BiALiBi, and the mask value on masked keys.

    `coefficients @ layout.bias_features[blocks]` is the additive bias (blocks, H, b * w) of those query blocks.
    """
    mask_column = torch.full_like(alpha, layout.mask_value)[:, None]
    coefficients = torch.cat((-bialibi_coefficients(alpha, beta, gamma), mask_column), dim=-1)
    return coefficients.to(layout.bias_features.dtype)


def softmax_in_float(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, computed in at least float32, returned in the scores' dtype."""
    return F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(scores.dtype)


def _key_rows(packed: torch.Tensor, tokens: torch.Tensor, layout: BlockSparseLayout) -> torch.Tensor:
    """Each example's stack of key rows: (B, s, H, d_h) and (B, L, H, d_h) -> (B * (np + n) * b, H, d_h).

    Pack rows padded to `np * b`, then the tokens padded to `n * b`. The padding is zeros: masked keys must hold finite
    values, as 0 * NaN would leak through the softmax.
    """
    batch, seq_len, heads, head_dim = tokens.shape
    b = layout.block_size
    pieces = [
        packed,
        packed.new_zeros(batch, layout.pack_blocks * b - packed.shape[1], heads, head_dim),
        tokens,
        tokens.new_zeros(batch, layout.num_blocks * b - seq_len, heads, head_dim),
    ]
    return torch.cat(pieces, dim=1).view(-1, heads, head_dim)


def attention_dropout_keep(shape, p: float, seed: int, chunk_index: int, device) -> torch.Tensor:
    """The dropout of one chunk of USWAttn weights as a multiplier (shape, float32): 0 where dropped, 1 / (1 - p)
    where kept. A function of (seed, chunk_index) alone, so the lean backward regenerates the forward's mask instead
    of keeping it."""
    generator = torch.Generator(device=device).manual_seed(seed + chunk_index)
    keep = torch.rand(shape, generator=generator, device=device) >= p
    return keep.float().div_(1 - p)


class LeanUnpackSlidingWindow(torch.autograd.Function):
    """USWAttn for training, flash-attention style: the forward runs chunk by chunk of query blocks and keeps only
    q, the key and value rows, the context and each query's logsumexp; the backward recomputes every chunk's scores
    from them. No (blocks, H, b, w) tensor outlives its chunk, so what a layer keeps for backward is O(L d), not the
    O(L H w) of the explicit products (which SDPA cannot replace: it does not differentiate its mask, and the BiALiBi
    slopes need gradients).

    query: (B, n b, H, d_h), padded to whole blocks; key_rows, value_rows: (B (np + n) b, H, d_h) (`_key_rows`);
    coefficients: (H, 4) (`bias_coefficients`), whose gradient `sum dS * bias_features` reaches alpha, beta, gamma.
    Returns the context (B, n b, H, d_h). Attention dropout draws one seed from torch's global generator per call and
    each chunk's mask from it (`attention_dropout_keep`).
    """

    @staticmethod
    def forward(ctx, query, key_rows, value_rows, coefficients, layout, scaling, dropout, chunk):
        batch, _, heads, head_dim = query.shape
        b = layout.block_size
        total_blocks = batch * layout.num_blocks
        seed = int(torch.randint(2**62, ())) if dropout > 0 else 0
        # Without dropout on CPU, torch's fused kernel (what SDPA runs) also returns the logsumexp. The public
        # F.scaled_dot_product_attention does not return it, and the backward needs it, hence the private aten op
        # (checked for, so a torch without it takes the explicit products).
        fused = (
            dropout == 0
            and query.device.type == "cpu"
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
        )
        query_blocks = query.view(total_blocks, b, heads, head_dim).transpose(1, 2)  # (B n, H, b, d_h)
        context = query.new_empty(query.shape)
        context_blocks = context.view(total_blocks, b, heads, head_dim)
        logsumexp = query.new_empty(total_blocks, heads, b, 1, dtype=torch.promote_types(query.dtype, torch.float32))
        for chunk_index, start in enumerate(range(0, total_blocks, chunk)):
            blocks = slice(start, min(start + chunk, total_blocks))
            key_windows, value_windows = _window_rows(key_rows, value_rows, layout, blocks)
            if fused:
                bias = _window_bias(coefficients, layout, blocks, query.dtype)
                chunk_context, chunk_logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    query_blocks[blocks], key_windows, value_windows, attn_mask=bias, scale=scaling
                )
                context_blocks[blocks] = chunk_context.transpose(1, 2)
                logsumexp[blocks] = chunk_logsumexp[..., None]
                continue
            scores = _window_scores(query_blocks[blocks], key_windows, coefficients, layout, blocks, scaling)
            logsumexp[blocks] = torch.logsumexp(scores, dim=-1, keepdim=True)
            weights = scores.sub_(logsumexp[blocks]).exp_()
            if dropout > 0:
                weights = weights * attention_dropout_keep(weights.shape, dropout, seed, chunk_index, query.device)
            context_blocks[blocks] = torch.matmul(weights.to(query.dtype), value_windows).transpose(1, 2)
        ctx.save_for_backward(query, key_rows, value_rows, coefficients, context, logsumexp)
        ctx.layout, ctx.scaling, ctx.dropout, ctx.chunk, ctx.seed = layout, scaling, dropout, chunk, seed
        return context

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_context):
        query, key_rows, value_rows, coefficients, context, logsumexp = ctx.saved_tensors
        layout, scaling, dropout, chunk = ctx.layout, ctx.scaling, ctx.dropout, ctx.chunk
        batch, _, heads, head_dim = query.shape
        b = layout.block_size
        total_blocks = batch * layout.num_blocks

        def blocked(tensor):  # (B, n b, H, ...) -> (B n, H, b, ...)
            return tensor.reshape(total_blocks, b, heads, -1).transpose(1, 2)

        # rowsum(dP * P) = rowsum(dO * O), with dropout too: O = (P * keep) V and dP = (dO V^T) * keep.
        row_dot = blocked((grad_context * context).sum(-1, keepdim=True, dtype=logsumexp.dtype))  # (B n, H, b, 1)
        query_blocks, grad_blocks = blocked(query), blocked(grad_context)
        grad_query = torch.empty_like(query)
        grad_query_blocks = grad_query.view(total_blocks, b, heads, head_dim)
        grad_key_rows, grad_value_rows = torch.zeros_like(key_rows), torch.zeros_like(value_rows)
        grad_coefficients = torch.zeros(heads, 4, dtype=layout.bias_features.dtype, device=query.device)
        for chunk_index, start in enumerate(range(0, total_blocks, chunk)):
            blocks = slice(start, min(start + chunk, total_blocks))
            index = layout.key_index[blocks].flatten()
            key_windows, value_windows = (
                rows.contiguous() for rows in _window_rows(key_rows, value_rows, layout, blocks)
            )
            # Each is read by two products: laid out for them once.
            chunk_query, chunk_grad = query_blocks[blocks].contiguous(), grad_blocks[blocks].contiguous()
            scores = _window_scores(chunk_query, key_windows, coefficients, layout, blocks, scaling)
            weights = scores.sub_(logsumexp[blocks]).exp_()  # (blocks, H, b, w), float32 at least
            grad_scores = torch.matmul(chunk_grad, value_windows.transpose(2, 3)).to(weights.dtype)  # dP
            dropped = weights
            if dropout > 0:
                keep = attention_dropout_keep(weights.shape, dropout, ctx.seed, chunk_index, query.device)
                dropped = weights * keep
                grad_scores.mul_(keep)
            grad_value_windows = torch.matmul(
                dropped.to(query.dtype).transpose(2, 3), chunk_grad
            )  # (blocks, H, w, d_h)
            grad_scores.sub_(row_dot[blocks]).mul_(weights)  # dS = P * (dP - rowsum(dO * O))
            features = layout.bias_features[blocks]  # (blocks, 4, b w)
            grad_coefficients += torch.bmm(grad_scores.flatten(2).to(features.dtype), features.transpose(1, 2)).sum(0)
            grad_scores = grad_scores.to(query.dtype)
            grad_query_blocks[blocks] = (torch.matmul(grad_scores, key_windows) * scaling).transpose(1, 2)
            grad_key_windows = torch.matmul(grad_scores.transpose(2, 3), chunk_query) * scaling  # (blocks, H, w, d_h)
            grad_key_rows.index_add_(0, index, grad_key_windows.transpose(1, 2).reshape(-1, heads, head_dim))
            grad_value_rows.index_add_(0, index, grad_value_windows.transpose(1, 2).reshape(-1, heads, head_dim))
        grad_coefficients = grad_coefficients.to(coefficients.dtype)
        return grad_query, grad_key_rows, grad_value_rows, grad_coefficients, None, None, None, None


def _window_rows(key_rows, value_rows, layout: BlockSparseLayout, blocks: slice):
    """The keys and values the query blocks `blocks` attend: (B (np + n) b, H, d_h) rows -> (blocks, H, w, d_h)."""
    index = layout.key_index[blocks].flatten()
    shape = (index.shape[0] // layout.keys_per_block, layout.keys_per_block, *key_rows.shape[1:])
    key_windows = key_rows.index_select(0, index).view(shape).transpose(1, 2)
    value_windows = value_rows.index_select(0, index).view(shape).transpose(1, 2)
    return key_windows, value_windows


def _window_bias(coefficients, layout: BlockSparseLayout, blocks: slice, dtype) -> torch.Tensor:
    """The additive bias (blocks, H, b, w) of the query blocks `blocks`, in `dtype`."""
    bias = torch.matmul(coefficients, layout.bias_features[blocks]).to(dtype)
    return bias.view(bias.shape[0], bias.shape[1], layout.block_size, -1)


def _window_scores(query_blocks, key_windows, coefficients, layout: BlockSparseLayout, blocks: slice, scaling):
    """Logits of the query blocks `blocks` (blocks, H, b, d_h) over their keys (blocks, H, w, d_h), the additive
    bias included; in at least float32, as the softmax is computed (blocks, H, b, w)."""
    bias = _window_bias(coefficients, layout, blocks, query_blocks.dtype)
    scores = torch.matmul(query_blocks, key_windows.transpose(2, 3)).mul_(scaling).add_(bias)
    return scores.to(torch.promote_types(scores.dtype, torch.float32))


def unpack_sliding_window_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pack_key: torch.Tensor,
    pack_value: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    gamma: torch.Tensor,
    layout: BlockSparseLayout,
    scaling: float,
    dropout: float = 0.0,
    need_weights: bool = False,
):
    """USWAttn: one softmax per query over its unpacked keys and its 4 key blocks, minus the BiALiBi bias.

    query, key, value: (B, L, H, d_h); pack_key, pack_value: (B, s, H, d_h); alpha, beta, gamma: (H,).
    Returns the context (B, L, H, d_h) and, with need_weights, the weights (B, H, n, b, w) over each query block's
    keys in `layout` order (np pack blocks, then the 4 window blocks of `window_key_blocks`).

    logits = Q [K(Cp); K(X)]^T * scaling - bias, masked, then softmax [paper]. Query blocks are batched: each one's
    keys are gathered through `layout.key_index`, so the work is two batched matrix products over blocks, done in
    chunks of query blocks (ATTENTION_CHUNK_ELEMENTS; LEAN_ATTENTION_CHUNK_ELEMENTS in training). Three paths compute
    the same function:
    - without a graph to build, a chunk goes through SDPA (fused: no (b, w) scores per block are kept);
    - training (a graph, no weights asked for) takes `LeanUnpackSlidingWindow`, which recomputes each chunk's scores
      in backward instead of keeping them;
    - need_weights takes the explicit products, all blocks in one chunk; the context is computed from the weights
      returned, so a gradient reaches them (attention attribution).
    """
    batch, seq_len, heads, head_dim = query.shape
    b, n, w = layout.block_size, layout.num_blocks, layout.keys_per_block
    key_rows = _key_rows(pack_key, key, layout)
    value_rows = _key_rows(pack_value, value, layout)
    query = F.pad(query, (0, 0, 0, 0, 0, n * b - seq_len))
    grad = torch.is_grad_enabled()
    slopes_need_grad = grad and any(t.requires_grad for t in (alpha, beta, gamma))
    building_graph = slopes_need_grad or (grad and any(t.requires_grad for t in (query, key_rows, value_rows)))
    coefficients = bias_coefficients(alpha, beta, gamma, layout)
    chunk = max(1, ATTENTION_CHUNK_ELEMENTS // (heads * w * head_dim))
    if building_graph and not need_weights:
        chunk = max(1, LEAN_ATTENTION_CHUNK_ELEMENTS // (heads * w * head_dim))
        context = LeanUnpackSlidingWindow.apply(
            query, key_rows, value_rows, coefficients, layout, scaling, dropout, chunk
        )
        return context[:, :seq_len], None

    query_blocks = query.view(batch * n, b, heads, head_dim).transpose(1, 2)  # (B n, H, b, d_h)
    if need_weights:
        every_block = slice(0, batch * n)
        key_windows, value_windows = _window_rows(key_rows, value_rows, layout, every_block)
        scores = _window_scores(query_blocks, key_windows, coefficients, layout, every_block, scaling)
        weights = F.softmax(scores, dim=-1).to(query.dtype).view(batch, n, heads, b, w).transpose(1, 2)
        blocked = F.dropout(weights, p=dropout, training=dropout > 0).transpose(1, 2).reshape(batch * n, heads, b, w)
        context = torch.matmul(blocked, value_windows).transpose(1, 2)  # (B n, b, H, d_h)
        return context.reshape(batch, n * b, heads, head_dim)[:, :seq_len], weights  # weights: (B, H, n, b, w)

    # A graph keeps every chunk's tensors anyway, and the backward of each chunk's gather would fill and add a
    # gradient of all the keys: one chunk then. An exported graph (ONNX) has one chunk too: it serves every length.
    chunk = batch * n if building_graph or torch.compiler.is_exporting() else chunk
    contexts = []
    for start in range(0, batch * n, chunk):
        blocks = slice(start, min(start + chunk, batch * n))
        key_windows, value_windows = _window_rows(key_rows, value_rows, layout, blocks)
        bias = _window_bias(coefficients, layout, blocks, query.dtype)
        context = F.scaled_dot_product_attention(
            query_blocks[blocks], key_windows, value_windows, attn_mask=bias, dropout_p=dropout, scale=scaling
        )
        contexts.append(context.transpose(1, 2))  # (blocks, b, H, d_h)
    return torch.cat(contexts).view(batch, n * b, heads, head_dim)[:, :seq_len], None


# ---------------------------------------------------------------------------------------------------------------------
# The fused kernel: USWAttn as one FlexAttention call
# ---------------------------------------------------------------------------------------------------------------------


FLEX_ATTENTION_REFUSAL = flex_attention_refusal("LittleBird", "unpack + sliding-window attention")


# The smallest tile of the block mask: every default configuration of FlexAttention's CUDA kernels divides 128, and some
# (H100 with d_h = 64) do not divide LittleBird-base's 64-token blocks.
FLEX_BLOCK_SIZE = 128
# By device type, where the kernel reads tiles of any size: FlexAttention's CPU kernel runs faster at LittleBird's own
# blocks (base size, 1024 tokens, inference: 128-token tiles took 1.7x the block-sparse products' time, the 64-token
# blocks 0.6-0.95x on a loaded 2-core machine).
FLEX_MIN_TILE = {"cpu": 1}
# FlexAttention's CPU kernel takes these dtypes only (torch 2.13: a float64 model failed inside inductor's lowering).
FLEX_CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def block_lists(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockMask's format of (B, query tiles, key tiles) flags: counts (B, 1, Q) int32 and the flagged key tiles first
    in each row, indices (B, 1, Q, K) int32."""
    order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True)
    return flags.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]


@dataclass
class KernelLayout:
    """Where the fused kernel puts queries and keys: FlexAttention's CUDA kernels read the block mask in tiles of at
    least `FLEX_BLOCK_SIZE` (every default configuration divides it), so its tiles are `tile = lcm(b, 128)` tokens,
    whole LittleBird blocks (on CPU, `FLEX_MIN_TILE`: the blocks themselves). Queries: the tokens padded to
    `query_slots`; keys: the `s` unpacked keys padded to `pack_slots`, then the tokens padded to `token_slots`, each a
    multiple of the tile."""

    tile: int
    query_slots: int
    pack_slots: int
    token_slots: int

    @classmethod
    def of(cls, layout: BlockSparseLayout) -> "KernelLayout":
        tile = math.lcm(layout.block_size, FLEX_MIN_TILE.get(layout.token_keys.device.type, FLEX_BLOCK_SIZE))
        tokens = math.ceil(layout.num_blocks * layout.block_size / tile) * tile
        return cls(tile, tokens, math.ceil(layout.pack_length / tile) * tile, tokens)


def unpack_sliding_window_block_mask(layout: BlockSparseLayout):
    """USWAttn's FlexAttention BlockMask over `KernelLayout`'s queries and keys: a tile pair is read when one of its
    (query block, key block) pairs is (the query block's pack blocks and those of its 4 window blocks,
    `window_key_blocks`, that hold a real key), in full when every pair in it is read and every key real, masked per
    key otherwise. Built from (B, n, np + n) block flags, never (L x L). The mask_mod alone is the whole pattern (a real
    key, and a pack key or one in the query block's window), as FlexAttention's uncompiled reference reads it alone."""
    from torch.nn.attention.flex_attention import BlockMask

    b, n, s = layout.block_size, layout.num_blocks, layout.pack_length
    kernel = KernelLayout.of(layout)
    batch, device = layout.token_keys.shape[0], layout.token_keys.device
    pack_keys = (torch.arange(kernel.pack_slots, device=device) < s).expand(batch, -1)
    token_keys = F.pad(layout.token_keys, (0, kernel.token_slots - n * b))
    real_keys = torch.cat((pack_keys, token_keys), dim=-1)  # (B, pack_slots + token_slots)

    # Which key blocks each query block reads, at LittleBird's block size: (B, query blocks, key blocks)
    pack_blocks, query_blocks = kernel.pack_slots // b, kernel.query_slots // b
    window_blocks = window_key_blocks(layout.real_blocks, n)  # (B, n, 4), may point past n (no real key there)
    window_reads = torch.zeros(
        batch, query_blocks, kernel.token_slots // b + WINDOW_BLOCKS, dtype=torch.bool, device=device
    )
    window_reads[:, :n].scatter_(-1, window_blocks, True)
    pack_reads = torch.zeros(batch, query_blocks, pack_blocks, dtype=torch.bool, device=device)
    pack_reads[:, :n] = True
    reads = torch.cat((pack_reads, window_reads[..., : kernel.token_slots // b]), dim=-1)
    keys_per_block = real_keys.view(batch, -1, b)
    attended = reads & keys_per_block.any(-1)[:, None, :]
    full = reads & keys_per_block.all(-1)[:, None, :]

    per_tile = kernel.tile // b  # (B, query tiles, per_tile, key tiles, per_tile)
    tiles = (batch, query_blocks // per_tile, per_tile, -1, per_tile)
    attended_tiles = attended.view(tiles).any(-1).any(2)
    full_tiles = full.view(tiles).all(-1).all(2)

    window_centers = window_blocks[..., 2]  # (B, n); the query blocks past n repeat the last one
    window_centers = torch.cat((window_centers, window_centers[:, -1:].expand(-1, query_blocks - n)), dim=1)
    pack_slots = kernel.pack_slots

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        key_block = (kv_idx - pack_slots) // b
        in_window = (key_block == 0) | ((key_block - window_centers[batch_idx, q_idx // b]).abs() <= 1)
        return real_keys[batch_idx, kv_idx] & ((kv_idx < pack_slots) | in_window)

    return BlockMask.from_kv_blocks(
        *block_lists(attended_tiles & ~full_tiles),
        *block_lists(full_tiles),
        BLOCK_SIZE=kernel.tile,
        mask_mod=mask_mod,
        seq_lengths=(kernel.query_slots, real_keys.shape[-1]),
    )


def bialibi_score_mod(alpha: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor, layout: BlockSparseLayout):
    """The BiALiBi bias as a FlexAttention score_mod over `unpack_sliding_window_block_mask`'s key layout: minus
    `(beta + gamma) / 2 * b` on pack keys [paper: D_p], minus `bialibi_coefficients @ bialibi_distances` on token keys.
    alpha, beta, gamma: (H,), read by head inside the kernel (their gradients flow through it)."""
    pack_rows, half_block = KernelLayout.of(layout).pack_slots, layout.block_size / 2
    global_prefix_length = layout.global_prefix_length

    def score_mod(score, batch_idx, head_idx, q_idx, kv_idx):
        after, before, touches_cls = bialibi_channels(q_idx, kv_idx - pack_rows, global_prefix_length)
        slope_alpha, slope_beta, slope_gamma = alpha[head_idx], beta[head_idx], gamma[head_idx]
        window_bias = slope_beta * after + slope_gamma * before + torch.where(touches_cls, slope_alpha, 0.0)
        return score - torch.where(kv_idx < pack_rows, (slope_beta + slope_gamma) * half_block, window_bias)

    return score_mod


def fused_unpack_sliding_window_attention(
    query,
    key,
    value,
    pack_key,
    pack_value,
    alpha,
    beta,
    gamma,
    layout: BlockSparseLayout,
    scaling: float,
    dropout: float = 0.0,
    need_weights: bool = False,
):
    """USWAttn (`unpack_sliding_window_attention`, whose signature it shares) in one FlexAttention kernel, forward and
    backward: what it keeps for backward is O(L d) (q, the key and value rows, the context and the logsumexp). It has
    no attention dropout and returns no weights (`LittleBirdSelfAttention.kernel` runs the block-sparse products for
    passes that need them), and reads the block mask built with `layout` (`BlockSparseLayout.build(fused=True)`).

    query, key, value: (B, L, H, d_h); pack_key, pack_value: (B, s, H, d_h); alpha, beta, gamma: (H,).
    Returns the context (B, L, H, d_h) and None.
    """
    if dropout > 0 or need_weights:
        raise ValueError("the fused LittleBird kernel has no attention dropout and returns no weights")
    seq_len, kernel = query.shape[1], KernelLayout.of(layout)

    def padded(tensor, slots):  # (B, l, H, d_h) -> (B, H, slots, d_h), zeros after l (finite, as in `_key_rows`)
        return F.pad(tensor, (0, 0, 0, 0, 0, slots - tensor.shape[1])).transpose(1, 2)

    query = padded(query, kernel.query_slots)
    key_rows = torch.cat((padded(pack_key, kernel.pack_slots), padded(key, kernel.token_slots)), dim=2)
    value_rows = torch.cat((padded(pack_value, kernel.pack_slots), padded(value, kernel.token_slots)), dim=2)
    context = flex_attention_kernel(query.device.type)(
        query,
        key_rows,
        value_rows,
        score_mod=bialibi_score_mod(alpha, beta, gamma, layout),
        block_mask=layout.block_mask,
        scale=scaling,
    )
    return context.transpose(1, 2)[:, :seq_len], None  # (B, L, H, d_h)


# USWAttn's kernels by `attn_implementation`, one signature (`unpack_sliding_window_attention`'s), chosen in
# `LittleBirdSelfAttention.kernel`. They are not transformers' `AttentionInterface` functions: USWAttn's keys are the
# unpacked pack keys plus 4 blocks gathered per query block through a `BlockSparseLayout`, with a bias built from
# trainable slopes, which no (query, key, value, attention_mask) kernel there can take; and "flex_attention", which
# names transformers' own FlexAttention kernel across posformers, cannot run it (LittleBird refuses that name).
UNPACK_SLIDING_WINDOW_KERNELS = {
    "eager": unpack_sliding_window_attention,
    "posformers_fused": fused_unpack_sliding_window_attention,
}


def attention_layout(config: LittleBirdConfig, attention_mask, shape, dtype, device) -> BlockSparseLayout:
    """The `BlockSparseLayout` of one padded batch of `shape` (B, L) (the whole batch on the padded path, a length group
    of a packed pass), with the fused kernel's block mask when that kernel is selected."""
    return BlockSparseLayout.build(
        attention_mask,
        *shape,
        config.block_size,
        config.pack_length,
        dtype=dtype,
        device=device,
        global_prefix_length=config.global_prefix_length,
        fused=config._attn_implementation == "posformers_fused",
    )


def group_layouts(config: LittleBirdConfig, packing: PackedBatch, dtype) -> dict[int, tuple]:
    """The layouts of a packed pass's length groups, memoised on the packing (every layer attends the same groups):
    `id(group)` -> (the batch rows the group holds, in its order; its `BlockSparseLayout`).

    Each group is attended as the padded batch of its sequences, at a width rounded up to whole blocks: what the padded
    path computes for those rows alone, and the same at their real tokens (a real token's output does not depend on
    the padding after it, see `window_key_blocks`). Pack states stay (rows, s, d) in the batch's row order; groups
    hold rows in length order.
    """

    def build():
        layouts, starts = {}, packing.cu_seqlens.long()
        for group in packing.groups(config.block_size):
            # A group row's first slot holds its sequence's first token; the last start at or before it is the row
            # (rows of padding only share a start with the next row and are in no group).
            first_tokens = group.gather.view(group.rows, group.width)[:, 0].contiguous()
            rows = torch.searchsorted(starts, first_tokens, right=True) - 1
            layout = attention_layout(config, group.key_mask, (group.rows, group.width), dtype, first_tokens.device)
            layouts[id(group)] = (rows, layout)
        return layouts

    return packing.memo(("littlebird_group_layouts", dtype), build)


def attention_dtype(hidden_states: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in, which its masks take the minimum of: autocast's where it is on (the states
    leave the embeddings in float32 there, and float32's minimum would overflow to -inf, and -inf times a zero bias
    feature is NaN), else the states'."""
    device_type = hidden_states.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden_states.dtype


# ---------------------------------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------------------------------


class LittleBirdEmbeddings(TokenEmbeddings):
    """Word and token-type embeddings, LayerNorm, dropout; no absolute positions (BiALiBi is the only position
    signal, so there is no maximum length) [paper]. Also holds P0, the learned pack states fed to layer 1 [paper]."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.pack_embeddings = nn.Parameter(torch.empty(config.pack_length, config.hidden_size))


# ---------------------------------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------------------------------


class LittleBirdProjections(nn.Module):
    """The query, key and value projections of both attentions, named like BERT's self-attention's so that they map
    one to one, and the head layout they share."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)


class LittleBirdPackAttention(LittleBirdProjections):
    """PackAttn: multi-head attention of the pack states over the tokens, with its own Q/K/V/O [choice], no position
    bias, padded keys masked (the pack states never are). Returns Cp (before the residual, as USWAttn reads it) and
    P' = LayerNorm(Cp + P).

    The last layer's P' would feed nothing, so that layer has no update (`updates_pack=False`): no LayerNorm, whose
    parameters would get no gradient (plain DDP refuses such parameters), and P passes through unchanged [choice].
    """

    def __init__(self, config: LittleBirdConfig, updates_pack: bool = True):
        super().__init__(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if updates_pack else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, pack_states, hidden_states, key_mask, output_attentions=False, **kwargs):
        """pack_states: (B, s, d); hidden_states: (B, L, d); key_mask: (B, 1, 1, L) additive or None. `**kwargs` are
        accepted and unused: the kernels take none."""
        pack_context, weights = self.attend(
            self.query(pack_states), self.key(hidden_states), self.value(hidden_states), key_mask, output_attentions
        )
        return pack_context, self.update(pack_context, pack_states), weights

    def attend(self, query, key, value, key_mask, output_attentions=False):
        """The attention and output projection, given the projections: query (B, s, d) of the pack states, key and
        value (B, L, d) of the tokens -> Cp (B, s, d), weights or None."""
        batch, pack_length, _ = query.shape

        def heads(states):  # (B, l, d) -> (B, H, l, d_h)
            return states.view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)

        query, key, value = heads(query), heads(key), heads(value)
        dropout = self.attention_dropout if self.training else 0.0
        weights = None
        if output_attentions:
            scores = torch.matmul(query, key.transpose(2, 3)) * self.scaling
            if key_mask is not None:
                scores = scores + key_mask
            weights = softmax_in_float(scores)
            context = torch.matmul(F.dropout(weights, p=dropout, training=self.training), value)
        else:
            # The mask is the dtype's most negative finite value, not -inf: a sequence that is all padding gets
            # finite (uniform) weights instead of NaN.
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, dropout_p=dropout)
        return self.dense(context.transpose(1, 2).reshape(batch, pack_length, -1)), weights

    def update(self, pack_context, pack_states):
        """P' = LayerNorm(Cp + P), the next layer's pack states; P itself in the last layer, which has no update."""
        if self.LayerNorm is None:
            return pack_states
        return self.LayerNorm(self.dropout(pack_context) + pack_states)


class LittleBirdSelfAttention(LittleBirdProjections):
    """USWAttn's projections and BiALiBi slopes; named like BERT's self-attention so that its Q/K/V map one to one.

    The same K and V projections serve the unpacked keys Cp and the tokens X [paper: K(Cp), K(X)]. alpha, beta and
    gamma are per-head, per-layer, trainable [paper].
    """

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.config = config
        self.alpha = nn.Parameter(torch.empty(config.num_attention_heads))
        self.beta = nn.Parameter(torch.empty(config.num_attention_heads))
        self.gamma = nn.Parameter(torch.empty(config.num_attention_heads))

    def forward(self, hidden_states, pack_context, layout: BlockSparseLayout, output_attentions=False, **kwargs):
        """hidden_states: (B, L, d); pack_context: Cp (B, s, d) -> context (B, L, d), weights or None. `**kwargs` are
        accepted and unused: the kernel takes none."""
        return self.attend(
            self.query(hidden_states),
            self.key(hidden_states),
            self.value(hidden_states),
            pack_context,
            layout,
            output_attentions,
        )

    def attend(self, query, key, value, pack_context, layout: BlockSparseLayout, output_attentions=False):
        """The attention, given the tokens' projections query, key, value (B, L, d) -> context (B, L, d), weights."""

        def heads(states):
            return states.view(*states.shape[:2], self.num_heads, self.head_dim)

        pieces = (
            heads(query),
            heads(key),
            heads(value),
            heads(self.key(pack_context)),
            heads(self.value(pack_context)),
        )
        context, weights = self.kernel(pieces[0], output_attentions)(
            *pieces,
            self.alpha,
            self.beta,
            self.gamma,
            layout,
            scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            need_weights=output_attentions,
        )
        return context.reshape(query.shape), weights

    def kernel(self, query: torch.Tensor, output_attentions: bool):
        """The one place a USWAttn kernel is chosen (`UNPACK_SLIDING_WINDOW_KERNELS`): `config._attn_implementation`'s,
        or the block-sparse products ("eager") for a pass the fused kernel cannot run."""
        implementation = self.config._attn_implementation
        if implementation == "flex_attention":
            raise ValueError(FLEX_ATTENTION_REFUSAL)
        if implementation == "posformers_fused" and not output_attentions and self.fused_kernel_runs(query):
            return UNPACK_SLIDING_WINDOW_KERNELS["posformers_fused"]
        return UNPACK_SLIDING_WINDOW_KERNELS["eager"]

    def fused_kernel_runs(self, query: torch.Tensor) -> bool:
        """Whether the fused kernel can run this pass (else the block-sparse products run, noted once per reason): it
        has no attention dropout, and trains only where FlexAttention has a backward (`FLEX_BACKWARD_DEVICES`). The
        weights (output_attentions) come from the explicit products."""
        building_graph = torch.is_grad_enabled() and (query.requires_grad or self.alpha.requires_grad)
        if self.training and self.attention_dropout > 0:
            reason = "attention dropout (set attention_probs_dropout_prob=0 to train with the fused kernel)"
        elif building_graph and query.device.type not in FLEX_BACKWARD_DEVICES:
            reason = f"a backward pass on {query.device.type} (FlexAttention has a backward on {FLEX_BACKWARD_DEVICES})"
        elif query.device.type == "cpu" and query.dtype not in FLEX_CPU_DTYPES:
            reason = f"{query.dtype} on CPU (FlexAttention's CPU kernel takes {FLEX_CPU_DTYPES})"
        else:
            return True
        logger.warning_once(f"The fused LittleBird attention runs the block-sparse products for {reason}.")
        return False


class LittleBirdAttention(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.self = LittleBirdSelfAttention(config)
        # the output projection exists so that a BERT/RoBERTa self-attention maps onto USWAttn one to one [choice]
        self.output = ResidualOutput(config, config.hidden_size)

    def forward(self, hidden_states, pack_context, layout, output_attentions=False, **kwargs):
        context, weights = self.self(hidden_states, pack_context, layout, output_attentions, **kwargs)
        return self.output(context, hidden_states), weights


# ---------------------------------------------------------------------------------------------------------------------
# Layer and encoder
# ---------------------------------------------------------------------------------------------------------------------


# Tokens per chunk of the feed-forward block: enough that its (tokens, intermediate_size) activation holds about this
# many elements (16 MB in float32), for the same reason as ATTENTION_CHUNK_ELEMENTS; each token is computed alone.
FEED_FORWARD_CHUNK_ELEMENTS = 2**22


class LittleBirdLayer(GradientCheckpointingLayer):
    """Pack attention, then unpack + sliding-window attention, then the feed-forward block; post-LN [paper]."""

    def __init__(self, config: LittleBirdConfig, updates_pack: bool = True):
        super().__init__()
        self.config = config
        self.pack_attention = LittleBirdPackAttention(config, updates_pack)
        self.attention = LittleBirdAttention(config)
        self.intermediate = Intermediate(config)
        self.output = ResidualOutput(config, config.intermediate_size)
        self.feed_forward_chunk = max(1, FEED_FORWARD_CHUNK_ELEMENTS // config.intermediate_size)

    def forward(
        self,
        hidden_states,
        pack_states,
        layout: BlockSparseLayout | None,
        packing: PackedBatch | None = None,
        output_attentions=False,
        **kwargs,
    ):
        """hidden_states: (B, L, d) with the batch's `layout` (padded path), or the real tokens of `packing` as one
        (1, N, d) row (padding-free path, `layout` None); pack_states: (B or rows, s, d)."""
        if packing is not None:
            context, pack_context = self.packed_attention(hidden_states, pack_states, packing)
            pack_states = self.pack_attention.update(pack_context, pack_states)
            attention_output, weights, pack_weights = self.attention.output(context, hidden_states), None, None
        else:
            pack_context, pack_states, pack_weights = self.pack_attention(
                pack_states, hidden_states, layout.pack_key_mask, output_attentions, **kwargs
            )
            attention_output, weights = self.attention(hidden_states, pack_context, layout, output_attentions, **kwargs)
        tokens = attention_output.flatten(0, 1)
        layer_output = torch.cat([self.feed_forward(chunk) for chunk in tokens.split(self.feed_forward_chunk)])
        return layer_output.view_as(attention_output), pack_states, weights, pack_weights

    def feed_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """X' = LayerNorm(FFN(A) + A) on (tokens, d).

        While a graph is built, the activation's output (tokens, intermediate_size) is not kept for backward: it is
        recomputed from the pre-activation, which GELU keeps anyway. That is 4 of the ~15 (L, d) tensors a layer
        keeps, for one elementwise pass in backward. Off under activation checkpointing (whose own saved-tensor hooks
        must see every tensor) and torch.compile.
        """
        pre_activation = self.intermediate.dense(tokens)
        activation_fn = self.intermediate.intermediate_act_fn
        activation = activation_fn(pre_activation)
        checkpointing = self.gradient_checkpointing and self.training
        if not activation.requires_grad or checkpointing or is_torchdynamo_compiling():
            return self.output(activation, tokens)

        # torch keeps the pack hook with what it saved: it must not hold the activation itself.
        activation_storage = (activation.data_ptr(), activation.shape)

        def pack(tensor):
            return None if (tensor.data_ptr(), tensor.shape) == activation_storage else tensor

        def unpack(saved):
            return activation_fn(pre_activation) if saved is None else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return self.output(activation, tokens)

    def packed_attention(self, hidden_states, pack_states, packing: PackedBatch):
        """Both attentions of a packed pass: every projection on the real tokens (1, N, d), the attentions per length
        group of sequences (`grouped_attention`), each group as the padded batch of its rows.

        Returns the USWAttn context (1, N, d), before its output projection, and Cp (rows, s, d) in the batch's row
        order. A row of padding only is in no group: its Cp is zero, so its pack states go through the LayerNorms
        alone (the padded path attends its padding; either way nothing reads them).
        """
        pack_attention, attention = self.pack_attention, self.attention.self
        layouts = group_layouts(self.config, packing, attention_dtype(hidden_states))
        pack_query = pack_attention.query(pack_states)
        pack_contexts = []

        def attend(group, pack_key, pack_value, query, key, value):
            rows, group_layout = layouts[id(group)]
            pack_context, _ = pack_attention.attend(
                pack_query.index_select(0, rows), pack_key, pack_value, group_layout.pack_key_mask
            )
            pack_contexts.append((rows, pack_context))
            return attention.attend(query, key, value, pack_context, group_layout)[0]

        context = grouped_attention(
            packing,
            attend,
            pack_attention.key(hidden_states),
            pack_attention.value(hidden_states),
            attention.query(hidden_states),
            attention.key(hidden_states),
            attention.value(hidden_states),
            multiple_of=self.config.block_size,
        )
        pack_context = pack_states.new_zeros(pack_states.shape)
        if pack_contexts:
            rows, contexts = zip(*pack_contexts, strict=True)
            pack_context = pack_context.index_copy(0, torch.cat(rows), torch.cat(contexts).to(pack_context.dtype))
        return context, pack_context


@dataclass
class LittleBirdModelOutput(BaseModelOutput):
    """transformers' `BaseModelOutput` (the encoder output of all three posformers models) plus the pack states, which
    every layer carries beside the tokens and which have no place in it. Its tuple is the base one's, then these.

    last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`): the final token
        states X.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*): token states after the embeddings and after each layer.
    attentions (`tuple(torch.FloatTensor)`, *optional*): per layer, the unpack + sliding-window weights in the blocked
        layout, `(batch, heads, num_blocks, block_size, keys_per_block)`: keys are `ceil(pack_length / block_size)`
        pack blocks (unpacked keys, then padding), then the 4 window blocks of `window_key_blocks`.
    pack_states (`torch.FloatTensor` of shape `(batch_size, pack_length, hidden_size)`): the final pack states, those
        the last layer reads (P' of the layer before it; P0 in a one-layer model): the last layer computes no update,
        which nothing would read (not used by the heads).
    pack_hidden_states (`tuple(torch.FloatTensor)`, *optional*): P0 and the pack states after each layer; the last
        layer's repeat the ones before it.
    pack_attentions (`tuple(torch.FloatTensor)`, *optional*): per layer, the pack attention weights,
        `(batch, heads, pack_length, sequence_length)`.
    """

    pack_states: torch.FloatTensor | None = None
    pack_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    pack_attentions: tuple[torch.FloatTensor, ...] | None = None


class LittleBirdEncoder(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.config = config
        last = config.num_hidden_layers - 1
        self.layer = nn.ModuleList(
            [LittleBirdLayer(config, updates_pack=index < last) for index in range(config.num_hidden_layers)]
        )

    def forward(
        self,
        hidden_states,
        pack_states,
        layout: BlockSparseLayout | None,
        packing: PackedBatch | None = None,
        output_attentions=False,
        output_hidden_states=False,
        show_states=keep_states,
        **kwargs,
    ) -> "LittleBirdModelOutput":
        """The padded path gets the batch's `layout`, built once per pass; the padding-free one the `packing`, on
        which the layers memoise their group layouts. show_states: how the hidden states are handed back
        (`state_shower`)."""
        all_hidden_states = None
        if output_hidden_states:
            shown, hidden_states = show_states(hidden_states)
            all_hidden_states = (shown,)
        all_pack_states = (pack_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_pack_attentions = () if output_attentions else None
        for layer_module in self.layer:
            hidden_states, pack_states, weights, pack_weights = layer_module(
                hidden_states, pack_states, layout, packing, output_attentions=output_attentions, **kwargs
            )
            if output_hidden_states:
                shown, hidden_states = show_states(hidden_states)
                all_hidden_states += (shown,)
                all_pack_states += (pack_states,)
            if output_attentions:
                all_attentions += (weights,)
                all_pack_attentions += (pack_weights,)
        return LittleBirdModelOutput(
            last_hidden_state=hidden_states,
            pack_states=pack_states,
            hidden_states=all_hidden_states,
            pack_hidden_states=all_pack_states,
            attentions=all_attentions,
            pack_attentions=all_pack_attentions,
        )


# ---------------------------------------------------------------------------------------------------------------------
# Pre-trained base and base model
# ---------------------------------------------------------------------------------------------------------------------


class LittleBirdPreTrainedModel(FusedKernelChoice, CheckedLoadingMixin, PreTrainedModel):
    """Kernels: "eager" (the block-sparse products, the default on every device), plus "posformers_fused"
    (LittleBird's FlexAttention kernel, `fused_unpack_sliding_window_attention`)."""

    config_class = LittleBirdConfig
    config: LittleBirdConfig
    base_model_prefix = "littlebird"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LittleBirdLayer"]
    _input_embed_layer = "word_embeddings"  # transformers' get/set_input_embeddings find embeddings.word_embeddings
    # Flattened batches (transformers' DataCollatorWithFlattening) run as they are: the attention is per sequence in
    # every packed pass, so each flattened sequence gets its own blocks, BiALiBi positions and pack states.
    accepts_flattened_batches = True
    # Checkpoints saved before the last layer lost its pack LayerNorm (its output fed nothing) hold that LayerNorm:
    # loading ignores it. Every other layer still has one, so only the last layer's can be unexpected.
    _keys_to_ignore_on_load_unexpected = [r"encoder\.layer\.\d+\.pack_attention\.LayerNorm\.(weight|bias)$"]
    flex_attention_refusal = FLEX_ATTENTION_REFUSAL

    @property
    def base_model_class(self) -> type:
        """The base model that heads.py's generic heads build under `base_model_prefix`."""
        return LittleBirdModel

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, LittleBirdEmbeddings):
            # P0 at the tokens' scale (unit RMS): at initializer_range it is swamped by the pooled tokens and the s
            # pack states collapse into one after layer 1 [choice: not in the paper; docs/littlebird.md, "P0"].
            init.normal_(module.pack_embeddings, mean=0.0, std=1.0)
        elif isinstance(module, LittleBirdSelfAttention):
            slopes = initial_slopes(self.config).to(module.alpha.device)
            for slope in (module.alpha, module.beta, module.gamma):
                init.copy_(slope, slopes)
        elif isinstance(module, LittleBirdLMPredictionHead):
            init.zeros_(module.bias)


def check_littlebird_mask(attention_mask: torch.Tensor, shape: tuple[int, int]) -> None:
    """LittleBird's rule for `check_inputs`: a (batch, seq_len) padding mask whose rows start with a real token."""
    check_padding_mask(attention_mask, shape)
    if is_torchdynamo_compiling():
        return
    real = attention_mask.bool()
    if (~real[:, 0] & real.any(-1)).any():
        # Positions and blocks count from the first token: left padding would move every real token. Padding between
        # real tokens after a real first one is Padding Insertion, which moves them on purpose.
        raise ValueError(
            "LittleBird needs right-padded input (real tokens first, then padding): the attention_mask has a padded "
            "first token before real ones. Pad on the right (tokenizer.padding_side = 'right')."
        )


class LittleBirdModel(EncoderForward, LittleBirdPreTrainedModel):
    """The bare LittleBird encoder: final token states, plus the final pack states.

    `position_ids` only mark a flattened batch (one row whose positions restart at 0 per sequence, with the
    `cu_seq_lens_q/k` and `max_length_q/k` of DataCollatorWithFlattening, popped from `kwargs`): LittleBird's
    positions are the token indices.

    Padding-free execution (`config.unpad_inputs`): embeddings, projections, feed-forward blocks and LayerNorms run
    on the real tokens as one (1, N, d) row; the attentions run per example (`LittleBirdLayer.packed_attention`).
    `last_hidden_state` and `hidden_states` come back as the input came: (B, L, d), or (1, N, d) for a flattened
    batch; `pack_states` are (B, s, d), or (num_sequences, s, d) for a flattened batch. Per-token states hold
    zeros at padded positions on both paths. Packing is ruled out ("auto": padded path; "always": an error) by
    output_attentions, whose weights come in the padded blocked layout, and by padding between real tokens
    (Padding Insertion).
    """

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        config.validate_fields()  # fields may have been changed since the config was created
        self.embeddings = LittleBirdEmbeddings(config)
        self.encoder = LittleBirdEncoder(config)
        self.post_init()

    def input_rules(self) -> dict:
        return dict(
            dtype=self.embeddings.LayerNorm.weight.dtype,
            embedding_size=self.config.hidden_size,
            check_mask=check_littlebird_mask,
        )

    def encode(self, shape, inputs, output_attentions, output_hidden_states, **kwargs) -> LittleBirdModelOutput:
        config = self.config
        input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds = inputs
        cu_seq_lens = pop_cu_seq_lens(kwargs)
        blocker = (
            "output_attentions=True (the weights come in the padded blocked layout)" if output_attentions else None
        )
        device = (input_ids if input_ids is not None else inputs_embeds).device
        packing = plan_packing(config, shape, attention_mask, position_ids, cu_seq_lens, blocker, device)
        if position_ids is not None and (packing is None or not packing.flattened):
            _check_token_positions(position_ids, shape)
        if packing is not None:
            input_ids, inputs_embeds, token_type_ids = (
                packing.pack(t.expand(*shape, *t.shape[2:])) if t is not None else None
                for t in (input_ids, inputs_embeds, token_type_ids)
            )

        hidden_states = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
        layout = None
        if packing is None:
            dtype = attention_dtype(hidden_states)
            layout = attention_layout(config, attention_mask, shape, dtype, hidden_states.device)
        pack_states = self.embeddings.pack_embeddings.expand(packing.rows if packing else shape[0], -1, -1)
        restore = packing.restore if packing is not None else lambda states: zero_padding(states, attention_mask)
        output = self.encoder(
            hidden_states,
            pack_states,
            layout,
            packing,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            show_states=state_shower(restore, packing),
            **kwargs,
        )
        if output_hidden_states:
            output.last_hidden_state = output.hidden_states[-1]
        else:
            output.last_hidden_state = restore(output.last_hidden_state)
        return output


def _check_token_positions(position_ids: torch.Tensor, shape: tuple[int, int]) -> None:
    """position_ids outside a flattened batch must be what LittleBird reads anyway: 0, 1, 2, ... in every row."""
    check_per_token("position_ids", position_ids, shape)
    if is_torchdynamo_compiling():
        return
    if not bool((position_ids == torch.arange(shape[1], device=position_ids.device)).all()):
        raise ValueError(
            "position_ids must be 0, 1, 2, ... in every row (LittleBird's positions are the token indices) or mark a "
            "flattened batch (one row, restarting at 0 for each sequence)"
        )


# ---------------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------------


class LittleBirdLMPredictionHead(nn.Module):
    """BERT's MLM head: transform (dense, activation, LayerNorm), then a decoder tied to the word embeddings."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.transform = SpanSelectionTransform(config)  # BERT's transform, the module the span-selection head uses
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))


class LittleBirdForMaskedLM(GenericForMaskedLM, LittleBirdPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "littlebird.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.littlebird = LittleBirdModel(config)
        self.cls = OnlyMLMHead(LittleBirdLMPredictionHead(config))
        self.post_init()


class LittleBirdForSequenceClassification(GenericForSequenceClassification, LittleBirdPreTrainedModel):
    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.littlebird = LittleBirdModel(config)
        self.classifier = ClassificationHead(config, config.num_labels)
        self.post_init()


class LittleBirdForMultipleChoice(GenericForMultipleChoice, LittleBirdPreTrainedModel):
    """Multiple choice with `ClassificationHead` on each choice's first token ([CLS])."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.littlebird = LittleBirdModel(config)
        self.classifier = ClassificationHead(config, 1)
        self.post_init()


class LittleBirdForTokenClassification(GenericForTokenClassification, LittleBirdPreTrainedModel): ...


class LittleBirdForQuestionAnswering(GenericForQuestionAnswering, LittleBirdPreTrainedModel): ...


class LittleBirdForQuestionSpanSelection(GenericForQuestionSpanSelection, LittleBirdPreTrainedModel): ...


# The names the posformers package exports from this file.
__all__ = [
    "LittleBirdForMaskedLM",
    "LittleBirdForMultipleChoice",
    "LittleBirdForQuestionAnswering",
    "LittleBirdForQuestionSpanSelection",
    "LittleBirdForSequenceClassification",
    "LittleBirdForTokenClassification",
    "LittleBirdModel",
    "LittleBirdModelOutput",
    "LittleBirdPreTrainedModel",
]
