"""A generic side-by-side benchmark harness.

A `Suite` names a few model factories that build models of the same size with the same weights (see
`SharedWeights`), plus a function making inputs. `run_suite` builds every model once, then for each workload
("forward": a forward pass under `torch.inference_mode`; "train": forward + backward of a scalar loss, by default the
sum of `last_hidden_state`, with dropout off unless `Options.train_mode_dropout`) and each sequence length:

1. runs every model `warmup` times, untimed;
2. times `repeats` rounds, alternating the models inside each round (A, B, C, A, B, C, ...) so that a slow spell of
   the machine hits every model alike; a round during which other processes took more than `max_foreign_cpu`% of
   the CPU is redone (see `ForeignCpuMeter`); reports the median, quartiles and minimum, and the ratio of the
   candidate's median (and minimum) to each reference's;
3. measures peak memory with one more, untimed step per model (see `MEMORY_METHODS`).

Before timing, the models listed in `Suite.equivalent` are run on the same input and their largest output difference
is recorded. On CUDA the models run in bfloat16, elsewhere in float32. `format_markdown` and `write_json` render the
report.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

WORKLOADS = ("forward", "train")
DEFAULT_SEQ_LENS = (128, 512, 2048)
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

MEMORY_METHODS = {
    "cuda": (
        "torch.cuda.max_memory_allocated() during one step minus torch.cuda.memory_allocated() before it: peak bytes "
        "of live tensors the step adds on top of weights and inputs (gradients included for train, as they are "
        "freed before every step)."
    ),
    "cpu": (
        "peak of the running sum of the CPU allocator's allocation/free events recorded by torch.profiler "
        "(profile_memory=True) during one step: peak bytes of live tensors the step adds on top of weights and inputs "
        "(gradients included for train, as they are freed before every step). Memory that bypasses c10's allocator "
        "(oneDNN/BLAS scratch, Python objects) is not counted; the step is run separately from the timed ones."
    ),
}

# disentangled-flash (DeBERTa attention kernels with a PyTorch backend) is a column of the clients and realbatch
# suites, not a dependency of posformers: a run without it says so in one line and runs everything else.
FLASH_INSTALL = "pip install disentangled-flash"


def flash_available() -> bool:
    return importlib.util.find_spec("disentangled_flash") is not None


def flash_missing(what: str) -> str:
    """The one line a run prints when disentangled-flash is not installed and `what` is left out."""
    return f"disentangled-flash is not installed ({FLASH_INSTALL}): {what} is left out"


# ---------------------------------------------------------------------------------------------------------------------
# What a suite declares
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class ModelEntry:
    """A named factory returning a freshly built model (on CPU, float32); the harness moves it to device and dtype."""

    name: str
    factory: Callable[[], nn.Module]
    description: str = ""


@dataclass
class Target:
    """`candidate / reference <= max_ratio` for one workload and sequence length.

    metric "time" compares median times, "memory" peak memory. reference may be the candidate itself with
    `reference_seq_len` set: the candidate's own cost at another length (a scaling target).
    """

    workload: str
    seq_len: int
    reference: str
    max_ratio: float
    metric: str = "time"
    reference_seq_len: int | None = None


@dataclass
class Suite:
    """Everything a model family plugs into the harness.

    models: the factories; the first one listed is timed first in every round.
    candidate: the model whose ratios are reported; references: the models it is compared with.
    make_inputs(batch, seq_len, device) -> the keyword arguments of `model(**inputs)`.
    loss_fn(output) -> scalar for the train workload (default: sum of last_hidden_state, in float32).
    equivalent: names of models expected to compute the same function; the harness reports their largest output
        difference from the first one, so a ratio never compares models that silently differ.
    config: what the models were built with, recorded in the report.
    profile_functions: "module:function" names `benchmarks.profile_ops` labels in its profiles (rotary helpers...).
    """

    name: str
    models: list[ModelEntry]
    candidate: str
    references: list[str]
    make_inputs: Callable[[int, int, torch.device], dict[str, torch.Tensor]]
    config: dict[str, Any] = field(default_factory=dict)
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    equivalent: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    profile_functions: list[str] = field(default_factory=list)

    def __post_init__(self):
        names = [entry.name for entry in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"Model names must be unique, got {names}")
        for name in [self.candidate, *self.references, *self.equivalent, *(t.reference for t in self.targets)]:
            if name not in names:
                raise ValueError(f"Suite {self.name!r} refers to model {name!r}, which is not one of {names}")


@dataclass
class Options:
    """How to run a suite. `repeats`/`warmup` of None pick `default_repeats`/`default_warmup` per length."""

    seq_lens: Sequence[int]
    batch: int = 1
    workloads: Sequence[str] = WORKLOADS
    repeats: int | None = None
    warmup: int | None = None
    threads: int | None = None
    device: str | None = None
    dtype: str | None = None
    measure_memory: bool = True
    # False: the train workload runs with modules in eval mode (no dropout). On CPU, sdpa with dropout_p > 0 has no
    # fused kernel and falls back to the math path (the full L x L attention matrix, for every sdpa model alike),
    # which would hide the implementations' differences behind that fallback.
    train_mode_dropout: bool = False
    # Timed rounds during which other processes used more than this share (%) of the CPU are redone (at most
    # `repeats` times per case), after waiting up to quiet_timeout_s for the machine to calm down. None: keep all.
    max_foreign_cpu: float | None = 10.0
    quiet_timeout_s: float = 5.0

    def resolved_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return getattr(torch, self.dtype)
        return torch.bfloat16 if self.resolved_device().type == "cuda" else torch.float32


def random_token_inputs(vocab_size: int, first_id: int = 1) -> Callable:
    """A suite's `make_inputs`: input_ids drawn in [first_id, vocab_size) with a seed that depends on the length only
    (every model and run sees the same batch), and an all-ones attention_mask (an unpadded tokenizer batch)."""

    def make_inputs(batch: int, seq_len: int, device: torch.device) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seq_len)
        input_ids = torch.randint(first_id, vocab_size, (batch, seq_len), generator=generator)
        attention_mask = torch.ones(batch, seq_len, dtype=torch.long)
        return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}

    return make_inputs


def default_repeats(seq_len: int, device: torch.device) -> int:
    """Timed rounds: fewer at long lengths, where one CPU step takes seconds."""
    if device.type == "cuda":
        return 30
    if seq_len <= 256:
        return 15
    if seq_len <= 1024:
        return 7
    return 3


def default_warmup(seq_len: int, device: torch.device) -> int:
    if device.type == "cuda":
        return 5
    return 2 if seq_len <= 1024 else 1


# ---------------------------------------------------------------------------------------------------------------------
# Shared weights
# ---------------------------------------------------------------------------------------------------------------------


class SharedWeights:
    """One set of weights for every model of a suite.

    `build` makes the model whose (seeded, randomly initialised) state dict is the source; it runs once, lazily.
    `load_into` copies it into another model (no storage is shared, so gradients stay separate) and checks that the
    only missing/unexpected keys are the declared ones.
    """

    def __init__(self, build: Callable[[], nn.Module], seed: int = 0):
        self._build = build
        self._seed = seed
        self._state: dict[str, torch.Tensor] | None = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            torch.manual_seed(self._seed)
            self._state = {k: v.detach().clone() for k, v in self._build().state_dict().items()}
        return self._state

    def load_into(
        self, model: nn.Module, allowed_missing: Sequence[str] = (), allowed_unexpected: Sequence[str] = ()
    ) -> nn.Module:
        result = model.load_state_dict(self.state_dict(), strict=False)
        missing = set(result.missing_keys) - set(allowed_missing)
        unexpected = set(result.unexpected_keys) - set(allowed_unexpected)
        if missing or unexpected:
            raise RuntimeError(
                f"{type(model).__name__} does not take the shared weights: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
        return model


# ---------------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _last_hidden_state(output: Any) -> torch.Tensor:
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0]


def _default_loss(output: Any) -> torch.Tensor:
    return _last_hidden_state(output).float().sum()


def _make_step(model: nn.Module, workload: str, inputs: dict, loss_fn: Callable) -> tuple[Callable, Callable]:
    """(prepare, step): `prepare` runs untimed before each `step`."""
    if workload == "forward":

        def forward_step():
            with torch.inference_mode():
                model(**inputs)

        return (lambda: None), forward_step

    def prepare():
        model.zero_grad(set_to_none=True)

    def train_step():
        loss_fn(model(**inputs)).backward()

    return prepare, train_step


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence the profiler's C++ start/stop lines (written to fd 2, so `contextlib.redirect_stderr` misses them)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_peak_bytes(prepare: Callable, step: Callable) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    prepare()
    gc.collect()
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:  # private API: report nothing rather than a wrong number
        return None
    allocations = sorted(
        ((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type().name == "CPU"),
        key=lambda pair: pair[0],
    )
    live = peak = 0
    for _, nbytes in allocations:
        live += nbytes
        peak = max(peak, live)
    return peak


def _cuda_peak_bytes(prepare: Callable, step: Callable, device: torch.device) -> int:
    prepare()
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


class ForeignCpuMeter:
    """CPU time used by other processes while the timed steps run (Linux only), so a report shows its own noise.

    Busy jiffies of the whole machine (/proc/stat) minus this process's CPU time (os.times), both summed over the
    timed steps only; `percent` is that, as a share of every core over the timed wall time. A few percent is
    normal background; tens of percent mean another job shared the cores and the times are inflated.
    """

    def __init__(self):
        self.available = Path("/proc/stat").exists()
        self._tick = os.sysconf("SC_CLK_TCK") if self.available else 100
        self.foreign_s = self.wall_s = 0.0

    def _read(self) -> tuple[float, float]:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / self._tick  # all but idle and iowait; no guest double count
        own = os.times()
        return busy, own.user + own.system

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        if not self.available:
            yield
            return
        busy, own = self._read()
        begin = time.perf_counter()
        yield
        self.wall_s += time.perf_counter() - begin
        busy_after, own_after = self._read()
        self.foreign_s += max(0.0, (busy_after - busy) - (own_after - own))

    def add(self, other: ForeignCpuMeter) -> None:
        self.foreign_s += other.foreign_s
        self.wall_s += other.wall_s

    @classmethod
    def wait_until_quiet(cls, max_percent: float, timeout_s: float, window_s: float = 1.0) -> float:
        """Sleep in `window_s` windows until other processes use at most `max_percent` of the CPU, or `timeout_s`
        passed; returns the seconds waited."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout_s:
            meter = cls()
            with meter.measure():
                time.sleep(window_s)
            if meter.percent is None or meter.percent <= max_percent:
                break
        return time.perf_counter() - started

    @property
    def percent(self) -> float | None:
        if not self.available or self.wall_s == 0:
            return None
        return 100.0 * self.foreign_s / (self.wall_s * (os.cpu_count() or 1))


