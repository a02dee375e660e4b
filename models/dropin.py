"""posformers inside other libraries (docs/drop-in.md): `posformers.enable()` makes transformers' Auto classes build
posformers' models for "deberta", "deberta-v2" and "roformer" configs, and `posformers.optimize(model)` converts a
model already built, in place. The classes built here carry transformers' class names, configs, parameter names and
files (no `auto_map`, no model code); this module is not part of the files `save_pretrained` copies for
`trust_remote_code` users.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
import transformers
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.utils import logging

from . import modeling_deberta, modeling_littlebird, modeling_roformer
from ._private_apis import (
    RoFormerSinusoidalPositionalEmbedding,
    attn_implementation,
    auto_mapping,
    declared_fields,
    hook_kinds,
    move_hooks,
    registered_entry,
    restore_entry,
    set_attn_implementation,
    sinusoidal_table,
    state_dict_keys,
    without_auto_class,
)
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


@without_auto_class  # never copy posformers' configuration files beside a drop-in model
class TransformersFormat:
    """A posformers config that reads and writes a transformers config (`transformers_config`): `from_transformers`
    builds it from one, `to_transformers` gives one back, and `to_dict` / `to_diff_dict` (what `save_pretrained`
    writes) are transformers' own. Fields posformers adds are written only where the original config had them."""

    transformers_config: ClassVar[type[PreTrainedConfig]]
    default_auto_map: ClassVar[dict] = {}

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
        ours.name_or_path = config.name_or_path
        set_attn_implementation(ours, attn_implementation(config))
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
        ours = declared_fields(type(self)) - declared_fields(self.transformers_config)
        for name in (ours | {"auto_map", "_transformers_keys"}) - getattr(self, "_transformers_keys", frozenset()):
            fields.pop(name, None)
        fields["model_type"] = self.transformers_config.model_type
        config = self.transformers_config.from_dict(fields)
        config.name_or_path = self.name_or_path
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


@without_auto_class  # no model code beside the weights: the folder is transformers'
class DropInModel:
    """Mixin of the drop-in classes: the class takes a transformers config (`config_class`, what the Auto classes
    check) and runs posformers' model of the same role on it; `from_pretrained` and `_from_config` of a config
    posformers cannot honour give transformers' class instead, with one warning line."""

    transformers_class: ClassVar[type[PreTrainedModel]]
    format_config: ClassVar[type[TransformersFormat]]
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
            with _building_for_posformers():
                return stand_in.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    @classmethod
    def _from_config(cls, config, **kwargs):
        if (stand_in := stand_in_for(cls.transformers_class, config)) is not cls:
            with _building_for_posformers():
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
            table.weight.copy_(sinusoidal_table(table))
        encoder = self.base_model.encoder
        encoder._modules = {"embed_positions": table, **encoder._modules}  # where transformers' encoder holds it

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, RoFormerSinusoidalPositionalEmbedding):
            module.weight.copy_(sinusoidal_table(module))


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
# Every drop-in class is an attribute of this module under its name, as any class is where it is defined: pickle (and
# torch.save, spawn workers, Ray, ...) stores a class as module + name and finds it there again.
if clash := {ours.__name__ for ours in DROP_IN.values()} & set(globals()):
    raise RuntimeError(f"posformers.dropin: drop-in classes would shadow {sorted(clash)}")
globals().update({ours.__name__: ours for ours in DROP_IN.values()})
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
        with _building_for_posformers():
            model = stand_in.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        return self._over_encoder(model)

    def _from_config(self, config, **kwargs):
        stand_in = stand_in_for(self.transformers_class, config)
        with _building_for_posformers():
            model = stand_in._from_config(config_for(stand_in, config), **kwargs)
        return self._over_encoder(model)

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
# While enabled: torch's module-registration hook that notices transformers' classes built by name (`_watch_builds`)
_build_watch: list = []
_warned_builds: set[type] = set()
_building = threading.local()  # .depth > 0 while this thread builds a model through the Auto classes' stand-ins

# What a client builds by name instead of through the Auto classes, which enable() therefore does not reach
BUILT_BY_NAME = frozenset((*DROP_IN, *HEAD_OVER_ENCODER))
BUILT_BY_NAME_WARNING = (
    "posformers: {name} was built by name (not through transformers' Auto classes), which posformers.enable() does "
    "not reach: it runs transformers' code; call posformers.optimize(model) on the model built"
)


@contextlib.contextmanager
def _building_for_posformers() -> Iterator[None]:
    """transformers' classes built in this block are built for posformers (a stand-in's fallback, a head over an
    encoder `optimize` converts): not by a client that enable() does not reach."""
    _building.depth = getattr(_building, "depth", 0) + 1
    try:
        yield
    finally:
        _building.depth -= 1


