"""The clients benchmark (benchmarks/clients.py) end to end at its quick size, in-process: tiny models, a few real
items per client, one timed pass per cell. Checks that every cell of every client ran on the right classes, that the
variants computed the same outputs, and that the report is written with every cell; never a time."""

import importlib.util

import pytest
from helpers.reports import check_written_report

from benchmarks import clients, run

pytestmark = pytest.mark.slow  # every client loaded twice or three times, tiny models: about half a minute


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("clients") / "clients.json"
    report, written = clients.main(clients.Options(quick=True, threads=1, max_foreign_cpu=None), output)
    return report, written


def expected_cells():
    return {
        (client.name, family, client.mode, batch)
        for client in clients.CLIENTS
        for family in client.families
        for batch in (clients.INFERENCE_BATCHES if client.mode == "inference" else [None])
    }


def test_every_client_model_and_batch_is_measured(quick_run):
    report, _ = quick_run
    assert report["failures"] == []
    cells = {
        (c["client"], c["family"], c["mode"], c["batch"] if c["mode"] == "inference" else None): c
        for c in report["cells"]
    }
    assert set(cells) == expected_cells() and len(report["cells"]) == len(cells)
    flash = importlib.util.find_spec("disentangled_flash") is not None
    assert report["flash_available"] is flash
    for key, cell in cells.items():
        client = next(c for c in clients.CLIENTS if c.name == key[0])
        names = [clients.SHIPPED, clients.POSFORMERS] + ([clients.FLASH] if client.flash and flash else [])
        assert list(cell["variants"]) == names, key
        for variant in cell["variants"].values():
            assert variant["ms_per_item"] > 0 and len(variant["times_s"]) == report["options"]["repeats"]
        assert cell["variants"][clients.SHIPPED]["model_class"].startswith("transformers.models."), key
        assert cell["variants"][clients.POSFORMERS]["model_class"].startswith("posformers.dropin."), key
        assert all(value > 0 for value in cell["ratios"].values())
        ratios = {target["ratio"] for target in cell["targets"]}
        assert f"{clients.POSFORMERS} / {clients.SHIPPED}" in ratios
        assert (f"{clients.POSFORMERS} / {clients.FLASH}" in ratios) is (clients.FLASH in cell["variants"])


def test_the_variants_compute_the_clients_outputs(quick_run):
    """Scores, embeddings, features at real tokens, GLiNER2's spans and confidences, and the training losses agree."""
    report, _ = quick_run
    for cell in report["cells"]:
        assert cell["agree"], (cell["client"], cell["family"], cell["max_abs_diff"], cell.get("notes"))


def test_clients_that_build_or_cut_transformers_models_are_measured(quick_run):
    """GLiNER (its encoder built by name, so posformers' variant is its documented line, optimize) and BERTScore (its
    encoder cut to its first layers), each on posformers' model with the client's outputs."""
    report, _ = quick_run
    measured = {(cell["client"], cell["family"]) for cell in report["cells"]}
    assert {("GLiNER predict", "deberta"), ("BERTScore", "deberta"), ("BERTScore", "roformer")} <= measured
    gliner = next(client for client in clients.CLIENTS if client.name == "GLiNER predict")
    assert gliner.posformers_how == "optimize"
    assert {"gliner", "bert-score"} <= set(report["versions"]) and report["versions"]["gliner"] == "0.2.29"


def test_the_report_is_written_as_json_markdown_and_a_plot(quick_run):
    report, written = quick_run
    markdown = check_written_report(report, written, clients.format_markdown)
    for cell in report["cells"]:
        assert f"| {cell['client']} | {cell['family']} | {cell['mode']} | {cell['batch']} |" in markdown
    assert "other CPU %" in markdown


def test_without_disentangled_flash_one_line_says_so_and_its_column_is_left_out(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(clients, "flash_available", lambda: False)
    monkeypatch.setattr(clients, "CLIENTS", tuple(c for c in clients.CLIENTS if c.name == "GLiNER2 extract"))
    report, written = clients.main(clients.Options(quick=True, threads=1, max_foreign_cpu=None), tmp_path / "c.json")
    assert capsys.readouterr().err.count(clients.FLASH_MISSING) == 1
    assert report["cells"] and all(clients.FLASH not in cell["variants"] for cell in report["cells"])
    assert clients.FLASH_MISSING in written["markdown"].read_text()


def test_the_command_line_takes_the_suite():
    args = run.parse_args(["--suite", "clients", "--quick", "--repeats", "3", "--threads", "1"])
    assert (args.suite, args.quick, args.repeats, args.threads) == ("clients", True, 3, 1)
