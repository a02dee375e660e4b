"""Tokenizers that load everywhere: every tokenizer posformers writes is a `tokenizer.json` that
`AutoTokenizer.from_pretrained` loads in a fresh Python where sentencepiece, protobuf, rjieba and posformers cannot be
imported, and it gives the original tokenizer's ids on real text.

The originals are written here from their papers' code, not taken from transformers or tokenizers: sentencepiece
itself for DeBERTa v2/v3, GPT-2's byte-level BPE (openai's encoder.py) for DeBERTa v1, BERT's WordPiece
(google-research/bert tokenization.py) for RoFormer's character models and LittleBird's BERT teachers, and for the
word-level RoFormer jieba words then WordPiece, as ZhuiyiTechnology's bert4keras tokenizer does.

RoFormer's word-level Chinese models (chinese_roformer_L-12_H-768_A-12, junnyu/roformer_chinese_base) segment words
with jieba before WordPiece. Without rjieba, AutoTokenizer refuses their folder (transformers' RoFormerTokenizer needs
it) and the `tokenizer.json` loaded as a plain fast tokenizer splits Chinese into single characters: it gives the same
ids except that each multi-character vocabulary word jieba finds becomes the ids of its characters.
"""

from __future__ import annotations

import itertools
import json
import shutil
import unicodedata
from functools import cache
from pathlib import Path

import pytest
import regex
import transformers
from helpers import python_env, run_python
from helpers.data import DATA_DIR

import posformers
from posformers.conversion import core, deberta, littlebird, roformer

VOCAB_DIR = DATA_DIR / "vocab"
BLOCKED = ["sentencepiece", "google.protobuf", "rjieba"]
# Text that Unicode NFKC normalization changes ("ﬁ", full-width letters and digits, "…"): Microsoft's spm.model
# normalizes it, and a tokenizer that forgets the model's normalization map gives other ids.
NFKC_TEXT = ["ﬁne ＡＢＣ １２３ café naïve…", "  leading, trailing and  double  spaces  "]
# Short everyday Chinese sentences for RoFormer's vocabularies.
CHINESE = [
    "今天天气非常好。",
    "我们在北京大学学习自然语言处理。",
    "这部电影的故事很感人，演员的表演也非常出色。",
    "中华人民共和国成立于一九四九年。",
    "他说：“明天见！”然后就离开了。",
    "RoFormer 模型于2021年发表，用旋转位置编码（RoPE）处理长文本。",  # Latin words and digits among Chinese
]


def sst2_sentences(count: int) -> list[str]:
    lines = (DATA_DIR / "glue" / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1 : count + 1]
    return [line.split("\t")[0] for line in lines]


def mrpc_sentences(count: int) -> list[str]:
    """Mixed-case news sentences with quotes, numbers and punctuation (MRPC dev, first column of sentences)."""
    lines = (DATA_DIR / "glue" / "mrpc" / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[1 : count + 1]
    return [line.split("\t")[3] for line in lines]


ENGLISH = sst2_sentences(400) + mrpc_sentences(200)


# ---------------------------------------------------------------------------------------------------------------------
# The original tokenizers
# ---------------------------------------------------------------------------------------------------------------------


def read_vocab(vocab_file: Path) -> dict[str, int]:
    return {token: i for i, token in enumerate(vocab_file.read_text(encoding="utf-8").rstrip("\n").split("\n"))}


def _is_cjk(char: str) -> bool:
    code = ord(char)
    ranges = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F)]
    ranges += [(0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]
    return any(low <= code <= high for low, high in ranges)


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    ascii_punctuation = 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126
    return ascii_punctuation or unicodedata.category(char).startswith("P")


def bert_ids(text: str, vocab: dict[str, int]) -> list[int]:
    """google-research/bert's FullTokenizer (do_lower_case=True): clean, split CJK characters and punctuation, lower
    case and strip accents, then greedy longest-match WordPiece; [CLS] ... [SEP]."""
    cleaned = []
    for char in text:
        if ord(char) in (0, 0xFFFD) or (unicodedata.category(char).startswith("C") and char not in "\t\n\r"):
            continue
        cleaned.append(" " if char.isspace() else f" {char} " if _is_cjk(char) else char)
    words = []
    for word in "".join(cleaned).split():
        word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        words += "".join(f" {char} " if _is_punctuation(char) else char for char in word).split()
    ids = [vocab["[CLS]"]]
    for word in words:
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[("##" if start else "") + word[start:end]])
            start = end
        ids += pieces if len(word) <= 100 else [vocab["[UNK]"]]
    return [*ids, vocab["[SEP]"]]


