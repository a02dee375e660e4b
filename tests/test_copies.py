"""The pieces the three model folders repeat on purpose stay identical: every `# Copied from` marker is checked.

The model folders stand alone (`save_pretrained` copies them to the Hub as remote code), so they repeat the same
skeleton. A repeated piece carries, on the line above its `def` / `class`, a marker in the syntax of transformers'
utils/check_copies.py:

    # Copied from posformers.modeling_roformer.RoFormerForQuestionAnswering with RoFormer->Deberta all-casing

The named source (a module-level function or class, or a method as `Class.method`) with the renames applied must equal
the code under the marker. Renames are comma-separated `old->new` replacements of plain text; `all-casing` also
applies the lower- and upper-case forms of a rename. A trailing `# noqa: ...` on the marker is ignored.
"""

import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers.dynamic_module_utils import get_imports, get_relative_import_files

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
MARKER = re.compile(
    r"^(?P<indent>\s*)# Copied from posformers\.(?P<source>[\w.]+)(?: with (?P<renames>.*?))?\s*(?:# noqa.*)?$"
)
RENAME = re.compile(r"^\s*(\S+)->(\S+)(\s+all-casing)?\s*$")


@dataclass
class Copy:
    path: Path
    line: int  # 1-based line of the marker
    indent: str
    source: str  # "modeling_roformer.RoFormerSelfOutput.forward"
    renames: str | None

    def __str__(self) -> str:
        return f"{self.path.relative_to(MODELS_DIR.parent)}:{self.line} (copy of posformers.{self.source})"


def block_at(lines: list[str], start: int) -> str:
    """The definition starting at lines[start]: its decorators, its `def` / `class` line and every following line that
    is blank or indented deeper, trailing blank lines dropped."""
    header = start
    while lines[header].lstrip().startswith("@"):
        header += 1
    indent = len(lines[header]) - len(lines[header].lstrip())
    end = signature_end(lines, header)
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    while not lines[end - 1].strip():
        end -= 1
    return "\n".join(lines[start:end])


def signature_end(lines: list[str], header: int) -> int:
    """The index of the line after the `def` / `class` statement at lines[header], which may span several lines: its
    brackets must close (a multi-line signature ends in `) -> ...:` at the `def`'s own indent)."""
    depth, end = 0, header
    while True:
        code = lines[end].split("#", 1)[0]
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        end += 1
        if depth <= 0 or end == len(lines):
            return end


def find_definition(text: str, qualified_name: str) -> str:
    """The source of `qualified_name` ("f", "Class" or "Class.method") in a module's text, with its decorators."""
    lines, indent = text.split("\n"), ""
    for name in qualified_name.split("."):
        pattern = re.compile(rf"^{indent}(?:class|def) {re.escape(name)}\b")
        found = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
        if found is None:
            raise LookupError(f"no definition of {qualified_name!r} (looking for {name!r})")
        while found > 0 and lines[found - 1].startswith(indent + "@"):
            found -= 1
        lines, indent = block_at(lines, found).split("\n"), indent + "    "
    return "\n".join(lines)


def apply_renames(code: str, renames: str | None) -> str:
    for rename in (renames or "").split(","):
        if not rename.strip():
            continue
        match = RENAME.match(rename)
        if match is None:
            raise ValueError(f"cannot read the rename {rename!r} (expected old->new [all-casing])")
        old, new, all_casing = match.groups()
        code = code.replace(old, new)
        if all_casing:
            code = code.replace(old.lower(), new.lower()).replace(old.upper(), new.upper())
    return code


def find_copies(path: Path, text: str | None = None) -> list[Copy]:
    text = path.read_text() if text is None else text
    copies = []
    for number, line in enumerate(text.split("\n"), start=1):
        match = MARKER.match(line)
        if match:
            copies.append(Copy(path, number, match["indent"], match["source"], match["renames"]))
        elif "Copied from" in line:
            raise ValueError(f"{path}:{number}: unreadable copy marker: {line.strip()!r}")
    return copies


def source_text(module: str) -> str:
    """The text of `posformers.<module>` ("modeling_roformer") from the models folder."""
    return (MODELS_DIR / f"{module}.py").read_text()


def check_copy(copy: Copy, copy_text: str) -> str | None:
    """None if the copy under the marker equals its source after the renames, else a description of the drift."""
    module, qualified = copy.source.split(".", 1)
    source = find_definition(source_text(module), qualified)
    source_indent = len(source) - len(source.lstrip())
    expected = "\n".join(copy.indent + line[source_indent:] if line.strip() else line for line in source.split("\n"))
    expected = apply_renames(expected, copy.renames)
    actual = block_at(copy_text.split("\n"), copy.line)  # 0-based index of the line under the marker
    if actual == expected:
        return None
    diff = difflib.unified_diff(expected.split("\n"), actual.split("\n"), "expected (source + renames)", "copy", n=1)
    return f"{copy} has drifted:\n" + "\n".join(diff)


