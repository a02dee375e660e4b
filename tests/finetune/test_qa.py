"""posformers-qa end to end: gold answers round-trip through windows and post-processing on every format, windows
with doc_stride recover answers cut by a window edge, a tiny model overfits real questions through the full script,
resuming equals not stopping, --push_to_hub reaches the (local) Hub, and bad data stops the run before training."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
from helpers import python_env, run_python
from helpers.data import DATA_DIR
from safetensors.torch import load_file
from transformers import AutoConfig, BertTokenizerFast

from posformers.finetune import run_qa
from posformers.finetune.demo import DEMO_DATA
from posformers.finetune.errors import BadExamples
from posformers.finetune.qa_data import load_qa_file
from posformers.finetune.qa_features import postprocess_predictions, prepare_features
from posformers.finetune.qa_metrics import normalize_squad
from posformers.finetune.qa_trainer import score_predictions

QA_DATA = DATA_DIR / "qa"
BERT_VOCAB = DATA_DIR / "vocab" / "bert-base-uncased" / "vocab.txt"
GOLD_LOGIT = 20.0

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
TINY_LITTLEBIRD = {"model_type": "littlebird", "block_size": 32, "pack_length": 8, **TINY}
# The overfitting run takes a few hundred steps: RoFormer is the quickest family per step on a CPU.
TINY_ROFORMER = {"model_type": "posformers-roformer", "max_position_embeddings": 256, **TINY}


@pytest.fixture(scope="module")
def english_tokenizer():
    tokenizer = BertTokenizerFast(vocab=str(BERT_VOCAB), do_lower_case=True)
    assert tokenizer.vocab_size == 30522  # the whole vocabulary, not only the special tokens
    return tokenizer


@pytest.fixture(scope="module")
def korean_tokenizer(tmp_path_factory):
    """WordPiece over single characters (the shared vocabularies have no Hangul): every character is a token, so
    every answer boundary is a token boundary."""
    examples = [e for m in ("html", "context") for e in load_korquad(m)]
    chars = sorted({c for e in examples for c in e["context"] + e["question"] if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    path = tmp_path_factory.mktemp("korean-vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(path), do_lower_case=False, strip_accents=False)
    assert tokenizer.vocab_size == len(vocab)
    return tokenizer


def load_korquad(mode):
    files = ("korquad2.1_train_00.json", "korquad2.1_dev_00.json")
    return [
        e
        for name in files
        for e in load_qa_file(QA_DATA / "korquad2_sample" / name, "validation", BadExamples(False, "v"), "auto", mode)
    ]


def windows(examples, tokenizer, max_seq_length, doc_stride, **options):
    """(examples Dataset, features Dataset with gold positions and post-processing columns); `options` go to
    prepare_features."""
    dataset = datasets.Dataset.from_list(examples)
    prepare = functools.partial(
        prepare_features,
        tokenizer=tokenizer,
        max_seq_length=max_seq_length,
        doc_stride=doc_stride,
        with_labels=True,
        for_postprocessing=True,
        **options,
    )
    return dataset, dataset.map(prepare, batched=True, remove_columns=dataset.column_names)


def gold_logits(features):
    """Logits that put all weight on each window's gold start / end token (padded like Trainer pads, with -100)."""
    length = max(len(ids) for ids in features["input_ids"])
    start, end = np.full((len(features), length), -100.0), np.full((len(features), length), -100.0)
    for i, ids in enumerate(features["input_ids"]):
        start[i, : len(ids)] = end[i, : len(ids)] = 0.0
        start[i, features["start_positions"][i]] = end[i, features["end_positions"][i]] = GOLD_LOGIT
    return start, end


def round_trip(examples, tokenizer, max_seq_length=384, doc_stride=128, version_2=False, normalizer="squad", **options):
    dataset, features = windows(examples, tokenizer, max_seq_length, doc_stride, **options)
    start, end = gold_logits(features)
    predictions = postprocess_predictions(
        dataset, features, start, end, version_2_with_negative=version_2, max_answer_length=1000
    )
    return score_predictions(dataset, predictions, version_2, normalizer), predictions, features


# ---------------------------------------------------------------------------------------------------------------------
# Gold answers survive windows -> positions -> post-processing
# ---------------------------------------------------------------------------------------------------------------------


