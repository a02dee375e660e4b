"""Property-based tests (hypothesis) of RoFormer: configs and inputs nobody wrote by hand.

Valid configs are drawn over every option the config exposes (sizes, heads, head dimensions, rotary dimension or
fraction, layout, theta, every rope_parameters type and its keys, v2 norm and bias, linear attention, rotary values,
factorised embeddings, token types, pooler, decoder and bidirectional_prompt) at tiny sizes, and run on random
right-padded batches (rows of length 1 to beyond max_position_embeddings, fully padded rows, extra padding columns,
token types, position_ids, inputs_embeds, flattened batches). The reference is never the tested path's own output:
each sequence run alone without padding, the same positions shifted (rotary attention sees only relative positions),
the padded path's gradients, or one pass over what a cache continues.

Invalid configs and inputs change one field or argument of a valid draw and must raise a ValueError or TypeError
naming it.

Tolerance: float32 throughout; backends and packing only reorder sums and LayerNorm/RMS norm may amplify by the
inverse of a small standard deviation. Measured over every example: at most 4e-6 between backends and paths, 1.1e-5
with positions shifted by up to 300 (float32 cos/sin of larger angles), 8.5e-6 of a gradient's largest entry.
TOLERANCE = 1e-4 leaves a 9x margin; a wrong mask, position or rotation moves outputs by O(0.1).
"""

import math
import warnings

import pytest
import torch
from helpers.modeling import flattened, tiny_fields
from helpers.properties import examples, one_thread  # noqa: F401 (one_thread: an autouse fixture)
from hypothesis import given
from hypothesis import strategies as st

from posformers.configuration_roformer import RoFormerConfig
from posformers.modeling_roformer import RoFormerForCausalLM, RoFormerForMaskedLM, RoFormerModel

TOLERANCE = 1e-4


# ---------------------------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def rope_scalings(draw, max_position_embeddings: int):
    """None or a valid rope_scaling dict of any type, with a random subset of its optional keys."""
    rope_type = draw(st.sampled_from([None, "default", "linear", "dynamic", "yarn"]))
    if rope_type is None:
        return None
    if rope_type == "default":
        return {"rope_type": "default"}
    scaling = {"rope_type": rope_type, "factor": draw(st.floats(1.0, 8.0))}
    if rope_type == "yarn":
        optional = {
            "original_max_position_embeddings": st.integers(1, 2 * max_position_embeddings),
            "attention_factor": st.floats(0.5, 2.0),
            "beta_fast": st.floats(8.0, 64.0),
            "beta_slow": st.floats(0.5, 4.0),
            "mscale": st.floats(0.5, 2.0),
            "mscale_all_dim": st.floats(0.5, 2.0),
            "truncate": st.booleans(),
        }
        for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
            scaling[key] = draw(optional[key])
    return scaling


