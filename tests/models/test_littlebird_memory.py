"""LittleBird's memory-lean training attention (`LeanUnpackSlidingWindow`) against the explicit block products it
replaces in training: the same gradients for every input, weight and BiALiBi slope (with attention dropout too, from
the mask the lean backward regenerates), gradcheck in float64, and what one attention keeps for backward.

The explicit path is the one `need_weights` still takes; it is itself checked against a dense reference written from
the paper's equations in test_littlebird.py.
"""

import gc
import weakref

import pytest
import torch
from helpers.modeling import tiny_config

from posformers import littlebird_kernels, modeling_littlebird
from posformers.configuration_littlebird import LittleBirdConfig
from posformers.littlebird_kernels import BlockSparseLayout, attention_dropout_keep, unpack_sliding_window_attention
from posformers.modeling_littlebird import LittleBirdForMaskedLM

TOLERANCE = 1e-5
HEADS, HEAD_DIM = 3, 8

# (block_size, pack_length, row lengths, width, where padding sits): 1 to 5+ blocks, pack lengths below, equal to and
# above the block size and not a multiple of it, right padding, padding inserted between real tokens.
CASES = {
    "one-block": (4, 3, [3], 3, "right"),
    "two-blocks": (4, 4, [7, 5], 7, "right"),
    "three-blocks": (4, 6, [11, 9, 2], 11, "right"),
    "four-blocks": (4, 5, [16, 13], 16, "right"),
    "six-blocks-uneven-pack": (4, 7, [23, 17, 6], 23, "right"),
    "block-8-pack-10": (8, 10, [37, 30], 37, "right"),
    "inserted-padding": (4, 5, [21, 18], 21, "inserted"),
    "blocks-of-2": (2, 3, [8, 6], 8, "right"),  # small enough for gradcheck's finite differences
}


@pytest.fixture(params=["one-chunk", "several-chunks", "chunks-of-1-block"])
def attention_chunks(request, monkeypatch):
    """Query blocks per chunk: all of them (the tiny sizes here), a few, or one."""
    elements = {"one-chunk": None, "several-chunks": 2 * HEADS * 40 * HEAD_DIM, "chunks-of-1-block": 1}[request.param]
    if elements is not None:
        monkeypatch.setattr(littlebird_kernels, "LEAN_ATTENTION_CHUNK_ELEMENTS", elements)


