"""The core shared by `posformers-convert`: safe loading, key maps with strict accounting, checks, verification, output,
and the one driver that runs them.

Each source format of a family (roformer.py, deberta.py, littlebird.py) is a `Source`: it reads its checkpoint (with
`load_tensors`, or its own reader, e.g. TensorFlow checkpoints), names a `KeyMap` (every source tensor is mapped or
dropped with a reason), verifies the built model against the reference implementation (`compare_outputs`) and names
its tokenizer. `run_conversion` does the rest the same way for all: the map, the state-dict check against the model
built on the meta device (`build_model`), verification, an atomic `write_output` and the push.

Every user-facing failure is a `ConversionError`: the CLI prints its message and exits with status 1, no traceback.

Non-tensor entries of a PyTorch checkpoint (legacy configs or step counters that some releases pickle beside the
weights) are not returned by `load_tensors`: they are listed in a printed note, because they are not weights and a
converted model never needs them.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError
from huggingface_hub.utils import validate_repo_id

from posformers.loading import CheckpointError, safetensors_header

SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_INDEX = "pytorch_model.bin.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
# What a Hub `--source` downloads besides the weights: configs, tokenizer files (vocab.txt, merges.txt, spm.model),
# the model card; weights: safetensors where the repo has them, else pickles or a TF checkpoint (bert_model.ckpt.*).
HUB_FILES = ("*.json", "*.txt", "*.model", "README.md")
HUB_PICKLES = [f"*{suffix}" for suffix in PICKLE_SUFFIXES] + ["*.ckpt.*"]
# Fields of Google BERT's bert_config.json that every BERT-shaped encoder's config has, with the same meaning.
BERT_ENCODER_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_TOLERANCE = 1e-4
# Above this many tensors a mapping shows a progress bar (when stderr is a terminal).
PROGRESS_MIN_TENSORS = 200


class ConversionError(Exception):
    """A problem with the user's input or the conversion; its message says what and where, and what to do."""


def log(message: str = "") -> None:
    """Progress and report lines go to stdout, so that they can be read (and checked) when run as a command."""
    print(message, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


def checkpoint_files(path: str | Path) -> list[Path]:
    """The weight files of `path` (a file or a directory), safetensors preferred over pickles.

    In a directory: the shards named by `model.safetensors.index.json`, else every `*.safetensors`, else the shards of
    `pytorch_model.bin.index.json`, else every `*.bin` / `*.pt` / `*.pth` / `*.ckpt`.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConversionError(f"{path}: no such file or directory")
    for index_name, pattern in ((SAFETENSORS_INDEX, "*.safetensors"), (PYTORCH_INDEX, None)):
        index = path / index_name
        if index.is_file():
            return _indexed_files(index)
        if pattern and (files := sorted(path.glob(pattern))):
            return files
    files = sorted(file for suffix in PICKLE_SUFFIXES for file in path.glob(f"*{suffix}"))
    if not files:
        raise ConversionError(
            f"{path}: no weights found (looked for {SAFETENSORS_INDEX}, *.safetensors, {PYTORCH_INDEX}, "
            f"{', '.join('*' + s for s in PICKLE_SUFFIXES)})"
        )
    return files


def _indexed_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ConversionError(f"{index}: not a valid shard index ({error})") from error
    files = [index.parent / name for name in dict.fromkeys(weight_map.values())]
    if missing := [str(file) for file in files if not file.is_file()]:
        raise ConversionError(f"{index} names shard files that do not exist: {missing}")
    return files


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint at `path` (file or directory, sharded or not), on the CPU, by name.

    safetensors files are read as they are; pickles (`*.bin`, `*.pt`, ...) only with `torch.load(weights_only=True)`,
    which refuses anything that would run code. Non-tensor entries are left out with a printed note.
    """
    tensors: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        loaded = _load_safetensors(file) if file.suffix == ".safetensors" else _load_pickle(file)
        if duplicates := sorted(set(loaded) & set(tensors)):
            raise ConversionError(f"{file}: tensors also found in another shard: {duplicates}")
        tensors.update(loaded)
    if not tensors:
        raise ConversionError(f"{path}: the checkpoint holds no tensors")
    return tensors


def _load_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as error:
        try:  # says "truncated" or "corrupted header" and by how much, where it can tell
            safetensors_header(str(file))
        except CheckpointError as problem:
            raise ConversionError(str(problem)) from error
        raise ConversionError(f"{file}: not a readable safetensors file ({error})") from error


def _load_pickle(file: Path) -> dict[str, torch.Tensor]:
    try:
        try:
            loaded = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:  # mmap needs the zip format; legacy (torch<1.6) files are read into memory
            if "mmap" not in str(error) and "zip" not in str(error):
                raise
            loaded = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        unpickled = re.search(r"GLOBAL (\S+)", str(error))
        raise ConversionError(
            f"{file}: refused to load. This pickle needs more than tensors to be unpickled"
            + (f" (it calls {unpickled.group(1)})" if unpickled else "")
            + ", which could run arbitrary code, so it is not read. If you trust the file, re-save its tensors in a "
            "separate step in an isolated environment, e.g. `safetensors.torch.save_file(torch.load(path, "
            "weights_only=False), 'model.safetensors')`, and convert the safetensors file"
        ) from error
    except (RuntimeError, OSError, EOFError) as error:
        raise ConversionError(f"{file}: not a readable PyTorch checkpoint ({error})") from error
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]  # training checkpoints wrap the weights
    if not isinstance(loaded, dict):
        raise ConversionError(f"{file}: expected a dict of tensors, found a {type(loaded).__name__}")
    tensors = {key: value for key, value in loaded.items() if isinstance(value, torch.Tensor)}
    if others := sorted(set(loaded) - set(tensors)):
        log(f"note: {file.name}: ignored non-tensor entries (not weights): {others}")
    return tensors


