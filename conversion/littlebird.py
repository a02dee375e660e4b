"""`posformers-convert littlebird --from {bert,roberta}`: initialise LittleBird from a pretrained short-input encoder.

This is the initialisation of the LittleBird paper (section "Distillation from a short-input model", see
docs/littlebird.md): the student takes the teacher's

* word and token-type embeddings and the embedding LayerNorm,
* in every layer, the self-attention Q/K/V and output projection (into the unpack & sliding-window attention, whose
  projections are named and shaped like BERT's on purpose), the feed-forward block and both LayerNorms,
* the MLM head when the source has one (`cls.predictions.*` for BERT, `lm_head.*` for RoBERTa); the output is then a
  `LittleBirdForMaskedLM`, otherwise a `LittleBirdModel`.

Dropped on purpose: the absolute position table (LittleBird has no absolute positions: BiALiBi is its only position
signal and there is no maximum length; RoBERTa's padding_idx offset of positions goes with it), the pooler and the
next-sentence head (LittleBird's heads have neither), buffers, and the MLM decoder, which is tied to the word
embeddings (checked equal first). New, initialised fresh as a LittleBird model initialises them: P0
(`embeddings.pack_embeddings`, N(0, 1): at the tokens' scale, so the pack starts as s distinct slots), each layer's
pack attention and its LayerNorm (all but the last layer, which computes no pack update), and the BiALiBi slopes
(alpha, beta, gamma at the ALiBi geometric slopes). They are listed in the output as "new".

Verification compares what can be compared before any training: the teacher's embedding output (transformers'
BertModel / RobertaModel with its position table zeroed, i.e. minus the position embeddings) against LittleBird's, the
MLM head on the same hidden states, and checks that every copied tensor is identical to the teacher's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from posformers.conversion import core
from posformers.conversion.core import ConversionError, log

FORMATS = {"bert": "bert", "roberta": "roberta"}  # --from -> the model_type the source config.json must have

# Teacher sub-modules each student layer takes over unchanged (same names on both sides).
_LAYER_PARTS = (
    r"attention\.self\.(?:query|key|value)",
    r"attention\.output\.dense",
    r"attention\.output\.LayerNorm",
    r"intermediate\.dense",
    r"output\.dense",
    r"output\.LayerNorm",
)
# Config fields LittleBird takes from the teacher's config as they are.
TEACHER_CONFIG_FIELDS = (*core.BERT_ENCODER_FIELDS, "pad_token_id")
# Parameters LittleBird has and BERT/RoBERTa do not: initialised fresh (regexes over LittleBirdModel's names).
NEW_PARAMETERS = {
    r"embeddings\.pack_embeddings": "P0 (embeddings.pack_embeddings, drawn from N(0, 1): posformers' choice)",
    r"encoder\.layer\.\d+\.pack_attention\..+": (
        "each layer's pack attention and its LayerNorm, the last layer's without (pack_attention.*)"
    ),
    r"encoder\.layer\.\d+\.attention\.self\.(?:alpha|beta|gamma)": "BiALiBi slopes (attention.self.alpha/beta/gamma)",
}
POSITION_REASON = (
    "absolute position table: LittleBird has no absolute positions (BiALiBi is its only position signal, so there is "
    "no maximum length); the paper drops it"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--block-size", type=int, default=64, help="tokens per sliding-window block (default 64)")
    parser.add_argument("--pack-length", type=int, default=64, help="number of pack states P0 (default 64)")
    parser.add_argument(
        "--vocab",
        help="tokenizer files when the source directory has none: a directory with vocab.txt (BERT) or "
        "vocab.json + merges.txt (RoBERTa), or the vocab.txt file itself",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fresh parameters (default 0)")


# ---------------------------------------------------------------------------------------------------------------------
# Source
# ---------------------------------------------------------------------------------------------------------------------


def read_teacher_config(source: Path, source_format: str):
    """The source's transformers config (BertConfig / RobertaConfig), checked against --from."""
    from transformers import AutoConfig

    if not (source / "config.json").is_file():
        raise ConversionError(f"{source}: no config.json; --source must be a {source_format} model directory")
    config = AutoConfig.from_pretrained(source)
    if config.model_type != FORMATS[source_format]:
        raise ConversionError(
            f"{source}/config.json says model_type {config.model_type!r}, but --from {source_format} expects "
            f"{FORMATS[source_format]!r}"
        )
    return config


