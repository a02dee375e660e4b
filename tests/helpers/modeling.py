"""Tiny configs, padded batches and output comparisons shared by the model tests (and any test that needs a model)."""

from __future__ import annotations

import pytest
import torch

# Small enough for CPU tests; intermediate_size 37 matches no other size, so a mixed-up dimension fails loudly.
# Dropout is off so that training-mode outputs are comparable.
TINY_FIELDS = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
# What each model adds, by model_type: short position tables for RoFormer (the warning beyond them is tested); a
# third layer and the official table for DeBERTa (the convolution sits beside layer 1, the EMD reuses the last);
# blocks of 4 and 3 pack states for LittleBird, so that 17 tokens span several blocks.
TINY_MODEL_FIELDS = {
    "posformers-roformer": dict(max_position_embeddings=64),
    "posformers-deberta": dict(num_hidden_layers=3, max_position_embeddings=512),
    "littlebird": dict(block_size=4, pack_length=3),
}


def tiny_fields(model_type: str) -> dict:
    """The tiny config fields of a model type (also what transformers' reference configs are built from)."""
    return {**TINY_FIELDS, **TINY_MODEL_FIELDS.get(model_type, {})}


def tiny_config(config_class, **overrides):
    """A tiny `config_class` (RoFormerConfig, DebertaConfig, LittleBirdConfig), with `overrides` on top."""
    return config_class(**{**tiny_fields(config_class.model_type), **overrides})


def make_batch(batch=3, seq_len=17, vocab=99, pad_from=(None, 11, 5), seed=0, choices=None):
    """Random (input_ids, attention_mask, token_type_ids), right-padded: row i is padded from pad_from[i] on (ids 0
    there); token types switch to 1 halfway. With `choices`, the shape is (batch, choices, seq_len)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, seq_len) if choices is None else (batch, choices, seq_len)
    input_ids = torch.randint(1, vocab, shape, generator=generator)
    attention_mask = torch.ones(shape, dtype=torch.long)
    for row, start in enumerate(pad_from[:batch]):
        if start is not None:
            attention_mask[row, ..., start:] = 0
            input_ids[row, ..., start:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[..., seq_len // 2 :] = 1
    return input_ids, attention_mask, token_type_ids


def reload_as(model, model_class, folder, **kwargs):
    """`model` saved to `folder` and loaded back as `model_class` (e.g. a transformers reference as ours), in eval
    mode; `kwargs` go to `from_pretrained`."""
    model.save_pretrained(folder)
    return model_class.from_pretrained(folder, **kwargs).eval()


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Largest absolute difference of two tensors; with a (B, L) `mask` of a (B, L, ...) pair, on real tokens only
    (padded positions hold whatever each implementation leaves there)."""
    if mask is not None and a.shape[: mask.dim()] == mask.shape:
        a, b = a[mask.bool()], b[mask.bool()]
    return (a - b).abs().max().item()


def check_preset_overrides(config_class, name: str, **overrides) -> None:
    """`config_class.from_preset(name, **overrides)` is the preset with exactly `overrides` changed, the preset table
    is left as it was, and an unknown name is refused with the names there are."""
    preset = config_class.from_preset(name).to_dict()
    assert any(preset[field] != value for field, value in overrides.items()), "pick overrides that change something"
    assert config_class.from_preset(name, **overrides).to_dict() == {**preset, **overrides}
    assert config_class.from_preset(name).to_dict() == preset
    with pytest.raises(ValueError, match=rf"Unknown preset 'no-such-size' for {config_class.__name__}; choose one of"):
        config_class.from_preset("no-such-size")


def tensor_outputs(model, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors among `model(**inputs)`'s outputs, computed without gradients."""
    with torch.no_grad():
        return {key: value for key, value in model(**inputs).items() if isinstance(value, torch.Tensor)}


def assert_same_outputs(actual: dict, expected: dict, tolerance: float = 1e-6) -> None:
    """Two {name: tensor} outputs have the same names and shapes and differ by at most `tolerance` anywhere."""
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert actual[key].shape == value.shape, key
        diff = max_diff(actual[key], value)
        assert diff <= tolerance, f"{key}: max abs diff {diff}"


def check_activation_checkpointing(model, loss, atol: float = 1e-6) -> dict[str, torch.Tensor]:
    """`loss(model).backward()` in training mode gives the same gradients with activation checkpointing on, in both
    of torch's checkpoint implementations (non-reentrant, transformers' default, and reentrant), as without it (a
    parameter without a gradient there may have a zero one here). Returns the gradients without checkpointing."""
    model.train()

    def gradients():
        model.zero_grad()
        loss(model).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain = gradients()
    for kwargs in ({"use_reentrant": False}, {"use_reentrant": True}):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        checkpointed = gradients()
        model.activation_checkpointing_disable()
        assert plain.keys() <= checkpointed.keys(), (kwargs, plain.keys() - checkpointed.keys())
        for name, grad in checkpointed.items():
            # Reentrant checkpointing gives zeros, not None, to parameters of an output that nothing reads.
            expected = plain.get(name, torch.zeros_like(grad))
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=atol, msg=f"{kwargs} {name}")
    return plain


