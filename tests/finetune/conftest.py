"""Fixtures of the fine-tuning tests: the real GLUE files under tests/data, and a tiny model built from scratch."""

from pathlib import Path

import pytest
import torch
from helpers.data import DATA_DIR
from helpers.pretrain_corpus import write_corpus

from posformers.finetune.demo import DEMO_DATA

# The models here are tiny: a second intra-op thread gains nothing, and on a busy machine (CI runners, other jobs)
# its spin-waiting made a 2-second training test take minutes.
torch.set_num_threads(1)

GLUE_DIR = DATA_DIR / "glue"
# The real bert-base-uncased vocabulary shipped for the demo (finetune/demo_data/tokenizer).
TOKENIZER_DIR = DEMO_DATA / "tokenizer"

# A RoFormer small enough to train in a second on a CPU.
TINY_ROFORMER = ",".join(
    [
        "hidden_size=32",
        "num_hidden_layers=1",
        "num_attention_heads=2",
        "intermediate_size=64",
        "max_position_embeddings=128",
    ]
)


def tiny_model_args(model_type: str = "posformers-roformer", overrides: str = TINY_ROFORMER) -> list[str]:
    """Arguments that make run_glue / run_qa build a tiny model from scratch with the real uncased vocabulary."""
    return ["--model_type", model_type, "--config_overrides", overrides, "--tokenizer_name", str(TOKENIZER_DIR)]


# Quiet, quick Trainer settings shared by the test runs.
QUIET = ["--report_to", "none", "--disable_tqdm", "True", "--save_strategy", "no", "--log_level", "error"]


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    return GLUE_DIR


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """train.txt and valid.txt of real text for the pre-training tests (helpers.pretrain_corpus.write_corpus)."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))
