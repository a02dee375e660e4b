"""The padding-free core shared by the three models (posformers/packing.py): packing, length groups, running per group
and the packing decision."""

import types

import pytest
import torch
import torch.nn.functional as F

from posformers import packing as packing_module
from posformers.packing import (
    attention_groups,
    is_right_padded,
    pack_flattened,
    pack_padded,
    plan_packing,
    run_in_groups,
)


def right_padded_mask(lengths, width) -> torch.Tensor:
    return (torch.arange(width) < torch.tensor(lengths)[:, None]).long()


def random_lengths(seed: int, rows: int = 7, width: int = 23) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (rows,), generator=generator).tolist()
    lengths[0] = width  # at least one full row, and (often) empty ones
    return lengths


def config(mode: str):
    return types.SimpleNamespace(unpad_inputs=mode)


# --- PackedBatch ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_pack_unpack_roundtrip(seed):
    lengths, width = random_lengths(seed), 23
    mask = right_padded_mask(lengths, width)
    packing = pack_padded(mask)
    grid = torch.randn(len(lengths), width, 5)
    packed = packing.pack(grid)
    assert packed.shape == (1, sum(lengths), 5)
    assert torch.equal(packed[0], grid[mask.bool()])  # row-major order of the real tokens
    restored = packing.unpack(packed, fill=-3.0)
    assert torch.equal(restored[mask.bool()], grid[mask.bool()])
    assert (restored[~mask.bool()] == -3.0).all()
    assert torch.equal(packing.restore(packed), packing.unpack(packed))
    assert packing.cu_seqlens.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert packing.position_ids()[0].tolist() == [p for n in lengths for p in range(n)]


def test_unpack_is_differentiable_and_first_tokens_read_each_sequence_start():
    mask = right_padded_mask([3, 0, 2], 4)
    packing = pack_padded(mask)
    packed = torch.randn(1, 5, 2, requires_grad=True)
    packing.unpack(packed).sum().backward()
    assert torch.equal(packed.grad, torch.ones_like(packed))
    first = packing.first_tokens(packed)
    assert first.shape == (3, 2)
    assert torch.equal(first[0], packed[0, 0]) and torch.equal(first[2], packed[0, 3])
    assert (first[1] == 0).all()


def test_pack_flattened_reads_sequences_from_position_ids():
    position_ids = torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3]])
    packing = pack_flattened(position_ids)
    assert packing.flattened and packing.lengths == [3, 1, 4] and packing.width == 4
    assert packing.cu_seqlens.tolist() == [0, 3, 4, 8]
    assert torch.equal(packing.position_ids(), position_ids)
    tokens = torch.randn(1, 8, 3)
    assert packing.pack(tokens) is tokens and packing.restore(tokens) is tokens
    per_sequence = packing.unpack(tokens)
    assert per_sequence.shape == (3, 4, 3)
    assert torch.equal(per_sequence[2], tokens[0, 4:]) and (per_sequence[1, 1:] == 0).all()
    assert torch.equal(packing.first_tokens(tokens), tokens[0, [0, 3, 4]])
    kwargs = packing.varlen_kwargs()
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == 4
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 3, 4, 8]


def test_pack_flattened_refuses_contradictions():
    with pytest.raises(ValueError, match="must count 0, 1, 2"):
        pack_flattened(torch.tensor([[0, 1, 3, 0, 1]]))
    with pytest.raises(ValueError, match="must start at 0"):
        pack_flattened(torch.tensor([[1, 2, 0, 1]]))
    with pytest.raises(ValueError, match="attention_mask marks padding"):
        pack_flattened(torch.tensor([[0, 1, 0, 1]]), attention_mask=torch.tensor([[1, 1, 1, 0]]))
    with pytest.raises(ValueError, match="cu_seq_lens_q/cu_seq_lens_k"):
        pack_flattened(torch.tensor([[0, 1, 0, 1]]), cu_seq_lens=torch.tensor([0, 1, 4]))


def test_is_right_padded():
    assert is_right_padded(right_padded_mask([3, 0, 4], 4))
    assert not is_right_padded(torch.tensor([[0, 1, 1]]))  # left padding
    assert not is_right_padded(torch.tensor([[1, 0, 1]]))  # a hole


# --- Length groups and running per group -----------------------------------------------------------------------------


