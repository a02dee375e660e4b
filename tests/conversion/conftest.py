"""Helpers shared by the conversion tests: run `posformers-convert` as a user would, read what it printed, load its
output in a fresh process with trust_remote_code, and check the --overwrite behaviour.

Fixtures:
    workdir        a temporary directory for one test
    convert        run the console command in a subprocess (offline, own HF_HOME): convert(*args) -> result
    convert_here   the same command run in this process (quicker): same result type

Each model's files run the console command itself in a subprocess where a test is about it (a user's run, --overwrite
through the command, a push to the Hub); the other conversions run `convert_in_process`, the same `main`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import python_env
from helpers.data import DATA_DIR
from helpers.remote import assert_no_posformers, load_remote

VOCAB_DIR = DATA_DIR / "vocab"
CONVERT_COMMAND = Path(sys.executable).parent / "posformers-convert"
# A line of the verification table: "  <output> | <max abs diff>"
_TABLE_LINE = re.compile(r"^\s+(?P<name>[^|]+?)\s+\|\s+(?P<diff>[0-9.eE+-]+)\s*$")


@dataclass
class ConvertResult:
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> ConvertResult:
        assert self.returncode == 0, f"conversion failed ({self.returncode})\n{self.stdout}\n{self.stderr}"
        return self

    def verification(self) -> dict[str, float]:
        """The printed "output | max abs diff" table, as {output: diff}."""
        lines = self.stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("verification against"))
        table = {}
        for line in lines[start + 2 :]:
            match = _TABLE_LINE.match(line)
            if not match:
                break
            table[match["name"]] = float(match["diff"])
        assert table, self.stdout
        return table


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="posformers-test-conversion-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_convert(args, *, hf_home: Path, endpoint: str | None = None, timeout: float = 300) -> ConvertResult:
    """`posformers-convert *args` in a subprocess with its own (offline unless `endpoint`) Hugging Face home."""
    assert CONVERT_COMMAND.is_file(), f"{CONVERT_COMMAND} missing: install the package (make install)"
    command = [str(CONVERT_COMMAND), *map(str, args)]
    env = python_env(hf_home, endpoint=endpoint)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=hf_home.parent)
    return ConvertResult(result.returncode, result.stdout, result.stderr)


@pytest.fixture
def convert(workdir):
    def run(*args, endpoint: str | None = None) -> ConvertResult:
        return run_convert(args, hf_home=workdir / "hf-home", endpoint=endpoint)

    return run


def convert_in_process(args) -> ConvertResult:
    """`posformers-convert *args` as its `main` in this process (offline: tests/conftest.py), what it printed
    captured."""
    from posformers.conversion import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(arg) for arg in args])
    return ConvertResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def convert_here():
    def run(*args) -> ConvertResult:
        return convert_in_process(args)

    return run


def tree_digest(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder`."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def assert_no_partial_outputs(parent: Path, name: str) -> None:
    """No staging or backup directory of the output `name` is left in `parent`."""
    leftovers = [path.name for path in parent.iterdir() if path.name.startswith(f".{name}.")]
    assert not leftovers, leftovers


def check_overwrite_behaviour(convert, args: list, output: Path) -> None:
    """Converting again into `output`: refused without --overwrite (nothing touched), replaced with it.

    convert: the `convert` fixture (the console command) or `convert_here` (the same command in this process)."""
    before = tree_digest(output)
    refused = convert(*args)
    assert refused.returncode == 1
    assert "--overwrite" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert tree_digest(output) == before
    (output / "stale-file.txt").write_text("from an earlier run")
    convert(*args, "--overwrite").check()
    assert not (output / "stale-file.txt").exists()
    assert tree_digest(output).keys() == before.keys()
    assert_no_partial_outputs(output.parent, output.name)


def load_with_remote_code(model_dir: Path, auto_name: str, inputs: dict, workdir: Path) -> dict[str, torch.Tensor]:
    """Outputs of `auto_name.from_pretrained(model_dir, trust_remote_code=True)` computed in a fresh process without
    posformers; asserts that the repo's own code (not posformers) ran."""
    return load_all_with_remote_code([(model_dir, auto_name, inputs)], workdir)[0]


def load_all_with_remote_code(jobs: list[tuple[Path, str, dict]], workdir: Path) -> list[dict[str, torch.Tensor]]:
    """`load_with_remote_code` for several `(model_dir, auto_name, inputs)` in ONE fresh process (one interpreter
    start and one transformers import for all). Output directories need distinct names: transformers caches remote
    code by the directory's name."""
    remote_jobs = {
        f"remote-{i}": (auto_name, model_dir, inputs) for i, (model_dir, auto_name, inputs) in enumerate(jobs)
    }
    loaded = load_remote(remote_jobs, env=python_env(workdir / "hf-home-remote"), cwd=workdir)
    assert_no_posformers(loaded)
    for name, (_, model_dir, _) in remote_jobs.items():
        info = loaded["models"][name]
        assert info["module"].startswith("transformers_modules.") and info["training"] is False, (model_dir, info)
    return [loaded["models"][name]["outputs"] for name in remote_jobs]


def run_in_process(capsys, *args) -> tuple[int, str]:
    """`posformers-convert *args` run in this process (quicker, for refusals and options): exit status and everything
    it printed (and anything printed before it that `capsys` holds), stdout then stderr."""
    result = convert_in_process(args)
    captured = capsys.readouterr()
    return result.returncode, captured.out + result.stdout + captured.err + result.stderr


def cli_failure(capsys, *args) -> str:
    """`posformers-convert *args` run in this process refuses: exit status 1 with an `error:` line and no traceback,
    and no --output left behind where there was none. Returns everything it printed."""
    output = next((Path(value) for flag, value in itertools.pairwise(args) if flag == "--output"), None)
    existed = output is not None and output.exists()
    capsys.readouterr()  # drop what earlier steps printed
    code, printed = run_in_process(capsys, *args)
    assert code == 1 and "\nerror: " in f"\n{printed}" and "Traceback" not in printed, printed
    assert existed or output is None or not output.exists(), f"{output} written by a refused conversion\n{printed}"
    return printed
