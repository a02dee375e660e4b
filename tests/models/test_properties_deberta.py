"""Property-based tests (hypothesis) of DeBERTa: configs and inputs nobody wrote by hand.

Valid configs are drawn over every option the config exposes, at tiny sizes (hidden <= 32, <= 2 layers): heads and
head sizes, relative attention on or off, position buckets (none, 0, or 2 up to the largest the clipping distance
allows), max_relative_positions (default, or 1 to beyond the inputs), pos_att_type (any subset, in any order, as a
list, an official "a|b" string, "none" or None), share_att_key, norm_rel_ebd, position_biased_input, the v1 fused and
v2/v3 separate projection layouts, the v2 convolution (kernel, activation, groups), embedding_size, token types, the
pooler, the Enhanced Mask Decoder's steps, tied embeddings, pad ids. They run on random right-padded batches (rows of
length 1 to beyond max_relative_positions and the buckets' exact window, fully padded rows, extra padding columns,
random ids at padding, token_type_ids and position_ids per row or broadcast, inputs_embeds) through the heads.

The reference is never the output under test itself: each sequence run alone without padding is what every backend
(eager, sdpa and the fused FlexAttention kernel; padded and padding-free; a flattened batch) must give at its real
tokens.

Invalid configs and inputs change one field or argument of a valid draw and must raise a ValueError or TypeError
whose message names it.

Tolerance: float32 throughout. The backends and the packing only reorder sums (at most 32-term dot products and
softmaxes over at most ~30 keys here), and the LayerNorms may amplify by the inverse of a small standard deviation;
the largest difference observed over every example is 1.4e-5, so TOLERANCE = 1e-4 leaves a 7x margin. One padding
token left visible moves the real tokens of the smallest model by 5e-4 with the smallest weights drawn
(initializer_range 0.02; `test_tolerance_detects_an_unmasked_padding_token`), by 0.07 and 1.1 with the larger ones
the strategies also draw (0.2, 0.5).

The tensors are tiny, so the module runs on one intra-op thread: on the shared 2-core machine, thread hand-offs made
the same examples ten times slower.
"""

import os
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posformers import (
    DebertaConfig,
    DebertaForMaskedLM,
    DebertaForMultipleChoice,
    DebertaForQuestionAnswering,
    DebertaForReplacedTokenDetection,
    DebertaForSequenceClassification,
    DebertaForTokenClassification,
    DebertaModel,
)

