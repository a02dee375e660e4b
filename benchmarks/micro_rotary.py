"""Micro-benchmark of interleaved rotary application: posformers' `apply_rotary` against faster formulations.

    python -m benchmarks.micro_rotary [--seq-len 512] [--batch 1] [--repeats 200] [--backward]

Each variant rotates query and key of one layer, shaped as in RoFormerSelfAttention: (B, H, L, D) transposed views
of a (B, L, H*D) projection output; cos/sin come from the model's cached table. Per-layer times are printed, with
the maximum difference from `apply_rotary` and the cost over a 12-layer forward (2 calls per layer). Variants:

  current      posformers' `apply_rotary` with the tables its RoFormerRotaryEmbedding returns (whatever the code on
               disk does; at the time of writing: stack-swap of the pairs, mul, addcmul)
  complex      view_as_complex(x) * (cos + i sin): one complex multiply per tensor, table built once per forward
  flip_fma     x * cos2 + flip_pairs(x) * sin2 with the full-width tables: `flip` instead of `stack` for the swap
  blhd         `current`, but applied before the (1, 2) transpose, on the projection output's own memory order
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import posformers
from posformers.roformer.modeling_roformer import RoFormerRotaryEmbedding, apply_rotary


def rotary_complex_table(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(.., L, r/2) cos, sin -> complex (.., L, r/2); built once per forward, shared by every layer."""
    return torch.complex(cos, sin)


def apply_rotary_complex(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x: (B, H, L, D) with D == r, interleaved pairs; table: complex (B or 1, 1, L, r/2)."""
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * table).flatten(-2)


def apply_rotary_flip(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """cos2 = (c0, c0, c1, c1, ...), sin2 = (-s0, s0, -s1, s1, ...)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x1, x0, x3, x2, ...)
    return torch.addcmul(x * cos2, swapped, sin2)


def _time(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


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
    cos_half, sin_half = rotary.cos_cached[positions][:, None], rotary.sin_cached[positions][:, None]  # (1, 1, L, r/2)
    cos2 = cos_half.repeat_interleave(2, dim=-1)
    sin2 = torch.stack((-sin_half, sin_half), dim=-1).flatten(-2)

    generator = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seq_len, heads, head_dim)
    projected_q = torch.randn(shape, generator=generator).flatten(2)  # (B, L, H*D), as nn.Linear returns it
    projected_k = torch.randn(shape, generator=generator).flatten(2)

    def heads_view(t):
        return t.view(shape).transpose(1, 2)

    table = rotary_complex_table(cos_half, sin_half)
    cos_blhd, sin_blhd = cos.transpose(1, 2), sin.transpose(1, 2)  # (1, L, 1, .)
    variants = {
        "current": lambda q, k: (apply_rotary(q, cos, sin, "interleaved"), apply_rotary(k, cos, sin, "interleaved")),
        "complex": lambda q, k: (apply_rotary_complex(q, table), apply_rotary_complex(k, table)),
        "flip_fma": lambda q, k: (apply_rotary_flip(q, cos2, sin2), apply_rotary_flip(k, cos2, sin2)),
        "blhd": lambda q, k: tuple(
            apply_rotary(t.transpose(1, 2), cos_blhd, sin_blhd, "interleaved").transpose(1, 2) for t in (q, k)
        ),
    }
    per_forward_setup = {"complex": lambda: rotary_complex_table(cos_half, sin_half)}

    reference = variants["current"](heads_view(projected_q), heads_view(projected_k))
    print(
        f"rotary on q and k, B={args.batch} L={args.seq_len} H={heads} D={head_dim}, {args.threads} threads, "
        f"{'forward + backward' if args.backward else 'forward (inference_mode)'}, median of {args.repeats}\n"
    )
    print("| variant | per layer (q+k) ms | x 12 layers ms | one-off table ms | max abs diff vs current |")
    print("|---|---|---|---|---|")
    for name, fn in variants.items():
        if args.backward:
            q_leaf = projected_q.clone().requires_grad_()
            k_leaf = projected_k.clone().requires_grad_()

            def run(fn=fn, q_leaf=q_leaf, k_leaf=k_leaf):
                q_out, k_out = fn(heads_view(q_leaf), heads_view(k_leaf))
                (q_out.sum() + k_out.sum()).backward()

        else:

            def run(fn=fn):
                with torch.inference_mode():
                    fn(heads_view(projected_q), heads_view(projected_k))

        seconds = _time(run, args.repeats)
        setup = per_forward_setup.get(name)
        setup_ms = _time(setup, args.repeats) * 1e3 if setup else 0.0
        with torch.no_grad():
            outputs = fn(heads_view(projected_q), heads_view(projected_k))
        diff = max(float((o - r).abs().max()) for o, r in zip(outputs, reference, strict=True))
        print(f"| {name} | {seconds * 1e3:.3f} | {seconds * 1e3 * layers:.2f} | {setup_ms:.3f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
