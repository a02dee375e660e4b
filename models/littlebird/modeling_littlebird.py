"""PyTorch LittleBird (Lee, Han, Shin, "LittleBird: Efficient Faster & Longer Transformer for Question Answering",
EMNLP 2022, arXiv 2210.11870). No official code or weights exist; this is the architecture of posformers' design note
(`docs/littlebird.md` in the repository), whose tags are repeated here: [paper] from the paper, [recon] reconstructed
where the paper's text is cut off, [choice] a decision of posformers.

One layer, post-LN [paper], with token states X (B, L, d) and pack states P (B, s, d):

    Cp = PackAttn(P, X)        queries P, keys/values X; padded keys masked          (B, s, d)
    P' = LayerNorm(Cp + P)                                                           feeds the next layer
    Cx = USWAttn(X, Cp)        unpack + sliding window, one joint softmax            (B, L, d)
    A  = LayerNorm(Cx + X)
    X' = LayerNorm(FFN(A) + A)

USWAttn gives each query token one softmax over the `s` unpacked keys K(Cp) and the 4 key blocks of its query block
(block 0, which is global as keys only, and a band of 3 blocks), with BiALiBi biases instead of position embeddings.
It runs on a blocked layout: the key blocks of every query block are gathered through a per-example table, so the cost
and memory are O(B H L (s + 4b)) and no (L x L) tensor is ever built.

Reads top to bottom in the order data flows: block-sparse math (small pure functions), embeddings, attention, layer,
encoder, pre-trained base, base model, heads. This file imports only torch, transformers and its sibling
`configuration_littlebird.py`: `save_pretrained` copies both to the Hub for `trust_remote_code` users.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import CrossEntropyLoss
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import is_torchdynamo_compiling

from .configuration_littlebird import LittleBirdConfig

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


def bialibi_distances(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """What each BiALiBi slope multiplies, for broadcastable integer positions i (queries) and j (keys).

    Returns float32 (3, *shape) with channels [j - i if j > i, i - j if j < i, 1 if i == 0 or j == 0], all zero where
    i == j; on a row or column of position 0 (the [CLS] token) the first two channels are zero, as alpha is a constant
    there, not scaled by distance [paper].
    """
    offset = key_positions - query_positions
    touches_cls = ((query_positions == 0) | (key_positions == 0)) & (offset != 0)
    after = offset.clamp_min(0).masked_fill(touches_cls, 0)
    before = (-offset).clamp_min(0).masked_fill(touches_cls, 0)
    return torch.stack(torch.broadcast_tensors(after, before, touches_cls)).float()


def bialibi_coefficients(alpha: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """(H,) slopes -> (H, 3), in the channel order of `bialibi_distances`: beta for keys after the query, gamma for
    keys before it, alpha for the [CLS] position. Which of beta/gamma is "after" is a fixed convention [recon].

    The BiALiBi bias subtracted from the logits is `coefficients @ distances` (H, *shape):
    bias(i, j) = 0 if i == j;  alpha if i == 0 or j == 0;  beta (j - i) if j > i;  gamma (i - j) if j < i.
    """
    return torch.stack((beta, gamma, alpha), dim=-1)


# Query blocks per chunk of the unpack + sliding-window attention: enough that a chunk's gathered keys hold about this
# many elements (4 MB in float32). Temporaries this small are reused by the CPU allocator, where ones of tens of MB are
# page-faulted in afresh on every call (an order of magnitude slower than the gather itself); peak memory stays small.
ATTENTION_CHUNK_ELEMENTS = 2**20


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
    ) -> "BlockSparseLayout":
        """attention_mask: (B, L), 1 = real token, a real first token (right padding and inserted padding), or None
        (every token real)."""
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
        window_distances = bialibi_distances(query_positions, key_positions).to(bias_dtype)  # (3, B, n, b, 4b)
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
        return cls(
            block_size=b,
            num_blocks=n,
            pack_length=s,
            pack_blocks=pack_blocks,
            key_index=key_index.flatten(0, 1),
            bias_features=bias_features.permute(1, 2, 0, 3, 4).reshape(batch_size * n, 4, -1),
            mask_value=min_value,
            pack_key_mask=pack_key_mask,
        )


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
    chunks of query blocks (ATTENTION_CHUNK_ELEMENTS). Without gradients to the bias a chunk goes through SDPA (fused:
    no (b, w) scores per block are kept); training and `need_weights` take the explicit products, as SDPA cannot
    differentiate its mask.
    """
    batch, seq_len, heads, head_dim = query.shape
    b, n, w = layout.block_size, layout.num_blocks, layout.keys_per_block
    key_rows = _key_rows(pack_key, key, layout)
    value_rows = _key_rows(pack_value, value, layout)
    query = F.pad(query, (0, 0, 0, 0, 0, n * b - seq_len))
    query_blocks = query.view(batch * n, b, heads, head_dim).transpose(1, 2)  # (B n, H, b, d_h)
    grad = torch.is_grad_enabled()
    slopes_need_grad = grad and any(t.requires_grad for t in (alpha, beta, gamma))
    building_graph = slopes_need_grad or (grad and any(t.requires_grad for t in (query, key_rows, value_rows)))
    explicit = need_weights or slopes_need_grad
    coefficients = bias_coefficients(alpha, beta, gamma, layout)

    # A graph keeps every chunk's tensors anyway, and the backward of each chunk's gather would fill and add a
    # gradient of all the keys: one chunk then.
    chunk = batch * n if building_graph else max(1, ATTENTION_CHUNK_ELEMENTS // (heads * w * head_dim))
    contexts, all_weights = [], []
    for start in range(0, batch * n, chunk):
        blocks = slice(start, min(start + chunk, batch * n))
        index = layout.key_index[blocks].flatten()
        num_blocks = index.shape[0] // w
        key_windows = key_rows.index_select(0, index).view(num_blocks, w, heads, head_dim).transpose(1, 2)
        value_windows = value_rows.index_select(0, index).view(num_blocks, w, heads, head_dim).transpose(1, 2)
        bias = torch.matmul(coefficients, layout.bias_features[blocks]).to(query.dtype).view(num_blocks, heads, b, w)
        if explicit:
            scores = torch.matmul(query_blocks[blocks], key_windows.transpose(2, 3)) * scaling + bias
            weights = softmax_in_float(scores)
            context = torch.matmul(F.dropout(weights, p=dropout, training=dropout > 0), value_windows)
            if need_weights:
                all_weights.append(weights)
        else:
            context = F.scaled_dot_product_attention(
                query_blocks[blocks], key_windows, value_windows, attn_mask=bias, dropout_p=dropout, scale=scaling
            )
        contexts.append(context.transpose(1, 2))  # (blocks, b, H, d_h)
    context = torch.cat(contexts).view(batch, n * b, heads, head_dim)[:, :seq_len]
    weights = None
    if need_weights:
        weights = torch.cat(all_weights).view(batch, n, heads, b, w).transpose(1, 2)
    return context, weights


# ---------------------------------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------------------------------


class LittleBirdEmbeddings(nn.Module):
    """Word and token-type embeddings, LayerNorm, dropout; no absolute positions (BiALiBi is the only position
    signal, so there is no maximum length) [paper]. Also holds P0, the learned pack states fed to layer 1 [paper]."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.pack_embeddings = nn.Parameter(torch.empty(config.pack_length, config.hidden_size))

    # Copied from posformers.roformer.modeling_roformer.RoFormerEmbeddings.forward
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


class LittleBirdPackAttention(nn.Module):
    """PackAttn: multi-head attention of the pack states over the tokens, with its own Q/K/V/O [choice], no position
    bias, padded keys masked (the pack states never are). Returns Cp (before the residual, as USWAttn reads it) and
    P' = LayerNorm(Cp + P)."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, pack_states, hidden_states, key_mask, output_attentions=False, **kwargs):
        """pack_states: (B, s, d); hidden_states: (B, L, d); key_mask: (B, 1, 1, L) additive or None. `**kwargs` are
        accepted and unused: the kernels take none."""
        batch, pack_length, _ = pack_states.shape

        def heads(states):  # (B, l, d) -> (B, H, l, d_h)
            return states.view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)

        query, key, value = (
            heads(self.query(pack_states)),
            heads(self.key(hidden_states)),
            heads(self.value(hidden_states)),
        )
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
        pack_context = self.dense(context.transpose(1, 2).reshape(batch, pack_length, -1))
        new_pack_states = self.LayerNorm(self.dropout(pack_context) + pack_states)
        return pack_context, new_pack_states, weights


