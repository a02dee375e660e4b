"""Client libraries on posformers' drop-in: time per item of each library's own API as shipped (transformers' models)
and with posformers (`posformers.enabled()` around the load, or `posformers.optimize(model)`), side by side.

    python -m benchmarks.run --suite clients [--quick] [--threads N] [--repeats N] [--output PATH]

Writes benchmarks/results/clients.json, clients.md (the table) and clients.png (the plot; needs matplotlib).

Models: random weights, saved to a temporary folder with the demo tokenizer (finetune/demo_data/tokenizer,
bert-base-uncased's WordPiece vocabulary): DeBERTa-v3-base (benchmarks/deberta.py's V3_BASE, transformers'
DebertaV2Config) and RoFormer base (benchmarks/roformer.py's BASE), both with that 30,522-token vocabulary and their
released dropout 0.1. Every variant of a cell loads the same folder, so it runs the same weights; nothing is
downloaded.

Clients (each one's API as a user calls it):
- transformers pipelines: text-classification (SST-2 dev sentences, `top_k=None`), zero-shot-classification (SQuAD
  v1.1 dev passages against 4 topic labels: 4 premise/hypothesis pairs a passage; the config's label2id has
  `entailment`), feature-extraction (SST-2, `return_tensors=True`);
- a Trainer-style training step: AutoModelForSequenceClassification, the batch tokenized and padded to its longest,
  forward with labels, backward, AdamW step (batch 32 SST-2 sentences);
- sentence-transformers: SentenceTransformer.encode (SST-2; mean pooling over the backbone),
  CrossEncoder.predict (MRPC dev pairs, one label) and one CrossEncoder fit step (its BinaryCrossEntropyLoss, what
  CrossEncoderTrainer and `fit` compute, backward, AdamW step; batch 32 pairs);
- GLiNER2 (DeBERTa-v3 only: its released encoders): batch_extract_entities (SQuAD passages, 4 entity types,
  threshold 0.5) and one training step of its own loss (ExtractorCollator + the model's `total_loss`, backward, AdamW
  step; 8 passages whose SQuAD answers are the entities, batch 8). GLiNER2 also runs with its own speed switch,
  `enable_disentangled_flash(backend="torch")` (the `disentangled-flash` package; when it is not installed, one line
  says so and that column is left out);
- GLiNER 0.2.29 (DeBERTa-v3 only): `batch_predict_entities` (SQuAD passages, 4 entity types, threshold 0.5), its
  span model built from its config over the "base" encoder folder (seeded heads, saved once: every variant loads the
  same weights). It builds `DebertaV2Model` by name, which `posformers.enable()` does not reach;
- BERTScore 0.3.13: `BERTScorer(model_type=folder, num_layers=k).score` on MRPC dev pairs, k = 3/4 of the layers (9 of
  12, as BERTScore's own table picks for deberta-base): it loads the encoder through `AutoModel` and keeps its first k
  layers.

Variants: "as shipped" (the client as installed), "posformers" (`posformers.enabled()` around the client's load, or
for GLiNER2 and GLiNER `posformers.optimize(model)` on the model built as shipped: each library's documented line),
"disentangled-flash" (GLiNER2 only).

Measure: inference cells run the client's call over the cell's items at batch 32 and, over the first 16 of them, at
batch 1 (the client's own `batch_size`); one untimed pass per variant first (it also gives the outputs compared
between variants), then `repeats` timed passes, the variants alternating pass by pass. ms per item = the median pass /
items. A training cell times `repeats` steps per variant (after one untimed step), on different batches, the same ones
for every variant; ms per item = the median step / batch size. Each round waits (up to 5 s) until other processes use
at most `max_foreign_cpu`% of the CPU, and the share they used during the timed passes is reported ("other CPU %").

Ratios: posformers / as shipped, and for GLiNER2 posformers / disentangled-flash. Targets: inference at batch 32
<= 0.7x, at batch 1 <= 1.0x, a training step <= 0.8x; GLiNER2 with posformers <= 0.8x GLiNER2 with
disentangled-flash. Outputs are compared on the untimed pass: the largest |difference| of the client's numbers
(scores, embeddings, per-token features at real tokens, span confidences); training cells compare the loss of the
first batch in eval mode, before any step (|difference| / max(1, |loss|)).
"""

from __future__ import annotations

import contextlib
import csv
import gc
import json
import os
import random
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import posformers

from . import deberta, roformer
from .harness import (
    REPO_ROOT,
    RESULTS_DIR,
    ForeignCpuMeter,
    _log,
    environment,
    flash_available,
    flash_missing,
    run_and_write,
)

