"""LittleBird's fused USWAttn (`attn_implementation="posformers_fused"`: FlexAttention with a block mask of each query
block's pack and window blocks and the BiALiBi bias in a score_mod over the learnable slopes) against the block-sparse
products ("eager"), forward and gradients, padded and packed.

Every test runs on CPU and, where torch sees a CUDA device, on CUDA too. On CPU the inference test runs the compiled
FlexAttention kernel. torch 2.13 has no FlexAttention backward on CPU (the model trains there with the block-sparse
products), so on CPU the gradient tests lift that refusal and run FlexAttention uncompiled: its own autograd (the same
score_mod, mask_mod and gradients into the captured slopes) on its dense reference implementation. On CUDA they run the
compiled kernels, forward and backward.

One batch covers every case: a row of 5 blocks of 16 tokens, right-padded rows of 2 blocks and of 1 block, and a row
with padding inside it (Padding Insertion) spanning 3 blocks; the global prefix is 3 tokens long.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
from helpers.modeling import max_diff, tiny_config

from posformers import attention
from posformers import littlebird_kernels as littlebird
from posformers.configuration_littlebird import LittleBirdConfig
from posformers.modeling_littlebird import LittleBirdModel

pytestmark = pytest.mark.slow  # the inference test compiles FlexAttention through inductor on CPU (~10-20 s)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")),
]
# Blocks of 16 (FlexAttention's CUDA kernels need tiles of at least 16), 3 pack states, a 3-token global prefix.
BLOCK_SIZE, SEQ_LEN = 16, 75


def config(**overrides) -> LittleBirdConfig:
    return tiny_config(LittleBirdConfig, block_size=BLOCK_SIZE, pack_length=3, global_prefix_length=3, **overrides)


def batch(device: str, layout: str = "padded") -> dict[str, torch.Tensor]:
    """Rows of 5 blocks (75 tokens), 2 blocks (29), 1 block (11) and 3 blocks with 5 padded keys inside (40); the
    last row only in the padded layout (padding inside a row rules packing out)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 99, (4, SEQ_LEN), generator=generator)
    attention_mask = torch.ones(4, SEQ_LEN, dtype=torch.long)
    for row, length in ((1, 29), (2, 11), (3, 40)):
        attention_mask[row, length:] = 0
    attention_mask[3, 18:23] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    rows = 4 if layout == "padded" else 3
    return {"input_ids": input_ids[:rows].to(device), "attention_mask": attention_mask[:rows].to(device)}


@pytest.fixture
def flex_trains(monkeypatch, device):
    """On CPU, FlexAttention's autograd in its reference mode (see the module docstring); on CUDA, nothing to do."""
    if device == "cpu":
        monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)
        monkeypatch.setattr(littlebird, "FLEX_BACKWARD_DEVICES", ("cpu",))
        monkeypatch.setattr(attention, "compiled_flex_attention", lambda device_type: torch_flex.flex_attention)


def block_sparse_refused(monkeypatch):
    """From here on, running the block-sparse products fails: what passes ran the fused kernel."""

    def refuse(*args, **kwargs):
        raise AssertionError("the block-sparse products ran")

    monkeypatch.setitem(littlebird.UNPACK_SLIDING_WINDOW_KERNELS, "eager", refuse)


