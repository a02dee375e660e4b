"""QA data loading on the real files in tests/data/qa: SQuAD v1.1/v2.0, KorQuAD 2.1 (HTML and context), TriviaQA;
the HTML-to-text converter's offset map; and a clear error (or a counted skip) for each kind of bad data."""

import json
from pathlib import Path

import pytest
from helpers.data import DATA_DIR

from posformers.finetune.errors import BadExamples, DataError
from posformers.finetune.qa_data import alias_spans, detect_format, load_qa_file
from posformers.finetune.qa_html import fragment_text, html_to_text

QA_DATA = DATA_DIR / "qa"
SQUAD_DEV = QA_DATA / "squad_v1.1" / "dev-v1.1.json"
FIXTURES = QA_DATA / "fixtures"
KORQUAD = QA_DATA / "korquad2_sample"
TRIVIAQA = QA_DATA / "triviaqa_sample"


def load(path, split="validation", skip=False, **options):
    return load_qa_file(path, split, BadExamples(skip=skip, split=split), **options)


def assert_offsets_match(examples):
    for example in examples:
        for text, start in zip(example["answers"]["text"], example["answers"]["answer_start"]):
            assert example["context"][start : start + len(text)] == text, example["id"]


def write_json(path: Path, content) -> Path:
    path.write_text(json.dumps(content), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------------
# SQuAD
# ---------------------------------------------------------------------------------------------------------------------


def test_squad_v11_dev_loads_every_question():
    examples = load(SQUAD_DEV)
    # tests/data keeps the dev set's first four articles: 1,680 of its 10,570 questions (tests/data/PROVENANCE.md)
    assert len(examples) == 1680
    assert len({e["id"] for e in examples}) == 1680
    first = examples[0]
    assert first["title"] == "Super_Bowl_50"
    assert first["question"] == "Which NFL team represented the AFC at Super Bowl 50?"
    assert first["answers"]["text"][0] == "Denver Broncos"
    assert_offsets_match(examples)


def test_squad_flat_records_load():
    examples = load(FIXTURES / "sample.json", version_2_with_negative=True)  # v2.0 records in the Hub's layout
    assert detect_format(json.loads((FIXTURES / "sample.json").read_text()), FIXTURES) == "squad"
    assert len(examples) == 14
    assert examples[0]["answers"] == {"text": ["France"] * 4, "answer_start": [159] * 4}
    assert sum(not e["answers"]["text"] for e in examples) == 6
    assert_offsets_match(examples)


def test_squad_flat_json_lines(tmp_path):
    records = json.loads((FIXTURES / "sample.json").read_text())["data"][:3]  # answerable ones
    path = tmp_path / "dev.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert [e["id"] for e in load(path)] == [r["id"] for r in records]


def test_squad_v2_unanswerable_questions():
    examples = load(FIXTURES / "dev-v2.0.json", version_2_with_negative=True)
    unanswerable = [e for e in examples if not e["answers"]["text"]]
    assert unanswerable and len(unanswerable) < len(examples)
    assert "5ad39d53604f3c001a3fe8d3" in {e["id"] for e in unanswerable}  # is_impossible, plausible answer ignored
    with pytest.raises(DataError, match=r"5ad39d53604f3c001a3fe8d3.*--version_2_with_negative"):
        load(FIXTURES / "dev-v2.0.json")


def test_test_split_needs_no_answers(tmp_path):
    data = {"data": [{"id": "q1", "question": "Who?", "context": "Nobody knows."}]}
    assert load(write_json(tmp_path / "test.json", data), split="test")[0]["answers"]["text"] == []


# ---------------------------------------------------------------------------------------------------------------------
# HTML to text
# ---------------------------------------------------------------------------------------------------------------------


def test_html_to_text_layout_and_offsets():
    source = (
        "<html><head><title>T</title><script>var x = '<p>';</script></head><body>"
        "<h2>Head &amp; line</h2><p>Some   <b>bold</b>\n text.</p>"
        "<table><tr><th>Year</th><th>Club</th></tr><tr><td>1994</td><td>Seoul &#39;FC&#39;</td></tr></table>"
        "<ul><li>one</li><li>two<br>lines</li></ul></body></html>"
    )
    converted = html_to_text(source)
    assert converted.text == "Head & line\nSome bold text.\nYear | Club\n1994 | Seoul 'FC'\n- one\n- two\nlines"
    assert len(converted.source_offsets) == len(converted.text)
    assert converted.source_offsets == sorted(converted.source_offsets)
    for word in ("Head", "bold", "1994", "Seoul", "lines"):  # every text character points at itself in the source
        start = converted.text.index(word)
        source_start = converted.source_offsets[start]
        assert source[source_start : source_start + len(word)] == word
    bold = source.index("<b>bold</b>")
    assert converted.span_to_text(bold, bold + len("<b>bold</b>")) == (converted.text.index("bold"),) * 1 + (
        converted.text.index("bold") + 4,
    )
    amp = source.index("&amp;")
    assert converted.text[slice(*converted.span_to_text(amp, amp + 5))] == "&"
    assert converted.span_to_text(source.index("<script>"), source.index("</script>")) is None
    assert fragment_text("<a href='x'>신중현</a>") == "신중현"


# ---------------------------------------------------------------------------------------------------------------------
# KorQuAD 2.1
# ---------------------------------------------------------------------------------------------------------------------

KORQUAD_ANSWERS = {"59994": "360대", "66678": "시나위", "57677": "신중현"}


@pytest.mark.parametrize("mode", ["html", "context"])
def test_korquad2_pages_become_text_with_answers(mode):
    examples = load(KORQUAD / "korquad2.1_train_00.json", korquad_mode=mode) + load(
        KORQUAD / "korquad2.1_dev_00.json", korquad_mode=mode
    )
    assert {e["id"]: e["answers"]["text"][0] for e in examples} == KORQUAD_ANSWERS
    assert_offsets_match(examples)
    for example in examples:
        assert "<" not in example["context"] and "href" not in example["context"]
        assert len(example["context"]) > 2000  # whole Wikipedia pages: long documents
    # The answer sits in the sentence it came from.
    by_id = {e["id"]: e for e in examples}
    t_x = by_id["59994"]
    start = t_x["answers"]["answer_start"][0]
    assert t_x["context"][start - 24 : start + 10] == "2017년 말 납품되는 T-X 초기 물량은 360대(17조원)"


def test_korquad2_modes_give_the_same_text():
    html, context = (load(KORQUAD / "korquad2.1_dev_00.json", korquad_mode=m) for m in ("html", "context"))
    for a, b in zip(html, context):
        # Both sources are the same page: the body text agrees around the answer.
        start_a, start_b = a["answers"]["answer_start"][0], b["answers"]["answer_start"][0]
        assert a["context"][start_a - 30 : start_a + 30] == b["context"][start_b - 30 : start_b + 30]


def test_korquad2_answer_offset_mismatch_names_the_example(tmp_path):
    data = json.loads((KORQUAD / "korquad2.1_dev_00.json").read_text())
    data["data"][0]["qas"][1]["answer"]["html_answer_start"] += 7
    path = write_json(tmp_path / "korquad.json", data)
    with pytest.raises(DataError, match=r"example '57677'.*does not match 'raw_html' at html_answer_start"):
        load(path)
    kept = load(path, skip=True)
    assert [e["id"] for e in kept] == ["66678"]


# ---------------------------------------------------------------------------------------------------------------------
# TriviaQA
# ---------------------------------------------------------------------------------------------------------------------


def test_triviaqa_examples_per_question_and_document():
    examples = load(TRIVIAQA / "qa" / "web-train.json")
    by_id = {e["id"]: e for e in examples}
    assert list(by_id) == [
        "tc_1--46/46_46.txt",  # web search results live in evidence/web/<dir>/<file>
        "tc_1--194/194_50.txt",
        "tc_3--England.txt",  # entity pages in evidence/wikipedia/
        "tc_3--Judi_Dench.txt",
        "tc_3--100/100_1957043.txt",
        "tc_3--109/109_2592361.txt",
        "tc_15--Integrated_Services_Digital_Network.txt",
    ]
    lewis = by_id["tc_1--46/46_46.txt"]
    assert lewis["context"] == (TRIVIAQA / "evidence" / "web" / "46" / "46_46.txt").read_text()
    assert lewis["question"] == "Which American-born Sinclair won the Nobel Prize for Literature in 1930?"
    assert set(lewis["answers"]["text"]) == {"Sinclair Lewis"}
    assert "(Harry) Sinclair Lewis" in lewis["aliases"] and "sinclair lewis" in lewis["aliases"]
    assert set(by_id["tc_3--109/109_2592361.txt"]["answers"]["text"]) == {"York", "York, England", "York England"}
    assert by_id["tc_3--England.txt"]["answers"]["text"] == []  # no alias in this (shortened) page
    assert_offsets_match(examples)


def test_triviaqa_training_drops_documents_without_an_alias():
    train = load(TRIVIAQA / "qa" / "web-train.json", split="train")
    evaluation = load(TRIVIAQA / "qa" / "web-train.json", split="validation")
    assert len(train) == 4 and all(e["answers"]["text"] for e in train)
    assert len(evaluation) == 7  # evaluation keeps every (question, document) pair
    assert {e["id"] for e in train} <= {e["id"] for e in evaluation}
    assert any(e["id"].startswith("tc_1--") and "/" in e["id"] for e in evaluation)  # web files: "46/46_46.txt"
    test = load(TRIVIAQA / "qa" / "wikipedia-test-without-answers.json", split="test")
    assert all(e["answers"]["text"] == [] for e in test)


def test_alias_spans_case_word_boundaries_and_overlaps():
    document = "Sinclair Lewis met Lewis. sinclair lewis's novels; Lewisham is elsewhere."
    spans = alias_spans(document, ["Lewis", "Sinclair Lewis"])
    assert spans == [(0, "Sinclair Lewis"), (19, "Lewis"), (26, "sinclair lewis")]


def test_triviaqa_missing_evidence_file(tmp_path):
    data = json.loads((TRIVIAQA / "qa" / "wikipedia-dev.json").read_text())
    data["Data"][0]["EntityPages"][0]["Filename"] = "No_Such_Page.txt"
    (tmp_path / "qa").mkdir()
    path = write_json(tmp_path / "qa" / "dev.json", data)
    with pytest.raises(DataError, match="no evidence folder"):
        load(path)
    with pytest.raises(DataError, match=r"tc_33.*No_Such_Page.txt does not exist"):
        load(path, evidence_dir=TRIVIAQA / "evidence")


# ---------------------------------------------------------------------------------------------------------------------
# Bad data
# ---------------------------------------------------------------------------------------------------------------------


def squad_file(tmp_path, qas, context="The Normans gave their name to Normandy, a region in France."):
    return write_json(
        tmp_path / "bad.json", {"data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}
    )


GOOD = {"id": "good", "question": "Where?", "answers": [{"text": "France", "answer_start": 53}]}


def test_empty_and_unreadable_files(tmp_path):
    (tmp_path / "empty.json").write_text("  \n")
    with pytest.raises(DataError, match=r"empty.json: the file is empty"):
        load(tmp_path / "empty.json")
    (tmp_path / "broken.json").write_text('{"data": [\n{"id": 1,,}]}')
    with pytest.raises(DataError, match=r"broken.json, line 2: not valid JSON"):
        load(tmp_path / "broken.json")
    with pytest.raises(DataError, match="no such file"):
        load(tmp_path / "missing.json")
    with pytest.raises(DataError, match="holds no examples"):
        load(write_json(tmp_path / "none.json", {"data": []}))
    with pytest.raises(DataError, match="unrecognised layout"):
        load(write_json(tmp_path / "other.json", {"rows": [{"q": 1}]}))


def test_missing_fields_are_named(tmp_path):
    with pytest.raises(DataError, match=r"column 'question': question #1 \(id 'q2'\) has no 'question' field"):
        load(squad_file(tmp_path, [GOOD, {"id": "q2", "answers": []}]))
    with pytest.raises(DataError, match=r"has no 'id' field"):
        load(squad_file(tmp_path, [{"question": "Where?", "answers": []}]))
    with pytest.raises(DataError, match=r"paragraph of article 'T' has no context"):
        load(squad_file(tmp_path, [GOOD], context=""))


def test_answer_offset_mismatch_is_reported_with_the_id(tmp_path):
    bad = {"id": "shifted", "question": "Where?", "answers": [{"text": "France", "answer_start": 50}]}
    path = squad_file(tmp_path, [GOOD, bad])
    with pytest.raises(DataError, match=r"example 'shifted': answer 'France' does not match the context at "):
        load(path)
    collector = BadExamples(skip=True, split="train")
    kept = load_qa_file(path, "train", collector)
    assert [e["id"] for e in kept] == ["good"]
    assert len(collector) == 1
    assert "skipped 1 bad example" in collector.summary() and "shifted" in collector.summary()


def test_duplicate_ids_and_answerless_questions(tmp_path):
    with pytest.raises(DataError, match="'good' appears twice"):
        load(squad_file(tmp_path, [GOOD, GOOD]))
    with pytest.raises(DataError, match="'none' has no answer"):
        load(squad_file(tmp_path, [GOOD, {"id": "none", "question": "Who?", "answers": []}]))
    with pytest.raises(DataError, match="no usable train examples"):
        load(squad_file(tmp_path, [{**GOOD, "answers": [{"text": "Spain", "answer_start": 53}]}]), "train", skip=True)
