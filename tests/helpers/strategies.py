"""Hypothesis strategies of the three models' valid configs and inputs, and how a property test runs each model.

`STRATEGIES[name]` is what tests/models/test_contract_properties.py states its properties over (every model the same
way); tests/models/test_properties_<model>.py draw from the same strategies for the properties only that model has.
Every option a config exposes is drawn at tiny sizes (hidden <= 32, <= 2 layers), and the batches are right-padded
with rows of padding only and lengths beyond each model's position tables, spans and blocks.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import torch
from hypothesis import strategies as st

from posformers import DebertaConfig, LittleBirdConfig
from posformers.configuration_common import UNPAD_MODES
from posformers.configuration_deberta import parse_pos_att_type

from .registry import REGISTRY

# ---------------------------------------------------------------------------------------------------------------------
# RoFormer
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
def roformer_fields(draw, decoder: bool = False) -> dict:
    """Keyword arguments of a valid tiny RoFormerConfig (hidden <= 32, <= 2 layers), every option drawn: sizes,
    heads, head dimensions, rotary dimension or fraction, layout, theta, every rope_parameters type and its keys, v2
    norm and bias, linear attention, rotary values, factorised embeddings, token types, pooler, decoder and
    bidirectional_prompt."""
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
def roformer_batches(draw, fields: dict) -> dict:
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


def dynamic_scaling(fields: dict) -> bool:
    """RoFormer with dynamic NTK scaling: its frequencies depend on the batch's longest sequence (as in
    transformers)."""
    return fields.get("rope_parameters", {}).get("rope_type") == "dynamic"


# ---------------------------------------------------------------------------------------------------------------------
# DeBERTa
# ---------------------------------------------------------------------------------------------------------------------

DEBERTA_ACTIVATIONS = ["gelu", "relu", "tanh", "gelu_new", "silu"]
# The heads DeBERTa's cases draw.
DEBERTA_HEADS = (
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForPreTraining",
    "AutoModelForTokenClassification",
    "AutoModelForSequenceClassification",
    "AutoModelForQuestionAnswering",
)


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
def deberta_fields(draw, head: str = "AutoModel") -> dict:
    """Keyword arguments of a valid tiny DebertaConfig for `head`, every option drawn: heads and head sizes, relative
    attention on or off, position buckets (none, 0, or 2 up to the largest the clipping distance allows),
    max_relative_positions (default, or 1 to beyond the inputs), pos_att_type (any subset, in any order, in every
    spelling), share_att_key, norm_rel_ebd, position_biased_input, the v1 fused and v2/v3 separate projection
    layouts, the v2 convolution (kernel, activation, groups), embedding_size, token types, the pooler, the Enhanced
    Mask Decoder's steps, tied embeddings, pad ids."""
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
        hidden_act=draw(st.sampled_from(DEBERTA_ACTIVATIONS)),
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
        clip_relative_positions=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()),
        pooler_hidden_act=draw(st.sampled_from(DEBERTA_ACTIVATIONS)),
        pooler_dropout=draw(st.sampled_from([0, 0.2])),
        cls_dropout=draw(st.sampled_from([None, 0.0, 0.3])),
    )
    if not (relative and parse_pos_att_type(fields["pos_att_type"])):
        fields["position_biased_input"] = True  # a DeBERTa without any position information is refused
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
            conv_act=draw(st.sampled_from(DEBERTA_ACTIVATIONS)),
            conv_groups=draw(st.sampled_from(divisors)),
        )
    if draw(st.booleans()):
        fields["embedding_size"] = draw(st.integers(1, 32))
    if draw(st.booleans()):
        fields["pooler_hidden_size"] = draw(st.integers(1, 32))
    masked_lm = head == "AutoModelForMaskedLM"
    if masked_lm and fields.get("embedding_size", hidden) != hidden and not fields["position_biased_input"]:
        fields["emd_steps"] = 0  # the EMD adds hidden-wide position embeddings (refused otherwise)
    if head in ("AutoModelForSequenceClassification", "AutoModelForTokenClassification"):
        fields["num_labels"] = draw(st.integers(1, 3))
    if head == "AutoModelForQuestionAnswering":
        fields["num_labels"] = 2
    return fields


