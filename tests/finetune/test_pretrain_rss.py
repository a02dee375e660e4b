"""Recurring Span Selection (`posformers-pretrain --objective rss`, finetune/pretrain_rss.py) on real text: the span
finder on a hand-checked SQuAD paragraph, masking, the collator with and without Padding Insertion, training the
three models end to end, distillation followed by RSS, resuming, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest
import torch
from conftest import QUIET, TOKENIZER_DIR
from helpers.pretrain_corpus import TINY, eval_history, squad_contexts
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoTokenizer

from posformers import LittleBirdForQuestionSpanSelection, RoFormerForQuestionSpanSelection
from posformers.configuration_roformer import RoFormerConfig
from posformers.finetune import run_pretrain, run_qa
from posformers.finetune.arguments import ModelArguments
from posformers.finetune.demo import DEMO_DATA
from posformers.finetune.errors import DataError
from posformers.finetune.loading import load_config
from posformers.finetune.padding_free import FlatteningCollator
from posformers.finetune.pretrain_data import fix_masks, pack_batch, pack_corpus, train_tokenizer
from posformers.finetune.pretrain_rss import (
    QUESTION_TOKEN,
    RecurringSpanCollator,
    RSSPaddingInsertionCollator,
    add_question_token,
    annotate_spans,
    build_rss_model,
    find_recurring_spans,
    mask_recurring_spans,
    piece_texts,
    token_kinds,
)
from posformers.modeling_roformer import RoFormerForMaskedLM

# SQuAD v1.1 dev's first paragraph ("Super Bowl 50 was an American football game ..."), bert-base-uncased tokens.
# Checked by hand: every n-gram of whole words that occurs twice, minus stopword-only and punctuation n-grams, chosen
# longest first without overlaps.
SUPER_BOWL_GROUPS = {
    "super bowl": 5,  # "Super Bowl 50", "third Super Bowl title", "50th Super Bowl", "each Super Bowl game", "... L"
    "the national football": 2,  # "the National Football League", "the National Football Conference"
    "american football": 2,  # "American football game", "The American Football Conference"
    "the game": 2,  # "The game was played", "the game would have"
    "game": 2,  # the other two: "football game", "Super Bowl game"
    "champion": 3,
    "conference": 2,  # "football conference" twice, but both overlap the longer groups above
    "league": 2,
    "numerals": 2,  # three word pieces: "nu ##meral ##s", one whole word
    "50": 2,  # "Super Bowl 50", "Arabic numerals 50" ("50th" is another token)
}
DEMO_QA = DEMO_DATA / "qa"
# Recurring but never a span: stopwords only, punctuation, a word piece, a part of a longer group.
NOT_SPANS = ("the", "of the", "was", "in the", "as", ",", "(", ".", "football", "national", "bowl")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)  # the real bert-base-uncased vocabulary
    add_question_token(tokenizer)
    return tokenizer


def passage(tokenizer, text: str, length: int = 512) -> tuple[list[int], list[int]]:
    packed = pack_batch([text], tokenizer, length, word_starts=True)
    return packed["input_ids"][0], packed["word_starts"][0]


def groups_in(tokenizer, text: str) -> tuple[list[int], list[list[tuple[int, int]]]]:
    input_ids, word_starts = passage(tokenizer, text)
    kinds = token_kinds(input_ids, word_starts, piece_texts(tokenizer))
    return input_ids, find_recurring_spans(input_ids, word_starts, kinds, max_span_length=10)


# ---------------------------------------------------------------------------------------------------------------------
# Span finder and masking
# ---------------------------------------------------------------------------------------------------------------------


def test_the_span_finder_finds_the_hand_checked_groups_of_a_squad_paragraph(tokenizer):
    text = squad_contexts()[0]
    assert text.startswith("Super Bowl 50 was an American football game")
    input_ids, groups = groups_in(tokenizer, text)
    found = {}
    for group in groups:
        texts = {tokenizer.decode(input_ids[first : last + 1]) for first, last in group}
        assert len(texts) == 1, texts  # every occurrence of a group is the same n-gram
        found[texts.pop()] = len(group)
    assert found == SUPER_BOWL_GROUPS
    assert not set(NOT_SPANS) & set(found)
    covered = [position for group in groups for first, last in group for position in range(first, last + 1)]
    assert len(covered) == len(set(covered))  # disjoint occurrences
    assert len(found) == len(groups)


def test_the_span_finder_keeps_to_the_longest_span(tokenizer):
    text = "the river flows north into the lake . the river flows north again . a river"
    input_ids, groups = groups_in(tokenizer, text)
    spans = [[tokenizer.decode(input_ids[first : last + 1]) for first, last in group] for group in groups]
    assert spans == [["the river flows north"] * 2]  # the lone third "river" has no partner left
    input_ids, word_starts = passage(tokenizer, text)
    kinds = token_kinds(input_ids, word_starts, piece_texts(tokenizer))
    short = find_recurring_spans(input_ids, word_starts, kinds, max_span_length=2)
    assert [[tokenizer.decode(input_ids[a : b + 1]) for a, b in group] for group in short] == [
        ["the river", "the river"],
        ["flows north", "flows north"],
    ]


def test_the_span_finder_takes_whole_words_only(tokenizer):
    # "numeral" is "nu ##meral" and "numerals" "nu ##meral ##s": the two pieces recur, the word does not
    input_ids, groups = groups_in(tokenizer, "a numeral , two numerals")
    assert tokenizer.convert_ids_to_tokens(input_ids[2:4]) == tokenizer.convert_ids_to_tokens(input_ids[6:8])
    assert groups == []
    input_ids, groups = groups_in(tokenizer, "a numeral , two numerals , three numerals")
    assert [[tokenizer.decode(input_ids[a : b + 1]) for a, b in group] for group in groups] == [["numerals"] * 2]


def reconstruct(masked: dict, question_id: int) -> list[int]:
    """Put each question's answer tokens back in place of its [QUESTION]."""
    ids, answers = masked["input_ids"], {}
    for question, start, end in zip(masked["question_positions"], masked["start_positions"], masked["end_positions"]):
        answers[question] = ids[start : end + 1]
    restored = []
    for position, token in enumerate(ids):
        restored += answers.get(position, [token])
        assert (token == question_id) == (position in answers)
    return restored


