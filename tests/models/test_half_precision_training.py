"""Half-precision training of the three models.

100 AdamW steps on real text (SST-2 dev, tokenized with BERT's uncased vocabulary) under CPU `torch.autocast` in
float16 with dynamic loss scaling (`torch.amp.GradScaler`) and in bfloat16, for masked-LM and sequence
classification, every batch holding a row of padding only. Each run is checked against the same 100 steps in float32:
no inf/NaN loss, finite gradients on every step the scaler keeps (and few skipped), finite logits on the padding row,
and a loss curve that tracks float32's. The same, over 30 steps, for a DeBERTa masked LM with mDeBERTa's 251,000-token
vocabulary.

The loop is the model-level one: on CPU, `Trainer(fp16=True)` trains in float32 (accelerate turns on fp16 autocast and
its GradScaler only on accelerators and leaves `native_amp` off on CPU), so it would exercise nothing here.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from helpers.data import DATA_DIR
from helpers.modeling import make_batch, max_diff, tiny_config

from posformers import (
    DebertaConfig,
    DebertaForMaskedLM,
    DebertaForSequenceClassification,
    LittleBirdConfig,
    LittleBirdForMaskedLM,
    LittleBirdForSequenceClassification,
    RoFormerConfig,
    RoFormerForMaskedLM,
    RoFormerForSequenceClassification,
)

STEPS = 100
PAD_ID, MASK_ID = 0, 103  # BERT uncased's [PAD] and [MASK]
BERT_VOCAB = 30522
# mDeBERTa-v3's vocabulary (its preset's vocab_size), where fp16 training is a known complaint in transformers' tracker
MDEBERTA_VOCAB = DebertaConfig.from_preset("mdeberta-v3-base").vocab_size
HALF_DTYPES = [torch.float16, torch.bfloat16]

MODELS = {
    "roformer": (RoFormerConfig, RoFormerForMaskedLM, RoFormerForSequenceClassification),
    "deberta": (DebertaConfig, DebertaForMaskedLM, DebertaForSequenceClassification),
    "littlebird": (LittleBirdConfig, LittleBirdForMaskedLM, LittleBirdForSequenceClassification),
}


@functools.cache
def sst2_examples(count: int, max_tokens: int) -> tuple[tuple[tuple[int, ...], int], ...]:
    """(BERT uncased token ids, label) of the first `count` SST-2 dev sentences, cut to `max_tokens`."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    rows = [line.split("\t") for line in (DATA_DIR / "glue" / "sst2" / "dev.tsv").read_text().splitlines()[1:]]
    encode = functools.partial(tokenizer, truncation=True, max_length=max_tokens)
    return tuple((tuple(encode(sentence)["input_ids"]), int(label)) for sentence, label in rows[:count])


def training_batches(
    task: str, rows: int = 3, max_tokens: int = 24, vocab_size: int | None = None, seed: int = 0, steps: int = STEPS
):
    """(vocab_size, `steps` batches): each batch `rows` SST-2 sentences, right-padded, plus a row of padding only
    (attention mask all zeros, label -100). For "mlm", 15% of the inner tokens (at least one per sentence) become
    [MASK] and are the labels; for "classification", the sentence labels.

    Token ids are renumbered densely over the tokens the sentences use (and [PAD], [MASK]), which keeps the MLM head
    small; with `vocab_size`, they are instead spread over a table of that size by a fixed random injection, so that
    the rows trained lie all over it."""
    generator = torch.Generator().manual_seed(seed)
    examples = sst2_examples(steps * rows, max_tokens)
    used = sorted({PAD_ID, MASK_ID}.union(*(ids for ids, _ in examples)))
    if vocab_size is None:
        vocab_size, targets = len(used), torch.arange(len(used))
    else:
        targets = torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(vocab_size - 1, generator=generator) + 1])
    renumber = dict(zip(used, targets[: len(used)].tolist()))  # [PAD] (id 0, first) stays 0 either way
    batches = []
    for step in range(steps):
        chunk = examples[step * rows : (step + 1) * rows]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.full((rows + 1, width), PAD_ID)
        attention_mask = torch.zeros(rows + 1, width, dtype=torch.long)
        for row, (ids, _) in enumerate(chunk):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
        if task == "mlm":
            inner = attention_mask.clone().bool()
            inner[:, 0] = False  # [CLS]
            inner[torch.arange(rows), attention_mask[:rows].sum(1) - 1] = False  # [SEP]
            chosen = (torch.rand(input_ids.shape, generator=generator) < 0.15) & inner
            chosen[torch.arange(rows), inner[:rows].float().argmax(1)] |= inner[:rows].any(1)
            labels = torch.where(chosen, input_ids, -100)
            input_ids = input_ids.masked_fill(chosen, MASK_ID)
        else:
            labels = torch.tensor([label for _, label in chunk] + [-100])
        input_ids = input_ids.apply_(renumber.__getitem__)
        if task == "mlm":
            labels = torch.where(labels >= 0, labels.clamp_min(0).apply_(renumber.__getitem__), labels)
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return vocab_size, batches


def build_model(name: str, task: str, vocab_size: int, **overrides):
    config_class, mlm_class, classification_class = MODELS[name]
    config = tiny_config(config_class, vocab_size=vocab_size, num_labels=2, pad_token_id=PAD_ID, **overrides)
    torch.manual_seed(0)
    return (mlm_class if task == "mlm" else classification_class)(config).train()


