"""The LittleBird recipe end to end, on a CPU in minutes: posformers-littlebird-recipe (also `make littlebird-recipe`,
`python -m posformers.finetune.littlebird_recipe`, or `main([...])` in Python, which returns the summary).

No LittleBird weights exist anywhere, so every user starts from a short-input encoder. This driver runs the whole path
through the scripts' public command lines (each script's `main([...])`), on real text shipped in
`posformers/demo_data` (provenance in its README.md), with a held-out number for every stage:

    1. teacher   posformers-pretrain --objective mlm --model_type bert --train_tokenizer wordpiece
                 a small BERT learns masked language modelling on SQuAD paragraphs + SST-2 sentences
                 -> held-out MLM loss and accuracy
    2. convert   posformers-convert littlebird --from bert, then posformers-pretrain --do_eval
                 -> the converted student's held-out MLM loss and accuracy on the teacher's held-out masks
    3. distill   posformers-pretrain --objective distill (Padding Insertion)
                 -> held-out distillation loss, agreement with the teacher, the student's own MLM loss
    4. rss       posformers-pretrain --objective rss (Recurring Span Selection)
                 -> held-out span-selection loss and exact match
    5. qa        posformers-qa on whole SQuAD articles (all their paragraphs joined, up to 4096 tokens, one window)
                 trained on the questions of some articles, scored on the questions of other articles -> EM / F1

    posformers-littlebird-recipe [--output_dir demo_output/littlebird-recipe] [--size full|toy] [--seed 0] [--threads 1]
        [--overwrite_output_dir] [--global_prefix_experiment]

--global_prefix_experiment adds two stages, 6-rss-prefix-off and 7-rss-prefix-on: the RSS stage again, from the
distilled student, on question-first passages (`question_first_passages`) with LittleBirdConfig.global_prefix_length
1 (the paper's behaviour) and block_size (the whole first block distance-free), scored on held-out ones.

Held out everywhere: the SQuAD articles HELD_OUT_ARTICLES (their paragraphs are the held-out pre-training text with
the SST-2 dev sentences; their questions are the QA evaluation), never seen in any training stage.

Output folder: one folder per stage (1-teacher, 2-convert, 3-distill, 4-rss, 5-qa; each a normal output folder of
its script, a model that the next stage and the Auto classes load), data/ (the text and QA files the stages read),
and summary.md / summary.json (every stage's held-out numbers, wall time and CPU time), rewritten after each stage.
A stage that finished (its folder holds recipe_stage.json, of a run with the same --size and --seed) is skipped
when the recipe is run again, so an interrupted run resumes at the stage it was in; the stages after one that runs
run again too. The recipe writes only into a folder it made itself (it leaves a
.posformers-littlebird-recipe marker): a non-empty folder without the marker is refused unless
--overwrite_output_dir, which also reruns every stage.

Sizes are presets (RECIPE_SIZES): `full`, about 6 minutes of CPU time with one thread (so about 7 minutes of wall
time on a quiet 2-core machine), and `toy`, seconds, for the tests. A tiny model trained for minutes is a smoke test
of the recipe, not a quality claim: README.md, "The LittleBird recipe", says what each number means and what this
machine measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from posformers.conversion import cli as convert_cli

from . import run_pretrain, run_qa
from .demo import DEMO_DATA

ARTICLES = DEMO_DATA / "littlebird" / "squad_articles.json"
SST2 = DEMO_DATA / "sst2"
# Whole articles read by no training stage: held-out text for pre-training, held-out questions for QA.
HELD_OUT_ARTICLES = ("Jacksonville,_Florida", "Intergovernmental_Panel_on_Climate_Change")
MARKER = ".posformers-littlebird-recipe"
STAGE_RECORD = "recipe_stage.json"
STAGES = ("teacher", "convert", "distill", "rss", "qa")
# --global_prefix_experiment: the RSS stage again on question-first passages, without and with a global prefix of one
# block (LittleBirdConfig.global_prefix_length 1, the paper's behaviour, and block_size).
PREFIX_STAGES = ("rss-prefix-off", "rss-prefix-on")
QA_WINDOW = 4096
QUIET = ["--report_to", "none", "--disable_tqdm", "True", "--save_strategy", "no"]


@dataclasses.dataclass(frozen=True)
class RecipeSize:
    """Every size of a recipe run in one place."""

    teacher: str  # the BERT teacher's --config_overrides
    vocab_size: int  # WordPiece vocabulary trained on the training text
    sst2_sentences: int  # SST-2 training rows in the pre-training text (the SQuAD paragraphs are all used)
    seq_length: int  # pre-training sequence length (the teacher's position table)
    batch_size: int
    teacher_steps: int
    teacher_learning_rate: float
    block_size: int
    pack_length: int
    distill_steps: int
    distill_learning_rate: float
    padding_insertion_max_length: int  # the student's longest length with Padding Insertion (distill and rss)
    rss_seq_length: int  # RSS passages: SQuAD paragraphs packed into sequences of this length
    rss_steps: int
    rss_learning_rate: float
    qa_train_questions: int  # training questions, drawn in turn from every training article
    qa_eval_questions: int | None  # held-out questions scored (None: all of both held-out articles)
    qa_epochs: float
    qa_batch_size: int
    qa_learning_rate: float


# Every size in each preset, side by side: (full, toy).
PRESETS = ("full", "toy")
PRESET_SIZES = {
    "teacher": (
        "hidden_size=128,num_hidden_layers=2,num_attention_heads=4,intermediate_size=512,max_position_embeddings=64",
        "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,max_position_embeddings=64",
    ),
    "vocab_size": (4000, 800),
    "sst2_sentences": (30000, 300),
    "seq_length": (64, 64),
    "batch_size": (16, 16),
    "teacher_steps": (800, 8),
    "teacher_learning_rate": (2e-3, 1e-3),
    "block_size": (64, 16),
    "pack_length": (16, 8),
    "distill_steps": (100, 4),
    "distill_learning_rate": (1e-3, 1e-3),
    "padding_insertion_max_length": (256, 128),
    "rss_seq_length": (256, 64),
    "rss_steps": (100, 4),
    "rss_learning_rate": (1e-3, 1e-3),
    "qa_train_questions": (200, 8),
    "qa_eval_questions": (None, 8),
    "qa_epochs": (1.0, 1.0),
    "qa_batch_size": (4, 4),
    "qa_learning_rate": (2e-3, 1e-3),
}
RECIPE_SIZES = {
    preset: RecipeSize(**{field: values[column] for field, values in PRESET_SIZES.items()})
    for column, preset in enumerate(PRESETS)
}


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def load_articles() -> tuple[list[dict], list[dict]]:
    """(training articles, held-out articles) of the shipped SQuAD v1.1 file, in file order."""
    articles = json.loads(ARTICLES.read_text(encoding="utf-8"))["data"]
    held_out = [article for article in articles if article["title"] in HELD_OUT_ARTICLES]
    return [article for article in articles if article["title"] not in HELD_OUT_ARTICLES], held_out


def sst2_sentences(split: str, count: int | None = None) -> list[str]:
    """The first `count` sentences of the shipped SST-2 `split` (train or dev)."""
    lines = (SST2 / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines[:count] if line.strip()]


def write_lines(path: Path, documents: list[str]) -> Path:
    path.write_text("\n".join(" ".join(text.split()) for text in documents) + "\n", encoding="utf-8")
    return path


def write_pretraining_text(folder: Path, size: RecipeSize) -> dict[str, Path]:
    """One document per line: train.txt / valid.txt (SQuAD paragraphs and SST-2 sentences) for MLM and distillation,
    rss_train.txt / rss_valid.txt (the SQuAD paragraphs alone: recurring spans live in passages) for RSS."""
    train_articles, held_out = load_articles()
    paragraphs = {
        "train": [p["context"] for article in train_articles for p in article["paragraphs"]],
        "validation": [p["context"] for article in held_out for p in article["paragraphs"]],
    }
    sentences = {"train": sst2_sentences("train", size.sst2_sentences), "validation": sst2_sentences("dev")}
    return {
        "train": write_lines(folder / "train.txt", paragraphs["train"] + sentences["train"]),
        "validation": write_lines(folder / "valid.txt", paragraphs["validation"] + sentences["validation"]),
        "rss_train": write_lines(folder / "rss_train.txt", paragraphs["train"]),
        "rss_validation": write_lines(folder / "rss_valid.txt", paragraphs["validation"]),
    }


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
CONTENT_WORD = re.compile(r"[A-Za-z][A-Za-z-]{4,}|[A-Z][a-z]+|\d{3,}")


def question_first(text: str) -> str:
    """`text` with the sentence sharing the most content words with the others (not the first or last sentence)
    moved to the front: its recurring spans become [QUESTION]s or answers in the passage's first block."""
    sentences = SENTENCE_END.split(text)
    if len(sentences) < 3:
        return text

    def shared(index: int) -> int:
        others = set(CONTENT_WORD.findall(" ".join(sentences[:index] + sentences[index + 1 :])))
        return len(set(CONTENT_WORD.findall(sentences[index])) & others)

    chosen = max(range(1, len(sentences) - 1), key=shared)
    return " ".join([sentences[chosen], *sentences[:chosen], *sentences[chosen + 1 :]])


