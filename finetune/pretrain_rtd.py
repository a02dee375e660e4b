"""DeBERTa-v3 pre-training: replaced token detection (RTD) with gradient-disentangled embedding sharing (GDES).

He, Gao, Chen, "DeBERTaV3: Improving DeBERTa using ELECTRA-Style Pre-Training with Gradient-Disentangled Embedding
Sharing" (ICLR 2023), section 3; the official code is microsoft/DeBERTa, `apps/tasks/rtd_task.py` (RTDModel) and
`apps/models/replaced_token_detection_model.py`. This module follows it:

* The generator is a `DebertaForMaskedLM` (its MLM goes through the Enhanced Mask Decoder) with the discriminator's
  width and half its layers by default (the official rtd_base.json: 6 of 12); its input has every selected token
  replaced by [MASK] (the official RTD masking: no random or kept tokens).
* Replacements are sampled from the generator's full output distribution at the masked positions
  (`softmax(logits / temperature)`, one multinomial draw; the official `topk_sampling` with topk=1, temp=1), without
  gradient. A replaced token that happens to equal the original counts as original (label 0). In training the draws
  come from torch's RNG (which a resumed run restores); in evaluation (`model.eval()`) from a generator per sequence
  seeded by `eval_seed` and the sequence's tokens, so that two evaluations of the same weights on the same held-out
  data give the same metrics, whatever the batch size, padding or order.
* The discriminator is a `DebertaForReplacedTokenDetection`; its loss is the mean binary cross-entropy over all real
  tokens, and the total loss is `mlm_loss + rtd_weight * rtd_loss` (paper: lambda = 50, as ELECTRA; the official
  script's `--rtd_lambda` defaults to 10).
* GDES: the discriminator's word embedding is `E_G.detach() + E_Delta`, with `E_Delta` its own zero-initialised
  parameter (`GDESEmbedding`). E_G is trained by the generator's MLM loss alone; the discriminator's loss reaches only
  E_Delta. The same holds for an absolute position table when the discriminator adds one to its input
  (`position_biased_input`), as the official code shares both tables.

One optimizer trains the pair on the summed loss: because no gradient crosses from the discriminator into the
generator (the samples are discrete, E_G is detached), each part's gradient is exactly that of its own loss, as in the
official decoupled training (which uses two optimizers over the same gradients).

Checkpoints (`RTDTrainer`; the final output folder has the same layout):

    checkpoint-N/config.json, model.safetensors   the discriminator as a normal DeBERTa checkpoint, with the effective
                                                  embedding E_G + E_Delta folded in: `posformers-glue
                                                  --model_name_or_path checkpoint-N` fine-tunes it as it is
    checkpoint-N/generator/                       the generator (a DebertaForMaskedLM checkpoint, with the tokenizer)
    checkpoint-N/gdes_delta.safetensors           E_Delta itself, so that resuming restores the pair bit for bit
                                                  (E_G + E_Delta - E_G is not E_Delta in floating point)
    checkpoint-N/optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json   Trainer's own, as for any model
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import logging
import os
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Trainer
from transformers.modeling_outputs import ModelOutput

from posformers.configuration_deberta import DebertaConfig
from posformers.modeling_deberta import DebertaForMaskedLM, DebertaForReplacedTokenDetection

from .errors import ArgumentError, OutputDirError
from .loading import parse_overrides
from .padding_free import FLATTENED_KEYS
from .pretrain_data import mlm_metrics, mlm_sums

logger = logging.getLogger(__name__)

GENERATOR_DIR = "generator"
DELTA_FILE = "gdes_delta.safetensors"
SHARED_TABLES = ("word_embeddings", "position_embeddings")


@dataclasses.dataclass
class RTDArguments:
    """The generator and the loss of `--objective rtd` (DeBERTa-v3)."""

    generator_num_hidden_layers: int | None = dataclasses.field(
        default=None, metadata={"help": "Generator depth (default: half the discriminator's, as DeBERTa-v3)."}
    )
    generator_hidden_size: int | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Generator width (default: the discriminator's). A narrower generator gets heads of the "
            "discriminator's head size, 4x intermediate size, and needs emd_steps=0 in --generator_config_overrides."
        },
    )
    generator_config_overrides: str | None = dataclasses.field(
        default=None, metadata={"help": "Generator config fields, e.g. 'intermediate_size=512,emd_steps=2'."}
    )
    generator_name_or_path: str | None = dataclasses.field(
        default=None, metadata={"help": "Start from this generator (a DebertaForMaskedLM folder, e.g. generator/)."}
    )
    rtd_weight: float = dataclasses.field(
        default=50.0, metadata={"help": "Weight lambda of the discriminator loss (paper: 50)."}
    )
    sampling_temperature: float = dataclasses.field(
        default=1.0, metadata={"help": "Temperature of the generator distribution the replacements are drawn from."}
    )


# ---------------------------------------------------------------------------------------------------------------------
# The pair
# ---------------------------------------------------------------------------------------------------------------------


def generator_config(discriminator: DebertaConfig, args: RTDArguments) -> DebertaConfig:
    """The generator's config: the discriminator's, with the depth/width asked for (default: half the layers)."""
    config = copy.deepcopy(discriminator)
    config.architectures = ["DebertaForMaskedLM"]
    config.num_hidden_layers = args.generator_num_hidden_layers or max(1, discriminator.num_hidden_layers // 2)
    if args.generator_hidden_size and args.generator_hidden_size != discriminator.hidden_size:
        # Embeddings are shared, so the generator keeps the discriminator's embedding width and projects it.
        config.hidden_size = args.generator_hidden_size
        config.num_attention_heads = max(1, args.generator_hidden_size // discriminator.head_dim)
        config.intermediate_size = 4 * args.generator_hidden_size
        config.embedding_size = discriminator.embedding_size
    for key, value in parse_overrides(DebertaConfig, args.generator_config_overrides).items():
        setattr(config, key, value)
    if config.embedding_size != discriminator.embedding_size or config.vocab_size != discriminator.vocab_size:
        raise ArgumentError(
            "the generator shares the discriminator's embeddings: its embedding_size and vocab_size must be the "
            f"discriminator's ({discriminator.embedding_size}, {discriminator.vocab_size})"
        )
    if config.uses_emd and config.embedding_size != config.hidden_size:
        raise ArgumentError(
            f"a generator of hidden_size {config.hidden_size} with embedding_size {config.embedding_size} cannot use "
            "the Enhanced Mask Decoder (it adds embedding-width positions to hidden states): pass "
            "--generator_config_overrides emd_steps=0, or keep the discriminator's width"
        )
    return config


class GDESEmbedding(nn.Module):
    """An embedding table equal to `shared.weight.detach() + delta`: gradient-disentangled embedding sharing.

    `shared` (the generator's nn.Embedding) is held by reference, not as a submodule: it belongs to the generator.
    `delta` is the discriminator's own parameter, zero at the start (DeBERTa-v3 section 3.2).
    """

    def __init__(self, shared: nn.Embedding, padding_idx: int | None):
        super().__init__()
        object.__setattr__(self, "shared", shared)  # a reference, kept out of this module's parameters
        self.delta = nn.Parameter(torch.zeros_like(shared.weight))
        self.padding_idx = padding_idx
        self.num_embeddings, self.embedding_dim = shared.weight.shape

    @property
    def weight(self) -> torch.Tensor:
        """The effective table (V, D): the discriminator's loss reaches `delta` only."""
        return self.shared.weight.detach() + self.delta

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, L) -> (B, L, D)."""
        return F.embedding(input_ids, self.weight, self.padding_idx)


@dataclasses.dataclass
class RTDOutput(ModelOutput):
    """loss = mlm_loss + rtd_weight * rtd_loss; logits (B, L, V) of the generator, rtd_logits (B, L) of the
    discriminator, rtd_labels (B, L): 1 replaced, 0 original, -100 padding; rtd_input_ids (B, L): what the
    discriminator read (the generator's samples at the masked positions)."""

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    rtd_loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    rtd_logits: torch.Tensor | None = None
    rtd_labels: torch.Tensor | None = None
    rtd_input_ids: torch.Tensor | None = None


def sample_replacements(logits: torch.Tensor, temperature: float = 1.0, generator=None) -> torch.Tensor:
    """One token per row drawn from softmax(logits / temperature). logits (N, V) -> (N,) ids."""
    probabilities = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).view(-1)


