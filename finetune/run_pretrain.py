"""Pre-train a RoFormer, DeBERTa or LittleBird encoder from raw text: posformers-pretrain.

    posformers-pretrain --objective mlm --model_type posformers-roformer --train_tokenizer wordpiece \\
        --train_file corpus.txt --do_train --do_eval --max_steps 100000 --output_dir out/roformer
                                                      # masked language modelling (any of the three models)
    posformers-pretrain --objective mlm --model_type posformers-deberta --tokenizer_name <tokenizer> ...
                                                      # DeBERTa: the loss goes through the Enhanced Mask Decoder
    posformers-pretrain --objective rtd --model_type posformers-deberta --rtd_weight 50 ...
                                                      # DeBERTa-v3 replaced token detection with GDES
                                                      # (finetune/pretrain_rtd.py); the output is the discriminator
    posformers-pretrain --objective distill --model_name_or_path <littlebird converted from bert> \
        --teacher_name_or_path <that bert> ...       # LittleBird: KL to the teacher with Padding Insertion
                                                      # (finetune/pretrain_distill.py); the output is the student
    posformers-pretrain --objective rss --model_name_or_path <an MLM / distilled checkpoint> ...
                                                      # Recurring Span Selection (finetune/pretrain_rss.py), any of
                                                      # the three models; the output is an XForQuestionSpanSelection
    posformers-pretrain --objective distill --rss_after_distill_steps 40000 --max_steps 50000 \
        --rss_padding_insertion ...                   # LittleBird, the paper's recipe in one command: distillation
                                                      # for 40k steps (into output_dir/distill), then RSS for 10k

The LittleBird recipe, end to end: `posformers-convert littlebird --from bert` -> distillation with Padding Insertion
-> RSS (with Padding Insertion) -> `posformers-qa --model_name_or_path <the RSS output>` (its config says
qa_head="span_selection": QA fine-tunes the pre-trained span-selection head, with a [QUESTION] token after each
question, as Splinter). RSS's reconstructed numbers, all options of RSSArguments and marked [recon] in
finetune/pretrain_rss.py: spans of at most 10 tokens (`--rss_max_span_length`), at most 30 questions per passage
(`--rss_max_questions`) and at most 15% of its tokens (`--rss_question_rate`); Padding Insertion's are the
`--padding_insertion_*` options of distillation (finetune/pretrain_distill.py).

`--rss_after_distill_steps N` splits --max_steps: the first N steps distil (checkpoints in output_dir/distill/,
the distilled student saved there), the other max_steps - N train RSS from that student (checkpoints and the final
model in output_dir; its steps count from 0). `--resume_from_checkpoint True` resumes the RSS stage when it has a
checkpoint, else the distillation stage (a finished distillation is not run again); a checkpoint path resumes its own
stage. `--push_to_hub` uploads the RSS model only.

Also `python -m posformers.finetune.run_pretrain` and `posformers.finetune.run_pretrain.main([...])`. Every
`TrainingArguments` flag works (`--save_steps`, `--resume_from_checkpoint True`, `--eval_strategy steps`,
`--eval_on_start`, `--push_to_hub`, `--bf16`, torchrun, ...). Data options: finetune/pretrain_data.py.
`--padding_free auto|true|false` (default auto): flattened batches for mlm, rtd and rss (the same masks and samples
as padded ones); distill and rss with Padding Insertion keep their padded batches (finetune/padding_free.py).

Without `--model_name_or_path` the model is new: its config comes from `--model_type` (+ `--config_overrides`) or
`--config_name`, and its vocabulary size and special token ids from the tokenizer. `--train_tokenizer wordpiece|unigram`
trains the tokenizer on the training text first and saves it into --output_dir (a resumed run reloads it from the
checkpoint instead of training it again).

Held-out metrics (eval_*): MLM `loss`, `perplexity` and `accuracy` over the selected tokens, masked the same way at
every evaluation; for rtd the generator's `mlm_*` and the discriminator's `rtd_loss`, `rtd_accuracy` and the share of
tokens replaced, next to `eval_loss` (mlm_loss + rtd_weight * rtd_loss), with the replacements drawn the same way at
every evaluation (from --seed and each sequence's tokens); for distill `eval_loss` (the distillation
loss) and `eval_accuracy_vs_teacher`; for rss `eval_loss` (the span-selection loss) and `eval_exact_match` (the
share of questions whose argmax start and end are both the answer's), on held-out passages masked the same way at
every evaluation.

Bad input stops the script before training with one line (exit status 1): missing or empty text files, a text column
that is not there, an objective the model cannot train (rtd needs DeBERTa, distill LittleBird, Padding Insertion in
rss LittleBird), a tokenizer larger than a pre-trained model's vocabulary, sequences longer than the model's position
table, --streaming without --max_steps, rss on a corpus in which no passage has a recurring span,
--rss_after_distill_steps not below --max_steps.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path

from transformers import AutoModelForMaskedLM, AutoTokenizer, Trainer, TrainingArguments

from .arguments import ModelArguments, RunArguments, prepare_output_dir
from .checkpoints import last_complete_checkpoint
from .errors import ArgumentError
from .loading import load_config, load_model, load_tokenizer
from .pretrain_data import (
    MaskEpochCallback,
    MaskingCollator,
    PretrainDataArguments,
    fix_masks,
    load_corpus,
    mlm_metrics,
    mlm_sums,
    pack_corpus,
    train_tokenizer,
)
from .pretrain_distill import DistillArguments, DistillationTrainer, PaddingInsertionCollator, load_teacher
from .pretrain_rss import (
    RecurringSpanCollator,
    RSSArguments,
    RSSPaddingInsertionCollator,
    add_question_token,
    annotate_spans,
    build_rss_model,
    preprocess_span_logits,
    rss_metrics,
    span_selection_class,
)
from .pretrain_rtd import RTDArguments, RTDTrainer, build_rtd_model, preprocess_rtd_logits, rtd_metrics
from .script import Script, script_main

logger = logging.getLogger(__name__)

OBJECTIVES = ("mlm", "rtd", "distill", "rss")
# The model family each objective trains (None: any masked-language model; rss: any of the three posformers models).
OBJECTIVE_MODEL_TYPES = {"mlm": None, "rtd": "posformers-deberta", "distill": "littlebird", "rss": None}
# What a flattened MLM batch keeps per token: the masked ids and their labels.
MLM_TOKEN_KEYS = ("input_ids", "token_type_ids", "labels")


@dataclasses.dataclass
class PretrainArguments:
    """Which pre-training objective to run."""

    objective: str = dataclasses.field(
        default="mlm",
        metadata={
            "help": "mlm: masked language modelling (all models; DeBERTa through its Enhanced Mask Decoder). "
            "rtd: DeBERTa-v3 replaced token detection with gradient-disentangled embedding sharing. "
            "distill: a LittleBird student learns a teacher's MLM distributions with Padding Insertion. "
            "rss: Recurring Span Selection (Splinter's), with a question-aware span-selection head.",
            "choices": list(OBJECTIVES),
        },
    )

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ArgumentError(f"--objective: unknown objective {self.objective!r} (choose one of {OBJECTIVES})")


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and config
# ---------------------------------------------------------------------------------------------------------------------


def obtain_tokenizer(
    model_args: ModelArguments,
    data_args: PretrainDataArguments,
    corpus: dict,
    checkpoint,
    output_dir,
    max_positions: int | None = None,
):
    """The tokenizer: trained on the corpus (`--train_tokenizer`, with the model's `max_positions` as its
    `model_max_length`; saved into output_dir unless that is None), reloaded from the checkpoint a resumed run trained
    it into, or loaded from --tokenizer_name / the model."""
    if data_args.train_tokenizer is None:
        return load_tokenizer(model_args)
    if checkpoint is not None:
        logger.info("reusing the tokenizer trained by the resumed run (%s)", checkpoint)
        return AutoTokenizer.from_pretrained(checkpoint)
    if model_args.tokenizer_name:
        raise ArgumentError("give either --train_tokenizer or --tokenizer_name, not both")
    tokenizer = train_tokenizer(
        corpus["train"], data_args.train_tokenizer, data_args.tokenizer_vocab_size, data_args.tokenizer_lowercase
    )
    if max_positions is not None:  # else the tokenizers library's "no limit" (1e30): LittleBird has no position limit
        tokenizer.model_max_length = max_positions
    if output_dir is not None:
        tokenizer.save_pretrained(output_dir)
    return tokenizer


def fit_config_to_tokenizer(config, tokenizer, model_args: ModelArguments, data_args: PretrainDataArguments):
    """A new model takes the tokenizer's vocabulary size and special ids; a pre-trained one must already fit."""
    if model_args.model_name_or_path is None:
        config.vocab_size = len(tokenizer)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            token_id = getattr(tokenizer, name, None)
            if token_id is not None and hasattr(config, name):
                setattr(config, name, token_id)
    elif len(tokenizer) > config.vocab_size:
        raise ArgumentError(
            f"the tokenizer has {len(tokenizer)} tokens but {model_args.model_name_or_path} has vocab_size "
            f"{config.vocab_size}: use the model's tokenizer"
        )
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and limit > 0 and data_args.max_seq_length > limit:
        raise ArgumentError(
            f"--max_seq_length {data_args.max_seq_length} exceeds the model's max_position_embeddings ({limit})"
        )
    return config


