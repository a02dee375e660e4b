"""Configuration contracts: RoFormer's `rope_parameters` (transformers 5's format) and the older fields it replaces, and
the checkpoint errors `from_pretrained` raises.

The older fields are checked against transformers' own conversion of them (LlamaConfig reads `rope_theta` and
`rope_scaling` into `rope_parameters` the same way), and against the outputs of the model they configure.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import warnings

import pytest
import torch
from helpers import corrupt
from helpers.modeling import make_batch, tiny_config
from transformers import AutoModel, LlamaConfig

import posformers
from posformers import RoFormerConfig, RoFormerModel

# config.json fields written by posformers before `rope_parameters` (and by transformers 4 for rotary models).
LEGACY_ROPE_FIELDS = {
    "theta": {"rope_theta": 500.0},
    "linear": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "legacy_type_key": {"rope_theta": 2000.0, "rope_scaling": {"type": "linear", "factor": 3.0}},
    "dynamic": {"rope_theta": 500.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "yarn": {
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 16}
    },
    "yarn_default_original": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
}


def legacy_config_file(folder, legacy: dict) -> None:
    """Rewrite folder/config.json as earlier posformers wrote it: `legacy` fields instead of `rope_parameters`."""
    path = folder / "config.json"
    fields = json.loads(path.read_text())
    del fields["rope_parameters"]
    path.write_text(json.dumps({**fields, **legacy}))


@pytest.mark.parametrize("legacy", LEGACY_ROPE_FIELDS.values(), ids=LEGACY_ROPE_FIELDS.keys())
def test_legacy_rope_fields_read_as_transformers_reads_them(legacy):
    ours = tiny_config(RoFormerConfig, **copy.deepcopy(legacy))
    reference = LlamaConfig(hidden_size=32, num_attention_heads=4, max_position_embeddings=64, **copy.deepcopy(legacy))
    expected = {key: value for key, value in reference.rope_parameters.items() if key != "type"}
    assert ours.rope_parameters == expected


@pytest.mark.parametrize("legacy", LEGACY_ROPE_FIELDS.values(), ids=LEGACY_ROPE_FIELDS.keys())
def test_folder_with_legacy_rope_fields_loads_to_the_same_model(tmp_path, legacy):
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig, **copy.deepcopy(legacy), max_position_embeddings=16)).eval()
    model.save_pretrained(tmp_path)
    legacy_config_file(tmp_path, legacy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an older file is not wrong: no deprecation warning
        reloaded = AutoModel.from_pretrained(tmp_path).eval()
    assert reloaded.config.rope_parameters == model.config.rope_parameters
    assert not hasattr(reloaded.config, "rope_theta")
    input_ids, attention_mask, _ = make_batch(seq_len=40)  # past max_position_embeddings: scaling applies
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask).last_hidden_state
        assert torch.equal(reloaded(input_ids, attention_mask=attention_mask).last_hidden_state, expected)


def test_legacy_theta_changes_the_outputs(tmp_path):
    """The test above can fail: a file whose `rope_theta` were dropped would compute other outputs."""
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig)).eval()
    other = RoFormerModel(tiny_config(RoFormerConfig, rope_theta=500.0)).eval()
    other.load_state_dict(model.state_dict())
    input_ids = make_batch()[0]
    with torch.no_grad():
        assert not torch.allclose(model(input_ids).last_hidden_state, other(input_ids).last_hidden_state)


def test_saved_config_holds_rope_parameters_only(tmp_path):
    parameters = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 16}
    config = tiny_config(RoFormerConfig, rope_parameters=parameters)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_parameters"] == parameters
    assert not {"rope_theta", "rope_scaling", "ignore_keys_at_rope_validation"} & set(saved)
    assert RoFormerConfig.from_pretrained(tmp_path).rope_parameters == parameters


def test_default_rope_parameters_are_transformers_defaults():
    assert RoFormerConfig().rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


def test_partial_rotary_factor_inside_rope_parameters_is_the_field():
    config = tiny_config(RoFormerConfig, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5})
    assert config.partial_rotary_factor == 0.5 and config.rope_dim == 4
    assert "partial_rotary_factor" not in config.rope_parameters
    with pytest.raises(ValueError, match=r"rope_parameters\['partial_rotary_factor'\] \(0.5\) disagrees"):
        tiny_config(RoFormerConfig, partial_rotary_factor=0.25, rope_parameters={"partial_rotary_factor": 0.5})


@pytest.mark.parametrize(
    "parameters, field",
    [
        ("linear", r"RoFormerConfig\.rope_parameters must be a dict"),
        ({"rope_type": "llama3", "factor": 2.0}, r"RoFormerConfig\.rope_parameters\['rope_type'\] must be one of"),
        ({"rope_type": "linear"}, r"RoFormerConfig\.rope_parameters of type 'linear' needs the key\(s\) \['factor'\]"),
        ({"rope_type": "linear", "factor": "2"}, r"RoFormerConfig\.rope_parameters\['factor'\] must be a number"),
        ({"rope_type": "default", "rope_theta": -1.0}, r"RoFormerConfig\.rope_parameters\['rope_theta'\] must be"),
        ({"rope_type": "yarn", "factor": 2.0, "beta_slow": 0}, r"RoFormerConfig\.rope_parameters\['beta_slow'\]"),
    ],
    ids=["not_a_dict", "unknown_type", "missing_key", "string_factor", "negative_theta", "zero_beta"],
)
def test_bad_rope_parameters_is_a_one_line_error_naming_the_field(tmp_path, parameters, field):
    with pytest.raises(ValueError, match=field) as raised:
        tiny_config(RoFormerConfig, rope_parameters=parameters)
    assert "\n" not in str(raised.value)
    config = tiny_config(RoFormerConfig)
    config.rope_parameters = parameters  # set after creation: refused when a model is built
    with pytest.raises(ValueError, match=field):
        RoFormerModel(config)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({**tiny_config(RoFormerConfig).to_dict(), "rope_parameters": parameters}))
    with pytest.raises(ValueError, match=f"^{re.escape(str(config_file))}: {field}"):
        RoFormerConfig.from_pretrained(tmp_path)


def test_keys_a_rope_type_does_not_read_are_kept_with_a_warning_as_transformers_does(caplog):
    """transformers' rope validation warns about keys a rope_type does not read and keeps them (its own model tests
    write `original_max_position_embeddings` into a "default" config): such a config loads here too, and the warning
    names the keys."""
    parameters = {"rope_type": "default", "rope_theta": 10000.0, "original_max_position_embeddings": 16384}
    with caplog.at_level(logging.WARNING, logger="posformers.configuration_roformer"):
        config = tiny_config(RoFormerConfig, rope_parameters=parameters)
    assert config.rope_parameters == parameters
    assert any(
        "rope_parameters of type 'default' ignores the key(s) ['original_max_position_embeddings']" in r.getMessage()
        for r in caplog.records
    )
    model = RoFormerModel(config).eval()
    reference = RoFormerModel(tiny_config(RoFormerConfig)).eval()
    reference.load_state_dict(model.state_dict())
    input_ids = torch.arange(1, 20)[None]
    with torch.no_grad():
        assert torch.equal(model(input_ids).last_hidden_state, reference(input_ids).last_hidden_state)


def test_rope_parameters_and_legacy_rope_scaling_together_are_refused():
    with pytest.raises(ValueError, match="give rope_parameters or the older rope_scaling, not both"):
        tiny_config(
            RoFormerConfig,
            rope_parameters={"rope_type": "linear", "factor": 2.0},
            rope_scaling={"rope_type": "dynamic", "factor": 2.0},
        )


def test_rope_parameters_state_takes_priority_over_legacy_theta():
    """As in transformers: a value in rope_parameters wins over the same value stated outside it."""
    config = tiny_config(RoFormerConfig, rope_theta=500.0, rope_parameters={"rope_type": "default", "rope_theta": 9.0})
    assert config.rope_parameters["rope_theta"] == 9.0


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoint errors
# ---------------------------------------------------------------------------------------------------------------------

FAMILIES = {
    "roformer": (posformers.RoFormerConfig, posformers.RoFormerForMaskedLM),
    "deberta": (posformers.DebertaConfig, posformers.DebertaForMaskedLM),
    "littlebird": (posformers.LittleBirdConfig, posformers.LittleBirdForMaskedLM),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_shaped_tensor_is_the_runtime_error_transformers_code_catches(tmp_path, family):
    config_class, model_class = FAMILIES[family]
    model_class(tiny_config(config_class)).save_pretrained(tmp_path)
    corrupt.wrong_shape(tmp_path)
    with pytest.raises(RuntimeError, match=r"query(_proj)?\.weight has shape \(3, 3\), the model expects \(32, 32\)"):
        model_class.from_pretrained(tmp_path)
    with pytest.raises(OSError, match="ignore_mismatched_sizes=True"):  # still posformers' CheckpointError
        model_class.from_pretrained(tmp_path)
