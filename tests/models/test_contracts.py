"""Contracts every model keeps with every head its AUTO_MAP registers, stated once over tests/helpers/registry.py (as
transformers' ModelTesterMixin states them once for all its models): padding changes nothing at real tokens (each row
alone gives what it gives in a padded batch, for every head and VARIANT, attention implementation and path),
padding-free == padded (outputs, losses and gradients, in every batch layout of the registry's CASES and every
model-specific VARIANT), flattened batches (each sequence as alone, trained as the padded batch, refused where a head
cannot take one or the inputs contradict it), what rules packing out, half precision, torch.compile and activation
checkpointing on the packed path, trust_remote_code loading, and what transformers' common model tests expect of any
PreTrainedModel (a batch of padding only, output_hidden_states from the config, loading into a model built without
initialisation, gradients through the returned attentions and into every parameter, a shape mismatch on loading)."""

from __future__ import annotations

import sys

import pytest
import torch
from helpers import python_env
from helpers.modeling import (
    check_activation_checkpointing,
    check_flattened_refusals,
    flattened,
    max_diff,
    packing_calls,
    sst2_token_ids,
    tensor_outputs,
)
from helpers.padding_free import (
    SPAN_LOGITS,
    TOLERANCE,
    assert_all_close,
    assert_same_pass,
    case_inputs,
    compared_outputs,
    readout,
    run_pass,
    tensors,
)
from helpers.registry import (
    BASE_AND_MASKED_LM,
    CASES,
    MODEL_HEAD_IDS,
    MODEL_HEADS,
    PER_TOKEN_OUTPUTS,
    REGISTRY,
    TOKEN_LABELS,
    VARIANT_HEADS,
    VARIANTS,
    padded_inputs,
    per_token,
    real_tokens,
    training_loss,
)
from helpers.remote import assert_loaded_remotely, assert_no_posformers, load_remote
from safetensors.torch import load_file, save_file
from transformers.initialization import no_init_weights

# RoFormer's multiple choice summarises each choice by its last position by default, which a padding-free pass does
# not have: the padding-free contracts read the choices' mean instead.
PADDING_FREE_FIELDS = {("roformer", "AutoModelForMultipleChoice"): {"summary_type": "mean"}}
# Heads that refuse a flattened batch: a choice is not a sequence, and a decoder's flattened rows would see each other.
REFUSE_FLATTENED = {"AutoModelForMultipleChoice", "AutoModelForCausalLM"}
LABEL_KEYS = ("labels", "start_positions", "end_positions")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run faster on one thread than on several."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def head_params(heads: list[tuple[str, str, str, dict]]):
    """Parametrises a test over (variant, model, head, overrides) rows, ids "variant-head"."""
    ids = [f"{variant}-{auto_name}" for variant, _, auto_name, _ in heads]
    return pytest.mark.parametrize(("variant", "name", "auto_name", "overrides"), heads, ids=ids)


model_heads = pytest.mark.parametrize(("name", "auto_name"), MODEL_HEADS, ids=MODEL_HEAD_IDS)
# A decoder (RoFormer's causal LM) always runs padded, and refuses unpad_inputs="always".
ENCODER_MODEL_HEADS = [(name, auto_name) for name, auto_name in MODEL_HEADS if auto_name != "AutoModelForCausalLM"]
encoder_heads = pytest.mark.parametrize(
    ("name", "auto_name"), ENCODER_MODEL_HEADS, ids=[f"{name}-{auto_name}" for name, auto_name in ENCODER_MODEL_HEADS]
)
# Every head of every model, then of every model-specific variant; ALL_HEADS without the decoder.
EVERY_HEAD = [(name, name, auto_name, {}) for name, auto_name in MODEL_HEADS] + VARIANT_HEADS
ALL_HEADS = [(name, name, auto_name, {}) for name, auto_name in ENCODER_MODEL_HEADS] + VARIANT_HEADS
FLATTENING_HEADS = [row for row in ALL_HEADS if row[2] not in REFUSE_FLATTENED]
REFUSING_HEADS = [(name, auto_name) for name, auto_name in MODEL_HEADS if auto_name in REFUSE_FLATTENED]
# Each model's tiny default and its encoder variants, as (variant, model, overrides).
ENCODERS = [(name, name, {}) for name in REGISTRY] + [
    (variant, name, overrides) for variant, (name, heads, overrides) in VARIANTS.items() if heads == BASE_AND_MASKED_LM
]
encoders = pytest.mark.parametrize(("variant", "name", "overrides"), ENCODERS, ids=[row[0] for row in ENCODERS])
models = pytest.mark.parametrize("name", list(REGISTRY))
training_modes = pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])


