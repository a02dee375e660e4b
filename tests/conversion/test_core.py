"""The conversion core: safe loading, strict key accounting, state-dict checks, verification and atomic output."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

import posformers
from posformers.conversion import cli
from posformers.conversion.core import (
    ConversionError,
    KeyMap,
    OutputInfo,
    build_model,
    check_output_dir,
    check_state_dict,
    compare_outputs,
    load_tensors,
    transposed,
    write_output,
)

from .conftest import assert_no_partial_outputs, tree_digest


def tiny_model(seed: int = 0) -> posformers.RoFormerForMaskedLM:
    config = posformers.RoFormerConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24
    )
    torch.manual_seed(seed)
    return posformers.RoFormerForMaskedLM(config).eval()


INFO = OutputInfo(source_description="a test checkpoint", command_line="posformers-convert roformer --from hf ...")


class _TouchOnUnpickle:
    """Unpickling this object would create `marker`: the code-execution a weights-only load must refuse."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


def test_load_tensors_refuses_a_pickle_that_runs_code(workdir):
    marker = workdir / "pwned"
    file = workdir / "pytorch_model.bin"
    with open(file, "wb") as handle:
        pickle.dump({"weight": _TouchOnUnpickle(marker)}, handle, protocol=2)  # the protocol torch.save uses
    with pytest.raises(ConversionError, match="refused to load") as error:
        load_tensors(file)
    assert "safetensors" in str(error.value)  # says what to do instead
    assert not marker.exists()


def test_load_tensors_refuses_a_torch_save_of_arbitrary_objects(workdir):
    marker = workdir / "pwned"
    torch.save({"weight": torch.ones(2), "payload": _TouchOnUnpickle(marker)}, workdir / "model.pt")
    marker.unlink(missing_ok=True)
    with pytest.raises(ConversionError, match="refused to load"):
        load_tensors(workdir)
    assert not marker.exists()


def test_load_tensors_drops_non_tensor_entries_with_a_note(workdir, capsys):
    torch.save({"weight": torch.arange(3.0), "config": {"hidden_size": 3}, "step": 7}, workdir / "pytorch_model.bin")
    tensors = load_tensors(workdir)
    assert list(tensors) == ["weight"] and torch.equal(tensors["weight"], torch.arange(3.0))
    assert "ignored non-tensor entries (not weights): ['config', 'step']" in capsys.readouterr().out


