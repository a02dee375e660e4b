"""`posformers-convert roformer --from {tf,hf,v2}`: RoFormer checkpoints into posformers' RoFormer.

Sources:
    tf  ZhuiyiTechnology's bert4keras releases (chinese_roformer_L-12_H-768_A-12, ..._char_..., ..._sim_char_...):
        `bert_config.json`, a TF1 checkpoint prefix (`bert_model.ckpt`) and `vocab.txt`, with Google-BERT variable
        names (`bert/encoder/layer_N/attention/self/query/kernel`, ...). Kernels are stored (in, out) and transposed.
        Needs tensorflow (the `tf` extra).
    hf  HF-format directories saved by transformers' RoFormer or published as junnyu/roformer_chinese_base etc.:
        config.json (model_type "roformer") + pytorch_model.bin or model.safetensors. Any head, or the bare
        RoFormerModel, whose file names its tensors without the `roformer.` prefix.
    v2  junnyu's RoFormer-v2 (junnyu/roformer_v2_chinese_char_small/base/large): the same layout with
        `"norm_type": "rms_norm"` and `"use_bias": false` in config.json; no biases, no norm parameters.

Pooler (RoFormer-sim): a source holding a BERT-style pooler (`bert/pooler/dense/*`, `roformer.pooler.dense.*`) is
converted with `add_pooling_layer=True`, and `pooler_activation` is chosen as follows, the first rule that applies:
    1. `--config '{"pooler_activation": ...}'` (or `"add_pooling_layer": false` to drop the pooler);
    2. the source config's own `pooler_activation` (junnyu's sim configs say "linear");
    3. tf: "linear", since the ZhuiyiTechnology releases with a pooler are the RoFormer-sim models, whose sentence
       vector is the pooler without activation (bert4keras `with_pool='linear'`), and bert_config.json cannot say;
       hf/v2: "tanh", the default of junnyu's RoFormer config, i.e. what his code computes for such a config.json.

Generation (RoFormer-sim): junnyu's RoFormerForCausalLM, which the sim checkpoints were published for, reads a prompt
bidirectionally and gives generated tokens token type 1. `bidirectional_prompt=True` reproduces that and is set for
    tf: a release with a pooler (the RoFormer-sim releases; the output is a masked LM whose config carries the flag for
        `AutoModelForCausalLM.from_pretrained(dir, is_decoder=True)`);
    hf/v2: a decoder (`is_decoder` or a RoFormerForCausalLM architecture) saved by junnyu's package: a pooler in the
        file or `pooler_activation` in config.json, which transformers' RoFormerConfig does not have. A decoder saved
        by transformers stays strictly causal, as transformers runs it.
`--config '{"bidirectional_prompt": false}'` overrides it. Verification runs without a cache, so for such a model the
reference is transformers' RoFormer with `is_decoder=False`.

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
from abc import abstractmethod
from pathlib import Path

import torch
from torch import nn

from posformers._extras import install_hint
from posformers.conversion.core import (
    BERT_ENCODER_FIELDS,
    ConversionError,
    KeyMap,
    Source,
    compare_outputs,
    load_tensors,
    log,
    masked_hidden,
    no_tokenizer,
    read_json,
    tokenizer_location,
    transposed,
    verification_batch,
)

TOLERANCE = 1e-4

# bert_config.json fields that have a RoFormer counterpart (the rest describe BERT's pooler or nothing we use).
BERT_CONFIG_FIELDS = (
    *BERT_ENCODER_FIELDS,
    "embedding_size",
    "max_position_embeddings",
    "pooler_activation",  # not in the official files; honoured if a user adds it (RoFormerSource.pooler_fields)
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
BASE_PREFIX = "roformer."  # RoFormerPreTrainedModel.base_model_prefix, as the heads' parameter names carry it
BIDIRECTIONAL_NOTE = (
    "generation: bidirectional_prompt=True, as junnyu's RoFormerForCausalLM generates (RoFormer-sim): the prompt is "
    "read bidirectionally, generated tokens attend causally and get token type 1; --config "
    "'{\"bidirectional_prompt\": false}' makes the decoder strictly causal"
)
HF_POOLER = {"weight": "roformer.pooler.dense.weight", "bias": "roformer.pooler.dense.bias"}


def pooler_note(config, origin: str) -> str:
    if not config.add_pooling_layer:
        return f"pooler: {origin} dropped (--config add_pooling_layer false)"
    load = "AutoModel.from_pretrained(dir, is_decoder=False)" if config.is_decoder else "AutoModel.from_pretrained(dir)"
    return (
        f"pooler: {origin} -> roformer.pooler.dense, pooler_activation={config.pooler_activation!r}; the sentence "
        f"vector is `{load}(**batch).pooler_output`"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="JSON file (or inline JSON object) with config fields that supply or override the source's config",
    )
    parser.add_argument(
        "--vocab", help="vocab.txt (or a directory holding it) for the tokenizer (default: the one next to the source)"
    )
    parser.add_argument("--no-tokenizer", action="store_true", help="write the model only, no tokenizer files")
    parser.add_argument(
        "--sentence-transformers",
        action="store_true",
        help="also write sentence-transformers modules ([CLS] -> pooler -> normalise; RoFormer-sim's sentence vector) "
        "so that SentenceTransformer(OUTPUT) loads it; needs a pooler and the [st] extra",
    )


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


def make_config(fields: dict, origin: str):
    import posformers

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
            f"reading TensorFlow checkpoints needs tensorflow, the tf extra: {install_hint('tf')}"
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


def with_base_prefix(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` named as a head's file names them. A bare `RoFormerModel.save_pretrained` (junnyu's or transformers')
    writes `embeddings.*`, `encoder.*` without the `roformer.` prefix of the heads; one key map reads both."""
    if any(key.startswith(BASE_PREFIX) for key in tensors):
        return tensors
    log("note: tensor names without the 'roformer.' prefix (a bare RoFormerModel's file), read as roformer.<name>")
    return {BASE_PREFIX + key: value for key, value in tensors.items()}


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
        theta = config.rope_parameters["rope_theta"]
        expected = sinusoid_table(table.shape[0], table.shape[1], theta)
        if table.shape[1] != config.rope_dim or not torch.allclose(table, expected, atol=1e-3):
            raise ConversionError(
                f"{key} is not the sinusoid RoFormer rotates with (head dim {config.rope_dim}, theta "
                f"{theta}); posformers computes that table, so these weights cannot be represented"
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
    # with bidirectional_prompt, a forward pass without a cache (what verification runs) reads bidirectionally
    config.is_decoder = model.config.is_decoder and not model.config.bidirectional_prompt
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


def build_tokenizer(vocab_file: Path, config):
    """A tokenizer for `vocab_file`: transformers' RoFormerTokenizer (jieba words) for a word vocab, else a WordPiece
    BertTokenizer. Both save a tokenizer.json.

    jieba cannot be written into a tokenizer.json: RoFormerTokenizer saves a plain BERT pre-tokenizer there, and its
    own normalizer leaves Chinese unsplit (jieba splits it), so the file read without rjieba would turn each run of
    Chinese into one [UNK]. The saved normalizer splits Chinese characters instead, as BERT's does: read alone, the
    file gives jieba's ids except that each multi-character word becomes its characters. transformers'
    RoFormerTokenizer (AutoTokenizer with rjieba) rebuilds its own normalizer and pre-tokenizer on load, so jieba
    words come back there."""
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
    if tokenizer_class is transformers.RoFormerTokenizer:
        from tokenizers.normalizers import BertNormalizer

        tokenizer.backend_tokenizer.normalizer = BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
        )
    tokenizer.model_max_length = config.max_position_embeddings
    if len(tokenizer) != config.vocab_size:
        log(f"note: the vocab has {len(tokenizer)} tokens and the model {config.vocab_size} embeddings")
    log(f"tokenizer: {type(tokenizer).__name__} from {vocab_file}")
    return tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------------------------------


