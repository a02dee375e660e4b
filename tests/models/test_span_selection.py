"""Question-aware span selection (Splinter's QASS head) in all three models: XForQuestionSpanSelection and its
carry-over to XForQuestionAnswering with `qa_head="span_selection"`.

The passages are real SQuAD v1.1 dev contexts (BERT uncased tokens) with a [QUESTION] token added to the vocabulary,
as `posformers-pretrain --objective rss` adds it. Every check compares the head against something it did not compute
itself: a loop over examples and questions on the head's own transforms, the padded path against the padding-free and
flattened paths, a saved and reloaded model, the QA model against the span-selection model.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers import python_env
from helpers.data import DATA_DIR
from helpers.modeling import max_diff, tiny_config
from helpers.remote import check_remote_load

import posformers
from posformers import (
    DebertaConfig,
    DebertaForQuestionAnswering,
    DebertaForQuestionSpanSelection,
    LittleBirdConfig,
    LittleBirdForQuestionAnswering,
    LittleBirdForQuestionSpanSelection,
    RoFormerConfig,
    RoFormerForQuestionAnswering,
    RoFormerForQuestionSpanSelection,
)

TOLERANCE = 1e-5
BERT_VOCAB = 30522
QUESTION = BERT_VOCAB  # the [QUESTION] token, added after BERT's vocabulary
MODELS = {
    "roformer": (RoFormerConfig, RoFormerForQuestionSpanSelection, RoFormerForQuestionAnswering),
    "deberta": (DebertaConfig, DebertaForQuestionSpanSelection, DebertaForQuestionAnswering),
    "littlebird": (LittleBirdConfig, LittleBirdForQuestionSpanSelection, LittleBirdForQuestionAnswering),
}
# Passage lengths: mixed, the last row short; LittleBird's blocks of 4 make these several blocks long.
LENGTHS = [29, 21, 12]
# Per row: (question position, answer start, answer end); row 2 asks nothing.
QUESTIONS = [[(3, 12, 14), (9, 20, 20)], [(5, 10, 12)], []]


@pytest.fixture(scope="module")
def squad_passages() -> list[list[int]]:
    """BERT uncased tokens ([CLS] ... [SEP]) of the first SQuAD v1.1 dev contexts of four articles, then the first
    three paragraphs of the first article as one long passage."""
    tokenizer = transformers.BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
    data = json.loads((DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json").read_text())["data"]
    passages = [article["paragraphs"][0]["context"] for article in data[:4]]
    passages.append(" ".join(paragraph["context"] for paragraph in data[0]["paragraphs"][:3]))
    return [tokenizer(passage)["input_ids"] for passage in passages]


def tiny_span_model(name: str, model_class=None, seed: int = 0, **overrides):
    config_class, span_class, _ = MODELS[name]
    fields = dict(vocab_size=BERT_VOCAB + 1, question_token_id=QUESTION, **overrides)
    torch.manual_seed(seed)
    return (model_class or span_class)(tiny_config(config_class, **fields)).eval()


def rss_batch(passages, lengths=LENGTHS, questions=QUESTIONS) -> dict[str, torch.Tensor]:
    """A right-padded batch of passages cut to `lengths`, [QUESTION] tokens at the question positions, and
    question_positions / start_positions / end_positions (-1 / 0 where a row asks fewer than the most)."""
    width, most = max(lengths), max(len(q) for q in questions)
    input_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    question_positions = torch.full((len(lengths), most), -1)
    start_positions, end_positions = torch.zeros_like(question_positions), torch.zeros_like(question_positions)
    for row, (length, asked) in enumerate(zip(lengths, questions)):
        input_ids[row, :length] = torch.tensor(passages[row][: length - 1] + passages[row][-1:])
        attention_mask[row, :length] = 1
        for column, (position, start, end) in enumerate(asked):
            input_ids[row, position] = QUESTION
            question_positions[row, column] = position
            start_positions[row, column], end_positions[row, column] = start, end
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "question_positions": question_positions,
        "start_positions": start_positions,
        "end_positions": end_positions,
    }


def flatten(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch's real tokens in transformers' padding-free format: one row, position_ids restarting per sequence."""
    real = batch["attention_mask"].bool()
    positions = torch.cat([torch.arange(int(n)) for n in real.sum(-1)])
    return {"input_ids": batch["input_ids"][real][None], "position_ids": positions[None]}


def set_unpad(model, mode: str):
    model.config.unpad_inputs = mode
    model.base_model.config.unpad_inputs = mode


