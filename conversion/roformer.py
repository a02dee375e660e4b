"""`posformers-convert roformer --from {tf,hf,v2}`: RoFormer checkpoints into posformers' RoFormer.

Sources:
    tf  ZhuiyiTechnology's bert4keras releases (chinese_roformer_L-12_H-768_A-12, ..._char_..., ..._sim_char_...):
        `bert_config.json`, a TF1 checkpoint prefix (`bert_model.ckpt`) and `vocab.txt`, with Google-BERT variable
        names (`bert/encoder/layer_N/attention/self/query/kernel`, ...). Kernels are stored (in, out) and transposed.
        Needs tensorflow (`pip install "posformers[tf]"`).
    hf  HF-format directories saved by transformers' RoFormer or published as junnyu/roformer_chinese_base etc.:
        config.json (model_type "roformer") + pytorch_model.bin or model.safetensors.
    v2  junnyu's RoFormer-v2 (junnyu/roformer_v2_chinese_char_small/base/large): the same layout with
        `"norm_type": "rms_norm"` and `"use_bias": false` in config.json; no biases, no norm parameters.

Pooler (RoFormer-sim): a source holding a BERT-style pooler (`bert/pooler/dense/*`, `roformer.pooler.dense.*`) is
converted with `add_pooling_layer=True`, and `pooler_activation` is chosen as follows, the first rule that applies:
    1. `--config '{"pooler_activation": ...}'` (or `"add_pooling_layer": false` to drop the pooler);
    2. the source config's own `pooler_activation` (junnyu's sim configs say "linear");
    3. tf: "linear", since the ZhuiyiTechnology releases with a pooler are the RoFormer-sim models, whose sentence
       vector is the pooler without activation (bert4keras `with_pool='linear'`), and bert_config.json cannot say;
       hf/v2: "tanh", the default of junnyu's RoFormer config, i.e. what his code computes for such a config.json.

Verification: tf and hf load the same weights into transformers' RoFormer (for hf, straight from the source
directory) and compare hidden states and every head. transformers' RoFormer has no pooler, so the "pooler output" row
compares ours with the reference's final [CLS] hidden state put through the source's own pooler tensors (as stored:
TF kernels (in, out), torch weights (out, in)) and the chosen activation. transformers has no RoFormer-v2, so v2 is
checked against transformers' RoFormer with its LayerNorms replaced by the parameter-free RMS norm of RoFormer-v2
(x / sqrt(mean(x^2) + eps)), its biases zeroed and the MLM transform removed, which is how the v2 release computes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from posformers.conversion.core import (
    ConversionError,
    KeyMap,
    OutputInfo,
    build_model,
    compare_outputs,
    load_tensors,
    log,
    masked_hidden,
    transposed,
    verification_batch,
    write_output,
)

HELP = "RoFormer: ZhuiyiTechnology TF checkpoints (tf), HF-format directories (hf), junnyu's RoFormer-v2 (v2)"
FORMATS = ("tf", "hf", "v2")
TOLERANCE = 1e-4

# bert_config.json fields that have a RoFormer counterpart (the rest describe BERT's pooler or nothing we use).
BERT_CONFIG_FIELDS = (
    "vocab_size",
    "embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pooler_activation",  # not in the official files; honoured if a user adds it (see pooler_fields)
)
# config.json fields of transformers' and junnyu's RoFormer that posformers does not use.
UNUSED_HF_FIELDS = (
    "transformers_version",
    "architectures",
    "model_type",
    "gradient_checkpointing",
)
HEADS = (
    "RoFormerModel",
    "RoFormerForMaskedLM",
    "RoFormerForCausalLM",
    "RoFormerForSequenceClassification",
    "RoFormerForTokenClassification",
    "RoFormerForQuestionAnswering",
    "RoFormerForMultipleChoice",
)

LAYER_PARTS = {  # TF scope inside bert/encoder/layer_N -> module path inside roformer.encoder.layer.N
    "attention/self/query": "attention.self.query",
    "attention/self/key": "attention.self.key",
    "attention/self/value": "attention.self.value",
    "attention/output/dense": "attention.output.dense",
    "intermediate/dense": "intermediate.dense",
    "output/dense": "output.dense",
}
LAYER_NORMS = {"attention/output/LayerNorm": "attention.output.LayerNorm", "output/LayerNorm": "output.LayerNorm"}

TF_DROPPED = {
    r".*/(adam_m|adam_v|Adam|Adam_1)|(.*/)?(AdamWeightDecayOptimizer|AdamWeightDecayOptimizer_1)(/.*)?": (
        "optimizer state, not part of the model"
    ),
    r"global_step|bad_steps|good_steps|loss_scale|.*/(accum_grad|moving_average)(/.*)?": "training bookkeeping",
    r"cls/seq_relationship/.*": "next-sentence-prediction head, not used by RoFormer",
}
POOLER_OFF_REASON = "BERT-style pooler, dropped because --config sets add_pooling_layer to false"
TF_POOLER = {"kernel": "bert/pooler/dense/kernel", "bias": "bert/pooler/dense/bias"}
HF_POOLER = {"weight": "roformer.pooler.dense.weight", "bias": "roformer.pooler.dense.bias"}
# pooler_activation when the source has a pooler and neither --config nor the source config names one (see above)
DEFAULT_POOLER_ACTIVATION = {"tf": "linear", "hf": "tanh"}


def pooler_fields(has_pooler: bool, source_config: dict, overrides: dict, source_format: str) -> dict:
    """`add_pooling_layer` / `pooler_activation` for a source with or without a pooler (rules in the docstring)."""
    if not has_pooler:
        if overrides.get("add_pooling_layer"):
            raise ConversionError(
                "--config sets add_pooling_layer, but the source has no pooler weights to fill it with"
            )
        return {}
    activation = source_config.get("pooler_activation", DEFAULT_POOLER_ACTIVATION[source_format])
    return {"add_pooling_layer": True, "pooler_activation": overrides.get("pooler_activation", activation)}


def pooler_note(config, origin: str) -> str:
    if not config.add_pooling_layer:
        return f"pooler: {origin} dropped (--config add_pooling_layer false)"
    load = "AutoModel.from_pretrained(dir, is_decoder=False)" if config.is_decoder else "AutoModel.from_pretrained(dir)"
    return (
        f"pooler: {origin} -> roformer.pooler.dense, pooler_activation={config.pooler_activation!r}; the sentence "
        f"vector is `{load}(**batch).pooler_output`"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source_format", required=True, choices=FORMATS, help="source format")
    parser.add_argument(
        "--config",
        help="JSON file (or inline JSON object) with config fields that supply or override the source's config",
    )
    parser.add_argument("--vocab", help="vocab.txt for the tokenizer (default: the one next to the source)")
    parser.add_argument("--no-tokenizer", action="store_true", help="write the model only, no tokenizer files")


def convert(args: argparse.Namespace) -> int:
    from posformers.conversion.core import check_output_dir

    check_output_dir(args.output, args.overwrite)
    overrides = read_config_overrides(args.config)
    if args.source_format == "tf":
        source = TFSource(Path(args.source), overrides)
    else:
        source = HFSource(Path(args.source), overrides, v2=args.source_format == "v2")
    model = build_model(source.model_class, source.config, source.state_dict)
    verification = None if args.no_verify else source.verify(model)
    tokenizer = None if args.no_tokenizer else build_tokenizer(args.vocab or source.vocab_file, source.config)
    info = OutputInfo(
        source_description=source.description,
        command_line=args.command_line,
        base_model=source.hub_name,
        verification=verification,
        notes=source.notes,
    )
    write_output(
        model, args.output, overwrite=args.overwrite, info=info, tokenizer=tokenizer, dtype=args.dtype,
        push_to_hub=args.push_to_hub,
    )  # fmt: skip
    return 0


def read_config_overrides(value: str | None) -> dict:
    if not value:
        return {}
    text = value if value.lstrip().startswith("{") else _read_text(Path(value), "--config")
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConversionError(f"--config {value}: not valid JSON ({error})") from error
    if not isinstance(overrides, dict):
        raise ConversionError(f"--config {value}: expected a JSON object of config fields")
    return overrides


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConversionError(f"{what} {path}: cannot be read ({error})") from error


def make_config(fields: dict, overrides: dict, origin: str):
    import posformers

    fields = {**fields, **overrides}
    try:
        return posformers.RoFormerConfig(**fields)
    except (TypeError, ValueError) as error:
        raise ConversionError(f"{origin}: invalid RoFormer config ({error})") from error


# ---------------------------------------------------------------------------------------------------------------------
# TF (bert4keras) checkpoints
# ---------------------------------------------------------------------------------------------------------------------


def tf_key_map(pooler: bool = True) -> KeyMap:
    """TF variable names -> posformers names; kernels are transposed from (in, out) to torch's (out, in).

    pooler: map `bert/pooler/dense` into the pooler (else it is dropped: the config has none)."""
    layer = r"bert/encoder/layer_(\d+)/"
    rules = [
        (r"bert/embeddings/word_embeddings", "roformer.embeddings.word_embeddings.weight"),
        (r"bert/embeddings/token_type_embeddings", "roformer.embeddings.token_type_embeddings.weight"),
        (r"bert/embeddings/LayerNorm/gamma", "roformer.embeddings.LayerNorm.weight"),
        (r"bert/embeddings/LayerNorm/beta", "roformer.embeddings.LayerNorm.bias"),
        (r"bert/encoder/embedding_hidden_mapping_in/kernel", transposed("roformer.embeddings_project.weight")),
        (r"bert/encoder/embedding_hidden_mapping_in/bias", "roformer.embeddings_project.bias"),
        (r"cls/predictions/transform/dense/kernel", transposed("cls.predictions.transform.dense.weight")),
        (r"cls/predictions/transform/dense/bias", "cls.predictions.transform.dense.bias"),
        (r"cls/predictions/transform/LayerNorm/gamma", "cls.predictions.transform.LayerNorm.weight"),
        (r"cls/predictions/transform/LayerNorm/beta", "cls.predictions.transform.LayerNorm.bias"),
        (r"cls/predictions/output_bias", "cls.predictions.bias"),
        (r"bert/pooler/dense/kernel", transposed("roformer.pooler.dense.weight")),
        (r"bert/pooler/dense/bias", "roformer.pooler.dense.bias"),
    ]
    for scope, module in LAYER_PARTS.items():
        target = rf"roformer.encoder.layer.\1.{module}"
        rules.append((layer + scope + "/kernel", transposed(target + ".weight")))
        rules.append((layer + scope + "/bias", target + ".bias"))
    for scope, module in LAYER_NORMS.items():
        target = rf"roformer.encoder.layer.\1.{module}"
        rules += [(layer + scope + "/gamma", target + ".weight"), (layer + scope + "/beta", target + ".bias")]
    dropped = dict(TF_DROPPED)
    if not pooler:
        dropped[r"bert/pooler/dense/(kernel|bias)"] = POOLER_OFF_REASON
    return KeyMap(rules, dropped)


def read_tf_checkpoint(prefix: Path) -> dict[str, torch.Tensor]:
    """Every variable of the TF checkpoint `prefix` (as written by tf.compat.v1.train.Saver), by name."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's start-up chatter would bury the conversion report
    try:
        import numpy as np
        import tensorflow as tf
    except ImportError as error:
        raise ConversionError(
            "reading TensorFlow checkpoints needs tensorflow: pip install 'posformers[tf]' (or tensorflow-cpu)"
        ) from error
    try:
        reader = tf.train.load_checkpoint(str(prefix))
    except (tf.errors.OpError, ValueError) as error:
        raise ConversionError(f"{prefix}: not a readable TensorFlow checkpoint ({error})") from error
    names = sorted(reader.get_variable_to_shape_map())
    return {name: torch.from_numpy(np.array(reader.get_tensor(name))) for name in names}