def jieba_reference_ids(text: str, vocab: dict[str, int]) -> list[int]:
    """ZhuiyiTechnology's RoFormer tokenizer (bert4keras with `pre_tokenize=jieba.cut(HMM=False)`): a jieba word in the
    vocabulary is one token, any other word goes through BERT's tokenizer."""
    import rjieba

    ids = [vocab["[CLS]"]]
    for word in rjieba.cut(text, hmm=False):
        ids += [vocab[word]] if word in vocab else bert_ids(word, vocab)[1:-1]
    return [*ids, vocab["[SEP]"]]


@cache
def _byte_symbols() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (openai/gpt-2 encoder.py, bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


GPT2_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def gpt2_tokens(text: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """openai/gpt-2 encoder.py: the regex split, bytes as printable symbols, then the lowest-ranked merge first."""
    tokens = []
    for piece in GPT2_PATTERN.findall(text):
        word = [_byte_symbols()[byte] for byte in piece.encode("utf-8")]
        while len(word) > 1:
            pairs = set(itertools.pairwise(word))
            best = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
            if best not in ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        tokens += word
    return tokens


# ---------------------------------------------------------------------------------------------------------------------
# Folders as posformers writes them
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory) -> Path:
    """A real SentencePiece Unigram model (sentencepiece's trainer, default NFKC normalization) on 8,000 SST-2 and
    2,000 MRPC training sentences, with DeBERTa's special pieces: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, [MASK]."""
    import sentencepiece

    folder = tmp_path_factory.mktemp("spm")
    sst2 = (DATA_DIR / "glue" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:8001]
    mrpc = (DATA_DIR / "glue" / "mrpc" / "train.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
    lines = [line.split("\t")[0] for line in sst2] + [text for line in mrpc for text in line.split("\t")[3:5]]
    (folder / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "spm"), vocab_size=1000,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", user_defined_symbols=["[MASK]"], minloglevel=2,
    )  # fmt: skip
    return folder / "spm.model"


def write_converted(folder: Path, tokenizer) -> Path:
    """The tokenizer as `posformers-convert` writes it: `core.write_output` with a tiny model beside it."""
    config = posformers.RoFormerConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2)
    info = core.OutputInfo(source_description="a test source", command_line="posformers-convert ...")
    return core.write_output(posformers.RoFormerModel(config), folder, overwrite=False, info=info, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def written(tmp_path_factory, spm_file) -> dict[str, Path]:
    """{name: folder} of tokenizers written by the conversions (and one by posformers-glue)."""
    root = tmp_path_factory.mktemp("written")
    v3_source = root / "deberta-v3-source"  # a Hub folder: spm.model + tokenizer_config.json
    v3_source.mkdir()
    shutil.copy(spm_file, v3_source / "spm.model")
    (v3_source / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "spm"}))
    v1_source = root / "deberta-base-source"  # microsoft/deberta-base: GPT-2's vocab.json + merges.txt
    shutil.copytree(VOCAB_DIR / "gpt2", v1_source)
    (v1_source / "config.json").write_text(json.dumps({"model_type": "deberta"}))
    (v1_source / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "gpt2"}))
    json_source = root / "deberta-v3-json-source"  # a Hub folder with tokenizer.json (normalization map inside) only
    deberta.spm_unigram_tokenizer(spm_file).save_pretrained(json_source)
    config = json.loads((json_source / "tokenizer_config.json").read_text())
    (json_source / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "DebertaV2Tokenizer"}))
    (json_source / "config.json").write_text(json.dumps({"model_type": "deberta-v2"}))
    char_config = transformers.RoFormerConfig(max_position_embeddings=1536)
    tokenizers = {
        "deberta-v3": deberta.load_tokenizer(v3_source, None, "deberta-v2"),
        "deberta-v3-spm-file": deberta.load_tokenizer(root, str(spm_file), "deberta-v2"),  # --vocab spm.model
        "deberta-v3-json": deberta.load_tokenizer(json_source, None, "deberta-v2"),
        "deberta-v1": deberta.load_tokenizer(v1_source, None, "deberta"),
        "roformer-char": roformer.build_tokenizer(VOCAB_DIR / "bert-base-chinese" / "vocab.txt", char_config),
        "roformer-word": roformer.build_tokenizer(VOCAB_DIR / "roformer-chinese-base" / "vocab.txt", char_config),
        "littlebird-bert": littlebird.load_tokenizer(VOCAB_DIR / "bert-base-uncased", None, "bert"),
        "littlebird-roberta": littlebird.load_tokenizer(VOCAB_DIR / "gpt2", None, "roberta"),
    }
    return {name: write_converted(root / name, tokenizer) for name, tokenizer in tokenizers.items()}