# ---------------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------------


def preprocess_mlm_logits(logits, labels):
    """(B, L, V) logits -> per-example sums (see `mlm_sums`), so that Trainer never gathers the full logits."""
    return mlm_sums(logits[0] if isinstance(logits, tuple) else logits, labels)


def compute_mlm_metrics(prediction) -> dict[str, float]:
    predictions, loss_sums, counts = prediction.predictions
    return mlm_metrics(predictions, prediction.label_ids, loss_sums, counts, prefix="mlm_")


# ---------------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------------


def check_run(training_args: TrainingArguments, data_args: PretrainDataArguments) -> None:
    if not (training_args.do_train or training_args.do_eval):
        raise ArgumentError("nothing to do: give --do_train and/or --do_eval")
    if data_args.streaming and training_args.do_train and training_args.max_steps <= 0:
        raise ArgumentError("--streaming needs --max_steps (a streamed corpus has no known length)")


def build_model(objective: str, config, model_args: ModelArguments, rtd_args: RTDArguments, seed: int = 0):
    if objective == "rtd":  # evaluation draws the generator's samples with `seed` (finetune/pretrain_rtd.py)
        return build_rtd_model(config, rtd_args, model_args.model_name_or_path, eval_seed=seed)
    return load_model(model_args, config, AutoModelForMaskedLM)