def sequence_spans(input_ids, attention_mask=None, cu_seq_lens=None) -> list[tuple[int, int, torch.Tensor]]:
    """(start, end, tokens) of each sequence of a batch, in positions of the batch flattened row by row: the rows of
    a padded batch (B, L), tokens without the padding; or the sequences of a flattened one (1, N), `cu_seq_lens`
    (B + 1,) their boundaries. A sequence has the same tokens in either form."""
    if cu_seq_lens is not None:
        bounds = cu_seq_lens.tolist()
        return [(start, end, input_ids.view(-1)[start:end]) for start, end in itertools.pairwise(bounds)]
    length = input_ids.shape[1]
    rows = input_ids if attention_mask is None else [row[mask.bool()] for row, mask in zip(input_ids, attention_mask)]
    return [(index * length, (index + 1) * length, tokens) for index, tokens in enumerate(rows)]


def seeded_replacements(labels, logits, temperature: float, seed: int, spans) -> torch.Tensor:
    """`sample_replacements` at the masked positions (labels != -100) in row-major order, each sequence of `spans`
    (see sequence_spans) drawn with a generator seeded by `seed` and its tokens."""
    masked = (labels != -100).view(-1)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    samples = []
    for start, end, tokens in spans:
        positions = masked[start:end].nonzero().view(-1) + start
        if positions.numel():
            key = zlib.crc32(tokens.detach().to("cpu", torch.int64).numpy().tobytes())
            generator = torch.Generator(device=logits.device).manual_seed(seed * 1_000_003 + key)
            samples.append(sample_replacements(flat_logits[positions].detach(), temperature, generator))
    return torch.cat(samples) if samples else torch.zeros(0, dtype=torch.long, device=logits.device)


