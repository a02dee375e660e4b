"""LittleBird under hypothesis: random valid configs (every field the config exposes, at tiny sizes) and random inputs
(batch sizes, lengths of 1 to several blocks, right padding with rows of padding only, padding between real tokens,
token types, position_ids, inputs_embeds, flattened batches), and random invalid configs and inputs.

Properties of a valid config and input: no exception and no NaN/inf anywhere; outputs at real tokens independent of
extra right padding and of the other rows; the same outputs from every way the model computes them (the padded path,
the padding-free path, the explicit-products path of output_attentions, the training kernel `LeanUnpackSlidingWindow`,
both kernels in chunks of query blocks, inputs_embeds instead of input_ids, a flattened batch, the fused FlexAttention
kernel), and the same gradients from the training kernel's hand-written backward as from autograd; a finite training
step of every head. An invalid config or input gets a ValueError or TypeError whose message names the field or
argument.

Every output is checked for NaN/inf in float32 (the dtype models run in); the paths are compared in float64. The paths
differ only in the order of their sums (fused SDPA against explicit products, a (1, N) packed row against (B, L)), so
in float64 they agree to roundoff: over 200 drawn configs the largest difference was 4e-13, at initializer_range 0.5,
where logits are large (1e-15 at 0.02). `TOL` = 1e-9 leaves 2500x headroom and is still 1e8 times smaller than a real
mix-up (a wrong block, bias or mask moves outputs by O(0.1)). In float32 the same comparison needs ~1e-4 at
initializer_range 0.5 (1e-6 at 0.02): roundoff in logits of that size, which would hide less than float64 does.

Examples per run (derandomized, so CI draws the same ones every time; settings from tests/helpers/properties.py,
POSFORMERS_HYPOTHESIS_SCALE multiplies them): `EXAMPLES` below (the "padding" count serves two tests), 650 in all: 400
valid, 250 invalid.
"""

import math
from unittest import mock

import pytest
import torch
from helpers.modeling import max_diff, tiny_config
from helpers.properties import examples, one_thread  # noqa: F401 (one_thread: an autouse fixture)
from hypothesis import given
from hypothesis import strategies as st
from transformers.activations import ACT2FN

from posformers import (
    LittleBirdConfig,
    LittleBirdForMaskedLM,
    LittleBirdForMultipleChoice,
    LittleBirdForQuestionAnswering,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    LittleBirdModel,
    modeling_littlebird,
)
from posformers.configuration_littlebird import QA_HEADS, UNPAD_MODES

TOL = 1e-9
DTYPES = (torch.float32, torch.float64)

EXAMPLES = {
    "paths": 120,
    "padding": 60,
    "flattened": 50,
    "fused": 10,
    "gradients": 40,
    "training": 60,
    "invalid_config": 150,
    "invalid_input": 100,
}


ACTIVATIONS = ("gelu", "relu", "gelu_new", "silu", "tanh", "quick_gelu", "mish", "gelu_pytorch_tanh")


