"""`--padding_free auto|true|false` of posformers-glue, posformers-qa and posformers-pretrain.

    plan = plan_padding_free(run_args.padding_free, model, training_args, pad_to_max_length=...)
    collator = plan.collator(DataCollatorWithPadding(tokenizer))   # flattens the padded batches when plan.flatten
    trainer = Trainer(..., data_collator=collator)
    plan.attach(trainer)   # the run-time unpad_inputs for this run; saved config.json files keep the model's own

- true: batches reach the model in transformers' padding-free format, built by `FlatteningCollator`: one row of the
  batch's real tokens, `position_ids` restarting at 0 for every sequence, `cu_seq_lens_q/k` and `max_length_q/k`.
  Unlike transformers' DataCollatorWithFlattening it keeps every per-token key (token_type_ids, MLM labels) and the
  per-sequence ones (classification labels, QA start/end positions). The batch is collated padded first and then
  flattened, so it holds exactly the padded batch's tokens and labels (the same MLM masks for the same seed). Only
  for models whose class says `accepts_flattened_batches`; refused with --pad_to_max_length.
- false: padded batches as before, and the model computes on its padding too (config.unpad_inputs="never").
- auto (default): true where the model accepts flattened batches; else padded batches that the model unpads
  internally (config.unpad_inputs="auto"; a model without that field is left alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import torch

from .errors import ArgumentError

logger = logging.getLogger(__name__)

PADDING_FREE_CHOICES = ("auto", "true", "false")
# The keyword arguments transformers' padding-free format passes beside position_ids.
VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
FLATTENED_KEYS = ("position_ids", *VARLEN_KEYS)


def check_padding_free(value: str) -> str:
    if value not in PADDING_FREE_CHOICES:
        raise ArgumentError(f"--padding_free must be one of {', '.join(PADDING_FREE_CHOICES)}, got {value!r}")
    return value


def accepts_flattened_batches(model) -> bool:
    """Whether `model` takes transformers' padding-free format (its class's `accepts_flattened_batches`)."""
    return bool(getattr(model, "accepts_flattened_batches", False))


def unpad_configs(model) -> list:
    """The distinct configs with an `unpad_inputs` field inside `model` (two for RTD: generator and discriminator)."""
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "unpad_inputs"):
            configs[id(config)] = config
    return list(configs.values())


def flatten_batch(batch: dict, token_keys: tuple[str, ...]) -> dict:
    """A padded batch (`attention_mask` (B, L): each row's tokens in one run, padded on either side) -> transformers'
    padding-free format.

    token_keys: the (B, L) tensors to keep at real tokens only, as (1, N); `attention_mask` is dropped; every other
    tensor is per sequence ((B, ...), kept as it is). Adds position_ids (1, N), restarting at 0 for each sequence,
    cu_seq_lens_q/k (B + 1,) int32 and max_length_q/k (ints).
    """
    mask = batch["attention_mask"].bool()
    lengths = mask.sum(dim=1)
    if not bool((lengths > 0).all()):
        raise ValueError("attention_mask: a row without tokens cannot be flattened")
    columns = torch.arange(mask.shape[1])
    positions = columns - mask.long().argmax(dim=1, keepdim=True)  # (B, L): 0 at each row's first token
    if not torch.equal(mask, (positions >= 0) & (positions < lengths[:, None])):
        raise ValueError("attention_mask: a row has padding between its tokens, which a flattened batch cannot keep")
    real = mask.flatten()
    flat = {}
    for key, value in batch.items():
        if key == "attention_mask":
            continue
        if key in token_keys:
            if value.shape[:2] != mask.shape:
                raise ValueError(f"{key}: expected a per-token (B, L) tensor of shape {tuple(mask.shape)}")
            flat[key] = value.flatten(0, 1)[real][None]
        else:
            flat[key] = value
    cu_seq_lens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    longest = int(lengths.max())
    flat.update(
        position_ids=positions.flatten()[real][None],
        cu_seq_lens_q=cu_seq_lens,
        cu_seq_lens_k=cu_seq_lens,
        max_length_q=longest,
        max_length_k=longest,
    )
    return flat


class FlatteningCollator:
    """Collates with `base_collator` (padded batches) and flattens the result (`flatten_batch`).

    token_keys: the per-token keys of the batch besides input_ids; labels count as per-token only where listed (MLM),
    else as per-sequence (classification labels, QA start/end positions).
    """

    def __init__(self, base_collator, token_keys: tuple[str, ...] = ("input_ids", "token_type_ids")):
        self.base_collator = base_collator
        self.token_keys = tuple(token_keys)

    def __call__(self, features: list[dict]) -> dict:
        return flatten_batch(dict(self.base_collator(features)), self.token_keys)


@dataclasses.dataclass
class PaddingFreePlan:
    """What --padding_free decided for one run.

    flatten: batches go to the model flattened (FlatteningCollator). unpad_inputs: the config value the model runs
    with ("never" / "auto"; None: the config is left as it is). configs: the configs it is set on, with their own
    values in `saved`, written back while a checkpoint or the final model is saved.
    """

    flatten: bool
    unpad_inputs: str | None
    configs: list = dataclasses.field(default_factory=list)
    saved: list = dataclasses.field(default_factory=list)

    def collator(self, base_collator, token_keys: tuple[str, ...] = ("input_ids", "token_type_ids")):
        return FlatteningCollator(base_collator, token_keys) if self.flatten else base_collator

    def apply(self) -> None:
        if self.unpad_inputs is not None:
            for config in self.configs:
                config.unpad_inputs = self.unpad_inputs

    def restore(self) -> None:
        for config, value in zip(self.configs, self.saved):
            config.unpad_inputs = value

    @contextlib.contextmanager
    def saved_values(self):
        """The model's own unpad_inputs for the duration (a save), then the run's again."""
        self.restore()
        try:
            yield
        finally:
            self.apply()

    def attach(self, trainer) -> None:
        """Set the run's unpad_inputs and make every save of `trainer` (checkpoints, the final model, push_to_hub,
        which all go through `save_model`) write the model's own value: users loading the result get it back."""
        self.apply()
        if self.unpad_inputs is None:
            return
        save_model = trainer.save_model

        def save_model_with_own_config(*args, **kwargs):
            with self.saved_values():
                return save_model(*args, **kwargs)

        trainer.save_model = save_model_with_own_config