DATA_DIR = REPO_ROOT / "tests" / "data"
TOKENIZER = REPO_ROOT / "finetune" / "demo_data" / "tokenizer"
SEED = 0
SHIPPED, POSFORMERS, FLASH = "as shipped", "posformers", "disentangled-flash"
VARIANTS = (SHIPPED, POSFORMERS, FLASH)
INFERENCE_BATCHES = (32, 1)
# Largest posformers / reference ratio of time per item: (mode, batch) -> limit; GLiNER2 against disentangled-flash.
TIME_TARGETS = {("inference", 32): 0.7, ("inference", 1): 1.0, ("train", None): 0.8}
FLASH_TARGET = 0.8
# Largest |difference| of a client's outputs between variants called equal (float32, 12 layers, random weights).
EQUIVALENCE_TOLERANCE = 1e-4
DIFFERENT = "different spans"
VOCAB_SIZE = 30522  # the demo tokenizer's
SIZES = {
    "deberta": dict(deberta.V3_BASE, vocab_size=VOCAB_SIZE),
    "roformer": dict(roformer.BASE, vocab_size=VOCAB_SIZE, max_position_embeddings=512),
}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
ZERO_SHOT_LABELS = ["sports", "history", "city", "technology"]
ENTITY_TYPES = ["person", "organization", "location", "date"]
NLI_LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}


@dataclass(frozen=True)
class Options:
    quick: bool = False  # tiny models, a few items, one timed pass: checks that every cell runs
    threads: int | None = None  # torch threads (default: every core; quick: 1)
    repeats: int | None = None  # timed passes (or steps) per variant (default 2; quick 1)
    max_foreign_cpu: float | None = 10.0
    # Items per cell: SST-2 sentences, MRPC pairs, SQuAD passages (GLiNER2, zero-shot); at batch 1 the first `batch_1`
    # of them (time per item hardly depends on how many); training batch sizes.
    items: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        default = (
            dict(sst2=4, mrpc=4, passages=2, zero_shot=2, batch_1=2, train_batch=2, gliner2_train_batch=2)
            if self.quick
            else dict(sst2=64, mrpc=32, passages=16, zero_shot=8, batch_1=16, train_batch=32, gliner2_train_batch=8)
        )
        return {**default, **self.items}

    def timed_repeats(self) -> int:
        return self.repeats or (1 if self.quick else 2)


# ---------------------------------------------------------------------------------------------------------------------
# Data: real text from tests/data
# ---------------------------------------------------------------------------------------------------------------------


def sst2(count: int) -> tuple[list[str], list[int]]:
    """The first `count` SST-2 dev sentences and labels."""
    rows = [line.rsplit("\t", 1) for line in (DATA_DIR / "glue/sst2/dev.tsv").read_text().splitlines()[1 : count + 1]]
    return [row[0].strip() for row in rows], [int(row[1]) for row in rows]


def mrpc(count: int) -> tuple[list[tuple[str, str]], list[int]]:
    """The first `count` MRPC dev sentence pairs and their paraphrase labels."""
    with open(DATA_DIR / "glue/mrpc/dev.tsv", encoding="utf-8-sig", newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]
    return [(row["#1 String"], row["#2 String"]) for row in rows], [int(row["Quality"]) for row in rows]


def squad_paragraphs(count: int) -> list[dict]:
    """`count` SQuAD v1.1 dev paragraphs spread evenly over the 4 articles tests/data keeps (Super Bowl 50, Warsaw,
    Normans, Nikola Tesla), each with its answers."""
    articles = json.loads((DATA_DIR / "qa/squad_v1.1/dev-v1.1.json").read_text())["data"]
    paragraphs = [paragraph for article in articles for paragraph in article["paragraphs"]]
    step = len(paragraphs) / count
    return [paragraphs[int(i * step)] for i in range(count)]


def passages(count: int) -> list[str]:
    return [paragraph["context"] for paragraph in squad_paragraphs(count)]


def answer_records(count: int) -> list[dict]:
    """GLiNER2 training records: a SQuAD passage whose answers (the distinct answer texts found in it) are the entities
    of one type, "answer"."""
    records = []
    for paragraph in squad_paragraphs(count):
        answers = sorted(
            {a["text"] for qa in paragraph["qas"] for a in qa["answers"] if a["text"] in paragraph["context"]}
        )
        records.append({"text": paragraph["context"], "entities": {"answer": answers[:8]}})
    return records


# ---------------------------------------------------------------------------------------------------------------------
# Model folders: random weights, transformers' classes and files, the demo tokenizer
# ---------------------------------------------------------------------------------------------------------------------


def build_folder(work: Path, family: str, head: str, quick: bool) -> Path:
    """A transformers model of `family` with seeded random weights saved with the demo tokenizer: head "base" (the
    encoder), "sst2" (2 labels), "nli" (3 labels, entailment first) or "ce" (1 label); "gliner2": a GLiNER2 over the
    "base" encoder (seeded heads). Built once per run."""
    folder = work / f"{family}-{head}"
    if folder.is_dir():
        return folder
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    if head == "gliner2":
        from gliner2 import ExtractorConfig, GLiNER2

        backbone = build_folder(work, family, "base", quick)
        torch.manual_seed(SEED)
        GLiNER2(ExtractorConfig(model_name=str(backbone))).save_pretrained(str(folder))
        return folder
    if head == "gliner":
        backbone = build_folder(work, family, "base", quick)
        torch.manual_seed(SEED)
        folder.mkdir()
        (folder / "backbone.txt").write_text(str(backbone))
        torch.save(_gliner_from_config(backbone).state_dict(), folder / "gliner.pt")
        return folder
    size = dict(SIZES[family], **(TINY if quick else {}))
    model_type = "deberta-v2" if family == "deberta" else "roformer"
    labels = {"base": None, "sst2": {0: "negative", 1: "positive"}, "nli": NLI_LABELS, "ce": {0: "LABEL_0"}}[head]
    extra = {} if labels is None else dict(id2label=labels, label2id={v: k for k, v in labels.items()})
    config = AutoConfig.for_model(model_type, **size, **extra)
    torch.manual_seed(SEED)
    model = (AutoModel if head == "base" else AutoModelForSequenceClassification).from_config(config)
    model.save_pretrained(folder)
    for file in TOKENIZER.iterdir():
        shutil.copy(file, folder)
    return folder