def packed_splits(corpus: dict, tokenizer, data_args: PretrainDataArguments, seed: int, rss_args=None) -> dict:
    """Packed train and (masked-once) validation splits; for RSS (`rss_args`) with their recurring spans."""
    if rss_args is not None and not getattr(tokenizer, "is_fast", False):
        raise ArgumentError("--objective rss needs a fast tokenizer (tokenizer.json) to find word boundaries")
    word_starts = data_args.whole_word_masking or rss_args is not None
    workers = data_args.preprocessing_num_workers
    packed = {
        split: pack_corpus(text, tokenizer, data_args.max_seq_length, word_starts, workers)
        for split, text in corpus.items()
    }
    if rss_args is not None:
        names = {"train": "training", "validation": "held-out"}
        packed = {
            split: annotate_spans(passages, tokenizer, rss_args.rss_max_span_length, workers, names[split])
            for split, passages in packed.items()
        }
    if "validation" in packed:
        packed["validation"] = fix_masks(packed["validation"], seed)
    return packed


class Pretrain(Script):
    """posformers-pretrain's steps (finetune/script.py runs them) for one objective; `start` chains distillation and
    RSS under --rss_after_distill_steps."""

    @classmethod
    def argument_groups(cls) -> tuple[type, ...]:
        return (
            ModelArguments, PretrainDataArguments, PretrainArguments, RTDArguments, DistillArguments, RSSArguments,
            RunArguments, TrainingArguments,
        )  # fmt: skip

    def __init__(self, model_args, data_args, pretrain_args, rtd_args, distill_args, rss_args, run_args, training_args):
        super().__init__(model_args, data_args, run_args, training_args)
        self.pretrain_args, self.rtd_args = pretrain_args, rtd_args
        self.distill_args, self.rss_args = distill_args, rss_args
        self.checkpoint: str | None = None

    @property
    def objective(self) -> str:
        return self.pretrain_args.objective

    @property
    def task(self) -> str:
        return {"mlm": "fill-mask", "rss": "question-answering"}.get(self.objective, "feature-extraction")

    def replace(self, **arguments) -> Pretrain:
        """This script with other argument groups (`training_args=...`), for a stage of its own."""
        script = copy.copy(self)
        vars(script).update(arguments)
        return script

    def start(self) -> dict:
        check_run(self.training_args, self.data_args)
        self.rss_args.check()
        if self.rss_args.rss_after_distill_steps > 0:
            if self.objective != "distill":
                raise ArgumentError(f"--rss_after_distill_steps follows --objective distill, not {self.objective}")
            return distill_then_rss(self)
        return super().start()

    def run(self, checkpoint: str | None = None) -> dict:
        """One pre-training run of the objective into training_args.output_dir (resuming from `checkpoint`)."""
        self.checkpoint = checkpoint  # a tokenizer that the resumed run trained is reloaded from it
        results = super().run(checkpoint)
        if self.trainer.is_world_process_zero():
            logger.info("pre-trained model written to %s", Path(self.training_args.output_dir).resolve())
        return results

    def load(self):
        model_args, data_args, training_args = self.model_args, self.data_args, self.training_args
        objective = self.objective
        config = load_config(model_args)
        required = OBJECTIVE_MODEL_TYPES[objective]
        if required is not None and config.model_type != required:
            raise ArgumentError(f"--objective {objective} trains {required} models; got {config.model_type}")
        if objective == "distill":
            self.distill_args.check()
        if objective == "rss":
            span_selection_class(config.model_type)  # refuses the models without a span-selection head
            if self.rss_args.rss_padding_insertion and config.model_type != "littlebird":
                raise ArgumentError(f"--rss_padding_insertion is for LittleBird models, not {config.model_type}")
        self.corpus = load_corpus(
            data_args, training_args.seed, model_args.cache_dir, training_args.do_eval, encoding=self.run_args.encoding
        )
        max_positions = getattr(config, "max_position_embeddings", None)
        # a trained tokenizer is saved by the process that saves the run (one per run, or per node: save_on_each_node)
        save_to = training_args.output_dir if training_args.should_save else None
        self.tokenizer = obtain_tokenizer(model_args, data_args, self.corpus, self.checkpoint, save_to, max_positions)
        config = fit_config_to_tokenizer(config, self.tokenizer, model_args, data_args)
        if objective != "rss":
            return build_model(objective, config, model_args, self.rtd_args, training_args.seed)
        self.question_token_id = add_question_token(self.tokenizer)
        if model_args.model_name_or_path is None:
            config.vocab_size = max(config.vocab_size, len(self.tokenizer))
        return build_rss_model(config, model_args, self.tokenizer, self.question_token_id)

    def padding_free_options(self) -> dict:
        # Distillation and RSS with Padding Insertion insert padding into the batches on purpose: they stay padded (the
        # model unpads them internally where it can: right padding; inserted runs are holes, which keep the padded
        # path).
        objective = self.objective
        inserts_padding = objective == "distill" or (objective == "rss" and self.rss_args.rss_padding_insertion)
        reason = f"--objective {objective} with Padding Insertion inserts padding into the batches on purpose"
        return {"flattenable": not inserts_padding, "reason": reason}

    def prepare_datasets(self) -> tuple:
        rss_args = self.rss_args if self.objective == "rss" else None
        self.packed = packed_splits(self.corpus, self.tokenizer, self.data_args, self.training_args.seed, rss_args)
        return self.packed["train"] if self.training_args.do_train else None, self.packed.get("validation")

    def build_trainer(self, padding_free, **common) -> Trainer:
        collator = self.masking_collator()
        common["callbacks"].append(MaskEpochCallback(collator))
        self.training_args.remove_unused_columns = False  # the collator reads word_starts / mask_seed and drops them
        if (
            self.objective == "distill"
        ):  # finetune/pretrain_distill.py: the student sees Padding Insertion, the teacher not
            insertion = PaddingInsertionCollator(
                self.tokenizer, base_collator=collator, **self.distill_args.padding_insertion_options()
            )
            teacher = load_teacher(self.distill_args.teacher_name_or_path, cache_dir=self.model_args.cache_dir)
            return DistillationTrainer(
                teacher=teacher, distill_args=self.distill_args, data_collator=insertion, **common
            )
        if self.objective == "rtd":
            return RTDTrainer(
                data_collator=padding_free.collator(collator, MLM_TOKEN_KEYS), compute_metrics=rtd_metrics,
                preprocess_logits_for_metrics=preprocess_rtd_logits, **common,
            )  # fmt: skip
        if self.objective == "rss":  # finetune/pretrain_rss.py
            if self.rss_args.rss_padding_insertion:
                options = self.distill_args.padding_insertion_options()
                rss_collator = RSSPaddingInsertionCollator(self.tokenizer, collator, **options)
            else:
                rss_collator = padding_free.collator(collator)
            self.training_args.label_names = ["start_positions", "end_positions"]  # evaluation reports the head's loss
            return Trainer(
                data_collator=rss_collator,
                compute_metrics=rss_metrics,
                preprocess_logits_for_metrics=preprocess_span_logits,
                **common,
            )
        return Trainer(
            data_collator=padding_free.collator(collator, MLM_TOKEN_KEYS),
            compute_metrics=compute_mlm_metrics,
            preprocess_logits_for_metrics=preprocess_mlm_logits,
            **common,
        )

    @property
    def pad_to_multiple_of(self) -> int | None:
        """Padded lengths in multiples of 8 under --fp16 or --bf16."""
        return 8 if self.training_args.fp16 or self.training_args.bf16 else None

    def masking_collator(self):
        """RSS's questions, or the masks of MLM (and of rtd and distill), drawn from --seed."""
        training_args = self.training_args
        if self.objective == "rss":
            return RecurringSpanCollator(
                self.tokenizer,
                self.question_token_id,
                self.rss_args.rss_max_questions,
                self.rss_args.rss_question_rate,
                pad_to_multiple_of=self.pad_to_multiple_of,
                seed=training_args.seed,
            )
        # RTD masks every selected token (the official DeBERTa-v3 data); MLM uses BERT's 80/10/10.
        replace = {"mask_replace_prob": 1.0, "random_replace_prob": 0.0} if self.objective == "rtd" else {}
        return MaskingCollator(
            self.tokenizer,
            self.data_args.mlm_probability,
            self.data_args.whole_word_masking,
            pad_to_multiple_of=self.pad_to_multiple_of,
            seed=training_args.seed,
            **replace,
        )

    def evaluate(self) -> dict[str, float]:
        metrics = self.trainer.evaluate()
        if not self.data_args.streaming:
            metrics["eval_samples"] = len(self.packed["validation"])
        return metrics


