"""`make demo` runs end to end (with fewer training steps): SST-2 through posformers-glue, a reload through
AutoModelForSequenceClassification, two classified sentences, then long-document QA through posformers-qa."""

import json
import re

import pytest

from posformers.finetune import demo
from posformers.finetune.demo import DEMO_DATA
from posformers.finetune.errors import BadExamples
from posformers.finetune.qa_data import load_qa_file
from posformers.finetune.qa_metrics import normalize_squad


@pytest.mark.slow
def test_demo_trains_reloads_classifies_and_answers(tmp_path, capsys):
    out = tmp_path / "demo"
    demo.main(["--output-dir", str(out), "--epochs", "1", "--train-samples", "256", "--qa-epochs", "1"])
    printed = capsys.readouterr().out
    # a second run with the same seeds ends with the same numbers (the docs state what a run gives)
    again = tmp_path / "again"
    demo.main(["--output-dir", str(again), "--epochs", "1", "--train-samples", "256", "--qa-epochs", "1"])
    for step in ("sst2-roformer", "qa-littlebird"):
        first, second = (json.loads((run / step / "eval_results.json").read_text()) for run in (out, again))
        assert {k: v for k, v in first.items() if "runtime" not in k and "per_second" not in k} == {
            k: v for k, v in second.items() if "runtime" not in k and "per_second" not in k
        }, step
    capsys.readouterr()

    accuracy = float(re.search(r"SST-2 dev accuracy (\d\.\d+)", printed).group(1))
    saved = json.loads((out / "sst2-roformer" / "eval_results.json").read_text())
    assert saved["eval_samples"] == 872  # the whole official dev set
    assert accuracy == pytest.approx(saved["eval_accuracy"], abs=5e-4)
    assert (out / "sst2-roformer" / "model.safetensors").exists()
    assert "reloaded with AutoModelForSequenceClassification as posformers.modeling_roformer" in printed
    assert len(re.findall(r"-> (positive|negative) \(\d\.\d\d\)", printed)) == 2

    em, f1 = (float(x) for x in re.search(r"exact match (\d+\.\d), F1 (\d+\.\d)", printed).groups())
    qa = out / "qa-littlebird"
    saved = json.loads((qa / "eval_results.json").read_text())
    assert (em, f1) == (round(saved["eval_exact_match"], 1), round(saved["eval_f1"], 1))
    assert (qa / "model.safetensors").exists()
    # The reported exact match is that of the answers it wrote, one per question, each a span of the document.
    questions = load_qa_file(DEMO_DATA / "qa" / "train.json", "validation", BadExamples(False, "validation"))
    answers = json.loads((qa / "eval_predictions.json").read_text())
    assert sorted(answers) == sorted(q["id"] for q in questions)
    assert all(answers[q["id"]] in q["context"] for q in questions)
    exact = [normalize_squad(answers[q["id"]]) in map(normalize_squad, q["answers"]["text"]) for q in questions]
    assert saved["eval_exact_match"] == pytest.approx(100 * sum(exact) / len(questions))


def test_demo_never_writes_into_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="was not made by this demo"):
        demo.main(["--output-dir", str(tmp_path), "--train-samples", "8", "--skip-qa"])
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]
