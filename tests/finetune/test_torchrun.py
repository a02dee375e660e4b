"""Several processes: posformers-glue and posformers-pretrain under `torchrun --nproc_per_node 2` on CPU (gloo), as
DDP and as FSDP (Trainer's --fsdp, FSDP2 `fully_shard`, finetune/distributed.py), posformers-mc, -ner and -qa on two
"nodes" of one process each (`--nnodes 2 --node_rank 0/1`, rendezvous on 127.0.0.1), and a process that dies or
hangs. The launches take the launcher's defaults on a machine without a GPU: no --use_cpu, no --ddp_backend.

- DDP: the two processes train on different examples, the saved model is the one they ended training with, its
  metrics are those process 0 reported, and --push_to_hub runs on every process (Trainer saves there first, a
  collective under FSDP) and uploads the saved model.
- Every script reports the losses and metrics of one process that trains on both processes' batches as one (the
  same data, seed and steps; glue and pretrain also end with its weights), and only node 0's process 0 writes the
  output folder.
- FSDP trains, checkpoints, resumes and pushes to the Hub (a local fake one), and ends with the weights of the same
  run under DDP; its checkpoints are FSDP's (pytorch_model_fsdp.bin: the run sharded, it did not fall back to DDP)
  and load as the model's own remote code in a Python without posformers.
- A process killed with SIGKILL: torchrun stops the run at once and names the process and the signal.
- A process that hangs (SIGSTOP): the other one gives up after --ddp_timeout, with one line saying what happened.

How the tests see inside the DDP processes: torchrun runs the script through tests/helpers/sample_log.py, which wraps
its Trainer: each process writes the example ids (`idx`) of each training batch to <folder>/rank<R>.txt,
<folder>/rank<R>-final.json (global step and a SHA-256 of the weights) when training ends, and <folder>/rank<R>-push
when it enters Trainer.push_to_hub.

Each torchrun launch costs 10-20 s here: the runs are shared by module-scoped fixtures (the two nodes run three
scripts in turn, tests/helpers/scripts_in_turn.py), and every wait is bounded (a launch that outlives its limit is
killed with its whole process group); they are marked slow.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import torch
from conftest import QUIET, TINY_ROFORMER, TOKENIZER_DIR, tiny_model_args
from helpers import dying_rank, python_env, sample_log, scripts_in_turn
from helpers.data import DATA_DIR
from helpers.modeling import make_batch, tensor_outputs, tiny_config
from helpers.pretrain_corpus import TINY, write_corpus
from helpers.remote import check_remote_load
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

import posformers
from posformers.finetune import run_glue, run_mc, run_ner, run_pretrain, run_qa
from posformers.finetune.distributed import shared_state_dict, unregister_embedding_aliases

PROCESSES = 2
EXAMPLES, PER_DEVICE_BATCH = 64, 4
STEPS, SAVE_STEPS = EXAMPLES // (PER_DEVICE_BATCH * PROCESSES), 4  # one epoch
FSDP = ["--fsdp", "--fsdp_config", json.dumps({"version": 2})]  # layers wrapped by the models' _no_split_modules
# No dropout: a distributed run draws other dropout masks than one process would, and runs are compared to one
NO_DROPOUT = ",hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
TWO_LAYERS = (
    "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,max_position_embeddings=128"
    + NO_DROPOUT
)
# The launcher's defaults on a machine without a GPU, as a user types the command: no --use_cpu, no --ddp_backend.
# Where there is a GPU the tests still run on the CPU (two processes cannot share one GPU under NCCL).
ON_CPU = ["--use_cpu"] if torch.accelerator.is_available() else []
COMMON = [
    "--report_to", "none", "--disable_tqdm", "True", "--log_level", "error", *ON_CPU,
    "--learning_rate", "1e-3", "--save_strategy", "steps", "--save_steps", str(SAVE_STEPS),
]  # fmt: skip
LAUNCH_LIMIT = 300  # seconds for one torchrun launch


def torchrun(target: list[str], *, env: dict[str, str], cwd: Path, timeout: float = LAUNCH_LIMIT):
    """`torchrun --standalone --nproc_per_node 2 <target>`; the launcher and its workers are killed (SIGKILL to the
    process group) if they outlive `timeout`. Returns (CompletedProcess, the time it ended)."""
    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")
    env = {key: value for key, value in env.items() if not key.startswith(launcher)}
    env.update(OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(PROCESSES)]
    process = subprocess.Popen(
        [*command, *target], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=60)
        pytest.fail(f"torchrun ran past {timeout} s (killed)\nstderr:\n{stderr[-8000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a worker left behind (stopped, orphaned) goes with the launch
            os.killpg(process.pid, signal.SIGKILL)
    ended = time.time()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), ended


def script(name: str) -> list[str]:
    return ["-m", f"posformers.finetune.{name}"]


def logged(name: str, log_dir: Path) -> list[str]:
    """The script run through tests/helpers/sample_log.py, which logs into `log_dir` (see the module's docstring)."""
    log_dir.mkdir(parents=True)
    return [sample_log.__file__, str(log_dir), name]


def check_completed(result) -> None:
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-8000:]}"


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert sorted(first) == sorted(second)
    return max((first[name] - second[name]).abs().max().item() for name in first)


