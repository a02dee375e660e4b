"""What new users of posformers-convert ran into: each test replays one user's command."""

import os
import stat

import torch
import transformers
import yaml

from posformers.conversion import cli

from .conftest import run_convert, run_in_process

TINY_BERT = dict(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)


def write_bert(folder, card: str | None = None):
    """A tiny BertModel folder (random weights), with `card` as its README.md."""
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY_BERT)).save_pretrained(folder)
    if card is not None:
        (folder / "README.md").write_text(card, encoding="utf-8")
    return folder


def card_metadata(folder) -> dict:
    return yaml.safe_load((folder / "README.md").read_text(encoding="utf-8").split("---\n")[1])


def test_output_dir_spelling_and_the_umask_mode(workdir, capsys):
    source, output = write_bert(workdir / "bert"), workdir / "out"
    umask = os.umask(0o022)
    try:
        code, printed = run_in_process(
            capsys, "littlebird", "--from", "bert", "--source", source, "--output_dir", output
        )
    finally:
        os.umask(umask)
    assert code == 0, printed
    assert stat.S_IMODE(output.stat().st_mode) == 0o755
    assert card_metadata(output)["license"] == "unknown"  # the source's card does not say: nothing is invented


def test_the_scripts_spellings_and_the_dashed_ones_parse_alike():
    parser = cli.build_parser()
    common = ["littlebird", "--source", "src"]
    scripts = parser.parse_args([*common, "--output_dir", "out", "--push_to_hub", "org/x", "--no_verify"])
    dashed = parser.parse_args([*common, "--output", "out", "--push-to-hub", "org/x", "--no-verify"])
    assert vars(scripts) == vars(dashed)
    assert (scripts.output, scripts.push_to_hub, scripts.no_verify) == ("out", "org/x", True)


def test_the_card_takes_the_license_of_the_source(workdir, capsys):
    source = write_bert(workdir / "bert", card="---\nlicense: mit\n---\n# tiny\n")
    output = workdir / "out"
    code, printed = run_in_process(capsys, "littlebird", "--from", "bert", "--source", source, "--output", output)
    assert code == 0, printed
    assert card_metadata(output)["license"] == "mit"


def test_a_hub_id_offline_says_so_in_one_line(workdir, capsys):
    code, printed = run_in_process(
        capsys, "littlebird", "--from", "bert", "--source", "bert-base-uncased", "--output", workdir / "out"
    )
    assert code == 1 and "Traceback" not in printed
    assert printed.strip().splitlines()[-1] == (
        "error: --source bert-base-uncased: no such local path, and the Hub is offline (HF_HUB_OFFLINE=1) with no "
        "cached copy of that repo: download it while online, or give a local folder"
    )
    assert not (workdir / "out").exists()


def test_a_hub_id_is_downloaded(workdir, hub_server):
    source = write_bert(workdir / "bert", card="---\nlicense: mit\n---\n# tiny\n")
    torch.save({"unused": torch.zeros(1)}, source / "pytorch_model.bin")  # safetensors are there: not downloaded
    repo_id = "user/tiny-bert-for-convert"
    hub_server.create_repo(repo_id)
    for path in source.iterdir():
        hub_server.write_file(repo_id, path.name, path.read_bytes())
    output = workdir / "out"
    args = ["littlebird", "--from", "bert", "--source", repo_id, "--output_dir", output]
    run_convert(args, hf_home=workdir / "hf-home", endpoint=hub_server.url).check()
    metadata = card_metadata(output)
    assert (metadata["base_model"], metadata["license"]) == (repo_id, "mit")
    downloaded = {path.rsplit("/", 1)[-1] for method, path in hub_server.requests if "/resolve/" in path}
    assert "model.safetensors" in downloaded and "pytorch_model.bin" not in downloaded
