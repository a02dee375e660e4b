"""`posformers-convert deberta --from {hf,original}`: Microsoft's DeBERTa v1, v2, v3 and mDeBERTa checkpoints.

Sources:

* `--from hf`: the checkpoints Microsoft publishes on the Hub (microsoft/deberta-base, -large, -xlarge;
  deberta-v2-xlarge, -xxlarge; deberta-v3-xsmall, -small, -base, -large; mdeberta-v3-base): `config.json` with
  model_type "deberta" or "deberta-v2", `pytorch_model.bin` or `*.safetensors` (tensors stored in fp16; converted
  to fp32, then saved in `--dtype`), tokenizer files (GPT-2 BPE `vocab.json` + `merges.txt` for v1, SentencePiece
  `spm.model` for v2/v3).
* `--from original`: the release assets of the microsoft/DeBERTa repository: `pytorch.model.bin` (older releases) or
  `pytorch_model.bin`, `model_config.json` (the repository's `ModelConfig`: no model_type, `padding_idx`, defaults of
  that code; the config may also sit in the state dict under "config"), and `bpe_encoder.bin` (v1) or `spm.model`.
  Key names are the repository's: `deberta.embeddings.*`, `deberta.encoder.layer.N.attention.self.in_proj.weight`,
  `q_bias`, `v_bias`, `pos_proj`, `pos_q_proj` for v1, `query_proj`/`key_proj`/... for v2/v3,
  `lm_predictions.lm_head.*` and the RTD head `mask_predictions.*` with its classifier spelled `classifer`.

Both use posformers' names unchanged for the encoder (posformers' DeBERTa keeps the official names; v1 keeps its
fused `in_proj` layout), so the mapping is mostly accounting. Which head the output is:

* `DebertaForReplacedTokenDetection` when the source has `mask_predictions.*` (the RTD head of the v3 discriminators).
  Their `lm_predictions.*` head is then dropped: the v3 checkpoints were trained by replaced token detection, not by
  masked language modelling, so that head is not a trained MLM (`--head masked-lm` keeps it instead);
* else `DebertaForMaskedLM` when it has `lm_predictions.*` (v1/v2), with the Enhanced Mask Decoder, which reads the
  absolute position table `deberta.embeddings.position_embeddings.weight` that the encoder itself does not add;
* else `DebertaModel`. `--head` overrides the choice; what a head does not use is dropped with the reason.

Fine-tuned checkpoints (microsoft/deberta-large-mnli, deberta-v2-xlarge-mnli, ... and anything saved by transformers'
DeBERTa task classes) become the posformers task class of the same names: `pooler.dense.*` + `classifier.*` ->
`DebertaForSequenceClassification` (num_labels / id2label from config.json, else the classifier's rows),
`classifier.*` alone -> `DebertaForTokenClassification`, `qa_outputs.*` -> `DebertaForQuestionAnswering`. The head
comes from `architectures` in config.json when it names one of these classes, else from the tensors. (For pretraining
checkpoints the tensors decide: their configs do not name the RTD head, which transformers lacks.)

Some safetensors files carry the word embeddings twice, also as `deberta.embeddings.word_embeddings._weight`: that
alias is dropped after checking that it equals `word_embeddings.weight`, and used as `word_embeddings.weight` when it
is the only copy. A discriminator saved by the repository's RTD trainer with gradient-disentangled embedding sharing
(GDES) carries `_weight` for both the word and the position table: there it is the residual, and `weight` (generator
table + residual) is the table the discriminator ran, so `weight` is kept and the residuals are dropped.

Config fields the official code reads differently from transformers: the repository's `pooling` section (fine-tuned
checkpoints) becomes `pooler_hidden_act` / `pooler_dropout` / `pooler_hidden_size`, and without it a repository file's
pooler runs the model's own `hidden_act` (the official `PoolConfig`); a config.json's own `pooler_*` fields win over
the section. `pos_att_type: "none"` and `position_buckets` without relative attention are accepted as the official
code ignores them (bert_base.json); `talking_head` is refused.

A transformers-format MLM folder (DebertaV2ForMaskedLM with the non-legacy head, `position_biased_input: false`) has no
absolute position table, since transformers has no Enhanced Mask Decoder: it converts with `emd_steps=0`, the head
transformers ran, verified against transformers' ForMaskedLM logits, and the command says so.

Verification runs transformers' DebertaModel / DebertaV2Model (for a fine-tuned head, transformers' task class of the
same name) on weights that transformers loads strictly under its own names (`transformers_weights`, a table separate
from the conversion's), and compares every hidden state and the head's outputs; `HEAD_REFERENCES` says, per head,
which transformers class holds the weights and which rows compare it. The pretraining heads have no transformers
counterpart that computes what the official models compute (transformers' MLM head has no Enhanced Mask Decoder, and
there is no RTD head), so their references are built from transformers' modules:

* MLM: the official EnhancedMaskDecoder (DeBERTa/apps/models/masked_language_model.py) on transformers' encoder: its
  last layer applied twice with keys/values from transformers' `hidden_states[-2]` and queries starting from those
  plus the absolute positions, then transformers' non-legacy `lm_predictions` head. For v1, transformers' layer cannot
  take separate query states (its `in_proj` path transposes a 3-D tensor), so the last layer is rebuilt as
  transformers' DebertaV2Layer with the official repository's own v1 -> v2 weight rule (its `_pre_load_hook`).
* RTD: the official LMMaskPredictionHead (replaced_token_detection_model.py) on transformers' last hidden state:
  LayerNorm(h + h[CLS]), dense, activation, classifier.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from posformers._extras import install_hint
from posformers.configuration_deberta import OFFICIAL_COMMON_DEFAULTS, pooler_fields
from posformers.conversion import core
from posformers.conversion.core import ConversionError, log

TASK_HEADS = {  # head -> (posformers class, its tensors besides the encoder, as a regex)
    "sequence-classification": ("DebertaForSequenceClassification", r"(pooler\.dense|classifier)\.(weight|bias)"),
    "token-classification": ("DebertaForTokenClassification", r"classifier\.(weight|bias)"),
    "question-answering": ("DebertaForQuestionAnswering", r"qa_outputs\.(weight|bias)"),
}
HEAD_CLASSES = {
    "model": "DebertaModel",
    "masked-lm": "DebertaForMaskedLM",
    "rtd": "DebertaForReplacedTokenDetection",
    **{head: class_name for head, (class_name, _) in TASK_HEADS.items()},
}
HEADS = ("auto", *HEAD_CLASSES)
# `architectures` entries of config.json (transformers' class names, v1 and v2) that decide the head.
ARCHITECTURE_HEADS = {
    f"{prefix}For{task}": head
    for prefix in ("Deberta", "DebertaV2")
    for task, head in (
        ("SequenceClassification", "sequence-classification"),
        ("TokenClassification", "token-classification"),
        ("QuestionAnswering", "question-answering"),
    )
}
WORD_EMBEDDINGS = "deberta.embeddings.word_embeddings.weight"
WORD_EMBEDDINGS_ALIAS = "deberta.embeddings.word_embeddings._weight"  # a second name some safetensors files carry
POSITION_EMBEDDINGS = "deberta.embeddings.position_embeddings.weight"
# Gradient-disentangled embedding sharing (the repository's RTDModel, rtd_task.py, embedding_sharing "gdes"): the
# discriminator's tables are re-registered as `_weight` (its residual, trained) and, before each forward pass, a
# `weight` buffer = generator table (detached) + `_weight`, which the discriminator's embeddings then read and which
# its saved state holds. A discriminator on its own runs `weight`; `_weight` alone is not a table.
GDES_RESIDUALS = {
    WORD_EMBEDDINGS_ALIAS: WORD_EMBEDDINGS,
    "deberta.embeddings.position_embeddings._weight": POSITION_EMBEDDINGS,
}
ORIGINAL_WEIGHTS = ("pytorch.model*.bin", "pytorch_model*.bin")
OFFICIAL_EMD_STEPS = 2  # EnhancedMaskDecoder.emd_context_layer: `[encoder.layer[-1] for _ in range(2)]`

# What a field means when the repository's model_config.json leaves it out: its `ModelConfig` defaults and the
# `getattr(config, name, default)` fallbacks of its modules (bert.py, disentangled_attention.py, ops.py).
ORIGINAL_DEFAULTS = dict(
    OFFICIAL_COMMON_DEFAULTS,  # the same fallbacks as an HF-format config.json, except:
    padding_idx=0,
    pos_att_type="c2p",
)
# config.json entries that describe a file, not the architecture (`legacy`: which MLM head class transformers built;
# the tensors' names say it too).
NON_ARCHITECTURE_FIELDS = (
    "architectures",
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "auto_map",
    "legacy",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--head",
        choices=HEADS,
        default="auto",
        help="output class: auto (the task head named by `architectures` in config.json or held by the weights: "
        "pooler + classifier, classifier, qa_outputs; else rtd if mask_predictions.*, else masked-lm if "
        "lm_predictions.*, else model)",
    )
    parser.add_argument(
        "--vocab",
        help="tokenizer files when the source has none: spm.model (v2/v3), a directory with vocab.json + merges.txt "
        "(v1), or the repository's bpe_encoder.bin (v1)",
    )


# ---------------------------------------------------------------------------------------------------------------------
# Reading the source: an official config dict (model_type "deberta" / "deberta-v2") and the tensors
# ---------------------------------------------------------------------------------------------------------------------


def read_hf_config(source: Path) -> dict:
    path = source / "config.json"
    if not path.is_file():
        raise ConversionError(f"{source}: no config.json; --from hf needs a Hugging Face model directory")
    config = core.read_json(path)
    if config.get("model_type") not in ("deberta", "deberta-v2"):
        raise ConversionError(
            f"{path}: model_type is {config.get('model_type')!r}; --from hf converts 'deberta' or 'deberta-v2' "
            "(for the microsoft/DeBERTa repository's files use --from original)"
        )
    return pooler_fields(config, repository_format=False)


def original_weight_file(source: Path) -> Path:
    """The repository's single weight file: `pytorch.model.bin` (old releases) or `pytorch_model.bin`."""
    if source.is_file():
        return source
    if not source.is_dir():
        raise ConversionError(f"{source}: no such file or directory")
    files = sorted({file for pattern in ORIGINAL_WEIGHTS for file in source.glob(pattern)})
    if len(files) != 1:
        found = [file.name for file in files] or "none"
        raise ConversionError(f"{source}: expected one of {' / '.join(ORIGINAL_WEIGHTS)}, found {found}")
    return files[0]