TOLERANCE = 1e-4
# Examples per test scale with POSFORMERS_HYPOTHESIS_SCALE (e.g. 10 for a long local hunt); CI runs scale 1,
# derandomized so that every run tries the same examples.
SCALE = float(os.environ.get("POSFORMERS_HYPOTHESIS_SCALE", "1"))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a loaded machine the threads' hand-offs cost more than
    the arithmetic: one thread for this module, the previous count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def examples(count: int) -> settings:
    return settings(
        max_examples=max(1, int(count * SCALE)),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# Each head and whether its outputs are per token (compared at real tokens) or per row (compared on rows that hold a
# real token: a fully padded row has no first token to pool).
HEADS = {
    "base": DebertaModel,
    "mlm": DebertaForMaskedLM,
    "rtd": DebertaForReplacedTokenDetection,
    "token": DebertaForTokenClassification,
    "sequence": DebertaForSequenceClassification,
    "qa": DebertaForQuestionAnswering,
}
PER_ROW_HEADS = {"sequence"}
ACTIVATIONS = ["gelu", "relu", "tanh", "gelu_new", "silu"]


# ---------------------------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def pos_att_types(draw):
    """Any subset of the position terms, in any order, in each spelling the config accepts."""
    entries = draw(st.lists(st.sampled_from(["c2p", "p2c"]), unique=True, max_size=2))
    if not entries:
        return draw(st.sampled_from([None, [], "none", ""]))
    spelling = draw(st.sampled_from(["list", "string", "upper"]))
    if spelling == "list":
        return entries
    text = "|".join(entries)
    return text.upper() if spelling == "upper" else text


@st.composite
def config_fields(draw, head: str = "base") -> dict:
    """Keyword arguments of a valid tiny DebertaConfig for `head`, every option drawn."""
    heads = draw(st.integers(1, 4))
    # 4 wide at least: a LayerNorm over 2 features is nearly sign(x1 - x2), which turns float rounding into O(1)
    head_dim = draw(st.integers(max(1, -(-4 // heads)), 32 // heads))
    hidden = heads * head_dim
    max_positions = draw(st.integers(2, 40))
    relative = draw(st.booleans())
    max_relative = draw(st.sampled_from([-1, 0]) | st.integers(1, 48))
    distance = max_relative if max_relative >= 1 else max_positions
    # Buckets need relative attention and half of them below the clipping distance - 1; without relative attention a
    # positive value is accepted and ignored (with a logged note), as the official code does.
    buckets = draw(st.sampled_from([-1, 0]))
    if relative and distance >= 3 and draw(st.booleans()):
        buckets = draw(st.integers(2, min(2 * distance - 3, 64)))
    elif not relative and draw(st.booleans()):
        buckets = draw(st.integers(1, 64))
    fields = dict(
        vocab_size=draw(st.integers(2, 40)),
        hidden_size=hidden,
        num_hidden_layers=draw(st.integers(1, 2)),
        num_attention_heads=heads,
        intermediate_size=draw(st.integers(1, 40)),
        hidden_act=draw(st.sampled_from(ACTIVATIONS)),
        # dropout is off in eval mode, where every comparison runs
        hidden_dropout_prob=draw(st.sampled_from([0.0, 0.1, 0.5])),
        attention_probs_dropout_prob=draw(st.sampled_from([0.0, 0.1])),
        max_position_embeddings=max_positions,
        type_vocab_size=draw(st.integers(0, 3)),
        # large weights make the position terms matter against the content terms
        initializer_range=draw(st.sampled_from([0.02, 0.2, 0.5])),
        layer_norm_eps=draw(st.sampled_from([1e-12, 1e-7, 1e-3])),
        relative_attention=relative,
        max_relative_positions=max_relative,
        position_buckets=buckets,
        pos_att_type=draw(pos_att_types()),
        share_att_key=draw(st.booleans()),
        norm_rel_ebd=draw(st.sampled_from(["none", "layer_norm", "none|layer_norm", "LAYER_NORM"])),
        position_biased_input=draw(st.booleans()),
        projection_layout=draw(st.sampled_from(["separate", "fused"])),
        emd_steps=draw(st.integers(0, 3)),
        tie_word_embeddings=draw(st.booleans()),
        pooler_hidden_act=draw(st.sampled_from(ACTIVATIONS)),
        pooler_dropout=draw(st.sampled_from([0, 0.2])),
        cls_dropout=draw(st.sampled_from([None, 0.0, 0.3])),
    )
    if draw(st.booleans()):
        fields["attention_head_size"] = head_dim
    fields["pad_token_id"] = draw(st.none() | st.integers(0, fields["vocab_size"] - 1))
    if draw(st.booleans()):
        fields["question_token_id"] = draw(st.integers(0, fields["vocab_size"] - 1))
    kernel = draw(st.sampled_from([0, 0, 1, 3, 5]))
    if kernel:
        divisors = [d for d in range(1, hidden + 1) if hidden % d == 0]
        fields.update(
            conv_kernel_size=kernel,
            conv_act=draw(st.sampled_from(ACTIVATIONS)),
            conv_groups=draw(st.sampled_from(divisors)),
        )
    if draw(st.booleans()):
        fields["embedding_size"] = draw(st.integers(1, 32))
    if draw(st.booleans()):
        fields["pooler_hidden_size"] = draw(st.integers(1, 32))
    if head == "mlm" and fields.get("embedding_size", hidden) != hidden and not fields["position_biased_input"]:
        fields["emd_steps"] = 0  # the EMD adds hidden-wide position embeddings (refused otherwise, tested below)
    if head == "sequence":
        fields["num_labels"] = draw(st.integers(1, 3))
    if head in ("token", "qa"):
        fields["num_labels"] = draw(st.integers(1, 3)) if head == "token" else 2
    return fields


def reads_absolute_positions(fields: dict, head: str) -> bool:
    """Whether the model reads the absolute position table: input bias, or the MLM head's Enhanced Mask Decoder."""
    config = DebertaConfig(**fields)
    return config.position_biased_input or (head == "mlm" and config.uses_emd)


@st.composite
def batches(draw, fields: dict, head: str, rows: tuple[int, int] = (1, 3)) -> dict:
    """A right-padded batch: row lengths 0 (fully padded) to past max_relative_positions (and, where no absolute
    position is read, past max_position_embeddings), 0-3 extra padding columns, random ids at padding too, token types
    and position_ids per row or (1, L) broadcast, or inputs_embeds instead of input_ids."""
    absolute = reads_absolute_positions(fields, head)
    given_positions = absolute and draw(st.booleans())
    longest = 30 if not absolute or given_positions else fields["max_position_embeddings"] - 3
    longest = max(longest, 1)
    lengths = draw(st.lists(st.integers(0, longest), min_size=rows[0], max_size=rows[1]).filter(lambda ls: max(ls) > 0))
    width = max(lengths) + draw(st.integers(0, 3))
    if absolute and not given_positions:
        width = min(width, fields["max_position_embeddings"])
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    shape = (len(lengths), width)
    batch = {"attention_mask": (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()}
    if draw(st.booleans()):
        batch["input_ids"] = torch.randint(0, fields["vocab_size"], shape, generator=generator)
    else:
        width_embed = fields.get("embedding_size", fields["hidden_size"])
        batch["inputs_embeds"] = torch.randn(*shape, width_embed, generator=generator)
    per_row = draw(st.booleans())
    token_shape = shape if per_row else (1, width)
    if draw(st.booleans()):
        # without token types (type_vocab_size 0) the ids are ignored, as in transformers and the official code
        batch["token_type_ids"] = torch.randint(0, max(fields["type_vocab_size"], 1), token_shape, generator=generator)
    if given_positions:
        # 1 and up: in a batch of one, position_ids restarting at 0 mark a flattened batch
        batch["position_ids"] = torch.randint(1, fields["max_position_embeddings"], token_shape, generator=generator)
    return batch


@st.composite
def cases(draw, heads=tuple(HEADS)):
    head = draw(st.sampled_from(heads))
    fields = draw(config_fields(head))
    return head, fields, draw(batches(fields, head))


# ---------------------------------------------------------------------------------------------------------------------
# Running and comparing
# ---------------------------------------------------------------------------------------------------------------------


def build(head: str, fields: dict):
    torch.manual_seed(0)
    return HEADS[head](DebertaConfig(**fields)).eval()


def run(model, implementation: str, unpad_inputs: str, **inputs) -> dict[str, torch.Tensor]:
    """The tensor outputs of `model(**inputs)` with an attention implementation and padding-free mode, no gradients."""
    model.set_attn_implementation(implementation)
    model.config.unpad_inputs = unpad_inputs
    with torch.no_grad():
        output = model(**inputs)
    return {key: value for key, value in output.items() if isinstance(value, torch.Tensor)}


def row(batch: dict, index: int, length: int) -> dict:
    """Row `index` of a batch cut to its real tokens, as a batch of one without an attention mask (a broadcast (1, L)
    input is cut the same way)."""
    alone = {}
    for key, value in batch.items():
        if key != "attention_mask":
            alone[key] = value[min(index, value.shape[0] - 1) : min(index, value.shape[0] - 1) + 1, :length]
    return alone


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, what
    diff = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert diff <= TOLERANCE, f"{what}: max abs diff {diff}"


def alone_outputs(model, batch: dict) -> list[dict | None]:
    """Each row's outputs run alone without padding (padded path, eager): the reference; None for an empty row."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    return [run(model, "eager", "never", **row(batch, i, n)) if n else None for i, n in enumerate(lengths)]


def check_against_alone(head: str, outputs: dict, expected: list, batch: dict, what: str) -> None:
    """Every output is finite (padding and fully padded rows included) and, at each row's real tokens (per-row heads:
    on rows with a real token), equals the row run alone."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    for key, value in outputs.items():
        assert torch.isfinite(value).all(), f"{what}: {key} is not finite"
        for i, n in enumerate(lengths):
            if not n:
                continue
            reference = expected[i][key][0]
            actual = value[i] if head in PER_ROW_HEADS else value[i, :n]
            assert_close(actual, reference, f"{what}: {key}, row {i} of length {n}")


# ---------------------------------------------------------------------------------------------------------------------
# Valid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@examples(120)
@given(case=cases())
def test_padded_batch_equals_each_sequence_alone_on_every_backend(case):
    """eager and sdpa, padded and padding-free, give every real token what its sequence alone gives, and nothing is
    NaN or inf, fully padded rows included. With output_attentions (which runs eager and padded) the same, and every
    real query gives padded keys no weight."""
    head, fields, batch = case
    model = build(head, fields)
    expected = alone_outputs(model, batch)
    for implementation in ("eager", "sdpa"):
        for unpad_inputs in ("never", "always"):
            outputs = run(model, implementation, unpad_inputs, **batch)
            check_against_alone(head, outputs, expected, batch, f"{implementation}, unpad_inputs={unpad_inputs}")
    model.config.unpad_inputs = "auto"
    with torch.no_grad():
        output = model(**batch, output_attentions=True)
    tensors = {key: value for key, value in output.items() if isinstance(value, torch.Tensor)}
    check_against_alone(head, tensors, expected, batch, "output_attentions")
    mask = batch["attention_mask"].bool()
    for weights in output.attentions:
        assert torch.isfinite(weights).all()
        to_padding = weights.masked_fill(mask[:, None, None, :], 0.0)  # weights on padded keys only
        assert not to_padding[mask[:, None, :, None].expand_as(weights)].any()


@st.composite
def unpositioned_cases(draw, heads=tuple(HEADS)):
    """`cases` without position_ids (a flattened batch counts its positions itself)."""
    head, fields, batch = draw(cases(heads))
    batch.pop("position_ids", None)
    if reads_absolute_positions(fields, head):
        width = min(batch["attention_mask"].shape[1], fields["max_position_embeddings"])
        batch = {key: value[:, :width] for key, value in batch.items()}
        assume_some_real_token(batch)
    return head, fields, batch, draw(st.booleans())


def assume_some_real_token(batch: dict) -> None:
    from hypothesis import assume

    assume(bool(batch["attention_mask"].any()))


def flatten(batch: dict, with_cu_seq_lens: bool) -> dict:
    """The batch as transformers' DataCollatorWithFlattening builds it: the real tokens of every non-empty row in one
    row, position_ids restarting at 0 per sequence (and cu_seq_lens_q/k when asked)."""
    lengths = [n for n in batch["attention_mask"].sum(-1).tolist()]
    rows = [(i, n) for i, n in enumerate(lengths) if n]
    flat = {}
    for key in ("input_ids", "inputs_embeds", "token_type_ids"):
        if key in batch:
            value = batch[key]
            flat[key] = torch.cat([value[min(i, value.shape[0] - 1), :n] for i, n in rows])[None]
    flat["position_ids"] = torch.cat([torch.arange(n) for _, n in rows])[None]
    if with_cu_seq_lens:
        cu = torch.tensor([0] + [n for _, n in rows]).cumsum(0).to(torch.int32)
        flat.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    return flat


@examples(50)
@given(case=unpositioned_cases())
def test_flattened_batch_equals_each_sequence_alone(case):
    """A flattened batch (one row, position_ids restarting per sequence, optionally cu_seq_lens) gives each sequence
    what it gives alone, on both kernels; sequence-level heads give one row per sequence, the QA head one row of span
    logits per sequence."""
    head, fields, batch, with_cu_seq_lens = case
    model = build(head, fields)
    expected = [out for out in alone_outputs(model, batch) if out is not None]
    lengths = [n for n in batch["attention_mask"].sum(-1).tolist() if n]
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    for implementation in ("eager", "sdpa"):
        outputs = run(model, implementation, "auto", **flatten(batch, with_cu_seq_lens))
        for key, value in outputs.items():
            assert torch.isfinite(value).all(), f"{implementation}: {key}"
            for i, n in enumerate(lengths):
                if head in PER_ROW_HEADS:
                    actual = value[i]
                elif head == "qa":  # span logits come as (sequences, longest sequence)
                    actual = value[i, :n]
                else:
                    actual = value[0, starts[i] : starts[i] + n]
                assert_close(actual, expected[i][key][0], f"{implementation}: {key}, sequence {i}")


@st.composite
def choice_cases(draw):
    """Fields, and a batch of `examples x choices` rows with every input per row, for the multiple-choice head."""
    fields = draw(config_fields("choice"))
    examples_, choices = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    batch = draw(batches(fields, "choice", rows=(examples_ * choices, examples_ * choices)))
    width = batch["attention_mask"].shape[1]
    return (
        fields,
        {key: value.expand(examples_ * choices, width, *value.shape[2:]) for key, value in batch.items()},
        choices,
    )


@examples(30)
@given(case=choice_cases())
def test_multiple_choice_equals_each_choice_alone(case):
    """(examples, choices, L) inputs: each choice's logit is what the choice alone gives (choices with a real token),
    on eager and sdpa, padded and padding-free."""
    fields, batch, choices = case
    torch.manual_seed(0)
    model = DebertaForMultipleChoice(DebertaConfig(**fields)).eval()
    lengths = batch["attention_mask"].sum(-1).tolist()
    expected = []
    for i, n in enumerate(lengths):  # each choice alone: one example of one choice, (1, 1, n)
        alone = {key: value[None] for key, value in row(batch, i, n).items()}
        expected.append(run(model, "eager", "never", **alone)["logits"][0] if n else None)
    grouped = {key: value.unflatten(0, (-1, choices)) for key, value in batch.items()}
    for implementation in ("eager", "sdpa"):
        for unpad_inputs in ("never", "always"):
            logits = run(model, implementation, unpad_inputs, **grouped)["logits"].flatten()
            assert torch.isfinite(logits).all()
            for i, n in enumerate(lengths):
                if n:
                    what = f"{implementation}, unpad_inputs={unpad_inputs}, choice row {i}"
                    assert_close(logits[i : i + 1], expected[i], what)


@examples(40)
@given(case=cases())
def test_inputs_embeds_and_a_3d_mask_equal_input_ids_and_the_2d_mask(case):
    """The word embeddings of input_ids passed as inputs_embeds, and a (B, L, L) mask whose every query row is the 2D
    key mask, give the outputs of input_ids with the 2D mask (padded and padding-free)."""
    head, fields, batch = case
    model = build(head, fields)
    if "input_ids" in batch:
        embeds = model.get_input_embeddings()(batch["input_ids"]).detach()
        embedded = {**{k: v for k, v in batch.items() if k != "input_ids"}, "inputs_embeds": embeds}
    else:
        embedded = batch
    mask = batch["attention_mask"].bool()
    square = {**batch, "attention_mask": batch["attention_mask"][:, None, :].expand(-1, mask.shape[1], -1)}
    for unpad_inputs in ("never", "always"):
        expected = run(model, "sdpa", unpad_inputs, **batch)
        outputs = run(model, "sdpa", unpad_inputs, **embedded)
        square_outputs = run(model, "sdpa", "auto", **square)  # a 3D mask runs padded
        for key, value in expected.items():
            if head in PER_ROW_HEADS:
                keep = mask.any(-1)
                actual, square_actual, value = outputs[key][keep], square_outputs[key][keep], value[keep]
            else:
                actual, square_actual, value = outputs[key][mask], square_outputs[key][mask], value[mask]
            assert_close(actual, value, f"inputs_embeds, unpad_inputs={unpad_inputs}: {key}")
            assert_close(square_actual, value, f"3D mask against unpad_inputs={unpad_inputs}: {key}")


def training_labels(head: str, fields: dict, batch: dict, generator: torch.Generator) -> dict:
    """Labels for `head` on the real tokens of `batch` (-100 at padding)."""
    mask = batch["attention_mask"].bool()
    shape = mask.shape
    if head == "mlm":
        labels = torch.randint(0, fields["vocab_size"], shape, generator=generator)
    elif head == "rtd":
        labels = torch.randint(0, 2, shape, generator=generator)
    elif head == "token":
        labels = torch.randint(0, fields["num_labels"], shape, generator=generator)
    elif head == "sequence":
        if fields["num_labels"] == 1:
            return {"labels": torch.randn(shape[0], generator=generator)}
        return {"labels": torch.randint(0, fields["num_labels"], (shape[0],), generator=generator)}
    elif head == "qa":
        lengths = mask.sum(-1)
        start = (torch.rand(shape[0], generator=generator) * lengths).long()
        end = start + (torch.rand(shape[0], generator=generator) * (lengths - start)).long()
        return {"start_positions": start, "end_positions": end}
    else:
        return {}
    return {"labels": labels.masked_fill(~mask, -100)}


@examples(40)
@given(case=cases(), seed=st.integers(0, 2**16))
def test_training_step_is_finite_and_padding_free_gradients_equal_padded(case, seed):
    """In training mode (dropout 0) the loss and every gradient are finite, and the padding-free pass gives the
    padded pass's loss and gradients (rows with a real token; a fully padded row has no first token to classify)."""
    head, fields, batch = case
    keep = batch["attention_mask"].any(-1)
    batch = {key: value[keep] if value.shape[0] == keep.shape[0] else value for key, value in batch.items()}
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "pooler_dropout", "cls_dropout"):
        fields[name] = 0.0
    model = build(head, fields).train()
    labels = training_labels(head, fields, batch, torch.Generator().manual_seed(seed))
    weights = torch.randn(32, generator=torch.Generator().manual_seed(seed))
    results = {}
    for unpad_inputs in ("never", "always"):
        model.config.unpad_inputs = unpad_inputs
        model.zero_grad()
        output = model(**batch, **labels)
        if head == "base":  # a loss on the real tokens only
            states = output.last_hidden_state[batch["attention_mask"].bool()]
            loss = (states * weights[: states.shape[-1]]).sum()
        else:
            loss = output.loss
        loss.backward()
        gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        assert torch.isfinite(loss), unpad_inputs
        assert all(torch.isfinite(g).all() for g in gradients.values()), unpad_inputs
        results[unpad_inputs] = loss.detach(), gradients
    (padded_loss, padded), (packed_loss, packed) = results["never"], results["always"]
    assert_close(packed_loss, padded_loss, "loss")
    assert packed.keys() == padded.keys()
    for name, gradient in padded.items():
        scale = max(1.0, gradient.abs().max().item())  # gradients grow with the number of tokens summed
        assert_close(packed[name] / scale, gradient / scale, f"gradient of {name}")


@st.composite
def fused_cases(draw):
    """A config for the base model or the MLM head, and several batches for it."""
    head, fields, batch = draw(cases(heads=("base", "mlm")))
    more = draw(st.lists(batches(fields, head), min_size=1, max_size=3))
    return head, fields, [batch, *more]


def check_fused_attention(head: str, fields: dict, batches_: list) -> None:
    model = build(head, fields)
    for batch in batches_:
        expected = alone_outputs(model, batch)
        for unpad_inputs in ("never", "always"):
            outputs = run(model, "posformers_fused", unpad_inputs, **batch)
            check_against_alone(head, outputs, expected, batch, f"posformers_fused, unpad_inputs={unpad_inputs}")


@examples(12)
@given(case=fused_cases())
def test_fused_attention_score_mod_equals_each_sequence_alone(case):
    """The fused kernel's logic ("posformers_fused": the position scores read from the small
    tables inside FlexAttention's score_mod, key padding and packed sequences as block masks), padded and
    padding-free, gives every real token what its sequence alone gives. Run uncompiled (torch's reference
    FlexAttention on a materialised score matrix, the same score_mod and block masks): compiling costs 10-20 s per
    config and batch shape here. The kernel is compared with the others in test_fused_attention.py."""
    with torch.compiler.set_stance("force_eager"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        check_fused_attention(*case)


# The smallest model the strategies draw (hidden 4, one head and layer), for the tests of one case.
SMALLEST = dict(
    vocab_size=5, hidden_size=4, num_hidden_layers=1, num_attention_heads=1, intermediate_size=1, position_buckets=-1
)


def test_tolerance_detects_an_unmasked_padding_token():
    """The comparisons can fail: one padding token left visible to attention moves real tokens far beyond TOLERANCE
    (for the smallest model and weights the strategies draw)."""
    model = build("base", {**SMALLEST, "max_position_embeddings": 8, "initializer_range": 0.02})
    input_ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 1, 0]])
    expected = alone_outputs(model, {"input_ids": input_ids, "attention_mask": mask})
    leaked = run(model, "eager", "never", input_ids=input_ids, attention_mask=torch.ones_like(mask))
    with pytest.raises(AssertionError, match="max abs diff"):
        check_against_alone("base", leaked, expected, {"input_ids": input_ids, "attention_mask": mask}, "leak")


def test_set_attn_implementation_switches_the_kernel(monkeypatch):
    """Regression: transformers guesses from a module's source whether its attention kernel can be switched, and
    guessed wrong for DeBERTa, so `set_attn_implementation` only warned and every pass stayed on sdpa (the eager and
    fused comparisons above compared sdpa with itself)."""
    import posformers.modeling_deberta as modeling

    calls = []
    eager = modeling.ATTENTION_KERNELS["eager"]
    monkeypatch.setitem(
        modeling.ATTENTION_KERNELS, "eager", lambda *args, **kwargs: calls.append(1) or eager(*args, **kwargs)
    )
    model = build("base", SMALLEST)
    for implementation in ("eager", "posformers_fused", "sdpa"):
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
    run(model, "eager", "never", input_ids=torch.tensor([[1, 2, 3]]))
    assert calls, "set_attn_implementation('eager') left the model on another kernel"


# ---------------------------------------------------------------------------------------------------------------------
# Invalid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------

NOT_INTEGERS = st.sampled_from([1.5, "8", True, None, [4]])
NOT_PROBABILITIES = st.sampled_from([-0.1, 1.0, 1.5, "0.1", True, None])
NOT_ACTIVATIONS = st.sampled_from(["no_such_act", 3, None, ["gelu"]])
NOT_BOOLEANS = st.sampled_from(["false", "true", 2, None, 0.5])


def bad_values(fields: dict) -> dict:
    """Field -> a strategy of values that field must refuse, given the other (valid) fields."""
    vocab = fields["vocab_size"]
    distance = fields["max_relative_positions"]
    distance = distance if distance >= 1 else fields["max_position_embeddings"]
    positive = {
        name: st.integers(-5, 0) | NOT_INTEGERS
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        )
    }
    # None means "hidden_size" / "hidden_size / heads" for these
    for name in ("embedding_size", "pooler_hidden_size", "attention_head_size"):
        positive[name] = st.integers(-5, 0) | NOT_INTEGERS.filter(lambda value: value is not None)
    return {
        **positive,
        **{name: st.integers(-5, -1) | NOT_INTEGERS for name in ("type_vocab_size", "conv_kernel_size", "emd_steps")},
        **{name: st.integers(-9, -2) | NOT_INTEGERS for name in ("max_relative_positions", "position_buckets")},
        **{
            name: NOT_PROBABILITIES
            for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "pooler_dropout")
        },
        "cls_dropout": NOT_PROBABILITIES.filter(lambda value: value is not None),  # None: hidden_dropout_prob
        **{name: NOT_ACTIVATIONS for name in ("hidden_act", "pooler_hidden_act", "conv_act")},
        **{name: NOT_BOOLEANS for name in ("relative_attention", "share_att_key", "position_biased_input")},
        "layer_norm_eps": st.sampled_from([0.0, -1e-5, "1e-7", None, True]),
        "initializer_range": st.sampled_from([-0.02, "0.02", None, True]),
        "pad_token_id": st.sampled_from([-1, vocab, vocab + 7, 1.5, "0", True]),
        "question_token_id": st.sampled_from([-1, vocab, 2.5, "3", True]),
        "qa_head": st.sampled_from(["span", None, 1]),
        "projection_layout": st.sampled_from(["interleaved", None, 0]),
        "unpad_inputs": st.sampled_from(["sometimes", True, None]),
        "pos_att_type": st.sampled_from(["c2p|p2p", "p2p", "c2q", ["c2p", "c2p"], "p2c|P2C", 5, ["c2p", 3]]),
        "norm_rel_ebd": st.sampled_from(["batch_norm", "layer_norm|rms", 5]),
        "talking_head": st.just(True),
        # more buckets than the clipping distance allows (with relative attention)
        "position_buckets:too_many": st.integers(max(2 * distance - 2, 2), 2 * distance + 8),
        "conv_kernel_size:even": st.sampled_from([2, 4, 6]),
        "conv_groups": st.sampled_from([0, -1, 1.5, "2", fields["hidden_size"] + 1]),
        # heads that do not divide the hidden size
        "num_attention_heads:divisor": st.integers(1, 8).filter(lambda h: fields["hidden_size"] % h),
    }