def question_first_passages(articles: list[dict], tokenizer, length: int) -> list[str]:
    """One document per passage of `length` tokens, each starting with a question sentence (`question_first`).

    Passage k reads the article from paragraph k, cut at a word boundary and filled with " ." (one token each,
    never part of a span) to exactly `length - 3` tokens: posformers-pretrain packs documents into
    `[CLS] doc [SEP] [SEP]` chunks of `length` (documents joined by [SEP]), so each document is one passage, read from
    position 1."""
    size, passages = length - 3, []
    for article in articles:
        paragraphs = [" ".join(p["context"].split()) for p in article["paragraphs"]]
        for start in range(len(paragraphs)):
            text = " ".join(paragraphs[start:])
            encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            if len(encoding["input_ids"]) < size:
                break
            word_ids = encoding.word_ids()
            # the last whole word within `size` tokens
            cut = next(i for i in range(size, 0, -1) if i == len(word_ids) or word_ids[i] != word_ids[i - 1])
            passage = question_first(text[: encoding["offset_mapping"][cut - 1][1]])
            passage += " ." * (size - len(tokenizer.tokenize(passage)))
            if len(tokenizer.tokenize(passage)) == size:
                passages.append(passage)
    return passages


def long_document(article: dict, tokenizer, window: int) -> dict:
    """One SQuAD paragraph holding the article's paragraphs joined by blank lines, as many as fit with every one of
    their questions into one window of `window` tokens ([CLS] question [SEP] document [SEP]); answers shifted."""
    context, questions, fitted = "", [], None
    for paragraph in article["paragraphs"]:
        offset = len(context) + 2 if context else 0
        joined = f"{context}\n\n{paragraph['context']}" if context else paragraph["context"]
        shifted = [
            {**qa, "answers": [{**a, "answer_start": a["answer_start"] + offset} for a in qa["answers"]]}
            for qa in paragraph["qas"]
        ]
        longest_question = max(len(tokenizer.tokenize(qa["question"])) for qa in questions + shifted)
        if len(tokenizer.tokenize(joined)) + longest_question + 3 > window:
            break
        context, questions = joined, questions + shifted
        fitted = {"title": article["title"], "paragraphs": [{"context": context, "qas": questions}]}
    if fitted is None:
        raise ValueError(f"article {article['title']!r}: its first paragraph does not fit into window={window} tokens")
    return fitted


