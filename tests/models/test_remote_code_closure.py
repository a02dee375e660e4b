"""What `save_pretrained` copies beside the weights for `trust_remote_code` users imports nothing they may lack.

transformers' `custom_object_save` copies a model's modeling and configuration files together with the closure of their
single-dot relative imports (`from .packing import PackedBatch`), and `trust_remote_code` loads that closure the same
way: every file in it must sit in the models folder and import only the standard library, torch and transformers.
"""

import sys
from pathlib import Path

import pytest
from transformers.dynamic_module_utils import get_imports, get_relative_import_files

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
REMOTE_CODE_FILES = sorted(MODELS_DIR.glob("modeling_*.py")) + sorted(MODELS_DIR.glob("configuration_*.py"))


def foreign_imports(path: Path) -> set[tuple[str, str]]:
    """(file, module) of every import in `path`'s remote-code closure that is neither the standard library, torch nor
    transformers."""
    closure = [path, *map(Path, get_relative_import_files(str(path)))]
    return {
        (p.name, name)
        for p in closure
        for name in get_imports(str(p))
        if name not in sys.stdlib_module_names and name not in ("torch", "transformers")
    }


@pytest.mark.parametrize("path", REMOTE_CODE_FILES, ids=lambda p: p.name)
def test_remote_code_closure_imports_only_the_standard_library_torch_and_transformers(path):
    closure = [path, *map(Path, get_relative_import_files(str(path)))]
    assert all(p.parent == MODELS_DIR for p in closure), closure
    outside = foreign_imports(path)
    assert not outside, f"{path.name}'s remote-code closure imports {sorted(outside)}"


def test_the_closure_check_sees_a_foreign_import(tmp_path):
    (tmp_path / "modeling_x.py").write_text("from .shared import f\n")
    (tmp_path / "shared.py").write_text("import numpy\nimport torch\n")
    assert foreign_imports(tmp_path / "modeling_x.py") == {("shared.py", "numpy")}
