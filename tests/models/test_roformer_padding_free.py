"""RoFormer's padding-free path (`unpad_inputs`, flattened batches) against its padded path on the same weights.

Every comparison runs the same model twice, once with `unpad_inputs="never"` (the padded computation) and once packed,
and compares outputs at real tokens, losses and every parameter's gradient.
"""

import pytest
import torch
from helpers.data import DATA_DIR
from helpers.modeling import (
    check_activation_checkpointing,
    check_flattened_refusals,
    flattened,
    packing_calls,
    sst2_token_ids,
    tiny_config,
)
from transformers import BertTokenizer, DataCollatorWithPadding

from posformers import (
    RoFormerConfig,
    RoFormerForCausalLM,
    RoFormerForMaskedLM,
    RoFormerForMultipleChoice,
    RoFormerForQuestionAnswering,
    RoFormerForSequenceClassification,
    RoFormerForTokenClassification,
    RoFormerModel,
    modeling_roformer,
)

TOLERANCE = 1e-5
HEADS = {
    "base": (RoFormerModel, {"add_pooling_layer": True}),
    "mlm": (RoFormerForMaskedLM, {}),
    "seq-cls": (RoFormerForSequenceClassification, {"num_labels": 3}),
    "multiple-choice-first": (RoFormerForMultipleChoice, {"summary_type": "first"}),
    "multiple-choice-last": (RoFormerForMultipleChoice, {"summary_type": "last"}),
    "multiple-choice-mean": (RoFormerForMultipleChoice, {"summary_type": "mean"}),
    "token-cls": (RoFormerForTokenClassification, {"num_labels": 5}),
    "qa": (RoFormerForQuestionAnswering, {}),
}
# (lengths of the rows, width): real tokens first, padding after.
CASES = {
    "no-padding": ([7, 7, 7], 7),
    "row-of-padding": ([9, 0, 4], 9),
    "batch-of-one": ([5], 8),
    "length-one": ([1, 3, 1], 3),
    "mixed-lengths": ([17, 11, 5, 2], 17),
}
VARIANTS = {
    "interleaved": {},
    "half-rotary-value": {"rope_layout": "half", "rotary_value": True},
    "partial-rotary": {"rotary_dim": 4},
    "linear-kernel": {"attention_kernel": "linear"},
    "v2": {"norm_type": "rms_norm", "use_bias": False},
    "factorised-embeddings": {"embedding_size": 16},
}


def build(head: str, seed: int = 0, **overrides):
    model_class, head_fields = HEADS[head]
    torch.manual_seed(seed)
    return model_class(tiny_config(RoFormerConfig, **{**head_fields, **overrides}))


def padded_batch(lengths, width, seed=0, choices=None):
    """Random input_ids, attention_mask and token_type_ids with rows of `lengths` real tokens, right-padded to
    `width` (with `choices`, every choice of a row has its length)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (len(lengths), width) if choices is None else (len(lengths), choices, width)
    mask = (torch.arange(width) < torch.tensor(lengths).view(-1, *[1] * (len(shape) - 1))).long().expand(shape)
    input_ids = torch.randint(1, 99, shape, generator=generator) * mask
    token_type_ids = (torch.arange(width) >= width // 2).long().expand(shape) * mask
    return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": token_type_ids}


def head_inputs(head: str, lengths, width, seed=0):
    """The head's inputs with labels, and the (rows, width) mask of real tokens."""
    generator = torch.Generator().manual_seed(seed + 1)
    rows = len(lengths)
    if head.startswith("multiple-choice"):
        inputs = padded_batch([max(n, 1) for n in lengths], width, seed, choices=2)
        inputs["labels"] = torch.randint(0, 2, (rows,), generator=generator)
        return inputs, inputs["attention_mask"]
    inputs = padded_batch(lengths, width, seed)
    mask = inputs["attention_mask"]
    if head in ("mlm", "token-cls"):
        size = 99 if head == "mlm" else 5
        inputs["labels"] = torch.randint(0, size, (rows, width), generator=generator).masked_fill(mask == 0, -100)
    elif head == "seq-cls":
        inputs["labels"] = torch.randint(0, 3, (rows,), generator=generator)
    elif head == "qa":
        # answers lie in the real tokens; a row without any gets the ignored position (width)
        for name in ("start_positions", "end_positions"):
            positions = [int(torch.randint(0, n, (), generator=generator)) if n else width for n in lengths]
            inputs[name] = torch.tensor(positions)
    return inputs, mask


