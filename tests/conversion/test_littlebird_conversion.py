"""`posformers-convert littlebird --from {bert,roberta}` on teachers written in their official layouts, random weights.

bert: Google's bert-base-uncased as published (pytorch_model.bin of BertForPreTraining: LayerNorm `gamma`/`beta`,
    the tied decoder stored, the next-sentence head), vocab.txt from tests/data/vocab/bert-base-uncased.
roberta: roberta-base as published (RobertaForMaskedLM plus the unused pooler, the decoder stored), GPT-2 BPE files
    from tests/data/vocab/gpt2.
"""

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import save_file

import posformers

from .conftest import (
    VOCAB_DIR,
    check_overwrite_behaviour,
    cli_failure,
    convert_in_process,
    load_all_with_remote_code,
    run_in_process,
)

VERIFY_TOLERANCE = 1e-5
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
TEXT = "LittleBird reads long documents quickly."


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random values in every parameter (LayerNorms and biases included), so that any mix-up of tensors shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            offset = 1.0 if "LayerNorm.weight" in name or "layer_norm.weight" in name else 0.0
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2 + offset)
    return model.eval()


def write_bert_release(directory, state_edit=None):
    """bert-base-uncased's layout: BertForPreTraining weights in pytorch_model.bin with `gamma`/`beta` LayerNorm names
    (Google's TF conversion), config.json, vocab.txt, tokenizer_config.json. Returns the model."""
    directory.mkdir(parents=True)
    vocab = VOCAB_DIR / "bert-base-uncased" / "vocab.txt"
    config = transformers.BertConfig(vocab_size=len(vocab.read_text().splitlines()), **TINY)
    torch.manual_seed(0)
    model = randomize(transformers.BertForPreTraining(config), seed=1)
    state = {}
    for key, value in model.state_dict().items():
        if ".LayerNorm." in key:
            key = key.replace(".weight", ".gamma").replace(".bias", ".beta")
        state[key] = value
    assert "cls.predictions.decoder.weight" in state and "cls.seq_relationship.weight" in state
    if state_edit:
        state_edit(state)
    torch.save(state, directory / "pytorch_model.bin")
    config.to_json_file(directory / "config.json")
    shutil.copy(vocab, directory / "vocab.txt")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return model


def write_roberta_release(directory, state_edit=None):
    """roberta-base's layout: RobertaForMaskedLM weights plus the pooler it never uses, the decoder stored beside the
    embeddings it is tied to, config.json (type_vocab_size 1, pad 1), GPT-2 BPE vocab.json + merges.txt."""
    directory.mkdir(parents=True)
    config = transformers.RobertaConfig(vocab_size=50265, type_vocab_size=1, max_position_embeddings=66, **TINY)
    torch.manual_seed(0)
    model = randomize(transformers.RobertaForMaskedLM(config), seed=2)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    generator = torch.Generator().manual_seed(3)
    state["roberta.pooler.dense.weight"] = torch.randn(32, 32, generator=generator)
    state["roberta.pooler.dense.bias"] = torch.randn(32, generator=generator)
    if state_edit:
        state_edit(state)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config.to_json_file(directory / "config.json")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(VOCAB_DIR / "gpt2" / name, directory / name)
    return model


def assert_verified(result) -> dict[str, float]:
    table = result.verification()
    assert table and all(diff <= VERIFY_TOLERANCE for diff in table.values()), table
    assert "copied tensors identical to the teacher's" in result.stdout
    return table


def convert_once(tmp_path_factory, name: str, write_release, args: list):
    """Write a teacher release and convert it, once per module: (args, output, result, teacher)."""
    base = tmp_path_factory.mktemp(name)
    source, output = base / "source", base / name
    teacher = write_release(source)
    args = [*args, "--source", source, "--output", output]
    return args, output, convert_in_process(args).check(), teacher


@pytest.fixture(scope="module")
def bert_converted(tmp_path_factory):
    args = ["littlebird", "--from", "bert", "--block-size", "16", "--pack-length", "8"]
    return convert_once(tmp_path_factory, "littlebird-from-bert", write_bert_release, args)