def find_tf_prefix(source: Path) -> Path:
    """`source` as a checkpoint prefix: given as such (`.../bert_model.ckpt`), or the one checkpoint in a directory."""
    if Path(f"{source}.index").is_file():
        return source
    if source.is_dir():
        indexes = sorted(source.glob("*.index"))
        if len(indexes) == 1:
            return indexes[0].with_suffix("")
        if indexes:
            raise ConversionError(
                f"{source} holds several checkpoints ({[p.name for p in indexes]}); pass the prefix of one"
            )
    raise ConversionError(
        f"--source {source}: no TensorFlow checkpoint found (expected a prefix such as .../bert_model.ckpt with "
        "a .index file beside it, or a directory holding one)"
    )


class TFSource:
    def __init__(self, source: Path, overrides: dict):
        prefix = find_tf_prefix(source)
        folder = prefix.parent
        self.description = (
            f"the RoFormer TensorFlow checkpoint `{folder.name}/{prefix.name}` (ZhuiyiTechnology/bert4keras format)"
        )
        self.hub_name = None
        self.vocab_file = folder / "vocab.txt" if (folder / "vocab.txt").is_file() else None
        self.notes: list[str] = []
        variables = read_tf_checkpoint(prefix)
        log(f"read {len(variables)} variables from {prefix}")
        self.config = make_config(self._config_fields(folder, variables, overrides), {}, str(folder))
        self.model_class = _model_class("RoFormerForMaskedLM" if "cls/predictions/output_bias" in variables else None)
        # the source's own pooler, kept (in, out) as TF stores it, for the independent check in `verify`
        self.pooler = None
        if self.config.add_pooling_layer:
            self.pooler = (variables[TF_POOLER["kernel"]].clone(), variables[TF_POOLER["bias"]].clone())
        self.state_dict, report = tf_key_map(pooler=self.config.add_pooling_layer).apply(variables)
        log(report.summary())
        self.notes += [line.strip() for line in report.summary().splitlines()[1:]]
        if TF_POOLER["kernel"] in report_sources(report):
            self.notes.append(pooler_note(self.config, "bert/pooler/dense"))
            log(self.notes[-1])

    def _config_fields(self, folder: Path, variables: dict, overrides: dict) -> dict:
        config_file = folder / "bert_config.json"
        if not config_file.is_file() and not overrides:
            raise ConversionError(f"{config_file} not found; pass --config with the model's config fields")
        raw = json.loads(_read_text(config_file, "config")) if config_file.is_file() else {}
        fields = {key: raw[key] for key in BERT_CONFIG_FIELDS if key in raw}
        if ignored := sorted(set(raw) - set(BERT_CONFIG_FIELDS)):
            log(f"note: bert_config.json fields without a RoFormer counterpart, ignored: {ignored}")
        words = variables.get("bert/embeddings/word_embeddings")
        if words is not None and "embedding_size" not in fields:
            fields["embedding_size"] = words.shape[1]  # the small models project embeddings up to hidden_size
        fields.setdefault("layer_norm_eps", 1e-12)  # bert4keras' LayerNormalization epsilon
        fields.update(pooler_fields(TF_POOLER["kernel"] in variables, raw, overrides, "tf"))
        return {**fields, **overrides}

    def verify(self, model) -> dict[str, float]:
        """Against transformers' RoFormer holding the same (converted) weights; the pooler from the TF tensors."""
        reference = transformers_reference(model)
        return compare_models(model, reference, pooler=self.pooler)


