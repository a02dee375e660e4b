"""posformers-glue and posformers-pretrain under `torchrun --nproc_per_node 2` on CPU (gloo): the run completes, the
two processes train on different examples, the saved model is the one the processes ended training with, and
--push_to_hub runs on every process (Trainer saves there first, a collective under FSDP) and uploads the saved model.

How the test sees inside the processes: torchrun runs the script through tests/helpers/sample_log.py, which wraps
its Trainer: each process writes the example ids (`idx`) of each training batch to <folder>/rank<R>.txt,
<folder>/rank<R>-final.json (global step and a SHA-256 of the weights) when training ends, and <folder>/rank<R>-push
when it enters Trainer.push_to_hub.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import QUIET, TOKENIZER_DIR, tiny_model_args
from helpers import python_env, sample_log
from helpers.pretrain_corpus import TINY, write_corpus
from transformers import AutoModelForSequenceClassification
from transformers.trainer_pt_utils import get_module_class_from_name

import posformers
from posformers.finetune import run_glue

EXAMPLES, PER_DEVICE_BATCH, PROCESSES = 64, 4, 2
STEPS = EXAMPLES // (PER_DEVICE_BATCH * PROCESSES)  # exactly one epoch


def torchrun(script: str, args: list[str], log_dir: Path, cwd: Path, env: dict[str, str] | None = None):
    """`torchrun --nproc_per_node 2` of finetune/<script>.py with the sample log in `log_dir`; `env`: this process's
    (offline) by default."""
    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")
    env = {key: value for key, value in (os.environ if env is None else env).items() if not key.startswith(launcher)}
    env.update(OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(PROCESSES),
        sample_log.__file__, str(log_dir), script, *args,
    ]  # fmt: skip
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def check_completed(result) -> None:
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-8000:]}"


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory, glue_dir):
    work = tmp_path_factory.mktemp("torchrun")
    log_dir = work / "sample-log"
    log_dir.mkdir()
    args = [
        *tiny_model_args(),
        *QUIET,
        "--output_dir", str(work / "out"),
        "--task_name", "sst2",
        "--train_file", str(glue_dir / "sst2" / "dev.tsv"),
        "--validation_file", str(glue_dir / "sst2" / "dev.tsv"),
        "--max_train_samples", str(EXAMPLES),
        "--max_eval_samples", "48",
        "--do_train", "--do_eval",
        "--per_device_train_batch_size", str(PER_DEVICE_BATCH),
        "--per_device_eval_batch_size", "8",
        "--max_steps", str(STEPS),
        "--learning_rate", "1e-3",
        "--max_seq_length", "48",
        "--ddp_backend", "gloo",
        "--use_cpu",
    ]  # fmt: skip
    result = torchrun("run_glue", args, log_dir, cwd=work)
    return {"result": result, "work": work, "log_dir": log_dir, "args": args}


def test_torchrun_completes(torchrun_run):
    check_completed(torchrun_run["result"])
    assert (torchrun_run["work"] / "out" / "model.safetensors").exists()
    train = json.loads((torchrun_run["work"] / "out" / "train_results.json").read_text())
    assert train["train_samples"] == EXAMPLES


def read_ids(path: Path) -> list[int]:
    return [int(token) for line in path.read_text().splitlines() for token in line.split()]


def test_the_two_processes_trained_on_different_examples(torchrun_run):
    log_dir = torchrun_run["log_dir"]
    ids = {rank: read_ids(log_dir / f"rank{rank}.txt") for rank in range(PROCESSES)}
    for rank in range(PROCESSES):
        assert len(ids[rank]) == STEPS * PER_DEVICE_BATCH, rank
        assert len(set(ids[rank])) == len(ids[rank]), f"rank {rank} saw an example twice in one epoch"
    assert not set(ids[0]) & set(ids[1]), "both processes trained on the same examples"
    assert set(ids[0]) | set(ids[1]) == set(range(EXAMPLES)), "together they did not cover the epoch"


def test_saved_model_is_what_the_processes_ended_with(torchrun_run):
    log_dir, out = torchrun_run["log_dir"], torchrun_run["work"] / "out"
    finals = [json.loads((log_dir / f"rank{rank}-final.json").read_text()) for rank in range(PROCESSES)]
    assert [final["global_step"] for final in finals] == [STEPS] * PROCESSES
    assert finals[0]["weights_sha256"] == finals[1]["weights_sha256"], "DDP replicas diverged"
    saved = AutoModelForSequenceClassification.from_pretrained(out)
    assert sample_log.weights_digest(saved) == finals[0]["weights_sha256"]


def test_rank0_metrics_are_those_of_the_saved_model(torchrun_run, tmp_path):
    out = torchrun_run["work"] / "out"
    reported = json.loads((out / "eval_results.json").read_text())
    args = torchrun_run["args"]
    data = args[args.index("--validation_file") : args.index("--validation_file") + 2]
    evaluation = [
        "--do_eval",
        "--max_eval_samples",
        "48",
        "--max_seq_length",
        "48",
        "--per_device_eval_batch_size",
        "8",
    ]
    model = ["--model_name_or_path", str(out), *QUIET, "--output_dir", str(tmp_path / "eval"), "--task_name", "sst2"]
    again = run_glue.main([*model, *data, *evaluation])
    assert again["eval_samples"] == reported["eval_samples"] == 48
    assert again["eval_accuracy"] == reported["eval_accuracy"]
    assert again["eval_loss"] == pytest.approx(reported["eval_loss"], abs=1e-5)


@pytest.mark.slow
def test_pretrain_push_to_hub_runs_on_every_process(tmp_path, hub_server):
    """Trainer.push_to_hub saves on every process (under FSDP a collective that hangs when one process skips it),
    then process 0 uploads: the script must call it on all of them."""
    log_dir, repo = tmp_path / "sample-log", "user/tiny-mlm-ddp"
    log_dir.mkdir()
    corpus = write_corpus(tmp_path / "corpus", train_contexts=20, train_sentences=200, held_out=5)
    args = [
        "--model_type", "posformers-roformer", "--config_overrides", TINY["posformers-roformer"],
        "--tokenizer_name", str(TOKENIZER_DIR),
        "--train_file", str(corpus["train"]), "--max_seq_length", "32",
        "--do_train", "--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
        "--output_dir", str(tmp_path / "out"), "--ddp_backend", "gloo", "--use_cpu",
        "--push_to_hub", "--hub_model_id", repo, *QUIET,
    ]  # fmt: skip
    env = python_env(tmp_path / "hf-home", endpoint=hub_server.url)
    check_completed(torchrun("run_pretrain", args, log_dir, cwd=tmp_path, env=env))

    assert sorted(path.name for path in log_dir.glob("rank*-push")) == [f"rank{r}-push" for r in range(PROCESSES)]
    finals = [json.loads((log_dir / f"rank{rank}-final.json").read_text()) for rank in range(PROCESSES)]
    assert finals[0]["weights_sha256"] == finals[1]["weights_sha256"], "DDP replicas diverged"
    pushed = hub_server.read_file(repo, "model.safetensors")
    assert pushed == (tmp_path / "out" / "model.safetensors").read_bytes()
    saved = posformers.RoFormerForMaskedLM.from_pretrained(tmp_path / "out")
    assert sample_log.weights_digest(saved) == finals[0]["weights_sha256"]


@pytest.mark.parametrize(
    ("model_class", "config"),
    [
        ("RoFormerForSequenceClassification", {}),
        ("DebertaForSequenceClassification", {"position_buckets": 32, "max_position_embeddings": 128}),
        ("LittleBirdForSequenceClassification", {"block_size": 8, "pack_length": 4}),
    ],
)
def test_no_split_modules_name_the_layer_class_fsdp_wraps(model_class, config):
    """FSDP's transformer auto-wrap (Trainer: fsdp_config transformer_layer_cls_to_wrap, default _no_split_modules)
    looks each name up among the model's modules; every name must be found and cover all encoder layers."""
    model_class = getattr(posformers, model_class)
    sizes = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2}
    model = model_class(model_class.config_class(**sizes, intermediate_size=64, **config))
    for name in model._no_split_modules:
        layer_class = get_module_class_from_name(model, name)
        assert layer_class is not None, name
        assert sum(isinstance(module, layer_class) for module in model.modules()) == 3