# ---------------------------------------------------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Client:
    """One library API. `load(folder)` builds it as shipped; `module(obj)` is the model inside (what
    `posformers.optimize` and disentangled-flash act on). Inference: `run(obj, items, batch)` -> outputs, compared by
    `compare(a, b)` -> largest |difference|. Training: `trainer(obj)` -> (eval_loss(batch), step(batch))."""

    name: str
    description: str
    mode: str  # "inference" | "train"
    families: tuple[str, ...]
    head: str
    items: Callable[[dict[str, int], int], list]  # (counts, training batches) -> the items, or the batches
    load: Callable[[Path], Any]
    module: Callable[[Any], nn.Module]
    run: Callable[[Any, list, int], Any] | None = None
    compare: Callable[[Any, Any], float] | None = None
    trainer: Callable[[Any], tuple[Callable[[list], float], Callable[[list], None]]] | None = None
    batch: str | None = None  # training: the counts() key of the batch size
    posformers_how: str = "enable"  # "enable": posformers.enabled() around `load`; "optimize": optimize(module(obj))
    flash: bool = False  # also run with GLiNER2's enable_disentangled_flash(backend="torch")


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items) - size + 1, size)]


def _max_diff(pairs) -> float:
    return max((float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max()) for a, b in pairs), default=0.0)


def _pipeline(task: str):
    def load(folder: Path):
        from transformers import pipeline

        return pipeline(task, model=str(folder), device="cpu")

    return load


def _text_classification(pipe, texts: list[str], batch: int):
    results = pipe(texts, batch_size=batch, top_k=None)
    return [[item["score"] for item in sorted(result, key=lambda item: item["label"])] for result in results]


def _zero_shot(pipe, texts: list[str], batch: int):
    results = pipe(texts, candidate_labels=ZERO_SHOT_LABELS, batch_size=batch)
    return [[dict(zip(result["labels"], result["scores"]))[label] for label in ZERO_SHOT_LABELS] for result in results]


def _feature_extraction(pipe, texts: list[str], batch: int):
    """Per-token features at real tokens (posformers leaves zeros at padded positions, transformers other values)."""
    features = pipe(texts, batch_size=batch, return_tensors=True)
    lengths = [len(ids) for ids in pipe.tokenizer(texts)["input_ids"]]
    return [feature[0, :length] for feature, length in zip(features, lengths)]


def _pairwise(a, b) -> float:
    return _max_diff(zip(a, b))