def attention_mask_of(lengths, width, padding):
    """(B, L) long. "inserted": a run of padding in the middle of every row longer than 6 (Padding Insertion)."""
    positions = torch.arange(width)[None, :]
    mask = (positions < torch.tensor(lengths)[:, None]).long()
    if padding == "inserted":
        for row, length in enumerate(lengths):
            if length > 6:
                mask[row, length // 3 : length // 3 + 4] = 0
    return mask


def kernel_inputs(case, dtype=torch.float32, seed=0, heads=HEADS, head_dim=HEAD_DIM):
    """Random q, k, v, pack k, v, slopes (all requiring grad), the layout and the attention mask of a case."""
    block_size, pack_length, lengths, width, padding = CASES[case]
    generator = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    shapes = [(batch, width, heads, head_dim)] * 3 + [(batch, pack_length, heads, head_dim)] * 2
    tensors = [torch.randn(shape, generator=generator, dtype=dtype) for shape in shapes]
    slopes = [torch.rand(heads, generator=generator, dtype=dtype) * 0.5 + 0.05 for _ in range(3)]
    attention_mask = attention_mask_of(lengths, width, padding)
    layout = BlockSparseLayout.build(attention_mask, batch, width, block_size, pack_length, dtype, torch.device("cpu"))
    return [t.requires_grad_(True) for t in (*tensors, *slopes)], layout, attention_mask


def gradients(inputs, context, seed=1):
    """Gradients of <context, a fixed random tensor> for every input."""
    generator = torch.Generator().manual_seed(seed)
    cotangent = torch.randn(context.shape, generator=generator, dtype=context.dtype)
    return torch.autograd.grad((context * cotangent).sum(), inputs)


INPUT_NAMES = ("query", "key", "value", "pack_key", "pack_value", "alpha", "beta", "gamma")


def assert_same_gradients(actual, expected, tolerance=TOLERANCE):
    for name, a, e in zip(INPUT_NAMES, actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=tolerance, atol=tolerance, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("case", list(CASES))
def test_lean_gradients_equal_the_explicit_products(case, attention_chunks):
    inputs, layout, _ = kernel_inputs(case)
    lean, weights = unpack_sliding_window_attention(*inputs, layout, scaling=HEAD_DIM**-0.5)
    assert weights is None
    explicit, _ = unpack_sliding_window_attention(*inputs, layout, scaling=HEAD_DIM**-0.5, need_weights=True)
    torch.testing.assert_close(lean, explicit, rtol=TOLERANCE, atol=TOLERANCE)
    assert_same_gradients(gradients(inputs, lean), gradients(inputs, explicit))


def test_slopes_alone_get_the_explicit_gradients():
    """Only alpha, beta, gamma require grad (a frozen encoder tuning its slopes): the lean path still runs."""
    inputs, layout, _ = kernel_inputs("four-blocks")
    tensors = [t.detach() for t in inputs[:5]]
    slopes = inputs[5:]
    lean, _ = unpack_sliding_window_attention(*tensors, *slopes, layout, scaling=0.5)
    assert "LeanUnpackSlidingWindowBackward" in graph_nodes(lean)
    explicit, _ = unpack_sliding_window_attention(*tensors, *slopes, layout, scaling=0.5, need_weights=True)
    for actual, expected in zip(gradients(slopes, lean), gradients(slopes, explicit), strict=True):
        torch.testing.assert_close(actual, expected, rtol=TOLERANCE, atol=TOLERANCE)


def graph_nodes(tensor) -> set[str]:
    """The names of every backward node that leads to `tensor`."""
    names, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and type(node).__name__ not in names:
            names.add(type(node).__name__)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def explicit_with_masks(inputs, layout, dropout, seed, chunk_blocks):
    """The explicit products with dropout applied through the masks `attention_dropout_keep` gives each chunk of
    `chunk_blocks` query blocks: the weights of `need_weights` (differentiable), dropped, times the gathered values."""
    query, _, value, _, pack_value = inputs[:5]
    batch, seq_len, heads, head_dim = query.shape
    b, n, w = layout.block_size, layout.num_blocks, layout.keys_per_block
    _, weights = unpack_sliding_window_attention(*inputs, layout, scaling=HEAD_DIM**-0.5, need_weights=True)
    weights = weights.transpose(1, 2).reshape(batch * n, heads, b, w)
    keep = torch.cat(
        [
            attention_dropout_keep((min(chunk_blocks, batch * n - start), heads, b, w), dropout, seed, index, "cpu")
            for index, start in enumerate(range(0, batch * n, chunk_blocks))
        ]
    )
    value_rows = littlebird_kernels._key_rows(pack_value, value, layout)
    value_windows = value_rows[layout.key_index].transpose(1, 2)  # (B n, H, w, d_h)
    context = torch.matmul(weights * keep, value_windows).transpose(1, 2)  # (B n, b, H, d_h)
    return context.reshape(batch, n * b, heads, head_dim)[:, :seq_len]


@pytest.mark.parametrize("case", ["three-blocks", "inserted-padding", "block-8-pack-10"])
def test_dropout_gradients_equal_the_explicit_products_with_the_same_masks(case, monkeypatch):
    """The backward regenerates the forward's masks from the saved seed: gradients equal those of the explicit
    products under the masks `attention_dropout_keep` gives (one query block per chunk here)."""
    monkeypatch.setattr(littlebird_kernels, "LEAN_ATTENTION_CHUNK_ELEMENTS", 1)
    inputs, layout, _ = kernel_inputs(case)
    dropout = 0.3
    torch.manual_seed(7)
    seed = int(torch.randint(2**62, ()))  # what the lean forward draws from the global generator
    torch.manual_seed(7)
    lean, _ = unpack_sliding_window_attention(*inputs, layout, scaling=HEAD_DIM**-0.5, dropout=dropout)
    expected = explicit_with_masks(inputs, layout, dropout, seed, chunk_blocks=1)
    torch.testing.assert_close(lean, expected, rtol=TOLERANCE, atol=TOLERANCE)
    assert_same_gradients(gradients(inputs, lean), gradients(inputs, expected))
    without_dropout, _ = unpack_sliding_window_attention(*inputs, layout, scaling=HEAD_DIM**-0.5)
    assert (lean - without_dropout).abs().max() > 0.1


def test_dropout_masks_differ_between_calls_and_follow_the_global_seed():
    inputs, layout, _ = kernel_inputs("four-blocks")

    def context(seed):
        torch.manual_seed(seed)
        return unpack_sliding_window_attention(*inputs, layout, scaling=0.5, dropout=0.5)[0]

    assert torch.equal(context(3), context(3))
    assert not torch.equal(context(3), context(4))
    keep = attention_dropout_keep((2000,), 0.25, seed=5, chunk_index=0, device="cpu")
    assert keep.unique().tolist() == [0.0, torch.tensor(1 / 0.75).item()]
    assert abs((keep == 0).float().mean().item() - 0.25) < 0.05


@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_lean_path_passes_gradcheck_in_float64(dropout, monkeypatch):
    """Finite differences on every input and slope, over chunks of one query block; with dropout, each evaluation
    reseeds the global generator, so that every call draws the same masks."""
    monkeypatch.setattr(littlebird_kernels, "LEAN_ATTENTION_CHUNK_ELEMENTS", 1)
    inputs, layout, attention_mask = kernel_inputs("blocks-of-2", dtype=torch.float64, heads=2, head_dim=3)

    def real_context(*tensors):
        torch.manual_seed(0)
        context, _ = unpack_sliding_window_attention(*tensors, layout, scaling=0.5, dropout=dropout)
        return context[attention_mask.bool()]

    assert torch.autograd.gradcheck(real_context, inputs, eps=1e-6, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Whole model
# ---------------------------------------------------------------------------------------------------------------------


def explicit_kernel(monkeypatch):
    """Run every layer's USWAttn through the explicit products (as need_weights does), dropping the weights."""
    kernel = littlebird_kernels.unpack_sliding_window_attention

    def explicit(*args, **kwargs):
        return kernel(*args, **{**kwargs, "need_weights": True})[0], None

    monkeypatch.setitem(littlebird_kernels.UNPACK_SLIDING_WINDOW_KERNELS, "eager", explicit)


def model_gradients(model, inputs):
    model.zero_grad()
    model(**inputs).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def mlm_batch(lengths, width, padding, seed=0):
    generator = torch.Generator().manual_seed(seed)
    attention_mask = attention_mask_of(lengths, width, padding)
    input_ids = torch.randint(1, 99, (len(lengths), width), generator=generator) * attention_mask
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@pytest.mark.parametrize(
    ("unpad_inputs", "padding"), [("never", "right"), ("never", "inserted"), ("always", "right")], ids=str
)
def test_model_gradients_equal_the_explicit_products(unpad_inputs, padding, monkeypatch):
    """Every parameter's gradient (slopes included) through the lean kernel equals the explicit products', on right
    padding, Padding Insertion and padding-free (packed) batches; pack length 5 is not a multiple of the block."""
    torch.manual_seed(0)
    config = tiny_config(LittleBirdConfig, pack_length=5, unpad_inputs=unpad_inputs)
    model = LittleBirdForMaskedLM(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, modeling_littlebird.LittleBirdSelfAttention):
                for slope in (module.alpha, module.beta, module.gamma):
                    slope.uniform_(0.05, 0.55)
    inputs = mlm_batch([23, 14, 3], 23, padding)
    lean = model_gradients(model, inputs)
    explicit_kernel(monkeypatch)
    explicit = model_gradients(model, inputs)
    assert lean.keys() == explicit.keys()
    assert any(name.endswith("attention.self.gamma") for name in lean)
    for name, grad in lean.items():
        torch.testing.assert_close(grad, explicit[name], rtol=TOLERANCE, atol=TOLERANCE, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# What the attention keeps for backward
# ---------------------------------------------------------------------------------------------------------------------


def saved_bytes(run) -> int:
    """Bytes of the distinct storages autograd keeps for backward while `run()` builds its graph."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = run()
    del output
    return sum(storages.values())


@pytest.mark.parametrize("block_size", [4, 8, 16, 32])
def test_saved_tensors_do_not_grow_with_the_window(block_size):
    """At a fixed length, the lean path keeps q, the key and value rows and the context: O(L d) however wide the
    window w = (ceil(s / b) + 4) b; the explicit products keep (B n, H, b, w) scores, O(L H w)."""
    seq_len, pack_length = 128, 8
    generator = torch.Generator().manual_seed(0)
    shapes = [(1, seq_len, HEADS, HEAD_DIM)] * 3 + [(1, pack_length, HEADS, HEAD_DIM)] * 2
    tensors = [torch.randn(shape, generator=generator).requires_grad_(True) for shape in shapes]
    slopes = [torch.full((HEADS,), 0.1, requires_grad=True) for _ in range(3)]
    layout = BlockSparseLayout.build(None, 1, seq_len, block_size, pack_length, torch.float32, torch.device("cpu"))

    def attention(need_weights):
        return lambda: unpack_sliding_window_attention(
            *tensors, *slopes, layout, scaling=0.5, need_weights=need_weights
        )[0]

    token_bytes = seq_len * HEADS * HEAD_DIM * 4
    lean, explicit = saved_bytes(attention(False)), saved_bytes(attention(True))
    pack_rows = layout.pack_blocks * block_size
    # q, the context, the key and value rows (pack rows included), the logsumexp (L H) and the (H, 4) coefficients
    assert lean <= 4 * token_bytes + 2 * pack_rows * HEADS * HEAD_DIM * 4 + seq_len * HEADS * 4 + HEADS * 4 * 4
    assert explicit >= seq_len * HEADS * layout.keys_per_block * 4  # at least the softmax's output


def test_feed_forward_recomputes_the_activation_instead_of_keeping_it():
    """The feed-forward block keeps its pre-activation but not the activation's output (tokens, intermediate_size),
    and its gradients equal those of the modules called plainly."""
    torch.manual_seed(0)
    config = tiny_config(LittleBirdConfig)
    layer = modeling_littlebird.LittleBirdLayer(config).train()
    tokens = torch.randn(37, config.hidden_size, requires_grad=True)
    cotangent = torch.randn(37, config.hidden_size)
    parameters = [tokens, *layer.intermediate.parameters(), *layer.output.parameters()]

    def plain():
        return layer.output(layer.intermediate(tokens), tokens)

    def grads(run):
        return torch.autograd.grad((run() * cotangent).sum(), parameters)

    for actual, expected in zip(grads(lambda: layer.feed_forward(tokens)), grads(plain), strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)

    def activation_kept(run) -> bool:
        """Whether the activation's output outlives the forward (held by the graph for backward)."""
        outputs = []
        hook = layer.intermediate.intermediate_act_fn.register_forward_hook(
            lambda module, args, output: outputs.append(weakref.ref(output))
        )
        output = run()
        hook.remove()
        gc.collect()
        kept = outputs[0]() is not None
        del output
        return kept

    assert activation_kept(plain)
    assert not activation_kept(lambda: layer.feed_forward(tokens))


def test_longest_trainable_input_from_measured_peaks():
    """`python -m benchmarks.littlebird longest`: the least-squares line through the measured train peaks, solved for
    the budget; a measured peak above the budget caps it at the longest measured length that fits."""
    from benchmarks.littlebird import longest_trainable

    def case(seq_len, **peaks):
        return {"workload": "train", "seq_len": seq_len, "models": {k: {"peak_mem_mib": v} for k, v in peaks.items()}}

    report = {
        "models": {"lean": "", "dense": ""},
        "results": [
            case(1024, lean=600, dense=1000),
            case(2048, lean=700, dense=3000),
            case(4096, lean=900, dense=9000),
        ],
    }
    longest = longest_trainable(report, budget_mib=4000)
    assert longest["lean"]["mib_per_token"] == pytest.approx(100 / 1024)
    assert abs(longest["lean"]["longest_tokens"] - (4000 - 500) * 1024 / 100) <= 1
    assert longest["lean"]["extrapolated"]
    assert longest["dense"] == {**longest["dense"], "longest_tokens": 2048, "extrapolated": False}