def resolve_source(source: str) -> tuple[str, str | None]:
    """`--source` as a local path: as given when it exists or is no Hub repo id, else the repo's snapshot in the Hub
    cache (downloaded when online: configs, tokenizer files, the model card and one format of weights). Returns
    (path, the repo id or None)."""
    if Path(source).exists():
        return source, None
    try:
        validate_repo_id(source)
    except HFValidationError:
        return source, None  # a mistyped path: the family says "no such file or directory"
    try:
        if hf_constants.HF_HUB_OFFLINE:
            folder = snapshot_download(source, local_files_only=True)
        else:
            files = HfApi().list_repo_files(source)
            weights = ["*.safetensors"] if any(name.endswith(".safetensors") for name in files) else HUB_PICKLES
            folder = snapshot_download(source, allow_patterns=[*HUB_FILES, *weights])
    except LocalEntryNotFoundError as error:
        raise ConversionError(
            f"--source {source}: no such local path, and the Hub is offline (HF_HUB_OFFLINE=1) with no cached copy of "
            "that repo: download it while online, or give a local folder"
        ) from error
    except RepositoryNotFoundError as error:
        raise ConversionError(f"--source {source}: no such local path, nor a Hub repo of that name") from error
    except (HfHubHTTPError, OSError) as error:
        first_line = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise ConversionError(
            f"--source {source}: no such local path; downloading the Hub repo failed: {first_line}"
        ) from error
    log(f"--source {source}: the Hub repo, in {folder}")
    return folder, source


def source_license(source: Path, fallback: str | None) -> str:
    """The license of the source weights: the `license:` of the model card in their folder, else the family's own
    (`Source.license`), else "unknown"."""
    from posformers.integrations import hub

    folder = source if source.is_dir() else source.parent
    return hub.weights_license(folder) or fallback or "unknown"


