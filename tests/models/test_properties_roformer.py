"""Property-based tests (hypothesis) of what RoFormer alone has: rotary positions (outputs do not change when every
position shifts), flex_attention, the decoder's cache, and its own config fields and inputs. Configs and batches are
drawn by tests/helpers/strategies.py over every option the config exposes; what every model keeps (each sequence as
alone on every backend, inputs_embeds, padding-free gradients, invalid inputs and shared fields refused) is in
test_contract_properties.py.

Invalid configs change one RoFormer field of a valid draw and must raise a ValueError or TypeError naming it.

Tolerance: float32 throughout; backends and packing only reorder sums and LayerNorm/RMS norm may amplify by the
inverse of a small standard deviation. Measured over every example: at most 4e-6 between backends and paths, 1.1e-5
with positions shifted by up to 300 (float32 cos/sin of larger angles). TOLERANCE = 1e-4 leaves a 9x margin; a wrong
mask, position or rotation moves outputs by O(0.1).
"""

import math

import pytest
import torch
from helpers.modeling import tiny_fields
from helpers.properties import examples, one_thread  # noqa: F401 (one_thread: an autouse fixture)
from helpers.strategies import dynamic_scaling, roformer_batches, roformer_fields, run
from hypothesis import given
from hypothesis import strategies as st

from posformers.configuration_roformer import RoFormerConfig
from posformers.modeling_roformer import RoFormerForCausalLM, RoFormerForMaskedLM, RoFormerModel

TOLERANCE = 1e-4


def build(fields: dict, model_class=RoFormerModel):
    torch.manual_seed(0)
    return model_class(RoFormerConfig(**fields)).eval()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, scale: float = 1.0) -> None:
    """At most TOLERANCE apart, times `scale` for quantities larger than the O(1) normalised states."""
    assert actual.shape == expected.shape, what
    diff = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert diff <= TOLERANCE * scale, f"{what}: max abs diff {diff}"


# ---------------------------------------------------------------------------------------------------------------------
# Valid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def flex_cases(draw):
    """Encoder cases with 2 heads of 8 features: every other option varies, but a new head shape would compile a
    new flex kernel (tens of seconds on a CPU)."""
    fields = draw(roformer_fields())
    if fields["hidden_size"] != 16 or fields["num_attention_heads"] != 2:
        fields.update(hidden_size=16, num_attention_heads=2, rotary_dim=None, partial_rotary_factor=None)
    return fields, draw(roformer_batches(fields))


@pytest.mark.slow
@examples(10)
@given(case=flex_cases())
def test_flex_attention_equals_eager(case):
    """flex_attention (inference only on CPU: torch has no CPU backward for it) gives eager's outputs at real tokens,
    padded and padding-free."""
    fields, batch = case
    model = build(fields)
    mask = batch["attention_mask"].bool()
    expected = run(model, "eager", "never", **batch).last_hidden_state
    for unpad_inputs in ("never", "always"):
        output = run(model, "flex_attention", unpad_inputs, **batch).last_hidden_state
        assert torch.isfinite(output[mask]).all(), unpad_inputs
        assert_close(output[mask], expected[mask], f"flex_attention, unpad_inputs={unpad_inputs}")


@st.composite
def shift_cases(draw):
    fields = draw(roformer_fields())
    fields["rotary_value"] = False  # rotated values carry absolute positions
    if dynamic_scaling(fields):
        # the dynamic base depends on the largest position
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": fields["rope_parameters"]["rope_theta"]}
    return fields, draw(roformer_batches(fields)), draw(st.integers(-50, 300))


@examples(120)
@given(case=shift_cases())
def test_outputs_do_not_change_when_every_position_shifts(case):
    """Rotary attention scores depend only on the distance between positions, so position_ids shifted by a constant
    (negative, or past the cached table of max_position_embeddings) give the outputs of the default positions."""
    fields, batch, shift = case
    model = build(fields)
    mask = batch["attention_mask"].bool()
    expected = run(model, "sdpa", "never", **batch).last_hidden_state
    positions = torch.arange(batch["input_ids"].shape[1]) + shift
    for unpad_inputs in ("never", "always"):
        for position_ids in (positions[None], positions.expand_as(batch["input_ids"])):
            output = run(model, "sdpa", unpad_inputs, position_ids=position_ids, **batch).last_hidden_state
            assert_close(output[mask], expected[mask], f"shift {shift}, unpad_inputs={unpad_inputs}")