def run(model, mode: str, **inputs):
    """Outputs of `model(**inputs)` with unpad_inputs=mode and the parameter gradients of their loss."""
    set_unpad(model, mode)
    model.zero_grad()
    outputs = model(**inputs)
    outputs.loss.backward()
    return outputs, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(actual: dict, expected: dict):
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=TOLERANCE, atol=TOLERANCE, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# Shapes, masking and the loss
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_logits_are_lowest_at_padding_and_on_absent_questions(name, squad_passages):
    model = tiny_span_model(name)
    batch = rss_batch(squad_passages)
    with torch.no_grad():
        outputs = model(**batch)
    lowest = torch.finfo(torch.float32).min
    for logits in (outputs.start_logits, outputs.end_logits):
        assert logits.shape == (3, 2, max(LENGTHS))
        blocked = (batch["question_positions"] < 0)[..., None] | ~batch["attention_mask"].bool()[:, None, :]
        assert bool((logits[blocked] == lowest).all())
        assert bool(logits[~blocked].isfinite().all()) and bool((logits[~blocked] > lowest / 2).all())
    assert type(model.qass).__name__ == "QuestionAwareSpanSelectionHead"


def test_littlebird_padding_inside_the_sequence_is_lowest(squad_passages):
    """Padding Insertion leaves holes in the mask; the passage tokens there can never be selected."""
    model = tiny_span_model("littlebird")
    batch = rss_batch(squad_passages)
    batch["attention_mask"][0, 15:18] = 0
    with torch.no_grad():
        outputs = model(**batch)
    assert bool((outputs.start_logits[0, :, 15:18] == torch.finfo(torch.float32).min).all())
    assert bool(outputs.start_logits[0, :, 18:29].isfinite().all())


