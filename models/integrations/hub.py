"""Hugging Face Hub integration shared by every posformers model: the model card written on push.

Each model's `PreTrainedModel` base names `posformers.hub_methods.HubMethods` in its class line; its `push_to_hub` and
`save_pretrained(push_to_hub=True)` call `push_to_hub` and `save_pretrained` here, which upload, in the same commit as
the weights, a README.md whose YAML metadata lets the Hub index the model:

    library_name: transformers     # what the Hub needs to offer `trust_remote_code` loading
    license: apache-2.0            # `license=` overrides; a model loaded from weights takes their card's license
    base_model: org/name           # `base_model=`, else the repo the weights were loaded from (if any)
    pipeline_tag: fill-mask        # from the head: the Auto class the model is registered with
    tags: [posformers, roformer]   # plus `tags=` and `model.model_tags`

A README.md already on the Hub is never replaced: it is uploaded back as it is, with only the metadata keys it lacks
(and missing tags) added, unless `overwrite_model_card=True` is passed. Only public API is used: transformers'
`save_pretrained` writes the files, huggingface_hub's `HfApi.create_commit` uploads them with the card.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from huggingface_hub import (
    CommitInfo,
    CommitOperationAdd,
    HfApi,
    ModelCard,
    ModelCardData,
    hf_hub_download,
    try_to_load_from_cache,
)
from huggingface_hub.errors import EntryNotFoundError, HFValidationError, RevisionNotFoundError
from huggingface_hub.utils import validate_repo_id

from ..configuration_common import SIZE_FIELDS

DEFAULT_LICENSE = "apache-2.0"
LIBRARY_NAME = "transformers"
LIBRARY_TAG = "posformers"
MODEL_TYPE_PREFIX = "posformers-"
README = "README.md"

# The Hub's pipeline tag for each Auto class a head can be registered with.
PIPELINE_TAGS = {
    "AutoModel": "feature-extraction",
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForCausalLM": "text-generation",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
    "AutoModelForMultipleChoice": "multiple-choice",
}

# Config fields listed in the generated card, when the config has them.
_CARD_CONFIG_FIELDS = (
    *SIZE_FIELDS,
    "max_position_embeddings",
    "rope_parameters",
    "rotary_dim",
    "rope_layout",
    "norm_type",
    "attention_kernel",
)


@dataclasses.dataclass(frozen=True)
class CardOptions:
    """What the caller of `push_to_hub` / `save_pretrained(push_to_hub=True)` asked of the model card."""

    license: str | None = None
    base_model: str | bool | None = None  # None: infer; False: omit
    tags: tuple[str, ...] = ()
    overwrite: bool = False
    local_card: str | None = None  # README.md that was already in save_pretrained's folder


# ---------------------------------------------------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------------------------------------------------


def pipeline_tag(model) -> str | None:
    """The Hub pipeline tag of `model` (instance or class), from the Auto class its head is registered with."""
    model_class = model if isinstance(model, type) else type(model)
    return PIPELINE_TAGS.get(getattr(model_class, "_auto_class", None))


def model_type_tag(config) -> str:
    """`config.model_type` as users know it: "posformers-roformer" -> "roformer"."""
    model_type = config.model_type
    return model_type[len(MODEL_TYPE_PREFIX) :] if model_type.startswith(MODEL_TYPE_PREFIX) else model_type


def looks_like_repo_id(name) -> bool:
    """True for "namespace/name" strings that are valid Hub repo ids and not an existing local path."""
    if not isinstance(name, str) or name.count("/") != 1 or os.path.exists(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def infer_base_model(model, repo_id: str | None = None) -> str | None:
    """The Hub repo the model's weights came from (`config._name_or_path`), unless it is `repo_id` itself."""
    name = getattr(model.config, "_name_or_path", None) or ""
    if not looks_like_repo_id(name) or (repo_id is not None and name == repo_id):
        return None
    return name