def paths(auto_name: str, with_auto: bool = False) -> tuple[str, ...]:
    """The unpad_inputs modes that run the head's two paths, padded and padding-free (a decoder has the first only);
    `with_auto` adds "auto", whose choice between them is under test too."""
    modes = ("never",) if auto_name == "AutoModelForCausalLM" else ("never", "always")
    return (*modes, "auto") if with_auto else modes


def build(name: str, auto_name: str, **overrides):
    fields = {**PADDING_FREE_FIELDS.get((name, auto_name), {}), **overrides}
    return REGISTRY[name].build(auto_name, **fields)


def modeling_module(name: str):
    """The modeling module of a registry model, where `packing_calls` records its plans."""
    return sys.modules[REGISTRY[name].heads["AutoModel"].__module__]


# ---------------------------------------------------------------------------------------------------------------------
# Padding-free execution of padded batches
# ---------------------------------------------------------------------------------------------------------------------


@training_modes
@pytest.mark.parametrize("case", CASES)
@encoder_heads
def test_packed_equals_padded(name, auto_name, case, training, monkeypatch):
    """unpad_inputs="always", and "auto" where the batch holds padding, run padding-free and give the padded path's
    outputs (every layer's hidden states and padded positions included), loss and parameter gradients."""
    model = build(name, auto_name)
    inputs = case_inputs(auto_name, case)
    expected = run_pass(model, auto_name, inputs, "never", training)
    calls = packing_calls(monkeypatch, modeling_module(name))
    padded = not bool(inputs["attention_mask"].all())
    for mode in ("always", "auto"):
        assert_same_pass(run_pass(model, auto_name, inputs, mode, training), expected)
        assert (calls[-1] is not None) == (mode == "always" or padded), mode


# The layouts the variants run on: no padding, a row of padding only, a batch of one, rows of one token, one column.
VARIANT_CASES = ["mixed-lengths", "no-padding", "row-of-padding", "batch-of-one", "length-one", "one-column"]


@training_modes
@pytest.mark.parametrize("case", VARIANT_CASES)
@head_params(VARIANT_HEADS)
def test_packed_equals_padded_for_every_variant(variant, name, auto_name, overrides, case, training):
    model = build(name, auto_name, **overrides)
    inputs = case_inputs(auto_name, case)
    expected = run_pass(model, auto_name, inputs, "never", training)
    assert_same_pass(run_pass(model, auto_name, inputs, "always", training), expected)


@model_heads
def test_padded_positions_hold_zeros_on_every_path(name, auto_name):
    """Per-token outputs at padded positions do not depend on the path a batch took: hidden states and logits are 0
    there (the padding-free path never computes them), and span logits the dtype's minimum (no answer starts at
    padding)."""
    inputs = padded_inputs(auto_name, labels=False)
    pad = ~real_tokens(inputs)
    for mode in paths(auto_name):
        model = build(name, auto_name, unpad_inputs=mode)
        output = model(**inputs, output_hidden_states=True)
        per_token = {key: output[key] for key in PER_TOKEN_OUTPUTS if output.get(key) is not None}
        per_token.update({f"hidden_states[{i}]": states for i, states in enumerate(output.hidden_states)})
        for key, value in per_token.items():
            if auto_name == "AutoModelForMultipleChoice" and key != "logits":  # (rows * choices, width, ...)
                value = value.view(len(pad), -1, *value.shape[1:])[:, 0]
            if value.shape[:2] != pad.shape:
                continue  # one output per row
            fill = torch.finfo(value.dtype).min if key in SPAN_LOGITS else 0.0
            assert (value[pad] == fill).all(), f"unpad_inputs={mode!r} {key}: {value[pad].abs().max()} at padding"


