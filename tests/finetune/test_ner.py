"""posformers-ner (finetune/run_ner.py): both CoNLL-2003 layouts, JSON lines and a Hub-style dataset folder, tags on
sub-tokens, scores as seqeval computes them from the predictions file, padded vs flattened batches, bad data with
file and line, the output folder's safety and resuming."""

import json
import shutil
import warnings
from pathlib import Path

import datasets
import pytest
from conftest import QUIET, TOKENIZER_DIR, tiny_model_args
from helpers.data import DATA_DIR
from helpers.pretrain_corpus import TINY
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score
from transformers import AutoConfig, AutoTokenizer, GPT2Tokenizer

from posformers.finetune import run_ner
from posformers.finetune.arguments import ModelArguments
from posformers.finetune.loading import load_tokenizer
from posformers.finetune.ner_data import read_conll, read_split_files, to_iob2

CONLL = DATA_DIR / "ner" / "conll2003"
TAGS = ["B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER", "O"]
NO_DROPOUT = ",hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
FAST = ["--learning_rate", "5e-3", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16"]


def ner_main(out: Path, *args: str, model: list[str] | None = None) -> dict:
    return run_ner.main([*(model or tiny_model_args()), *QUIET, "--output_dir", str(out), *FAST, *args])


def train_and_evaluate_on(path: Path, out: Path, *args: str) -> dict:
    """One training step on `path`, then an evaluation on the same file."""
    files = ["--train_file", str(path), "--validation_file", str(path)]
    return ner_main(out, *files, "--do_train", "--do_eval", "--max_steps", "1", *args)


def read_predictions(path: Path) -> list[list[tuple[str, str, str]]]:
    """The `word gold predicted` lines of a predictions file, per sentence."""
    sentences = [[]]
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line:
            sentences[-1].append(tuple(line.split(" ")))
        elif sentences[-1]:
            sentences.append([])
    return [sentence for sentence in sentences if sentence]


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("iob1", "iob2", "count"), [("eng.train", "train.txt", 218), ("eng.testa", "valid.txt", 127)])
def test_both_conll2003_layouts_give_the_same_sentences(iob1, iob2, count):
    original, hub_layout = read_conll(CONLL / iob1), read_conll(CONLL / iob2)
    assert len(original) == len(hub_layout) == count
    assert [(s["tokens"], s["ner_tags"]) for s in original] == [(s["tokens"], s["ner_tags"]) for s in hub_layout]
    # IOB1 in the file: LEICESTERSHIRE starts its entity with I-ORG; read as IOB2
    raw = (CONLL / iob1).read_text().splitlines()
    if iob1 == "eng.testa":
        assert raw[4] == "LEICESTERSHIRE NNP I-NP I-ORG"
        assert original[0]["tokens"][2:4] == ["LEICESTERSHIRE", "TAKE"]
        assert original[0]["ner_tags"][2:4] == ["B-ORG", "O"] and original[0]["line"] == 3
    assert sorted({tag for s in original for tag in s["ner_tags"]}) == TAGS


def test_iob1_to_iob2_keeps_b_between_adjacent_entities():
    # IOB1: B- only where an entity follows one of the same type
    assert to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "B-PER",
        "O",
        "B-LOC",
        "B-ORG",
        "I-ORG",
    ]
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
    assert to_iob2(iob2) == iob2


def test_last_sentence_without_a_closing_blank_line(tmp_path):
    # The original eng.* files end without a newline after the last word
    path = tmp_path / "eng.testb"
    path.write_text("-DOCSTART- -X- -X- O\n\nSOCCER NN I-NP O\nJAPAN NNP I-NP I-LOC\n\nAl-Ain NNP I-NP I-LOC")
    assert [(s["tokens"], s["ner_tags"], s["line"]) for s in read_conll(path)] == [
        (["SOCCER", "JAPAN"], ["O", "B-LOC"], 3),
        (["Al-Ain"], ["B-LOC"], 6),
    ]


def test_labels_on_first_sub_token_or_all():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    sentence = read_conll(CONLL / "valid.txt")[6]  # "... at Headingley ..."
    encoded = tokenizer(sentence["tokens"], is_split_into_words=True)
    word_ids = encoded.word_ids()
    label2id = {tag: i for i, tag in enumerate(TAGS)}
    first = run_ner.align_labels(word_ids, sentence["ner_tags"], label2id, all_tokens=False)
    every = run_ner.align_labels(word_ids, sentence["ner_tags"], label2id, all_tokens=True)
    pieces = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert sentence["tokens"][28] == "Headingley" and sentence["ner_tags"][28] == "B-LOC"
    headingley = [i for i, word in enumerate(word_ids) if word == 28]
    assert [pieces[i] for i in headingley] == ["heading", "##ley"]
    assert first[headingley[0]] == every[headingley[0]] == label2id["B-LOC"]
    assert (first[headingley[1]], every[headingley[1]]) == (-100, label2id["I-LOC"])
    assert first[0] == every[0] == first[-1] == every[-1] == -100  # [CLS], [SEP]
    assert sum(label != -100 for label in first) == len(sentence["tokens"])