def weights_license(name_or_path) -> str | None:
    """The `license:` of the model card beside the weights at `name_or_path` (a local folder, or a Hub repo whose
    README.md is in the local cache: nothing is downloaded), or None when there is none."""
    if not name_or_path:
        return None
    path = Path(name_or_path) / README
    if not path.is_file() and looks_like_repo_id(name_or_path):
        cached = try_to_load_from_cache(name_or_path, README)
        path = Path(cached) if isinstance(cached, str) else path
    if not path.is_file():
        return None
    license = ModelCard(path.read_text(encoding="utf-8"), ignore_metadata_errors=True).data.get("license")
    return str(license) if license else None


def default_license(name_or_path) -> str:
    """The license of a model made from the weights at `name_or_path`: theirs ("unknown" when their card does not
    say), or DEFAULT_LICENSE for a model made from scratch (no `name_or_path`)."""
    if not name_or_path:
        return DEFAULT_LICENSE
    return weights_license(name_or_path) or "unknown"


def card_metadata(
    model,
    repo_id: str | None = None,
    *,
    license: str | None = None,
    base_model: str | bool | None = None,
    tags: Iterable[str] = (),
) -> dict:
    """The YAML metadata posformers writes for `model`, in the order a card shows it, unknown values left out.

    base_model: a repo id, `None` to use the repo the weights were loaded from (if any), `False` to leave it out.
    """
    if base_model is None:
        base_model = infer_base_model(model, repo_id)
    all_tags = [LIBRARY_TAG, model_type_tag(model.config), *(getattr(model, "model_tags", None) or []), *tags]
    metadata = {
        "library_name": LIBRARY_NAME,
        "license": license or default_license(getattr(model.config, "_name_or_path", None)),
        "base_model": base_model or None,
        "pipeline_tag": pipeline_tag(model),
        "tags": list(dict.fromkeys(all_tags)),
    }
    return {key: value for key, value in metadata.items() if value is not None}


# ---------------------------------------------------------------------------------------------------------------------
# Cards
# ---------------------------------------------------------------------------------------------------------------------


def _card_body(model, repo_id: str | None, metadata: dict) -> str:
    model_class = type(model).__name__
    auto_class = getattr(type(model), "_auto_class", None) or "AutoModel"
    name = repo_id.rsplit("/", 1)[-1] if repo_id else model_class
    load_id = repo_id or "path/to/model"
    lines = [
        f"# {name}",
        "",
        f"A `{model_class}` ({model_type_tag(model.config)}) made with "
        "[posformers](https://github.com/posformers/posformers).",
    ]
    if metadata.get("base_model"):
        lines += ["", f"Base model: [{metadata['base_model']}](https://huggingface.co/{metadata['base_model']})."]
    lines += [
        "",
        "## Usage",
        "",
        "The model code ships with the weights, so transformers alone loads it:",
        "",
        "```python",
        f"from transformers import {auto_class}, AutoTokenizer",
        "",
        f'model = {auto_class}.from_pretrained("{load_id}", trust_remote_code=True)',
        f'tokenizer = AutoTokenizer.from_pretrained("{load_id}", trust_remote_code=True)',
        "```",
        "",
        "The tokenizer is transformers' own class, but `AutoTokenizer` reads `config.json` first and, without the "
        "flag, asks on stdin whether to run the model's code (`trust_remote_code=False` loads the tokenizer too, with "
        "a warning about the model type).",
        "",
        "With posformers installed, `import posformers` registers the architecture and `trust_remote_code` is not "
        "needed:",
        "",
        "```python",
        "import posformers",
        f"from transformers import {auto_class}, AutoTokenizer",
        "",
        f'model = {auto_class}.from_pretrained("{load_id}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{load_id}")',
        "```",
        "",
        "## Configuration",
        "",
        "| field | value |",
        "|---|---|",
        f"| architecture | `{model_class}` |",
        f"| parameters | {model.num_parameters():,} |",
    ]
    for field in _CARD_CONFIG_FIELDS:
        value = getattr(model.config, field, None)
        if value is not None:
            lines.append(f"| {field} | `{value}` |")
    return "\n".join(lines) + "\n"