@pytest.fixture(scope="module")
def roberta_converted(tmp_path_factory):
    args = ["littlebird", "--from", "roberta"]
    return convert_once(tmp_path_factory, "littlebird-from-roberta", write_roberta_release, args)


def test_bert_release_converts_loads_and_keeps_every_copied_tensor(bert_converted):
    args, output, result, teacher = bert_converted
    source = args[args.index("--source") + 1]
    table = assert_verified(result)
    assert set(table) == {"embeddings (teacher without positions)", "MLM head logits (same hidden states)"}
    for reason in ("absolute position table", "next-sentence-prediction head", "pooler", "tied to the word embeddings"):
        assert reason in result.stdout, reason
    assert "new (initialised fresh)" in result.stdout and "pack_attention" in result.stdout

    model = transformers.AutoModelForMaskedLM.from_pretrained(output).eval()
    assert isinstance(model, posformers.LittleBirdForMaskedLM)
    assert (model.config.block_size, model.config.pack_length) == (16, 8)
    ours, theirs = model.state_dict(), teacher.state_dict()
    for key in (
        "embeddings.word_embeddings.weight",
        "encoder.layer.1.attention.self.key.bias",
        "embeddings.LayerNorm.weight",
    ):
        assert torch.equal(ours[f"littlebird.{key}"], theirs[f"bert.{key}"]), key
    assert torch.equal(
        ours["cls.predictions.transform.LayerNorm.bias"], theirs["cls.predictions.transform.LayerNorm.bias"]
    )
    assert model.littlebird.embeddings.pack_embeddings.shape == (8, 32)

    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert tokenizer.tokenize(TEXT) == transformers.AutoTokenizer.from_pretrained(source).tokenize(TEXT)


def test_roberta_release_maps_its_lm_head_and_drops_the_pooler(roberta_converted):
    args, output, result, teacher = roberta_converted
    source = args[args.index("--source") + 1]
    assert_verified(result)
    assert "pooler" in result.stdout and "absolute position table" in result.stdout

    model = posformers.LittleBirdForMaskedLM.from_pretrained(output).eval()
    assert (model.config.type_vocab_size, model.config.pad_token_id) == (1, 1)
    assert (model.config.block_size, model.config.pack_length) == (64, 64)
    ours, theirs = model.state_dict(), teacher.state_dict()
    pairs = {
        "cls.predictions.transform.dense.weight": "lm_head.dense.weight",
        "cls.predictions.transform.LayerNorm.weight": "lm_head.layer_norm.weight",
        "cls.predictions.bias": "lm_head.bias",
        "littlebird.embeddings.token_type_embeddings.weight": "roberta.embeddings.token_type_embeddings.weight",
        "littlebird.encoder.layer.0.output.LayerNorm.bias": "roberta.encoder.layer.0.output.LayerNorm.bias",
    }
    for our_key, their_key in pairs.items():
        assert torch.equal(ours[our_key], theirs[their_key]), our_key
    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert tokenizer.tokenize(TEXT) == transformers.AutoTokenizer.from_pretrained(source).tokenize(TEXT)


def test_outputs_load_with_remote_code_and_respect_overwrite(
    bert_converted, roberta_converted, workdir, convert, convert_here
):
    """Both outputs in one fresh process without posformers (trust_remote_code), with the teachers' tokenizers; then
    --overwrite: through the console command for the BERT one, in this process for the RoBERTa one."""
    jobs, expected = [], []
    for _, output, _, _ in (bert_converted, roberta_converted):
        model = transformers.AutoModelForMaskedLM.from_pretrained(output).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(output)
        inputs = dict(tokenizer([TEXT, "short one"], padding=True, return_tensors="pt"))
        with torch.no_grad():
            expected.append(model(**inputs).logits)
        jobs.append((output, "AutoModelForMaskedLM", inputs))
    for remote, logits in zip(load_all_with_remote_code(jobs, workdir), expected, strict=True):
        assert (remote["logits"] - logits).abs().max().item() <= VERIFY_TOLERANCE
    (bert_args, bert_output, *_), (roberta_args, roberta_output, *_) = bert_converted, roberta_converted
    check_overwrite_behaviour(convert, bert_args, bert_output)
    check_overwrite_behaviour(convert_here, roberta_args, roberta_output)


