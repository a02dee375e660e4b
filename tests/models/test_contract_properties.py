"""Properties every model keeps, stated once over the registry and drawn by hypothesis from each model's valid configs
and inputs (tests/helpers/strategies.py: every option a config exposes at tiny sizes, right-padded batches with rows of
padding only and lengths past each model's position tables, spans and blocks, token types, position_ids,
inputs_embeds): a padded batch gives each sequence what it gives alone on every backend, padded, padding-free,
flattened and with output_attentions; inputs_embeds give what input_ids give; padding-free training gives the padded
loss and gradients; an invalid input, or an invalid value of a field every config has, is refused by name. The
properties of one model only (its own fields, kernels, caches and positions) are in test_properties_<model>.py.

The reference is never the output under test itself: each sequence run alone without padding (RoFormer with dynamic
NTK scaling, whose frequencies depend on the batch's longest sequence as in transformers: the batch without extra
padding columns), the padded path's gradients, input_ids for inputs_embeds.

Tolerance: RoFormer and DeBERTa are compared in float32 at 1e-4. The backends and the packing only reorder sums, and
the norms may amplify by the inverse of a small standard deviation: over every example at most 4e-6 (RoFormer) and
1.4e-5 (DeBERTa), and 8.5e-6 of a gradient's largest entry, against O(0.1) for a wrong mask or position (one padding
token left visible moves the smallest DeBERTa by 5e-4: test_properties_deberta.py). LittleBird is checked finite in
float32 and compared in float64 at 1e-9: the paths agree to 4e-13 there (float32 would need 1e-4 at
initializer_range 0.5, where logits are large).

Examples per model are each strategy's `examples` (settings from tests/helpers/properties.py; derandomized, so CI
draws the same ones every time; POSFORMERS_HYPOTHESIS_SCALE multiplies them).
"""

import math
import re

import pytest
import torch
from helpers.properties import examples, one_thread  # noqa: F401 (one_thread: an autouse fixture)
from helpers.registry import REGISTRY, per_token
from helpers.strategies import (
    BAD_EPSILON,
    BAD_POSITIVE_INTEGER,
    BAD_PROBABILITY,
    BAD_RANGE,
    NOT_A_NUMBER,
    STRATEGIES,
    dynamic_scaling,
    position_limit,
    real_mask,
    row,
    run,
)
from hypothesis import assume, given
from hypothesis import strategies as st
from transformers.activations import ACT2FN

from posformers.configuration_common import QA_HEADS, UNPAD_MODES

models = pytest.mark.parametrize("name", list(REGISTRY))
PATHS = ("never", "always")  # padded, padding-free
# Gradients are compared in float64, where the paths agree to roundoff (1e-14 of a gradient's largest entry).
GRADIENT_TOLERANCE = 1e-9


def finite_outputs(strategy, model, outputs_of, dtypes=None) -> dict:
    """`outputs_of(model)` ({label: output}) in each of the model's dtypes (or `dtypes`), every tensor output and
    attention weight checked finite; the outputs in the last dtype, for comparing."""
    for dtype in dtypes or strategy.dtypes:
        outputs = outputs_of(model.to(dtype))
        for label, output in outputs.items():
            for key, value in output.items():
                for tensor in value if isinstance(value, tuple) else (value,):
                    if isinstance(tensor, torch.Tensor):
                        assert torch.isfinite(tensor).all(), f"{label}, {dtype}: {key} has NaN or inf"
    return outputs


