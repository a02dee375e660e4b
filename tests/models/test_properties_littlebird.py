"""LittleBird under hypothesis, what it alone has: every way it computes its attention (the explicit products of
output_attentions, the training kernel `LeanUnpackSlidingWindow` and its hand-written backward, both kernels in chunks
of query blocks, the fused FlexAttention kernel), extra right padding adding blocks, padding between real tokens
(Padding Insertion), a finite training step of every head, and its own config fields. Configs and batches are drawn
by tests/helpers/strategies.py (every field at tiny sizes; lengths of 1 to several blocks, rows of padding only);
what every model keeps (each sequence as alone, padded, padding-free and flattened; inputs_embeds; padding-free
gradients; invalid inputs and shared fields refused) is in test_contract_properties.py.

Every output is checked for NaN/inf in float32 (the dtype models run in); the paths are compared in float64. The paths
differ only in the order of their sums (fused SDPA against explicit products, a (1, N) packed row against (B, L)), so
in float64 they agree to roundoff: over 200 drawn configs the largest difference was 4e-13, at initializer_range 0.5,
where logits are large (1e-15 at 0.02). `TOL` = 1e-9 leaves 2500x headroom and is still 1e8 times smaller than a real
mix-up (a wrong block, bias or mask moves outputs by O(0.1)). In float32 the same comparison needs ~1e-4 at
initializer_range 0.5 (1e-6 at 0.02): roundoff in logits of that size, which would hide less than float64 does.

Examples per run (derandomized, so CI draws the same ones every time; settings from tests/helpers/properties.py,
POSFORMERS_HYPOTHESIS_SCALE multiplies them): `EXAMPLES` below (the "padding" count serves two tests).
"""

import math
from unittest import mock

import pytest
import torch
from helpers.modeling import max_diff, tiny_config
from helpers.properties import examples, one_thread  # noqa: F401 (one_thread: an autouse fixture)
from helpers.registry import distinct_bialibi_slopes
from helpers.strategies import (
    BAD_POSITIVE_INTEGER,
    NEGATIVE,
    littlebird_batches,
    littlebird_fields,
    real_mask,
)
from hypothesis import given
from hypothesis import strategies as st

from posformers import (
    LittleBirdConfig,
    LittleBirdForMaskedLM,
    LittleBirdForMultipleChoice,
    LittleBirdForQuestionAnswering,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    LittleBirdModel,
    littlebird_kernels,
)

TOL = 1e-9
DTYPES = (torch.float32, torch.float64)

EXAMPLES = {
    "paths": 120,
    "padding": 60,
    "fused": 10,
    "gradients": 40,
    "training": 60,
    "invalid_config": 75,
}


def build(fields: dict, seed: int, model_class=LittleBirdModel, **overrides):
    """The model of `fields`, in eval mode, with its BiALiBi slopes moved apart per head and layer."""
    torch.manual_seed(seed)
    model = model_class(LittleBirdConfig(**{**fields, **overrides})).eval()
    distinct_bialibi_slopes(model, seed)
    return model


def run(model, batch: dict, unpad_inputs: str | None = None, grad: bool = False, **kwargs):
    """`model(**batch, **kwargs)` under `config.unpad_inputs = unpad_inputs` (if given), with or without autograd."""
    if unpad_inputs is not None:
        model.config.unpad_inputs = unpad_inputs
    with torch.set_grad_enabled(grad):
        return model(**batch, **kwargs)


def finite_then_float64(model, outputs_of) -> dict:
    """`outputs_of(model)` ({label: output}) with the model in float32, every output checked for NaN/inf, then in
    float64, whose outputs (checked too) are returned for comparing."""
    for dtype in DTYPES:
        outputs = outputs_of(model.to(dtype))
        for label, output in outputs.items():
            for name in ("last_hidden_state", "pack_states"):
                value = getattr(output, name)
                assert torch.isfinite(value).all(), f"{label}, {dtype}: {name} has NaN or inf"
            for weights in (output.attentions or ()) + (output.pack_attentions or ()):
                assert torch.isfinite(weights).all(), f"{label}, {dtype}: attention weights have NaN or inf"
    return outputs


def assert_same_at_real_tokens(actual, expected, mask: torch.Tensor, label: str) -> None:
    """Equal last_hidden_state at real tokens, and equal pack states of every row holding a real token (a row of
    padding only has pack states that nothing reads, computed from its padding on the padded path)."""
    diff = max_diff(actual.last_hidden_state, expected.last_hidden_state, mask) if mask.any() else 0.0
    assert diff <= TOL, f"{label}: last_hidden_state differs by {diff}"
    rows = mask.any(-1)
    if rows.any():
        diff = max_diff(actual.pack_states[rows], expected.pack_states[rows])
        assert diff <= TOL, f"{label}: pack_states differ by {diff}"


