"""LittleBird: the block-sparse attention against a dense reference written here, BiALiBi against its formula, and the
model's plumbing (padding, gradients, precision, saving, Auto classes, remote code, the Hub).

The reference builds the full (L x L) score matrix, masks it with the sparsity pattern of the design note's table
(written out as sets, not with the model's index arithmetic), adds the biases from the formula and takes one softmax.
"""

import json
import math

import pytest
import torch
import transformers
from helpers.data import DATA_DIR
from helpers.modeling import check_activation_checkpointing, check_preset_overrides, max_diff, tiny_config
from helpers.remote import auto_heads
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModel

import posformers
from posformers import (
    LittleBirdConfig,
    LittleBirdForMaskedLM,
    LittleBirdForMultipleChoice,
    LittleBirdForQuestionAnswering,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    LittleBirdModel,
    littlebird_kernels,
    modeling_littlebird,
)
from posformers.configuration_littlebird import AUTO_MAP
from posformers.littlebird_kernels import (
    BlockSparseLayout,
    bialibi_distances,
    unpack_sliding_window_attention,
    window_key_blocks,
)
from posformers.modeling_littlebird import alibi_slopes

TOL = 1e-5
HEADS = auto_heads(AUTO_MAP)


def tiny_model(model_class=LittleBirdModel, seed=0, **overrides):
    torch.manual_seed(seed)
    model = model_class(tiny_config(LittleBirdConfig, **overrides)).eval()
    randomize_slopes(model, seed)
    return model


def randomize_slopes(model, seed=0):
    """Distinct positive alpha, beta, gamma per head and layer, so that mixing them up cannot go unnoticed."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, modeling_littlebird.LittleBirdSelfAttention):
                for slope in (module.alpha, module.beta, module.gamma):
                    slope.copy_(torch.rand(slope.shape, generator=generator) * 0.5 + 0.05)


def right_padded_batch(lengths, seq_len, vocab=99, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (len(lengths), seq_len), generator=generator)
    attention_mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids = input_ids * attention_mask
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq_len // 3 :] = 1
    return input_ids, attention_mask, token_type_ids


# ---------------------------------------------------------------------------------------------------------------------
# The dense reference
# ---------------------------------------------------------------------------------------------------------------------


def reference_key_blocks(query_block: int, real_blocks: int) -> set[int]:
    """The design note's table: the key blocks of a query block of a sequence whose real tokens fill `real_blocks`."""
    m = real_blocks
    if m < 4:
        return set(range(m))  # a sequence of fewer than 4 blocks attends all of its blocks
    q = min(query_block, m - 1)  # query blocks of padding only: anything finite will do
    if q in (0, 1):
        return {0, 1, 2, 3}
    if q == m - 1:
        return {0, m - 3, m - 2, m - 1}
    return {0, q - 1, q, q + 1}


def reference_bialibi(i, j, alpha, beta, gamma, global_prefix_length=1):
    """The formula of the design note for positions i (Lq, 1) and j (1, Lk) -> (H, Lq, Lk); with a global prefix of g
    positions, a pair with exactly one position below g is distance-free (alpha) too."""
    i, j = i.double(), j.double()
    alpha, beta, gamma = (slope.double()[:, None, None] for slope in (alpha, beta, gamma))
    bias = torch.where(j > i, beta * (j - i), gamma * (i - j))
    bias = torch.where((i == 0) | (j == 0), alpha, bias)
    bias = torch.where((i < global_prefix_length) != (j < global_prefix_length), alpha, bias)
    return torch.where(i == j, torch.zeros_like(bias), bias)


