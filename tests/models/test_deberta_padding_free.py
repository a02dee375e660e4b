"""DeBERTa's padding-free execution (`unpad_inputs`, flattened batches) against its padded computation.

Every comparison runs the SAME weights twice: packed (`unpad_inputs="always"` / `"auto"`, or a flattened batch) and
padded (`"never"`, or each sequence alone), and compares outputs at real tokens and every parameter's gradient.
"""

import pytest
import torch
import transformers
from helpers.data import DATA_DIR
from helpers.modeling import (
    check_activation_checkpointing,
    check_flattened_refusals,
    flattened,
    make_batch,
    packing_calls,
    sst2_token_ids,
    tiny_config,
)

from posformers import (
    DebertaConfig,
    DebertaForMaskedLM,
    DebertaForMultipleChoice,
    DebertaForQuestionAnswering,
    DebertaForReplacedTokenDetection,
    DebertaForSequenceClassification,
    DebertaForTokenClassification,
    DebertaModel,
    modeling_deberta,
)

TOLERANCE = 1e-5

# Relative distances of the 17-token batches reach 16: beyond max_relative_positions (v1: 6) and beyond the log
# buckets' exact window (v2/v3: 4 buckets over 8 positions), so clipping and bucketing both differ per group width.
VERSIONS = {
    "v1": dict(
        projection_layout="fused",
        position_biased_input=True,
        position_buckets=-1,
        max_relative_positions=6,
        share_att_key=False,
        norm_rel_ebd="none",
        pos_att_type="c2p|p2c",
        type_vocab_size=2,
    ),
    "v2": dict(position_buckets=4, max_relative_positions=8, conv_kernel_size=3, conv_act="gelu"),
    "v3": dict(position_buckets=4, max_relative_positions=8, pos_att_type="c2p|p2c"),
}

HEADS = {
    "base": DebertaModel,
    "mlm": DebertaForMaskedLM,
    "rtd": DebertaForReplacedTokenDetection,
    "seq-cls": DebertaForSequenceClassification,
    "multiple-choice": DebertaForMultipleChoice,
    "token-cls": DebertaForTokenClassification,
    "qa": DebertaForQuestionAnswering,
}

# (batch, seq_len, where each row's padding starts)
CASES = {
    "mixed-lengths": (3, 17, (None, 11, 5)),
    "one-row-all-padding": (3, 17, (None, 0, 7)),
    "batch-of-one": (1, 17, (9,)),
    "length-one": (3, 17, (1, None, 1)),
    "single-token-input": (2, 1, (None, 0)),
}


def build(head: str, version: str, **overrides):
    torch.manual_seed(0)
    config = tiny_config(DebertaConfig, **{**VERSIONS[version], "num_labels": 3, **overrides})
    return HEADS[head](config)


