"""LittleBird pre-training by distillation from a short-input teacher, with Padding Insertion (`--objective distill`).

The LittleBird paper (see docs/littlebird.md) initialises the student from a pretrained BERT/RoBERTa
(`posformers-convert littlebird --from bert`), then trains it to match that teacher on the same text. The student
sees the text with **Padding Insertion**: random runs of pad tokens between real tokens, masked (attention_mask 0) and
left out of every loss, so that short texts look like long documents to BiALiBi (longer distances) and to the block
pattern (later tokens in later blocks); the teacher sees the clean text. Optionally the last steps are plain MLM.

API (what posformers-pretrain calls):

    distill_args: DistillArguments                        # parsed with HfArgumentParser beside the other dataclasses
    distill_args.check()                                  # ArgumentError naming the field for impossible values
    teacher = load_teacher(distill_args.teacher_name_or_path)      # any AutoModelForMaskedLM, frozen, eval mode
    collator = PaddingInsertionCollator(tokenizer, base_collator=MaskingCollator(...),
                                        **distill_args.padding_insertion_options())
    trainer = DistillationTrainer(model=student, teacher=teacher, distill_args=distill_args, args=training_args,
                                  train_dataset=..., eval_dataset=..., data_collator=collator)
    trainer.train(); trainer.evaluate()   # eval_loss (the distillation loss), eval_accuracy_vs_teacher

Padding Insertion, per example with `num_real` real tokens (the recipe is [recon]: the paper names it, its numbers
are not public; every number is a field of DistillArguments):

    with probability padding_insertion_probability (else the example is left clean):
        target ~ Uniform{max(num_real, min_length) .. max(num_real, max_length)}   the student's length for it
        pads = target - num_real
        runs = clamp(round(pads / mean_run_length), 1, num_real - 1)
        the runs go into `runs` distinct gaps between consecutive real tokens (never before the first token, which
        LittleBird needs real: position 0 is its [CLS] position); their lengths are a uniformly drawn composition
        of `pads` into `runs` positive parts (mean exactly pads / runs).

Batch of the collator (all (B, ·) long tensors): the student's `input_ids`, `attention_mask`, `token_type_ids`,
`labels` (when the base collator gives labels; -100 on every pad) of length Ls; the teacher's clean
`teacher_input_ids`, `teacher_attention_mask`, `teacher_token_type_ids` (and `teacher_labels`) of length Lt;
`position_map` (B, Ls): the teacher position of each student token, -1 on inserted and trailing pads. Real tokens
keep their order.

Loss (training): kl_weight * T^2 * KL(teacher_T || student_T), the mean over the real tokens of the clean text of
the KL between the temperature-T softmaxes of the MLM logits (Hinton et al.'s T^2 keeps gradient sizes independent
of T), + hidden_mse_weight * the MSE of the last hidden states at the same tokens. The hidden-state term needs equal
hidden sizes: there is no projection [choice: a converted student always has its teacher's width, and a learned
projection would be a parameter the saved student does not hold]. During the last `mlm_after_distill_steps` steps
the loss is the student's own MLM cross-entropy on `labels` and the teacher is not run.

Checkpoints hold the student only: the teacher is an attribute of the trainer, not a sub-module of the model, so a
checkpoint is a normal LittleBird checkpoint that AutoModelForMaskedLM and the fine-tuning scripts load.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForMaskedLM, DataCollatorWithPadding, Trainer

from posformers import LittleBirdForMaskedLM

from .errors import ArgumentError
from .pretrain_data import example_generator, round_up

IGNORE_INDEX = -100
# Offset of the Padding Insertion seed of a held-out example from its masking seed, so the two draws differ.
INSERTION_SEED_OFFSET = 7919


# ---------------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DistillArguments:
    """The teacher, the distillation loss and Padding Insertion (`--objective distill`)."""

    teacher_name_or_path: str | None = dataclasses.field(
        default=None,
        metadata={"help": "Teacher: any AutoModelForMaskedLM folder or repo id (e.g. the BERT the student came from)."},
    )
    temperature: float = dataclasses.field(
        default=1.0, metadata={"help": "Softmax temperature T of both distributions; the KL is scaled by T^2."}
    )
    kl_weight: float = dataclasses.field(default=1.0, metadata={"help": "Weight of the KL term."})
    hidden_mse_weight: float = dataclasses.field(
        default=0.0,
        metadata={"help": "Weight of the MSE of last hidden states at real tokens (0 = off; needs equal widths)."},
    )
    padding_insertion_probability: float = dataclasses.field(
        default=1.0, metadata={"help": "Share of training examples that get padding inserted (the rest stay clean)."}
    )
    padding_insertion_min_length: int = dataclasses.field(
        default=0, metadata={"help": "Smallest length of a padded example (0: its own length)."}
    )
    padding_insertion_max_length: int = dataclasses.field(
        default=1024, metadata={"help": "Largest length of a padded example; lengths are drawn uniformly up to it."}
    )
    padding_insertion_mean_run_length: float = dataclasses.field(
        default=32.0, metadata={"help": "Mean number of pad tokens in one inserted run."}
    )
    mlm_after_distill_steps: int = dataclasses.field(
        default=0,
        metadata={"help": "Train the last N steps with the student's own MLM loss instead (no teacher; 0 = none)."},
    )

    def check(self) -> None:
        """Raise ArgumentError naming the field of any impossible value."""
        if not self.teacher_name_or_path:
            raise ArgumentError("--objective distill needs --teacher_name_or_path (an AutoModelForMaskedLM checkpoint)")
        rules = {
            "temperature": ("must be > 0", self.temperature > 0),
            "kl_weight": ("must be >= 0", self.kl_weight >= 0),
            "hidden_mse_weight": ("must be >= 0", self.hidden_mse_weight >= 0),
            "mlm_after_distill_steps": ("must be >= 0", self.mlm_after_distill_steps >= 0),
        }
        for name, (rule, holds) in rules.items():
            if not holds:
                raise ArgumentError(f"--{name} {rule}, got {getattr(self, name)}")
        check_padding_insertion(**self.padding_insertion_options(), prefix="--padding_insertion_")
        if self.kl_weight == 0 and self.hidden_mse_weight == 0:
            raise ArgumentError("--kl_weight and --hidden_mse_weight are both 0: the distillation loss would be 0")

    def padding_insertion_options(self) -> dict:
        """Keyword arguments of PaddingInsertionCollator."""
        return {
            "probability": self.padding_insertion_probability,
            "min_length": self.padding_insertion_min_length,
            "max_length": self.padding_insertion_max_length,
            "mean_run_length": self.padding_insertion_mean_run_length,
        }


# ---------------------------------------------------------------------------------------------------------------------
# Padding Insertion
# ---------------------------------------------------------------------------------------------------------------------


def check_padding_insertion(
    probability: float, min_length: int, max_length: int, mean_run_length: float, prefix: str = ""
) -> None:
    """ArgumentError naming the first impossible Padding Insertion setting (`prefix` + its name)."""
    rules = {
        "probability": ("must be in [0, 1]", 0.0 <= probability <= 1.0, probability),
        "min_length": ("must be >= 0", min_length >= 0, min_length),
        "max_length": (f"must be >= {prefix}min_length ({min_length})", max_length >= min_length, max_length),
        "mean_run_length": ("must be >= 1", mean_run_length >= 1, mean_run_length),
    }
    for name, (rule, holds, value) in rules.items():
        if not holds:
            raise ArgumentError(f"{prefix}{name} {rule}, got {value}")


def insertion_gaps(
    num_real: int,
    probability: float,
    min_length: int,
    max_length: int,
    mean_run_length: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """How many pads go before each real token of one example: (num_real,) long, always 0 before the first.

    The recipe of the module docstring: a target length drawn uniformly, its pads cut into runs of mean
    `mean_run_length` (a uniform composition), the runs put into distinct gaps between real tokens.
    """
    gaps = torch.zeros(num_real, dtype=torch.long)
    if num_real < 2 or torch.rand((), generator=generator) >= probability:
        return gaps
    low, high = max(num_real, min_length), max(num_real, max_length)
    pads = int(torch.randint(low, high + 1, (), generator=generator)) - num_real
    if pads == 0:
        return gaps
    runs = min(max(round(pads / mean_run_length), 1), num_real - 1, pads)
    where = torch.randperm(num_real - 1, generator=generator)[:runs] + 1
    cuts = torch.randperm(pads - 1, generator=generator)[: runs - 1].sort().values + 1
    bounds = torch.cat((torch.zeros(1, dtype=torch.long), cuts, torch.full((1,), pads)))
    gaps[where] = bounds.diff()
    return gaps


class PaddingInsertionCollator:
    """Collates clean batches (through `base_collator`) and inserts random runs of pads for the student.

    base_collator: builds the clean batch from the features (e.g. posformers' MaskingCollator, which masks for MLM and
        gives labels); default: transformers' DataCollatorWithPadding (right padding, no labels unless the features
        have them). Its batch needs input_ids (and attention_mask when it pads); the student's real tokens are the
        clean batch's tokens with attention_mask 1, in order, from position 0.
    probability, min_length, max_length, mean_run_length: the Padding Insertion recipe (see the module docstring).
    pad_to_multiple_of: round the student's length up (e.g. to LittleBird's block size).
    position_keys: keys of the clean batch that hold token positions, (B, Q) long with -1 where absent (RSS's
        question_positions, start_positions, end_positions): they are carried to the student's positions.
    generator: random source of the insertions. Without one, an example is seeded like its masks when the base
        collator is a seeded MaskingCollator (by seed, epoch and its tokens: a resumed run inserts as the interrupted
        one did), else torch's global RNG is used. Features carrying a "mask_seed" (held-out examples) always use one
        seeded by it and their tokens, so every evaluation sees the same insertions.

    Returns the batch described in the module docstring.
    """

    def __init__(
        self,
        tokenizer,
        base_collator=None,
        probability: float = 1.0,
        min_length: int = 0,
        max_length: int = 1024,
        mean_run_length: float = 32.0,
        pad_to_multiple_of: int | None = None,
        generator: torch.Generator | None = None,
        position_keys: tuple[str, ...] = (),
    ):
        if tokenizer.pad_token_id is None:
            raise ArgumentError("Padding Insertion needs a tokenizer with a pad token")
        check_padding_insertion(probability, min_length, max_length, mean_run_length)
        self.pad_token_id = tokenizer.pad_token_id
        self.base_collator = base_collator or DataCollatorWithPadding(tokenizer)
        self.options = {
            "probability": probability,
            "min_length": min_length,
            "max_length": max_length,
            "mean_run_length": mean_run_length,
        }
        self.pad_to_multiple_of = pad_to_multiple_of
        self.generator = generator
        self.position_keys = position_keys

    def _generator_for(self, feature: dict) -> torch.Generator | None:
        """The random source of one example: seeded like its masks where the base collator seeds those."""
        seed = getattr(self.base_collator, "seed", None) if self.generator is None else None
        epoch = getattr(self.base_collator, "epoch", 0)
        generator = example_generator(feature, seed, epoch, offset=INSERTION_SEED_OFFSET)
        return self.generator if generator is None else generator

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        clean = dict(self.base_collator(features))
        input_ids = clean["input_ids"]
        attention_mask = clean.get("attention_mask", torch.ones_like(input_ids))
        token_type_ids = clean.get("token_type_ids", torch.zeros_like(input_ids))
        real = attention_mask.bool()
        # student position of every real token: its rank among the real tokens plus the pads inserted before it
        student_positions = []
        for row, feature in enumerate(features):
            num_real = int(real[row].sum())
            gaps = insertion_gaps(num_real, **self.options, generator=self._generator_for(feature))
            student_positions.append(torch.arange(num_real) + gaps.cumsum(0))
        length = max(int(positions[-1]) + 1 if positions.numel() else 1 for positions in student_positions)
        length = round_up(length, self.pad_to_multiple_of)

        batch_size = input_ids.shape[0]
        student = {
            "input_ids": torch.full((batch_size, length), self.pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros((batch_size, length), dtype=torch.long),
            "token_type_ids": torch.zeros((batch_size, length), dtype=torch.long),
            "position_map": torch.full((batch_size, length), -1, dtype=torch.long),
        }
        sources = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        if "labels" in clean:
            student["labels"] = torch.full((batch_size, length), IGNORE_INDEX, dtype=torch.long)
            sources["labels"] = clean["labels"]
        # the student position of each clean position (-1 on the clean batch's padding)
        student_of = torch.full(input_ids.shape, -1, dtype=torch.long)
        for row, positions in enumerate(student_positions):
            teacher_positions = real[row].nonzero().view(-1)
            for key, source in sources.items():
                student[key][row, positions] = source[row, teacher_positions]
            student["position_map"][row, positions] = teacher_positions
            student_of[row, teacher_positions] = positions
        for key in self.position_keys:
            clean_positions = clean[key]  # (B, Q)
            moved = student_of.gather(1, clean_positions.clamp(min=0))
            student[key] = torch.where(clean_positions >= 0, moved, clean_positions)
        teacher = {
            "teacher_input_ids": input_ids,
            "teacher_attention_mask": attention_mask,
            "teacher_token_type_ids": token_type_ids,
        }
        if "labels" in clean:
            teacher["teacher_labels"] = clean["labels"]
        return {**student, **teacher}


# ---------------------------------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------------------------------


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * mean over tokens of KL(softmax(teacher / T) || softmax(student / T)). Logits: (N, V) -> scalar.

    Computed in float32 whatever the logits' dtype.
    """
    teacher_log_probs = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    student_log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    per_token = (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1)
    return per_token.mean() * temperature**2


