"""`posformers-convert roformer --from {tf,hf,v2}` on sources written in the exact official formats, random weights.

tf: a real TF1 checkpoint (tf.compat.v1 Saver) with the ZhuiyiTechnology/bert4keras variable names, made from a
    transformers RoFormer whose outputs the converted model must reproduce.
hf: directories as transformers' RoFormer and junnyu/roformer_chinese_base publish them (pytorch_model.bin with the
    frozen position table and the tied decoder; or safetensors with a classification head).
v2: junnyu's RoFormer-v2 layout (no biases, no norm parameters); transformers has no v2 class, so the converted model
    is checked against a plain reference computation of RoFormer-v2 written below from its equations.
"""

import json
import shutil

import pytest
import torch
import transformers
from helpers.modeling import sim_generation_reference

import posformers

from .conftest import (
    VOCAB_DIR,
    check_overwrite_behaviour,
    cli_failure,
    convert_in_process,
    load_all_with_remote_code,
    load_with_remote_code,
)

VERIFY_TOLERANCE = 1e-5
CHAR_VOCAB = VOCAB_DIR / "bert-base-chinese" / "vocab.txt"
WORD_DIR = VOCAB_DIR / "roformer-chinese-base"
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
TEXT = "今天天气非常好。"


def vocab_size(vocab_file) -> int:
    return len(vocab_file.read_text(encoding="utf-8").rstrip("\n").split("\n"))  # some tokens are line breaks


def sample_inputs(config, batch: int = 2, length: int = 9) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    input_ids = torch.randint(1, config.vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 4:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random values everywhere, LayerNorms and biases included, so a mix-up of any two tensors shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" not in name:
                parameter.copy_(
                    torch.randn(parameter.shape, generator=generator) * 0.2
                    + (1.0 if "LayerNorm.weight" in name else 0.0)
                )
    return model.eval()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, mask=None, tolerance: float = VERIFY_TOLERANCE):
    if mask is not None:
        keep = mask.to(actual.dtype)[..., None]
        actual, expected = actual * keep, expected * keep
    assert actual.shape == expected.shape
    diff = (actual - expected).abs().max().item()
    assert diff <= tolerance, diff


def assert_verified(result, expected_outputs) -> None:
    table = result.verification()
    assert sorted(table) == sorted(expected_outputs), table
    assert all(diff <= VERIFY_TOLERANCE for diff in table.values()), table


# ---------------------------------------------------------------------------------------------------------------------
# --from tf
# ---------------------------------------------------------------------------------------------------------------------


def tf_variables(reference: transformers.RoFormerForMaskedLM) -> dict:
    """The bert4keras/Google-BERT variables of `reference`: TF names, kernels stored (in, out)."""
    state = {key: value.numpy() for key, value in reference.state_dict().items()}
    variables = {
        "bert/embeddings/word_embeddings": state["roformer.embeddings.word_embeddings.weight"],
        "bert/embeddings/token_type_embeddings": state["roformer.embeddings.token_type_embeddings.weight"],
        "bert/embeddings/LayerNorm/gamma": state["roformer.embeddings.LayerNorm.weight"],
        "bert/embeddings/LayerNorm/beta": state["roformer.embeddings.LayerNorm.bias"],
        "cls/predictions/transform/dense/kernel": state["cls.predictions.transform.dense.weight"].T,
        "cls/predictions/transform/dense/bias": state["cls.predictions.transform.dense.bias"],
        "cls/predictions/transform/LayerNorm/gamma": state["cls.predictions.transform.LayerNorm.weight"],
        "cls/predictions/transform/LayerNorm/beta": state["cls.predictions.transform.LayerNorm.bias"],
        "cls/predictions/output_bias": state["cls.predictions.bias"],
    }
    if "roformer.embeddings_project.weight" in state:
        variables["bert/encoder/embedding_hidden_mapping_in/kernel"] = state["roformer.embeddings_project.weight"].T
        variables["bert/encoder/embedding_hidden_mapping_in/bias"] = state["roformer.embeddings_project.bias"]
    for i in range(reference.config.num_hidden_layers):
        ours, theirs = f"roformer.encoder.layer.{i}.", f"bert/encoder/layer_{i}/"
        for tf_scope, module in (
            ("attention/self/query", "attention.self.query"),
            ("attention/self/key", "attention.self.key"),
            ("attention/self/value", "attention.self.value"),
            ("attention/output/dense", "attention.output.dense"),
            ("intermediate/dense", "intermediate.dense"),
            ("output/dense", "output.dense"),
        ):
            variables[f"{theirs}{tf_scope}/kernel"] = state[f"{ours}{module}.weight"].T
            variables[f"{theirs}{tf_scope}/bias"] = state[f"{ours}{module}.bias"]
        for tf_scope, module in (
            ("attention/output/LayerNorm", "attention.output.LayerNorm"),
            ("output/LayerNorm", "output.LayerNorm"),
        ):
            variables[f"{theirs}{tf_scope}/gamma"] = state[f"{ours}{module}.weight"]
            variables[f"{theirs}{tf_scope}/beta"] = state[f"{ours}{module}.bias"]
    return variables