def real_outputs(head: str, output, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The outputs that are defined by real tokens: per-token outputs at real tokens, per-sequence outputs of rows
    that have any, QA logits everywhere (the lowest float at padding in every mode)."""
    real, nonempty = mask.bool(), mask.bool().flatten(1).any(-1)
    if head == "base":
        return {"last_hidden_state": output.last_hidden_state[real], "pooler_output": output.pooler_output[nonempty]}
    if head in ("mlm", "token-cls"):
        return {"logits": output.logits[real]}
    if head == "qa":
        return {"start_logits": output.start_logits, "end_logits": output.end_logits}
    return {"logits": output.logits[nonempty]}


def run(model, head: str, inputs: dict, mask: torch.Tensor, mode: str):
    """Outputs at real tokens, the loss, and every parameter's gradient of (loss + a readout of those outputs)."""
    model.config.unpad_inputs = mode
    model.zero_grad()
    output = model(**inputs)
    outputs = real_outputs(head, output, mask)
    generator = torch.Generator().manual_seed(7)
    readout = sum((value * torch.randn(value.shape, generator=generator)).sum() for value in outputs.values())
    nonempty = bool(mask.bool().flatten(1).any(-1).all())
    loss = output.loss if head != "base" and nonempty else None
    (readout + (loss if loss is not None else 0.0)).backward()
    outputs["loss"] = loss.detach() if loss is not None else torch.zeros(())
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {key: value.detach() for key, value in outputs.items()}, gradients, output


def assert_close(actual: dict, expected: dict, what: str):
    """Equal within TOLERANCE, relative to the tensor's largest entry where that exceeds 1 (an embedding gradient
    summed over every token of the batch reaches ~100, where float32 rounding alone is ~1e-5)."""
    assert actual.keys() == expected.keys(), what
    for key, value in expected.items():
        assert actual[key].shape == value.shape, f"{what} {key}"
        if not value.numel():
            continue
        diff = (actual[key] - value).abs().max().item()
        scale = max(1.0, value.abs().max().item())
        assert diff <= TOLERANCE * scale, f"{what} {key}: max abs diff {diff} (largest entry {scale})"


# --- Padded batches: packed == padded --------------------------------------------------------------------------------


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("mode", ["auto", "always"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("head", HEADS)
def test_packed_equals_padded(head, case, mode, training, monkeypatch):
    model = build(head).train(training)
    inputs, mask = head_inputs(head, *CASES[case])
    expected, expected_grads, _ = run(model, head, inputs, mask, "never")
    calls = packing_calls(monkeypatch, modeling_roformer)
    last_read_at_padding = head == "multiple-choice-last" and not bool(mask.bool()[..., -1].all())
    if mode == "always" and last_read_at_padding:  # the padding token's state exists on the padded path only
        with pytest.raises(ValueError, match="keep_padding_states=True returns the states of padded positions"):
            run(model, head, inputs, mask, mode)
        return
    actual, actual_grads, _ = run(model, head, inputs, mask, mode)
    assert_close(actual, expected, "outputs")
    assert_close(actual_grads, expected_grads, "gradients")
    has_padding = not bool(mask.bool().all())
    assert (calls[0] is not None) == (mode == "always" or (has_padding and not last_read_at_padding))


@pytest.mark.parametrize("case", ["row-of-padding", "mixed-lengths", "length-one"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("head", ["base", "mlm"])
def test_packed_equals_padded_for_every_variant(head, variant, case, monkeypatch):
    calls = packing_calls(monkeypatch, modeling_roformer)
    model = build(head, **VARIANTS[variant]).train()
    inputs, mask = head_inputs(head, *CASES[case])
    expected, expected_grads, _ = run(model, head, inputs, mask, "never")
    actual, actual_grads, _ = run(model, head, inputs, mask, "auto")
    assert_close(actual, expected, "outputs")
    assert_close(actual_grads, expected_grads, "gradients")
    assert calls[0] is None and calls[-1] is not None


def test_packed_hidden_states_are_zero_at_padding_and_equal_at_real_tokens():
    model = build("base").eval()
    inputs, mask = head_inputs("base", *CASES["mixed-lengths"])
    with torch.no_grad():
        model.config.unpad_inputs = "never"
        expected = model(**inputs, output_hidden_states=True)
        model.config.unpad_inputs = "auto"
        actual = model(**inputs, output_hidden_states=True)
    real = mask.bool()
    assert len(actual.hidden_states) == len(expected.hidden_states) == 3
    for packed, padded in zip((*actual.hidden_states, actual.last_hidden_state), expected.hidden_states):
        assert packed.shape == padded.shape
        assert (packed[~real] == 0).all()
    for packed, padded in zip(actual.hidden_states, expected.hidden_states):
        assert (packed[real] - padded[real]).abs().max() <= TOLERANCE


def test_token_heads_project_real_tokens_only():
    """The MLM head sees (1, N, d): its projection runs on the real tokens, and padded logits are zeros."""
    model = build("mlm").eval()
    inputs, mask = head_inputs("mlm", *CASES["mixed-lengths"])
    seen = []
    model.cls.register_forward_hook(lambda module, args, output: seen.append(args[0].shape))
    with torch.no_grad():
        logits = model(**inputs).logits
    assert seen == [torch.Size([1, int(mask.sum()), 32])]
    assert (logits[~mask.bool()] == 0).all()


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_qa_logits_are_lowest_at_padding_in_every_mode(mode):
    model = build("qa", unpad_inputs=mode).eval()
    inputs, mask = head_inputs("qa", *CASES["mixed-lengths"])
    with torch.no_grad():
        output = model(**inputs)
    lowest = torch.finfo(torch.float32).min
    for logits in (output.start_logits, output.end_logits):
        assert (logits[~mask.bool()] == lowest).all()
        assert (logits[mask.bool()] > lowest).all()


# --- Blockers and bad input ------------------------------------------------------------------------------------------


def test_auto_keeps_the_padded_path_where_packing_is_ruled_out(monkeypatch):
    calls = packing_calls(monkeypatch, modeling_roformer)
    inputs, mask = head_inputs("base", *CASES["mixed-lengths"])
    model = build("base").eval()
    with torch.no_grad():
        output = model(**inputs, output_attentions=True)
        assert output.attentions[0].shape == (4, 4, 17, 17)
        left = {**inputs, "attention_mask": inputs["attention_mask"].flip(-1)}
        model(**left)
        model(**{**inputs, "attention_mask": mask[:, None, None, :].bool().expand(4, 1, 17, 17)})
    assert calls == [None, None, None]
    decoder = RoFormerForCausalLM(tiny_config(RoFormerConfig, is_decoder=True)).eval()
    with torch.no_grad():
        output = decoder(**inputs)
    assert calls[-1] is None and output.logits.shape == (4, 17, 99)


def test_decoder_heads_read_a_left_padded_row_as_their_base_model_does():
    """A decoder reads a left-padded row's position_ids, which restart at 0 after the padding as `generate` numbers
    them, as given and runs padded; its heads plan the same, not a flattened batch that the padding contradicts."""
    model = build("token-cls", is_decoder=True).eval()
    input_ids = torch.arange(5, 13)[None]
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        alone = model(input_ids[:, 2:], position_ids=position_ids[:, 2:]).logits
    assert logits.shape == (1, 8, 5) and not logits[:, :2].any()
    torch.testing.assert_close(logits[:, 2:], alone)


def test_always_refuses_what_cannot_be_packed():
    inputs, mask = head_inputs("base", *CASES["mixed-lengths"])
    model = build("base", unpad_inputs="always").eval()
    with pytest.raises(ValueError, match="output_attentions"):
        model(**inputs, output_attentions=True)
    with pytest.raises(ValueError, match="attention_mask is not right-padded"):
        model(**{**inputs, "attention_mask": mask.flip(-1)})
    with pytest.raises(ValueError, match="4D attention_mask"):
        model(**{**inputs, "attention_mask": mask[:, None, None, :].bool().expand(4, 1, 17, 17)})
    multiple_choice = build("multiple-choice-last", unpad_inputs="always").eval()
    choice_inputs, _ = head_inputs("multiple-choice-last", *CASES["mixed-lengths"])
    with pytest.raises(ValueError, match="keep_padding_states=True"):
        multiple_choice(**choice_inputs)


def test_unpad_inputs_is_validated():
    with pytest.raises(ValueError, match=r"RoFormerConfig\.unpad_inputs must be one of"):
        tiny_config(RoFormerConfig, unpad_inputs="sometimes")
    config = tiny_config(RoFormerConfig)
    assert config.unpad_inputs == "auto"
    config.unpad_inputs = True
    with pytest.raises(ValueError, match=r"RoFormerConfig\.unpad_inputs"):
        RoFormerModel(config)


def test_accepts_flattened_batches_is_declared():
    assert modeling_roformer.RoFormerPreTrainedModel.accepts_flattened_batches is True


# --- Flattened batches (transformers' DataCollatorWithFlattening) ----------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")


@pytest.fixture(scope="module")
def sentences() -> list[list[int]]:
    """Token ids of SST-2 dev sentences (BERT uncased vocabulary), of different lengths."""
    ids = sst2_token_ids(6)
    assert len({len(i) for i in ids}) > 3
    return ids


def build_for_text(head: str, **overrides):
    return build(head, vocab_size=30522, max_position_embeddings=128, **overrides).eval()


@pytest.mark.parametrize("cu_seq_lens", [False, True], ids=["position-ids", "cu-seq-lens"])
@pytest.mark.parametrize("variant", ["interleaved", "linear-kernel"])
@pytest.mark.parametrize("head", ["base", "mlm", "seq-cls", "token-cls", "qa"])
def test_flattened_batch_equals_each_sequence_alone(head, variant, cu_seq_lens, sentences):
    model = build_for_text(head, **VARIANTS[variant])
    batch = flattened(sentences, cu_seq_lens)
    with torch.no_grad():
        output = model(**batch)
        alone = [model(torch.tensor([s])) for s in sentences]
    if head in ("base", "mlm", "token-cls"):
        name = "last_hidden_state" if head == "base" else "logits"
        expected = torch.cat([getattr(o, name) for o in alone], dim=1)
        assert getattr(output, name).shape == expected.shape
        assert (getattr(output, name) - expected).abs().max() <= TOLERANCE
    if head == "base":
        expected = torch.cat([o.pooler_output for o in alone])
        assert output.pooler_output.shape == expected.shape
        assert (output.pooler_output - expected).abs().max() <= TOLERANCE
    elif head == "seq-cls":
        expected = torch.cat([o.logits for o in alone])
        assert output.logits.shape == (len(sentences), 3)
        assert (output.logits - expected).abs().max() <= TOLERANCE
    elif head == "qa":
        assert output.start_logits.shape == (len(sentences), max(len(s) for s in sentences))
        for row, (sentence, single) in enumerate(zip(sentences, alone)):
            for name in ("start_logits", "end_logits"):
                logits = getattr(output, name)[row]
                assert (logits[: len(sentence)] - getattr(single, name)[0]).abs().max() <= TOLERANCE
                assert (logits[len(sentence) :] == torch.finfo(logits.dtype).min).all()


@pytest.mark.parametrize("head", ["seq-cls", "qa", "mlm"])
def test_flattened_batch_trains_as_the_padded_batch(head, sentences, tokenizer):
    """Loss and gradients of a flattened batch equal those of the same sequences padded (per-sequence labels for
    classification and QA, per-token labels for MLM)."""
    model = build_for_text(head).train()
    count = len(sentences)
    generator = torch.Generator().manual_seed(3)
    padded = DataCollatorWithPadding(tokenizer)([{"input_ids": s} for s in sentences])
    padded.pop("token_type_ids", None)
    flat = flattened(sentences, cu_seq_lens=False)
    if head == "seq-cls":
        padded["labels"] = flat["labels"] = torch.randint(0, 3, (count,), generator=generator)
    elif head == "qa":
        starts = torch.tensor([int(torch.randint(0, len(s), (), generator=generator)) for s in sentences])
        padded["start_positions"] = flat["start_positions"] = starts
        ends = torch.minimum(starts + 2, torch.tensor([len(s) - 1 for s in sentences]))
        padded["end_positions"] = flat["end_positions"] = ends
    else:
        labels = torch.randint(0, 30522, padded["input_ids"].shape, generator=generator)
        padded["labels"] = labels.masked_fill(padded["attention_mask"] == 0, -100)
        flat["labels"] = padded["labels"][padded["attention_mask"].bool()][None]

    def loss_and_gradients(inputs):
        model.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        return {"loss": loss.detach()}, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.config.unpad_inputs = "never"
    expected = loss_and_gradients(padded)
    actual = loss_and_gradients(flat)
    assert_close(actual[0], expected[0], "loss")
    assert_close(actual[1], expected[1], "gradients")


@pytest.mark.parametrize("head_class", [RoFormerForMultipleChoice, RoFormerForCausalLM])
def test_flattened_batch_to_a_head_that_refuses_it_names_position_ids(head_class, sentences):
    model = head_class(tiny_config(RoFormerConfig, vocab_size=30522, is_decoder=head_class is RoFormerForCausalLM))
    batch = flattened(sentences, cu_seq_lens=False)
    with pytest.raises(ValueError, match="position_ids"):
        model(**batch)
    with pytest.raises(ValueError, match="position_ids"):
        model(**flattened(sentences, cu_seq_lens=True))


def test_decoder_reads_restarting_position_ids_of_a_padded_row():
    """`generate` numbers a left-padded prompt 1, 1, 0, 1, 2: with padding in the mask that is no flattened batch."""
    model = RoFormerForCausalLM(tiny_config(RoFormerConfig, is_decoder=True)).eval()
    input_ids = torch.tensor([[0, 0, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    with torch.no_grad():
        output = model(input_ids, attention_mask=mask, position_ids=torch.tensor([[1, 1, 0, 1, 2]]))
    assert output.logits.shape == (1, 5, 99)


def test_contradicting_flattened_inputs_are_refused(sentences):
    model = build_for_text("base")
    batch = flattened(sentences, cu_seq_lens=True)
    check_flattened_refusals(model, batch)
    with pytest.raises(ValueError, match="position_ids of a flattened batch must start at 0"):
        model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"] + 1, cu_seq_lens_q=batch["cu_seq_lens_q"]
        )


def test_always_with_left_padding_names_attention_mask():
    model = build("base", unpad_inputs="always").eval()
    inputs, mask = head_inputs("base", *CASES["mixed-lengths"])
    with pytest.raises(ValueError, match="attention_mask"):
        model(**{**inputs, "attention_mask": mask.flip(-1)})


# --- Precision, compilation, checkpointing ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["interleaved", "linear-kernel"])
def test_half_precision_packed_without_nan(variant, dtype):
    model = build("mlm", unpad_inputs="always", **VARIANTS[variant]).eval().to(dtype)
    inputs, _ = head_inputs("mlm", *CASES["row-of-padding"])
    with torch.no_grad():
        output = model(**inputs)
    assert output.logits.dtype == dtype
    assert not output.logits.isnan().any() and not output.loss.isnan()


def test_torch_compile_runs_the_packed_path():
    model = build("mlm", unpad_inputs="always").eval()
    inputs, _ = head_inputs("mlm", *CASES["mixed-lengths"])
    with torch.no_grad():
        expected = model(**inputs).logits
        actual = torch.compile(model)(**inputs).logits
    assert (actual - expected).abs().max() <= TOLERANCE


@pytest.mark.parametrize("variant", ["interleaved", "linear-kernel"])
@pytest.mark.parametrize("head", ["base", "qa"])
def test_gradient_checkpointing_gives_equal_gradients_packed(head, variant):
    model = build(head, unpad_inputs="always", **VARIANTS[variant])
    inputs, mask = head_inputs(head, *CASES["mixed-lengths"])

    def loss(model):
        output = model(**inputs)
        return output.loss if head != "base" else output.last_hidden_state[mask.bool()].pow(2).mean()

    check_activation_checkpointing(model, loss, atol=TOLERANCE)