def load_file_examples(path, split="validation", **options):
    return load_qa_file(path, split, BadExamples(False, split), **options)


def test_round_trip_squad_v11_dev_questions(english_tokenizer):
    examples = load_file_examples(QA_DATA / "squad_v1.1" / "dev-v1.1.json")[::50]  # 212 questions, 48 articles
    metrics, _, _ = round_trip(examples, english_tokenizer)
    assert metrics == {"exact_match": 100.0, "f1": 100.0}


@pytest.mark.parametrize("name", ["sample.json", "dev-v2.0.json"])
def test_round_trip_squad_v2_fixtures_with_unanswerable(english_tokenizer, name):
    examples = load_file_examples(QA_DATA / "fixtures" / name, version_2_with_negative=True)
    metrics, predictions, _ = round_trip(examples, english_tokenizer, version_2=True)
    assert metrics["exact"] == 100.0 and metrics["f1"] == 100.0
    assert metrics["HasAns_total"] > 0 and metrics["NoAns_total"] > 0
    assert metrics["NoAns_exact"] == 100.0
    unanswerable = [e["id"] for e in examples if not e["answers"]["text"]]
    assert all(predictions.predictions[qid] == "" for qid in unanswerable)
    assert all(predictions.null_odds[qid] > 0 for qid in unanswerable)


@pytest.mark.parametrize("mode", ["html", "context"])
def test_round_trip_korquad2_whole_pages(korean_tokenizer, mode):
    examples = load_korquad(mode)
    # Pages of ~10k characters in 512-token windows: many windows per page, the answer in one or two of them.
    metrics, predictions, features = round_trip(examples, korean_tokenizer, max_seq_length=512, doc_stride=128)
    assert metrics == {"exact_match": 100.0, "f1": 100.0}
    assert len(features) > 5 * len(examples)
    assert predictions.predictions == {e["id"]: e["answers"]["text"][0] for e in examples}


def test_round_trip_triviaqa_sample(english_tokenizer):
    examples = [
        e
        for name in ("wikipedia-dev.json", "wikipedia-train.json", "web-dev.json", "web-train.json")
        for e in load_file_examples(QA_DATA / "triviaqa_sample" / "qa" / name)
        if e["answers"]["text"]  # evidence documents in which an alias occurs
    ]
    assert len(examples) >= 4
    metrics, _, _ = round_trip(examples, english_tokenizer, max_seq_length=128, doc_stride=32, normalizer="triviaqa")
    assert metrics == {"exact_match": 100.0, "f1": 100.0}


# ---------------------------------------------------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------------------------------------------------


def long_document_examples(paragraphs=10, every=4):
    """SQuAD v1.1 dev's first article as one long document (its first `paragraphs` joined, ~1,500 tokens), with every
    `every`-th question and its first answer (shifted), as a training file would have it. Answers inside a word
    ("gold" of "golden") are left out: no span of whole tokens is exactly them."""
    article = json.loads((QA_DATA / "squad_v1.1" / "dev-v1.1.json").read_text())["data"][0]
    document, examples = "", []
    for paragraph in article["paragraphs"][:paragraphs]:
        shift = len(document)
        document += paragraph["context"] + "\n\n"
        for qa in paragraph["qas"]:
            answer = qa["answers"][0]
            answers = {"text": [answer["text"]], "answer_start": [answer["answer_start"] + shift]}
            examples.append({"id": qa["id"], "title": "", "question": qa["question"], "answers": answers})
    examples = [{**e, "context": document} for e in examples[::every]]
    return [e for e in examples if whole_words(document, e["answers"]["answer_start"][0], e["answers"]["text"][0])]


def whole_words(text: str, start: int, answer: str) -> bool:
    end = start + len(answer)
    return (start == 0 or not text[start - 1].isalnum()) and (end == len(text) or not text[end].isalnum())


