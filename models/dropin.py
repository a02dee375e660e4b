"""posformers inside other libraries (docs/drop-in.md): `posformers.enable()` makes transformers' Auto classes build
posformers' models for "deberta", "deberta-v2" and "roformer" configs, and `posformers.optimize(model)` converts a
model already built, in place. The classes built here carry transformers' class names, configs, parameter names and
files (no `auto_map`, no model code); this module is not part of the files `save_pretrained` copies for
`trust_remote_code` users.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import ClassVar

import torch
import transformers
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.models.roformer.modeling_roformer import RoFormerSinusoidalPositionalEmbedding
from transformers.utils import logging

from . import modeling_deberta, modeling_roformer
from .configuration_deberta import AUTO_MAP as DEBERTA_AUTO_MAP
from .configuration_deberta import OFFICIAL_DEFAULTS, DebertaConfig, pooler_fields
from .configuration_roformer import AUTO_MAP as ROFORMER_AUTO_MAP
from .configuration_roformer import RoFormerConfig

logger = logging.get_logger(__name__)

# The Auto classes `enable()` reaches: every one posformers has a head for.
AUTO_CLASSES = tuple(
    dict.fromkeys(
        name for auto_map in (DEBERTA_AUTO_MAP, ROFORMER_AUTO_MAP) for name in auto_map if name != "AutoConfig"
    )
)

QA_REASON = (
    "its span loss reads the logits transformers computes at padded positions, which posformers does not compute"
)


# Configs: posformers' config under transformers' model_type, read from and written as transformers' format


class TransformersFormat:
    """A posformers config that reads and writes a transformers config (`transformers_config`): `from_transformers`
    builds it from one, `to_transformers` gives one back, and `to_dict` / `to_diff_dict` (what `save_pretrained`
    writes) are transformers' own. Fields posformers adds are written only where the original config had them."""

    transformers_config: ClassVar[type[PreTrainedConfig]]
    default_auto_map: ClassVar[dict] = {}
    _auto_class = None  # never copy posformers' configuration files beside a drop-in model

    @classmethod
    def posformers_fields(cls, fields: dict) -> dict:
        """transformers' config dict -> posformers' fields for the same model (a family's own rules)."""
        return fields

    @classmethod
    def from_transformers(cls, config: PreTrainedConfig):
        if isinstance(config, cls):
            return config
        fields = config.to_dict()
        original_keys = frozenset(fields)
        fields = {**cls.posformers_fields(fields), "model_type": cls.model_type}
        ours = super().from_dict(fields)
        ours._transformers_keys = original_keys
        ours._name_or_path = config._name_or_path
        ours._attn_implementation_internal = config._attn_implementation_internal
        return ours

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        config = cls.transformers_config.from_dict(config_dict, **kwargs)
        if isinstance(config, tuple):  # return_unused_kwargs=True
            return cls.from_transformers(config[0]), config[1]
        return cls.from_transformers(config)

    def to_transformers(self) -> PreTrainedConfig:
        fields = super().to_dict()
        # Fields posformers declares and transformers' config class does not: written only where the original had them.
        ours = set(super().__dataclass_fields__) - set(self.transformers_config.__dataclass_fields__)
        for name in (ours | {"auto_map", "_transformers_keys"}) - getattr(self, "_transformers_keys", frozenset()):
            fields.pop(name, None)
        fields["model_type"] = self.transformers_config.model_type
        config = self.transformers_config.from_dict(fields)
        config._name_or_path = self._name_or_path
        return config

    def to_dict(self) -> dict:
        return self.to_transformers().to_dict()

    def to_diff_dict(self) -> dict:
        return self.to_transformers().to_diff_dict()


