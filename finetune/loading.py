"""Config, tokenizer and model of a fine-tuning run, all through the Auto classes after `import posformers`:
RoFormer, DeBERTa and LittleBird (and any transformers model) load the same way.

    config = load_config(model_args, num_labels=2, finetuning_task="sst2")   # pretrained, config.json or scratch
    tokenizer = load_tokenizer(model_args)
    config = fit_config_to_tokenizer(config, tokenizer, model_args)   # from scratch: the tokenizer's vocab size
    model = load_model(model_args, config, AutoModelForSequenceClassification)
        # without --model_name_or_path the model is built from the config
    max_length = window_length(config, data_args.max_seq_length)     # tokens per input (QA: per window), NER, MC
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import posformers  # registers the posformers model types with the Auto classes

from .arguments import ModelArguments
from .errors import ArgumentError

# transformers' model types whose checkpoints the scripts run on posformers (posformers.enable's)
DROP_IN_MODEL_TYPES = ("deberta", "deberta-v2", "roformer")
LITTLEBIRD_WINDOW = 4096
DEFAULT_WINDOW = 512

logger = logging.getLogger(__name__)


def hub_kwargs(model_args: ModelArguments) -> dict:
    """from_pretrained's Hub options: --cache_dir, --model_revision, --token, --trust_remote_code."""
    return {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }


def load_error(argument: str, name, error: Exception) -> ArgumentError:
    """`error`, raised by transformers loading `name` (given as `argument`), as one line for the user: its message's
    first line, after the argument unless it already starts with the file (posformers' loading errors do)."""
    first_line = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    if first_line.startswith(str(name)):
        return ArgumentError(first_line)
    return ArgumentError(f"{argument} {name}: {first_line}")


def config_class_for(model_type: str | None, source: str):
    """The config class registered for `model_type` (posformers' three are registered on import)."""
    if model_type not in CONFIG_MAPPING:
        known = ", ".join(sorted(name for name in CONFIG_MAPPING if "posformers" in name or name == "littlebird"))
        raise ArgumentError(f"{source}: unknown model_type {model_type!r} (posformers types: {known}, ...)")
    return CONFIG_MAPPING[model_type]


def load_config(model_args: ModelArguments, **config_kwargs):
    """The model config: --config_name (folder, repo or config.json file), else the model's, else --model_type's
    defaults; then --config_overrides. `config_kwargs` (num_labels, finetuning_task, ...) are set on it."""
    if model_args.config_name and Path(model_args.config_name).is_file():
        try:
            config_dict = json.loads(Path(model_args.config_name).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ArgumentError(f"--config_name {model_args.config_name}: not a JSON file ({error})") from error
        if not isinstance(config_dict, dict):
            raise ArgumentError(f"--config_name {model_args.config_name}: expected a JSON object of config fields")
        config_class = config_class_for(config_dict.get("model_type"), model_args.config_name)
        try:
            config = config_class.from_dict(config_dict, **config_kwargs)
        except (ValueError, TypeError) as error:
            raise load_error("--config_name", model_args.config_name, error) from error
    elif model_args.config_name or model_args.model_name_or_path:
        argument = "--config_name" if model_args.config_name else "--model_name_or_path"
        name = model_args.config_name or model_args.model_name_or_path
        try:
            config = AutoConfig.from_pretrained(name, **config_kwargs, **hub_kwargs(model_args))
        except (OSError, ValueError, TypeError) as error:  # a config.json that is not JSON, a bad field, a model_type
            raise load_error(argument, name, error) from error
    elif model_args.model_type:
        # A new config takes the overrides as constructor arguments, so that the fields derived from them in
        # __post_init__ follow (embedding_size from hidden_size, ...) and the config's own checks see them.
        config_class = config_class_for(model_args.model_type, "--model_type")
        overrides = parse_overrides(config_class, model_args.config_overrides)
        try:
            return config_class(**{**config_kwargs, **overrides})
        except ValueError as error:
            raise ArgumentError(f"--model_type {model_args.model_type} --config_overrides: {error}") from error
    else:
        raise ArgumentError("give --model_name_or_path, --config_name or --model_type")
    if model_args.config_overrides:
        for key, value in parse_overrides(type(config), model_args.config_overrides).items():
            setattr(config, key, value)
    return config


def parse_overrides(config_class, overrides: str | None) -> dict:
    """'hidden_size=64,hidden_act=gelu' -> {"hidden_size": 64, "hidden_act": "gelu"}, typed like the config's fields."""
    if not overrides:
        return {}
    probe = config_class()
    try:
        probe.update_from_string(overrides)
    except ValueError as error:
        raise ArgumentError(f"--config_overrides {overrides!r}: {error}") from error
    keys = [item.split("=", 1)[0].strip() for item in overrides.split(",") if item.strip()]
    return {key: getattr(probe, key) for key in keys}


def load_tokenizer(model_args: ModelArguments):
    """AutoTokenizer from --tokenizer_name or the model; training from scratch needs --tokenizer_name."""
    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name is None:
        raise ArgumentError("training from scratch needs --tokenizer_name (a tokenizer folder or repo id)")
    argument = "--tokenizer_name" if model_args.tokenizer_name else "--model_name_or_path"
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **hub_kwargs(model_args))
    except json.JSONDecodeError as error:
        raise ArgumentError(f"{argument} {name}: a tokenizer file is not valid JSON, truncated? ({error})") from error
    except Exception as error:  # tokenizers' own parse errors are plain Exceptions; any of them means a bad folder
        raise load_error(argument, name, error) from error
    check_tokenizer_files(tokenizer, name, argument)
    return tokenizer


