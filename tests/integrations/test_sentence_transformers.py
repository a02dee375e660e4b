"""posformers models inside sentence-transformers: SentenceTransformer (Transformer + Pooling), a saved folder loaded
with trust_remote_code where posformers cannot be imported, CrossEncoder reranking, training with an ST loss, and
RoFormer-sim converted by posformers-convert as a SentenceTransformer. Real text: MRPC sentence pairs, SST-2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import python_env, run_python
from helpers.data import DATA_DIR
from helpers.modeling import tiny_config
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
from transformers import AutoTokenizer, BertTokenizer

import posformers

CONFIGS = {
    "roformer": posformers.RoFormerConfig,
    "deberta": posformers.DebertaConfig,
    "littlebird": posformers.LittleBirdConfig,
}
TOLERANCE = 1e-5


def mrpc_pairs(count: int, paraphrases_only: bool = True) -> list[tuple[str, str]]:
    """The first `count` sentence pairs of MRPC train (the paraphrases only, by default)."""
    with open(DATA_DIR / "glue/mrpc/train.tsv", encoding="utf-8-sig", newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    pairs = [(row["#1 String"], row["#2 String"]) for row in rows if row["Quality"] == "1" or not paraphrases_only]
    return pairs[:count]


def sst2_sentences(count: int) -> list[str]:
    return [line.split("\t")[0] for line in (DATA_DIR / "glue/sst2/dev.tsv").read_text().splitlines()[1 : count + 1]]


def save_tiny(family: str, class_name: str, folder, **overrides):
    """A tiny posformers `class_name` with the BERT uncased vocabulary, saved with its tokenizer to `folder`."""
    tokenizer = BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    torch.manual_seed(0)
    config = tiny_config(CONFIGS[family], vocab_size=tokenizer.vocab_size, **overrides)
    model = getattr(posformers, class_name)(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def mean_pooled(model, tokenizer, sentences: list[str]) -> torch.Tensor:
    """The reference embedding: the model's last hidden state averaged over real tokens, L2-normalised."""
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    return F.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)


def mean_pooling_st(folder) -> SentenceTransformer:
    transformer = Transformer(str(folder))
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[transformer, pooling, Normalize()])


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_sentence_transformer_embeds_like_the_model(family, tmp_path):
    """Transformer + mean Pooling + Normalize around a posformers model: ST's embeddings of real sentences (batched
    with padding, run padding-free by the model) equal the model's own mean-pooled states."""
    model, tokenizer = save_tiny(family, f"{CONFIGS[family].__name__.removesuffix('Config')}Model", tmp_path)
    st = mean_pooling_st(tmp_path)
    assert type(st[0].model) is type(model)
    sentences = sst2_sentences(6)
    embeddings = st.encode(sentences, batch_size=4, convert_to_tensor=True)
    assert (embeddings - mean_pooled(model, tokenizer, sentences)).abs().max() <= TOLERANCE