def _trainer_step(model):
    """AutoModelForSequenceClassification trained the way Trainer does a step: padded batch, loss, backward, AdamW."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

    def inputs(batch):
        texts, labels = zip(*batch)
        encoded = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
        return {**encoded, "labels": torch.tensor(labels)}

    def eval_loss(batch) -> float:
        model.eval()
        with torch.no_grad():
            return float(model(**inputs(batch)).loss)

    def step(batch) -> None:
        model.train()
        model(**inputs(batch)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return eval_loss, step


def _sentence_transformer(folder: Path):
    from sentence_transformers import SentenceTransformer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SentenceTransformer(str(folder), device="cpu")


def _cross_encoder(folder: Path):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu")


def _cross_encoder_fit_step(cross_encoder):
    """One step of CrossEncoder training: BinaryCrossEntropyLoss (what CrossEncoderTrainer and `fit` use for one
    label) on a batch of pairs, backward, AdamW step."""
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    loss = BinaryCrossEntropyLoss(cross_encoder)
    optimizer = torch.optim.AdamW(cross_encoder.parameters(), lr=2e-5)

    def value(batch):
        pairs, labels = zip(*batch)
        return loss([[a for a, _ in pairs], [b for _, b in pairs]], torch.tensor(labels))

    def eval_loss(batch) -> float:
        cross_encoder.eval()
        with torch.no_grad():
            return float(value(batch))

    def step(batch) -> None:
        cross_encoder.train()
        value(batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return eval_loss, step


def _gliner2(folder: Path):
    from gliner2 import GLiNER2

    return GLiNER2.from_pretrained(str(folder))


def _gliner2_extract(model, texts: list[str], batch: int):
    results = model.batch_extract_entities(
        texts, ENTITY_TYPES, batch_size=batch, threshold=0.5, include_confidence=True, include_spans=True
    )
    return [
        {
            (label, span["start"], span["end"]): span["confidence"]
            for label, spans in result["entities"].items()
            for span in spans
        }
        for result in results
    ]


def _compare_spans(a: list[dict], b: list[dict]) -> float:
    """Largest |confidence difference| over the spans both found; infinity when they found different spans."""
    if any(x.keys() != y.keys() for x, y in zip(a, b)):
        return float("inf")
    return max((abs(x[key] - y[key]) for x, y in zip(a, b) for key in x), default=0.0)


def _gliner2_train_step(model):
    """One step of GLiNER2's training loss as gliner2.training.trainer computes it: ExtractorCollator (training
    targets) -> model(batch)["total_loss"] -> backward -> AdamW step."""
    from gliner2.training.data import InputExample
    from gliner2.training.trainer import ExtractorCollator, ExtractorDataset

    collator = ExtractorCollator(model.processor, is_training=True, architecture=getattr(model, "architecture", "span"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def collate(records):
        examples = [InputExample(text=record["text"], entities=record["entities"]) for record in records]
        dataset = ExtractorDataset.from_examples(examples, shuffle=False)
        # The training collator samples (label order, dropped fields, ...) with the `random` module: seeded, every
        # variant gets the same batch of the same records.
        random.seed(SEED)
        return collator([dataset[i] for i in range(len(dataset))])

    def eval_loss(records) -> float:
        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return float(model(collate(records))["total_loss"])
        finally:
            model.train(training)

    def step(records) -> None:
        model.train()
        model(collate(records))["total_loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return eval_loss, step


def _gliner_from_config(backbone: Path):
    """GLiNER's span model (markerV0, spans up to 8 words) over the encoder folder, as its `from_config` builds it."""
    from gliner import GLiNER, GLiNERConfig

    hidden_size = json.loads((backbone / "config.json").read_text())["hidden_size"]
    config = GLiNERConfig(
        model_name=str(backbone), max_width=8, hidden_size=hidden_size, max_len=384, span_mode="markerV0"
    )
    return GLiNER.from_config(config, backbone_from_pretrained=True, load_tokenizer=True)


def _gliner(folder: Path):
    model = _gliner_from_config(Path((folder / "backbone.txt").read_text()))
    model.load_state_dict(torch.load(folder / "gliner.pt", weights_only=True))
    return model.eval()


def _gliner_predict(model, texts: list[str], batch: int):
    results = model.batch_predict_entities(texts, ENTITY_TYPES, threshold=0.5, batch_size=batch)
    return [
        {(entity["label"], entity["start"], entity["end"]): entity["score"] for entity in spans} for spans in results
    ]


