"""Checks of a forward pass's inputs, shared by the three models: every wrong shape, type or index range stops with one
line naming the argument, before anything reaches a kernel."""

from collections.abc import Callable

import torch
from transformers.utils import is_torchdynamo_compiling


def input_shape(input_ids, inputs_embeds, embedding_size: int) -> tuple[int, int]:
    """(batch, seq_len) of exactly one of input_ids (B, L) or inputs_embeds (B, L, width); else a clear error."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(
            "Pass exactly one of input_ids or inputs_embeds (got both)"
            if input_ids is not None
            else "Pass exactly one of input_ids or inputs_embeds (got neither)"
        )
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
        shape = tuple(input_ids.shape)
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != embedding_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, seq_len, {embedding_size}), got {tuple(inputs_embeds.shape)}"
            )
        shape = tuple(inputs_embeds.shape[:2])
    if shape[1] == 0:
        raise ValueError("The input sequence is empty (seq_len = 0)")
    return shape


def check_per_token(name: str, tensor: torch.Tensor | None, shape: tuple[int, int]) -> None:
    """A per-token input (token_type_ids, position_ids) must have shape (batch or 1, seq_len)."""
    if tensor is not None and (
        tensor.dim() != 2 or tensor.shape[1] != shape[1] or tensor.shape[0] not in (1, shape[0])
    ):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} but the input has shape {shape}")


def check_index_ranges(checks) -> None:
    """Each `(name, ids or None, size)` of `checks` must hold indices in [0, size). Not while compiling: reading the
    values back is a data-dependent branch."""
    if is_torchdynamo_compiling():
        return
    for name, tensor, size in checks:
        if tensor is None or not tensor.numel():
            continue
        low, high = (int(v) for v in torch.aminmax(tensor))  # one pass, one device sync
        if low < 0 or high >= size:
            raise ValueError(f"{name} must lie in [0, {size}) for this config, got values in [{low}, {high}]")


def check_input_types(inputs: dict, dtype: torch.dtype) -> None:
    """Every given input (`inputs`: the forward arguments by name) is a tensor; ids (input_ids, token_type_ids,
    position_ids) are torch.long or torch.int, what embeddings and the rotary tables index with; inputs_embeds have
    the model's dtype `dtype` (any floating dtype under autocast, which casts them)."""
    for name, tensor in inputs.items():
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    for name in ("input_ids", "token_type_ids", "position_ids"):
        ids = inputs[name]
        if ids is not None and ids.dtype not in (torch.long, torch.int):
            raise TypeError(f"{name} must hold integers (torch.long or torch.int), got {ids.dtype}")
    embeds = inputs["inputs_embeds"]
    autocast = embeds is not None and embeds.is_floating_point() and torch.is_autocast_enabled(embeds.device.type)
    if embeds is not None and embeds.dtype != dtype and not autocast:
        raise TypeError(f"inputs_embeds must have the model's dtype {dtype}, got {embeds.dtype}")


def check_padding_mask(attention_mask: torch.Tensor, shape: tuple[int, int]) -> None:
    """The default mask check: a (batch, seq_len) padding mask."""
    if tuple(attention_mask.shape) != shape:
        raise ValueError(
            f"attention_mask must have the input's shape (batch, seq_len) = {shape}, got {tuple(attention_mask.shape)}"
        )


def check_inputs(
    config,
    dtype: torch.dtype,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    *,
    embedding_size: int,
    check_mask: Callable[[torch.Tensor, tuple[int, int]], None] | None = check_padding_mask,
    position_limit: int | None = None,
) -> tuple[int, int]:
    """Clear errors for malformed inputs, before they reach an index or a reshape deep inside torch; returns the
    input's (batch, seq_len).

    dtype: the model's; then the forward's inputs; embedding_size: the width inputs_embeds must have;
    check_mask(attention_mask, shape): the model's rule for mask shapes (default: a (batch, seq_len) padding mask;
    None: the model checks the mask itself); position_limit: the size of an absolute position table the model reads,
    which position_ids and the length must fit.
    """
    inputs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        position_ids=position_ids,
        inputs_embeds=inputs_embeds,
    )
    check_input_types(inputs, dtype)
    shape = input_shape(input_ids, inputs_embeds, embedding_size)
    if shape[0] == 0:
        raise ValueError(
            f"{'input_ids' if input_ids is not None else 'inputs_embeds'} holds an empty batch (batch = 0)"
        )
    if attention_mask is not None and check_mask is not None:
        check_mask(attention_mask, shape)
    check_per_token("token_type_ids", token_type_ids, shape)
    check_per_token("position_ids", position_ids, shape)
    checks = [("input_ids", input_ids, config.vocab_size)]
    if config.type_vocab_size > 0:
        checks.append(("token_type_ids", token_type_ids, config.type_vocab_size))
    if position_limit is not None:
        checks.append(("position_ids", position_ids, position_limit))
        if position_ids is None and shape[1] > position_limit:
            raise ValueError(
                f"Input of {shape[1]} tokens is longer than max_position_embeddings={position_limit}, the size of "
                f"the absolute position table this model reads"
            )
    check_index_ranges(checks)
    return shape