def normalize_keys(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Source keys in one spelling: the base model under `prefix.` (checkpoints saved from a bare BertModel have no
    prefix) and LayerNorm `weight`/`bias` (Google's original BERT conversions, e.g. bert-base-uncased's
    pytorch_model.bin, say `gamma`/`beta`). Same tensors, new dict."""
    bare = not any(key.startswith(prefix + ".") for key in tensors)
    renamed = {}
    for key, tensor in tensors.items():
        if bare and key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = f"{prefix}.{key}"
        if ".LayerNorm." in key or ".layer_norm." in key:
            key = key.removesuffix(".gamma") + ".weight" if key.endswith(".gamma") else key
            key = key.removesuffix(".beta") + ".bias" if key.endswith(".beta") else key
        renamed[key] = tensor
    return renamed


def mlm_keys(source_format: str) -> dict[str, str]:
    """The teacher's MLM head parameters -> LittleBirdForMaskedLM's (`cls.predictions.*`, BERT's layout)."""
    if source_format == "bert":
        return {
            "cls.predictions.transform.dense.weight": "cls.predictions.transform.dense.weight",
            "cls.predictions.transform.dense.bias": "cls.predictions.transform.dense.bias",
            "cls.predictions.transform.LayerNorm.weight": "cls.predictions.transform.LayerNorm.weight",
            "cls.predictions.transform.LayerNorm.bias": "cls.predictions.transform.LayerNorm.bias",
            "cls.predictions.bias": "cls.predictions.bias",
        }
    return {
        "lm_head.dense.weight": "cls.predictions.transform.dense.weight",
        "lm_head.dense.bias": "cls.predictions.transform.dense.bias",
        "lm_head.layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
        "lm_head.layer_norm.bias": "cls.predictions.transform.LayerNorm.bias",
        "lm_head.bias": "cls.predictions.bias",
    }


def tied_decoder_keys(source_format: str) -> tuple[str, str, str]:
    """(decoder weight, decoder bias, the head's bias) of the teacher's MLM head."""
    head = "cls.predictions" if source_format == "bert" else "lm_head"
    return f"{head}.decoder.weight", f"{head}.decoder.bias", f"{head}.bias"


def check_tied_decoder(tensors: dict[str, torch.Tensor], source_format: str, prefix: str) -> None:
    """LittleBirdForMaskedLM ties its decoder to the word embeddings (and its bias to the head's bias), as BERT and
    RoBERTa do; a source whose stored decoder differs would lose weights, so it is refused."""
    decoder_weight, decoder_bias, head_bias = tied_decoder_keys(source_format)
    for key, tied_to in ((decoder_weight, f"{prefix}.embeddings.word_embeddings.weight"), (decoder_bias, head_bias)):
        if key in tensors and tied_to in tensors and not torch.equal(tensors[key], tensors[tied_to]):
            raise ConversionError(
                f"{key} differs from {tied_to}: this checkpoint does not tie its MLM decoder, and LittleBird's is "
                "tied, so converting it would lose weights"
            )


def key_map(source_format: str, prefix: str, with_head: bool) -> core.KeyMap:
    """Teacher names (after `normalize_keys`) -> LittleBird names."""
    base = "littlebird." if with_head else ""  # LittleBirdModel's own keys have no prefix
    p = prefix
    rules = [
        (rf"{p}\.embeddings\.(word_embeddings|token_type_embeddings)\.weight", rf"{base}embeddings.\1.weight"),
        (rf"{p}\.embeddings\.LayerNorm\.(weight|bias)", rf"{base}embeddings.LayerNorm.\1"),
        (
            rf"{p}\.encoder\.layer\.(\d+)\.({'|'.join(_LAYER_PARTS)})\.(weight|bias)",
            rf"{base}encoder.layer.\1.\2.\3",
        ),
    ]
    head_reason = "MLM head of the teacher: the output is a LittleBirdModel (the source has no complete MLM head)"
    dropped = {
        rf"{p}\.embeddings\.position_embeddings\.weight": POSITION_REASON,
        rf"{p}\.embeddings\.(position_ids|token_type_ids)": "buffer of the teacher's embeddings, not a weight",
        rf"{p}\.pooler\.dense\.(weight|bias)": "pooler (dense + tanh on the first token): LittleBird's heads have none",
        r"cls\.seq_relationship\.(weight|bias)": "next-sentence-prediction head: LittleBird has none",
    }
    decoder_weight, decoder_bias, _ = tied_decoder_keys(source_format)
    if with_head:
        rules += [(_literal(key), value) for key, value in mlm_keys(source_format).items()]
        dropped[_literal(decoder_weight)] = "MLM decoder: tied to the word embeddings (checked equal)"
        dropped[_literal(decoder_bias)] = "MLM decoder bias: tied to the head's bias (checked equal)"
    else:
        for key in (*mlm_keys(source_format), decoder_weight, decoder_bias):
            dropped[_literal(key)] = head_reason
    return core.KeyMap(rules, dropped)


def _literal(key: str) -> str:
    return key.replace(".", r"\.")


def has_mlm_head(tensors: dict[str, torch.Tensor], source_format: str) -> bool:
    """Whether every tensor of the teacher's MLM head is there (a partial head is not carried over)."""
    return all(key in tensors for key in mlm_keys(source_format))


# ---------------------------------------------------------------------------------------------------------------------
# Target
# ---------------------------------------------------------------------------------------------------------------------


def littlebird_config(teacher_config, block_size: int, pack_length: int):
    """The LittleBird config with the teacher's sizes; no max_position_embeddings (LittleBird has no limit)."""
    from posformers import LittleBirdConfig

    fields = {name: getattr(teacher_config, name) for name in TEACHER_CONFIG_FIELDS}
    fields.update(
        bos_token_id=getattr(teacher_config, "bos_token_id", None),
        eos_token_id=getattr(teacher_config, "eos_token_id", None),
        block_size=block_size,
        pack_length=pack_length,
    )
    try:
        return LittleBirdConfig(**fields)
    except ValueError as error:
        raise ConversionError(f"the teacher's config does not give a valid LittleBird config: {error}") from error


def fresh_parameters(model_class, config, seed: int) -> dict[str, torch.Tensor]:
    """The parameters LittleBird adds (`NEW_PARAMETERS`), initialised as a new LittleBird model initialises them."""
    import re

    torch.manual_seed(seed)
    model = model_class(config)
    prefix = "littlebird." if hasattr(model, "littlebird") else ""
    patterns = [re.compile(prefix.replace(".", r"\.") + pattern) for pattern in NEW_PARAMETERS]
    return {
        key: value.detach().clone()
        for key, value in model.state_dict().items()
        if any(pattern.fullmatch(key) for pattern in patterns)
    }


def load_tokenizer(source: Path, vocab: str | None, source_format: str):
    """The teacher's tokenizer, from --vocab or the source directory; None (with a note) when there is none. Its
    `model_max_length` (BERT's and RoBERTa's 512) is dropped: LittleBird has no position limit, and the teacher's
    would truncate or warn at 512 tokens."""
    tokenizer = _teacher_tokenizer(source, vocab, source_format)
    if tokenizer is not None:
        from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

        tokenizer.model_max_length = VERY_LARGE_INTEGER  # what transformers writes for "no limit"
    return tokenizer


def _teacher_tokenizer(source: Path, vocab: str | None, source_format: str):
    from transformers import AutoTokenizer, BertTokenizer, RobertaTokenizer

    location = core.tokenizer_location(vocab, source)
    tokenizer_class = BertTokenizer if source_format == "bert" else RobertaTokenizer
    needed = ["vocab.txt"] if source_format == "bert" else ["vocab.json", "merges.txt"]
    if location.is_file():
        if source_format != "bert" or location.name != "vocab.txt":
            raise ConversionError(f"--vocab {location}: give a directory holding {' + '.join(needed)}")
        return tokenizer_class.from_pretrained(location.parent)
    has_tokenizer = (location / "tokenizer.json").is_file() or all((location / name).is_file() for name in needed)
    if not has_tokenizer:
        return core.no_tokenizer(location, f"tokenizer.json or {' + '.join(needed)}", explicit=bool(vocab))
    try:
        if (location / "config.json").is_file() or (location / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(location)
        return tokenizer_class.from_pretrained(location)
    except (OSError, ValueError) as error:
        raise ConversionError(f"{location}: could not load the {source_format} tokenizer ({error})") from error


# ---------------------------------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------------------------------


def load_teacher(source: Path, source_format: str, with_head: bool):
    """The teacher in transformers' own classes, read by transformers from the source directory, fp32, eval."""
    import transformers

    name = {"bert": "Bert", "roberta": "Roberta"}[source_format] + ("ForMaskedLM" if with_head else "Model")
    try:
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # its report of the pooler / NSP tensors it skips is expected
        try:
            teacher = getattr(transformers, name).from_pretrained(source, dtype=torch.float32)
        finally:
            transformers.logging.set_verbosity(verbosity)
    except (OSError, ValueError, RuntimeError) as error:
        raise ConversionError(f"transformers' {name} could not load {source} for verification: {error}") from error
    return teacher.eval()


def verify(model, teacher, source_format: str, copied: list[tuple[str, str]], prefix: str) -> dict[str, float]:
    """Compare the student with the teacher on what the initialisation makes equal; returns the printed diffs.

    copied: (teacher key, student key) of every tensor taken over.
    """
    config = model.config
    student = model.littlebird if hasattr(model, "littlebird") else model
    teacher_base = getattr(teacher, prefix, teacher)
    batch = core.verification_batch(config.vocab_size, config.type_vocab_size)
    with torch.no_grad():
        check_copied_tensors(model, teacher, [student for _, student in copied], source_format)
        # The teacher minus its position embeddings: a zero position table contributes nothing to its sum.
        teacher_base.embeddings.position_embeddings.weight.zero_()
        token_type_ids = batch.get("token_type_ids")
        expected = teacher_base.embeddings(input_ids=batch["input_ids"], token_type_ids=token_type_ids)
        actual = student.embeddings(input_ids=batch["input_ids"], token_type_ids=token_type_ids)
        pairs = {"embeddings (teacher without positions)": (actual, expected)}
        if hasattr(model, "cls"):
            generator = torch.Generator().manual_seed(1)
            states = torch.randn(2, 12, config.hidden_size, generator=generator)
            teacher_head = teacher.cls if source_format == "bert" else teacher.lm_head
            pairs["MLM head logits (same hidden states)"] = (model.cls(states), teacher_head(states))
    return core.compare_outputs(pairs)


# The student's MLM head names -> the teacher's, read in the opposite direction from `mlm_keys` on purpose: the
# comparison then checks the names the conversion chose, not just that values travelled unchanged.
TEACHER_HEAD_NAMES = {
    "bert": {"cls.predictions.": "cls.predictions."},
    "roberta": {
        "cls.predictions.transform.LayerNorm.": "lm_head.layer_norm.",
        "cls.predictions.transform.": "lm_head.",
        "cls.predictions.": "lm_head.",
    },
}


def teacher_name(student_key: str, source_format: str, bare_teacher: bool) -> str:
    """Where transformers' teacher keeps the tensor that LittleBird's `student_key` must equal."""
    prefix = FORMATS[source_format]
    if student_key.startswith("cls."):
        for student, teacher in TEACHER_HEAD_NAMES[source_format].items():
            if student_key.startswith(student):
                return teacher + student_key.removeprefix(student)
    base = student_key.removeprefix("littlebird.")
    return base if bare_teacher else f"{prefix}.{base}"


def check_copied_tensors(model, teacher, student_keys: list[str], source_format: str) -> None:
    """Every tensor taken over must be bit-identical to the teacher's tensor of the same role, as transformers reads
    the source (a name mix-up or a changed value stops the conversion)."""
    ours, theirs = model.state_dict(), teacher.state_dict()
    bare = not hasattr(teacher, FORMATS[source_format])
    for student_key in student_keys:
        name = teacher_name(student_key, source_format, bare)
        if name not in theirs:
            raise ConversionError(f"verification: transformers' {type(teacher).__name__} has no {name}")
        if ours[student_key].shape != theirs[name].shape or not torch.equal(ours[student_key], theirs[name]):
            difference = "shape" if ours[student_key].shape != theirs[name].shape else "values"
            raise ConversionError(f"copied tensor {student_key} differs from the teacher's {name} ({difference})")
    log(f"copied tensors identical to the teacher's: {len(student_keys)} of {len(student_keys)} (max abs diff 0)")


# ---------------------------------------------------------------------------------------------------------------------
# Source
# ---------------------------------------------------------------------------------------------------------------------


class TeacherSource(core.Source):
    """A BERT or RoBERTa model directory (transformers' layout; `--from` says which) whose encoder initialises
    LittleBird."""

    def load(self) -> dict[str, torch.Tensor]:
        from posformers import LittleBirdForMaskedLM, LittleBirdModel

        self.source_format = source_format = self.args.source_format
        teacher_config = read_teacher_config(self.path, source_format)
        self.prefix = FORMATS[source_format]
        tensors = normalize_keys(core.load_tensors(self.path), self.prefix)
        self.with_head = has_mlm_head(tensors, source_format)
        if self.with_head and source_format == "roberta" and teacher_config.hidden_act != "gelu":
            raise ConversionError(
                f"RoBERTa's MLM head always uses gelu, but hidden_act is {teacher_config.hidden_act!r}: LittleBird's "
                "head uses hidden_act, so it would compute something else"
            )
        check_tied_decoder(tensors, source_format, self.prefix)
        self.config = littlebird_config(teacher_config, self.args.block_size, self.args.pack_length)
        self.model_class = LittleBirdForMaskedLM if self.with_head else LittleBirdModel
        log(f"source: {source_format} {self.path} -> {self.model_class.__name__}")
        return tensors

    def key_map(self) -> core.KeyMap:
        return key_map(self.source_format, self.prefix, self.with_head)

    def complete(self, target, report):
        """Adds the parameters LittleBird has and the teacher does not, initialised fresh."""
        self.copied = report.mapped
        new = fresh_parameters(self.model_class, self.config, self.args.seed)
        target.update(new)
        log(f"new (initialised fresh): {len(new)} tensors: {', '.join(_new_summary(new))}")
        self.notes.append(f"New, initialised fresh (train before use): {', '.join(_new_summary(new))}.")
        return target

    def verify(self, model) -> dict[str, float]:
        teacher = load_teacher(self.path, self.source_format, self.with_head)
        return verify(model, teacher, self.source_format, self.copied, self.prefix)

    def tokenizer(self):
        return load_tokenizer(self.path, self.args.vocab, self.source_format)

    def describe(self) -> str:
        return (
            f"the {self.source_format} checkpoint `{self.path}` (LittleBird initialisation from a short-input "
            "encoder, as in the LittleBird paper)"
        )


class BertSource(TeacherSource):
    help = "a BERT directory (config.json with model_type bert), e.g. bert-base-uncased"


class RobertaSource(TeacherSource):
    help = "a RoBERTa directory (config.json with model_type roberta), e.g. roberta-base"


SOURCES = {"bert": BertSource, "roberta": RobertaSource}


def _new_summary(new: dict[str, torch.Tensor]) -> list[str]:
    """The kinds of new parameters present in `new`, as named in `NEW_PARAMETERS`."""
    import re

    return [label for pattern, label in NEW_PARAMETERS.items() if any(re.search(pattern, key) for key in new)]
