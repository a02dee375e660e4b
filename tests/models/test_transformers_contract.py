"""Three checks of transformers' common model tests (`tests/test_modeling_common.py` of transformers 5.23's sources:
`test_retain_grad_hidden_states_attentions`, `test_model_rope_scaling_from_config`,
`test_model_rope_scaling_frequencies`), restated for posformers' classes: the same inputs, the same procedure and the
same assertions, written here because transformers' test files are not part of its wheel.

DeBERTa and LittleBird have no rotary embedding: their configs have no `rope_parameters`, which is what makes the
upstream RoPE tests skip them (`_config_supports_rope_scaling`); the test below checks that premise.
"""

from __future__ import annotations

import pytest
import torch
from helpers.modeling import tiny_config

from posformers import (
    DebertaConfig,
    DebertaModel,
    LittleBirdConfig,
    LittleBirdModel,
    RoFormerConfig,
    RoFormerModel,
)
from posformers.modeling_roformer import RoFormerRotaryEmbedding

MODELS = {
    "roformer": (RoFormerConfig, RoFormerModel),
    "deberta": (DebertaConfig, DebertaModel),
    "littlebird": (LittleBirdConfig, LittleBirdModel),
}


def random_padding_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """transformers' testers' inputs: random ids and a random 0/1 attention mask (`random_attention_mask`: the last
    column is always 1), so rows hold padding anywhere; here the first column too, which LittleBird requires (its
    positions and blocks count from a real first token)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (3, 14), generator=generator)
    attention_mask = torch.randint(0, 2, (3, 14), generator=generator)
    attention_mask[:, [0, -1]] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def right_padded_batch(vocab_size: int) -> dict[str, torch.Tensor]:
    """A right-padded batch: the padding-free path packs it (output_attentions off)."""
    input_ids = torch.randint(1, vocab_size, (3, 14), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    attention_mask[2, 4:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    ("inputs", "output_attentions"),
    [(random_padding_batch, True), (right_padded_batch, False)],
    ids=["upstream-eager-random-mask", "padding-free"],
)
def test_retain_grad_hidden_states_attentions(name, inputs, output_attentions):
    """The returned hidden states (and attentions) are the tensors the model computed with: a gradient retained on
    the first of them arrives after a backward from the first output value, with padding in the batch, on the padded
    (eager, attentions returned) and on the padding-free path."""
    config_class, model_class = MODELS[name]
    config = tiny_config(config_class, output_hidden_states=True, output_attentions=output_attentions)
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation="eager")
    outputs = model(**inputs(config.vocab_size))
    hidden_states = outputs.hidden_states[0]
    hidden_states.retain_grad()
    if output_attentions:
        attentions = outputs.attentions[0]
        attentions.retain_grad()
    outputs[0].flatten()[0].backward(retain_graph=True)
    assert hidden_states.grad is not None
    if output_attentions:
        assert attentions.grad is not None


def set_rope_parameters(config: RoFormerConfig, parameters: dict) -> None:
    """transformers' `_set_config_rope_params`: the new keys update the config's dict, earlier keys stay."""
    config.rope_parameters = {**(config.rope_parameters or {}), **parameters}


@pytest.mark.parametrize("scaling_type", ["linear", "dynamic", "yarn"])
def test_model_rope_scaling_from_config(scaling_type):
    """A RoFormer built from a config with `original_max_position_embeddings` in a "default" rope_parameters (as
    transformers writes it), then with each scaling type: dynamic scaling leaves short inputs alone, linear and YaRN
    change them, and every type changes inputs 1.5 times longer than max_position_embeddings."""
    config = tiny_config(RoFormerConfig, max_position_embeddings=32)
    short_input = torch.randint(1, config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    long_input = torch.randint(1, config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1))

    def outputs(parameters: dict):
        set_rope_parameters(config, parameters)
        torch.manual_seed(42)  # the same random weights
        model = RoFormerModel(config).eval()
        with torch.no_grad():
            return model(short_input).last_hidden_state, model(long_input).last_hidden_state

    original = outputs({"rope_type": "default", "rope_theta": 10_000.0, "original_max_position_embeddings": 16384})
    scaled = outputs({"rope_type": scaling_type, "factor": 10.0, "rope_theta": 10_000.0})
    if scaling_type == "dynamic":
        torch.testing.assert_close(original[0], scaled[0], rtol=1e-5, atol=1e-5)
    else:
        assert not torch.allclose(original[0], scaled[0], atol=1e-5)
    assert not torch.allclose(original[1], scaled[1], atol=1e-5)


def test_model_rope_scaling_frequencies():
    """The rotary module called as transformers calls its own, `rope(x, position_ids)` -> (cos, sin): short positions
    read the long table's first rows; linear scaling maps position p to the original p / factor; dynamic NTK keeps
    short inputs and changes long ones, lowering `inv_freq`; YaRN changes every position."""
    config = tiny_config(RoFormerConfig, max_position_embeddings=32)
    model = RoFormerModel(config)
    (rope_class,) = {type(module) for name, module in model.named_modules() if "rotary_emb" in name}
    assert rope_class is RoFormerRotaryEmbedding
    factor, short_length, long_length = 10, 10, int(config.max_position_embeddings * 1.5)
    x = torch.randn(1, dtype=torch.float32)  # gives the dtype and device
    short_positions, long_positions = torch.arange(short_length)[None], torch.arange(long_length)[None]

    def rope(parameters: dict):
        set_rope_parameters(config, parameters)
        module = rope_class(config=config)
        return module, module(x, short_positions), module(x, long_positions)

    original, (cos_short, sin_short), (cos_long, sin_long) = rope({"rope_type": "default", "rope_theta": 10_000.0})
    assert cos_long.shape == (1, long_length, config.rope_dim) and cos_long.dtype == x.dtype
    torch.testing.assert_close(cos_short, cos_long[:, :short_length])
    torch.testing.assert_close(sin_short, sin_long[:, :short_length])

    _, (linear_cos_short, linear_sin_short), (linear_cos_long, linear_sin_long) = rope(
        {"rope_type": "linear", "factor": factor, "rope_theta": 10_000.0}
    )
    torch.testing.assert_close(linear_cos_short, linear_cos_long[:, :short_length])
    torch.testing.assert_close(linear_sin_short, linear_sin_long[:, :short_length])
    for position in range(0, long_length, factor):
        torch.testing.assert_close(linear_cos_long[:, position], cos_long[:, position // factor])
        torch.testing.assert_close(linear_sin_long[:, position], sin_long[:, position // factor])

    dynamic, (ntk_cos_short, ntk_sin_short), (ntk_cos_long, ntk_sin_long) = rope(
        {"rope_type": "dynamic", "factor": factor, "rope_theta": 10_000.0}
    )
    torch.testing.assert_close(ntk_cos_short, cos_short)
    torch.testing.assert_close(ntk_sin_short, sin_short)
    assert not torch.allclose(ntk_cos_long, cos_long) and not torch.allclose(ntk_sin_long, sin_long)
    assert (dynamic.inv_freq <= original.inv_freq * (1 + torch.finfo(torch.float32).eps)).all()
    assert (dynamic.inv_freq < original.inv_freq).any()

    _, (yarn_cos_short, yarn_sin_short), (yarn_cos_long, yarn_sin_long) = rope(
        {"rope_type": "yarn", "factor": factor, "rope_theta": 10_000.0}
    )
    torch.testing.assert_close(yarn_cos_short, yarn_cos_long[:, :short_length])
    torch.testing.assert_close(yarn_sin_short, yarn_sin_long[:, :short_length])
    for theirs, ours in ((cos_short, yarn_cos_short), (sin_short, yarn_sin_short), (cos_long, yarn_cos_long)):
        assert not torch.allclose(theirs, ours)
    assert not torch.allclose(sin_long, yarn_sin_long)


@pytest.mark.parametrize("config_class", [DebertaConfig, LittleBirdConfig])
def test_models_without_rotary_embeddings_have_no_rope_parameters(config_class):
    """The premise on which transformers' RoPE tests skip a model: no `rope_parameters` on its config."""
    assert not hasattr(tiny_config(config_class), "rope_parameters")