def sequence_outputs(output, auto_name: str, index: int, length: int, start: int | None = None) -> dict:
    """The tensor outputs and hidden states of one sequence: row `index` of a padded batch, cut to its `length` real
    tokens, or (with `start`) sequence `index` of a flattened batch, whose tokens start at `start` of its one row and
    whose span logits come one row per sequence."""
    outputs = {}
    for key, value in output.items():
        if key == "hidden_states":
            outputs.update({f"{key}[{layer}]": states for layer, states in enumerate(value)})
        elif isinstance(value, torch.Tensor) and value.dim():
            outputs[key] = value
    for key, value in outputs.items():
        if not (per_token(auto_name, key) or key.startswith("hidden_states")):
            outputs[key] = value[index]
        elif start is None or key in ("start_logits", "end_logits"):
            outputs[key] = value[index, :length]
        else:
            outputs[key] = value[0, start : start + length]
    return outputs


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, tolerance: float, relative: bool = False):
    """At most `tolerance` apart; with `relative`, relative to the largest entry where that exceeds 1 (logits of the
    large weights drawn reach ~10 and gradients sum over tokens: float32 rounding grows with them)."""
    assert actual.shape == expected.shape, what
    if not actual.numel():
        return
    diff = (actual - expected).abs().max().item()
    scale = max(1.0, expected.abs().max().item()) if relative else 1.0
    assert diff <= tolerance * scale, f"{what}: max abs diff {diff} (largest entry {expected.abs().max().item()})"


def assert_same_sequences(actual: dict, expected: dict, what: str, tolerance: float) -> None:
    """The same outputs: states (normalised, O(1)) within `tolerance`, logits within it relative to their size."""
    assert sorted(actual) == sorted(expected), what
    for key, value in expected.items():
        assert_close(actual[key], value, f"{what}: {key}", tolerance, relative=key.endswith("logits"))


def without_token_index_positions(batch: dict) -> dict:
    """The batch without position_ids that are the token indices 0, 1, 2, ... (what every model reads without
    them)."""
    positions = batch.get("position_ids")
    if positions is not None and torch.equal(positions, torch.arange(positions.shape[1]).expand_as(positions)):
        return {key: value for key, value in batch.items() if key != "position_ids"}
    return batch


def flatten(batch: dict, cu_seq_lens: bool) -> dict:
    """The batch as transformers' DataCollatorWithFlattening lays it out: the real tokens of every row holding any in
    one row, position_ids restarting at 0 per sequence (and cu_seq_lens_q/k when asked)."""
    lengths = real_mask(batch).sum(-1).tolist()
    rows = [(i, n) for i, n in enumerate(lengths) if n]
    flat = {}
    for key in ("input_ids", "inputs_embeds", "token_type_ids"):
        if key in batch:
            value = batch[key]
            flat[key] = torch.cat([value[min(i, value.shape[0] - 1), :n] for i, n in rows])[None]
    flat["position_ids"] = torch.cat([torch.arange(n) for _, n in rows])[None]
    if cu_seq_lens:
        cu = torch.tensor([0] + [n for _, n in rows]).cumsum(0).to(torch.int32)
        flat.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    return flat


