"""Every place the drop-in (`dropin.py`) reaches into transformers or torch beyond their documented APIs, in one file.

Each accessor says why no public API does the job and which versions it was checked against; tests/integrations/
test_private_apis.py exercises each one, and `make test` runs that file against both transformers versions posformers
tests (constraints.txt's and constraints-newest.txt's). A transformers or torch release that moves one of these breaks
that test first, here, and not a user's program.

Checked against transformers 5.23.0 and 5.24.0, torch 2.13.0. Not part of the files `save_pretrained` copies for
`trust_remote_code` users (nor is dropin.py).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers import PreTrainedConfig

# transformers' RoFormer keeps its frozen sinusoidal table in a module of this class (`encoder.embed_positions`); the
# drop-in keeps one so that state_dicts hold the same keys. The class is not exported from `transformers` itself.
from transformers.models.roformer.modeling_roformer import RoFormerSinusoidalPositionalEmbedding

# ---------------------------------------------------------------------------------------------------------------------
# transformers: the Auto classes' mappings
# ---------------------------------------------------------------------------------------------------------------------

MISSING = object()


def auto_mapping(auto_class: type):
    """The `_LazyAutoMapping` behind an Auto class (`AutoModel`, ...): config class -> model class. The Auto classes
    offer `register` and nothing that reads or restores an entry; the mapping itself is `_model_mapping`."""
    return auto_class._model_mapping


def registered_entry(mapping, config_class: type):
    """What `mapping.register(config_class, ...)` put there (MISSING when nothing): `register` writes to
    `_extra_content`, and no public API reads that layer apart from transformers' own entries."""
    return mapping._extra_content.get(config_class, MISSING)


def restore_entry(mapping, config_class: type, before) -> None:
    """Put `mapping`'s registered entry for `config_class` back to `before` (MISSING: none). transformers has no
    `unregister`; `disable()` must undo `enable()`'s `register` exactly."""
    if before is MISSING:
        mapping._extra_content.pop(config_class, None)
    else:
        mapping._extra_content[config_class] = before


# ---------------------------------------------------------------------------------------------------------------------
# transformers: configs and models
# ---------------------------------------------------------------------------------------------------------------------


def attn_implementation(config: PreTrainedConfig) -> str | None:
    """The attention implementation the user asked for (None: not chosen yet). The public `_attn_implementation`
    property resolves a default; the drop-in's config must keep the unresolved choice, `_attn_implementation_internal`,
    so that transformers resolves it for the drop-in class as it would have for its own."""
    return config._attn_implementation_internal


def set_attn_implementation(config: PreTrainedConfig, value: str | None) -> None:
    """Sets the unresolved choice `attn_implementation` reads (`PreTrainedModel.set_attn_implementation` needs a model,
    and the drop-in config is built before one exists)."""
    config._attn_implementation_internal = value


def declared_fields(config_class: type[PreTrainedConfig]) -> frozenset[str]:
    """The fields a config class declares. transformers 5 declares config fields as dataclass fields, but documents no
    list of them (`to_dict` holds the values of an instance, extra keys included)."""
    return frozenset(field.name for field in dataclasses.fields(config_class))


def sinusoidal_table(module: RoFormerSinusoidalPositionalEmbedding) -> torch.Tensor:
    """transformers' RoFormer sinusoidal table, computed as transformers computes it (`create_weight`, which its
    `_init_weights` calls; undocumented)."""
    return module.create_weight()


def without_auto_class(cls: type) -> type:
    """A class that `save_pretrained` writes with no custom code beside it: transformers copies model and config files
    for classes whose `_auto_class` is set (`register_for_auto_class`, public, sets it), and offers no way to unset it
    for a subclass."""
    cls._auto_class = None
    return cls


# ---------------------------------------------------------------------------------------------------------------------
# torch: the hooks a module holds
# ---------------------------------------------------------------------------------------------------------------------

# The dicts `register_*_hook` fill, by the kind of hook they hold: torch has no public API that lists a module's hooks
# or moves them to another module. `_forward_hooks_with_kwargs`, `_forward_hooks_always_called` and
# `_forward_pre_hooks_with_kwargs` flag entries of the forward dicts (by handle id); `_is_full_backward_hook` says
# which backward API the module's backward hooks came from.
HOOK_DICTS = {
    "forward pre": "_forward_pre_hooks",
    "forward": "_forward_hooks",
    "backward pre": "_backward_pre_hooks",
    "backward": "_backward_hooks",
    "state_dict pre": "_state_dict_pre_hooks",
    "state_dict": "_state_dict_hooks",
    "load_state_dict pre": "_load_state_dict_pre_hooks",
    "load_state_dict post": "_load_state_dict_post_hooks",
}
HOOK_FLAG_DICTS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def hook_kinds(module: nn.Module) -> list[str]:
    """The kinds of hook registered on `module` itself (HOOK_DICTS' keys)."""
    return [kind for kind, name in HOOK_DICTS.items() if getattr(module, name)]


def move_hooks(source: nn.Module, target: nn.Module, bind_to: nn.Module | None = None) -> None:
    """Every hook of `source` onto `target`, after any `target` has: the dicts themselves move, so that the
    `RemovableHandle`s the user holds still remove them. load_state_dict pre-hooks registered with the module
    (`register_load_state_dict_pre_hook`) are bound to `bind_to` (default `target`) instead of `source`."""
    bind_to = target if bind_to is None else bind_to
    for name in (*HOOK_DICTS.values(), *HOOK_FLAG_DICTS):
        hooks, own = getattr(source, name), getattr(target, name)
        if own:
            mine = list(hooks.items())
            hooks.clear()
            hooks.update(own)
            hooks.update(mine)
        setattr(target, name, hooks)
    for key, hook in source._load_state_dict_pre_hooks.items():
        if isinstance(hook, torch.nn.modules.module._WrappedHook) and hook.with_module and hook.module() is source:
            target._load_state_dict_pre_hooks[key] = torch.nn.modules.module._WrappedHook(hook.hook, bind_to)
    if source._backward_hooks or source._backward_pre_hooks:
        target._is_full_backward_hook = source._is_full_backward_hook


def state_dict_keys(module: nn.Module) -> set[str]:
    """The keys `module.state_dict()` gives, without calling it: it would run the user's state_dict hooks, and torch
    has no public API that lists the keys alone (parameters and persistent buffers, `_non_persistent_buffers_set`)."""
    keys = set()
    for path, inner in module.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        keys.update(prefix + name for name, value in inner._parameters.items() if value is not None)
        keys.update(
            prefix + name
            for name, value in inner._buffers.items()
            if value is not None and name not in inner._non_persistent_buffers_set
        )
    return keys