def test_answers_cut_by_a_window_edge_are_found_in_the_overlapping_window(english_tokenizer):
    examples = long_document_examples()
    _, predictions, features = round_trip(examples, english_tokenizer, max_seq_length=96, doc_stride=48)
    assert len(features) > 20 * len(examples)  # a ~1,500-token document in 96-token windows

    # Windows that hold only part of a gold answer are labelled "no answer"; another window holds it whole.
    cut = 0
    by_id = {e["id"]: e for e in examples}
    for i, offsets in enumerate(features["offset_mapping"]):
        context = [o for o in offsets if o is not None]
        window_start, window_end = context[0][0], context[-1][1]
        example = by_id[features["example_id"][i]]
        start = example["answers"]["answer_start"][0]
        end = start + len(example["answers"]["text"][0])
        if start < window_end < end or start < window_start < end:
            cut += 1
            assert features["start_positions"][i] == features["cls_index"][i]
    assert cut >= 3
    for example in examples:
        assert predictions.predictions[example["id"]] in example["answers"]["text"]


def test_window_counts_follow_max_seq_length_and_doc_stride(english_tokenizer):
    examples = long_document_examples(every=40)
    _, wide = windows(examples, english_tokenizer, 512, 128)
    _, narrow = windows(examples, english_tokenizer, 512, 256)  # more overlap: more windows
    _, whole = windows(examples, english_tokenizer, 8192, 128)
    assert len(whole) == len(examples)  # LittleBird-style: the whole document in one window
    assert len(wide) < len(narrow)
    # Consecutive windows of one example overlap by doc_stride tokens.
    first = [i for i, eid in enumerate(wide["example_id"]) if eid == examples[0]["id"]]
    a, b = (wide["input_ids"][first[0]], wide["input_ids"][first[1]])
    assert a[-1 - 128 : -1] == b[b.index(english_tokenizer.sep_token_id) + 1 :][:128]


def covering_span(context: str, start: int, answer: str, offsets) -> str:
    """The text of the whole tokens that cover context[start : start + len(answer)] (offsets: the context's tokens)."""
    end = start + len(answer)
    covering = [(s, e) for s, e in offsets if s < end and e > start]
    return context[covering[0][0] : covering[-1][1]]


@pytest.mark.parametrize("name", ["train.json", "dev.json"])
def test_demo_data_is_one_long_document_read_in_one_littlebird_window(english_tokenizer, name):
    demo = DEMO_DATA / "qa"
    config = AutoConfig.for_model(**json.loads((demo / "littlebird-qa.json").read_text()))
    examples = load_file_examples(demo / name)
    assert len(examples) == 24 and len({e["context"] for e in examples}) == 1
    context = examples[0]["context"]
    offsets = english_tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert len(offsets) > 1500

    metrics, predictions, features = round_trip(
        examples, english_tokenizer, max_seq_length=run_qa.window_length(config, None)
    )
    assert len(features) == len(examples)  # the whole document in one window
    # The best a model can answer is the whole tokens around each first gold answer, worked out here from the
    # document's own tokenization: a gold answer that ends inside a token (a SQuAD annotation slip) cannot be exact.
    best = {
        e["id"]: covering_span(context, e["answers"]["answer_start"][0], e["answers"]["text"][0], offsets)
        for e in examples
    }
    assert predictions.predictions == best
    exact = [any(normalize_squad(best[e["id"]]) == normalize_squad(g) for g in e["answers"]["text"]) for e in examples]
    assert metrics["exact_match"] == pytest.approx(100 * sum(exact) / len(examples))
    if name == "train.json":  # what the demo trains on: every answer is a span of whole tokens
        assert all(exact)


def test_default_window_littlebird_whole_document_others_512():
    littlebird = AutoConfig.for_model(**TINY_LITTLEBIRD)
    roformer = AutoConfig.for_model("posformers-roformer", max_position_embeddings=1536)
    short_roformer = AutoConfig.for_model("posformers-roformer", max_position_embeddings=128)
    deberta = AutoConfig.for_model("posformers-deberta")
    assert run_qa.window_length(littlebird, None) == 4096
    assert run_qa.window_length(littlebird, 16384) == 16384  # longer when asked: no position limit
    assert run_qa.window_length(roformer, None) == 512
    assert run_qa.window_length(roformer, 1024) == 1024
    assert run_qa.window_length(roformer, 4096) == 1536  # capped by the model's positions
    assert run_qa.window_length(short_roformer, None) == 128
    assert run_qa.window_length(deberta, None) == min(512, deberta.max_position_embeddings)


# ---------------------------------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------------------------------


