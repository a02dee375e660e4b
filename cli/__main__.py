"""`python -m posformers_cli`: write `help/<script>.txt` for every console script, as the script prints its `--help`
at 100 columns. Run it after changing a script's options; tests/test_cli.py checks that the texts are current."""

import contextlib
import importlib
import io
import os
import sys
from pathlib import Path

from . import SCRIPTS

HELP_DIR = Path(__file__).parent / "help"


def render_help(script: str) -> str:
    """What `script --help` prints when it runs the script itself, at 100 columns."""
    os.environ["COLUMNS"] = "100"
    sys.argv = [script, "--help"]  # argparse names the program after sys.argv[0]
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.suppress(SystemExit):
        importlib.import_module(SCRIPTS[script]).main(["--help"])
    return output.getvalue()


def main() -> None:
    for script in SCRIPTS:
        (HELP_DIR / f"{script}.txt").write_text(render_help(script), encoding="utf-8")
        print(f"wrote {HELP_DIR / script}.txt")


if __name__ == "__main__":
    main()
