"""Helpers shared by the conversion tests: run `posformers-convert` as a user would, read what it printed, load its
output in a fresh process with trust_remote_code, and check the --overwrite behaviour.

Fixtures:
    workdir        a temporary directory for one test
    convert        run the console command in a subprocess (offline, own HF_HOME): convert(*args) -> result
    convert_here   the same command run in this process (quicker; for refusals and repeat runs): same result type
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import python_env, run_python
from helpers.data import DATA_DIR
from safetensors.torch import load_file, save_file

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


@pytest.fixture
def convert_here(capsys):
    def run(*args) -> ConvertResult:
        from posformers.conversion import cli

        capsys.readouterr()  # drop what earlier steps printed
        code = cli.main([str(arg) for arg in args])
        captured = capsys.readouterr()
        return ConvertResult(code, captured.out, captured.err)

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


# Loads each output with its Auto class and trust_remote_code=True where posformers cannot be imported.
_CHILD_LOAD = """
import torch, transformers
from safetensors.torch import load_file, save_file

loaded = []
for job in ARGS["jobs"]:
    model = getattr(transformers, job["auto"]).from_pretrained(job["model"], trust_remote_code=True).eval()
    with torch.no_grad():
        output = model(**load_file(job["inputs"]))
    tensors = {k: v.contiguous() for k, v in output.items() if isinstance(v, torch.Tensor)}
    save_file(tensors, job["outputs"])
    loaded.append({"module": type(model).__module__, "class": type(model).__name__})
print(json.dumps(loaded))
"""


def load_with_remote_code(model_dir: Path, auto_name: str, inputs: dict, workdir: Path) -> dict[str, torch.Tensor]:
    """Outputs of `auto_name.from_pretrained(model_dir, trust_remote_code=True)` computed in a fresh process without
    posformers; asserts that the repo's own code (not posformers) ran."""
    return load_all_with_remote_code([(model_dir, auto_name, inputs)], workdir)[0]


def load_all_with_remote_code(jobs: list[tuple[Path, str, dict]], workdir: Path) -> list[dict[str, torch.Tensor]]:
    """`load_with_remote_code` for several `(model_dir, auto_name, inputs)` in ONE fresh process (one interpreter
    start and one transformers import for all). Output directories need distinct names: transformers caches remote
    code by the directory's name."""
    names = [Path(model_dir).name for model_dir, _, _ in jobs]
    assert len(set(names)) == len(names), f"output directories need distinct names: {names}"
    args = {"jobs": []}
    for i, (model_dir, auto_name, inputs) in enumerate(jobs):
        inputs_file = workdir / f"remote-{i}-inputs.safetensors"
        save_file({key: value.contiguous() for key, value in inputs.items()}, str(inputs_file))
        outputs_file = workdir / f"remote-{i}-outputs.safetensors"
        args["jobs"].append(
            {"auto": auto_name, "model": str(model_dir), "inputs": str(inputs_file), "outputs": str(outputs_file)}
        )
    loaded = run_python(
        _CHILD_LOAD, args, env=python_env(workdir / "hf-home-remote"), cwd=workdir, without_posformers=True
    )
    assert len(loaded) == len(jobs), loaded
    for (model_dir, _, _), info in zip(jobs, loaded, strict=True):
        assert info["module"].startswith("transformers_modules."), (model_dir, info)
    return [load_file(job["outputs"]) for job in args["jobs"]]


def run_in_process(capsys, *args) -> tuple[int, str]:
    """`posformers-convert *args` run in this process (quicker, for refusals and options): exit status and everything
    it printed, stdout then stderr."""
    from posformers.conversion import cli

    code = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err