def read_original_config(weight_file: Path, tensors: dict[str, torch.Tensor]) -> dict:
    """The repository's config (model_config.json beside the weights, else the state's "config" entry, as its
    `load_model_state` reads it), as an official config dict: defaults filled, `padding_idx` -> `pad_token_id`,
    model_type from the layout of the weights."""
    path = weight_file.parent / "model_config.json"
    if path.is_file():
        config = core.read_json(path)
    else:
        state = torch.load(weight_file, map_location="cpu", weights_only=True, mmap=True)
        config = state.get("config") if isinstance(state, dict) else None
        if not isinstance(config, dict):
            raise ConversionError(
                f"{weight_file.parent}: no model_config.json, and {weight_file.name} holds no 'config' entry"
            )
    fields = pooler_fields({**ORIGINAL_DEFAULTS, **config}, repository_format=True)
    fields["pad_token_id"] = fields.pop("padding_idx")
    word_embeddings = tensors.get("deberta.embeddings.word_embeddings.weight")
    if fields.get("vocab_size", -1) < 1 and word_embeddings is not None:
        fields["vocab_size"] = word_embeddings.shape[0]  # ModelConfig's -1: the vocabulary decides
    fused = any(key.endswith("attention.self.in_proj.weight") for key in tensors)
    fields["model_type"] = "deberta" if fused else "deberta-v2"
    return fields


