"""Real text for the pre-training tests: SQuAD v1.1 dev contexts and SST-2 sentences from tests/data."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from helpers.data import DATA_DIR

SQUAD_DEV = DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json"
SST2_TRAIN = DATA_DIR / "glue" / "sst2" / "train.tsv"


def squad_contexts() -> list[str]:
    """The distinct paragraphs of SQuAD v1.1 dev, in file order."""
    data = json.loads(SQUAD_DEV.read_text(encoding="utf-8"))["data"]
    seen: dict[str, None] = {}
    for article in data:
        for paragraph in article["paragraphs"]:
            seen.setdefault(" ".join(paragraph["context"].split()), None)
    return list(seen)


def sst2_sentences(split: str = "train") -> list[str]:
    """The sentences of SST-2's `split` (train or dev), in file order."""
    with (SST2_TRAIN.parent / f"{split}.tsv").open(encoding="utf-8") as file:
        rows = csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"].strip() for row in rows if row["sentence"].strip()]


def write_corpus(folder: Path, train_contexts: int = 150, train_sentences: int = 1500, held_out: int = 20) -> dict:
    """train.txt and valid.txt (one document per line) from disjoint SQuAD contexts and SST-2 sentences."""
    contexts, sentences = squad_contexts(), sst2_sentences()
    train = contexts[:train_contexts] + sentences[:train_sentences]
    valid = (
        contexts[train_contexts : train_contexts + held_out]
        + sentences[train_sentences : train_sentences + 10 * held_out]
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"train": folder / "train.txt", "validation": folder / "valid.txt"}
    paths["train"].write_text("\n".join(train) + "\n", encoding="utf-8")
    paths["validation"].write_text("\n".join(valid) + "\n", encoding="utf-8")
    return paths


# Tiny models of each family (hidden 32, 1-2 layers) that train in seconds on a CPU.
TINY = {
    "posformers-roformer": "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,"
    "max_position_embeddings=64",
    "posformers-deberta": "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,"
    "max_position_embeddings=64,position_buckets=16",
    "littlebird": "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,block_size=8,"
    "pack_length=8",
}


def eval_history(output_dir: Path, key: str) -> list[float]:
    """The values of `key` at every evaluation logged in output_dir/trainer_state.json, in order."""
    state = json.loads((Path(output_dir) / "trainer_state.json").read_text(encoding="utf-8"))
    return [entry[key] for entry in state["log_history"] if key in entry]
