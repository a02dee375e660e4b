"""transformers pipelines on RoFormer, DeBERTa and LittleBird: every score a pipeline reports is the model's own
output on the same text, computed here one sentence at a time without the pipeline (so the pipeline's batching,
padding and label handling are checked too). Real text: SST-2 sentences, SQuAD v1.1 articles; tiny random models with
the bert-base-uncased vocabulary.

transformers 5 has no "question-answering" pipeline any more; posformers registers "extractive-question-answering"
(posformers.integrations.pipelines), and a LittleBird model reads a 4,000-token SQuAD article in one window there.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.data import DATA_DIR
from helpers.modeling import tiny_config

import posformers
from posformers.integrations import pipelines

TOKENIZER = transformers.BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
MODELS = {
    "roformer": (posformers.RoFormerConfig, "RoFormer"),
    "deberta": (posformers.DebertaConfig, "Deberta"),
    "littlebird": (posformers.LittleBirdConfig, "LittleBird"),
}
SENTENCES = [
    line.split("\t")[0]
    for line in (DATA_DIR / "glue" / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:9]
]
NLI_LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}  # entailment last, as in MNLI checkpoints


def build(name: str, head: str, **overrides):
    """A tiny random `<Model><head>` of model `name` for the bert-base-uncased vocabulary, in eval mode. Weights
    drawn wider than the default so that scores differ from one another."""
    config_class, prefix = MODELS[name]
    torch.manual_seed(0)
    fields = dict(vocab_size=len(TOKENIZER), pad_token_id=TOKENIZER.pad_token_id, initializer_range=0.2)
    return getattr(posformers, prefix + head)(tiny_config(config_class, **{**fields, **overrides})).eval()


def own_output(model, *texts: str):
    """The model's output on one text (or one pair), no padding."""
    with torch.no_grad():
        return model(**TOKENIZER(*texts, return_tensors="pt"))


