"""LittleBird's own padding-free behaviour: length groups of different block layouts, position_ids read only as the
token indices, and right padding required in every mode (block 0 is global). What every model keeps (packed ==
padded for every head and case, flattened batches, what rules packing out, precision, compilation, checkpointing) is
in test_contracts.py."""

import pytest
import torch
from helpers.modeling import max_diff
from helpers.padding_free import TOLERANCE
from helpers.registry import REGISTRY

from posformers.configuration_common import UNPAD_MODES
from posformers.packing import pack_padded

BLOCK = 4  # the tiny config's block_size


def test_groups_of_different_widths_give_each_example_its_own_rows():
    """Lengths so far apart that the cost model attends them in separate groups (widths 44 and 4, not the batch's
    45), the rows in another order than the batch's: results and pack states still land on their own rows."""
    lengths, width = [2, 41, 3, 1], 45
    generator = torch.Generator().manual_seed(3)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids = torch.randint(1, 99, (len(lengths), width), generator=generator) * attention_mask
    token_type_ids = (torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None] // 3).long() * attention_mask
    model = REGISTRY["littlebird"].build("AutoModel")
    assert [group.width for group in pack_padded(attention_mask).groups(BLOCK)] == [44, 4]
    outputs = {}
    for mode in ("never", "always"):
        model.config.unpad_inputs = mode
        with torch.no_grad():
            outputs[mode] = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    assert max_diff(outputs["always"].last_hidden_state, outputs["never"].last_hidden_state, attention_mask) <= 1e-5
    assert max_diff(outputs["always"].pack_states, outputs["never"].pack_states) <= 1e-5
    # and each row is what the example gives alone (no padding, the padded path)
    for row, length in enumerate(lengths):
        with torch.no_grad():
            alone = model(input_ids[row : row + 1, :length], token_type_ids=token_type_ids[row : row + 1, :length])
        assert max_diff(outputs["always"].last_hidden_state[row, :length], alone.last_hidden_state[0]) <= TOLERANCE
        assert max_diff(outputs["always"].pack_states[row], alone.pack_states[0]) <= TOLERANCE


@pytest.mark.parametrize("mode", UNPAD_MODES)
def test_left_padding_is_refused_in_every_mode(mode):
    model = REGISTRY["littlebird"].build("AutoModel", unpad_inputs=mode)
    input_ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"right-padded input.*attention_mask"):
        model(input_ids, attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]))


def test_position_ids_must_count_tokens_or_mark_a_flattened_batch():
    model = REGISTRY["littlebird"].build("AutoModel")
    input_ids = torch.randint(1, 99, (2, 5), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        model(input_ids, attention_mask=attention_mask, position_ids=torch.arange(5)[None])
    with pytest.raises(ValueError, match="position_ids must be 0, 1, 2"):
        model(input_ids, attention_mask=attention_mask, position_ids=torch.arange(1, 6)[None])
    with pytest.raises(ValueError, match="position_ids of a flattened batch must count"):
        model(torch.ones(1, 5, dtype=torch.long), position_ids=torch.tensor([[0, 1, 0, 2, 3]]))
