"""Load saved models with trust_remote_code=True in a fresh Python that cannot import posformers, as a user without
the package would, and check that what ran there was the repository's own code, giving the outputs posformers gives."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from helpers import run_python
from helpers.modeling import assert_same_outputs, tensor_outputs

# Loads each job's model with its Auto class and trust_remote_code=True, saves its tensor outputs and says what it
# loaded (class, module, mode); then tries to import posformers and lists any posformers module that got imported.
REMOTE_LOAD = """
import torch, transformers
from safetensors.torch import load_file, save_file

result = {"posformers_found": POSFORMERS_FOUND, "models": {}}
for job in ARGS["jobs"]:
    model = getattr(transformers, job["auto"]).from_pretrained(job["source"], trust_remote_code=True)
    with torch.no_grad():
        output = model(**load_file(job["inputs"]))
    save_file({k: v.contiguous() for k, v in output.items() if isinstance(v, torch.Tensor)}, job["outputs"])
    result["models"][job["name"]] = {
        "class": type(model).__name__, "module": type(model).__module__, "training": model.training,
    }
try:
    import posformers
    result["import_posformers"] = "imported"
except ModuleNotFoundError:
    result["import_posformers"] = "ModuleNotFoundError"
result["posformers_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "posformers")
print(json.dumps(result))
"""


def auto_heads(auto_map: dict[str, str]) -> dict[str, str]:
    """{Auto class: model class name} of a model folder's AUTO_MAP, AutoConfig left out."""
    return {auto_name: target.rsplit(".", 1)[1] for auto_name, target in auto_map.items() if auto_name != "AutoConfig"}


def load_remote(
    jobs: dict[str, tuple[str, str | os.PathLike, dict[str, torch.Tensor]]],
    *,
    env: dict[str, str],
    cwd: str | os.PathLike,
) -> dict:
    """Run each job `name: (auto_name, source, inputs)` as `auto_name.from_pretrained(source, trust_remote_code=True)`
    on `inputs`, all in ONE fresh process that cannot import posformers (input and output files go to `cwd`).

    Returns the child's report: {"posformers_found", "import_posformers", "posformers_modules",
    "models": {name: {"class", "module", "training", "outputs"}}}, with the outputs read back as tensors.
    """
    sources = [Path(source).name for _, source, _ in jobs.values()]
    # transformers caches remote code under the folder's (or repo's) name: two sources of one name would share it.
    assert len(set(sources)) == len(sources), f"sources need distinct names: {sources}"
    args = {"jobs": []}
    for name, (auto_name, source, inputs) in jobs.items():
        inputs_file, outputs_file = Path(cwd) / f"{name}-inputs.safetensors", Path(cwd) / f"{name}-outputs.safetensors"
        save_file({key: value.contiguous() for key, value in inputs.items()}, str(inputs_file))
        job = {"name": name, "auto": auto_name, "source": str(source)}
        args["jobs"].append({**job, "inputs": str(inputs_file), "outputs": str(outputs_file)})
    result = run_python(REMOTE_LOAD, args, env=env, cwd=cwd, without_posformers=True)
    assert sorted(result["models"]) == sorted(jobs), result
    for job in args["jobs"]:
        result["models"][job["name"]]["outputs"] = load_file(job["outputs"])
    return result


def assert_no_posformers(result: dict) -> None:
    """The child of `load_remote` could neither find nor import posformers, and nothing imported a piece of it."""
    assert result["posformers_found"] is False
    assert result["import_posformers"] == "ModuleNotFoundError"
    assert result["posformers_modules"] == []


def assert_loaded_remotely(result: dict, name: str, class_name: str, expected: dict, tolerance: float = 1e-6) -> None:
    """Job `name` of `load_remote` ran the repository's code (not posformers) as `class_name` in eval mode, and its
    outputs match `expected` within `tolerance`."""
    loaded = result["models"][name]
    assert loaded["module"].startswith("transformers_modules."), loaded  # the repo's code, not posformers
    assert loaded["class"] == class_name, loaded
    assert loaded["training"] is False, loaded
    assert_same_outputs(loaded["outputs"], expected, tolerance)


def check_remote_load(
    models: dict[str, tuple[str, str | os.PathLike, torch.nn.Module, dict[str, torch.Tensor]]],
    *,
    env: dict[str, str],
    cwd: str | os.PathLike,
) -> dict:
    """`load_remote` of each `name: (auto_name, source, model, inputs)`, then what every such test checks: the child
    could not import posformers, and each source loaded as `model`'s class from the repository's code and gave
    `model`'s outputs on `inputs`. Returns the child's report."""
    jobs = {name: (auto_name, source, inputs) for name, (auto_name, source, _, inputs) in models.items()}
    result = load_remote(jobs, env=env, cwd=cwd)
    assert_no_posformers(result)
    for name, (_, _, model, inputs) in models.items():
        assert_loaded_remotely(result, name, type(model).__name__, tensor_outputs(model, inputs))
    return result