def check_own_remote_code(folder: Path, files: list[str]) -> None:
    """A folder saved under FSDP holds the model's own code (not torch's _fsdp_*.py) and its auto_map names it."""
    assert "modeling_roformer.py" in files, files
    assert not [name for name in files if name.startswith("_fsdp")], files
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert all(target.split(".")[0] in ("configuration_roformer", "modeling_roformer") for target in auto_map.values())


def with_values(args: list[str], **values: str) -> list[str]:
    """`args` with the word after each `--<name>` replaced by values[name]."""
    args = list(args)
    for name, value in values.items():
        args[args.index(f"--{name}") + 1] = value
    return args


TIMING_KEYS = ("_runtime", "_per_second")


def check_same_numbers(alone: dict, distributed: dict) -> None:
    """What one process reported (`alone`) and what a distributed run reported: every metric but the speeds, floats
    (losses, scores) within float tolerance."""
    compared = sorted(key for key in alone if not key.endswith(TIMING_KEYS))
    assert {"train_loss", "eval_loss"} <= set(compared), compared
    for key in compared:
        assert key in distributed, key
        if isinstance(alone[key], float):
            assert distributed[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), key
        else:
            assert distributed[key] == alone[key], key


def one_process(main, args: list[str], output_dir: Path, batch: int, eval_batch: int) -> dict:
    """The run of `args` in this process, with the per-device batches of all processes as one batch."""
    batches = {
        "per_device_train_batch_size": str(batch * PROCESSES),
        "per_device_eval_batch_size": str(eval_batch * PROCESSES),
    }
    return main([*with_values(args, **batches), "--save_strategy", "no", "--output_dir", str(output_dir)])


# ---------------------------------------------------------------------------------------------------------------------
# The MLM heads' second name of the decoder bias (in-process, no torchrun)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_class", "alias"),
    [
        ("RoFormerForMaskedLM", "cls.predictions.bias"),
        ("DebertaForMaskedLM", "lm_predictions.lm_head.bias"),
        ("LittleBirdForMaskedLM", "cls.predictions.bias"),
    ],
)
def test_mlm_heads_register_the_embeddings_parameters_once(model_class, alias):
    """What FSDP2 needs (one FSDP group per parameter) without changing what the model computes or saves."""
    model_class = getattr(posformers, model_class)
    torch.manual_seed(0)
    model = model_class(tiny_config(model_class.config_class)).eval()
    input_ids, attention_mask, _ = make_batch()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    expected, state_dict = tensor_outputs(model, inputs), model.state_dict()
    decoder_bias = model.get_output_embeddings().bias

    aliases = unregister_embedding_aliases(model)

    assert aliases == {alias: alias.rsplit(".", 1)[0] + ".decoder.bias"}
    owners = [
        name
        for name, module in model.named_modules()
        if any(parameter is decoder_bias for parameter in module.parameters(recurse=False))
    ]
    assert owners == [alias.rsplit(".", 1)[0] + ".decoder"]
    for name, actual in tensor_outputs(model, inputs).items():
        assert torch.equal(actual, expected[name]), name
    # what saving puts back: every name of the state dict before, the tied ones sharing one tensor
    without_alias = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    restored = shared_state_dict(without_alias, model, aliases)
    assert sorted(restored) == sorted(state_dict)
    assert all(torch.equal(restored[name], state_dict[name]) for name in state_dict)
    assert restored[alias] is restored[aliases[alias]]
    embeddings = [name for name in restored if name.endswith("word_embeddings.weight")]
    assert restored[embeddings[0]] is restored[alias.rsplit(".", 1)[0] + ".decoder.weight"]


