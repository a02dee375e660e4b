"""DeBERTa's fused attention (`attn_implementation="posformers_fused"`, FlexAttention with the c2p/p2c scores read
from their tables inside the kernel) against the eager kernel, forward and gradients, padded and packed.

Every test runs on CPU and, where torch sees a CUDA device, on CUDA too. On CPU the kernel runs FlexAttention
uncompiled (its dense reference implementation: the same score_mod and block mask), since inductor's CPU FlexAttention
kernel is wrong where it generates AVX2 code (`posformers.attention.compiled_flex_attention`); the forward test also
runs with inductor forced to AVX2, so that compiling it again on CPU fails here on any machine. torch 2.13 has no
FlexAttention backward on CPU (the model trains there with the sdpa kernel), so on CPU the gradient tests lift that
refusal and run FlexAttention's own autograd (gradients into the captured tables included). On CUDA they run the
compiled kernels, forward and backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
from helpers.modeling import make_batch, max_diff, tiny_config

from posformers import deberta_kernels as kernels
from posformers import modeling_deberta as deberta
from posformers.configuration_deberta import DebertaConfig
from posformers.modeling_deberta import DebertaForMaskedLM, DebertaForReplacedTokenDetection, DebertaModel

pytestmark = pytest.mark.slow  # FlexAttention compiles through inductor on CPU: seconds per new shape

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")),
]
# The three official layouts: v1 (one fused projection, own position projections, no buckets), v2 (convolution,
# log buckets, shared keys), v3 (buckets, shared keys, no convolution).
VARIANTS = {
    "v1": dict(projection_layout="fused", pos_att_type="c2p|p2c", max_relative_positions=64, position_buckets=0),
    "v2": dict(pos_att_type="p2c|c2p", position_buckets=8, share_att_key=True, conv_kernel_size=3),
    "v3": dict(pos_att_type="p2c|c2p", position_buckets=8, share_att_key=True, norm_rel_ebd="layer_norm"),
}
# 40 tokens and buckets of 8: distances reach the log-bucketed range, so rows are shared between distances.
SEQ_LEN, PAD_FROM = 40, (None, 30, 3)


def config(variant: str, **overrides) -> DebertaConfig:
    return tiny_config(DebertaConfig, relative_attention=True, **{**VARIANTS[variant], **overrides})


@pytest.fixture
def flex_trains(monkeypatch, device):
    """On CPU, FlexAttention's autograd in its reference mode (see the module docstring); on CUDA, nothing to do."""
    if device == "cpu":
        monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)
        monkeypatch.setattr(kernels, "FLEX_BACKWARD_DEVICES", ("cpu",))


def batch(device: str, layout: str) -> dict[str, torch.Tensor]:
    input_ids, attention_mask, _ = make_batch(seq_len=SEQ_LEN, pad_from=PAD_FROM)
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}


