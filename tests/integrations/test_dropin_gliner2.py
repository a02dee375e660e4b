"""GLiNER2 (2.1) on posformers' drop-in: its DeBERTa-v3 encoder built by `posformers.enable()` or converted by
`posformers.optimize(model)` extracts the same spans with the same scores, and one training step with GLiNER2's own
loss gives the same gradients, as GLiNER2 as shipped.

The reference runs in ONE child process that never imports posformers: it builds the GLiNER2 model (seeded heads over
a tiny random DeBERTa-v3 backbone saved with the demo tokenizer, as clients-offline.md describes), saves it, and
reports its extractions and gradients. Here the same saved weights run on posformers. Real text: SST-2 dev sentences.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from gliner2 import ExtractorConfig, GLiNER2
from helpers import REPO_ROOT, python_env, run_python
from helpers.data import DATA_DIR
from safetensors.torch import load_file
from transformers import DebertaV2Config, DebertaV2Model

import posformers

TOKENIZER = REPO_ROOT / "finetune" / "demo_data" / "tokenizer"
# A tiny DeBERTa-v3: relative attention with both disentangled terms, log buckets (16: GLiNER2's inputs, its prompt
# before the sentence, are far longer than the 8 exact positions either side), one shared key projection, layer-normed
# relative embeddings. Dropout 0, so a training step is deterministic on both sides.
BACKBONE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=16,
    max_relative_positions=-1,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=0,
    layer_norm_eps=1e-7,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
LABELS = ["person", "organization", "feeling"]
SCORE_TOLERANCE = 1e-5
GRADIENT_TOLERANCE = 1e-5  # relative to the largest |gradient| of each parameter

# Run on both sides (the child gets it as text, this module execs it): extraction of every span with its score, and
# one training step the way gliner2.training.trainer computes it (ExtractorCollator with is_training=True, the
# model's forward on the collated batch, `total_loss`, backward). The heads' dropout is set to 0 (the backbone's is
# 0 in its config), and the collator runs after a fixed seed, so both sides see the same batch.
STEPS = """
import random

import torch
from gliner2.training.data import Classification, InputExample
from gliner2.training.trainer import ExtractorCollator, ExtractorDataset


def extract(model, texts, labels):
    model.eval()
    results = model.batch_extract_entities(
        texts, labels, threshold=0.0, batch_size=8, include_confidence=True, include_spans=True, overlap_policy="allow"
    )
    return [
        [label, row, span["start"], span["end"], span["confidence"]]
        for row, result in enumerate(results)
        for label, spans in result["entities"].items()
        for span in spans
    ]


def training_step(model, records):
    examples = [
        InputExample(
            text=record["text"],
            entities=record["entities"],
            classifications=[Classification("sentiment", ["negative", "positive"], record["sentiment"])],
        )
        for record in records
    ]
    dataset = ExtractorDataset.from_examples(examples, shuffle=False)
    collator = ExtractorCollator(model.processor, is_training=True, architecture=getattr(model, "architecture", "span"))
    random.seed(0)
    torch.manual_seed(0)
    batch = collator([dataset[i] for i in range(len(dataset))])
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.zero_grad(set_to_none=True)
    outputs = model(batch)
    outputs["total_loss"].backward()
    gradients = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(outputs["total_loss"].detach()), gradients
"""

REFERENCE = """
from pathlib import Path

from gliner2 import GLiNER2, ExtractorConfig
from safetensors.torch import save_file

torch.manual_seed(0)
model = GLiNER2(ExtractorConfig(model_name=ARGS["backbone"]))
model.save_pretrained(ARGS["gliner2"])
spans = extract(model, ARGS["texts"], ARGS["labels"])
loss, gradients = training_step(model, ARGS["records"])
save_file(gradients, ARGS["gradients"])
print(json.dumps({
    "encoder": f"{type(model.encoder).__module__}.{type(model.encoder).__name__}",
    "spans": spans,
    "loss": loss,
    "posformers_found": POSFORMERS_FOUND,
    "posformers_imported": sorted(m for m in sys.modules if m.split(".")[0] == "posformers"),
}))
"""

_steps: dict = {}
exec(STEPS, _steps)
extract, training_step = _steps["extract"], _steps["training_step"]


def sst2_rows(count: int) -> list[tuple[str, int]]:
    lines = (DATA_DIR / "glue/sst2/dev.tsv").read_text().splitlines()[1 : count + 1]
    return [(line.rsplit("\t", 1)[0], int(line.rsplit("\t", 1)[1])) for line in lines]


def training_records() -> list[dict]:
    """Four SST-2 dev sentences annotated with entities found in them (one an explicit negative) and their label."""
    entities = [
        {"feeling": ["charming"], "organization": []},
        {"feeling": ["bleak", "desperate"]},
        {"person": ["nolan"], "feeling": []},
        {"organization": ["production"], "person": []},
    ]
    rows = sst2_rows(len(entities))
    return [
        {"text": text, "entities": found, "sentiment": ["negative", "positive"][label]}
        for (text, label), found in zip(rows, entities)
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The backbone folder, the reference GLiNER2 saved, and the child's report and gradients."""
    work = tmp_path_factory.mktemp("gliner2")
    backbone = work / "backbone"
    torch.manual_seed(0)
    config = DebertaV2Config(vocab_size=len((TOKENIZER / "vocab.txt").read_text().splitlines()), **BACKBONE)
    DebertaV2Model(config).save_pretrained(backbone)
    for file in TOKENIZER.iterdir():
        shutil.copy(file, backbone)
    args = {
        "backbone": str(backbone),
        "gliner2": str(work / "gliner2"),
        "gradients": str(work / "gradients.safetensors"),
        "texts": [text for text, _ in sst2_rows(12)],
        "labels": LABELS,
        "records": training_records(),
    }
    report = run_python(STEPS + REFERENCE, args, env=python_env(work / "hf-home"), cwd=work, without_posformers=True)
    assert report["encoder"] == "transformers.models.deberta_v2.modeling_deberta_v2.DebertaV2Model", report["encoder"]
    assert not report["posformers_found"] and report["posformers_imported"] == []
    return {**args, "report": report, "reference_gradients": load_file(args["gradients"])}


