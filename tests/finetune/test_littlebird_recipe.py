"""The LittleBird recipe (finetune/littlebird_recipe.py): teacher -> convert -> distill -> RSS -> long-document QA,
run end to end at toy sizes on the shipped SQuAD articles and SST-2 text."""

import json
import math

import pytest
from conftest import TOKENIZER_DIR
from transformers import AutoTokenizer

from posformers.finetune import littlebird_recipe as recipe
from posformers.finetune.pretrain_data import pack_batch

TOY = ["--size", "toy", "--threads", "1"]


def run(output_dir, *extra) -> dict:
    return recipe.main(["--output_dir", str(output_dir), *TOY, *extra])


def stage_weights(output_dir) -> dict[str, int]:
    """mtime (ns) of every stage's saved model: a stage that ran again rewrote it."""
    return {
        stage: (output_dir / f"{index}-{stage}" / "model.safetensors").stat().st_mtime_ns
        for index, stage in enumerate(recipe.STAGES, start=1)
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A toy run of the whole recipe: (output folder, the summary main returned)."""
    output_dir = tmp_path_factory.mktemp("recipe") / "out"
    return output_dir, run(output_dir)


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def test_long_document_joins_whole_paragraphs_with_shifted_answers_into_one_window():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    article = recipe.load_articles()[0][0]
    window = 700
    document = recipe.long_document(article, tokenizer, window)
    (paragraph,) = document["paragraphs"]
    context, questions = paragraph["context"], paragraph["qas"]
    kept = context.split("\n\n")
    assert kept == [p["context"] for p in article["paragraphs"][: len(kept)]]
    assert 1 < len(kept) < len(article["paragraphs"])
    assert [qa["id"] for qa in questions] == [qa["id"] for p in article["paragraphs"][: len(kept)] for qa in p["qas"]]
    for qa in questions:
        for answer in qa["answers"]:
            assert context[answer["answer_start"] : answer["answer_start"] + len(answer["text"])] == answer["text"]
        assert len(tokenizer.tokenize(qa["question"])) + len(tokenizer.tokenize(context)) + 3 <= window
    # the next paragraph would not have fitted with its questions
    longer = context + "\n\n" + article["paragraphs"][len(kept)]["context"]
    longest = max(
        len(tokenizer.tokenize(qa["question"])) for p in article["paragraphs"][: len(kept) + 1] for qa in p["qas"]
    )
    assert len(tokenizer.tokenize(longer)) + longest + 3 > window


def test_long_document_refuses_a_window_smaller_than_the_first_paragraph():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    with pytest.raises(ValueError, match="window=20"):
        recipe.long_document(recipe.load_articles()[0][0], tokenizer, 20)


def test_interleave_takes_questions_from_every_document_in_turn():
    documents = [
        {"title": title, "paragraphs": [{"context": title, "qas": [{"id": f"{title}{i}"} for i in range(count)]}]}
        for title, count in (("a", 3), ("b", 1), ("c", 2))
    ]
    chosen = recipe.interleave(documents, 5)
    assert {d["title"]: [qa["id"] for qa in d["paragraphs"][0]["qas"]] for d in chosen} == {
        "a": ["a0", "a1"],
        "b": ["b0"],
        "c": ["c0", "c1"],
    }
    assert sum(len(d["paragraphs"][0]["qas"]) for d in recipe.interleave(documents, None)) == 6


def test_question_first_moves_one_whole_sentence_to_the_front():
    text = (
        "Geology is the study of the Earth. Rocks form in many ways. "
        "Geologists study rocks and the Earth with field work. It ends here."
    )
    moved = recipe.question_first(text)
    assert moved.startswith("Geologists study rocks and the Earth with field work. Geology is the study")
    assert sorted(moved.split()) == sorted(text.split())
    assert recipe.question_first("One sentence. Two sentences.") == "One sentence. Two sentences."


def test_question_first_passages_each_fill_one_packed_sequence():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    articles = recipe.load_articles()[1]
    passages = recipe.question_first_passages(articles, tokenizer, 128)
    assert len(passages) > 20
    assert all(len(tokenizer.tokenize(passage)) == 125 for passage in passages)
    # packed as posformers-pretrain packs documents, every passage starts its own sequence at position 1
    packed = pack_batch(passages, tokenizer, 128, word_starts=False)["input_ids"]
    assert len(packed) == len(passages)
    for passage, ids in zip(passages, packed):
        assert ids[1:126] == tokenizer(passage, add_special_tokens=False)["input_ids"]
    first_sentence = passages[0].split(". ")[0]
    assert first_sentence in " ".join(p["context"] for p in articles[0]["paragraphs"])


def test_held_out_articles_and_text_never_reach_training(finished):
    output_dir, summary = finished
    _, held_out = recipe.load_articles()
    assert {a["title"] for a in held_out} == set(recipe.HELD_OUT_ARTICLES)
    qa = summary["stages"]["qa"]["metrics"]
    assert set(qa["eval_articles"]) == set(recipe.HELD_OUT_ARTICLES)
    assert not set(qa["train_articles"]) & set(recipe.HELD_OUT_ARTICLES)
    train_lines = set((output_dir / "data" / "train.txt").read_text(encoding="utf-8").splitlines())
    valid_lines = (output_dir / "data" / "valid.txt").read_text(encoding="utf-8").splitlines()
    assert valid_lines and not train_lines & set(valid_lines)
    train_questions = json.loads((output_dir / "data" / "train.json").read_text(encoding="utf-8"))["data"]
    eval_questions = json.loads((output_dir / "data" / "eval.json").read_text(encoding="utf-8"))["data"]
    ids = [{qa["id"] for d in data for qa in d["paragraphs"][0]["qas"]} for data in (train_questions, eval_questions)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]


# ---------------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------------


def results(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_summary_holds_every_stage_s_held_out_numbers_as_the_scripts_wrote_them(finished):
    output_dir, summary = finished
    assert summary == json.loads((output_dir / "summary.json").read_text(encoding="utf-8"))
    assert list(summary["stages"]) == list(recipe.STAGES)
    stages = summary["stages"]
    for stage, index in zip(recipe.STAGES, range(1, len(recipe.STAGES) + 1)):
        assert stages[stage]["seconds"] > 0
        folder = output_dir / f"{index}-{stage}"
        assert folder.is_dir() and (folder / "config.json").is_file()
    # the numbers are the scripts' own results files
    for stage in ("teacher", "convert", "distill"):
        folder = output_dir / f"{recipe.STAGES.index(stage) + 1}-{stage}"
        mlm = results(folder / "mlm-eval" / "eval_results.json")
        assert stages[stage]["metrics"]["mlm_loss"] == mlm["eval_mlm_loss"]
        assert stages[stage]["metrics"]["mlm_accuracy"] == mlm["eval_mlm_accuracy"]
        assert math.isfinite(mlm["eval_mlm_loss"])
    rss = results(output_dir / "4-rss" / "eval_results.json")
    rss_start = results(output_dir / "4-rss" / "trainer_state.json")["log_history"][0]
    assert rss_start["step"] == 0  # --eval_on_start: the held-out loss before RSS training
    assert stages["rss"]["metrics"] == {
        "span_loss_before": rss_start["eval_loss"],
        "span_loss": rss["eval_loss"],
        "exact_match": rss["eval_exact_match"],
    }
    distill = results(output_dir / "3-distill" / "eval_results.json")
    assert stages["distill"]["metrics"]["distill_loss"] == distill["eval_loss"]
    distill_history = results(output_dir / "3-distill" / "trainer_state.json")["log_history"]
    assert stages["distill"]["metrics"]["distill_loss_before"] == distill_history[0]["eval_loss"]
    assert distill_history[0]["step"] == 0
    assert stages["distill"]["metrics"]["accuracy_vs_teacher"] == distill["eval_accuracy_vs_teacher"]
    qa_folder = output_dir / f"{recipe.STAGES.index('qa') + 1}-qa"
    qa = results(qa_folder / "eval_results.json")
    metrics = stages["qa"]["metrics"]
    assert (metrics["exact_match"], metrics["f1"]) == (qa["eval_exact_match"], qa["eval_f1"])
    assert metrics["eval_questions"] == qa["eval_samples"] == 8
    # whole documents of thousands of tokens, each question read in one window
    assert metrics["train_windows"] == metrics["train_questions"] == 8
    assert 3000 < metrics["longest_document_tokens"] <= recipe.QA_WINDOW
    assert len(results(qa_folder / "eval_predictions.json")) == 8
    table = (output_dir / "summary.md").read_text(encoding="utf-8")
    teacher = stages["teacher"]["metrics"]
    assert f"MLM loss {teacher['mlm_loss']:.3f}, accuracy {teacher['mlm_accuracy']:.1%}" in table
    assert f"EM {metrics['exact_match']:.1f}, F1 {metrics['f1']:.1f}" in table
    assert len([line for line in table.splitlines() if line.startswith("| ")]) == len(recipe.STAGES) + 1


def test_the_student_is_converted_from_the_teacher_and_each_stage_starts_from_the_last(finished):
    output_dir, _ = finished
    teacher = results(output_dir / "1-teacher" / "config.json")
    student = results(output_dir / "2-convert" / "config.json")
    assert (teacher["model_type"], student["model_type"]) == ("bert", "littlebird")
    assert student["hidden_size"] == teacher["hidden_size"] and student["vocab_size"] == teacher["vocab_size"]
    distill_args = results(output_dir / "3-distill" / "train_results.json")
    assert distill_args["train_samples"] > 0
    # RSS adds [QUESTION] to the tokenizer; QA fine-tunes its span-selection head, reading [QUESTION] after questions
    rss_config = results(output_dir / "4-rss" / "config.json")
    question = AutoTokenizer.from_pretrained(output_dir / "4-rss").convert_tokens_to_ids("[QUESTION]")
    assert rss_config["architectures"] == ["LittleBirdForQuestionSpanSelection"]
    assert (rss_config["question_token_id"], rss_config["qa_head"]) == (question, "span_selection")
    qa_config = results(output_dir / "5-qa" / "config.json")
    assert qa_config["architectures"] == ["LittleBirdForQuestionAnswering"]
    assert (qa_config["question_token_id"], qa_config["qa_head"]) == (question, "span_selection")


def test_a_rerun_skips_finished_stages_and_reruns_an_unfinished_one_and_those_after_it(finished, tmp_path):
    output_dir, summary = finished
    before = stage_weights(output_dir)
    assert run(output_dir) == summary
    assert stage_weights(output_dir) == before
    # RSS was interrupted: it runs again, and so does QA, which starts from its model
    (output_dir / f"{recipe.stage_number('rss')}-rss" / recipe.STAGE_RECORD).unlink()
    rerun = run(output_dir)
    after = stage_weights(output_dir)
    assert {stage for stage in recipe.STAGES if after[stage] != before[stage]} == {"rss", "qa"}
    kept = ("teacher", "convert", "distill")
    assert {stage: rerun["stages"][stage] for stage in kept} == {stage: summary["stages"][stage] for stage in kept}
    # a record of another --seed is not this run's: everything runs again
    rerun = run(output_dir, "--seed", "1")
    assert all(stage_weights(output_dir)[stage] != after[stage] for stage in recipe.STAGES)
    assert {record["run"]["seed"] for record in rerun["stages"].values()} == {1}


def test_refuses_a_folder_it_did_not_make_unless_told_to_overwrite(tmp_path):
    output_dir = tmp_path / "mine"
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(SystemExit, match="--overwrite_output_dir"):
        run(output_dir)
    assert sorted(path.name for path in output_dir.iterdir()) == ["notes.txt"]
    with pytest.raises(SystemExit, match="is a file"):
        run(output_dir / "notes.txt")


def test_global_prefix_experiment_trains_rss_without_and_with_a_global_first_block(finished):
    output_dir, _ = finished
    before = stage_weights(output_dir)
    seed = results(output_dir / "summary.json")["seed"]  # the recipe's stages of that run are reused
    with_prefix = run(output_dir, "--seed", str(seed), "--global_prefix_experiment", "--question_first_length", "96")
    assert stage_weights(output_dir) == before  # the recipe's stages are reused
    assert list(with_prefix["stages"]) == [*recipe.STAGES, *recipe.PREFIX_STAGES]
    block_size = recipe.RECIPE_SIZES["toy"].block_size
    for stage, prefix in zip(recipe.PREFIX_STAGES, (1, block_size)):
        folder = output_dir / f"{recipe.stage_number(stage)}-{stage}"
        assert results(folder / "config.json")["global_prefix_length"] == prefix
        metrics = with_prefix["stages"][stage]["metrics"]
        assert (metrics["global_prefix_length"], metrics["passage_length"]) == (prefix, 96)
        assert metrics["span_loss"] == results(folder / "eval_results.json")["eval_loss"]
    table = (output_dir / "summary.md").read_text(encoding="utf-8")
    assert f"global_prefix_length {block_size} (one block)" in table
    assert "question-first passages of 96 tokens" in table
    tokenizer = AutoTokenizer.from_pretrained(output_dir / "3-distill")
    passages = (output_dir / "data" / "question_first_validation.txt").read_text(encoding="utf-8").splitlines()
    assert passages and all(len(tokenizer.tokenize(passage)) == 93 for passage in passages)


def test_overwrite_output_dir_reruns_every_stage(finished):
    output_dir, _ = finished
    before = stage_weights(output_dir)
    summary = run(output_dir, "--overwrite_output_dir")
    after = stage_weights(output_dir)
    assert all(after[stage] != before[stage] for stage in recipe.STAGES)
    assert list(summary["stages"]) == list(recipe.STAGES)


def test_bad_arguments_are_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit):
        recipe.main(["--output_dir", str(tmp_path / "x"), "--size", "huge"])
    with pytest.raises(SystemExit):
        recipe.main(["--output_dir", str(tmp_path / "x"), "--threads", "0"])
    assert not (tmp_path / "x").exists()
