"""posformers-pretrain on real text (SQuAD contexts and SST-2 sentences): MLM for the three model families, the data
pipeline (tokenizer training, packing, whole-word masking, streaming), the Enhanced Mask Decoder on DeBERTa's loss
path, and bad input."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
from conftest import QUIET
from helpers import python_env, run_python
from helpers.pretrain_corpus import TINY, eval_history
from transformers import AutoModelForMaskedLM, AutoTokenizer

from posformers import modeling_deberta
from posformers.configuration_deberta import DebertaConfig
from posformers.finetune import run_pretrain
from posformers.finetune.errors import DataError
from posformers.finetune.pretrain_data import (
    MaskingCollator,
    PretrainDataArguments,
    fix_masks,
    load_corpus,
    pack_batch,
    pack_corpus,
    train_tokenizer,
)
from posformers.modeling_deberta import DebertaForMaskedLM


@pytest.fixture(scope="module")
def documents(corpus) -> list[str]:
    return corpus["train"].read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory, documents):
    """A 600-token WordPiece tokenizer trained on the corpus, saved as a folder."""
    tokenizer = train_tokenizer(datasets.Dataset.from_dict({"text": documents}), "wordpiece", 600)
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    return tokenizer, folder


def data_args(corpus, max_seq_length=32):
    return [
        "--train_file", str(corpus["train"]), "--validation_file", str(corpus["validation"]),
        "--max_seq_length", str(max_seq_length), "--max_eval_samples", "60",
    ]  # fmt: skip


def train_args(output_dir, steps=30, batch=16, lr="5e-3"):
    return [
        "--do_train", "--do_eval", "--max_steps", str(steps), "--per_device_train_batch_size", str(batch),
        "--per_device_eval_batch_size", "32", "--learning_rate", lr, "--warmup_steps", "3", "--eval_on_start",
        "--logging_steps", "10", "--output_dir", str(output_dir), "--seed", "7", *QUIET,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# MLM end to end, each model family
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["posformers-roformer", "posformers-deberta", "littlebird"])
def test_mlm_held_out_loss_falls(model_type, corpus, wordpiece, tmp_path, monkeypatch):
    emd_calls = []
    original_emd = modeling_deberta.DebertaEnhancedMaskDecoder.forward

    def counting_emd(self, sequence_output, deberta=None, **kwargs):
        emd_calls.append((self.steps, deberta is not None))
        return original_emd(self, sequence_output, deberta=deberta, **kwargs)

    monkeypatch.setattr(modeling_deberta.DebertaEnhancedMaskDecoder, "forward", counting_emd)
    output = tmp_path / "out"
    metrics = run_pretrain.main(
        ["--objective", "mlm", "--model_type", model_type, "--config_overrides", TINY[model_type],
         "--tokenizer_name", str(wordpiece[1]), *data_args(corpus), *train_args(output)]
    )  # fmt: skip
    start, end = eval_history(output, "eval_mlm_loss")[0], metrics["eval_mlm_loss"]  # eval_on_start, final eval
    print(f"{model_type}: held-out MLM loss {start:.3f} -> {end:.3f}")
    assert end < start - 0.4
    assert metrics["eval_mlm_perplexity"] == pytest.approx(torch.tensor(end).exp().item(), rel=1e-4)
    assert 0 < metrics["eval_mlm_accuracy"] <= 1
    assert metrics["train_samples"] > 0 and metrics["train_samples_per_second"] > 0
    model = AutoModelForMaskedLM.from_pretrained(output)
    assert model.config.model_type == model_type and model.config.vocab_size == len(wordpiece[0])
    if model_type == "posformers-deberta":
        # every training and evaluation forward went through the EMD with its steps and the base model
        assert emd_calls and all(steps == model.config.emd_steps > 0 and layer for steps, layer in emd_calls)
    else:
        assert not emd_calls


def tiny_deberta_mlm(vocab_size: int) -> DebertaForMaskedLM:
    torch.manual_seed(0)
    config = DebertaConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, position_buckets=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return DebertaForMaskedLM(config).eval()


def masked_batch(tokenizer, documents, count=8, length=32):
    torch.manual_seed(0)
    packed = pack_batch(documents[:count], tokenizer, length, word_starts=False)
    return MaskingCollator(tokenizer)([{"input_ids": ids} for ids in packed["input_ids"][:count]])


def test_emd_is_on_the_deberta_mlm_loss_path(wordpiece, documents, monkeypatch):
    tokenizer = wordpiece[0]
    model = tiny_deberta_mlm(len(tokenizer))
    batch = masked_batch(tokenizer, documents)
    assert model.lm_predictions.steps == 2
    output = model(**batch)
    output.loss.backward()
    # the absolute position table and the last layer feed the MLM logits only through the EMD
    assert model.deberta.embeddings.position_embeddings.weight.grad.abs().sum() > 0
    assert model.deberta.encoder.layer[-1].attention.output.dense.weight.grad.abs().sum() > 0

    def bypass(self, sequence_output, **kwargs):  # the LM head straight on the encoder output
        return self.lm_head(sequence_output)

    monkeypatch.setattr(modeling_deberta.DebertaEnhancedMaskDecoder, "forward", bypass)
    with torch.no_grad():
        bypassed = model(**batch)
    # an untrained model's loss sits near ln(V) either way: compare what the head sees, i.e. the logits
    difference = (bypassed.logits - output.logits.detach()).abs().max()
    print(f"EMD bypass changes the logits by up to {difference:.2e}")
    assert difference > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# Data pipeline
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_train_tokenizer(kind, documents):
    tokenizer = train_tokenizer(datasets.Dataset.from_dict({"text": documents[:600]}), kind, 400)
    assert 100 < len(tokenizer) <= 400
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id) == (0, 1)
    assert None not in (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id)
    encoded = tokenizer("The Normans gave their name to Normandy.")
    assert encoded["input_ids"][0] == tokenizer.cls_token_id and encoded["input_ids"][-1] == tokenizer.sep_token_id
    assert tokenizer.unk_token_id not in encoded["input_ids"]
    assert tokenizer.decode(encoded["input_ids"], skip_special_tokens=True).replace(" .", ".") == (
        "the normans gave their name to normandy."
    )


def test_train_tokenizer_from_the_command_line_is_saved_and_used(corpus, tmp_path):
    output = tmp_path / "out"
    run_pretrain.main(
        ["--model_type", "posformers-roformer", "--config_overrides", TINY["posformers-roformer"],
         "--train_tokenizer", "unigram", "--tokenizer_vocab_size", "350", *data_args(corpus),
         *train_args(output, steps=2)]
    )  # fmt: skip

    tokenizer = AutoTokenizer.from_pretrained(output)
    model = AutoModelForMaskedLM.from_pretrained(output)
    assert len(tokenizer) <= 350 and model.config.vocab_size == len(tokenizer)
    assert tokenizer.tokenize("normans")[0].startswith("▁")


def test_packing_frames_and_keeps_every_token(wordpiece, documents):
    tokenizer = wordpiece[0]
    packed = pack_batch(documents[:50], tokenizer, 32, word_starts=True)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert all(len(ids) <= 32 and ids[0] == cls and ids[-1] == sep for ids in packed["input_ids"])
    assert all(len(ids) == 32 for ids in packed["input_ids"][:-1])  # only the last chunk is short
    content = [token for ids in packed["input_ids"] for token in ids[1:-1]]
    joined = []
    for text in documents[:50]:
        joined += ([sep] if joined else []) + tokenizer(text, add_special_tokens=False)["input_ids"]
    assert content == joined
    assert [len(ids) for ids in packed["input_ids"]] == [len(starts) for starts in packed["word_starts"]]


def words_of(feature) -> list[list[int]]:
    """Positions grouped by word, from the word_starts flags."""
    words = []
    for position, start in enumerate(feature["word_starts"]):
        if start or not words:
            words.append([])
        words[-1].append(position)
    return words


@pytest.mark.parametrize("whole_words", [True, False])
def test_whole_word_masking_masks_all_pieces_of_a_word(whole_words, wordpiece, documents):
    tokenizer = wordpiece[0]
    packed = pack_batch(documents[:40], tokenizer, 64, word_starts=True)
    features = [{"input_ids": ids, "word_starts": starts} for ids, starts in zip(*packed.values())]
    torch.manual_seed(1)
    batch = MaskingCollator(tokenizer, mlm_probability=0.4, whole_word_masking=whole_words)(features)
    selected = batch["labels"] != -100
    split_words = 0
    for row, feature in enumerate(features):
        for word in words_of(feature):
            chosen = selected[row, word]
            split_words += int(len(word) > 1 and bool(chosen.any()) and not bool(chosen.all()))
        specials = torch.isin(torch.tensor(feature["input_ids"]), torch.tensor(tokenizer.all_special_ids))
        assert not selected[row, : len(feature["input_ids"])][specials].any()
    assert (split_words == 0) if whole_words else (split_words > 0)
    share = float(selected.sum() / batch["attention_mask"].sum())
    assert 0.3 < share < 0.5, (split_words, share)


def test_held_out_masks_are_the_same_at_every_evaluation(wordpiece, documents):
    tokenizer = wordpiece[0]
    split = pack_corpus(datasets.Dataset.from_dict({"text": documents[:30]}), tokenizer, 32)
    held_out = [dict(example) for example in fix_masks(split, seed=3)]
    collator = MaskingCollator(tokenizer)
    first, second = collator(held_out[:8]), collator(held_out[:8])
    assert torch.equal(first["input_ids"], second["input_ids"]) and torch.equal(first["labels"], second["labels"])
    training = [{"input_ids": example["input_ids"]} for example in held_out[:8]]
    assert not torch.equal(collator(training)["labels"], collator(training)["labels"])


def test_streaming_packs_like_in_memory_and_trains(corpus, wordpiece, documents, tmp_path):
    tokenizer = wordpiece[0]
    in_memory = pack_corpus(datasets.Dataset.from_dict({"text": documents[:300]}), tokenizer, 32)
    streamed = pack_corpus(datasets.IterableDataset.from_generator(lambda: ({"text": t} for t in documents[:300])),
                           tokenizer, 32)  # fmt: skip
    assert [example["input_ids"] for example in streamed] == in_memory["input_ids"]

    output = tmp_path / "out"
    metrics = run_pretrain.main(
        ["--model_type", "posformers-roformer", "--config_overrides", TINY["posformers-roformer"],
         "--tokenizer_name", str(wordpiece[1]), "--streaming", "--train_file", str(corpus["train"]),
         "--streaming_validation_lines", "40", "--max_seq_length", "32", *train_args(output, steps=12)]
    )  # fmt: skip
    assert metrics["eval_mlm_loss"] < eval_history(output, "eval_mlm_loss")[0] and metrics["train_runtime"] > 0


PUSH = """
from posformers.finetune import run_pretrain
run_pretrain.main(ARGS["argv"])
print(json.dumps({"done": True}))
"""


@pytest.mark.slow
def test_push_to_hub_uploads_the_pretrained_model(corpus, wordpiece, tmp_path, hub_server):
    output = tmp_path / "out"
    argv = [
        "--model_type", "posformers-roformer", "--config_overrides", TINY["posformers-roformer"],
        "--tokenizer_name", str(wordpiece[1]), *data_args(corpus), *train_args(output, steps=2),
        "--push_to_hub", "--hub_model_id", "user/tiny-mlm",
    ]  # fmt: skip
    run_python(PUSH, {"argv": argv}, env=python_env(tmp_path / "hf-home", endpoint=hub_server.url), cwd=tmp_path)
    files = set(hub_server.list_files("user/tiny-mlm"))
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "README.md"} <= files, files
    assert json.loads(hub_server.read_file("user/tiny-mlm", "config.json"))["model_type"] == "posformers-roformer"
    assert hub_server.read_file("user/tiny-mlm", "model.safetensors") == (output / "model.safetensors").read_bytes()


# ---------------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------------


def run_refused(argv) -> str:
    with pytest.raises(SystemExit) as refusal:
        run_pretrain.main(argv)
    return str(refusal.value.code)


def test_bad_input_is_refused_with_a_clear_message(corpus, wordpiece, tmp_path, capsys):
    tiny = ["--model_type", "posformers-roformer", "--config_overrides", TINY["posformers-roformer"],
            "--tokenizer_name", str(wordpiece[1])]  # fmt: skip
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\n", encoding="utf-8")
    message = run_refused([*tiny, "--train_file", str(blank), *train_args(tmp_path / "a", steps=1)])
    assert "error (data)" in message and "blank.txt" in message and "no text" in message

    missing = tmp_path / "missing.txt"
    message = run_refused([*tiny, "--train_file", str(missing), *train_args(tmp_path / "b", steps=1)])
    assert "missing.txt" in message and "no such file" in message

    code = run_refused([*tiny, "--objective", "electra", *data_args(corpus), *train_args(tmp_path / "c", steps=1)])
    assert code == "2" and "invalid choice: 'electra'" in capsys.readouterr().err

    message = run_refused(["--objective", "rtd", *tiny, *data_args(corpus), *train_args(tmp_path / "d", steps=1)])
    assert "--objective rtd trains posformers-deberta" in message and "posformers-roformer" in message

    message = run_refused([*tiny, "--streaming", "--train_file", str(corpus["train"]), "--do_train",
                           "--output_dir", str(tmp_path / "e"), *QUIET])  # fmt: skip
    assert "--streaming needs --max_steps" in message

    message = run_refused([*tiny, *data_args(corpus, max_seq_length=128), *train_args(tmp_path / "f", steps=1)])
    assert "max_position_embeddings (64)" in message

    table = tmp_path / "table.jsonl"
    table.write_text('{"sentence": "a fine film"}\n', encoding="utf-8")
    message = run_refused([*tiny, "--train_file", str(table), *train_args(tmp_path / "g", steps=1)])
    assert "table.jsonl" in message and "column 'text'" in message and "--text_column" in message


def test_several_text_columns_make_one_document_per_row(tmp_path):
    """--text_column question,sentence (as posformers-glue's --text_columns): each row's texts, joined by a space,
    are one document; in memory and streamed alike."""
    table = tmp_path / "qnli.csv"
    rows = 'question,sentence,label\nWho wrote it?,"She did, in 1990.",0\n,Only a sentence.,1\n,,0\n'
    table.write_text(rows, encoding="utf-8")
    expected = ["Who wrote it? She did, in 1990.", "Only a sentence."]  # the row without text is dropped
    for streaming in (False, True):
        data_args = PretrainDataArguments(
            train_file=[str(table)], validation_file=[str(table)], text_column="question, sentence", streaming=streaming
        )
        corpus = load_corpus(data_args, seed=0)
        for split in ("train", "validation"):
            assert [row for row in corpus[split]] == [{"text": text} for text in expected], (streaming, split)
    with pytest.raises(DataError, match="answer"):
        load_corpus(PretrainDataArguments(train_file=[str(table)], text_column="question,answer"), seed=0)


def test_distill_from_the_command_line(corpus, wordpiece, tmp_path):
    """--objective distill wires finetune/pretrain_distill.py: a LittleBird student learns a teacher's distributions."""
    from posformers import RoFormerConfig, RoFormerForMaskedLM

    torch.manual_seed(0)
    # a teacher with confident (far from uniform) predictions, so there is something to learn
    teacher_config = RoFormerConfig(
        vocab_size=len(wordpiece[0]), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, initializer_range=0.3,
    )  # fmt: skip
    RoFormerForMaskedLM(teacher_config).save_pretrained(tmp_path / "teacher")
    output = tmp_path / "out"
    metrics = run_pretrain.main(
        ["--objective", "distill", "--model_type", "littlebird", "--config_overrides", TINY["littlebird"],
         "--tokenizer_name", str(wordpiece[1]), "--teacher_name_or_path", str(tmp_path / "teacher"),
         "--padding_insertion_max_length", "96", "--padding_insertion_mean_run_length", "4",
         *data_args(corpus), *train_args(output)]
    )  # fmt: skip
    start, end = eval_history(output, "eval_loss")[0], metrics["eval_loss"]
    print(f"distill: held-out distillation loss {start:.3f} -> {end:.3f}")
    assert end < 0.8 * start and 0 <= metrics["eval_accuracy_vs_teacher"] <= 1
    assert AutoModelForMaskedLM.from_pretrained(output).config.model_type == "littlebird"
