"""Recurring Span Selection pre-training (`--objective rss`): Splinter's objective (Ram et al. 2021), which the
LittleBird paper uses after distillation, for RoFormer, DeBERTa and LittleBird.

In each passage (a packed `[CLS] ... [SEP]` sequence of posformers-pretrain, which may join short documents; spans
never cross a [SEP]), n-grams of whole words that occur at least twice are grouped; in each chosen group one
occurrence (drawn at random) is kept as the answer and every other occurrence is replaced by ONE `[QUESTION]` token,
so the sequence gets shorter. A question-aware span-selection head (`XForQuestionSpanSelection`, Splinter's QASS)
learns to point each `[QUESTION]` at the first and last token of the kept occurrence.

    rss_args.check()
    question_id = add_question_token(tokenizer)           # "[QUESTION]", an additional special token
    passages = annotate_spans(pack_corpus(split, tokenizer, 512, word_starts=True), tokenizer, 10)
    collator = RecurringSpanCollator(tokenizer, question_id, max_questions=30, question_rate=0.15, seed=42)
    batch = collator(features)   # input_ids, attention_mask, token_type_ids (B, L);
                                 # question_positions, start_positions, end_positions (B, Q), -1 where absent

The recipe, Splinter's where it is known (its paper and pre-training code), [recon] where posformers had to choose:

- A span is an n-gram of whole words of at most `rss_max_span_length` tokens (10 [recon: Splinter's
  --max_span_length]) that starts at a word start and ends at a word end, contains no special token and no
  punctuation word (a word without a letter or digit), and is not made of stopwords only (`STOPWORDS`, a short
  English list [recon: posformers' own list of function words; Splinter's code has a longer, NLTK-like one]).
  Single content words count.
- Spans with the same token ids form a group when they occur at least twice. Groups are chosen greedily, longest
  first (ties: the earliest first occurrence), keeping only occurrences that overlap no occurrence already chosen;
  a group keeps its place only if two or more occurrences survive (Splinter's procedure).
- Per passage, at most min(`rss_max_questions`, max(1, round(`rss_question_rate` * length))) occurrences become
  `[QUESTION]` (30 and 0.15 [recon: Splinter's --max_recurring_predictions_per_seq 30 at 512 tokens and its
  masked_lm_prob 0.15]). Groups are visited in a random order; the last one visited may lose some of its questions
  to the cap, never its kept occurrence.
- The random draws (group order, kept occurrence) come from a generator seeded by (seed, epoch, the passage's tokens)
  as the MLM masks (finetune/pretrain_data.py): new draws every epoch, the same ones in a resumed run, and held-out
  passages (`fix_masks`) masked the same way at every evaluation.
- Passages in which no group is found are left out; a corpus with none at all is refused.

The loss is the head's: the mean over the questions of (CE(start) + CE(end)) / 2. Held-out metrics: `eval_loss` and
`eval_exact_match` (the share of questions whose argmax start and argmax end are both the kept occurrence's).

With Padding Insertion (`--rss_padding_insertion`, LittleBird only) the batch goes through PaddingInsertionCollator
with the `--padding_insertion_*` options of distillation; question and answer indices move with the inserted pads.
"""

from __future__ import annotations

import dataclasses
import logging

import datasets
import numpy as np
import torch

from .errors import ArgumentError, DataError
from .loading import hub_kwargs
from .pretrain_data import example_generator, round_up
from .pretrain_distill import PaddingInsertionCollator

logger = logging.getLogger(__name__)

QUESTION_TOKEN = "[QUESTION]"
SPANS = "recurring_spans"  # dataset column: [start, end, group] per occurrence (token indices, end inclusive)
NO_QUESTION = -1
# Batch keys that hold token positions of the passage (moved by Padding Insertion).
POSITION_KEYS = ("question_positions", "start_positions", "end_positions")
STUDENT_KEYS = ("input_ids", "attention_mask", "token_type_ids", *POSITION_KEYS)