@pytest.mark.parametrize("mode", ["never", "always", "auto"])
@models
def test_span_logits_are_lowest_exactly_at_padding(name, mode):
    model = build(name, "AutoModelForQuestionAnswering", unpad_inputs=mode)
    inputs = case_inputs("AutoModelForQuestionAnswering", "row-of-padding", labels=False)
    real = real_tokens(inputs)
    with torch.no_grad():
        output = model(**inputs)
    lowest = torch.finfo(torch.float32).min
    for logits in (output.start_logits, output.end_logits):
        assert (logits[~real] == lowest).all() and (logits[real] > lowest).all()


@models
def test_masked_lm_head_projects_real_tokens_only(name):
    """On the padding-free path the vocabulary projection reads the (1, N, hidden) real tokens, not the padded
    grid."""
    model = build(name, "AutoModelForMaskedLM", unpad_inputs="always")
    inputs = padded_inputs("AutoModelForMaskedLM", labels=False)
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    with torch.no_grad():
        model(**inputs)
    assert seen == [torch.Size([1, int(inputs["attention_mask"].sum()), model.config.hidden_size])]


# Rows across ten of LittleBird's tiny blocks of 4 and beyond DeBERTa's relative spans, short rows, a row of one token,
# a row of padding only, and padding after the longest row too: every real token has padding after it.
PADDED_ROWS, PADDED_WIDTH = (41, 17, 11, 5, 1, 0), 48