@st.composite
def decoder_cases(draw):
    fields = draw(roformer_fields(decoder=True))
    fields["add_pooling_layer"] = False
    if fields["norm_type"] == "rms_norm":
        fields.pop("embedding_size", None)  # RoFormer-v2's LM head needs embedding_size == hidden_size
    length = draw(st.integers(2, fields["max_position_embeddings"] + 6))
    prefix = draw(st.integers(1, length - 1))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    input_ids = torch.randint(0, fields["vocab_size"], (draw(st.integers(1, 3)), length), generator=generator)
    return fields, input_ids, prefix


@examples(100)
@given(case=decoder_cases())
def test_decoder_cache_and_backends_agree_with_a_full_pass(case):
    """A causal LM: eager and sdpa agree, with and without a cache, and continuing from the cache of a prefix gives
    the logits of one causal pass over the whole sequence. With bidirectional_prompt a pass without a cache reads its
    tokens bidirectionally, so there only the backends are compared (and so where dynamic NTK scaling changes the
    base between the prefix and the whole sequence)."""
    fields, input_ids, prefix = case
    model = build(fields, RoFormerForCausalLM)
    full = run(model, "eager", "never", input_ids=input_ids).logits
    assert torch.isfinite(full).all()
    assert_close(run(model, "sdpa", "never", input_ids=input_ids).logits, full, "sdpa vs eager")
    continuations = {}
    for implementation in ("eager", "sdpa"):
        first = run(model, implementation, "never", input_ids=input_ids[:, :prefix], use_cache=True)
        cache = first.past_key_values
        rest = run(
            model, implementation, "never", input_ids=input_ids[:, prefix:], past_key_values=cache, use_cache=True
        )
        continuations[implementation] = rest.logits
        assert torch.isfinite(rest.logits).all(), implementation
        # Dynamic NTK scaling rotates every position differently once the sequence outgrows the table, so a prefix
        # that fits it reads differently from the whole (as in transformers).
        outgrown = dynamic_scaling(fields) and input_ids.shape[1] > fields["max_position_embeddings"]
        if not fields["bidirectional_prompt"] and not outgrown:
            assert_close(first.logits, full[:, :prefix], f"{implementation}, prefix")
            assert_close(rest.logits, full[:, prefix:], f"{implementation}, continuation")
    assert_close(continuations["sdpa"], continuations["eager"], "continuation, sdpa vs eager")


# ---------------------------------------------------------------------------------------------------------------------
# Invalid configs: one of RoFormer's own fields broken, an error naming it
# ---------------------------------------------------------------------------------------------------------------------

NOT_INTEGERS = [0, -3, 2.5, "8", True, None]
NOT_POSITIVE_NUMBERS = [0, -1.0, "1e4", None, math.nan, math.inf, True]
NOT_BOOLEANS = ["yes", 1, None]
NOT_NAMES = ["bogus", None, 3]


@st.composite
def broken_rope_parameters(draw, fields: dict):
    """A rope_parameters that a valid config with `fields` cannot take."""
    factor = {"factor": 2.0}
    return draw(
        st.sampled_from(
            [
                "linear",
                [("rope_type", "linear")],
                {"rope_type": "bogus", **factor},
                {"rope_type": "linear"},
                {"rope_type": "linear", "factor": 0.5},
                {"rope_type": "linear", "factor": "2"},
                {"rope_type": "linear", "factor": math.nan},
                {"rope_type": "linear", "factor": math.inf},
                {"rope_type": "dynamic", "factor": True},
                {"rope_type": "linear", "beta_fast": 32, **factor},
                {"rope_type": "yarn", "original_max_position_embeddings": 0, **factor},
                {"rope_type": "yarn", "original_max_position_embeddings": True, **factor},
                {"rope_type": "yarn", "original_max_position_embeddings": 8.0, **factor},
                {"rope_type": "yarn", "beta_fast": 1.0, "beta_slow": 4.0, **factor},
                {"rope_type": "yarn", "beta_fast": "32", **factor},
                {"rope_type": "yarn", "beta_fast": -5.0, "beta_slow": -10.0, **factor},
                {"rope_type": "yarn", "beta_slow": math.nan, **factor},
                {"rope_type": "yarn", "attention_factor": 0.0, **factor},
                {"rope_type": "yarn", "attention_factor": "1", **factor},
                {"rope_type": "yarn", "mscale": "1", "mscale_all_dim": 1.0, **factor},
                {"rope_type": "yarn", "mscale": -1.0, **factor},
                {"rope_type": "yarn", "mscale_all_dim": math.inf, **factor},
                {"rope_type": "yarn", "truncate": "no", **factor},
                *({"rope_type": "default", "rope_theta": theta} for theta in NOT_POSITIVE_NUMBERS),
            ]
        )
    )