def model_card(model, repo_id: str | None = None, **metadata_fields) -> ModelCard:
    """A new model card for `model`: the `card_metadata` YAML block (`metadata_fields` are its keyword arguments), a
    short description and loading instructions."""
    metadata = card_metadata(model, repo_id, **metadata_fields)
    data = ModelCardData(**metadata).to_yaml(original_order=list(metadata))
    return ModelCard(f"---\n{data}\n---\n\n{_card_body(model, repo_id, metadata)}")


def merge_card_metadata(content: str, metadata: dict) -> str:
    """`content` (an existing README.md) with the keys of `metadata` it lacks added and missing tags appended.

    Values already in the card win. The text below the YAML block is kept as it is; if nothing is missing the whole
    content is returned unchanged, byte for byte (otherwise the YAML block is re-serialized, keeping its key order).
    """
    card = ModelCard(content)
    changed = False
    for key, value in metadata.items():
        if key == "tags":
            existing = card.data.get("tags")
            existing = [existing] if isinstance(existing, str) else list(existing or [])
            missing = [tag for tag in value if tag not in existing]
            if missing:
                card.data.tags = existing + missing
                changed = True
        elif card.data.get(key) is None:
            card.data[key] = value
            changed = True
    return card.content if changed else content


def _remote_card(repo_id: str, *, token=None, revision: str | None = None) -> str | None:
    """README.md of `repo_id` on the Hub (at `revision`, else the default branch), or None if there is none."""
    try:
        path = hf_hub_download(repo_id, README, revision=revision, token=token)
    except EntryNotFoundError:
        return None
    except RevisionNotFoundError:
        if revision is None:
            raise
        return _remote_card(repo_id, token=token)  # a branch push_to_hub is about to create from the default one
    return Path(path).read_text(encoding="utf-8")


def card_for_push(model, repo_id: str, existing: str | None, options: CardOptions | None = None) -> str:
    """README.md content to upload with `model` to `repo_id`, given the card `existing` there (None if none)."""
    options = options or CardOptions()
    metadata = card_metadata(model, repo_id, license=options.license, base_model=options.base_model, tags=options.tags)
    if existing is not None and not options.overwrite:
        return merge_card_metadata(existing, metadata)
    if options.local_card is not None:
        return merge_card_metadata(options.local_card, metadata)
    return str(model_card(model, repo_id, license=options.license, base_model=options.base_model, tags=options.tags))


# ---------------------------------------------------------------------------------------------------------------------
# Pushing
# ---------------------------------------------------------------------------------------------------------------------


def _file_times(folder: Path) -> dict[str, int]:
    """{path relative to `folder`: modification time in ns} of every file under `folder` (none if it is missing)."""
    return {
        path.relative_to(folder).as_posix(): path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()
    }


def push_with_card(
    model,
    folder: Path,
    paths: Iterable[str],
    repo_id: str,
    options: CardOptions,
    *,
    private: bool | None = None,
    token: bool | str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    commit_description: str | None = None,
) -> CommitInfo:
    """Upload `paths` (relative to `folder`) and the posformers card to `repo_id` in one commit.

    The card (see `card_for_push`) is also written to `folder`/README.md, so the folder holds what the Hub holds.
    Creates the repo, and the branch `revision`, if they do not exist yet.
    """
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None and not revision.startswith("refs/pr/"):
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    existing = None if options.overwrite else _remote_card(repo_id, token=token, revision=revision)
    with open(folder / README, "w", encoding="utf-8", newline="") as f:
        f.write(card_for_push(model, repo_id, existing, options))
    operations = [
        CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(folder / path)) for path in sorted({*paths, README})
    ]
    return api.create_commit(
        repo_id,
        operations,
        commit_message=commit_message or f"Upload {type(model).__name__}",
        commit_description=commit_description,
        revision=revision,
        create_pr=create_pr,
    )


