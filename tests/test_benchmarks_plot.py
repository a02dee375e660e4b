"""The model suites' plots (benchmarks/plot.py plot_suite, `python -m benchmarks.run --plot-only`): drawn from every
committed report, next to its JSON; one line instead of a crash without matplotlib."""

import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.plot import MISSING_MATPLOTLIB

RESULTS = Path(run.__file__).resolve().parent / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("report", ["roformer", "deberta", "deberta-train", "littlebird", "littlebird-scaling"])
def test_plot_only_redraws_each_committed_report(report, tmp_path, capsys):
    path = shutil.copy(RESULTS / f"{report}.json", tmp_path / f"{report}.json")
    assert run.main(["--model", "roformer", "--plot-only", "--output", str(path)]) == 0
    assert (tmp_path / f"{report}.png").read_bytes().startswith(PNG_MAGIC)
    assert capsys.readouterr().out.strip() == f"plot: {tmp_path / f'{report}.png'}"
    assert (RESULTS / f"{report}.png").is_file()  # the README shows the committed one


def test_without_matplotlib_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    path = shutil.copy(RESULTS / "roformer.json", tmp_path / "roformer.json")
    assert run.main(["--model", "roformer", "--plot-only", "--output", str(path)]) == 0
    assert capsys.readouterr().out.strip() == MISSING_MATPLOTLIB
    assert not (tmp_path / "roformer.png").exists()