def outputs_at_real_tokens(head: str, output, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The outputs a head defines at real tokens: per-token outputs at real tokens only (padded positions hold zeros
    on the packed path, whatever the padded path computes there), per-sequence outputs whole; QA logits whole (both
    paths put finfo.min at padding)."""
    real = mask.bool()
    if head == "base":
        return {"last_hidden_state": output.last_hidden_state[real]}
    if head in ("mlm", "rtd", "token-cls"):
        return {"logits": output.logits[real]}
    if head == "qa":
        return {"start_logits": output.start_logits, "end_logits": output.end_logits}
    # a sequence-level output of a row without any real token means nothing on either path
    return {"logits": output.logits[real.flatten(1).any(-1)]}


def run(model, head: str, inputs: dict, mask: torch.Tensor, mode: str):
    """Outputs and parameter gradients of one pass in `mode`, through a loss of fixed random weights over the
    outputs at real tokens, averaged so that gradients are of order one (float32 rounding then stays below the
    tolerance)."""
    model.config.unpad_inputs = mode
    model.zero_grad()
    output = model(**inputs)
    values = outputs_at_real_tokens(head, output, mask)
    generator = torch.Generator().manual_seed(1)
    loss = sum((v * torch.randn(v.shape, generator=generator)).mean() for v in values.values() if v.numel())
    if "loss" in output and output.loss is not None:
        loss = loss + output.loss
        values["loss"] = output.loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in values.items()}, grads, output


def head_inputs(head: str, batch: int, seq_len: int, pad_from) -> tuple[dict, torch.Tensor]:
    """The head's inputs (with labels) for a right-padded batch, and the (B, L) mask of its real tokens."""
    choices = 2 if head == "multiple-choice" else None
    input_ids, attention_mask, token_type_ids = make_batch(batch, seq_len, pad_from=pad_from, choices=choices)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    generator = torch.Generator().manual_seed(2)
    if head == "mlm":
        inputs["labels"] = torch.where(attention_mask.bool(), torch.randint(0, 99, input_ids.shape), -100)
    elif head == "rtd":
        inputs["labels"] = torch.randint(0, 2, input_ids.shape, generator=generator)
    elif head == "token-cls":
        inputs["labels"] = torch.where(attention_mask.bool(), torch.randint(0, 3, input_ids.shape), -100)
    elif head == "seq-cls":  # negative labels (rows without tokens) are ignored by DeBERTa's loss
        labels = torch.randint(0, 3, (batch,), generator=generator)
        inputs["labels"] = torch.where(attention_mask.bool().any(-1), labels, -1)
    elif head == "multiple-choice":
        labels = torch.randint(0, 2, (batch,), generator=generator)
        inputs["labels"] = torch.where(attention_mask.bool().flatten(1).any(-1), labels, -100)
    elif head == "qa":
        lengths = attention_mask.sum(-1).clamp_min(1)
        inputs["start_positions"] = torch.zeros(batch, dtype=torch.long)
        inputs["end_positions"] = lengths - 1
    return inputs, attention_mask


def assert_close(actual: dict, expected: dict, what: str):
    assert actual.keys() == expected.keys(), what
    for name, value in expected.items():
        assert actual[name].shape == value.shape, (what, name)
        diff = (actual[name] - value).abs().max().item() if value.numel() else 0.0
        assert diff <= TOLERANCE, f"{what} {name}: max abs diff {diff}"


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("version", VERSIONS)
def test_packed_equals_padded(version, head, case, training, monkeypatch):
    """unpad_inputs="always" (and "auto" for a padded batch) give the padded path's outputs at real tokens and its
    gradients, for every head; padded positions of the base model's output are zeros."""
    model = build(head, version).train(training)
    inputs, mask = head_inputs(head, *CASES[case])
    expected, expected_grads, _ = run(model, head, inputs, mask, "never")
    modes = ["always", "auto"] if case == "mixed-lengths" else ["always"]
    calls = packing_calls(monkeypatch, modeling_deberta)
    for mode in modes:
        actual, grads, output = run(model, head, inputs, mask, mode)
        assert_close(actual, expected, f"{mode} outputs")
        assert_close(grads, expected_grads, f"{mode} gradients")
        assert calls[-1] is not None
        if head == "base":
            assert output.last_hidden_state.shape[:2] == mask.shape
            assert not output.last_hidden_state[~mask.bool()].any()


@pytest.mark.parametrize("version", VERSIONS)
def test_auto_leaves_a_batch_without_padding_on_the_padded_path(version, monkeypatch):
    """No padding: "auto" runs the padded path untouched (no packing, no gather), with the same outputs."""
    model = build("base", version).eval()
    input_ids = make_batch(pad_from=(None, None, None))[0]
    attention_mask = torch.ones_like(input_ids)
    model.config.unpad_inputs = "never"
    expected = model(input_ids, attention_mask=attention_mask).last_hidden_state
    model.config.unpad_inputs = "auto"
    packing_module = type(model).__module__
    calls = []
    monkeypatch.setattr(
        f"{packing_module}.PackedBatch.pack", lambda *args: calls.append(args) or pytest.fail("packed a full batch")
    )
    plans = packing_calls(monkeypatch, modeling_deberta)
    for mask in (attention_mask, None):
        output = model(input_ids, attention_mask=mask)
        assert plans[-1] is None and not calls
        torch.testing.assert_close(output.last_hidden_state, expected, rtol=0, atol=0)


def test_hidden_states_are_restored_with_zeros_at_padding():
    model = build("base", "v2").eval()
    input_ids, attention_mask, _ = make_batch()
    model.config.unpad_inputs = "never"
    expected = model(input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
    model.config.unpad_inputs = "always"
    actual = model(input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
    assert len(actual) == len(expected)
    real = attention_mask.bool()
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and not a[~real].any()
        assert (a[real] - e[real]).abs().max() <= TOLERANCE


def test_output_attentions_runs_padded_in_auto_and_is_refused_in_always(monkeypatch):
    calls = packing_calls(monkeypatch, modeling_deberta)
    model = build("base", "v3").eval()
    input_ids, attention_mask, _ = make_batch()
    output = model(input_ids, attention_mask=attention_mask, output_attentions=True)
    assert calls == [None] and output.attentions[0].shape == (3, 4, 17, 17)
    model.config.unpad_inputs = "always"
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids, attention_mask=attention_mask, output_attentions=True)


def test_three_dimensional_mask_runs_padded_in_auto_and_is_refused_in_always(monkeypatch):
    calls = packing_calls(monkeypatch, modeling_deberta)
    model = build("base", "v3").eval()
    input_ids, attention_mask, _ = make_batch()
    mask3d = attention_mask[:, None, :] * attention_mask[:, :, None]
    model(input_ids, attention_mask=mask3d)
    assert calls == [None]
    model.config.unpad_inputs = "always"
    with pytest.raises(ValueError, match="3D attention_mask"):
        model(input_ids, attention_mask=mask3d)


def test_always_with_left_padding_names_attention_mask(monkeypatch):
    model = build("base", "v3", unpad_inputs="always").eval()
    input_ids, attention_mask, _ = make_batch()
    with pytest.raises(ValueError, match="attention_mask is not right-padded"):
        model(input_ids, attention_mask=attention_mask.flip(-1))
    model.config.unpad_inputs = "auto"  # auto: left padding runs padded
    calls = packing_calls(monkeypatch, modeling_deberta)
    model(input_ids, attention_mask=attention_mask.flip(-1))
    assert calls == [None]


def test_unpad_inputs_is_validated():
    with pytest.raises(ValueError, match=r"DebertaConfig\.unpad_inputs must be one of"):
        tiny_config(DebertaConfig, unpad_inputs="sometimes")
    config = tiny_config(DebertaConfig)
    assert config.unpad_inputs == "auto"
    config.unpad_inputs = "yes"
    with pytest.raises(ValueError, match=r"DebertaConfig\.unpad_inputs"):
        DebertaModel(config)


# --- Flattened batches (transformers' DataCollatorWithFlattening) ---------------------------------------------------


@pytest.fixture(scope="module")
def sentences() -> list[list[int]]:
    """Token ids of SST-2 dev sentences (BERT uncased vocabulary), of different lengths, beyond the relative span."""
    ids = sst2_token_ids(5)
    assert len({len(i) for i in ids}) > 2 and max(len(i) for i in ids) > 16
    return ids


@pytest.mark.parametrize("cu_seq_lens", [False, True], ids=["position-ids", "cu-seq-lens"])
@pytest.mark.parametrize("head", ["base", "mlm", "seq-cls", "qa", "token-cls", "rtd"])
@pytest.mark.parametrize("version", VERSIONS)
def test_flattened_batch_equals_each_sequence_alone(version, head, cu_seq_lens, sentences):
    model = build(head, version, vocab_size=30522, max_position_embeddings=64).eval()
    batch = flattened(sentences, cu_seq_lens)
    with torch.no_grad():
        output = model(**batch)
        alone = [model(torch.tensor([s])) for s in sentences]
    if head in ("base", "mlm", "token-cls", "rtd"):
        name = "last_hidden_state" if head == "base" else "logits"
        expected = torch.cat([getattr(o, name) for o in alone], dim=1)
        assert getattr(output, name).shape == expected.shape
        assert (getattr(output, name) - expected).abs().max() <= TOLERANCE
    elif head == "seq-cls":
        expected = torch.cat([o.logits for o in alone])
        assert output.logits.shape == (len(sentences), 3)
        assert (output.logits - expected).abs().max() <= TOLERANCE
    else:
        longest = max(len(s) for s in sentences)
        assert output.start_logits.shape == (len(sentences), longest)
        for row, (sentence, o) in enumerate(zip(sentences, alone)):
            n = len(sentence)
            for name in ("start_logits", "end_logits"):
                logits = getattr(output, name)[row]
                assert (logits[:n] - getattr(o, name)[0]).abs().max() <= TOLERANCE
                assert (logits[n:] == torch.finfo(logits.dtype).min).all()


def test_flattened_batch_gradients_equal_the_padded_batch(sentences):
    """Training on a flattened batch gives the gradients of the same sequences padded (seq-cls, per-sequence
    labels)."""
    model = build("seq-cls", "v2", vocab_size=30522, max_position_embeddings=64).train()
    labels = torch.tensor([0, 1, 2, 1, 0])
    padded = transformers.DataCollatorWithPadding(
        transformers.BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    )([{"input_ids": s} for s in sentences])

    def grads(**inputs):
        model.zero_grad()
        model(**inputs, labels=labels).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model.config.unpad_inputs = "never"
    expected = grads(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"])
    actual = grads(**flattened(sentences, cu_seq_lens=False))
    assert_close(actual, expected, "gradients")


def test_flattened_batch_to_multiple_choice_names_position_ids(sentences):
    model = build("multiple-choice", "v3", vocab_size=30522, max_position_embeddings=64).eval()
    batch = flattened(sentences, cu_seq_lens=False)
    with pytest.raises(ValueError, match="position_ids"):
        model(**batch)
    with pytest.raises(ValueError, match="position_ids"):
        model(batch["input_ids"][:, None], position_ids=batch["position_ids"][:, None])


def test_contradicting_flattened_inputs_are_refused(sentences):
    model = build("base", "v3", vocab_size=30522, max_position_embeddings=64).eval()
    check_flattened_refusals(model, flattened(sentences, cu_seq_lens=True))


# --- Precision, compilation, checkpointing --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("version", VERSIONS)
def test_half_precision_packed_without_nan(version, dtype):
    model = build("mlm", version, unpad_inputs="always").eval().to(dtype)
    input_ids, attention_mask, token_type_ids = make_batch(pad_from=(None, 0, 5))
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
    assert logits.dtype == dtype and not logits.isnan().any()


def test_torch_compile_runs_the_packed_path():
    model = build("base", "v2", unpad_inputs="always").eval()
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask).last_hidden_state
        actual = torch.compile(model)(input_ids, attention_mask=attention_mask).last_hidden_state
    # inductor's fused kernels round differently: the padded path compiled is off by as much (~1e-4 at |x| ~ 3)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head", ["base", "mlm"])
def test_gradient_checkpointing_gives_equal_gradients_packed(head):
    model = build(head, "v2", unpad_inputs="always")
    inputs, mask = head_inputs(head, *CASES["mixed-lengths"])

    def loss(model):
        output = model(**inputs)
        return output.loss if head != "base" else output.last_hidden_state[mask.bool()].pow(2).mean()

    check_activation_checkpointing(model, loss, atol=TOLERANCE)


def test_inference_cache_keys_on_the_group_width():
    """In inference (no autograd) the shared buffers and cached projections serve groups of several widths within
    each layer: outputs equal those of the training-mode path without the cache."""
    model = build("mlm", "v3", unpad_inputs="always")
    input_ids, attention_mask, _ = make_batch(batch=6, seq_len=40, pad_from=(None, 3, 30, 8, 39, 1))
    with torch.no_grad():
        cached = model.eval()(input_ids, attention_mask=attention_mask).logits
    model.eval()
    uncached = model(input_ids, attention_mask=attention_mask).logits  # autograd on: no cache
    assert model.deberta.plan_packing((6, 40), attention_mask, None, False, {}, None).groups().__len__() > 1
    real = attention_mask.bool()
    assert (cached[real] - uncached[real]).abs().max() <= TOLERANCE


def test_inputs_embeds_and_per_token_inputs_broadcast_over_the_batch():
    """inputs_embeds, and token_type_ids / position_ids of shape (1, L) that broadcast over the batch, are packed as
    the padded path reads them (v1 adds both to its input)."""
    model = build("base", "v1").eval()
    input_ids, attention_mask, token_type_ids = make_batch()
    inputs = dict(
        inputs_embeds=model.get_input_embeddings()(input_ids),
        attention_mask=attention_mask,
        token_type_ids=token_type_ids[:1],
        position_ids=torch.arange(17).flip(0)[None],
    )
    real = attention_mask.bool()
    with torch.no_grad():
        model.config.unpad_inputs = "never"
        expected = model(**inputs).last_hidden_state
        model.config.unpad_inputs = "always"
        actual = model(**inputs).last_hidden_state
    assert (actual[real] - expected[real]).abs().max() <= TOLERANCE


def test_enhanced_mask_decoder_reads_the_given_position_ids_packed():
    model = build("mlm", "v3").eval()
    input_ids, attention_mask, _ = make_batch()
    position_ids = torch.randint(0, 64, input_ids.shape, generator=torch.Generator().manual_seed(3))
    real = attention_mask.bool()
    with torch.no_grad():
        model.config.unpad_inputs = "never"
        expected = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        model.config.unpad_inputs = "always"
        actual = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        default = model(input_ids, attention_mask=attention_mask).logits
    assert (actual[real] - expected[real]).abs().max() <= TOLERANCE
    assert (default[real] - expected[real]).abs().max() > 1e-3  # the positions matter