def _watch_builds(module: nn.Module, name: str, submodule: nn.Module) -> None:
    """torch calls this whenever any module registers a submodule, which each model does while it is built: a
    transformers DeBERTa / RoFormer class built while enabled, not through the Auto classes, gets one warning line per
    class, saying what reaches it."""
    kind = type(module)
    if kind not in BUILT_BY_NAME or kind in _warned_builds or getattr(_building, "depth", 0):
        return
    if _inside_a_model_being_built(module):
        return  # the model of a head (transformers builds it in the head's __init__): the head is what was built
    _warned_builds.add(kind)
    logger.warning(BUILT_BY_NAME_WARNING.format(name=kind.__name__))


def _inside_a_model_being_built(module: nn.Module) -> bool:
    """Whether `module` is being built inside the `__init__` of another transformers model of these families (a
    head: it warns for itself, or stays transformers' by design, `KEPT`)."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if owner is not None and owner is not module and (type(owner) in BUILT_BY_NAME or type(owner) in KEPT):
            return True
        frame = frame.f_back
    return False


def _registrations() -> Iterator[tuple[str, type, type]]:
    """(the Auto class's name, transformers' config class, transformers' model class) for every Auto class and
    family posformers stands in for."""
    for auto_name in AUTO_CLASSES:
        mapping = auto_mapping(getattr(transformers, auto_name))
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

    A client that builds transformers' classes by name (GLiNER's `DebertaV2Model.from_pretrained`) is not reached:
    one warning line per class says so, and that `posformers.optimize(model)` converts the model it built.

    The switch is process-wide (the Auto classes are): every thread's loads see it."""
    with _lock:
        if _saved:
            return
        for auto_name, config_class, theirs in _registrations():
            mapping = auto_mapping(getattr(transformers, auto_name))
            _saved[(auto_name, config_class)] = registered_entry(mapping, config_class)
            mapping.register(config_class, AutoStandIn(theirs), exist_ok=True)
        _warned_builds.clear()
        _build_watch.append(torch.nn.modules.module.register_module_module_registration_hook(_watch_builds))


def disable() -> None:
    """Restores transformers' own Auto mapping exactly; models already built keep running on posformers. Calling it
    twice is harmless."""
    with _lock:
        for (auto_name, config_class), before in _saved.items():
            restore_entry(auto_mapping(getattr(transformers, auto_name)), config_class, before)
        _saved.clear()
        while _build_watch:
            _build_watch.pop().remove()


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
    """The outermost transformers DeBERTa / DeBERTa-v2 / RoFormer modules inside `model` (itself included) that still
    run transformers' code: a masked-LM head over an encoder posformers already runs is not one."""
    found, stack = [], [model]
    while stack:
        module = stack.pop()
        if type(module) in HEAD_OVER_ENCODER and isinstance(module.base_model, DropInModel):
            continue
        if type(module) in DROP_IN or type(module) in HEAD_OVER_ENCODER or type(module) in KEPT:
            found.append(module)
        else:
            stack.extend(reversed(list(module.children())))
    return found


POSFORMERS_MODELS = (
    modeling_deberta.DebertaPreTrainedModel,
    modeling_roformer.RoFormerPreTrainedModel,
    modeling_littlebird.LittleBirdPreTrainedModel,
)


def runs_on_posformers(model: nn.Module) -> bool:
    """Whether `model` runs on posformers: it holds a posformers model (a drop-in class, the encoder under DeBERTa's
    masked-LM head, a posformers class of its own) and no transformers DeBERTa, DeBERTa-v2 or RoFormer model that
    posformers could run (`...ForQuestionAnswering`, which stays transformers' by design, aside). Right for every
    model, a client's wrapper included; `type(model).__module__` is not (DeBERTa's masked-LM models keep
    transformers' class over posformers' encoder)."""
    if not any(isinstance(module, POSFORMERS_MODELS) for module in model.modules()):
        return False
    return all(type(target) in KEPT for target in _targets(model))


# Modules `optimize` moves into posformers' model as they are (a PEFT wrapper around one included).
LEAF_TYPES = (nn.Linear, nn.LayerNorm, nn.Embedding, nn.Conv1d)


def _transplant(new: nn.Module, old: nn.Module) -> None:
    """Put `old`'s modules and parameters into `new` wherever `new` has a module of the same path: a standard leaf
    (Linear, LayerNorm, Embedding, Conv1d) is replaced by `old`'s module object (a PEFT wrapper included), other
    modules get `old`'s parameter objects. Reads `old` only. A parameter of another shape than posformers' model
    expects for the config (pruned heads, ...) is refused in one line."""
    for path, module in list(new.named_modules()):
        if not any(True for _ in module.parameters(recurse=False)):
            continue
        try:
            source = old.get_submodule(path)
        except AttributeError:
            raise ValueError(f"posformers.optimize: {type(old).__name__} has no module {path!r}") from None
        for name, expected in module.named_parameters(recurse=False):
            held = getattr(source, name, None)
            if held is not None and held.shape != expected.shape:
                raise ValueError(
                    f"posformers.optimize: {type(old).__name__}'s {'.'.join(filter(None, (path, name)))} has shape "
                    f"{tuple(held.shape)}, its config gives {tuple(expected.shape)}"
                )
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


def _held_sizes(old: PreTrainedModel) -> dict[str, int]:
    """Config fields whose value a client may have changed in the model without changing the config: the layers the
    encoder holds (BERTScore keeps the first k of them) and the rows of the word embeddings."""
    base = old.base_model
    sizes = {}
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if isinstance(layers, nn.ModuleList):
        sizes["num_hidden_layers"] = len(layers)
    words = getattr(getattr(base, "embeddings", None), "word_embeddings", None)
    if isinstance(words, nn.Embedding):
        sizes["vocab_size"] = words.num_embeddings
    return sizes


@dataclass
class _Conversion:
    """One transformers model `old` and posformers' model `new` built to take its place (holding `old`'s parameters
    and leaf modules); `hooks`: the modules of `old` that `new` replaces and that hold hooks, each with the module of
    `new` at its path."""

    old: PreTrainedModel
    new: PreTrainedModel
    hooks: list[tuple[nn.Module, nn.Module]]

    def apply(self) -> None:
        old, new = self.old, self.new
        new.train(old.training)
        if old.is_activation_checkpointing:
            new.activation_checkpointing_enable()
        for module, counterpart in self.hooks:
            move_hooks(module, counterpart, bind_to=old if module is old else counterpart)
        old.__class__ = type(new)
        old.__dict__ = new.__dict__


def _plan(old: PreTrainedModel, path: str) -> _Conversion | None:
    """posformers' model for `old` (a transformers model of a drop-in class at `path` in the user's model), built and
    checked without changing `old`; None where `old` stays transformers' (with one warning line saying why)."""
    if type(old) in HEAD_OVER_ENCODER:
        return _plan(old.base_model, ".".join(filter(None, (path, old.base_model_prefix))))
    ours = DROP_IN[type(old)]
    if reason := ours.unsupported(old.config):
        _warn_kept(type(old), reason)
        return None
    # The model is built for the modules `old` holds, and then keeps the config as `old` has it
    config = ours.format_config.from_transformers(old.config)
    as_configured = {field: getattr(config, field) for field in _held_sizes(old)}
    for field, value in _held_sizes(old).items():
        setattr(config, field, value)
    try:
        with torch.device("meta"):  # every parameter is replaced by old's: only the structure is built
            new = ours(config)
    finally:
        for field, value in as_configured.items():
            setattr(config, field, value)
    _transplant(new, old)
    _materialize(new, next(old.parameters()).device)
    before = state_dict_keys(old)
    if state_dict_keys(new) != before:
        difference = sorted(state_dict_keys(new) ^ before)[:5]
        raise ValueError(f"posformers.optimize: {type(old).__name__}'s state_dict keys would change: {difference}")
    kept = {id(module) for module in new.modules()}
    hooks = []
    for name, module in old.named_modules():
        if id(module) in kept or not (kinds := hook_kinds(module)):
            continue
        try:
            counterpart = new.get_submodule(name)
        except AttributeError:
            where = ".".join(filter(None, (path, name))) or type(old).__name__
            raise ValueError(
                f"posformers.optimize: the module {where!r} ({type(module).__name__}) has a {kinds[0]} hook, and "
                "posformers' model has no module there to keep it on; remove the hook, or register it on a module "
                "posformers keeps (the model itself, an embeddings, layer or attention module, a Linear)"
            ) from None
        hooks.append((module, counterpart))
    return _Conversion(old, new, hooks)


def optimize(model: nn.Module) -> nn.Module:
    """Run the transformers DeBERTa, DeBERTa-v2 and RoFormer models inside `model` (or `model` itself) on posformers,
    in place, and return `model`. Parameters stay the same tensors (requires_grad, device and dtype included), as do
    the train/eval mode, the state_dict keys, the config and the hooks, so an optimizer, checkpoints and hooks of the
    surrounding library keep working. The model built has the layers `model` holds (a client may have cut them).
    Everything is checked before anything changes: a refused model is left as it was. Call it before wrapping the
    model in DistributedDataParallel or FSDP."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"posformers.optimize takes a torch.nn.Module, got {type(model).__name__}")
    if wrapper := _wrapped(model):
        raise ValueError(
            f"posformers.optimize: the model is wrapped by {wrapper}; call posformers.optimize(model) before "
            "wrapping it"
        )
    targets = _targets(model)
    if not targets:
        if any(isinstance(module, DropInModel) for module in model.modules()):
            return model  # already optimized
        raise ValueError(
            f"posformers.optimize cannot take {type(model).__name__}: it holds no transformers DeBERTa, DeBERTa-v2 or "
            "RoFormer model"
        )
    paths = {id(module): name for name, module in model.named_modules()}
    conversions = []
    for target in targets:
        if type(target) in KEPT:
            _warn_kept(type(target), KEPT[type(target)])
        elif conversion := _plan(target, paths[id(target)]):
            conversions.append(conversion)
    for conversion in conversions:
        conversion.apply()
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

__all__ = ["disable", "enable", "enabled", "is_enabled", "optimize", "runs_on_posformers"]