def aligned_positions(position_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """position_map (B, Ls) -> (rows, student_positions, teacher_positions), each (N,): the real tokens, in order."""
    rows, student_positions = (position_map >= 0).nonzero(as_tuple=True)
    return rows, student_positions, position_map[rows, student_positions]


def load_teacher(name_or_path: str, **from_pretrained_kwargs):
    """Any AutoModelForMaskedLM checkpoint, frozen (no gradients) and in eval mode."""
    teacher = AutoModelForMaskedLM.from_pretrained(name_or_path, **from_pretrained_kwargs)
    return freeze(teacher)


def freeze(model):
    model.requires_grad_(False)
    return model.eval()


class DistillationTerms(NamedTuple):
    loss: torch.Tensor
    student_predictions: torch.Tensor  # (B, Lt) the student's argmax at the clean text's real tokens, -100 elsewhere
    teacher_predictions: torch.Tensor  # (B, Lt) the teacher's argmax there, -100 elsewhere


def accuracy_vs_teacher(eval_prediction) -> dict[str, float]:
    """compute_metrics of DistillationTrainer: how often the student's MLM argmax is the teacher's."""
    predictions, references = eval_prediction.predictions, eval_prediction.label_ids
    counted = references != IGNORE_INDEX
    return {"accuracy_vs_teacher": float(np.mean(predictions[counted] == references[counted]))}


class DistillationTrainer(Trainer):
    """Trainer whose `model` is the LittleBird student (LittleBirdForMaskedLM) and which holds a frozen `teacher`.

    Batches come from PaddingInsertionCollator. Training loss and evaluation as in the module docstring; evaluation
    reports `eval_loss` (the distillation loss) and `eval_accuracy_vs_teacher`.
    """

    # compute_loss returns a per-batch mean: Trainer divides it by the accumulation steps
    loss_is_scaled_for_ga = False

    def __init__(self, *args, teacher, distill_args: DistillArguments, **kwargs):
        kwargs.setdefault("compute_metrics", accuracy_vs_teacher)
        super().__init__(*args, **kwargs)
        check_pair(self.model, teacher, distill_args)
        self.distill_args = distill_args
        # not a sub-module of the model: Trainer neither optimises nor saves it, and model.train() leaves it alone
        self.teacher = freeze(teacher).to(self.args.device)

    # -- the two objectives -------------------------------------------------------------------------------------------

    def _in_mlm_phase(self, model) -> bool:
        steps = self.distill_args.mlm_after_distill_steps
        return model.training and steps > 0 and self.state.global_step >= self.state.max_steps - steps

    def _student_outputs(self, model, inputs):
        return model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            token_type_ids=inputs.get("token_type_ids"),
            output_hidden_states=self.distill_args.hidden_mse_weight > 0,
        )

    def _teacher_outputs(self, inputs):
        teacher_inputs = {"input_ids": inputs["teacher_input_ids"], "attention_mask": inputs["teacher_attention_mask"]}
        if self.teacher.config.type_vocab_size and "teacher_token_type_ids" in inputs:
            teacher_inputs["token_type_ids"] = inputs["teacher_token_type_ids"]
        limit = getattr(self.teacher.config, "max_position_embeddings", None)
        if limit is not None and teacher_inputs["input_ids"].shape[1] > limit:
            raise ArgumentError(
                f"the clean text is {teacher_inputs['input_ids'].shape[1]} tokens long, more than the teacher's "
                f"max_position_embeddings ({limit}): lower --max_seq_length"
            )
        with torch.no_grad():
            return self.teacher(**teacher_inputs, output_hidden_states=self.distill_args.hidden_mse_weight > 0)

    def distillation_terms(self, model, inputs) -> DistillationTerms:
        """The weighted loss of the module docstring, and both models' argmax at the clean text's real tokens."""
        args = self.distill_args
        student = self._student_outputs(model, inputs)
        teacher = self._teacher_outputs(inputs)
        rows, student_positions, teacher_positions = aligned_positions(inputs["position_map"])
        student_logits = student.logits[rows, student_positions]  # (N, V)
        teacher_logits = teacher.logits[rows, teacher_positions]
        loss = args.kl_weight * distillation_kl(student_logits, teacher_logits, args.temperature)
        if args.hidden_mse_weight > 0:
            student_hidden = student.hidden_states[-1][rows, student_positions]
            teacher_hidden = teacher.hidden_states[-1][rows, teacher_positions]
            loss = loss + args.hidden_mse_weight * F.mse_loss(student_hidden.float(), teacher_hidden.float())
        shape = inputs["teacher_input_ids"].shape
        student_predictions = torch.full(shape, IGNORE_INDEX, dtype=torch.long, device=student_logits.device)
        student_predictions[rows, teacher_positions] = student_logits.argmax(-1)
        teacher_predictions = torch.full_like(student_predictions, IGNORE_INDEX)
        teacher_predictions[rows, teacher_positions] = teacher_logits.argmax(-1)
        return DistillationTerms(loss, student_predictions, teacher_predictions)

    def mlm_loss(self, model, inputs) -> torch.Tensor:
        """The student's own MLM cross-entropy on `labels` (the last `mlm_after_distill_steps` steps)."""
        if inputs.get("labels") is None:
            raise ArgumentError(
                "--mlm_after_distill_steps needs masked batches with labels: give PaddingInsertionCollator a "
                "base_collator that masks (MaskingCollator)"
            )
        outputs = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            token_type_ids=inputs.get("token_type_ids"),
            labels=inputs["labels"],
        )
        return outputs.loss

    # -- Trainer hooks ------------------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self._in_mlm_phase(model):
            loss = self.mlm_loss(model, inputs)
            return (loss, None) if return_outputs else loss
        terms = self.distillation_terms(model, inputs)
        return (terms.loss, terms) if return_outputs else terms.loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            terms = self.distillation_terms(model, inputs)
        loss = terms.loss.detach()
        if prediction_loss_only:
            return loss, None, None
        return loss, terms.student_predictions, terms.teacher_predictions


def check_pair(student, teacher, distill_args: DistillArguments) -> None:
    """Student and teacher must be able to be compared: a LittleBird MLM student, the same vocabulary, and equal
    widths when the hidden-state MSE is on."""
    if not isinstance(student, LittleBirdForMaskedLM):
        raise ArgumentError(
            f"the distillation student must be a LittleBirdForMaskedLM, got {type(student).__name__} (convert one with "
            "`posformers-convert littlebird --from bert` or build it from a LittleBird config)"
        )
    if student.config.vocab_size != teacher.config.vocab_size:
        raise ArgumentError(
            f"student vocab_size ({student.config.vocab_size}) differs from the teacher's "
            f"({teacher.config.vocab_size}): their MLM distributions cannot be compared"
        )
    if distill_args.hidden_mse_weight > 0 and student.config.hidden_size != teacher.config.hidden_size:
        raise ArgumentError(
            f"--hidden_mse_weight needs equal hidden sizes, but the student has {student.config.hidden_size} and the "
            f"teacher {teacher.config.hidden_size} (there is no projection): set it to 0"
        )