def with_implementation(model, implementation: str, layout: str):
    model.set_attn_implementation(implementation)
    model.config.unpad_inputs = "always" if layout == "packed" else "never"
    return model


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def forward_backward(model, inputs: dict, implementation: str, layout: str, dtype=torch.float32):
    """Token states at real tokens and the gradients of every parameter and of the input embeddings, for a loss that
    weighs each output feature differently (a plain sum would cancel in the LayerNorms)."""
    model.zero_grad()
    with_implementation(model, implementation, layout)
    embeddings = model.embeddings.word_embeddings(inputs["input_ids"]).detach().requires_grad_()
    output = model(inputs_embeds=embeddings, attention_mask=inputs["attention_mask"]).last_hidden_state
    real = inputs["attention_mask"].bool()
    weights = torch.linspace(-1.0, 1.0, output.shape[-1], device=output.device, dtype=dtype)
    (output[real] * weights).sum(-1).mean().backward()
    grads = {name: p.grad.detach().float() for name, p in model.named_parameters() if p.grad is not None}
    grads["inputs_embeds"] = embeddings.grad.float()
    return output.detach()[real].float(), grads


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_fused_inference_equals_eager(device, monkeypatch):
    """The compiled kernel (on CPU too) against the block-sparse products, at every token of the batch: real ones and
    padding alike (both reuse an example's last window for the query blocks past its real blocks)."""
    torch.manual_seed(0)
    model = LittleBirdModel(config()).to(device).eval()
    inputs = batch(device)
    with torch.no_grad():
        expected = with_implementation(model, "eager", "padded")(**inputs).last_hidden_state
        block_sparse_refused(monkeypatch)
        actual = with_implementation(model, "posformers_fused", "padded")(**inputs).last_hidden_state
    assert max_diff(actual, expected) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fused_gradients_equal_eager(layout, device, flex_trains, monkeypatch):
    """Token states and the gradients of every parameter (the BiALiBi slopes alpha, beta, gamma of every layer
    included) and of the input embeddings within 1e-5 of the block-sparse products' (relative to each tensor's
    largest entry), padded and padding-free."""
    torch.manual_seed(0)
    model = LittleBirdModel(config()).to(device).train()
    inputs = batch(device, layout)
    expected_states, expected = forward_backward(model, inputs, "eager", "padded")
    block_sparse_refused(monkeypatch)
    states, actual = forward_backward(model, inputs, "posformers_fused", layout)
    assert max_diff(states, expected_states) <= 1e-5
    assert actual.keys() == expected.keys()
    assert {"encoder.layer.1.attention.self.alpha", "encoder.layer.1.attention.self.gamma"} <= expected.keys()
    for name in expected:
        assert max_diff(actual[name], expected[name]) <= 1e-5 * max(1.0, expected[name].abs().max().item()), name
    assert expected["encoder.layer.0.attention.self.beta"].abs().max() > 0  # the slopes' comparison is not 0 == 0


@pytest.mark.parametrize("device", DEVICES)
def test_fused_bfloat16_within_one_percent_of_eager(device, flex_trains, monkeypatch):
    """In bfloat16, token states, each slope's gradient and the whole gradient (every parameter's and the input
    embeddings', as one vector) within 1% (relative, in norm) of the block-sparse products' in bfloat16."""
    torch.manual_seed(0)
    model = LittleBirdModel(config()).to(device).train().to(torch.bfloat16)
    inputs = batch(device)
    expected_states, expected = forward_backward(model, inputs, "eager", "padded", torch.bfloat16)
    block_sparse_refused(monkeypatch)
    states, actual = forward_backward(model, inputs, "posformers_fused", "padded", torch.bfloat16)
    assert relative_error(states, expected_states) <= 1e-2
    everything = [torch.cat([grads[name].flatten() for name in expected]) for grads in (actual, expected)]
    assert relative_error(*everything) <= 1e-2
    slopes = [name for name in expected if name.rsplit(".", 1)[-1] in ("alpha", "beta", "gamma")]
    assert len(slopes) == 6
    for name in slopes:
        assert relative_error(actual[name], expected[name]) <= 1e-2, name