# Loads each job's folder in a Python that cannot import sentencepiece, protobuf, rjieba or posformers.
LOAD_TOKENIZERS = """
for name in ARGS["blocked"]:
    sys.modules[name] = None  # `import name` fails and importlib.util.find_spec(name) says it is not installed
import transformers
from transformers.utils import is_protobuf_available, is_sentencepiece_available

result = {"sentencepiece": is_sentencepiece_available(), "protobuf": is_protobuf_available(), "jobs": {}}
texts = json.loads(open(ARGS["texts"], encoding="utf-8").read())
for name, job in ARGS["jobs"].items():
    job_texts = texts[job["texts"]]
    try:
        # trust_remote_code=False: the folder's config.json names remote code (the model's), which a tokenizer does not
        # need; without it transformers would ask on stdin first.
        tokenizer = transformers.AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=False)
    except ImportError as error:
        result["jobs"][name] = {"error": str(error)}
        tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(job["folder"])
    result["jobs"][name] = {
        **result["jobs"].get(name, {}),
        "class": type(tokenizer).__name__,
        "ids": [tokenizer(text)["input_ids"] for text in job_texts],
        "pair": tokenizer(*job_texts[:2])["input_ids"],
    }
result["posformers"] = sorted(m for m in sys.modules if m.split(".")[0] == "posformers")
print(json.dumps(result))
"""


def load_elsewhere(folders: dict[str, tuple[Path, str]], cwd: Path) -> dict:
    """{name: (folder, "english" | "chinese")} loaded with AutoTokenizer in the blocked child: {name: {"class",
    "ids" (of each text), "pair" (of the first two), "error" (AutoTokenizer's ImportError, if any)}}."""
    texts_file = cwd / "texts.json"
    texts_file.write_text(json.dumps({"english": ENGLISH + NFKC_TEXT, "chinese": CHINESE}), encoding="utf-8")
    jobs = {name: {"folder": str(folder), "texts": texts} for name, (folder, texts) in folders.items()}
    args = {"jobs": jobs, "blocked": BLOCKED, "texts": str(texts_file)}
    result = run_python(LOAD_TOKENIZERS, args, env=python_env(cwd / "hf-home"), cwd=cwd, without_posformers=True)
    assert result["sentencepiece"] is False and result["protobuf"] is False and result["posformers"] == []
    return result["jobs"]


@pytest.fixture(scope="module")
def loaded_elsewhere(written, tmp_path_factory) -> dict:
    """What AutoTokenizer gives on each written folder in the blocked child."""
    language = {name: "chinese" if name.startswith("roformer") else "english" for name in written}
    folders = {name: (folder, language[name]) for name, folder in written.items()}
    return load_elsewhere(folders, tmp_path_factory.mktemp("child"))


