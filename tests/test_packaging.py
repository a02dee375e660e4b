"""How posformers installs: `pip install posformers` is the models only, the wheel and sdist build and pass
`twine check`, and a script started without its extra says in one line which extra to install."""

from __future__ import annotations

import json
import re
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from posformers._extras import TRAIN_MODULES

ROOT = Path(__file__).resolve().parents[1]
CORE = {"torch", "transformers", "safetensors", "huggingface-hub"}
# What only the extras may bring: the train extra's modules and the other features' heavy packages.
EXTRA_MODULES = (*TRAIN_MODULES, "peft", "sentence_transformers", "onnx", "onnxruntime", "tensorflow", "matplotlib")


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)


def test_importing_posformers_imports_no_extra():
    # transformers.modeling_utils itself imports accelerate when it is installed; that posformers also imports
    # without accelerate is what the wheel test below shows
    code = (
        "import sys, transformers.modeling_utils; before = set(sys.modules); import posformers; "
        f"print(sorted(m for m in {EXTRA_MODULES!r} if m in sys.modules and m not in before))"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel `python -m build` makes of this checkout (the wheel is built from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    result = run(sys.executable, "-m", "build", "--outdir", str(out), str(ROOT))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def wheel(dist: Path) -> Path:
    (found,) = dist.glob("posformers-*.whl")
    return found


@pytest.mark.slow
def test_build_makes_a_wheel_and_sdist_that_twine_accepts(dist):
    assert len(list(dist.glob("posformers-*.tar.gz"))) == 1
    result = run(sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir()))
    assert result.returncode == 0, result.stdout + result.stderr


def requirement_names(requires: list[str], extra: str | None) -> set[str]:
    marker = None if extra is None else f'extra == "{extra}"'
    names = set()
    for line in requires:
        requirement, _, condition = line.partition(";")
        if (condition.strip() or None) == marker:
            names.add(re.match(r"[A-Za-z0-9._-]+", requirement).group().lower())
    return names


@pytest.mark.slow
def test_wheel_requires_the_models_only_and_train_has_what_the_scripts_check(dist):
    with zipfile.ZipFile(wheel(dist)) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(name).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert requirement_names(requires, None) == CORE
    assert set(TRAIN_MODULES) <= requirement_names(requires, "train")


def venv_without_extras(path: Path, train: bool = False) -> Path:
    """A fresh venv that sees this environment's packages except posformers and (unless `train`) the train extra's,
    so installing the wheel there needs no download (pip runs with --no-index: a requirement that is missing fails
    it)."""
    run(sys.executable, "-m", "venv", "--without-pip", str(path)).check_returncode()
    visible = path / "visible-packages"
    visible.mkdir()
    hidden = {"posformers"} | (set() if train else {name.replace("_", "-") for name in TRAIN_MODULES})
    for source in site.getsitepackages():
        for entry in Path(source).iterdir():
            top = re.split(r"[-.]", entry.name.lstrip("_").removeprefix("editable_"), maxsplit=1)[0].lower()
            if top.replace("_", "-") in hidden or "posformers" in entry.name or entry.suffix == ".pth":
                continue
            if not (visible / entry.name).exists():
                (visible / entry.name).symlink_to(entry)
    (site_packages,) = path.glob("lib/python*/site-packages")
    (site_packages / "visible-packages.pth").write_text(f"{visible}\n")
    return path / "bin"


@pytest.mark.slow
def test_wheel_installs_with_its_core_dependencies_and_a_script_names_its_missing_extra(dist, tmp_path):
    bin_dir = venv_without_extras(tmp_path / "venv")
    python = str(bin_dir / "python")
    result = run(sys.executable, "-m", "pip", "--python", python, "install", "--no-index", str(wheel(dist)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    code = (
        "import importlib.util, posformers; "
        f"print(posformers.__file__, [m for m in {TRAIN_MODULES!r} if importlib.util.find_spec(m)])"
    )
    imported = run(python, "-c", code)
    assert imported.returncode == 0, imported.stderr
    location, present = imported.stdout.split(maxsplit=1)
    assert location.startswith(str(tmp_path)) and present.strip() == "[]"  # the wheel's posformers, no train extra

    # the converter is part of the core install; the fine-tuning scripts are the train extra's, which their --help
    # does not need
    converter = run(str(bin_dir / "posformers-convert"), "roformer", "--help")
    assert converter.returncode == 0, converter.stderr
    assert run(str(bin_dir / "posformers-glue"), "--help").stdout.startswith("usage: posformers-glue")
    script = run(str(bin_dir / "posformers-glue"), "--task_name", "sst2")
    assert script.returncode == 1
    assert script.stderr.strip().splitlines() == [
        "posformers.finetune needs the train extra (datasets, evaluate, accelerate not installed): "
        "pip install -e '.[train]' in a clone, or pip install 'posformers[train]' once released"
    ]


@pytest.mark.slow
def test_wheel_with_the_train_extra_fine_tunes_on_the_repositorys_sst2_files(dist, tmp_path):
    bin_dir = venv_without_extras(tmp_path / "venv", train=True)
    python = str(bin_dir / "python")
    result = run(sys.executable, "-m", "pip", "--python", python, "install", "--no-index", f"{wheel(dist)}[train]")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sst2 = ROOT / "tests" / "data" / "glue" / "sst2"
    glue = run(
        str(bin_dir / "posformers-glue"),
        *("--model_type", "posformers-roformer", "--tokenizer_name", str(ROOT / "finetune/demo_data/tokenizer")),
        *("--config_overrides", "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64"),
        *("--task_name", "sst2", "--train_file", str(sst2 / "train.tsv"), "--validation_file", str(sst2 / "dev.tsv")),
        *("--max_train_samples", "64", "--max_eval_samples", "32", "--max_steps", "4", "--do_train", "--do_eval"),
        *("--per_device_train_batch_size", "8", "--report_to", "none", "--output_dir", str(tmp_path / "out")),
        cwd=tmp_path,  # not the clone: the wheel's posformers runs
    )
    assert glue.returncode == 0, glue.stdout[-3000:] + glue.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert 0.0 <= results["eval_accuracy"] <= 1.0
    assert str(tmp_path) in run(python, "-c", "import posformers; print(posformers.__file__)", cwd=tmp_path).stdout
