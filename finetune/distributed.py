"""Several processes (torchrun; gloo on CPU): the --ddp_timeout the user set, FSDP that shards, models that load.
Every script's main (finetune/script.py) takes these steps:

    @exit_on_data_error
    @exit_on_lost_process             # a failed collective: one line, exit status 1; a clean end of the processes
    def main(argv=None):
        ...                               # parse_arguments: train_together_on_cpu() before TrainingArguments is
                                          # built, check_processes_train_together(training_args) after
        prepare_processes(training_args)  # before building the Trainer
        trainer = Trainer(...)
        attach(trainer)                   # FSDP2: tied MLM heads shard; saves keep the model's class and tied names;
                                          # the losses reported are those of one process with the whole batch

A process that dies (SIGKILL, out of memory) or hangs: under torchrun on one machine the agent sees a worker exit
and stops the others at once (SIGTERM, then SIGKILL 30 s later), naming the worker and its signal. The processes
on another machine, or beside a worker that hangs without exiting, learn it from their next collective: gloo raises
at once when the peer's connection closes, and after --ddp_timeout when the peer is silent. `exit_on_lost_process`
turns that error into one line and leaves at once, without the interpreter's teardown (which can wait on gloo's
threads for good, see tests/helpers/littlebird_ddp.py).

What goes wrong without this module (transformers 5.23, accelerate 1.15, torch 2.13):

- torchrun on a machine without a GPU, without `--use_cpu`: accelerate's PartialState looks for an accelerator to
  distribute over, finds none, and still initializes a process group (gloo) because LOCAL_RANK is set; it then counts
  the run as one process (DistributedType.NO; transformers logs "torch.distributed process group is initialized, but
  parallel_mode != ParallelMode.DISTRIBUTED"). Every process trained on all the data on its own, printed its own
  metrics and wrote the same output folder. With `--ddp_backend gloo` the run counted its processes, so Trainer
  split the data between them, but still no DDP: the processes never averaged their gradients, each trained its own
  model, and the losses read the world size times too large (below). `train_together_on_cpu` does what `--use_cpu`
  (accelerate's ACCELERATE_USE_CPU) does there: the processes train as one over gloo. A launch that would still run
  its processes apart (an accelerator that accelerate does not distribute over) stops with one line
  (`check_processes_train_together`).
- Trainer multiplies the loss by the number of processes for every model whose forward takes `**kwargs`
  (`model_accepts_loss_kwargs`, with `--average_tokens_across_devices`, the default), assuming the loss is a sum
  divided by `num_items_in_batch`, the label count of all processes (DDP then averages the gradients back). A loss
  that ignores it, a mean over this process's batch, came out the world size times too large, in the logs, in the
  evaluation and in the gradients; so did every loss of a run whose processes do not all-reduce (above), where
  `num_items_in_batch` stays this process's count. posformers' heads honour it; for a model of another library,
  which the scripts cannot inspect, `attach` turns the loss kwargs off: each process's loss is then the mean over its
  own batch, averaged over the processes by DDP.
- Trainer's final `train_loss` adds the losses since the last logging step as this process alone saw them (the
  logged ones are averaged over the processes): a run shorter than --logging_steps reported process 0's half of the
  batch. `attach` averages them over the processes first.
- `--ddp_timeout` is passed to the process group only on GPUs (TrainingArguments._setup_devices): a CPU run keeps
  gloo's 30 minutes, so a process that hangs (a stopped or unreachable peer) held the others for half an hour
  whatever the user set. `prepare_processes` sets the process group's timeout to --ddp_timeout: a collective that
  waits longer for a silent peer raises, and the process exits with that error.
- `--fsdp` (with `--fsdp_config`) is Trainer's FSDP: FSDP2 `fully_shard` by default (fsdp_config {"version": 2}),
  each encoder layer wrapped on its own (the models' `_no_split_modules`). accelerate attaches the FSDP plugin only
  on accelerators: on CPU its state stays MULTI_CPU, the plugin is dropped and Trainer silently trains plain DDP.
  torch's `fully_shard` runs on CPU with gloo, so `prepare_processes` makes accelerate's state FSDP there, as it is
  on a GPU.
- `fully_shard` changes the model's class in place to a subclass `FSDP<Model>` defined in torch's `_fsdp_init`
  module, and `save_pretrained` writes the remote code of the model's class: every checkpoint got torch's private
  `_fsdp_*.py` files instead of `modeling_<model>.py`, and a config `auto_map` naming `_fsdp_init.FSDP<Model>`.
  `save_as_own_class` saves under the model's own class.
- FSDP2 and an MLM head (GPUs too): see `unregister_embedding_aliases`; without it every posformers-pretrain MLM run
  (and transformers' BERT) stopped at its first step. A full state dict gathered from the shards also held the tied
  decoder weight a second time, which save_pretrained then wrote: `shared_state_dict` ties the names again.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import sys
from collections.abc import Callable

import accelerate.state
import torch
import torch.distributed as dist
from accelerate.utils import DistributedType
from torch.distributed.fsdp import FSDPModule
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import unwrap_peft_model
from transformers.training_args import ParallelMode

from .errors import ArgumentError

# What the scripts exit with when a collective fails (as for bad input: the user has to act, here by resuming).
LOST_PROCESS_EXIT_STATUS = 1


def collective_failed(error: BaseException) -> bool:
    """Whether `error` is a collective that failed (torch's DistError, or gloo's RuntimeError) in a multi-process
    run."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and "gloo" in str(error))