def read_json(path: Path) -> dict:
    """The JSON object in `path` (a config file); ConversionError when it cannot be read or is not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConversionError(f"{path}: not a readable JSON file ({error})") from error
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return value


# ---------------------------------------------------------------------------------------------------------------------
# Key maps and strict accounting
# ---------------------------------------------------------------------------------------------------------------------

# A rule's replacement: a `re` template ("roformer.encoder.layer.\\1.attention.self.query.weight"), or a callable
# `(match, tensor) -> {target_key: tensor}` for transposes, splits and anything else (it may return several keys).
Replacement = str | Callable[[re.Match, torch.Tensor], dict[str, torch.Tensor]]


def transposed(template: str) -> Callable[[re.Match, torch.Tensor], dict[str, torch.Tensor]]:
    """A rule replacement that renames with `template` and transposes a 2-D kernel ((in, out) -> (out, in))."""

    def rule(match: re.Match, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if tensor.dim() != 2:
            raise ConversionError(f"{match.string}: expected a 2-D kernel, got shape {tuple(tensor.shape)}")
        return {match.expand(template): tensor.t().contiguous()}

    return rule


@dataclass
class MappingReport:
    """What `KeyMap.apply` did: (source, target) pairs and (source, reason) pairs, in source order."""

    mapped: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"mapped {len(self.mapped)} tensors, dropped {len(self.dropped)}"]
        by_reason: dict[str, list[str]] = {}
        for key, reason in self.dropped:
            by_reason.setdefault(reason, []).append(key)
        for reason, keys in by_reason.items():
            shown = ", ".join(keys[:3]) + (f", ... ({len(keys)} in all)" if len(keys) > 3 else "")
            lines.append(f"  dropped {shown}: {reason}")
        return "\n".join(lines)


class KeyMap:
    """Renames a source state dict into posformers names; every source key must be mapped or deliberately dropped.

    rules: ordered `(regex, replacement)`; the first regex that fully matches a key maps it (see `Replacement`).
    dropped: `{regex: reason}`; a key fully matching one of them is dropped with that reason (checked before rules,
        so an optimizer slot like `.../kernel/adam_m` is never mapped by accident).
    """

    def __init__(self, rules: Iterable[tuple[str, Replacement]], dropped: dict[str, str] | None = None):
        self.rules = [(re.compile(pattern), replacement) for pattern, replacement in rules]
        self.dropped = [(re.compile(pattern), reason) for pattern, reason in (dropped or {}).items()]

    def apply(self, source: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], MappingReport]:
        """The renamed tensors and a report. `source` is emptied as it goes, so only one copy of the weights lives.

        Raises ConversionError listing every key that no rule or drop pattern matches (nothing is returned then),
        and for two source keys that map to the same target.
        """
        if unmatched := [key for key in source if self._drop_reason(key) is None and self._rule(key) is None]:
            raise ConversionError(
                f"{len(unmatched)} source tensor(s) are neither mapped nor deliberately dropped, so the conversion "
                f"stops rather than lose them: {unmatched}"
            )
        target: dict[str, torch.Tensor] = {}
        report = MappingReport()
        for key in _progress(list(source), "mapping tensors"):
            tensor = source.pop(key)
            if (reason := self._drop_reason(key)) is not None:
                report.dropped.append((key, reason))
                continue
            pattern, replacement = self._rule(key)
            match = pattern.fullmatch(key)
            if isinstance(replacement, str):
                produced = {match.expand(replacement): tensor}
            else:
                produced = replacement(match, tensor)
            for new_key, new_tensor in produced.items():
                if new_key in target:
                    raise ConversionError(f"two source tensors map to {new_key!r} (the second is {key!r})")
                target[new_key] = new_tensor
                report.mapped.append((key, new_key))
        return target, report

    def _drop_reason(self, key: str) -> str | None:
        return next((reason for pattern, reason in self.dropped if pattern.fullmatch(key)), None)

    def _rule(self, key: str):
        return next(((pattern, rep) for pattern, rep in self.rules if pattern.fullmatch(key)), None)


def _progress(items: list, description: str) -> Iterator:
    from tqdm.auto import tqdm

    disable = len(items) < PROGRESS_MIN_TENSORS or not sys.stderr.isatty()
    return iter(tqdm(items, desc=description, unit="tensor", disable=disable))


# ---------------------------------------------------------------------------------------------------------------------
# Checks and the model
# ---------------------------------------------------------------------------------------------------------------------


def expected_state(model_class, config) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The persistent tensors `model_class(config)` holds (on the meta device: shapes and dtypes, no data), and the
    tied keys it recreates by itself.

    The model is built on the meta device: no memory, no initialisation.
    """
    with torch.device("meta"):
        model = model_class(config)
    return dict(model.state_dict()), set(getattr(model, "all_tied_weights_keys", None) or {})