def test_byte_level_bpe_tokenizers_get_a_space_before_each_word(tmp_path):
    # GPT-2's BPE (DeBERTa v1's tokenizer): without add_prefix_space, words of a pre-split sentence lose their "Ġ"
    shutil.copytree(DATA_DIR / "vocab" / "gpt2", tmp_path / "gpt2")
    GPT2Tokenizer.from_pretrained(tmp_path / "gpt2").save_pretrained(tmp_path / "tokenizer")
    model_args = ModelArguments(tokenizer_name=str(tmp_path / "tokenizer"))
    plain = load_tokenizer(model_args)
    words = ["EU", "rejects", "German", "call"]
    assert plain.convert_ids_to_tokens(plain(words, is_split_into_words=True)["input_ids"])[0] == "EU"
    tokenizer = run_ner.tokenizer_for_words(plain, model_args)
    encoded = tokenizer(words, is_split_into_words=True)
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"]) == ["ĠEU", "Ġrejects", "ĠGerman", "Ġcall"]
    assert encoded.word_ids() == [0, 1, 2, 3]


def test_word_predictions_reads_padded_and_flattened_layouts_alike():
    sentences = [{"tokens": ["a", "b", "c"], "ner_tags": ["O"] * 3}, {"tokens": ["d", "e"], "ner_tags": ["O"] * 2}]
    kept = [[0, 1, 2], [0]]  # "e" was cut off by max_seq_length
    id2label = {0: "O", 1: "B-PER"}
    padded_ids, padded_labels = [[0, 1, 7, 0, 0], [0, 1, 0, 0, 0]], [[-100, 0, -100, 0, 0], [-100, 0, -100, -100, -100]]
    flat_ids, flat_labels = [[0, 1, 7, 0, 0, 0, 1]], [[-100, 0, -100, 0, 0, -100, 0]]
    expected = [["B-PER", "O", "O"], ["B-PER", "O"]]
    assert run_ner.word_predictions(padded_ids, padded_labels, sentences, kept, id2label) == expected
    assert run_ner.word_predictions(flat_ids, flat_labels, sentences, kept, id2label) == expected


# ---------------------------------------------------------------------------------------------------------------------
# Training, scores and predictions
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """A tiny RoFormer trained on the first 96 sentences of train.txt, evaluated and predicting on valid.txt."""
    out = tmp_path_factory.mktemp("ner") / "out"
    files = ["--train_file", str(CONLL / "train.txt"), "--validation_file", str(CONLL / "valid.txt")]
    metrics = ner_main(
        out,
        *files,
        "--test_file",
        str(CONLL / "eng.testa"),
        "--max_train_samples",
        "96",
        "--max_predict_samples",
        "40",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--num_train_epochs",
        "3",
        "--logging_steps",
        "4",
    )
    return out, metrics


def test_training_learns_and_scores_match_seqeval_on_the_predictions_file(trained):
    out, metrics = trained
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert losses[-1] < losses[0] * 0.6, losses  # from ~2.2 (9 tags) down: it learns at least the "O" majority
    # The predictions file holds every validation word with its gold tag, and its predicted tags score as in seqeval
    predicted = read_predictions(out / "eval_predictions.txt")
    gold_sentences = read_conll(CONLL / "valid.txt")
    assert [[w for w, _, _ in s] for s in predicted] == [s["tokens"] for s in gold_sentences]
    assert [[g for _, g, _ in s] for s in predicted] == [s["ner_tags"] for s in gold_sentences]
    gold, guess = [[g for _, g, _ in s] for s in predicted], [[p for _, _, p in s] for s in predicted]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert metrics["eval_f1"] == pytest.approx(f1_score(gold, guess), abs=1e-9)
        assert metrics["eval_precision"] == pytest.approx(precision_score(gold, guess), abs=1e-9)
        assert metrics["eval_recall"] == pytest.approx(recall_score(gold, guess), abs=1e-9)
        report = classification_report(gold, guess, output_dict=True)
    for type_ in ("LOC", "MISC", "ORG", "PER"):
        assert metrics[f"eval_{type_}_f1"] == pytest.approx(report[type_]["f1-score"], abs=1e-9)
        assert metrics[f"eval_{type_}_number"] == report[type_]["support"]
    assert metrics["eval_samples"] == 127
    # --do_predict on the IOB1 file: the same sentences in IOB2, 40 of them
    test_predictions = read_predictions(out / "predictions.txt")
    assert [[g for _, g, _ in s] for s in test_predictions] == [s["ner_tags"] for s in gold_sentences[:40]]
    assert metrics["predict_samples"] == 40 and "predict_f1" in metrics
    config = AutoConfig.from_pretrained(out)
    assert list(config.id2label.values()) == TAGS