def corrupt(
    input_ids, labels, logits, temperature: float = 1.0, seed: int | None = None, spans=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The discriminator's input and labels. input_ids, labels (B, L) (labels: the original id where masked, -100
    elsewhere); logits (B, L, V) of the generator. Returns (B, L) ids with masked positions replaced by samples,
    and (B, L) labels: 1 where the sample differs from the original, else 0. With a `seed` (and the batch's
    `sequence_spans`) the samples are `seeded_replacements`, else torch's RNG draws them."""
    masked = labels != -100
    if seed is None:
        sampled = sample_replacements(logits[masked].detach(), temperature)
    else:
        spans = spans if spans is not None else sequence_spans(input_ids)
        sampled = seeded_replacements(labels, logits, temperature, seed, spans)
    corrupted = input_ids.clone()
    corrupted[masked] = sampled
    replaced = torch.zeros_like(labels)
    replaced[masked] = (sampled != labels[masked]).long()
    return corrupted, replaced


class DebertaRTDModel(nn.Module):
    """Generator + discriminator with GDES; `forward` returns the summed loss (see the module docstring)."""

    main_input_name = "input_ids"
    # The summed loss is a mean per batch (the discriminator's over real tokens, a count Trainer does not keep): no
    # num_items_in_batch, so that Trainer does not multiply it by the number of processes.
    accepts_loss_kwargs = False

    def __init__(
        self,
        generator: DebertaForMaskedLM,
        discriminator: DebertaForReplacedTokenDetection,
        rtd_weight: float = 50.0,
        temperature: float = 1.0,
        eval_seed: int | None = 0,
    ):
        super().__init__()
        self.generator, self.discriminator = generator, discriminator
        self.rtd_weight, self.temperature = rtd_weight, temperature
        self.eval_seed = eval_seed  # evaluation draws the replacements with it (None: from torch's RNG, as training)
        self.config = discriminator.config  # what Trainer reads (model card, ignore keys)
        self._share_embeddings()

    def _share_embeddings(self) -> None:
        """Replace the discriminator's tables by GDES views of the generator's (word, and absolute positions when
        the discriminator adds them to its input)."""
        generator, discriminator = self.generator.deberta.embeddings, self.discriminator.deberta.embeddings
        for name in SHARED_TABLES:
            own, shared = getattr(discriminator, name, None), getattr(generator, name, None)
            if own is None or isinstance(own, GDESEmbedding):
                continue
            if shared is None or shared.weight.shape != own.weight.shape:
                raise ArgumentError(f"the generator has no {name} table of the discriminator's shape to share")
            setattr(discriminator, name, GDESEmbedding(shared, own.padding_idx))

    def gradient_checkpointing_enable(self, **kwargs):
        self.generator.gradient_checkpointing_enable(**kwargs)
        self.discriminator.gradient_checkpointing_enable(**kwargs)

    @property
    def accepts_flattened_batches(self) -> bool:
        """Whether both models take transformers' padding-free format (see finetune/padding_free.py)."""
        return all(getattr(part, "accepts_flattened_batches", False) for part in (self.generator, self.discriminator))

    def forward(self, input_ids, attention_mask=None, labels=None, token_type_ids=None, **kwargs) -> RTDOutput:
        """input_ids (B, L) with [MASK] at the selected positions, labels (B, L): their original ids, -100 elsewhere.

        A flattened batch (input_ids (1, N), position_ids restarting per sequence, cu_seq_lens_q/k, max_length_q/k)
        reaches both models as it is; the replacements are sampled at the masked positions in token order, so a
        flattened batch draws the same samples as its padded form."""
        if labels is None:
            raise ValueError("DebertaRTDModel needs labels (the MLM targets): use the masking collator")
        # Only the layout travels on: Trainer's loss kwargs (num_items_in_batch) count the generator's targets.
        layout = {key: kwargs[key] for key in FLATTENED_KEYS if key in kwargs}
        generated = self.generator(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels, **layout
        )
        with torch.no_grad():
            seed = None if self.training else self.eval_seed
            spans = None
            if seed is not None:
                spans = sequence_spans(input_ids, attention_mask, layout.get("cu_seq_lens_q"))
            corrupted, replaced = corrupt(input_ids, labels, generated.logits, self.temperature, seed, spans)
            # The discriminator sees the original tokens everywhere it was not masked.
            corrupted = torch.where(labels != -100, corrupted, input_ids)
        if attention_mask is not None:
            replaced = replaced.masked_fill(attention_mask == 0, -100)
        detected = self.discriminator(
            input_ids=corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=replaced, **layout
        )
        loss = generated.loss + self.rtd_weight * detected.loss
        return RTDOutput(
            loss=loss,
            mlm_loss=generated.loss.detach(),
            rtd_loss=detected.loss.detach(),
            logits=generated.logits,
            rtd_logits=detected.logits,
            rtd_labels=replaced,
            rtd_input_ids=corrupted,
        )