# ---------------------------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def valid_fields(draw) -> dict:
    """The fields of a tiny valid LittleBirdConfig: hidden <= 32 split over 1-4 heads, 1-2 layers, blocks of 1-8 tokens,
    1-10 pack states (fewer, as many as and more than a block), a global prefix up to the block size, every BiALiBi
    init form (the name, a number, a number as a string), token types or none, a padding id or none, any unpad mode."""
    heads = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([d for d in (1, 2, 3, 4, 8) if heads * d <= 32]))
    block_size = draw(st.integers(1, 8))
    vocab_size = draw(st.integers(2, 40))
    bialibi_init = draw(
        st.one_of(
            st.just("alibi"),
            st.floats(0.0, 2.0),
            st.integers(0, 2),
            st.floats(0.0, 2.0).map(str),
        )
    )
    return dict(
        vocab_size=vocab_size,
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_hidden_layers=draw(st.integers(1, 2)),
        intermediate_size=draw(st.integers(1, 40)),
        hidden_act=draw(st.sampled_from(ACTIVATIONS)),
        hidden_dropout_prob=draw(st.sampled_from([0.0, 0.1, 0.5])),
        attention_probs_dropout_prob=draw(st.sampled_from([0.0, 0.1, 0.5])),
        type_vocab_size=draw(st.integers(0, 3)),
        initializer_range=draw(st.sampled_from([0.0, 0.02, 0.5])),
        layer_norm_eps=draw(st.sampled_from([1e-12, 1e-5, 0.1])),
        pad_token_id=draw(st.one_of(st.none(), st.integers(0, vocab_size - 1))),
        block_size=block_size,
        pack_length=draw(st.integers(1, 10)),
        bialibi_init=bialibi_init,
        global_prefix_length=draw(st.integers(1, block_size)),
        unpad_inputs=draw(st.sampled_from(UNPAD_MODES)),
        tie_word_embeddings=draw(st.booleans()),
    )


def build_model(fields: dict, seed: int, model_class=LittleBirdModel, **overrides):
    """The model of `fields`, in eval mode, with every BiALiBi slope moved off its initial value by a seeded random
    amount in [0, 0.5): distinct slopes per head and layer, so that mixing heads or slopes up cannot go unnoticed."""
    torch.manual_seed(seed)
    model = model_class(LittleBirdConfig(**{**fields, **overrides})).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("alpha", "beta", "gamma"):
                parameter.add_(torch.rand(parameter.shape, generator=generator) * 0.5)
    return model


@st.composite
def padded_batches(draw, config: LittleBirdConfig, holes: bool = False) -> dict:
    """A right-padded batch for `config`: 1-4 rows, seq_len from 1 to 8 blocks and a part (12 blocks and a part of a
    block of 1, 40 tokens at most), each row 0 (all padding) to seq_len real tokens; token types, an attention mask
    and position_ids when drawn. With `holes`, padding may also sit between real tokens after the first (Padding
    Insertion)."""
    rows = draw(st.integers(1, 4))
    seq_len = draw(st.integers(1, min(max(8 * config.block_size, 12) + 3, 40)))
    lengths = draw(st.lists(st.integers(0, seq_len), min_size=rows, max_size=rows))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (rows, seq_len), generator=generator)
    attention_mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    if holes:
        inserted = torch.rand(rows, seq_len, generator=generator) < draw(st.sampled_from([0.2, 0.5]))
        inserted[:, 0] = False
        attention_mask = attention_mask.masked_fill(inserted, 0)
    batch = {"input_ids": input_ids}
    if draw(st.booleans()) or not bool(attention_mask.all()):
        batch["attention_mask"] = attention_mask
    if config.type_vocab_size > 0 and draw(st.booleans()):
        batch["token_type_ids"] = torch.randint(0, config.type_vocab_size, (rows, seq_len), generator=generator)
    if draw(st.booleans()):
        batch["position_ids"] = torch.arange(seq_len).expand(draw(st.sampled_from([1, rows])), -1)
    return batch