def sim_generation_reference(reference, prompt: torch.Tensor, steps: int):
    """Greedy generation as junnyu's RoFormerForCausalLM (RoFormer-sim) does it, run on transformers' RoFormer: the
    prompt, token type 0, is read with `is_decoder` off (bidirectionally) while filling a cache; each generated token,
    token type 1, then attends causally to the cache. Returns the tokens and the logits each choice was made from."""
    from transformers import DynamicCache

    from posformers.modeling_roformer import CACHE_FIELD  # the argument's name in this transformers version

    cache = DynamicCache(config=reference.config)
    reference.config.is_decoder = False
    try:
        logits = [reference(prompt, **{CACHE_FIELD: cache}).logits]
    finally:
        reference.config.is_decoder = True
    assert cache.get_seq_length() == prompt.shape[1]
    tokens = prompt
    for _ in range(steps):
        token = logits[-1][:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, token], dim=1)
        step = reference(token, token_type_ids=torch.ones_like(token), use_cache=True, **{CACHE_FIELD: cache})
        logits.append(step.logits)
    return tokens, logits


def sst2_token_ids(count: int) -> list[list[int]]:
    """Token ids (BERT uncased vocabulary) of the first `count` SST-2 dev sentences: real text of different lengths."""
    from transformers import BertTokenizer

    from .data import DATA_DIR

    tokenizer = BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    lines = (DATA_DIR / "glue" / "sst2" / "dev.tsv").read_text().splitlines()[1 : count + 1]
    return [tokenizer(line.split("\t")[0])["input_ids"] for line in lines]


def flattened(sentences: list[list[int]], cu_seq_lens: bool) -> dict:
    """transformers' DataCollatorWithFlattening batch of `sentences` (labels dropped), with cu_seq_lens_q/k and
    max_length_q/k when `cu_seq_lens`."""
    from transformers import DataCollatorWithFlattening

    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=cu_seq_lens)([{"input_ids": s} for s in sentences])
    batch.pop("labels")
    return batch


def check_flattened_refusals(model, batch: dict) -> None:
    """A model taking flattened batches refuses, each with its one-line error, a flattened `batch` (with cu_seq_lens)
    contradicted by a padding mask, by cu_seq_lens, by cu_seq_lens_q != cu_seq_lens_k, by position_ids that do not
    count 0, 1, 2, ..., and combined with output_attentions."""
    mask = torch.ones_like(batch["input_ids"])
    mask[0, -1] = 0
    with pytest.raises(ValueError, match=r"position_ids restart at 0 .* but attention_mask marks padding"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask)
    with pytest.raises(ValueError, match=r"cu_seq_lens_q/cu_seq_lens_k .* contradict"):
        model(**{**batch, "cu_seq_lens_q": batch["cu_seq_lens_q"] + 1, "cu_seq_lens_k": batch["cu_seq_lens_q"] + 1})
    with pytest.raises(ValueError, match="cu_seq_lens_q and cu_seq_lens_k differ"):
        model(**{**batch, "cu_seq_lens_k": batch["cu_seq_lens_k"].flip(0)})
    wrong = batch["position_ids"].clone()
    wrong[0, 3] += 1
    with pytest.raises(ValueError, match="position_ids of a flattened batch must count 0, 1, 2"):
        model(input_ids=batch["input_ids"], position_ids=wrong)
    with pytest.raises(ValueError, match="output_attentions"):
        model(**batch, output_attentions=True)


def packing_calls(monkeypatch, modeling_module) -> list:
    """Records the packing every base model of `modeling_module` plans for its pass (None for the padded path): the
    base models return transformers' output types only, so this is where a test sees which path a pass took."""
    calls = []
    plan = modeling_module.plan_packing

    def recording(*args, **kwargs):
        calls.append(plan(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(modeling_module, "plan_packing", recording)
    return calls


def forward_without_grad(model, inputs: dict):
    """`model(**inputs)` under `torch.no_grad()`: a module-level function, so a spawn worker of `multiprocessing` can
    run it on a model it is sent."""
    with torch.no_grad():
        return model(**inputs)
