"""`make demo` runs end to end: trains, saves, reloads through AutoModel and fills masks correctly."""

import pytest

from posformers import demo


def test_demo_fills_masks_after_training(tmp_path, capsys):
    demo.main(["--output-dir", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert "reloaded with AutoModelForMaskedLM as posformers.roformer" in printed
    assert "4/4 masks filled correctly" in printed
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_demo_never_writes_into_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="was not made by this demo"):
        demo.main(["--output-dir", str(tmp_path), "--steps", "1"])
    assert (tmp_path / "notes.txt").read_text() == "mine"