@pytest.mark.slow
def test_every_conversion_output_carries_a_tokenizer_json(written):
    for name, folder in written.items():
        assert (folder / "tokenizer.json").is_file(), (name, sorted(p.name for p in folder.iterdir()))
        assert not (folder / "spm.model").exists(), name  # nothing there needs sentencepiece


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deberta-v3", "deberta-v3-spm-file", "deberta-v3-json"])
def test_deberta_v3_unigram_gives_sentencepiece_ids_without_sentencepiece(name, loaded_elsewhere, spm_file):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
    texts = ENGLISH + NFKC_TEXT
    expected = [[1, *processor.encode(text), 2] for text in texts]
    job = loaded_elsewhere[name]
    assert "error" not in job and job["class"] == "TokenizersBackend"
    assert job["ids"] == expected
    assert job["pair"] == [1, *processor.encode(texts[0]), 2, *processor.encode(texts[1]), 2]
    pieces = [i for ids in expected for i in ids[1:-1]]
    assert pieces.count(3) < 0.01 * len(pieces) and len(set(pieces)) > 900  # real pieces, hardly any [UNK]
    # transformers 5's own DebertaV2Tokenizer drops the model's NFKC map and gives other ids there
    folder = spm_file.parent / "hub-v3"
    folder.mkdir(exist_ok=True)
    shutil.copy(spm_file, folder / "spm.model")
    own = transformers.DebertaV2Tokenizer.from_pretrained(folder)
    assert own(NFKC_TEXT[0])["input_ids"] != expected[-2]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, class_name, first, last",
    [("deberta-v1", "DebertaTokenizer", "[CLS]", "[SEP]"), ("littlebird-roberta", "RobertaTokenizer", "<s>", "</s>")],
)
def test_byte_level_bpe_gives_gpt2_ids(name, class_name, first, last, loaded_elsewhere, written):
    """DeBERTa v1 and LittleBird's RoBERTa teachers: GPT-2's byte-level BPE between their own special tokens."""
    vocab = json.loads((VOCAB_DIR / "gpt2" / "vocab.json").read_text(encoding="utf-8"))
    merges = (VOCAB_DIR / "gpt2" / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    ranks = {tuple(line.split()): rank for rank, line in enumerate(merges) if line}
    special = json.loads((written[name] / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    special = {token["content"]: token["id"] for token in special}
    job = loaded_elsewhere[name]
    assert job["class"] == class_name
    for text, ids in zip(ENGLISH + NFKC_TEXT, job["ids"]):
        assert ids == [special[first], *(vocab[token] for token in gpt2_tokens(text, ranks)), special[last]]


@pytest.mark.slow
def test_littlebird_tokenizers_have_no_length_limit(written, tmp_path):
    """LittleBird reads any length: its tokenizers do not keep their BERT/RoBERTa teacher's 512."""
    teacher = tmp_path / "bert-teacher"
    shutil.copytree(VOCAB_DIR / "bert-base-uncased", teacher)
    config = {"tokenizer_class": "BertTokenizer", "model_max_length": 512, "do_lower_case": True}  # bert-base-uncased
    (teacher / "tokenizer_config.json").write_text(json.dumps(config))
    assert transformers.AutoTokenizer.from_pretrained(teacher).model_max_length == 512
    converted = write_converted(tmp_path / "converted", littlebird.load_tokenizer(teacher, None, "bert"))
    for folder in (converted, written["littlebird-bert"], written["littlebird-roberta"]):
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        assert tokenizer.model_max_length > 10**20
        assert len(tokenizer(" ".join(ENGLISH), truncation=True)["input_ids"]) > 4000


@pytest.mark.slow
def test_wordpiece_tokenizers_give_bert_ids(loaded_elsewhere):
    uncased = read_vocab(VOCAB_DIR / "bert-base-uncased" / "vocab.txt")
    job = loaded_elsewhere["littlebird-bert"]
    assert job["class"] == "BertTokenizer" and job["ids"] == [bert_ids(text, uncased) for text in ENGLISH + NFKC_TEXT]
    chinese = read_vocab(VOCAB_DIR / "bert-base-chinese" / "vocab.txt")
    job = loaded_elsewhere["roformer-char"]
    assert job["class"] == "BertTokenizer" and job["ids"] == [bert_ids(text, chinese) for text in CHINESE]


@pytest.mark.slow
def test_word_level_roformer_without_rjieba_splits_words_into_characters(loaded_elsewhere, written):
    """With rjieba: transformers' RoFormerTokenizer, jieba words. Without: AutoTokenizer says to install rjieba, and
    the tokenizer.json gives the character ids of every multi-character word (the rest is the same)."""
    vocab = read_vocab(VOCAB_DIR / "roformer-chinese-base" / "vocab.txt")
    job = loaded_elsewhere["roformer-word"]
    assert "rjieba" in job["error"] and job["class"] == "TokenizersBackend"
    with_jieba = transformers.AutoTokenizer.from_pretrained(written["roformer-word"])
    assert type(with_jieba).__name__ == "RoFormerTokenizer"
    token_of = {i: token for token, i in vocab.items()}
    words = 0
    for text, ids in zip(CHINESE, job["ids"]):
        jieba_ids = with_jieba(text)["input_ids"]
        assert jieba_ids == jieba_reference_ids(text, vocab)
        as_characters = []
        for i in jieba_ids:
            token = token_of[i]
            if len(token) > 1 and all(_is_cjk(char) for char in token):
                as_characters += [vocab[char] for char in token]
                words += 1
            else:
                as_characters.append(i)
        assert ids == as_characters == bert_ids(text, vocab)
    assert words >= 10  # jieba did find vocabulary words: the two really differ


@pytest.mark.slow
def test_posformers_glue_output_carries_a_tokenizer_json(tmp_path):
    """A script output from a tokenizer folder that has only vocab.txt: the fine-tuned folder has tokenizer.json."""
    from posformers.finetune import run_glue
    from posformers.finetune.demo import DEMO_DATA

    source = DEMO_DATA / "tokenizer"
    assert not (source / "tokenizer.json").exists()
    model = ["--model_type", "posformers-roformer", "--tokenizer_name", str(source)]
    model += ["--config_overrides", "hidden_size=16,num_hidden_layers=1,num_attention_heads=2,intermediate_size=16"]
    quiet = ["--report_to", "none", "--disable_tqdm", "True", "--save_strategy", "no", "--log_level", "error"]
    data = ["--task_name", "sst2", "--train_file", str(DATA_DIR / "glue" / "sst2" / "dev.tsv")]
    run_glue.main([*model, *quiet, *data, "--do_train", "--max_steps", "1", "--max_train_samples", "8",
                   "--output_dir", str(tmp_path / "out")])  # fmt: skip
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    job = load_elsewhere({"out": (tmp_path / "out", "english")}, tmp_path)["out"]
    uncased = read_vocab(source / "vocab.txt")
    assert job["ids"][: len(ENGLISH)] == [bert_ids(text, uncased) for text in ENGLISH]
