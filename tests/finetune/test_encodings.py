"""Data files in another encoding than UTF-8, or with a byte-order mark (finetune/text_files.py): every script that
reads text files (posformers-glue, -ner, -mc, -qa, -pretrain) stops with one line naming the file, the line and the
encoding to pass, reads the file with --encoding, and drops a UTF-8 byte-order mark."""

import codecs
import json
import re
from pathlib import Path

import pytest
from conftest import QUIET, tiny_model_args

from posformers.finetune import run_glue, run_mc, run_ner, run_pretrain, run_qa
from posformers.finetune.errors import BadExamples
from posformers.finetune.glue_data import read_files
from posformers.finetune.mc_data import read_split_files as read_mc_files
from posformers.finetune.ner_data import read_split_files as read_ner_files
from posformers.finetune.pretrain_data import PretrainDataArguments, load_corpus
from posformers.finetune.qa_data import load_qa_file

# Short Chinese film reviews, as a RoFormer user's data, and their labels.
REVIEWS = [
    ("这部电影很好看，我很喜欢。", "1"),
    ("剧情拖沓，演员表演也很一般。", "0"),
    ("画面精美，音乐动人，值得一看。", "1"),
    ("浪费时间，不推荐。", "0"),
    ("导演讲故事的方式很有新意。", "1"),
    ("结尾太仓促了，让人失望。", "0"),
    ("演员的表演非常自然。", "1"),
    ("情节混乱，看不懂在讲什么。", "0"),
]
NOT_UTF8 = (
    r"not UTF-8 text \(byte 0x[0-9a-f]{2} does not decode\); it reads as gb18030 \(Chinese\): pass --encoding gb18030"
)


def write(path: Path, text: str, encoding: str) -> Path:
    path.write_bytes(text.encode(encoding))
    return path