# Token kinds for the span finder.
CONTENT, STOPWORD, BLOCKED = 0, 1, 2

# English function words [recon: posformers' list; a span made of these only is not a span].
STOPWORDS = frozenset(
    """
    a an the this that these those some any each every all both either neither no not nor only own same such
    i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself she her hers
    herself it its itself they them their theirs themselves what which who whom whose
    am is are was were be been being have has had having do does did doing will would shall should can could may
    might must
    and but or if then else than because as until while so too very just also again further once
    of at by for with about against between into through during before after above below to from up down in out on
    off over under here there when where why how more most other few s t don
    """.split()  # noqa: SIM905 (a word list reads better as text)
)


@dataclasses.dataclass
class RSSArguments:
    """Recurring Span Selection (`--objective rss`, or after distillation with `--rss_after_distill_steps`)."""

    rss_max_span_length: int = dataclasses.field(
        default=10, metadata={"help": "Longest recurring span, in tokens [recon: Splinter's 10]."}
    )
    rss_max_questions: int = dataclasses.field(
        default=30, metadata={"help": "Most [QUESTION] tokens per passage [recon: Splinter's 30 per 512 tokens]."}
    )
    rss_question_rate: float = dataclasses.field(
        default=0.15,
        metadata={"help": "At most this share of a passage's tokens become questions [recon: Splinter's 0.15]."},
    )
    rss_after_distill_steps: int = dataclasses.field(
        default=0,
        metadata={
            "help": "With --objective distill: distil for the first N steps, then train RSS for the rest of "
            "--max_steps (0 = distillation only)."
        },
    )
    rss_padding_insertion: bool = dataclasses.field(
        default=False,
        metadata={"help": "LittleBird: insert padding into RSS batches (the --padding_insertion_* options)."},
    )

    def check(self) -> None:
        """Raise ArgumentError naming the field of any impossible value."""
        rules = {
            "rss_max_span_length": ("must be >= 1", self.rss_max_span_length >= 1),
            "rss_max_questions": ("must be >= 1", self.rss_max_questions >= 1),
            "rss_question_rate": ("must be in (0, 1]", 0 < self.rss_question_rate <= 1),
            "rss_after_distill_steps": ("must be >= 0", self.rss_after_distill_steps >= 0),
        }
        for name, (rule, holds) in rules.items():
            if not holds:
                raise ArgumentError(f"--{name} {rule}, got {getattr(self, name)}")


# ---------------------------------------------------------------------------------------------------------------------
# The [QUESTION] token and the word kinds
# ---------------------------------------------------------------------------------------------------------------------


def add_question_token(tokenizer) -> int:
    """Add "[QUESTION]" to the tokenizer as an additional special token (once); return its id."""
    if QUESTION_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [QUESTION_TOKEN]})
    return tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)


def piece_texts(tokenizer) -> list[str | None]:
    """Per token id: its text without word-piece markers ("##", "▁"), lowercased; None for special tokens."""
    special = set(tokenizer.all_special_ids)
    texts: list[str | None] = [""] * len(tokenizer)
    for token, index in tokenizer.get_vocab().items():
        if index >= len(texts):
            texts.extend([""] * (index + 1 - len(texts)))
        texts[index] = None if index in special else token.removeprefix("##").replace("▁", "").lower()
    return texts


def token_kinds(input_ids: list[int], word_starts: list[int], texts: list[str | None]) -> list[int]:
    """Per token, its word's kind: BLOCKED (a special token, or a word without a letter or digit), STOPWORD or
    CONTENT. `texts` comes from `piece_texts`."""
    kinds = [CONTENT] * len(input_ids)
    start = 0
    for end in range(1, len(input_ids) + 1):
        if end < len(input_ids) and not word_starts[end]:
            continue
        pieces = [texts[token] if token < len(texts) else "" for token in input_ids[start:end]]
        if any(piece is None for piece in pieces):
            kind = BLOCKED
        else:
            word = "".join(pieces)
            if not any(char.isalnum() for char in word):
                kind = BLOCKED
            else:
                kind = STOPWORD if word.strip("'’") in STOPWORDS else CONTENT
        kinds[start:end] = [kind] * (end - start)
        start = end
    return kinds