def exit_on_lost_process(main: Callable) -> Callable:
    """Wrap a script's `main(argv=None)`: when a collective fails because another process died or stopped answering,
    say so in one line (with gloo's or NCCL's message) and exit with LOST_PROCESS_EXIT_STATUS.

    When `main` returns in a multi-process run, the processes wait for each other, the run's objects (the DDP or FSDP
    model holds the process group) are freed and the process group is destroyed, while the interpreter is whole. Left
    to the interpreter's teardown, gloo's worker threads can still hold tensors, and a process whose run succeeded
    died with SIGABRT ("terminate called without an active exception"), which torchrun reports as a failed run."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None):
        try:
            result = main(argv)
            in_process_group = dist.is_available() and dist.is_initialized()
            if in_process_group:
                dist.barrier()
        except (RuntimeError, dist.DistError) as error:
            if not collective_failed(error):
                raise
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            print(
                f"error (processes): process {dist.get_rank()} of {dist.get_world_size()}: another process of this "
                "run died or stopped answering (a silent one is given up after --ddp_timeout); resume from the last "
                f"checkpoint with --resume_from_checkpoint True. {type(error).__name__}: {reason}",
                file=sys.stderr,
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            # Not through the interpreter's teardown: destroying a gloo process group whose peer is gone can wait on
            # its worker threads for good, and this process would then never exit.
            os._exit(LOST_PROCESS_EXIT_STATUS)
        if in_process_group:
            gc.collect()  # the Trainer and its wrapped model are in reference cycles
            dist.destroy_process_group()
        return result

    return wrapper


def launched_processes() -> int:
    """How many processes the launcher started (torchrun and accelerate launch set WORLD_SIZE); 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1") or "1")


def train_together_on_cpu() -> None:
    """Before TrainingArguments is built (it sets up the processes): under a launcher on a machine without an
    accelerator, have accelerate run the processes as one CPU run over gloo, as `--use_cpu` does. Without it accelerate
    leaves them apart (see the module's docstring). ACCELERATE_USE_CPU is what `accelerate launch --cpu` sets; a value
    the user set is kept."""
    if launched_processes() > 1 and not torch.accelerator.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")


def check_processes_train_together(training_args: TrainingArguments) -> None:
    """Stop a launch whose processes would each train on their own (and write the same output folder): one line
    naming the flag that makes them one run."""
    processes = launched_processes()
    # NOT_DISTRIBUTED: several GPUs under one process (DataParallel); TPUs and SageMaker have modes of their own
    if processes <= 1 or training_args.parallel_mode not in (ParallelMode.NOT_PARALLEL, ParallelMode.NOT_DISTRIBUTED):
        return
    device = training_args.device.type
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # accelerate's, unused: left to the interpreter's teardown it can abort the exit
    raise ArgumentError(
        f"the launcher started {processes} processes, but accelerate does not run them as one on this machine's "
        f"{device} (each would train on its own): pass --use_cpu to train them together on the CPU (gloo)"
    )


def prepare_processes(training_args: TrainingArguments) -> None:
    """On CPU: --ddp_timeout for the process group, and --fsdp that shards (see the module's docstring)."""
    if training_args.device.type != "cpu":
        return
    if dist.is_available() and dist.is_initialized():
        # A private torch function, the only way to change the timeout of a process group that accelerate created.
        dist.distributed_c10d._set_pg_timeout(training_args.ddp_timeout_delta)
    if training_args.fsdp_plugin_args is not None:
        shard_on_cpu()