@st.composite
def config_fields(draw, decoder: bool = False) -> dict:
    """Keyword arguments of a valid tiny RoFormerConfig (hidden <= 32, <= 2 layers), every option drawn."""
    heads = draw(st.integers(1, 4))
    head_dim = draw(st.integers(2, 32 // heads))
    # The rotated part of each head: all of it (needs an even head), or an even rotary_dim given directly or as a
    # fraction of the head.
    rotary = draw(st.sampled_from(["all", "rotary_dim", "partial_rotary_factor"] if head_dim % 2 == 0 else ["dim"]))
    rotary_dim = draw(st.integers(1, head_dim // 2)) * 2
    fields = dict(
        vocab_size=draw(st.integers(2, 40)),
        hidden_size=heads * head_dim,
        num_hidden_layers=draw(st.integers(1, 2)),
        num_attention_heads=heads,
        intermediate_size=draw(st.integers(1, 40)),
        hidden_act=draw(st.sampled_from(["gelu", "relu", "silu", "tanh", "gelu_new"])),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=draw(st.integers(1, 24)),
        type_vocab_size=draw(st.integers(0, 3)),
        initializer_range=draw(st.sampled_from([0.02, 0.2, 0.5])),
        layer_norm_eps=draw(st.sampled_from([1e-12, 1e-6, 1e-3])),
        rope_theta=draw(st.sampled_from([10.0, 10000.0, 1e6])),
        rope_layout=draw(st.sampled_from(["interleaved", "half"])),
        rotary_value=draw(st.booleans()),
        norm_type=draw(st.sampled_from(["layer_norm", "rms_norm"])),
        use_bias=draw(st.booleans()),
        attention_kernel=draw(st.sampled_from(["softmax", "linear"])),
        add_pooling_layer=draw(st.booleans()),
        pooler_activation=draw(st.sampled_from(["tanh", "linear", "relu"])),
        is_decoder=decoder,
        bidirectional_prompt=decoder and draw(st.booleans()),
    )
    fields["pad_token_id"] = draw(st.none() | st.integers(0, fields["vocab_size"] - 1))
    if draw(st.booleans()):
        fields["embedding_size"] = draw(st.integers(1, 32))
    if rotary in ("rotary_dim", "dim"):
        fields["rotary_dim"] = rotary_dim
    elif rotary == "partial_rotary_factor":
        fields["partial_rotary_factor"] = rotary_dim / head_dim
    scaling = draw(rope_scalings(fields["max_position_embeddings"]))
    rope_dim = head_dim if rotary == "all" else rotary_dim
    if scaling is not None and scaling["rope_type"] == "dynamic" and rope_dim <= 2:
        scaling = None  # dynamic NTK raises the base to the power dim / (dim - 2)
    fields["rope_parameters"] = {"rope_theta": fields.pop("rope_theta"), **(scaling or {"rope_type": "default"})}
    return fields


@st.composite
def batches(draw, fields: dict) -> dict:
    """A right-padded batch for a config: row lengths 0 (fully padded) to past max_position_embeddings, 0-3 extra
    padding columns, random ids (the pad id included) and token types."""
    longest = fields["max_position_embeddings"] + 6
    lengths = draw(st.lists(st.integers(0, longest), min_size=1, max_size=4).filter(lambda ls: max(ls) > 0))
    width = max(lengths) + draw(st.integers(0, 3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    shape = (len(lengths), width)
    input_ids = torch.randint(0, fields["vocab_size"], shape, generator=generator)
    attention_mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if fields["type_vocab_size"] > 0 and draw(st.booleans()):
        batch["token_type_ids"] = torch.randint(0, fields["type_vocab_size"], shape, generator=generator)
    return batch


def build(fields: dict, model_class=RoFormerModel):
    torch.manual_seed(0)
    return model_class(RoFormerConfig(**fields)).eval()


def run(model, implementation: str, unpad_inputs: str, **inputs):
    """`model(**inputs)` with an attention implementation and padding-free mode, no gradients, warnings (position
    extrapolation beyond max_position_embeddings is expected here) silenced."""
    model.set_attn_implementation(implementation)
    model.config.unpad_inputs = unpad_inputs
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(**inputs)


def row(batch: dict, index: int, length: int) -> dict:
    """Row `index` of a batch, cut to its real tokens, as a batch of one without an attention mask."""
    return {key: value[index : index + 1, :length] for key, value in batch.items() if key != "attention_mask"}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, scale: float = 1.0) -> None:
    """At most TOLERANCE apart, times `scale` for quantities larger than the O(1) normalised states."""
    assert actual.shape == expected.shape, what
    diff = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert diff <= TOLERANCE * scale, f"{what}: max abs diff {diff}"


def dynamic_scaling(fields: dict) -> bool:
    return fields["rope_parameters"]["rope_type"] == "dynamic"


# ---------------------------------------------------------------------------------------------------------------------
# Valid configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def encoder_cases(draw):
    fields = draw(config_fields())
    return fields, draw(batches(fields))


def flattened_batch(batch: dict, cu_seq_lens: bool) -> dict:
    """The real tokens of a right-padded batch as transformers' DataCollatorWithFlattening lays them out (one row,
    position_ids restarting at 0 per sequence, with cu_seq_lens_q/k and max_length_q/k when `cu_seq_lens`), token
    types alongside."""
    mask = batch["attention_mask"].bool()
    flat = flattened([ids[real].tolist() for ids, real in zip(batch["input_ids"], mask) if real.any()], cu_seq_lens)
    if "token_type_ids" in batch:
        flat["token_type_ids"] = batch["token_type_ids"][mask][None]
    return flat


@examples(250)
@given(case=encoder_cases(), cu_seq_lens=st.booleans())
def test_padded_batch_equals_each_sequence_alone_on_every_backend(case, cu_seq_lens):
    """eager and sdpa, padded, padding-free and flattened (DataCollatorWithFlattening), give every real token what
    its sequence alone gives, and nothing is NaN or inf, fully padded rows included. With dynamic NTK scaling the
    frequencies depend on the longest sequence of the batch (as in transformers), so there the reference is the batch
    without extra padding columns."""
    fields, batch = case
    model = build(fields)
    lengths = batch["attention_mask"].sum(-1).tolist()
    if dynamic_scaling(fields):
        width = max(lengths)
        trimmed = {key: value[:, :width] for key, value in batch.items()}
        reference = run(model, "eager", "never", **trimmed)
        expected = [reference.last_hidden_state[i, :n] for i, n in enumerate(lengths)]
        expected_pooled = reference.pooler_output
    else:
        alone = [run(model, "eager", "never", **row(batch, i, n)) if n else None for i, n in enumerate(lengths)]
        expected = [out.last_hidden_state[0] if out is not None else None for out in alone]
        expected_pooled = [
            out.pooler_output[0] if out is not None and out.pooler_output is not None else None for out in alone
        ]
    for implementation in ("eager", "sdpa"):
        for unpad_inputs in ("never", "always"):
            what = f"{implementation}, unpad_inputs={unpad_inputs}"
            output = run(model, implementation, unpad_inputs, **batch)
            assert torch.isfinite(output.last_hidden_state).all(), what
            for i, n in enumerate(lengths):
                if n:
                    assert_close(output.last_hidden_state[i, :n], expected[i], f"{what}, row {i}")
            if fields["add_pooling_layer"]:
                assert torch.isfinite(output.pooler_output).all(), what
                for i, n in enumerate(lengths):
                    if n and expected_pooled[i] is not None:
                        assert_close(output.pooler_output[i], expected_pooled[i], f"{what}, pooler row {i}")
        flat = run(model, implementation, "auto", **flattened_batch(batch, cu_seq_lens))
        real = [i for i, n in enumerate(lengths) if n]
        for sequence, tokens in zip(real, flat.last_hidden_state[0].split([lengths[i] for i in real])):
            assert_close(tokens, expected[sequence], f"{implementation}, flattened, sequence {sequence}")
            if fields["add_pooling_layer"]:
                pooled = flat.pooler_output[real.index(sequence)]
                assert_close(pooled, expected_pooled[sequence], f"{implementation}, flattened, pooler {sequence}")


@st.composite
def flex_cases(draw):
    """Encoder cases with 2 heads of 8 features: every other option varies, but a new head shape would compile a
    new flex kernel (tens of seconds on a CPU)."""
    fields = draw(config_fields())
    if fields["hidden_size"] != 16 or fields["num_attention_heads"] != 2:
        fields.update(hidden_size=16, num_attention_heads=2, rotary_dim=None, partial_rotary_factor=None)
    return fields, draw(batches(fields))


@pytest.mark.slow
@examples(10)
@given(case=flex_cases())
def test_flex_attention_equals_eager(case):
    """flex_attention (inference only on CPU: torch has no CPU backward for it) gives eager's outputs at real tokens,
    padded and padding-free."""
    fields, batch = case
    model = build(fields)
    mask = batch["attention_mask"].bool()
    expected = run(model, "eager", "never", **batch).last_hidden_state
    for unpad_inputs in ("never", "always"):
        output = run(model, "flex_attention", unpad_inputs, **batch).last_hidden_state
        assert torch.isfinite(output[mask]).all(), unpad_inputs
        assert_close(output[mask], expected[mask], f"flex_attention, unpad_inputs={unpad_inputs}")


def real_token_gradients(model, batch: dict, unpad_inputs: str) -> dict[str, torch.Tensor]:
    """Every parameter's gradient of a fixed random projection of the real tokens' final states (training mode)."""
    model.train()
    model.config.unpad_inputs = unpad_inputs
    model.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        states = model(**batch).last_hidden_state
    weights = torch.randn(states.shape, generator=torch.Generator().manual_seed(0))
    (states * weights)[batch["attention_mask"].bool()].sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@examples(60)
@given(case=encoder_cases())
def test_padding_free_training_gives_the_padded_gradients(case):
    """A training step's gradients, every parameter's, are finite and the same padded and padding-free (padding must
    contribute nothing to any gradient). Gradients sum over tokens, so the tolerance is relative to each one's
    largest entry."""
    fields, batch = case
    model = build(fields)
    model.set_attn_implementation("sdpa")
    padded = real_token_gradients(model, batch, "never")
    packed = real_token_gradients(model, batch, "always")
    assert padded.keys() == packed.keys()
    for name, gradient in padded.items():
        assert torch.isfinite(gradient).all(), name
        assert_close(packed[name], gradient, f"gradient of {name}", scale=max(1.0, gradient.abs().max().item()))


@st.composite
def shift_cases(draw):
    fields = draw(config_fields())
    fields["rotary_value"] = False  # rotated values carry absolute positions
    if dynamic_scaling(fields):
        # the dynamic base depends on the largest position
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": fields["rope_parameters"]["rope_theta"]}
    return fields, draw(batches(fields)), draw(st.integers(-50, 300))


@examples(120)
@given(case=shift_cases())
def test_outputs_do_not_change_when_every_position_shifts(case):
    """Rotary attention scores depend only on the distance between positions, so position_ids shifted by a constant
    (negative, or past the cached table of max_position_embeddings) give the outputs of the default positions."""
    fields, batch, shift = case
    model = build(fields)
    mask = batch["attention_mask"].bool()
    expected = run(model, "sdpa", "never", **batch).last_hidden_state
    positions = torch.arange(batch["input_ids"].shape[1]) + shift
    for unpad_inputs in ("never", "always"):
        for position_ids in (positions[None], positions.expand_as(batch["input_ids"])):
            output = run(model, "sdpa", unpad_inputs, position_ids=position_ids, **batch).last_hidden_state
            assert_close(output[mask], expected[mask], f"shift {shift}, unpad_inputs={unpad_inputs}")


@st.composite
def embeds_cases(draw):
    fields = draw(config_fields())
    return fields, draw(batches(fields)), draw(st.sampled_from(["never", "auto", "always"]))


@examples(60)
@given(case=embeds_cases())
def test_inputs_embeds_equal_input_ids(case):
    """The word embeddings of input_ids passed as inputs_embeds give the same outputs, padded or padding-free."""
    fields, batch, unpad_inputs = case
    model = build(fields)
    mask = batch["attention_mask"].bool()
    expected = run(model, "sdpa", unpad_inputs, **batch).last_hidden_state
    embeds = {key: value for key, value in batch.items() if key != "input_ids"}
    embeds["inputs_embeds"] = model.get_input_embeddings()(batch["input_ids"]).detach()
    output = run(model, "sdpa", unpad_inputs, **embeds).last_hidden_state
    assert_close(output[mask], expected[mask], f"unpad_inputs={unpad_inputs}")


@st.composite
def decoder_cases(draw):
    fields = draw(config_fields(decoder=True))
    fields["add_pooling_layer"] = False
    if fields["norm_type"] == "rms_norm":
        fields.pop("embedding_size", None)  # RoFormer-v2's LM head needs embedding_size == hidden_size
    length = draw(st.integers(2, fields["max_position_embeddings"] + 6))
    prefix = draw(st.integers(1, length - 1))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    input_ids = torch.randint(0, fields["vocab_size"], (draw(st.integers(1, 3)), length), generator=generator)
    return fields, input_ids, prefix


@examples(100)
@given(case=decoder_cases())
def test_decoder_cache_and_backends_agree_with_a_full_pass(case):
    """A causal LM: eager and sdpa agree, with and without a cache, and continuing from the cache of a prefix gives
    the logits of one causal pass over the whole sequence. With bidirectional_prompt a pass without a cache reads its
    tokens bidirectionally, so there only the backends are compared (and so where dynamic NTK scaling changes the
    base between the prefix and the whole sequence)."""
    fields, input_ids, prefix = case
    model = build(fields, RoFormerForCausalLM)
    full = run(model, "eager", "never", input_ids=input_ids).logits
    assert torch.isfinite(full).all()
    assert_close(run(model, "sdpa", "never", input_ids=input_ids).logits, full, "sdpa vs eager")
    continuations = {}
    for implementation in ("eager", "sdpa"):
        first = run(model, implementation, "never", input_ids=input_ids[:, :prefix], use_cache=True)
        cache = first.past_key_values
        rest = run(
            model, implementation, "never", input_ids=input_ids[:, prefix:], past_key_values=cache, use_cache=True
        )
        continuations[implementation] = rest.logits
        assert torch.isfinite(rest.logits).all(), implementation
        # Dynamic NTK scaling rotates every position differently once the sequence outgrows the table, so a prefix
        # that fits it reads differently from the whole (as in transformers).
        outgrown = dynamic_scaling(fields) and input_ids.shape[1] > fields["max_position_embeddings"]
        if not fields["bidirectional_prompt"] and not outgrown:
            assert_close(first.logits, full[:, :prefix], f"{implementation}, prefix")
            assert_close(rest.logits, full[:, prefix:], f"{implementation}, continuation")
    assert_close(continuations["sdpa"], continuations["eager"], "continuation, sdpa vs eager")


# ---------------------------------------------------------------------------------------------------------------------
# Invalid configs and inputs: one field or argument broken, an error naming it
# ---------------------------------------------------------------------------------------------------------------------

NOT_INTEGERS = [0, -3, 2.5, "8", True, None]
NOT_PROBABILITIES = [-0.1, 1.0, 1.5, "0.1", None, math.nan]
NOT_POSITIVE_NUMBERS = [0, -1.0, "1e4", None, math.nan, math.inf, True]
NOT_BOOLEANS = ["yes", 1, None]
NOT_NAMES = ["bogus", None, 3]


@st.composite
def broken_rope_parameters(draw, fields: dict):
    """A rope_parameters that a valid config with `fields` cannot take."""
    factor = {"factor": 2.0}
    return draw(
        st.sampled_from(
            [
                "linear",
                [("rope_type", "linear")],
                {"rope_type": "bogus", **factor},
                {"rope_type": "linear"},
                {"rope_type": "linear", "factor": 0.5},
                {"rope_type": "linear", "factor": "2"},
                {"rope_type": "linear", "factor": math.nan},
                {"rope_type": "linear", "factor": math.inf},
                {"rope_type": "dynamic", "factor": True},
                {"rope_type": "linear", "beta_fast": 32, **factor},
                {"rope_type": "yarn", "original_max_position_embeddings": 0, **factor},
                {"rope_type": "yarn", "original_max_position_embeddings": True, **factor},
                {"rope_type": "yarn", "original_max_position_embeddings": 8.0, **factor},
                {"rope_type": "yarn", "beta_fast": 1.0, "beta_slow": 4.0, **factor},
                {"rope_type": "yarn", "beta_fast": "32", **factor},
                {"rope_type": "yarn", "beta_fast": -5.0, "beta_slow": -10.0, **factor},
                {"rope_type": "yarn", "beta_slow": math.nan, **factor},
                {"rope_type": "yarn", "attention_factor": 0.0, **factor},
                {"rope_type": "yarn", "attention_factor": "1", **factor},
                {"rope_type": "yarn", "mscale": "1", "mscale_all_dim": 1.0, **factor},
                {"rope_type": "yarn", "mscale": -1.0, **factor},
                {"rope_type": "yarn", "mscale_all_dim": math.inf, **factor},
                {"rope_type": "yarn", "truncate": "no", **factor},
                *({"rope_type": "default", "rope_theta": theta} for theta in NOT_POSITIVE_NUMBERS),
            ]
        )
    )


@st.composite
def invalid_configs(draw):
    """(valid fields, the field to break, its bad value): every checked field of the config."""
    fields = draw(config_fields())
    head_dim = fields["hidden_size"] // fields["num_attention_heads"]
    choices = {
        **{
            name: st.sampled_from(NOT_INTEGERS)
            for name in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
            )
        },
        "embedding_size": st.sampled_from([value for value in NOT_INTEGERS if value is not None]),
        "type_vocab_size": st.sampled_from([-1, 1.5, "2", None]),
        "hidden_dropout_prob": st.sampled_from(NOT_PROBABILITIES),
        "attention_probs_dropout_prob": st.sampled_from(NOT_PROBABILITIES),
        "layer_norm_eps": st.sampled_from([-1e-12, "1e-12", None, math.nan, math.inf]),
        "initializer_range": st.sampled_from([-0.02, "0.02", None, math.nan, math.inf]),
        "rotary_dim": st.sampled_from([0, -2, 2.0, "2", True, head_dim + 1 + head_dim % 2, 2 * head_dim + 2]),
        "partial_rotary_factor": st.sampled_from([0.0, -0.5, 1.5, "0.5", math.nan, True]),
        "rope_parameters": broken_rope_parameters(fields),
        "pad_token_id": st.sampled_from([fields["vocab_size"], -1, "0", 1.5, True]),
        "question_token_id": st.sampled_from([fields["vocab_size"], -1, "0", 1.5, True]),
        **{
            name: st.sampled_from(NOT_NAMES)
            for name in (
                "rope_layout",
                "norm_type",
                "attention_kernel",
                "summary_type",
                "unpad_inputs",
                "qa_head",
                "hidden_act",
                "pooler_activation",
            )
        },
        **{
            name: st.sampled_from(NOT_BOOLEANS)
            for name in ("use_bias", "rotary_value", "add_pooling_layer", "bidirectional_prompt")
        },
        "add_cross_attention": st.just(True),
    }
    name = draw(st.sampled_from(sorted(choices)))
    value = draw(choices[name])
    if name == "num_attention_heads" and draw(st.booleans()):
        value = fields["hidden_size"] + 1  # divides nothing it should
    if name == "rotary_dim":
        fields.pop("partial_rotary_factor", None)
    if name == "partial_rotary_factor" and head_dim % 2 == 0:
        fields.pop("rotary_dim", None)  # an odd head needs its even rotary_dim (which a bad factor then contradicts)
    return fields, name, value


@examples(300)
@given(case=invalid_configs(), after_creation=st.booleans())
def test_invalid_config_field_is_refused_by_name(case, after_creation):
    """A bad value is refused with a ValueError or TypeError naming the field, whether given to the constructor or
    set on a valid config before a model is built from it (fields may change in between)."""
    fields, name, value = case
    with pytest.raises((ValueError, TypeError), match=rf"\b{name}\b"):
        if after_creation:
            config = RoFormerConfig(**fields)
            setattr(config, name, value)
            RoFormerModel(config)
        else:
            RoFormerConfig(**{**fields, name: value})


@st.composite
def invalid_inputs(draw):
    """(valid fields, a valid batch, the argument to break, the broken inputs)."""
    fields = draw(config_fields())
    fields["add_pooling_layer"] = False
    batch = draw(batches(fields))
    rows, width = batch["input_ids"].shape
    ids = batch["input_ids"]
    embeds = torch.zeros(rows, width, fields.get("embedding_size", fields["hidden_size"]))
    breakages = {
        "input_ids": [
            ids.clone().index_fill_(1, torch.tensor([0]), fields["vocab_size"]),
            ids.clone().index_fill_(1, torch.tensor([width - 1]), -1),
            ids.float(),
            ids.bool(),
            ids[0],
            ids[:, None],
            ids.tolist(),
            ids[:0],
        ],
        "token_type_ids": [
            torch.full_like(ids, max(fields["type_vocab_size"], 1)),
            torch.full_like(ids, -1),
            torch.zeros(rows, width + 1, dtype=torch.long),
            torch.zeros(rows + 1, width, dtype=torch.long),
            torch.zeros(rows, width),
            torch.zeros(rows, width, dtype=torch.long).tolist(),
        ],
        "position_ids": [
            torch.arange(width + 1)[None],
            torch.arange(width)[None, None],
            torch.arange(width).expand(rows + 1, width),
            torch.arange(width, dtype=torch.float32)[None],
        ],
        "attention_mask": [
            torch.ones(rows, width + 1, dtype=torch.long),
            torch.ones(rows + 1, width, dtype=torch.long),
            torch.ones(rows, width, width),
            torch.ones(rows, 1, width, width + 1),
            torch.ones(rows + 1, 1, width, width),
            torch.ones(rows, 1, width + 1, width),
            batch["attention_mask"].tolist(),
        ],
        "inputs_embeds": [
            embeds[..., :-1],
            embeds[0],
            embeds.long(),
            embeds.double(),
            embeds[:0],
        ],
        "input_ids or inputs_embeds": [None, "both"],
    }
    name = draw(st.sampled_from(sorted(breakages)))
    value = draw(st.sampled_from(breakages[name]))
    inputs = dict(batch)
    if name == "inputs_embeds":
        del inputs["input_ids"]
        inputs["attention_mask"] = inputs["attention_mask"][: len(value)]
    elif name == "input_ids or inputs_embeds":
        if value is None:
            del inputs["input_ids"]
        else:
            inputs["inputs_embeds"] = embeds
        return fields, name, inputs
    elif name == "input_ids" and isinstance(value, torch.Tensor) and value.dim() == 2 and not len(value):
        inputs["attention_mask"] = inputs["attention_mask"][:0]
    inputs[name] = value
    return fields, name, inputs


@examples(250)
@given(case=invalid_inputs(), unpad_inputs=st.sampled_from(["never", "always"]))
def test_invalid_input_is_refused_by_name(case, unpad_inputs):
    """A bad argument (ids out of range, a wrong dtype or type, a mismatched shape, an empty batch) is a ValueError or
    TypeError naming it, on the padded and the padding-free path, never an error from inside torch."""
    fields, name, inputs = case
    model = build(fields)
    with pytest.raises((ValueError, TypeError), match=name):
        run(model, "sdpa", unpad_inputs, **inputs)


# ---------------------------------------------------------------------------------------------------------------------
# Regressions: the bugs the properties above found, each pinned by one example
# ---------------------------------------------------------------------------------------------------------------------


def regression_fields(**overrides) -> dict:
    """The shared tiny RoFormer (hidden 32, 4 heads) with a table of 8 positions and weights large enough that a
    wrong rotation moves outputs far past TOLERANCE."""
    return {**tiny_fields("posformers-roformer"), "max_position_embeddings": 8, "initializer_range": 0.5, **overrides}


@pytest.mark.parametrize("start", [100, -3], ids=["past-the-table", "negative"])
def test_position_ids_outside_the_cached_table_are_rotated(start):
    """position_ids past max_position_embeddings on a short input used to index the cached table (IndexError), and
    negative ones silently wrapped to its end; now they rotate as positions, so a constant shift changes nothing."""
    model = build(regression_fields())
    input_ids = torch.randint(1, 99, (2, 5), generator=torch.Generator().manual_seed(0))
    expected = run(model, "sdpa", "never", input_ids=input_ids).last_hidden_state
    position_ids = torch.arange(start, start + 5)[None]
    actual = run(model, "sdpa", "never", input_ids=input_ids, position_ids=position_ids).last_hidden_state
    assert_close(actual, expected, f"positions from {start}")


@pytest.mark.parametrize("unpad_inputs", ["never", "always"])
def test_one_padded_row_with_positions_counting_through_zero_is_not_a_flattened_batch(unpad_inputs):
    """position_ids -5, -4, ..., 2 on one padded row were read as a flattened batch (a 0 after the first token) and
    refused for its padding; a flattened batch restarts at 0, it does not count up through it."""
    model = build(regression_fields())
    input_ids = torch.randint(1, 99, (1, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 5 + [0] * 3])
    expected = run(model, "sdpa", unpad_inputs, input_ids=input_ids, attention_mask=mask).last_hidden_state
    position_ids = torch.arange(-5, 3)[None]
    actual = run(model, "sdpa", unpad_inputs, input_ids=input_ids, attention_mask=mask, position_ids=position_ids)
    assert_close(actual.last_hidden_state[:, :5], expected[:, :5], "positions from -5")


@pytest.mark.parametrize("unpad_inputs", ["never", "always"])
@pytest.mark.parametrize(("length", "padding"), [(12, 5), (6, 4)], ids=["past-the-table", "padding-past-the-table"])
def test_dynamic_ntk_scaling_does_not_depend_on_padding(length, padding, unpad_inputs):
    """Dynamic NTK scaling sized its base for the padded width: 5 padding columns after 12 real tokens (past
    max_position_embeddings=8) changed every real token's output by ~0.2. It now reads the longest real sequence,
    while padded positions past the table (6 real tokens padded to 10) are still computed, not looked up."""
    model = build(regression_fields(rope_parameters={"rope_type": "dynamic", "factor": 4.0}))
    input_ids = torch.randint(1, 99, (1, length), generator=torch.Generator().manual_seed(0))
    expected = run(model, "eager", "never", input_ids=input_ids).last_hidden_state
    padded = torch.nn.functional.pad(input_ids, (0, padding))
    mask = (padded != 0).long()
    actual = run(model, "eager", unpad_inputs, input_ids=padded, attention_mask=mask).last_hidden_state
    assert_close(actual[:, :length], expected, "padded")


def test_rms_norm_lm_head_with_factorised_embeddings_is_refused():
    """RoFormer-v2's LM head is the tied word embeddings alone: with embedding_size != hidden_size it failed at the
    first forward pass with a shape error from inside F.linear."""
    config = RoFormerConfig(**regression_fields(norm_type="rms_norm", embedding_size=8))
    with pytest.raises(ValueError, match=r"RoFormerConfig\.embedding_size \(8\) must equal hidden_size \(32\)"):
        RoFormerForMaskedLM(config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # bare TypeErrors from a comparison or math.log, naming nothing
        (
            {"rope_parameters": {"rope_theta": "1e4"}},
            r"RoFormerConfig\.rope_parameters\['rope_theta'\] must be positive",
        ),
        ({"partial_rotary_factor": "0.5"}, r"RoFormerConfig\.partial_rotary_factor must be in \(0, 1\]"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_fast": "32"}},
            r"rope_parameters\['beta_fast'\]",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mscale": "1"}}, r"rope_parameters\['mscale'\]"),
        # "math domain error" from inside the YaRN ramp
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_slow": -1.0}},
            r"rope_parameters\['beta_slow'\]",
        ),
        # accepted, then NaN in every output
        ({"rope_parameters": {"rope_theta": math.nan}}, r"rope_parameters\['rope_theta'\] must be positive"),
        ({"layer_norm_eps": -1.0}, r"RoFormerConfig\.layer_norm_eps must be positive and finite"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": math.nan}},
            r"rope_parameters\['factor'\] must be a number",
        ),
        # accepted silently
        ({"use_bias": "no"}, r"RoFormerConfig\.use_bias must be True or False"),
        ({"rotary_value": 1}, r"RoFormerConfig\.rotary_value must be True or False"),
        ({"partial_rotary_factor": True}, r"RoFormerConfig\.partial_rotary_factor must be in"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "attention_factor": -1.0}}, r"'attention_factor'\]"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "truncate": "no"}}, r"rope_parameters\['truncate'\]"),
        # a KeyError or a RuntimeError only when the model was built
        ({"hidden_act": "swish-ish"}, r"RoFormerConfig\.hidden_act must be the name of an activation"),
        ({"initializer_range": -0.02}, r"RoFormerConfig\.initializer_range must be a number >= 0"),
        # named embedding_size, which defaults to hidden_size, instead of the field that was given
        ({"hidden_size": "16"}, r"RoFormerConfig\.hidden_size must be a positive integer"),
    ],
)
def test_config_values_that_used_to_fail_late_or_silently_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        RoFormerConfig(**regression_fields(**overrides))