def interleave(documents: list[dict], count: int | None) -> list[dict]:
    """The documents with `count` of their questions, taken from each document in turn (all when count is None)."""
    queues = [list(document["paragraphs"][0]["qas"]) for document in documents]
    chosen: list[list[dict]] = [[] for _ in documents]
    total = sum(len(queue) for queue in queues) if count is None else count
    while total > 0 and any(queues):
        for index, queue in enumerate(queues):
            if queue and total > 0:
                chosen[index].append(queue.pop(0))
                total -= 1
    return [
        {"title": document["title"], "paragraphs": [{"context": document["paragraphs"][0]["context"], "qas": qas}]}
        for document, qas in zip(documents, chosen)
        if qas
    ]


def write_qa_files(folder: Path, tokenizer, size: RecipeSize) -> dict:
    """train.json (training articles' questions) and eval.json (held-out articles' questions) as whole documents;
    returns the paths and what they hold."""
    train_articles, held_out = load_articles()
    splits = {
        "train": interleave([long_document(a, tokenizer, QA_WINDOW) for a in train_articles], size.qa_train_questions),
        "eval": interleave([long_document(a, tokenizer, QA_WINDOW) for a in held_out], size.qa_eval_questions),
    }
    info = {}
    for split, documents in splits.items():
        path = folder / f"{split}.json"
        path.write_text(json.dumps({"data": documents, "version": "1.1"}, ensure_ascii=False), encoding="utf-8")
        info[split] = {
            "path": str(path),
            "articles": [document["title"] for document in documents],
            "questions": sum(len(document["paragraphs"][0]["qas"]) for document in documents),
            "document_tokens": [
                len(tokenizer.tokenize(document["paragraphs"][0]["context"])) for document in documents
            ],
        }
    return info


