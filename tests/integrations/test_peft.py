"""PEFT on the three models: LoRA on every linear equals its merged model, trains on real SST-2 with only the adapters
(and the head) changing, survives gradient checkpointing, saves and reloads; a config without targets is refused."""

from __future__ import annotations

import pytest
import torch
from helpers.data import DATA_DIR
from helpers.modeling import max_diff, tiny_config
from peft import LoraConfig, PeftModel, TaskType

import posformers
from posformers.integrations.peft import TARGET_MODULES, get_peft_model, head_modules, target_modules

# The bert-base-uncased vocabulary the SST-2 sentences are tokenized with.
VOCAB_SIZE = 30522
# DeBERTa twice: v2/v3 (separate projections, the relative table projected by query_proj/key_proj) and v1 (one fused
# in_proj, its own pos_proj/pos_q_proj); "v1-shared" projects the table with in_proj's query and key rows.
MODELS = {
    "roformer": (posformers.RoFormerConfig, posformers.RoFormerForSequenceClassification, {}),
    "deberta": (posformers.DebertaConfig, posformers.DebertaForSequenceClassification, {}),
    "deberta-v1": (
        posformers.DebertaConfig,
        posformers.DebertaForSequenceClassification,
        dict(projection_layout="fused", share_att_key=False),
    ),
    "deberta-v1-shared": (
        posformers.DebertaConfig,
        posformers.DebertaForSequenceClassification,
        dict(projection_layout="fused", share_att_key=True),
    ),
    "littlebird": (posformers.LittleBirdConfig, posformers.LittleBirdForSequenceClassification, {}),
}
THREE = ["roformer", "deberta", "littlebird"]


def build(name: str, seed: int = 0):
    config_class, model_class, overrides = MODELS[name]
    torch.manual_seed(seed)
    return model_class(tiny_config(config_class, vocab_size=VOCAB_SIZE, **overrides)).eval()


@pytest.fixture(scope="module")
def sst2():
    """The first 32 SST-2 training sentences, tokenized with the bert-base-uncased vocabulary and padded."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    rows = [line.rsplit("\t", 1) for line in (DATA_DIR / "glue" / "sst2" / "train.tsv").read_text().splitlines()[1:33]]
    batch = tokenizer([text for text, _ in rows], padding=True, return_tensors="pt")
    batch["labels"] = torch.tensor([int(label) for _, label in rows])
    assert 0 in batch["attention_mask"], "the batch should hold padding"
    return dict(batch)


def inputs_of(batch: dict) -> dict:
    return {key: value for key, value in batch.items() if key != "labels"}


def lora_everywhere(model, seed: int = 1):
    """LoRA on every linear (peft's "all-linear"), with random B so that the adapters change the outputs."""
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(model, config).eval()


@pytest.mark.parametrize("name", list(MODELS))
def test_lora_on_every_linear_equals_its_merged_model(name, sst2):
    """Every projection goes through its module: what LoRA adapts is what merge_and_unload() bakes in. DeBERTa
    projected its relative table with the raw query/key weights and differed from its merged model by ~1e-1."""
    inputs = inputs_of(sst2)
    model = build(name)
    with torch.no_grad():
        base = model(**inputs).logits
    adapted_model = lora_everywhere(model)
    adapted = adapted_model(**inputs).logits.detach()  # with autograd on: the path training takes
    with torch.no_grad():
        adapted_inference = adapted_model(**inputs).logits  # inference: DeBERTa's cached position projections
        with adapted_model.disable_adapter():
            disabled = adapted_model(**inputs).logits
        merged = adapted_model.merge_and_unload()(**inputs).logits
    assert max_diff(adapted, base) > 1e-2, "the adapters should change the outputs"
    assert max_diff(adapted_inference, adapted) <= 1e-5
    assert max_diff(disabled, base) <= 1e-6, "adapters switched off must give the base model, cache or not"
    assert max_diff(merged, adapted) <= 1e-5

    # Loaded and merged at once after an inference pass of the base model (what it cached must not survive).
    model = build(name)
    with torch.no_grad():
        model(**inputs)
        merged_at_once = lora_everywhere(model).merge_and_unload()(**inputs).logits
    assert max_diff(merged_at_once, adapted) <= 1e-5


@pytest.mark.parametrize("name", THREE)
def test_lora_steps_on_sst2_lower_the_loss_and_change_only_adapters_and_head(name, sst2):
    model = build(name)
    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=8,
        lora_alpha=16,
        target_modules=target_modules(model),
        modules_to_save=head_modules(model),
    )
    model = get_peft_model(model, config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    trainable = {key for key, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in key or "modules_to_save" in key for key in trainable), trainable

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    losses = []
    for _ in range(8):
        loss = model(**sst2).loss
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        final = model(**sst2).loss.item()
    assert final < losses[0] - 0.05, (losses, final)

    after = model.state_dict()
    changed = {key for key in before if not torch.equal(before[key], after[key])}
    assert changed, "training changed nothing"
    assert all("lora_" in key or "modules_to_save" in key for key in changed), changed - trainable
    assert any(".lora_B." in key for key in changed) and any("modules_to_save" in key for key in changed)


@pytest.mark.parametrize("name", THREE)
def test_gradient_checkpointing_with_input_require_grads_reaches_the_adapters(name, sst2):
    """Reentrant checkpointing over a frozen model only gives gradients to what runs inside it when its inputs require
    grad: `enable_input_require_grads` makes the embeddings' output do so (transformers' DeBERTa lost this once,
    transformers PR #35898). The adapters get the gradients they get without checkpointing."""
    inputs = dict(sst2)

    def adapter_gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = build(name)
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=4, target_modules=target_modules(model, "all-linear"))).train()
        loss = model(**inputs).loss
        assert torch.isfinite(loss)
        loss.backward()
        return {key: p.grad for key, p in model.named_parameters() if p.requires_grad}

    plain = adapter_gradients(checkpointing=False)
    checkpointed = adapter_gradients(checkpointing=True)
    assert plain.keys() == checkpointed.keys()
    lora_b = [key for key in plain if ".lora_B." in key]  # B starts at zero: its gradient is the non-zero one
    layers = {key.split("encoder.layer.")[1].split(".")[0] for key in lora_b}
    assert layers == {str(i) for i in range(len(layers))} and len(layers) >= 2, layers
    for key in lora_b:
        assert checkpointed[key] is not None and checkpointed[key].abs().sum() > 0, key
        torch.testing.assert_close(checkpointed[key], plain[key], rtol=1e-5, atol=1e-7, msg=key)


