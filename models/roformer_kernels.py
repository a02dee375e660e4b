"""RoFormer's attention computations, called by modeling_roformer.py's attention with rotated queries and keys.

`softmax_attention` and `linear_attention_forward` take the pass's one attention plan: the packing of a padding-free
pass, whose sequences each attend their own tokens, or the mask of a padded pass. Imports only torch, transformers and
packing.py, so `save_pretrained` ships it with the model files.
"""

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .packing import PackedBatch, run_in_groups


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, is_causal=None, **kwargs):
    """Plain softmax attention. query: (B, H, Lq, D), key/value: (B, H, Lk, D) -> ((B, Lq, H, D), (B, H, Lq, Lk)).

    Takes the masks built for "eager" (additive float) and for "sdpa" (boolean, or None for causal attention:
    `is_causal`, else the module's), so `output_attentions=True` can fall back to it whatever the configured backend.
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


def softmax_attention(
    module, query, key, value, attention_plan, past_key_values=None, output_attentions=False, is_causal=False, **kwargs
):
    """query, key, value: (B, H, L, D), rotated -> context (B, L, H, D), weights (B, H, Lq, Lk) or None.

    attention_plan: the packing, or the mask transformers' masking utilities built for the configured implementation
    (a padded pass, which also reads and extends the KV cache)."""
    if isinstance(attention_plan, PackedBatch):
        return packed_softmax_attention(module, query, key, value, attention_plan, **kwargs), None
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, module.layer_idx)
    implementation = module.config._attn_implementation
    if output_attentions and implementation not in ("eager", "sdpa", None):
        raise ValueError(f"output_attentions=True needs attn_implementation 'eager' or 'sdpa', not {implementation!r}")
    attention_interface = eager_attention_forward  # which also takes the masks built for sdpa
    if implementation not in (None, "eager") and not output_attentions:
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    dropout = module.attention_dropout if module.training else 0.0
    options = dict(scaling=module.scaling, dropout=dropout, is_causal=is_causal)
    return attention_interface(module, query, key, value, attention_plan, **options, **kwargs)


def packed_softmax_attention(module, query, key, value, packing: PackedBatch, **kwargs) -> torch.Tensor:
    """Softmax attention of each sequence over its own tokens: (1, H, N, D) packed -> (1, N, H, D). A flash-attention
    implementation takes the packed row with the sequences' boundaries (varlen); the others attend length groups of
    sequences as padded batches with a boolean key mask (sdpa kernels where the implementation is not eager)."""
    implementation = module.config._attn_implementation or "eager"
    dropout = module.attention_dropout if module.training else 0.0
    options = dict(scaling=module.scaling, dropout=dropout, is_causal=False)
    if "flash" in implementation and packing.num_tokens:  # no tokens (a batch of padding): the grouped path
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        return attention_interface(module, query, key, value, None, **options, **packing.varlen_kwargs(), **kwargs)[0]
    attention_interface = eager_attention_forward if implementation == "eager" else ALL_ATTENTION_FUNCTIONS["sdpa"]

    def attend(group, *padded):  # (rows, width, H, D) each
        heads_first = (t.transpose(1, 2) for t in padded)
        return attention_interface(module, *heads_first, group.key_mask[:, None, None, :], **options)[0]

    # N may be 0 (a batch of padding only)
    return run_in_groups(packing, attend, *(t.transpose(1, 2) for t in (query, key, value)))


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


def linear_attention_forward(
    module,
    query_features,
    key_features,
    rotated_query,
    rotated_key,
    value,
    attention_plan,
    past_key_values=None,
    output_attentions=False,
    is_causal=False,
    **kwargs,
):
    """`linear_attention` of (B, H, L, D) features -> context (B, L, H, D), weights or None. attention_plan: the
    packing (the key summary is per sequence: each length group is attended as a padded batch with its key mask), or
    a padded pass's (B, keys) bool padding mask, or None."""
    if isinstance(attention_plan, PackedBatch):

        def attend(group, *padded):  # (rows, width, H, D) each
            heads_first = (t.transpose(1, 2) for t in padded)
            return linear_attention(*heads_first, group.key_mask, causal=False, need_weights=False)[0]

        states = (query_features, key_features, rotated_query, rotated_key, value)
        return run_in_groups(attention_plan, attend, *(t.transpose(1, 2) for t in states)), None
    if past_key_values is not None:
        # The cache keeps rotated and plain key features side by side: the numerator needs one, the denominator the
        # other.
        both, value = past_key_values.update(torch.cat((rotated_key, key_features), -1), value, module.layer_idx)
        rotated_key, key_features = both.split(query_features.shape[-1], dim=-1)
    causal = is_causal and query_features.shape[2] > 1
    return linear_attention(
        query_features, key_features, rotated_query, rotated_key, value, attention_plan, causal, output_attentions
    )