def dispatches_batches(training_args) -> bool:
    """Whether the user asked accelerate to dispatch batches (one process reads, each gets a slice along dim 0)."""
    config = getattr(training_args, "accelerator_config", None)
    return getattr(config, "dispatch_batches", None) is True


def keep_batches_whole(training_args) -> None:
    """Each process reads its own flattened batches. Accelerate dispatches the batches of an iterable dataset (a
    streamed corpus) by default, slicing every tensor to the batch's first dimension, which is 1 for a flattened
    batch: the per-sequence tensors (cu_seq_lens, labels) would lose all but their first entry."""
    config = getattr(training_args, "accelerator_config", None)
    if config is not None and config.dispatch_batches is None:
        config.dispatch_batches = False


def plan_padding_free(
    setting: str,
    model,
    training_args=None,
    pad_to_max_length: bool = False,
    flattenable: bool = True,
    reason: str = "",
) -> PaddingFreePlan:
    """Resolve `--padding_free` for `model` (and, when batches are flattened, keep `training_args` from dispatching
    them). flattenable False (with `reason`): this run keeps padded batches on purpose (distillation's Padding
    Insertion), so `true` is refused and `auto` means the model's internal unpadding."""
    check_padding_free(setting)
    accepts = accepts_flattened_batches(model)
    dispatch = dispatches_batches(training_args)
    if setting == "true":
        if not flattenable:
            raise ArgumentError(f"--padding_free true: {reason}; use --padding_free auto or false")
        if dispatch:
            raise ArgumentError(
                "--padding_free true and accelerator_config dispatch_batches=True contradict each other: dispatching "
                "slices each batch along its first dimension, which a flattened batch does not have"
            )
        if not accepts:
            raise ArgumentError(
                f"--padding_free true: {type(model).__name__} does not accept flattened batches "
                "(accepts_flattened_batches is False); use --padding_free auto or false"
            )
        if pad_to_max_length:
            raise ArgumentError("--padding_free true and --pad_to_max_length contradict each other: choose one")
    configs = unpad_configs(model)
    plan = PaddingFreePlan(
        flatten=setting == "true"
        or (setting == "auto" and accepts and flattenable and not pad_to_max_length and not dispatch),
        unpad_inputs=None if not configs else ("never" if setting == "false" else "auto"),
        configs=configs,
        saved=[config.unpad_inputs for config in configs],
    )
    if plan.flatten:
        plan.unpad_inputs = None  # a flattened batch runs packed whatever the config says
        if training_args is not None:
            keep_batches_whole(training_args)
    logger.info(
        "padding-free: %s", "flattened batches" if plan.flatten else f"padded batches, unpad_inputs={plan.unpad_inputs}"
    )
    return plan
