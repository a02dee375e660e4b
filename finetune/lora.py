"""`--lora_r`/`--lora_alpha`/`--lora_dropout`/`--lora_target_modules` of posformers-glue and posformers-qa.

    model = load_model(...)
    if run_args.lora_r is not None:
        model = apply_lora(model, model_args, run_args, training_args, "SEQ_CLS", "AutoModelForSequenceClassification",
                           id2label=..., label2id=...)   # config fields the run changed, for loading it back

The base model is frozen; LoRA adapters on the chosen projections (posformers.integrations.peft.target_modules) and
the head, trained whole, are what Trainer trains, checkpoints and saves: the output folder holds
`adapter_config.json` and `adapter_model.safetensors` (peft's format) instead of a whole model, and
LOAD_ADAPTER.md says how to load it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import TrainingArguments

from posformers._extras import install_hint

from .arguments import ModelArguments, RunArguments
from .errors import ArgumentError

logger = logging.getLogger(__name__)


def apply_lora(
    model,
    model_args: ModelArguments,
    run_args: RunArguments,
    training_args: TrainingArguments,
    task_type: str | None,
    auto_class: str,
    **config_kwargs,
):
    """`model` with LoRA adapters as the --lora_* flags say; LOAD_ADAPTER.md written into the output folder."""
    if model_args.model_name_or_path is None:
        raise ArgumentError(
            "--lora_r needs --model_name_or_path: adapters adapt pretrained weights, and a model built from scratch "
            "has none to load them on"
        )
    if Path(model_args.model_name_or_path).is_dir():  # the adapter's config names its base: make it work from anywhere
        model.config._name_or_path = str(Path(model_args.model_name_or_path).resolve())
    try:
        from posformers.integrations.peft import add_lora
    except ImportError as error:
        raise ArgumentError(f"--lora_r needs the peft extra ({error}): {install_hint('peft')}") from error
    model = add_lora(
        model,
        run_args.lora_r,
        alpha=run_args.lora_alpha,
        dropout=run_args.lora_dropout,
        targets=run_args.lora_target_modules,
        task_type=task_type,
    )
    trainable, total = model.get_nb_trainable_parameters()
    logger.info("LoRA: training %d of %d parameters (%.2f%%)", trainable, total, 100 * trainable / total)
    if training_args.do_train and training_args.process_index == 0:
        write_loading_note(training_args.output_dir, model.config._name_or_path, auto_class, **config_kwargs)
    return model


def write_loading_note(folder, base: str, auto_class: str, **config_kwargs) -> None:
    """LOAD_ADAPTER.md in `folder` (an adapter saved by a fine-tuning script): how to load the adapter on its base
    model `base` with transformers' `auto_class` (e.g. "AutoModelForSequenceClassification"), passing the config
    fields the run changed (labels) as `config_kwargs`."""
    arguments = "".join(f", {key}={value!r}" for key, value in config_kwargs.items())
    text = f"""# A LoRA adapter, not a whole model

This folder holds LoRA adapters and the fine-tuned head (`adapter_config.json`, `adapter_model.safetensors`) for the
base model `{base}`, which is loaded from there. With peft installed (`pip install peft`):

```python
import posformers  # registers the posformers model types with the Auto classes
from transformers import {auto_class}

model = {auto_class}.from_pretrained("{folder}"{arguments})
```

One plain model with the adapter merged into its weights (no peft needed to run it afterwards):

```python
import posformers
from peft import PeftModel
from transformers import {auto_class}

base = {auto_class}.from_pretrained("{base}"{arguments})
model = PeftModel.from_pretrained(base, "{folder}").merge_and_unload()
```
"""
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "LOAD_ADAPTER.md").write_text(text, encoding="utf-8")
