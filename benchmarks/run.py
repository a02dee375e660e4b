"""Run a benchmark suite and print a markdown table; the full report goes to benchmarks/results/<suite>.json.

    python -m benchmarks.run --model roformer [--seq-lens 128 512 2048] [--batch 1] [--repeats N] [--quick]
    python -m benchmarks.run --suite realbatch [--quick] [--families roformer deberta littlebird]
    python -m benchmarks.run --model roformer --plot-only [--output benchmarks/results/roformer.json]

Every run also plots its report next to the JSON (<suite>.png: time and peak memory per workload and length,
benchmarks/plot.py; needs matplotlib, `pip install 'posformers[bench]'`, else one line says so); `--plot-only`
redraws the plot of a report already written, without running anything.

`--suite` names any suite (`--model roformer` and `--suite roformer` are the same run). `realbatch` (see
benchmarks/realbatch.py) runs every model, real-data workload, mode and variant in one run (posformers padding-free
and padded, transformers in random and length-grouped order, the floor: the model's dense matmuls alone on the real
tokens, and for DeBERTa disentangled-flash's PyTorch backend, when `pip install disentangled-flash` has installed it)
and also writes realbatch.md and a plot, realbatch.png; of the options below it takes --quick (tiny models, one timed
batch per cell), --families, --threads, --max-other-cpu, --no-memory and --output. `gpu` runs benchmarks/gpu.py (the
GPU suite, `python -m benchmarks.gpu`) with --device, --dtype, --output, and --quick as its --smoke. `deploy` runs
benchmarks/deploy.py (CPU deployment: ONNX Runtime float32 and int8 against PyTorch) with --quick, --threads, --output.
`clients` runs benchmarks/clients.py (transformers pipelines, a Trainer step, sentence-transformers and GLiNER2 as
shipped and on posformers' drop-in; writes clients.json, .md and .png) with --quick (tiny models, a few items),
--threads, --repeats, --max-other-cpu and --output.

On CPU the torch thread count is fixed for the whole run (`--threads`, default: every core) and recorded; models run
in float32. With CUDA available they run on the GPU in bfloat16.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from . import plot, realbatch
from .harness import RESULTS_DIR, WORKLOADS, Options, format_markdown, run_suite, write_json
from .registry import SUITES, build_suite, default_seq_lens

QUICK_SEQ_LENS = (128, 512)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    suite = parser.add_mutually_exclusive_group(required=True)
    suite.add_argument("--model", choices=sorted(SUITES), help="benchmark suite of one model")
    suite.add_argument(
        "--suite", choices=[*sorted(SUITES), "realbatch", "gpu", "deploy", "clients"], help="benchmark suite"
    )
    parser.add_argument(
        "--families",
        nargs="+",
        choices=list(realbatch.FAMILIES),
        default=list(realbatch.FAMILIES),
        help="realbatch: the models to run (default: all)",
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", help="sequence lengths (default: the suite's, 128 512 2048)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--repeats",
        type=int,
        help="timed runs per model and length (default: 15 up to 256 tokens, 7 up to 1024, 3 beyond)",
    )
    parser.add_argument("--warmup", type=int, help="untimed runs per model first (default: 2, 1 beyond 1024 tokens)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: lengths {' '.join(map(str, QUICK_SEQ_LENS))}, 3 timed runs, 1 warmup",
    )
    parser.add_argument(
        "--threads", type=int, help="torch.set_num_threads on CPU (default: every core; realbatch --quick: 1)"
    )
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), help="default: bfloat16 on CUDA, float32 on CPU"
    )
    parser.add_argument(
        "--dropout",
        action="store_true",
        help="run the train workload in train mode (dropout on; on CPU sdpa then falls back to its math path)",
    )
    parser.add_argument(
        "--max-other-cpu",
        type=float,
        default=10.0,
        help="redo a timed round when other processes used more than this %% of the CPU during it (0: never redo); "
        "realbatch waits (up to 5 s) before each round until they use less",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--output", type=Path, help="JSON path (default: benchmarks/results/<model>.json)")
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw <output>.png from the report already in --output; run nothing"
    )
    return parser.parse_args(argv)


def run_realbatch(args: argparse.Namespace) -> int:
    options = realbatch.Options(
        quick=args.quick,
        families=tuple(args.families),
        # A quick run of tiny models gains nothing from a second thread and, on a busy machine, loses a lot to it.
        threads=args.threads or (1 if args.quick else os.cpu_count()),
        measure_memory=not args.no_memory,
        # A quick run only checks that every cell runs: no waiting for a quiet machine.
        max_foreign_cpu=None if args.quick else args.max_other_cpu or None,
    )
    report, written = realbatch.main(options, args.output)
    sys.stdout.write(realbatch.format_markdown(report))
    print()
    for kind, where in written.items():
        print(f"{kind}: {where}")
    return 0


def run_deploy(args: argparse.Namespace) -> int:
    """benchmarks/deploy.py (CPU deployment) with --quick, --threads and --output."""
    from . import deploy

    options = deploy.Options(quick=args.quick, **({"threads": args.threads} if args.threads else {}))
    report, written = deploy.main(options, args.output)
    sys.stdout.write(deploy.format_markdown(report))
    for kind, where in written.items():
        print(f"{kind}: {where}")
    return 0


def run_clients(args: argparse.Namespace) -> int:
    """benchmarks/clients.py with --quick, --threads, --repeats, --max-other-cpu and --output."""
    from . import clients

    options = clients.Options(
        quick=args.quick,
        threads=args.threads,
        repeats=args.repeats,
        # A quick run only checks that every cell runs: no waiting for a quiet machine.
        max_foreign_cpu=None if args.quick else args.max_other_cpu or None,
    )
    report, written = clients.main(options, args.output)
    sys.stdout.write(clients.format_markdown(report))
    for kind, where in written.items():
        print(f"{kind}: {where}")
    return 1 if report["failures"] else 0


def run_gpu(args: argparse.Namespace) -> int:
    """`python -m benchmarks.gpu` (see benchmarks/gpu.py) with --device, --dtype, --output, and --quick as --smoke."""
    from . import gpu

    argv = ["--device", args.device or "cuda", "--dtype", args.dtype or "bfloat16"]
    argv += ["--smoke"] if args.quick else []
    argv += ["--output", str(args.output)] if args.output else []
    return gpu.main(argv)


def write_plot(report: dict, json_path: Path) -> None:
    """<suite>.png beside the report's JSON, or the line saying why not."""
    try:
        print(f"plot: {plot.plot_suite(report, json_path.with_suffix('.png'))}")
    except ImportError as error:
        print(error)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.model = args.model or args.suite
    if args.plot_only and args.model == "clients":
        from . import clients

        path = args.output or RESULTS_DIR / "clients.json"
        print(f"plot: {clients.plot(json.loads(path.read_text()), path.with_suffix('.png'))}")
        return 0
    if args.plot_only and args.model != "realbatch":
        path = args.output or RESULTS_DIR / f"{args.model}.json"
        write_plot(json.loads(path.read_text()), path)
        return 0
    if args.model == "realbatch":
        return run_realbatch(args)
    if args.model == "gpu":
        return run_gpu(args)
    if args.model == "deploy":
        return run_deploy(args)
    if args.model == "clients":
        return run_clients(args)
    if args.quick:
        seq_lens = args.seq_lens or list(QUICK_SEQ_LENS)
        repeats, warmup = args.repeats or 3, 1 if args.warmup is None else args.warmup
    else:
        seq_lens, repeats, warmup = args.seq_lens, args.repeats, args.warmup
    seq_lens = list(seq_lens or default_seq_lens(args.model))
    suite = build_suite(args.model, max_seq_len=max(seq_lens))
    options = Options(
        seq_lens=seq_lens,
        batch=args.batch,
        workloads=args.workloads,
        repeats=repeats,
        warmup=warmup,
        threads=args.threads or os.cpu_count(),
        device=args.device,
        dtype=args.dtype,
        measure_memory=not args.no_memory,
        train_mode_dropout=args.dropout,
        max_foreign_cpu=args.max_other_cpu or None,
    )
    report = run_suite(suite, options)
    path = write_json(report, args.output)
    sys.stdout.write(format_markdown(report))
    print(f"\nJSON: {path}")
    write_plot(report, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