class LittleBirdSelfAttention(nn.Module):
    """USWAttn's projections and BiALiBi slopes; named like BERT's self-attention so that its Q/K/V map one to one.

    The same K and V projections serve the unpacked keys Cp and the tokens X [paper: K(Cp), K(X)]. alpha, beta and
    gamma are per-head, per-layer, trainable [paper].
    """

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.alpha = nn.Parameter(torch.empty(config.num_attention_heads))
        self.beta = nn.Parameter(torch.empty(config.num_attention_heads))
        self.gamma = nn.Parameter(torch.empty(config.num_attention_heads))

    def forward(self, hidden_states, pack_context, layout: BlockSparseLayout, output_attentions=False, **kwargs):
        """hidden_states: (B, L, d); pack_context: Cp (B, s, d) -> context (B, L, d), weights or None. `**kwargs` are
        accepted and unused: the kernel takes none."""

        def heads(states):
            return states.view(*states.shape[:2], self.num_heads, self.head_dim)

        context, weights = unpack_sliding_window_attention(
            heads(self.query(hidden_states)),
            heads(self.key(hidden_states)),
            heads(self.value(hidden_states)),
            heads(self.key(pack_context)),
            heads(self.value(pack_context)),
            self.alpha,
            self.beta,
            self.gamma,
            layout,
            scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            need_weights=output_attentions,
        )
        return context.reshape(*hidden_states.shape), weights


