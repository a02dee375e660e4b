"""RoFormer's own padding-free behaviour: the multiple-choice summary of each choice's last position, which exists on
the padded path only, and the decoder, which always runs padded. What every model keeps (packed == padded for every
head, case and RoFormer variant, flattened batches, what rules packing out, precision, compilation, checkpointing) is
in test_contracts.py."""

import pytest
import torch
from helpers.modeling import packing_calls, tiny_config
from helpers.padding_free import assert_same_pass, case_inputs, run_pass
from helpers.registry import CASES, REGISTRY

from posformers import RoFormerConfig, RoFormerForCausalLM, modeling_roformer


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("mode", ["auto", "always"])
@pytest.mark.parametrize("case", CASES)
def test_last_position_choice_runs_padded_where_that_position_is_padding(case, mode, training, monkeypatch):
    """summary_type="last" reads each choice's last position, padding included: "auto" runs a batch padded where a
    choice ends in padding, "always" refuses it; otherwise both pack and give the padded path's outputs and
    gradients."""
    auto_name = "AutoModelForMultipleChoice"
    model = REGISTRY["roformer"].build(auto_name, summary_type="last")
    inputs = case_inputs(auto_name, case)
    expected = run_pass(model, auto_name, inputs, "never", training)
    calls = packing_calls(monkeypatch, modeling_roformer)
    last_read_at_padding = not bool(inputs["attention_mask"][..., -1].all())
    if mode == "always" and last_read_at_padding:  # the padding token's state exists on the padded path only
        with pytest.raises(ValueError, match="keep_padding_states=True returns the states of padded positions"):
            run_pass(model, auto_name, inputs, mode, training)
        return
    assert_same_pass(run_pass(model, auto_name, inputs, mode, training), expected)
    padded = not bool(inputs["attention_mask"].all())
    assert (calls[-1] is not None) == (mode == "always" or (padded and not last_read_at_padding))


def test_decoder_runs_padded_in_auto(monkeypatch):
    calls = packing_calls(monkeypatch, modeling_roformer)
    decoder = REGISTRY["roformer"].build("AutoModelForCausalLM")
    inputs = case_inputs("AutoModelForCausalLM", "mixed-lengths", labels=False)
    with torch.no_grad():
        output = decoder(**inputs)
    assert all(plan is None for plan in calls)  # no packing planned
    assert output.logits.shape == (*inputs["input_ids"].shape, 99)


def test_decoder_heads_read_a_left_padded_row_as_their_base_model_does():
    """A decoder reads a left-padded row's position_ids, which restart at 0 after the padding as `generate` numbers
    them, as given and runs padded; its heads plan the same, not a flattened batch that the padding contradicts."""
    model = REGISTRY["roformer"].build("AutoModelForTokenClassification", is_decoder=True)
    input_ids = torch.arange(5, 13)[None]
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        alone = model(input_ids[:, 2:], position_ids=position_ids[:, 2:]).logits
    assert logits.shape == (1, 8, 5) and not logits[:, :2].any()
    torch.testing.assert_close(logits[:, 2:], alone)


def test_decoder_reads_restarting_position_ids_of_a_padded_row():
    """`generate` numbers a left-padded prompt 1, 1, 0, 1, 2: with padding in the mask that is no flattened batch."""
    model = RoFormerForCausalLM(tiny_config(RoFormerConfig, is_decoder=True)).eval()
    input_ids = torch.tensor([[0, 0, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    with torch.no_grad():
        output = model(input_ids, attention_mask=mask, position_ids=torch.tensor([[1, 1, 0, 1, 2]]))
    assert output.logits.shape == (1, 5, 99)
