"""Where the time goes: torch.profiler tables for the models of a benchmark suite, one workload and length.

    python -m benchmarks.profile_ops --model roformer --seq-len 512 [--models posformers hf-bert-sdpa] [--top 25]

For each model: the top ops by self CPU time, then the inclusive time of every module class (each module's forward
is wrapped in a `record_function("module::<Class>")` by hooks) and of the functions the suite lists in
`profile_functions` (wrapped the same way as "fn::<name>"), averaged per step. Nothing in the models is changed;
the wrappers are removed afterwards. Profiling adds overhead to every op, so compare models with each other, not
with the times of `benchmarks.run`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from importlib import import_module

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from .harness import ForeignCpuMeter, Options, _default_loss, _make_step, _quiet_stderr
from .registry import SUITES, build_suite


@contextlib.contextmanager
def labelled_modules(model: nn.Module) -> Iterator[None]:
    """Wrap every submodule's forward in record_function("module::<Class>") via hooks."""
    handles, stack = [], []

    def pre_hook(module, args):
        context = record_function(f"module::{type(module).__name__}")
        context.__enter__()
        stack.append(context)

    def post_hook(module, args, output):
        stack.pop().__exit__(None, None, None)

    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(post_hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def labelled_functions(targets: list[str]) -> Iterator[None]:
    """Temporarily replace each "module:attribute" function by a wrapper that labels its calls "fn::<attribute>".

    Works for functions looked up through their module's globals at call time (the usual case)."""
    saved = []
    for target in targets:
        module_name, attribute = target.split(":")
        module = import_module(module_name)
        original = getattr(module, attribute)

        def wrapper(*args, _original=original, _label=f"fn::{attribute}", **kwargs):
            with record_function(_label):
                return _original(*args, **kwargs)

        functools.update_wrapper(wrapper, original)
        setattr(module, attribute, wrapper)
        saved.append((module, attribute, original))
    try:
        yield
    finally:
        for module, attribute, original in reversed(saved):
            setattr(module, attribute, original)


def profile_model(model: nn.Module, workload: str, inputs: dict, steps: int, labels: list[str], quiet_pct: float):
    """Returns the profile and the share of the CPU (%) other processes used meanwhile."""
    prepare, step = _make_step(model, workload, inputs, _default_loss)
    for _ in range(2):
        prepare()
        step()
    meter = ForeignCpuMeter()
    if meter.available and quiet_pct:
        ForeignCpuMeter.wait_until_quiet(quiet_pct, timeout_s=300)
    profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    with labelled_modules(model), labelled_functions(labels), _quiet_stderr(), profiler as prof, meter.measure():
        for _ in range(steps):
            prepare()
            with record_function("step"):
                step()
    return prof, meter.percent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_ops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(SUITES))
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--workload", choices=("forward", "train"), default="forward")
    parser.add_argument("--models", nargs="+", help="which of the suite's models (default: all)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per model")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--quiet-pct",
        type=float,
        default=10.0,
        help="first wait (up to 5 min) until other processes use at most this %% of the CPU (0: don't wait)",
    )
    parser.add_argument(
        "--dropout",
        action="store_true",
        help="run the train workload in train mode (dropout on; on CPU sdpa then falls back to its math path)",
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    suite = build_suite(args.model, max_seq_len=args.seq_len)
    options = Options(seq_lens=[args.seq_len], batch=args.batch)
    device, dtype = options.resolved_device(), options.resolved_dtype()
    wanted = args.models or [entry.name for entry in suite.models]
    inputs = suite.make_inputs(args.batch, args.seq_len, device)
    print(
        f"# {args.model} {args.workload}, batch {args.batch}, seq_len {args.seq_len}, {device} {dtype}, "
        f"{args.threads} threads, {args.steps} profiled steps per model; times are per step\n"
    )
    for entry in suite.models:
        if entry.name not in wanted:
            continue
        model = entry.factory().to(device=device, dtype=dtype)
        model.train(args.workload == "train" and args.dropout)
        prof, foreign = profile_model(model, args.workload, inputs, args.steps, suite.profile_functions, args.quiet_pct)
        averages = prof.key_averages()
        total = next(a for a in averages if a.key == "step").cpu_time_total / args.steps
        noise = "" if foreign is None else f"; other processes used {foreign:.0f}% of the CPU meanwhile"
        print(f"## {entry.name}: {total / 1e3:.1f} ms per step under the profiler{noise}\n")
        print("Top ops by self CPU time (per step):\n")
        print("| op | self ms | % of step | calls |")
        print("|---|---|---|---|")
        ops = sorted(
            (a for a in averages if not a.key.startswith(("module::", "fn::", "step"))),
            key=lambda a: a.self_cpu_time_total,
            reverse=True,
        )
        for a in ops[: args.top]:
            self_ms = a.self_cpu_time_total / args.steps / 1e3
            print(f"| {a.key} | {self_ms:.2f} | {100 * self_ms * 1e3 / total:.1f} | {a.count // args.steps} |")
        print("\nInclusive time of labelled modules and functions (per step):\n")
        print("| label | total ms | % of step | calls |")
        print("|---|---|---|---|")
        labelled = sorted(
            (a for a in averages if a.key.startswith(("module::", "fn::"))),
            key=lambda a: a.cpu_time_total,
            reverse=True,
        )
        for a in labelled:
            total_ms = a.cpu_time_total / args.steps / 1e3
            print(f"| {a.key} | {total_ms:.2f} | {100 * total_ms * 1e3 / total:.1f} | {a.count // args.steps} |")
        print()
        del model, prof
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