def write_tf_checkpoint(folder, variables: dict) -> None:
    """A TF1 checkpoint as bert4keras releases are: `bert_model.ckpt.{index,data-*}` with plain variable names."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        tf_vars = [tf.compat.v1.Variable(value, name=name) for name, value in variables.items()]
        saver = tf.compat.v1.train.Saver(tf_vars)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(folder / "bert_model.ckpt"), write_meta_graph=False)


@pytest.fixture(scope="module")
def tf_release(tmp_path_factory):
    """chinese_roformer-sim-char_L-6_H-384_A-6 in miniature: char vocab, embedding projection, pooler, optimizer
    slots and a global step; and the transformers RoFormer it was made from."""
    import numpy as np

    config = transformers.RoFormerConfig(
        vocab_size=vocab_size(CHAR_VOCAB), embedding_size=16, max_position_embeddings=512, **TINY
    )
    reference = randomize(transformers.RoFormerForMaskedLM(config), seed=11)
    variables = tf_variables(reference)
    generator = np.random.default_rng(0)
    variables["bert/pooler/dense/kernel"] = (0.2 * generator.standard_normal((32, 32))).astype("float32")  # (in, out)
    variables["bert/pooler/dense/bias"] = (0.2 * generator.standard_normal(32)).astype("float32")
    variables["bert/encoder/layer_0/attention/self/query/kernel/adam_m"] = generator.standard_normal((32, 32)).astype(
        "float32"
    )
    variables["global_step"] = np.int64(1000)
    folder = tmp_path_factory.mktemp("tf") / "chinese_roformer-sim-char_L-2_H-32_A-4"
    write_tf_checkpoint(folder, variables)
    bert_config = {
        "attention_probs_dropout_prob": 0.1, "directionality": "bidi", "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": 32, "embedding_size": 16, "initializer_range": 0.02,
        "intermediate_size": 48, "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 2,
        "pooler_fc_size": 32, "pooler_num_attention_heads": 4, "pooler_num_fc_layers": 3, "pooler_size_per_head": 8,
        "pooler_type": "first_token_transform", "type_vocab_size": 2, "vocab_size": config.vocab_size,
    }  # fmt: skip
    (folder / "bert_config.json").write_text(json.dumps(bert_config, indent=2))
    shutil.copy(CHAR_VOCAB, folder / "vocab.txt")
    return folder, reference, variables


def convert_once(tmp_path_factory, name: str, args: list):
    """Run the conversion for a module-scoped output `name`; returns (args, output, result)."""
    base = tmp_path_factory.mktemp(name)
    output = base / name
    args = [*args, "--output", output]
    return args, output, convert_in_process(args).check()


@pytest.fixture(scope="module")
def tf_converted(tf_release, tmp_path_factory):
    return convert_once(
        tmp_path_factory,
        "roformer-sim-from-tf",
        ["roformer", "--from", "tf", "--source", tf_release[0] / "bert_model.ckpt"],
    )


def test_tf_checkpoint_converts_and_reproduces_the_model_it_came_from(tf_release, tf_converted):
    _, reference, variables = tf_release
    _, output, result = tf_converted
    assert_verified(result, {"last hidden state", "logits", "pooler output"})
    assert "optimizer state" in result.stdout
    assert "pooler: bert/pooler/dense -> roformer.pooler.dense, pooler_activation='linear'" in result.stdout

    model = transformers.AutoModelForMaskedLM.from_pretrained(output)
    assert isinstance(model, posformers.RoFormerForMaskedLM)
    assert model.config.embedding_size == 16
    assert model.config.bidirectional_prompt  # a RoFormer-sim release: generating, it reads the prompt bidirectionally
    inputs = sample_inputs(model.config)
    with torch.no_grad():
        expected, actual = reference(**inputs).logits, model(**inputs).logits
    assert_close(actual, expected, inputs["attention_mask"])

    assert model.config.add_pooling_layer and model.config.pooler_activation == "linear"
    # RoFormer-sim's sentence vector: [CLS] through the TF pooler kernel (in, out) and bias, no activation
    kernel, bias = (torch.from_numpy(variables[f"bert/pooler/dense/{name}"]) for name in ("kernel", "bias"))
    with torch.no_grad():
        cls = reference(**inputs, output_hidden_states=True).hidden_states[-1][:, 0]
        pooled = transformers.AutoModel.from_pretrained(output)(**inputs).pooler_output
    assert_close(pooled, cls @ kernel + bias)

    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert tokenizer.tokenize(TEXT) == list(TEXT)  # a character vocab: one token per character
    assert tokenizer(TEXT)["input_ids"] == transformers.BertTokenizer(str(CHAR_VOCAB))(TEXT)["input_ids"]


def test_tf_accounting_names_extra_and_missing_variables(tf_release, workdir, capsys):
    _, _, variables = tf_release
    extra = dict(variables, **{"bert/encoder/layer_1/attention/self/relative_bias": variables["global_step"]})
    write_tf_checkpoint(workdir / "extra", extra)
    shutil.copy(tf_release[0] / "bert_config.json", workdir / "extra")
    error = cli_failure(
        capsys, "roformer", "--from", "tf", "--source", workdir / "extra", "--output", workdir / "o1", "--no-tokenizer"
    )
    assert "['bert/encoder/layer_1/attention/self/relative_bias']" in error

    missing = {key: value for key, value in variables.items() if key != "bert/encoder/layer_1/output/dense/bias"}
    write_tf_checkpoint(workdir / "missing", missing)
    shutil.copy(tf_release[0] / "bert_config.json", workdir / "missing")
    error = cli_failure(
        capsys,
        "roformer",
        "--from",
        "tf",
        "--source",
        workdir / "missing",
        "--output",
        workdir / "o2",
        "--no-tokenizer",
    )
    assert "missing" in error and "roformer.encoder.layer.1.output.dense.bias" in error


def test_bare_model_folder_and_tf_checkpoint_convert_to_the_same_model(tf_release, workdir, convert_here):
    """A bare RoFormerModel saved by transformers 5 (names without `roformer.`) converts with --from hf, and a TF
    checkpoint without the MLM head (hence a bare model) converts to the same tensor names and outputs."""
    bare = randomize(transformers.RoFormerModel(tf_release[1].config), seed=18)
    hf_source, tf_source = workdir / "roformer-bare", workdir / "roformer-bare-tf"
    bare.save_pretrained(hf_source)
    mlm = transformers.RoFormerForMaskedLM(bare.config)
    mlm.roformer.load_state_dict(bare.state_dict())
    write_tf_checkpoint(tf_source, {k: v for k, v in tf_variables(mlm).items() if not k.startswith("cls/")})
    shutil.copy(tf_release[0] / "bert_config.json", tf_source)
    reference = transformers.RoFormerModel.from_pretrained(hf_source).eval()
    inputs = sample_inputs(reference.config)
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
    names = []
    for source in (hf_source, tf_source):
        output = workdir / f"{source.name}-converted"
        fmt = "hf" if source == hf_source else "tf"
        args = ["roformer", "--from", fmt, "--source", source, "--output", output, "--no-tokenizer"]
        assert_verified(convert_here(*args).check(), {"last hidden state"})
        model = transformers.AutoModel.from_pretrained(output).eval()
        assert type(model) is posformers.RoFormerModel
        with torch.no_grad():
            assert_close(model(**inputs).last_hidden_state, expected, inputs["attention_mask"])
        names.append(sorted(model.state_dict()))
    assert names[0] == names[1] and "embeddings.word_embeddings.weight" in names[0]


def miswired_pooler(key_map_factory, pooler_key: str, wrong):
    """`key_map_factory` with the rule for `pooler_key` replaced by `wrong(match, tensor) -> {name: tensor}`."""

    def factory(*args, **kwargs):
        key_map = key_map_factory(*args, **kwargs)
        key_map.rules = [(p, wrong if p.fullmatch(pooler_key) else r) for p, r in key_map.rules]
        return key_map

    return factory


def test_verification_catches_a_wrongly_mapped_tf_pooler(tf_release, workdir, capsys, monkeypatch):
    """The pooler row is checked against the TF tensors as stored, so a kernel left untransposed (the layout bug a
    square (hidden, hidden) shape cannot reveal) stops the conversion."""
    from posformers.conversion import roformer as converter

    folder = tf_release[0]
    untransposed = miswired_pooler(
        converter.tf_key_map, "bert/pooler/dense/kernel", lambda m, t: {"roformer.pooler.dense.weight": t}
    )
    monkeypatch.setattr(converter, "tf_key_map", untransposed)
    args = ["roformer", "--from", "tf", "--source", folder, "--output", workdir / "o", "--no-tokenizer"]
    error = cli_failure(capsys, *args)
    assert "pooler output differs" in error and "last hidden state differs" not in error, error


# ---------------------------------------------------------------------------------------------------------------------
# --from hf
# ---------------------------------------------------------------------------------------------------------------------


def hf_config(head: str, **overrides) -> transformers.RoFormerConfig:
    """junnyu/roformer_chinese_base's config.json at a tiny size."""
    fields = json.loads((WORD_DIR / "config.json").read_text())
    fields.update(TINY, embedding_size=TINY["hidden_size"], architectures=[head], **overrides)
    fields.pop("model_type")
    return transformers.RoFormerConfig(**fields)