def saved_state(reference) -> dict[str, torch.Tensor]:
    return load_file(Path(reference["gliner2"]) / "model.safetensors")


def build(how: str, reference) -> GLiNER2:
    """A GLiNER2 on posformers, with the reference's weights:
    - "enable": built from the backbone folder under posformers.enabled() (GLiNER2 loads its encoder with
      AutoModel.from_pretrained), then given the reference's heads (seeded there: the same seed need not give the same
      heads here, as the encoder's construction may draw differently);
    - "enable-checkpoint": the saved GLiNER2 loaded under posformers.enabled() (AutoModel.from_config, then its
      state_dict);
    - "optimize": the saved GLiNER2 loaded as shipped, then posformers.optimize(model)."""
    if how == "enable":
        with posformers.enabled():
            model = GLiNER2(ExtractorConfig(model_name=reference["backbone"]))
        backbone = load_file(Path(reference["backbone"]) / "model.safetensors")
        state = model.state_dict()
        for name, tensor in backbone.items():  # GLiNER2 adds rows to the word embeddings for its special tokens
            assert torch.equal(state[f"encoder.{name}"][: len(tensor)], tensor), name
        model.load_state_dict(saved_state(reference))
    elif how == "enable-checkpoint":
        with posformers.enabled():
            model = GLiNER2.from_pretrained(reference["gliner2"])
    else:
        model = GLiNER2.from_pretrained(reference["gliner2"])
        assert type(model.encoder) is DebertaV2Model
        parameters = dict(model.named_parameters())
        assert posformers.optimize(model) is model
        assert all(parameters[name] is p for name, p in model.named_parameters())
        assert len(parameters) == len(list(model.parameters()))
    assert not posformers.is_enabled()
    assert (type(model.encoder).__module__, type(model.encoder).__name__) == ("posformers.dropin", "DebertaV2Model")
    state = model.state_dict()
    expected = saved_state(reference)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[name], tensor) for name, tensor in expected.items())
    return model


def scores(spans: list) -> dict[tuple, float]:
    """(label, sentence, start, end) -> score: GLiNER2 lists a sentence's spans by score, so spans whose scores differ
    by float rounding may swap places."""
    return {tuple(span[:4]): span[4] for span in spans}


@pytest.mark.parametrize("how", ["enable", "enable-checkpoint", "optimize"])
def test_extraction_is_gliner2s(how, reference):
    """Every span with its score (threshold 0, overlaps allowed) of 12 SST-2 sentences, in two batches of 8."""
    spans = scores(extract(build(how, reference), reference["texts"], LABELS))
    expected = scores(reference["report"]["spans"])
    assert len(expected) > 1000
    assert spans.keys() == expected.keys()
    difference = max(abs(spans[key] - score) for key, score in expected.items())
    assert difference <= SCORE_TOLERANCE, difference


@pytest.mark.parametrize("how", ["enable", "optimize"])
def test_training_step_gives_gliner2s_gradients(how, reference):
    """One step of GLiNER2's loss (entity spans, a negative entity type, the sentiment classification) on 4 SST-2
    sentences: the same loss, and every parameter's gradient within 1e-5 of its largest |value|."""
    loss, gradients = training_step(build(how, reference), reference["records"])
    expected = reference["reference_gradients"]
    assert abs(loss - reference["report"]["loss"]) <= 1e-5 * abs(reference["report"]["loss"])
    assert gradients.keys() == expected.keys()
    assert any(name.startswith("encoder.") for name in expected) and any(
        name.startswith("classifier.") for name in expected
    )
    errors = {
        name: float((gradients[name] - want).abs().max() / want.abs().max().clamp_min(1e-12))
        for name, want in expected.items()
    }
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRADIENT_TOLERANCE, (worst, errors[worst])
