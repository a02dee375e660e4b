"""Where the tests' real data lives: tests/data/ inside the repository (tests/data/PROVENANCE.md names each source)."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