# `save_pretrained(push_to_hub=True, ...)` keywords that are about the upload, not the files.
_PUSH_KEYWORDS = ("repo_id", "private", "commit_message", "commit_description", "create_pr", "revision")


def push_to_hub(
    model,
    repo_id: str,
    *,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: bool | str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    max_shard_size: int | str | None = "50GB",
    tags: list[str] | str | None = None,
    license: str | None = None,
    base_model: str | bool | None = None,
    overwrite_model_card: bool = False,
) -> CommitInfo:
    """`model.push_to_hub(repo_id, ...)` of a posformers model (`HubMethods`): upload the model (weights, config,
    code) and its model card to `repo_id` in one commit.

    transformers' `PreTrainedModel.push_to_hub` parameters (`tags` are added to the card's tags, after
    "posformers", the model type and `model.model_tags`), plus the card options:

        license (`str`, *optional*, defaults to `"apache-2.0"`): license of a new card, or added to a card
            without one.
        base_model (`str` or `False`, *optional*): the model this one derives from; defaults to the Hub repo the
            weights were loaded from, if any. `False` leaves it out.
        overwrite_model_card (`bool`, *optional*, defaults to `False`): replace a README.md already on the Hub
            instead of only adding the metadata it lacks.
    """
    tags = (tags,) if isinstance(tags, str) else tuple(tags or ())
    options = CardOptions(license=license, base_model=base_model, tags=tags, overwrite=overwrite_model_card)
    with tempfile.TemporaryDirectory() as tmp_dir:
        folder = Path(tmp_dir)
        model.save_pretrained(folder, max_shard_size=max_shard_size)
        return push_with_card(
            model,
            folder,
            list(_file_times(folder)),
            repo_id,
            options,
            private=private,
            token=token,
            revision=revision,
            create_pr=create_pr,
            commit_message=commit_message,
            commit_description=commit_description,
        )


def save_pretrained(
    model,
    save: Callable[..., None],
    save_directory: str | os.PathLike,
    is_main_process: bool = True,
    state_dict: dict | None = None,
    push_to_hub: bool = False,
    *,
    license: str | None = None,
    base_model: str | bool | None = None,
    overwrite_model_card: bool = False,
    **kwargs,
) -> None:
    """`model.save_pretrained(...)` of a posformers model (`HubMethods`), `save` being transformers' method.

    With `push_to_hub=True`, the saving rank then uploads the files this call wrote and the model card in one commit
    (keywords `repo_id`, defaulting to the folder's name, `private`, `commit_message`, `commit_description`,
    `create_pr`, `revision`, `token`, and the card options of `push_to_hub`). A README.md already in `save_directory`
    is the card's starting point when the Hub has none (or `overwrite_model_card=True`); the uploaded card replaces
    it. Without `push_to_hub` the card options are ignored.
    """
    if not push_to_hub or kwargs.get("distributed_checkpoint"):
        # transformers pushes a distributed checkpoint from a consolidated copy, with its own card.
        return save(save_directory, is_main_process, state_dict, push_to_hub, **kwargs)
    push_kwargs = {key: kwargs.pop(key) for key in _PUSH_KEYWORDS if key in kwargs}
    folder = Path(save_directory)
    uploads = model.should_save_on_this_rank(is_main_process)  # every rank saves (a collective under FSDP)
    before = _file_times(folder) if uploads else {}
    readme = folder / README
    local_card = readme.read_text(encoding="utf-8") if uploads and readme.is_file() else None
    save(save_directory, is_main_process, state_dict, **kwargs)
    if not uploads:
        return
    written = [path for path, time in _file_times(folder).items() if before.get(path) != time]
    options = CardOptions(license=license, base_model=base_model, overwrite=overwrite_model_card, local_card=local_card)
    repo_id = push_kwargs.pop("repo_id", None) or folder.resolve().name
    push_with_card(model, folder, written, repo_id, options, token=kwargs.get("token"), **push_kwargs)