# ---------------------------------------------------------------------------------------------------------------------
# Valid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@models
def test_padded_batch_equals_each_sequence_alone(name):
    """Every backend, padded and padding-free, gives every real token (every layer's hidden state and output) and
    every row holding one (pooler, pack states, classes) what its sequence alone gives; so do a flattened batch of the
    same sequences (where the batch gives no positions of its own) and output_attentions, whose weights give padded
    keys nothing. Nothing is NaN or inf, fully padded rows included."""
    strategy = STRATEGIES[name]

    @examples(strategy.examples["alone"])
    @given(case=strategy.cases(), cu_seq_lens=st.booleans())
    def check(case, cu_seq_lens):
        model, batch, auto_name = strategy.build(case), case.batch, case.auto_name
        mask = real_mask(batch)
        lengths = mask.sum(-1).tolist()
        plain = without_token_index_positions(batch)
        flat = flatten(plain, cu_seq_lens) if "position_ids" not in plain and mask.any() else None
        reference = strategy.backends[0]
        expected_rows = [i for i, n in enumerate(lengths) if n]

        def every_path(model):
            def hidden(implementation, mode, inputs, **kwargs):
                return run(model, implementation, mode, inputs, output_hidden_states=True, **kwargs)

            if dynamic_scaling(case.fields):
                outputs = {"reference": hidden(reference, "never", {k: v[:, : max(lengths)] for k, v in batch.items()})}
            else:
                outputs = {f"row {i}": hidden(reference, "never", row(batch, i, lengths[i])) for i in expected_rows}
            for implementation in strategy.backends:
                for mode in ("never", "always"):
                    outputs[f"{implementation}, unpad_inputs={mode}"] = hidden(implementation, mode, batch)
                if flat is not None:
                    outputs[f"{implementation}, flattened"] = hidden(implementation, "auto", flat)
            outputs["output_attentions"] = hidden(reference, "auto", batch, output_attentions=True)
            return outputs

        outputs = finite_outputs(strategy, model, every_path)
        if dynamic_scaling(case.fields):
            reference_output = outputs.pop("reference")
            expected = {i: sequence_outputs(reference_output, auto_name, i, lengths[i]) for i in expected_rows}
        else:
            expected = {i: sequence_outputs(outputs.pop(f"row {i}"), auto_name, 0, lengths[i]) for i in expected_rows}
        starts = torch.tensor([0, *(lengths[i] for i in expected)]).cumsum(0).tolist()
        for label, output in outputs.items():
            for sequence, (i, reference_outputs) in enumerate(expected.items()):
                if label.endswith("flattened"):
                    actual = sequence_outputs(output, auto_name, sequence, lengths[i], start=starts[sequence])
                else:
                    actual = sequence_outputs(output, auto_name, i, lengths[i])
                what = f"{label}, row {i} of length {lengths[i]}"
                assert_same_sequences(actual, reference_outputs, what, strategy.tolerance)
        if strategy.per_key_attentions:
            for weights in outputs["output_attentions"].attentions:
                to_padding = weights.masked_fill(mask[:, None, None, :], 0.0)  # weights on padded keys only
                assert not to_padding[mask[:, None, :, None].expand_as(weights)].any()

    check()


@models
def test_inputs_embeds_equal_input_ids(name):
    """The word embeddings of input_ids passed as inputs_embeds give the same outputs, padded, padding-free and as a
    flattened batch."""
    strategy = STRATEGIES[name]

    @examples(strategy.examples["inputs_embeds"])
    @given(case=strategy.cases())
    def check(case):
        assume("input_ids" in case.batch)
        model, batch = strategy.build(case), case.batch
        mask = real_mask(batch)

        plain = without_token_index_positions(batch)
        layouts = {mode: (batch, mode) for mode in PATHS}
        if "position_ids" not in plain and mask.any():
            layouts["flattened"] = (flatten(plain, cu_seq_lens=True), "auto")

        def both(model):
            outputs = {}
            for layout, (inputs, mode) in layouts.items():
                embeds = model.get_input_embeddings()(inputs["input_ids"]).detach()
                embedded = {**{k: v for k, v in inputs.items() if k != "input_ids"}, "inputs_embeds": embeds}
                outputs[f"input_ids, {layout}"] = run(model, strategy.backends[-1], mode, inputs)
                outputs[f"inputs_embeds, {layout}"] = run(model, strategy.backends[-1], mode, embedded)
            return outputs

        outputs = finite_outputs(strategy, model, both, dtypes=strategy.dtypes[-1:])  # finite: the test above
        for layout in layouts:
            expected, actual = outputs[f"input_ids, {layout}"], outputs[f"inputs_embeds, {layout}"]
            for key, value in expected.items():
                if isinstance(value, torch.Tensor) and value.dim():
                    keep = mask if per_token(case.auto_name, key) else mask.any(-1)
                    keep = slice(None) if layout == "flattened" else keep  # (1, tokens) and one row per sequence
                    what, relative = f"{layout}: {key}", key.endswith("logits")
                    assert_close(actual[key][keep], value[keep], what, strategy.tolerance, relative)

    check()