def assert_scores(actual, expected) -> None:
    torch.testing.assert_close(torch.tensor(actual, dtype=torch.float64), expected.double(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_text_classification_scores_are_the_models_softmax(name):
    model = build(name, "ForSequenceClassification", id2label={0: "negative", 1: "positive"})
    classify = transformers.pipeline("text-classification", model=model, tokenizer=TOKENIZER)
    results = classify(SENTENCES, top_k=None, batch_size=4)  # padded batches of 4
    for sentence, result in zip(SENTENCES, results):
        expected = own_output(model, sentence).logits[0].softmax(-1)
        by_label = {item["label"]: item["score"] for item in result}
        assert set(by_label) == {"negative", "positive"}
        assert_scores([by_label["negative"], by_label["positive"]], expected)


@pytest.mark.parametrize("name", MODELS)
def test_token_classification_tags_every_token_with_the_models_softmax(name):
    labels = {0: "O", 1: "B-MISC", 2: "I-MISC"}
    model = build(name, "ForTokenClassification", id2label=labels)
    tag = transformers.pipeline("token-classification", model=model, tokenizer=TOKENIZER, ignore_labels=[])
    results = tag(SENTENCES[:4], batch_size=2)
    for sentence, result in zip(SENTENCES[:4], results):
        probabilities = own_output(model, sentence).logits[0].softmax(-1)
        assert [item["index"] for item in result] == list(range(1, probabilities.shape[0] - 1))  # no [CLS]/[SEP]
        assert [item["entity"] for item in result] == [labels[int(i)] for i in probabilities[1:-1].argmax(-1)]
        assert_scores([float(item["score"]) for item in result], probabilities[1:-1].max(-1).values)
        assert all(sentence[item["start"] : item["end"]].lower() == item["word"].removeprefix("##") for item in result)


@pytest.mark.parametrize("name", MODELS)
def test_feature_extraction_gives_the_last_hidden_state(name):
    model = build(name, "Model")
    extract = transformers.pipeline("feature-extraction", model=model, tokenizer=TOKENIZER)
    results = extract(SENTENCES, batch_size=4)  # rows come back at the batch's padded length
    for sentence, result in zip(SENTENCES, results):
        expected = own_output(model, sentence).last_hidden_state
        torch.testing.assert_close(torch.tensor(result)[:, : expected.shape[1]], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_zero_shot_classification_reads_the_entailment_logit(name):
    label2id = {label: i for i, label in NLI_LABELS.items()}
    model = build(name, "ForSequenceClassification", id2label=NLI_LABELS, label2id=label2id)
    classify = transformers.pipeline("zero-shot-classification", model=model, tokenizer=TOKENIZER)
    candidates = ["positive", "negative", "about acting"]
    for sentence in SENTENCES[:3]:
        logits = torch.stack([own_output(model, sentence, f"This example is {c}.").logits[0] for c in candidates])
        result = classify(sentence, candidate_labels=candidates)
        scores = dict(zip(result["labels"], result["scores"]))
        assert_scores([scores[c] for c in candidates], logits[:, 2].softmax(0))  # entailment across the labels
        result = classify(sentence, candidate_labels=candidates, multi_label=True)
        scores = dict(zip(result["labels"], result["scores"]))
        assert_scores([scores[c] for c in candidates], logits[:, [0, 2]].softmax(-1)[:, 1])  # vs contradiction


@pytest.mark.parametrize("name", MODELS)
def test_fill_mask_scores_are_the_models_softmax(name):
    model = build(name, "ForMaskedLM")
    fill = transformers.pipeline("fill-mask", model=model, tokenizer=TOKENIZER)
    for sentence in SENTENCES[:3]:
        words = sentence.split()
        masked = " ".join([*words[:2], TOKENIZER.mask_token, *words[3:]])
        inputs = TOKENIZER(masked, return_tensors="pt")
        position = int((inputs["input_ids"][0] == TOKENIZER.mask_token_id).nonzero())
        expected = own_output(model, masked).logits[0, position].softmax(-1).topk(5)
        result = fill(masked, top_k=5)
        assert [item["token"] for item in result] == expected.indices.tolist()
        assert_scores([item["score"] for item in result], expected.values)


def test_deberta_fill_mask_runs_through_the_enhanced_mask_decoder():
    """The pipeline's forward is DebertaForMaskedLM's: the last layer runs once in the encoder and `emd_steps` more
    times in the Enhanced Mask Decoder, and the scores are not those of the plain LM head on the encoder output."""
    model = build("deberta", "ForMaskedLM")
    assert model.lm_predictions.steps == 2
    calls = []
    model.deberta.encoder.layer[-1].register_forward_hook(lambda *_: calls.append(1))
    fill = transformers.pipeline("fill-mask", model=model, tokenizer=TOKENIZER)
    masked = f"it 's a charming and often {TOKENIZER.mask_token} journey ."
    result = fill(masked, top_k=5)
    assert len(calls) == 1 + 2
    inputs = TOKENIZER(masked, return_tensors="pt")
    position = int((inputs["input_ids"][0] == TOKENIZER.mask_token_id).nonzero())
    with torch.no_grad():
        encoder_output = model.deberta(**inputs).last_hidden_state
        plain = model.lm_predictions.lm_head(encoder_output)[0, position].log_softmax(-1)
    emd = own_output(model, masked).logits[0, position].log_softmax(-1)
    assert_scores([item["score"] for item in result], emd.exp()[[item["token"] for item in result]])
    assert (plain - emd).abs().max() > 0.1  # the decoder changed the scores


# ---------------------------------------------------------------------------------------------------------------------
# Extractive question answering
# ---------------------------------------------------------------------------------------------------------------------


def squad_document(min_tokens: int) -> tuple[str, str, str]:
    """(question, its gold answer, document): Super_Bowl_50's paragraphs joined until the document passes
    `min_tokens`; the question is one of the article's, asked of the whole document."""
    article = json.loads((DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"][0]
    document = ""
    for paragraph in article["paragraphs"]:
        if len(TOKENIZER(document)["input_ids"]) > min_tokens:
            break
        document += paragraph["context"] + "\n\n"
    qa = article["paragraphs"][0]["qas"][0]
    return qa["question"], qa["answers"][0]["text"], document


def best_span(model, question: str, context: str, max_answer_len: int = 30, tokenizer=TOKENIZER) -> str:
    """The best answer of the model's own logits over the whole input (one pass), by checking every start and end
    in the context."""
    encoded = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets, sequence_ids = encoded.pop("offset_mapping")[0].tolist(), encoded.sequence_ids(0)
    with torch.no_grad():
        output = model(**encoded)
    start, end = output.start_logits[0], output.end_logits[0]
    context_tokens = torch.tensor([s == 1 for s in sequence_ids])
    scores = start[:, None] + end[None, :]
    positions = torch.arange(len(sequence_ids))
    lengths = positions[None, :] - positions[:, None]
    valid = (lengths >= 0) & (lengths < max_answer_len) & context_tokens[:, None] & context_tokens[None, :]
    flat = scores.masked_fill(~valid, float("-inf")).argmax()
    first, last = divmod(int(flat), scores.shape[1])
    return context[offsets[first][0] : offsets[last][1]]


@pytest.fixture(scope="module")
def long_document():
    return squad_document(4000)


@pytest.mark.slow
def test_littlebird_answers_a_4000_token_document_in_one_window(long_document, tmp_path):
    question, _, document = long_document
    model = build("littlebird", "ForQuestionAnswering")
    assert len(TOKENIZER(question, document)["input_ids"]) > 4000
    assert TOKENIZER.model_max_length > 10**20  # no limit from the tokenizer: the config decides
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(KeyError, match="question-answering has been removed from transformers"):
        transformers.pipeline("question-answering", model=model, tokenizer=TOKENIZER)  # why posformers registers one
    qa = transformers.pipeline(pipelines.TASK, model=model, tokenizer=TOKENIZER)
    answer = qa(question=question, context=document)
    assert len(calls) == 1  # one window: the whole document
    text = best_span(model, question, document)
    assert answer["answer"] == text == document[answer["start"] : answer["end"]]
    top = qa(question=question, context=document, top_k=3)
    assert top[0] == answer and len(top) == 3 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]

    # transformers' old default (384 tokens, overlapping windows) on request
    calls.clear()
    qa(question=question, context=document, max_seq_len=384, doc_stride=128)
    assert len(calls) > 10

    # by task name from a saved folder, as a user loads it
    model.save_pretrained(tmp_path / "littlebird-qa")
    TOKENIZER.save_pretrained(tmp_path / "littlebird-qa")
    loaded = transformers.pipeline(pipelines.TASK, model=str(tmp_path / "littlebird-qa"))
    assert isinstance(loaded, pipelines.QuestionAnsweringPipeline)
    assert loaded(question=question, context=document)["answer"] == text


@pytest.mark.parametrize("name", ["roformer", "deberta"])
def test_models_with_a_position_limit_answer_over_windows(name, long_document):
    """RoFormer and DeBERTa read windows of min(384, max_position_embeddings) tokens, as transformers' pipeline did;
    the answer of a one-window paragraph is the best span of the model's own logits."""
    question, _, document = long_document
    model = build(name, "ForQuestionAnswering", max_position_embeddings=512)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    qa = pipelines.QuestionAnsweringPipeline(model=model, tokenizer=TOKENIZER)
    paragraph = document.split("\n\n")[0]
    answers = qa([{"question": question, "context": paragraph}, {"question": question, "context": document}])
    window = min(384, model.config.max_position_embeddings)
    windows = TOKENIZER(
        question, document, truncation="only_second", max_length=window, stride=min(window // 2, 128),
        return_overflowing_tokens=True,
    )["input_ids"]  # fmt: skip
    assert len(calls) == 1 + len(windows) and len(windows) > 10
    assert answers[0]["answer"] == best_span(model, question, paragraph)
    assert document[answers[1]["start"] : answers[1]["end"]] == answers[1]["answer"]


def test_question_answering_refuses_bad_arguments():
    qa = pipelines.QuestionAnsweringPipeline(model=build("littlebird", "ForQuestionAnswering"), tokenizer=TOKENIZER)
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        qa(question="who?", context="nobody.", top_k=0)
    with pytest.raises(ValueError, match="question and context: 2 questions for 1 contexts"):
        qa(question=["who?", "what?"], context=["nobody."])
    with pytest.raises(ValueError, match="inputs: question and context must both hold text"):
        qa(question=" ", context="nobody.")
    with pytest.raises(ValueError, match="max_seq_len must be at least 8"):
        qa(question="who?", context="nobody.", max_seq_len=4)


def test_question_answering_options(long_document):
    """max_answer_len bounds the span; handle_impossible_answer answers "" when the null score (both logits at
    [CLS]) wins, and only then."""
    question, _, document = long_document
    paragraph = document.split("\n\n")[0]
    model = build("littlebird", "ForQuestionAnswering")
    qa = pipelines.QuestionAnsweringPipeline(model=model, tokenizer=TOKENIZER)
    short = qa(question=question, context=paragraph, max_answer_len=1)
    assert len(TOKENIZER.tokenize(short["answer"])) == 1
    one = qa(question=question, context=paragraph)
    assert qa(question=[question, question], context=[paragraph, paragraph]) == [one, one]
    assert qa({"question": question, "context": paragraph}) == one
    assert qa(question=question, context=paragraph, handle_impossible_answer=True)["answer"] != ""

    def favour_cls(module, args, output):
        output.start_logits[:, 0] += 100.0
        output.end_logits[:, 0] += 100.0
        return output

    model.register_forward_hook(favour_cls)
    impossible = qa(question=question, context=paragraph, handle_impossible_answer=True)
    assert impossible["answer"] == "" and impossible["score"] > 0.99
    assert qa(question=question, context=paragraph)["answer"] != ""  # SQuAD v1: a span all the same


def test_span_selection_head_reads_its_question_token(long_document):
    """A QA model whose head is Splinter's (qa_head="span_selection") gets [QUESTION] right after the question, as
    posformers-qa gives it, and answers with the best span of its own logits on that input."""
    question, _, document = long_document
    paragraph = document.split("\n\n")[0]
    tokenizer = transformers.BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    tokenizer.add_special_tokens({"additional_special_tokens": ["[QUESTION]"]})
    question_id = tokenizer.convert_tokens_to_ids("[QUESTION]")
    model = build(
        "littlebird", "ForQuestionAnswering", vocab_size=len(tokenizer), question_token_id=question_id,
        qa_head="span_selection",
    )  # fmt: skip
    calls = []
    model.register_forward_hook(
        lambda module, args, kwargs, output: calls.append(kwargs["input_ids"]), with_kwargs=True
    )
    qa = pipelines.QuestionAnsweringPipeline(model=model, tokenizer=tokenizer)
    answer = qa(question=question, context=paragraph)
    (input_ids,) = calls
    assert input_ids[0].tolist().count(question_id) == 1
    assert (
        int((input_ids[0] == question_id).nonzero()) == int((input_ids[0] == tokenizer.sep_token_id).nonzero()[0]) - 1
    )
    assert answer["answer"] == best_span(model, f"{question} [QUESTION]", paragraph, tokenizer=tokenizer)

    plain = transformers.BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    with pytest.raises(ValueError, match=r"^tokenizer: .* no added special token of that id"):
        pipelines.QuestionAnsweringPipeline(model=model, tokenizer=plain)(question=question, context=paragraph)


# Runs pipelines on saved folders in a Python that cannot import posformers (the folders' own code runs).
REMOTE_PIPELINES = """
import transformers

results = {}
for name, job in ARGS["jobs"].items():
    pipe = transformers.pipeline(job["task"], model=job["folder"], trust_remote_code=True)
    results[name] = {"module": type(pipe.model).__module__, "output": pipe(job["text"], **job["kwargs"])}
results["posformers"] = sorted(m for m in sys.modules if m.split(".")[0] == "posformers")
print(json.dumps(results))
"""


@pytest.mark.slow
def test_pipelines_without_posformers_run_the_folders_own_code(tmp_path):
    """fill-mask (DeBERTa) and text-classification (LittleBird) from saved folders with trust_remote_code=True, where
    posformers cannot be imported, give the scores of the same pipelines here."""
    from helpers import python_env, run_python

    masked = f"it 's a charming and often {TOKENIZER.mask_token} journey ."
    jobs = {
        "deberta-fill-mask": ("fill-mask", build("deberta", "ForMaskedLM"), masked, {"top_k": 5}),
        "littlebird-classify": (
            "text-classification",
            build("littlebird", "ForSequenceClassification", id2label={0: "negative", 1: "positive"}),
            SENTENCES[0],
            {"top_k": None},
        ),
    }
    args = {"jobs": {}}
    expected = {}
    for name, (task, model, text, kwargs) in jobs.items():
        model.save_pretrained(tmp_path / name)
        TOKENIZER.save_pretrained(tmp_path / name)
        args["jobs"][name] = {"task": task, "folder": str(tmp_path / name), "text": text, "kwargs": kwargs}
        expected[name] = transformers.pipeline(task, model=model, tokenizer=TOKENIZER)(text, **kwargs)
    result = run_python(
        REMOTE_PIPELINES, args, env=python_env(tmp_path / "hf-home"), cwd=tmp_path, without_posformers=True
    )
    assert result.pop("posformers") == []
    for name, remote in result.items():
        assert remote["module"].startswith("transformers_modules."), remote
        assert [item.get("token", item.get("label")) for item in remote["output"]] == [
            item.get("token", item.get("label")) for item in expected[name]
        ]
        assert_scores([item["score"] for item in remote["output"]], torch.tensor([i["score"] for i in expected[name]]))
