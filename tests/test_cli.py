"""The console scripts' launcher (cli/, `posformers_cli`): a lone --help prints the script's shipped help without
importing the models, the shipped texts are what the scripts print, and every other command line runs the script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import posformers_cli

BIN = Path(sys.executable).parent  # the console scripts, installed beside this Python by pip


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_shipped_help_is_what_each_script_prints():
    # in a child: rendering sets COLUMNS and sys.argv, and imports every script
    code = (
        "import json; from posformers_cli import SCRIPTS; from posformers_cli.__main__ import render_help; "
        "print(json.dumps({script: render_help(script) for script in SCRIPTS}))"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    rendered = json.loads(result.stdout.splitlines()[-1])
    stale = [script for script, text in rendered.items() if text != posformers_cli.help_text(script)]
    assert not stale, f"run `python -m posformers_cli` to write the help of {stale} again"
    assert all(text.startswith(f"usage: {script}") for script, text in rendered.items())


def test_help_answers_without_importing_torch_transformers_or_posformers():
    code = (
        "import sys; sys.argv = ['posformers-glue', '--help']; import posformers_cli; posformers_cli.glue(); "
        "print(sorted(m for m in ('torch', 'transformers', 'posformers') if m in sys.modules))"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == posformers_cli.help_text("posformers-glue") + "[]\n"
    assert "--task_name" in result.stdout and "--padding_free" in result.stdout


def test_every_other_command_line_runs_the_script(tmp_path):
    # the script's own parser answers an unknown flag, and -h among other words is its own help
    unknown = subprocess.run(
        [str(BIN / "posformers-glue"), "--use_fast_tokenizr", "False"], capture_output=True, text=True, timeout=300
    )
    assert unknown.returncode != 0
    assert "unknown argument --use_fast_tokenizr" in unknown.stderr
    subcommand = subprocess.run(
        [str(BIN / "posformers-convert"), "deberta", "-h"], capture_output=True, text=True, timeout=300
    )
    assert subcommand.returncode == 0, subcommand.stderr
    assert subcommand.stdout.startswith("usage: posformers-convert deberta")