def training_labels(auto_name: str, fields: dict, batch: dict, generator: torch.Generator) -> dict:
    """Labels of the head's loss on the real tokens of `batch` (-100 at padding); none for the base model."""
    mask = real_mask(batch)
    shape = mask.shape
    if auto_name in ("AutoModelForMaskedLM", "AutoModelForPreTraining", "AutoModelForTokenClassification"):
        classes = {"AutoModelForMaskedLM": fields["vocab_size"], "AutoModelForPreTraining": 2}
        labels = torch.randint(0, classes.get(auto_name, fields.get("num_labels", 2)), shape, generator=generator)
        return {"labels": labels.masked_fill(~mask, -100)}
    if auto_name == "AutoModelForSequenceClassification":
        if fields.get("num_labels", 2) == 1:
            return {"labels": torch.randn(shape[0], generator=generator)}
        return {"labels": torch.randint(0, fields.get("num_labels", 2), (shape[0],), generator=generator)}
    if auto_name == "AutoModelForQuestionAnswering":
        lengths = mask.sum(-1)
        start = (torch.rand(shape[0], generator=generator) * lengths).long()
        end = start + (torch.rand(shape[0], generator=generator) * (lengths - start)).long()
        return {"start_positions": start, "end_positions": end}
    return {}


def readout(output, auto_name: str, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """A fixed random weighting of every output at real tokens and of every per-row output of rows holding one (zero
    weight elsewhere)."""
    generator = torch.Generator().manual_seed(seed)
    loss = torch.zeros(())
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.dim():
            keep = mask if per_token(auto_name, key) else mask.any(-1)
            weights = torch.randn(value.shape, generator=generator, dtype=value.dtype)
            loss = loss + (value * weights * keep.view(*keep.shape, *[1] * (value.dim() - keep.dim()))).sum()
    return loss


@models
def test_padding_free_training_gives_the_padded_loss_and_gradients(name):
    """A training step (dropout off) has a finite loss and finite gradients, in float32 and float64, and the
    padding-free pass gives the padded pass's loss and every parameter's gradient (padding contributes nothing to any
    of them): the head's loss, or for the base model a fixed random weighting of the outputs at real tokens and of rows
    holding one. Compared in float64 for every model: gradients sum over tokens and small norms amplify them, so in
    float32 the two paths' roundoff reaches 2e-4 of a gradient's largest entry (RoFormer, embedding_size 2, linear
    attention), while in float64 they agree to 1e-14."""
    strategy = STRATEGIES[name]

    @examples(strategy.examples["gradients"])
    @given(case=strategy.cases(), seed=st.integers(0, 2**16))
    def check(case, seed):
        model = strategy.build(case, **{key: 0.0 for key in case.fields if "dropout" in key}).train()
        batch = case.batch
        labels = training_labels(case.auto_name, case.fields, batch, torch.Generator().manual_seed(seed))
        if labels:  # a fully padded row has no first token to classify
            keep = real_mask(batch).any(-1)
            batch = {key: value[keep] if value.shape[0] == keep.shape[0] else value for key, value in batch.items()}
            labels = training_labels(case.auto_name, case.fields, batch, torch.Generator().manual_seed(seed))
        mask = real_mask(batch)

        def loss_and_gradients(mode, dtype):
            model.zero_grad()
            inputs = {key: value.to(dtype) if value.is_floating_point() else value for key, value in batch.items()}
            targets = {key: value.to(dtype) if value.is_floating_point() else value for key, value in labels.items()}
            output = run(model, strategy.backends[-1], mode, inputs, grad=True, **targets)
            loss = output.loss if labels else readout(output, case.auto_name, mask, seed)
            loss.backward()
            gradients = {key: p.grad.clone() for key, p in model.named_parameters() if p.grad is not None}
            assert torch.isfinite(loss), (mode, dtype)
            assert all(torch.isfinite(g).all() for g in gradients.values()), (mode, dtype)
            return loss.detach(), gradients

        for dtype in (torch.float32, torch.float64):
            model.to(dtype)
            (padded_loss, padded), (packed_loss, packed) = (loss_and_gradients(mode, dtype) for mode in PATHS)
        # a head's loss is a mean; the base model's readout a sum over tokens
        assert_close(packed_loss, padded_loss, "loss", GRADIENT_TOLERANCE, relative=not labels)
        for key in padded.keys() | packed.keys():  # no gradient is a zero one (a batch of padding only packs nothing)
            gradient = padded[key] if key in padded else torch.zeros_like(packed[key])
            actual = packed[key] if key in packed else torch.zeros_like(gradient)
            assert_close(actual, gradient, f"gradient of {key}", GRADIENT_TOLERANCE, relative=True)

    check()


# ---------------------------------------------------------------------------------------------------------------------
# Invalid inputs: one argument of a valid call broken, an error naming it (the checks of models/inputs.py)
# ---------------------------------------------------------------------------------------------------------------------


def replace(**changes):
    """A corruption setting each argument of `changes` to its function of the drawn value."""
    return lambda value, batch: {**batch, **{key: change(value) for key, change in changes.items()}}


def shared_invalid_inputs(model, batch: dict) -> dict:
    """kind -> (function of a drawn value and the batch giving the broken arguments, strategy of the value, what the
    error must name): the checks every model's inputs go through."""
    config = model.config
    ids = batch["input_ids"]
    rows, width = ids.shape
    embedding_size = model.get_input_embeddings().embedding_dim
    embeds = torch.zeros(rows, width, embedding_size)
    per_token_shapes = st.sampled_from([(rows, width + 1), (rows + 1, width), (width,), (rows, width, 2)]) | st.tuples(
        st.just(rows), st.integers(0, width - 1)
    )
    table = {
        "input_ids out of range": (
            replace(input_ids=lambda v: ids.clone().index_fill_(1, torch.tensor([v[1] % width]), v[0])),
            st.tuples(
                st.integers(max_value=-1) | st.integers(min_value=config.vocab_size), st.integers(0, width - 1)
            ).filter(lambda v: abs(v[0]) < 2**62),
            "input_ids",
        ),
        "input_ids of another rank": (
            replace(input_ids=lambda v: ids[0] if v else ids[..., None]),
            st.booleans(),
            "input_ids",
        ),
        "ids of a floating or bool dtype": (
            lambda v, batch: {**batch, v[0]: ids.to(v[1])},
            st.tuples(
                st.sampled_from(["input_ids", "token_type_ids", "position_ids"]),
                st.sampled_from([torch.float32, torch.float64, torch.bool]),
            ),
            "(input_ids|token_type_ids|position_ids) must hold integers",
        ),
        "a list instead of a tensor": (
            lambda v, batch: {**batch, v: ids.tolist()},
            st.sampled_from(["input_ids", "attention_mask", "token_type_ids", "position_ids"]),
            "(input_ids|attention_mask|token_type_ids|position_ids) must be a torch.Tensor",
        ),
        "token_type_ids of another shape": (
            replace(token_type_ids=lambda v: torch.zeros(v, dtype=torch.long)),
            per_token_shapes,
            "token_type_ids",
        ),
        "position_ids of another shape": (
            replace(position_ids=lambda v: torch.zeros(v, dtype=torch.long)),
            per_token_shapes,
            "position_ids",
        ),
        "attention_mask of another shape": (
            replace(attention_mask=lambda v: torch.ones(rows + v[0], width + v[1], dtype=torch.long)),
            st.tuples(st.integers(0, 2), st.integers(-width + 1, 3)).filter(lambda v: v != (0, 0)),
            "attention_mask",
        ),
        "inputs_embeds of another width": (
            lambda v, batch: {"inputs_embeds": torch.zeros(rows, width, embedding_size + v)},
            st.integers(-embedding_size + 1, 3).filter(lambda v: v != 0),
            "inputs_embeds",
        ),
        "inputs_embeds of another rank": (
            lambda v, batch: {"inputs_embeds": embeds[0]},
            st.just(None),
            "inputs_embeds",
        ),
        "inputs_embeds of another dtype": (
            lambda v, batch: {"inputs_embeds": embeds.to(v)},
            st.sampled_from([torch.float64, torch.float16, torch.bfloat16, torch.long, torch.bool]),
            "inputs_embeds",
        ),
        "both input_ids and inputs_embeds": (
            lambda v, batch: {**batch, "inputs_embeds": embeds},
            st.just(None),
            "input_ids or inputs_embeds",
        ),
        "neither input_ids nor inputs_embeds": (
            lambda v, batch: {key: value for key, value in batch.items() if key != "input_ids"},
            st.just(None),
            "input_ids or inputs_embeds",
        ),
        "an empty batch": (
            lambda v, batch: {v: ids[:0] if v == "input_ids" else embeds[:0]},
            st.sampled_from(["input_ids", "inputs_embeds"]),
            r"(input_ids|inputs_embeds) holds an empty batch",
        ),
        "an empty sequence": (lambda v, batch: {"input_ids": ids[:, :0]}, st.just(None), "empty"),
    }
    if config.type_vocab_size > 0:
        table["token_type_ids out of range"] = (
            replace(token_type_ids=lambda v: torch.full_like(ids, v)),
            st.sampled_from([-100, -1]) | st.integers(config.type_vocab_size, config.type_vocab_size + 5),
            "token_type_ids",
        )
    # A flattened batch of the rows' first tokens (as many as an absolute position table, if any, takes).
    limit = position_limit(model) or rows * width
    cut = min(width, limit // rows)
    if not cut:
        return table
    flat_ids = ids[:, :cut].flatten()[None]
    flat_positions = torch.arange(cut).repeat(rows)[None]
    cu_seq_lens = torch.arange(rows + 1, dtype=torch.int32) * cut
    table["cu_seq_lens without position_ids"] = (
        lambda v, batch: {"input_ids": flat_ids, "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens},
        st.just(None),
        "position_ids",
    )
    table["cu_seq_lens_q and cu_seq_lens_k that differ"] = (
        lambda v, batch: {
            "input_ids": flat_ids,
            "position_ids": flat_positions,
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens + torch.tensor([0] * rows + [v], dtype=torch.int32),
        },
        st.integers(1, 3),
        "cu_seq_lens_q and cu_seq_lens_k",
    )
    if rows > 1 and cut > 1:  # a flattened batch (restarting position_ids) with a padding mask
        table["a flattened batch with padding"] = (
            lambda v, batch: {
                "input_ids": flat_ids,
                "position_ids": flat_positions,
                "attention_mask": torch.ones_like(flat_ids).index_fill_(1, torch.tensor([v % flat_ids.shape[1]]), 0),
            },
            st.integers(1, 100),
            "attention_mask",
        )
    return table


@models
def test_invalid_input_is_refused_naming_it(name):
    """One argument of a valid call broken (ids out of range, a wrong dtype, type, rank or shape, both or neither of
    input_ids and inputs_embeds, an empty batch or sequence, a contradicted flattened batch, and each model's own
    rules): a ValueError or TypeError naming it in every padding-free mode, never an error from inside torch."""
    strategy = STRATEGIES[name]

    @examples(strategy.examples["invalid_input"])
    @given(case=strategy.cases(), data=st.data())
    def check(case, data):
        model, batch = strategy.build(case), dict(case.batch)
        if "input_ids" not in batch:
            batch.pop("inputs_embeds")
            generator = torch.Generator().manual_seed(0)
            batch["input_ids"] = torch.randint(0, model.config.vocab_size, real_mask(batch).shape, generator=generator)
        batch = without_token_index_positions(batch)
        table = shared_invalid_inputs(model, batch)
        for kind, (corrupt, named) in strategy.invalid_inputs(model, batch).items():
            table[kind] = (lambda value, batch, corrupt=corrupt: corrupt(batch), st.just(None), named)
        kind = data.draw(st.sampled_from(sorted(table)), label="corruption")
        corrupt, values, named = table[kind]
        arguments = corrupt(data.draw(values, label=kind), batch)
        for mode in UNPAD_MODES:
            with pytest.raises((ValueError, TypeError), match=named):
                run(model, strategy.backends[-1], mode, arguments)

    check()


@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        # errors from inside nn.Embedding, a LayerNorm or sdpa, or an AttributeError
        ({"input_ids": torch.ones(2, 5)}, TypeError, r"^input_ids must hold integers \(torch.long or torch.int\)"),
        ({"input_ids": [[1] * 5] * 2}, TypeError, r"^input_ids must be a torch.Tensor, got list"),
        ({"token_type_ids": torch.zeros(2, 5)}, TypeError, r"^token_type_ids must hold integers"),
        ({"token_type_ids": torch.zeros(2, 5).bool()}, TypeError, r"^token_type_ids must hold integers"),
        ({"position_ids": torch.arange(5.0)[None]}, TypeError, r"^position_ids must hold integers"),
        ({"attention_mask": [[1] * 5] * 2}, TypeError, r"^attention_mask must be a torch.Tensor"),
        # "mixed dtype (CPU): all inputs must share same datatype", and integer embeddings were taken as they were
        ({"inputs_embeds": torch.zeros(2, 5, 32).double()}, TypeError, r"^inputs_embeds must have the model's dtype"),
        ({"inputs_embeds": torch.zeros(2, 5, 32).long()}, TypeError, r"^inputs_embeds must have the model's dtype"),
        # "cannot reshape tensor of 0 elements into shape [0, 4, -1]"
        ({"input_ids": torch.ones(0, 5).long()}, ValueError, r"^input_ids holds an empty batch \(batch = 0\)"),
        ({"inputs_embeds": torch.zeros(0, 5, 32)}, ValueError, r"^inputs_embeds holds an empty batch"),
    ],
)
@models
def test_inputs_that_used_to_fail_inside_torch_are_refused_by_name(name, inputs, error, message):
    model = REGISTRY[name].build("AutoModel")
    if "input_ids" not in inputs and "inputs_embeds" not in inputs:
        inputs = {"input_ids": torch.ones(2, 5, dtype=torch.long), **inputs}
    with pytest.raises(error, match=message):
        model(**inputs)


@models
def test_inputs_embeds_of_another_dtype_are_taken_under_autocast(name):
    """Under autocast, bfloat16 embeddings (say, from another autocast computation) into a float32 model are not
    refused: autocast casts what enters each matmul, and the outputs are finite and close to those of the same
    values in float32 without autocast."""
    model = REGISTRY[name].build("AutoModel")
    embeds = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad():
        expected = model(inputs_embeds=embeds.float()).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = model(inputs_embeds=embeds).last_hidden_state
    assert torch.isfinite(output).all()
    assert (output.float() - expected).abs().max() < 0.1  # bfloat16 keeps 8 bits of mantissa


# DeBERTa is left out: without token types (its tiny config has type_vocab_size 0) the bfloat16 embeddings reach its
# embedding LayerNorm as they are, which CPU autocast runs in bfloat16, so its hidden states stay bfloat16 and differ
# by ~0.03 from those of the same values in float32.
@pytest.mark.parametrize("name", ["roformer", "littlebird"])
def test_inputs_embeds_under_autocast_give_what_the_same_float32_values_give(name):
    model = REGISTRY[name].build("AutoModel")
    embeds = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        mixed = model(inputs_embeds=embeds).last_hidden_state
        same = model(inputs_embeds=embeds.float()).last_hidden_state
    assert torch.equal(mixed, same)


# ---------------------------------------------------------------------------------------------------------------------
# Invalid configs: one field every config has (models/configuration_common.py) made invalid, an error naming it
# ---------------------------------------------------------------------------------------------------------------------


def shared_bad_fields(fields: dict) -> dict:
    """field -> a strategy of values that make a valid config of `fields` invalid, for every field all configs
    share."""
    vocab_size = fields["vocab_size"]
    bad_id = st.one_of(
        st.integers(max_value=-1), st.integers(min_value=vocab_size), st.floats(), st.booleans(), st.text(max_size=3)
    )
    table = {
        name: BAD_POSITIVE_INTEGER
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    }
    # heads that do not divide the hidden size
    table["num_attention_heads"] = BAD_POSITIVE_INTEGER | st.integers(1, 64).filter(lambda h: fields["hidden_size"] % h)
    not_a_choice = st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans())
    return table | {
        "type_vocab_size": st.one_of(st.integers(max_value=-1), st.floats(), NOT_A_NUMBER, st.just("2")),
        "hidden_dropout_prob": BAD_PROBABILITY,
        "attention_probs_dropout_prob": BAD_PROBABILITY,
        "layer_norm_eps": BAD_EPSILON,
        "initializer_range": BAD_RANGE,
        "pad_token_id": bad_id | st.just("0"),
        "question_token_id": bad_id | st.just("3"),
        "hidden_act": st.one_of(
            st.text(max_size=8).filter(lambda name: name not in ACT2FN),
            st.integers(),
            st.none(),
            st.lists(st.integers() | st.just("gelu"), max_size=1),
        ),
        "unpad_inputs": not_a_choice.filter(lambda mode: mode not in UNPAD_MODES),
        "qa_head": not_a_choice.filter(lambda head: head not in QA_HEADS),
    }


