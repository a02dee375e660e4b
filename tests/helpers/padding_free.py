"""Running a registry head padded and padding-free on the same weights, and comparing the two: outputs (every layer's
hidden states and padded positions included), loss and every parameter's gradient. Used by the padding-free contracts
(tests/models/test_contracts.py) and the model-specific padding-free tests."""

from __future__ import annotations

import torch

from .modeling import max_diff
from .registry import CASES, padded_inputs, per_token, real_tokens

TOLERANCE = 1e-5
SPAN_LOGITS = ("start_logits", "end_logits")


def tensors(output) -> dict[str, torch.Tensor]:
    return {key: value for key, value in output.items() if isinstance(value, torch.Tensor)}


def assert_all_close(actual: dict, expected: dict, what: str, tolerance: float = TOLERANCE):
    """The same names and shapes, at most `tolerance` apart anywhere."""
    assert sorted(actual) == sorted(expected), what
    for key, value in expected.items():
        assert actual[key].shape == value.shape, f"{what} {key}"
        diff = max_diff(actual[key], value) if value.numel() else 0.0
        assert diff <= tolerance, f"{what} {key}: max abs diff {diff}"


def case_inputs(auto_name: str, case: str, labels: bool = True) -> dict:
    lengths, width = CASES[case]
    return padded_inputs(auto_name, lengths, width, labels=labels)


def real_or_none(inputs: dict) -> torch.Tensor | None:
    """The (rows, width) real tokens of a padded batch; None for a flattened one (every position is a token)."""
    return real_tokens(inputs) if "attention_mask" in inputs else None


def compared_outputs(output, auto_name: str, real: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A pass's outputs as the padding-free contracts compare them: per-token outputs and every layer's hidden states
    whole (padded positions hold zeros, span logits the lowest float, on every path), per-row outputs (pooler, pack
    states, classes) of the rows holding a `real` token (a row of padding only has nothing to summarise), the
    loss."""
    rows = slice(None) if real is None else real.any(-1)
    compared = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor):
            compared[key] = value if value.dim() == 0 or per_token(auto_name, key) else value[rows]
        elif key == "hidden_states":
            compared.update({f"{key}[{layer}]": states for layer, states in enumerate(value)})
        elif isinstance(value, tuple):  # LittleBird's pack_hidden_states: per row
            compared.update({f"{key}[{layer}]": states[rows] for layer, states in enumerate(value)})
    return compared


def readout(output, auto_name: str, real: torch.Tensor | None) -> torch.Tensor:
    """The head's loss plus a fixed random weighting of its outputs at `real` tokens and of its per-row outputs of
    rows holding one, averaged so that gradients are of order one (float32 rounding then stays below TOLERANCE)."""
    generator = torch.Generator().manual_seed(1)
    loss = output.loss if output.get("loss") is not None else torch.zeros(())
    for key, value in tensors(output).items():
        if value.dim() and real is not None:
            value = value[real] if per_token(auto_name, key) else value[real.any(-1)]
        elif key in SPAN_LOGITS:  # a flattened batch's (sequences, longest): the lowest float past each end
            value = value[value > torch.finfo(value.dtype).min]
        if value.dim():
            loss = loss + (value * torch.randn(value.shape, generator=generator)).mean()
    return loss


def run_pass(model, auto_name: str, inputs: dict, mode: str, training: bool):
    """The compared outputs of one pass in `mode`, and in training (autograd on) every parameter's gradient of
    `readout`; in inference no autograd, so the kernels and caches of torch.no_grad run."""
    model.config.unpad_inputs = mode
    model.train(training)
    real = real_or_none(inputs)
    if not training:
        with torch.no_grad():
            return compared_outputs(model(**inputs, output_hidden_states=True), auto_name, real), {}
    model.zero_grad()
    output = model(**inputs, output_hidden_states=True)
    readout(output, auto_name, real).backward()
    gradients = {key: p.grad.clone() for key, p in model.named_parameters() if p.grad is not None}
    return {key: value.detach() for key, value in compared_outputs(output, auto_name, real).items()}, gradients


def assert_same_pass(actual: tuple, expected: tuple) -> None:
    """Two `run_pass` results agree: outputs and gradients within TOLERANCE."""
    assert_all_close(actual[0], expected[0], "outputs")
    assert_all_close(actual[1], expected[1], "gradients")