def test_masking_replaces_all_but_one_occurrence_by_one_question(tokenizer):
    question_id = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    input_ids, groups = groups_in(tokenizer, squad_contexts()[0])
    masked = mask_recurring_spans(input_ids, groups, question_id, 100, torch.Generator().manual_seed(0))
    questions = sum(len(group) - 1 for group in groups)
    replaced = sum(last - first + 1 for group in groups for first, last in group) - sum(
        group[0][1] - group[0][0] + 1 for group in groups
    )
    assert len(masked["question_positions"]) == questions == 14
    assert len(masked["input_ids"]) == len(input_ids) - replaced + questions  # shorter: one token per question
    assert masked["question_positions"] == sorted(masked["question_positions"])
    # the kept occurrences are intact and the answers point at them in the new ids: putting the answers back in
    # place of the questions gives the original passage
    assert reconstruct(masked, question_id) == input_ids
    kept = {(start, end) for start, end in zip(masked["start_positions"], masked["end_positions"])}
    assert len(kept) == len(groups)
    assert masked == mask_recurring_spans(input_ids, groups, question_id, 100, torch.Generator().manual_seed(0))
    others = [
        mask_recurring_spans(input_ids, groups, question_id, 100, torch.Generator().manual_seed(s)) for s in (1, 2)
    ]
    assert any(other["start_positions"] != masked["start_positions"] for other in others)  # the kept one is drawn

    capped = mask_recurring_spans(input_ids, groups, question_id, 4, torch.Generator().manual_seed(0))
    assert len(capped["question_positions"]) == 4 and reconstruct(capped, question_id) == input_ids


# ---------------------------------------------------------------------------------------------------------------------
# Collators
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def passages(tokenizer):
    split = datasets.Dataset.from_dict({"text": squad_contexts()[:12]})
    return annotate_spans(pack_corpus(split, tokenizer, 128, word_starts=True), tokenizer, 10)


def check_rss_batch(batch, question_id):
    """Each row: questions at [QUESTION] tokens, answers inside the real tokens, -1 beyond the row's questions."""
    for row in range(batch["input_ids"].shape[0]):
        questions = batch["question_positions"][row]
        real = questions >= 0
        assert real.any()
        for key in ("start_positions", "end_positions"):
            assert torch.equal(batch[key][row] >= 0, real)
        ids = batch["input_ids"][row]
        assert (ids[questions[real]] == question_id).all() and int((ids == question_id).sum()) == int(real.sum())
        starts, ends = batch["start_positions"][row][real], batch["end_positions"][row][real]
        assert (starts <= ends).all() and batch["attention_mask"][row][starts].all()
        assert batch["attention_mask"][row][ends].all() and not (ids[starts] == question_id).any()