def shard_on_cpu() -> None:
    """Make accelerate build FSDP on CPU as it does on a GPU (once per process)."""
    init = accelerate.state.AcceleratorState.__init__
    if getattr(init, "shards_on_cpu", False):
        return

    @functools.wraps(init)
    def init_sharding_on_cpu(state, *args, fsdp_plugin=None, **kwargs):
        init(state, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        # What AcceleratorState.__init__ does with an FSDP plugin on a GPU (accelerate/state.py), skipped on CPU.
        if fsdp_plugin is not None and state.distributed_type == DistributedType.MULTI_CPU:
            state.distributed_type = DistributedType.FSDP
            state.fsdp_plugin = fsdp_plugin
            accelerate.state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    init_sharding_on_cpu.shards_on_cpu = True
    accelerate.state.AcceleratorState.__init__ = init_sharding_on_cpu


def own_class(model) -> type:
    """The class `fully_shard` subclassed (FSDP<Model> -> Model); the model's class when it is not sharded."""
    if not isinstance(model, FSDPModule):
        return type(model)
    return next(base for base in type(model).__bases__ if not issubclass(base, FSDPModule))


def attach(trainer: Trainer) -> None:
    """After building the Trainer: under FSDP2, register the embeddings' parameters once; every save writes the model
    under its own class; the losses it reports are those of one process with the processes' batches together (see
    the module's docstring)."""
    aliases = {}
    if trainer.is_fsdp_enabled and trainer.accelerator.state.fsdp_plugin.fsdp_version == 2:
        aliases = unregister_embedding_aliases(trainer.model)
    save_as_own_class(trainer, aliases)
    count_loss_items_only_for_posformers(trainer)
    average_final_loss(trainer)


def count_loss_items_only_for_posformers(trainer: Trainer) -> None:
    """Trainer hands `num_items_in_batch` to a model that takes `**kwargs` and multiplies its loss by the number of
    processes: right for a loss divided by that count, as posformers' heads do; the world size times too large for one
    that ignores it (transformers' own BERT classification heads, for one). The scripts cannot tell which a model of
    another library computes: for those they turn the count off, and each process's loss is its batch's mean."""
    model = unwrap_peft_model(trainer.accelerator.unwrap_model(trainer.model))
    if trainer.model_accepts_loss_kwargs and not type(model).__module__.startswith("posformers."):
        trainer.model_accepts_loss_kwargs = False


def average_final_loss(trainer: Trainer) -> None:
    """Make the final `train_loss` the mean over the processes. Trainer averages the loss of every logging step over
    the processes, but adds what accrued since the last one (`_tr_loss`, private) as this process alone saw it, in
    `_finalize_training` (private). Every process calls it: the average is a collective."""
    finalize = trainer._finalize_training

    def finalize_with_average(*args, **kwargs):
        if trainer.args.world_size > 1 and torch.is_tensor(getattr(trainer, "_tr_loss", None)):
            trainer._tr_loss = trainer.accelerator.gather(trainer._tr_loss.detach().reshape(1)).mean()
        return finalize(*args, **kwargs)

    trainer._finalize_training = finalize_with_average


def unregister_embedding_aliases(model) -> dict[str, str]:
    """Unregister the second names of the input and output embeddings' parameters held by other modules; returns
    {second name: the embedding's name}.

    accelerate shards the tied word embeddings and MLM decoder as one FSDP2 group, but a BERT-style head registers
    the decoder's bias a second time (`cls.predictions.bias`, what checkpoints name it), which then lands in the
    root's group: torch 2.13 refuses a parameter that two groups hold. Nothing reads the second name in a forward
    pass (the decoder adds its bias); saves put it back into the state dict (`save_as_own_class`)."""
    embeddings = [model.get_input_embeddings(), model.get_output_embeddings()]
    names = {
        id(parameter): f"{module_name}.{name}" if module_name else name
        for module_name, module in model.named_modules()
        if any(module is embedding for embedding in embeddings if embedding is not None)
        for name, parameter in module.named_parameters(recurse=False)
    }
    aliases = {}
    for module_name, module in model.named_modules():
        if any(module is embedding for embedding in embeddings):
            continue
        for name, parameter in list(module.named_parameters(recurse=False)):
            if id(parameter) in names:
                del module._parameters[name]
                aliases[f"{module_name}.{name}" if module_name else name] = names[id(parameter)]
    return aliases


def shared_state_dict(state_dict: dict, model, aliases: dict[str, str]) -> dict:
    """A full state dict gathered from FSDP shards holds a copy per name of a tied parameter: one tensor for all its
    names again (and its second names `aliases` back), so that save_pretrained keeps one of them, as without FSDP."""
    state_dict = dict(state_dict)
    first_names = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        first = first_names.setdefault(id(parameter), name)
        if first != name and first in state_dict and name in state_dict:
            state_dict[name] = state_dict[first]
    state_dict.update({alias: state_dict[name] for alias, name in aliases.items() if name in state_dict})
    return state_dict


def save_as_own_class(trainer: Trainer, aliases: dict[str, str] | None = None) -> None:
    """Make every save of `trainer` (checkpoints, the final model, push_to_hub) write the model under its own class,
    with the parameters' second names `aliases` ({second name: name}) back in its state dict. Trainer._save is
    private: it is where process 0 writes the weights, gathered from the shards on every process before, with
    save_pretrained; only the class object changes during it, not the modules or their parameters."""
    save = trainer._save

    def save_under_own_class(output_dir=None, state_dict=None):
        if state_dict and isinstance(trainer.model, FSDPModule):  # process 0's full state dict, the others' is empty
            state_dict = shared_state_dict(state_dict, trainer.model, aliases or {})
        model = trainer.model
        sharded_class = type(model)
        model.__class__ = own_class(model)
        try:
            return save(output_dir, state_dict=state_dict)
        finally:
            model.__class__ = sharded_class

    trainer._save = save_under_own_class