@pytest.mark.parametrize("name", THREE)
def test_saved_adapter_reloads_to_the_same_outputs(name, sst2, tmp_path):
    inputs = inputs_of(sst2)
    model = build(name)
    model.save_pretrained(tmp_path / "base")
    torch.manual_seed(1)
    config = LoraConfig(
        r=4, target_modules=target_modules(model), modules_to_save=head_modules(model), init_lora_weights=False
    )
    adapted = get_peft_model(model, config).eval()
    with torch.no_grad():
        for p in adapted.parameters():  # the head's trainable copy too, so that a head left unsaved would show
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
        expected = adapted(**inputs).logits
    adapted.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

    base = type(model).from_pretrained(tmp_path / "base")
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert max_diff(reloaded(**inputs).logits, expected) <= 1e-6
        assert max_diff(base.__class__.from_pretrained(tmp_path / "base")(**inputs).logits, expected) > 1e-3


@pytest.mark.parametrize("name", THREE)
def test_missing_target_modules_is_refused_in_one_line_naming_the_modules(name):
    model = build(name)
    with pytest.raises(ValueError) as error:
        get_peft_model(model, LoraConfig(r=4))
    message = str(error.value)
    assert "\n" not in message
    assert "LoraConfig.target_modules is missing" in message and repr(model.config.model_type) in message
    assert str(TARGET_MODULES[model.config.model_type]["attention"]) in message


def test_target_modules_refuses_other_models_and_scopes():
    model = build("roformer")
    with pytest.raises(ValueError, match="scope must be one of"):
        target_modules(model, "everything")
    model.config.model_type = "bert"
    with pytest.raises(ValueError, match="model: target_modules knows the posformers model types"):
        target_modules(model)


def test_target_modules_name_the_encoder_linears_only():
    """The attention scope adapts the query and value projections of every layer, and "all-linear" every encoder
    linear, never the classifier, the pooler or (DeBERTa v1) anything but existing projections."""
    for name in MODELS:
        model = build(name)
        adapted = get_peft_model(model, LoraConfig(r=2, target_modules=target_modules(model, "all-linear")))
        wrapped = {key.rsplit(".lora_A", 1)[0] for key, _ in adapted.named_parameters() if ".lora_A." in key}
        linears = {
            key.removeprefix("base_model.model.")
            for key, module in adapted.named_modules()
            if isinstance(module, torch.nn.Linear) and "lora_" not in key and "base_layer" not in key
        }
        wrapped = {key.removeprefix("base_model.model.") for key in wrapped}
        assert wrapped, name
        assert all(".encoder.layer." in key for key in wrapped), name
        heads = {key for key in linears if ".encoder.layer." not in key}
        assert not wrapped & heads and heads, (name, heads)


def test_readme_example_runs(tmp_path, monkeypatch, sst2):
    """The manual's PEFT example runs as written on a tiny DeBERTa saved in a folder that stands for the Hub repo it
    names, and its saved adapter reloads."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    section = page[page.index("## PEFT: LoRA and other adapters") :]
    code = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 10)]
    assert code.count('"microsoft/deberta-v3-base"') == 2, code
    code = code.replace('"microsoft/deberta-v3-base"', '"deberta-v3-base"')
    build("deberta").save_pretrained(tmp_path / "deberta-v3-base")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    inputs = inputs_of(sst2)
    with torch.no_grad():
        merged = namespace["merged"].eval()(**inputs).logits
        # The adapter reloaded from out/adapter, on a fresh base, before merging: the merge changed nothing.
        base = posformers.DebertaForSequenceClassification.from_pretrained(tmp_path / "deberta-v3-base")
        adapted = PeftModel.from_pretrained(base, tmp_path / "out" / "adapter").eval()(**inputs).logits
    assert max_diff(merged, adapted) <= 1e-5