def squad_subset(path: Path, count: int, skip: int = 0) -> Path:
    """The SQuAD v1.1 dev questions [skip, skip + count) in the official layout."""
    article_list = json.loads((QA_DATA / "squad_v1.1" / "dev-v1.1.json").read_text())["data"]
    paragraphs, seen = [], 0
    for article in article_list:
        for paragraph in article["paragraphs"]:
            qas = []
            for qa in paragraph["qas"]:
                if skip <= seen < skip + count:
                    qas.append(qa)
                seen += 1
            if qas:
                paragraphs.append({"context": paragraph["context"], "qas": qas})
        if seen >= skip + count:
            break
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "subset", "paragraphs": paragraphs}]}))
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, english_tokenizer):
    """Files a run needs: tiny LittleBird and RoFormer configs, the bert-base-uncased tokenizer, 32 real questions
    (SQuAD v1.1 dev's first: 30 of them have an answer made of whole tokens; "gold" in "golden" and the "8" that
    SQuAD's first annotator marked in "20–18" cannot be extracted exactly, so 93.75 is the best EM possible)."""
    root = tmp_path_factory.mktemp("qa-run")
    (root / "config.json").write_text(json.dumps(TINY_LITTLEBIRD))
    (root / "roformer.json").write_text(json.dumps(TINY_ROFORMER))
    english_tokenizer.save_pretrained(root / "tokenizer")
    squad_subset(root / "train.json", 32)
    return root


def script_args(root: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--config_name", str(root / "config.json"),
        "--tokenizer_name", str(root / "tokenizer"),
        "--train_file", str(root / "train.json"),
        "--validation_file", str(root / "train.json"),
        "--output_dir", str(output_dir),
        "--max_seq_length", "256",
        "--per_device_train_batch_size", "8",
        "--per_device_eval_batch_size", "16",
        "--learning_rate", "3e-3",
        "--warmup_steps", "10",
        "--report_to", "none",
        "--seed", "0",
        "--disable_tqdm", "true",
        "--dataloader_pin_memory", "false",
        *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_tiny_model_overfits_32_real_questions(workspace, tmp_path, capsys):
    output_dir = tmp_path / "run"
    results = run_qa.main(
        script_args(workspace, output_dir, "--do_train", "--do_eval", "--num_train_epochs", "40",
                    "--save_strategy", "no", "--logging_steps", "40", "--config_name", str(workspace / "roformer.json"))
    )  # fmt: skip
    assert results["eval_exact_match"] >= 90.0, results
    assert results["eval_f1"] >= 90.0
    assert results["eval_samples"] == 32
    # What the run leaves: the model, results JSON and printed table, predictions files.
    assert json.loads((output_dir / "eval_results.json").read_text())["eval_exact_match"] == results["eval_exact_match"]
    predictions = json.loads((output_dir / "eval_predictions.json").read_text())
    assert len(predictions) == 32
    nbest = json.loads((output_dir / "eval_nbest_predictions.json").read_text())
    assert all(0.0 <= c["probability"] <= 1.0 for candidates in nbest.values() for c in candidates)
    assert (output_dir / "model.safetensors").is_file()
    printed = capsys.readouterr().out
    assert "***** eval metrics *****" in printed and "eval_exact_match" in printed
    assert "samples_per_second" in printed and "eta" in printed  # throughput and ETA in the training log


REPO = "user/tiny-littlebird-qa"


@pytest.mark.slow
def test_push_to_hub_through_the_local_hub(workspace, tmp_path, hub_server):
    output_dir = tmp_path / "push"
    args = script_args(workspace, output_dir, "--do_train", "--max_steps", "2", "--max_train_samples", "8",
                       "--save_strategy", "no", "--push_to_hub", "--hub_model_id", REPO)  # fmt: skip
    code = "from posformers.finetune.run_qa import main\nmain(ARGS)\nprint(json.dumps('done'))"
    assert run_python(code, args, env=python_env(tmp_path / "hf-home", endpoint=hub_server.url), cwd=tmp_path) == "done"
    files = set(hub_server.list_files(REPO))
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
    pushed = json.loads(hub_server.read_file(REPO, "config.json"))
    assert pushed["model_type"] == "littlebird" and pushed["architectures"] == ["LittleBirdForQuestionAnswering"]
    weights = hub_server.read_file(REPO, "model.safetensors")
    assert weights == (output_dir / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_v2_run_with_step_evaluation_best_model_and_predictions(workspace, tmp_path):
    """SQuAD v2 through the script: scores logged at every eval step, the best checkpoint reloaded at the end, and
    predictions for a test file without answers."""
    records = json.loads((QA_DATA / "fixtures" / "sample.json").read_text())["data"]
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({k: r[k] for k in ("id", "question", "context")}) + "\n" for r in records))
    output_dir = tmp_path / "v2"
    args = script_args(workspace, output_dir, "--do_train", "--do_eval", "--do_predict", "--version_2_with_negative",
                       "--train_file", str(QA_DATA / "fixtures" / "sample.json"),
                       "--validation_file", str(QA_DATA / "fixtures" / "dev-v2.0.json"), "--test_file", str(test_file),
                       "--max_steps", "4", "--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "2",
                       "--load_best_model_at_end", "--metric_for_best_model", "f1")  # fmt: skip
    results = run_qa.main(args)

    state = json.loads((output_dir / "trainer_state.json").read_text())
    evaluations = [entry for entry in state["log_history"] if "eval_f1" in entry]
    assert [entry["step"] for entry in evaluations] == [2, 4]
    for entry in evaluations:
        assert {"eval_exact", "eval_HasAns_f1", "eval_NoAns_f1", "eval_best_f1_thresh", "eval_loss"} <= entry.keys()
    best = max(evaluations, key=lambda entry: entry["eval_f1"])
    assert state["best_metric"] == best["eval_f1"]
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{best['step']}")
    assert results["eval_f1"] == best["eval_f1"]  # the final evaluation is the best checkpoint's

    null_odds = json.loads((output_dir / "eval_null_odds.json").read_text())
    assert set(null_odds) == set(json.loads((output_dir / "eval_predictions.json").read_text()))
    predicted = json.loads((output_dir / "predict_predictions.json").read_text())
    assert set(predicted) == {r["id"] for r in records}
    assert (output_dir / "predict_null_odds.json").is_file()
    assert "predict_f1" not in results  # nothing to score a test file without answers against