def write_hub_release(folder, reference) -> None:
    """As junnyu/roformer_chinese_base is published: config.json, vocab.txt and a pytorch_model.bin that holds every
    tensor (the frozen position table and the tied decoder included)."""
    folder.mkdir(parents=True)
    reference.config.save_pretrained(folder)
    torch.save(dict(reference.state_dict()), folder / "pytorch_model.bin")
    shutil.copy(WORD_DIR / "vocab.txt", folder / "vocab.txt")


def test_hf_hub_checkpoint_converts_pushes_and_loads_with_remote_code(workdir, convert, hub_server):
    reference = randomize(transformers.RoFormerForMaskedLM(hf_config("RoFormerForMaskedLM")), seed=12)
    assert "roformer.encoder.embed_positions.weight" in reference.state_dict()
    source, output = workdir / "roformer_chinese_base", workdir / "converted"
    write_hub_release(source, reference)
    repo_id = "posformers-test/roformer-chinese-base-converted"
    result = convert(
        "roformer", "--from", "hf", "--source", source, "--output", output, "--push-to-hub", repo_id,
        endpoint=hub_server.url,
    ).check()  # fmt: skip
    assert_verified(result, {"last hidden state", "logits"})
    assert "embed_positions.weight" in result.stdout and "checked" in result.stdout

    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert type(tokenizer).__name__ == "RoFormerTokenizer"
    assert tokenizer.tokenize(TEXT) == ["今", "天", "天", "气", "非常", "好", "。"]  # jieba words of the real vocab

    inputs = sample_inputs(reference.config)
    with torch.no_grad():
        expected = reference(**inputs).logits
    assert_close(
        transformers.AutoModelForMaskedLM.from_pretrained(output)(**inputs).logits.detach(),
        expected,
        inputs["attention_mask"],
    )
    pushed = set(hub_server.list_files(repo_id))
    assert {"config.json", "model.safetensors", "modeling_roformer.py", "README.md", "tokenizer.json"} <= pushed
    pushed_card = hub_server.read_file(repo_id, "README.md").decode()
    assert "## Conversion" in pushed_card and "`roformer_chinese_base`" in pushed_card
    remote = load_with_remote_code(output, "AutoModelForMaskedLM", inputs, workdir)
    assert_close(remote["logits"], expected, inputs["attention_mask"])