@st.composite
def invalid_configs(draw):
    """(field, valid fields with that one field made invalid)."""
    fields = draw(config_fields())
    options = bad_values(fields)
    key = draw(st.sampled_from(sorted(options)))
    field = key.split(":")[0]
    value = draw(options[key])
    if key == "position_buckets:too_many":
        fields["relative_attention"] = True
    elif key in ("conv_kernel_size:even", "conv_groups"):
        fields["conv_kernel_size"] = fields.get("conv_kernel_size") or 3
        if key == "conv_groups" and value in range(1, fields["hidden_size"] + 1) and fields["hidden_size"] % value == 0:
            value = 0  # a divisor is valid
    elif key == "num_attention_heads:divisor":
        fields.pop("attention_head_size", None)
    elif key == "attention_head_size" and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        value += fields["hidden_size"]  # positive but not hidden_size / heads
    fields[field] = value
    return field, fields


@examples(150)
@given(case=invalid_configs())
def test_invalid_config_is_refused_naming_the_field(case):
    """One invalid field in an otherwise valid config: a ValueError or TypeError whose message names it (the
    heads-and-hidden-size mismatch names num_attention_heads)."""
    field, fields = case
    with pytest.raises((ValueError, TypeError)) as error:
        DebertaConfig(**fields)
    assert field in str(error.value), f"{field}={fields[field]!r}: {error.value}"


