"""LittleBird's speed code, beside the model of `modeling_littlebird.py`: the block-sparse layout of the unpack +
sliding-window attention (USWAttn) with its BiALiBi features, USWAttn's kernels (block-sparse products, a memory-lean
training Function, a fused FlexAttention kernel), the attention plan of a padded or padding-free pass and the dispatch
that runs a layer's attentions on it, and the feed-forward block's memory saving. Like the modeling file, it imports
only torch, transformers and sibling modules: `save_pretrained` copies it beside the model for `trust_remote_code`.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.utils import is_torchdynamo_compiling, logging

from .attention import FLEX_BACKWARD_DEVICES, flex_attention_kernel, flex_attention_refusal
from .packing import PackedBatch, run_in_groups

logger = logging.get_logger(__name__)

# Every query block attends exactly this many key blocks [paper, Figure 2].
WINDOW_BLOCKS = 4


def window_key_blocks(real_blocks: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The 4 key blocks of every query block, per example [paper, Figure 2]. real_blocks: (B,) -> (B, n, 4) long.

    With `m` the number of blocks covering an example's real tokens (not the padded batch's `n`):

        query block 0 and 1   ->  0, 1, 2, 3
        query block 2 .. m-2  ->  0, q-1, q, q+1
        query block m-1       ->  0, m-3, m-2, m-1

    Every row is block 0 (global as keys only) plus a band of 3 blocks around `clamp(q, 2, m-2)`. A sequence of fewer
    than 4 blocks gets 0, 1, 2, 3, the blocks it lacks masked (they may lie past `n`: callers clamp before gathering).
    Query blocks past `m` reuse the last row. Rows based on `m` keep every real token's output free of the padding.
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


# Query blocks per chunk of USWAttn: enough that a chunk's gathered keys hold about this many elements (4 MB in
# float32). Temporaries this small are reused by the CPU allocator, where larger ones are page-faulted in afresh on
# every call, at a cost above the gather's; peak memory stays small.
ATTENTION_CHUNK_ELEMENTS = 2**20
# The training path's chunks (`LeanUnpackSlidingWindow`) are larger: its forward and backward each do several products
# per chunk, which run faster batched over more blocks (docs/benchmarks.md), and its temporaries (a few
# (blocks, H, b, w) tensors) live only while their chunk is computed.
LEAN_ATTENTION_CHUNK_ELEMENTS = 2**22
# Tokens per chunk of the feed-forward block: enough that its (tokens, intermediate_size) activation holds about this
# many elements (16 MB in float32), for the same reason as ATTENTION_CHUNK_ELEMENTS; each token is computed alone.
FEED_FORWARD_CHUNK_ELEMENTS = 2**22


@dataclass
class BlockSparseLayout:
    """What USWAttn needs from a padded batch's shape and attention mask; built once per pass, read by every layer.

    Each query block of `b` tokens attends `w = np * b + 4 * b` keys: the `s` unpacked keys, stored as
    `np = ceil(s / b)` blocks (their padding masked), then its 4 window blocks. Keys are gathered from each example's
    stack of `(np + n) * b` key rows: the pack rows, then the tokens padded to whole blocks.

    key_index: (B * n, w) the key rows (of all examples' stacks, flattened) each query block attends.
    bias_features: (B * n, 4, b * w) for every (query, key) pair of a query block, the `bialibi_distances` channels
        and a fourth that is 1 for masked keys (padding, internal padding, pack padding, blocks a short sequence
        lacks), whose other channels are 0. Unpacked keys have `b / 2` in both the "after" and "before" channels,
        which makes their bias `(beta + gamma) / 2 * b` [paper: D_p = ((beta + gamma) / 2) b J], with the window's
        beta and gamma [choice]. `bias_coefficients` weighs the channels into the additive bias.
    mask_value: the most negative finite value of the compute dtype, what masked keys get.
    pack_key_mask: (B, 1, 1, L) additive mask of the pack attention's keys (padding), or None without padding.
    real_blocks: (B,) long, each example's number of real blocks `m` (`window_key_blocks`): the blocks up to its last
        real token, so padding inserted between real tokens (Padding Insertion) moves later tokens into later blocks.
    token_keys: (B, n * b) bool, which token positions are real keys (False for padding and past L).
    block_mask: the fused kernel's BlockMask (`unpack_sliding_window_block_mask`) when that kernel is selected.
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
        (every token real). global_prefix_length: as in `bialibi_distances`. fused: also build the block mask."""
        b, s = block_size, pack_length
        n, pack_blocks = math.ceil(seq_len / b), math.ceil(s / b)
        min_value = torch.finfo(dtype).min
        bias_dtype = torch.promote_types(dtype, torch.float32)  # half-precision models compute the bias in float32
        if attention_mask is None:
            lengths = torch.full((batch_size,), seq_len, device=device)
            pack_key_mask = None
            token_keys = (torch.arange(n * b, device=device) < seq_len).expand(batch_size, -1)
        else:
            attention_mask = attention_mask.to(device=device, dtype=torch.bool)
            # the last real position + 1: the length with right padding, the real tokens' span with padding inserted
            lengths = (torch.arange(1, seq_len + 1, device=device) * attention_mask).amax(-1)
            pack_key_mask = torch.zeros(batch_size, 1, 1, seq_len, device=device, dtype=dtype)
            pack_key_mask = pack_key_mask.masked_fill(~attention_mask[:, None, None, :], min_value)
            token_keys = F.pad(attention_mask, (0, n * b - seq_len))
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
        window_attended = real_keys(token_keys, key_positions, max(n, WINDOW_BLOCKS) * b)
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
            token_keys=token_keys,
            global_prefix_length=global_prefix_length,
        )
        if fused:
            layout.block_mask = unpack_sliding_window_block_mask(layout)
        return layout


def real_keys(token_keys: torch.Tensor, key_positions: torch.Tensor, padded_length: int) -> torch.Tensor:
    """Whether each window key is a real token. token_keys: (B, n b) bool; key_positions: (B, n, 1, 4b), which may
    point past n b (blocks a short sequence lacks, up to `padded_length`) -> (B, n, 1, 4b) bool."""
    padded = F.pad(token_keys, (0, padded_length - token_keys.shape[-1]))
    return padded.gather(1, key_positions.flatten(1)).view(key_positions.shape)


def bias_coefficients(alpha, beta, gamma, layout: BlockSparseLayout) -> torch.Tensor:
    """(H,) slopes -> (H, 4) weights of `layout.bias_features`: minus BiALiBi, and the mask value on masked keys.

    `coefficients @ layout.bias_features[blocks]` is the additive bias (blocks, H, b * w) of those query blocks.
    """
    mask_column = torch.full_like(alpha, layout.mask_value)[:, None]
    coefficients = torch.cat((-bialibi_coefficients(alpha, beta, gamma), mask_column), dim=-1)
    return coefficients.to(layout.bias_features.dtype)


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
    query, key, value, pack_key, pack_value, alpha, beta, gamma, layout, scaling: float, dropout=0.0, need_weights=False
):
    """USWAttn: one softmax per query over its unpacked keys and its 4 key blocks, minus the BiALiBi bias.

    query, key, value: (B, L, H, d_h); pack_key, pack_value: (B, s, H, d_h); alpha, beta, gamma: (H,).
    Returns the context (B, L, H, d_h) and, with need_weights, the weights (B, H, n, b, w) over each query block's
    keys in `layout` order (np pack blocks, then the 4 window blocks of `window_key_blocks`).

    logits = Q [K(Cp); K(X)]^T * scaling - bias, masked, then softmax [paper]. Query blocks are batched: each one's
    keys are gathered through `layout.key_index`, so the work is two batched matrix products over blocks, done in
    chunks of query blocks. Three paths compute the same function:
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


# The fused kernel: USWAttn as one FlexAttention call


FLEX_ATTENTION_REFUSAL = flex_attention_refusal("LittleBird", "unpack + sliding-window attention")
# The smallest tile of the block mask: every default configuration of FlexAttention's CUDA kernels divides 128, and some
# (H100 with d_h = 64) do not divide LittleBird-base's 64-token blocks.
FLEX_BLOCK_SIZE = 128
# By device type, where the kernel reads tiles of any size: FlexAttention's CPU kernel runs faster at LittleBird's own
# blocks (docs/littlebird.md, "Layout").
FLEX_MIN_TILE = {"cpu": 1}
# FlexAttention's CPU kernel takes these dtypes only (a float64 model fails inside inductor's lowering).
FLEX_CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def block_lists(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockMask's format of (B, query tiles, key tiles) flags: counts (B, 1, Q) int32 and the flagged key tiles first
    in each row, indices (B, 1, Q, K) int32."""
    order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True)
    return flags.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]


@dataclass
class KernelLayout:
    """Where the fused kernel puts queries and keys: FlexAttention's CUDA kernels read the block mask in tiles of at
    least `FLEX_BLOCK_SIZE`, so its tiles are `tile = lcm(b, 128)` tokens, whole LittleBird blocks (on CPU,
    `FLEX_MIN_TILE`: the blocks themselves). Queries: the tokens padded to `query_slots`; keys: the `s` unpacked keys
    padded to `pack_slots`, then the tokens padded to `token_slots`, each a multiple of the tile."""

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
    query, key, value, pack_key, pack_value, alpha, beta, gamma, layout, scaling: float, dropout=0.0, need_weights=False
):
    """USWAttn (`unpack_sliding_window_attention`, whose signature it shares) in one FlexAttention kernel, forward and
    backward: what it keeps for backward is O(L d). It has no attention dropout and returns no weights
    (`unpack_sliding_window_kernel` picks the block-sparse products for passes that need them), and reads the block
    mask built with `layout` (`BlockSparseLayout.build(fused=True)`). Returns the context (B, L, H, d_h) and None.
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


# USWAttn's kernels by `attn_implementation`, one signature (`unpack_sliding_window_attention`'s). They are not
# transformers' `AttentionInterface` functions: USWAttn's keys are the unpacked pack keys plus 4 blocks gathered per
# query block through a `BlockSparseLayout`, with a bias built from trainable slopes, which no (query, key, value,
# attention_mask) kernel there can take; and "flex_attention", which names transformers' own FlexAttention kernel
# across posformers, cannot run it (LittleBird refuses that name).
UNPACK_SLIDING_WINDOW_KERNELS = {
    "eager": unpack_sliding_window_attention,
    "posformers_fused": fused_unpack_sliding_window_attention,
}


def unpack_sliding_window_kernel(implementation: str, query, alpha, dropout: float, output_attentions: bool):
    """The one place a USWAttn kernel is chosen: `implementation`'s (`config._attn_implementation`), or the
    block-sparse products ("eager") for a pass the fused kernel cannot run (noted once per reason): one with weights
    (output_attentions) or attention dropout, a backward where FlexAttention has none (`FLEX_BACKWARD_DEVICES`), a
    dtype its CPU kernel does not take."""
    if implementation == "flex_attention":
        raise ValueError(FLEX_ATTENTION_REFUSAL)
    if implementation != "posformers_fused" or output_attentions:
        return UNPACK_SLIDING_WINDOW_KERNELS["eager"]
    building_graph = torch.is_grad_enabled() and (query.requires_grad or alpha.requires_grad)
    if dropout > 0:
        reason = "attention dropout (set attention_probs_dropout_prob=0 to train with the fused kernel)"
    elif building_graph and query.device.type not in FLEX_BACKWARD_DEVICES:
        reason = f"a backward pass on {query.device.type} (FlexAttention has a backward on {FLEX_BACKWARD_DEVICES})"
    elif query.device.type == "cpu" and query.dtype not in FLEX_CPU_DTYPES:
        reason = f"{query.dtype} on CPU (FlexAttention's CPU kernel takes {FLEX_CPU_DTYPES})"
    else:
        return UNPACK_SLIDING_WINDOW_KERNELS["posformers_fused"]
    logger.warning_once(f"The fused LittleBird attention runs the block-sparse products for {reason}.")
    return UNPACK_SLIDING_WINDOW_KERNELS["eager"]


# The attention plan of a pass and the dispatch of a layer's attentions on it


def attention_layout(config, attention_mask, shape, dtype, device) -> BlockSparseLayout:
    """The `BlockSparseLayout` of one padded batch of `shape` (B, L) (the whole batch on the padded path, a length group
    of a packed pass), with the fused kernel's block mask when that kernel is selected."""
    fused = config._attn_implementation == "posformers_fused"
    return BlockSparseLayout.build(
        attention_mask, *shape, config.block_size, config.pack_length, dtype, device, config.global_prefix_length, fused
    )


@dataclass
class GroupLayouts:
    """The attention plan of a padding-free pass: for each length group of `packing` (`PackedBatch.groups`, widths
    whole blocks), by `id(group)`, the batch rows it holds, in its order, and its `BlockSparseLayout`. A group is
    attended as the padded batch of its sequences, which gives the padded path's outputs at their real tokens (a real
    token's output does not depend on the padding after it, see `window_key_blocks`)."""

    packing: PackedBatch
    block_size: int
    layouts: dict[int, tuple[torch.Tensor, BlockSparseLayout]]


def group_layouts(config, packing: PackedBatch, dtype) -> GroupLayouts:
    layouts, starts = {}, packing.cu_seqlens.long()
    for group in packing.groups(config.block_size):
        # A group row's first slot holds its sequence's first token; the last start at or before it is the row
        # (rows of padding only share a start with the next row and are in no group).
        first_tokens = group.gather.view(group.rows, group.width)[:, 0].contiguous()
        rows = torch.searchsorted(starts, first_tokens, right=True) - 1
        layout = attention_layout(config, group.key_mask, (group.rows, group.width), dtype, first_tokens.device)
        layouts[id(group)] = (rows, layout)
    return GroupLayouts(packing, config.block_size, layouts)


def attention_plan(config, embeddings: torch.Tensor, attention_mask, packing: PackedBatch | None):
    """What every layer's attention reads, built once per pass from its embeddings (B, L, d) or (1, N, d): the batch's
    `BlockSparseLayout` on the padded path, the `GroupLayouts` of `packing` on the padding-free one.

    The masks take the minimum of the dtype attention computes in: autocast's where it is on (the states leave the
    embeddings in float32 there, and float32's minimum would overflow to -inf, and -inf times a zero bias feature is
    NaN), else the states'."""
    device_type = embeddings.device.type
    autocast = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else embeddings.dtype
    if packing is not None:
        return group_layouts(config, packing, dtype)
    return attention_layout(config, attention_mask, embeddings.shape[:2], dtype, embeddings.device)


def attend_per_example(plan: BlockSparseLayout | GroupLayouts, attend, pack_states, *tokens):
    """A layer's two attentions on the pass's `plan`. `attend(layout, rows, *padded)` runs them on one padded batch of
    examples, `rows` of the batch (None: all), `padded` the token tensors (rows, width, ...), and returns the USWAttn
    context (rows, width, ...), Cp (rows, s, d), and their weights or None.

    A `BlockSparseLayout`: `tokens` (B, L, ...) are that padded batch. `GroupLayouts`: `tokens` are the real tokens
    (1, N, ...), attended per length group (`run_in_groups`); returns the context (1, N, ...), Cp (rows, s, d) in
    the batch's row order (zeros for a row of padding only, which is in no group), and no weights."""
    if isinstance(plan, BlockSparseLayout):
        return attend(plan, None, *tokens)
    pack_contexts = []

    def attend_group(group, *padded):
        rows, layout = plan.layouts[id(group)]
        context, pack_context, _, _ = attend(layout, rows, *padded)
        pack_contexts.append((rows, pack_context))
        return context

    context = run_in_groups(plan.packing, attend_group, *tokens, multiple_of=plan.block_size)
    pack_context = pack_states.new_zeros(pack_states.shape)
    if pack_contexts:
        rows, contexts = zip(*pack_contexts, strict=True)
        pack_context = pack_context.index_copy(0, torch.cat(rows), torch.cat(contexts).to(pack_context.dtype))
    return context, pack_context, None, None


def lean_feed_forward(intermediate, output, tokens: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    """`output(intermediate(tokens), tokens)`, X' = LayerNorm(FFN(A) + A) on (tokens, d), where, while a graph is
    built, the activation's output (tokens, intermediate_size) is not kept for backward: it is recomputed from the
    pre-activation, which GELU keeps anyway (one elementwise pass in backward). Off under activation checkpointing
    (whose own saved-tensor hooks must see every tensor) and torch.compile."""
    pre_activation = intermediate.dense(tokens)
    activation_fn = intermediate.intermediate_act_fn
    activation = activation_fn(pre_activation)
    if not activation.requires_grad or checkpointing or is_torchdynamo_compiling():
        return output(activation, tokens)

    # torch keeps the pack hook with what it saved: it must not hold the activation itself.
    activation_storage = (activation.data_ptr(), activation.shape)

    def pack(tensor):
        return None if (tensor.data_ptr(), tensor.shape) == activation_storage else tensor

    def unpack(saved):
        return activation_fn(pre_activation) if saved is None else saved

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return output(activation, tokens)