class DebertaFormat(TransformersFormat, DebertaConfig):
    """DeBERTa as transformers configures it: the fields a transformers file leaves out take transformers' defaults,
    the projection layout follows the version, there is no Enhanced Mask Decoder (transformers has none), and
    distances beyond `max_relative_positions` take transformers' unclipped buckets (`clip_relative_positions`), what
    weights fine-tuned with transformers on long inputs learned; a config that names the field keeps its value."""

    @classmethod
    def posformers_fields(cls, fields: dict) -> dict:
        model_type = cls.transformers_config.model_type
        fields = {
            **OFFICIAL_DEFAULTS[model_type],
            "clip_relative_positions": False,
            **pooler_fields(fields, repository_format=False),
            "emd_steps": 0,
        }
        if fields.get("pos_att_type") is None:
            fields["pos_att_type"] = []
        return fields


class DebertaV1Format(DebertaFormat):
    model_type = "deberta"
    transformers_config = transformers.DebertaConfig


class DebertaV2Format(DebertaFormat):
    model_type = "deberta-v2"
    transformers_config = transformers.DebertaV2Config


class RoFormerFormat(TransformersFormat, RoFormerConfig):
    model_type = "roformer"
    transformers_config = transformers.RoFormerConfig


# Models: posformers' classes under transformers' names and configs


class DropInModel:
    """Mixin of the drop-in classes: the class takes a transformers config (`config_class`, what the Auto classes
    check) and runs posformers' model of the same role on it; `from_pretrained` and `_from_config` of a config
    posformers cannot honour give transformers' class instead, with one warning line."""

    transformers_class: ClassVar[type[PreTrainedModel]]
    format_config: ClassVar[type[TransformersFormat]]
    _auto_class = None  # no model code beside the weights: the folder is transformers'
    # transformers' own saving and pushing, model card included: the files are transformers' model's, not posformers'
    save_pretrained = PreTrainedModel.save_pretrained
    push_to_hub = PreTrainedModel.push_to_hub

    def __init__(self, config, *inputs, **kwargs):
        super().__init__(self.format_config.from_transformers(config), *inputs, **kwargs)
        self.add_transformers_modules()

    def add_transformers_modules(self) -> None:
        """Modules transformers' class has and posformers' does not need, kept so the state_dict keys are
        transformers'."""

    @classmethod
    def unsupported(cls, config) -> str | None:
        """Why this class cannot stand in for transformers' on `config`, or None."""
        try:
            cls.format_config.from_transformers(config)
        except (ValueError, TypeError) as error:
            return str(error).splitlines()[0]
        return None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        config = kwargs.get("config")
        if (
            isinstance(config, PreTrainedConfig)
            and (stand_in := stand_in_for(cls.transformers_class, config)) is not cls
        ):
            kwargs["config"] = config_for(stand_in, config)
            return stand_in.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    @classmethod
    def _from_config(cls, config, **kwargs):
        if (stand_in := stand_in_for(cls.transformers_class, config)) is not cls:
            return stand_in._from_config(config_for(stand_in, config), **kwargs)
        return super()._from_config(config, **kwargs)


class RoFormerDropIn(DropInModel):
    """transformers' RoFormer keeps a frozen sinusoidal table (`encoder.embed_positions`) that posformers computes
    on the fly; the module is kept, unused, so that files and state_dicts hold it."""

    def add_transformers_modules(self) -> None:
        super().add_transformers_modules()
        config = self.config
        table = RoFormerSinusoidalPositionalEmbedding(
            config.max_position_embeddings, config.hidden_size // config.num_attention_heads
        )
        with torch.no_grad():
            table.weight.copy_(table.create_weight())
        encoder = self.base_model.encoder
        encoder._modules = {"embed_positions": table, **encoder._modules}  # where transformers' encoder holds it

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, RoFormerSinusoidalPositionalEmbedding):
            module.weight.copy_(module.create_weight())