def report_sources(report) -> set[str]:
    return {source for source, _ in report.mapped} | {source for source, _ in report.dropped}


# ---------------------------------------------------------------------------------------------------------------------
# HF-format and RoFormer-v2 directories
# ---------------------------------------------------------------------------------------------------------------------


def hf_key_map(config) -> KeyMap:
    """transformers' / junnyu's RoFormer names -> posformers names (the same names, old `gamma`/`beta` renamed)."""
    layer = r"roformer\.encoder\.layer\.(\d+)\."
    modules = "|".join(re.escape(m) for m in (*LAYER_PARTS.values(), *LAYER_NORMS.values()))
    rules = [
        (r"(roformer\.embeddings\.(word_embeddings|token_type_embeddings)\.weight)", r"\1"),
        (r"(roformer\.embeddings\.LayerNorm|roformer\.embeddings_project)\.(weight|bias)", r"\1.\2"),
        (r"(roformer\.embeddings\.LayerNorm)\.gamma", r"\1.weight"),
        (r"(roformer\.embeddings\.LayerNorm)\.beta", r"\1.bias"),
        (layer + rf"({modules})\.(weight|bias)", r"roformer.encoder.layer.\1.\2.\3"),
        (layer + r"(.*LayerNorm)\.gamma", r"roformer.encoder.layer.\1.\2.weight"),
        (layer + r"(.*LayerNorm)\.beta", r"roformer.encoder.layer.\1.\2.bias"),
        (r"(cls\.predictions\.transform\.(dense|LayerNorm)\.(weight|bias)|cls\.predictions\.bias)", r"\1"),
        (r"(classifier\.(dense|out_proj)\.(weight|bias))", r"\1"),
        (r"(classifier|qa_outputs)\.(weight|bias)", r"\1.\2"),
        (r"(roformer\.pooler\.dense\.(weight|bias))", r"\1"),
    ]
    dropped = {
        r"roformer\.(encoder|embeddings)\.embed_positions\.weight": (
            "the frozen sinusoidal position table of transformers' RoFormer; posformers computes the same values "
            "(checked before dropping)"
        ),
        r"cls\.predictions\.decoder\.weight": "tied to roformer.embeddings.word_embeddings.weight (checked equal)",
        r"cls\.predictions\.decoder\.bias": "tied to cls.predictions.bias (checked equal)",
    }
    if not config.add_pooling_layer:
        dropped[r"roformer\.pooler\.dense\.(weight|bias)"] = POOLER_OFF_REASON
    return KeyMap(rules, dropped)