def test_collator_masks_pads_and_repeats_held_out_draws(tokenizer, passages):
    question_id = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    assert len(passages) > 10
    features = [dict(example) for example in passages.select(range(8))]
    collator = RecurringSpanCollator(tokenizer, question_id, max_questions=30, question_rate=0.15, seed=3)
    batch = collator(features)
    check_rss_batch(batch, question_id)
    lengths = batch["attention_mask"].sum(1)
    assert (lengths < 128).all() and lengths.max() == batch["input_ids"].shape[1]
    assert (batch["question_positions"] >= 0).sum(1).max() <= round(0.15 * 128)
    for row, feature in enumerate(features):
        assert reconstruct(
            {key: batch[key][row][batch[key][row] >= 0].tolist() for key in batch if key.endswith("positions")}
            | {"input_ids": batch["input_ids"][row][: lengths[row]].tolist()},
            question_id,
        ) == list(feature["input_ids"])
    assert all(torch.equal(batch[key], collator(features)[key]) for key in batch)  # seeded
    collator.epoch = 1
    assert not torch.equal(batch["start_positions"], collator(features)["start_positions"])  # a new epoch redraws
    held_out = [dict(example) for example in fix_masks(passages.select(range(8)), seed=5)]
    first = collator(held_out)
    collator.epoch = 2
    assert all(torch.equal(first[key], collator(held_out)[key]) for key in first)


def test_padding_insertion_moves_questions_and_answers_with_the_tokens(tokenizer, passages):
    question_id = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    features = [dict(example) for example in passages.select(range(8))]
    base = RecurringSpanCollator(tokenizer, question_id, seed=3)
    plain = base(features)
    collator = RSSPaddingInsertionCollator(tokenizer, base, max_length=400, mean_run_length=4, pad_to_multiple_of=8)
    inserted = collator(features)
    assert set(inserted) == set(plain)
    assert inserted["input_ids"].shape[1] > plain["input_ids"].shape[1] and inserted["input_ids"].shape[1] % 8 == 0
    check_rss_batch(inserted, question_id)
    for row in range(len(features)):
        real = inserted["attention_mask"][row].nonzero().view(-1)  # the student position of each plain token
        count = int(plain["attention_mask"][row].sum())
        assert torch.equal(inserted["input_ids"][row][real], plain["input_ids"][row][:count])
        assert real[-1] + 1 > count  # padding went in
        for key in ("question_positions", "start_positions", "end_positions"):
            valid = plain[key][row] >= 0
            assert torch.equal(inserted[key][row][valid], real[plain[key][row][valid]]), key
            assert (inserted[key][row][~valid] == -1).all()
    assert all(torch.equal(inserted[key], collator(features)[key]) for key in inserted)  # seeded like its masks


def test_a_corpus_without_recurring_spans_is_refused(tokenizer):
    split = datasets.Dataset.from_dict({"text": ["a fine film", "the cast is great", "rain , wind and snow"]})
    packed = pack_corpus(split, tokenizer, 16, word_starts=True)
    with pytest.raises(DataError, match=r"no recurring span .* in any of the 1 training passage\(s\)"):
        annotate_spans(packed, tokenizer, 10)