def build_rtd_model(
    config: DebertaConfig, args: RTDArguments, discriminator_path: str | None = None, eval_seed: int = 0, **load_kwargs
):
    """The pair: discriminator from `discriminator_path` (or new from `config`), generator from
    `args.generator_name_or_path` (or new). A pre-trained discriminator keeps its embeddings as E_Delta's starting
    point minus the generator's, so that its effective embedding is unchanged. `eval_seed`: see DebertaRTDModel."""
    if config.model_type != DebertaConfig.model_type:
        raise ArgumentError(
            f"--objective rtd pre-trains DeBERTa-v3 (model_type {DebertaConfig.model_type}); got {config.model_type}"
        )
    if discriminator_path:
        discriminator = DebertaForReplacedTokenDetection.from_pretrained(
            discriminator_path, config=config, **load_kwargs
        )
    else:
        discriminator = DebertaForReplacedTokenDetection(config)
    if args.generator_name_or_path:
        generator = DebertaForMaskedLM.from_pretrained(args.generator_name_or_path, **load_kwargs)
    else:
        generator = DebertaForMaskedLM(generator_config(config, args))
    tables = {name: getattr(discriminator.deberta.embeddings, name, None) for name in SHARED_TABLES}
    model = DebertaRTDModel(generator, discriminator, args.rtd_weight, args.sampling_temperature, eval_seed)
    if discriminator_path:
        with torch.no_grad():
            for name, table in tables.items():
                if table is not None:
                    view = getattr(discriminator.deberta.embeddings, name)
                    view.delta.copy_(table.weight - view.shared.weight)
    return model


# ---------------------------------------------------------------------------------------------------------------------
# Saving and loading
# ---------------------------------------------------------------------------------------------------------------------


def discriminator_state_dict(model: DebertaRTDModel) -> dict[str, torch.Tensor]:
    """The discriminator's weights as a plain DeBERTa's: each GDES table folded into `<table>.weight`."""
    state = {}
    for key, tensor in model.discriminator.state_dict().items():
        if key.endswith(".delta"):
            table = model.discriminator.get_submodule(key.removesuffix(".delta"))
            state[key.removesuffix(".delta") + ".weight"] = table.weight.detach().contiguous()
        else:
            state[key] = tensor
    return state


def delta_state_dict(model: DebertaRTDModel) -> dict[str, torch.Tensor]:
    return {
        key: tensor.contiguous() for key, tensor in model.discriminator.state_dict().items() if key.endswith(".delta")
    }