@st.composite
def invalid_configs(draw):
    """(valid fields, the field to break, its bad value): every checked field of RoFormer's own (the fields every
    config has: test_contract_properties.py)."""
    fields = draw(roformer_fields())
    head_dim = fields["hidden_size"] // fields["num_attention_heads"]
    choices = {
        "max_position_embeddings": st.sampled_from(NOT_INTEGERS),
        "embedding_size": st.sampled_from([value for value in NOT_INTEGERS if value is not None]),
        "rotary_dim": st.sampled_from([0, -2, 2.0, "2", True, head_dim + 1 + head_dim % 2, 2 * head_dim + 2]),
        "partial_rotary_factor": st.sampled_from([0.0, -0.5, 1.5, "0.5", math.nan, True]),
        "rope_parameters": broken_rope_parameters(fields),
        **{
            name: st.sampled_from(NOT_NAMES)
            for name in ("rope_layout", "norm_type", "attention_kernel", "summary_type", "pooler_activation")
        },
        **{
            name: st.sampled_from(NOT_BOOLEANS)
            for name in ("use_bias", "rotary_value", "add_pooling_layer", "bidirectional_prompt")
        },
        "add_cross_attention": st.just(True),
    }
    name = draw(st.sampled_from(sorted(choices)))
    value = draw(choices[name])
    if name == "rotary_dim":
        fields.pop("partial_rotary_factor", None)
    if name == "partial_rotary_factor" and head_dim % 2 == 0:
        fields.pop("rotary_dim", None)  # an odd head needs its even rotary_dim (which a bad factor then contradicts)
    return fields, name, value


@examples(150)
@given(case=invalid_configs())
def test_invalid_config_field_is_refused_by_name(case):
    """A bad value is refused with a ValueError or TypeError naming the field, given to the constructor and set on a
    valid config before a model is built from it (fields may change in between)."""
    fields, name, value = case
    with pytest.raises((ValueError, TypeError), match=rf"\b{name}\b"):
        RoFormerConfig(**{**fields, name: value})
    config = RoFormerConfig(**fields)
    setattr(config, name, value)
    with pytest.raises((ValueError, TypeError), match=rf"\b{name}\b"):
        RoFormerModel(config)


# ---------------------------------------------------------------------------------------------------------------------
# Regressions: the bugs the properties above found, each pinned by one example
# ---------------------------------------------------------------------------------------------------------------------


def regression_fields(**overrides) -> dict:
    """The shared tiny RoFormer (hidden 32, 4 heads) with a table of 8 positions and weights large enough that a
    wrong rotation moves outputs far past TOLERANCE."""
    return {**tiny_fields("posformers-roformer"), "max_position_embeddings": 8, "initializer_range": 0.5, **overrides}


@pytest.mark.parametrize("start", [100, -3], ids=["past-the-table", "negative"])
def test_position_ids_outside_the_cached_table_are_rotated(start):
    """position_ids past max_position_embeddings on a short input used to index the cached table (IndexError), and
    negative ones silently wrapped to its end; now they rotate as positions, so a constant shift changes nothing."""
    model = build(regression_fields())
    input_ids = torch.randint(1, 99, (2, 5), generator=torch.Generator().manual_seed(0))
    expected = run(model, "sdpa", "never", input_ids=input_ids).last_hidden_state
    position_ids = torch.arange(start, start + 5)[None]
    actual = run(model, "sdpa", "never", input_ids=input_ids, position_ids=position_ids).last_hidden_state
    assert_close(actual, expected, f"positions from {start}")


@pytest.mark.parametrize("unpad_inputs", ["never", "always"])
def test_one_padded_row_with_positions_counting_through_zero_is_not_a_flattened_batch(unpad_inputs):
    """position_ids -5, -4, ..., 2 on one padded row were read as a flattened batch (a 0 after the first token) and
    refused for its padding; a flattened batch restarts at 0, it does not count up through it."""
    model = build(regression_fields())
    input_ids = torch.randint(1, 99, (1, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 5 + [0] * 3])
    expected = run(model, "sdpa", unpad_inputs, input_ids=input_ids, attention_mask=mask).last_hidden_state
    position_ids = torch.arange(-5, 3)[None]
    actual = run(model, "sdpa", unpad_inputs, input_ids=input_ids, attention_mask=mask, position_ids=position_ids)
    assert_close(actual.last_hidden_state[:, :5], expected[:, :5], "positions from -5")