def check_state_dict(model, target: dict[str, torch.Tensor]) -> None:
    """Stop (ConversionError) unless `target` fills exactly the persistent tensors of `model`, with their shapes, and
    floating-point tensors with floating-point values (an integer tensor would be cast silently).

    model: a model instance, or `(model_class, config)`. Tied weights the model recreates (the MLM decoder tied to
    the word embeddings) may be present or absent. The message, one line, names every missing and unexpected key,
    every shape mismatch (expected vs found) and every tensor of a non-floating dtype.
    """
    if isinstance(model, tuple):
        expected, tied = expected_state(*model)
    else:
        expected = dict(model.state_dict())
        tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    shapes = {key: value.shape for key, value in expected.items()}
    missing = sorted(set(shapes) - set(target) - tied)
    unexpected = sorted(set(target) - set(shapes))
    mismatched = [
        f"{key}: expected {tuple(shapes[key])}, found {tuple(target[key].shape)}"
        for key in sorted(set(shapes) & set(target))
        if tuple(shapes[key]) != tuple(target[key].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing (the model needs them, the source has nothing for them): {missing}")
    if unexpected:
        problems.append(f"unexpected (the model has no such tensor): {unexpected}")
    if mismatched:
        problems.append("shape mismatches: " + "; ".join(mismatched))
    if wrong_dtypes := [
        f"{key}: {str(target[key].dtype).removeprefix('torch.')}"
        for key in sorted(set(expected) & set(target))
        if expected[key].is_floating_point() and not target[key].is_floating_point()
    ]:
        problems.append("not floating point (the model's weights are): " + "; ".join(wrong_dtypes))
    if problems:
        raise ConversionError("The converted weights do not fit the model: " + " | ".join(problems))


def build_model(model_class, config, target: dict[str, torch.Tensor]):
    """`model_class(config)` holding `target` (checked with `check_state_dict` first), in eval mode.

    Goes through transformers' own loading path (`from_pretrained(None, state_dict=...)`), so tied weights and
    computed buffers are set up exactly as for a model loaded from disk.
    """
    check_state_dict((model_class, config), target)
    dtype = next(iter(target.values())).dtype
    model = model_class.from_pretrained(None, config=config, state_dict=target, dtype=dtype)
    return model.eval()


# ---------------------------------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------------------------------


def max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if actual.shape != expected.shape:
        raise ConversionError(f"output shapes differ: {tuple(actual.shape)} vs reference {tuple(expected.shape)}")
    return (actual.double() - expected.double()).abs().max().item()


def compare_outputs(
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], tolerance: float = DEFAULT_TOLERANCE
) -> dict[str, float]:
    """Print "output | max abs diff" for each `(ours, reference)` pair; ConversionError if any exceeds `tolerance`."""
    diffs = {name: max_abs_diff(ours, reference) for name, (ours, reference) in pairs.items()}
    width = max(len("output"), *(len(name) for name in diffs))
    log("verification against the reference implementation:")
    log(f"  {'output'.ljust(width)} | max abs diff")
    for name, diff in diffs.items():
        log(f"  {name.ljust(width)} | {diff:.3e}")
    if failed := {name: diff for name, diff in diffs.items() if not diff <= tolerance}:
        raise ConversionError(
            f"verification failed: {', '.join(f'{n} differs by {d:.3e}' for n, d in failed.items())} "
            f"(tolerance {tolerance:g}); nothing was written"
        )
    log(f"  all outputs within {tolerance:g}")
    return diffs


def verification_batch(vocab_size: int, type_vocab_size: int = 2, *, batch: int = 2, length: int = 12, seed: int = 0):
    """A fixed batch: random ids (the second row half padding) and two segments. Returns model input tensors."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1:, length // 2 :] = 0
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if type_vocab_size > 1:
        token_type_ids = torch.zeros_like(input_ids)
        token_type_ids[:, length // 3 :] = 1
        inputs["token_type_ids"] = token_type_ids
    return inputs


def masked_hidden(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`hidden` (B, L, ...) with padded positions zeroed: outputs there are arbitrary and not compared."""
    keep = attention_mask.to(hidden.dtype).reshape(*attention_mask.shape, *([1] * (hidden.dim() - 2)))
    return hidden * keep


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer files
# ---------------------------------------------------------------------------------------------------------------------


def tokenizer_location(vocab: str | None, source_dir: Path) -> Path:
    """Where the tokenizer files are: `--vocab` when given (it must exist), else the source's own directory."""
    location = Path(vocab) if vocab else source_dir
    if not location.exists():
        raise ConversionError(f"--vocab {location}: no such file or directory")
    return location


def no_tokenizer(location: Path, wanted: str, explicit: bool) -> None:
    """No tokenizer files (`wanted`) at `location`: an error for an explicit `--vocab`, else a note (and None)."""
    if explicit:
        raise ConversionError(f"--vocab {location}: no {wanted} there")
    log(f"note: {location} has no tokenizer files ({wanted}); no tokenizer written (see --vocab)")


# ---------------------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------------------


def check_output_dir(output_dir: str | Path, overwrite: bool) -> Path:
    """Refuse a non-empty `output_dir` unless `overwrite`; called first, before any work."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ConversionError(f"--output_dir {output_dir} exists and is not a directory")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ConversionError(
            f"--output_dir {output_dir} exists and is not empty; pass --overwrite to replace it (its contents are "
            "deleted)"
        )
    return output_dir


@dataclass
class OutputInfo:
    """What the model card says about where the weights came from."""

    source_description: str  # e.g. "ZhuiyiTechnology RoFormer TensorFlow checkpoint /data/.../bert_model.ckpt"
    command_line: str
    base_model: str | None = None  # a Hub repo id the source is known as, for the card metadata
    license: str = "unknown"  # the source weights' license
    verification: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)


def conversion_card(model, info: OutputInfo, repo_id: str | None = None) -> str:
    """README.md: posformers' model card (metadata, usage, config) plus how the weights were converted."""
    from posformers.integrations import hub

    card = hub.model_card(
        model, repo_id, license=info.license, base_model=info.base_model or False, tags=("converted",)
    )
    card = str(card)
    lines = ["", "## Conversion", "", f"Converted from {info.source_description} with:", "", "```bash"]
    lines += [info.command_line, "```", ""]
    if info.verification:
        lines += ["Verification against the reference implementation (max abs difference, fp32):", ""]
        lines += ["| output | max abs diff |", "|---|---|"]
        lines += [f"| {name} | {diff:.2e} |" for name, diff in info.verification.items()]
        lines.append("")
    else:
        lines += ["The conversion ran with `--no_verify`: outputs were not compared with a reference.", ""]
    lines += [f"- {note}" for note in info.notes]
    return card.rstrip("\n") + "\n" + "\n".join(lines).rstrip("\n") + "\n"


def write_output(
    model,
    output_dir: str | Path,
    *,
    overwrite: bool,
    info: OutputInfo,
    tokenizer=None,
    dtype: str = "float32",
    max_shard_size: str | int = "5GB",
    push_to_hub: str | None = None,
    extras: Callable[[Path], None] | None = None,
) -> Path:
    """Save `model` (safetensors, sharded above `max_shard_size`, with its remote-code files), `tokenizer`, what
    `extras(folder)` writes and a model card into `output_dir`, atomically: everything goes into a temporary sibling
    directory that is renamed at the end, so a failure never leaves a partial output. Then push the directory to
    `push_to_hub` (a repo id) if given.
    """
    output_dir = check_output_dir(output_dir, overwrite).resolve()
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    model = model.to(DTYPES[dtype])
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    try:
        staging.chmod(0o777 & ~current_umask())  # mkdtemp's 0700, renamed into place, would be the output's mode
        model.save_pretrained(staging, max_shard_size=max_shard_size)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if extras is not None:
            extras(staging)
        (staging / "README.md").write_text(conversion_card(model, info, push_to_hub), encoding="utf-8")
        _replace_dir(staging, output_dir)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):  # a full disk (ENOSPC), a quota, permissions: nothing was replaced
            kept = "the previous output is unchanged" if output_dir.exists() else "nothing was written"
            raise ConversionError(
                f"--output_dir {output_dir}: writing failed ({error.strerror or error}); {kept}"
            ) from error
        raise
    log(f"wrote {output_dir}: {', '.join(sorted(path.name for path in output_dir.iterdir()))}")
    if push_to_hub:
        push_output(model, output_dir, push_to_hub, tokenizer=tokenizer, max_shard_size=max_shard_size)
    return output_dir