class Family:
    """One transformers model type and the posformers module that stands in for it."""

    def __init__(self, model_type, prefix, module, our_prefix, format_config, mixin, heads):
        self.model_type, self.prefix, self.format_config = model_type, prefix, format_config
        self.classes: dict[type, type] = {}  # transformers' class -> drop-in class
        for head in heads:
            theirs = getattr(transformers, prefix + head, None)
            ours = getattr(module, our_prefix + head)
            if theirs is None:
                continue
            attributes = {
                "__module__": __name__,
                "__qualname__": theirs.__name__,
                "__doc__": f"posformers' `{ours.__name__}` as transformers' `{theirs.__name__}` (posformers.dropin).",
                "config_class": theirs.config_class,
                "transformers_class": theirs,
                "format_config": format_config,
            }
            self.classes[theirs] = type(theirs.__name__, (mixin, ours), attributes)


DEBERTA_HEADS = ("Model", "ForSequenceClassification", "ForTokenClassification", "ForMultipleChoice")
ROFORMER_HEADS = (*DEBERTA_HEADS, "ForMaskedLM", "ForCausalLM")
FAMILIES = (
    Family("deberta", "Deberta", modeling_deberta, "Deberta", DebertaV1Format, DropInModel, DEBERTA_HEADS),
    Family("deberta-v2", "DebertaV2", modeling_deberta, "Deberta", DebertaV2Format, DropInModel, DEBERTA_HEADS),
    Family("roformer", "RoFormer", modeling_roformer, "RoFormer", RoFormerFormat, RoFormerDropIn, ROFORMER_HEADS),
)
DROP_IN: dict[type, type] = {theirs: ours for family in FAMILIES for theirs, ours in family.classes.items()}
# DeBERTa's masked-LM models keep transformers' head (its legacy layout by default) over a posformers encoder
HEAD_OVER_ENCODER = {transformers.DebertaForMaskedLM, transformers.DebertaV2ForMaskedLM}
# transformers' classes of these families that keep their own code, with one warning line (QA_REASON says why)
KEPT = {
    getattr(transformers, family.prefix + "ForQuestionAnswering"): QA_REASON
    for family in FAMILIES
    if hasattr(transformers, family.prefix + "ForQuestionAnswering")
}


def _warn_kept(transformers_class: type, reason: str) -> None:
    logger.warning(f"posformers: {transformers_class.__name__} stays transformers' class: {reason}")


def stand_in_for(transformers_class: type, config):
    """What builds `transformers_class`'s model for `config` while posformers is enabled: its drop-in class, or
    transformers' class itself (kept with a warning saying why, or a head over an encoder `optimize` converts)."""
    if transformers_class in KEPT:
        _warn_kept(transformers_class, KEPT[transformers_class])
        return transformers_class
    ours = DROP_IN.get(transformers_class)
    if ours is None:
        return transformers_class
    if reason := ours.unsupported(config):
        _warn_kept(transformers_class, reason)
        return transformers_class
    return ours


class AutoStandIn:
    """The Auto mapping's entry for one transformers class while enabled: `from_pretrained` / `_from_config` choose
    the stand-in for the config at hand (`stand_in_for`). It carries transformers' class name and config class,
    which the Auto classes and the pipelines read."""

    def __init__(self, transformers_class: type[PreTrainedModel], config_class: type | None = None):
        self.transformers_class = transformers_class
        self.__name__ = transformers_class.__name__
        self.__module__ = __name__
        self.config_class = config_class or transformers_class.config_class

    def from_pretrained(self, pretrained_model_name_or_path, *model_args, **kwargs):
        stand_in = stand_in_for(self.transformers_class, kwargs.get("config"))
        if "config" in kwargs:
            kwargs["config"] = config_for(stand_in, kwargs["config"])
        return self._over_encoder(stand_in.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs))

    def _from_config(self, config, **kwargs):
        stand_in = stand_in_for(self.transformers_class, config)
        return self._over_encoder(stand_in._from_config(config_for(stand_in, config), **kwargs))

    def _over_encoder(self, model):
        """DeBERTa's masked-LM models: transformers' head class over a posformers encoder (`optimize` converts it)."""
        return optimize(model) if self.transformers_class in HEAD_OVER_ENCODER else model


def config_for(stand_in, config):
    """A drop-in config (`DebertaV2Format`, ...) handed to transformers' code becomes transformers' config again."""
    if isinstance(config, TransformersFormat) and not (
        isinstance(stand_in, type) and issubclass(stand_in, DropInModel)
    ):
        return config.to_transformers()
    return config