def with_implementation(model, implementation: str, layout: str):
    model.set_attn_implementation(implementation)
    model.config.unpad_inputs = "always" if layout == "packed" else "never"
    return model


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.fixture(params=["native", "avx2"])
def inductor_isa(request):
    """The instruction set inductor generates CPU code for: the machine's own, or AVX2 (what a CPU without AVX-512
    gets: its CPU FlexAttention kernel was wrong there while exact with AVX-512)."""
    from torch._inductor import config as inductor_config
    from torch._inductor import cpu_vec_isa

    simdlen = None
    if request.param == "avx2":
        if not any(isa.bit_width() == 256 and "avx2" in str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()):
            pytest.skip("this CPU has no AVX2")
        simdlen = 256
    torch.compiler.reset()  # no kernel compiled for the other instruction set
    with inductor_config.patch({"cpp.simdlen": simdlen}):
        yield request.param
    torch.compiler.reset()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_forward_equals_eager(variant, layout, device, inductor_isa):
    if device != "cpu" and inductor_isa != "native":
        pytest.skip("the instruction set is that of inductor's CPU code")
    torch.manual_seed(0)
    model = DebertaModel(config(variant)).to(device).eval()
    inputs = batch(device, layout)
    with torch.no_grad():
        expected = with_implementation(model, "eager", "padded")(**inputs).last_hidden_state
        actual = with_implementation(model, "posformers_fused", layout)(**inputs).last_hidden_state
    assert max_diff(actual, expected, inputs["attention_mask"]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("variant", ["v1", "v3"])  # v2's attention is v3's (its convolution sits outside attention)
def test_fused_gradients_equal_eager_through_the_emd(variant, layout, device, flex_trains):
    """DebertaForMaskedLM with its Enhanced Mask Decoder (two more passes through the last layer, queries from the
    absolute positions): every parameter's gradient, the relative table's included."""
    torch.manual_seed(0)
    model = DebertaForMaskedLM(config(variant, emd_steps=2)).to(device).train()
    inputs = batch(device, layout)
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)

    def run(implementation, run_layout):
        model.zero_grad()
        output = with_implementation(model, implementation, run_layout)(**inputs, labels=labels)
        output.loss.backward()
        return output.logits.detach(), gradients(model)

    expected_logits, expected = run("eager", "padded")
    logits, actual = run("posformers_fused", layout)
    assert max_diff(logits, expected_logits, inputs["attention_mask"]) <= 1e-5
    assert "deberta.encoder.rel_embeddings.weight" in actual and actual.keys() == expected.keys()
    for name in expected:
        assert max_diff(actual[name], expected[name]) <= 1e-5, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fused_replaced_token_detection_equals_eager(layout, device, flex_trains):
    torch.manual_seed(0)
    model = DebertaForReplacedTokenDetection(config("v3")).to(device).train()
    inputs = batch(device, layout)
    labels = (inputs["input_ids"] % 2).masked_fill(inputs["attention_mask"] == 0, -100)

    def run(implementation, run_layout):
        model.zero_grad()
        output = with_implementation(model, implementation, run_layout)(**inputs, labels=labels)
        output.loss.backward()
        return output.loss.detach(), gradients(model)

    expected_loss, expected = run("eager", "padded")
    loss, actual = run("posformers_fused", layout)
    assert abs(loss.item() - expected_loss.item()) <= 1e-5
    for name in expected:
        assert max_diff(actual[name], expected[name]) <= 1e-5, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fused_bfloat16_within_one_percent_of_eager(layout, device, flex_trains):
    """In bfloat16, logits and the whole gradient (every parameter's, as one vector) within 1% (relative, in norm)
    of the eager kernel's in bfloat16; and each parameter's gradient as close to the float32 one as the eager
    kernel's (a bias whose gradient nearly cancels, such as the key bias, is off by ~2% in bfloat16 either way)."""
    torch.manual_seed(0)
    model = DebertaForMaskedLM(config("v3", emd_steps=2)).to(device).train()
    inputs = batch(device, layout)
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    real = inputs["attention_mask"].bool()

    def run(implementation, run_layout):
        model.zero_grad()
        output = with_implementation(model, implementation, run_layout)(**inputs, labels=labels)
        output.loss.backward()
        return output.logits.detach()[real].float(), {name: g.float() for name, g in gradients(model).items()}

    _, exact = run("eager", "padded")
    model.to(torch.bfloat16)
    expected_logits, expected = run("eager", "padded")
    logits, actual = run("posformers_fused", layout)
    assert relative_error(logits, expected_logits) <= 1e-2
    assert (
        relative_error(
            torch.cat([g.flatten() for g in actual.values()]), torch.cat([g.flatten() for g in expected.values()])
        )
        <= 1e-2
    )
    for name in expected:
        eager_error = relative_error(expected[name], exact[name])
        assert relative_error(actual[name], exact[name]) <= max(1e-2, 1.5 * eager_error), name


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fused_builds_no_pairwise_tensor(layout, monkeypatch):
    """Neither the (B, H, L, L) bias nor the (L, L) indices are built on the fused path: building either fails here."""

    def refuse(*args, **kwargs):
        raise AssertionError("the fused path built a pairwise tensor")

    monkeypatch.setattr(kernels, "gather_position_bias", refuse)
    monkeypatch.setattr(kernels.RelativePositions, "p2c_index", property(refuse))
    monkeypatch.setattr(kernels.RelativePositions, "c2p_index", property(refuse))
    torch.manual_seed(0)
    model = with_implementation(DebertaForMaskedLM(config("v3", emd_steps=2)).eval(), "posformers_fused", layout)
    with torch.no_grad():
        logits = model(**batch("cpu", layout)).logits
    assert torch.isfinite(logits).all()
    # the check can fail: the sdpa path builds both
    with pytest.raises(AssertionError, match="pairwise"), torch.no_grad():
        with_implementation(model, "sdpa", layout)(**batch("cpu", layout))