def train(model, batches, dtype: torch.dtype | None) -> dict:
    """AdamW on `batches` under CPU autocast in `dtype` (None: float32); float16 scales the loss with a GradScaler.
    Returns the losses, the steps whose unscaled gradients were not all finite, the steps the scaler skipped (its
    scale went down), whether the padding row's logits were finite on every step, and the logits' dtypes."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    run = {"losses": [], "bad_gradients": [], "skipped": [], "padding_row_finite": True, "logits_dtypes": set()}
    for step, batch in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            output = model(**batch)
        run["losses"].append(output.loss.item())
        run["logits_dtypes"].add(output.logits.dtype)
        run["padding_row_finite"] &= bool(torch.isfinite(output.logits[-1]).all())
        scaler.scale(output.loss).backward()
        scaler.unscale_(optimizer)
        if not all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None):
            run["bad_gradients"].append(step)
        scale = scaler.get_scale() if scaler.is_enabled() else None
        scaler.step(optimizer)
        scaler.update()
        if scaler.is_enabled() and scaler.get_scale() < scale:
            run["skipped"].append(step)
    return run


@functools.cache
def float32_run(name: str, task: str, vocab_size: int | None = None, **batch_args) -> dict:
    """The float32 reference run of `name` on `task` (shared by the float16 and bfloat16 runs)."""
    vocab, batches = training_batches(task, vocab_size=vocab_size, **batch_args)
    return train(build_model(name, task, vocab), batches, None)


def check_half_run(run: dict, reference: dict, dtype: torch.dtype) -> None:
    """A half-precision run is sound: it computed in `dtype`; its loss is finite on every step; its gradients are
    finite on every step but those the GradScaler skipped (float16), which are few and at the start; the padding row's
    logits are finite; and its loss curve tracks the float32 run's (means of every 10 steps within 2%)."""
    assert run["logits_dtypes"] == {dtype}
    assert all(torch.isfinite(torch.tensor(run["losses"])))
    assert run["bad_gradients"] == run["skipped"], "non-finite gradients on a step the scaler kept"
    assert len(run["skipped"]) <= 3 and all(step < 10 for step in run["skipped"]), run["skipped"]
    assert run["padding_row_finite"] and reference["padding_row_finite"]
    half, full = torch.tensor(run["losses"]).view(-1, 10).mean(1), torch.tensor(reference["losses"]).view(-1, 10)
    torch.testing.assert_close(half, full.mean(1), rtol=0.02, atol=0.0)


@pytest.fixture
def one_thread():
    """Tiny models step faster on one thread than on several (and leave the shared machine's other cores alone)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("task", ["mlm", "classification"])
@pytest.mark.parametrize("name", MODELS)
def test_hundred_steps_in_half_precision_track_float32(name, task, dtype, one_thread):
    vocab_size, batches = training_batches(task)
    run = train(build_model(name, task, vocab_size), batches, dtype)
    reference = float32_run(name, task)
    check_half_run(run, reference, dtype)
    if task == "mlm":  # the runs learned something, so tracking float32 is not two flat lines
        losses = torch.tensor(reference["losses"])
        assert losses[-10:].mean() < losses[:10].mean() - 1.0


# mDeBERTa's vocabulary matters in the masked-LM head (classification only looks rows up, as every DeBERTa does). The
# head is the costly part on CPU, where float16 matrix products have no hardware support (one (256 x 32) @ (32 x
# 251,000) product: 2.4 s in float16, 0.3 s in float32, 0.2 s in bfloat16): a step takes one sentence of at most 16
# tokens and the padding row, for 30 steps (three of the 10-step windows the loss curves are compared over).
MDEBERTA_BATCHES = dict(rows=1, max_tokens=16, steps=30)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_mdeberta_vocabulary_trains_in_half_precision(dtype, one_thread):
    vocab_size, batches = training_batches("mlm", vocab_size=MDEBERTA_VOCAB, **MDEBERTA_BATCHES)
    assert vocab_size == MDEBERTA_VOCAB and max(batch["input_ids"].max() for batch in batches) > BERT_VOCAB
    run = train(build_model("deberta", "mlm", vocab_size), batches, dtype)
    check_half_run(run, float32_run("deberta", "mlm", MDEBERTA_VOCAB, **MDEBERTA_BATCHES), dtype)


@pytest.mark.parametrize("unpad_inputs", ["auto", "never"])
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("name", MODELS)
def test_padding_only_rows_stay_finite_in_half_precision(name, dtype, unpad_inputs):
    """A batch with a row of padding only (attention mask all zeros), in the padding-free and the padded path, with
    every attention kernel, under autocast and with the weights themselves in `dtype`: logits finite everywhere, a
    finite loss and finite gradients, and logits at real tokens close to float32's."""
    input_ids, attention_mask, _ = make_batch(batch=3, seq_len=17, pad_from=(None, 0, 5))
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    tolerance = 2e-3 if dtype == torch.float16 else 2e-2
    implementations = ["sdpa", "eager"] if name != "littlebird" else [None]
    for implementation, weights_in_dtype in itertools.product(implementations, [False, True]):
        model = build_model(name, "mlm", 99, unpad_inputs=unpad_inputs)
        if implementation is not None:
            model.set_attn_implementation(implementation)
        reference = model(input_ids, attention_mask=attention_mask).logits.detach()
        if weights_in_dtype:
            model.to(dtype)
        with torch.autocast("cpu", dtype=dtype, enabled=not weights_in_dtype):
            output = model(input_ids, attention_mask=attention_mask, labels=labels)
        case = f"{implementation} weights_in_dtype={weights_in_dtype}"
        assert output.logits.dtype == dtype, case
        assert torch.isfinite(output.logits).all() and torch.isfinite(output.loss), case
        assert max_diff(output.logits.float(), reference, attention_mask) <= tolerance, case
        output.loss.backward()
        for parameter_name, parameter in model.named_parameters():
            assert parameter.grad is None or torch.isfinite(parameter.grad).all(), f"{case} {parameter_name}"
