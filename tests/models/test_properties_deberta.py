"""Property-based tests (hypothesis) of what DeBERTa alone has: the multiple-choice head per choice, the (B, L, L)
mask, the fused FlexAttention kernel's score_mod, and its own config fields. Configs and batches are drawn by
tests/helpers/strategies.py over every option the config exposes (relative attention, position buckets, pos_att_type
in every spelling, the v1/v2/v3 layouts, the convolution, the Enhanced Mask Decoder, ...); what every model keeps
(each sequence as alone on every backend, flattened batches, inputs_embeds, padding-free gradients, invalid inputs
and shared fields refused) is in test_contract_properties.py.

The reference is never the output under test itself: each sequence run alone without padding is what every backend
must give at its real tokens.

Tolerance: float32 throughout. The backends and the packing only reorder sums (at most 32-term dot products and
softmaxes over at most ~30 keys here), and the LayerNorms may amplify by the inverse of a small standard deviation;
the largest difference observed over every example is 1.4e-5, so TOLERANCE = 1e-4 leaves a 7x margin. One padding
token left visible moves the real tokens of the smallest model by 5e-4 with the smallest weights drawn
(initializer_range 0.02; `test_tolerance_detects_an_unmasked_padding_token`), by 0.07 and 1.1 with the larger ones
the strategies also draw (0.2, 0.5).
"""

import warnings

import pytest
import torch
from helpers.properties import examples, one_thread  # noqa: F401 (one_thread: an autouse fixture)
from helpers.registry import per_token
from helpers.strategies import build_model, deberta_batches, deberta_cases, deberta_fields, row, run
from hypothesis import given
from hypothesis import strategies as st

from posformers import DebertaConfig, DebertaForMultipleChoice, DebertaModel

TOLERANCE = 1e-4


def build(head: str, fields: dict):
    return build_model("deberta", fields, auto_name=head)


def outputs(model, implementation: str, unpad_inputs: str, **inputs) -> dict[str, torch.Tensor]:
    """The tensor outputs of one pass, without gradients."""
    output = run(model, implementation, unpad_inputs, **inputs)
    return {key: value for key, value in output.items() if isinstance(value, torch.Tensor)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, what
    diff = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert diff <= TOLERANCE, f"{what}: max abs diff {diff}"


def alone_outputs(model, batch: dict) -> list[dict | None]:
    """Each row's outputs run alone without padding (padded path, eager): the reference; None for an empty row."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    return [outputs(model, "eager", "never", **row(batch, i, n)) if n else None for i, n in enumerate(lengths)]


def check_against_alone(head: str, results: dict, expected: list, batch: dict, what: str) -> None:
    """Every output is finite (padding and fully padded rows included) and, at each row's real tokens (per-row
    outputs: on rows with a real token), equals the row run alone."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    for key, value in results.items():
        assert torch.isfinite(value).all(), f"{what}: {key} is not finite"
        for i, n in enumerate(lengths):
            if not n:
                continue
            actual = value[i, :n] if per_token(head, key) else value[i]
            assert_close(actual, expected[i][key][0], f"{what}: {key}, row {i} of length {n}")


# ---------------------------------------------------------------------------------------------------------------------
# Valid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def choice_cases(draw):
    """Fields, and a batch of `examples x choices` rows with every input per row, for the multiple-choice head."""
    fields = draw(deberta_fields("AutoModelForMultipleChoice"))
    examples_, choices = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    rows = examples_ * choices
    batch = draw(deberta_batches(fields, "AutoModelForMultipleChoice", rows=(rows, rows)))
    width = batch["attention_mask"].shape[1]
    return fields, {key: value.expand(rows, width, *value.shape[2:]) for key, value in batch.items()}, choices


@examples(30)
@given(case=choice_cases())
def test_multiple_choice_equals_each_choice_alone(case):
    """(examples, choices, L) inputs: each choice's logit is what the choice alone gives (choices with a real token),
    on eager and sdpa, padded and padding-free."""
    fields, batch, choices = case
    torch.manual_seed(0)
    model = DebertaForMultipleChoice(DebertaConfig(**fields)).eval()
    lengths = batch["attention_mask"].sum(-1).tolist()
    expected = []
    for i, n in enumerate(lengths):  # each choice alone: one example of one choice, (1, 1, n)
        alone = {key: value[None] for key, value in row(batch, i, n).items()}
        expected.append(outputs(model, "eager", "never", **alone)["logits"][0] if n else None)
    grouped = {key: value.unflatten(0, (-1, choices)) for key, value in batch.items()}
    for implementation in ("eager", "sdpa"):
        for unpad_inputs in ("never", "always"):
            logits = outputs(model, implementation, unpad_inputs, **grouped)["logits"].flatten()
            assert torch.isfinite(logits).all()
            for i, n in enumerate(lengths):
                if n:
                    what = f"{implementation}, unpad_inputs={unpad_inputs}, choice row {i}"
                    assert_close(logits[i : i + 1], expected[i], what)