def test_hf_classification_checkpoint_keeps_its_head(workdir, convert_here):
    config = hf_config("RoFormerForSequenceClassification", num_labels=3, vocab_size=vocab_size(CHAR_VOCAB))
    reference = randomize(transformers.RoFormerForSequenceClassification(config), seed=13)
    source, output = workdir / "roformer_chinese_char_base-cls", workdir / "converted"
    reference.save_pretrained(source)  # transformers 5 writes safetensors
    shutil.copy(CHAR_VOCAB, source / "vocab.txt")
    args = ["roformer", "--from", "hf", "--source", source, "--output", output]
    result = convert_here(*args).check()
    assert_verified(result, {"last hidden state", "logits"})
    check_overwrite_behaviour(convert_here, args, output)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(output)
    assert isinstance(model, posformers.RoFormerForSequenceClassification) and model.config.num_labels == 3
    inputs = sample_inputs(config)
    with torch.no_grad():
        assert_close(model(**inputs).logits, reference(**inputs).logits)


def write_sim_release(folder, seed: int = 16, **config_overrides):
    """As junnyu/roformer_chinese_sim_char_base is published: a RoFormerForCausalLM whose config.json says
    `"is_decoder": true, "eos_token_id": 102, "pooler_activation": "linear"`, and a pytorch_model.bin that holds the
    pooler `roformer.pooler.dense.*` next to the LM head. Returns (reference causal LM, pooler weight, pooler bias)."""
    fields = dict(is_decoder=True, eos_token_id=102, pooler_activation="linear", vocab_size=vocab_size(CHAR_VOCAB))
    config = hf_config("RoFormerForCausalLM", **{**fields, **config_overrides})
    reference = randomize(transformers.RoFormerForCausalLM(config), seed=seed)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(32, 32, generator=generator) * 0.2  # (out, in), as torch stores it
    bias = torch.randn(32, generator=generator) * 0.2
    folder.mkdir(parents=True)
    reference.config.save_pretrained(folder)
    state = dict(reference.state_dict(), **{"roformer.pooler.dense.weight": weight, "roformer.pooler.dense.bias": bias})
    torch.save(state, folder / "pytorch_model.bin")
    shutil.copy(CHAR_VOCAB, folder / "vocab.txt")
    return reference, weight, bias


