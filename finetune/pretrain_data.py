"""The pre-training data pipeline of posformers-pretrain: raw text in, packed and masked batches out.

    corpus = load_corpus(data_args, seed)                      # {"train": ..., "validation": ...} of a "text" column
    tokenizer = train_tokenizer(corpus["train"], "wordpiece", vocab_size=32000)   # or a tokenizer folder
    train = pack_corpus(corpus["train"], tokenizer, max_seq_length=128, word_starts=True)
    collator = MaskingCollator(tokenizer, mlm_probability=0.15, whole_word_masking=True)

Text: plain-text files (one document per line; blank lines are skipped), .csv/.tsv/.json/.jsonl files with a text
column, or a datasets name. With `streaming` every split is an `IterableDataset`, read lazily: corpora larger than
memory work, and the held-out split is the first `streaming_validation_lines` documents when no validation file is
given (otherwise `validation_split_percentage` of the documents, chosen with the seed). Files are read in --encoding
(default UTF-8, a byte-order mark dropped: finetune/text_files.py); the first MiB of each is decoded before anything
else, so a file in another encoding stops the run at once with its file, line and the encoding to pass.

Packing (as BERT's and DeBERTa's pre-training data): documents are tokenized without special tokens, joined with the
separator token, and cut into chunks of `max_seq_length - 2` tokens, each framed as `[CLS] chunk [SEP]`; nothing is
padded except the last chunk of each map batch (1000 documents).

Masking: `mlm_probability` of the real tokens (whole words with `whole_word_masking`: a word is a pre-tokenizer word
of the fast tokenizer, i.e. WordPiece's `##` continuations or SentencePiece's pieces without `▁` stay with their
word) are selected; of those, `mask_replace_prob` become the mask token, `random_replace_prob` a random token, the
rest keep their token (BERT's 80/10/10 by default; RTD uses 100% mask, as the official DeBERTa-v3 code). The script's
training masks come from a generator seeded by (seed, epoch, the example's tokens): new masks every epoch, and a
resumed run masks exactly as the interrupted one would have (torch's global RNG would not do: the data loader collates
a batch ahead, before Trainer restores the RNG state of the checkpoint). Held-out examples carry a fixed seed
(`fix_masks`), so every evaluation of a run sees the same masks. Without a seed the collator draws from the global
RNG.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from datasets.exceptions import DatasetGenerationError
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, TrainerCallback

from .errors import ArgumentError, DataError
from .text_files import HEAD_BYTES, codec_name, file_codec, read_head

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = {".txt": "text", ".text": "text", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}
TOKENIZER_KINDS = ("wordpiece", "unigram")
PACK_BATCH_SIZE = 1000
MASK_SEED = "mask_seed"


@dataclasses.dataclass
class PretrainDataArguments:
    """Where the text comes from, how it is tokenized, packed and masked."""

    train_file: list[str] | None = dataclasses.field(
        default=None,
        metadata={"help": "Training text: .txt (one document per line) or .csv/.tsv/.json/.jsonl files (several ok)."},
    )
    validation_file: list[str] | None = dataclasses.field(
        default=None, metadata={"help": "Held-out text, same formats (default: a part of the training text)."}
    )
    dataset_name: str | None = dataclasses.field(default=None, metadata={"help": "A datasets name instead of files."})
    dataset_config_name: str | None = dataclasses.field(default=None, metadata={"help": "Its configuration."})
    text_column: str = dataclasses.field(
        default="text",
        metadata={
            "help": "Column holding the text in tables and datasets; several, comma-separated (question,sentence), "
            "are joined by a space into one document per row."
        },
    )
    validation_split_percentage: float = dataclasses.field(
        default=5.0, metadata={"help": "Percent of the documents held out when no validation file is given."}
    )
    streaming_validation_lines: int = dataclasses.field(
        default=1000, metadata={"help": "With --streaming and no validation file: hold out this many first documents."}
    )
    streaming: bool = dataclasses.field(
        default=False, metadata={"help": "Read the corpus lazily (for corpora larger than memory; needs --max_steps)."}
    )
    max_seq_length: int = dataclasses.field(default=128, metadata={"help": "Length of the packed sequences."})
    mlm_probability: float = dataclasses.field(default=0.15, metadata={"help": "Share of tokens selected to predict."})
    whole_word_masking: bool = dataclasses.field(
        default=False, metadata={"help": "Select whole words (all their sub-tokens) instead of single tokens."}
    )
    train_tokenizer: str | None = dataclasses.field(
        default=None,
        metadata={"help": "Train a tokenizer on the training text first.", "choices": [None, *TOKENIZER_KINDS]},
    )
    tokenizer_vocab_size: int = dataclasses.field(default=32000, metadata={"help": "Vocabulary size to train."})
    tokenizer_lowercase: bool = dataclasses.field(default=True, metadata={"help": "Lowercase in the trained one."})
    max_train_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N documents."})
    max_eval_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N held-out ones."})
    preprocessing_num_workers: int | None = dataclasses.field(default=None, metadata={"help": "Tokenizer processes."})

    def __post_init__(self):
        if not 0 < self.mlm_probability < 1:
            raise ArgumentError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.max_seq_length < 4:
            raise ArgumentError(f"--max_seq_length must be at least 4, got {self.max_seq_length}")
        if self.train_tokenizer is not None and self.train_tokenizer not in TOKENIZER_KINDS:
            raise ArgumentError(f"--train_tokenizer: unknown kind {self.train_tokenizer!r} (use {TOKENIZER_KINDS})")


# ---------------------------------------------------------------------------------------------------------------------
# Reading text
# ---------------------------------------------------------------------------------------------------------------------


def _builder(path: Path) -> tuple[str, dict]:
    """The datasets builder for a file and its options; DataError for a missing file or an unknown format."""
    if not path.is_file():
        raise DataError("no such file", path=path)
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise DataError(f"unknown text format {suffix!r} (use {', '.join(sorted(TEXT_SUFFIXES))})", path=path)
    options = {}
    if suffix == ".tsv":  # GLUE-style TSVs carry quotes inside the text: no CSV quoting
        options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
    return TEXT_SUFFIXES[suffix], options


def _check_has_text(path: Path, encoding: str | None = None) -> str:
    """Refuse an empty file, or one not in `encoding` (its first MiB is decoded: finetune/text_files.py), early,
    before any (lazy) loading: one non-blank line is enough. Returns the codec to read the file with."""
    if not read_head(path, encoding).strip():
        with path.open(encoding=file_codec(path, encoding), errors="replace") as lines:
            if not any(line.strip() for line in lines):
                raise DataError("no text: the file is empty or holds only blank lines", path=path)
    return file_codec(path, encoding)


def _load_files(files: list[str], text_column: str, streaming: bool, cache_dir, encoding: str | None = None):
    """One split from files of the same format and `encoding` -> a Dataset (or IterableDataset) with a "text"
    column."""
    paths = [Path(file) for file in files]
    builders = [_builder(path) for path in paths]
    codecs_used = {_check_has_text(path, encoding): path for path in paths}
    if len({(builder, path.suffix.lower()) for (builder, _), path in zip(builders, paths)}) > 1:
        raise DataError(f"mixed formats in one split: {', '.join(files)}")
    if len(codecs_used) > 1:  # a byte-order mark in some files only: datasets reads a split in one encoding
        detail = ", ".join(f"{path.name}: {codec}" for codec, path in codecs_used.items())
        raise DataError(f"files of one split in different encodings ({detail}): save them in one", path=files[0])
    builder, options = builders[0]
    codec = next(iter(codecs_used))
    # datasets' json reader drops a UTF-8 byte-order mark itself, and decodes (per batch of lines) only other codecs
    options = {**options, "encoding": "utf-8" if builder == "json" and codec == "utf-8-sig" else codec}
    try:
        split = datasets.load_dataset(
            builder,
            data_files=[str(path) for path in paths],
            split="train",
            streaming=streaming,
            cache_dir=cache_dir,
            **options,
        )
    except DatasetGenerationError as error:  # a truncated or malformed file; datasets says which parser failed
        cause = error.__cause__ or error.__context__ or error
        if isinstance(cause, UnicodeDecodeError):  # past the first MiB that _check_has_text decoded
            raise DataError(
                f"not {codec_name(codec)} text after its first {HEAD_BYTES >> 20} MiB ({cause.reason}): pass its "
                "encoding with --encoding",
                path=", ".join(files),
            ) from error
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise DataError(
            f"not a readable {paths[0].suffix.lstrip('.').lower()} file (truncated or malformed?): {reason}",
            path=", ".join(files),
        ) from error
    return _select_text(split, "text" if builder == "text" else text_column, files[0])


def _select_text(split, column: str, source: str):
    """Keep only the text column, renamed "text", without blank documents. Several columns ("question,sentence", as
    posformers-glue takes them) become one document per row: their texts joined by a space."""
    columns = [name.strip() for name in column.split(",") if name.strip()] or [column]
    names = split.column_names
    missing = [name for name in columns if names is not None and name not in names]
    if missing:
        raise DataError(
            f"no text column (have: {', '.join(names)}); name it with --text_column",
            path=source,
            column=", ".join(missing),
        )
    if len(columns) > 1:

        def joined(batch):
            rows = zip(*(batch[name] for name in columns))
            return {"text": [" ".join(str(text).strip() for text in row if text and str(text).strip()) for row in rows]}

        # select_columns also where a streamed file's columns are not known before it is read
        split = split.map(joined, batched=True).select_columns(["text"])
        column, names = "text", ["text"]
    if column != "text":
        split = split.rename_column(column, "text")
    drop = [name for name in (names or []) if name not in (column, "text")]
    if drop:
        split = split.remove_columns(drop)
    return split.filter(lambda batch: [bool(text and text.strip()) for text in batch["text"]], batched=True)


def _hold_out(train, data_args: PretrainDataArguments, seed: int) -> dict:
    """Split a held-out part off the training documents (the first ones when streaming)."""
    if data_args.streaming:
        count = data_args.streaming_validation_lines
        return {"train": train.skip(count), "validation": train.take(count)}
    fraction = data_args.validation_split_percentage / 100
    if not 0 < fraction < 1 or len(train) < 2:
        raise DataError(
            "cannot hold out a validation part: give --validation_file or a larger corpus "
            f"(have {len(train)} document(s), --validation_split_percentage "
            f"{data_args.validation_split_percentage})"
        )
    parts = train.train_test_split(test_size=fraction, seed=seed, shuffle=True)
    return {"train": parts["train"], "validation": parts["test"]}


def _first(split, count: int | None):
    if count is None:
        return split
    return (
        split.take(count)
        if isinstance(split, datasets.IterableDataset)
        else split.select(range(min(count, len(split))))
    )


def load_corpus(
    data_args: PretrainDataArguments, seed: int, cache_dir=None, need_validation: bool = True, encoding=None
) -> dict:
    """{"train": ..., "validation": ...}: Datasets (IterableDatasets when streaming) with one "text" column; files
    are read in `encoding` (--encoding, default UTF-8)."""
    if data_args.train_file:
        corpus = {
            "train": _load_files(data_args.train_file, data_args.text_column, data_args.streaming, cache_dir, encoding)
        }
        if data_args.validation_file:
            corpus["validation"] = _load_files(
                data_args.validation_file, data_args.text_column, data_args.streaming, cache_dir, encoding
            )
    elif data_args.dataset_name:
        loaded = datasets.load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, streaming=data_args.streaming, cache_dir=cache_dir
        )
        if "train" not in loaded:
            raise DataError(f"{data_args.dataset_name} has no train split (have: {', '.join(loaded)})")
        corpus = {
            split: _select_text(loaded[split], data_args.text_column, data_args.dataset_name)
            for split in ("train", "validation")
            if split in loaded
        }
    else:
        raise DataError("no text: give --train_file or --dataset_name")
    if not data_args.streaming and len(corpus["train"]) == 0:
        raise DataError(
            "no text: the training corpus has no non-blank document",
            path=", ".join(data_args.train_file or [data_args.dataset_name]),
        )
    if need_validation and "validation" not in corpus:
        corpus = _hold_out(corpus["train"], data_args, seed)
    corpus["train"] = _first(corpus["train"], data_args.max_train_samples)
    if "validation" in corpus:
        corpus["validation"] = _first(corpus["validation"], data_args.max_eval_samples)
    return corpus


# ---------------------------------------------------------------------------------------------------------------------
# Training a tokenizer
# ---------------------------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def _texts(split, batch_size: int = 1000) -> Iterator[list[str]]:
    batch = []
    for example in split:
        batch.append(example["text"])
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def _tokenizer_model(
    kind: str, vocab_size: int, lowercase: bool, first_tokens: list[str] | None = None
) -> tuple[Tokenizer, trainers.Trainer]:
    """An untrained tokenizers pipeline of `kind` and its trainer (special tokens first, [PAD] = id 0; then
    `first_tokens`, given to the trainer as special tokens too)."""
    special = list(SPECIAL_TOKENS.values()) + list(first_tokens or [])
    if kind == "wordpiece":  # BERT's pipeline
        tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIAL_TOKENS["unk_token"]))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special)
    else:  # SentencePiece's Unigram, as DeBERTa-v3's spm.model: words keep their leading "▁"
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=special, unk_token=SPECIAL_TOKENS["unk_token"]
        )
    return tokenizer, trainer


def train_tokenizer(split, kind: str, vocab_size: int, lowercase: bool = True) -> PreTrainedTokenizerFast:
    """Train a `kind` ("wordpiece" or "unigram") tokenizer on the "text" column of `split`; the same text and options
    give the same tokenizer, ids and all (see _train_deterministically)."""
    tokenizer = _train_deterministically(split, kind, vocab_size, lowercase)
    cls, sep = SPECIAL_TOKENS["cls_token"], SPECIAL_TOKENS["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )
    logger.info("trained a %s tokenizer with %d tokens", kind, tokenizer.get_vocab_size())
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


UNIGRAM_SCORE_DECIMALS = 6  # what the trainer's scores keep (see _canonical_unigram)
UNIGRAM_PENALTY = 1e-4  # the score step between the characters the Unigram trainer adds (see _canonical_unigram)


def _train_deterministically(split, kind: str, vocab_size: int, lowercase: bool) -> Tokenizer:
    """The trained pipeline. The tokenizers trainers count words in hash maps, seeded at random in every process (and
    for every map), so their output depends on iteration order where it should not:

    * WordPiece (BPE's trainer) numbers the continuation characters ("##x") in the order it meets them, and among
      merges of equal count it takes the pair of lowest ids first: the vocabulary changes with that order near its
      end, and the ids everywhere. A first pass (no merges: cheap) finds the continuation characters; the second pass
      is given them, sorted, as special tokens, which numbers them first and in a fixed order (they then become plain
      tokens again). The text is read twice.
    * Unigram sums its EM statistics in word order (scores differ in their last digits between runs), orders pieces
      of equal score by that order, and gives the characters it must keep but had pruned scores one step apart in
      hash order. _canonical_unigram fixes each.

    What remains: the Unigram trainer's pruning compares those sums; where two pieces tie to the last digits, which
    one it keeps could still differ between runs (not seen on the corpora tested)."""
    if kind == "wordpiece":
        alphabet, trainer = _tokenizer_model(kind, 1, lowercase)
        alphabet.train_from_iterator(_texts(split), trainer=trainer)
        continuations = sorted(token for token in alphabet.get_vocab() if token.startswith("##"))
        tokenizer, trainer = _tokenizer_model(kind, vocab_size, lowercase, continuations)
        tokenizer.train_from_iterator(_texts(split), trainer=trainer)
        state = json.loads(tokenizer.to_str())
        state["added_tokens"] = [token for token in state["added_tokens"] if token["content"] not in continuations]
        return Tokenizer.from_str(json.dumps(state))
    tokenizer, trainer = _tokenizer_model(kind, vocab_size, lowercase)
    tokenizer.train_from_iterator(_texts(split), trainer=trainer)
    return _canonical_unigram(tokenizer)


def _canonical_unigram(tokenizer: Tokenizer) -> Tokenizer:
    """A trained Unigram pipeline with its scores and ids independent of the trainer's hash order: the characters
    the trainer added back get their scores (the lowest score, plus UNIGRAM_PENALTY for each one before) in
    code-point order; scores are rounded to UNIGRAM_SCORE_DECIMALS (the last digits of the trainer's sums vary, and
    1e-6 in a log-probability changes no segmentation worth the name); ids: the special tokens, then the pieces by
    decreasing score, equal scores in code-point order."""
    state = json.loads(tokenizer.to_str())
    model = state["model"]
    special = set(SPECIAL_TOKENS.values())
    first = [entry for entry in model["vocab"] if entry[0] in special]
    pieces = {piece: score for piece, score in model["vocab"] if piece not in special}
    lowest = min(pieces.values())
    # The added characters sit on the steps 0, 1, ..., n - 1 above the lowest score; a piece of the trainer's own
    # that happens to lie on a step further up is left alone.
    on_steps = {}
    for piece, score in pieces.items():
        step = (score - lowest) / UNIGRAM_PENALTY
        if len(piece) == 1 and abs(step - round(step)) < 1e-6:
            on_steps[piece] = round(step)
    added = sorted(piece for piece, step in on_steps.items() if step < len(on_steps))
    for piece, step in zip(added, sorted(on_steps[piece] for piece in added)):
        pieces[piece] = lowest + step * UNIGRAM_PENALTY
    ordered = sorted(
        ((piece, round(score, UNIGRAM_SCORE_DECIMALS)) for piece, score in pieces.items()),
        key=lambda entry: (-entry[1], entry[0]),
    )
    model["vocab"] = [*first, *map(list, ordered)]
    model["unk_id"] = next(i for i, (piece, _) in enumerate(model["vocab"]) if piece == SPECIAL_TOKENS["unk_token"])
    return Tokenizer.from_str(json.dumps(state))


# ---------------------------------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------------------------------


def frame_tokens(tokenizer) -> tuple[int, int]:
    """(start, separator) ids that frame a packed sequence: [CLS]/[SEP], or <s>/</s> for RoBERTa-style vocabularies."""
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if start is None or sep is None:
        raise ArgumentError("the tokenizer has no [CLS]/<s> and [SEP]/</s> tokens to frame packed sequences")
    return start, sep


def _word_starts(encoding, length: int) -> list[int]:
    """1 where a token begins a word (a new pre-tokenizer word), 0 where it continues the previous one."""
    words = encoding.word_ids if encoding is not None else None
    if words is None:
        return [1] * length
    return [int(i == 0 or words[i] is None or words[i] != words[i - 1]) for i in range(length)]


def pack_batch(texts: list[str], tokenizer, max_seq_length: int, word_starts: bool) -> dict[str, list[list[int]]]:
    """Documents -> chunks `[CLS] tokens [SEP]` of at most `max_seq_length` ids (documents joined by [SEP]).

    Returns {"input_ids": [[...], ...]} and, with `word_starts`, a parallel "word_starts" column of 0/1 flags.
    """
    start, sep = frame_tokens(tokenizer)
    # Whole documents, cut into chunks below: transformers' "longer than the maximum sequence length" warning is void
    encoded = tokenizer(
        texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False, verbose=False
    )
    stream, starts = [], []
    for index, ids in enumerate(encoded["input_ids"]):
        if not ids:
            continue
        if stream:
            stream.append(sep)
            starts.append(1)
        stream.extend(ids)
        if word_starts:
            starts.extend(_word_starts(encoded.encodings[index] if encoded.encodings else None, len(ids)))
    size = max_seq_length - 2
    chunks = {"input_ids": [[start, *stream[i : i + size], sep] for i in range(0, len(stream), size)]}
    if word_starts:
        # a word cut by a chunk boundary becomes two words: each chunk starts one
        chunks["word_starts"] = [[1, 1, *starts[i + 1 : i + size], 1] for i in range(0, len(stream), size)]
    return chunks


def pack_corpus(split, tokenizer, max_seq_length: int, word_starts: bool = False, num_proc: int | None = None):
    """A "text" split -> packed sequences (columns input_ids and, with `word_starts`, word_starts)."""
    if word_starts and not getattr(tokenizer, "is_fast", False):
        raise ArgumentError("--whole_word_masking needs a fast tokenizer (tokenizer.json) to find word boundaries")

    def pack(batch):
        return pack_batch(batch["text"], tokenizer, max_seq_length, word_starts)

    options = {"batched": True, "batch_size": PACK_BATCH_SIZE, "remove_columns": ["text"]}
    if isinstance(split, datasets.Dataset):
        options["num_proc"] = num_proc
    return split.map(pack, **options)


# ---------------------------------------------------------------------------------------------------------------------
# Masking
# ---------------------------------------------------------------------------------------------------------------------


def _example_generator(input_ids: list[int], seed: int) -> torch.Generator:
    """A generator seeded by the example's tokens: the same example is always masked the same way."""
    key = zlib.crc32(torch.tensor(input_ids, dtype=torch.int64).numpy().tobytes())
    return torch.Generator().manual_seed(seed * 1_000_003 + key)


def example_generator(feature: dict, seed: int | None, epoch: int = 0, offset: int = 0) -> torch.Generator | None:
    """The random source of one example's draws (masks, questions, inserted padding), seeded with its tokens and:
    its "mask_seed" (a held-out example, see `fix_masks`: the same draws at every evaluation), else `seed` and
    `epoch` (a resumed run draws as the interrupted one did). None without either: torch's global RNG. `offset` keeps
    the draws of another purpose (Padding Insertion's) apart from the masks'."""
    if feature.get(MASK_SEED) is not None:
        return _example_generator(list(feature["input_ids"]), feature[MASK_SEED] + offset)
    if seed is not None:
        return _example_generator(list(feature["input_ids"]), seed * 65_537 + epoch + offset)
    return None


def round_up(length: int, multiple: int | None) -> int:
    """`length` rounded up to a multiple of `multiple` (pad_to_multiple_of; None: as it is)."""
    return -(-length // multiple) * multiple if multiple else length


def select_positions(
    candidates: torch.Tensor, word_starts: torch.Tensor | None, probability: float, generator=None
) -> torch.Tensor:
    """Positions to predict in one sequence. candidates, word_starts: (L,) bool; returns (L,) bool.

    Each candidate token (each candidate word, when `word_starts` is given) is chosen with `probability`; a sequence
    with candidates but no choice gets one, so no batch is left without a target (its loss would be NaN).
    """
    # the unit drawn for each token: itself, or its word (index = number of word starts up to it, minus one)
    unit = torch.arange(candidates.numel()) if word_starts is None else torch.cumsum(word_starts.long(), dim=0) - 1
    draws = torch.rand(int(unit.max()) + 1 if unit.numel() else 0, generator=generator) < probability
    selected = draws[unit] & candidates
    if candidates.any() and not selected.any():
        pick = candidates.nonzero().view(-1)
        chosen = pick[torch.randint(pick.numel(), (1,), generator=generator)]
        selected = (unit == unit[chosen]) & candidates
    return selected


class MaskingCollator:
    """Pads packed sequences and masks them for MLM. Features: dicts with input_ids (and word_starts).

    Batch: input_ids, attention_mask (B, L) and labels (B, L): the original id at selected positions, -100 elsewhere.
    Examples with a "mask_seed" (see `fix_masks`) are masked with a generator seeded by it and their tokens; the
    others with one seeded by `seed`, `epoch` (set by `MaskEpochCallback`) and their tokens, or, when `seed` is None,
    from torch's global RNG.
    """

    def __init__(
        self,
        tokenizer,
        mlm_probability: float = 0.15,
        whole_word_masking: bool = False,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        pad_to_multiple_of: int | None = None,
        seed: int | None = None,
    ):
        if tokenizer.mask_token_id is None:
            raise ArgumentError("masked-language-model pre-training needs a tokenizer with a mask token")
        if mask_replace_prob + random_replace_prob > 1:
            raise ArgumentError("mask_replace_prob + random_replace_prob must be at most 1")
        self.tokenizer = tokenizer
        self.mlm_probability, self.whole_word_masking = mlm_probability, whole_word_masking
        self.mask_replace_prob, self.random_replace_prob = mask_replace_prob, random_replace_prob
        self.pad_to_multiple_of, self.seed, self.epoch = pad_to_multiple_of, seed, 0
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)))
        self.vocab_size = len(tokenizer)

    def _pad(self, features: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """-> input_ids (B, L), attention_mask (B, L), word_starts (B, L) or None."""
        length = round_up(max(len(feature["input_ids"]) for feature in features), self.pad_to_multiple_of)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(features), length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(features), length), dtype=torch.long)
        with_words = self.whole_word_masking and "word_starts" in features[0]
        word_starts = torch.ones((len(features), length), dtype=torch.bool) if with_words else None
        for row, feature in enumerate(features):
            ids = feature["input_ids"]
            input_ids[row, : len(ids)] = torch.as_tensor(ids)
            attention_mask[row, : len(ids)] = 1
            if with_words:
                word_starts[row, : len(ids)] = torch.as_tensor(feature["word_starts"], dtype=torch.bool)
        return input_ids, attention_mask, word_starts

    def _replace(self, input_ids: torch.Tensor, selected: torch.Tensor, generator=None) -> torch.Tensor:
        """Selected positions of one sequence (L,) -> [MASK] / a random token / unchanged (80/10/10 by default)."""
        draw = torch.rand(input_ids.shape, generator=generator)
        to_mask = selected & (draw < self.mask_replace_prob)
        to_random = selected & ~to_mask & (draw < self.mask_replace_prob + self.random_replace_prob)
        random_ids = torch.randint(self.vocab_size, input_ids.shape, generator=generator)
        masked = torch.where(to_mask, torch.full_like(input_ids, self.tokenizer.mask_token_id), input_ids)
        return torch.where(to_random, random_ids, masked)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask, word_starts = self._pad(features)
        candidates = attention_mask.bool() & ~torch.isin(input_ids, self.special_ids)
        labels = torch.full_like(input_ids, -100)
        for row, feature in enumerate(features):
            generator = example_generator(feature, self.seed, self.epoch)
            starts = word_starts[row] if word_starts is not None else None
            selected = select_positions(candidates[row], starts, self.mlm_probability, generator)
            labels[row][selected] = input_ids[row][selected]
            input_ids[row] = self._replace(input_ids[row], selected, generator)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class MaskEpochCallback(TrainerCallback):
    """Tells a seeded MaskingCollator the epoch, so that each epoch masks every example anew."""

    def __init__(self, collator: MaskingCollator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        # state.epoch is fractional when resuming mid-epoch; the small margin guards float sums like 0.999999
        self.collator.epoch = math.floor((state.epoch or 0) + 1e-6)


def fix_masks(split, seed: int):
    """Give every example of a held-out split a mask seed: MaskingCollator then masks it the same way each time."""
    return split.map(lambda batch: {MASK_SEED: [seed] * len(batch["input_ids"])}, batched=True)


# ---------------------------------------------------------------------------------------------------------------------
# Held-out metrics
# ---------------------------------------------------------------------------------------------------------------------


def mlm_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-example sums for token-weighted metrics. logits (B, L, V), labels (B, L) with -100 where not predicted.

    Returns predictions (B, L) (argmax), the summed cross-entropy (B,) and the number of predicted tokens (B,).
    """
    masked = labels != -100
    losses = F.cross_entropy(logits.float().transpose(1, 2), labels.clamp(min=0), reduction="none")  # (B, L)
    return logits.argmax(dim=-1), (losses * masked).sum(dim=1), masked.sum(dim=1)


def mlm_metrics(predictions, labels, loss_sums, counts, prefix: str = "") -> dict[str, float]:
    """Token-weighted MLM loss, perplexity and accuracy from `mlm_sums` gathered over the held-out split."""
    masked = labels != -100
    loss = float(np.sum(loss_sums) / max(int(np.sum(counts)), 1))
    return {
        f"{prefix}loss": loss,
        f"{prefix}perplexity": float(np.exp(loss)),
        f"{prefix}accuracy": float(np.mean(predictions[masked] == labels[masked])) if masked.any() else float("nan"),
    }