def test_flattened_rss_batches_give_the_padded_batches_loss(tokenizer, passages):
    """--padding_free auto flattens RSS batches (question and answer positions stay per sequence)."""
    question_id = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    features = [dict(example) for example in passages.select(range(6))]
    padded = RecurringSpanCollator(tokenizer, question_id, seed=3)(features)
    flat = FlatteningCollator(RecurringSpanCollator(tokenizer, question_id, seed=3))(features)
    assert flat["input_ids"].shape[0] == 1 and flat["question_positions"].shape == padded["question_positions"].shape
    torch.manual_seed(0)
    config = RoFormerConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=128, question_token_id=question_id,
    )  # fmt: skip
    model = RoFormerForQuestionSpanSelection(config).eval()
    with torch.no_grad():
        expected, got = model(**padded), model(**flat)
    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=1e-5)
    real = padded["attention_mask"][:, None, :].bool() & (padded["question_positions"] >= 0)[..., None]
    width = padded["input_ids"].shape[1]
    torch.testing.assert_close(got.start_logits[..., :width][real], expected.start_logits[real], rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# posformers-pretrain --objective rss
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def contexts(tmp_path_factory) -> Path:
    """All SQuAD v1.1 dev paragraphs, one a line: posformers-pretrain holds 10% of them out."""
    path = tmp_path_factory.mktemp("rss") / "contexts.txt"
    path.write_text("\n".join(squad_contexts()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def wordpiece(contexts, tmp_path_factory) -> Path:
    """A 1000-token WordPiece tokenizer trained on the paragraphs, saved as a folder."""
    documents = contexts.read_text(encoding="utf-8").splitlines()
    tokenizer = train_tokenizer(datasets.Dataset.from_dict({"text": documents}), "wordpiece", 1000)
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


def rss_argv(contexts, output, model_type="posformers-roformer", steps=40):
    return [
        "--objective", "rss", "--model_type", model_type, "--config_overrides", TINY[model_type],
        "--train_file", str(contexts), "--validation_split_percentage", "10", "--max_seq_length", "64",
        "--do_train", "--do_eval", "--max_steps", str(steps), "--per_device_train_batch_size", "16",
        "--per_device_eval_batch_size", "32", "--learning_rate", "3e-3", "--warmup_steps", "4", "--logging_steps", "10",
        "--output_dir", str(output), "--seed", "7", *QUIET,
    ]  # fmt: skip


@pytest.mark.parametrize("model_type", ["posformers-roformer", "posformers-deberta", "littlebird"])
def test_rss_held_out_span_loss_falls(model_type, contexts, wordpiece, tmp_path):
    output = tmp_path / "out"
    metrics = run_pretrain.main(
        [*rss_argv(contexts, output, model_type), "--tokenizer_name", str(wordpiece), "--eval_on_start"]
    )
    start, end = eval_history(output, "eval_loss")[0], metrics["eval_loss"]
    first_match = eval_history(output, "eval_exact_match")[0]
    print(f"{model_type}: held-out span loss {start:.3f} -> {end:.3f}, exact match {first_match:.3f} -> "
          f"{metrics['eval_exact_match']:.3f}")  # fmt: skip
    assert end < start - 0.3
    assert metrics["eval_exact_match"] > first_match + 0.05
    tokenizer = AutoTokenizer.from_pretrained(output)
    question_id = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    assert QUESTION_TOKEN in tokenizer.all_special_tokens and question_id == len(tokenizer) - 1
    model = AutoModelForQuestionAnswering.from_pretrained(output)  # posformers-qa fine-tunes with the QASS head
    assert model.config.qa_head == "span_selection" and model.config.question_token_id == question_id
    assert model.config.vocab_size == len(tokenizer)


def assert_same_weights(folder, other, atol=1e-6):
    before, after = load_file(str(folder / "model.safetensors")), load_file(str(other / "model.safetensors"))
    assert before.keys() == after.keys()
    for key in before:
        torch.testing.assert_close(before[key], after[key], rtol=0, atol=atol, msg=key)


def test_rss_streams_a_corpus(contexts, wordpiece, tmp_path):
    argv = [*rss_argv(contexts, tmp_path / "out", "littlebird", steps=6), "--tokenizer_name", str(wordpiece)]
    metrics = run_pretrain.main([*argv, "--streaming", "--streaming_validation_lines", "20"])
    assert 0 < metrics["eval_loss"] < 10 and 0 <= metrics["eval_exact_match"] <= 1
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 6


def test_resumed_rss_run_ends_like_an_uninterrupted_one(contexts, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    # a tokenizer trained by the run itself (reloaded from the checkpoint on resume), dropout on
    argv = ["--train_tokenizer", "wordpiece", "--tokenizer_vocab_size", "800", "--save_strategy", "steps",
            "--save_steps", "3"]  # fmt: skip
    expected = run_pretrain.main([*rss_argv(contexts, whole, steps=6), *argv])
    resumed.mkdir()
    shutil.copytree(whole / "checkpoint-3", resumed / "checkpoint-3")  # as if stopped after step 3
    metrics = run_pretrain.main([*rss_argv(contexts, resumed, steps=6), *argv, "--resume_from_checkpoint", "True"])
    assert_same_weights(whole, resumed)
    for key in ("eval_loss", "eval_exact_match"):  # (train_loss averages the steps of its own session)
        assert metrics[key] == pytest.approx(expected[key], abs=1e-6), key


def test_an_mlm_checkpoint_starts_rss_with_its_encoder(wordpiece, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(wordpiece)
    config = RoFormerConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    RoFormerForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    question_id = add_question_token(tokenizer)
    model_args = ModelArguments(model_name_or_path=str(tmp_path / "mlm"))
    model = build_rss_model(load_config(model_args), model_args, tokenizer, question_id)
    assert isinstance(model, RoFormerForQuestionSpanSelection) and question_id == config.vocab_size
    mlm = load_file(str(tmp_path / "mlm" / "model.safetensors"))
    encoder = {key: value for key, value in model.state_dict().items() if key.startswith("roformer.")}
    assert encoder.keys() <= mlm.keys() and len(encoder) > 10
    for key, value in encoder.items():
        if key == "roformer.embeddings.word_embeddings.weight":
            assert value.shape[0] == len(tokenizer) and torch.equal(value[:question_id], mlm[key])
        else:
            assert torch.equal(value, mlm[key]), key
    assert model.config.question_token_id == question_id and model.config.qa_head == "span_selection"


# ---------------------------------------------------------------------------------------------------------------------
# Distillation, then RSS (LittleBird, with Padding Insertion)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def teacher(wordpiece, tmp_path_factory) -> Path:
    """A tiny RoFormer MLM with confident predictions over the tokenizer's vocabulary."""
    torch.manual_seed(0)
    config = RoFormerConfig(
        vocab_size=len(AutoTokenizer.from_pretrained(wordpiece)), hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, initializer_range=0.3,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("teacher")
    RoFormerForMaskedLM(config).save_pretrained(folder)
    return folder


def chain_argv(contexts, wordpiece, teacher, output, steps=30, distill_steps=10):
    return [
        *rss_argv(contexts, output, "littlebird", steps), "--objective", "distill", "--tokenizer_name", str(wordpiece),
        "--teacher_name_or_path", str(teacher), "--rss_after_distill_steps", str(distill_steps),
        "--rss_padding_insertion", "--padding_insertion_max_length", "160", "--padding_insertion_mean_run_length", "4",
    ]  # fmt: skip


def test_distillation_then_rss_in_one_command(contexts, wordpiece, teacher, tmp_path):
    output = tmp_path / "out"
    metrics = run_pretrain.main([*chain_argv(contexts, wordpiece, teacher, output), "--eval_on_start"])
    distilled = output / "distill"
    assert AutoModelForMaskedLM.from_pretrained(distilled).config.model_type == "littlebird"
    assert eval_history(distilled, "eval_loss")[0] > metrics["distill_eval_loss"]  # the distillation stage trained
    assert json.loads((distilled / "trainer_state.json").read_text())["global_step"] == 10
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == 20
    start, end = eval_history(output, "eval_loss")[0], metrics["eval_loss"]
    print(f"distill -> rss: held-out span loss {start:.3f} -> {end:.3f}")
    assert end < start - 0.3 and "eval_exact_match" in metrics
    model = LittleBirdForQuestionSpanSelection.from_pretrained(output)
    student = load_file(str(distilled / "model.safetensors"))
    layer = "littlebird.encoder.layer.0.output.dense.weight"
    assert layer in student and not torch.equal(model.state_dict()[layer], student[layer])  # RSS trained it further
    assert model.config.qa_head == "span_selection"
    question_id = AutoTokenizer.from_pretrained(output).convert_tokens_to_ids(QUESTION_TOKEN)
    assert question_id == len(student["littlebird.embeddings.word_embeddings.weight"])  # a new row

    # posformers-qa fine-tunes the pre-trained span-selection head on long documents (the demo's 1,848-token article)
    qa = run_qa.main(
        ["--model_name_or_path", str(output), "--train_file", str(DEMO_QA / "train.json"), "--validation_file",
         str(DEMO_QA / "train.json"), "--max_train_samples", "4", "--max_eval_samples", "2", "--do_train", "--do_eval",
         "--max_steps", "2", "--per_device_train_batch_size", "2", "--output_dir", str(tmp_path / "qa"), *QUIET]
    )  # fmt: skip
    assert "eval_exact_match" in qa
    pretrained, fine_tuned = (load_file(str(folder / "model.safetensors")) for folder in (output, tmp_path / "qa"))
    assert pretrained.keys() == fine_tuned.keys()  # the same head, nothing new or dropped
    assert json.loads((tmp_path / "qa" / "config.json").read_text())["qa_head"] == "span_selection"


CHAIN_SAVING = ["--save_strategy", "steps", "--save_steps", "2"]


@pytest.fixture(scope="module")
def whole_chain(contexts, wordpiece, teacher, tmp_path_factory):
    """The distillation -> RSS chain run uninterrupted, saving every 2 steps: (its folder, its metrics)."""
    whole = tmp_path_factory.mktemp("chain") / "whole"
    return whole, run_pretrain.main([*chain_argv(contexts, wordpiece, teacher, whole, 8, 4), *CHAIN_SAVING])


@pytest.mark.parametrize("stage", ["distill", "rss"])
def test_the_chain_resumes_from_a_checkpoint_of_either_stage(
    stage, contexts, wordpiece, teacher, whole_chain, tmp_path
):
    (whole, expected), resumed, saving = whole_chain, tmp_path / "resumed", CHAIN_SAVING
    if stage == "distill":  # stopped after 2 distillation steps
        shutil.copytree(whole / "distill" / "checkpoint-2", resumed / "distill" / "checkpoint-2")
    else:  # stopped after distillation and 2 RSS steps
        shutil.copytree(whole / "distill", resumed / "distill")
        shutil.copytree(whole / "checkpoint-2", resumed / "checkpoint-2")
    metrics = run_pretrain.main(
        [*chain_argv(contexts, wordpiece, teacher, resumed, 8, 4), *saving, "--resume_from_checkpoint", "True"]
    )
    assert_same_weights(whole / "distill", resumed / "distill")
    assert_same_weights(whole, resumed)
    for key in ("eval_loss", "eval_exact_match"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-6), key
    assert ("distill_eval_loss" in metrics) == (stage == "distill")  # a finished distillation is not run again


# ---------------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------------


def refusal(argv) -> str:
    with pytest.raises(SystemExit) as refused:
        run_pretrain.main(argv)
    message = str(refused.value.code)
    assert "\n" not in message.strip()
    return message


def test_bad_rss_input_is_refused_in_one_line(contexts, wordpiece, teacher, tmp_path):
    tokenizer = ["--tokenizer_name", str(wordpiece)]
    message = refusal([*rss_argv(contexts, tmp_path / "a"), *tokenizer, "--rss_padding_insertion"])
    assert "--rss_padding_insertion is for LittleBird models, not posformers-roformer" in message

    message = refusal([*rss_argv(contexts, tmp_path / "b"), *tokenizer, "--max_seq_length", "128"])
    assert "--max_seq_length 128 exceeds the model's max_position_embeddings (64)" in message

    distinct = tmp_path / "distinct.txt"
    distinct.write_text("alpha beta gamma\ndelta epsilon\nzeta eta theta\n", encoding="utf-8")
    argv = [*rss_argv(distinct, tmp_path / "c"), "--train_tokenizer", "wordpiece", "--tokenizer_vocab_size", "100"]
    message = refusal([*argv, "--validation_split_percentage", "40"])
    assert "no recurring span" in message and "training passage(s)" in message

    message = refusal([*rss_argv(contexts, tmp_path / "d"), *tokenizer, "--rss_max_span_length", "0"])
    assert "--rss_max_span_length must be >= 1, got 0" in message

    message = refusal([*rss_argv(contexts, tmp_path / "e"), *tokenizer, "--rss_after_distill_steps", "5"])
    assert "--rss_after_distill_steps follows --objective distill, not rss" in message

    chain = chain_argv(contexts, wordpiece, teacher, tmp_path / "f", steps=10, distill_steps=10)
    assert "must be below --max_steps (10)" in refusal(chain)

    chain = chain_argv(contexts, wordpiece, teacher, tmp_path / "g", steps=10, distill_steps=4)
    message = refusal([*chain, "--resume_from_checkpoint", "True"])
    assert "no checkpoint-N folder" in message and "distill" in message