def normalize_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder under `deberta.` (a state saved from the bare encoder has no prefix). Same tensors, new dict."""
    if any(key.startswith("deberta.") for key in tensors):
        return tensors
    return {(f"deberta.{key}" if key.startswith(("embeddings.", "encoder.")) else key): t for key, t in tensors.items()}


def resolve_embedding_aliases(tensors: dict[str, torch.Tensor]) -> bool:
    """`..._embeddings._weight` entries (in place). A GDES discriminator (`position_embeddings._weight` present too):
    its `weight` tables are the ones it ran, the `_weight` residuals are left for the key map to drop; returns True.
    Otherwise `word_embeddings._weight` is a second name of the table: renamed to `...word_embeddings.weight` when it is
    the only copy, else left for the key map to drop after checking that it holds the same values; returns False."""
    if all(residual in tensors for residual in GDES_RESIDUALS):
        missing = [table for table in GDES_RESIDUALS.values() if table not in tensors]
        if missing:
            raise ConversionError(
                f"{', '.join(missing)} missing beside the gradient-disentangled embedding sharing residuals "
                f"({', '.join(GDES_RESIDUALS)}): the discriminator's tables are the generator's plus these residuals, "
                "and the generator is not in the file"
            )
        return True
    if WORD_EMBEDDINGS_ALIAS not in tensors:
        return False
    if WORD_EMBEDDINGS not in tensors:
        tensors[WORD_EMBEDDINGS] = tensors.pop(WORD_EMBEDDINGS_ALIAS)
        log(f"note: {WORD_EMBEDDINGS_ALIAS} is the only copy of the word embeddings; used as {WORD_EMBEDDINGS}")
    elif not torch.equal(tensors[WORD_EMBEDDINGS_ALIAS], tensors[WORD_EMBEDDINGS]):
        raise ConversionError(
            f"{WORD_EMBEDDINGS_ALIAS} differs from {WORD_EMBEDDINGS}; an alias must hold the same values, so the "
            "checkpoint is inconsistent and it is not clear which table the model used"
        )
    return False


def _task_head_in(tensors: dict[str, torch.Tensor]) -> str | None:
    """The task head the tensors hold, if any: pooler + classifier, classifier alone, or qa_outputs."""
    if "qa_outputs.weight" in tensors:
        return "question-answering"
    if "classifier.weight" in tensors:
        return "sequence-classification" if "pooler.dense.weight" in tensors else "token-classification"
    return None


def choose_head(tensors: dict[str, torch.Tensor], requested: str, architectures: list | None = None) -> str:
    has_lm = any(key.startswith("lm_predictions.") for key in tensors)
    has_rtd = any(key.startswith("mask_predictions.") for key in tensors)
    if requested == "auto":
        named = next((ARCHITECTURE_HEADS[name] for name in architectures or () if name in ARCHITECTURE_HEADS), None)
        if named or (named := _task_head_in(tensors)):
            return named
        return "rtd" if has_rtd else "masked-lm" if has_lm else "model"
    if requested == "masked-lm" and not has_lm:
        raise ConversionError("--head masked-lm: the source has no lm_predictions.* tensors (no MLM head)")
    if requested == "rtd" and not has_rtd:
        raise ConversionError("--head rtd: the source has no mask_predictions.* tensors (no RTD head)")
    return requested


# ---------------------------------------------------------------------------------------------------------------------
# Target
# ---------------------------------------------------------------------------------------------------------------------


def posformers_config(official: dict):
    """posformers' DebertaConfig for an official config dict, with the defaults transformers / the official code give
    to absent fields (as `DebertaConfig.from_pretrained` does for a config.json)."""
    from posformers import DebertaConfig
    from posformers.configuration_deberta import OFFICIAL_DEFAULTS

    fields = {**OFFICIAL_DEFAULTS[official["model_type"]], **official}
    for name in ("model_type", *NON_ARCHITECTURE_FIELDS):
        fields.pop(name, None)
    if fields.get("pos_att_type") is None:
        fields["pos_att_type"] = []
    try:
        return DebertaConfig(**fields)
    except ValueError as error:
        raise ConversionError(f"the source config is not a valid DeBERTa config: {error}") from error


def key_map(
    head: str,
    keeps_positions: bool,
    drop_task_heads: bool = False,
    gdes: bool = False,
    relative_attention: bool = True,
) -> core.KeyMap:
    """Official names -> posformers names for the `head` output. keeps_positions: the output reads the absolute
    position table (input bias, or the Enhanced Mask Decoder). drop_task_heads: drop (with the reason) the tensors of
    task heads other than `head` instead of stopping on them (when the user chose `--head` explicitly). gdes: the
    source is a GDES discriminator (`resolve_embedding_aliases`), whose `_weight` tensors are residuals."""
    base = "" if head == "model" else "deberta."  # DebertaModel's own keys have no prefix
    rules = [(r"deberta\.(.+)", rf"{base}\1")]
    dropped = {r"deberta\.embeddings\.position_ids": "buffer of positions 0..n-1, not a weight"}
    if gdes:
        dropped[r"deberta\.embeddings\.(word|position)_embeddings\._weight"] = (
            "GDES residual of the discriminator's table: the table it ran (`weight` = generator table + residual) "
            "is in the file"
        )
    else:
        dropped[r"deberta\.embeddings\.word_embeddings\._weight"] = (
            "second name of the word embeddings some safetensors files carry (checked equal to "
            "deberta.embeddings.word_embeddings.weight)"
        )
    if head in TASK_HEADS:
        rules.append((TASK_HEADS[head][1], r"\g<0>"))  # posformers' task heads use transformers' names
    elif drop_task_heads:
        dropped[r"(pooler\.dense|classifier|qa_outputs)\.(weight|bias)"] = (
            f"fine-tuned task head: not part of the {HEAD_CLASSES[head]} output (--head chose it)"
        )
    if not relative_attention:
        dropped[r"deberta\.encoder\.LayerNorm\.(weight|bias)"] = (
            "LayerNorm of the relative embedding table (norm_rel_ebd): without relative attention there is no table "
            "and nothing reads it"
        )
    if not keeps_positions:
        dropped[r"deberta\.embeddings\.position_embeddings\.weight"] = (
            "absolute position table, read only by the Enhanced Mask Decoder of the MLM head; the "
            f"{HEAD_CLASSES[head]} output does not add absolute positions (position_biased_input is false)"
        )
    if head == "masked-lm":
        rules.append(
            (r"lm_predictions\.lm_head\.((?:dense|LayerNorm)\.(?:weight|bias)|bias)", r"lm_predictions.lm_head.\1")
        )
    else:
        dropped[r"lm_predictions\..+"] = (
            "MLM head (lm_predictions): in v3 discriminator checkpoints it was not trained by their replaced token "
            "detection objective; --head masked-lm keeps it instead"
            if head == "rtd"
            else "MLM head (lm_predictions): not part of the DebertaModel output (--head masked-lm keeps it)"
        )
    if head == "rtd":
        rules += [
            (r"mask_predictions\.(dense|LayerNorm)\.(weight|bias)", r"mask_predictions.\1.\2"),
            # the repository's LMMaskPredictionHead spells it `classifer`; the Hub checkpoints `classifier`
            (r"mask_predictions\.classifi?er\.(weight|bias)", r"mask_predictions.classifier.\1"),
        ]
    else:
        dropped[r"mask_predictions\..+"] = (
            f"replaced token detection head (mask_predictions): not part of the {HEAD_CLASSES[head]} output "
            "(--head rtd keeps it)"
        )
    return core.KeyMap(rules, dropped)


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------


def load_tokenizer(source_dir: Path, vocab: str | None, version: str):
    """The source's tokenizer: SentencePiece (`spm.model`) for v2/v3, GPT-2 BPE for v1 (HF `vocab.json` +
    `merges.txt`, or the repository's `bpe_encoder.bin`, converted). None, with a note, when there is none."""
    location = core.tokenizer_location(vocab, source_dir)
    try:
        if version == "deberta-v2":
            return _sentencepiece_tokenizer(location, explicit=bool(vocab))
        return _bpe_tokenizer(location, explicit=bool(vocab))
    except ImportError as error:
        raise ConversionError(
            f"{location}: reading spm.model needs sentencepiece and protobuf, the sentencepiece extra: "
            f"{install_hint('sentencepiece')} (or pass --vocab a folder with tokenizer.json)"
        ) from error
    except (OSError, ValueError) as error:
        raise ConversionError(f"{location}: could not load the DeBERTa tokenizer ({error})") from error