main = script_main(Pretrain)


# ---------------------------------------------------------------------------------------------------------------------
# Distillation, then RSS
# ---------------------------------------------------------------------------------------------------------------------

DISTILL_STAGE_DIR = "distill"


def distill_finished(folder: Path) -> bool:
    """Whether the distillation stage wrote its final model (it reports train_results.json after saving it)."""
    return (folder / "train_results.json").is_file() and (folder / "config.json").is_file()


def chain_checkpoints(training_args: TrainingArguments, distill_dir: Path) -> tuple[str | None, str | None, bool]:
    """Where each stage resumes from under --resume_from_checkpoint: (distillation's, RSS's, skip distillation)."""
    resume = training_args.resume_from_checkpoint
    if resume is None or str(resume).lower() in ("false", "0", ""):
        return None, None, False
    output_dir = Path(training_args.output_dir)
    if str(resume).lower() in ("true", "1"):
        last_rss = last_complete_checkpoint(output_dir, training_args)  # sets newer half-written ones aside
        if last_rss is not None or distill_finished(distill_dir):
            return None, last_rss, True
        return "True", None, False  # prepare_output_dir finds distillation's last checkpoint-N or says there is none
    if Path(resume).resolve().parent == distill_dir.resolve():
        return str(resume), None, False
    if not distill_finished(distill_dir):
        raise ArgumentError(
            f"--resume_from_checkpoint {resume}: an RSS checkpoint, but the distillation stage in {distill_dir} has "
            "not finished (resume from one of its checkpoint-N folders instead)"
        )
    return None, str(resume), True