def test_korquad_and_triviaqa_evaluate_through_the_script(workspace, korean_tokenizer, tmp_path):
    """Long pages through main: LittleBird's default window (4096 tokens), KorQuAD's HTML, TriviaQA's scoring."""
    korean_tokenizer.save_pretrained(tmp_path / "korean")
    korquad = run_qa.main(
        ["--config_name", str(workspace / "config.json"), "--tokenizer_name", str(tmp_path / "korean"),
         "--validation_file", str(QA_DATA / "korquad2_sample" / "korquad2.1_dev_00.json"), "--korquad_mode", "html",
         "--do_eval", "--output_dir", str(tmp_path / "korquad"), "--report_to", "none"]
    )  # fmt: skip
    assert korquad["eval_samples"] == 2 and "eval_exact_match" in korquad
    nbest = json.loads((tmp_path / "korquad" / "eval_nbest_predictions.json").read_text())
    assert set(nbest) == {"66678", "57677"}

    trivia = run_qa.main(
        ["--config_name", str(workspace / "config.json"), "--tokenizer_name", str(workspace / "tokenizer"),
         "--validation_file", str(QA_DATA / "triviaqa_sample" / "qa" / "web-dev.json"),
         "--do_eval", "--output_dir", str(tmp_path / "trivia"), "--report_to", "none"]
    )  # fmt: skip
    assert trivia["eval_samples"] == 6  # every (question, document) pair, also those without an alias
    predictions = json.loads((tmp_path / "trivia" / "eval_predictions.json").read_text())
    assert "tc_2--10/10_99.txt" in predictions


