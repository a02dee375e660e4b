"""FlexAttention plumbing shared by the fused kernels of DeBERTa and LittleBird: availability, one compiled kernel per
device type, and which devices run its backward."""

import functools
from collections.abc import Callable

import torch
from transformers.utils import is_torchdynamo_compiling

# The fused kernel (FlexAttention): "flex_attention" and "posformers_fused" both run it. It reads the c2p/p2c scores
# from their (L x R) tables inside the kernel and masks padding and sequence boundaries per block, so that neither a
# (B, H, L, L) bias nor an (L, L) index exists; gradients reach the tables through FlexAttention's support for
# tensors captured by a score_mod.
FUSED_IMPLEMENTATIONS = ("posformers_fused", "flex_attention")


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
    """flex_attention compiled once per process and device type (uncompiled it runs a dense reference
    implementation). On CPU with static shapes: inductor's CPU template fails to build the kernel once a new length
    makes the shapes dynamic (torch 2.13: undeclared `cur_qSplitSize` in the generated C++), so each length compiles
    its own; elsewhere shapes turn dynamic after the first new length, as torch.compile does by default."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False if device_type == "cpu" else None)


def flex_attention_kernel(device_type: str) -> Callable[..., torch.Tensor]:
    """The compiled kernel, or the plain function inside a graph that is being compiled (it compiles with it)."""
    if is_torchdynamo_compiling():
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention
    return compiled_flex_attention(device_type)