def reads_absolute_positions(fields: dict, head: str) -> bool:
    """Whether DeBERTa reads its absolute position table: input bias, or the MLM head's Enhanced Mask Decoder."""
    config = DebertaConfig(**fields)
    return config.position_biased_input or (head == "AutoModelForMaskedLM" and config.uses_emd)


def position_limit(model) -> int | None:
    """The size of the absolute position table `model`'s embeddings read, None when they read none."""
    reads_positions = hasattr(model.base_model.embeddings, "position_embeddings")
    return model.config.max_position_embeddings if reads_positions else None


@st.composite
def deberta_batches(draw, fields: dict, head: str, rows: tuple[int, int] = (1, 3)) -> dict:
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


# ---------------------------------------------------------------------------------------------------------------------
# LittleBird
# ---------------------------------------------------------------------------------------------------------------------

LITTLEBIRD_ACTIVATIONS = ("gelu", "relu", "gelu_new", "silu", "tanh", "quick_gelu", "mish", "gelu_pytorch_tanh")


@st.composite
def littlebird_fields(draw) -> dict:
    """The fields of a tiny valid LittleBirdConfig: hidden <= 32 split over 1-4 heads, 1-2 layers, blocks of 1-8 tokens,
    1-10 pack states (fewer, as many as and more than a block), a global prefix up to the block size, every BiALiBi
    init form (the name, a number, a number as a string), token types or none, a padding id or none, any unpad mode."""
    heads = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([d for d in (1, 2, 3, 4, 8) if heads * d <= 32]))
    block_size = draw(st.integers(1, 8))
    vocab_size = draw(st.integers(2, 40))
    bialibi_init = draw(
        st.one_of(
            st.just("alibi"),
            st.floats(0.0, 2.0),
            st.integers(0, 2),
            st.floats(0.0, 2.0).map(str),
        )
    )
    return dict(
        vocab_size=vocab_size,
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_hidden_layers=draw(st.integers(1, 2)),
        intermediate_size=draw(st.integers(1, 40)),
        hidden_act=draw(st.sampled_from(LITTLEBIRD_ACTIVATIONS)),
        hidden_dropout_prob=draw(st.sampled_from([0.0, 0.1, 0.5])),
        attention_probs_dropout_prob=draw(st.sampled_from([0.0, 0.1, 0.5])),
        type_vocab_size=draw(st.integers(0, 3)),
        initializer_range=draw(st.sampled_from([0.0, 0.02, 0.5])),
        layer_norm_eps=draw(st.sampled_from([1e-12, 1e-5, 0.1])),
        pad_token_id=draw(st.one_of(st.none(), st.integers(0, vocab_size - 1))),
        block_size=block_size,
        pack_length=draw(st.integers(1, 10)),
        bialibi_init=bialibi_init,
        global_prefix_length=draw(st.integers(1, block_size)),
        unpad_inputs=draw(st.sampled_from(UNPAD_MODES)),
        tie_word_embeddings=draw(st.booleans()),
    )


@st.composite
def littlebird_batches(draw, config: LittleBirdConfig, holes: bool = False) -> dict:
    """A right-padded batch for `config`: 1-4 rows, seq_len from 1 to 8 blocks and a part (12 blocks and a part of a
    block of 1, 40 tokens at most), each row 0 (all padding) to seq_len real tokens; token types, an attention mask
    and position_ids when drawn. With `holes`, padding may also sit between real tokens after the first (Padding
    Insertion)."""
    rows = draw(st.integers(1, 4))
    seq_len = draw(st.integers(1, min(max(8 * config.block_size, 12) + 3, 40)))
    lengths = draw(st.lists(st.integers(0, seq_len), min_size=rows, max_size=rows))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (rows, seq_len), generator=generator)
    attention_mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    if holes:
        inserted = torch.rand(rows, seq_len, generator=generator) < draw(st.sampled_from([0.2, 0.5]))
        inserted[:, 0] = False
        attention_mask = attention_mask.masked_fill(inserted, 0)
    batch = {"input_ids": input_ids}
    if draw(st.booleans()) or not bool(attention_mask.all()):
        batch["attention_mask"] = attention_mask
    if config.type_vocab_size > 0 and draw(st.booleans()):
        batch["token_type_ids"] = torch.randint(0, config.type_vocab_size, (rows, seq_len), generator=generator)
    if draw(st.booleans()):
        batch["position_ids"] = torch.arange(seq_len).expand(draw(st.sampled_from([1, rows])), -1)
    return batch