class RoFormerSource(Source):
    """What the three formats share: `--config` overrides, the pooler rules, the comparison and the tokenizer.

    `load` sets `has_pooler` and, when the output keeps the pooler, `pooler`: the source's own pooler tensors as
    (kernel (in, out), bias), for the independent "pooler output" row of `verify`."""

    pooler_origin = ""  # the source's name of the pooler, for the notes
    default_pooler_activation = ""  # rule 3 of the module docstring

    def __init__(self, args):
        super().__init__(args)
        if args.sentence_transformers and args.push_to_hub:
            # push_output re-saves and uploads the model and tokenizer only
            raise ConversionError(
                "--sentence-transformers cannot be combined with --push-to-hub: convert, then upload the whole "
                "output folder (huggingface_hub's upload_folder)"
            )
        self.folder = self.path  # where vocab.txt is looked for
        self.has_pooler = False
        self.pooler: tuple[torch.Tensor, torch.Tensor] | None = None

    def pooler_fields(self, source_config: dict, overrides: dict) -> dict:
        """`add_pooling_layer` / `pooler_activation` for the source (rules in the module docstring)."""
        if not self.has_pooler:
            if overrides.get("add_pooling_layer"):
                raise ConversionError(
                    "--config sets add_pooling_layer, but the source has no pooler weights to fill it with"
                )
            return {}
        activation = source_config.get("pooler_activation", self.default_pooler_activation)
        return {"add_pooling_layer": True, "pooler_activation": overrides.get("pooler_activation", activation)}

    def sim_fields(self, is_sim: bool) -> dict:
        """`bidirectional_prompt` for a RoFormer-sim source: its generation reads the prompt bidirectionally."""
        return {"bidirectional_prompt": True} if is_sim else {}

    def complete(self, target, report):
        if self.has_pooler:
            self.notes.append(pooler_note(self.config, self.pooler_origin))
            log(self.notes[-1])
        if self.config.bidirectional_prompt:
            self.notes.append(BIDIRECTIONAL_NOTE)
            log(self.notes[-1])
        if self.model_class.__name__ == "RoFormerModel":  # the key maps name the heads' layout, `roformer.*`
            target = {key.removeprefix(BASE_PREFIX): value for key, value in target.items()}
        return target

    @abstractmethod
    def reference(self, model):
        """transformers' RoFormer computing what the source computes, as `model`'s head class."""

    def verify(self, model) -> dict[str, float]:
        return compare_models(model, self.reference(model), pooler=self.pooler)

    def write_extras(self, model, folder: Path) -> None:
        if not self.args.sentence_transformers:
            return
        if not self.has_pooler or not model.config.add_pooling_layer:
            raise ConversionError("--sentence-transformers needs a pooler (RoFormer-sim); the converted model has none")
        from posformers.conversion.st_modules import write_pooler_modules

        log(f"sentence-transformers modules: {', '.join(write_pooler_modules(folder))}")

    def tokenizer(self):
        if self.args.no_tokenizer:
            return None
        location = tokenizer_location(self.args.vocab, self.folder)
        vocab_file = location / "vocab.txt" if location.is_dir() else location
        if not vocab_file.is_file():
            return no_tokenizer(location, "vocab.txt", explicit=bool(self.args.vocab))
        return build_tokenizer(vocab_file, self.config)