@models
def test_invalid_shared_field_is_refused_naming_it(name):
    """One field every config has, made invalid in a valid config (wrong type, out of range, inconsistent with another
    field): a ValueError or TypeError naming it, on creation and again when a model is built from a config changed
    later."""
    strategy = STRATEGIES[name]
    config_class = REGISTRY[name].config_class

    @examples(strategy.examples["invalid_config"])
    @given(case=strategy.cases(), data=st.data())
    def check(case, data):
        table = shared_bad_fields(case.fields)
        field = data.draw(st.sampled_from(sorted(table)), label="field")
        value = data.draw(table[field], label=field)
        # DeBERTa's attention_head_size lets heads leave part of the hidden size: drop it to break the heads
        fields = {key: value for key, value in case.fields.items() if key != "attention_head_size"}
        with pytest.raises((ValueError, TypeError), match=rf"\b{field}\b"):
            config_class(**{**fields, field: value})
        config = config_class(**fields)
        setattr(config, field, value)
        with pytest.raises((ValueError, TypeError), match=rf"\b{field}\b"):
            REGISTRY[name].heads["AutoModel"](config)

    check()


# Each once accepted (NaN outputs), or refused late (torch's init, nn.Dropout, nn.Embedding's padding_idx, a bare
# comparison, a dict lookup) with a message naming nothing: field -> (what the error says after the field, the values).
FIELD_REGRESSIONS = {
    "layer_norm_eps": (
        "must be positive and finite, got {!r}",
        (-1.0, 0.0, -1e-5, "1e-7", "x", math.nan, math.inf, True),
    ),
    "initializer_range": ("must be a number >= 0 (a finite int or float), got {!r}", (-0.02, -1.0, math.nan, "0.02")),
    "hidden_act": ("must be the name of an activation in transformers' ACT2FN, got {!r}", (["gelu"], "swish-ish")),
    "pad_token_id": ("({!r}) must be None or an integer in [0, vocab_size=99)", ("3", 2.5, True)),
    "hidden_dropout_prob": ("must be in [0, 1), got {!r}", (None,)),
    "unpad_inputs": ("must be one of ('auto', 'always', 'never'), got {!r}", ("sometimes", "yes", True, None)),
    # was named embedding_size, which defaults to it
    "hidden_size": ("must be a positive integer, got {!r}", ("16",)),
}
FIELD_VALUES = [(field, value) for field, (_, values) in FIELD_REGRESSIONS.items() for value in values]


@pytest.mark.parametrize(("field", "value"), FIELD_VALUES, ids=[f"{field}={value!r}" for field, value in FIELD_VALUES])
@models
def test_shared_field_values_that_used_to_fail_late_or_silently_are_refused(name, field, value):
    """Refused on creation, and when a model is built from a config set to it later, with a ValueError that names
    the config's field and the value."""
    entry = REGISTRY[name]
    message = f"{entry.config_class.__name__}.{field} {FIELD_REGRESSIONS[field][0].format(value)}"
    with pytest.raises(ValueError, match=re.escape(message)):
        entry.config(**{field: value})
    config = entry.config()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        entry.heads["AutoModel"](config)


@models
def test_padding_free_mode_defaults_to_auto(name):
    assert REGISTRY[name].config().unpad_inputs == "auto"
