"""Checks of a forward pass's inputs, shared by the three models: every wrong shape, type or index range stops with one
line naming the argument, before anything reaches a kernel."""

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