@pytest.mark.parametrize("length", [1, 2, 5, 40, 129, 300])
def test_kernel_distance_rows_equal_the_pair_indices(length):
    """The (2P - 1) vector the kernel reads gives, at i - j + P - 1, the row of the (L, L) indices the gathers read."""
    positions = deberta.relative_positions(length, config("v3"), torch.device("cpu"))
    p2c_rows, c2p_columns, offset = kernels.kernel_distance_rows(positions)
    assert offset + 1 >= length and (offset + 1) & offset == 0  # a power of two, at least L
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    assert torch.equal(p2c_rows[i - j + offset], positions.p2c_index)
    assert torch.equal(c2p_columns[i - j + offset], positions.c2p_index)


def attended_keys(block_mask, batch: int, length: int) -> torch.Tensor:
    """(B, L, L) bool: the keys each query reads under `block_mask`, as FlexAttention applies it (blocks skipped, read
    in full or through mask_mod). Equal scores and one-hot values make each output row the attended keys' weights."""
    query = torch.zeros(batch, 1, length, 8)
    values = torch.eye(length).expand(batch, 1, length, length)
    weights = torch_flex.flex_attention(query, query, values.contiguous(), block_mask=block_mask)
    return weights[:, 0] > 0


def test_document_block_mask_keeps_each_token_in_its_sequence():
    lengths = [5, 1, 9, 3, 0, 6]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    length = sum(lengths)
    document = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    expected = document[:, None] == document[None, :]
    for block in (4, 8, 32):
        mask = kernels.document_block_mask(cu_seqlens, length, block_size=block)
        assert torch.equal(attended_keys(mask, 1, length)[0], expected), block


def test_key_padding_block_mask_hides_padded_keys_only():
    key_mask = torch.ones(3, 21, dtype=torch.bool)
    key_mask[1, 13:] = False
    key_mask[2, :] = False
    key_mask[2, 4] = key_mask[2, 9] = True  # holes are masked as well as right padding
    for block in (4, 8, 32):
        mask = kernels.key_padding_block_mask(key_mask, block_size=block)
        assert torch.equal(attended_keys(mask, 3, 21), key_mask[:, None, :].expand(3, 21, 21)), block


@pytest.mark.parametrize("device", DEVICES)
def test_default_and_fallbacks(device, caplog, monkeypatch):
    """The default is "sdpa" on every device; passes the kernel cannot run (attention dropout in training, a (B, L, L)
    mask, a graph compiled for CPU) run the sdpa kernel, with the same outputs."""
    torch.manual_seed(0)
    model = DebertaModel(config("v3"))
    assert model.config._attn_implementation == "sdpa"  # the fused kernel is opt-in, on CUDA too
    model = model.to(device).eval()
    inputs = batch(device, "padded")
    mask = inputs["attention_mask"]
    pairwise = mask[:, None, :] * mask[:, :, None]
    with torch.no_grad():
        expected = with_implementation(model, "eager", "padded")(**inputs).last_hidden_state
        with_implementation(model, "posformers_fused", "padded")
        actual = model(inputs["input_ids"], attention_mask=pairwise).last_hidden_state
    assert max_diff(actual, expected, mask) <= 1e-5
    model.config.attention_probs_dropout_prob = 0.1
    dropout = DebertaModel(model.config).to(device).train()
    query = torch.zeros(1, device=device)
    assert kernels.choose_implementation(dropout.encoder.layer[0].attention.self, query, None, False) == "sdpa"
    attention = model.encoder.layer[0].attention.self
    assert kernels.choose_implementation(attention, query, None, False) == "posformers_fused"
    monkeypatch.setattr(kernels, "is_torchdynamo_compiling", lambda: True)
    compiled = kernels.choose_implementation(attention, query, None, False)
    assert compiled == ("sdpa" if device == "cpu" else "posformers_fused")


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="posformers_fusd"):
        DebertaModel(config("v3")).set_attn_implementation("posformers_fusd")
