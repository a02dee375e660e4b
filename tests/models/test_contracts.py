"""Contracts every model keeps with every head its AUTO_MAP registers, stated once over tests/helpers/registry.py (as
transformers' ModelTesterMixin states them once for all its models): padding-free == padded, flattened batches,
trust_remote_code loading, and what transformers' common model tests expect of any PreTrainedModel (a batch of padding
only, output_hidden_states from the config, loading into a model built without initialisation, gradients through the
returned attentions and into every parameter, a shape mismatch on loading)."""

from __future__ import annotations

import pytest
import torch
from helpers import python_env
from helpers.modeling import flattened, max_diff, tensor_outputs
from helpers.registry import (
    MODEL_HEAD_IDS,
    MODEL_HEADS,
    PER_TOKEN_OUTPUTS,
    REGISTRY,
    TOKEN_LABELS,
    padded_inputs,
    real_tokens,
    training_loss,
)
from helpers.remote import assert_loaded_remotely, assert_no_posformers, load_remote
from safetensors.torch import load_file, save_file
from transformers.initialization import no_init_weights

TOLERANCE = 1e-5
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


model_heads = pytest.mark.parametrize(("name", "auto_name"), MODEL_HEADS, ids=MODEL_HEAD_IDS)
# A decoder (RoFormer's causal LM) always runs padded, and refuses unpad_inputs="always".
ENCODER_HEADS = [(name, auto_name) for name, auto_name in MODEL_HEADS if auto_name != "AutoModelForCausalLM"]
encoder_heads = pytest.mark.parametrize(
    ("name", "auto_name"), ENCODER_HEADS, ids=[f"{name}-{auto_name}" for name, auto_name in ENCODER_HEADS]
)
models = pytest.mark.parametrize("name", list(REGISTRY))


def paths(auto_name: str, with_auto: bool = False) -> tuple[str, ...]:
    """The unpad_inputs modes that run the head's two paths, padded and padding-free (a decoder has the first only);
    `with_auto` adds "auto", whose choice between them is under test too."""
    modes = ("never",) if auto_name == "AutoModelForCausalLM" else ("never", "always")
    return (*modes, "auto") if with_auto else modes


def build(name: str, auto_name: str, **overrides):
    fields = {**PADDING_FREE_FIELDS.get((name, auto_name), {}), **overrides}
    return REGISTRY[name].build(auto_name, **fields)


def tensors(output) -> dict[str, torch.Tensor]:
    return {key: value for key, value in output.items() if isinstance(value, torch.Tensor)}


def assert_close_at_real_tokens(actual: dict, expected: dict, real: torch.Tensor, tolerance: float = TOLERANCE):
    """The same outputs; per-token ones compared at `real` tokens only, the others everywhere."""
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert actual[key].shape == value.shape, key
        per_token = key in PER_TOKEN_OUTPUTS and value.shape[:2] == real.shape
        diff = max_diff(actual[key], value, real if per_token else None)
        assert diff <= tolerance, f"{key}: max abs diff {diff}"


# ---------------------------------------------------------------------------------------------------------------------
# Padding-free execution
# ---------------------------------------------------------------------------------------------------------------------


@encoder_heads
def test_padding_free_matches_padded(name, auto_name):
    inputs = padded_inputs(auto_name)
    padded = build(name, auto_name, unpad_inputs="never")(**inputs, output_hidden_states=True)
    packed = build(name, auto_name, unpad_inputs="always")(**inputs, output_hidden_states=True)
    real = real_tokens(inputs)
    assert_close_at_real_tokens(tensors(packed), tensors(padded), real)
    for layer, (expected, actual) in enumerate(zip(padded.hidden_states, packed.hidden_states, strict=True)):
        if expected.shape[:2] != real.shape:  # multiple choice: (rows * choices, width, hidden)
            expected, actual = (states.view(len(real), -1, *states.shape[1:])[:, 0] for states in (expected, actual))
        assert max_diff(actual, expected, real) <= TOLERANCE, f"hidden_states[{layer}]"


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
            fill = torch.finfo(value.dtype).min if key in ("start_logits", "end_logits") else 0.0
            assert (value[pad] == fill).all(), f"unpad_inputs={mode!r} {key}: {value[pad].abs().max()} at padding"