def reference_pattern(seq_len: int, length: int, block_size: int) -> torch.Tensor:
    """(L, L) bool: may query i see token j? j in one of i's key blocks, and j a real token."""
    real_blocks = max(math.ceil(length / block_size), 1)
    allowed = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    for i in range(seq_len):
        for block in reference_key_blocks(i // block_size, real_blocks):
            allowed[i, block * block_size : min((block + 1) * block_size, length)] = True
    return allowed


def dense_attention(
    query, key, value, pack_key, pack_value, alpha, beta, gamma, lengths, block_size, global_prefix_length=1
):
    """Full scores over [s unpacked keys; L tokens], the pattern as a mask, the biases, one softmax.

    query/key/value: (B, L, H, d_h); pack_key/pack_value: (B, s, H, d_h) -> context (B, L, H, d_h) and weights
    (B, H, L, s + L).
    """
    batch, seq_len, heads, head_dim = query.shape
    pack_length = pack_key.shape[1]
    positions = torch.arange(seq_len)
    token_bias = reference_bialibi(positions[:, None], positions[None, :], alpha, beta, gamma, global_prefix_length)
    pack_bias = ((beta.double() + gamma.double()) / 2 * block_size)[:, None, None].expand(heads, seq_len, pack_length)
    bias = torch.cat((pack_bias, token_bias), dim=-1).to(query.dtype)
    contexts, all_weights = [], []
    for example in range(batch):
        keys = torch.cat((pack_key[example], key[example])).transpose(0, 1)  # (H, s + L, d_h)
        values = torch.cat((pack_value[example], value[example])).transpose(0, 1)
        scores = query[example].transpose(0, 1) @ keys.transpose(1, 2) / math.sqrt(head_dim) - bias
        allowed = reference_pattern(seq_len, int(lengths[example]), block_size)
        allowed = torch.cat((torch.ones(seq_len, pack_length, dtype=torch.bool), allowed), dim=-1)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        contexts.append((weights @ values).transpose(0, 1))
        all_weights.append(weights)
    return torch.stack(contexts), torch.stack(all_weights)


def blocked_weights_as_dense(weights, lengths, block_size, pack_length, seq_len):
    """Scatter (B, H, n, b, w) block-sparse weights into (B, H, L, s + L) using the model's block table."""
    batch, heads, n, b, _ = weights.shape
    pack_columns = math.ceil(pack_length / b) * b
    real_blocks = ((lengths + b - 1) // b).clamp_min(1)
    key_blocks = window_key_blocks(real_blocks, n)  # (B, n, 4)
    dense = weights.new_zeros(batch, heads, n, b, pack_length + (n + 4) * b)
    dense[..., :pack_length] = weights[..., :pack_length]
    for slot in range(4):
        columns = pack_length + key_blocks[:, :, slot, None] * b + torch.arange(b)  # (B, n, b)
        columns = columns[:, None, :, None, :].expand(batch, heads, n, b, b)
        start = pack_columns + slot * b
        dense.scatter_add_(-1, columns, weights[..., start : start + b])
    assert (weights[..., pack_length:pack_columns] == 0).all(), "weight on the pack padding"
    dense = dense.flatten(2, 3)[:, :, :seq_len]
    assert dense[..., pack_length + seq_len :].abs().max() == 0, "weight on keys past the sequence"
    return dense[..., : pack_length + seq_len]


# (block_size, pack_length, seq_len, lengths): 1 to 6 blocks and beyond, lengths on and off block boundaries, pack
# lengths below, equal to and above the block size, right-padded batches (one row all padding).
ATTENTION_CASES = [
    (4, 3, 1, [1]),
    (4, 3, 4, [4]),
    (4, 3, 7, [7]),
    (4, 4, 12, [12]),
    (4, 3, 14, [14]),
    (4, 3, 16, [16]),
    (4, 8, 18, [18]),
    (4, 3, 20, [20]),
    (4, 3, 23, [23]),
    (4, 3, 24, [24]),
    (4, 5, 45, [45]),
    (8, 8, 64, [64]),
    (4, 3, 30, [30, 17, 9, 4, 1, 0]),
    (4, 6, 25, [25, 24, 13, 12, 8, 5]),
    (8, 3, 70, [70, 33, 24, 15]),
]


def attention_inputs(seq_len, lengths, pack_length, heads=3, head_dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batch = len(lengths)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    tensors = [randn(batch, seq_len, heads, head_dim) for _ in range(3)]
    tensors += [randn(batch, pack_length, heads, head_dim) for _ in range(2)]
    slopes = [torch.rand(heads, generator=generator) * 0.5 + 0.05 for _ in range(3)]
    attention_mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    return tensors, slopes, attention_mask


@pytest.fixture(params=["one-chunk", "several-chunks", "chunks-of-1-block"])
def attention_chunks(request, monkeypatch):
    """Run the kernel in one chunk of query blocks (the tiny sizes here) or in several, uneven ones."""
    elements = {"one-chunk": None, "several-chunks": 5 * 3 * 8 * 40, "chunks-of-1-block": 1}[request.param]
    if elements is not None:
        monkeypatch.setattr(littlebird_kernels, "ATTENTION_CHUNK_ELEMENTS", elements)


@pytest.mark.parametrize("path", ["sdpa", "explicit", "grad"])
@pytest.mark.parametrize(
    ("block_size", "pack_length", "seq_len", "lengths"),
    ATTENTION_CASES,
    ids=[f"b{c[0]}-s{c[1]}-L{c[2]}" for c in ATTENTION_CASES],
)
def test_block_sparse_attention_matches_dense_reference(
    path, block_size, pack_length, seq_len, lengths, attention_chunks
):
    (query, key, value, pack_key, pack_value), slopes, attention_mask = attention_inputs(seq_len, lengths, pack_length)
    if path == "grad":
        for slope in slopes:
            slope.requires_grad_(True)
    layout = BlockSparseLayout.build(
        attention_mask, len(lengths), seq_len, block_size, pack_length, torch.float32, torch.device("cpu")
    )
    with torch.set_grad_enabled(path == "grad"):
        context, weights = unpack_sliding_window_attention(
            query, key, value, pack_key, pack_value, *slopes, layout, scaling=8**-0.5, need_weights=path == "explicit"
        )
    expected_context, expected_weights = dense_attention(
        query, key, value, pack_key, pack_value, *(s.detach() for s in slopes), torch.tensor(lengths), block_size
    )
    real = attention_mask.bool()
    assert context.shape == query.shape
    assert torch.isfinite(context).all()
    if real.any():
        assert (context - expected_context)[real].abs().max().item() <= TOL
    if path == "explicit":
        dense = blocked_weights_as_dense(weights, torch.tensor(lengths), block_size, pack_length, seq_len)
        assert (dense - expected_weights).transpose(1, 2)[real].abs().max().item() <= TOL


@pytest.mark.parametrize("global_prefix_length", [1, 3])
@pytest.mark.parametrize("block_size", [4, 8])
@pytest.mark.parametrize("path", ["sdpa", "grad"])
def test_global_prefix_matches_dense_reference(path, block_size, global_prefix_length):
    """`global_prefix_length` in the layout's bias features against the formula in the dense reference."""
    seq_len, lengths = 37, [37, 30, 11, 2]
    (query, key, value, pack_key, pack_value), slopes, attention_mask = attention_inputs(seq_len, lengths, 5)
    layout = BlockSparseLayout.build(
        attention_mask, 4, seq_len, block_size, 5, torch.float32, torch.device("cpu"), global_prefix_length
    )
    slopes = [slope.requires_grad_(path == "grad") for slope in slopes]
    context, _ = unpack_sliding_window_attention(query, key, value, pack_key, pack_value, *slopes, layout, 8**-0.5)
    expected, _ = dense_attention(
        query, key, value, pack_key, pack_value, *(slope.detach() for slope in slopes), torch.tensor(lengths),
        block_size, global_prefix_length,
    )  # fmt: skip
    real = attention_mask.bool()
    assert (context - expected)[real].abs().max().item() <= TOL
    if global_prefix_length > 1:  # the prefix changes the outputs: the reference is not checking nothing
        paper, _ = dense_attention(
            query, key, value, pack_key, pack_value, *(slope.detach() for slope in slopes), torch.tensor(lengths),
            block_size,
        )  # fmt: skip
        assert (paper - expected)[real].abs().max().item() > 1e-3


def test_global_prefix_follows_the_formula():
    alpha, beta, gamma = torch.tensor([0.3, 1.5]), torch.tensor([0.5, 0.25]), torch.tensor([0.7, 2.0])
    positions = torch.arange(9)
    bias = bialibi_bias(bialibi_distances(positions[:, None], positions[None, :], 3), alpha, beta, gamma)
    for h in range(2):
        assert bias[h, 8, 2] == alpha[h] and bias[h, 2, 8] == alpha[h]  # the prefix, as key and as query
        assert bias[h, 1, 2] == pytest.approx(beta[h].item())  # inside the prefix: distances (word order) stay
        assert bias[h, 2, 1] == pytest.approx(gamma[h].item()) and bias[h, 2, 0] == alpha[h]
        assert bias[h, 5, 3] == pytest.approx(2 * gamma[h].item())  # outside: as before
        assert bias[h, 2, 2] == 0
    torch.testing.assert_close(
        bias.double(), reference_bialibi(positions[:, None], positions[None, :], alpha, beta, gamma, 3)
    )


@pytest.mark.parametrize("global_prefix_length", [1, 4])
def test_model_matches_model_with_dense_attention(monkeypatch, global_prefix_length):
    """The whole model (K(Cp), V(Cp), masks, internal padding) with the dense reference in place of the kernel."""
    model = tiny_model(LittleBirdModel, pack_length=5, global_prefix_length=global_prefix_length)
    lengths = [27, 19, 6, 2]
    input_ids, attention_mask, token_type_ids = right_padded_batch(lengths, 27)
    with torch.no_grad():
        actual = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)

    def dense_kernel(query, key, value, pack_key, pack_value, alpha, beta, gamma, layout, **kwargs):
        context, _ = dense_attention(
            query, key, value, pack_key, pack_value, alpha, beta, gamma, torch.tensor(lengths), layout.block_size,
            global_prefix_length,
        )  # fmt: skip
        return context, None

    monkeypatch.setitem(littlebird_kernels.UNPACK_SLIDING_WINDOW_KERNELS, "eager", dense_kernel)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    assert max_diff(actual.last_hidden_state, expected.last_hidden_state, attention_mask) <= TOL
    assert (actual.pack_states - expected.pack_states).abs().max().item() <= TOL


def test_gradients_of_the_kernel_match_finite_differences():
    (query, key, value, pack_key, pack_value), slopes, attention_mask = attention_inputs(
        13, [13, 9], pack_length=3, heads=2, head_dim=4
    )
    inputs = [t.double().requires_grad_(True) for t in (query, key, value, pack_key, pack_value, *slopes)]
    layout = BlockSparseLayout.build(attention_mask, 2, 13, 4, 3, torch.float64, torch.device("cpu"))

    def real_context(*tensors):
        context, _ = unpack_sliding_window_attention(*tensors, layout, scaling=0.5)
        return context[attention_mask.bool()]

    assert torch.autograd.gradcheck(real_context, inputs, eps=1e-6, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Sparsity pattern and BiALiBi
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("real_blocks", range(1, 10))
def test_key_block_table_follows_the_design_note(real_blocks):
    num_blocks = real_blocks + 2  # two blocks of padding in the batch
    table = window_key_blocks(torch.tensor([real_blocks]), num_blocks)[0]
    for query_block in range(real_blocks):
        attended = {int(block) for block in table[query_block] if block < real_blocks}
        assert attended == reference_key_blocks(query_block, real_blocks), query_block
        assert len(set(table[query_block].tolist())) == 4  # the 4 slots never repeat a block


# (query block, token changed, whether the query's output may change), for 8 blocks of 4 tokens and query token
# 4 * query_block + 1. Query block 5 sees 0, 4, 5, 6; block 0 sees 0..3; block 7 (the last) sees 0, 5, 6, 7.
PATTERN_CASES = [
    (5, 9, False),  # block 2
    (5, 30, False),  # block 7
    (5, 16, True),  # block 4 = q - 1
    (5, 27, True),  # block 6 = q + 1
    (5, 2, True),  # block 0, global as keys
    (5, 0, True),  # position 0
    (0, 17, False),  # block 4, past the first query block's 0..3
    (0, 14, True),  # block 3
    (7, 18, False),  # block 4
    (7, 20, True),  # block 5 = n - 3
]


@pytest.mark.parametrize(("query_block", "changed", "may_change"), PATTERN_CASES)
def test_sparsity_pattern_in_a_one_layer_model(query_block, changed, may_change):
    """With the pack attention's values zeroed, Cp no longer depends on the tokens: a query's output can then depend
    only on the tokens of its key blocks (and on itself). Block 0 is global as keys only: query 0 sees no far block."""
    model = tiny_model(LittleBirdModel, num_hidden_layers=1)
    with torch.no_grad():
        model.encoder.layer[0].pack_attention.value.weight.zero_()
        model.encoder.layer[0].pack_attention.value.bias.zero_()
    input_ids, _, _ = right_padded_batch([32], 32)
    edited = input_ids.clone()
    edited[0, changed] = (edited[0, changed] % 98) + 1
    query = 4 * query_block + (1 if query_block else 0)
    with torch.no_grad():
        before = model(input_ids).last_hidden_state[0, query]
        after = model(edited).last_hidden_state[0, query]
    difference = (before - after).abs().max().item()
    if may_change:
        assert difference > 1e-5
    else:
        assert difference == 0.0


def bialibi_bias(distances, alpha, beta, gamma):
    """The BiALiBi bias (H, *shape) subtracted from the logits: the model's slope coefficients weighing the channels
    of `bialibi_distances` (3, *shape)."""
    coefficients = littlebird_kernels.bialibi_coefficients(alpha, beta, gamma).to(distances.dtype)
    return (coefficients @ distances.flatten(1)).view(-1, *distances.shape[1:])


def packed_key_bias(beta, gamma, block_size):
    """The bias of every unpacked key [paper: D_p = ((beta + gamma) / 2) b J]."""
    return (beta + gamma) / 2 * block_size


def test_bialibi_values_follow_the_formula():
    alpha, beta, gamma = torch.tensor([0.3, 1.5]), torch.tensor([0.5, 0.25]), torch.tensor([0.7, 2.0])
    positions = torch.arange(6)
    bias = bialibi_bias(bialibi_distances(positions[:, None], positions[None, :]), alpha, beta, gamma)
    assert bias.shape == (2, 6, 6)
    for h in range(2):
        for i in range(6):
            assert bias[h, i, i] == 0  # i == j, including position 0 itself
        for j in range(1, 6):
            assert bias[h, 0, j] == alpha[h] and bias[h, j, 0] == alpha[h]  # [CLS], not scaled by distance
        assert bias[h, 2, 5] == pytest.approx(3 * beta[h].item())  # key after the query
        assert bias[h, 5, 2] == pytest.approx(3 * gamma[h].item())  # key before the query
        assert bias[h, 1, 2] == pytest.approx(beta[h].item()) and bias[h, 4, 1] == pytest.approx(3 * gamma[h].item())
    torch.testing.assert_close(
        bias.double(), reference_bialibi(positions[:, None], positions[None, :], alpha, beta, gamma)
    )
    assert torch.allclose(packed_key_bias(beta, gamma, 64), torch.tensor([38.4, 72.0]))


def test_layout_biases_packed_keys_with_the_constant():
    """The packed-key columns of the model's blocked distances give (beta + gamma) / 2 * b for every query."""
    alpha, beta, gamma = torch.tensor([0.3]), torch.tensor([0.5]), torch.tensor([0.7])
    layout = BlockSparseLayout.build(None, 1, 20, 4, 3, torch.float32, torch.device("cpu"))
    features = layout.bias_features.view(layout.num_blocks, 4, 4, layout.keys_per_block).transpose(0, 1)
    bias = bialibi_bias(features[:3], alpha, beta, gamma)
    assert torch.allclose(bias[..., :3], packed_key_bias(beta, gamma, 4))
    assert (features[3, ..., :3] == 0).all() and (features[3, ..., 3] == 1).all()  # the pack padding is masked
    additive = littlebird_kernels.bias_coefficients(alpha, beta, gamma, layout) @ layout.bias_features
    additive = additive.view(layout.num_blocks, 4, layout.keys_per_block)
    assert torch.allclose(additive[..., :3], -packed_key_bias(beta, gamma, 4))
    assert (additive[..., 3] == torch.finfo(torch.float32).min).all()


def test_slopes_start_at_alibi_values_or_a_constant():
    slopes = alibi_slopes(12)
    assert torch.allclose(slopes, torch.tensor([2 ** (-8 * h / 12) for h in range(1, 13)]))
    attention = LittleBirdModel(tiny_config(LittleBirdConfig)).encoder.layer[1].attention.self
    for slope in (attention.alpha, attention.beta, attention.gamma):
        assert torch.equal(slope.data, alibi_slopes(4))
    attention = LittleBirdModel(tiny_config(LittleBirdConfig, bialibi_init=0.25)).encoder.layer[0].attention.self
    assert torch.equal(attention.gamma.data, torch.full((4,), 0.25))
    # a number spelled as a string (a command line's --config_overrides) is that number
    assert tiny_config(LittleBirdConfig, bialibi_init="0.25").bialibi_init == 0.25


# ---------------------------------------------------------------------------------------------------------------------
# Padding, determinism, gradients, precision
# ---------------------------------------------------------------------------------------------------------------------


def test_feed_forward_in_chunks_of_tokens_gives_the_same_outputs():
    model = tiny_model(LittleBirdModel)
    input_ids, attention_mask, _ = right_padded_batch([23, 16, 3], 23)
    with torch.no_grad():
        whole = model(input_ids, attention_mask=attention_mask).last_hidden_state
        for layer in model.encoder.layer:
            layer.feed_forward_chunk = 5  # 69 tokens: 14 chunks, the last one short
        chunked = model(input_ids, attention_mask=attention_mask).last_hidden_state
    assert (whole - chunked).abs().max().item() <= 1e-6


def test_global_prefix_gives_the_same_outputs_padded_and_padding_free(monkeypatch):
    model = tiny_model(LittleBirdModel, pack_length=5, global_prefix_length=3)
    input_ids, attention_mask, token_type_ids = right_padded_batch([27, 19, 6, 2], 27)
    packed_passes = []
    original = littlebird_kernels.group_layouts
    monkeypatch.setattr(
        littlebird_kernels, "group_layouts", lambda *args: packed_passes.append(args) or original(*args)
    )
    outputs = {}
    for mode in ("never", "always"):
        model.config.unpad_inputs = mode
        with torch.no_grad():
            outputs[mode] = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        assert bool(packed_passes) == (mode == "always")
    expected, actual = outputs["never"], outputs["always"]
    assert max_diff(actual.last_hidden_state, expected.last_hidden_state, attention_mask) <= TOL
    assert (actual.pack_states - expected.pack_states).abs().max().item() <= TOL


@pytest.mark.slow
def test_torch_compile_matches_eager_on_the_padded_path():
    """(The padding-free path compiles in tests/models/test_contracts.py, for every model.)"""
    model = tiny_model(LittleBirdForMaskedLM, unpad_inputs="never")
    input_ids, attention_mask, token_type_ids = right_padded_batch([17, 11, 5], 17)
    compiled = torch.compile(model)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
        actual = compiled(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
    assert max_diff(expected, actual, attention_mask) <= 1e-5


def test_forward_is_deterministic():
    input_ids, attention_mask, _ = right_padded_batch([30, 11], 30)
    model = tiny_model(LittleBirdForQuestionAnswering)
    with torch.no_grad():
        first = model(input_ids, attention_mask=attention_mask).start_logits
        second = model(input_ids, attention_mask=attention_mask).start_logits
        third = tiny_model(LittleBirdForQuestionAnswering)(input_ids, attention_mask=attention_mask).start_logits
    assert torch.equal(first, second) and torch.equal(first, third)


def test_gradients_reach_slopes_and_pack_embeddings():
    model = tiny_model(LittleBirdForQuestionAnswering).train()
    input_ids, attention_mask, _ = right_padded_batch([25, 14], 25)
    output = model(
        input_ids,
        attention_mask=attention_mask,
        start_positions=torch.tensor([3, 20]),
        end_positions=torch.tensor([5, 9]),
    )
    output.loss.backward()
    pack_embeddings = model.littlebird.embeddings.pack_embeddings
    assert pack_embeddings.grad is not None and pack_embeddings.grad.abs().sum() > 0
    for layer in model.littlebird.encoder.layer:
        for slope in (layer.attention.self.alpha, layer.attention.self.beta, layer.attention.self.gamma):
            assert slope.grad is not None and (slope.grad != 0).all()
    # The last layer computes no P' (nothing would read it), so every parameter gets a gradient (plain DDP needs it).
    assert [name for name, parameter in model.named_parameters() if parameter.grad is None] == []


def test_gradient_checkpointing_gives_the_same_gradients():
    input_ids, attention_mask, _ = right_padded_batch([22, 9], 22)
    # Reentrant checkpointing runs the first forward pass without gradients, where the attention takes its fused SDPA
    # path: the layers recomputed in backward read inputs that differ from the explicit path's at float rounding
    # (up to 4e-6 in the gradients here, with unit-scale pack states); non-reentrant checkpointing is exact.
    check_activation_checkpointing(
        tiny_model(LittleBirdModel),
        lambda model: model(input_ids, attention_mask=attention_mask).last_hidden_state[attention_mask.bool()].sum(),
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_without_nan_including_all_padding_rows(dtype):
    model = tiny_model(LittleBirdForQuestionAnswering).to(dtype)
    input_ids, attention_mask, _ = right_padded_batch([37, 10, 0], 37)
    with torch.no_grad():
        output = model(input_ids, attention_mask=attention_mask, output_attentions=True)
        fused = model(input_ids, attention_mask=attention_mask)
    for tensor in (output.start_logits, output.end_logits, fused.start_logits, *output.attentions):
        assert tensor.dtype == dtype and torch.isfinite(tensor).all()
    model.train()
    loss = model(
        input_ids,
        attention_mask=attention_mask,
        start_positions=torch.tensor([1, 2, 0]),
        end_positions=torch.tensor([4, 3, 0]),
    ).loss
    loss.backward()
    assert torch.isfinite(loss)
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name


def test_attention_weights_are_returned_in_the_blocked_layout():
    model = tiny_model(LittleBirdModel, pack_length=6)
    input_ids, attention_mask, _ = right_padded_batch([21, 8], 21)
    with torch.no_grad():
        output = model(input_ids, attention_mask=attention_mask, output_attentions=True, output_hidden_states=True)
        fused = model(input_ids, attention_mask=attention_mask)
    assert max_diff(output.last_hidden_state, fused.last_hidden_state, attention_mask) <= TOL
    assert len(output.attentions) == len(output.pack_attentions) == 2
    assert output.attentions[0].shape == (2, 4, 6, 4, 2 * 4 + 4 * 4)  # pack blocks ceil(6 / 4) = 2, then 4 blocks
    assert output.pack_attentions[0].shape == (2, 4, 6, 21)
    torch.testing.assert_close(output.attentions[1].sum(-1), torch.ones(2, 4, 6, 4))
    assert output.pack_attentions[0][1, :, :, 8:].abs().max() == 0  # padded keys
    assert len(output.hidden_states) == len(output.pack_hidden_states) == 3
    assert torch.equal(output.pack_hidden_states[0][0], model.embeddings.pack_embeddings)


def test_returned_attention_weights_receive_gradients():
    """Attention attribution: the weights returned are the ones the output is computed from, so `retain_grad` on
    them sees a gradient."""
    model = tiny_model(LittleBirdModel, pack_length=6, num_hidden_layers=1)
    input_ids, attention_mask, _ = right_padded_batch([21, 8], 21)
    output = model(input_ids, attention_mask=attention_mask, output_attentions=True)
    weights, pack_weights = output.attentions[0], output.pack_attentions[0]
    weights.retain_grad()
    pack_weights.retain_grad()
    direction = torch.randn(output.last_hidden_state.shape[-1], generator=torch.Generator().manual_seed(0))
    (output.last_hidden_state[:, 3] @ direction).sum().backward()  # a plain sum of LayerNorm outputs is constant
    assert weights.grad is not None and weights.grad.abs().max() > 0
    assert pack_weights.grad is not None and pack_weights.grad.abs().max() > 0


@pytest.mark.parametrize("unpad_inputs", ["never", "auto", "always"])
def test_a_batch_without_real_tokens_gives_outputs(unpad_inputs):
    model = tiny_model(LittleBirdForQuestionAnswering, unpad_inputs=unpad_inputs)
    input_ids, attention_mask, _ = right_padded_batch([0, 0], 11)
    with torch.no_grad():
        output = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert output.start_logits.shape == (2, 11) and torch.isfinite(output.start_logits).all()
    assert output.hidden_states[-1].abs().max() == 0


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator returns."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(output):
            if isinstance(tensor, torch.Tensor):
                self.numel = max(self.numel, tensor.numel())
        return output


def test_no_tensor_grows_with_length_squared():
    """Memory O(B H L (s + 4b)): at L = 2048 an (L x L) matrix would dwarf every tensor the model makes."""
    config = dict(block_size=16, pack_length=16, num_attention_heads=2)
    model = tiny_model(LittleBirdForQuestionAnswering, **config)
    seq_len = 2048
    input_ids, attention_mask, _ = right_padded_batch([seq_len, 1500], seq_len)
    with torch.no_grad(), LargestTensor() as largest:
        model(input_ids, attention_mask=attention_mask)
    heads, keys_per_query = 2, 16 + 4 * 16
    assert largest.numel <= 3 * 2 * heads * seq_len * keys_per_query < seq_len * seq_len


# ---------------------------------------------------------------------------------------------------------------------
# Heads, saving, Auto classes
# ---------------------------------------------------------------------------------------------------------------------


def test_heads_outputs_and_losses():
    input_ids, attention_mask, token_type_ids = right_padded_batch([19, 12], 19)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    mlm = tiny_model(LittleBirdForMaskedLM)
    output = mlm(**inputs, labels=input_ids.masked_fill(attention_mask == 0, -100))
    assert output.logits.shape == (2, 19, 99) and torch.isfinite(output.loss)
    assert mlm.cls.predictions.decoder.weight is mlm.littlebird.embeddings.word_embeddings.weight
    classifier = tiny_model(LittleBirdForSequenceClassification, num_labels=3)
    assert classifier(**inputs, labels=torch.tensor([0, 2])).logits.shape == (2, 3)
    tagger = tiny_model(LittleBirdForTokenClassification, num_labels=5)
    assert torch.isfinite(tagger(**inputs, labels=torch.zeros_like(input_ids)).loss)
    qa = tiny_model(LittleBirdForQuestionAnswering)
    output = qa(**inputs, start_positions=torch.tensor([1, 30]), end_positions=torch.tensor([2, 3]))
    assert output.start_logits.shape == output.end_logits.shape == (2, 19) and torch.isfinite(output.loss)
    choices = tiny_model(LittleBirdForMultipleChoice)
    stacked = {key: value[None].expand(3, -1, -1) for key, value in inputs.items()}
    output = choices(**stacked, labels=torch.tensor([0, 1, 1]))
    assert output.logits.shape == (3, 2) and torch.isfinite(output.loss)
    with pytest.raises(ValueError, match="num_choices"):
        choices(input_ids)


def test_inputs_embeds_and_default_token_types():
    model = tiny_model(LittleBirdModel)
    input_ids, attention_mask, _ = right_padded_batch([15, 6], 15)
    with torch.no_grad():
        from_ids = model(input_ids, attention_mask=attention_mask).last_hidden_state
        embeds = model.embeddings.word_embeddings(input_ids)
        from_embeds = model(inputs_embeds=embeds, attention_mask=attention_mask).last_hidden_state
        zeros = model(input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids))
    assert torch.equal(from_ids, from_embeds)
    assert torch.equal(from_ids, zeros.last_hidden_state)
    assert not hasattr(
        LittleBirdModel(tiny_config(LittleBirdConfig, type_vocab_size=0)).embeddings, "token_type_embeddings"
    )


def test_save_load_round_trip_and_auto_classes(tmp_path):
    model = tiny_model(LittleBirdForQuestionAnswering, bialibi_init=0.5)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    assert {"configuration_littlebird.py", "modeling_littlebird.py", "littlebird_kernels.py"} <= {
        p.name for p in tmp_path.iterdir()
    }
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "littlebird" and saved["auto_map"] == AUTO_MAP
    assert "max_position_embeddings" not in saved
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is LittleBirdConfig and config.bialibi_init == 0.5 and config.block_size == 4
    reloaded = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert type(reloaded) is LittleBirdForQuestionAnswering
    input_ids, attention_mask, _ = right_padded_batch([17, 5], 17)
    with torch.no_grad():
        assert torch.equal(
            model(input_ids, attention_mask=attention_mask).start_logits,
            reloaded(input_ids, attention_mask=attention_mask).start_logits,
        )
    assert torch.equal(
        reloaded.littlebird.encoder.layer[1].attention.self.beta, model.littlebird.encoder.layer[1].attention.self.beta
    )
    assert type(AutoModel.from_pretrained(tmp_path)) is LittleBirdModel


@pytest.mark.parametrize("auto_name", sorted(HEADS))
def test_auto_classes_build_littlebird_heads(auto_name):
    assert transformers.CONFIG_MAPPING["littlebird"] is LittleBirdConfig
    model = getattr(transformers, auto_name).from_config(tiny_config(LittleBirdConfig))
    assert type(model).__name__ == HEADS[auto_name] and type(model).__module__.startswith(
        "posformers.modeling_littlebird"
    )
    assert getattr(posformers, HEADS[auto_name]) is type(model)


def test_defaults_are_littlebird_base_and_presets_take_overrides():
    assert LittleBirdConfig().to_dict() == LittleBirdConfig.from_preset("littlebird-base").to_dict()
    check_preset_overrides(LittleBirdConfig, "littlebird-large", pack_length=32)


# ---------------------------------------------------------------------------------------------------------------------
# Bad configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 30}, "divisible by num_attention_heads"),
        ({"block_size": 0}, "block_size must be a positive integer"),
        ({"pack_length": -2}, "pack_length must be a positive integer"),
        ({"block_size": 4.0}, "block_size must be a positive integer"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"vocab_size": True}, "vocab_size must be a positive integer"),
        ({"type_vocab_size": -1}, "type_vocab_size must be an integer >= 0"),
        ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob must be in"),
        ({"attention_probs_dropout_prob": -0.1}, "attention_probs_dropout_prob must be in"),
        ({"layer_norm_eps": 0}, "layer_norm_eps must be positive"),
        ({"pad_token_id": 500}, "pad_token_id"),
        ({"hidden_act": "swishy"}, "hidden_act must be the name of an activation"),
        ({"bialibi_init": "uniform"}, "bialibi_init must be one of"),
        ({"bialibi_init": -1.0}, "bialibi_init must be one of"),
        ({"global_prefix_length": 0}, "LittleBirdConfig.global_prefix_length must be a positive integer"),
        ({"global_prefix_length": 5}, r"LittleBirdConfig.global_prefix_length \(5\) must be at most block_size \(4\)"),
        ({"is_decoder": True}, "bidirectional encoder"),
        ({"add_cross_attention": True}, "bidirectional encoder"),
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(LittleBirdConfig, **overrides)


def test_config_is_validated_again_when_a_model_is_built():
    config = tiny_config(LittleBirdConfig)
    config.block_size = 0
    with pytest.raises(ValueError, match="block_size"):
        LittleBirdModel(config)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": torch.ones(2, 5, dtype=torch.long), "inputs_embeds": torch.zeros(2, 5, 32)}, "got both"),
        ({}, "got neither"),
        ({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 6)}, "attention_mask must"),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 1, 5, 5)},
            "attention_mask must",
        ),
        (
            {
                "input_ids": torch.ones(2, 5, dtype=torch.long),
                "attention_mask": torch.tensor([[1] * 5, [0, 0, 1, 1, 1]]),
            },
            "right-padded",
        ),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "token_type_ids": torch.ones(2, 4, dtype=torch.long)},
            "token_type_ids has shape",
        ),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "token_type_ids": torch.full((2, 5), 7)},
            "token_type_ids must",
        ),
        ({"input_ids": torch.full((2, 5), 99)}, r"input_ids must lie in \[0, 99\)"),
        ({"input_ids": torch.ones(5, dtype=torch.long)}, "input_ids must have shape"),
        ({"inputs_embeds": torch.zeros(2, 5, 31)}, "inputs_embeds must have shape"),
        ({"input_ids": torch.ones(2, 0, dtype=torch.long)}, "empty"),
    ],
)
def test_bad_inputs_give_clear_errors(kwargs, message):
    model = LittleBirdModel(tiny_config(LittleBirdConfig)).eval()
    with pytest.raises(ValueError, match=message):
        model(**kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# A long real document
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_korquad_page_runs_end_to_end_at_full_length():
    """A KorQuAD 2.1 Wikipedia page (~10k characters) with its question, tokenized with bert-base-chinese's WordPiece
    vocabulary (Hangul is split into jamo), through the QA head at its full length, forward and backward."""
    document = json.loads((DATA_DIR / "qa" / "korquad2_sample" / "korquad2.1_dev_00.json").read_text())["data"][0]
    qa = document["qas"][0]
    tokenizer = transformers.BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-chinese")
    encoding = tokenizer(qa["question"], document["context"], return_offsets_mapping=True, return_tensors="pt")
    seq_len = encoding["input_ids"].shape[1]
    assert len(document["context"]) > 10_000 and seq_len > 10_000
    answer_start = qa["answer"]["answer_start"]
    answer_end = answer_start + len(qa["answer"]["text"])
    in_context = torch.tensor([sequence == 1 for sequence in encoding.sequence_ids()])
    offsets = encoding.pop("offset_mapping")[0]
    answer_tokens = torch.nonzero(in_context & (offsets[:, 0] < answer_end) & (offsets[:, 1] > answer_start))[:, 0]
    assert len(answer_tokens) > 0

    config = tiny_config(
        LittleBirdConfig, vocab_size=tokenizer.vocab_size, block_size=64, pack_length=64, hidden_size=64
    )
    torch.manual_seed(0)
    model = LittleBirdForQuestionAnswering(config).train()
    output = model(**encoding, start_positions=answer_tokens[:1], end_positions=answer_tokens[-1:])
    assert output.start_logits.shape == output.end_logits.shape == (1, seq_len)
    assert torch.isfinite(output.start_logits).all() and torch.isfinite(output.loss)
    output.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
