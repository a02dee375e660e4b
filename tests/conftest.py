"""Shared pytest setup: no test reaches the real Hugging Face Hub, and a local Hub for those that need one."""

import os

import pytest
from helpers.hub_server import HubServer  # standard library only: imports nothing of huggingface_hub

# Set before anything imports huggingface_hub (it reads these once): a test that tries to download fails at once
# instead of hanging on the network. Child processes talking to the local Hub get their own environment
# (helpers.python_env).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="session")
def hub_server():
    """A local Hub-compatible server (helpers/hub_server.py) on 127.0.0.1; its files go with it at the end."""
    with HubServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _restore_transformers_verbosity():
    """Scripts run in-process (`main([...])`) set transformers' log level from their arguments and keep it: restore it
    after each test, so a later test that captures a logged warning does not depend on which tests ran before."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    yield
    logging.set_verbosity(verbosity)