def test_hf_sim_checkpoint_keeps_its_pooler(workdir, convert_here, capsys, monkeypatch):
    source, output = workdir / "roformer_chinese_sim_char_base", workdir / "converted"
    reference, weight, bias = write_sim_release(source)
    assert "pooler_activation" in json.loads((source / "config.json").read_text())
    result = convert_here("roformer", "--from", "hf", "--source", source, "--output", output).check()
    assert_verified(result, {"last hidden state", "logits", "pooler output"})
    assert "pooler_activation='linear'" in result.stdout

    model = transformers.AutoModelForCausalLM.from_pretrained(output)
    assert isinstance(model, posformers.RoFormerForCausalLM) and model.config.is_decoder
    assert model.config.add_pooling_layer and model.config.pooler_activation == "linear"
    # generation as junnyu's RoFormerForCausalLM does it: the prompt bidirectionally, generated tokens type 1
    assert model.config.bidirectional_prompt and "bidirectional_prompt=True" in result.stdout
    prompt = sample_inputs(reference.config)["input_ids"][:, :5]
    with torch.no_grad():
        expected_tokens, expected_logits = sim_generation_reference(reference.eval(), prompt, steps=4)
        generated = model.generate(
            prompt, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    assert torch.equal(generated.sequences, expected_tokens)
    for step, logits in enumerate(generated.logits):
        assert_close(logits, expected_logits[step][:, -1])
    # the sentence vector: the encoder read bidirectionally (as junnyu's code does without a cache), [CLS] pooled
    inputs = sample_inputs(reference.config)
    encoder = transformers.RoFormerModel.from_pretrained(source, is_decoder=False).eval()
    with torch.no_grad():
        expected = encoder(**inputs).last_hidden_state[:, 0] @ weight.T + bias
        pooled = transformers.AutoModel.from_pretrained(output, is_decoder=False)(**inputs).pooler_output
    assert_close(pooled, expected)

    # no pooler_activation in config.json: junnyu's default, tanh; --config wins over both
    raw = json.loads((source / "config.json").read_text())
    raw.pop("pooler_activation")
    (source / "config.json").write_text(json.dumps(raw))
    for extra, activation in (([], "tanh"), (["--config", '{"pooler_activation": "gelu"}'], "gelu")):
        args = ["roformer", "--from", "hf", "--source", source, "--output", workdir / activation, "--no-tokenizer"]
        result = convert_here(*args, *extra).check()
        assert_verified(result, {"last hidden state", "logits", "pooler output"})
        assert posformers.RoFormerConfig.from_pretrained(workdir / activation).pooler_activation == activation
    result = convert_here(*args[:-2], workdir / "off", "--config", '{"add_pooling_layer": false}').check()
    assert_verified(result, {"last hidden state", "logits"})
    assert posformers.RoFormerConfig.from_pretrained(workdir / "off").bidirectional_prompt  # still junnyu's config
    assert "roformer.pooler.dense.weight" in result.stdout and "add_pooling_layer to false" in result.stdout
    assert not posformers.RoFormerConfig.from_pretrained(workdir / "off").add_pooling_layer

    # a pooler weight mapped transposed is caught by the pooler row (which uses the source tensors as stored)
    from posformers.conversion import roformer as converter

    def transpose_weight(match, tensor):
        return {match.expand(r"\1"): tensor.T.contiguous() if tensor.dim() == 2 else tensor}

    transposed = miswired_pooler(converter.hf_key_map, "roformer.pooler.dense.weight", transpose_weight)
    monkeypatch.setattr(converter, "hf_key_map", transposed)
    error = cli_failure(capsys, *args[:-2], workdir / "bad")
    assert "pooler output differs" in error, error


def test_hf_decoder_from_transformers_stays_strictly_causal(workdir, convert_here):
    """transformers' RoFormerForCausalLM is causal everywhere; its folder (no pooler, no pooler_activation) converts
    with bidirectional_prompt off, verified against transformers' causal logits."""
    config = hf_config("RoFormerForCausalLM", is_decoder=True, vocab_size=vocab_size(CHAR_VOCAB))
    reference = randomize(transformers.RoFormerForCausalLM(config), seed=19)
    source = workdir / "roformer-causal"
    reference.save_pretrained(source)
    args = ["roformer", "--from", "hf", "--source", source, "--output", workdir / "out", "--no-tokenizer"]
    result = convert_here(*args).check()
    assert_verified(result, {"last hidden state", "logits"})
    assert "bidirectional_prompt" not in result.stdout
    model = transformers.AutoModelForCausalLM.from_pretrained(workdir / "out")
    assert model.config.is_decoder and not model.config.bidirectional_prompt
    inputs = sample_inputs(config)
    with torch.no_grad():
        assert_close(model(**inputs).logits, reference(**inputs).logits, inputs["attention_mask"])


def test_hf_accounting_and_position_table_checks(workdir, capsys):
    reference = randomize(transformers.RoFormerForMaskedLM(hf_config("RoFormerForMaskedLM")), seed=14)
    cases = {
        "extra": (
            {"roformer.encoder.layer.0.attention.self.rel_bias": torch.ones(4)},
            None,
            "roformer.encoder.layer.0.attention.self.rel_bias",
        ),
        "missing": (
            {},
            "roformer.encoder.layer.1.intermediate.dense.weight",
            "roformer.encoder.layer.1.intermediate.dense.weight",
        ),
        "positions": ({"roformer.encoder.embed_positions.weight": torch.zeros(512, 8)}, None, "is not the sinusoid"),
    }
    for name, (added, removed, expected_message) in cases.items():
        source = workdir / name
        write_hub_release(source, reference)
        state = torch.load(source / "pytorch_model.bin", weights_only=True)
        state.update(added)
        state.pop(removed, None)
        torch.save(state, source / "pytorch_model.bin")
        error = cli_failure(capsys, "roformer", "--from", "hf", "--source", source, "--output", workdir / f"out-{name}")
        assert expected_message in error, (name, error)
    error = cli_failure(capsys, "roformer", "--from", "v2", "--source", workdir / "extra", "--output", workdir / "o")
    assert "use --from hf" in error


# ---------------------------------------------------------------------------------------------------------------------
# --from v2
# ---------------------------------------------------------------------------------------------------------------------

V2_CONFIG = {  # junnyu/roformer_v2_chinese_char_base's config.json fields at a tiny size
    "architectures": ["RoFormerForMaskedLM"], "attention_probs_dropout_prob": 0.1, "embedding_size": 32,
    "hidden_act": "relu", "hidden_dropout_prob": 0.1, "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "roformer",
    "norm_type": "rms_norm", "num_attention_heads": 4, "num_hidden_layers": 2, "pad_token_id": 0,
    "pooler_activation": "tanh", "rotary_value": False, "type_vocab_size": 2, "use_bias": False, "use_cache": True,
}  # fmt: skip


def v2_state_dict(vocab: int, seed: int = 15) -> dict[str, torch.Tensor]:
    """The tensors of junnyu's RoFormer-v2 RoFormerForMaskedLM, by their published names (no biases, no norms)."""
    generator = torch.Generator().manual_seed(seed)
    hidden, inner = V2_CONFIG["hidden_size"], V2_CONFIG["intermediate_size"]

    def random(*shape):
        return torch.randn(shape, generator=generator) * 0.3

    state = {
        "roformer.embeddings.word_embeddings.weight": random(vocab, hidden),
        "roformer.embeddings.token_type_embeddings.weight": random(2, hidden),
    }
    for i in range(V2_CONFIG["num_hidden_layers"]):
        prefix = f"roformer.encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            state[f"{prefix}{name}.weight"] = random(hidden, hidden)
        state[f"{prefix}intermediate.dense.weight"] = random(inner, hidden)
        state[f"{prefix}output.dense.weight"] = random(hidden, inner)
    state["cls.predictions.decoder.weight"] = state["roformer.embeddings.word_embeddings.weight"]  # tied, saved
    return state


def roformer_v2_hidden(state, input_ids, token_type_ids, attention_mask) -> torch.Tensor:
    """RoFormer-v2's last hidden state written out from its equations: post-norm blocks with the parameter-free RMS
    norm x / sqrt(mean(x^2) + eps), rotary attention on (2i, 2i+1) pairs with angles m * 10000^(-2i/d), ReLU FFN.
    With `roformer.embeddings_project.*` in `state` (embedding_size != hidden_size), junnyu's projection
    `x W^T + b` follows the embedding norm; it has a bias whatever use_bias says."""
    heads, eps = V2_CONFIG["num_attention_heads"], V2_CONFIG["layer_norm_eps"]

    def norm(x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    words = state["roformer.embeddings.word_embeddings.weight"]
    x = norm(words[input_ids] + state["roformer.embeddings.token_type_embeddings.weight"][token_type_ids])
    if "roformer.embeddings_project.weight" in state:
        x = x @ state["roformer.embeddings_project.weight"].T + state["roformer.embeddings_project.bias"]
    batch, length, hidden = x.shape
    d = hidden // heads
    angles = torch.arange(length, dtype=torch.float64)[:, None] * 10000 ** (-torch.arange(0, d, 2) / d)[None]
    cos, sin = angles.cos().float(), angles.sin().float()  # (L, d/2)

    def rotate(t):  # (B, H, L, d): each pair (t[2i], t[2i+1]) turned by its angle
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)

    def heads_of(t):
        return t.view(batch, length, heads, d).transpose(1, 2)

    blocked = (1.0 - attention_mask[:, None, None, :].float()) * -1e9
    for i in range(V2_CONFIG["num_hidden_layers"]):
        w = {name: state[f"roformer.encoder.layer.{i}.{name}.weight"] for name in (
            "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
            "intermediate.dense", "output.dense")}  # fmt: skip
        q, k = rotate(heads_of(x @ w["attention.self.query"].T)), rotate(heads_of(x @ w["attention.self.key"].T))
        v = heads_of(x @ w["attention.self.value"].T)
        probabilities = torch.softmax(q @ k.transpose(-1, -2) / d**0.5 + blocked, dim=-1)
        attended = (probabilities @ v).transpose(1, 2).reshape(batch, length, hidden)
        x = norm(x + attended @ w["attention.output.dense"].T)
        x = norm(x + torch.relu(x @ w["intermediate.dense"].T) @ w["output.dense"].T)
    return x


def roformer_v2_logits(state, input_ids, token_type_ids, attention_mask) -> torch.Tensor:
    """RoFormer-v2's MLM logits: the last hidden state times the word embeddings (its output layer)."""
    hidden = roformer_v2_hidden(state, input_ids, token_type_ids, attention_mask)
    return hidden @ state["roformer.embeddings.word_embeddings.weight"].T


def write_v2_release(source, state: dict[str, torch.Tensor], **config_fields) -> None:
    """As junnyu/roformer_v2_chinese_char_base is published: config.json, pytorch_model.bin, vocab.txt."""
    source.mkdir(parents=True)
    fields = {**V2_CONFIG, "vocab_size": vocab_size(CHAR_VOCAB), **config_fields}
    (source / "config.json").write_text(json.dumps(fields, indent=2))
    torch.save(state, source / "pytorch_model.bin")
    shutil.copy(CHAR_VOCAB, source / "vocab.txt")


@pytest.fixture(scope="module")
def v2_converted(tmp_path_factory):
    """(args, output, result) of converting a RoFormer-v2 release, and the release's state dict."""
    state = v2_state_dict(vocab_size(CHAR_VOCAB))
    source = tmp_path_factory.mktemp("v2") / "roformer_v2_chinese_char_base"
    write_v2_release(source, state)
    return (
        *convert_once(tmp_path_factory, "roformer-v2-base", ["roformer", "--from", "v2", "--source", source]),
        state,
    )


def test_v2_checkpoint_matches_the_roformer_v2_equations(v2_converted):
    _, output, result, state = v2_converted
    assert_verified(result, {"last hidden state", "logits"})
    model = transformers.AutoModelForMaskedLM.from_pretrained(output)
    assert model.config.norm_type == "rms_norm" and model.config.use_bias is False
    inputs = sample_inputs(model.config)
    expected = roformer_v2_logits(state, **inputs)
    with torch.no_grad():
        assert_close(model(**inputs).logits, expected, inputs["attention_mask"], tolerance=1e-4)
    assert transformers.AutoTokenizer.from_pretrained(output).tokenize(TEXT) == list(TEXT)


def factorised_v2_state_dict(vocab: int, embedding_size: int = 16, labels: int = 3) -> dict[str, torch.Tensor]:
    """A RoFormer-v2 RoFormerForTokenClassification with embedding_size != hidden_size, as junnyu's code saves it:
    narrow embedding tables, `roformer.embeddings_project` with its bias (his Linear always has one), no other bias
    but the classifier's. (His v2 MLM head cannot run factorised: its decoder reads embedding_size features.)"""
    generator = torch.Generator().manual_seed(17)
    hidden = V2_CONFIG["hidden_size"]

    def random(*shape):
        return torch.randn(shape, generator=generator) * 0.3

    state = v2_state_dict(vocab)
    del state["cls.predictions.decoder.weight"]
    state["roformer.embeddings.word_embeddings.weight"] = random(vocab, embedding_size)
    state["roformer.embeddings.token_type_embeddings.weight"] = random(2, embedding_size)
    state["roformer.embeddings_project.weight"] = random(hidden, embedding_size)
    state["roformer.embeddings_project.bias"] = random(hidden)
    state["classifier.weight"], state["classifier.bias"] = random(labels, hidden), random(labels)
    return state


def test_v2_factorised_embeddings_keep_the_projection_bias(workdir, convert_here):
    state = factorised_v2_state_dict(vocab_size(CHAR_VOCAB))
    source = workdir / "roformer_v2_factorised"
    labels = {"id2label": {"0": "B", "1": "I", "2": "O"}, "label2id": {"B": 0, "I": 1, "O": 2}}
    write_v2_release(source, state, embedding_size=16, architectures=["RoFormerForTokenClassification"], **labels)
    result = convert_here("roformer", "--from", "v2", "--source", source, "--output", workdir / "out").check()
    assert_verified(result, {"last hidden state", "logits"})
    converted = transformers.AutoModelForTokenClassification.from_pretrained(workdir / "out")
    # the source folder loads directly too, every tensor in the file finding its place
    direct, info = posformers.RoFormerForTokenClassification.from_pretrained(source, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    inputs = sample_inputs(converted.config)
    hidden = roformer_v2_hidden(state, **inputs)
    expected = hidden @ state["classifier.weight"].T + state["classifier.bias"]
    for model in (converted, direct):
        assert model.config.use_bias is False and model.config.embedding_size == 16
        with torch.no_grad():
            output = model.eval()(**inputs, output_hidden_states=True)
        assert_close(output.hidden_states[-1], hidden, inputs["attention_mask"])
        assert_close(output.logits, expected, inputs["attention_mask"])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("bias", "roformer.encoder.layer.0.attention.self.query.bias"),  # v2 has no biases: an extra tensor
        ("missing", "roformer.encoder.layer.1.intermediate.dense.weight"),
    ],
)
def test_v2_accounting_names_extra_and_missing_tensors(change, named, workdir, capsys):
    state = v2_state_dict(vocab_size(CHAR_VOCAB))
    if change == "bias":
        state[named] = torch.zeros(32)
    else:
        del state[named]
    source = workdir / "roformer_v2_chinese_char_base"
    write_v2_release(source, state)
    error = cli_failure(capsys, "roformer", "--from", "v2", "--source", source, "--output", workdir / "o")
    assert named in error and (change == "bias" or "missing" in error), error
    if change == "bias":
        error = cli_failure(capsys, "roformer", "--from", "hf", "--source", source, "--output", workdir / "o")
        assert "use --from v2" in error


def test_tf_and_v2_outputs_load_with_remote_code_and_respect_overwrite(
    tf_converted, v2_converted, workdir, convert_here
):
    """Both outputs in one fresh process without posformers (trust_remote_code), then --overwrite on each."""
    jobs, expected = [], []
    for _, output, *_ in (tf_converted, v2_converted):
        model = transformers.AutoModelForMaskedLM.from_pretrained(output).eval()
        inputs = sample_inputs(model.config)
        with torch.no_grad():
            expected.append((model(**inputs).logits, inputs["attention_mask"]))
        jobs.append((output, "AutoModelForMaskedLM", inputs))
    for remote, (logits, mask) in zip(load_all_with_remote_code(jobs, workdir), expected, strict=True):
        assert_close(remote["logits"], logits, mask)
    for args, output, *_ in (tf_converted, v2_converted):
        check_overwrite_behaviour(convert_here, args, output)