def bertscore_layers(folder: Path) -> int:
    """The layers BERTScore keeps: 3/4 of the encoder's (9 of 12), at least 1."""
    return max(1, json.loads((folder / "config.json").read_text())["num_hidden_layers"] * 3 // 4)


def _bertscore(folder: Path):
    from bert_score import BERTScorer

    return BERTScorer(model_type=str(folder), num_layers=bertscore_layers(folder), lang="en", device="cpu")


def _bertscore_score(scorer, pairs: list[tuple[str, str]], batch: int):
    candidates, references = [a for a, _ in pairs], [b for _, b in pairs]
    return torch.stack(scorer.score(candidates, references, batch_size=batch))  # (P, R, F) x pairs


BOTH = ("deberta", "roformer")
CLIENTS = (
    Client(
        "text-classification",
        "transformers pipeline('text-classification'), SST-2 dev sentences",
        "inference",
        BOTH,
        "sst2",
        lambda counts, _: sst2(counts["sst2"])[0],
        _pipeline("text-classification"),
        lambda pipe: pipe.model,
        run=_text_classification,
        compare=_pairwise,
    ),
    Client(
        "zero-shot-classification",
        f"transformers pipeline('zero-shot-classification'), SQuAD dev passages x {len(ZERO_SHOT_LABELS)} labels",
        "inference",
        BOTH,
        "nli",
        lambda counts, _: passages(counts["zero_shot"]),
        _pipeline("zero-shot-classification"),
        lambda pipe: pipe.model,
        run=_zero_shot,
        compare=_pairwise,
    ),
    Client(
        "feature-extraction",
        "transformers pipeline('feature-extraction'), SST-2 dev sentences",
        "inference",
        BOTH,
        "base",
        lambda counts, _: sst2(counts["sst2"])[0],
        _pipeline("feature-extraction"),
        lambda pipe: pipe.model,
        run=_feature_extraction,
        compare=_pairwise,
    ),
    Client(
        "Trainer step",
        "AutoModelForSequenceClassification: padded batch, forward with labels, backward, AdamW step (SST-2)",
        "train",
        BOTH,
        "sst2",
        lambda counts, batches: _chunks(list(zip(*sst2(counts["train_batch"] * batches))), counts["train_batch"]),
        lambda folder: __import__("transformers").AutoModelForSequenceClassification.from_pretrained(str(folder)),
        lambda model: model,
        trainer=_trainer_step,
        batch="train_batch",
    ),
    Client(
        "SentenceTransformer.encode",
        "sentence-transformers SentenceTransformer (mean pooling).encode, SST-2 dev sentences",
        "inference",
        BOTH,
        "base",
        lambda counts, _: sst2(counts["sst2"])[0],
        _sentence_transformer,
        lambda st: st,
        run=lambda st, texts, batch: st.encode(texts, batch_size=batch, convert_to_tensor=True),
        compare=lambda a, b: _max_diff([(a, b)]),
    ),
    Client(
        "CrossEncoder.predict",
        "sentence-transformers CrossEncoder.predict, MRPC dev pairs",
        "inference",
        BOTH,
        "ce",
        lambda counts, _: mrpc(counts["mrpc"])[0],
        _cross_encoder,
        lambda cross_encoder: cross_encoder,
        run=lambda ce, pairs, batch: ce.predict(pairs, batch_size=batch, convert_to_tensor=True),
        compare=lambda a, b: _max_diff([(a, b)]),
    ),
    Client(
        "CrossEncoder fit step",
        "sentence-transformers CrossEncoder: BinaryCrossEntropyLoss, backward, AdamW step (MRPC pairs)",
        "train",
        BOTH,
        "ce",
        lambda counts, batches: _chunks(list(zip(*mrpc(counts["train_batch"] * batches))), counts["train_batch"]),
        _cross_encoder,
        lambda cross_encoder: cross_encoder,
        trainer=_cross_encoder_fit_step,
        batch="train_batch",
    ),
    Client(
        "GLiNER2 extract",
        f"GLiNER2.batch_extract_entities, SQuAD dev passages, {len(ENTITY_TYPES)} entity types",
        "inference",
        ("deberta",),
        "gliner2",
        lambda counts, _: passages(counts["passages"]),
        _gliner2,
        lambda model: model,
        run=_gliner2_extract,
        compare=_compare_spans,
        posformers_how="optimize",
        flash=True,
    ),
    Client(
        "GLiNER2 train step",
        "GLiNER2 training loss (SQuAD passages, answers as entities), backward, AdamW step",
        "train",
        ("deberta",),
        "gliner2",
        lambda counts, batches: _chunks(
            answer_records(counts["gliner2_train_batch"] * batches), counts["gliner2_train_batch"]
        ),
        _gliner2,
        lambda model: model,
        trainer=_gliner2_train_step,
        batch="gliner2_train_batch",
        posformers_how="optimize",
        flash=True,
    ),
    Client(
        "GLiNER predict",
        f"GLiNER 0.2.29 batch_predict_entities, SQuAD dev passages, {len(ENTITY_TYPES)} entity types",
        "inference",
        ("deberta",),
        "gliner",
        lambda counts, _: passages(counts["passages"]),
        _gliner,
        lambda model: model,
        run=_gliner_predict,
        compare=_compare_spans,
        posformers_how="optimize",
    ),
    Client(
        "BERTScore",
        "BERTScore 0.3.13 BERTScorer(num_layers=3/4 of the layers).score, MRPC dev pairs: P, R, F",
        "inference",
        BOTH,
        "base",
        lambda counts, _: mrpc(counts["mrpc"])[0],
        _bertscore,
        lambda scorer: scorer._model,
        run=_bertscore_score,
        compare=lambda a, b: _max_diff([(a, b)]),
    ),
)


FLASH_MISSING = flash_missing("GLiNER2's disentangled-flash column")


# ---------------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------------


def model_class(module: nn.Module) -> str:
    """`module.class` of the first transformers or posformers model inside `module` (itself included), and of the
    first disentangled-flash module where there is one (the encoder GLiNER2's switch puts in)."""
    found: dict[str, str] = {}
    for inner in module.modules():
        kind = type(inner).__module__
        role = "flash" if kind.startswith("disentangled_flash") else "model"
        if role not in found and kind.startswith(("transformers.models.", "posformers.", "disentangled_flash")):
            found[role] = f"{kind}.{type(inner).__name__}"
    return " + ".join(found.values()) or f"{type(module).__module__}.{type(module).__name__}"


def load_variants(client: Client, folder: Path, with_flash: bool) -> dict[str, Any]:
    """The client loaded once per variant, each from `folder`. Raises if the posformers variant does not run
    posformers' model (the drop-in did not reach it)."""
    objects = {SHIPPED: client.load(folder)}
    if client.posformers_how == "enable":
        with posformers.enabled():
            objects[POSFORMERS] = client.load(folder)
    else:
        objects[POSFORMERS] = client.load(folder)
        posformers.optimize(client.module(objects[POSFORMERS]))
    if client.flash and with_flash:
        objects[FLASH] = client.load(folder)
        model = client.module(objects[FLASH])
        model.train(client.mode == "train")
        model.enable_disentangled_flash(backend="torch", inference=client.mode != "train")
    kind = model_class(client.module(objects[POSFORMERS]))
    if not kind.startswith("posformers."):
        raise RuntimeError(f"{client.name}: the posformers variant runs {kind}, not posformers' model")
    return objects


def _timed(run: Callable[[], Any], meter: ForeignCpuMeter) -> float:
    gc.collect()
    with meter.measure():
        begin = time.perf_counter()
        run()
        return time.perf_counter() - begin


def _variant_stats(times: list[float], per: int, module: nn.Module) -> dict[str, Any]:
    return {
        "ms_per_item": 1e3 * statistics.median(times) / per,
        "times_s": times,
        "model_class": model_class(module),
    }


def inference_cell(client: Client, objects: dict[str, Any], items: list, batch: int, options: Options) -> dict:
    """One untimed pass per variant (its outputs are compared), then `repeats` timed passes, variants alternating."""
    outputs = {name: client.run(obj, items, batch) for name, obj in objects.items()}
    diffs = {name: client.compare(outputs[SHIPPED], outputs[name]) for name in objects if name != SHIPPED}
    del outputs
    times: dict[str, list[float]] = {name: [] for name in objects}
    meter = ForeignCpuMeter()
    for _ in range(options.timed_repeats()):
        if options.max_foreign_cpu is not None and meter.available:
            ForeignCpuMeter.wait_until_quiet(options.max_foreign_cpu, timeout_s=5.0)
        for name, obj in objects.items():
            times[name].append(_timed(lambda obj=obj: client.run(obj, items, batch), meter))
    return {
        "batch": batch,
        "items": len(items),
        "variants": {name: _variant_stats(times[name], len(items), client.module(objects[name])) for name in objects},
        "max_abs_diff": diffs,
        "foreign_cpu_pct": meter.percent,
    }


def train_cell(client: Client, objects: dict[str, Any], batches: list[list], options: Options) -> dict:
    """The first batch's loss in eval mode (compared), one untimed step, then one timed step per repeat on the next
    batches, variants alternating."""
    trainers = {name: client.trainer(obj) for name, obj in objects.items()}
    losses, notes = {}, []
    for name, (eval_loss, _) in trainers.items():
        try:
            losses[name] = eval_loss(batches[0])
        except Exception as error:  # a variant that cannot evaluate still trains and is timed; the report says why
            losses[name] = None
            notes.append(f"{name}: the eval-mode loss failed ({type(error).__name__}: {error})")
    # Relative to the loss where it exceeds 1 (GLiNER2's sums over spans and queries run into the hundreds).
    diffs = {
        name: None
        if losses[name] is None or losses[SHIPPED] is None
        else abs(losses[name] - losses[SHIPPED]) / max(1.0, abs(losses[SHIPPED]))
        for name in objects
        if name != SHIPPED
    }
    for _, step in trainers.values():
        step(batches[0])
    times: dict[str, list[float]] = {name: [] for name in objects}
    meter = ForeignCpuMeter()
    for position in range(1, options.timed_repeats() + 1):
        if options.max_foreign_cpu is not None and meter.available:
            ForeignCpuMeter.wait_until_quiet(options.max_foreign_cpu, timeout_s=5.0)
        for name, (_, step) in trainers.items():
            times[name].append(_timed(lambda step=step, batch=batches[position]: step(batch), meter))
    size = len(batches[0])
    return {
        "batch": size,
        "items": size * options.timed_repeats(),
        "variants": {name: _variant_stats(times[name], size, client.module(objects[name])) for name in objects},
        "max_abs_diff": diffs,
        "losses": losses,
        "foreign_cpu_pct": meter.percent,
        **({"notes": notes} if notes else {}),
    }


def cell_ratios(cell: dict) -> dict[str, float]:
    variants = cell["variants"]
    ours = variants[POSFORMERS]["ms_per_item"]
    ratios = {f"{POSFORMERS} / {SHIPPED}": ours / variants[SHIPPED]["ms_per_item"]}
    if FLASH in variants:
        ratios[f"{POSFORMERS} / {FLASH}"] = ours / variants[FLASH]["ms_per_item"]
    return ratios


def cell_targets(cell: dict) -> list[dict]:
    limit = TIME_TARGETS[(cell["mode"], cell["batch"] if cell["mode"] == "inference" else None)]
    limits = [(f"{POSFORMERS} / {SHIPPED}", limit)]
    if f"{POSFORMERS} / {FLASH}" in cell["ratios"]:
        limits.append((f"{POSFORMERS} / {FLASH}", FLASH_TARGET))
    return [
        {"ratio": name, "value": cell["ratios"][name], "limit": limit, "met": cell["ratios"][name] <= limit}
        for name, limit in limits
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    """transformers' load reports (weights newly initialised for a head, ...) and progress bars, for the run."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    progress = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(verbosity)
        if progress:
            logging.enable_progress_bar()


def run_clients(options: Options, on_cell: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Every client, model and mode; `on_cell(report)` after each cell, so a run that dies leaves what it finished."""
    threads = options.threads or (1 if options.quick else os.cpu_count() or 1)
    torch.set_num_threads(threads)
    started = time.perf_counter()
    counts = options.counts()
    with_flash = flash_available()
    if not with_flash:
        _log(FLASH_MISSING)
    report: dict[str, Any] = {
        "suite": "clients",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment(torch.device("cpu"), torch.float32, threads),
        "options": {
            "quick": options.quick,
            "repeats": options.timed_repeats(),
            "max_foreign_cpu": options.max_foreign_cpu,
            "counts": counts,
            "seed": SEED,
        },
        "versions": _versions(),
        "sizes": {family: dict(size, **(TINY if options.quick else {})) for family, size in SIZES.items()},
        "variants": {
            SHIPPED: "the client as installed (transformers' models)",
            POSFORMERS: "posformers.enabled() around the client's load; GLiNER2 and GLiNER: posformers.optimize(model)",
            FLASH: "GLiNER2 with enable_disentangled_flash(backend='torch')",
        },
        "flash_available": with_flash,
        "clients": {client.name: client.description for client in CLIENTS},
        "cells": [],
        "failures": [],
        "notes": [
            "Random weights, the configs' dropout (0.1): training cells run in train mode with dropout, as a user's "
            "training does; their outputs are compared on the first batch's loss in eval mode, before any step.",
            "Inference: ms per item = the median of the timed passes over all items / items (one untimed pass "
            "first). Training: the median step / batch size (one untimed step first).",
            "GLiNER2 and GLiNER posformers = the model as shipped, then posformers.optimize(model) (GLiNER builds its "
            "encoder by name, which posformers.enabled() does not reach); the others load under posformers.enabled().",
        ]
        + ([] if with_flash else [FLASH_MISSING]),
    }
    with tempfile.TemporaryDirectory(prefix="posformers-clients-") as work, _quiet():
        for client in CLIENTS:
            for family in client.families:
                _run_client(client, family, Path(work), options, counts, with_flash, report)
                _log(f"[{time.perf_counter() - started:6.0f}s] {client.name} {family} done")
                if on_cell is not None:
                    on_cell(report)
    report["environment"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["wall_s"] = time.perf_counter() - started
    return report


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("transformers", "sentence-transformers", "gliner2", "gliner", "bert-score", "disentangled-flash"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


def _run_client(
    client: Client, family: str, work: Path, options: Options, counts: dict, with_flash: bool, report: dict
) -> None:
    try:
        torch.manual_seed(SEED)
        folder = build_folder(work, family, client.head, options.quick)
        objects = load_variants(client, folder, with_flash)
        if client.mode == "inference":
            items = client.items(counts, 0)
            cells = [
                inference_cell(client, objects, items if batch > 1 else items[: counts["batch_1"]], batch, options)
                for batch in INFERENCE_BATCHES
            ]
        else:
            batches = client.items(counts, 1 + options.timed_repeats())
            cells = [train_cell(client, objects, batches, options)]
    except Exception as error:
        # A failing client is reported, and the run goes on with the others.
        _log(f"{client.name} {family}: FAILED: {type(error).__name__}: {error}")
        report["failures"].append(
            {"client": client.name, "family": family, "error": f"{type(error).__name__}: {error}"}
        )
        return
    finally:
        gc.collect()
    for cell in cells:
        cell = {"client": client.name, "family": family, "mode": client.mode, **cell}
        # A client whose outputs differ in kind (GLiNER2 finding other spans) has no number to report.
        cell["max_abs_diff"] = {
            name: DIFFERENT if diff == float("inf") else diff for name, diff in cell["max_abs_diff"].items()
        }
        cell["agree"] = all(
            isinstance(diff, float) and diff <= EQUIVALENCE_TOLERANCE for diff in cell["max_abs_diff"].values()
        )
        cell["ratios"] = cell_ratios(cell)
        cell["targets"] = cell_targets(cell)
        report["cells"].append(cell)


# ---------------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------------


def _ms(variant: dict | None) -> str:
    return "n/a" if variant is None else f"{variant['ms_per_item']:.1f}"


def _target(cell: dict, ratio: str) -> str:
    target = next((t for t in cell["targets"] if t["ratio"] == ratio), None)
    if target is None:
        return "n/a"
    return f"{target['value']:.2f}x (<= {target['limit']:.2f}x: {'yes' if target['met'] else 'NO'})"


def _diff(value: float | str | None) -> str:
    return "n/a" if value is None else value if isinstance(value, str) else f"{value:.1g}"


def _load(average: list[float] | None) -> str:
    return "n/a" if not average else f"{average[0]:.1f}"


def _short(kind: str) -> str:
    """transformers.models.deberta_v2.modeling_deberta_v2.DebertaV2Model -> transformers DebertaV2Model; posformers'
    classes keep their module (posformers.dropin)."""
    return " + ".join(
        part if part.startswith("posformers.") else f"{part.split('.')[0]} {part.rsplit('.', 1)[-1]}"
        for part in kind.split(" + ")
    )


def format_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items() if version)
    counts = report["options"]["counts"]
    lines = [
        "## clients: client libraries as shipped vs on posformers' drop-in",
        "",
        f"{env['device_name']} ({env['device']}), {env['dtype']}, torch threads {env['torch_threads']}, "
        f"torch {env['torch']}, {versions}, commit {env['git_commit']}"
        + (" (models/ modified)" if env.get("models_dir_modified") else "")
        + (", QUICK (tiny models)" if report["options"]["quick"] else ", base size (DeBERTa-v3-base, RoFormer base)"),
        "",
        f"Items: {counts['sst2']} SST-2 dev sentences, {counts['mrpc']} MRPC dev pairs, {counts['passages']} SQuAD dev "
        f"passages (GLiNER2, GLiNER), {counts['zero_shot']} passages x {len(ZERO_SHOT_LABELS)} labels (zero-shot), "
        f"the first {counts['batch_1']} of them at batch 1; training "
        f"batches of {counts['train_batch']} ({counts['gliner2_train_batch']} for GLiNER2); "
        f"{report['options']['repeats']} timed passes or steps per variant. Times in ms per item (lower is better). "
        f"Load average at start / end: {_load(env.get('loadavg_start'))} / {_load(env.get('loadavg_end'))}.",
        "",
    ]
    header = [
        "client",
        "model",
        "mode",
        "batch",
        f"{SHIPPED} ms",
        f"{POSFORMERS} ms",
        f"{FLASH} ms",
        f"{POSFORMERS} / {SHIPPED}",
        f"{POSFORMERS} / {FLASH}",
        "outputs max abs diff",
        "other CPU %",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for cell in report["cells"]:
        variants = cell["variants"]
        diffs = ", ".join(f"{name}: {_diff(value)}" for name, value in cell["max_abs_diff"].items())
        foreign = cell["foreign_cpu_pct"]
        row = [
            cell["client"],
            cell["family"],
            cell["mode"],
            str(cell["batch"]),
            _ms(variants[SHIPPED]),
            _ms(variants[POSFORMERS]),
            _ms(variants.get(FLASH)),
            _target(cell, f"{POSFORMERS} / {SHIPPED}"),
            _target(cell, f"{POSFORMERS} / {FLASH}"),
            diffs,
            "n/a" if foreign is None else f"{foreign:.0f}",
        ]
        lines.append("| " + " | ".join(row) + " |")
    met = [target["met"] for cell in report["cells"] for target in cell["targets"]]
    lines += ["", f"Targets met: {sum(met)} of {len(met)}."]
    lines += ["", *(f"- {name}: {description}" for name, description in report["clients"].items())]
    lines += [f"- {name}: {description}" for name, description in report["variants"].items()]
    for cell in report["cells"]:
        if cell is next(c for c in report["cells"] if (c["client"], c["family"]) == (cell["client"], cell["family"])):
            kinds = "; ".join(f"{name}: {_short(v['model_class'])}" for name, v in cell["variants"].items())
            lines.append(f"- {cell['client']} {cell['family']} runs {kinds}")
        for note in cell.get("notes", []):
            lines.append(f"- {cell['client']} {cell['family']}: {note}")
    lines += [
        f"- FAILED: {failure['client']} {failure['family']}: {failure['error']}" for failure in report["failures"]
    ]
    lines += [f"- {note}" for note in report["notes"]]
    lines.append(
        f"- Outputs are called equal within {EQUIVALENCE_TOLERANCE:g}; "
        + (
            "all cells agree."
            if all(c["agree"] for c in report["cells"])
            else "cells that do not: see the diff column."
        )
    )
    lines.append(f"- Wall time of the run: {report['wall_s'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> Path:
    """Grouped bars of ms per item, one group per cell, one bar per variant; a log axis (the cells span batch 1 to
    training steps). Raises ImportError when matplotlib is absent."""
    from .plot import MISSING_MATPLOTLIB

    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(MISSING_MATPLOTLIB) from error
    cells = report["cells"]
    variants = [name for name in VARIANTS if any(name in cell["variants"] for cell in cells)]
    width = 0.8 / max(1, len(variants))
    figure = Figure(figsize=(max(8.0, 0.75 * len(cells)), 5.0), layout="constrained")
    axes = figure.subplots()
    for index, name in enumerate(variants):
        offsets = [i + (index - (len(variants) - 1) / 2) * width for i in range(len(cells))]
        values = [cell["variants"][name]["ms_per_item"] if name in cell["variants"] else 0.0 for cell in cells]
        axes.bar(offsets, values, width, label=name)
    axes.set_yscale("log")
    axes.set_xticks(range(len(cells)))
    axes.set_xticklabels(
        [f"{c['client']}\n{c['family']} {c['mode'][:5]} {c['batch']}" for c in cells], fontsize=6, rotation=90
    )
    axes.set_ylabel("ms per item (log)")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    env = report["environment"]
    quick = ", quick (tiny models)" if report["options"]["quick"] else ""
    threads = f"{env['torch_threads']} thread{'s' * (env['torch_threads'] != 1)}"
    axes.set_title(f"Client libraries as shipped vs posformers: {env['dtype']}, {threads}{quick}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def main(options: Options, json_path: Path | None = None) -> tuple[dict[str, Any], dict[str, Path | str]]:
    """Run the benchmark and write its outputs (`harness.run_and_write`): (report, the paths written)."""
    return run_and_write(
        lambda on_cell: run_clients(options, on_cell=on_cell),
        json_path or RESULTS_DIR / "clients.json",
        format_markdown,
        plot,
    )