def random_ids_at_padding(inputs: dict, seed: int = 1) -> dict:
    """`inputs` with random token ids at padded positions: padding that leaks into a real token's output shows."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randint(1, 99, inputs["input_ids"].shape, generator=generator)
    return {**inputs, "input_ids": torch.where(inputs["attention_mask"].bool(), inputs["input_ids"], noise)}


@head_params(EVERY_HEAD)
def test_each_row_alone_equals_its_row_in_a_padded_batch(variant, name, auto_name, overrides):
    """Padding changes nothing at real tokens: each row of a right-padded batch gives, with every attention
    implementation of the model, padded and padding-free, what it gives alone (no padding, no mask, the first
    implementation): per-token outputs at its real tokens, per-row outputs (pooler, pack states, classes)."""
    model = build(name, auto_name, **overrides)
    inputs = random_ids_at_padding(padded_inputs(auto_name, PADDED_ROWS, PADDED_WIDTH, labels=False))
    implementations = REGISTRY[name].attn_implementations
    model.set_attn_implementation(implementations[0])
    alone = {}
    with torch.no_grad():
        for row, length in enumerate(PADDED_ROWS):
            if length:
                cut = {key: value[row : row + 1, ..., :length] for key, value in inputs.items()}
                alone[row] = tensors(model(**{key: value for key, value in cut.items() if key != "attention_mask"}))
    for implementation in implementations:
        model.set_attn_implementation(implementation)
        for mode in paths(auto_name):
            model.config.unpad_inputs = mode
            with torch.no_grad():
                batched = tensors(model(**inputs))
            for row, expected in alone.items():
                for key, value in expected.items():
                    actual = batched[key][row : row + 1]
                    if per_token(auto_name, key):
                        actual = actual[:, : PADDED_ROWS[row]]
                    what = f"{implementation}, unpad_inputs={mode!r}, row {row} of {PADDED_ROWS[row]} tokens: {key}"
                    assert actual.shape == value.shape, what
                    assert max_diff(actual, value) <= TOLERANCE, what


@models
def test_auto_runs_a_batch_without_padding_padded(name, monkeypatch):
    """No padding: "auto" runs the padded path untouched (no plan, no gather), with a mask of ones or none, and gives
    its very outputs; "always" packs the batch all the same."""
    model = build(name, "AutoModel", unpad_inputs="never")
    inputs = case_inputs("AutoModel", "no-padding", labels=False)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        model.config.unpad_inputs = "auto"
        calls = packing_calls(monkeypatch, modeling_module(name))
        with monkeypatch.context() as patch:
            patch.setattr(modeling_module(name).PackedBatch, "pack", lambda *args: pytest.fail("packed a full batch"))
            for batch in (inputs, {key: value for key, value in inputs.items() if key != "attention_mask"}):
                assert torch.equal(model(**batch).last_hidden_state, expected)
        assert calls == [None, None]
        model.config.unpad_inputs = "always"
        model(**inputs)
    assert calls[-1] is not None and calls[-1].lengths == list(CASES["no-padding"][0])


def ruled_out(name: str) -> list[str]:
    """What keeps a pass of the model off the padding-free path: attention weights (they exist only padded), padding
    between real tokens, left padding (where the model reads it), a (query, key) mask (where the model takes one)."""
    entry = REGISTRY[name]
    dense = [f"{entry.dense_mask}D-mask"] if entry.dense_mask else []
    return ["output_attentions", "padding-between-real-tokens"] + ["left-padding"] * entry.left_padding + dense


def ruling_out(reason: str, inputs: dict) -> tuple[dict, str]:
    """`inputs` changed so that `reason` rules packing out, and what a refusal of it names."""
    mask = inputs["attention_mask"]
    if reason == "output_attentions":
        return {**inputs, "output_attentions": True}, "output_attentions"
    if reason == "padding-between-real-tokens":
        holes = mask.clone()
        holes[0, 3:5] = 0
        return {**inputs, "attention_mask": holes}, "attention_mask is not right-padded"
    if reason == "left-padding":
        return {**inputs, "attention_mask": mask.flip(-1)}, "attention_mask is not right-padded"
    rows, width = mask.shape
    square = mask[:, None, :].expand(rows, width, width)  # every query row is the key mask
    dense = square if reason == "3D-mask" else square[:, None].bool()
    return {**inputs, "attention_mask": dense}, reason.replace("-mask", " attention_mask")


RULED_OUT = [(name, reason) for name in REGISTRY for reason in ruled_out(name)]


@pytest.mark.parametrize(("name", "reason"), RULED_OUT, ids=[f"{name}-{reason}" for name, reason in RULED_OUT])
def test_what_rules_packing_out_runs_padded_in_auto_and_is_refused_in_always(name, reason, monkeypatch):
    model = build(name, "AutoModel", unpad_inputs="never")
    inputs, refusal = ruling_out(reason, padded_inputs("AutoModel", labels=False))
    with torch.no_grad():
        expected = tensors(model(**inputs))
        model.config.unpad_inputs = "auto"
        calls = packing_calls(monkeypatch, modeling_module(name))
        assert_all_close(tensors(model(**inputs)), expected, "auto", tolerance=0.0)
    assert calls == [None]
    model.config.unpad_inputs = "always"
    with pytest.raises(ValueError, match=rf"unpad_inputs='always'.*{refusal}"):
        model(**inputs)


@models
def test_always_with_left_padding_names_attention_mask(name):
    model = build(name, "AutoModel", unpad_inputs="always")
    inputs = padded_inputs("AutoModel", labels=False)
    with pytest.raises(ValueError, match="attention_mask"):
        model(**{**inputs, "attention_mask": inputs["attention_mask"].flip(-1)})


@encoders
def test_inputs_embeds_and_broadcast_token_types_are_packed_like_input_ids(variant, name, overrides):
    """inputs_embeds and (1, L) token_type_ids that broadcast over the batch, packed, give what input_ids with every
    row's token types give padded."""
    model = build(name, "AutoModel", **overrides)
    inputs = padded_inputs("AutoModel", labels=False)
    token_type_ids = (torch.arange(inputs["input_ids"].shape[1]) >= 3).long()[None]
    with torch.no_grad():
        model.config.unpad_inputs = "never"
        expected = model(**{**inputs, "token_type_ids": token_type_ids.expand_as(inputs["input_ids"])})
        model.config.unpad_inputs = "always"
        embeds = model.get_input_embeddings()(inputs["input_ids"])
        actual = model(inputs_embeds=embeds, attention_mask=inputs["attention_mask"], token_type_ids=token_type_ids)
    assert_all_close(tensors(actual), tensors(expected), "inputs_embeds")


# ---------------------------------------------------------------------------------------------------------------------
# Flattened batches (transformers' DataCollatorWithFlattening)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentences() -> list[list[int]]:
    """Token ids of SST-2 dev sentences (BERT uncased vocabulary), of different lengths, beyond DeBERTa's tiny
    relative spans."""
    ids = sst2_token_ids(6)
    assert len({len(i) for i in ids}) > 3 and max(len(i) for i in ids) > 16
    return ids