# enable / disable / enabled

_lock = threading.RLock()
# (Auto class name, config class) -> what its mapping held there before enable(); present while enabled
_saved: dict[tuple[str, type], object] = {}
_MISSING = object()


def _registrations() -> Iterator[tuple[str, type, type]]:
    """(the Auto class's name, transformers' config class, transformers' model class) for every Auto class and
    family posformers stands in for."""
    for auto_name in AUTO_CLASSES:
        mapping = getattr(transformers, auto_name)._model_mapping
        for family in FAMILIES:
            config_class = transformers.CONFIG_MAPPING[family.model_type]
            if config_class not in mapping:
                continue
            theirs = mapping[config_class]
            if theirs in DROP_IN or theirs in HEAD_OVER_ENCODER or theirs in KEPT:
                yield auto_name, config_class, theirs


def enable() -> None:
    """While enabled, transformers' Auto classes build posformers' models for `deberta`, `deberta-v2` and `roformer`
    configs, from the Hub, a folder or a config. Tokenizers and configs are untouched. Calling it twice is harmless.

    The switch is process-wide (the Auto classes are): every thread's loads see it."""
    with _lock:
        if _saved:
            return
        for auto_name, config_class, theirs in _registrations():
            mapping = getattr(transformers, auto_name)._model_mapping
            # `_extra_content` is where `register` puts an entry; no public API removes one, and `disable()` must.
            _saved[(auto_name, config_class)] = mapping._extra_content.get(config_class, _MISSING)
            mapping.register(config_class, AutoStandIn(theirs), exist_ok=True)


def disable() -> None:
    """Restores transformers' own Auto mapping exactly; models already built keep running on posformers. Calling it
    twice is harmless."""
    with _lock:
        for (auto_name, config_class), before in _saved.items():
            mapping = getattr(transformers, auto_name)._model_mapping
            if before is _MISSING:
                mapping._extra_content.pop(config_class, None)
            else:
                mapping._extra_content[config_class] = before
        _saved.clear()


def is_enabled() -> bool:
    return bool(_saved)


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """`enable()` for the block, then the state before it (enabled or not). Process-wide, like `enable()`: another
    thread loading a model during the block gets posformers too."""
    with _lock:
        was_enabled = is_enabled()
        enable()
    try:
        yield
    finally:
        if not was_enabled:
            disable()


# optimize


def _wrapped(model: nn.Module) -> str | None:
    """The name of the distributed wrapper around (or inside) `model`, if any."""
    wrappers = [torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel]
    with contextlib.suppress(ImportError):
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        wrappers += [FullyShardedDataParallel, FSDPModule]
    for module in model.modules():
        for wrapper in wrappers:
            if isinstance(module, wrapper):
                return wrapper.__name__
    return None


def _targets(model: nn.Module) -> list[nn.Module]:
    """The outermost transformers DeBERTa / DeBERTa-v2 / RoFormer modules inside `model` (itself included)."""
    found, stack = [], [model]
    while stack:
        module = stack.pop()
        if type(module) in DROP_IN or type(module) in HEAD_OVER_ENCODER or type(module) in KEPT:
            found.append(module)
        else:
            stack.extend(reversed(list(module.children())))
    return found


# Modules `optimize` moves into posformers' model as they are (a PEFT wrapper around one included).
LEAF_TYPES = (nn.Linear, nn.LayerNorm, nn.Embedding, nn.Conv1d)


def _transplant(new: nn.Module, old: nn.Module) -> None:
    """Put `old`'s modules and parameters into `new` wherever `new` has a module of the same path: a standard leaf
    (Linear, LayerNorm, Embedding, Conv1d) is replaced by `old`'s module object (a PEFT wrapper included), other
    modules get `old`'s parameter objects."""
    for path, module in list(new.named_modules()):
        if not any(True for _ in module.parameters(recurse=False)):
            continue
        try:
            source = old.get_submodule(path)
        except AttributeError:
            raise ValueError(f"posformers.optimize: {type(old).__name__} has no module {path!r}") from None
        if isinstance(module, LEAF_TYPES) and path:
            parent, _, name = path.rpartition(".")
            new.get_submodule(parent).register_module(name, source)
            continue
        for name, _ in list(module.named_parameters(recurse=False)):
            setattr(module, name, getattr(source, name))