def test_bare_encoder_gives_a_littlebird_model(workdir, capsys):
    source, output = workdir / "bert", workdir / "out"
    config = transformers.BertConfig(vocab_size=120, **TINY)
    torch.manual_seed(0)
    randomize(transformers.BertModel(config), seed=4).save_pretrained(source)
    code, printed = run_in_process(capsys, "littlebird", "--from", "bert", "--source", source, "--output", output)
    assert code == 0, printed
    assert "MLM head logits" not in printed and "embeddings (teacher without positions)" in printed
    assert "no tokenizer written" in printed
    model = transformers.AutoModel.from_pretrained(output)
    assert type(model) is posformers.LittleBirdModel


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s: s.__setitem__("bert.encoder.layer.0.attention.self.rotary.weight", torch.ones(2)), "rotary"),
        (lambda s: s.pop("bert.encoder.layer.1.output.dense.weight"), "littlebird.encoder.layer.1.output.dense.weight"),
        (lambda s: s.__setitem__("cls.predictions.decoder.weight", s["cls.predictions.decoder.weight"] + 1), "tied"),
    ],
    ids=["extra", "missing", "untied-decoder"],
)
def test_accounting_stops_with_the_key_named(edit, named, workdir, capsys):
    source, output = workdir / "bert", workdir / "out"

    def state_edit(state):
        state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"].clone()
        edit(state)

    write_bert_release(source, state_edit)
    printed = cli_failure(capsys, "littlebird", "--from", "bert", "--source", source, "--output", output)
    assert named in printed, printed


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda s: s.__setitem__("roberta.encoder.layer.0.attention.self.distance_embedding.weight", torch.ones(2)),
            "distance_embedding",
        ),
        (
            lambda s: s.pop("roberta.encoder.layer.1.attention.output.LayerNorm.bias"),
            "littlebird.encoder.layer.1.attention.output.LayerNorm.bias",
        ),
    ],
    ids=["extra", "missing"],
)
def test_roberta_accounting_stops_with_the_key_named(edit, named, workdir, capsys):
    source, output = workdir / "roberta", workdir / "out"
    write_roberta_release(source, edit)
    printed = cli_failure(capsys, "littlebird", "--from", "roberta", "--source", source, "--output", output)
    assert named in printed, printed


def test_wrong_source_format_is_refused(workdir, capsys):
    source = workdir / "bert"
    write_bert_release(source)
    printed = cli_failure(capsys, "littlebird", "--from", "roberta", "--source", source, "--output", workdir / "o")
    assert "model_type 'bert'" in printed, printed


def test_verification_catches_a_wrong_mapping(workdir, capsys, monkeypatch):
    """A converter that swapped two LayerNorm tensors would be caught by the comparison with the teacher."""
    from posformers.conversion import littlebird

    source, output = workdir / "bert", workdir / "out"
    write_bert_release(source)
    original_key_map = littlebird.key_map

    def swapped(*args):
        keys = original_key_map(*args)
        rules = [(pattern.pattern, replacement) for pattern, replacement in keys.rules]
        swap = {"weight": "bias", "bias": "weight"}
        rules.insert(
            0,
            (
                r"bert\.embeddings\.LayerNorm\.(weight|bias)",
                lambda m, t: {f"littlebird.embeddings.LayerNorm.{swap[m[1]]}": t},
            ),
        )
        return littlebird.core.KeyMap(rules, {p.pattern: r for p, r in keys.dropped})

    monkeypatch.setattr(littlebird, "key_map", swapped)
    printed = cli_failure(capsys, "littlebird", "--from", "bert", "--source", source, "--output", output)
    assert "differs from the teacher's" in printed, printed
