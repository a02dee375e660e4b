"""What every benchmark suite writes (benchmarks/harness.py `run_and_write`), checked the same way for each."""

import importlib.util
import json

from benchmarks.plot import MISSING_MATPLOTLIB


def check_written_report(report: dict, written: dict, format_markdown) -> str:
    """The JSON holds the report's cells, the markdown is `format_markdown(report)`, the plot is a PNG (or the one-line
    message where matplotlib is missing), and no partial report is left; returns the markdown."""
    assert json.loads(written["json"].read_text())["cells"] == report["cells"]
    markdown = written["markdown"].read_text()
    assert markdown == format_markdown(report)
    if importlib.util.find_spec("matplotlib") is None:
        assert written["plot"] == MISSING_MATPLOTLIB
    else:
        assert written["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not written["json"].with_suffix(".partial.json").exists()
    return markdown