# ---------------------------------------------------------------------------------------------------------------------
# posformers-glue: DDP, FSDP (checkpoints, push)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glue_runs(tmp_path_factory, glue_dir, hub_server):
    work = tmp_path_factory.mktemp("fsdp-glue")
    data = [
        *tiny_model_args(overrides=TWO_LAYERS),
        "--task_name", "sst2",
        "--train_file", str(glue_dir / "sst2" / "dev.tsv"), "--validation_file", str(glue_dir / "sst2" / "dev.tsv"),
        "--max_train_samples", str(EXAMPLES), "--max_eval_samples", "48", "--max_seq_length", "48",
        "--do_train", "--do_eval", "--per_device_train_batch_size", str(PER_DEVICE_BATCH),
        "--per_device_eval_batch_size", "8", "--max_steps", str(STEPS), *COMMON,
    ]  # fmt: skip
    env = python_env(work / "hf-home", endpoint=hub_server.url)
    runs = {}
    for name, target, extra in [
        ("ddp", logged("run_glue", work / "sample-log"), []),
        ("fsdp", script("run_glue"), [*FSDP, "--push_to_hub", "--hub_model_id", "user/tiny-sst2-fsdp"]),
    ]:
        result, _ = torchrun([*target, *data, "--output_dir", str(work / name), *extra], env=env, cwd=work)
        runs[name] = result
    return {"work": work, "runs": runs, "env": env, "args": data}


def read_ids(path: Path) -> list[int]:
    return [int(token) for line in path.read_text().splitlines() for token in line.split()]


@pytest.mark.slow
def test_ddp_processes_train_on_different_examples(glue_runs):
    check_completed(glue_runs["runs"]["ddp"])
    log_dir = glue_runs["work"] / "sample-log"
    ids = {rank: read_ids(log_dir / f"rank{rank}.txt") for rank in range(PROCESSES)}
    for rank in range(PROCESSES):
        assert len(ids[rank]) == STEPS * PER_DEVICE_BATCH, rank
        assert len(set(ids[rank])) == len(ids[rank]), f"rank {rank} saw an example twice in one epoch"
    assert not set(ids[0]) & set(ids[1]), "both processes trained on the same examples"
    assert set(ids[0]) | set(ids[1]) == set(range(EXAMPLES)), "together they did not cover the epoch"


@pytest.mark.slow
def test_ddp_saves_the_model_the_processes_ended_with(glue_runs):
    work = glue_runs["work"]
    log_dir, out = work / "sample-log", work / "ddp"
    finals = [json.loads((log_dir / f"rank{rank}-final.json").read_text()) for rank in range(PROCESSES)]
    assert [final["global_step"] for final in finals] == [STEPS] * PROCESSES
    assert finals[0]["weights_sha256"] == finals[1]["weights_sha256"], "DDP replicas diverged"
    saved = AutoModelForSequenceClassification.from_pretrained(out)
    assert sample_log.weights_digest(saved) == finals[0]["weights_sha256"]
    train = json.loads((out / "train_results.json").read_text())
    assert train["train_samples"] == EXAMPLES


@pytest.mark.slow
def test_ddp_rank0_metrics_are_those_of_the_saved_model(glue_runs, tmp_path):
    out = glue_runs["work"] / "ddp"
    reported = json.loads((out / "eval_results.json").read_text())
    args = glue_runs["args"]
    data = args[args.index("--validation_file") : args.index("--validation_file") + 2]
    evaluation = ["--do_eval", "--max_eval_samples", "48", "--max_seq_length", "48",
                  "--per_device_eval_batch_size", "8"]  # fmt: skip
    model = ["--model_name_or_path", str(out), *QUIET, "--output_dir", str(tmp_path / "eval"), "--task_name", "sst2"]
    again = run_glue.main([*model, *data, *evaluation])
    assert again["eval_samples"] == reported["eval_samples"] == 48
    assert again["eval_accuracy"] == reported["eval_accuracy"]
    assert again["eval_loss"] == pytest.approx(reported["eval_loss"], abs=1e-5)


