"""Micro-benchmark of interleaved rotary application: posformers' `apply_rotary` against faster formulations.

    python -m benchmarks.micro_rotary [--seq-len 512] [--batch 1] [--repeats 200] [--backward]

Each variant rotates query and key of one layer, starting from the (B, L, H*D) outputs of the projections and
ending with the (B, H, L, D) tensors sdpa receives, as RoFormerSelfAttention does; cos/sin come from the model's
cached table. Per-layer times are printed, with the maximum difference from `apply_rotary` and the cost over a
12-layer forward (2 calls per layer). Variants:

  current   posformers' `apply_rotary` with the tables its RoFormerRotaryEmbedding returns, in whatever layout
            the code on disk uses ((B, L, H, D) tables of shape (1, L, 1, r), or (B, H, L, D) with (1, 1, L, r))
  complex   view_as_complex(x) * (cos + i sin) on the (B, L, H, D) layout: one complex multiply per tensor; the
            complex table is built once per forward
  flip_fma  x * cos2 + flip_pairs(x) * sin2 on the (B, L, H, D) layout: `flip` instead of `stack` for the swap
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import posformers
from posformers.modeling_roformer import RoFormerRotaryEmbedding, apply_rotary


def rotary_complex_table(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(.., L, r/2) cos, sin -> complex (.., L, r/2); built once per forward, shared by every layer."""
    return torch.complex(cos, sin)


def apply_rotary_complex(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x: (B, L, H, D) with D == r, interleaved pairs; table: complex (B or 1, L, 1, r/2)."""
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * table).flatten(-2)


def apply_rotary_flip(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """cos2 = (c0, c0, c1, c1, ...), sin2 = (-s0, s0, -s1, s1, ...)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x1, x0, x3, x2, ...)
    return torch.addcmul(x * cos2, swapped, sin2)


def _time_alternating(runs: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, calling them in turn (A, B, C, A, B, C, ...) after 5 warmups."""
    for _ in range(5):
        for run in runs.values():
            run()
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            begin = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - begin)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.micro_rotary", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--backward", action="store_true", help="time forward + backward of the rotation")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    config = posformers.RoFormerConfig(max_position_embeddings=max(512, args.seq_len))
    heads, head_dim, layers = config.num_attention_heads, config.head_dim, config.num_hidden_layers
    rotary = RoFormerRotaryEmbedding(config)
    rotary.reset_tables()
    positions = torch.arange(args.seq_len)[None]
    cos, sin = rotary(positions, args.seq_len, torch.float32)  # as the model passes them to apply_rotary
    cos_half = rotary.cos_cached[positions][:, :, None]  # (1, L, 1, r/2)
    sin_half = rotary.sin_cached[positions][:, :, None]
    cos2 = cos_half.repeat_interleave(2, dim=-1)
    sin2 = torch.stack((-sin_half, sin_half), dim=-1).flatten(-2)
    table = rotary_complex_table(cos_half, sin_half)
    tables_blhd = cos.shape[1] == args.seq_len  # (1, L, 1, r): the code rotates before the head transpose

    generator = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seq_len, heads, head_dim)
    projected_q = torch.randn(shape, generator=generator).flatten(2)  # (B, L, H*D), as nn.Linear returns it
    projected_k = torch.randn(shape, generator=generator).flatten(2)

    def current(p):
        if tables_blhd:
            return apply_rotary(p.view(shape), cos, sin, "interleaved").transpose(1, 2)
        return apply_rotary(p.view(shape).transpose(1, 2), cos, sin, "interleaved")

    variants = {
        "current": current,
        "complex": lambda p: apply_rotary_complex(p.view(shape), table).transpose(1, 2),
        "flip_fma": lambda p: apply_rotary_flip(p.view(shape), cos2, sin2).transpose(1, 2),
    }
    per_forward_setup = {"complex": lambda: rotary_complex_table(cos_half, sin_half)}

    reference = [variants["current"](p) for p in (projected_q, projected_k)]
    print(
        f"rotary on q and k, B={args.batch} L={args.seq_len} H={heads} D={head_dim}, {args.threads} threads, "
        f"{'forward + backward' if args.backward else 'forward (inference_mode)'}, median of {args.repeats}\n"
    )
    print("| variant | per layer (q+k) ms | x 12 layers ms | one-off table ms | max abs diff vs current |")
    print("|---|---|---|---|---|")
    runs = {}
    for name, fn in variants.items():
        if args.backward:
            q_leaf = projected_q.clone().requires_grad_()
            k_leaf = projected_k.clone().requires_grad_()

            def run(fn=fn, q_leaf=q_leaf, k_leaf=k_leaf):
                (fn(q_leaf).sum() + fn(k_leaf).sum()).backward()

        else:

            def run(fn=fn):
                with torch.inference_mode():
                    fn(projected_q)
                    fn(projected_k)

        runs[name] = run
    seconds = _time_alternating(runs, args.repeats)  # variants alternate, so a busy spell hits them alike
    for name, fn in variants.items():
        setup = per_forward_setup.get(name)
        setup_ms = _time_alternating({name: setup}, args.repeats)[name] * 1e3 if setup else 0.0
        with torch.no_grad():
            outputs = [fn(p) for p in (projected_q, projected_k)]
        diff = max(float((o - r).abs().max()) for o, r in zip(outputs, reference, strict=True))
        ms = seconds[name] * 1e3
        print(f"| {name} | {ms:.3f} | {ms * layers:.2f} | {setup_ms:.3f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
