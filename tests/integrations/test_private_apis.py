"""Each accessor of `posformers._private_apis` (what the drop-in reads of transformers and torch beyond their documented
APIs) does what the drop-in needs, on every transformers version `make test` runs (its NEWEST_TESTS include this file:
it needs torch and transformers only). And `optimize` leaves the process's default dtype alone while it converts a
half-precision model, so other threads never see it change."""

from __future__ import annotations

import threading

import pytest
import torch
import transformers
from torch import nn

import posformers
from posformers import _private_apis as private
from posformers import dropin

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


def test_auto_mapping_entries_are_read_and_restored():
    mapping = private.auto_mapping(transformers.AutoModel)
    assert mapping[transformers.DebertaV2Config] is transformers.DebertaV2Model
    before = private.registered_entry(mapping, transformers.DebertaV2Config)
    assert before is private.MISSING  # transformers' own entry is not a registered one

    class Marker(nn.Module):
        config_class = transformers.DebertaV2Config

    try:
        mapping.register(transformers.DebertaV2Config, Marker, exist_ok=True)
        assert private.registered_entry(mapping, transformers.DebertaV2Config) is Marker
        assert mapping[transformers.DebertaV2Config] is Marker
    finally:
        private.restore_entry(mapping, transformers.DebertaV2Config, before)
    assert private.registered_entry(mapping, transformers.DebertaV2Config) is private.MISSING
    assert mapping[transformers.DebertaV2Config] is transformers.DebertaV2Model


def test_the_attention_implementation_chosen_is_read_and_set_unresolved():
    config = transformers.DebertaV2Config(**TINY)
    assert private.attn_implementation(config) is None
    config = transformers.DebertaV2Config(**TINY, attn_implementation="eager")
    assert private.attn_implementation(config) == "eager"
    private.set_attn_implementation(config, "sdpa")
    assert private.attn_implementation(config) == "sdpa" and config._attn_implementation == "sdpa"


def test_declared_fields_are_the_config_classes_fields():
    fields = private.declared_fields(transformers.DebertaV2Config)
    assert {"hidden_size", "relative_attention", "pos_att_type", "max_relative_positions"} <= fields
    assert "use_rotary" not in fields
    ours = private.declared_fields(dropin.DebertaV2Format)
    assert {"hidden_size", "relative_attention"} <= ours and ours - fields  # posformers' config declares its own


def test_the_sinusoidal_table_is_transformers_own():
    model = transformers.RoFormerModel(transformers.RoFormerConfig(**TINY, max_position_embeddings=64))
    table = model.encoder.embed_positions
    assert isinstance(table, private.RoFormerSinusoidalPositionalEmbedding)
    assert torch.equal(private.sinusoidal_table(table), table.weight)


def test_a_class_without_auto_class_saves_no_code(tmp_path):
    """posformers registers its classes for the Auto classes (so their files travel with a saved model); a class
    marked `without_auto_class` (the drop-in's model and config classes) saves transformers' files only."""

    class Registered(posformers.RoFormerModel):
        pass

    assert Registered._auto_class == "AutoModel"
    assert private.without_auto_class(Registered)._auto_class is None
    assert posformers.RoFormerModel._auto_class == "AutoModel"
    config = transformers.RoFormerConfig(**TINY, max_position_embeddings=64)
    dropin.RoFormerModel(config).save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.py"))


def test_hooks_are_listed_and_moved_with_their_handles():
    source, target = nn.Linear(2, 2), nn.Linear(2, 2)
    calls = []
    handles = [
        source.register_forward_hook(lambda m, args, kwargs, out: calls.append(("forward", m)), with_kwargs=True),
        source.register_forward_pre_hook(lambda m, args: calls.append(("pre", m)), prepend=True),
        source.register_full_backward_hook(lambda m, grad_in, grad_out: calls.append(("backward", m))),
        source.register_load_state_dict_pre_hook(lambda m, *args: calls.append(("load pre", m))),
        source.register_state_dict_post_hook(lambda m, *args: calls.append(("state_dict", m))),
    ]
    assert private.hook_kinds(source) == ["forward pre", "forward", "backward", "state_dict", "load_state_dict pre"]
    assert private.hook_kinds(target) == []
    private.move_hooks(source, target)
    target(torch.ones(1, 2, requires_grad=True)).sum().backward()
    target.load_state_dict(target.state_dict())
    kinds = ["pre", "forward", "backward", "state_dict", "load pre"]
    assert calls == [(kind, target) for kind in kinds]
    for handle in handles:
        handle.remove()
    assert private.hook_kinds(target) == []


def test_state_dict_keys_are_the_state_dicts_without_running_its_hooks():
    model = transformers.RoFormerForMaskedLM(transformers.RoFormerConfig(**TINY, max_position_embeddings=64))
    calls = []
    model.register_state_dict_pre_hook(lambda *args: calls.append(args))
    assert private.state_dict_keys(model) == set(model.state_dict()) and len(calls) == 1


@pytest.mark.parametrize("family", ["DebertaV2", "RoFormer"])
def test_optimize_never_changes_the_default_dtype_another_thread_sees(family):
    """One thread converts bfloat16 models while another creates float tensors in a loop: every one of them is float32
    (the process's default), and the converted models are bfloat16."""
    config = getattr(transformers, family + "Config")(**TINY)
    models = [getattr(transformers, family + "Model")(config).to(torch.bfloat16) for _ in range(6)]
    done, seen = threading.Event(), set()

    def create():
        while not done.is_set():
            seen.add(torch.ones(2).dtype)
            seen.add(torch.tensor([0.5]).dtype)

    watcher = threading.Thread(target=create)
    watcher.start()
    try:
        for model in models:
            posformers.optimize(model)
    finally:
        done.set()
        watcher.join()
    assert seen == {torch.float32}
    assert all(dropin.runs_on_posformers(m) and {p.dtype for p in m.parameters()} == {torch.bfloat16} for m in models)
    assert torch.get_default_dtype() == torch.float32