@pytest.mark.parametrize("unpad_inputs", ["never", "always"])
@pytest.mark.parametrize(("length", "padding"), [(12, 5), (6, 4)], ids=["past-the-table", "padding-past-the-table"])
def test_dynamic_ntk_scaling_does_not_depend_on_padding(length, padding, unpad_inputs):
    """Dynamic NTK scaling sized its base for the padded width: 5 padding columns after 12 real tokens (past
    max_position_embeddings=8) changed every real token's output by ~0.2. It now reads the longest real sequence,
    while padded positions past the table (6 real tokens padded to 10) are still computed, not looked up."""
    model = build(regression_fields(rope_parameters={"rope_type": "dynamic", "factor": 4.0}))
    input_ids = torch.randint(1, 99, (1, length), generator=torch.Generator().manual_seed(0))
    expected = run(model, "eager", "never", input_ids=input_ids).last_hidden_state
    padded = torch.nn.functional.pad(input_ids, (0, padding))
    mask = (padded != 0).long()
    actual = run(model, "eager", unpad_inputs, input_ids=padded, attention_mask=mask).last_hidden_state
    assert_close(actual[:, :length], expected, "padded")


def test_rms_norm_lm_head_with_factorised_embeddings_is_refused():
    """RoFormer-v2's LM head is the tied word embeddings alone: with embedding_size != hidden_size it failed at the
    first forward pass with a shape error from inside F.linear."""
    config = RoFormerConfig(**regression_fields(norm_type="rms_norm", embedding_size=8))
    with pytest.raises(ValueError, match=r"RoFormerConfig\.embedding_size \(8\) must equal hidden_size \(32\)"):
        RoFormerForMaskedLM(config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # bare TypeErrors from a comparison or math.log, naming nothing
        (
            {"rope_parameters": {"rope_theta": "1e4"}},
            r"RoFormerConfig\.rope_parameters\['rope_theta'\] must be positive",
        ),
        ({"partial_rotary_factor": "0.5"}, r"RoFormerConfig\.partial_rotary_factor must be in \(0, 1\]"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_fast": "32"}},
            r"rope_parameters\['beta_fast'\]",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mscale": "1"}}, r"rope_parameters\['mscale'\]"),
        # "math domain error" from inside the YaRN ramp
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_slow": -1.0}},
            r"rope_parameters\['beta_slow'\]",
        ),
        # accepted, then NaN in every output
        ({"rope_parameters": {"rope_theta": math.nan}}, r"rope_parameters\['rope_theta'\] must be positive"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": math.nan}},
            r"rope_parameters\['factor'\] must be a number",
        ),
        # accepted silently
        ({"use_bias": "no"}, r"RoFormerConfig\.use_bias must be True or False"),
        ({"rotary_value": 1}, r"RoFormerConfig\.rotary_value must be True or False"),
        ({"partial_rotary_factor": True}, r"RoFormerConfig\.partial_rotary_factor must be in"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "attention_factor": -1.0}}, r"'attention_factor'\]"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "truncate": "no"}}, r"rope_parameters\['truncate'\]"),
    ],
)
def test_config_values_that_used_to_fail_late_or_silently_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        RoFormerConfig(**regression_fields(**overrides))


IDS = torch.ones(2, 5, dtype=torch.long)


@pytest.mark.parametrize(
    ("attention_mask", "message"),
    [
        # errors from inside sdpa
        (torch.ones(2, 1, 5, 4), r"a 4D attention_mask must have shape"),
        (torch.ones(3, 1, 5, 5), r"a 4D attention_mask must have shape"),
        (torch.ones(2, 1, 5, 6), r"kv_len=5\), got \(2, 1, 5, 6\)"),
    ],
)
def test_four_dimensional_masks_that_used_to_fail_inside_torch_are_refused_by_name(attention_mask, message):
    model = build(regression_fields())
    with pytest.raises(ValueError, match=message):
        model(input_ids=IDS, attention_mask=attention_mask)