@pytest.mark.parametrize("cu_seq_lens", [False, True], ids=["position-ids", "cu-seq-lens"])
@head_params(FLATTENING_HEADS)
def test_flattened_batch_equals_each_sequence_alone(variant, name, auto_name, overrides, cu_seq_lens, sentences):
    """One row of sequences whose position_ids restart at 0 (token types alongside) gives each sequence what it gives
    alone: per-token outputs and every layer's hidden states on its tokens, per-sequence outputs (pooler, pack
    states, classes) one row per sequence, span logits one row per sequence with the lowest float past its end."""
    model = build(name, auto_name, vocab_size=30522, **overrides)
    assert type(model).accepts_flattened_batches is True
    token_types = [(torch.arange(len(ids)) >= len(ids) // 2).long() for ids in sentences]
    batch = {**flattened(sentences, cu_seq_lens), "token_type_ids": torch.cat(token_types)[None]}
    lengths = [len(ids) for ids in sentences]
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    with torch.no_grad():
        packed = compared_outputs(model(**batch, output_hidden_states=True), auto_name)
        alone = [
            compared_outputs(
                model(torch.tensor([ids]), token_type_ids=types[None], output_hidden_states=True), auto_name
            )
            for ids, types in zip(sentences, token_types)
        ]
    assert sorted(packed) == sorted(alone[0])
    for row, (single, length) in enumerate(zip(alone, lengths)):
        for key, value in packed.items():
            if key in SPAN_LOGITS:  # (sequences, longest)
                assert (value[row, length:] == torch.finfo(value.dtype).min).all(), key
                actual = value[row, :length]
            elif per_token(auto_name, key) or key.startswith("hidden_states"):  # (1, tokens, ...)
                actual = value[0, starts[row] : starts[row + 1]]
            else:
                actual = value[row]
            assert max_diff(actual, single[key][0]) <= TOLERANCE, f"{key}, sequence {row}"


@training_modes
@head_params([row for row in FLATTENING_HEADS if not row[3]])
def test_flattened_batch_matches_padded(variant, name, auto_name, overrides, training):
    """transformers' DataCollatorWithFlattening batch of a padded batch's rows gives each sequence the outputs, the
    loss and, in training, every parameter's gradient that its padded row gives."""
    inputs = padded_inputs(auto_name)
    real = real_tokens(inputs)
    model = build(name, auto_name)
    sentences = [ids[mask].tolist() for ids, mask in zip(inputs["input_ids"], real)]
    # The collator carries no token types: the padded run goes without them too.
    without_types = {key: value for key, value in inputs.items() if key != "token_type_ids"}
    padded, padded_gradients = run_pass(model, auto_name, without_types, "never", training)
    for key, value in padded.items():  # to the flattened layout
        if key in SPAN_LOGITS:  # (sequences, longest)
            padded[key] = value[:, : int(real.sum(-1).max())]
        elif value.dim() and (per_token(auto_name, key) or key.startswith("hidden_states")):  # (1, tokens, ...)
            padded[key] = value[real][None]
    for cu_seq_lens in (False, True):
        batch = flattened(sentences, cu_seq_lens)
        batch.update({key: value for key, value in inputs.items() if key in LABEL_KEYS})
        if auto_name in TOKEN_LABELS:
            batch["labels"] = inputs["labels"][real][None]
        packed = run_pass(model, auto_name, batch, "never", training)
        assert_same_pass(packed, (padded, padded_gradients))


# A flattened batch as one row, with cu_seq_lens, or (multiple choice) as one example of flattened choices.
REFUSED_LAYOUTS = [
    (name, auto_name, layout)
    for name, auto_name in REFUSING_HEADS
    for layout in ("one row", "cu_seq_lens") + ("choices",) * (auto_name == "AutoModelForMultipleChoice")
]


@pytest.mark.parametrize(
    ("name", "auto_name", "layout"), REFUSED_LAYOUTS, ids=["-".join(row) for row in REFUSED_LAYOUTS]
)
def test_head_that_refuses_a_flattened_batch_names_position_ids(name, auto_name, layout):
    """Multiple choice (a choice is not a sequence) and a decoder (its flattened rows would see each other) refuse a
    flattened batch."""
    model = build(name, auto_name)
    batch = flattened([[5, 6, 7], [8, 9], [3, 4, 5, 6]], cu_seq_lens=layout == "cu_seq_lens")
    if layout == "choices":  # (1, 1, tokens)
        batch = {"input_ids": batch["input_ids"][:, None], "position_ids": batch["position_ids"][:, None]}
    with pytest.raises(ValueError, match="position_ids"):
        model(**batch)


@models
def test_contradicting_flattened_inputs_are_refused(name):
    """A flattened batch contradicted by a padding mask, by its cu_seq_lens, by position_ids that do not count from 0,
    or cu_seq_lens without the position_ids they describe; or combined with output_attentions: each refused."""
    model = build(name, "AutoModel")
    batch = flattened([[5, 6, 7, 8, 9], [8, 9], [3, 4, 5, 6]], cu_seq_lens=True)
    check_flattened_refusals(model, batch)
    with pytest.raises(ValueError, match="position_ids of a flattened batch must start at 0"):
        model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"] + 1, cu_seq_lens_q=batch["cu_seq_lens_q"]
        )
    with pytest.raises(ValueError, match="cu_seq_lens_q describes a flattened batch; pass its position_ids"):
        model(**{key: value for key, value in batch.items() if key != "position_ids"})


# ---------------------------------------------------------------------------------------------------------------------
# Precision, compilation and activation checkpointing of the packed path
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("auto_name", ["AutoModelForMaskedLM", "AutoModelForQuestionAnswering"])
@encoders
def test_half_precision_packed_is_finite(variant, name, overrides, auto_name, dtype):
    """A model in bfloat16 or float16, padding-free, gives finite outputs in its dtype and a finite loss, with a row of
    padding only and a row of one token, padded and flattened."""
    model = build(name, auto_name, unpad_inputs="always", **overrides).to(dtype)
    inputs = padded_inputs(auto_name, (23, 10, 0, 1), 23)
    real = real_tokens(inputs)
    batch = flattened([ids[mask].tolist() for ids, mask in zip(inputs["input_ids"], real) if mask.any()], True)
    with torch.no_grad():
        outputs = {"padded": tensors(model(**inputs)), "flattened": tensors(model(**batch))}
    for layout, output in outputs.items():
        assert "loss" in output or layout == "flattened"
        for key, value in output.items():
            assert value.dtype == dtype or key == "loss", f"{layout} {key}: {value.dtype}"  # losses reduce in float32
            assert torch.isfinite(value).all(), f"{layout} {key}"


@pytest.mark.parametrize(
    "name",
    ["roformer", "deberta", pytest.param("littlebird", marks=pytest.mark.slow)],  # LittleBird's compiles for longer
)
def test_torch_compile_runs_the_packed_path(name):
    model = build(name, "AutoModelForMaskedLM", unpad_inputs="always")
    inputs = padded_inputs("AutoModelForMaskedLM", labels=False)
    with torch.no_grad():
        expected = model(**inputs).logits
        actual = torch.compile(model)(**inputs).logits
    assert max_diff(actual, expected) <= TOLERANCE


@pytest.mark.parametrize("auto_name", ["AutoModel", "AutoModelForMaskedLM", "AutoModelForQuestionAnswering"])
@encoders
def test_activation_checkpointing_gives_the_padded_gradients_packed(variant, name, overrides, auto_name):
    """Activation checkpointing (both of torch's implementations) on the padding-free path gives the gradients
    without it, which are the padded path's."""
    model = build(name, auto_name, **overrides)
    inputs = padded_inputs(auto_name)
    real = real_tokens(inputs)

    def loss(model):
        return readout(model(**inputs), auto_name, real)

    gradients = {}
    for mode in ("always", "never"):
        model.config.unpad_inputs = mode
        gradients[mode] = check_activation_checkpointing(model, loss)
    assert_all_close(gradients["always"], gradients["never"], "gradients")


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def remote_load(tmp_path_factory):
    """Every head of every model saved, then loaded with trust_remote_code=True in ONE child process that cannot
    import posformers (helpers/remote.py): the child's report, and posformers' own outputs of each head."""
    folder = tmp_path_factory.mktemp("remote")
    jobs, expected = {}, {}
    for name, auto_name in MODEL_HEADS:
        model, job, inputs = REGISTRY[name].build(auto_name), f"{name}-{auto_name}", padded_inputs(auto_name)
        model.save_pretrained(folder / job)
        jobs[job] = (auto_name, folder / job, inputs)
        expected[job] = tensor_outputs(model, inputs)
    return load_remote(jobs, env=python_env(folder / "hf-home"), cwd=folder), expected


@pytest.mark.slow
def test_remote_code_child_cannot_import_posformers(remote_load):
    assert_no_posformers(remote_load[0])


@pytest.mark.slow
@model_heads
def test_saved_head_loads_with_remote_code_like_posformers(remote_load, name, auto_name):
    """The saved folder loads as the head's class from the folder's own code, in eval mode, with posformers' outputs
    (the loss included)."""
    result, expected = remote_load
    job = f"{name}-{auto_name}"
    assert_loaded_remotely(result, job, REGISTRY[name].heads[auto_name].__name__, expected[job])


@model_heads
def test_model_built_without_init_loads_state_dict(name, auto_name):
    """transformers builds a model under no_init_weights before loading a checkpoint into it: whatever the checkpoint
    does not hold (non-persistent buffers) must already be right."""
    inputs = padded_inputs(auto_name, labels=False)
    model = REGISTRY[name].build(auto_name)
    with no_init_weights():
        bare = REGISTRY[name].heads[auto_name](REGISTRY[name].config(auto_name))
    bare.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected, actual = tensors(model(**inputs)), tensors(bare.eval()(**inputs))
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert torch.isfinite(actual[key][value > torch.finfo(value.dtype).min]).all(), key
        assert torch.equal(actual[key], value), key  # the same weights and buffers: the same computation


@models
def test_wrong_shaped_checkpoint_tensor_is_a_runtime_error(name, tmp_path):
    """As transformers' own loading: a checkpoint tensor whose shape is not the model's is a RuntimeError (naming
    the tensor), not a silently re-initialised weight."""
    model = REGISTRY[name].build("AutoModelForMaskedLM")
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    key = next(key for key in weights if key.endswith("word_embeddings.weight"))
    weights[key] = weights[key][:-1].contiguous()
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="word_embeddings"):
        type(model).from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# What transformers' common model tests expect
