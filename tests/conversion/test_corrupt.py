"""`posformers-convert` on sources that are not what they claim, and on a disk that fills up while it writes: one
`error: ...` line naming the file and the problem, exit status 1, and no output (nor any staging folder) left behind.

The source is a Hugging Face-format RoFormer folder as transformers writes it (model.safetensors, config.json,
vocab.txt of bert-base-chinese); the intact folder converts (checked first), each case breaks one thing in a copy.
"""

from __future__ import annotations

import errno
import re
import shutil

import pytest
import torch
import transformers
from helpers import corrupt

from .conftest import VOCAB_DIR, assert_no_partial_outputs, tree_digest

VOCAB = VOCAB_DIR / "bert-base-chinese" / "vocab.txt"
PROGRESS_BAR = re.compile(r"\d+/\d+ \[[^\]]*it/s\]$")  # tqdm's bars, which transformers draws on stderr
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, embedding_size=32)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A transformers RoFormer classifier saved whole and in shards, each beside its vocab.txt, by name."""
    root = tmp_path_factory.mktemp("convert-corrupt")
    vocab_size = len(VOCAB.read_text(encoding="utf-8").rstrip("\n").split("\n"))
    config = transformers.RoFormerConfig(vocab_size=vocab_size, num_labels=3, **TINY)
    torch.manual_seed(0)
    reference = transformers.RoFormerForSequenceClassification(config)
    folders = {"whole": root / "whole", "sharded": root / "sharded"}
    reference.save_pretrained(folders["whole"])
    reference.save_pretrained(folders["sharded"], max_shard_size="1MB")
    for folder in folders.values():
        shutil.copy(VOCAB, folder / "vocab.txt")
    return folders


def remove_the_vocab(folder):
    (folder / "vocab.txt").unlink()
    return folder


# case -> (break the source, sharded?, the problem the error line must state, extra arguments)
CASES = {
    "truncated safetensors": (corrupt.truncate, False, r"truncated safetensors file \(\d+ bytes", []),
    "truncated shard": (corrupt.truncate_shard, True, r"truncated safetensors file \(\d+ bytes", []),
    "truncated pickle": (corrupt.truncate_pickle, False, r"not a readable PyTorch checkpoint", []),
    "corrupted header": (corrupt.corrupt_header, False, r"corrupted safetensors header \(not valid JSON", []),
    "missing shard": (
        corrupt.remove_a_shard,
        True,
        r"names shard files that do not exist: \[.*model-000\d\d-of-000\d\d",
        [],
    ),
    "wrong shape": (
        corrupt.wrong_shape,
        False,
        r"shape mismatches: .*query\.weight: expected \(32, 32\), found \(3, 3\)",
        [],
    ),
    "wrong dtype": (
        corrupt.wrong_dtype,
        False,
        r"not floating point \(the model's weights are\): .*query\.weight: int64",
        [],
    ),
    "pickle that runs code": (
        corrupt.pickle_that_runs_code,
        False,
        r"refused to load\. This pickle needs more than tensors to be unpickled \(it calls os\.makedirs\), which "
        r"could run arbitrary code, so it is not read\. If you trust the file, re-save its tensors .*safetensors",
        [],
    ),
    "config not JSON": (corrupt.config_not_json, False, r"config\.json: not a readable JSON file", []),
    "config field type": (
        corrupt.config_field_of_the_wrong_type,
        False,
        r"config\.json: invalid RoFormer config \(RoFormerConfig\.hidden_size must be a positive integer, got '32'\)",
        [],
    ),
    "unknown model_type": (
        corrupt.unknown_model_type,
        False,
        r"config\.json: model_type is 'posformers-nosuchmodel', expected 'roformer'",
        [],
    ),
    "tokenizer file missing": (remove_the_vocab, False, r"no vocab\.txt there", ["--vocab", "{source}"]),
}


def convert_args(source, output, *extra):
    return ["roformer", "--from", "hf", "--source", source, "--output", output, "--no-verify", *extra]


def assert_one_error_line(result, *names: str, problem: str) -> None:
    """Exit status 1 and, besides transformers' progress bars, one stderr line: "error: ", one of `names` (the
    broken file, or the folder for a check of all its tensors) and `problem`."""
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.strip() and not PROGRESS_BAR.search(line)]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert any(name in lines[0] for name in names), lines[0]
    assert re.search(problem, lines[0]), lines[0]


def test_the_intact_sources_convert(sources, workdir, convert_here):
    for name, source in sources.items():
        convert_here(*convert_args(source, workdir / name)).check()
        assert (workdir / name / "model.safetensors").is_file()


@pytest.mark.parametrize("case", CASES)
def test_a_broken_source_is_one_error_line_and_writes_nothing(sources, workdir, convert_here, case):
    break_source, sharded, problem, extra = CASES[case]
    source = workdir / "source"
    shutil.copytree(sources["sharded" if sharded else "whole"], source)
    broken = break_source(source)
    output = workdir / "converted"
    result = convert_here(*convert_args(source, output, *(arg.format(source=source) for arg in extra)))
    assert_one_error_line(result, str(broken), str(source), problem=problem)
    assert not output.exists()
    assert_no_partial_outputs(workdir, "converted")
    assert not (source / "pwned").exists()  # nothing was unpickled


def test_a_full_disk_keeps_the_previous_output_and_leaves_nothing_behind(sources, workdir, convert_here, monkeypatch):
    output = workdir / "converted"
    args = convert_args(sources["whole"], output)
    convert_here(*args).check()
    before = tree_digest(output)
    write_file = transformers.modeling_utils.safe_save_file

    def write_half_then_fill_the_disk(tensors, filename, metadata=None):
        write_file(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as file:
            file.truncate(file.seek(0, 2) // 2)
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", write_half_then_fill_the_disk)
    result = convert_here(*args, "--overwrite")
    assert_one_error_line(
        result, str(output), problem=r"writing failed \(No space left on device\); the previous output is unchanged"
    )
    assert tree_digest(output) == before
    assert_no_partial_outputs(workdir, "converted")

    result = convert_here(*convert_args(sources["whole"], workdir / "fresh"))
    assert_one_error_line(result, str(workdir / "fresh"), problem=r"No space left on device\); nothing was written")
    assert not (workdir / "fresh").exists()
    assert_no_partial_outputs(workdir, "fresh")