@examples(40)
@given(case=deberta_cases())
def test_a_3d_mask_equals_the_2d_mask(case):
    """A (B, L, L) mask whose every query row is the 2D key mask (which runs padded) gives the outputs of the 2D mask,
    padded and padding-free."""
    head, batch = case.auto_name, case.batch
    model = build(head, case.fields)
    mask = batch["attention_mask"].bool()
    square = {**batch, "attention_mask": batch["attention_mask"][:, None, :].expand(-1, mask.shape[1], -1)}
    square_outputs = outputs(model, "sdpa", "auto", **square)
    for unpad_inputs in ("never", "always"):
        expected = outputs(model, "sdpa", unpad_inputs, **batch)
        for key, value in expected.items():
            keep = mask if per_token(head, key) else mask.any(-1)
            assert_close(square_outputs[key][keep], value[keep], f"3D mask against unpad_inputs={unpad_inputs}: {key}")


@st.composite
def fused_cases(draw):
    """A config for the base model or the MLM head, and several batches for it."""
    case = draw(deberta_cases(heads=("AutoModel", "AutoModelForMaskedLM")))
    more = draw(st.lists(deberta_batches(case.fields, case.auto_name), min_size=1, max_size=3))
    return case.auto_name, case.fields, [case.batch, *more]


def check_fused_attention(head: str, fields: dict, batches_: list) -> None:
    model = build(head, fields)
    for batch in batches_:
        expected = alone_outputs(model, batch)
        for unpad_inputs in ("never", "always"):
            results = outputs(model, "posformers_fused", unpad_inputs, **batch)
            check_against_alone(head, results, expected, batch, f"posformers_fused, unpad_inputs={unpad_inputs}")


@examples(12)
@given(case=fused_cases())
def test_fused_attention_score_mod_equals_each_sequence_alone(case):
    """The fused kernel's logic ("posformers_fused": the position scores read from the small
    tables inside FlexAttention's score_mod, key padding and packed sequences as block masks), padded and
    padding-free, gives every real token what its sequence alone gives. Run uncompiled (torch's reference
    FlexAttention on a materialised score matrix, the same score_mod and block masks): compiling costs 10-20 s per
    config and batch shape here. The kernel is compared with the others in test_fused_attention.py."""
    with torch.compiler.set_stance("force_eager"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        check_fused_attention(*case)


# The smallest model the strategies draw (hidden 4, one head and layer), for the tests of one case.
SMALLEST = dict(
    vocab_size=5, hidden_size=4, num_hidden_layers=1, num_attention_heads=1, intermediate_size=1, position_buckets=-1
)


def test_tolerance_detects_an_unmasked_padding_token():
    """The comparisons can fail: one padding token left visible to attention moves real tokens far beyond TOLERANCE
    (for the smallest model and weights the strategies draw)."""
    model = build("AutoModel", {**SMALLEST, "max_position_embeddings": 8, "initializer_range": 0.02})
    input_ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 1, 0]])
    expected = alone_outputs(model, {"input_ids": input_ids, "attention_mask": mask})
    leaked = outputs(model, "eager", "never", input_ids=input_ids, attention_mask=torch.ones_like(mask))
    with pytest.raises(AssertionError, match="max abs diff"):
        check_against_alone("AutoModel", leaked, expected, {"input_ids": input_ids, "attention_mask": mask}, "leak")


def test_set_attn_implementation_switches_the_kernel(monkeypatch):
    """Regression: transformers guesses from a module's source whether its attention kernel can be switched, and
    guessed wrong for DeBERTa, so `set_attn_implementation` only warned and every pass stayed on sdpa (the eager and
    fused comparisons above compared sdpa with itself)."""
    import posformers.deberta_kernels as kernels

    calls = []
    eager = kernels.ATTENTION_KERNELS["eager"]
    monkeypatch.setitem(
        kernels.ATTENTION_KERNELS, "eager", lambda *args, **kwargs: calls.append(1) or eager(*args, **kwargs)
    )
    model = build("AutoModel", SMALLEST)
    for implementation in ("eager", "posformers_fused", "sdpa"):
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
    outputs(model, "eager", "never", input_ids=torch.tensor([[1, 2, 3]]))
    assert calls, "set_attn_implementation('eager') left the model on another kernel"


# ---------------------------------------------------------------------------------------------------------------------
# Invalid configs: one of DeBERTa's own fields broken, an error naming it
# ---------------------------------------------------------------------------------------------------------------------