# ---------------------------------------------------------------------------------------------------------------------
# Finding and masking recurring spans
# ---------------------------------------------------------------------------------------------------------------------


def find_recurring_spans(
    input_ids: list[int], word_starts: list[int], kinds: list[int], max_span_length: int = 10
) -> list[list[tuple[int, int]]]:
    """The groups of recurring spans of one passage, chosen as the module docstring says.

    input_ids, word_starts (1 where a token begins a word), kinds (`token_kinds`): (L,) lists. Returns the groups
    ordered by their first occurrence, each a list of (first, last) token indices (inclusive) in passage order;
    the occurrences of all groups are disjoint.
    """
    length = len(input_ids)
    occurrences: dict[tuple[int, ...], list[int]] = {}
    for start in range(length):
        if not word_starts[start]:
            continue
        has_content = False
        for end in range(start + 1, min(start + max_span_length, length) + 1):  # end: exclusive
            if kinds[end - 1] == BLOCKED:
                break
            has_content |= kinds[end - 1] == CONTENT
            if has_content and (end == length or word_starts[end]):
                occurrences.setdefault(tuple(input_ids[start:end]), []).append(start)
    recurring = [(len(key), starts) for key, starts in occurrences.items() if len(starts) >= 2]
    recurring.sort(key=lambda item: (-item[0], item[1][0]))
    taken = [False] * length
    groups = []
    for size, starts in recurring:
        kept: list[int] = []
        for start in starts:  # ascending
            if not any(taken[start : start + size]) and (not kept or start >= kept[-1] + size):
                kept.append(start)
        if len(kept) >= 2:
            for start in kept:
                taken[start : start + size] = [True] * size
            groups.append([(start, start + size - 1) for start in kept])
    return sorted(groups)


def question_budget(length: int, max_questions: int, question_rate: float) -> int:
    """How many occurrences of a `length`-token passage may become [QUESTION]."""
    return min(max_questions, max(1, round(question_rate * length)))


def mask_recurring_spans(
    input_ids: list[int],
    groups: list[list[tuple[int, int]]],
    question_token_id: int,
    max_questions: int,
    generator: torch.Generator | None = None,
) -> dict[str, list[int]]:
    """Replace recurring spans by [QUESTION] tokens in one passage.

    groups: `find_recurring_spans`' answer. Groups are visited in a random order; in each, one occurrence (drawn at
    random) is kept and the others, while fewer than `max_questions` have been replaced, become one [QUESTION] each.
    Returns input_ids (the shorter passage) and, per question in passage order, question_positions (where its
    [QUESTION] is) and start_positions / end_positions (the kept occurrence's first and last token), all indices of
    the new passage.
    """
    replaced: dict[int, tuple[int, tuple[int, int]]] = {}  # first token -> (last token, the answer's span)
    for group_index in torch.randperm(len(groups), generator=generator).tolist():
        if len(replaced) >= max_questions:
            break
        group = groups[group_index]
        keep = int(torch.randint(len(group), (), generator=generator))
        for index, (first, last) in enumerate(group):
            if index != keep and len(replaced) < max_questions:
                replaced[first] = (last, group[keep])
    new_ids: list[int] = []
    new_position = [NO_QUESTION] * len(input_ids)
    questions: list[tuple[int, tuple[int, int]]] = []
    position = 0
    while position < len(input_ids):
        if position in replaced:
            last, answer = replaced[position]
            questions.append((len(new_ids), answer))
            new_ids.append(question_token_id)
            position = last + 1
        else:
            new_position[position] = len(new_ids)
            new_ids.append(input_ids[position])
            position += 1
    return {
        "input_ids": new_ids,
        "question_positions": [question for question, _ in questions],
        "start_positions": [new_position[first] for _, (first, _) in questions],
        "end_positions": [new_position[last] for _, (_, last) in questions],
    }


