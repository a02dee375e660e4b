"""One-line errors for weight files that are not what they claim, around transformers' `from_pretrained`
(`checked_from_pretrained`; the cases are listed in docs/reliability.md, "Corrupt and hostile files").

transformers loads the weights; nothing here loads them again. When loading fails, `explain_load_error` looks at the
checkpoint's files (the local folder, or the Hub files already in the cache) and returns a `CheckpointError` naming
the file and the problem; after a load, `check_loaded_dtypes` refuses a floating-point weight stored as integers or
booleans, which transformers would silently cast. Only safetensors headers are read, never tensor data. Imports only
torch and transformers: `save_pretrained` copies this file beside the weights for `trust_remote_code` users.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import struct

import torch
from transformers.utils import cached_file

SAFETENSORS_WEIGHTS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
# safetensors' names of the floating-point dtypes (https://github.com/huggingface/safetensors, "Format").
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4"})
# A safetensors header above this is refused by the library itself ("header too large").
MAX_HEADER_BYTES = 100_000_000


def _location(kwargs: dict) -> dict:
    """The keyword arguments of `from_pretrained` that say where its files are."""
    return {key: kwargs[key] for key in ("cache_dir", "revision", "subfolder", "token") if kwargs.get(key) is not None}


class CheckpointError(OSError):
    """A weight file that is not what it claims; the message names the file and the problem."""


class CheckpointShapeError(CheckpointError, RuntimeError):
    """Tensors of the wrong shape. Also a RuntimeError, what transformers raises for them: code written for
    transformers catches that."""


def local_file(name_or_path, filename: str, kwargs: dict) -> str | None:
    """`filename` of a checkpoint folder or Hub repo, if it is on this machine (the folder, or the Hub cache)."""
    if name_or_path is None:  # from_pretrained(None, state_dict=...): no files
        return None
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path):
        path = os.path.join(name_or_path, kwargs.get("subfolder") or "", filename)
        return path if os.path.isfile(path) else None
    try:
        return cached_file(name_or_path, filename, local_files_only=True, **_location(kwargs))
    except Exception:  # not in the cache, or not a repo id: there is nothing local to look at
        return None


def weight_files(name_or_path, kwargs: dict) -> list[str]:
    """The local weight files transformers loads for `name_or_path` (safetensors first, as transformers prefers).

    A shard index that cannot be read, or that names a shard which is not there, is a CheckpointError.
    """
    for index_name, single_name in ((SAFETENSORS_INDEX, SAFETENSORS_WEIGHTS), (PICKLE_INDEX, PICKLE_WEIGHTS)):
        if (index := local_file(name_or_path, index_name, kwargs)) is not None:
            shards = list(dict.fromkeys(weight_map(index).values()))
            files = [local_file(name_or_path, shard, kwargs) for shard in shards]
            if missing := [shard for shard, file in zip(shards, files) if file is None]:
                raise CheckpointError(
                    f"{index} names {len(missing)} shard(s) that are not there: {', '.join(missing)} "
                    f"({len(shards) - len(missing)} of {len(shards)} present); download the checkpoint again"
                )
            return files
        if (single := local_file(name_or_path, single_name, kwargs)) is not None:
            return [single]
    return []


def weight_map(index: str) -> dict[str, str]:
    """A shard index's tensor name -> shard file map; a CheckpointError where the index is not one."""
    try:
        with open(index, encoding="utf-8") as file:
            names = json.load(file)["weight_map"]
        if not isinstance(names, dict):
            raise TypeError(f"'weight_map' is a {type(names).__name__}")
        return names
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(
            f"{index}: not a valid shard index (a JSON object with a 'weight_map'): {error}"
        ) from None


def safetensors_header(path: str) -> dict:
    """The JSON header of a safetensors file, checked against the file's size; a CheckpointError says what is wrong.

    Layout: an 8-byte little-endian header length, the header (JSON: name -> dtype, shape, data_offsets), the data.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, too short for a header)")
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{path}: corrupted safetensors header (it claims {header_length} bytes, more than any header)"
            )
        if 8 + header_length > size:
            raise CheckpointError(
                f"{path}: truncated safetensors file ({size} bytes, but its header alone claims {8 + header_length})"
            )
        try:
            header = json.loads(file.read(header_length))
        except (UnicodeDecodeError, ValueError) as error:
            raise CheckpointError(f"{path}: corrupted safetensors header (not valid JSON: {error})") from None
    tensors = (
        {name: entry for name, entry in header.items() if name != "__metadata__"} if isinstance(header, dict) else None
    )
    if tensors is None or not all(_is_tensor_entry(entry) for entry in tensors.values()):
        raise CheckpointError(
            f"{path}: corrupted safetensors header (not a map of tensor names to dtype/shape/offsets)"
        )
    data_size = max((entry["data_offsets"][1] for entry in tensors.values()), default=0)
    if 8 + header_length + data_size > size:
        raise CheckpointError(
            f"{path}: truncated safetensors file ({size} bytes, its header describes {8 + header_length + data_size})"
        )
    return tensors


def checkpoint_names(name_or_path, kwargs: dict) -> set[str]:
    """The tensor names of a checkpoint whose safetensors files are on this machine (from their headers or the shard
    index); empty where there are none (pickled weights, or Hub files not downloaded yet)."""
    try:
        if (index := local_file(name_or_path, SAFETENSORS_INDEX, kwargs)) is not None:
            return set(weight_map(index))
        if (single := local_file(name_or_path, SAFETENSORS_WEIGHTS, kwargs)) is not None:
            return set(safetensors_header(single))
    except CheckpointError:  # the load itself reports it, and explain_load_error names it
        pass
    return set()


def _is_tensor_entry(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and all(isinstance(offset, int) for offset in entry["data_offsets"])
    )


def checkpoint_key(model_key: str, names, prefix: str) -> str | None:
    """The name a model tensor has in a checkpoint: as it is, without the base model's prefix, or with it."""
    for candidate in (model_key, model_key.removeprefix(f"{prefix}."), f"{prefix}.{model_key}"):
        if candidate in names:
            return candidate
    return None