@pytest.mark.slow
def test_ddp_reports_the_numbers_of_one_process_with_both_batches(glue_runs, tmp_path):
    """The launcher's defaults on a CPU: one run of two processes (not two runs of one), whose train loss, eval loss
    and accuracy are those of one process with both batches, not the world size times the loss."""
    check_completed(glue_runs["runs"]["ddp"])
    out = glue_runs["work"] / "ddp"
    alone = one_process(run_glue.main, glue_runs["args"], tmp_path / "alone", PER_DEVICE_BATCH, 8)
    check_same_numbers(alone, json.loads((out / "all_results.json").read_text()))
    assert max_difference(weights(tmp_path / "alone"), weights(out)) <= 1e-5


@pytest.mark.slow
def test_glue_fsdp_trains_and_checkpoints_sharded(glue_runs):
    work, runs = glue_runs["work"], glue_runs["runs"]
    check_completed(runs["fsdp"])
    check_completed(runs["ddp"])
    for step in (SAVE_STEPS, STEPS):
        # Trainer writes FSDP's own model and optimizer state only when the model was sharded: without
        # finetune/distributed.py, accelerate dropped --fsdp on CPU and this run was DDP.
        assert (work / "fsdp" / f"checkpoint-{step}" / "pytorch_model_fsdp.bin").is_file()
        assert not (work / "ddp" / f"checkpoint-{step}" / "pytorch_model_fsdp.bin").exists()
    train = json.loads((work / "fsdp" / "train_results.json").read_text())
    assert train["train_samples"] == EXAMPLES


@pytest.mark.slow
def test_glue_fsdp_weights_equal_ddp(glue_runs):
    work = glue_runs["work"]
    for folder in (f"checkpoint-{SAVE_STEPS}", "."):
        assert max_difference(weights(work / "fsdp" / folder), weights(work / "ddp" / folder)) <= 1e-5, folder
    # the steps after the first checkpoint changed the weights: equal runs are not merely untrained ones
    assert max_difference(weights(work / "fsdp"), weights(work / "fsdp" / f"checkpoint-{SAVE_STEPS}")) > 1e-4
    fsdp, ddp = (json.loads((work / run / "eval_results.json").read_text()) for run in ("fsdp", "ddp"))
    assert fsdp["eval_loss"] == pytest.approx(ddp["eval_loss"], abs=1e-5)
    assert fsdp["eval_accuracy"] == ddp["eval_accuracy"]