# Run where posformers cannot be imported: load each saved ST folder with remote code, embed, report.
REMOTE_ST = """
import sentence_transformers

result = {}
for family, folder in ARGS["folders"].items():
    st = sentence_transformers.SentenceTransformer(folder, trust_remote_code=True)
    embeddings = st.encode(ARGS["sentences"], convert_to_tensor=True)
    result[family] = {"module": type(st[0].model).__module__, "embeddings": embeddings.tolist()}
result["posformers"] = sorted(m for m in sys.modules if m.split(".")[0] == "posformers")
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def remote_st(tmp_path_factory):
    """Each family's SentenceTransformer saved, then loaded with remote code in ONE child without posformers: the
    child's report and the embeddings posformers gives."""
    work = tmp_path_factory.mktemp("remote-st")
    sentences, folders, expected = sst2_sentences(4), {}, {}
    for family in CONFIGS:
        save_tiny(family, f"{CONFIGS[family].__name__.removesuffix('Config')}Model", work / family)
        st = mean_pooling_st(work / family)
        folders[family] = str(work / f"st-{family}")
        st.save(folders[family])
        expected[family] = st.encode(sentences, convert_to_tensor=True)
    args = {"folders": folders, "sentences": sentences}
    result = run_python(REMOTE_ST, args, env=python_env(work / "hf-home"), cwd=work, without_posformers=True)
    return result, folders, expected


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_saved_sentence_transformer_loads_with_remote_code_without_posformers(family, remote_st):
    result, folders, expected = remote_st
    assert json.loads((Path(folders[family]) / "config.json").read_text())["auto_map"]["AutoModel"]
    assert result[family]["module"].startswith("transformers_modules."), result[family]["module"]
    assert result["posformers"] == []
    assert (torch.tensor(result[family]["embeddings"]) - expected[family]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_cross_encoder_scores_and_ranks_like_the_classifier(family, tmp_path):
    """CrossEncoder around a posformers sequence classifier (one label): its scores of (sentence, candidate) pairs
    are the classifier's sigmoid logits, and `rank` orders the candidates by them."""
    class_name = f"{CONFIGS[family].__name__.removesuffix('Config')}ForSequenceClassification"
    model, tokenizer = save_tiny(family, class_name, tmp_path, num_labels=1)
    torch.manual_seed(1)
    with torch.no_grad():  # a spread of scores, so that the ranking is not decided by ties
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(tmp_path)
    query, candidates = mrpc_pairs(1)[0][0], [pair[1] for pair in mrpc_pairs(6, paraphrases_only=False)]
    batch = tokenizer([query] * len(candidates), candidates, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch.sigmoid(model(**batch).logits[:, 0])

    cross_encoder = CrossEncoder(str(tmp_path))
    assert type(cross_encoder.model) is type(model)
    scores = torch.as_tensor(cross_encoder.predict([(query, c) for c in candidates]))
    assert (scores - expected).abs().max() <= TOLERANCE
    ranking = cross_encoder.rank(query, candidates)
    assert [entry["corpus_id"] for entry in ranking] == expected.argsort(descending=True).tolist()


@pytest.mark.slow
def test_multiple_negatives_ranking_loss_trains(tmp_path):
    """A few SentenceTransformerTrainer steps with MultipleNegativesRankingLoss on MRPC paraphrase pairs (in-batch
    negatives) lower that loss on the pairs trained on; the trained model saves and reloads to the same embeddings."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    save_tiny("roformer", "RoFormerModel", tmp_path / "model")
    st = mean_pooling_st(tmp_path / "model")
    pairs = mrpc_pairs(16)
    dataset = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
    loss = MultipleNegativesRankingLoss(st)

    def pair_loss() -> float:
        with torch.no_grad():
            anchors = st.encode([a for a, _ in pairs], convert_to_tensor=True)
            positives = st.encode([p for _, p in pairs], convert_to_tensor=True)
        scores = anchors @ positives.T * loss.scale
        return F.cross_entropy(scores, torch.arange(len(pairs))).item()

    before = pair_loss()
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_train_epochs=4, learning_rate=3e-2,
        report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, seed=0,
    )  # fmt: skip
    SentenceTransformerTrainer(model=st, args=args, train_dataset=dataset, loss=loss).train()
    after = pair_loss()
    assert after < before - 0.1, (before, after)

    st.save(str(tmp_path / "trained"))
    reloaded = SentenceTransformer(str(tmp_path / "trained"))
    sentences = sst2_sentences(3)
    expected = st.encode(sentences, convert_to_tensor=True)
    assert (reloaded.encode(sentences, convert_to_tensor=True) - expected).abs().max() <= TOLERANCE


@pytest.mark.slow
def test_converted_roformer_sim_is_a_sentence_transformer(tmp_path, capsys):
    """`posformers-convert roformer --from hf ... --sentence-transformers` on junnyu's RoFormer-sim layout: the
    output loads as a SentenceTransformer whose embedding is the model's normalised pooler vector, on Chinese text."""
    from conversion.test_roformer_conversion import write_sim_release

    from posformers.conversion import cli

    source, output = tmp_path / "roformer_chinese_sim_char_base", tmp_path / "converted"
    write_sim_release(source)
    args = ["roformer", "--from", "hf", "--source", str(source), "--output", str(output), "--sentence-transformers"]
    assert cli.main(args) == 0
    assert "sentence-transformers modules: modules.json" in capsys.readouterr().out
    st = SentenceTransformer(str(output))
    sentences = ["今天天气非常好。", "明天会下雨吗？", "我喜欢在公园里散步，尤其是在秋天的傍晚。"]

    tokenizer = AutoTokenizer.from_pretrained(output)
    model = posformers.RoFormerModel.from_pretrained(output, is_decoder=False).eval()
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = F.normalize(model(**batch).pooler_output, dim=-1)
    assert (st.encode(sentences, convert_to_tensor=True) - expected).abs().max() <= TOLERANCE

    # no pooler, no sentence-transformers modules: one line, nothing written
    capsys.readouterr()
    off = ["--config", '{"add_pooling_layer": false}']
    assert cli.main([*args[:-2], str(tmp_path / "off"), *off, "--sentence-transformers"]) == 1
    assert capsys.readouterr().err.strip().endswith("--sentence-transformers needs a pooler (RoFormer-sim); the "
                                                    "converted model has none")  # fmt: skip
    assert not (tmp_path / "off").exists()
