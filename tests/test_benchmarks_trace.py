"""The forward tracer (python -m benchmarks.trace_forward): what it counts is the code that ran, and it lists it."""

import json

from benchmarks import trace_forward


def test_traces_each_entry_point_and_counts_what_ran(tmp_path, capsys):
    path = tmp_path / "trace.json"
    trace_forward.main(["--json", str(path), "--functions"])
    traces = {t["entry_point"]: t for t in json.loads(path.read_text())}
    assert set(traces) == {*trace_forward.tiny_models()}
    bert = traces["transformers BertForSequenceClassification"]
    # transformers' BERT: its model, embeddings, encoder, layer, attention, ... forwards, all in modeling_bert.py
    assert bert["files"] == 1 and "BertModel.forward" in " ".join(bert["listing"])
    for trace in traces.values():
        assert trace["functions"] == len(trace["listing"]) > 0
        assert trace["lines"] == sum(trace["lines_per_file"].values())
        assert trace["files"] == len(trace["lines_per_file"])
        assert trace["longest_lines"] == max(int(line.rsplit("(", 1)[1][:-1]) for line in trace["listing"])
    deberta = traces["DebertaForSequenceClassification"]
    assert any("DebertaForSequenceClassification.forward" in line for line in deberta["listing"])
    out = capsys.readouterr().out
    assert out.startswith("| entry point | functions | files | lines | longest function |")