# ---------------------------------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------------------------------


def stage_number(stage: str) -> int:
    return (*STAGES, *PREFIX_STAGES).index(stage) + 1


def first_evaluation(output_dir: Path, key: str) -> float:
    """`key` at the first evaluation of the run in `output_dir` (--eval_on_start: before any training step)."""
    state = json.loads((output_dir / "trainer_state.json").read_text(encoding="utf-8"))
    return next(entry[key] for entry in state["log_history"] if key in entry)


class Recipe:
    """One run of the recipe in `output_dir`; each stage method returns its held-out metrics."""

    def __init__(self, output_dir: Path, size: RecipeSize, seed: int, overwrite: bool, question_first_length=None):
        self.output_dir, self.size, self.seed, self.overwrite = output_dir, size, seed, overwrite
        # passage length of the global-prefix experiment (default: the RSS stage's)
        self.question_first_length = question_first_length or size.rss_seq_length
        self.data = output_dir / "data"
        self.text: dict[str, Path] = {}

    def folder(self, stage: str) -> Path:
        return self.output_dir / f"{stage_number(stage)}-{stage}"

    def common(self, stage: str) -> list[str]:
        """Arguments every script call shares: its output folder (the recipe's own: a rerun may write over it)."""
        return ["--output_dir", str(self.folder(stage)), "--overwrite_output_dir", "--seed", str(self.seed), *QUIET]

    def pretraining_data(self) -> list[str]:
        return [
            "--train_file", str(self.text["train"]), "--validation_file", str(self.text["validation"]),
            "--max_seq_length", str(self.size.seq_length),
        ]  # fmt: skip

    def training(self, stage: str) -> list[str]:
        """Training arguments of a pre-training stage: its steps and learning rate from the size preset."""
        steps, rate = getattr(self.size, f"{stage}_steps"), getattr(self.size, f"{stage}_learning_rate")
        batch = str(self.size.batch_size)
        return [
            "--do_train", "--max_steps", str(steps), "--learning_rate", str(rate),
            "--warmup_steps", str(max(1, steps // 10)), "--weight_decay", "0.01",
            "--per_device_train_batch_size", batch, "--per_device_eval_batch_size", batch,
            "--logging_steps", str(max(1, steps // 8)),
        ]  # fmt: skip

    def train_from(self, source: str, objective: str, stage: str, *options: str) -> dict:
        """posformers-pretrain --objective `objective` on stage `source`'s model with `options`, into stage `stage`'s
        folder, evaluated before training (--eval_on_start) and after; its metrics."""
        return run_pretrain.main(
            [
                "--objective", objective, "--model_name_or_path", str(self.folder(source)), *options,
                *self.training(objective), "--do_eval", "--eval_on_start", *self.common(stage),
            ]
        )  # fmt: skip

    def held_out_mlm(self, model_dir: Path) -> dict:
        """The held-out MLM loss and accuracy of `model_dir` on the teacher's held-out text and masks (the results
        go into `model_dir`/mlm-eval)."""
        metrics = run_pretrain.main(
            [
                "--objective", "mlm", "--model_name_or_path", str(model_dir), *self.pretraining_data(),
                "--do_eval", "--per_device_eval_batch_size", str(self.size.batch_size),
                "--output_dir", str(model_dir / "mlm-eval"), "--seed", str(self.seed), *QUIET,
            ]
        )  # fmt: skip
        return {"mlm_loss": metrics["eval_mlm_loss"], "mlm_accuracy": metrics["eval_mlm_accuracy"]}

    def teacher(self) -> dict:
        run_pretrain.main(
            [
                "--objective", "mlm", "--model_type", "bert", "--config_overrides", self.size.teacher,
                "--train_tokenizer", "wordpiece", "--tokenizer_vocab_size", str(self.size.vocab_size),
                *self.pretraining_data(), *self.training("teacher"), *self.common("teacher"),
            ]
        )  # fmt: skip
        return self.held_out_mlm(self.folder("teacher"))

    def convert(self) -> dict:
        student = self.folder("convert")
        status = convert_cli.main(
            [
                "littlebird", "--from", "bert", "--source", str(self.folder("teacher")), "--output", str(student),
                "--block-size", str(self.size.block_size), "--pack-length", str(self.size.pack_length),
                "--seed", str(self.seed), "--overwrite",
            ]
        )  # fmt: skip
        if status != 0:
            raise SystemExit(f"posformers-convert littlebird failed (status {status}); its message is above")
        return self.held_out_mlm(student)

    def distill(self) -> dict:
        metrics = self.train_from(
            "convert", "distill", "distill",
            "--teacher_name_or_path", str(self.folder("teacher")),
            "--padding_insertion_max_length", str(self.size.padding_insertion_max_length),
            *self.pretraining_data(),
        )  # fmt: skip
        return {
            "distill_loss_before": first_evaluation(self.folder("distill"), "eval_loss"),
            "distill_loss": metrics["eval_loss"],
            "accuracy_vs_teacher": metrics["eval_accuracy_vs_teacher"],
            **self.held_out_mlm(self.folder("distill")),
        }

    def rss(self) -> dict:
        metrics = self.train_from(
            "distill", "rss", "rss",
            "--train_file", str(self.text["rss_train"]), "--validation_file", str(self.text["rss_validation"]),
            "--max_seq_length", str(self.size.rss_seq_length), "--rss_padding_insertion",
            "--padding_insertion_max_length", str(self.size.padding_insertion_max_length),
        )  # fmt: skip
        return self.span_selection_results("rss", metrics)

    def span_selection_results(self, stage: str, metrics: dict) -> dict:
        """An RSS stage's span-selection loss before and after training, and its exact match."""
        return {
            "span_loss_before": first_evaluation(self.folder(stage), "eval_loss"),
            "span_loss": metrics["eval_loss"],
            "exact_match": metrics["eval_exact_match"],
        }

    def prefix_experiment(self, stage: str, global_prefix_length: int) -> dict:
        """The RSS stage from the distilled student, trained and scored on question-first passages."""
        tokenizer = AutoTokenizer.from_pretrained(self.folder("distill"))
        train_articles, held_out = load_articles()
        files = {}
        for split, articles in (("train", train_articles), ("validation", held_out)):
            passages = question_first_passages(articles, tokenizer, self.question_first_length)
            files[split] = write_lines(self.data / f"question_first_{split}.txt", passages)
        metrics = self.train_from(
            "distill", "rss", stage,
            "--config_overrides", f"global_prefix_length={global_prefix_length}",
            "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
            "--max_seq_length", str(self.question_first_length),
        )  # fmt: skip
        return {
            "global_prefix_length": global_prefix_length,
            "passage_length": self.question_first_length,
            **self.span_selection_results(stage, metrics),
        }

    def rss_prefix_off(self) -> dict:
        return self.prefix_experiment("rss-prefix-off", 1)

    def rss_prefix_on(self) -> dict:
        return self.prefix_experiment("rss-prefix-on", self.size.block_size)

    def qa(self) -> dict:
        source = self.folder("rss")
        files = write_qa_files(self.data, AutoTokenizer.from_pretrained(source), self.size)
        metrics = run_qa.main(
            [
                "--model_name_or_path", str(source),
                "--train_file", files["train"]["path"], "--validation_file", files["eval"]["path"],
                "--max_seq_length", str(QA_WINDOW),
                "--do_train", "--do_eval", "--num_train_epochs", str(self.size.qa_epochs),
                "--learning_rate", str(self.size.qa_learning_rate),
                "--warmup_steps", "10", "--per_device_train_batch_size", str(self.size.qa_batch_size),
                "--per_device_eval_batch_size", str(self.size.qa_batch_size), "--logging_steps", "20",
                *self.common("qa"),
            ]
        )  # fmt: skip
        return {
            "exact_match": metrics["eval_exact_match"],
            "f1": metrics["eval_f1"],
            "eval_questions": files["eval"]["questions"],
            "train_questions": files["train"]["questions"],
            # one window per question: the whole document is read at once
            "train_windows": metrics["train_samples"],
            "longest_document_tokens": max(files["train"]["document_tokens"] + files["eval"]["document_tokens"]),
            "train_articles": files["train"]["articles"],
            "eval_articles": files["eval"]["articles"],
        }


# ---------------------------------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------------------------------

HELD_OUT_TEXT = "paragraphs of the held-out articles + SST-2 dev"
ROWS = {
    "teacher": ("BERT teacher, MLM", HELD_OUT_TEXT, "MLM loss {mlm_loss:.3f}, accuracy {mlm_accuracy:.1%}"),
    "convert": (
        "LittleBird converted from it",
        HELD_OUT_TEXT + " (the teacher's masks)",
        "MLM loss {mlm_loss:.3f}, accuracy {mlm_accuracy:.1%}",
    ),
    "distill": (
        "distilled with Padding Insertion",
        HELD_OUT_TEXT,
        "distillation loss {distill_loss_before:.3f} -> {distill_loss:.3f}, "
        "top-1 agreement with the teacher {accuracy_vs_teacher:.1%}; "
        "MLM loss {mlm_loss:.3f}, accuracy {mlm_accuracy:.1%}",
    ),
    "rss": (
        "Recurring Span Selection (Padding Insertion)",
        "paragraphs of the held-out articles",
        "span-selection loss {span_loss_before:.3f} -> {span_loss:.3f}, exact match {exact_match:.1%}",
    ),
    "rss-prefix-off": (
        "RSS on question-first passages, global_prefix_length {global_prefix_length} (off)",
        "question-first passages of {passage_length} tokens from the held-out articles",
        "span-selection loss {span_loss_before:.3f} -> {span_loss:.3f}, exact match {exact_match:.1%}",
    ),
    "rss-prefix-on": (
        "RSS on question-first passages, global_prefix_length {global_prefix_length} (one block)",
        "question-first passages of {passage_length} tokens from the held-out articles",
        "span-selection loss {span_loss_before:.3f} -> {span_loss:.3f}, exact match {exact_match:.1%}",
    ),
    "qa": (
        "posformers-qa, whole articles",
        "{eval_questions} questions about the held-out articles",
        "EM {exact_match:.1f}, F1 {f1:.1f} (trained on {train_questions} questions in {train_windows} windows; "
        "documents up to {longest_document_tokens} tokens)",
    ),
}


def summarize(output_dir: Path, records: dict, size_name: str, seed: int) -> dict:
    """summary.json and summary.md of the finished stages; returns the JSON."""
    summary = {
        "size": size_name,
        "seed": seed,
        "held_out_articles": list(HELD_OUT_ARTICLES),
        "stages": records,
        "seconds": round(sum(record["seconds"] for record in records.values()), 1),
        "cpu_seconds": round(sum(record.get("cpu_seconds", 0.0) for record in records.values()), 1),
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    lines = [
        f"# LittleBird recipe (size {size_name}, seed {seed})",
        "",
        "| stage | model | held-out data | held-out numbers | time (CPU time) |",
        "|---|---|---|---|---|",
    ]
    for stage, record in records.items():
        model, data, numbers = ROWS[stage]
        metrics = record["metrics"]
        lines.append(
            f"| {stage_number(stage)}. {stage} | {model.format(**metrics)} | {data.format(**metrics)} "
            f"| {numbers.format(**metrics)} | {record['seconds']:.0f} s ({record.get('cpu_seconds', 0):.0f} s) |"
        )
    lines += [
        "",
        f"Total: {summary['seconds']:.0f} s ({summary['cpu_seconds']:.0f} s CPU). "
        "A tiny model trained for minutes: a smoke test of the recipe, not a quality claim.",
    ]
    (output_dir / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return summary


# ---------------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------------


def prepare_output_dir(path: Path, overwrite: bool) -> None:
    """Write only into a folder the recipe made (or a new or empty one), unless the user says --overwrite_output_dir."""
    if path.is_file():
        raise SystemExit(f"error: --output_dir {path} is a file")
    if path.exists() and any(path.iterdir()) and not (path / MARKER).exists() and not overwrite:
        raise SystemExit(
            f"error: --output_dir {path} is not empty and was not made by this recipe; pass --overwrite_output_dir "
            "to write into it, or choose another folder"
        )
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).touch()
    if overwrite:  # every stage runs again: no record of an earlier run may stand for this one
        for record in path.glob(f"*/{STAGE_RECORD}"):
            record.unlink()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="posformers-littlebird-recipe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output_dir", type=Path, default=Path("demo_output/littlebird-recipe"))
    parser.add_argument("--size", choices=sorted(RECIPE_SIZES), default="full", help="preset of every size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="write into any folder; rerun all stages")
    parser.add_argument(
        "--global_prefix_experiment",
        action="store_true",
        help="also train the RSS stage on question-first passages with global_prefix_length 1 and block_size",
    )
    parser.add_argument(
        "--question_first_length",
        type=int,
        help="token length of the question-first passages (default: the RSS stage's --size length)",
    )
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.question_first_length is not None and args.question_first_length < 16:
        parser.error(f"--question_first_length must be at least 16, got {args.question_first_length}")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    """Run the recipe with `argv` (default: sys.argv[1:]); returns the summary to in-process callers."""
    args = parse_args(argv)
    # Small models: a second intra-op thread gains little, and on a busy machine it spin-waits (finetune/demo.py).
    torch.set_num_threads(args.threads)
    prepare_output_dir(args.output_dir, args.overwrite_output_dir)
    recipe = Recipe(
        args.output_dir, RECIPE_SIZES[args.size], args.seed, args.overwrite_output_dir, args.question_first_length
    )
    recipe.data.mkdir(exist_ok=True)
    recipe.text = write_pretraining_text(recipe.data, recipe.size)
    records: dict = {}
    this_run = {"size": args.size, "seed": args.seed}
    rerun = False  # once a stage runs, every stage after it runs too: it starts from the stages before it
    for stage in STAGES + (PREFIX_STAGES if args.global_prefix_experiment else ()):
        record_path = recipe.folder(stage) / STAGE_RECORD
        record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else None
        finished = record is not None and record.get("run") == this_run
        if stage in PREFIX_STAGES and finished:  # and with passages of the length asked for
            finished = record["metrics"]["passage_length"] == recipe.question_first_length
        if not rerun and finished:
            records[stage] = record
            print(f"== {stage}: finished in an earlier run, skipped ({record_path})", flush=True)
            continue
        rerun = True
        print(f"== {stage_number(stage)}. {stage} ==", flush=True)
        start, cpu_start = time.perf_counter(), time.process_time()
        metrics = getattr(recipe, stage.replace("-", "_"))()
        records[stage] = {
            "run": this_run,
            "seconds": round(time.perf_counter() - start, 1),
            # the wall time on a quiet machine with --threads 1 is about this; on a busy one `seconds` is larger
            "cpu_seconds": round(time.process_time() - cpu_start, 1),
            "metrics": metrics,
        }
        record_path.write_text(json.dumps(records[stage], indent=2) + "\n", encoding="utf-8")
        summarize(args.output_dir, records, args.size, args.seed)
    summary = summarize(args.output_dir, records, args.size, args.seed)
    print((args.output_dir / "summary.md").read_text(encoding="utf-8"), flush=True)
    return None if argv is None else summary


if __name__ == "__main__":
    main()