def _process_cpu_s() -> float:
    """CPU time of this process, all threads: unlike wall time, it barely grows while other jobs hold the cores."""
    own = os.times()
    return own.user + own.system


def _summary(times: list[float]) -> dict[str, Any]:
    ms = [t * 1e3 for t in times]
    quartiles = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {
        "median_ms": statistics.median(ms),
        "q1_ms": quartiles[0],
        "q3_ms": quartiles[2],
        "min_ms": min(ms),
        "times_ms": ms,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Running a suite
# ---------------------------------------------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def environment(device: torch.device, dtype: torch.dtype, threads: int) -> dict[str, Any]:
    import transformers

    def git(*args):
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine()
        with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
            device_name = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), device_name
            )
    models_status = git("status", "--porcelain", "--", "models")
    return {
        "device": str(device),
        "device_name": device_name,
        "dtype": str(dtype).removeprefix("torch."),
        "torch_threads": threads,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "models_dir_modified": bool(models_status) if models_status is not None else None,
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _build_models(suite: Suite, device: torch.device, dtype: torch.dtype) -> dict[str, nn.Module]:
    models = {}
    for entry in suite.models:
        started = time.perf_counter()
        models[entry.name] = entry.factory().to(device=device, dtype=dtype).eval()
        _log(f"built {entry.name} in {time.perf_counter() - started:.1f}s")
    return models


def _check_equivalence(suite: Suite, models: dict[str, nn.Module], inputs: dict) -> dict[str, float]:
    if len(suite.equivalent) < 2:
        return {}
    with torch.inference_mode():
        outputs = {name: _last_hidden_state(models[name](**inputs)).float() for name in suite.equivalent}
    first = suite.equivalent[0]
    return {f"{name} vs {first}": float((outputs[name] - outputs[first]).abs().max()) for name in suite.equivalent[1:]}


def run_suite(suite: Suite, options: Options) -> dict[str, Any]:
    device, dtype = options.resolved_device(), options.resolved_dtype()
    threads = options.threads or torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(threads)
    for workload in options.workloads:
        if workload not in WORKLOADS:
            raise ValueError(f"Unknown workload {workload!r}; choose from {WORKLOADS}")
    report: dict[str, Any] = {
        "suite": suite.name,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment(device, dtype, threads),
        "config": suite.config,
        "options": {
            "seq_lens": list(options.seq_lens),
            "batch": options.batch,
            "workloads": list(options.workloads),
            "repeats": options.repeats,
            "warmup": options.warmup,
            "train_mode_dropout": options.train_mode_dropout,
            "max_foreign_cpu": options.max_foreign_cpu,
        },
        "models": {entry.name: entry.description for entry in suite.models},
        "candidate": suite.candidate,
        "references": suite.references,
        "notes": suite.notes,
        "memory_method": MEMORY_METHODS["cuda" if device.type == "cuda" else "cpu"] if options.measure_memory else None,
        "results": [],
    }
    loss_fn = suite.loss_fn or _default_loss
    started = time.perf_counter()
    models = _build_models(suite, device, dtype)
    report["equivalence_max_abs_diff"] = _check_equivalence(
        suite, models, suite.make_inputs(options.batch, min(options.seq_lens), device)
    )
    for name, diff in report["equivalence_max_abs_diff"].items():
        _log(f"equivalence: max |{name}| = {diff:.3g}")

    for workload in options.workloads:
        for model in models.values():
            model.train(workload == "train" and options.train_mode_dropout)
        for seq_len in options.seq_lens:
            report["results"].append(_run_case(suite, models, workload, seq_len, options, device, loss_fn))
            _log(f"[{time.perf_counter() - started:6.0f}s] {workload} seq_len={seq_len} done")
        for model in models.values():
            model.zero_grad(set_to_none=True)

    checked = [
        _check_target(report, target)
        for target in suite.targets
        if target.workload in options.workloads and target.seq_len in options.seq_lens
    ]
    report["targets"] = [target for target in checked if target is not None]
    report["environment"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["wall_s"] = time.perf_counter() - started
    return report


def _run_case(
    suite: Suite,
    models: dict[str, nn.Module],
    workload: str,
    seq_len: int,
    options: Options,
    device: torch.device,
    loss_fn: Callable,
) -> dict[str, Any]:
    repeats = options.repeats or default_repeats(seq_len, device)
    warmup = options.warmup if options.warmup is not None else default_warmup(seq_len, device)
    inputs = suite.make_inputs(options.batch, seq_len, device)
    steps = {name: _make_step(model, workload, inputs, loss_fn) for name, model in models.items()}

    for _ in range(warmup):
        for prepare, step in steps.values():
            prepare()
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu_times: dict[str, list[float]] = {name: [] for name in steps}
    meter = ForeignCpuMeter()
    limit = options.max_foreign_cpu if meter.available else None
    discarded = 0
    while len(times[suite.candidate]) < repeats:
        if limit is not None:
            ForeignCpuMeter.wait_until_quiet(limit, options.quiet_timeout_s)
        round_meter = ForeignCpuMeter()
        round_times, round_cpu = {}, {}
        for name, (prepare, step) in steps.items():
            prepare()
            gc.collect()
            _sync(device)
            with round_meter.measure():
                cpu_begin = _process_cpu_s()
                begin = time.perf_counter()
                step()
                _sync(device)
                round_times[name] = time.perf_counter() - begin
                round_cpu[name] = _process_cpu_s() - cpu_begin
        busy = round_meter.percent
        if limit is not None and busy is not None and busy > limit and discarded < repeats:
            discarded += 1
            _log(f"  discarded a {workload} seq_len={seq_len} round: other processes used {busy:.0f}% of the CPU")
            continue
        for name, elapsed in round_times.items():
            times[name].append(elapsed)
            cpu_times[name].append(round_cpu[name])
        meter.add(round_meter)

    per_model = {name: _summary(values) for name, values in times.items()}
    for name, values in cpu_times.items():
        per_model[name]["median_process_cpu_ms"] = statistics.median(values) * 1e3
    if options.measure_memory:
        for name, (prepare, step) in steps.items():
            peak = _cuda_peak_bytes(prepare, step, device) if device.type == "cuda" else _cpu_peak_bytes(prepare, step)
            per_model[name]["peak_mem_mib"] = None if peak is None else peak / 2**20
    candidate = per_model[suite.candidate]["median_ms"]
    return {
        "workload": workload,
        "seq_len": seq_len,
        "batch": options.batch,
        "repeats": repeats,
        "warmup": warmup,
        "models": per_model,
        "ratios": {ref: candidate / per_model[ref]["median_ms"] for ref in suite.references},
        "ratios_of_min": {
            ref: per_model[suite.candidate]["min_ms"] / per_model[ref]["min_ms"] for ref in suite.references
        },
        "ratios_of_process_cpu": {
            ref: per_model[suite.candidate]["median_process_cpu_ms"] / per_model[ref]["median_process_cpu_ms"]
            for ref in suite.references
        },
        "foreign_cpu_pct": meter.percent,
        "discarded_rounds": discarded,
    }


_METRIC_LABELS = {"time": "", "memory": " peak memory"}


def _find_case(report: Mapping[str, Any], workload: str, seq_len: int) -> dict[str, Any]:
    return next(r for r in report["results"] if r["workload"] == workload and r["seq_len"] == seq_len)


def _check_target(report: dict[str, Any], target: Target) -> dict[str, Any] | None:
    """The target's ratio, or None when the run did not measure what it needs."""
    key = "median_ms" if target.metric == "time" else "peak_mem_mib"
    ref_len = target.reference_seq_len or target.seq_len
    if not any(r["workload"] == target.workload and r["seq_len"] == ref_len for r in report["results"]):
        return None
    mine = _find_case(report, target.workload, target.seq_len)["models"][report["candidate"]].get(key)
    theirs = _find_case(report, target.workload, ref_len)["models"][target.reference].get(key)
    if mine is None or theirs is None:
        return None
    ratio = mine / theirs
    return {
        "workload": target.workload,
        "seq_len": target.seq_len,
        "reference": target.reference if ref_len == target.seq_len else f"{target.reference} at {ref_len}",
        "metric": target.metric,
        "max_ratio": target.max_ratio,
        "ratio": ratio,
        "met": ratio <= target.max_ratio,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------------


def format_markdown(report: Mapping[str, Any]) -> str:
    env = report["environment"]
    names = list(report["models"])
    candidate = report["candidate"]
    lines = [
        f"## {report['suite']}: {candidate} vs {', '.join(report['references'])}",
        "",
        f"{env['device_name']} ({env['device']}), {env['dtype']}, torch threads {env['torch_threads']}, "
        f"torch {env['torch']}, transformers {env['transformers']}, commit {env['git_commit']}"
        + (" (models/ modified)" if env.get("models_dir_modified") else ""),
        "",
    ]
    header = ["workload", "seq", "batch", "runs (redone)", "other CPU %"]
    header += [f"{name} ms" for name in names]
    header += [f"{candidate} / {ref}" for ref in report["references"]]
    with_memory = report.get("memory_method") is not None
    if with_memory:
        header += [f"{name} peak MiB" for name in names]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for case in report["results"]:
        foreign = case.get("foreign_cpu_pct")
        runs = f"{case['repeats']} ({case.get('discarded_rounds', 0)})"
        row = [case["workload"], str(case["seq_len"]), str(case["batch"]), runs]
        row.append("n/a" if foreign is None else f"{foreign:.0f}")
        for name in names:
            stats = case["models"][name]
            row.append(f"{stats['median_ms']:.1f} ({stats['q1_ms']:.0f}-{stats['q3_ms']:.0f})")
        row += [f"{case['ratios'][ref]:.2f}x ({case['ratios_of_min'][ref]:.2f}x)" for ref in report["references"]]
        if with_memory:
            for name in names:
                peak = case["models"][name].get("peak_mem_mib")
                row.append("n/a" if peak is None else f"{peak:.0f}")
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Times: median (interquartile range) over the timed runs, in milliseconds; ratios: of medians (of minima). "
        "other CPU %: CPU time other "
        "processes used during the kept timed runs, as a share of all cores (high values mean inflated, noisy "
        "times); rounds above the --max-other-cpu limit are redone, and the count of redone rounds is in brackets.",
    ]
    if with_memory:
        lines.append(f"Peak memory: {report['memory_method']}")
    for label, diff in report.get("equivalence_max_abs_diff", {}).items():
        lines.append(f"Same weights, same function: max |{label}| on last_hidden_state = {diff:.2g}.")
    dropout = "on (modules in train mode)" if report["options"]["train_mode_dropout"] else "off (modules in eval mode)"
    if "train" in report["options"]["workloads"]:
        lines.append(
            "train = forward + backward of the loss (default: last_hidden_state.sum()), gradients set to None before "
            f"each step, no optimizer step; dropout {dropout}."
        )
    for note in report.get("notes", []):
        lines.append(f"Note: {note}")
    if env["device"] == "cpu" and report["references"]:
        lines += [
            "",
            "Process CPU time ratios (median CPU seconds of this process, all threads, per step): less disturbed by "
            "other jobs than wall time, but counts threads spinning at barriers.",
            "",
            "| workload | seq | " + " | ".join(f"{candidate} / {ref}" for ref in report["references"]) + " |",
            "|---|---|" + "---|" * len(report["references"]),
        ]
        for case in report["results"]:
            ratios = case.get("ratios_of_process_cpu", {})
            cells = [f"{ratios[ref]:.2f}x" if ref in ratios else "n/a" for ref in report["references"]]
            lines.append(f"| {case['workload']} | {case['seq_len']} | " + " | ".join(cells) + " |")
    if report.get("targets"):
        lines += ["", "| target | ratio | limit | met |", "|---|---|---|---|"]
        for target in report["targets"]:
            lines.append(
                f"| {target['workload']} {target['seq_len']}{_METRIC_LABELS[target.get('metric', 'time')]}: "
                f"{candidate} / {target['reference']} | "
                f"{target['ratio']:.2f}x | <= {target['max_ratio']:.2f}x | {'yes' if target['met'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def write_json(report: Mapping[str, Any], path: Path | None = None) -> Path:
    path = path or RESULTS_DIR / f"{report['suite']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def write_outputs(
    report: Mapping[str, Any],
    json_path: Path,
    format_markdown: Callable[[Mapping[str, Any]], str],
    plot: Callable[[Mapping[str, Any], Path], Path],
) -> dict[str, Path | str]:
    """Write the JSON report, its markdown table and its plot beside each other; a plot that cannot be drawn (no
    matplotlib) is reported by a message instead of a path."""
    written: dict[str, Path | str] = {"json": write_json(report, json_path)}
    written["markdown"] = json_path.with_suffix(".md")
    written["markdown"].write_text(format_markdown(report))
    try:
        written["plot"] = plot(report, json_path.with_suffix(".png"))
    except ImportError as error:
        written["plot"] = str(error)
    return written


def run_and_write(
    run: Callable[[Callable[[dict[str, Any]], None]], dict[str, Any]],
    json_path: Path,
    format_markdown: Callable[[Mapping[str, Any]], str],
    plot: Callable[[Mapping[str, Any], Path], Path],
) -> tuple[dict[str, Any], dict[str, Path | str]]:
    """Run a suite that reports each finished cell (`run(on_cell)`), then write its outputs: (report, what
    `write_outputs` wrote). Until the run ends, `<json_path>.partial.json` holds the cells finished so far, so a run
    that dies leaves them."""
    partial = json_path.with_suffix(".partial.json")

    def save_partial(report: dict[str, Any]) -> None:
        write_json({**report, "complete": False}, partial)

    report = run(save_partial)
    written = write_outputs(report, json_path, format_markdown, plot)
    partial.unlink(missing_ok=True)
    return report, written