# ---------------------------------------------------------------------------------------------------------------------
# Valid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@examples(EXAMPLES["paths"])
@given(fields=littlebird_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_every_path_gives_the_same_finite_outputs(fields, seed, data):
    """Padded path (the reference), explicit products (output_attentions), the training kernel (autograd on), padded
    and padding-free, both attention kernels in chunks of a drawn number of query blocks: finite everywhere, equal at
    real tokens, every layer's hidden states included."""
    model = build(fields, seed)
    batch = data.draw(littlebird_batches(model.config))
    chunk_elements = data.draw(st.sampled_from([1, 100, 1000]), label="chunk elements")
    mask = real_mask(batch)

    def every_path(model):
        outputs = {
            "padded": run(model, batch, "never", output_hidden_states=True),
            "output_attentions": run(model, batch, "never", output_attentions=True, output_hidden_states=True),
            "training kernel": run(model, batch, "never", grad=True),
            "training kernel, padding-free": run(model, batch, "always", grad=True, output_hidden_states=True),
        }
        with (
            mock.patch.object(littlebird_kernels, "ATTENTION_CHUNK_ELEMENTS", chunk_elements),
            mock.patch.object(littlebird_kernels, "LEAN_ATTENTION_CHUNK_ELEMENTS", chunk_elements),
        ):
            outputs["chunked"] = run(model, batch, "never")
            outputs["training kernel, chunked"] = run(model, batch, "never", grad=True)
        return outputs

    outputs = finite_then_float64(model, every_path)
    padded = outputs.pop("padded")
    assert padded.last_hidden_state.shape == (*batch["input_ids"].shape, model.config.hidden_size)
    for label, output in outputs.items():
        assert_same_at_real_tokens(output, padded, mask, label)
    for label in ("output_attentions", "training kernel, padding-free"):
        for layer, (actual, expected) in enumerate(
            zip(outputs[label].hidden_states, padded.hidden_states, strict=True)
        ):
            diff = max_diff(actual, expected, mask) if mask.any() else 0.0
            assert diff <= TOL, f"{label}: hidden_states[{layer}] differ by {diff}"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # uncompiled on purpose
@examples(EXAMPLES["fused"])
@given(fields=littlebird_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_the_fused_attention_matches_the_block_sparse_products(fields, seed, data):
    """attn_implementation="posformers_fused" (the fused USWAttn: a block mask and the BiALiBi bias in a score_mod)
    against the block-sparse products, padded and padding-free. FlexAttention runs uncompiled here, its dense reference
    (reading the mask_mod and score_mod for every pair, in float64 too): compiled, it builds a kernel per shape, seconds
    each on CPU, which tests/models/test_fused_attention.py does for fixed shapes."""
    from torch.nn.attention.flex_attention import flex_attention

    model = build(fields, seed, attention_probs_dropout_prob=0.0)
    batch = data.draw(littlebird_batches(model.config))
    mask = real_mask(batch)

    def both_kernels(model):
        model.config._attn_implementation = "sdpa"
        outputs = {"block-sparse": run(model, batch, "never")}
        model.config._attn_implementation = "posformers_fused"
        with (
            mock.patch.object(littlebird_kernels, "flex_attention_kernel", lambda device_type: flex_attention),
            mock.patch.object(littlebird_kernels, "FLEX_CPU_DTYPES", DTYPES),
        ):
            outputs["fused"] = run(model, batch, "never")
            outputs["fused, padding-free"] = run(model, batch, "always")
        model.config._attn_implementation = "sdpa"
        return outputs

    outputs = finite_then_float64(model, both_kernels)
    expected = outputs.pop("block-sparse")
    for label, output in outputs.items():
        assert_same_at_real_tokens(output, expected, mask, label)


@examples(EXAMPLES["gradients"])
@given(fields=littlebird_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_every_path_gives_the_same_gradients(fields, seed, data):
    """The training kernel's hand-written backward (`LeanUnpackSlidingWindow`) against autograd through the explicit
    products (output_attentions): the same gradient of every parameter, in float64, of a random weighting of the
    outputs at real tokens and of the pack states of rows holding one."""
    model = build(fields, seed).double()  # eval mode: no dropout, so every path computes the same function
    batch = data.draw(littlebird_batches(model.config))
    mask = real_mask(batch)
    generator = torch.Generator().manual_seed(seed)
    token_weights = torch.randn(*mask.shape, model.config.hidden_size, generator=generator, dtype=torch.float64)
    token_weights = token_weights * mask[..., None]
    pack_weights = torch.randn(mask.shape[0], model.config.pack_length, model.config.hidden_size, generator=generator)
    pack_weights = pack_weights.double() * mask.any(-1)[:, None, None]

    def gradients(unpad_inputs, **kwargs):
        model.zero_grad()
        output = run(model, batch, unpad_inputs, grad=True, **kwargs)
        loss = (output.last_hidden_state * token_weights).sum() + (output.pack_states * pack_weights).sum()
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    expected = gradients("never", output_attentions=True)
    actual = gradients("never")
    for name, grad in expected.items():
        diff = max_diff(actual.get(name, torch.zeros_like(grad)), grad)
        # gradients are sums over every token and layer: relative to their size
        assert diff <= TOL * (1 + grad.abs().max().item()), f"training kernel: gradient of {name} differs by {diff}"


@examples(EXAMPLES["padding"])
@given(fields=littlebird_fields(), seed=st.integers(0, 2**16), extra=st.integers(1, 12), data=st.data())
def test_more_right_padding_leaves_real_tokens_unchanged(fields, seed, extra, data):
    """More right padding (whole blocks of it) leaves the outputs at real tokens and the pack states unchanged (each
    row as alone: test_contract_properties.py)."""
    model = build(fields, seed)
    batch = data.draw(littlebird_batches(model.config))
    mask = real_mask(batch)
    batch["attention_mask"] = mask.long()
    batch.pop("position_ids", None)
    longer = {key: torch.nn.functional.pad(value, (0, extra)) for key, value in batch.items()}

    def padded_and_more(model):
        return {"batch": run(model, batch), "more padding": run(model, longer)}

    outputs = finite_then_float64(model, padded_and_more)
    longer_output = outputs["more padding"]
    longer_output.last_hidden_state = longer_output.last_hidden_state[:, : mask.shape[1]]
    assert_same_at_real_tokens(longer_output, outputs["batch"], mask, "more padding")


@examples(EXAMPLES["padding"])
@given(fields=littlebird_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_padding_between_real_tokens_is_finite_on_every_padded_path(fields, seed, data):
    """Padding Insertion (padding after a real first token, between real ones) runs padded in every mode but "always",
    which refuses it naming the attention mask; the padded paths agree at real tokens."""
    model = build(fields, seed)
    batch = data.draw(littlebird_batches(model.config, holes=True))
    mask = real_mask(batch)

    def padded_paths(model):
        return {
            "never": run(model, batch, "never"),
            "auto": run(model, batch, "auto"),
            "output_attentions": run(model, batch, "never", output_attentions=True),
            "training kernel": run(model, batch, "never", grad=True),
        }

    outputs = finite_then_float64(model, padded_paths)
    expected = outputs.pop("never")
    for label, output in outputs.items():
        assert_same_at_real_tokens(output, expected, mask, label)
    if not bool((mask[:, 1:] <= mask[:, :-1]).all()):
        with pytest.raises(ValueError, match="attention_mask is not right-padded"):
            run(model, batch, "always")


HEADS = {
    "masked_lm": LittleBirdForMaskedLM,
    "sequence_classification": LittleBirdForSequenceClassification,
    "token_classification": LittleBirdForTokenClassification,
    "question_answering": LittleBirdForQuestionAnswering,
    "question_answering, span selection": LittleBirdForQuestionAnswering,
    "multiple_choice": LittleBirdForMultipleChoice,
}


def with_one_question(batch: dict, question_token_id: int, generator: torch.Generator) -> dict:
    """`batch` with every row's first token real and exactly one [QUESTION] token at a random real position of each
    row (qa_head="span_selection" needs one per example; other occurrences of the id become 0)."""
    mask = real_mask(batch).clone()
    mask[:, 0] = True
    input_ids = batch["input_ids"].masked_fill(batch["input_ids"] == question_token_id, 0)
    for row, length in enumerate(mask.sum(-1).tolist()):
        input_ids[row, int(torch.randint(0, length, (), generator=generator))] = question_token_id
    return {**batch, "input_ids": input_ids, "attention_mask": mask.long()}


def head_labels(head: str, config: LittleBirdConfig, batch: dict, generator: torch.Generator) -> dict:
    """Random labels of `head` for `batch` (-100 at padded tokens)."""
    rows, seq_len = batch["input_ids"].shape
    real = real_mask(batch)
    if head == "masked_lm":
        return {
            "labels": torch.randint(0, config.vocab_size, (rows, seq_len), generator=generator).masked_fill(~real, -100)
        }
    if head == "token_classification":
        return {"labels": torch.randint(0, 2, (rows, seq_len), generator=generator).masked_fill(~real, -100)}
    if head.startswith("question_answering"):
        ends = (real.sum(-1) - 1).clamp_min(0)
        return {"start_positions": torch.zeros(rows, dtype=torch.long), "end_positions": ends}
    return {"labels": torch.randint(0, 2, (rows,), generator=generator)}


@examples(EXAMPLES["training"])
@given(
    fields=littlebird_fields(),
    seed=st.integers(0, 2**16),
    head=st.sampled_from(sorted(HEADS)),
    data=st.data(),
)
def test_a_training_step_of_every_head_is_finite(fields, seed, head, data):
    """Training mode (dropout on as drawn): the loss and every gradient are finite, with rows of padding only.

    A batch without a labelled token (every row padding, for the token-level heads) has a NaN loss, the mean over no
    token, as in every transformers model (the Trainer passes num_items_in_batch, with which it is 0): only its
    gradients are checked there."""
    overrides = {"num_labels": 2}
    if head == "question_answering, span selection":
        overrides |= {"qa_head": "span_selection", "question_token_id": fields["vocab_size"] - 1}
    model = build(fields, seed, HEADS[head], **overrides).train()
    batch = data.draw(littlebird_batches(model.config))
    batch.pop("position_ids", None)
    generator = torch.Generator().manual_seed(seed)
    if head == "question_answering, span selection":
        batch = with_one_question(batch, model.config.question_token_id, generator)
    labels = head_labels(head, model.config, batch, generator)
    if head == "multiple_choice":  # two choices: the batch and its rows reversed
        batch = {key: torch.stack((value, value.flip(0)), dim=1) for key, value in batch.items()}
    output = model(**batch, **labels)
    if (labels.get("labels", torch.zeros(1)) != -100).any():
        assert torch.isfinite(output.loss), output.loss
    output.loss.backward()
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert torch.isfinite(parameter.grad).all(), f"{name}: gradient has NaN or inf"


# ---------------------------------------------------------------------------------------------------------------------
# Invalid configs: one of LittleBird's own fields broken, an error naming it
# ---------------------------------------------------------------------------------------------------------------------


def not_a_valid_number_string(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return True
    return not (math.isfinite(value) and value >= 0)


def bad_fields(fields: dict) -> dict:
    """field -> a strategy of values that make `fields` invalid, for LittleBird's own fields (the fields every config
    has: test_contract_properties.py)."""
    return {
        "block_size": BAD_POSITIVE_INTEGER,
        "pack_length": BAD_POSITIVE_INTEGER,
        # an integer past the allowed range names the field and what it is compared with
        "global_prefix_length": st.one_of(BAD_POSITIVE_INTEGER, st.integers(fields["block_size"] + 1, 100)),
        "bialibi_init": st.one_of(
            NEGATIVE,
            st.just(math.inf),
            st.just(math.nan),
            st.text(max_size=6).filter(lambda text: text != "alibi" and not_a_valid_number_string(text)),
            st.none(),
            st.booleans(),
        ),
        "is_decoder": st.just(True),
        "add_cross_attention": st.just(True),
    }


@examples(EXAMPLES["invalid_config"])
@given(fields=littlebird_fields(), data=st.data())
def test_an_invalid_field_is_refused_naming_it(fields, data):
    """One field of a valid config made invalid (wrong type, out of range, inconsistent with another field): a
    ValueError or TypeError naming it, on creation and again when a model is built from a config changed later."""
    table = bad_fields(fields)
    name = data.draw(st.sampled_from(sorted(table)))
    value = data.draw(table[name], label=name)
    with pytest.raises((ValueError, TypeError), match=name):
        LittleBirdConfig(**{**fields, name: value})
    config = LittleBirdConfig(**fields)
    setattr(config, name, value)
    with pytest.raises((ValueError, TypeError), match=name):
        LittleBirdModel(config)


# ---------------------------------------------------------------------------------------------------------------------
# Regression tests of what the properties found
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        # an infinite slope was accepted: the bias on the diagonal is inf * 0 = NaN
        (math.inf, "bialibi_init must be one of \\('alibi',\\) or a finite number >= 0, got inf"),
        ("inf", "bialibi_init must be one of \\('alibi',\\) or a finite number >= 0, got inf"),
    ],
)
def test_bialibi_slopes_the_properties_found_unchecked_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(LittleBirdConfig, bialibi_init=value)


def test_the_fused_attention_of_a_float64_model_on_cpu_runs_the_block_sparse_products():
    """FlexAttention's CPU kernel takes float32, float16 and bfloat16 only: a float64 model failed inside inductor's
    lowering ("NotImplementedError: torch.float, torch.float16 and torch.bfloat16 are supported"); it now runs the
    block-sparse products, as for attention dropout."""
    torch.manual_seed(0)
    model = LittleBirdModel(tiny_config(LittleBirdConfig)).eval().double()
    input_ids = torch.randint(1, 99, (2, 11))
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
        model.config._attn_implementation = "posformers_fused"
        output = model(input_ids).last_hidden_state
    assert torch.equal(output, expected)