def groups_of(spans: list[list[int]]) -> list[list[tuple[int, int]]]:
    """The dataset column ([start, end, group] rows) -> groups of (start, end), as `find_recurring_spans` gave them."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for start, end, group in spans:
        groups.setdefault(group, []).append((start, end))
    return [groups[group] for group in sorted(groups)]


def annotate_spans(split, tokenizer, max_span_length: int, num_proc: int | None = None, name: str = "training"):
    """Packed passages with word_starts -> the same with a `recurring_spans` column, passages without any left out.

    DataError when no passage of the split has a recurring span.
    """
    texts = piece_texts(tokenizer)

    def annotate(batch):
        spans = []
        for input_ids, word_starts in zip(batch["input_ids"], batch["word_starts"]):
            groups = find_recurring_spans(
                input_ids, word_starts, token_kinds(input_ids, word_starts, texts), max_span_length
            )
            spans.append([[first, last, index] for index, group in enumerate(groups) for first, last in group])
        return {SPANS: spans}

    features = split.features.copy() if getattr(split, "features", None) else None
    options = {"batched": True, "remove_columns": ["word_starts"]}
    if features is not None:
        del features["word_starts"]
        features[SPANS] = datasets.List(datasets.List(datasets.Value("int32")))
        options["features"] = features
    if isinstance(split, datasets.Dataset):
        options["num_proc"] = num_proc
    annotated = split.map(annotate, **options).filter(lambda batch: [bool(s) for s in batch[SPANS]], batched=True)
    if isinstance(annotated, datasets.Dataset) and len(annotated) == 0:
        raise DataError(
            f"--objective rss: no recurring span (a non-stopword n-gram of whole words occurring twice in a passage) "
            f"in any of the {len(split)} {name} passage(s): give longer documents or a larger --max_seq_length"
        )
    return annotated


# ---------------------------------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------------------------------


class RecurringSpanCollator:
    """Masks passages for RSS and pads them. Features: input_ids and recurring_spans (`annotate_spans`).

    Batch: input_ids, attention_mask, token_type_ids (B, L), right-padded; question_positions, start_positions and
    end_positions (B, Q), -1 where a passage has fewer than Q questions. Random draws as MaskingCollator's: by
    (seed, `epoch`, the passage) for training, by the example's "mask_seed" for held-out passages, from the global
    RNG when `seed` is None.
    """

    def __init__(
        self,
        tokenizer,
        question_token_id: int,
        max_questions: int = 30,
        question_rate: float = 0.15,
        pad_to_multiple_of: int | None = None,
        seed: int | None = None,
    ):
        if tokenizer.pad_token_id is None:
            raise ArgumentError("--objective rss needs a tokenizer with a pad token")
        self.pad_token_id = tokenizer.pad_token_id
        self.question_token_id = question_token_id
        self.max_questions, self.question_rate = max_questions, question_rate
        self.pad_to_multiple_of, self.seed, self.epoch = pad_to_multiple_of, seed, 0

    def mask(self, feature: dict) -> dict[str, list[int]]:
        """One passage masked (see `mask_recurring_spans`)."""
        input_ids = list(feature["input_ids"])
        budget = question_budget(len(input_ids), self.max_questions, self.question_rate)
        return mask_recurring_spans(
            input_ids,
            groups_of(feature[SPANS]),
            self.question_token_id,
            budget,
            example_generator(feature, self.seed, self.epoch),
        )

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        masked = [self.mask(feature) for feature in features]
        length = round_up(max(len(example["input_ids"]) for example in masked), self.pad_to_multiple_of)
        questions = max(1, max(len(example["question_positions"]) for example in masked))
        batch_size = len(masked)
        batch = {
            "input_ids": torch.full((batch_size, length), self.pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros((batch_size, length), dtype=torch.long),
            "token_type_ids": torch.zeros((batch_size, length), dtype=torch.long),
            **{key: torch.full((batch_size, questions), NO_QUESTION, dtype=torch.long) for key in POSITION_KEYS},
        }
        for row, example in enumerate(masked):
            batch["input_ids"][row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
            batch["attention_mask"][row, : len(example["input_ids"])] = 1
            for key in POSITION_KEYS:
                batch[key][row, : len(example[key])] = torch.tensor(example[key], dtype=torch.long)
        return batch


class RSSPaddingInsertionCollator:
    """RecurringSpanCollator's batches with Padding Insertion (PaddingInsertionCollator's recipe and seeding): the
    passage tokens, their questions and answers move to the padded positions. Returns the keys of
    RecurringSpanCollator only (no teacher inputs)."""

    def __init__(self, tokenizer, base_collator: RecurringSpanCollator, **insertion_options):
        self.insertion = PaddingInsertionCollator(
            tokenizer, base_collator=base_collator, position_keys=POSITION_KEYS, **insertion_options
        )

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.insertion(features)
        return {key: batch[key] for key in STUDENT_KEYS}


# ---------------------------------------------------------------------------------------------------------------------
# Model and metrics
# ---------------------------------------------------------------------------------------------------------------------


def span_selection_class(model_type: str):
    """The XForQuestionSpanSelection class of a posformers model type."""
    import posformers

    classes = {
        "posformers-roformer": "RoFormerForQuestionSpanSelection",
        "posformers-deberta": "DebertaForQuestionSpanSelection",
        "littlebird": "LittleBirdForQuestionSpanSelection",
    }
    if model_type not in classes:
        raise ArgumentError(
            f"--objective rss trains {', '.join(classes)} models (a question-aware span-selection head); "
            f"got {model_type}"
        )
    return getattr(posformers, classes[model_type])


def build_rss_model(config, model_args, tokenizer, question_token_id: int):
    """XForQuestionSpanSelection: from --model_name_or_path (its encoder loads, e.g. from an MLM or distilled
    checkpoint; the head is new) or new from `config`. The model is fitted to the tokenizer with [QUESTION] (new
    embedding rows where the token is new), and its config records the token and that posformers-qa should
    fine-tune it with the span-selection head."""
    model_class = span_selection_class(config.model_type)
    if model_args.model_name_or_path is None:
        logger.info("training a new %s from scratch", model_class.__name__)
        model = model_class(config)
    else:
        model = model_class.from_pretrained(model_args.model_name_or_path, config=config, **hub_kwargs(model_args))
    if len(tokenizer) > model.config.vocab_size:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.config.question_token_id = question_token_id
    model.config.qa_head = "span_selection"
    return model


def preprocess_span_logits(logits, labels):
    """(start_logits, end_logits) (B, Q, L) -> argmax start and end (B, Q, 2): Trainer never gathers the logits."""
    start_logits, end_logits = logits[0], logits[1]
    return torch.stack((start_logits.argmax(-1), end_logits.argmax(-1)), dim=-1)


def rss_metrics(prediction) -> dict[str, float]:
    """eval_exact_match: the share of real questions whose predicted start and end are both the answer's."""
    predicted = np.asarray(prediction.predictions)  # (N, Q, 2); Trainer pads Q across batches with -100
    starts, ends = (np.asarray(labels) for labels in prediction.label_ids)  # (N, Q) each
    real = starts >= 0
    right = (predicted[..., 0] == starts) & (predicted[..., 1] == ends) & real
    return {"exact_match": float(right.sum() / max(int(real.sum()), 1))}