@pytest.mark.parametrize("multiple_of", [1, 4])
@pytest.mark.parametrize("overhead", [0, 4096, 10**12])
@pytest.mark.parametrize("seed", range(4))
def test_groups_cover_every_token_exactly_once(seed, overhead, multiple_of, monkeypatch):
    monkeypatch.setattr(packing_module, "GROUP_OVERHEAD", {"cpu": overhead})
    lengths = random_lengths(seed)
    packing = pack_padded(right_padded_mask(lengths, 23))
    groups = attention_groups(packing, multiple_of)
    if overhead == 10**12:
        assert len(groups) == 1
    if overhead == 0:  # free groups: no row padded beyond the next multiple of the block
        assert all(g.width == -(-int(g.key_mask.sum(-1).max()) // multiple_of) * multiple_of for g in groups)
    tokens = torch.cat([g.tokens for g in groups])
    assert sorted(tokens.tolist()) == list(range(sum(lengths)))
    assert sum(g.rows for g in groups) == sum(n > 0 for n in lengths)
    for group in groups:
        assert group.width % multiple_of == 0
        assert group.gather.shape == (group.rows * group.width,)
        assert torch.equal(group.gather[group.slots], group.tokens)
        assert int(group.key_mask.sum()) == group.tokens.numel()
        # each row of a group is one sequence, its tokens in order
        sequence_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        rows = group.gather.view(group.rows, group.width)
        for row, real in zip(rows, group.key_mask):
            assert sequence_of[row[real]].unique().numel() == 1
            assert torch.equal(row[real], torch.arange(int(row[0]), int(row[0]) + int(real.sum())))


def sdpa_attend(group, query, key, value):
    """(rows, width, H, D) each -> (rows, width, H, D), keys masked by the group's key mask."""
    output = F.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=group.key_mask[:, None, None]
    )
    return output.transpose(1, 2)


@pytest.mark.parametrize("overhead", [0, 10**12], ids=["many-groups", "one-group"])
def test_attention_run_in_groups_equals_the_padded_computation(overhead, monkeypatch):
    monkeypatch.setattr(packing_module, "GROUP_OVERHEAD", {"cpu": overhead})
    lengths, width = [11, 3, 0, 7, 11, 1], 11
    mask = right_padded_mask(lengths, width)
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(len(lengths), width, 2, 4, generator=generator) for _ in range(3))
    # padded computation: keys masked per row (a row of padding attends uniformly; it has no real token to compare)
    expected = F.scaled_dot_product_attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        attn_mask=mask.bool()[:, None, None] | (mask.sum(-1) == 0)[:, None, None, None],
    ).transpose(1, 2)
    packing = pack_padded(mask)
    actual = run_in_groups(packing, sdpa_attend, *(packing.pack(t) for t in (query, key, value)))
    assert actual.shape == (1, sum(lengths), 2, 4)
    assert (actual[0] - expected[mask.bool()]).abs().max() <= 1e-6
    assert (len(packing.groups()) == 1) == (overhead == 10**12)
    assert packing.groups() is packing.groups(1) and packing.groups(4) is packing.groups(4)  # built once per pass


def test_run_in_groups_of_a_batch_of_padding_is_empty():
    packing = pack_padded(torch.zeros(2, 3, dtype=torch.long))
    output = run_in_groups(packing, sdpa_attend, *(torch.zeros(1, 0, 2, 4) for _ in range(3)))
    assert output.shape == (1, 0, 2, 4)


# --- The decision ----------------------------------------------------------------------------------------------------


def test_plan_packing_never_keeps_padded_batches_padded():
    mask = right_padded_mask([4, 2], 4)
    assert plan_packing(config("never"), (2, 4), mask, None) is None


def test_plan_packing_auto_packs_only_padding_nothing_blocks():
    mask = right_padded_mask([4, 2], 4)
    packed = plan_packing(config("auto"), (2, 4), mask, None)
    assert packed is not None and packed.lengths == [4, 2] and not packed.flattened
    assert plan_packing(config("auto"), (2, 4), torch.ones(2, 4), None) is None  # no padding: no gather
    assert plan_packing(config("auto"), (2, 4), None, None) is None
    assert plan_packing(config("auto"), (2, 4), mask, None, blocker="output_attentions=True") is None
    assert plan_packing(config("auto"), (2, 4), mask.flip(-1), None) is None  # left padding
    assert plan_packing(config("auto"), (2, 4), mask[:, None, None].expand(2, 1, 4, 4), None) is None


def test_plan_packing_always_packs_every_pass_or_says_why_not():
    mask = right_padded_mask([4, 2], 4)
    assert plan_packing(config("always"), (2, 4), mask, None).lengths == [4, 2]
    assert plan_packing(config("always"), (2, 4), None, None).lengths == [4, 4]
    assert plan_packing(config("always"), (2, 4), torch.ones(2, 4), None).lengths == [4, 4]
    with pytest.raises(ValueError, match="output_attentions"):
        plan_packing(config("always"), (2, 4), mask, None, blocker="output_attentions=True")
    with pytest.raises(ValueError, match="attention_mask is not right-padded"):
        plan_packing(config("always"), (2, 4), mask.flip(-1), None)
    with pytest.raises(ValueError, match="4D attention_mask"):
        plan_packing(config("always"), (2, 4), mask[:, None, None].expand(2, 1, 4, 4), None)


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_plan_packing_always_packs_a_flattened_batch(mode):
    position_ids = torch.tensor([[0, 1, 2, 0, 1]])
    packed = plan_packing(config(mode), (1, 5), None, position_ids)
    assert packed.flattened and packed.lengths == [3, 2]
    packed = plan_packing(config(mode), (1, 5), None, position_ids, cu_seq_lens=torch.tensor([0, 3, 5]))
    assert packed.lengths == [3, 2]
    with pytest.raises(ValueError, match="position_ids restart at 0"):
        plan_packing(config(mode), (1, 5), None, position_ids, blocker="a KV cache")
    with pytest.raises(ValueError, match="pass its position_ids"):
        plan_packing(config(mode), (1, 5), None, None, cu_seq_lens=torch.tensor([0, 3, 5]))
    # one sequence numbered 0..L-1 is an ordinary batch of one
    single = plan_packing(config(mode), (1, 5), None, torch.arange(5)[None])
    if mode == "always":
        assert not single.flattened and single.lengths == [5]
    else:
        assert single is None