def save_rtd(model: DebertaRTDModel, output_dir, safe_serialization: bool = True) -> None:
    """Write the pair in the layout of the module docstring."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.discriminator.save_pretrained(output_dir, state_dict=discriminator_state_dict(model))
    model.generator.save_pretrained(output_dir / GENERATOR_DIR)
    save_file(
        {key: tensor.detach().cpu() for key, tensor in delta_state_dict(model).items()},
        str(output_dir / DELTA_FILE),
        metadata={"format": "pt"},
    )


def read_weights(folder) -> dict[str, torch.Tensor]:
    """All tensors of a save_pretrained folder (model.safetensors, or its shards)."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return {key: value for shard in shards for key, value in load_file(str(folder / shard)).items()}
    raise OutputDirError(f"{folder}: no model.safetensors to load")


def _load_into(module: nn.Module, state: dict, allowed_missing: set[str], source) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [key for key in missing if key not in allowed_missing]
    if missing or unexpected:
        raise OutputDirError(f"{source}: weights do not fit (missing {missing[:5]}, unexpected {unexpected[:5]})")


def load_rtd(model: DebertaRTDModel, checkpoint) -> None:
    """Restore the pair saved by `save_rtd` (exact: E_Delta comes from its own file)."""
    checkpoint = Path(checkpoint)
    generator_state = read_weights(checkpoint / GENERATOR_DIR)
    tied = {key for key in model.generator.state_dict() if key not in generator_state}
    tied_ok = set(model.generator._tied_weights_keys or {})
    _load_into(model.generator, generator_state, tied & tied_ok, checkpoint / GENERATOR_DIR)
    state = read_weights(checkpoint)
    for key in list(state):
        table = key.removesuffix(".weight")
        if isinstance(_submodule(model.discriminator, table), GDESEmbedding):
            del state[key]  # the folded table: E_Delta comes from DELTA_FILE
    delta_path = checkpoint / DELTA_FILE
    if not delta_path.is_file():
        raise OutputDirError(f"{checkpoint}: no {DELTA_FILE} (not a posformers RTD checkpoint)")
    state.update(load_file(str(delta_path)))
    _load_into(model.discriminator, state, set(), checkpoint)


def _submodule(module: nn.Module, name: str):
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


class RTDTrainer(Trainer):
    """Trainer for `DebertaRTDModel`: saves and restores the pair in the checkpoint layout of the module docstring."""

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        save_rtd(self.accelerator.unwrap_model(self.model), output_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
            # generator/ is a fill-mask model of its own: without its tokenizer, a pipeline on it picks another
            self.processing_class.save_pretrained(Path(output_dir) / GENERATOR_DIR)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        load_rtd(model if model is not None else self.model, resume_from_checkpoint)

    def _load_best_model(self) -> None:
        load_rtd(self.model, self.state.best_model_checkpoint)


# ---------------------------------------------------------------------------------------------------------------------
# Held-out metrics
# ---------------------------------------------------------------------------------------------------------------------


def preprocess_rtd_logits(outputs, labels):
    """Per batch, Trainer hands the RTDOutput fields after the loss; keep per-example sums for token-weighted
    metrics: the generator's `mlm_sums`, and the discriminator's summed BCE, correct decisions, real tokens and
    replaced tokens, each (B,)."""
    _, _, logits, rtd_logits, rtd_labels, _ = outputs
    real = rtd_labels != -100
    targets = rtd_labels.clamp(min=0).float()
    bce = F.binary_cross_entropy_with_logits(rtd_logits.float(), targets, reduction="none")
    correct = ((rtd_logits > 0).float() == targets) & real
    return (
        *mlm_sums(logits, labels),
        (bce * real).sum(dim=1),
        correct.sum(dim=1),
        real.sum(dim=1),
        (rtd_labels == 1).sum(dim=1),
    )


def rtd_metrics(prediction) -> dict[str, float]:
    """Held-out generator MLM loss/perplexity/accuracy (mlm_*) and discriminator loss/accuracy (rtd_*, over real
    tokens), and the share of real tokens the generator replaced (rtd_replaced_fraction)."""
    predictions, loss_sums, counts, bce_sums, correct, real, replaced = prediction.predictions
    tokens = max(int(np.sum(real)), 1)
    return {
        **mlm_metrics(predictions, prediction.label_ids, loss_sums, counts, prefix="mlm_"),
        "rtd_loss": float(np.sum(bce_sums) / tokens),
        "rtd_accuracy": float(np.sum(correct) / tokens),
        "rtd_replaced_fraction": float(np.sum(replaced) / tokens),
    }