# The output projection exists so that a BERT/RoBERTa self-attention maps onto USWAttn one to one [choice].
# Copied from posformers.deberta.modeling_deberta.DebertaSelfOutput with Deberta->LittleBird
class LittleBirdSelfOutput(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    # Copied from posformers.roformer.modeling_roformer.RoFormerSelfOutput.forward
    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class LittleBirdAttention(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.self = LittleBirdSelfAttention(config)
        self.output = LittleBirdSelfOutput(config)

    def forward(self, hidden_states, pack_context, layout, output_attentions=False, **kwargs):
        context, weights = self.self(hidden_states, pack_context, layout, output_attentions, **kwargs)
        return self.output(context, hidden_states), weights


# ---------------------------------------------------------------------------------------------------------------------
# Layer and encoder
# ---------------------------------------------------------------------------------------------------------------------


# Copied from posformers.deberta.modeling_deberta.DebertaIntermediate with Deberta->LittleBird
class LittleBirdIntermediate(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    # Copied from posformers.roformer.modeling_roformer.RoFormerIntermediate.forward
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


# Copied from posformers.deberta.modeling_deberta.DebertaOutput with Deberta->LittleBird
class LittleBirdOutput(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    # Copied from posformers.roformer.modeling_roformer.RoFormerOutput.forward
    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


# Tokens per chunk of the feed-forward block: enough that its (tokens, intermediate_size) activation holds about this
# many elements (16 MB in float32), for the same reason as ATTENTION_CHUNK_ELEMENTS; each token is computed alone.
FEED_FORWARD_CHUNK_ELEMENTS = 2**22


class LittleBirdLayer(GradientCheckpointingLayer):
    """Pack attention, then unpack + sliding-window attention, then the feed-forward block; post-LN [paper]."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.pack_attention = LittleBirdPackAttention(config)
        self.attention = LittleBirdAttention(config)
        self.intermediate = LittleBirdIntermediate(config)
        self.output = LittleBirdOutput(config)
        self.feed_forward_chunk = max(1, FEED_FORWARD_CHUNK_ELEMENTS // config.intermediate_size)

    def forward(self, hidden_states, pack_states, layout: BlockSparseLayout, output_attentions=False, **kwargs):
        pack_context, pack_states, pack_weights = self.pack_attention(
            pack_states, hidden_states, layout.pack_key_mask, output_attentions, **kwargs
        )
        attention_output, weights = self.attention(hidden_states, pack_context, layout, output_attentions, **kwargs)
        tokens = attention_output.flatten(0, 1)
        layer_output = torch.cat(
            [self.output(self.intermediate(chunk), chunk) for chunk in tokens.split(self.feed_forward_chunk)]
        )
        return layer_output.view_as(attention_output), pack_states, weights, pack_weights


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
    pack_states (`torch.FloatTensor` of shape `(batch_size, pack_length, hidden_size)`): the final pack states P' (not
        used by the heads).
    pack_hidden_states (`tuple(torch.FloatTensor)`, *optional*): P0 and the pack states after each layer.
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
        self.layer = nn.ModuleList([LittleBirdLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(
        self, hidden_states, pack_states, layout, output_attentions=False, output_hidden_states=False, **kwargs
    ) -> "LittleBirdModelOutput":
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_pack_states = (pack_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_pack_attentions = () if output_attentions else None
        for layer_module in self.layer:
            hidden_states, pack_states, weights, pack_weights = layer_module(
                hidden_states, pack_states, layout, output_attentions=output_attentions, **kwargs
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
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


class LittleBirdPreTrainedModel(PreTrainedModel):
    config_class = LittleBirdConfig
    config: LittleBirdConfig
    base_model_prefix = "littlebird"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LittleBirdLayer"]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, LittleBirdEmbeddings):
            init.normal_(module.pack_embeddings, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, LittleBirdSelfAttention):
            slopes = initial_slopes(self.config).to(module.alpha.device)
            for slope in (module.alpha, module.beta, module.gamma):
                init.copy_(slope, slopes)
        elif isinstance(module, LittleBirdLMPredictionHead):
            init.zeros_(module.bias)


# Copied from posformers.roformer.modeling_roformer._input_shape
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


# Copied from posformers.roformer.modeling_roformer._check_per_token
def _check_per_token(name: str, tensor: torch.Tensor | None, shape: tuple[int, int]) -> None:
    """A per-token input (token_type_ids, position_ids) must have shape (batch or 1, seq_len)."""
    if tensor is not None and (
        tensor.dim() != 2 or tensor.shape[1] != shape[1] or tensor.shape[0] not in (1, shape[0])
    ):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} but the input has shape {shape}")


# Copied from posformers.roformer.modeling_roformer._check_index_ranges
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


def _check_inputs(config: LittleBirdConfig, input_ids, inputs_embeds, attention_mask, token_type_ids):
    """Clear errors for malformed inputs, before they reach an index or a reshape deep inside torch."""
    shape = _input_shape(input_ids, inputs_embeds, config.hidden_size)
    if attention_mask is not None and tuple(attention_mask.shape) != shape:
        raise ValueError(
            f"attention_mask must have the input's shape (batch, seq_len) = {shape}, got {tuple(attention_mask.shape)}"
        )
    _check_per_token("token_type_ids", token_type_ids, shape)
    if attention_mask is not None and not is_torchdynamo_compiling():
        real = attention_mask.bool()
        if (~real[:, 0] & real.any(-1)).any():
            # Positions and blocks count from the first token: left padding would move every real token. Padding
            # between real tokens after a real first one is Padding Insertion, which moves them on purpose.
            raise ValueError(
                "LittleBird needs right-padded input (real tokens first, then padding): the attention_mask has a "
                "padded first token before real ones. Pad on the right (tokenizer.padding_side = 'right')."
            )
    _check_index_ranges(
        [("input_ids", input_ids, config.vocab_size), ("token_type_ids", token_type_ids, config.type_vocab_size)]
    )


class LittleBirdModel(LittleBirdPreTrainedModel):
    """The bare LittleBird encoder: final token states, plus the final pack states."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        config.validate_fields()  # fields may have been changed since the config was created
        self.embeddings = LittleBirdEmbeddings(config)
        self.encoder = LittleBirdEncoder(config)
        self.post_init()

    # Copied from posformers.roformer.modeling_roformer.RoFormerModel.get_input_embeddings
    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    # Copied from posformers.roformer.modeling_roformer.RoFormerModel.set_input_embeddings
    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> LittleBirdModelOutput | tuple:
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        return_dict = return_dict if return_dict is not None else config.return_dict
        _check_inputs(config, input_ids, inputs_embeds, attention_mask, token_type_ids)

        hidden_states = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
        batch_size, seq_len, _ = hidden_states.shape
        layout = BlockSparseLayout.build(
            attention_mask,
            batch_size,
            seq_len,
            config.block_size,
            config.pack_length,
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        pack_states = self.embeddings.pack_embeddings.expand(batch_size, -1, -1)
        output = self.encoder(
            hidden_states,
            pack_states,
            layout,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        return output if return_dict else output.to_tuple()


# ---------------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------------


# Copied from posformers.roformer.modeling_roformer._maybe_tuple
def _maybe_tuple(output, return_dict, config):
    """The head's `ModelOutput`, or its tuple when `return_dict` (else `config.return_dict`) is off."""
    return_dict = return_dict if return_dict is not None else config.return_dict
    return output if return_dict else output.to_tuple()


# Copied from posformers.roformer.modeling_roformer._num_choices
def _num_choices(head: nn.Module, input_ids, inputs_embeds) -> int:
    """The choice dimension of a multiple-choice input, or a clear error for an input without one."""
    reference = input_ids if input_ids is not None else inputs_embeds
    if reference is None or reference.dim() < 3:
        raise ValueError(
            f"{type(head).__name__} expects input_ids of shape (batch, num_choices, seq_len) or inputs_embeds of "
            "shape (batch, num_choices, seq_len, embedding width)"
        )
    return reference.shape[1]


# Copied from posformers.roformer.modeling_roformer._flatten_choices
def _flatten_choices(tensor: torch.Tensor | None, dims: int = 2) -> torch.Tensor | None:
    """(B, C, ...) -> (B * C, ...), a tensor of `dims` dimensions with the choices folded into the batch."""
    return tensor.reshape(-1, *tensor.shape[-dims + 1 :]) if tensor is not None else None


class LittleBirdPredictionHeadTransform(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    # Copied from posformers.roformer.modeling_roformer.RoFormerPredictionHeadTransform.forward
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class LittleBirdLMPredictionHead(nn.Module):
    """BERT's MLM head: transform (dense, activation, LayerNorm), then a decoder tied to the word embeddings."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.transform = LittleBirdPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))


# Copied from posformers.roformer.modeling_roformer.RoFormerOnlyMLMHead with RoFormer->LittleBird
class LittleBirdOnlyMLMHead(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.predictions = LittleBirdLMPredictionHead(config)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.predictions(sequence_output)


class LittleBirdForMaskedLM(LittleBirdPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "littlebird.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.littlebird = LittleBirdModel(config)
        self.cls = LittleBirdOnlyMLMHead(config)
        self.post_init()

    # Copied from posformers.roformer.modeling_roformer.RoFormerForMaskedLM.get_output_embeddings
    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    # Copied from posformers.roformer.modeling_roformer.RoFormerForMaskedLM.set_output_embeddings
    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        if new_embeddings.bias is not None:
            self.cls.predictions.bias = new_embeddings.bias

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        outputs = self.littlebird(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.cls(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        result = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


class LittleBirdClassificationHead(nn.Module):
    """Dense + tanh + projection on the first token ([CLS]), as RoBERTa's classification head."""

    def __init__(self, config: LittleBirdConfig, num_outputs: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, num_outputs)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.dropout(hidden_states[:, 0, :])
        x = self.dropout(torch.tanh(self.dense(x)))
        return self.out_proj(x)


class LittleBirdForSequenceClassification(LittleBirdPreTrainedModel):
    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.littlebird = LittleBirdModel(config)
        self.classifier = LittleBirdClassificationHead(config, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        outputs = self.littlebird(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config, **kwargs)
        result = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


class LittleBirdForMultipleChoice(LittleBirdPreTrainedModel):
    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.littlebird = LittleBirdModel(config)
        self.classifier = LittleBirdClassificationHead(config, 1)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> MultipleChoiceModelOutput | tuple:
        num_choices = _num_choices(self, input_ids, inputs_embeds)
        outputs = self.littlebird(
            _flatten_choices(input_ids),
            attention_mask=_flatten_choices(attention_mask),
            token_type_ids=_flatten_choices(token_type_ids),
            inputs_embeds=_flatten_choices(inputs_embeds, dims=3),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(outputs.last_hidden_state).view(-1, num_choices)
        # transformers' loss mapping has no multiple-choice entry (its heads write this loss out too)
        loss = CrossEntropyLoss()(logits, labels.to(logits.device)) if labels is not None else None
        result = MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


class LittleBirdForTokenClassification(LittleBirdPreTrainedModel):
    # Copied from posformers.roformer.modeling_roformer.RoFormerForTokenClassification.__init__ with RoFormer->LittleBird all-casing  # noqa: E501
    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.littlebird = LittleBirdModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        outputs = self.littlebird(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        result = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _maybe_tuple(result, return_dict, self.config)


class LittleBirdForQuestionAnswering(LittleBirdPreTrainedModel):
    """Extractive QA (the paper's task): start and end logits over the tokens."""

    # Copied from posformers.roformer.modeling_roformer.RoFormerForQuestionAnswering.__init__ with RoFormer->LittleBird all-casing  # noqa: E501
    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.littlebird = LittleBirdModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        outputs = self.littlebird(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
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


__all__ = [
    "BlockSparseLayout",
    "LittleBirdForMaskedLM",
    "LittleBirdForMultipleChoice",
    "LittleBirdForQuestionAnswering",
    "LittleBirdForSequenceClassification",
    "LittleBirdForTokenClassification",
    "LittleBirdModel",
    "LittleBirdModelOutput",
    "LittleBirdPreTrainedModel",
    "alibi_slopes",
    "bialibi_distances",
    "unpack_sliding_window_attention",
    "window_key_blocks",
]
