"""Shared test helpers: a fresh Python process, with or without posformers, and a local Hub (`hub_server`).

Tiny configs, padded batches and output comparisons for model tests are in `helpers.modeling`; loading saved models
with trust_remote_code in a process without posformers, and checking what ran there, in `helpers.remote`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Run first in a process that must not see posformers. The venv has posformers installed in editable mode: a finder
# that setuptools puts on sys.meta_path from a .pth file, which `python -I` still runs. Drop that finder and any
# sys.path entry inside the repository, record whether posformers could still be found, then block it for good so
# that remote code importing it would fail loudly.
_NO_POSFORMERS = textwrap.dedent(
    f"""
    import importlib.abc, importlib.util, os, sys

    def _in_repo(path, repo={str(REPO_ROOT)!r}, env=os.path.realpath(sys.prefix)):
        path = os.path.realpath(path)
        inside = lambda root: path == root or path.startswith(root + os.sep)  # noqa: E731
        return inside(repo) and not inside(env)  # the venv may live in the repo: keep its site-packages


    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
    sys.path[:] = [p for p in sys.path if p and not _in_repo(p)]
    POSFORMERS_FOUND = importlib.util.find_spec("posformers") is not None


    class _BlockPosformers(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "posformers" or name.startswith("posformers."):
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
            return None


    sys.meta_path.insert(0, _BlockPosformers())
    """
)

# Environment variables that would make a child process read a user's cache, token or Hub.
_DROPPED_ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "PYTHON")


def python_env(hf_home: str | os.PathLike, *, endpoint: str | None = None, **extra: str) -> dict[str, str]:
    """Environment for a child Python: its own HF_HOME; offline, or talking to the Hub at `endpoint` (dummy token)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(_DROPPED_ENV_PREFIXES)}
    env.update(
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
    )
    if endpoint is None:
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env.update(HF_ENDPOINT=endpoint, HF_TOKEN="hf_dummy_test_token")
    env.update(extra)
    return env


def run_python(
    code: str,
    args=None,
    *,
    env: dict[str, str],
    cwd: str | os.PathLike,
    without_posformers: bool = False,
    timeout: float = 300,
):
    """Run `code` in a fresh `python -I` (isolated: no PYTHONPATH, no user site, no cwd on sys.path) and return what
    it printed last as JSON (`print(json.dumps(...))`). `args` reaches it as `ARGS`, JSON-decoded. Raises
    AssertionError with the child's output if it fails.

    without_posformers: posformers cannot be imported; `POSFORMERS_FOUND` tells whether anything could find it.
    """
    preamble = "import json, sys\nARGS = json.loads(sys.argv[1])\n"
    if without_posformers:
        preamble = _NO_POSFORMERS + preamble
    command = [sys.executable, "-I", "-c", preamble + textwrap.dedent(code), json.dumps(args)]
    # stdin closed: a question on stdin (transformers' trust_remote_code prompt) fails at once instead of waiting
    result = subprocess.run(
        command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise AssertionError(
            f"child Python failed with exit code {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-5000:]}\n--- stderr ---\n{result.stderr[-10000:]}"
        )
    lines = result.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None