# A small config for the regression tests (8 wide: the inputs_embeds below).
SMALL = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=5)

# Each once accepted (the model then failed deep inside torch, or silently read "false" as true) or refused with a
# message naming nothing; found by the test above.
CONFIG_REGRESSIONS = {
    "activation-list": ("hidden_act", ["gelu"]),  # TypeError: unhashable type: 'list'
    "pos-att-type-int": ("pos_att_type", 5),  # TypeError: 'int' object is not iterable
    "eps-zero": ("layer_norm_eps", 0.0),
    "eps-negative": ("layer_norm_eps", -1e-5),
    "eps-string": ("layer_norm_eps", "1e-7"),
    "init-negative": ("initializer_range", -0.02),
    "relative-string": ("relative_attention", "false"),  # read as true
    "share-none": ("share_att_key", None),
    "absolute-int": ("position_biased_input", 2),
    "dropout-none": ("hidden_dropout_prob", None),  # nn.Dropout(None) failed when the model was built
}


@pytest.mark.parametrize("field, value", CONFIG_REGRESSIONS.values(), ids=CONFIG_REGRESSIONS.keys())
def test_config_regressions_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"DebertaConfig\.{field} must"):
        DebertaConfig(**SMALL, **{field: value})
    config = DebertaConfig(**SMALL)
    setattr(config, field, value)  # changed after creation: refused when a model is built
    with pytest.raises(ValueError, match=rf"DebertaConfig\.{field} must"):
        DebertaModel(config)


