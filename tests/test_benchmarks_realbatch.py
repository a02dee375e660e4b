"""The realbatch benchmark's quick mode end to end, in-process: tiny models, a few real examples per workload, one timed
batch per cell. Checks the report's structure and that the variants compute the same function; never a time."""

import dataclasses
import importlib.util
import json

import pytest

from benchmarks import realbatch, run
from benchmarks.plot import MISSING_MATPLOTLIB


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("realbatch")
    options = realbatch.Options(
        quick=True,
        threads=1,
        max_foreign_cpu=None,
        workloads={name: dataclasses.replace(spec, limit=8) for name, spec in realbatch.QUICK_WORKLOADS.items()},
    )
    report, written = realbatch.main(options, folder / "realbatch.json")
    return report, written


def test_every_cell_is_measured_with_its_ratios_and_targets(quick_run):
    report, _ = quick_run
    expected = {
        (family.name, workload, mode)
        for family in realbatch.FAMILIES.values()
        for workload in family.workloads
        for mode in realbatch.MODES
    }
    cells = {(cell["family"], cell["workload"], cell["mode"]): cell for cell in report["cells"]}
    assert set(cells) == expected and len(report["cells"]) == len(expected)
    for key, cell in cells.items():
        assert list(cell["variants"]) == list(realbatch.VARIANTS), key
        for variant in cell["variants"].values():
            assert variant["batches"] == 1 and variant["real_tokens"] <= variant["padded_tokens"]
            assert variant["tokens_per_s"] > 0
        for name, value in cell["ratios"].items():
            assert value is None or value > 0, (key, name)
        assert cell["ratios"]["padding-free / transformers"] is not None
        assert cell["ratios"]["padding cost"] is not None
        assert cell["variants"]["padding-free"]["peak_mem_mib"] is not None
        assert {target["ratio"] for target in cell["targets"]} >= {"padding cost", "memory padding-free / padded"}
    assert {target["ratio"] for target in cells["roformer", "sst2", "train"]["targets"]} >= {
        "padding-free / transformers",
        "padding-free / transformers-grouped",
    }
    assert {target["ratio"] for target in cells["littlebird", "documents", "inference"]["targets"]} >= {
        "padding-free / transformers"
    }


def test_variants_agree_at_real_tokens_and_the_padding_free_path_runs(quick_run):
    report, _ = quick_run
    checked = {(check["family"], check["workload"]) for check in report["equivalence"]}
    assert checked == {(f.name, w) for f in realbatch.FAMILIES.values() for w in f.workloads}
    for check in report["equivalence"]:
        assert check["agree"], check
        assert check["batch_has_padding"] and check["padding_free_ran"], check
    labels = {label for check in report["equivalence"] for label in check["max_abs_diff"]}
    assert "transformers vs padding-free" in labels


def test_the_report_is_written_as_json_markdown_and_a_plot(quick_run):
    report, written = quick_run
    assert json.loads(written["json"].read_text())["cells"] == report["cells"]
    markdown = written["markdown"].read_text()
    assert markdown == realbatch.format_markdown(report)
    for cell in report["cells"]:
        assert f"| {cell['family']} | {cell['workload']} | {cell['mode']} |" in markdown
    if importlib.util.find_spec("matplotlib") is None:
        assert written["plot"] == MISSING_MATPLOTLIB
    else:
        assert written["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_line_takes_the_suite_and_the_model_suites():
    args = run.parse_args(["--suite", "realbatch", "--quick", "--families", "roformer"])
    assert (args.suite, args.quick, args.families) == ("realbatch", True, ["roformer"])
    assert run.parse_args(["--model", "roformer"]).model == "roformer"
    assert run.parse_args(["--suite", "deberta"]).suite == "deberta"
    with pytest.raises(SystemExit):
        run.parse_args(["--model", "roformer", "--suite", "realbatch"])


def test_the_workloads_are_tokenized_into_real_wordpieces():
    """The real-text workloads are bert-base-uncased WordPieces, not a run of [UNK] (one per word) that a tokenizer
    built from `vocab_file=` gives in transformers 5."""
    tokenizer = realbatch.wordpiece_tokenizer()
    assert len(tokenizer) == 30522
    ids = tokenizer("The Panthers' defense was unbelievable.")["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.convert_ids_to_tokens(ids)[1:4] == ["the", "panthers", "'"]