# ---------------------------------------------------------------------------------------------------------------------
# LittleBird under plain DDP (find_unused_parameters=False): every parameter must get a gradient
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("old_last_layer", [False, True], ids=["littlebird", "with-the-old-last-pack-layernorm"])
def test_littlebird_trains_under_ddp_without_unused_parameter_detection(old_last_layer, tmp_path):
    import torch.multiprocessing as mp
    from helpers.littlebird_ddp import two_training_steps

    processes = mp.start_processes(
        two_training_steps,
        args=(PROCESSES, str(tmp_path / "init"), str(tmp_path), old_last_layer),
        nprocs=PROCESSES,
        join=False,
    )
    deadline = time.monotonic() + 300
    while not processes.join(timeout=5):
        if time.monotonic() > deadline:
            for process in processes.processes:
                process.kill()
            pytest.fail("the two DDP processes did not finish within 300 s (killed)")
    outcomes = [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(PROCESSES)]
    if old_last_layer:
        assert all("find_unused_parameters" in outcome for outcome in outcomes), outcomes
    else:
        assert all(outcome.startswith("ok ") for outcome in outcomes), outcomes
        assert outcomes[0] == outcomes[1], "DDP replicas diverged"


def test_a_script_that_returns_destroys_its_process_group(tmp_path):
    """Left to the interpreter's teardown, gloo's threads can abort a process whose run succeeded (SIGABRT, exit
    status -6): a script's main destroys the process group before it returns."""
    import torch.distributed as dist

    from posformers.finetune.distributed import exit_on_lost_process

    @exit_on_lost_process
    def main(argv=None):
        dist.all_reduce(torch.ones(1))
        return {"world_size": dist.get_world_size()}

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert main([]) == {"world_size": 1}
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