@model_heads
def test_row_alone_equals_row_in_padded_batch(name, auto_name):
    inputs = padded_inputs(auto_name, labels=False)
    short = -1  # the last row, 5 real tokens of 17
    length = int(real_tokens(inputs)[short].sum())
    alone = {key: value[short:, ..., :length] for key, value in inputs.items()}
    for mode in paths(auto_name):
        model = build(name, auto_name, unpad_inputs=mode)
        with torch.no_grad():
            in_batch, by_itself = tensors(model(**inputs)), tensors(model(**alone))
        for key, value in by_itself.items():
            batched = in_batch[key][short:]
            if key in PER_TOKEN_OUTPUTS and batched.dim() >= 2 and batched.shape[1] == inputs["input_ids"].shape[-1]:
                batched = batched[:, :length]
            elif key == "pack_states":
                continue  # LittleBird's pack states summarise the whole (padded) width
            assert max_diff(batched, value) <= TOLERANCE, f"unpad_inputs={mode!r} {key}"


@model_heads
def test_flattened_batch_matches_padded(name, auto_name):
    """transformers' DataCollatorWithFlattening batch (one row, position_ids restarting at 0 per sequence) gives each
    sequence the outputs and the loss its padded row gives; multiple choice and a decoder refuse it."""
    inputs = padded_inputs(auto_name)
    real = real_tokens(inputs)
    model = build(name, auto_name)
    if auto_name in REFUSE_FLATTENED:
        rows = [ids[0] if ids.dim() == 2 else ids for ids in inputs["input_ids"]]
        batch = flattened([row[: int(n)].tolist() for row, n in zip(rows, real.sum(1))], cu_seq_lens=False)
        with pytest.raises(ValueError, match=r"flattened batch|num_choices"):
            model(**batch)
        return
    sentences = [ids[mask].tolist() for ids, mask in zip(inputs["input_ids"], real)]
    for cu_seq_lens in (False, True):
        batch = flattened(sentences, cu_seq_lens)
        batch.update({key: value for key, value in inputs.items() if key in LABEL_KEYS})
        if auto_name in TOKEN_LABELS:
            batch["labels"] = inputs["labels"][real][None]
        # The collator carries no token types: the padded run goes without them too.
        without_types = {key: value for key, value in inputs.items() if key != "token_type_ids"}
        padded, packed = tensors(model(**without_types)), tensors(model(**batch))
        for key, value in padded.items():
            if key == "pack_states":
                continue  # per padded row of blocks, not per sequence
            per_token = key in PER_TOKEN_OUTPUTS and value.shape[:2] == real.shape
            if per_token and packed[key].shape != value.shape:  # (1, tokens, ...), not span logits' (rows, width)
                value, per_token = value[real][None], False
            assert packed[key].shape == value.shape, key
            diff = max_diff(packed[key], value, real if per_token else None)
            assert diff <= TOLERANCE, f"cu_seq_lens={cu_seq_lens} {key}: max abs diff {diff}"


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


# Variants that change which parameters exist or are read.
PARAMETER_VARIANTS = {"deberta-absolute": ("deberta", {"relative_attention": False, "position_biased_input": True})}


@pytest.mark.parametrize(
    ("name", "auto_name", "overrides"),
    [(name, auto_name, {}) for name, auto_name in MODEL_HEADS]
    + [(name, auto_name, overrides) for name, overrides in PARAMETER_VARIANTS.values() for auto_name in ("AutoModel",)],
    ids=MODEL_HEAD_IDS + [f"{variant}-AutoModel" for variant in PARAMETER_VARIANTS],
)
def test_every_parameter_gets_a_gradient(name, auto_name, overrides):
    model = build(name, auto_name, **overrides).train()
    training_loss(model(**padded_inputs(auto_name))).backward()
    missing = [key for key, parameter in model.named_parameters() if parameter.grad is None]
    assert not missing, f"no gradient for {missing}"