def glue_tsv(folder: Path, encoding: str) -> Path:
    return write(folder / "train.tsv", "sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in REVIEWS), encoding)


def ner_conll(folder: Path, encoding: str) -> Path:
    sentences = ["北京 B-LOC\n是 O\n首都 O\n", "张三 B-PER\n在 O\n上海 B-LOC\n"]
    return write(folder / "train.txt", "\n".join(sentences * 4), encoding)


def mc_csv(folder: Path, encoding: str) -> Path:
    header = "sent1,sent2,ending0,ending1,label\n"
    rows = [f"{s},他说,很好,很差,{1 - int(y)}\n" for s, y in REVIEWS]
    return write(folder / "train.csv", header + "".join(rows), encoding)


QA_CONTEXT = "北京是中国的首都，也是一座历史悠久的城市。"
QA_QUESTION = "中国的首都是哪里？"


def qa_json(folder: Path, encoding: str) -> Path:
    answers = {"text": ["北京"], "answer_start": [0]}
    records = [{"id": str(i), "question": QA_QUESTION, "context": QA_CONTEXT, "answers": answers} for i in range(4)]
    return write(folder / "train.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding)


def corpus_txt(folder: Path, encoding: str) -> Path:
    return write(folder / "train.txt", "".join(f"{s}\n" for s, _ in REVIEWS) * 4, encoding)


TINY_TRAINING = ["--do_train", "--max_steps", "1", "--per_device_train_batch_size", "4"]
SCRIPTS = {  # script, its data file, its arguments, the file's first line that is not ASCII
    "glue": (run_glue, glue_tsv, ["--train_file"], 2),
    "ner": (run_ner, ner_conll, ["--train_file"], 1),
    "mc": (run_mc, mc_csv, ["--train_file"], 2),
    "qa": (run_qa, qa_json, ["--max_seq_length", "64", "--doc_stride", "16", "--train_file"], 1),
    "pretrain": (run_pretrain, corpus_txt, ["--objective", "mlm", "--max_seq_length", "32", "--train_file"], 1),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_gbk_file_stops_with_one_line_naming_it_and_the_encoding_to_pass(script, tmp_path):
    module, write_data, data_args, line = SCRIPTS[script]
    path = write_data(tmp_path, "gbk")
    argv = [*tiny_model_args(), *QUIET, "--output_dir", str(tmp_path / "out"), *TINY_TRAINING, *data_args, str(path)]
    with pytest.raises(SystemExit) as stopped:
        module.main(argv)
    message = str(stopped.value.code)
    assert re.fullmatch(rf"error \(data\): {re.escape(str(path))}, line {line}: {NOT_UTF8}", message), message


def test_posformers_glue_trains_on_a_gb18030_file_with_encoding(tmp_path):
    path = glue_tsv(tmp_path, "gb18030")
    argv = [*tiny_model_args(), *QUIET, "--output_dir", str(tmp_path / "out"), *TINY_TRAINING]
    metrics = run_glue.main([*argv, "--train_file", str(path), "--encoding", "gb18030"])
    assert metrics["train_samples"] == len(REVIEWS)
    tables = read_files({"train": path}, None, None, False, encoding="gb18030")
    assert [example.texts[0] for example in tables["train"].examples] == [s for s, _ in REVIEWS]


def test_each_reader_reads_gb18030_with_encoding_as_utf8_without(tmp_path):
    for encoding, folder in (("gb18030", tmp_path / "gb"), (None, tmp_path / "utf8")):
        folder.mkdir()
        write_as = encoding or "utf-8"
        bad = BadExamples(False, "train")
        read = {
            "ner": read_ner_files({"train": ner_conll(folder, write_as)}, ("tokens", "ner_tags"), False, encoding),
            "mc": read_mc_files({"train": mc_csv(folder, write_as)}, False, encoding),
            "qa": load_qa_file(qa_json(folder, write_as), "train", bad, encoding=encoding),
            "pretrain": load_corpus(
                PretrainDataArguments(train_file=[str(corpus_txt(folder, write_as))]), 0, need_validation=False,
                cache_dir=str(folder / "cache"), encoding=encoding,
            )["train"]["text"],
        }  # fmt: skip
        assert read["ner"]["train"][0]["tokens"] == ["北京", "是", "首都"]
        assert read["mc"]["train"][0]["first"] == REVIEWS[0][0]
        assert read["qa"][0]["answers"]["text"] == ["北京"]
        assert read["pretrain"][0] == REVIEWS[0][0]


def test_a_utf8_byte_order_mark_is_dropped_by_every_reader(tmp_path):
    """Spreadsheet programs write one on "Save as UTF-8"; it must not become part of a column name or the first word."""

    def with_bom(path: Path) -> Path:
        path.write_bytes(codecs.BOM_UTF8 + path.read_bytes())
        return path

    bad = BadExamples(False, "train")
    tables = read_files({"train": with_bom(glue_tsv(tmp_path, "utf-8"))}, None, None, False)
    assert tables["train"].examples[0].texts[0] == REVIEWS[0][0]
    ner = read_ner_files({"train": with_bom(ner_conll(tmp_path, "utf-8"))}, ("tokens", "ner_tags"), False)
    assert ner["train"][0]["tokens"][0] == "北京"
    mc = read_mc_files({"train": with_bom(mc_csv(tmp_path, "utf-8"))}, False)
    assert mc["train"][0]["first"] == REVIEWS[0][0]
    assert load_qa_file(with_bom(qa_json(tmp_path, "utf-8")), "train", bad)[0]["context"].startswith("北京")
    corpus = load_corpus(
        PretrainDataArguments(train_file=[str(with_bom(corpus_txt(tmp_path, "utf-8")))]), 0, need_validation=False,
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    assert corpus["train"]["text"][0] == REVIEWS[0][0]


# Every file format of every script's reader, as `write(folder, encoding)`, and its first text as the script reads it.
def glue_csv(folder: Path, encoding: str) -> Path:
    return write(folder / "train.csv", "sentence,label\n" + "".join(f"{s},{y}\n" for s, y in REVIEWS), encoding)


def glue_json(folder: Path, encoding: str) -> Path:
    records = [{"sentence": s, "label": y} for s, y in REVIEWS]
    return write(folder / "train.json", json.dumps(records, ensure_ascii=False), encoding)


def glue_jsonl(folder: Path, encoding: str) -> Path:
    lines = "".join(json.dumps({"sentence": s, "label": y}, ensure_ascii=False) + "\n" for s, y in REVIEWS)
    return write(folder / "train.jsonl", lines, encoding)


NER_SENTENCES = [
    {"tokens": ["北京", "是", "首都"], "ner_tags": ["B-LOC", "O", "O"]},
    {"tokens": ["张三", "在", "上海"], "ner_tags": ["B-PER", "O", "B-LOC"]},
]


def ner_json(folder: Path, encoding: str) -> Path:
    return write(folder / "train.json", json.dumps(NER_SENTENCES * 4, ensure_ascii=False), encoding)


def ner_jsonl(folder: Path, encoding: str) -> Path:
    lines = "".join(json.dumps(sentence, ensure_ascii=False) + "\n" for sentence in NER_SENTENCES * 4)
    return write(folder / "train.jsonl", lines, encoding)


def mc_jsonl(folder: Path, encoding: str) -> Path:
    """CommonsenseQA's layout."""
    choices = [{"label": "A", "text": "很好"}, {"label": "B", "text": "很差"}]
    records = [{"id": "0", "question": {"stem": s, "choices": choices}, "answerKey": "A"} for s, _ in REVIEWS]
    return write(folder / "train.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding)


def qa_squad_json(folder: Path, encoding: str) -> Path:
    qas = [{"id": "0", "question": QA_QUESTION, "answers": [{"text": "北京", "answer_start": 0}]}]
    squad = {"version": "1.1", "data": [{"title": "北京", "paragraphs": [{"context": QA_CONTEXT, "qas": qas}]}]}
    return write(folder / "train.json", json.dumps(squad, ensure_ascii=False), encoding)


def glue_first(path: Path) -> str:
    """--text_columns sentence: the column must be found by its name."""
    return read_files({"train": path}, None, ("sentence",), False)["train"].examples[0].texts[0]


def ner_first(path: Path) -> str:
    return read_ner_files({"train": path}, ("tokens", "ner_tags"), False)["train"][0]["tokens"][0]


def mc_first(path: Path) -> str:
    return read_mc_files({"train": path}, False)["train"][0]["first"]


def qa_first(path: Path) -> str:
    return load_qa_file(path, "train", BadExamples(False, "train"))[0]["context"][:2]


READERS = {  # format: (write the file, read its first text, what that must be)
    "glue-tsv": (glue_tsv, glue_first, REVIEWS[0][0]),
    "glue-csv": (glue_csv, glue_first, REVIEWS[0][0]),
    "glue-json": (glue_json, glue_first, REVIEWS[0][0]),
    "glue-jsonl": (glue_jsonl, glue_first, REVIEWS[0][0]),
    "ner-conll": (ner_conll, ner_first, "北京"),
    "ner-json": (ner_json, ner_first, "北京"),
    "ner-jsonl": (ner_jsonl, ner_first, "北京"),
    "mc-csv": (mc_csv, mc_first, REVIEWS[0][0]),
    "mc-jsonl": (mc_jsonl, mc_first, REVIEWS[0][0]),
    "qa-jsonl": (qa_json, qa_first, "北京"),
    "qa-squad-json": (qa_squad_json, qa_first, "北京"),
}
BOMS = {"utf-8": codecs.BOM_UTF8, "utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}


@pytest.mark.parametrize("bom", BOMS)
@pytest.mark.parametrize("data_format", READERS)
def test_every_format_of_every_script_reads_a_file_with_a_byte_order_mark(data_format, bom, tmp_path):
    """A UTF-8 mark is dropped (it is no part of a column name or of the first word); a UTF-16 one says how the file
    decodes, whatever --encoding says. A reader that opens the file itself reads neither."""
    write_data, first_text, expected = READERS[data_format]
    path = write_data(tmp_path, "utf-8")
    path.write_bytes(BOMS[bom] + path.read_text(encoding="utf-8").encode(bom))
    assert first_text(path) == expected


def test_an_unknown_encoding_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error \(arguments\): --encoding gbx: unknown encoding"):
        run_glue.main([*tiny_model_args(), *QUIET, "--output_dir", str(tmp_path), "--encoding", "gbx"])