def real_mask(batch: dict) -> torch.Tensor:
    """(B, L) bool: the real tokens of a batch."""
    mask = batch.get("attention_mask")
    return torch.ones_like(batch["input_ids"], dtype=torch.bool) if mask is None else mask.bool()


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
@given(fields=valid_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_every_path_gives_the_same_finite_outputs(fields, seed, data):
    """Padded path (the reference), padding-free path, explicit products (output_attentions), the training kernel
    (autograd on), both attention kernels in chunks of a drawn number of query blocks, inputs_embeds: finite
    everywhere, equal at real tokens, every layer's hidden states included."""
    model = build_model(fields, seed)
    batch = data.draw(padded_batches(model.config))
    chunk_elements = data.draw(st.sampled_from([1, 100, 1000]), label="chunk elements")
    mask = real_mask(batch)
    inputs_embeds = {key: value for key, value in batch.items() if key != "input_ids"}

    def every_path(model):
        inputs_embeds["inputs_embeds"] = model.embeddings.word_embeddings(batch["input_ids"]).detach()
        outputs = {
            "padded": run(model, batch, "never", output_hidden_states=True),
            "padding-free": run(model, batch, "always", output_hidden_states=True),
            "output_attentions": run(model, batch, "never", output_attentions=True),
            "training kernel": run(model, batch, "never", grad=True),
            "training kernel, padding-free": run(model, batch, "always", grad=True),
            "inputs_embeds": run(model, inputs_embeds, fields["unpad_inputs"]),
        }
        with (
            mock.patch.object(modeling_littlebird, "ATTENTION_CHUNK_ELEMENTS", chunk_elements),
            mock.patch.object(modeling_littlebird, "LEAN_ATTENTION_CHUNK_ELEMENTS", chunk_elements),
        ):
            outputs["chunked"] = run(model, batch, "never")
            outputs["training kernel, chunked"] = run(model, batch, "never", grad=True)
        return outputs

    outputs = finite_then_float64(model, every_path)
    padded = outputs.pop("padded")
    assert padded.last_hidden_state.shape == (*batch["input_ids"].shape, model.config.hidden_size)
    for label, output in outputs.items():
        assert_same_at_real_tokens(output, padded, mask, label)
    hidden_states = zip(outputs["padding-free"].hidden_states, padded.hidden_states, strict=True)
    for layer, (actual, expected) in enumerate(hidden_states):
        diff = max_diff(actual, expected, mask) if mask.any() else 0.0
        assert diff <= TOL, f"padding-free: hidden_states[{layer}] differ by {diff}"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # uncompiled on purpose
@examples(EXAMPLES["fused"])
@given(fields=valid_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_the_fused_attention_matches_the_block_sparse_products(fields, seed, data):
    """attn_implementation="posformers_fused" (the fused USWAttn: a block mask and the BiALiBi bias in a score_mod)
    against the block-sparse products, padded and padding-free. FlexAttention runs uncompiled here, its dense reference
    (reading the mask_mod and score_mod for every pair, in float64 too): compiled, it builds a kernel per shape, seconds
    each on CPU, which tests/models/test_fused_attention.py does for fixed shapes."""
    from torch.nn.attention.flex_attention import flex_attention

    model = build_model(fields, seed, attention_probs_dropout_prob=0.0)
    batch = data.draw(padded_batches(model.config))
    mask = real_mask(batch)

    def both_kernels(model):
        model.config._attn_implementation = "sdpa"
        outputs = {"block-sparse": run(model, batch, "never")}
        model.config._attn_implementation = "posformers_fused"
        with (
            mock.patch.object(modeling_littlebird, "flex_attention_kernel", lambda device_type: flex_attention),
            mock.patch.object(modeling_littlebird, "FLEX_CPU_DTYPES", DTYPES),
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
@given(fields=valid_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_every_path_gives_the_same_gradients(fields, seed, data):
    """The training kernel's hand-written backward (`LeanUnpackSlidingWindow`), padded and padding-free, against
    autograd through the explicit products (output_attentions): the same gradient of every parameter, in float64, of a
    random weighting of the outputs at real tokens and of the pack states of rows holding one."""
    model = build_model(fields, seed).double()  # eval mode: no dropout, so every path computes the same function
    batch = data.draw(padded_batches(model.config))
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
    for label, actual in {"training kernel": gradients("never"), "padding-free": gradients("always")}.items():
        for name, grad in expected.items():
            other = actual.get(name, torch.zeros_like(grad))
            diff = max_diff(other, grad)
            # gradients are sums over every token and layer: relative to their size
            assert diff <= TOL * (1 + grad.abs().max().item()), f"{label}: gradient of {name} differs by {diff}"


@examples(EXAMPLES["padding"])
@given(fields=valid_fields(), seed=st.integers(0, 2**16), extra=st.integers(1, 12), data=st.data())
def test_outputs_at_real_tokens_do_not_depend_on_padding_or_other_rows(fields, seed, extra, data):
    """More right padding, or each row run alone without padding, leaves the outputs at real tokens unchanged."""
    model = build_model(fields, seed)
    batch = data.draw(padded_batches(model.config))
    mask = real_mask(batch)
    batch["attention_mask"] = mask.long()
    batch.pop("position_ids", None)
    longer = {key: torch.nn.functional.pad(value, (0, extra)) for key, value in batch.items()}
    lengths = mask.sum(-1).tolist()

    def padded_and_alone(model):
        outputs = {"batch": run(model, batch), "more padding": run(model, longer)}
        for row, length in enumerate(lengths):
            if length:
                alone = {key: value[row : row + 1, :length] for key, value in batch.items() if key != "attention_mask"}
                outputs[f"row {row} alone"] = run(model, alone)
        return outputs

    outputs = finite_then_float64(model, padded_and_alone)
    expected = outputs.pop("batch")
    longer_output = outputs.pop("more padding")
    longer_output.last_hidden_state = longer_output.last_hidden_state[:, : mask.shape[1]]
    assert_same_at_real_tokens(longer_output, expected, mask, "more padding")
    for row, length in enumerate(lengths):
        if length:
            output = outputs[f"row {row} alone"]
            diff = max_diff(output.last_hidden_state[0], expected.last_hidden_state[row, :length])
            assert diff <= TOL, f"row {row} alone: last_hidden_state differs by {diff}"
            diff = max_diff(output.pack_states[0], expected.pack_states[row])
            assert diff <= TOL, f"row {row} alone: pack_states differ by {diff}"


@examples(EXAMPLES["padding"])
@given(fields=valid_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_padding_between_real_tokens_is_finite_on_every_padded_path(fields, seed, data):
    """Padding Insertion (padding after a real first token, between real ones) runs padded in every mode but "always",
    which refuses it naming the attention mask; the padded paths agree at real tokens."""
    model = build_model(fields, seed)
    batch = data.draw(padded_batches(model.config, holes=True))
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


@examples(EXAMPLES["flattened"])
@given(
    fields=valid_fields(),
    seed=st.integers(0, 2**16),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    with_embeds=st.booleans(),
)
def test_flattened_batch_matches_the_padded_batch(fields, seed, lengths, with_embeds):
    """DataCollatorWithFlattening's layout (one row, position_ids restarting at 0, cu_seq_lens) gives each sequence
    the outputs it gets in a padded batch."""
    model = build_model(fields, seed)
    generator = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(0, model.config.vocab_size, (n,), generator=generator) for n in lengths]
    padded = {
        "input_ids": torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True),
        "attention_mask": torch.nn.utils.rnn.pad_sequence([torch.ones(n, dtype=torch.long) for n in lengths], True),
    }
    cu_seq_lens = torch.nn.functional.pad(torch.tensor(lengths).cumsum(0), (1, 0)).int()
    flat = {
        "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }

    def padded_and_flattened(model):
        flat_ids = torch.cat(sequences)[None]
        if with_embeds:
            flat["inputs_embeds"] = model.embeddings.word_embeddings(flat_ids).detach()
        else:
            flat["input_ids"] = flat_ids
        return {"padded": run(model, padded, "never"), "flattened": run(model, flat)}

    outputs = finite_then_float64(model, padded_and_flattened)
    expected, output = outputs["padded"], outputs["flattened"]
    assert output.last_hidden_state.shape == (1, sum(lengths), model.config.hidden_size)
    diff = max_diff(output.last_hidden_state[0], expected.last_hidden_state[padded["attention_mask"].bool()])
    assert diff <= TOL, f"flattened: last_hidden_state differs by {diff}"
    diff = max_diff(output.pack_states, expected.pack_states)
    assert diff <= TOL, f"flattened: pack_states differ by {diff}"


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
    fields=valid_fields(),
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
    model = build_model(fields, seed, HEADS[head], **overrides).train()
    batch = data.draw(padded_batches(model.config))
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
# Invalid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------

NOT_A_NUMBER = st.one_of(st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
# Negative floats stop short of -0.0, which compares equal to 0.0 and is as valid.
NEGATIVE = st.floats(max_value=-1e-300)
# A float is never a valid size, not even 4.0.
BAD_POSITIVE_INTEGER = st.one_of(st.integers(max_value=0), st.floats(), NOT_A_NUMBER)
BAD_PROBABILITY = st.one_of(NEGATIVE, st.floats(min_value=1.0), st.just(math.nan), NOT_A_NUMBER)
BAD_EPSILON = st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf), NOT_A_NUMBER)
BAD_RANGE = st.one_of(NEGATIVE, st.just(math.nan), st.just(math.inf), NOT_A_NUMBER)


def not_a_valid_number_string(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return True
    return not (math.isfinite(value) and value >= 0)


def bad_fields(fields: dict) -> dict:
    """field -> (strategy of values that make `fields` invalid, what the error must name)."""
    vocab_size = fields["vocab_size"]
    bad_id = st.one_of(
        st.integers(max_value=-1), st.integers(min_value=vocab_size), st.floats(), st.booleans(), st.text(max_size=3)
    )
    bad_choice = st.one_of(st.text(max_size=8), st.integers(), st.none())
    positives = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "block_size",
        "pack_length",
        "global_prefix_length",
    )
    table = {name: (BAD_POSITIVE_INTEGER, name) for name in positives}
    # an integer past the allowed range names the field and what it is compared with
    table["num_attention_heads"] = (
        st.one_of(BAD_POSITIVE_INTEGER, st.integers(1, 64).filter(lambda h: fields["hidden_size"] % h)),
        "num_attention_heads",
    )
    table["global_prefix_length"] = (
        st.one_of(BAD_POSITIVE_INTEGER, st.integers(fields["block_size"] + 1, 100)),
        "global_prefix_length",
    )
    table |= {
        "type_vocab_size": (st.one_of(st.integers(max_value=-1), st.floats(), NOT_A_NUMBER), "type_vocab_size"),
        "hidden_dropout_prob": (BAD_PROBABILITY, "hidden_dropout_prob"),
        "attention_probs_dropout_prob": (BAD_PROBABILITY, "attention_probs_dropout_prob"),
        "layer_norm_eps": (BAD_EPSILON, "layer_norm_eps"),
        "initializer_range": (BAD_RANGE, "initializer_range"),
        "pad_token_id": (bad_id, "pad_token_id"),
        "question_token_id": (bad_id, "question_token_id"),
        "hidden_act": (
            st.one_of(
                st.text(max_size=8).filter(lambda name: name not in ACT2FN),
                st.integers(),
                st.none(),
                st.lists(st.integers(), max_size=1),
            ),
            "hidden_act",
        ),
        "bialibi_init": (
            st.one_of(
                NEGATIVE,
                st.just(math.inf),
                st.just(math.nan),
                st.text(max_size=6).filter(lambda text: text != "alibi" and not_a_valid_number_string(text)),
                st.none(),
                st.booleans(),
            ),
            "bialibi_init",
        ),
        "unpad_inputs": (bad_choice.filter(lambda mode: mode not in UNPAD_MODES), "unpad_inputs"),
        "qa_head": (bad_choice.filter(lambda head: head not in QA_HEADS), "qa_head"),
        "is_decoder": (st.just(True), "is_decoder"),
        "add_cross_attention": (st.just(True), "add_cross_attention"),
    }
    return table


@examples(EXAMPLES["invalid_config"])
@given(fields=valid_fields(), data=st.data())
def test_an_invalid_field_is_refused_naming_it(fields, data):
    """One field of a valid config made invalid (wrong type, out of range, inconsistent with another field): a
    ValueError or TypeError naming it, on creation and again when a model is built from a config changed later."""
    table = bad_fields(fields)
    name = data.draw(st.sampled_from(sorted(table)))
    strategy, named = table[name]
    value = data.draw(strategy, label=name)
    with pytest.raises((ValueError, TypeError), match=named):
        LittleBirdConfig(**{**fields, name: value})
    config = LittleBirdConfig(**fields)
    setattr(config, name, value)
    with pytest.raises((ValueError, TypeError), match=named):
        LittleBirdModel(config)


def corruptions(config: LittleBirdConfig, batch: dict) -> dict:
    """kind -> (function of a drawn value and the batch giving the bad forward arguments, strategy of the value, what
    the error must name)."""
    rows, seq_len = batch["input_ids"].shape
    ids = batch["input_ids"]

    def replace(**changes):
        return lambda value, batch: {**batch, **{key: change(value) for key, change in changes.items()}}

    table = {
        "input_ids out of range": (
            replace(
                input_ids=lambda v: ids.clone().index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(v))
            ),
            st.one_of(st.integers(max_value=-1), st.integers(min_value=config.vocab_size)).filter(
                lambda v: abs(v) < 2**62
            ),
            "input_ids",
        ),
        "token_type_ids out of range": (
            replace(token_type_ids=lambda v: torch.full_like(ids, v)),
            st.one_of(st.integers(-5, -1), st.integers(config.type_vocab_size, config.type_vocab_size + 5)),
            "token_type_ids",
        ),
        "token_type_ids of another shape": (
            replace(token_type_ids=lambda v: torch.zeros(rows, seq_len + v, dtype=torch.long)),
            st.integers(-seq_len, 3).filter(lambda v: v != 0),
            "token_type_ids",
        ),
        "attention_mask of another shape": (
            replace(attention_mask=lambda v: torch.ones(rows + v[0], seq_len + v[1])),
            st.tuples(st.integers(0, 2), st.integers(-seq_len, 3)).filter(lambda v: v != (0, 0) and v[1] > -seq_len),
            "attention_mask",
        ),
        "position_ids that are not the token indices": (
            replace(position_ids=lambda v: torch.arange(seq_len).expand(rows, -1) + v),
            st.integers(1, 5),
            "position_ids",
        ),
        "position_ids of another shape": (
            replace(position_ids=lambda v: torch.arange(seq_len + v)[None]),
            st.integers(1, 3),
            "position_ids",
        ),
        "inputs_embeds of another width": (
            lambda v, batch: {"inputs_embeds": torch.zeros(rows, seq_len, config.hidden_size + v)},
            st.integers(-config.hidden_size + 1, 3).filter(lambda v: v != 0),
            "inputs_embeds",
        ),
        "inputs_embeds of another dtype": (
            lambda v, batch: {"inputs_embeds": torch.zeros(rows, seq_len, config.hidden_size, dtype=v)},
            st.sampled_from([torch.float64, torch.float16, torch.bfloat16, torch.long, torch.bool]),
            "inputs_embeds",
        ),
        "both input_ids and inputs_embeds": (
            lambda v, batch: {**batch, "inputs_embeds": torch.zeros(rows, seq_len, config.hidden_size)},
            st.just(None),
            "input_ids or inputs_embeds",
        ),
        "neither input_ids nor inputs_embeds": (
            lambda v, batch: {key: value for key, value in batch.items() if key != "input_ids"},
            st.just(None),
            "input_ids or inputs_embeds",
        ),
        "ids of a floating or bool dtype": (
            lambda v, batch: {**batch, v[0]: ids.to(v[1])},
            st.tuples(
                st.sampled_from(["input_ids", "token_type_ids", "position_ids"]),
                st.sampled_from([torch.float32, torch.bool]),
            ),
            "(input_ids|token_type_ids|position_ids) must hold integers",
        ),
        "a list instead of a tensor": (
            lambda v, batch: {**batch, v: ids.tolist()},
            st.sampled_from(["input_ids", "attention_mask", "token_type_ids", "position_ids"]),
            "(input_ids|attention_mask|token_type_ids|position_ids) must be a torch.Tensor",
        ),
        "an empty batch": (
            replace(input_ids=lambda v: ids[:0]),
            st.just(None),
            "input_ids",
        ),
        "an empty sequence": (
            lambda v, batch: {"input_ids": ids[:, :0]},
            st.just(None),
            "empty",
        ),
    }
    flat_ids = ids.flatten()[None]  # one row of rows * seq_len tokens: a flattened batch of the rows
    flat_positions = torch.arange(seq_len).repeat(rows)[None]
    cu_seq_lens = torch.arange(rows + 1, dtype=torch.int32) * seq_len
    table |= {
        "cu_seq_lens without position_ids": (
            lambda v, batch: {"input_ids": flat_ids, "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens},
            st.just(None),
            "position_ids",
        ),
        "cu_seq_lens_q and cu_seq_lens_k that differ": (
            lambda v, batch: {
                "input_ids": flat_ids,
                "position_ids": flat_positions,
                "cu_seq_lens_q": cu_seq_lens,
                "cu_seq_lens_k": cu_seq_lens + torch.tensor([0] * rows + [v], dtype=torch.int32),
            },
            st.integers(1, 3),
            "cu_seq_lens_q and cu_seq_lens_k",
        ),
    }
    if rows > 1 and seq_len > 1:  # a flattened batch (restarting position_ids) with a padding mask
        table["a flattened batch with padding"] = (
            lambda v, batch: {
                "input_ids": flat_ids,
                "position_ids": flat_positions,
                "attention_mask": torch.ones_like(flat_ids).index_fill_(1, torch.tensor([v % flat_ids.shape[1]]), 0),
            },
            st.integers(1, 100),
            "attention_mask",
        )
    if seq_len > 1:  # a padded first token before a real one
        table["left padding"] = (
            replace(attention_mask=lambda v: torch.ones(rows, seq_len).index_fill_(1, torch.tensor([0]), 0)),
            st.just(None),
            "attention_mask",
        )
    if config.type_vocab_size == 0:
        table["token_type_ids out of range"] = (
            replace(token_type_ids=lambda v: torch.full_like(ids, v)),
            st.integers(-2, 2),
            "token_type_ids",
        )
    return table


@examples(EXAMPLES["invalid_input"])
@given(fields=valid_fields(), seed=st.integers(0, 2**16), data=st.data())
def test_an_invalid_input_is_refused_naming_it(fields, seed, data):
    """One argument of a valid forward call made invalid: a ValueError or TypeError naming it."""
    model = build_model(fields, seed)
    batch = data.draw(padded_batches(model.config))
    batch.pop("position_ids", None)
    table = corruptions(model.config, batch)
    kind = data.draw(st.sampled_from(sorted(table)), label="corruption")
    corrupt, strategy, named = table[kind]
    arguments = corrupt(data.draw(strategy, label=kind), batch)
    with pytest.raises((ValueError, TypeError), match=named):
        run(model, arguments)


# ---------------------------------------------------------------------------------------------------------------------
# Regression tests of what the properties found
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # a string or a float reached a bare `<=` TypeError or nn.Embedding's padding_idx
        ("pad_token_id", "3", r"pad_token_id \('3'\) must be None or an integer in \[0, vocab_size=99\)"),
        ("pad_token_id", 2.5, r"pad_token_id \(2.5\) must be None or an integer"),
        ("pad_token_id", True, r"pad_token_id \(True\) must be None or an integer"),
        # a string failed in a bare comparison; NaN and inf were accepted (NaN outputs)
        ("layer_norm_eps", "x", "layer_norm_eps must be positive and finite, got 'x'"),
        ("layer_norm_eps", math.nan, "layer_norm_eps must be positive and finite, got nan"),
        ("layer_norm_eps", math.inf, "layer_norm_eps must be positive and finite, got inf"),
        ("layer_norm_eps", True, "layer_norm_eps must be positive and finite, got True"),
        # not checked at all: torch's init failed on it ("normal expects std >= 0.0")
        ("initializer_range", -1.0, "initializer_range must be a number >= 0 .*, got -1.0"),
        ("initializer_range", math.nan, "initializer_range must be a number >= 0 .*, got nan"),
        ("initializer_range", "0.02", "initializer_range must be a number >= 0 .*, got '0.02'"),
        # an unhashable value failed in the dict lookup ("unhashable type: 'list'")
        ("hidden_act", ["gelu"], "hidden_act must be the name of an activation in transformers' ACT2FN, got \\['gelu'\\]"),
        # an infinite slope was accepted: the bias on the diagonal is inf * 0 = NaN
        ("bialibi_init", math.inf, "bialibi_init must be one of \\('alibi',\\) or a finite number >= 0, got inf"),
        ("bialibi_init", "inf", "bialibi_init must be one of \\('alibi',\\) or a finite number >= 0, got inf"),
    ],
)
def test_fields_the_properties_found_unchecked_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(LittleBirdConfig, **{field: value})


IDS = torch.ones(2, 5, dtype=torch.long)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        # AttributeError: 'list' object has no attribute 'dim' / 'shape'
        ({"input_ids": IDS.tolist()}, TypeError, "input_ids must be a torch.Tensor, got list"),
        ({"input_ids": IDS, "attention_mask": IDS.tolist()}, TypeError, "attention_mask must be a torch.Tensor"),
        # torch's "Expected tensor for argument #1 'indices' to have one of the following scalar types"
        ({"input_ids": IDS.float()}, TypeError, r"input_ids must hold integers \(torch.long or torch.int\)"),
        ({"input_ids": IDS, "token_type_ids": IDS.bool()}, TypeError, "token_type_ids must hold integers"),
        # "mixed dtype (CPU): all inputs must share same datatype", and integer embeddings were taken as they were
        ({"inputs_embeds": torch.zeros(2, 5, 32, dtype=torch.float64)}, TypeError, "inputs_embeds must have the model"),
        ({"inputs_embeds": torch.zeros(2, 5, 32, dtype=torch.long)}, TypeError, "inputs_embeds must have the model"),
        # "cannot reshape tensor of 0 elements into shape [0, 4, -1]"
        ({"input_ids": IDS[:0]}, ValueError, r"input_ids holds an empty batch \(batch = 0\)"),
        ({"inputs_embeds": torch.zeros(0, 5, 32)}, ValueError, r"inputs_embeds holds an empty batch"),
    ],
)
def test_inputs_the_properties_found_unchecked_are_refused(kwargs, error, message):
    model = LittleBirdModel(tiny_config(LittleBirdConfig)).eval()
    with pytest.raises(error, match=message):
        model(**kwargs)


def test_inputs_embeds_of_another_dtype_run_under_autocast():
    """The dtype check leaves autocast alone: it casts the embeddings itself."""
    model = LittleBirdModel(tiny_config(LittleBirdConfig)).eval()
    embeds = torch.randn(2, 5, 32)
    with torch.no_grad():
        expected = model(inputs_embeds=embeds).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = model(inputs_embeds=embeds.bfloat16()).last_hidden_state
    assert torch.isfinite(output).all()
    assert max_diff(output.float(), expected) < 0.1  # bfloat16 keeps 8 bits of mantissa


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
