"""Two clients that build or reshape transformers' models themselves, run as their users run them, on posformers with
the documented line, against the same client without posformers:

- GLiNER 0.2.29 (`gliner`) builds its DeBERTa-v3 encoder by name (`DebertaV2Model.from_pretrained`), so
  `posformers.enable()` cannot reach it: enabled, one warning line says so and names `posformers.optimize(model)`,
  which then gives GLiNER's spans and scores.
- BERTScore 0.3.13 (`bert-score`) loads its encoder through `AutoModel` and keeps its first k layers: under
  `posformers.enable()`, and with `posformers.optimize(scorer._model)` on a scorer built as shipped, P, R and F are
  BERTScore's.

The reference runs in ONE child process that cannot import posformers: it builds GLiNER (random heads over a tiny
random DeBERTa-v3 backbone saved with the demo tokenizer), saves its state_dict so that every run here uses the same
weights, and reports its entities and BERTScore's scores. Real text: SST-2 dev sentences, MRPC dev sentence pairs.
"""

from __future__ import annotations

import csv
import inspect
import logging
import shutil

import pytest
import torch
import transformers
from helpers import REPO_ROOT, python_env, run_python
from helpers.data import DATA_DIR

import posformers
from posformers import dropin

TOKENIZER = REPO_ROOT / "finetune" / "demo_data" / "tokenizer"
# A tiny DeBERTa-v3 (as in test_dropin_gliner2.py), with 4 layers of which BERTScore keeps 3.
BACKBONE = dict(
    hidden_size=32,
    num_hidden_layers=4,
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
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
BERTSCORE_LAYERS = 3
LABELS = ["person", "organization", "feeling"]
TOLERANCE = 1e-5


def sst2_sentences(count: int) -> list[str]:
    lines = (DATA_DIR / "glue/sst2/dev.tsv").read_text(encoding="utf-8").splitlines()[1 : count + 1]
    return [line.rsplit("\t", 1)[0].strip() for line in lines]


def mrpc_pairs(count: int) -> tuple[list[str], list[str]]:
    with open(DATA_DIR / "glue/mrpc/dev.tsv", encoding="utf-8-sig", newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]
    return [row["#1 String"] for row in rows], [row["#2 String"] for row in rows]


# The clients, as their users call them; the reference child runs the same functions (their source).


def build_gliner(backbone: str):
    """GLiNER from its config over a local DeBERTa-v3 folder, as clients-offline.md describes."""
    from gliner import GLiNER, GLiNERConfig

    config = GLiNERConfig(model_name=backbone, max_width=8, hidden_size=32, max_len=256, span_mode="markerV0")
    return GLiNER.from_config(config, backbone_from_pretrained=True, load_tokenizer=True)


def gliner_entities(model, texts: list[str], labels: list[str]) -> list[list]:
    """Every span GLiNER scores (threshold 0, nested and multi-label kept): [row, start, end, label, score]."""
    model.eval()
    results = model.batch_predict_entities(texts, labels, threshold=0.0, flat_ner=False, multi_label=True)
    return [
        [row, entity["start"], entity["end"], entity["label"], entity["score"]]
        for row, entities in enumerate(results)
        for entity in entities
    ]


def bertscore(backbone: str, candidates: list[str], references: list[str], layers: int) -> dict:
    """BERTScorer over the folder, its first `layers` layers: P, R, F, and the model it ran."""
    from bert_score import BERTScorer

    scorer = BERTScorer(model_type=backbone, num_layers=layers, lang="en", device="cpu")
    precision, recall, f1 = scorer.score(candidates, references, batch_size=4)
    return {"P": precision.tolist(), "R": recall.tolist(), "F": f1.tolist(), "scorer": scorer}


REFERENCE = """
import torch

torch.manual_seed(0)
model = build_gliner(ARGS["backbone"])
torch.save(model.state_dict(), ARGS["gliner_state"])
result = bertscore(ARGS["backbone"], *ARGS["pairs"], ARGS["layers"])
scorer = result.pop("scorer")
print(json.dumps({
    "entities": gliner_entities(model, ARGS["texts"], ARGS["labels"]),
    "encoder": type(model.model.token_rep_layer.bert_layer.model).__module__,
    "bertscore": result,
    "bertscore_model": type(scorer._model).__module__,
    "bertscore_layers": [len(scorer._model.encoder.layer), scorer._model.config.num_hidden_layers],
    "posformers_found": POSFORMERS_FOUND,
    "posformers_imported": sorted(m for m in sys.modules if m.split(".")[0] == "posformers"),
}))
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    work = tmp_path_factory.mktemp("by-name")
    backbone = work / "backbone"
    torch.manual_seed(0)
    vocab_size = len((TOKENIZER / "vocab.txt").read_text().splitlines())
    transformers.DebertaV2Model(transformers.DebertaV2Config(vocab_size=vocab_size, **BACKBONE)).save_pretrained(
        backbone
    )
    for file in TOKENIZER.iterdir():
        shutil.copy(file, backbone)
    args = {
        "backbone": str(backbone),
        "gliner_state": str(work / "gliner.pt"),
        "texts": sst2_sentences(16),
        "labels": LABELS,
        "pairs": mrpc_pairs(8),
        "layers": BERTSCORE_LAYERS,
    }
    code = "\n\n".join(inspect.getsource(f) for f in (build_gliner, gliner_entities, bertscore)) + REFERENCE
    report = run_python(code, args, env=python_env(work / "hf-home"), cwd=work, without_posformers=True)
    assert not report["posformers_found"] and report["posformers_imported"] == []
    assert report["encoder"] == report["bertscore_model"] == "transformers.models.deberta_v2.modeling_deberta_v2"
    assert report["bertscore_layers"] == [BERTSCORE_LAYERS, BACKBONE["num_hidden_layers"]]
    return {**args, **report}


def gliner_with_reference_weights(reference):
    model = build_gliner(reference["backbone"])
    model.load_state_dict(torch.load(reference["gliner_state"], weights_only=True))
    return model


def assert_same_entities(actual: list, expected: list) -> None:
    """The same spans with the same labels, scores within TOLERANCE (GLiNER orders spans by score: spans whose
    scores differ by rounding may swap places)."""
    actual = {tuple(span[:4]): span[4] for span in actual}
    expected = {tuple(span[:4]): span[4] for span in expected}
    assert len(expected) > 100 and actual.keys() == expected.keys()
    difference = max(abs(actual[key] - score) for key, score in expected.items())
    assert difference <= TOLERANCE, difference


def test_gliner_with_optimize_finds_gliners_entities(reference):
    model = gliner_with_reference_weights(reference)
    encoder = model.model.token_rep_layer.bert_layer.model
    assert type(encoder) is transformers.DebertaV2Model
    parameters = dict(model.named_parameters())
    assert posformers.optimize(model) is model
    assert dropin.runs_on_posformers(model) and type(encoder).__module__ == "posformers.dropin"
    assert all(parameters[name] is p for name, p in model.named_parameters())
    assert_same_entities(gliner_entities(model, reference["texts"], LABELS), reference["entities"])


def test_enable_says_in_one_line_that_it_cannot_reach_gliner(reference, caplog):
    """GLiNER builds DebertaV2Model by name: enabled, it stays transformers', and one line (once) says so and what
    reaches it; following that line gives GLiNER's entities."""
    with caplog.at_level(logging.WARNING, logger="posformers.dropin"), posformers.enabled():
        model = gliner_with_reference_weights(reference)
        again = gliner_with_reference_weights(reference)
    warnings = [record.getMessage() for record in caplog.records if record.name == "posformers.dropin"]
    assert warnings == [dropin.BUILT_BY_NAME_WARNING.format(name="DebertaV2Model")]
    assert "posformers.optimize(model)" in warnings[0]
    assert not dropin.runs_on_posformers(model) and not dropin.runs_on_posformers(again)
    posformers.optimize(model)
    assert_same_entities(gliner_entities(model, reference["texts"], LABELS), reference["entities"])


@pytest.mark.parametrize("how", ["enable", "optimize"])
def test_bertscore_gives_its_scores(how, reference, caplog):
    """BERTScorer keeps 3 of the backbone's 4 layers and leaves its config at 4: under enable() and with
    optimize(scorer._model), posformers runs those 3 layers and P, R and F are BERTScore's."""
    with caplog.at_level(logging.WARNING, logger="posformers.dropin"):
        if how == "enable":
            with posformers.enabled():
                result = bertscore(reference["backbone"], *reference["pairs"], BERTSCORE_LAYERS)
        else:
            result = bertscore(reference["backbone"], *reference["pairs"], BERTSCORE_LAYERS)
            model = result["scorer"]._model
            assert type(model) is transformers.DebertaV2Model
            posformers.optimize(model)
            precision, recall, f1 = result["scorer"].score(*reference["pairs"], batch_size=4)
            result.update(P=precision.tolist(), R=recall.tolist(), F=f1.tolist())
    assert not [record for record in caplog.records if record.name == "posformers.dropin"]
    model = result.pop("scorer")._model
    assert dropin.runs_on_posformers(model) and type(model).__module__ == "posformers.dropin"
    assert len(model.encoder.layer) == BERTSCORE_LAYERS and model.config.num_hidden_layers == 4
    for name, expected in reference["bertscore"].items():
        torch.testing.assert_close(torch.tensor(result[name]), torch.tensor(expected), rtol=0, atol=TOLERANCE)
