"""Hugging Face Hub integration shared by every posformers model: the model card written on push.

`_registry.register` calls `enable_model_cards` on each model's `PreTrainedModel` base class. After that,
`model.push_to_hub(repo_id)` and `model.save_pretrained(dir, push_to_hub=True, repo_id=...)` upload a README.md whose
YAML metadata lets the Hub index the model:

    library_name: transformers     # what the Hub needs to offer `trust_remote_code` loading
    license: apache-2.0            # `license=` overrides
    base_model: org/name           # `base_model=`, else the repo the weights were loaded from (if any)
    pipeline_tag: fill-mask        # from the head: the Auto class the model is registered with
    tags: [posformers, roformer]   # plus `tags=` and `model.model_tags`

Both of transformers' upload paths write README.md into the folder they upload and then call
`_upload_modified_files`; the wrapped `_upload_modified_files` is where the posformers card replaces that file.
A README.md already on the Hub is never replaced: it is uploaded back as it is, with only the metadata keys it lacks
(and missing tags) added, unless `overwrite_model_card=True` is passed.

This module is package-level on purpose: model folders are copied next to the weights for `trust_remote_code` users
and must import only torch, transformers and their own files. A model loaded that way pushes with transformers'
plain behaviour.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import os
from collections.abc import Iterable
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HFValidationError, RevisionNotFoundError
from huggingface_hub.utils import validate_repo_id

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

# Card metadata keys written by posformers, in the order they appear in a generated card.
CARD_KEYS = ("library_name", "license", "base_model", "pipeline_tag", "tags")

# Config fields listed in the generated card, when the config has them.
_CARD_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "rope_theta",
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


_CARD_OPTIONS: contextvars.ContextVar[CardOptions | None] = contextvars.ContextVar(
    "posformers_card_options", default=None
)


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


def card_metadata(
    model,
    repo_id: str | None = None,
    *,
    license: str | None = None,
    base_model: str | bool | None = None,
    tags: Iterable[str] = (),
) -> dict:
    """The YAML metadata posformers writes for `model`, keys in `CARD_KEYS` order, unknown values left out.

    base_model: a repo id, `None` to use the repo the weights were loaded from (if any), `False` to leave it out.
    """
    if base_model is None:
        base_model = infer_base_model(model, repo_id)
    all_tags = [LIBRARY_TAG, model_type_tag(model.config), *(getattr(model, "model_tags", None) or []), *tags]
    metadata = {
        "library_name": LIBRARY_NAME,
        "license": license or DEFAULT_LICENSE,
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
        f"from transformers import {auto_class}",
        "",
        f'model = {auto_class}.from_pretrained("{load_id}", trust_remote_code=True)',
        "```",
        "",
        "With posformers installed, `import posformers` registers the architecture and `trust_remote_code` is not "
        "needed:",
        "",
        "```python",
        "import posformers",
        f"from transformers import {auto_class}",
        "",
        f'model = {auto_class}.from_pretrained("{load_id}")',
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


def model_card(
    model,
    repo_id: str | None = None,
    *,
    license: str | None = None,
    base_model: str | bool | None = None,
    tags: Iterable[str] = (),
) -> ModelCard:
    """A new model card for `model`: the `card_metadata` YAML block, a short description and loading instructions."""
    metadata = card_metadata(model, repo_id, license=license, base_model=base_model, tags=tags)
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
# Hooks into transformers' push_to_hub / save_pretrained
# ---------------------------------------------------------------------------------------------------------------------

_OPTIONS_DOC = """

        posformers model card options (keyword only):
            license (`str`, *optional*, defaults to `"apache-2.0"`): license of a new card, or added to a card
                without one.
            base_model (`str` or `False`, *optional*): the model this one derives from; defaults to the Hub repo the
                weights were loaded from, if any. `False` leaves it out.
            overwrite_model_card (`bool`, *optional*, defaults to `False`): replace a README.md already on the Hub
                instead of only adding the metadata it lacks.
"""


def _wrap_push_to_hub(push_to_hub):
    @functools.wraps(push_to_hub)
    def wrapper(self, *args, license=None, base_model=None, overwrite_model_card=False, **kwargs):
        tags = kwargs.get("tags") or ()
        options = CardOptions(
            license=license,
            base_model=base_model,
            tags=(tags,) if isinstance(tags, str) else tuple(tags),
            overwrite=overwrite_model_card,
        )
        token = _CARD_OPTIONS.set(options)
        try:
            return push_to_hub(self, *args, **kwargs)
        finally:
            _CARD_OPTIONS.reset(token)

    wrapper.__doc__ = (push_to_hub.__doc__ or "") + _OPTIONS_DOC
    return wrapper


def _wrap_save_pretrained(save_pretrained):
    signature = inspect.signature(save_pretrained)

    @functools.wraps(save_pretrained)
    def wrapper(self, save_directory, *args, license=None, base_model=None, overwrite_model_card=False, **kwargs):
        push_to_hub = signature.bind_partial(self, save_directory, *args, **kwargs).arguments.get("push_to_hub")
        if not push_to_hub:
            return save_pretrained(self, save_directory, *args, **kwargs)
        readme = Path(save_directory) / README
        options = CardOptions(
            license=license,
            base_model=base_model,
            overwrite=overwrite_model_card,
            local_card=readme.read_text(encoding="utf-8") if readme.is_file() else None,
        )
        token = _CARD_OPTIONS.set(options)
        try:
            return save_pretrained(self, save_directory, *args, **kwargs)
        finally:
            _CARD_OPTIONS.reset(token)

    wrapper.__doc__ = (save_pretrained.__doc__ or "") + _OPTIONS_DOC
    return wrapper


def _wrap_upload_modified_files(upload_modified_files):
    @functools.wraps(upload_modified_files)
    def wrapper(self, working_dir, repo_id, *args, **kwargs):
        readme = Path(working_dir) / README
        if readme.is_file():  # transformers wrote its card: replace it with ours
            options = _CARD_OPTIONS.get() or CardOptions()
            existing = None
            if not options.overwrite:
                existing = _remote_card(repo_id, token=kwargs.get("token"), revision=kwargs.get("revision"))
            content = card_for_push(self, repo_id, existing, options)
            with open(readme, "w", encoding="utf-8", newline="") as f:
                f.write(content)
        return upload_modified_files(self, working_dir, repo_id, *args, **kwargs)

    return wrapper


def enable_model_cards(model_class: type) -> None:
    """Make `push_to_hub` and `save_pretrained(push_to_hub=True)` of `model_class` and its subclasses upload the
    posformers model card. Idempotent."""
    if model_class.__dict__.get("_posformers_model_cards"):
        return
    upload_modified_files = getattr(model_class, "_upload_modified_files", None)
    if upload_modified_files is None:  # a private transformers hook: without it, keep transformers' own card
        return
    model_class.push_to_hub = _wrap_push_to_hub(model_class.push_to_hub)
    model_class.save_pretrained = _wrap_save_pretrained(model_class.save_pretrained)
    model_class._upload_modified_files = _wrap_upload_modified_files(upload_modified_files)
    model_class._posformers_model_cards = True


__all__ = [
    "CARD_KEYS",
    "DEFAULT_LICENSE",
    "PIPELINE_TAGS",
    "CardOptions",
    "card_for_push",
    "card_metadata",
    "enable_model_cards",
    "infer_base_model",
    "looks_like_repo_id",
    "merge_card_metadata",
    "model_card",
    "model_type_tag",
    "pipeline_tag",
]
