"""Models on posformers' drop-in travel as transformers' models do: `pickle`, `torch.save` / `torch.load`, a spawn
worker of `multiprocessing` (which pickles the model to send it) and `copy.deepcopy` give back a model of the same
class, still on posformers, with the same outputs. Built by `posformers.enable()` or converted by `optimize`; DeBERTa
v1, DeBERTa-v2 and RoFormer; DeBERTa's masked-LM models (transformers' head over posformers' encoder) included.
Unpickled where posformers is not installed, such a model fails in one line naming posformers."""

from __future__ import annotations

import copy
import io
import multiprocessing
import pickle

import pytest
import torch
import transformers
from helpers import python_env, run_python
from helpers.modeling import forward_without_grad

import posformers
from posformers import dropin

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
FAMILIES = {
    "v1": ("Deberta", dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=64)),
    "v3": (
        "DebertaV2",
        dict(
            relative_attention=True,
            pos_att_type="p2c|c2p",
            position_buckets=32,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
        ),
    ),
    "roformer": ("RoFormer", dict(max_position_embeddings=64)),
}
CASES = [
    ("v1", "ForSequenceClassification"),
    ("v3", "ForSequenceClassification"),
    ("v3", "ForMaskedLM"),
    ("roformer", "ForTokenClassification"),
    ("roformer", "ForMaskedLM"),
]
INPUTS = dict(
    input_ids=torch.tensor([[5, 17, 23, 41, 8, 2], [5, 9, 2, 0, 0, 0]]),
    attention_mask=torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]),
)


def build(family: str, head: str, how: str, folder) -> torch.nn.Module:
    """A transformers checkpoint of `family` and `head` (random, seeded) on posformers: loaded through the Auto
    classes while enabled, or built by transformers and optimized. In eval mode."""
    prefix, fields = FAMILIES[family]
    config = getattr(transformers, prefix + "Config")(**TINY, **fields, num_labels=3)
    torch.manual_seed(0)
    model = getattr(transformers, prefix + head)(config)
    if how == "optimize":
        model = posformers.optimize(model)
    else:
        model.save_pretrained(folder)
        with posformers.enabled():
            model = getattr(transformers, f"AutoModel{head}").from_pretrained(folder)
    assert dropin.runs_on_posformers(model)
    return model.eval()


def logits(model) -> torch.Tensor:
    return forward_without_grad(model, INPUTS).logits


def assert_same_model(copied, model) -> None:
    assert copied is not model and type(copied) is type(model)
    assert type(copied.base_model) is type(model.base_model) and dropin.runs_on_posformers(copied)
    assert type(copied.config) is type(model.config) and copied.config.to_dict() == model.config.to_dict()
    torch.testing.assert_close(logits(copied), logits(model), rtol=0, atol=0)


@pytest.mark.parametrize("how", ["enable", "optimize"])
@pytest.mark.parametrize(("family", "head"), CASES)
def test_pickle_torch_save_and_deepcopy_keep_the_model(family, head, how, tmp_path):
    model = build(family, head, how, tmp_path)
    assert_same_model(pickle.loads(pickle.dumps(model)), model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    assert_same_model(torch.load(buffer, weights_only=False), model)
    assert_same_model(copy.deepcopy(model), model)


def test_every_class_the_drop_in_builds_is_found_by_its_name():
    """What pickle needs of a class: its module's attribute of its qualified name is the class itself."""
    import importlib

    classes = [*dropin.DROP_IN.values(), *(family.format_config for family in dropin.FAMILIES)]
    for cls in classes:
        assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls, cls


def test_a_spawn_worker_runs_the_model_it_is_sent(tmp_path):
    """A `multiprocessing` pool of the spawn kind (the default on macOS and Windows, and what CUDA needs) pickles each
    model to its worker, a fresh interpreter: the worker's outputs are the model's here."""
    cases = [(family, head, how) for family, head in CASES[::2] for how in ("enable", "optimize")]
    models = [build(family, head, how, tmp_path / f"{family}-{head}-{how}") for family, head, how in cases]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        results = pool.starmap(forward_without_grad, [(model, INPUTS) for model in models])
    # the worker runs torch with its own thread count (make test gives this process one): sums may round differently
    for model, result in zip(models, results):
        torch.testing.assert_close(result.logits, logits(model), rtol=0, atol=1e-6)


UNPICKLE = """
import pickle

try:
    with open(ARGS["pickled"], "rb") as file:
        pickle.load(file)
except Exception as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}", "found": POSFORMERS_FOUND}))
else:
    print(json.dumps({"error": None, "found": POSFORMERS_FOUND}))
"""


def test_unpickling_without_posformers_fails_in_one_line_naming_it(tmp_path):
    pickled = tmp_path / "model.pkl"
    pickled.write_bytes(pickle.dumps(build("v3", "ForSequenceClassification", "optimize", tmp_path)))
    report = run_python(
        UNPICKLE, {"pickled": str(pickled)}, env=python_env(tmp_path / "hf"), cwd=tmp_path, without_posformers=True
    )
    assert not report["found"]
    error = report["error"]
    assert error is not None and "\n" not in error
    assert error.startswith("ModuleNotFoundError: No module named 'posformers'"), error