@pytest.mark.parametrize("name", MODELS)
def test_loss_and_logits_equal_a_loop_over_examples_and_questions(name, squad_passages):
    model = tiny_span_model(name)
    batch = rss_batch(squad_passages)
    with torch.no_grad():
        outputs = model(**batch)
        hidden = model.base_model(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        head, losses = model.qass, []
        for row, asked in enumerate(QUESTIONS):
            tokens = hidden[row, : LENGTHS[row]]
            for column, (position, start, end) in enumerate(asked):
                question = hidden[row, position]
                start_scores = head.start_transform(tokens) @ head.start_classifier(
                    head.query_start_transform(question)
                )
                end_scores = head.end_transform(tokens) @ head.end_classifier(head.query_end_transform(question))
                assert max_diff(outputs.start_logits[row, column, : LENGTHS[row]], start_scores) <= TOLERANCE
                assert max_diff(outputs.end_logits[row, column, : LENGTHS[row]], end_scores) <= TOLERANCE
                start_loss = F.cross_entropy(start_scores[None], torch.tensor([start]))
                end_loss = F.cross_entropy(end_scores[None], torch.tensor([end]))
                losses.append((start_loss + end_loss) / 2)
    assert len(losses) == 3
    assert abs(outputs.loss.item() - torch.stack(losses).mean().item()) <= TOLERANCE


@pytest.mark.parametrize("name", MODELS)
def test_question_token_id_finds_the_questions(name, squad_passages):
    """Without question_positions, every [QUESTION] token is a question, left-aligned, -1 padded."""
    model = tiny_span_model(name)
    batch = rss_batch(squad_passages)
    with torch.no_grad():
        given = model(**batch)
        found = model(**{k: v for k, v in batch.items() if k != "question_positions"})
    assert max_diff(found.start_logits, given.start_logits) == 0
    assert found.loss.item() == given.loss.item()


def test_a_batch_without_questions_has_a_zero_loss_with_gradients(squad_passages):
    model = tiny_span_model("roformer").train()
    batch = rss_batch(squad_passages, questions=[[], [], []])
    outputs = model(**batch)
    assert outputs.start_logits.shape == (3, 0, max(LENGTHS)) and outputs.loss.item() == 0
    outputs.loss.backward()  # DDP needs a graph even here


# ---------------------------------------------------------------------------------------------------------------------
# Padding-free execution
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_padding_free_equals_padded_with_gradients(name, squad_passages):
    model = tiny_span_model(name).train()
    batch = rss_batch(squad_passages)
    padded, padded_grads = run(model, "never", **batch)
    for mode in ("always", "auto"):
        packed, packed_grads = run(model, mode, **batch)
        assert max_diff(packed.start_logits, padded.start_logits) <= TOLERANCE
        assert max_diff(packed.end_logits, padded.end_logits) <= TOLERANCE
        assert abs(packed.loss.item() - padded.loss.item()) <= TOLERANCE
        assert_same_gradients(packed_grads, padded_grads)
    assert "qass.start_classifier.weight" in padded_grads and "qass.query_end_transform.dense.weight" in padded_grads


@pytest.mark.parametrize("name", MODELS)
def test_flattened_batch_equals_padded_per_sequence(name, squad_passages):
    """transformers' padding-free format (one row, position_ids restarting per sequence): question positions count
    within each sequence, and logits come back per sequence."""
    model = tiny_span_model(name).train()
    batch = rss_batch(squad_passages)
    padded, padded_grads = run(model, "never", **batch)
    flat = flatten(batch)
    flat.update({key: batch[key] for key in ("question_positions", "start_positions", "end_positions")})
    flattened, flat_grads = run(model, "auto", **flat)
    assert max_diff(flattened.start_logits, padded.start_logits) <= TOLERANCE
    assert max_diff(flattened.end_logits, padded.end_logits) <= TOLERANCE
    assert abs(flattened.loss.item() - padded.loss.item()) <= TOLERANCE
    assert_same_gradients(flat_grads, padded_grads)


def test_littlebird_long_passage_padding_free_equals_padded(squad_passages):
    """LittleBird of any length: a 140-token passage (35 blocks) next to a short one."""
    model = tiny_span_model("littlebird").train()
    passages = [squad_passages[4], squad_passages[1]]
    assert len(passages[0]) >= 140
    batch = rss_batch(passages, lengths=[140, 21], questions=[[(4, 100, 103), (120, 7, 9)], [(5, 10, 12)]])
    padded, padded_grads = run(model, "never", **batch)
    packed, packed_grads = run(model, "always", **batch)
    assert max_diff(packed.start_logits, padded.start_logits) <= TOLERANCE
    assert_same_gradients(packed_grads, padded_grads)


# ---------------------------------------------------------------------------------------------------------------------
# Saving and loading
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_save_and_load_round_trip(name, squad_passages, tmp_path):
    model = tiny_span_model(name, seed=1)
    batch = rss_batch(squad_passages)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"]["AutoModelForPreTraining"].endswith(f".{type(model).__name__}")
    assert (tmp_path / f"modeling_{name}.py").exists()  # the code goes with the weights for trust_remote_code
    loaded, info = type(model).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        expected, actual = model(**batch), loaded.eval()(**batch)
    assert max_diff(actual.start_logits, expected.start_logits) == 0 and actual.loss.item() == expected.loss.item()
    if name != "deberta":  # DeBERTa's AutoModelForPreTraining is its replaced-token detector
        assert type(transformers.AutoModelForPreTraining.from_pretrained(tmp_path)) is type(model)


@pytest.mark.slow
def test_remote_code_loads_the_span_selection_models_without_posformers(squad_passages, tmp_path):
    batch = rss_batch(squad_passages)
    jobs = {}
    for name in MODELS:
        model = tiny_span_model(name, seed=2)
        model.save_pretrained(tmp_path / name)
        jobs[name] = ("AutoModelForPreTraining", tmp_path / name, model, batch)
    check_remote_load(jobs, env=python_env(tmp_path / "hf-home"), cwd=tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# Carry-over to question answering
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_question_answering_loads_every_head_weight_and_gives_the_same_logits(name, squad_passages, tmp_path):
    span_model = tiny_span_model(name, seed=3, qa_head="span_selection")
    span_model.save_pretrained(tmp_path)
    qa_model, info = MODELS[name][2].from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert sorted(qa_model.state_dict()) == sorted(span_model.state_dict())
    auto_model = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path)
    assert type(auto_model) is MODELS[name][2] and hasattr(auto_model, "qass")
    # one question per example, after the "question" (the first tokens), as posformers-qa places it
    batch = rss_batch(squad_passages, questions=[[(6, 12, 14)], [(5, 10, 12)], [(4, 8, 8)]])
    qa_model.eval()
    with torch.no_grad():
        expected = span_model(**batch)
        actual = qa_model(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            start_positions=batch["start_positions"][:, 0],
            end_positions=batch["end_positions"][:, 0],
        )
    assert actual.start_logits.shape == (3, max(LENGTHS))
    assert max_diff(actual.start_logits, expected.start_logits[:, 0]) <= TOLERANCE
    assert max_diff(actual.end_logits, expected.end_logits[:, 0]) <= TOLERANCE
    assert abs(actual.loss.item() - expected.loss.item()) <= TOLERANCE  # one question each: the same mean


@pytest.mark.parametrize("name", MODELS)
def test_question_answering_with_the_span_selection_head_runs_padding_free(name, squad_passages):
    model = tiny_span_model(name, model_class=MODELS[name][2], qa_head="span_selection").train()
    batch = rss_batch(squad_passages, questions=[[(6, 12, 14)], [(5, 10, 12)], [(4, 8, 8)]])
    inputs = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "start_positions": batch["start_positions"][:, 0],
        "end_positions": batch["end_positions"][:, 0],
    }
    padded, padded_grads = run(model, "never", **inputs)
    packed, packed_grads = run(model, "always", **inputs)
    assert max_diff(packed.start_logits, padded.start_logits) <= TOLERANCE
    assert_same_gradients(packed_grads, padded_grads)
    flat = flatten(batch)
    flat.update(start_positions=inputs["start_positions"], end_positions=inputs["end_positions"])
    flattened, flat_grads = run(model, "auto", **flat)
    assert max_diff(flattened.start_logits, padded.start_logits) <= TOLERANCE
    assert_same_gradients(flat_grads, padded_grads)
    assert not hasattr(model, "qa_outputs")