@pytest.mark.parametrize("model_type", list(TINY))
def test_flattened_and_padded_batches_give_the_same_predictions(model_type, tmp_path):
    # Each model family, trained a few steps from scratch (dropout off), then evaluated both ways
    tiny = tiny_model_args(model_type, TINY[model_type] + NO_DROPOUT)
    data = ["--train_file", str(CONLL / "train.txt"), "--validation_file", str(CONLL / "valid.txt")]
    data += ["--max_train_samples", "32", "--max_eval_samples", "48"]
    ner_main(tmp_path / "model", *data, "--do_train", "--max_steps", "3", model=tiny)
    options = {"true": ["--padding_free", "true"], "false": ["--padding_free", "false"]}
    options["max_length"] = ["--padding_free", "false", "--pad_to_max_length", "--max_seq_length", "64"]
    results = {}
    for mode, option in options.items():
        model = ["--model_name_or_path", str(tmp_path / "model")]
        results[mode] = ner_main(tmp_path / mode, *data, "--do_eval", *option, model=model)
    padded = (tmp_path / "false" / "eval_predictions.txt").read_text()
    for mode in ("true", "max_length"):  # flattened, and every sentence padded to 64 tokens
        assert (tmp_path / mode / "eval_predictions.txt").read_text() == padded, mode
        assert results[mode]["eval_f1"] == results["false"]["eval_f1"]
        assert results[mode]["eval_loss"] == pytest.approx(results["false"]["eval_loss"], abs=1e-5)


def test_label_all_tokens_and_words_cut_by_max_seq_length(tmp_path, caplog):
    metrics = ner_main(
        tmp_path / "out",
        "--train_file",
        str(CONLL / "train.txt"),
        "--validation_file",
        str(CONLL / "valid.txt"),
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "20",
        "--label_all_tokens",
        "--max_seq_length",
        "12",
        "--log_level",
        "warning",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "2",
    )
    predicted = read_predictions(tmp_path / "out" / "eval_predictions.txt")
    # Every word is in the file; the long sentences' words past 10 tokens were predicted "O"
    assert [len(s) for s in predicted] == [len(s["tokens"]) for s in read_conll(CONLL / "valid.txt")[:20]]
    assert any("words get no prediction" in record.message for record in caplog.records)
    assert 0 <= metrics["eval_f1"] <= 1


def test_hub_style_dataset_folder_with_class_label_tags(tmp_path):
    # The Hub's conll2003 layout: tokens and ner_tags ids with ClassLabel names (in its own order, not sorted)
    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "tokens": datasets.Sequence(datasets.Value("string")),
            "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names)),
        }
    )
    folder = tmp_path / "conll2003"
    for split, file in (("train", "train.txt"), ("validation", "valid.txt")):
        sentences = read_conll(CONLL / file)[:24]
        rows = {
            "id": [str(s["id"]) for s in sentences],
            "tokens": [s["tokens"] for s in sentences],
            "ner_tags": [[names.index(tag) for tag in s["ner_tags"]] for s in sentences],
        }
        datasets.Dataset.from_dict(rows, features=features).to_parquet(folder / "data" / f"{split}.parquet")
    metrics = ner_main(tmp_path / "out", "--dataset_name", str(folder), "--do_train", "--do_eval", "--max_steps", "2")
    assert list(AutoConfig.from_pretrained(tmp_path / "out").id2label.values()) == names
    predicted = read_predictions(tmp_path / "out" / "eval_predictions.txt")
    assert [[g for _, g, _ in s] for s in predicted] == [s["ner_tags"] for s in read_conll(CONLL / "valid.txt")[:24]]
    assert metrics["eval_samples"] == 24


def test_a_fine_tuned_checkpoint_keeps_its_tag_order_and_refuses_other_tags(trained, tmp_path):
    model_dir, _ = trained
    reordered = tmp_path / "valid.jsonl"  # some of its tags (no I-ORG), first seen in another order
    sentences = read_conll(CONLL / "valid.txt")[:8]
    reordered.write_text(
        "".join(json.dumps({"tokens": s["tokens"], "ner_tags": s["ner_tags"]}) + "\n" for s in sentences)
    )
    model = ["--model_name_or_path", str(model_dir)]
    metrics = ner_main(tmp_path / "same", "--validation_file", str(reordered), "--do_eval", model=model)
    assert metrics["eval_samples"] == 8
    # the model's own tag ids: the same predictions as its evaluation on the whole validation file
    whole = read_predictions(model_dir / "eval_predictions.txt")[:8]
    assert read_predictions(tmp_path / "same" / "eval_predictions.txt") == whole
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"tokens": ["EU", "rejects"], "ner_tags": ["B-GPE", "O"]}) + "\n")
    with pytest.raises(SystemExit, match=r"the data's tags \(B-GPE, O\) are not those .* --ignore_mismatched_sizes"):
        ner_main(tmp_path / "other", "--train_file", str(other), "--do_train", model=model)
    ner_main(tmp_path / "new-head", "--train_file", str(other), "--do_train", "--max_steps", "1",
             "--ignore_mismatched_sizes", model=model)  # fmt: skip
    assert AutoConfig.from_pretrained(tmp_path / "new-head").id2label == {0: "B-GPE", 1: "O"}