def distill_then_rss(script: Pretrain) -> dict[str, float]:
    """`--objective distill --rss_after_distill_steps N`: distillation for N steps into output_dir/distill, then RSS
    from the distilled student for the other max_steps - N steps into output_dir. Each stage has its own checkpoints
    and step count; --resume_from_checkpoint True resumes whichever stage was interrupted."""
    training_args, steps = script.training_args, script.rss_args.rss_after_distill_steps
    if not training_args.do_train:
        raise ArgumentError("--rss_after_distill_steps needs --do_train (it chains two training stages)")
    if not 0 < steps < training_args.max_steps:
        raise ArgumentError(
            f"--rss_after_distill_steps {steps} must be below --max_steps ({training_args.max_steps}): the RSS stage "
            "trains for the steps after it"
        )
    distill_dir = Path(training_args.output_dir) / DISTILL_STAGE_DIR
    distill_checkpoint, rss_checkpoint, skip_distill = chain_checkpoints(training_args, distill_dir)
    results = {}
    if not skip_distill:
        distill_training = copy.deepcopy(training_args)
        distill_training.output_dir, distill_training.max_steps = str(distill_dir), steps
        distill_training.resume_from_checkpoint = distill_checkpoint
        distill_training.push_to_hub = False  # the Hub gets the finished model, the RSS stage's
        checkpoint = prepare_output_dir(distill_training, script.run_args.overwrite_output_dir)
        logger.info("stage 1 of 2: distillation for %d steps into %s", steps, distill_dir)
        metrics = script.replace(training_args=distill_training).run(checkpoint)
        results.update({f"distill_{key}": value for key, value in metrics.items()})

    rss_training = copy.deepcopy(training_args)
    rss_training.max_steps = training_args.max_steps - steps
    rss_training.resume_from_checkpoint = rss_checkpoint
    checkpoint = prepare_output_dir(rss_training, script.run_args.overwrite_output_dir)
    # the RSS model starts from the distilled student, with its tokenizer (trained in stage 1 where asked)
    rss_script = script.replace(
        model_args=dataclasses.replace(
            script.model_args, model_name_or_path=str(distill_dir), config_name=None, model_type=None,
            config_overrides=None, tokenizer_name=str(distill_dir),
        ),
        data_args=dataclasses.replace(script.data_args, train_tokenizer=None),
        pretrain_args=dataclasses.replace(script.pretrain_args, objective="rss"),
        training_args=rss_training,
    )  # fmt: skip
    logger.info("stage 2 of 2: RSS for %d steps into %s", rss_training.max_steps, rss_training.output_dir)
    results.update(rss_script.run(checkpoint))
    return results


if __name__ == "__main__":
    main()