def current_umask() -> int:
    """The process's umask (reading it means setting it: it is set straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _replace_dir(staging: Path, output_dir: Path) -> None:
    """Move `staging` to `output_dir`; an existing `output_dir` (allowed by --overwrite) is removed only once the new
    one is in place."""
    if not output_dir.exists():
        staging.rename(output_dir)
        return
    old = output_dir.with_name(f".{output_dir.name}.old-{staging.name.rsplit('-', 1)[-1]}")
    output_dir.rename(old)
    try:
        staging.rename(output_dir)
    except BaseException:
        old.rename(output_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def push_output(model, output_dir: Path, repo_id: str, *, tokenizer=None, max_shard_size: str | int = "5GB") -> None:
    """Upload the written directory through posformers' `save_pretrained(push_to_hub=True)`: the conversion card
    already in `output_dir` is kept (a README.md already on the Hub is merged, not replaced), weights and code are
    re-saved identically and uploaded; the tokenizer follows with its own `push_to_hub`."""
    try:
        model.save_pretrained(output_dir, push_to_hub=True, repo_id=repo_id, max_shard_size=max_shard_size)
        if tokenizer is not None:
            tokenizer.push_to_hub(repo_id)
    except Exception as error:  # the local output is complete; say so, and why the upload failed
        raise ConversionError(
            f"the converted model is complete in {output_dir}, but pushing it to {repo_id} failed: {error}"
        ) from error
    log(f"pushed {output_dir} to {repo_id}")


# ---------------------------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------------------------


class Source(ABC):
    """One source format of one family (`roformer --from tf`, `deberta --from original`, ...), as `run_conversion`
    drives it. Built from the parsed command line, it reads nothing until `load`. A subclass provides, in the order
    they are called:

        load() -> tensors     read the source: return its tensors (under source names), set `config` and
                              `model_class`, check what only the source can tell (tied copies, position tables)
        key_map() -> KeyMap   source names -> posformers names, for what `load` found
        complete(target, report) -> target
                              after the mapping: add what the source lacks (fresh parameters), cast, note what the
                              mapping means; the default returns `target` unchanged
        verify(model) -> diffs
                              compare `model` with the reference implementation (`compare_outputs`); --no_verify skips
        tokenizer()           the tokenizer to save beside the model, or None
        describe() -> str     where the weights came from, for the model card
        write_extras(model, folder)
                              files to write next to the saved model and tokenizer (before the card), e.g.
                              sentence-transformers modules; the default writes none

    `help` (class attribute) is the format's entry in `--from`'s help; `notes` collects lines for the model card.
    """

    help = ""
    base_model: str | None = None  # a Hub repo id the source is known as, for the card metadata
    license: str | None = None  # the license of every checkpoint of this format, where one license covers them all

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.path = Path(args.source)
        self.config = None
        self.model_class = None
        self.notes: list[str] = []

    @abstractmethod
    def load(self) -> dict[str, torch.Tensor]: ...

    @abstractmethod
    def key_map(self) -> KeyMap: ...

    def complete(self, target: dict[str, torch.Tensor], report: MappingReport) -> dict[str, torch.Tensor]:
        return target

    @abstractmethod
    def verify(self, model) -> dict[str, float]: ...

    @abstractmethod
    def tokenizer(self): ...

    @abstractmethod
    def describe(self) -> str: ...

    def write_extras(self, model, folder: Path) -> None:
        return None


def run_conversion(source: Source, args: argparse.Namespace) -> int:
    """Convert `source` into `args.output` (and push it): load, map with strict accounting, check the shapes against
    the model, build it, verify it, write it atomically. Returns the exit status; raises ConversionError."""
    check_output_dir(args.output, args.overwrite)
    tensors = source.load()
    target, report = source.key_map().apply(tensors)
    log(report.summary())
    target = source.complete(target, report)
    try:
        model = build_model(source.model_class, source.config, target)
    except ConversionError as error:
        raise ConversionError(f"--source {source.path}: {error}") from error
    del target
    verification = None if args.no_verify else source.verify(model)
    info = OutputInfo(
        source_description=source.describe(),
        command_line=args.command_line,
        base_model=source.base_model or getattr(args, "source_repo_id", None),
        license=source_license(source.path, source.license),
        verification=verification,
        notes=[line.strip() for line in report.summary().splitlines()] + source.notes,
    )
    tokenizer = source.tokenizer()
    write_output(
        model,
        args.output,
        overwrite=args.overwrite,
        info=info,
        tokenizer=tokenizer,
        dtype=args.dtype,
        push_to_hub=args.push_to_hub,
        extras=lambda folder: source.write_extras(model, folder),
    )
    return 0
