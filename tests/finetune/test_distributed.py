"""Several processes without torchrun (tests/finetune/test_torchrun.py runs the scripts under it): the layer class
FSDP wraps, LittleBird under plain DDP, the process group a script leaves behind, what a script makes of a launch
(processes that train as one, or one line), and losses that Trainer may multiply by the number of processes."""

import os
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import QUIET, tiny_model_args
from helpers.modeling import make_batch, tiny_config
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.trainer_pt_utils import get_module_class_from_name
from transformers.training_args import ParallelMode

import posformers
from posformers.finetune import distributed, run_glue
from posformers.finetune.errors import ArgumentError

PROCESSES = 2


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


# ---------------------------------------------------------------------------------------------------------------------
# A launch: its processes train as one run, or the script stops with one line
# ---------------------------------------------------------------------------------------------------------------------


def test_a_launch_without_an_accelerator_trains_on_the_cpu(monkeypatch):
    """accelerate finds nothing to distribute over on a machine without an accelerator and leaves the processes
    apart, unless told to use the CPU (what --use_cpu and `accelerate launch --cpu` do)."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "")
    monkeypatch.delenv("ACCELERATE_USE_CPU")  # absent, and absent again after the test
    for processes, accelerator in (("1", False), ("2", True)):
        monkeypatch.setenv("WORLD_SIZE", processes)
        monkeypatch.setattr(torch.accelerator, "is_available", lambda accelerator=accelerator: accelerator)
        distributed.train_together_on_cpu()
        assert "ACCELERATE_USE_CPU" not in os.environ, (processes, accelerator)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    distributed.train_together_on_cpu()
    assert os.environ["ACCELERATE_USE_CPU"] == "true"
    monkeypatch.setenv("ACCELERATE_USE_CPU", "false")  # the user's own setting stays
    distributed.train_together_on_cpu()
    assert os.environ["ACCELERATE_USE_CPU"] == "false"


def test_a_launch_whose_processes_would_train_apart_stops_with_one_line(monkeypatch, tmp_path, glue_dir):
    """Two processes that accelerate does not run as one (here: the user set ACCELERATE_USE_CPU=false on a machine
    without a GPU; an accelerator that accelerate does not distribute over, such as Apple's MPS, ends the same way)
    would each train on all the data into the same folder: the script stops before reading any, naming the flag."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "false")
    data = ["--task_name", "sst2", "--validation_file", str(glue_dir / "sst2" / "dev.tsv"), "--do_eval"]
    with pytest.raises(SystemExit) as stopped:
        run_glue.main([*tiny_model_args(), *data, *QUIET, "--output_dir", str(tmp_path / "out")])
    message = str(stopped.value)
    assert message.startswith("error (arguments): the launcher started 2 processes") and "\n" not in message
    assert "pass --use_cpu" in message
    assert not (tmp_path / "out").exists()
    apart = SimpleNamespace(parallel_mode=ParallelMode.NOT_PARALLEL, device=torch.device("mps"))
    with pytest.raises(ArgumentError, match=r"on this machine's mps .* pass --use_cpu"):
        distributed.check_processes_train_together(apart)


# ---------------------------------------------------------------------------------------------------------------------
# Losses: Trainer passes num_items_in_batch (the labels of all processes) to a model whose forward takes **kwargs and
# multiplies its loss by the number of processes
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_class", "config", "task"),
    [
        ("RoFormerForMultipleChoice", {}, "choices"),
        ("DebertaForMultipleChoice", {}, "choices"),
        ("LittleBirdForMultipleChoice", {"block_size": 8, "pack_length": 4}, "choices"),
        ("RoFormerForSequenceClassification", {"num_labels": 1}, "regression"),
        ("LittleBirdForSequenceClassification", {"block_size": 8, "pack_length": 4, "num_labels": 1}, "regression"),
        ("RoFormerForSequenceClassification", {"num_labels": 3}, "classes"),
        ("DebertaForSequenceClassification", {"num_labels": 3}, "classes"),
        ("DebertaForSequenceClassification", {"num_labels": 1}, "regression"),
        ("RoFormerForSequenceClassification", {"problem_type": "multi_label_classification", "num_labels": 3}, "multi"),
    ],
)
def test_heads_divide_their_loss_by_num_items_in_batch(model_class, config, task):
    """A head's loss with `num_items_in_batch` is its labels' sum divided by it: with twice this batch's labels (a
    second process's), half the batch's mean. A mean left as it is read, and trained, the world size times too large
    under DDP (and the accumulation steps times too large with gradient accumulation)."""
    model_class = getattr(posformers, model_class)
    torch.manual_seed(0)
    model = model_class(tiny_config(model_class.config_class, **config)).eval()
    choices = 4 if task == "choices" else None
    input_ids, attention_mask, _ = make_batch(choices=choices)
    labels = {
        "choices": torch.tensor([1, 3, 0]),
        "regression": torch.tensor([0.5, -1.0, 2.0]),
        "classes": torch.tensor([2, 0, 1]),
        "multi": torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]),
    }[task]
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    with torch.no_grad():
        mean = model(**inputs).loss
        shared = model(**inputs, num_items_in_batch=2 * labels.ne(-100).sum()).loss
    torch.testing.assert_close(shared, mean / 2)


def test_scripts_keep_num_items_in_batch_only_for_losses_that_divide_by_it(tmp_path):
    """A model of another library may take **kwargs and still return a mean (transformers' BERT classification
    head): the scripts turn the count off for it, so that Trainer does not multiply its loss by the processes."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    sizes = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    models = {
        "bert": BertForSequenceClassification(BertConfig(**sizes, intermediate_size=64)),
        "posformers": posformers.RoFormerForSequenceClassification(tiny_config(posformers.RoFormerConfig)),
    }
    kept = {}
    for name, model in models.items():
        trainer = Trainer(model=model, args=args)
        assert trainer.model_accepts_loss_kwargs, name  # Trainer's own reading: the forward takes **kwargs
        distributed.attach(trainer)
        kept[name] = trainer.model_accepts_loss_kwargs
    assert kept == {"bert": False, "posformers": True}