@pytest.mark.parametrize("min_tile", [1, 128])  # CPU's tiles (LittleBird's blocks) and CUDA's
@pytest.mark.parametrize(("block_size", "seq_len"), [(BLOCK_SIZE, SEQ_LEN), (16, 700), (48, 1000)])
def test_block_mask_attends_the_keys_of_the_layout(block_size, seq_len, min_tile, monkeypatch):
    """The block mask (its tile lists and mask_mod together) lets each query attend exactly the keys the block-sparse
    layout leaves unmasked: its pack keys and the real keys of its 4 window blocks; the mask_mod alone (what
    FlexAttention's uncompiled reference reads) is the same pattern; and every tile listed holds an attended pair. The
    longer cases span several tiles (of 128 tokens and of lcm(48, 128) = 384 tokens with CUDA's tiles)."""
    monkeypatch.setitem(littlebird.FLEX_MIN_TILE, "cpu", min_tile)
    attention_mask = torch.ones(4, seq_len, dtype=torch.long)
    for row, length in ((1, seq_len // 2), (2, 11), (3, seq_len - 30)):
        attention_mask[row, length:] = 0
    attention_mask[3, 18:23] = 0
    layout = littlebird.BlockSparseLayout.build(
        attention_mask, 4, seq_len, block_size, 3, torch.float32, torch.device("cpu"), 3
    )
    kernel = littlebird.KernelLayout.of(layout)
    b, n, pack_rows = block_size, layout.num_blocks, layout.pack_blocks * block_size
    key_slots = kernel.pack_slots + kernel.token_slots
    # the layout: (B n, w) key rows of each query block in `_key_rows`' stack, masked where the fourth bias channel is
    # 1; moved to the kernel's key layout (the pack keys padded to pack_slots instead of np b)
    unmasked = layout.bias_features[:, 3].view(4 * n, b, -1) == 0  # (B n, b, w)
    key_rows = layout.key_index - layout.key_index[:, :1]
    key_rows = torch.where(key_rows < pack_rows, key_rows, key_rows - pack_rows + kernel.pack_slots)
    expected = torch.zeros(4 * n, b, key_slots, dtype=torch.bool)
    expected.scatter_(-1, key_rows[:, None, :].expand_as(unmasked), unmasked)
    expected = torch.nn.functional.pad(expected.view(4, n * b, key_slots), (0, 0, 0, kernel.query_slots - n * b))

    block_mask = littlebird.unpack_sliding_window_block_mask(layout)
    tiles = block_mask.to_dense()[:, 0].bool()  # (B, query tiles, key tiles): listed, partial or full
    listed = tiles.repeat_interleave(kernel.tile, 1).repeat_interleave(kernel.tile, 2)
    mask_mod = torch_flex.create_mask(block_mask.mask_mod, 4, 1, kernel.query_slots, key_slots, device="cpu")[:, 0]
    real_queries = torch.arange(kernel.query_slots) < n * b  # queries past n b are the kernel's padding
    assert torch.equal(mask_mod[:, real_queries], expected[:, real_queries])
    assert torch.equal((listed & mask_mod)[:, real_queries], expected[:, real_queries])
    per_tile = expected.view(4, kernel.query_slots // kernel.tile, kernel.tile, -1, kernel.tile).any(-1).any(2)
    assert torch.equal(tiles, per_tile)
    if seq_len > 2 * kernel.tile:
        assert not tiles.all()  # the tile lists skip something


def test_flash_attention_is_refused_in_one_line_of_posformers(tmp_path):
    """FlashAttention cannot add BiALiBi or run USWAttn: one line saying so, not transformers' request to add support
    on a Hub page made from the folder's path (https://huggingface.co//tmp/...)."""
    LittleBirdModel(config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as refused:
        LittleBirdModel.from_pretrained(tmp_path, attn_implementation="flash_attention_2")
    message = str(refused.value)
    assert message.startswith("attn_implementation='flash_attention_2': FlashAttention takes no position scores")
    assert "'posformers_fused'" in message and "huggingface.co" not in message and "\n" not in message


@pytest.mark.parametrize("device", DEVICES)
def test_default_and_fallbacks(device, caplog):
    """The default is the block-sparse products ("eager") on every device, CUDA included: the fused kernel is one
    argument away. "flex_attention" (transformers' FlexAttention kernel, which cannot run USWAttn) is refused with a
    pointer to "posformers_fused". Passes the fused kernel cannot run (weights asked for, attention dropout in
    training, a backward on CPU) run the block-sparse products, with the same outputs."""
    torch.manual_seed(0)
    model = LittleBirdModel(config())
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="posformers_fused"):
        LittleBirdModel(config(attn_implementation="flex_attention"))
    with pytest.raises(ValueError, match="posformers_fused"):
        model.set_attn_implementation("flex_attention")
    model = model.to(device).eval()
    inputs = batch(device)
    with torch.no_grad():
        expected = with_implementation(model, "eager", "padded")(**inputs, output_attentions=True)
        actual = with_implementation(model, "posformers_fused", "padded")(**inputs, output_attentions=True)
    assert model.config._attn_implementation == "posformers_fused"
    assert all(torch.equal(a, e) for a, e in zip(actual.attentions, expected.attentions, strict=True))
    attention = model.encoder.layer[0].attention.self
    if device == "cpu":
        assert not fused_kernel_runs(attention, torch.zeros(1, requires_grad=True))
    dropout = LittleBirdModel(config(attention_probs_dropout_prob=0.1)).to(device).train()
    assert not fused_kernel_runs(dropout.encoder.layer[0].attention.self, torch.zeros(1, device=device))
    with torch.no_grad():  # inference runs the fused kernel on every device
        assert fused_kernel_runs(attention, torch.zeros(1, device=device))


def fused_kernel_runs(attention, query) -> bool:
    """Whether the kernel choice of a "posformers_fused" model's USWAttn `attention` runs the fused kernel for `query`
    in the module's mode."""
    dropout = attention.attention_dropout if attention.training else 0.0
    kernel = littlebird.unpack_sliding_window_kernel("posformers_fused", query, attention.alpha, dropout, False)
    return kernel is littlebird.UNPACK_SLIDING_WINDOW_KERNELS["posformers_fused"]