# ---------------------------------------------------------------------------------------------------------------------


@model_heads
def test_batch_of_padding_only_returns_outputs(name, auto_name):
    inputs = padded_inputs(auto_name, labels=False)
    inputs["attention_mask"] = torch.zeros_like(inputs["attention_mask"])
    for mode in paths(auto_name, with_auto=True):
        model = build(name, auto_name, unpad_inputs=mode)
        with torch.no_grad():
            output = tensors(model(**inputs))
        assert output, f"unpad_inputs={mode!r}"
        for key, value in output.items():
            assert not value.isnan().any(), f"unpad_inputs={mode!r} {key}"


@model_heads
def test_output_hidden_states_from_config(name, auto_name):
    """config.output_hidden_states=True gives hidden_states when forward is called without the argument."""
    model = REGISTRY[name].build(auto_name, output_hidden_states=True)
    output = model(**padded_inputs(auto_name, labels=False))
    assert output.hidden_states is not None
    assert len(output.hidden_states) == model.config.num_hidden_layers + 1


@models
def test_attentions_take_gradients(name):
    """Returned attention probabilities are part of the graph: a gradient reaches each of them from a loss on the
    encoder's output (the base model: DeBERTa's masked-LM decoder reruns the last layer, so that layer's first
    attentions rightly get none from the masked-LM loss)."""
    model = REGISTRY[name].build("AutoModel").train()
    output = model(**padded_inputs("AutoModel"), output_attentions=True)
    for attentions in output.attentions:
        attentions.retain_grad()
    training_loss(output).backward()
    assert all(attentions.grad is not None for attentions in output.attentions)


@head_params(EVERY_HEAD)
def test_every_parameter_gets_a_gradient(variant, name, auto_name, overrides):
    model = build(name, auto_name, **overrides).train()
    training_loss(model(**padded_inputs(auto_name))).backward()
    missing = [key for key, parameter in model.named_parameters() if parameter.grad is None]
    assert not missing, f"no gradient for {missing}"