def test_load_tensors_prefers_safetensors_and_reads_sharded_indexes(workdir):
    save_file({"a": torch.ones(2)}, str(workdir / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(3)}, str(workdir / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (workdir / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save({"stale": torch.ones(1)}, workdir / "pytorch_model.bin")  # ignored: safetensors win
    tensors = load_tensors(workdir)
    assert sorted(tensors) == ["a", "b"]

    index["weight_map"]["c"] = "model-00003-of-00003.safetensors"
    (workdir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConversionError, match=r"model-00003-of-00003\.safetensors"):
        load_tensors(workdir)


def test_load_tensors_names_what_it_looked_for(workdir):
    with pytest.raises(ConversionError, match=r"no weights found .*\*\.safetensors"):
        load_tensors(workdir)
    with pytest.raises(ConversionError, match="no such file or directory"):
        load_tensors(workdir / "missing")


# ---------------------------------------------------------------------------------------------------------------------
# Key maps
# ---------------------------------------------------------------------------------------------------------------------


def test_key_map_renames_transposes_and_drops_with_reasons():
    kernel = torch.arange(6.0).reshape(2, 3)
    source = {"enc/layer_0/kernel": kernel, "enc/layer_0/bias": torch.ones(3), "enc/layer_0/kernel/adam_m": kernel}
    key_map = KeyMap(
        [(r"enc/layer_(\d+)/kernel", transposed(r"layer.\1.weight")), (r"enc/layer_(\d+)/bias", r"layer.\1.bias")],
        {r".*/adam_m": "optimizer state"},
    )
    target, report = key_map.apply(source)
    assert source == {}  # consumed: one copy of the weights at a time
    assert sorted(target) == ["layer.0.bias", "layer.0.weight"]
    assert torch.equal(target["layer.0.weight"], kernel.t())
    assert report.dropped == [("enc/layer_0/kernel/adam_m", "optimizer state")]  # dropped, though a rule matches
    assert "dropped enc/layer_0/kernel/adam_m: optimizer state" in report.summary()


def test_key_map_names_every_unaccounted_key():
    source = {"known": torch.ones(1), "extra.one": torch.ones(1), "extra.two": torch.ones(1)}
    key_map = KeyMap([("known", "known")])
    with pytest.raises(ConversionError, match=r"2 source tensor\(s\).*\['extra.one', 'extra.two'\]"):
        key_map.apply(source)
    assert len(source) == 3  # nothing consumed when the accounting fails


def test_key_map_refuses_two_sources_for_one_target():
    key_map = KeyMap([(r"(a|b)", "same")])
    with pytest.raises(ConversionError, match="two source tensors map to 'same'"):
        key_map.apply({"a": torch.ones(1), "b": torch.ones(1)})


# ---------------------------------------------------------------------------------------------------------------------
# State-dict checks and verification
# ---------------------------------------------------------------------------------------------------------------------


def test_check_state_dict_names_missing_unexpected_and_mismatched_keys():
    model = tiny_model()
    state = dict(model.state_dict())
    state.pop("cls.predictions.decoder.weight")  # tied to the word embeddings: may be absent
    check_state_dict(model, state)
    check_state_dict((type(model), model.config), state)

    state.pop("roformer.encoder.layer.0.output.dense.bias")
    state["roformer.pooler.dense.weight"] = torch.ones(16, 16)
    state["roformer.embeddings.word_embeddings.weight"] = torch.ones(51, 16)
    with pytest.raises(ConversionError) as error:
        check_state_dict((type(model), model.config), state)
    message = str(error.value)
    assert "missing (the model needs them, the source has nothing for them): " in message
    assert "roformer.encoder.layer.0.output.dense.bias" in message
    assert "unexpected (the model has no such tensor): ['roformer.pooler.dense.weight']" in message
    assert "roformer.embeddings.word_embeddings.weight: expected (50, 16), found (51, 16)" in message


def test_build_model_holds_exactly_the_given_weights():
    model = tiny_model(seed=3)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    built = build_model(posformers.RoFormerForMaskedLM, model.config, state)
    for key, value in model.state_dict().items():
        assert torch.equal(built.state_dict()[key], value), key
    assert built.cls.predictions.decoder.weight is built.roformer.embeddings.word_embeddings.weight
    inputs = {"input_ids": torch.tensor([[1, 2, 3, 4]])}
    with torch.no_grad():
        assert torch.equal(built(**inputs).logits, model(**inputs).logits)


def test_compare_outputs_prints_the_table_and_fails_above_tolerance(capsys):
    ours, reference = torch.zeros(2, 3), torch.zeros(2, 3)
    assert compare_outputs({"logits": (ours, reference)}) == {"logits": 0.0}
    assert "  logits | 0.000e+00" in capsys.readouterr().out
    with pytest.raises(ConversionError, match=r"hidden differs by 1.000e-03 \(tolerance 0.0001\)"):
        compare_outputs({"logits": (ours, reference), "hidden": (ours + 1e-3, reference)})
    with pytest.raises(ConversionError, match="nan"):
        compare_outputs({"logits": (ours * float("nan"), reference)})


# ---------------------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------------------


def test_write_output_writes_weights_code_and_a_card(workdir):
    model = tiny_model()
    output = write_output(model, workdir / "out", overwrite=False, info=INFO)
    files = {path.name for path in output.iterdir()}
    assert {"config.json", "model.safetensors", "modeling_roformer.py", "configuration_roformer.py"} <= files
    assert "auto_map" in json.loads((output / "config.json").read_text())
    card = (output / "README.md").read_text()
    assert "a test checkpoint" in card and "posformers-convert roformer --from hf ..." in card
    assert "library_name: transformers" in card
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(output)
    words = model.roformer.embeddings.word_embeddings.weight
    assert torch.equal(loaded.roformer.embeddings.word_embeddings.weight, words)


def test_write_output_refuses_a_non_empty_directory_without_overwrite(workdir):
    output = workdir / "out"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    with pytest.raises(ConversionError, match="pass --overwrite"):
        write_output(tiny_model(), output, overwrite=False, info=INFO)
    assert [path.name for path in output.iterdir()] == ["notes.txt"]
    check_output_dir(workdir / "empty", overwrite=False)  # absent or empty is fine
    write_output(tiny_model(), output, overwrite=True, info=INFO)
    assert not (output / "notes.txt").exists()


class _FailingTokenizer:
    def save_pretrained(self, folder):
        (Path(folder) / "vocab.txt").write_text("half written")
        raise OSError("disk full")


def test_a_failed_write_leaves_no_partial_output(workdir):
    with pytest.raises(ConversionError, match="disk full"):
        write_output(tiny_model(), workdir / "out", overwrite=False, info=INFO, tokenizer=_FailingTokenizer())
    assert not (workdir / "out").exists()
    assert_no_partial_outputs(workdir, "out")

    # --overwrite of an existing output that then fails keeps the old output untouched
    write_output(tiny_model(seed=1), workdir / "out", overwrite=False, info=INFO)
    before = tree_digest(workdir / "out")
    with pytest.raises(ConversionError, match=r"disk full.*previous output is unchanged"):
        write_output(tiny_model(seed=2), workdir / "out", overwrite=True, info=INFO, tokenizer=_FailingTokenizer())
    assert tree_digest(workdir / "out") == before
    assert_no_partial_outputs(workdir, "out")


def test_sharded_output_loads(workdir):
    model = tiny_model(seed=4)
    output = write_output(model, workdir / "out", overwrite=False, info=INFO, max_shard_size="4KB", dtype="bfloat16")
    shards = sorted(path.name for path in output.glob("model-*.safetensors"))
    assert len(shards) > 1 and (output / "model.safetensors.index.json").is_file()
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(output)
    assert loaded.dtype == torch.bfloat16
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value.to(torch.bfloat16)), key


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


def test_cli_reports_conversion_errors_without_a_traceback(workdir):
    command = [sys.executable, "-m", "posformers.conversion", "roformer", "--from", "hf"]
    command += ["--source", str(workdir / "missing"), "--output", str(workdir / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("error: --source") and "Traceback" not in result.stderr, result.stderr
    assert not (workdir / "out").exists()


def test_cli_lists_every_family_and_checks_arguments(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert all(family in help_text for family in cli.FAMILIES)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["roformer", "--from", "onnx", "--source", "x", "--output", "y"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'onnx'" in capsys.readouterr().err
