"""FlexAttention plumbing shared by the fused kernels of DeBERTa and LittleBird: the choice of `attn_implementation`
(`FusedKernelChoice`), one compiled kernel per device type, and which devices run its backward."""

import functools
from collections.abc import Callable

import torch
from transformers.utils import is_torchdynamo_compiling

# FlexAttention has a backward only where torch generates its kernels with Triton: on other devices a training pass
# runs the sdpa kernel instead.
FLEX_BACKWARD_DEVICES = ("cuda", "xpu", "hpu")


def flex_attention_refusal(model: str, attention: str) -> str:
    """The error for attn_implementation='flex_attention' in a model whose attention holds its own position scores."""
    return (
        f"attn_implementation='flex_attention' names transformers' FlexAttention kernel, which cannot run {model}'s "
        f"{attention}; use attn_implementation='posformers_fused', {model}'s own FlexAttention kernel"
    )


class FusedKernelChoice:
    """`attn_implementation` for a model whose attention holds its own position scores (DeBERTa, LittleBird):
    transformers' choice, plus "posformers_fused", the model's own FlexAttention kernel (opt-in). "flex_attention"
    names transformers' FlexAttention kernel, which cannot take the model's position scores: it is refused with
    `flex_attention_refusal`. Inherit it before the model's `PreTrainedModel` base."""

    flex_attention_refusal: str

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        # transformers guesses from the module's source (a call of its AttentionInterface) whether attention reads
        # `config._attn_implementation` on every pass, and otherwise makes `set_attn_implementation` a warning that
        # changes nothing. These models' attention modules read it on every pass, so switching kernels is allowed.
        return True

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        if requested_attention == "flex_attention":
            raise ValueError(self.flex_attention_refusal)
        if requested_attention is not None and "flash" in requested_attention:
            # transformers' own text for a model without FlashAttention points to a Hub page built from the folder's
            # path (https://huggingface.co//tmp/...), and asking there cannot help: the kernel takes no score bias.
            raise ValueError(
                f"attn_implementation={requested_attention!r}: FlashAttention takes no position scores, which "
                f"{type(self).__name__}'s attention adds to every score; leave attn_implementation unset or use "
                "'posformers_fused', the model's own FlexAttention kernel"
            )
        if requested_attention == "posformers_fused":  # FlexAttention with the model's position scores inside
            return requested_attention
        return super().get_correct_attn_implementation(requested_attention, is_init_check)


@functools.cache
def compiled_flex_attention(device_type: str) -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process and device type; on CPU the plain function, which runs FlexAttention's
    dense reference implementation (the same score_mod and block mask, the (L x L) scores materialised).

    Not compiled on CPU: inductor's CPU kernel is wrong where it generates AVX2 code and exact with AVX-512
    (docs/deberta.md); a kernel whose result depends on the CPU's instruction set cannot be trusted, and on CPU the
    sdpa kernel is the faster one anyway."""
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