def _materialize(new: nn.Module, device: torch.device) -> None:
    """Buffers still on the meta device (posformers' own tables) are allocated on `device` and initialised."""
    for module in new.modules():
        tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        if any(tensor.is_meta for tensor in tensors):
            module.to_empty(device=device, recurse=False)
            new._init_weights(module)


def _convert(old: PreTrainedModel) -> None:
    """Turn `old` (a transformers model of a drop-in class) into posformers' model in place: same object, same
    parameter tensors and modules, same state_dict keys, same mode."""
    if type(old) in HEAD_OVER_ENCODER:
        _convert(old.base_model)
        return
    ours = DROP_IN[type(old)]
    if reason := ours.unsupported(old.config):
        _warn_kept(type(old), reason)
        return
    parameter = next(old.parameters())
    default_dtype = torch.get_default_dtype()
    try:
        torch.set_default_dtype(parameter.dtype if parameter.is_floating_point() else default_dtype)
        with torch.device("meta"):
            new = ours(old.config)
    finally:
        torch.set_default_dtype(default_dtype)
    _transplant(new, old)
    _materialize(new, parameter.device)
    before = set(old.state_dict())
    if set(new.state_dict()) != before:
        difference = sorted(set(new.state_dict()) ^ before)[:5]
        raise ValueError(f"posformers.optimize: {type(old).__name__}'s state_dict keys would change: {difference}")
    new.train(old.training)
    if old.is_activation_checkpointing:
        new.activation_checkpointing_enable()
    for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_state_dict_hooks"):
        getattr(new, hooks).update(getattr(old, hooks))
    old.__class__ = type(new)
    old.__dict__ = new.__dict__


def optimize(model: nn.Module) -> nn.Module:
    """Run the transformers DeBERTa, DeBERTa-v2 and RoFormer models inside `model` (or `model` itself) on posformers,
    in place, and return `model`. Parameters stay the same tensors (requires_grad, device and dtype included), as do
    the train/eval mode and the state_dict keys, so an optimizer and checkpoints of the surrounding library keep
    working. Call it before wrapping the model in DistributedDataParallel or FSDP."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"posformers.optimize takes a torch.nn.Module, got {type(model).__name__}")
    if wrapper := _wrapped(model):
        raise ValueError(
            f"posformers.optimize: the model is wrapped by {wrapper}; call posformers.optimize(model) before "
            "wrapping it"
        )
    targets = _targets(model)
    if not targets:
        if any(type(module) in DROP_IN.values() for module in model.modules()):
            return model  # already optimized
        raise ValueError(
            f"posformers.optimize cannot take {type(model).__name__}: it holds no transformers DeBERTa, DeBERTa-v2 or "
            "RoFormer model"
        )
    for target in targets:
        if type(target) in KEPT:
            _warn_kept(type(target), KEPT[type(target)])
        else:
            _convert(target)
    return model


def _register_drop_in_configs() -> None:
    """A drop-in model's config (`DebertaV2Format`, ...) given back to an Auto class (`AutoModel.from_config(
    model.config)`, `from_pretrained(..., config=model.config)`) builds the drop-in model, enabled or not: the config
    is posformers' own."""
    formats = {family.model_type: family.format_config for family in FAMILIES}
    for auto_name, config_class, theirs in _registrations():
        format_config = formats[config_class.model_type]
        getattr(transformers, auto_name).register(format_config, AutoStandIn(theirs, format_config), exist_ok=True)


_register_drop_in_configs()

__all__ = ["disable", "enable", "enabled", "is_enabled", "optimize"]