# DebertaV2Tokenizer's inputs: token types even though v3 has type_vocab_size 0 (its embeddings ignore them).
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]


def _sentencepiece_tokenizer(location: Path, explicit: bool):
    from transformers import PreTrainedTokenizerFast

    if location.is_file():
        return spm_unigram_tokenizer(location)
    if (location / "spm.model").is_file():
        return spm_unigram_tokenizer(location / "spm.model", _tokenizer_options(location))
    if (location / "tokenizer.json").is_file():
        # read as it is: transformers 5's DebertaV2Tokenizer would rebuild the normalizer without the model's map
        return PreTrainedTokenizerFast.from_pretrained(location, model_input_names=MODEL_INPUT_NAMES)
    return core.no_tokenizer(location, "spm.model or tokenizer.json", explicit)


def _tokenizer_options(folder: Path) -> dict:
    """`do_lower_case` / `split_by_punct` of a Hub folder's tokenizer_config.json (the v2/v3 tokenizer's options)."""
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    return {key: bool(config.get(key, False)) for key in ("do_lower_case", "split_by_punct")}


def spm_unigram_tokenizer(spm_file: Path, options: dict | None = None):
    """The v2/v3 `spm.model` as a `tokenizers` Unigram (tokenizer.json), built once here so that the output loads
    with AutoTokenizer where sentencepiece is not installed.

    transformers' own `DebertaV2Converter` builds it: the pieces and scores, the model's precompiled normalization map
    (NFKC for Microsoft's models), whitespace handling and `[CLS] A [SEP] B [SEP]`; its ids equal sentencepiece's. The
    tokenizer is saved as a plain `PreTrainedTokenizerFast`, since transformers 5's `DebertaV2Tokenizer` rebuilds the
    normalizer on load without that map (it gives other ids on text NFKC changes: "ﬁ", full-width letters)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import DebertaV2Converter, import_protobuf

    options = {"do_lower_case": False, "split_by_punct": False, **(options or {})}
    proto = import_protobuf().ModelProto()
    proto.ParseFromString(spm_file.read_bytes())
    vocab = {piece.piece: index for index, piece in enumerate(proto.pieces)}
    special = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
    special["mask_token"] = "[MASK]"
    missing = [token for token in special.values() if token not in vocab]
    if missing:
        raise ConversionError(f"{spm_file}: no {', '.join(missing)} piece (not a DeBERTa SentencePiece model)")
    spm_tokenizer = SimpleNamespace(
        vocab_file=str(spm_file), add_prefix_space=True, convert_tokens_to_ids=vocab.__getitem__, **options
    )
    backend = DebertaV2Converter(spm_tokenizer).converted()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **special,
        bos_token="[CLS]",
        eos_token="[SEP]",
        model_input_names=MODEL_INPUT_NAMES,
    )
    tokenizer.init_kwargs.update(options)
    log(f"tokenizer: {spm_file.name} as a tokenizers Unigram ({len(vocab)} pieces)")
    return tokenizer


def _bpe_tokenizer(location: Path, explicit: bool):
    from transformers import AutoTokenizer, DebertaTokenizer

    encoder = location if location.is_file() else location / "bpe_encoder.bin"
    if location.is_dir() and (location / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(location)
    if location.is_dir() and (location / "vocab.json").is_file() and (location / "merges.txt").is_file():
        return DebertaTokenizer.from_pretrained(location)
    if encoder.is_file():
        with tempfile.TemporaryDirectory() as directory:
            write_bpe_files(encoder, Path(directory))
            return DebertaTokenizer.from_pretrained(directory)
    return core.no_tokenizer(location, "vocab.json + merges.txt or bpe_encoder.bin", explicit)


def write_bpe_files(encoder_file: Path, directory: Path) -> None:
    """The repository's `bpe_encoder.bin` as HF `vocab.json` + `merges.txt`, with DeBERTa's ids.

    The file (read with `weights_only=True`: it holds only dicts, lists and strings) has GPT-2's `encoder` (token ->
    GPT-2 id), `vocab` (the BPE merges) and `dict_map` (fairseq's dictionary: GPT-2 ids as strings, with counts).
    Its GPT2Tokenizer numbers [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, then each new `dict_map` symbol in order, then
    [MASK]; the same numbering goes into vocab.json, so ids match the embeddings.
    """
    state = torch.load(encoder_file, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not {"encoder", "vocab", "dict_map"} <= set(state):
        raise ConversionError(
            f"{encoder_file}: expected a dict with 'encoder', 'vocab' and 'dict_map' (bpe_encoder.bin)"
        )
    token_of_id = {gpt2_id: token for token, gpt2_id in state["encoder"].items()}
    vocab: dict[str, int] = {}
    for symbol in ("[PAD]", "[CLS]", "[SEP]", "[UNK]"):
        vocab.setdefault(symbol, len(vocab))
    for word, _count in state["dict_map"]:
        token = token_of_id.get(int(word), word) if str(word).isdigit() else word
        vocab.setdefault(token, len(vocab))
    vocab.setdefault("[MASK]", len(vocab))
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in state["vocab"]]
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------------
# Verification against transformers
# ---------------------------------------------------------------------------------------------------------------------


def transformers_weights(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Source tensors grouped under transformers' names, independently of `key_map`: "encoder" (DebertaModel /
    DebertaV2Model keys), "lm_head" (the non-legacy `lm_predictions.lm_head.*` of transformers' ...ForMaskedLM),
    "mask_predictions" (the RTD head, for the official head's formula), "positions" (the absolute table) and
    "task_head" (`pooler.*`, `classifier.*`, `qa_outputs.*` of transformers' task classes, full names)."""
    groups: dict[str, dict[str, torch.Tensor]] = {
        "encoder": {},
        "lm_head": {},
        "mask_predictions": {},
        "positions": {},
        "task_head": {},
    }
    tensors = dict(tensors)
    resolve_embedding_aliases(tensors)
    for residual in GDES_RESIDUALS:  # an alias checked equal, or a GDES residual: not a table transformers reads
        tensors.pop(residual, None)
    for key, tensor in tensors.items():
        tensor = tensor.float()
        if key == "deberta.embeddings.position_embeddings.weight":
            groups["positions"]["weight"] = tensor
        if key.startswith(("pooler.", "classifier.", "qa_outputs.")):
            groups["task_head"][key] = tensor
        if key.startswith("deberta.") and not key.endswith("position_ids"):
            groups["encoder"][key.removeprefix("deberta.")] = tensor
        elif key.startswith("lm_predictions.lm_head."):
            groups["lm_head"][key] = tensor
        elif key.startswith("mask_predictions."):
            groups["mask_predictions"][key.removeprefix("mask_predictions.").replace("classifer.", "classifier.")] = (
                tensor
            )
    return groups


def transformers_config(official: dict):
    """transformers' DebertaConfig / DebertaV2Config for the same official fields (non-legacy MLM head)."""
    import transformers

    fields = {key: value for key, value in official.items() if key not in ("model_type", *NON_ARCHITECTURE_FIELDS)}
    config_class = transformers.DebertaConfig if official["model_type"] == "deberta" else transformers.DebertaV2Config
    return config_class(**fields, legacy=False)


def load_reference(official: dict, weights: dict[str, dict[str, torch.Tensor]], head: HeadReference):
    """transformers' `Deberta`/`DebertaV2` + `head.transformers_class` holding the source weights (the encoder, and
    the `head.head_weights` group for a head class), loaded strictly: a tensor transformers does not expect, or one it
    lacks, stops the verification with its name."""
    import transformers

    config = transformers_config(official)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    prefix = "Deberta" if official["model_type"] == "deberta" else "DebertaV2"
    encoder = weights["encoder"]
    if not config.position_biased_input:
        encoder = {key: value for key, value in encoder.items() if key != "embeddings.position_embeddings.weight"}
    model_class = getattr(transformers, prefix + head.transformers_class)
    if head.head_weights is None:
        state = encoder
    else:
        state = {f"deberta.{key}": value for key, value in encoder.items()}
        state.update(weights[head.head_weights])
    with torch.device("meta"):  # no memory and no random initialisation: the weights are assigned below
        model = model_class(config)
    try:
        model.load_state_dict(state, strict=True, assign=True)
        _materialize_position_ids(model)
    except RuntimeError as error:
        raise ConversionError(
            f"verification: transformers' {type(model).__name__} refused the weights: {error}"
        ) from error
    return model.eval()


def _materialize_position_ids(model) -> None:
    """transformers' DeBERTa embeddings keep `position_ids` (0..n-1) as a non-persistent buffer, which a model built
    on the meta device lacks after loading; any other buffer left there is an error."""
    for name, buffer in model.named_buffers():
        if buffer.is_meta:
            if not name.endswith("position_ids"):
                raise RuntimeError(f"buffer {name} has no value")
            module = model.get_submodule(name.rpartition(".")[0])
            module.position_ids = torch.arange(buffer.shape[-1]).expand(buffer.shape)


def v2_layer_from_v1(layer, config):
    """transformers' DebertaV2Layer computing what v1 `layer` computes, with the official repository's rule for
    loading v1 weights into its v2 attention (disentangled_attention.py, `_pre_load_hook`): `in_proj` rows are
    [query, key, value] per head, `q_bias`/`v_bias` are the query/value biases, the key has none, `pos_proj` is the
    bias-free position-key projection and `pos_q_proj` the position-query projection."""
    import transformers
    from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Layer

    v2_config = transformers.DebertaV2Config(
        **{key: getattr(config, key) for key in ("hidden_size", "num_attention_heads", "intermediate_size")},
        hidden_act=config.hidden_act,
        layer_norm_eps=config.layer_norm_eps,
        relative_attention=config.relative_attention,
        pos_att_type=list(config.pos_att_type or []),
        max_relative_positions=config.max_relative_positions,
        max_position_embeddings=config.max_position_embeddings,
        position_buckets=-1,
        share_att_key=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    state = dict(layer.state_dict())
    heads, hidden = config.num_attention_heads, config.hidden_size
    query, key, value = state.pop("attention.self.in_proj.weight").reshape(heads, 3, -1, hidden).unbind(1)
    state["attention.self.query_proj.weight"] = query.reshape(-1, hidden)
    state["attention.self.key_proj.weight"] = key.reshape(-1, hidden)
    state["attention.self.value_proj.weight"] = value.reshape(-1, hidden)
    state["attention.self.query_proj.bias"] = state.pop("attention.self.q_bias")
    state["attention.self.value_proj.bias"] = state.pop("attention.self.v_bias")
    state["attention.self.key_proj.bias"] = torch.zeros_like(state["attention.self.query_proj.bias"])
    if "attention.self.pos_proj.weight" in state:
        state["attention.self.pos_key_proj.weight"] = state.pop("attention.self.pos_proj.weight")
        state["attention.self.pos_key_proj.bias"] = torch.zeros_like(state["attention.self.query_proj.bias"])
    for name in ("weight", "bias"):
        if f"attention.self.pos_q_proj.{name}" in state:
            state[f"attention.self.pos_query_proj.{name}"] = state.pop(f"attention.self.pos_q_proj.{name}")
    v2_layer = DebertaV2Layer(v2_config)
    v2_layer.load_state_dict(state, strict=True)
    return v2_layer.eval()


def reference_emd_logits(reference, position_table: torch.Tensor, batch: dict, steps: int, version: str):
    """The official Enhanced Mask Decoder on transformers' encoder, then transformers' non-legacy MLM head.

    reference: transformers' ...ForMaskedLM (legacy=False); position_table: (max_positions, hidden).
    Returns logits (B, L, vocab).
    """
    deberta = reference.deberta
    encoder = deberta.encoder
    outputs = deberta(**batch, output_hidden_states=True)
    kv_states = outputs.hidden_states[-2]  # the input of the last layer
    layer = encoder.layer[-1] if version == "deberta-v2" else v2_layer_from_v1(encoder.layer[-1], reference.config)
    attention_mask = encoder.get_attention_mask(batch["attention_mask"])
    relative_pos = encoder.get_rel_pos(kv_states)  # v1: plain distances i - j, which the v2 layer reads alike
    rel_embeddings = encoder.get_rel_embedding()
    query_states = kv_states + position_table[: kv_states.shape[1]]
    for _ in range(steps):
        query_states = layer(
            kv_states,
            attention_mask,
            query_states=query_states,
            relative_pos=relative_pos,
            rel_embeddings=rel_embeddings,
        )[0]
    return reference.lm_predictions(query_states, deberta.embeddings.word_embeddings)


def reference_rtd_logits(last_hidden_state: torch.Tensor, head: dict[str, torch.Tensor], config) -> torch.Tensor:
    """The official LMMaskPredictionHead: LayerNorm(h + h[CLS]), dense, activation, classifier -> (B, L)."""
    from transformers.activations import ACT2FN

    states = F.layer_norm(
        last_hidden_state[:, :1] + last_hidden_state,
        (last_hidden_state.shape[-1],),
        head["LayerNorm.weight"],
        head["LayerNorm.bias"],
        config.layer_norm_eps,
    )
    states = ACT2FN[config.hidden_act](F.linear(states, head["dense.weight"], head["dense.bias"]))
    return F.linear(states, head["classifier.weight"], head["classifier.bias"]).squeeze(-1)


@dataclass
class VerificationRun:
    """What a head's rows compare: our model's outputs, the reference (transformers' model holding the source
    weights), its base model's outputs, the batch, the source weights grouped by `transformers_weights`, the official
    config dict and our config."""

    ours: ModelOutput
    reference: nn.Module
    expected: ModelOutput
    batch: dict[str, torch.Tensor]
    weights: dict[str, dict[str, torch.Tensor]]
    official: dict
    config: object


Rows = dict[str, tuple[torch.Tensor, torch.Tensor]]  # row name -> (ours, reference)


def mlm_rows(run: VerificationRun) -> Rows:
    """The official MLM head: the Enhanced Mask Decoder (two passes of the last layer) on transformers' encoder, unless
    the absolute positions are already added at the input; then transformers' non-legacy `lm_predictions`. A model
    converted with emd_steps=0 (a transformers-format MLM) compares with transformers' ForMaskedLM itself."""
    reference = run.reference
    if reference.config.position_biased_input:
        logits = reference.lm_predictions(run.expected.last_hidden_state, reference.deberta.embeddings.word_embeddings)
        return {"MLM logits": (run.ours.logits, logits)}
    if not run.config.uses_emd:  # a transformers-format MLM (HFSource.without_position_table): transformers' logits
        return {"MLM logits (emd_steps=0, as transformers)": (run.ours.logits, reference(**run.batch).logits)}
    positions = run.weights["positions"].get("weight")
    if positions is None:
        raise ConversionError("verification: the source has no absolute position table")
    logits = reference_emd_logits(reference, positions, run.batch, OFFICIAL_EMD_STEPS, run.official["model_type"])
    return {f"MLM logits (Enhanced Mask Decoder, {OFFICIAL_EMD_STEPS} steps)": (run.ours.logits, logits)}


def rtd_rows(run: VerificationRun) -> Rows:
    logits = reference_rtd_logits(run.expected.last_hidden_state, run.weights["mask_predictions"], run.config)
    return {"RTD logits": (run.ours.logits, logits)}


def output_rows(rows: dict[str, str]) -> Callable[[VerificationRun], Rows]:
    """Rows comparing outputs of ours and of transformers' task class of the same name: {row name: output field}."""

    def compare(run: VerificationRun) -> Rows:
        theirs = run.reference(**run.batch)
        return {name: (run.ours[field], theirs[field]) for name, field in rows.items()}

    return compare


@dataclass(frozen=True)
class HeadReference:
    """How one output class is verified: the transformers class holding the source weights (after `Deberta` /
    `DebertaV2`), the `transformers_weights` group its head loads (None: the encoder alone), and the rows that compare
    the head's outputs with the reference."""

    transformers_class: str
    rows: Callable[[VerificationRun], Rows]
    head_weights: str | None = None
    per_token: bool = True  # outputs per position: padded positions are zeroed on both sides before comparing


# --head -> its reference. transformers has no class that computes what the official MLM (Enhanced Mask Decoder) and
# RTD heads compute, so those two are built from transformers' modules (module docstring).
HEAD_REFERENCES = {
    "model": HeadReference("Model", lambda run: {}),
    "masked-lm": HeadReference("ForMaskedLM", mlm_rows, head_weights="lm_head"),
    "rtd": HeadReference("Model", rtd_rows),
    "sequence-classification": HeadReference(
        "ForSequenceClassification",
        output_rows({"sequence classification logits": "logits"}),
        head_weights="task_head",
        per_token=False,
    ),
    "token-classification": HeadReference(
        "ForTokenClassification", output_rows({"token classification logits": "logits"}), head_weights="task_head"
    ),
    "question-answering": HeadReference(
        "ForQuestionAnswering",
        output_rows({"QA start logits": "start_logits", "QA end logits": "end_logits"}),
        head_weights="task_head",
    ),
}


def verify(model, head: str, official: dict, weight_source: Path) -> dict[str, float]:
    """Run posformers' model and `head`'s reference (`HEAD_REFERENCES`) on one fixed batch: every hidden state, then
    the head's rows; print and return the diffs."""
    config = model.config
    weights = transformers_weights(normalize_keys(core.load_tensors(weight_source)))
    head_reference = HEAD_REFERENCES[head]
    reference = load_reference(official, weights, head_reference)
    batch = core.verification_batch(config.vocab_size, config.type_vocab_size)
    mask = batch["attention_mask"]
    with torch.no_grad():
        ours = model(**batch, output_hidden_states=True)
        expected = reference.base_model(**batch, output_hidden_states=True)
        head_rows = head_reference.rows(VerificationRun(ours, reference, expected, batch, weights, official, config))

    def stacked(states):
        return torch.stack([core.masked_hidden(state, mask) for state in states])

    layers = len(expected.hidden_states) - 1
    pairs = {
        f"hidden states (embeddings + {layers} layers)": (stacked(ours.hidden_states), stacked(expected.hidden_states)),
        "last hidden state": (
            core.masked_hidden(ours.hidden_states[-1], mask),
            core.masked_hidden(expected.last_hidden_state, mask),
        ),
    }
    for name, (our_output, reference_output) in head_rows.items():
        if head_reference.per_token:
            our_output, reference_output = (
                core.masked_hidden(our_output, mask),
                core.masked_hidden(reference_output, mask),
            )
        pairs[name] = (our_output, reference_output)
    return core.compare_outputs(pairs)


# ---------------------------------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------------------------------


class DebertaSource(core.Source):
    """What both formats share once the official config dict and the tensors are read: the head, the config, the
    key map, verification and the tokenizer."""

    format_name = ""
    # `DebertaConfig.clip_relative_positions`: the arithmetic the source's weights ran past max_relative_positions
    clip_relative_positions = True

    @abstractmethod
    def read(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The official config dict and the source tensors (the encoder under `deberta.`); sets `weight_source` (the
        weights, read again by verification) and `tokenizer_dir`."""

    def load(self) -> dict[str, torch.Tensor]:
        import posformers

        self.official, tensors = self.read()
        self.gdes = resolve_embedding_aliases(tensors)
        if self.gdes:
            log(
                "note: a discriminator trained with gradient-disentangled embedding sharing (GDES): its word and "
                "position tables are the `weight` tensors it ran (generator table + `_weight` residual)"
            )
        self.head = choose_head(tensors, self.args.head, self.official.get("architectures"))
        labelled = self.head in ("sequence-classification", "token-classification") and "classifier.weight" in tensors
        if labelled and not {"id2label", "num_labels"} & set(self.official):  # no labels in config.json: the rows
            self.official = {**self.official, "num_labels": tensors["classifier.weight"].shape[0]}
        self.config = posformers_config(self.official)
        self.config.clip_relative_positions = self.clip_relative_positions
        if self.head == "masked-lm" and self.config.uses_emd and POSITION_EMBEDDINGS not in tensors:
            self.without_position_table()
        self.model_class = getattr(posformers, HEAD_CLASSES[self.head])
        self.keeps_positions = self.config.position_biased_input or (self.head == "masked-lm" and self.config.uses_emd)
        self.version = "v1" if self.official["model_type"] == "deberta" else "v2/v3"
        log(
            f"source: DeBERTa {self.version} ({self.args.source_format} format) {self.path} -> "
            f"{self.model_class.__name__}"
        )
        return tensors

    def without_position_table(self) -> None:
        """An MLM source without the absolute position table, which the Enhanced Mask Decoder reads: refused by
        default (the key accounting names the missing table); `HFSource` converts it."""

    def key_map(self) -> core.KeyMap:
        return key_map(
            self.head,
            self.keeps_positions,
            drop_task_heads=self.args.head != "auto",
            gdes=self.gdes,
            relative_attention=self.config.relative_attention,
        )

    def complete(self, target, report):
        stored_dtypes = sorted({str(tensor.dtype).removeprefix("torch.") for tensor in target.values()})
        self.notes.append(
            f"Output class: {self.model_class.__name__}; source tensors stored as {', '.join(stored_dtypes)}."
        )
        for key in list(target):  # fp16 storage: compute and verify in fp32; --dtype decides what is saved
            target[key] = target[key].float()
        return target

    def verify(self, model) -> dict[str, float]:
        return verify(model, self.head, self.official, self.weight_source)

    def tokenizer(self):
        return load_tokenizer(self.tokenizer_dir, self.args.vocab, self.official["model_type"])

    def describe(self) -> str:
        return f"the DeBERTa {self.version} checkpoint `{self.path}` ({self.format_name})"


class HFSource(DebertaSource):
    help = "Microsoft's checkpoints on the Hub (config.json)"
    format_name = "Hugging Face format"
    # A folder in transformers' format ran transformers' unclipped buckets (a fine-tune saved by its classes learned
    # them; Microsoft's pretrained ones never met a distance where the two differ): the output keeps its answers.
    clip_relative_positions = False

    def read(self) -> tuple[dict, dict[str, torch.Tensor]]:
        official = read_hf_config(self.path)
        self.weight_source = self.tokenizer_dir = self.path
        return official, normalize_keys(core.load_tensors(self.path))

    def without_position_table(self) -> None:
        # A folder saved by transformers' DebertaV2ForMaskedLM (non-legacy head, position_biased_input false): its
        # embeddings have no absolute table, since transformers has no Enhanced Mask Decoder; its LM head reads the
        # encoder output. That is the head it ran and was trained with, so it converts with the EMD off.
        self.config.emd_steps = 0
        message = (
            f"the source has no absolute position table ({POSITION_EMBEDDINGS}), which the Enhanced Mask Decoder "
            "reads: a transformers-format MLM, whose head reads the encoder output; converted with emd_steps=0 (no "
            "Enhanced Mask Decoder), verified against transformers' ForMaskedLM logits"
        )
        log(f"note: {message}")
        self.notes.append(message[0].upper() + message[1:] + ".")


class OriginalSource(DebertaSource):
    help = "microsoft/DeBERTa release files (pytorch.model.bin + model_config.json)"
    format_name = "microsoft/DeBERTa repository format"
    license = "mit"  # the microsoft/DeBERTa repository's, under which its checkpoints are released

    def read(self) -> tuple[dict, dict[str, torch.Tensor]]:
        self.weight_source = original_weight_file(self.path)
        self.tokenizer_dir = self.weight_source.parent
        tensors = normalize_keys(core.load_tensors(self.weight_source))
        return read_original_config(self.weight_source, tensors), tensors


SOURCES = {"hf": HFSource, "original": OriginalSource}