def sinusoid_table(positions: int, dim: int, theta: float) -> torch.Tensor:
    """transformers' RoFormer table: sin of pos * theta^(-2i/dim) in the first half, cos in the second. (P, dim)"""
    inverse = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inverse[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def check_tied_and_positions(tensors: dict[str, torch.Tensor], config) -> None:
    """Stop unless the tensors we are about to drop carry nothing posformers would lose."""
    for key in ("roformer.encoder.embed_positions.weight", "roformer.embeddings.embed_positions.weight"):
        if key not in tensors:
            continue
        table = tensors[key].double()
        expected = sinusoid_table(table.shape[0], table.shape[1], config.rope_theta)
        if table.shape[1] != config.rope_dim or not torch.allclose(table, expected, atol=1e-3):
            raise ConversionError(
                f"{key} is not the sinusoid RoFormer rotates with (head dim {config.rope_dim}, theta "
                f"{config.rope_theta}); posformers computes that table, so these weights cannot be represented"
            )
    tied = {
        "cls.predictions.decoder.weight": "roformer.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    for key, source in tied.items():
        if key in tensors and (source not in tensors or not torch.equal(tensors[key], tensors[source])):
            raise ConversionError(
                f"{key} differs from {source}, but RoFormer ties them: this checkpoint's output layer is not tied, "
                "which posformers' RoFormer cannot represent"
            )


class HFSource:
    def __init__(self, source: Path, overrides: dict, *, v2: bool):
        self.source = source
        self.v2 = v2
        kind = "RoFormer-v2 (junnyu)" if v2 else "HF-format RoFormer"
        self.description = f"the {kind} checkpoint `{source.name}`"
        self.hub_name = None
        self.notes: list[str] = []
        config_file = source / "config.json"
        if not source.is_dir() or not config_file.is_file():
            raise ConversionError(f"--source {source}: expected a directory with config.json and the weights")
        raw = json.loads(_read_text(config_file, "config"))
        self._check_kind(raw, config_file)
        self.architecture = (raw.get("architectures") or [None])[0]
        fields = {key: value for key, value in raw.items() if key not in UNUSED_HF_FIELDS}
        if self.architecture == "RoFormerForCausalLM":
            fields["is_decoder"] = True
        tensors = load_tensors(source)
        fields.update(pooler_fields(HF_POOLER["weight"] in tensors, raw, overrides, "hf"))
        self.config = make_config(fields, overrides, str(config_file))
        self.model_class = _model_class(self.architecture)
        vocab = source / "vocab.txt"
        self.vocab_file = vocab if vocab.is_file() else None
        check_tied_and_positions(tensors, self.config)
        # the source's own pooler as (in, out), for the independent check in `verify`
        self.pooler = None
        if self.config.add_pooling_layer:
            self.pooler = (tensors[HF_POOLER["weight"]].T.clone(), tensors[HF_POOLER["bias"]].clone())
        has_pooler = HF_POOLER["weight"] in tensors
        self.state_dict, report = hf_key_map(self.config).apply(tensors)
        log(report.summary())
        self.notes += [line.strip() for line in report.summary().splitlines()[1:]]
        if has_pooler:
            self.notes.append(pooler_note(self.config, "roformer.pooler.dense"))
            log(self.notes[-1])

    def _check_kind(self, raw: dict, config_file: Path) -> None:
        if raw.get("model_type") != "roformer":
            raise ConversionError(f"{config_file}: model_type is {raw.get('model_type')!r}, expected 'roformer'")
        is_v2 = raw.get("norm_type", "layer_norm") == "rms_norm"
        if is_v2 and not self.v2:
            raise ConversionError(f"{config_file} describes a RoFormer-v2 (norm_type rms_norm): use --from v2")
        if self.v2 and not is_v2:
            raise ConversionError(
                f'{config_file} is not a RoFormer-v2 config (no "norm_type": "rms_norm"): use --from hf'
            )

    def verify(self, model) -> dict[str, float]:
        import transformers

        reference_class = getattr(transformers, self.architecture or model.__class__.__name__)
        if not self.v2:  # transformers' RoFormer reads the source directory itself
            reference = reference_class.from_pretrained(
                self.source, dtype=torch.float32, is_decoder=self.config.is_decoder
            )
            return compare_models(model, reference.eval(), pooler=self.pooler)
        return compare_models(model, v2_reference(model), pooler=self.pooler)


# ---------------------------------------------------------------------------------------------------------------------
# References and comparison
# ---------------------------------------------------------------------------------------------------------------------


def transformers_config(config):
    """transformers' RoFormerConfig with the fields of our `config` that it has."""
    import transformers

    fields = config.to_dict()
    names = set(transformers.RoFormerConfig().to_dict())
    return transformers.RoFormerConfig(**{key: value for key, value in fields.items() if key in names})


def transformers_reference(model, *, rms_norm: bool = False):
    """transformers' RoFormer of `model`'s head class, sharing `model`'s weights (biases it lacks are zeros)."""
    import transformers

    config = transformers_config(model.config)
    reference = getattr(transformers, type(model).__name__)(config).eval()
    if rms_norm:
        _use_v2_computation(reference, model.config.layer_norm_eps)
    # transformers' RoFormer has no pooler; `compare_models` checks ours against the source's pooler tensors
    state = {key: value for key, value in model.state_dict().items() if ".pooler." not in f".{key}"}
    for key, value in reference.state_dict().items():
        if key not in state and key.endswith(".bias"):
            state[key] = torch.zeros_like(value)  # RoFormer-v2 has no biases
    result = reference.load_state_dict(state, strict=False, assign=True)
    reference.tie_weights()
    leftover = [key for key in result.missing_keys if "embed_positions" not in key and "decoder" not in key]
    if leftover or result.unexpected_keys:
        raise ConversionError(
            f"internal: transformers' RoFormer did not take the weights (missing {leftover}, "
            f"unexpected {result.unexpected_keys})"
        )
    return reference


class ReferenceRMSNorm(nn.Module):
    """RoFormer-v2's norm as junnyu's release computes it: x / sqrt(mean(x^2) + eps), no parameters."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


def _use_v2_computation(reference: nn.Module, eps: float) -> None:
    """Turn transformers' RoFormer into RoFormer-v2: RMS norms for LayerNorms, no MLM transform."""
    for name, module in list(reference.named_modules()):
        if isinstance(module, nn.LayerNorm):
            parent_name, _, child = name.rpartition(".")
            setattr(reference.get_submodule(parent_name), child, ReferenceRMSNorm(eps))
    if hasattr(reference, "cls"):
        reference.cls.predictions.transform = nn.Identity()


def v2_reference(model):
    return transformers_reference(model, rms_norm=True)


def head_inputs(model) -> dict[str, torch.Tensor]:
    config = model.config
    inputs = verification_batch(config.vocab_size, config.type_vocab_size)
    if type(model).__name__ == "RoFormerForMultipleChoice":  # the two rows become two choices of one example
        inputs = {key: value[None] for key, value in inputs.items()}
    return inputs


def model_outputs(model, inputs) -> dict[str, torch.Tensor]:
    """Last hidden state and every head output of `model`, with padded positions zeroed."""
    with torch.no_grad():
        output = model(**inputs, output_hidden_states=True, return_dict=True)
    mask = inputs["attention_mask"].reshape(-1, inputs["attention_mask"].shape[-1])
    hidden = output.hidden_states[-1] if output.get("hidden_states") is not None else output.last_hidden_state
    results = {"last hidden state": masked_hidden(hidden, mask)}
    for name in ("logits", "start_logits", "end_logits"):
        value = output.get(name)
        if value is None:
            continue
        per_token = value.dim() >= 2 and value.shape[:2] == mask.shape
        results[name] = masked_hidden(value, mask) if per_token else value
    return results


def compare_models(model, reference, pooler: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, float]:
    """Max abs diff of every output; with `pooler` = the source's (kernel (in, out), bias), also "pooler output":
    ours against the reference's final [CLS] hidden state through that kernel, bias and the configured activation."""
    inputs = head_inputs(model)
    ours, theirs = model_outputs(model.float(), inputs), model_outputs(reference.float(), inputs)
    pairs = {name: (ours[name], theirs[name]) for name in ours}
    if pooler is not None:
        reference_pooled = reference_pooler_output(theirs, pooler, model.config)
        pairs["pooler output"] = (our_pooler_output(model, inputs), reference_pooled)
    return compare_outputs(pairs, tolerance=TOLERANCE)


def our_pooler_output(model, inputs) -> torch.Tensor:
    flat = {key: value.reshape(-1, value.shape[-1]) for key, value in inputs.items()}  # multiple choice: 3-D
    with torch.no_grad():
        return model.base_model(**flat, return_dict=True).pooler_output


def reference_pooler_output(reference_outputs: dict, pooler: tuple[torch.Tensor, torch.Tensor], config) -> torch.Tensor:
    """activation(h_[CLS] @ kernel + bias), in float64, from the reference's hidden state and the source tensors."""
    from transformers.activations import ACT2FN

    kernel, bias = (tensor.double() for tensor in pooler)
    cls = reference_outputs["last hidden state"][:, 0].double()  # position 0 is never padding
    return ACT2FN[config.pooler_activation](cls @ kernel + bias)


def _model_class(architecture: str | None):
    import posformers

    name = architecture or "RoFormerModel"
    if name not in HEADS:
        raise ConversionError(f"config.json names architecture {name!r}; posformers' RoFormer has {list(HEADS)}")
    return getattr(posformers, name)


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------


def is_word_level(vocab: list[str]) -> bool:
    """True for RoFormer's jieba word vocab (chinese_roformer_L-12_H-768_A-12): it holds multi-character Chinese words,
    which a character vocab (the char / v2 models, bert-base-chinese) never does."""
    cjk = re.compile(r"[\u4e00-\u9fff]{2,}")
    return sum(1 for token in vocab if cjk.fullmatch(token)) > 100


def build_tokenizer(vocab_file: Path | str | None, config):
    """A tokenizer for `vocab_file`: transformers' RoFormerTokenizer (jieba words) for a word vocab, else a WordPiece
    BertTokenizer. None (with a note) when there is no vocab."""
    if vocab_file is None:
        log("note: no vocab.txt next to the source and no --vocab: no tokenizer written")
        return None
    vocab_file = Path(vocab_file)
    # split on "\n" only: str.splitlines would also split tokens that are other line-break characters
    vocab = _read_text(vocab_file, "--vocab").rstrip("\n").split("\n")
    import transformers

    if is_word_level(vocab):
        try:
            import rjieba  # noqa: F401
        except ImportError as error:
            raise ConversionError(
                f"{vocab_file} is RoFormer's word-level vocab, whose tokenizer (transformers' RoFormerTokenizer) "
                "segments words with rjieba: pip install rjieba, or pass --no-tokenizer to write the model only"
            ) from error
        tokenizer_class = transformers.RoFormerTokenizer
    else:
        tokenizer_class = transformers.BertTokenizer
    with tempfile.TemporaryDirectory() as folder:
        shutil.copyfile(vocab_file, Path(folder) / "vocab.txt")
        tokenizer = tokenizer_class.from_pretrained(folder, do_lower_case=True)
    tokenizer.model_max_length = config.max_position_embeddings
    if len(tokenizer) != config.vocab_size:
        log(f"note: the vocab has {len(tokenizer)} tokens and the model {config.vocab_size} embeddings")
    log(f"tokenizer: {type(tokenizer).__name__} from {vocab_file}")
    return tokenizer