@st.composite
def invalid_inputs(draw):
    """(argument, head, fields, inputs): a valid case with one input made invalid."""
    head, fields, batch = draw(cases())
    config = DebertaConfig(**fields)
    if "input_ids" not in batch:
        batch.pop("inputs_embeds")
        generator = torch.Generator().manual_seed(0)
        batch["input_ids"] = torch.randint(0, fields["vocab_size"], batch["attention_mask"].shape, generator=generator)
    size, length = batch["input_ids"].shape
    options = [
        "input_ids:range",
        "input_ids:dtype",
        "input_ids:rank",
        "input_ids:both",
        "input_ids:neither",
        "inputs_embeds:width",
        "inputs_embeds:dtype",
        "attention_mask:shape",
        "token_type_ids:shape",
        "token_type_ids:dtype",
        "position_ids:shape",
        "position_ids:dtype",
    ]
    if config.type_vocab_size > 0:
        options.append("token_type_ids:range")
    if reads_absolute_positions(fields, head):
        options.append("position_ids:range")
    key = draw(st.sampled_from(options))
    argument, kind = key.split(":")
    row, column = draw(st.integers(0, size - 1)), draw(st.integers(0, length - 1))
    if kind == "range":
        limit = {"input_ids": config.vocab_size, "token_type_ids": config.type_vocab_size}.get(
            argument, config.max_position_embeddings
        )
        ids = batch.get(argument, torch.zeros_like(batch["input_ids"])).expand(size, length).clone()
        ids[row, column] = draw(st.sampled_from([limit, limit + 5, -1, -100]))
        batch[argument] = ids
    elif kind == "dtype":
        if argument == "inputs_embeds":
            embeds = torch.zeros(size, length, config.embedding_size, dtype=torch.long)
            batch = {**{k: v for k, v in batch.items() if k != "input_ids"}, "inputs_embeds": embeds}
        else:
            batch[argument] = batch.get(argument, torch.ones_like(batch["input_ids"])).float()
    elif kind == "rank":
        batch["input_ids"] = draw(st.sampled_from([batch["input_ids"][0], batch["input_ids"][..., None]]))
    elif kind == "both":
        batch["inputs_embeds"] = torch.zeros(size, length, config.embedding_size)
    elif kind == "neither":
        batch.pop("input_ids")
    elif kind == "width":
        batch.pop("input_ids")
        batch["inputs_embeds"] = torch.zeros(size, length, config.embedding_size + draw(st.sampled_from([-1, 1, 3])))
    elif kind == "shape":
        shapes = [(size, length + 1), (size + 1, length), (length,), (size, length, 2)]
        if argument == "attention_mask":
            shapes.append((size, 1, length, length))
        if size == 1:
            shapes.remove((size + 1, length))  # (2, L) ids broadcast over... nothing: still wrong
            shapes.append((2, length))
        shape = draw(st.sampled_from(shapes))
        batch[argument] = torch.ones(shape, dtype=torch.long)
    return argument, head, fields, batch


