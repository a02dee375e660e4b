"""FlexAttention plumbing shared by the fused kernels of DeBERTa and LittleBird: availability, one compiled kernel per
device type, and which devices run its backward."""

import functools
from collections.abc import Callable

import torch
from transformers.utils import is_torchdynamo_compiling

# posformers' own fused kernels, FlexAttention with the model's position scores inside: DeBERTa reads its c2p/p2c
# scores from their (L x R) tables in the kernel and masks padding and sequence boundaries per block, so that neither a
# (B, H, L, L) bias nor an (L, L) index exists. "flex_attention" always means transformers' own FlexAttention kernel,
# which cannot take a model's relative-position scores.
FUSED_IMPLEMENTATIONS = ("posformers_fused",)


# FlexAttention has a backward only where torch generates its kernels with Triton; on CPU (torch 2.13) it has a
# forward only, so a training pass there runs the sdpa kernel instead.
FLEX_BACKWARD_DEVICES = ("cuda", "xpu", "hpu")


def flex_attention_available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def compiled_flex_attention(device_type: str) -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process and device type; on CPU the plain function, which runs FlexAttention's
    dense reference implementation (the same score_mod and block mask, the (L x L) scores materialised).

    Not compiled on CPU: inductor's CPU template (torch 2.13) computes wrong numbers where it generates AVX2 code, with
    no score_mod and no mask at all: flex_attention(q, k, v) with a head size of 8 or 16 and a key length that is not
    a multiple of 16 (40, 200) is off by ~0.4 or NaN, while its AVX-512 build is exact. A kernel whose result depends on
    the CPU's instruction set cannot be trusted, and on CPU the sdpa kernel is the faster one anyway."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type == "cpu":
        return flex_attention
    return torch.compile(flex_attention)


def flex_attention_kernel(device_type: str) -> Callable[..., torch.Tensor]:
    """The compiled kernel, or the plain function inside a graph that is being compiled (it compiles with it)."""
    if is_torchdynamo_compiling():
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention
    return compiled_flex_attention(device_type)