def test_module_and_console_script_entry_points(tmp_path):
    console_script = Path(sys.executable).parent / "posformers-qa"  # installed beside this Python by pip
    assert console_script.is_file(), "posformers-qa is not installed (pip install -e .)"
    for command in ([sys.executable, "-m", "posformers.finetune.run_qa"], [str(console_script)]):
        result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        for flag in ("--doc_stride", "--version_2_with_negative", "--korquad_mode", "--eval_strategy"):
            assert flag in result.stdout
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    result = subprocess.run(
        [str(console_script), "--validation_file", str(broken), "--do_eval", "--output_dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error (data): ")
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Bad data stops the script before training
# ---------------------------------------------------------------------------------------------------------------------


def shifted_answer_file(root: Path, tmp_path: Path) -> Path:
    data = json.loads((root / "train.json").read_text())
    qa = data["data"][0]["paragraphs"][0]["qas"][0]
    qa["answers"][0]["answer_start"] += 3
    path = tmp_path / "shifted.json"
    path.write_text(json.dumps(data))
    return path, qa["id"]


def test_offset_mismatch_stops_before_training(workspace, tmp_path):
    path, qid = shifted_answer_file(workspace, tmp_path)
    output_dir = tmp_path / "out"
    with pytest.raises(SystemExit, match=rf"error \(data\): .*shifted.json.*example '{qid}': answer .* does not"):
        run_qa.main([*script_args(workspace, output_dir, "--do_train"), "--train_file", str(path)])
    assert not (output_dir / "model.safetensors").exists()


def test_skip_bad_examples_counts_and_goes_on(workspace, tmp_path, caplog):
    path, qid = shifted_answer_file(workspace, tmp_path)
    args = script_args(workspace, tmp_path / "out", "--do_train", "--max_steps", "1", "--save_strategy", "no",
                       "--skip_bad_examples", "--max_train_samples", "8")  # fmt: skip
    # explicit: the default "passive" level inherits whatever verbosity an earlier run in this process set
    results = run_qa.main([*args, "--train_file", str(path), "--log_level", "warning"])
    assert results["train_samples"] >= 7  # windows of the 7 good questions among the first 8 kept
    assert f"train: skipped 1 bad example(s); first: {path}" in caplog.text and qid in caplog.text


def test_empty_file_and_missing_field_stop_the_script(workspace, tmp_path):
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(SystemExit, match=r"empty.json: the file is empty"):
        run_qa.main(
            [*script_args(workspace, tmp_path / "a", "--do_train"), "--train_file", str(tmp_path / "empty.json")]
        )
    (tmp_path / "noq.json").write_text(json.dumps({"data": [{"id": "x", "context": "c", "answers": []}]}))
    with pytest.raises(SystemExit, match=r"noq.json, column 'question': question #0 \(id 'x'\) has no 'question'"):
        run_qa.main(
            [*script_args(workspace, tmp_path / "b", "--do_eval"), "--validation_file", str(tmp_path / "noq.json")]
        )


def test_hub_dataset_offline_is_a_clear_error(workspace, tmp_path):
    args = ["--dataset_name", "squad", "--do_eval", "--output_dir", str(tmp_path / "out"),
            "--config_name", str(workspace / "config.json")]  # fmt: skip
    with pytest.raises(SystemExit, match=r"cannot load split 'validation' of dataset 'squad'.*HF_HUB_OFFLINE"):
        run_qa.main(args)


# ---------------------------------------------------------------------------------------------------------------------
# A span-selection checkpoint (qa_head="span_selection"): the [QUESTION] token after each question
# ---------------------------------------------------------------------------------------------------------------------

QUESTION_TOKEN = "[QUESTION]"
DEMO_QA = DEMO_DATA / "qa"


@pytest.fixture(scope="module")
def question_tokenizer():
    """bert-base-uncased with [QUESTION] added as a special token, as posformers-pretrain --objective rss adds it."""
    tokenizer = BertTokenizerFast(vocab=str(BERT_VOCAB), do_lower_case=True)
    tokenizer.add_special_tokens({"additional_special_tokens": [QUESTION_TOKEN]})
    return tokenizer


def test_span_selection_windows_hold_one_question_token_right_after_the_question(question_tokenizer):
    examples = long_document_examples()
    question_id = question_tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    metrics, _, features = round_trip(
        examples, question_tokenizer, max_seq_length=96, doc_stride=48, question_token=QUESTION_TOKEN
    )
    assert len(features) > 20 * len(examples)
    for ids in features["input_ids"]:
        assert ids.count(question_id) == 1
        assert ids.index(question_id) == ids.index(question_tokenizer.sep_token_id) - 1  # closes the question
    assert metrics["exact_match"] == 100.0  # the gold positions still point at the answers
    _, plain = windows(examples, question_tokenizer, 96, 48)
    assert question_id not in {i for ids in plain["input_ids"] for i in ids}


@pytest.fixture(scope="module")
def span_selection_checkpoint(tmp_path_factory, question_tokenizer) -> Path:
    """A tiny LittleBirdForQuestionSpanSelection saved as an RSS run saves it: qa_head="span_selection",
    question_token_id set, the tokenizer with [QUESTION] beside it."""
    import torch

    from posformers import LittleBirdForQuestionSpanSelection

    folder = tmp_path_factory.mktemp("rss-checkpoint")
    fields = {k: v for k, v in TINY_LITTLEBIRD.items() if k != "model_type"}
    question_id = question_tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    config = AutoConfig.for_model(
        "littlebird",
        **fields,
        vocab_size=len(question_tokenizer),
        question_token_id=question_id,
        qa_head="span_selection",
    )
    torch.manual_seed(0)
    LittleBirdForQuestionSpanSelection(config).save_pretrained(folder)
    question_tokenizer.save_pretrained(folder)
    return folder


def rss_qa_args(checkpoint: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--model_name_or_path", str(checkpoint),
        "--train_file", str(DEMO_QA / "train.json"),
        "--validation_file", str(DEMO_QA / "train.json"),
        "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4",
        "--max_train_samples", "8",
        "--max_eval_samples", "4",
        *QUIET_RUN,
        *extra,
    ]  # fmt: skip


QUIET_RUN = ("--report_to", "none", "--seed", "0", "--disable_tqdm", "true", "--save_strategy", "no")


def test_span_selection_checkpoint_evaluates_with_its_own_head_on_long_documents(
    span_selection_checkpoint, question_tokenizer, tmp_path
):
    """posformers-qa reads the RSS checkpoint's head (no weight left untrained): its evaluation logits on the demo's
    1,848-token document, one LittleBird window with [QUESTION] after the question, are the span-selection model's."""
    import torch

    from posformers import LittleBirdForQuestionSpanSelection

    run_qa.main(rss_qa_args(span_selection_checkpoint, tmp_path / "eval", "--do_eval"))
    nbest = json.loads((tmp_path / "eval" / "eval_nbest_predictions.json").read_text())
    examples = load_file_examples(DEMO_QA / "train.json")[:4]
    _, features = windows(examples, question_tokenizer, 4096, 128, question_token=QUESTION_TOKEN)
    assert len(features) == len(examples) and len(features["input_ids"][0]) > 1500  # one window per question
    model = LittleBirdForQuestionSpanSelection.from_pretrained(span_selection_checkpoint).eval()
    for index, example in enumerate(examples):
        with torch.no_grad():
            window = {key: torch.tensor([features[key][index]]) for key in ("input_ids", "token_type_ids")}
            start_logits = model(**window).start_logits[0, 0]
        best = nbest[example["id"]][0]
        offsets = features["offset_mapping"][index]
        token = next(i for i, o in enumerate(offsets) if o is not None and o[0] == best["answer_start"])
        assert abs(start_logits[token].item() - best["start_logit"]) <= 1e-4


def test_span_selection_checkpoint_fine_tunes_through_the_script(span_selection_checkpoint, tmp_path):
    results = run_qa.main(
        rss_qa_args(span_selection_checkpoint, tmp_path / "train", "--do_train", "--do_eval", "--max_steps", "3")
    )
    assert results["train_samples"] == 8 and "eval_exact_match" in results
    saved = json.loads((tmp_path / "train" / "config.json").read_text())
    assert saved["qa_head"] == "span_selection" and saved["architectures"] == ["LittleBirdForQuestionAnswering"]
    before, after = (load_file(d / "model.safetensors") for d in (span_selection_checkpoint, tmp_path / "train"))
    assert before.keys() == after.keys()  # the same head, nothing added or dropped
    assert not (before["qass.start_classifier.weight"] == after["qass.start_classifier.weight"]).all()  # trained


def test_span_selection_checkpoint_needs_its_question_token(span_selection_checkpoint, workspace, tmp_path):
    args = rss_qa_args(span_selection_checkpoint, tmp_path / "a", "--do_eval")
    with pytest.raises(SystemExit, match=r"no added special token of that id: use the tokenizer saved with the model"):
        run_qa.main([*args, "--tokenizer_name", str(workspace / "tokenizer")])
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LITTLEBIRD, "qa_head": "span_selection"}))
    args = [*script_args(workspace, tmp_path / "b", "--do_eval"), "--config_name", str(tmp_path / "config.json")]
    with pytest.raises(SystemExit, match=r"qa_head='span_selection' but no question_token_id"):
        run_qa.main(args)
