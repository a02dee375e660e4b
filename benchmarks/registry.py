"""Benchmark suites by model name.

Each entry is "module:function"; the function takes `max_seq_len` (the longest length the run will use, so position
tables can be sized to it) and returns a `harness.Suite`. The module may set `DEFAULT_SEQ_LENS` (else
`harness.DEFAULT_SEQ_LENS`); `SUITE_SEQ_LENS` overrides it for one suite. A new suite plugs in by adding a module
beside `roformer.py` and a line here; modules are imported only when their suite is run.
"""

from importlib import import_module

from .harness import DEFAULT_SEQ_LENS, Suite

SUITES = {
    "roformer": "benchmarks.roformer:build_suite",
    "deberta": "benchmarks.deberta:build_suite",
    "littlebird": "benchmarks.littlebird:build_suite",
    "littlebird-scaling": "benchmarks.littlebird:build_scaling_suite",
    "littlebird-train": "benchmarks.littlebird:build_train_suite",
    "littlebird-train-scaling": "benchmarks.littlebird:build_train_scaling_suite",
}
# Suites that share a module but not its DEFAULT_SEQ_LENS.
SUITE_SEQ_LENS = {
    "littlebird-scaling": (1024, 2048, 4096, 8192, 16384),
    "littlebird-train-scaling": (1024, 2048, 4096, 8192, 16384),
}


def _resolve(name: str):
    if name not in SUITES:
        raise ValueError(f"Unknown benchmark suite {name!r}; choose one of {sorted(SUITES)}")
    module_name, function_name = SUITES[name].split(":")
    module = import_module(module_name)
    return module, getattr(module, function_name)


def default_seq_lens(name: str) -> tuple[int, ...]:
    if name in SUITE_SEQ_LENS:
        return SUITE_SEQ_LENS[name]
    return tuple(getattr(_resolve(name)[0], "DEFAULT_SEQ_LENS", DEFAULT_SEQ_LENS))


def build_suite(name: str, max_seq_len: int) -> Suite:
    return _resolve(name)[1](max_seq_len=max_seq_len)
