"""pyproject.toml's extras as the code sees them: which modules a feature needs, and the one line that says how to
install them."""

from __future__ import annotations

import importlib.util

# What the fine-tuning scripts import beyond posformers' own dependencies (the `train` extra; numpy comes with
# transformers).
TRAIN_MODULES = ("datasets", "evaluate", "accelerate")


def install_hint(extra: str) -> str:
    """How to install `extra`: from a clone today, by name once posformers is on PyPI."""
    return f"pip install -e '.[{extra}]' in a clone, or pip install 'posformers[{extra}]' once released"


def missing(modules: tuple[str, ...]) -> list[str]:
    """Those of `modules` that are not installed (found without importing them)."""
    return [name for name in modules if importlib.util.find_spec(name) is None]
