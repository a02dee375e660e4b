"""A process of the 2-process gloo DDP test of LittleBird (tests/finetune/test_distributed.py), in a module of its own:
torch.multiprocessing.spawn re-imports the target's module in each child, and a test module's imports (its conftest)
resolve differently there."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import posformers

from .modeling import make_batch, tiny_config
from .sample_log import weights_digest


def two_training_steps(rank: int, world_size: int, init_file: str, result_dir: str, old_last_layer: bool) -> None:
    """Two MLM training steps of a tiny LittleBird under DistributedDataParallel without unused-parameter detection
    (`find_unused_parameters=False`); writes rank<R>.txt: "ok <weights digest>" or "error: <message>".
    `old_last_layer` gives the last layer back the pack LayerNorm older checkpoints carry, whose output fed nothing."""
    torch.set_num_threads(1)
    # A collective that waits on a process which failed raises after the timeout instead of hanging the test.
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
    )
    try:
        torch.manual_seed(0)
        model = posformers.LittleBirdForMaskedLM(tiny_config(posformers.LittleBirdConfig)).train()
        if old_last_layer:
            last = model.littlebird.encoder.layer[-1].pack_attention
            last.LayerNorm = torch.nn.LayerNorm(model.config.hidden_size, eps=model.config.layer_norm_eps)
        ddp = DistributedDataParallel(model, find_unused_parameters=False)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(2):
            input_ids, attention_mask, token_type_ids = make_batch(seed=10 * rank + step)
            labels = input_ids.masked_fill(attention_mask == 0, -100)
            ddp(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        outcome = "ok " + weights_digest(model)
    except RuntimeError as error:
        outcome = f"error: {error}"
    # Every collective either rank started has finished once both pass this barrier.
    dist.barrier()
    (Path(result_dir) / f"rank{rank}.txt").write_text(outcome)
    # Leave without tearing down torch's objects: the Reducer's destructor, run with the GIL held, joins gloo's worker
    # threads, and a worker finishing a work item waits for the GIL, so the process can deadlock at exit (seen here
    # about one run in three, py-spy: ~ProcessGroupGloo <- ~Reducer <- pybind11 dealloc). The result is on disk.
    os._exit(0)