# ---------------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_question_answering_errors_name_the_problem(name, squad_passages):
    batch = rss_batch(squad_passages, questions=[[(6, 12, 14)], [(5, 10, 12)], [(4, 8, 8)]])
    model = tiny_span_model(name, model_class=MODELS[name][2], qa_head="span_selection")
    ids, mask = batch["input_ids"].clone(), batch["attention_mask"]
    ids[1, 8] = QUESTION
    with pytest.raises(ValueError, match=r"^example 1 holds 2 \[QUESTION\] tokens .* exactly one per example"):
        model(ids, attention_mask=mask)
    ids = batch["input_ids"].clone()
    ids[2, 4] = 1000
    with pytest.raises(ValueError, match=r"^example 2 holds 0 \[QUESTION\] tokens"):
        model(ids, attention_mask=mask)
    model.config.question_token_id = None
    with pytest.raises(ValueError, match=r"qa_head='span_selection' needs config.question_token_id"):
        model(batch["input_ids"], attention_mask=mask)
    config_class = MODELS[name][0]
    with pytest.raises(ValueError, match=rf"^{config_class.__name__}.qa_head must be one of \('linear', 'span_"):
        tiny_config(config_class, qa_head="splinter")
    with pytest.raises(
        ValueError, match=rf"^{config_class.__name__}.question_token_id \(99\) must be None or an integer"
    ):
        tiny_config(config_class, question_token_id=99)


@pytest.mark.parametrize("name", MODELS)
def test_span_selection_errors_name_the_argument(name, squad_passages):
    model = tiny_span_model(name)
    batch = rss_batch(squad_passages)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    questions = batch["question_positions"]
    cases = [
        (
            dict(question_positions=questions[:2]),
            r"question_positions must be an integer tensor of shape \(batch, num_questions\) with batch=3",
        ),
        (dict(question_positions=questions.float()), r"question_positions must be an integer tensor"),
        (
            dict(question_positions=torch.tensor([[3, 9], [25, -1], [-1, -1]])),
            r"question_positions\[1, 0\] = 25 is not a real token of sequence 1 \(-1 marks an absent question\)",
        ),
        (
            dict(question_positions=torch.tensor([[3, -2], [5, -1], [-1, -1]])),
            r"question_positions\[0, 1\] = -2 is not a real token",
        ),
        (
            dict(question_positions=questions, start_positions=batch["start_positions"]),
            r"start_positions and end_positions must be given together",
        ),
        (
            dict(
                question_positions=questions,
                start_positions=batch["start_positions"][:, :1],
                end_positions=batch["end_positions"][:, :1],
            ),
            r"start_positions must have the shape of question_positions \(3, 2\), got \(3, 1\)",
        ),
        (
            dict(
                question_positions=questions,
                start_positions=torch.tensor([[1, 1], [30, 0], [0, 0]]),
                end_positions=batch["end_positions"],
            ),
            r"start_positions\[1, 0\] = 30 is not a real token of sequence 1$",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(**inputs, **kwargs)
    model.config.question_token_id = None
    with pytest.raises(ValueError, match=r"needs question_positions, or input_ids and config.question_token_id"):
        model(**inputs)


def test_the_span_selection_models_are_exported():
    for _, span_class, _ in MODELS.values():
        assert getattr(posformers, span_class.__name__) is span_class
