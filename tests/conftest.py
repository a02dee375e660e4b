"""Shared pytest setup: no test reaches the real Hugging Face Hub, and a local Hub for those that need one."""

import logging
import os

import pytest
from helpers.hub_server import HubServer  # standard library only: imports nothing of huggingface_hub

# Set before anything imports huggingface_hub (it reads these once): a test that tries to download fails at once
# instead of hanging on the network. Child processes talking to the local Hub get their own environment
# (helpers.python_env).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

_POSFORMERS_LOG_LEVEL = logging.getLogger("posformers").level

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test`: one pytest process per core, so one thread each
    import torch

    torch.set_num_threads(1)


# The files that take longest under `make test`, longest first. pytest-xdist (`--dist loadfile
# --no-loadscope-reorder`) hands whole files to its workers in collection order; a long file handed out last keeps one
# worker busy after the other has finished. Starting these first lets the many short files fill in around them. The
# order only changes when a file runs, never what it runs; a file not listed keeps its place after these.
LONGEST_FIRST = (
    "tests/integrations/test_onnx.py",
    "tests/finetune/test_torchrun.py",
    "tests/test_benchmarks_clients.py",
    "tests/integrations/test_dropin_clients.py",
    "tests/finetune/test_kill_resume.py",
    "tests/finetune/test_qa.py",
    "tests/finetune/test_littlebird_recipe.py",
    "tests/conversion/test_roformer_conversion.py",
    "tests/conversion/test_deberta_conversion.py",
    "tests/models/test_long_inputs.py",
    "tests/models/test_contracts.py",
    "tests/models/test_half_precision_training.py",
    "tests/test_packaging.py",
    "tests/integrations/test_onnx_deploy.py",
    "tests/integrations/test_dropin.py",
    "tests/integrations/test_dropin_gliner2.py",
    "tests/integrations/test_dropin_gliner_bertscore.py",
    "tests/integrations/test_dropin_pickle.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(config.rootpath).as_posix(), len(rank)))


@pytest.fixture(scope="session")
def hub_server():
    """A local Hub-compatible server (helpers/hub_server.py) on 127.0.0.1; its files go with it at the end."""
    with HubServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _restore_transformers_verbosity():
    """Scripts run in-process (`main([...])`) set transformers' and posformers' log levels from their arguments and
    keep them (finetune/reporting.py setup_logging): restore both after each test, so a later test that captures a
    logged warning does not depend on which tests ran before."""
    import logging as std_logging

    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    yield
    logging.set_verbosity(verbosity)
    # Back to the level it had when the session began (a module-scoped fixture that runs a script sets it before
    # any per-test fixture could record it).
    std_logging.getLogger("posformers").setLevel(_POSFORMERS_LOG_LEVEL)


@pytest.fixture(autouse=True, scope="module")
def _fresh_compiler_per_module():
    """Each test module starts with torch.compile's caches empty, as when it runs alone. Compiled functions are global
    (transformers' flex_attention singleton, and the torch.compile(backend="eager") that uncompiled flex_attention
    runs in): after earlier modules called them with other shapes, dynamo marks the sizes dynamic, and on CPU torch
    2.13 then fails (inductor's CPU flex template does not build with dynamic shapes; the eager flex wrapper loses an
    unbacked symbol). Within a module compiled kernels are still shared."""
    import torch

    torch.compiler.reset()
    yield
