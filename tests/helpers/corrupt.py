"""Ways a checkpoint folder can be broken, shared by the corrupt-file tests of from_pretrained, posformers-convert and
the scripts. Each breaker changes one thing in a folder saved by `save_pretrained` and returns the file it broke."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file


class RunsCodeOnUnpickle:
    """A pickle payload that would create `marker` if unpickled (what a malicious .bin does with os.system)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def truncate(folder):
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])  # a download cut halfway
    return file


def truncate_shard(folder):
    file = sorted(folder.glob("model-*.safetensors"))[-1]
    file.write_bytes(file.read_bytes()[:-100])
    return file


def corrupt_header(folder):
    file = folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:24] = b"\x00garbage-bytes\xff\xfe"  # the JSON header's first bytes
    file.write_bytes(bytes(data))
    return file


def remove_a_shard(folder):
    sorted(folder.glob("model-*.safetensors"))[-1].unlink()
    return folder / "model.safetensors.index.json"


def _edit_tensor(folder, edit):
    file = folder / "model.safetensors"
    tensors = load_file(file)
    key = next(key for key in tensors if key.endswith("query.weight") or key.endswith("query_proj.weight"))
    tensors[key] = edit(tensors[key])
    save_file(tensors, file, metadata={"format": "pt"})
    return file


def wrong_shape(folder):
    return _edit_tensor(folder, lambda tensor: torch.zeros(3, 3))


def wrong_dtype(folder):
    return _edit_tensor(folder, lambda tensor: (tensor * 1000).to(torch.int64))


def pickle_that_runs_code(folder):
    """Replaces the safetensors weights with a pytorch_model.bin whose unpickling would create `folder/pwned`."""
    for file in folder.glob("*.safetensors"):
        file.unlink()
    file = folder / "pytorch_model.bin"
    torch.save({"weight": torch.ones(2), "payload": RunsCodeOnUnpickle(folder / "pwned")}, file)
    return file


def config_not_json(folder):
    file = folder / "config.json"
    file.write_text(file.read_text()[:-40])  # truncated
    return file


def _edit_config(folder, **fields):
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **fields}))
    return file


def config_field_of_the_wrong_type(folder):
    return _edit_config(folder, hidden_size="32")


def unknown_model_type(folder):
    return _edit_config(folder, model_type="posformers-nosuchmodel")


def truncate_pickle(folder):
    """Replaces the safetensors weights with the same tensors in a pytorch_model.bin, cut halfway."""
    tensors = {}
    for file in folder.glob("*.safetensors"):
        tensors.update(load_file(file))
        file.unlink()
    file = folder / "pytorch_model.bin"
    torch.save(tensors, file)
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    return file