class TFSource(RoFormerSource):
    help = "ZhuiyiTechnology's bert4keras releases (bert_config.json, a TF checkpoint prefix, vocab.txt)"
    pooler_origin = "bert/pooler/dense"
    default_pooler_activation = "linear"

    def load(self) -> dict[str, torch.Tensor]:
        overrides = read_config_overrides(self.args.config)
        self.prefix = find_tf_prefix(self.path)
        self.folder = self.prefix.parent
        variables = read_tf_checkpoint(self.prefix)
        log(f"read {len(variables)} variables from {self.prefix}")
        self.has_pooler = TF_POOLER["kernel"] in variables
        self.config = make_config(self._config_fields(variables, overrides), str(self.folder))
        self.model_class = _model_class("RoFormerForMaskedLM" if "cls/predictions/output_bias" in variables else None)
        if self.config.add_pooling_layer:
            self.pooler = (variables[TF_POOLER["kernel"]].clone(), variables[TF_POOLER["bias"]].clone())
        return variables

    def _config_fields(self, variables: dict, overrides: dict) -> dict:
        config_file = self.folder / "bert_config.json"
        if not config_file.is_file() and not overrides:
            raise ConversionError(f"{config_file} not found; pass --config with the model's config fields")
        raw = read_json(config_file) if config_file.is_file() else {}
        fields = {key: raw[key] for key in BERT_CONFIG_FIELDS if key in raw}
        if ignored := sorted(set(raw) - set(BERT_CONFIG_FIELDS)):
            log(f"note: bert_config.json fields without a RoFormer counterpart, ignored: {ignored}")
        words = variables.get("bert/embeddings/word_embeddings")
        if words is not None and "embedding_size" not in fields:
            fields["embedding_size"] = words.shape[1]  # the small models project embeddings up to hidden_size
        fields.setdefault("layer_norm_eps", 1e-12)  # bert4keras' LayerNormalization epsilon
        fields.update(self.pooler_fields(raw, overrides))
        fields.update(self.sim_fields(self.has_pooler))  # the releases with a pooler are RoFormer-sim's
        return {**fields, **overrides}

    def key_map(self) -> KeyMap:
        return tf_key_map(pooler=self.config.add_pooling_layer)

    def reference(self, model):
        """transformers' RoFormer holding the same (converted) weights; the pooler row reads the TF tensors."""
        return transformers_reference(model)

    def describe(self) -> str:
        checkpoint = f"{self.folder.name}/{self.prefix.name}"
        return f"the RoFormer TensorFlow checkpoint `{checkpoint}` (ZhuiyiTechnology/bert4keras format)"