@pytest.mark.slow
def test_glue_fsdp_saves_load_as_the_models_own_code(glue_runs, tmp_path, hub_server):
    work = glue_runs["work"]
    for folder in (work / "fsdp", work / "fsdp" / f"checkpoint-{SAVE_STEPS}"):
        check_own_remote_code(folder, [path.name for path in folder.iterdir()])
    pushed = hub_server.list_files("user/tiny-sst2-fsdp")
    check_own_remote_code(work / "fsdp", pushed)
    assert (
        hub_server.read_file("user/tiny-sst2-fsdp", "model.safetensors")
        == (work / "fsdp" / "model.safetensors").read_bytes()
    )
    model = AutoModelForSequenceClassification.from_pretrained(work / "fsdp").eval()
    inputs = {"input_ids": torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])}
    source = ("AutoModelForSequenceClassification", "user/tiny-sst2-fsdp", model, inputs)
    check_remote_load({"sst2": source}, env=glue_runs["env"], cwd=tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# posformers-pretrain: DDP, FSDP (checkpoints, push), FSDP resumed from its first checkpoint
# ---------------------------------------------------------------------------------------------------------------------

PRETRAIN_STEPS, PRETRAIN_SAVE_STEPS = 4, 2


@pytest.fixture(scope="module")
def pretrain_runs(tmp_path_factory, hub_server):
    work = tmp_path_factory.mktemp("fsdp-pretrain")
    corpus = write_corpus(work / "corpus", train_contexts=20, train_sentences=200, held_out=5)
    args = [
        "--model_type", "posformers-roformer", "--config_overrides", TINY["posformers-roformer"] + NO_DROPOUT,
        "--tokenizer_name", str(TOKENIZER_DIR), "--train_file", str(corpus["train"]),
        "--validation_file", str(corpus["validation"]), "--max_seq_length", "32", "--max_eval_samples", "32",
        "--do_train", "--do_eval", "--max_steps", str(PRETRAIN_STEPS), "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "8", *COMMON, "--save_steps", str(PRETRAIN_SAVE_STEPS),
    ]  # fmt: skip
    env = python_env(work / "hf-home", endpoint=hub_server.url)
    checkpoint = work / "fsdp" / f"checkpoint-{PRETRAIN_SAVE_STEPS}"
    runs = {}
    for name, target, extra in [
        ("ddp", logged("run_pretrain", work / "sample-log"), ["--push_to_hub", "--hub_model_id", "user/tiny-mlm-ddp"]),
        ("fsdp", script("run_pretrain"), [*FSDP, "--push_to_hub", "--hub_model_id", "user/tiny-mlm-fsdp"]),
        ("resumed", script("run_pretrain"), [*FSDP, "--resume_from_checkpoint", str(checkpoint), "--push_to_hub",
                                             "--hub_model_id", "user/tiny-mlm-fsdp-resumed"]),
    ]:  # fmt: skip
        result, _ = torchrun([*target, *args, "--output_dir", str(work / name), *extra], env=env, cwd=work)
        runs[name] = result
    return {"work": work, "runs": runs, "args": args}


@pytest.mark.slow
def test_ddp_pushes_to_the_hub_from_every_process(pretrain_runs, hub_server):
    """Trainer.push_to_hub saves on every process (under FSDP a collective that hangs when one process skips it),
    then process 0 uploads: the script must call it on all of them."""
    work = pretrain_runs["work"]
    check_completed(pretrain_runs["runs"]["ddp"])
    log_dir = work / "sample-log"
    assert sorted(path.name for path in log_dir.glob("rank*-push")) == [f"rank{r}-push" for r in range(PROCESSES)]
    finals = [json.loads((log_dir / f"rank{rank}-final.json").read_text()) for rank in range(PROCESSES)]
    assert finals[0]["weights_sha256"] == finals[1]["weights_sha256"], "DDP replicas diverged"
    pushed = hub_server.read_file("user/tiny-mlm-ddp", "model.safetensors")
    assert pushed == (work / "ddp" / "model.safetensors").read_bytes()
    saved = posformers.RoFormerForMaskedLM.from_pretrained(work / "ddp")
    assert sample_log.weights_digest(saved) == finals[0]["weights_sha256"]


@pytest.mark.slow
def test_pretrain_ddp_reports_the_numbers_of_one_process_with_both_batches(pretrain_runs, tmp_path):
    """MLM: a token-level loss, divided by the masked tokens of both processes (Trainer's num_items_in_batch)."""
    check_completed(pretrain_runs["runs"]["ddp"])
    out = pretrain_runs["work"] / "ddp"
    alone = one_process(run_pretrain.main, pretrain_runs["args"], tmp_path / "alone", 4, 8)
    check_same_numbers(alone, json.loads((out / "all_results.json").read_text()))
    assert max_difference(weights(tmp_path / "alone"), weights(out)) <= 1e-5


@pytest.mark.slow
def test_pretrain_fsdp_trains_checkpoints_and_pushes(pretrain_runs, hub_server):
    """Pushing saves on every process (a collective under FSDP), then process 0 uploads: a script that pushed from
    process 0 only would hang here until the launch limit."""
    work, runs = pretrain_runs["work"], pretrain_runs["runs"]
    for name in ("ddp", "fsdp", "resumed"):
        check_completed(runs[name])
    assert (work / "fsdp" / f"checkpoint-{PRETRAIN_SAVE_STEPS}" / "pytorch_model_fsdp.bin").is_file()
    for run, repo in (("fsdp", "user/tiny-mlm-fsdp"), ("resumed", "user/tiny-mlm-fsdp-resumed")):
        assert hub_server.read_file(repo, "model.safetensors") == (work / run / "model.safetensors").read_bytes()
        check_own_remote_code(work / run, hub_server.list_files(repo))


@pytest.mark.slow
def test_pretrain_fsdp_weights_equal_ddp_and_resume(pretrain_runs):
    work = pretrain_runs["work"]
    assert max_difference(weights(work / "fsdp"), weights(work / "ddp")) <= 1e-5
    state = json.loads((work / "resumed" / "trainer_state.json").read_text())
    assert state["global_step"] == PRETRAIN_STEPS
    # it started from the first checkpoint of "fsdp", and ends with the weights of the uninterrupted run
    assert not (work / "resumed" / f"checkpoint-{PRETRAIN_SAVE_STEPS}").exists()
    assert max_difference(weights(work / "resumed"), weights(work / "fsdp")) <= 1e-6
    first = weights(work / "fsdp" / f"checkpoint-{PRETRAIN_SAVE_STEPS}")
    assert max_difference(weights(work / "fsdp"), first) > 1e-4
    fsdp, resumed = (json.loads((work / run / "eval_results.json").read_text()) for run in ("fsdp", "resumed"))
    assert resumed["eval_loss"] == pytest.approx(fsdp["eval_loss"], abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# Two nodes of one process each (one machine, rendezvous on 127.0.0.1): posformers-mc, -ner and -qa in turn
# ---------------------------------------------------------------------------------------------------------------------

CSQA = DATA_DIR / "mc" / "commonsenseqa"
CONLL = DATA_DIR / "ner" / "conll2003"
SQUAD = DATA_DIR / "qa" / "squad_v1.1" / "dev-v1.1.json"
NODE_STEPS, NODE_BATCH, NODE_EVAL_BATCH = 4, 4, 8
# RoFormer's multiple-choice head classifies each choice's last position by default, as transformers' RoFormer does:
# in a padded batch a padding token, whose state depends on how far the batch is padded. "first" scores each choice
# by its own tokens, so that batches padded differently (one process with both batches) give the same scores.
NODE_MODEL = tiny_model_args(overrides=TINY_ROFORMER + NO_DROPOUT + ",summary_type=first")
NODE_TRAINING = [
    *QUIET, *ON_CPU, "--do_train", "--do_eval", "--max_steps", str(NODE_STEPS), "--learning_rate", "5e-3",
    "--per_device_train_batch_size", str(NODE_BATCH), "--per_device_eval_batch_size", str(NODE_EVAL_BATCH),
]  # fmt: skip
NODE_SCRIPTS = {
    "run_mc": (run_mc.main, [
        "--train_file", str(CSQA / "train_rand_split.jsonl"), "--validation_file", str(CSQA / "dev_rand_split.jsonl"),
        "--max_train_samples", "32", "--max_eval_samples", "32", "--max_seq_length", "48",
    ]),
    "run_ner": (run_ner.main, [
        "--train_file", str(CONLL / "train.txt"), "--validation_file", str(CONLL / "valid.txt"),
        "--max_train_samples", "32", "--max_eval_samples", "32",
    ]),
    "run_qa": (run_qa.main, [  # 16 questions, 32 windows: one epoch of 4 steps
        "--train_file", str(SQUAD), "--validation_file", str(SQUAD), "--max_train_samples", "16",
        "--max_eval_samples", "16", "--max_seq_length", "128", "--doc_stride", "32",
    ]),
}  # fmt: skip


def node_args(script: str) -> list[str]:
    return [*NODE_MODEL, *NODE_SCRIPTS[script][1], *NODE_TRAINING]


def two_nodes(target: list[str], *, env: dict[str, str], work: Path, timeout: float = LAUNCH_LIMIT) -> dict:
    """`torchrun --nnodes 2 --nproc_per_node 1 --node_rank R --master_addr 127.0.0.1 --master_port <free port>
    <target>`, one launcher per node, each in its own folder work/node<R> (its output in node<R>.out / .err beside
    it); both are killed with their workers if they outlive `timeout`. Returns {R: CompletedProcess}."""
    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")
    env = {key: value for key, value in env.items() if not key.startswith(launcher)}
    env.update(OMP_NUM_THREADS="1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launches = {}
    for rank in range(PROCESSES):
        folder = work / f"node{rank}"
        folder.mkdir()
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(PROCESSES), "--nproc_per_node", "1",
            "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), *target,
        ]  # fmt: skip
        # files, not pipes: a launcher waited on second must not block on a full pipe meanwhile
        with open(work / f"node{rank}.out", "w") as stdout, open(work / f"node{rank}.err", "w") as stderr:
            launches[rank] = subprocess.Popen(
                command, env=env, cwd=folder, stdout=stdout, stderr=stderr, text=True, start_new_session=True
            )
    deadline = time.monotonic() + timeout
    results = {}
    try:
        for rank, process in launches.items():
            process.wait(timeout=max(deadline - time.monotonic(), 1))
            out, err = ((work / f"node{rank}{suffix}").read_text() for suffix in (".out", ".err"))
            results[rank] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a node's torchrun ran past {timeout} s (killed)\n{(work / 'node0.err').read_text()[-8000:]}")
    finally:
        for process in launches.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return results


@pytest.fixture(scope="module")
def node_runs(tmp_path_factory):
    """The same command on both nodes, with a relative --output_dir per script: each node would write into its own
    folder, so anything node 1 writes shows there."""
    work = tmp_path_factory.mktemp("two-nodes")
    plan = work / "plan.json"
    plan.write_text(json.dumps([[script, [*node_args(script), "--output_dir", script]] for script in NODE_SCRIPTS]))
    runs = two_nodes([scripts_in_turn.__file__, str(plan)], env=python_env(work / "hf-home"), work=work)
    return {"work": work, "runs": runs}


@pytest.mark.slow
def test_two_nodes_train_as_one_run_that_node_0_writes(node_runs):
    for result in node_runs["runs"].values():
        check_completed(result)
    node0, node1 = (node_runs["work"] / f"node{rank}" for rank in range(PROCESSES))
    assert not list(node1.rglob("*")), sorted(str(path.relative_to(node1)) for path in node1.rglob("*"))
    for script in NODE_SCRIPTS:
        assert (node0 / script / "model.safetensors").is_file(), script
        assert json.loads((node0 / script / "trainer_state.json").read_text())["global_step"] == NODE_STEPS
    # the metric tables are printed once, by process 0 (Trainer's own log lines by each node's first process)
    assert "***** eval metrics *****" not in node_runs["runs"][1].stdout
    assert node_runs["runs"][0].stdout.count("***** eval metrics *****") == len(NODE_SCRIPTS)


@pytest.mark.slow
@pytest.mark.parametrize("script", list(NODE_SCRIPTS))
def test_two_nodes_report_the_numbers_of_one_process_with_both_batches(node_runs, script, tmp_path):
    for result in node_runs["runs"].values():
        check_completed(result)
    out = node_runs["work"] / "node0" / script
    alone = one_process(NODE_SCRIPTS[script][0], node_args(script), tmp_path / "alone", NODE_BATCH, NODE_EVAL_BATCH)
    # The eval loss is that of the trained weights. The weights themselves are not compared: a softmax over choices
    # or positions leaves the biases added to all of them without a gradient, and Adam turns the rounding noise
    # there into steps of the learning rate's size, one way or the other.
    check_same_numbers(alone, json.loads((out / "all_results.json").read_text()))


# ---------------------------------------------------------------------------------------------------------------------
# A process that dies or hangs mid-run
# ---------------------------------------------------------------------------------------------------------------------

DDP_TIMEOUT = 10  # --ddp_timeout of the runs below, in seconds
AGENT_GRACE = 30  # torchrun's wait between the SIGTERM and the SIGKILL it sends the workers it stops


def dying_run(how: str, work: Path, glue_dir: Path):
    """posformers-glue under FSDP in which process 1 `how`s ("kill": SIGKILL, "stop": SIGSTOP) at the end of step 3
    of 40. Returns (CompletedProcess, seconds from the signal to torchrun's exit, the time of the signal)."""
    mark = work / "signal-time"
    args = [
        *tiny_model_args(overrides=TWO_LAYERS), "--task_name", "sst2",
        "--train_file", str(glue_dir / "sst2" / "dev.tsv"), "--max_train_samples", "320", "--max_seq_length", "48",
        "--do_train", "--per_device_train_batch_size", "4", "--max_steps", "40", *COMMON, *FSDP,
        "--ddp_timeout", str(DDP_TIMEOUT), "--output_dir", str(work / "out"),
    ]  # fmt: skip
    target = [dying_rank.__file__, how, "1", "3", str(mark), "run_glue", *args]
    result, ended = torchrun(target, env=python_env(work / "hf-home"), cwd=work, timeout=240)
    assert mark.is_file(), f"process 1 never reached step 3\n{result.stderr[-8000:]}"
    signalled = float(mark.read_text())
    return result, ended - signalled, signalled


def root_cause(stderr: str) -> dict[str, str]:
    """The "Root Cause" block of torchrun's failure report: {"time", "rank", "exitcode", ...}."""
    block = stderr.split("Root Cause (first observed failure):", 1)[1].split("=====", 1)[0]
    fields = (line.split(":", 1) for line in block.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in fields}


@pytest.fixture(scope="module", autouse=True)
def dying_runs_started(tmp_path_factory, glue_dir):
    """The two dying runs start with the module, in the background: the hung one spends most of its time waiting
    (--ddp_timeout, then torchrun's grace period), time in which the killed one and this module's other launches run.
    Each has its own folder and torchrun its own free port."""
    pool = ThreadPoolExecutor(2)
    yield {how: pool.submit(dying_run, how, tmp_path_factory.mktemp(how), glue_dir) for how in ("kill", "stop")}
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def dying_runs(dying_runs_started):
    return {how: run.result() for how, run in dying_runs_started.items()}


@pytest.mark.slow
def test_a_killed_process_stops_the_run_at_once(dying_runs):
    result, seconds, _ = dying_runs["kill"]
    assert result.returncode != 0
    cause = root_cause(result.stderr)
    killed_first = cause["rank"].startswith("1 ") and "SIGKILL" in cause["exitcode"]
    # Or process 0's next collective failed (gloo: connection reset) before torchrun's agent polled the dead process:
    # then process 0's one line is the first failure, and the report still names the killed process among the others.
    lost_peer_first = cause["rank"].startswith("0 ") and "error (processes): process 0 of 2" in result.stderr
    assert killed_first or lost_peer_first, cause
    assert "SIGKILL" in result.stderr, result.stderr[-4000:]
    # torchrun's agent sees the worker exit and stops the other one; nothing waits for a timeout
    assert seconds < DDP_TIMEOUT + AGENT_GRACE, seconds
    print(f"SIGKILL of process 1: torchrun exited {seconds:.1f} s later")


@pytest.mark.slow
def test_a_hung_process_is_given_up_after_ddp_timeout(dying_runs):
    result, seconds, signalled = dying_runs["stop"]
    assert result.returncode != 0
    assert "error (processes): process 0 of 2: another process of this run died or stopped answering" in result.stderr
    assert f"Timed out waiting {DDP_TIMEOUT * 1000}ms" in result.stderr  # gloo's own words, with our timeout
    cause = root_cause(result.stderr)
    assert cause["rank"].startswith("0 ") and cause["exitcode"].startswith("1"), cause
    # process 0 left on its own, --ddp_timeout after its last collective began: it may have begun a moment before
    # process 1 stopped, and torchrun's time is cut to whole seconds
    gave_up = datetime.strptime(cause["time"], "%Y-%m-%d_%H:%M:%S").timestamp() - signalled
    assert DDP_TIMEOUT - 2 <= gave_up <= DDP_TIMEOUT + 15, gave_up
    # then torchrun stopped the hung process: SIGTERM, and SIGKILL after its grace period
    assert seconds < DDP_TIMEOUT + AGENT_GRACE + 30, seconds
    print(f"SIGSTOP of process 1: process 0 gave up {gave_up:.0f} s later, torchrun exited after {seconds:.1f} s")