NOT_INTEGERS = st.sampled_from([1.5, "8", True, None, [4]])
NOT_PROBABILITIES = st.sampled_from([-0.1, 1.0, 1.5, "0.1", True, None])
NOT_ACTIVATIONS = st.sampled_from(["no_such_act", 3, None, ["gelu"]])
NOT_BOOLEANS = st.sampled_from(["false", "true", 2, None, 0.5])


def bad_values(fields: dict) -> dict:
    """Field -> a strategy of values that DeBERTa's own field must refuse, given the other (valid) fields."""
    distance = fields["max_relative_positions"]
    distance = distance if distance >= 1 else fields["max_position_embeddings"]
    positive = {"max_position_embeddings": st.integers(-5, 0) | NOT_INTEGERS}
    # None means "hidden_size" / "hidden_size / heads" for these
    for name in ("embedding_size", "pooler_hidden_size", "attention_head_size"):
        positive[name] = st.integers(-5, 0) | NOT_INTEGERS.filter(lambda value: value is not None)
    return {
        **positive,
        **{name: st.integers(-5, -1) | NOT_INTEGERS for name in ("conv_kernel_size", "emd_steps")},
        **{name: st.integers(-9, -2) | NOT_INTEGERS for name in ("max_relative_positions", "position_buckets")},
        "pooler_dropout": NOT_PROBABILITIES,
        "cls_dropout": NOT_PROBABILITIES.filter(lambda value: value is not None),  # None: hidden_dropout_prob
        **{name: NOT_ACTIVATIONS for name in ("pooler_hidden_act", "conv_act")},
        **{
            name: NOT_BOOLEANS
            for name in ("relative_attention", "share_att_key", "position_biased_input", "clip_relative_positions")
        },
        "projection_layout": st.sampled_from(["interleaved", None, 0]),
        "pos_att_type": st.sampled_from(["c2p|p2p", "p2p", "c2q", ["c2p", "c2p"], "p2c|P2C", 5, ["c2p", 3]]),
        "norm_rel_ebd": st.sampled_from(["batch_norm", "layer_norm|rms", 5]),
        "talking_head": st.just(True),
        # more buckets than the clipping distance allows (with relative attention)
        "position_buckets:too_many": st.integers(max(2 * distance - 2, 2), 2 * distance + 8),
        "conv_kernel_size:even": st.sampled_from([2, 4, 6]),
        "conv_groups": st.sampled_from([0, -1, 1.5, "2", fields["hidden_size"] + 1]),
    }


@st.composite
def invalid_configs(draw):
    """(field, valid fields with that one field made invalid)."""
    fields = draw(deberta_fields())
    options = bad_values(fields)
    key = draw(st.sampled_from(sorted(options)))
    field = key.split(":")[0]
    value = draw(options[key])
    if key == "position_buckets:too_many":
        fields["relative_attention"] = True
    elif key in ("conv_kernel_size:even", "conv_groups"):
        fields["conv_kernel_size"] = fields.get("conv_kernel_size") or 3
        if key == "conv_groups" and value in range(1, fields["hidden_size"] + 1) and fields["hidden_size"] % value == 0:
            value = 0  # a divisor is valid
    elif key == "attention_head_size" and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        value += fields["hidden_size"]  # positive but not hidden_size / heads
    fields[field] = value
    return field, fields


@examples(75)
@given(case=invalid_configs())
def test_invalid_config_is_refused_naming_the_field(case):
    """One invalid field of DeBERTa's own in an otherwise valid config: a ValueError or TypeError whose message names
    it (the fields every config has: test_contract_properties.py)."""
    field, fields = case
    with pytest.raises((ValueError, TypeError)) as error:
        DebertaConfig(**fields)
    assert field in str(error.value), f"{field}={fields[field]!r}: {error.value}"


# A small config for the regression tests.
SMALL = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=5)

# Each once accepted (the model then failed deep inside torch, or silently read "false" as true) or refused with a
# message naming nothing; found by the test above (the fields every config has: test_contract_properties.py).
CONFIG_REGRESSIONS = {
    "pos-att-type-int": ("pos_att_type", 5),  # TypeError: 'int' object is not iterable
    "relative-string": ("relative_attention", "false"),  # read as true
    "share-none": ("share_att_key", None),
    "absolute-int": ("position_biased_input", 2),
}


@pytest.mark.parametrize("field, value", CONFIG_REGRESSIONS.values(), ids=CONFIG_REGRESSIONS.keys())
def test_config_regressions_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"DebertaConfig\.{field} must"):
        DebertaConfig(**SMALL, **{field: value})
    config = DebertaConfig(**SMALL)
    setattr(config, field, value)  # changed after creation: refused when a model is built
    with pytest.raises(ValueError, match=rf"DebertaConfig\.{field} must"):
        DebertaModel(config)