def all_copies() -> list[Copy]:
    return [copy for path in sorted(MODELS_DIR.glob("*.py")) for copy in find_copies(path)]


COPIES = all_copies()


@pytest.mark.parametrize("copy", COPIES, ids=str)
def test_marked_copy_equals_its_source(copy):
    assert check_copy(copy, copy.path.read_text()) is None, check_copy(copy, copy.path.read_text())


REMOTE_CODE_FILES = sorted(MODELS_DIR.glob("modeling_*.py")) + sorted(MODELS_DIR.glob("configuration_*.py"))


@pytest.mark.parametrize("path", REMOTE_CODE_FILES, ids=lambda p: p.name)
def test_remote_code_closure_imports_only_the_standard_library_torch_and_transformers(path):
    """What save_pretrained copies beside the weights (a file and the closure of its single-dot relative imports, as
    transformers' custom_object_save collects it) imports nothing a remote-code user may lack."""
    closure = [path, *map(Path, get_relative_import_files(str(path)))]
    assert all(p.parent == MODELS_DIR for p in closure), closure
    outside = {
        (p.name, name)
        for p in closure
        for name in get_imports(str(p))
        if name not in sys.stdlib_module_names and name not in ("torch", "transformers")
    }
    assert not outside, f"{path.name}'s remote-code closure imports {sorted(outside)}"


def test_the_closure_check_sees_a_foreign_import(tmp_path):
    (tmp_path / "modeling_x.py").write_text("from .shared import f\n")
    (tmp_path / "shared.py").write_text("import numpy\nimport torch\n")
    closure = get_relative_import_files(str(tmp_path / "modeling_x.py"))
    assert [Path(p).name for p in closure] == ["shared.py"] and "numpy" in get_imports(closure[0])


SOURCE = """class AlphaHead:
    def set_output_embeddings(self, new_embeddings):
        self.alpha.decoder = new_embeddings
        if new_embeddings.bias is not None:
            self.alpha.bias = new_embeddings.bias
"""


@pytest.fixture
def renamed_copy(tmp_path, monkeypatch) -> Copy:
    """A models folder holding `modeling_a.AlphaHead` and, in modeling_b.py, its marked copy renamed to Beta: the
    checker's own tests do not depend on the copies the package holds (ideally none)."""
    monkeypatch.setattr(sys.modules[__name__], "MODELS_DIR", tmp_path)
    (tmp_path / "modeling_a.py").write_text(SOURCE)
    copy = "# Copied from posformers.modeling_a.AlphaHead with Alpha->Beta all-casing\n"
    copy += apply_renames(SOURCE, "Alpha->Beta all-casing")
    (tmp_path / "modeling_b.py").write_text(copy)
    (found,) = find_copies(tmp_path / "modeling_b.py")
    return found


def test_a_drifted_copy_fails_the_check(renamed_copy):
    """Editing one copy (here in a temporary text) is caught, with the edited line in the report."""
    text = renamed_copy.path.read_text()
    assert check_copy(renamed_copy, text) is None
    drifted = text.replace("        if new_embeddings.bias is not None:\n", "", 1)
    assert drifted != text
    report = check_copy(renamed_copy, drifted)
    assert report is not None and "-        if new_embeddings.bias is not None:" in report


def test_a_rename_is_part_of_the_check(renamed_copy):
    """A copy whose renames are dropped or wrong no longer matches its source."""
    text = renamed_copy.path.read_text()
    assert check_copy(renamed_copy, text) is None
    without_renames = Copy(renamed_copy.path, renamed_copy.line, renamed_copy.indent, renamed_copy.source, None)
    assert check_copy(without_renames, text) is not None
    assert apply_renames("RoFormer roformer ROFORMER", "RoFormer->Deberta all-casing") == "Deberta deberta DEBERTA"
    assert apply_renames("RoFormer roformer", "RoFormer->Deberta") == "Deberta roformer"


def test_a_marker_naming_a_missing_source_fails(renamed_copy):
    ghost = Copy(renamed_copy.path, renamed_copy.line, renamed_copy.indent, "modeling_a.NoSuchPiece", None)
    with pytest.raises(LookupError, match="NoSuchPiece"):
        check_copy(ghost, renamed_copy.path.read_text())


def test_a_multi_line_signature_keeps_its_body_in_the_check():
    """A method whose signature spans lines (ending in `) -> ...:` at the def's indent) is compared body and all."""
    lines = [
        "class A:",
        "    def forward(",
        "        self,",
        "        x,",
        "    ) -> int:",
        "        return x + 1",
        "",
        "    def other(self):",
        "        pass",
    ]
    assert block_at(lines, 1).split("\n")[-1] == "        return x + 1"
    assert block_at(["def f(a=(1, 2), b={'k': [3]}):", "    return a", "", "g = 1"], 0).endswith("return a")