def test_overall_scores_only(trained, tmp_path):
    model = ["--model_name_or_path", str(trained[0])]
    data = ["--validation_file", str(CONLL / "valid.txt"), "--max_eval_samples", "8", "--do_eval"]
    metrics = ner_main(tmp_path / "out", *data, "--return_entity_level_metrics", "False", model=model)
    assert {key for key in metrics if key.endswith(("_f1", "_precision", "_recall"))} == {
        "eval_f1",
        "eval_precision",
        "eval_recall",
    }


def test_json_lines_and_a_json_list_with_string_tags(tmp_path):
    sentences = read_conll(CONLL / "train.txt")[:16]
    records = [{"tokens": s["tokens"], "ner_tags": s["ner_tags"]} for s in sentences]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    (tmp_path / "train.json").write_text(json.dumps(records, indent=1))
    columns = ("tokens", "ner_tags")
    read = read_split_files({"a": tmp_path / "train.jsonl", "b": tmp_path / "train.json"}, columns, skip_bad=False)
    assert [(s["tokens"], s["ner_tags"]) for s in read["a"]] == [(s["tokens"], s["ner_tags"]) for s in sentences]
    assert [(s["tokens"], s["ner_tags"]) for s in read["b"]] == [(s["tokens"], s["ner_tags"]) for s in sentences]
    assert train_and_evaluate_on(tmp_path / "train.jsonl", tmp_path / "out")["eval_samples"] == 16


# ---------------------------------------------------------------------------------------------------------------------
# Refusals: one line with file and line, before training
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("EU NNP B-NP B-ORG\nrejects\n", ".txt", r"train\.txt, line 2: the word 'rejects' has no tag"),
        ("EU NNP B-NP B-ORG\nrejects VBZ B-VP X-PER\n", ".txt", r"train\.txt, line 2: 'X-PER' is not a NER tag"),
        ('{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG"]}\n', ".jsonl", r"line 1, column 'ner_tags': 2 words"),
        ('{"tokens": ["EU"]}\n', ".jsonl", r"train\.jsonl, line 1: needs the keys 'tokens' and 'ner_tags'"),
        ("\n\n", ".txt", r"train\.txt: no sentences"),
    ],
)
def test_bad_data_stops_with_file_and_line(tmp_path, content, suffix, message):
    path = tmp_path / f"train{suffix}"
    path.write_text(content)
    with pytest.raises(SystemExit, match=r"^error \(data\): .*" + message):
        ner_main(tmp_path / "out", "--train_file", str(path), "--do_train", "--max_steps", "1")


def test_a_dataset_that_does_not_load_and_a_missing_split(tmp_path):
    with pytest.raises(SystemExit, match=r"cannot load the dataset nobody/no-such-dataset: "):
        ner_main(tmp_path / "a", "--dataset_name", "nobody/no-such-dataset", "--do_train")  # offline in the tests
    with pytest.raises(SystemExit, match=r"--do_eval needs a validation split \(have: train\)"):
        ner_main(tmp_path / "b", "--train_file", str(CONLL / "train.txt"), "--do_train", "--do_eval")


def test_skip_bad_examples_skips_broken_sentences(tmp_path, caplog):
    path = tmp_path / "train.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects\n\nPeter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n")
    metrics = train_and_evaluate_on(path, tmp_path / "out", "--skip_bad_examples", "--log_level", "warning")
    assert metrics["eval_samples"] == 1
    assert any("skipped 1 bad example" in record.message for record in caplog.records)


def test_output_folder_safety_and_resuming(tmp_path):
    args = ["--train_file", str(CONLL / "train.txt"), "--max_train_samples", "32", "--do_train", "--max_steps", "4"]
    out = tmp_path / "out"
    ner_main(out, *args, "--save_strategy", "steps", "--save_steps", "2")
    with pytest.raises(SystemExit, match="already holds a previous run"):
        ner_main(out, *args)
    resumed = ner_main(out, *args, "--max_steps", "6", "--resume_from_checkpoint", "True")
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and resumed["train_samples"] == 32