class HFSource(RoFormerSource):
    help = "HF-format directories (transformers' RoFormer, junnyu/roformer_chinese_base, ...)"
    kind = "HF-format RoFormer"
    pooler_origin = "roformer.pooler.dense"
    default_pooler_activation = "tanh"
    v2 = False

    def load(self) -> dict[str, torch.Tensor]:
        overrides = read_config_overrides(self.args.config)
        config_file = self.path / "config.json"
        if not self.path.is_dir() or not config_file.is_file():
            raise ConversionError(f"--source {self.path}: expected a directory with config.json and the weights")
        raw = read_json(config_file)
        self._check_kind(raw, config_file)
        self.architecture = (raw.get("architectures") or [None])[0]
        fields = {key: value for key, value in raw.items() if key not in UNUSED_HF_FIELDS}
        if self.architecture == "RoFormerForCausalLM":
            fields["is_decoder"] = True
        tensors = with_base_prefix(load_tensors(self.path))
        self.has_pooler = HF_POOLER["weight"] in tensors
        fields.update(self.pooler_fields(raw, overrides))
        # A decoder written by junnyu's package (a pooler in the file, or his config's pooler_activation field, which
        # transformers' RoFormerConfig lacks) ran his RoFormerForCausalLM, RoFormer-sim's generator.
        junnyu = self.has_pooler or "pooler_activation" in raw
        fields.update(self.sim_fields(bool(fields.get("is_decoder")) and junnyu))
        self.config = make_config({**fields, **overrides}, str(config_file))
        self.model_class = _model_class(self.architecture)
        check_tied_and_positions(tensors, self.config)
        if self.config.add_pooling_layer:
            self.pooler = (tensors[HF_POOLER["weight"]].T.clone(), tensors[HF_POOLER["bias"]].clone())
        return tensors

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

    def key_map(self) -> KeyMap:
        return hf_key_map(self.config)

    def reference(self, model):
        """transformers' RoFormer reading the source directory itself."""
        import transformers

        reference_class = getattr(transformers, self.architecture or type(model).__name__)
        is_decoder = self.config.is_decoder and not self.config.bidirectional_prompt  # see transformers_reference
        reference = reference_class.from_pretrained(self.path, dtype=torch.float32, is_decoder=is_decoder)
        return reference.eval()

    def describe(self) -> str:
        return f"the {self.kind} checkpoint `{self.path.name}`"


class V2Source(HFSource):
    help = "junnyu's RoFormer-v2 (junnyu/roformer_v2_chinese_char_*: rms_norm, no biases)"
    kind = "RoFormer-v2 (junnyu)"
    v2 = True

    def reference(self, model):
        """transformers has no RoFormer-v2: its RoFormer with RoFormer-v2's computation (module docstring)."""
        return transformers_reference(model, rms_norm=True)


SOURCES = {"tf": TFSource, "hf": HFSource, "v2": V2Source}