IDS = torch.ones(2, 5, dtype=torch.long)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        # errors from inside nn.Embedding, a LayerNorm or sdpa, or an AttributeError
        ({"input_ids": IDS.float()}, r"input_ids must hold integers"),
        ({"input_ids": IDS.tolist()}, r"input_ids must be a torch.Tensor, got list"),
        ({"input_ids": IDS, "token_type_ids": torch.zeros(2, 5)}, r"token_type_ids must hold integers"),
        ({"input_ids": IDS, "attention_mask": [[1] * 5] * 2}, r"attention_mask must be a torch.Tensor"),
        ({"inputs_embeds": torch.zeros(2, 5, 32, dtype=torch.float64)}, r"inputs_embeds must have the model's dtype"),
        ({"input_ids": IDS, "attention_mask": torch.ones(2, 1, 5, 4)}, r"a 4D attention_mask must have shape"),
        ({"input_ids": IDS, "attention_mask": torch.ones(3, 1, 5, 5)}, r"a 4D attention_mask must have shape"),
        ({"input_ids": IDS, "attention_mask": torch.ones(2, 1, 5, 6)}, r"kv_len=5\), got \(2, 1, 5, 6\)"),
        ({"input_ids": IDS[:0]}, r"input_ids holds an empty batch"),
        # accepted silently: integer embeddings, fractional positions indexing the table
        ({"inputs_embeds": torch.zeros(2, 5, 32, dtype=torch.long)}, r"inputs_embeds must have the model's dtype"),
        ({"input_ids": IDS, "position_ids": torch.arange(5.0)[None]}, r"position_ids must hold integers"),
    ],
)
def test_inputs_that_used_to_fail_inside_torch_are_refused_by_name(inputs, message):
    model = build(regression_fields())
    with pytest.raises((ValueError, TypeError), match=message):
        model(**inputs)


def test_inputs_embeds_of_another_dtype_are_taken_under_autocast():
    """Under autocast, bfloat16 embeddings (say, from another autocast computation) into a float32 model are not
    refused: autocast casts what enters each matmul, and the result is that of the same values in float32."""
    model = build(regression_fields())
    embeds = torch.randn(2, 5, 32).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        mixed = model(inputs_embeds=embeds).last_hidden_state
        same = model(inputs_embeds=embeds.float()).last_hidden_state
    assert torch.equal(mixed, same)