def check_tokenizer_files(tokenizer, name, argument: str) -> None:
    """A local tokenizer folder needs tokenizer.json or every vocabulary file of its tokenizer class: without them
    transformers builds a tokenizer of the special tokens alone, without a word of warning."""
    folder = Path(name)
    if not folder.is_dir() or (folder / "tokenizer.json").is_file():
        return
    needed = [file for key, file in type(tokenizer).vocab_files_names.items() if key != "tokenizer_file"]
    if missing := [file for file in needed if not (folder / file).is_file()]:
        raise ArgumentError(
            f"{argument} {folder}: the tokenizer's files are missing (no tokenizer.json, no {', '.join(missing)}); "
            f"{type(tokenizer).__name__} would hold only its {len(tokenizer)} special tokens"
        )


def fit_config_to_tokenizer(config, tokenizer, model_args: ModelArguments):
    """A model built from scratch gets the tokenizer's vocabulary size and padding id (unless --config_overrides set
    them): a config's defaults (RoFormer's 50,000 Chinese words) are not the tokenizer's (BERT's 30,522)."""
    if model_args.model_name_or_path is not None:
        return config
    overridden = set(parse_overrides(type(config), model_args.config_overrides)) if model_args.model_type else set()
    if "vocab_size" not in overridden and config.vocab_size != len(tokenizer):
        logger.info("vocab_size %d -> %d, the tokenizer's", config.vocab_size, len(tokenizer))
        config.vocab_size = len(tokenizer)
    if "pad_token_id" not in overridden and tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id
    return config


def load_model(model_args: ModelArguments, config, auto_class):
    """`auto_class` (e.g. AutoModelForSequenceClassification) from --model_name_or_path, or a new model from config.
    A transformers DeBERTa, DeBERTa-v2 or RoFormer checkpoint (model_type "deberta", "deberta-v2", "roformer") runs on
    posformers (`posformers.enabled()`), and the run's folder stays in transformers' format; one line says so."""
    if config.model_type not in DROP_IN_MODEL_TYPES:
        return _load_model(model_args, config, auto_class)
    with posformers.enabled():
        model = _load_model(model_args, config, auto_class)
    if type(model).__module__ == posformers.dropin.__name__:
        logger.warning(
            "%s runs on posformers as transformers' %s: same weights, and the output folder stays in transformers' "
            "format (model_type %r)",
            model_args.model_name_or_path or f"a new {config.model_type} model",
            type(model).__name__,
            config.model_type,
        )
    return model


def _load_model(model_args: ModelArguments, config, auto_class):
    if model_args.model_name_or_path is None:
        logger.info("training a new %s from scratch", config.model_type)
        return auto_class.from_config(config, trust_remote_code=model_args.trust_remote_code)
    try:
        return auto_class.from_pretrained(
            model_args.model_name_or_path,
            config=config,
            ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
            **hub_kwargs(model_args),
        )
    except OSError as error:  # posformers' CheckpointError (a truncated or corrupted file, ...) is one
        raise load_error("--model_name_or_path", model_args.model_name_or_path, error) from error


def window_length(config, requested: int | None) -> int:
    """Tokens per window: the whole document up to 4096 for LittleBird (any length when asked), 512 for others,
    never past a model's max_position_embeddings."""
    if config.model_type == "littlebird":
        return requested or LITTLEBIRD_WINDOW
    limit = getattr(config, "max_position_embeddings", None)
    length = requested or DEFAULT_WINDOW
    if limit is not None and length > limit:
        logger.warning("max_seq_length %d is more than the model's %d positions: using %d", length, limit, limit)
        length = limit
    return length