def explain_load_error(model_class, name_or_path, kwargs: dict, error: Exception) -> CheckpointError | None:
    """A CheckpointError naming the file and the problem behind `error` (raised by `from_pretrained`), or None when
    the checkpoint's files show nothing wrong (then `error` is about something else and stands as it is)."""
    try:
        files = weight_files(name_or_path, kwargs)
        headers = {file: safetensors_header(file) for file in files if file.endswith(".safetensors")}
    except CheckpointError as problem:
        return problem
    if isinstance(error, pickle.UnpicklingError):
        return _pickle_refusal(files, error)
    if isinstance(error, RuntimeError) and "ignore_mismatched_sizes" in str(error):
        try:
            return _shape_mismatch(model_class, name_or_path, kwargs, headers)
        except Exception:  # the config or the model cannot be built: the original error says more
            return None
    for file in files:
        problem = _load_error(file)
        if problem is None or isinstance(problem, pickle.UnpicklingError):  # readable, or refused: not unreadable
            continue
        reason = next((line.strip() for line in str(problem).splitlines() if line.strip()), type(problem).__name__)
        if "mmap" not in reason:  # a legacy (pre-zip) file cannot be mapped, which is no fault
            return CheckpointError(f"{file}: not a readable PyTorch checkpoint, truncated or corrupted ({reason})")
    return None


def _pickle_refusal(files: list[str], error: Exception) -> CheckpointError:
    unsafe = [file for file in files if isinstance(_load_error(file), pickle.UnpicklingError)]
    found = re.search(r"GLOBAL (\S+)", str(error))
    what = f"it calls {found.group(1)}" if found else "it holds more than tensors"
    return CheckpointError(
        f"{', '.join(unsafe or files)}: refused to unpickle, {what}, which could run arbitrary code. If you trust the "
        "file, re-save its tensors as safetensors in an isolated environment (torch.load(path, weights_only=False), "
        "then safetensors.torch.save_file) and load that"
    )


def _load_error(path: str) -> Exception | None:
    """What torch raises reading the pickle at `path` weights-only (an UnpicklingError: it refuses it), or None."""
    if path.endswith(".safetensors"):
        return None
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # mapped: nothing is read into memory
    except Exception as error:
        return error
    return None


def _shape_mismatch(model_class, name_or_path, kwargs: dict, headers: dict[str, dict]) -> CheckpointShapeError:
    config = kwargs.get("config")
    if not hasattr(config, "to_dict"):
        config = model_class.config_class.from_pretrained(config or name_or_path, **_location(kwargs))
    with torch.device("meta"):
        expected = model_class(config).state_dict()
    prefix = model_class.base_model_prefix
    mismatches = []
    for file, tensors in headers.items():
        for model_key, tensor in expected.items():
            key = checkpoint_key(model_key, tensors, prefix)
            if key is not None and tuple(tensors[key]["shape"]) != tuple(tensor.shape):
                shapes = f"{tuple(tensors[key]['shape'])}, the model expects {tuple(tensor.shape)}"
                mismatches.append(f"{os.path.basename(file)}: {key} has shape {shapes}")
    where = "; ".join(mismatches[:3]) + (f"; ... ({len(mismatches)} in all)" if len(mismatches) > 3 else "")
    return CheckpointShapeError(
        f"{name_or_path}: tensors of the wrong shape for {model_class.__name__}"
        + (f" ({where})" if where else "")
        + "; pass ignore_mismatched_sizes=True to initialise them afresh instead"
    )


def check_loaded_dtypes(model, name_or_path, kwargs: dict) -> None:
    """Refuse (CheckpointError) a floating-point weight of `model` that its safetensors file stores as integers or
    booleans: transformers casts it silently, and the model would compute with rounded garbage."""
    for file in weight_files(name_or_path, kwargs):
        if not file.endswith(".safetensors"):
            continue
        tensors = safetensors_header(file)
        if all(entry["dtype"] in FLOAT_DTYPES for entry in tensors.values()):
            continue
        for model_key, tensor in model.state_dict().items():
            key = checkpoint_key(model_key, tensors, model.base_model_prefix)
            if key is not None and tensor.is_floating_point() and tensors[key]["dtype"] not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{file}: tensor {key} is stored as {tensors[key]['dtype']}, the model's {model_key} is "
                    f"{str(tensor.dtype).removeprefix('torch.')}; the file is not a checkpoint of this model"
                )


def checked_from_pretrained(load, cls, pretrained_model_name_or_path, *model_args, **kwargs):
    """`load(pretrained_model_name_or_path, *model_args, **kwargs)`, `load` being the `super().from_pretrained` of a
    model class `cls`, with the checks above: weights that are not what they claim (a truncated or corrupted
    safetensors file, a shard index naming a missing shard, a tensor of the wrong shape or dtype, a pickle that would
    run code) end in one `CheckpointError` naming the file and the problem, not in a traceback from inside safetensors
    or torch. Each model's `PreTrainedModel.from_pretrained` calls it."""
    try:
        loaded = load(pretrained_model_name_or_path, *model_args, **kwargs)
    except Exception as error:
        if (problem := explain_load_error(cls, pretrained_model_name_or_path, kwargs, error)) is None:
            raise
        raise problem from None
    check_loaded_dtypes(loaded[0] if isinstance(loaded, tuple) else loaded, pretrained_model_name_or_path, kwargs)
    return loaded
