"""Checkpoint folders that are not what they claim: `from_pretrained` (the model classes and the Auto classes) ends
in one line naming the file and the problem, never a traceback from inside safetensors or torch.

Each case starts from a tiny model saved by `save_pretrained`, which loads back to the same weights (checked first, so
that a guard which refused good folders would fail here), breaks one thing, and expects an OSError / ValueError whose
one-line message names the broken file and says what is wrong with it.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from helpers import corrupt
from helpers.modeling import tiny_config
from transformers import AutoModelForMaskedLM

import posformers

FAMILIES = {
    "roformer": (posformers.RoFormerConfig, posformers.RoFormerForMaskedLM),
    "deberta": (posformers.DebertaConfig, posformers.DebertaForMaskedLM),
    "littlebird": (posformers.LittleBirdConfig, posformers.LittleBirdForMaskedLM),
}
# Small enough that the tiny models are saved in several shards.
SHARD_SIZE = "40KB"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{family: (model, folder, sharded folder)} of tiny MLMs saved by save_pretrained."""
    root = tmp_path_factory.mktemp("corrupt-files")
    folders = {}
    for family, (config_class, model_class) in FAMILIES.items():
        model = model_class(tiny_config(config_class)).eval()
        model.save_pretrained(root / family)
        model.save_pretrained(root / f"{family}-sharded", max_shard_size=SHARD_SIZE)
        folders[family] = (model, root / family, root / f"{family}-sharded")
    return folders


# case -> (break the folder, sharded?, the problem the message must state, loaders)
BOTH = ("auto", "class")
CASES = {
    "truncated safetensors": (corrupt.truncate, False, r"truncated safetensors file \(\d+ bytes", BOTH),
    "truncated shard": (corrupt.truncate_shard, True, r"truncated safetensors file \(\d+ bytes", BOTH),
    "truncated pickle": (
        corrupt.truncate_pickle,
        False,
        r"not a readable PyTorch checkpoint, truncated or corrupted",
        BOTH,
    ),
    "corrupted header": (corrupt.corrupt_header, False, r"corrupted safetensors header \(not valid JSON", BOTH),
    "missing shard": (
        corrupt.remove_a_shard,
        True,
        r"names 1 shard\(s\) that are not there: model-000\d\d-of-000\d\d",
        BOTH,
    ),
    "wrong shape": (
        corrupt.wrong_shape,
        False,
        r"query(_proj)?\.weight has shape \(3, 3\), the model expects \(32, 32\)",
        BOTH,
    ),
    "wrong dtype": (
        corrupt.wrong_dtype,
        False,
        r"query(_proj)?\.weight is stored as I64, the model's .* is float32",
        BOTH,
    ),
    "pickle that runs code": (
        corrupt.pickle_that_runs_code,
        False,
        r"refused to unpickle, it calls os\.makedirs, which could run arbitrary code\. If you trust the file, "
        r"re-save its tensors as safetensors in an isolated environment",
        BOTH,
    ),
    "config not JSON": (corrupt.config_not_json, False, r"is not a valid JSON file", BOTH),
    "config field type": (corrupt.config_field_of_the_wrong_type, False, r"hidden_size must be .*, got '32'", BOTH),
    # The Auto classes never reach posformers for a model_type nobody registered: transformers refuses it (naming the
    # model_type, not the file, and asking for trust_remote_code since the folder carries its code).
    "unknown model_type": (
        corrupt.unknown_model_type,
        False,
        r"unknown model_type 'posformers-nosuchmodel'",
        ("class",),
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_intact_checkpoints_load_the_saved_weights(saved, family):
    model, folder, sharded = saved[family]
    for source in (folder, sharded):
        loaded, info = AutoModelForMaskedLM.from_pretrained(source, output_loading_info=True)
        assert type(loaded) is type(model) and not info["missing_keys"] and not info["mismatched_keys"]
        for key, value in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), key


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_names_the_file_and_the_problem(saved, tmp_path, family, case):
    break_folder, sharded, problem, loaders = CASES[case]
    folder = tmp_path / family
    shutil.copytree(saved[family][2 if sharded else 1], folder)
    broken = break_folder(folder)
    for loader in loaders:
        load = AutoModelForMaskedLM.from_pretrained if loader == "auto" else FAMILIES[family][1].from_pretrained
        with pytest.raises((OSError, ValueError)) as error:
            load(folder)
        message = str(error.value)
        assert "\n" not in message, message
        assert str(broken) in message or str(folder) in message, message  # the file, or the folder of its tensors
        assert re.search(problem, message), message
        assert not (folder / "pwned").exists()  # nothing was unpickled