# ---------------------------------------------------------------------------------------------------------------------
# Values no config field of their kind takes
# ---------------------------------------------------------------------------------------------------------------------

NOT_A_NUMBER = st.one_of(st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
# Negative floats stop short of -0.0, which compares equal to 0.0 and is as valid.
NEGATIVE = st.floats(max_value=-1e-300)
# A float is never a valid size, not even 4.0; nor a number in a string.
BAD_POSITIVE_INTEGER = st.one_of(st.integers(max_value=0), st.floats(), NOT_A_NUMBER, st.sampled_from(["8", [4]]))
BAD_PROBABILITY = st.one_of(NEGATIVE, st.floats(min_value=1.0), st.just(math.nan), NOT_A_NUMBER, st.just("0.1"))
BAD_EPSILON = st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf), NOT_A_NUMBER, st.just("1e-7"))
BAD_RANGE = st.one_of(NEGATIVE, st.just(math.nan), st.just(math.inf), NOT_A_NUMBER, st.just("0.02"))


# ---------------------------------------------------------------------------------------------------------------------
# The three as one table
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """A drawn model and input: the head (an Auto class name), the config's fields, the seed of its weights, a batch."""

    auto_name: str
    fields: dict
    seed: int
    batch: dict


@dataclasses.dataclass(frozen=True)
class ModelStrategies:
    """How the property tests draw and run one model.

    cases(): a strategy of `Case`s. examples: how many examples each property draws for this model.
    invalid_inputs(model, batch): this model's own corruptions beyond the shared ones, {kind: (batch -> broken
    inputs, what the error names)}. dtypes: every output is checked finite in each, the last is compared at
    `tolerance`. per_key_attentions: output_attentions come as (batch, heads, L, L) weights over keys.
    """

    name: str
    cases: Callable
    examples: dict[str, int]
    invalid_inputs: Callable
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    tolerance: float = 1e-4
    per_key_attentions: bool = True

    @property
    def backends(self) -> tuple[str, ...]:
        """The attention implementations that must agree, the registry's (`ModelEntry.attn_implementations`)."""
        return REGISTRY[self.name].attn_implementations

    def build(self, case: Case, **overrides):
        """The case's model, in eval mode."""
        return build_model(self.name, case.fields, case.seed, case.auto_name, **overrides)


def build_model(name: str, fields: dict, seed: int = 0, auto_name: str = "AutoModel", **overrides):
    """A registry model's head built from `fields` (and `overrides`) with seed `seed`, prepared as the registry
    prepares it (LittleBird: distinct slopes), in eval mode."""
    entry = REGISTRY[name]
    torch.manual_seed(seed)
    model = entry.heads[auto_name](entry.config_class(**{**fields, **overrides})).eval()
    if entry.prepare is not None:
        entry.prepare(model, seed)
    return model


@st.composite
def roformer_cases(draw):
    fields = draw(roformer_fields())
    return Case("AutoModel", fields, 0, draw(roformer_batches(fields)))


@st.composite
def deberta_cases(draw, heads=DEBERTA_HEADS):
    head = draw(st.sampled_from(heads))
    fields = draw(deberta_fields(head))
    return Case(head, fields, 0, draw(deberta_batches(fields, head)))


@st.composite
def littlebird_cases(draw):
    fields = draw(littlebird_fields())
    return Case("AutoModel", fields, draw(st.integers(0, 2**16)), draw(littlebird_batches(LittleBirdConfig(**fields))))


