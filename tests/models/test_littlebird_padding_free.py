"""Padding-free execution of LittleBird (config.unpad_inputs, flattened batches): the packed path against the padded.

Every comparison runs the SAME weights twice: `unpad_inputs="never"` (the padded path, itself checked against a
dense reference in test_littlebird.py) and "always" / "auto" (the packed path, its attention per length group of
examples). Outputs at real tokens, pack states of rows with real tokens, losses and parameter gradients must agree.
"""

import pytest
import torch
from transformers import DataCollatorWithFlattening, PreTrainedModel

from posformers import modeling_littlebird
from posformers.configuration_littlebird import LittleBirdConfig
from posformers.modeling_littlebird import (
    LittleBirdForMaskedLM,
    LittleBirdForMultipleChoice,
    LittleBirdForQuestionAnswering,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    LittleBirdModel,
)
from posformers.packing import pack_padded
from tests.helpers.modeling import check_activation_checkpointing, max_diff, tiny_config

TOLERANCE = 1e-5
VOCAB = 99
BLOCK = 4  # the tiny config's block_size

# Row lengths of a right-padded batch (its width last): mixed, on and off block boundaries (multiples of the block
# size and +-1), a row of padding only, a batch of one, length 1, and no padding at all.
CASES = {
    "mixed": ([17, 11, 5, 8], 17),
    "block_boundaries": ([4 * BLOCK, 4 * BLOCK - 1, 4 * BLOCK + 1, 2 * BLOCK, 2 * BLOCK + 1, BLOCK - 1, BLOCK], 19),
    "one_row_of_padding": ([13, 0, 6], 13),
    "batch_of_one": ([9], 12),
    "length_one": ([1, 6, 1], 6),
    "long_and_short": ([41, 3], 41),
    "no_padding": ([10, 10], 10),
}


def tiny_model(model_class=LittleBirdModel, seed=0, **overrides):
    """A tiny model with distinct slopes per head and layer, so that mixing examples or heads up cannot go unseen."""
    torch.manual_seed(seed)
    model = model_class(tiny_config(LittleBirdConfig, **overrides)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, modeling_littlebird.LittleBirdSelfAttention):
                for slope in (module.alpha, module.beta, module.gamma):
                    slope.copy_(torch.rand(slope.shape, generator=generator) * 0.5 + 0.05)
    return model


def set_mode(model, mode: str):
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.config.unpad_inputs = mode


def padded_batch(lengths, width, seed=0):
    """(input_ids, attention_mask, token_type_ids), right-padded; token types switch to 1 at a third of each row."""
    generator = torch.Generator().manual_seed(seed)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator) * attention_mask
    token_type_ids = (torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None] // 3).long() * attention_mask
    return input_ids, attention_mask, token_type_ids


def run(model, mode, loss_of, **inputs):
    """model(**inputs) with unpad_inputs=mode: its outputs and the parameter gradients of loss_of(outputs)."""
    set_mode(model, mode)
    model.zero_grad()
    outputs = model(**inputs)
    loss_of(outputs).backward()
    return outputs, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(actual, expected):
    """Equal to 1e-5, relative where a gradient is large (the pack embeddings' reach a few hundred)."""
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=TOLERANCE, atol=TOLERANCE, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# The base model on padded batches
# ---------------------------------------------------------------------------------------------------------------------


