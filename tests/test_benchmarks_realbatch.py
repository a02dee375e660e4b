"""The realbatch benchmark's quick mode end to end, in-process: tiny models, a few real examples per workload, one timed
batch per cell. Checks the report's structure and that the variants compute the same function; never a time."""

import dataclasses

import pytest
import torch
from helpers.reports import check_written_report
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import realbatch, run

QUICK_WORKLOADS = {name: dataclasses.replace(spec, limit=8) for name, spec in realbatch.QUICK_WORKLOADS.items()}
TINY_SIZE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


def quick_options(**fields) -> realbatch.Options:
    return realbatch.Options(quick=True, threads=1, max_foreign_cpu=None, workloads=QUICK_WORKLOADS, **fields)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("realbatch")
    report, written = realbatch.main(quick_options(), folder / "realbatch.json")
    return report, written


def expected_variants(report, family: str) -> list[str]:
    """Every variant; disentangled-flash only for DeBERTa, and only where the package is installed."""
    flash = realbatch.FAMILIES[family].flash and report["flash_available"]
    return [name for name in realbatch.VARIANTS if name != realbatch.FLASH or flash]


def test_every_cell_is_measured_with_its_ratios_and_targets(quick_run):
    report, _ = quick_run
    expected = {
        (family.name, workload, mode)
        for family in realbatch.FAMILIES.values()
        for workload in family.workloads
        for mode in realbatch.QUICK_WORKLOADS[workload].modes
    }
    cells = {(cell["family"], cell["workload"], cell["mode"]): cell for cell in report["cells"]}
    assert set(cells) == expected and len(report["cells"]) == len(expected)
    for key, cell in cells.items():
        assert list(cell["variants"]) == expected_variants(report, cell["family"]), key
        for variant in cell["variants"].values():
            assert variant["batches"] == 1 and variant["real_tokens"] <= variant["padded_tokens"]
            assert variant["tokens_per_s"] > 0
        for name, value in cell["ratios"].items():
            assert value is None or value > 0, (key, name)
        assert cell["ratios"]["padding-free / transformers"] is not None
        assert cell["ratios"]["padding cost"] is not None
        assert cell["ratios"]["padding-free / floor"] is not None
        flash_ran = realbatch.FLASH in cell["variants"]
        assert (cell["ratios"]["padding-free / disentangled-flash"] is not None) == flash_ran, key
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


def test_the_floor_runs_the_padding_free_batches_real_tokens_and_counts_their_flops(quick_run):
    report, _ = quick_run
    for cell in report["cells"]:
        floor, padding_free = cell["variants"][realbatch.FLOOR], cell["variants"]["padding-free"]
        assert floor["real_tokens"] == padding_free["real_tokens"] and floor["batches"] == padding_free["batches"]
        size = report["families"][cell["family"]]["config"]
        assert floor["flops"] == realbatch.floor_flops(size, floor["real_tokens"], cell["mode"])
        assert floor["gflop_per_s"] == pytest.approx(floor["flops"] / floor["time_s"] / 1e9)


def test_the_floor_flops_are_the_dense_matmuls_of_the_real_tokens():
    """2 x (4 hidden^2 + 2 hidden x intermediate) per layer and real token; a training step 3 times that."""
    per_token_layer = 2 * (4 * 32 * 32 + 2 * 32 * 64)
    assert realbatch.floor_flops(TINY_SIZE, 10, "inference") == 10 * 2 * per_token_layer == 327_680
    assert realbatch.floor_flops(TINY_SIZE, 10, "train") == 3 * 327_680
    base = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12)
    assert realbatch.floor_flops(base, 1, "inference") == 169_869_312


@pytest.mark.parametrize("mode", realbatch.MODES)
def test_the_floor_runs_the_flops_it_counts(mode):
    """torch's own FLOP count of one floor step (forward, or forward and backward) is floor_flops: no matmul left out,
    none added (a missing gradient of the first layer's input or of a dead-end projection would show here)."""
    floor = realbatch.DenseFloor.of_size(TINY_SIZE).train(mode == "train")
    batch = realbatch.collate(
        [{"input_ids": [5] * 7, "token_type_ids": [0] * 7}, {"input_ids": [5] * 3, "token_type_ids": [0] * 3}], False
    )
    prepare, step = realbatch.FloorRunner(floor).steps(batch)
    prepare()
    with FlopCounterMode(display=False) as counter:
        step()
    assert counter.get_total_flops() == realbatch.floor_flops(TINY_SIZE, 10, mode)
    if mode == "train":
        assert all(parameter.grad is not None for parameter in floor.parameters())


def test_the_floor_is_below_the_models_own_flops_on_the_same_batch():
    """Each posformers model, padding-free, does at least the floor's FLOPs on a batch's real tokens (RoFormer's
    padding-free forward does less than the floor of the padded tokens: a floor counting padding would fail here)."""
    tokenizer = realbatch.wordpiece_tokenizer()
    spec = QUICK_WORKLOADS["sst2"]
    features = realbatch.read_workload(spec, tokenizer)
    for family in realbatch.FAMILIES.values():
        model, _, size = family.build(True)
        # FlopCounterMode's module tracker refuses parameters that require grad under no_grad.
        model.eval().requires_grad_(False).config.unpad_inputs = "auto"
        batch = realbatch.plan_batches(features, spec, grouped=False, token_types=family.token_types).timed[0]
        assert batch.real_tokens < batch.padded_tokens
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(**batch.inputs)
        assert realbatch.floor_flops(size, batch.real_tokens, "inference") <= counter.get_total_flops(), family.name


def test_disentangled_flash_runs_for_deberta_and_agrees_with_transformers(quick_run):
    pytest.importorskip("disentangled_flash")
    report, _ = quick_run
    assert report["flash_available"]
    flash_cells = [cell for cell in report["cells"] if realbatch.FLASH in cell["variants"]]
    assert {cell["family"] for cell in flash_cells} == {"deberta"}
    assert {(cell["workload"], cell["mode"]) for cell in flash_cells} == {
        (workload, mode) for workload in realbatch.FAMILIES["deberta"].workloads for mode in realbatch.MODES
    }
    for check in report["equivalence"]:
        if check["family"] == "deberta":
            assert {"disentangled-flash vs transformers", "disentangled-flash train vs transformers"} <= set(
                check["max_abs_diff"]
            )


def test_without_disentangled_flash_one_line_says_how_to_install_it_and_the_rest_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(realbatch, "flash_available", lambda: False)
    options = quick_options(families=("deberta",), measure_memory=False)
    report, written = realbatch.main(options, tmp_path / "realbatch.json")
    assert capsys.readouterr().err.count(realbatch.FLASH_MISSING) == 1
    assert "pip install disentangled-flash" in realbatch.FLASH_MISSING
    assert realbatch.FLASH_MISSING in written["markdown"].read_text()
    assert not report["flash_available"] and report["cells"]
    for cell in report["cells"]:
        assert list(cell["variants"]) == [name for name in realbatch.VARIANTS if name != realbatch.FLASH]
        assert cell["ratios"]["padding-free / disentangled-flash"] is None
        assert cell["ratios"]["padding-free / floor"] is not None


def test_the_report_is_written_as_json_markdown_and_a_plot(quick_run):
    report, written = quick_run
    markdown = check_written_report(report, written, realbatch.format_markdown)
    for cell in report["cells"]:
        assert f"| {cell['family']} | {cell['workload']} | {cell['mode']} |" in markdown
    for column in ("floor tok/s", "disentangled-flash tok/s", "pf / floor", "pf / disentangled-flash"):
        assert f"| {column} |" in markdown


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