def roformer_invalid_inputs(model, batch: dict) -> dict:
    """RoFormer takes a (batch, 1, q_len, kv_len) mask, and no (batch, L, L) one."""
    rows, width = batch["input_ids"].shape
    masks = [
        (rows, width, width),
        (rows, 1, width, width + 1),
        (rows + 1, 1, width, width),
        (rows, 1, width + 1, width),
    ]
    return {
        f"attention_mask of shape {shape}": (replaced(attention_mask=torch.ones(shape)), "attention_mask")
        for shape in masks
    }


def deberta_invalid_inputs(model, batch: dict) -> dict:
    """DeBERTa takes a (batch, L, L) mask, and no 4D one; where it reads its absolute position table (input bias, or
    the masked-LM head's Enhanced Mask Decoder), position_ids must index it."""
    rows, width = batch["input_ids"].shape
    table = {
        "a 4D attention_mask": (replaced(attention_mask=torch.ones(rows, 1, width, width)), "attention_mask"),
        "attention_mask of shape (batch, L, L + 1)": (
            replaced(attention_mask=torch.ones(rows, width, width + 1)),
            "attention_mask",
        ),
    }
    limit = position_limit(model)
    for position in (limit, -1) if limit else ():
        table[f"position_ids holding {position}"] = (
            replaced(position_ids=torch.full((rows, width), position)),
            "position_ids",
        )
    return table


def littlebird_invalid_inputs(model, batch: dict) -> dict:
    """LittleBird reads position_ids only as the token indices, and needs its first token real."""
    rows, width = batch["input_ids"].shape
    table = {
        "position_ids that are not the token indices": (
            replaced(position_ids=torch.arange(width).expand(rows, -1) + 1),
            "position_ids",
        ),
    }
    if width > 1:  # a padded first token before a real one
        table["left padding"] = (
            replaced(attention_mask=torch.ones(rows, width).index_fill_(1, torch.tensor([0]), 0)),
            "attention_mask",
        )
    return table


def replaced(**changes) -> Callable[[dict], dict]:
    """A corruption: the batch with `changes`."""
    return lambda batch: {**batch, **changes}


STRATEGIES = {
    "roformer": ModelStrategies(
        "roformer",
        roformer_cases,
        {"alone": 250, "inputs_embeds": 60, "gradients": 60, "invalid_input": 250, "invalid_config": 150},
        roformer_invalid_inputs,
    ),
    "deberta": ModelStrategies(
        "deberta",
        deberta_cases,
        {"alone": 120, "inputs_embeds": 40, "gradients": 40, "invalid_input": 120, "invalid_config": 75},
        deberta_invalid_inputs,
    ),
    # LittleBird's paths agree to roundoff in float64, where they are compared (test_properties_littlebird.py says
    # how closely).
    "littlebird": ModelStrategies(
        "littlebird",
        littlebird_cases,
        {"alone": 60, "inputs_embeds": 60, "gradients": 40, "invalid_input": 100, "invalid_config": 75},
        littlebird_invalid_inputs,
        dtypes=(torch.float32, torch.float64),
        tolerance=1e-9,
        per_key_attentions=False,
    ),
}


def run(model, implementation: str, unpad_inputs: str, batch: dict | None = None, grad: bool = False, **kwargs):
    """`model(**batch, **kwargs)` with an attention implementation and padding-free mode, with or without autograd,
    warnings (RoFormer's positions beyond its table, expected here) silenced."""
    model.set_attn_implementation(implementation)
    model.config.unpad_inputs = unpad_inputs
    with torch.set_grad_enabled(grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(**(batch or {}), **kwargs)


def real_mask(batch: dict) -> torch.Tensor:
    """(B, L) bool: the real tokens of a batch (all of them without an attention mask)."""
    if "attention_mask" in batch:
        return batch["attention_mask"].bool()
    ids = batch["input_ids"] if "input_ids" in batch else batch["inputs_embeds"][..., 0]
    return torch.ones(ids.shape, dtype=torch.bool)


def row(batch: dict, index: int, length: int) -> dict:
    """Row `index` of a batch cut to its real tokens, as a batch of one without an attention mask (a broadcast (1, L)
    input is cut the same way)."""
    alone = {}
    for key, value in batch.items():
        if key != "attention_mask":
            start = min(index, value.shape[0] - 1)
            alone[key] = value[start : start + 1, :length]
    return alone