def readout(hidden_size, seed=1):
    return torch.randn(hidden_size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("mode", ["always", "auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_base_model_matches_the_padded_path(case, mode, training):
    lengths, width = CASES[case]
    input_ids, attention_mask, token_type_ids = padded_batch(lengths, width)
    model = tiny_model().train(training)
    weights, real_rows = readout(model.config.hidden_size), torch.tensor(lengths) > 0

    def loss_of(outputs):
        tokens = outputs.last_hidden_state[attention_mask.bool()] @ weights
        packs = outputs.pack_states[real_rows] @ weights
        return tokens.square().mean() + packs.square().mean()

    inputs = dict(
        input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, output_hidden_states=True
    )
    expected, expected_grads = run(model, "never", loss_of, **inputs)
    actual, actual_grads = run(model, mode, loss_of, **inputs)

    assert actual.last_hidden_state.shape == expected.last_hidden_state.shape
    assert max_diff(actual.last_hidden_state, expected.last_hidden_state, attention_mask) <= TOLERANCE
    for got, want in zip(actual.hidden_states, expected.hidden_states, strict=True):
        assert max_diff(got, want, attention_mask) <= TOLERANCE
    for got, want in zip(actual.pack_hidden_states, expected.pack_hidden_states, strict=True):
        assert max_diff(got[real_rows], want[real_rows]) <= TOLERANCE
    assert actual.pack_states.shape == expected.pack_states.shape
    assert max_diff(actual.pack_states[real_rows], expected.pack_states[real_rows]) <= TOLERANCE
    packed = mode == "always" or not bool(attention_mask.all())
    if packed:  # the packed path leaves zeros where the padded one leaves finite garbage
        padding = ~attention_mask.bool()
        for states in (actual.last_hidden_state, *actual.hidden_states):
            assert not states[padding].any()
    assert_same_gradients(actual_grads, expected_grads)


def test_groups_of_different_widths_give_each_example_its_own_rows():
    """Lengths so far apart that the cost model attends them in separate groups (widths 44 and 4, not the batch's
    45), the rows in another order than the batch's: results and pack states still land on their own rows."""
    lengths, width = [2, 41, 3, 1], 45
    input_ids, attention_mask, token_type_ids = padded_batch(lengths, width, seed=3)
    model = tiny_model()
    packing = pack_padded(attention_mask)
    assert [group.width for group in packing.groups(BLOCK)] == [44, 4]
    outputs = {}
    for mode in ("never", "always"):
        set_mode(model, mode)
        with torch.no_grad():
            outputs[mode] = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    assert max_diff(outputs["always"].last_hidden_state, outputs["never"].last_hidden_state, attention_mask) <= 1e-5
    assert max_diff(outputs["always"].pack_states, outputs["never"].pack_states) <= 1e-5
    # and each row is what the example gives alone (no padding, the padded path)
    for row, length in enumerate(lengths):
        with torch.no_grad():
            alone = model(input_ids[row : row + 1, :length], token_type_ids=token_type_ids[row : row + 1, :length])
        assert max_diff(outputs["always"].last_hidden_state[row, :length], alone.last_hidden_state[0]) <= 1e-5
        assert max_diff(outputs["always"].pack_states[row], alone.pack_states[0]) <= 1e-5


def test_inputs_embeds_and_broadcast_token_types_are_packed_like_input_ids():
    model = tiny_model(unpad_inputs="always")
    input_ids, attention_mask, _ = padded_batch([9, 4, 6], 9)
    token_type_ids = (torch.arange(9) >= 3).long()[None]  # (1, L), broadcast over the batch
    with torch.no_grad():
        embeds = model.get_input_embeddings()(input_ids)
        actual = model(inputs_embeds=embeds, attention_mask=attention_mask, token_type_ids=token_type_ids)
        set_mode(model, "never")
        expected = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids.expand(3, -1))
    assert max_diff(actual.last_hidden_state, expected.last_hidden_state, attention_mask) <= TOLERANCE


def test_auto_runs_the_padded_path_without_padding_and_packs_with_it(monkeypatch):
    model = tiny_model()
    built = []
    original = modeling_littlebird.group_layouts

    def spy(config, packing, dtype):  # every layer asks; the packings of the packed passes, once each
        if not any(packing is seen for seen in built):
            built.append(packing)
        return original(config, packing, dtype)

    monkeypatch.setattr(modeling_littlebird, "group_layouts", spy)
    input_ids, attention_mask, _ = padded_batch([10, 10], 10)
    with torch.no_grad():
        model(input_ids)
        model(input_ids, attention_mask=attention_mask)
    assert built == []  # no padding: no gather, the padded path untouched
    set_mode(model, "always")
    with torch.no_grad():
        model(input_ids)
    assert len(built) == 1 and built[0].lengths == [10, 10]
    set_mode(model, "auto")
    input_ids, attention_mask, _ = padded_batch([10, 4], 10)
    with torch.no_grad():
        model(input_ids, attention_mask=attention_mask)
    assert len(built) == 2 and built[1].lengths == [10, 4]


def test_auto_keeps_the_padded_path_where_packing_is_ruled_out(monkeypatch):
    """output_attentions (weights in the padded blocked layout) and Padding Insertion (padding between real tokens,
    which keeps its positions) run padded in "auto"; "always" refuses them by name."""
    monkeypatch.setattr(modeling_littlebird, "group_layouts", None)  # any packed pass would fail
    model = tiny_model()
    input_ids, attention_mask, _ = padded_batch([10, 6], 10)
    inserted = attention_mask.clone()
    inserted[0, 3:5] = 0
    with torch.no_grad():
        assert model(input_ids, attention_mask=attention_mask, output_attentions=True).attentions is not None
        model(input_ids, attention_mask=inserted)
    set_mode(model, "always")
    with pytest.raises(ValueError, match=r"unpad_inputs='always'.*output_attentions"):
        model(input_ids, attention_mask=attention_mask, output_attentions=True)
    with pytest.raises(ValueError, match=r"unpad_inputs='always'.*attention_mask is not right-padded"):
        model(input_ids, attention_mask=inserted)


# ---------------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------------

HEAD_LENGTHS, HEAD_WIDTH = [17, 11, 5, 8], 17


def head_inputs(head_class):
    """Inputs with labels for one head on a mixed-length batch; labels -100 at padded positions."""
    input_ids, attention_mask, token_type_ids = padded_batch(HEAD_LENGTHS, HEAD_WIDTH)
    generator = torch.Generator().manual_seed(5)
    batch = len(HEAD_LENGTHS)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    if head_class is LittleBirdForMultipleChoice:
        return {
            **{key: value.view(2, 2, HEAD_WIDTH) for key, value in inputs.items()},
            "labels": torch.tensor([1, 0]),
        }
    if head_class in (LittleBirdForMaskedLM, LittleBirdForTokenClassification):
        classes = VOCAB if head_class is LittleBirdForMaskedLM else 2
        labels = torch.randint(0, classes, input_ids.shape, generator=generator)
        return {**inputs, "labels": labels.masked_fill(~attention_mask.bool(), -100)}
    if head_class is LittleBirdForSequenceClassification:
        return {**inputs, "labels": torch.tensor([0, 1, 1, 0])}
    lengths = torch.tensor(HEAD_LENGTHS)
    start = (torch.rand(batch, generator=generator) * lengths).long()
    return {**inputs, "start_positions": start, "end_positions": torch.minimum(start + 2, lengths - 1)}


def head_outputs(outputs):
    return {key: value for key, value in outputs.items() if key in ("logits", "start_logits", "end_logits")}


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("mode", ["always", "auto"])
@pytest.mark.parametrize(
    "head_class",
    [
        LittleBirdForMaskedLM,
        LittleBirdForSequenceClassification,
        LittleBirdForTokenClassification,
        LittleBirdForQuestionAnswering,
        LittleBirdForMultipleChoice,
    ],
)
def test_heads_match_the_padded_path(head_class, mode, training):
    model = tiny_model(head_class).train(training)
    inputs = head_inputs(head_class)
    expected, expected_grads = run(model, "never", lambda outputs: outputs.loss, **inputs)
    actual, actual_grads = run(model, mode, lambda outputs: outputs.loss, **inputs)
    assert abs(actual.loss.item() - expected.loss.item()) <= TOLERANCE
    token_level = head_class in (LittleBirdForMaskedLM, LittleBirdForTokenClassification)
    mask = inputs["attention_mask"] if token_level else None
    for key, value in head_outputs(expected).items():
        assert actual[key].shape == value.shape, key
        # QA logits are the lowest value at padded positions in both modes, so they are compared everywhere
        assert max_diff(actual[key], value, mask) <= TOLERANCE, key
    if token_level:  # computed on real tokens only: zeros at padded positions
        assert not actual.logits[~inputs["attention_mask"].bool()].any()
    assert_same_gradients(actual_grads, expected_grads)


@pytest.mark.parametrize("mode", ["never", "always", "auto"])
def test_qa_logits_are_lowest_at_padded_positions_in_every_mode(mode):
    model = tiny_model(LittleBirdForQuestionAnswering, unpad_inputs=mode)
    input_ids, attention_mask, _ = padded_batch([9, 4, 0], 9)
    with torch.no_grad():
        outputs = model(input_ids, attention_mask=attention_mask)
    lowest = torch.finfo(torch.float32).min
    for logits in (outputs.start_logits, outputs.end_logits):
        assert (logits[~attention_mask.bool()] == lowest).all()
        assert (logits[attention_mask.bool()] > lowest).all()


# ---------------------------------------------------------------------------------------------------------------------
# Flattened batches (DataCollatorWithFlattening)
# ---------------------------------------------------------------------------------------------------------------------

FLAT_LENGTHS = [9, 1, 4, 13]


def flattened_batch(lengths=FLAT_LENGTHS, **collator_options):
    """Features of the given lengths (input_ids, token_type_ids) and their flattened batch, as transformers'
    DataCollatorWithFlattening builds it (input_ids, labels, position_ids, optionally cu_seq_lens_q/k...)."""
    generator = torch.Generator().manual_seed(7)
    features = [
        {
            "input_ids": torch.randint(1, VOCAB, (n,), generator=generator).tolist(),
            "token_type_ids": [int(i >= n // 2) for i in range(n)],
        }
        for n in lengths
    ]
    ids_only = [{"input_ids": feature["input_ids"]} for feature in features]
    batch = DataCollatorWithFlattening(return_tensors="pt", **collator_options)(ids_only)
    # The collator flattens input_ids and labels only; token types are flattened the same way here.
    batch["token_type_ids"] = torch.tensor([[t for feature in features for t in feature["token_type_ids"]]])
    return features, batch


def alone(model, feature, **kwargs):
    """The model on one example without padding (the padded path)."""
    with torch.no_grad():
        return model(
            torch.tensor([feature["input_ids"]]), token_type_ids=torch.tensor([feature["token_type_ids"]]), **kwargs
        )


@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
def test_flattened_batch_is_each_sequence_alone(flash_kwargs):
    model = tiny_model()
    assert type(model).accepts_flattened_batches is True
    features, batch = flattened_batch(return_flash_attn_kwargs=flash_kwargs)
    assert ("cu_seq_lens_q" in batch) == flash_kwargs
    batch.pop("labels", None)
    with torch.no_grad():
        outputs = model(**batch, output_hidden_states=True)
    assert outputs.last_hidden_state.shape == (1, sum(FLAT_LENGTHS), model.config.hidden_size)
    assert outputs.pack_states.shape == (len(FLAT_LENGTHS), model.config.pack_length, model.config.hidden_size)
    start = 0
    for row, (feature, length) in enumerate(zip(features, FLAT_LENGTHS, strict=True)):
        expected = alone(model, feature, output_hidden_states=True)
        for got, want in zip(outputs.hidden_states, expected.hidden_states, strict=True):
            assert max_diff(got[0, start : start + length], want[0]) <= TOLERANCE
        assert max_diff(outputs.pack_states[row], expected.pack_states[0]) <= TOLERANCE
        start += length


def test_flattened_batch_through_the_heads():
    features, batch = flattened_batch()
    batch.pop("labels")
    lengths = torch.tensor(FLAT_LENGTHS)
    classifier = tiny_model(LittleBirdForSequenceClassification)
    tagger = tiny_model(LittleBirdForTokenClassification)
    reader = tiny_model(LittleBirdForQuestionAnswering)
    with torch.no_grad():
        classes = classifier(**batch, labels=torch.tensor([0, 1, 1, 0]))
        tags = tagger(**batch)
        spans = reader(**batch, start_positions=torch.tensor([1, 0, 2, 5]), end_positions=torch.tensor([3, 0, 2, 9]))
    assert classes.logits.shape == (len(FLAT_LENGTHS), 2) and torch.isfinite(classes.loss)
    assert tags.logits.shape == (1, sum(FLAT_LENGTHS), 2)
    assert spans.start_logits.shape == (len(FLAT_LENGTHS), max(FLAT_LENGTHS)) and torch.isfinite(spans.loss)
    lowest = torch.finfo(torch.float32).min
    beyond = torch.arange(max(FLAT_LENGTHS))[None, :] >= lengths[:, None]
    assert (spans.start_logits[beyond] == lowest).all() and (spans.end_logits[~beyond] > lowest).all()
    start = 0
    for row, (feature, length) in enumerate(zip(features, FLAT_LENGTHS, strict=True)):
        assert max_diff(classes.logits[row], alone(classifier, feature).logits[0]) <= TOLERANCE
        assert max_diff(tags.logits[0, start : start + length], alone(tagger, feature).logits[0]) <= TOLERANCE
        expected = alone(reader, feature)
        assert max_diff(spans.start_logits[row, :length], expected.start_logits[0]) <= TOLERANCE
        assert max_diff(spans.end_logits[row, :length], expected.end_logits[0]) <= TOLERANCE
        start += length


def test_flattened_batch_gradients_match_the_padded_batch():
    """The MLM loss of a flattened batch (labels -100 at each sequence's first token, as the collator writes them)
    and its gradients equal those of the same sequences right-padded."""
    features, batch = flattened_batch()
    model = tiny_model(LittleBirdForMaskedLM)
    flat, flat_grads = run(model, "auto", lambda outputs: outputs.loss, **batch)
    input_ids, attention_mask, _ = padded_batch(FLAT_LENGTHS, max(FLAT_LENGTHS))
    token_type_ids = torch.zeros_like(input_ids)
    for row, feature in enumerate(features):
        input_ids[row, : len(feature["input_ids"])] = torch.tensor(feature["input_ids"])
        token_type_ids[row, : len(feature["input_ids"])] = torch.tensor(feature["token_type_ids"])
    labels = input_ids.masked_fill(~attention_mask.bool(), -100)
    labels[:, 0] = -100
    padded, padded_grads = run(
        model,
        "never",
        lambda outputs: outputs.loss,
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        labels=labels,
    )
    assert abs(flat.loss.item() - padded.loss.item()) <= TOLERANCE
    assert_same_gradients(flat_grads, padded_grads)


def test_multiple_choice_refuses_a_flattened_batch():
    model = tiny_model(LittleBirdForMultipleChoice)
    _, batch = flattened_batch()
    with pytest.raises(ValueError, match="position_ids"):
        model(batch["input_ids"][:, None], position_ids=batch["position_ids"][:, None])


# ---------------------------------------------------------------------------------------------------------------------
# Precision, compilation, checkpointing, bad input
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_packed_without_nan(dtype):
    model = tiny_model(LittleBirdForQuestionAnswering, unpad_inputs="always").to(dtype)
    input_ids, attention_mask, token_type_ids = padded_batch([23, 10, 0, 1], 23)
    with torch.no_grad():
        outputs = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        _, batch = flattened_batch()
        batch.pop("labels")
        flat = model(**batch)
    for logits in (outputs.start_logits, outputs.end_logits, flat.start_logits):
        assert logits.dtype == dtype and torch.isfinite(logits).all()


@pytest.mark.slow
def test_torch_compile_runs_the_packed_path():
    model = tiny_model(LittleBirdForMaskedLM, unpad_inputs="always")
    input_ids, attention_mask, token_type_ids = padded_batch([17, 11, 5], 17)
    compiled = torch.compile(model)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
        actual = compiled(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
    assert max_diff(expected, actual, attention_mask) <= 1e-4


def test_gradient_checkpointing_gives_the_same_gradients_packed():
    input_ids, attention_mask, token_type_ids = padded_batch([22, 9, 0], 22)
    model = tiny_model(unpad_inputs="always")
    weights = readout(model.config.hidden_size)

    def loss(model):
        outputs = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return (outputs.last_hidden_state[attention_mask.bool()] @ weights).square().mean()

    packed = check_activation_checkpointing(model, loss)
    set_mode(model, "never")
    padded = check_activation_checkpointing(model, loss)
    assert_same_gradients(packed, padded)


def test_left_padding_is_refused_in_every_mode():
    model = tiny_model(unpad_inputs="always")
    input_ids, _, _ = padded_batch([5, 5], 5)
    with pytest.raises(ValueError, match=r"right-padded input.*attention_mask"):
        model(input_ids, attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]))


def test_position_ids_must_count_tokens_or_mark_a_flattened_batch():
    model = tiny_model()
    input_ids, attention_mask, _ = padded_batch([5, 3], 5)
    with torch.no_grad():
        model(input_ids, attention_mask=attention_mask, position_ids=torch.arange(5)[None])
    with pytest.raises(ValueError, match="position_ids must be 0, 1, 2"):
        model(input_ids, attention_mask=attention_mask, position_ids=torch.arange(1, 6)[None])
    with pytest.raises(ValueError, match="position_ids of a flattened batch must count"):
        model(torch.ones(1, 5, dtype=torch.long), position_ids=torch.tensor([[0, 1, 0, 2, 3]]))


@pytest.mark.parametrize("value", ["sometimes", None, True])
def test_unpad_inputs_is_validated(value):
    with pytest.raises(ValueError, match=r"LittleBirdConfig\.unpad_inputs must be one of"):
        tiny_config(LittleBirdConfig, unpad_inputs=value)
