"""Several processes without torchrun (tests/finetune/test_torchrun.py runs the scripts under it): the layer class
FSDP wraps, LittleBird under plain DDP, and the process group a script leaves behind."""

import time

import pytest
import torch
from transformers.trainer_pt_utils import get_module_class_from_name

import posformers

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