@examples(120)
@given(case=invalid_inputs())
def test_invalid_input_is_refused_naming_the_argument(case):
    """One invalid input (an id out of range, a float id, a wrong shape or rank, both or neither of input_ids and
    inputs_embeds, embeddings of the wrong width or dtype): a ValueError or TypeError naming the argument, padded or
    padding-free."""
    argument, head, fields, batch = case
    model = build(head, fields)
    for unpad_inputs in ("never", "always"):
        with pytest.raises((ValueError, TypeError)) as error:
            run(model, "sdpa", unpad_inputs, **batch)
        assert argument in str(error.value), f"{argument}: {error.value}"


# Each once reached torch's embedding or LayerNorm and failed there with a message naming no argument.
INPUT_REGRESSIONS = {
    "float-input-ids": ("input_ids", dict(input_ids=torch.ones(2, 3))),
    "float-token-types": ("token_type_ids", dict(input_ids=torch.ones(2, 3).long(), token_type_ids=torch.ones(2, 3))),
    "float-positions": ("position_ids", dict(input_ids=torch.ones(2, 3).long(), position_ids=torch.ones(1, 3))),
    "integer-embeds": ("inputs_embeds", dict(inputs_embeds=torch.ones(2, 3, 8).long())),
    "double-embeds": ("inputs_embeds", dict(inputs_embeds=torch.ones(2, 3, 8).double())),
    "list-ids": ("input_ids", dict(input_ids=[[1, 2, 3]])),
}


@pytest.mark.parametrize("argument, inputs", INPUT_REGRESSIONS.values(), ids=INPUT_REGRESSIONS.keys())
def test_input_regressions_name_the_argument(argument, inputs):
    model = build("base", {**SMALL, "type_vocab_size": 2, "position_biased_input": True})
    with pytest.raises(TypeError, match=rf"^{argument} must"):
        model(**inputs)
