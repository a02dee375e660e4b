"""DeBERTa: parity with transformers' DeBERTa (v1) and DeBERTa-v2 (v2, v3), the Enhanced Mask Decoder and the
disentangled attention against step-by-step references, backends, robustness, official checkpoints and the Hub."""

import json
import logging
import math
import sys

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.modeling import (
    check_activation_checkpointing,
    check_preset_overrides,
    make_batch,
    max_diff,
    reload_as,
    tiny_config,
    tiny_fields,
)
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining
from transformers.testing_utils import CaptureLogger

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
from posformers.configuration_deberta import AUTO_MAP, OFFICIAL_DEFAULTS, PRESETS
from posformers.modeling_deberta import LEGACY_MLM_KEY_MAPPING, log_bucket_position, relative_positions

TINY = tiny_fields(DebertaConfig.model_type)
TOL = 1e-5

# Architectures as transformers configures them: (transformers class prefix, config fields).
VARIANTS = {
    "v1": ("Deberta", dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=64)),
    "v1-absolute": (
        "Deberta",
        dict(relative_attention=True, pos_att_type="c2p|p2c", position_biased_input=True, type_vocab_size=2),
    ),
    "v2-conv": (
        "DebertaV2",
        dict(
            relative_attention=True,
            pos_att_type="p2c|c2p",
            position_buckets=32,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
            conv_kernel_size=3,
            conv_act="gelu",
        ),
    ),
    "v3": (
        "DebertaV2",
        dict(
            relative_attention=True,
            pos_att_type="p2c|c2p",
            position_buckets=32,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
        ),
    ),
    "v2-c2p-unshared": (
        "DebertaV2",
        dict(
            relative_attention=True,
            pos_att_type="c2p",
            max_relative_positions=40,
            position_biased_input=True,
            type_vocab_size=2,
        ),
    ),
    "v2-p2c-embedding-size": (
        "DebertaV2",
        dict(
            relative_attention=True,
            pos_att_type="p2c",
            position_buckets=16,
            position_biased_input=False,
            embedding_size=24,
            conv_kernel_size=5,
            conv_groups=4,
        ),
    ),
    # no relative attention: BERT-like, but the official scale still counts pos_att_type (sqrt(3 d) here)
    "absolute-only": (
        "DebertaV2",
        dict(relative_attention=False, pos_att_type="c2p|p2c", position_biased_input=True, type_vocab_size=2),
    ),
}
LENGTHS = (16, 300)  # below and above the buckets' exact window (16 and 8 distances) and v1's clipping (64, 40)


def ours_variant(variant: str, **overrides) -> DebertaConfig:
    """Our config for a VARIANTS entry: what loading transformers' saved config.json would give."""
    prefix, fields = VARIANTS[variant]
    official = OFFICIAL_DEFAULTS["deberta" if prefix == "Deberta" else "deberta-v2"]
    return DebertaConfig(**{**official, **TINY, **fields, **overrides})


def reference_model(variant: str, head: str, seq_len: int, **overrides):
    prefix, fields = VARIANTS[variant]
    config = getattr(transformers, f"{prefix}Config")(**{**TINY, **fields, **overrides})
    torch.manual_seed(0)
    return getattr(transformers, prefix + head)(config).eval()


# ---------------------------------------------------------------------------------------------------------------------
# Parity with transformers' DebertaModel / DebertaV2Model and their heads
# ---------------------------------------------------------------------------------------------------------------------

HEADS = [
    ("Model", DebertaModel, ("last_hidden_state",), {}),
    ("ForSequenceClassification", DebertaForSequenceClassification, ("logits",), {"num_labels": 3}),
    ("ForTokenClassification", DebertaForTokenClassification, ("logits",), {"num_labels": 5}),
    ("ForQuestionAnswering", DebertaForQuestionAnswering, ("start_logits", "end_logits"), {}),
    # transformers' DeBERTa has no Enhanced Mask Decoder: its non-legacy head equals ours with the EMD off
    ("ForMaskedLM", DebertaForMaskedLM, ("logits",), {"legacy": False}),
]


# transformers' non-legacy MLM head multiplies hidden_size-wide states by the embedding_size-wide word embeddings, so
# it cannot run with embedding_size != hidden_size (ours projects to embedding_size first, as the official head does).
PARITY_CASES = [
    pytest.param(head, variant, id=f"{head[0]}-{variant}")
    for head in HEADS
    for variant in VARIANTS
    if not (head[0] == "ForMaskedLM" and "embedding_size" in VARIANTS[variant][1])
]


def head_labels(head: str, input_ids, attention_mask) -> dict:
    generator = torch.Generator().manual_seed(1)
    batch, seq_len = input_ids.shape
    if head == "ForSequenceClassification":
        return {"labels": torch.randint(0, 3, (batch,), generator=generator)}
    if head == "ForTokenClassification":
        return {
            "labels": torch.randint(0, 5, (batch, seq_len), generator=generator).masked_fill(attention_mask == 0, -100)
        }
    if head == "ForMaskedLM":
        ignored = (torch.rand(input_ids.shape, generator=generator) < 0.7) | (attention_mask == 0)
        return {"labels": input_ids.masked_fill(ignored, -100)}
    return {}  # QA's loss also reads padded positions, which each implementation fills differently: see the QA test


@pytest.mark.parametrize("seq_len", LENGTHS)
@pytest.mark.parametrize(("head_case", "variant"), PARITY_CASES)
def test_parity_with_transformers(head_case, variant, seq_len, tmp_path):
    head, our_class, fields, head_kwargs = head_case
    reference = reference_model(variant, head, seq_len, **head_kwargs)
    ours = reload_as(reference, our_class, tmp_path, **({"emd_steps": 0} if head == "ForMaskedLM" else {}))
    assert ours.config.projection_layout == ("fused" if variant.startswith("v1") else "separate")
    input_ids, attention_mask, token_type_ids = make_batch(seq_len=seq_len, pad_from=(None, seq_len - 6, 5))
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if ours.config.type_vocab_size:
        inputs["token_type_ids"] = token_type_ids
    inputs.update(head_labels(head, input_ids, attention_mask))
    with torch.no_grad():
        expected, actual = reference(**inputs), ours(**inputs)
    for field in fields:
        diff = max_diff(getattr(expected, field), getattr(actual, field), attention_mask)
        assert diff <= TOL, f"{variant} {head} L={seq_len} {field}: max abs diff {diff}"
    if "labels" in inputs:
        assert abs(expected.loss.item() - actual.loss.item()) <= TOL


@pytest.mark.parametrize("variant", ["v1", "v3"])
def test_transformers_legacy_mlm_head_loads_with_the_key_mapping(variant, tmp_path):
    reference = reference_model(variant, "ForMaskedLM", 17)  # legacy=True: transformers' default head
    with torch.no_grad():
        for parameter in reference.cls.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    reference.save_pretrained(tmp_path)
    ours, info = DebertaForMaskedLM.from_pretrained(
        tmp_path, key_mapping=LEGACY_MLM_KEY_MAPPING, emd_steps=0, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=attention_mask).logits
        actual = ours.eval()(input_ids, attention_mask=attention_mask).logits
    assert max_diff(expected, actual, attention_mask) <= TOL


def test_transformers_legacy_mlm_head_is_recognised_without_the_mapping(tmp_path, caplog):
    """The user's call: a masked LM saved by transformers' own class (legacy head), loaded as any other folder."""
    reference = reference_model("v3", "ForMaskedLM", 17)
    with torch.no_grad():
        for parameter in reference.cls.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    reference.save_pretrained(tmp_path)
    with caplog.at_level("WARNING"):
        ours, info = DebertaForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert ours.config.emd_steps == 0
    assert "legacy MLM head" in caplog.text
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=attention_mask).logits
        actual = ours.eval()(input_ids, attention_mask=attention_mask).logits
    assert max_diff(expected, actual, attention_mask) <= TOL


@pytest.mark.parametrize("variant", ["v1", "v3"])
def test_parity_question_answering_loss(variant, tmp_path):
    reference = reference_model(variant, "ForQuestionAnswering", 17)
    ours = reload_as(reference, DebertaForQuestionAnswering, tmp_path)
    input_ids, _, _ = make_batch(pad_from=(None, None, None))
    positions = dict(start_positions=torch.tensor([1, 3, 21]), end_positions=torch.tensor([2, 4, 0]))  # 21: ignored
    with torch.no_grad():
        expected, actual = reference(input_ids, **positions), ours(input_ids, **positions)
    assert abs(expected.loss.item() - actual.loss.item()) <= TOL


@pytest.mark.parametrize("seq_len", LENGTHS)
@pytest.mark.parametrize("variant", [v for v in VARIANTS if VARIANTS[v][0] == "DebertaV2"])
def test_parity_multiple_choice(variant, seq_len, tmp_path):
    reference = reference_model(variant, "ForMultipleChoice", seq_len)
    ours = reload_as(reference, DebertaForMultipleChoice, tmp_path)
    input_ids, attention_mask, _ = make_batch(batch=2, seq_len=seq_len, choices=3, pad_from=(None, 9))
    labels = torch.tensor([0, 2])
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=attention_mask, labels=labels)
        actual = ours(input_ids, attention_mask=attention_mask, labels=labels)
    assert max_diff(expected.logits, actual.logits) <= TOL
    assert abs(expected.loss.item() - actual.loss.item()) <= TOL


@pytest.mark.parametrize(
    "labels",
    [torch.tensor([0, 2, 1]), torch.tensor([0, -1, 2]), torch.tensor([[0.2, 0.3, 0.5], [1.0, 0, 0], [0, 0.5, 0.5]])],
    ids=["classes", "ignored-negative", "soft"],
)
def test_parity_sequence_classification_losses(labels, tmp_path):
    reference = reference_model("v3", "ForSequenceClassification", 17, num_labels=3)
    ours = reload_as(reference, DebertaForSequenceClassification, tmp_path)
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=attention_mask, labels=labels).loss
        actual = ours(input_ids, attention_mask=attention_mask, labels=labels).loss
    assert abs(expected.item() - actual.item()) <= TOL


@pytest.mark.parametrize("variant", ["v1", "v3"])
def test_parity_attentions_and_hidden_states(variant, tmp_path):
    reference = reference_model(variant, "ForMaskedLM", 17, legacy=False)
    ours = reload_as(reference, DebertaForMaskedLM, tmp_path, emd_steps=0)
    input_ids, _, _ = make_batch(pad_from=(None, None, None))
    labels = input_ids.masked_fill(torch.rand(input_ids.shape) < 0.5, -100)
    kwargs = dict(labels=labels, output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        expected, actual = reference(input_ids, **kwargs), ours(input_ids, **kwargs)
    assert abs(expected.loss.item() - actual.loss.item()) <= TOL
    assert len(actual.attentions) == len(expected.attentions) == 3
    assert len(actual.hidden_states) == len(expected.hidden_states) == 4
    for a, b in zip(expected.attentions + expected.hidden_states, actual.attentions + actual.hidden_states):
        assert max_diff(a, b) <= TOL


def test_relative_buckets_match_transformers_inside_max_position_and_the_official_clip_beyond():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    for buckets, max_position in [(32, 512), (256, 512), (64, 128), (16, 40), (256, 1024)]:
        distances = torch.arange(-(max_position - 1), max_position)
        assert torch.equal(
            log_bucket_position(distances, buckets, max_position),
            make_log_bucket_position(distances, buckets, max_position),
        )
        # Official `make_log_bucket_position` clips |d| to max_position - 1 first: the farthest bucket is k - 1.
        far = torch.tensor([-5 * max_position, -max_position, max_position, 5 * max_position])
        assert (
            log_bucket_position(far, buckets, max_position).tolist() == [1 - buckets, 1 - buckets] + [buckets - 1] * 2
        )


@pytest.mark.parametrize(
    ("buckets", "max_position"), [(32, 512), (256, 512), (64, 128), (16, 40), (33, 100), (255, 129), (511, 513)]
)
def test_unclipped_buckets_are_transformers_own_at_every_distance(buckets, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    # far past max_position, where transformers' buckets keep growing; odd sizes and 513 part from the Python log
    distances = torch.arange(-16 * max_position, 16 * max_position)
    expected = make_log_bucket_position(distances, buckets, max_position).long()
    assert torch.equal(log_bucket_position(distances, buckets, max_position, clip=False), expected)


# transformers' DeBERTa-v2 relative positions: (position_buckets, max_relative_positions, max_position_embeddings)
TRANSFORMERS_POSITIONS = {
    "v3-base": (256, -1, 512),
    "b32-max64": (32, 64, 512),
    "b33-max100": (33, 100, 512),
    "no-buckets-max20": (-1, 20, 512),
}


@pytest.mark.parametrize("fields", TRANSFORMERS_POSITIONS.values(), ids=TRANSFORMERS_POSITIONS.keys())
@pytest.mark.parametrize("seq_len", [40, 513, 1100])
def test_unclipped_rows_are_transformers_rows(fields, seq_len):
    """With clip_relative_positions=False each query/key pair reads the row transformers' DebertaV2 attention reads:
    `clamp(build_relative_position + span, 0, 2 span - 1)`, for c2p and p2c alike."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    buckets, max_relative, max_positions = fields
    config = tiny_config(
        DebertaConfig,
        position_buckets=buckets,
        max_relative_positions=max_relative,
        max_position_embeddings=max_positions,
        clip_relative_positions=False,
    )
    positions = relative_positions(seq_len, config, torch.device("cpu"))
    states = torch.zeros(seq_len, 1)
    distance = build_relative_position(states, states, bucket_size=buckets, max_position=config.max_relative_distance)
    span = config.relative_span
    transformers_rows = (distance[0] + span).clamp(0, 2 * span - 1)
    assert torch.equal(positions.p2c_index + positions.first_row, transformers_rows)
    assert torch.equal(positions.c2p_index, positions.num_rows - 1 - positions.p2c_index)
    assert positions.p2c_index.min() >= 0 and positions.p2c_index.max() < positions.num_rows
    assert positions.first_row + positions.num_rows <= 2 * span


@pytest.mark.parametrize(
    "fields",
    [
        dict(position_buckets=32, max_position_embeddings=512),
        dict(position_buckets=256, max_position_embeddings=512),
        dict(position_buckets=-1, max_relative_positions=20),
        dict(position_buckets=-1, max_relative_positions=-1, max_position_embeddings=64),
    ],
    ids=["b32", "b256", "v1-clip20", "v1-span64"],
)
@pytest.mark.parametrize("seq_len", [1, 7, 40, 300, 700])
def test_relative_position_rows_follow_the_official_formula(fields, seq_len):
    config = tiny_config(DebertaConfig, **fields)
    positions = relative_positions(seq_len, config, torch.device("cpu"))
    span = config.relative_span
    i, j = torch.meshgrid(torch.arange(seq_len), torch.arange(seq_len), indexing="ij")
    distance = i - j
    if config.position_buckets > 0:
        distance = log_bucket_position(distance, config.position_buckets, config.max_relative_distance)
    official_rows = (distance + span).clamp(0, 2 * span - 1)
    assert torch.equal(positions.p2c_index + positions.first_row, official_rows)
    assert torch.equal(positions.c2p_index, positions.num_rows - 1 - positions.p2c_index)  # reversed c2p table
    assert positions.p2c_index.min() >= 0 and positions.p2c_index.max() < positions.num_rows
    assert positions.first_row + positions.num_rows <= 2 * span


# ---------------------------------------------------------------------------------------------------------------------
# Disentangled attention and the Enhanced Mask Decoder against step-by-step references
# ---------------------------------------------------------------------------------------------------------------------


def reference_bucket(distance: int, buckets: int, max_position: int) -> int:
    """The official log bucket of one distance, in plain Python."""
    mid = buckets // 2
    distance = max(-(max_position - 1), min(max_position - 1, distance))
    if abs(distance) <= mid:
        return distance
    log_part = math.ceil(math.log(abs(distance) / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return int(math.copysign(log_part, distance))


def reference_layer(model: DebertaModel, layer_index: int, kv_states, query_states, mask):
    """One DeBERTa layer computed step by step from the paper / official code, in float64.

    kv_states, query_states: (B, L, hidden); mask: (B, L), 1 for real tokens. Queries come from query_states, keys
    and values from kv_states; the residual is query_states (as in the official layer).
    """
    config = model.config
    layer = model.encoder.layer[layer_index]
    attention = layer.attention.self
    H, D = config.num_attention_heads, config.head_dim
    double = {name: p.detach().double() for name, p in attention.named_parameters()}

    def projection(part):  # weight and bias of "query"/"key"/"value", whatever the layout
        if config.projection_layout == "fused":
            weight = double["in_proj.weight"].view(H, 3, D, -1)[:, "qkv".index(part[0])].reshape(H * D, -1)
            bias = {"q": double["q_bias"], "k": None, "v": double["v_bias"]}[part[0]]
            return weight, bias
        return double[f"{part}_proj.weight"], double[f"{part}_proj.bias"]

    def heads(x):  # (..., L, H*D) -> (..., H, L, D)
        return x.unflatten(-1, (H, D)).transpose(-2, -3)

    q = heads(F.linear(query_states.double(), *projection("query")))
    k = heads(F.linear(kv_states.double(), *projection("key")))
    v = heads(F.linear(kv_states.double(), *projection("value")))
    factor = 1 + len(config.pos_att_type)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D * factor)  # content-to-content

    if config.relative_attention:
        table = model.encoder.rel_embeddings.weight.detach().double()  # (2k, hidden)
        if "layer_norm" in config.norm_rel_ebd:
            norm = model.encoder.LayerNorm
            table = F.layer_norm(table, (table.shape[-1],), norm.weight.double(), norm.bias.double(), norm.eps)
        span, L = config.relative_span, kv_states.shape[1]
        rows = torch.empty(L, L, dtype=torch.long)
        for i in range(L):
            for j in range(L):
                distance = i - j
                if config.position_buckets > 0:
                    distance = reference_bucket(distance, config.position_buckets, config.max_relative_distance)
                rows[i, j] = min(max(distance + span, 0), 2 * span - 1)
        if config.share_att_key:
            pos_key_weights, pos_query_weights = projection("key"), projection("query")
        elif config.projection_layout == "fused":
            pos_key_weights = (double.get("pos_proj.weight"), None)
            pos_query_weights = (double.get("pos_q_proj.weight"), double.get("pos_q_proj.bias"))
        else:
            pos_key_weights = (double.get("pos_key_proj.weight"), double.get("pos_key_proj.bias"))
            pos_query_weights = (double.get("pos_query_proj.weight"), double.get("pos_query_proj.bias"))
        if "c2p" in config.pos_att_type:  # query i against the embedding of its position relative to key j
            pos_key = heads(F.linear(table, *pos_key_weights))  # (H, 2k, D)
            c2p = torch.einsum("bhid,hijd->bhij", q, pos_key[:, rows])
            scores = scores + c2p / math.sqrt(D * factor)
        if "p2c" in config.pos_att_type:  # key j against the embedding of query i's position relative to it
            pos_query = heads(F.linear(table, *pos_query_weights))
            p2c = torch.einsum("bhjd,hijd->bhij", k, pos_query[:, rows])
            scores = scores + p2c / math.sqrt(D * factor)

    scores = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
    context = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)

    def linear(module, x):
        return F.linear(x, module.weight.double(), module.bias.double())

    def norm(module, x):
        return F.layer_norm(x, (x.shape[-1],), module.weight.double(), module.bias.double(), module.eps)

    attention_output = norm(
        layer.attention.output.LayerNorm, linear(layer.attention.output.dense, context) + query_states.double()
    )
    intermediate = layer.intermediate.intermediate_act_fn(linear(layer.intermediate.dense, attention_output))
    return norm(layer.output.LayerNorm, linear(layer.output.dense, intermediate) + attention_output)


REFERENCE_CASES = {
    "v3": ("v3", {}),
    "v1-fused": ("v1", dict(max_relative_positions=6)),
    "v2-unshared-c2p": ("v2-c2p-unshared", dict(position_biased_input=False, max_relative_positions=5)),
    "v2-unshared-p2c": ("v2-p2c-embedding-size", dict(conv_kernel_size=0)),
    "fused-shared-buckets": ("v3", dict(position_buckets=8, projection_layout="fused")),
}


@pytest.mark.parametrize("case", REFERENCE_CASES.values(), ids=REFERENCE_CASES.keys())
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_layers_match_step_by_step_reference(case, implementation):
    torch.manual_seed(0)
    model = DebertaModel(ours_variant(case[0], **case[1], num_hidden_layers=2)).eval()
    model.set_attn_implementation(implementation)
    with torch.no_grad():  # the position tables start at zero / one; make every term matter
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    input_ids, attention_mask, _ = make_batch(seq_len=20, pad_from=(None, 13, 4))
    with torch.no_grad():
        out = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    for index in range(2):
        states = out.hidden_states[index]
        expected = reference_layer(model, index, states, states, attention_mask)
        assert max_diff(expected.float(), out.hidden_states[index + 1], attention_mask) <= TOL


def test_own_config_clips_distances_beyond_max_relative_positions():
    """posformers' own config keeps the official arithmetic: at 70 tokens with max_relative_positions=40 the model
    equals the float64 reference, which clips; transformers' unclipped arithmetic gives other answers there."""
    torch.manual_seed(0)
    model = DebertaModel(ours_variant("v3", position_buckets=16, max_relative_positions=40, num_hidden_layers=1))
    assert model.config.clip_relative_positions is True
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    input_ids, attention_mask, _ = make_batch(seq_len=70, pad_from=(None, 55, 4))
    with torch.no_grad():
        out = model.eval()(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        expected = reference_layer(model, 0, out.hidden_states[0], out.hidden_states[0], attention_mask)
        assert max_diff(expected.float(), out.last_hidden_state, attention_mask) <= TOL
        model.config.clip_relative_positions = False
        unclipped = model(input_ids, attention_mask=attention_mask).last_hidden_state
    assert max_diff(unclipped, out.last_hidden_state, attention_mask) > 100 * TOL


def reference_mlm_logits(model: DebertaForMaskedLM, input_ids, attention_mask, steps: int):
    """The official EnhancedMaskDecoder (apps/models/masked_language_model.py), step by step in float64.

    hidden_states = encoder_layers[-2] (input of the last layer); z_states = absolute position embeddings; the last
    layer runs `steps` times with keys/values from hidden_states and queries z_states + hidden_states, then each
    step's output; the LM head (dense, activation, LayerNorm, tied decoder + bias) reads the last step.
    """
    deberta = model.deberta
    with torch.no_grad():
        encoder_layers = deberta(input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
        hidden_states = encoder_layers[-2]
        z_states = deberta.embeddings.position_embeddings.weight[: input_ids.shape[1]][None]
        query_states = (z_states + hidden_states).double()
        for _ in range(steps):
            query_states = reference_layer(
                deberta, model.config.num_hidden_layers - 1, hidden_states, query_states, attention_mask
            )
        head = model.lm_predictions.lm_head
        x = F.linear(query_states, head.dense.weight.double(), head.dense.bias.double())
        x = F.layer_norm(
            head.transform_act_fn(x), (x.shape[-1],), head.LayerNorm.weight.double(), head.LayerNorm.bias.double(), 1e-7
        )
        return x @ deberta.embeddings.word_embeddings.weight.double().T + head.bias.double()


@pytest.mark.parametrize("steps", [1, 2, 3])
@pytest.mark.parametrize("variant", ["v3", "v2-conv", "v1"])
def test_enhanced_mask_decoder_matches_official_algorithm(variant, steps):
    torch.manual_seed(0)
    model = DebertaForMaskedLM(ours_variant(variant, position_biased_input=False, emd_steps=steps)).eval()
    with torch.no_grad():
        model.lm_predictions.lm_head.bias.normal_()
    input_ids, attention_mask, _ = make_batch(seq_len=19)
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask).logits
    expected = reference_mlm_logits(model, input_ids, attention_mask, steps)
    assert max_diff(expected.float(), logits, attention_mask) <= TOL


def test_enhanced_mask_decoder_changes_the_logits_and_is_off_with_absolute_inputs(tmp_path):
    torch.manual_seed(0)
    model = DebertaForMaskedLM(tiny_config(DebertaConfig)).eval()
    model.save_pretrained(tmp_path)
    plain = DebertaForMaskedLM.from_pretrained(tmp_path, emd_steps=0).eval()
    assert "deberta.embeddings.position_embeddings.weight" in model.state_dict()
    assert "deberta.embeddings.position_embeddings.weight" not in plain.state_dict()
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        with_emd = model(input_ids, attention_mask=attention_mask).logits
        without = plain(input_ids, attention_mask=attention_mask).logits
        # without the EMD the head reads the encoder output
        encoder = model.deberta(input_ids, attention_mask=attention_mask).last_hidden_state
        assert max_diff(without, model.lm_predictions.lm_head(encoder), attention_mask) <= TOL
    assert max_diff(with_emd, without, attention_mask) > 1e-2
    # position_biased_input models add positions at the input; the official code runs no EMD for them
    absolute = DebertaForMaskedLM(tiny_config(DebertaConfig, position_biased_input=True))
    assert absolute.lm_predictions.steps == 0


def test_emd_positions_follow_position_ids():
    torch.manual_seed(0)
    model = DebertaForMaskedLM(tiny_config(DebertaConfig)).eval()
    input_ids = torch.randint(1, 99, (2, 9))
    with torch.no_grad():
        default = model(input_ids).logits
        explicit = model(input_ids, position_ids=torch.arange(9)[None]).logits
        shifted = model(input_ids, position_ids=torch.arange(9)[None] + 3).logits
    assert torch.equal(default, explicit)
    assert (default - shifted).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# Heads of our own
# ---------------------------------------------------------------------------------------------------------------------


def test_replaced_token_detection_head_and_loss():
    torch.manual_seed(0)
    model = DebertaForReplacedTokenDetection(tiny_config(DebertaConfig)).eval()
    input_ids, attention_mask, _ = make_batch()
    labels = (torch.rand(input_ids.shape) < 0.3).long()
    with torch.no_grad():
        out = model(input_ids, attention_mask=attention_mask, labels=labels)
        hidden = model.deberta(input_ids, attention_mask=attention_mask).last_hidden_state
    head = model.mask_predictions
    # official LMMaskPredictionHead: LayerNorm(hidden + [CLS] hidden), dense, activation, one logit per token
    expected = head.classifier(head.transform_act_fn(head.dense(head.LayerNorm(hidden[:, :1] + hidden)))).squeeze(-1)
    assert out.logits.shape == input_ids.shape
    # at real tokens: padding-free execution ("auto") leaves zeros at padded positions
    assert max_diff(out.logits, expected, attention_mask) <= TOL
    real_tokens = attention_mask.bool()
    expected_loss = F.binary_cross_entropy_with_logits(out.logits[real_tokens], labels[real_tokens].float())
    assert abs(out.loss.item() - expected_loss.item()) <= TOL
    assert isinstance(AutoModelForPreTraining.from_config(model.config), DebertaForReplacedTokenDetection)


def test_context_pooler_and_cls_dropout():
    config = tiny_config(DebertaConfig, num_labels=2, pooler_hidden_act="tanh", pooler_dropout=0.1, cls_dropout=0.2)
    model = DebertaForSequenceClassification(config).eval()
    assert model.pooler.dropout.p == 0.1 and model.dropout.p == 0.2
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask).logits
        hidden = model.deberta(input_ids, attention_mask=attention_mask).last_hidden_state
    assert max_diff(logits, model.classifier(torch.tanh(model.pooler.dense(hidden[:, 0])))) <= TOL
    wide = DebertaForSequenceClassification(tiny_config(DebertaConfig, pooler_hidden_size=48, num_labels=3))
    assert wide.pooler.dense.weight.shape == (48, 32) and wide(input_ids).logits.shape == (3, 3)


def test_mlm_decoder_is_tied_and_saved_under_official_names(tmp_path):
    model = DebertaForMaskedLM(tiny_config(DebertaConfig))
    head = model.lm_predictions.lm_head
    assert head.decoder.weight is model.deberta.embeddings.word_embeddings.weight
    assert head.decoder.bias is head.bias
    model.save_pretrained(tmp_path)
    saved = set(load_file(tmp_path / "model.safetensors"))
    assert {
        "lm_predictions.lm_head.dense.weight",
        "lm_predictions.lm_head.LayerNorm.weight",
        "lm_predictions.lm_head.bias",
        "deberta.embeddings.position_embeddings.weight",
        "deberta.encoder.rel_embeddings.weight",
        "deberta.encoder.LayerNorm.weight",
        "deberta.encoder.layer.0.attention.self.query_proj.weight",
    } <= saved
    assert not any(".decoder." in key for key in saved)


def test_resizing_the_vocabulary_keeps_the_decoder_tied():
    model = DebertaForMaskedLM(tiny_config(DebertaConfig)).eval()
    model.resize_token_embeddings(120)
    head = model.lm_predictions.lm_head
    assert head.decoder.weight is model.deberta.embeddings.word_embeddings.weight
    assert head.decoder.bias is head.bias and head.bias.shape == (120,)
    with torch.no_grad():
        assert model(torch.randint(0, 120, (2, 7))).logits.shape == (2, 7, 120)


# ---------------------------------------------------------------------------------------------------------------------
# Official checkpoints: config files and every tensor accounted for
# ---------------------------------------------------------------------------------------------------------------------

# microsoft/deberta-v3-base and microsoft/deberta-base config.json, as published (sizes shrunk).
OFFICIAL_V3_CONFIG = {
    "model_type": "deberta-v2",
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 37,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "position_buckets": 32,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": "p2c|c2p",
    "layer_norm_eps": 1e-7,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "type_vocab_size": 0,
    "vocab_size": 99,
}
OFFICIAL_V1_CONFIG = {
    "model_type": "deberta",
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 37,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "pos_att_type": "c2p|p2c",
    "layer_norm_eps": 1e-7,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "type_vocab_size": 0,
    "vocab_size": 99,
}


def write_official_checkpoint(directory, config: dict, version: str) -> dict[str, torch.Tensor]:
    """A checkpoint with the official key names: transformers' model keys for the encoder, plus what transformers
    drops (absolute positions, the official `lm_predictions` and `mask_predictions` heads), stored in fp16."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    prefix = "Deberta" if version == "v1" else "DebertaV2"
    fields = {k: v for k, v in config.items() if k != "model_type"}
    torch.manual_seed(0)
    encoder = getattr(transformers, f"{prefix}Model")(getattr(transformers, f"{prefix}Config")(**fields))
    state = {f"deberta.{key}": value for key, value in encoder.state_dict().items()}
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    state["deberta.embeddings.position_embeddings.weight"] = torch.randn(config["max_position_embeddings"], hidden)
    for name, shape in {
        "lm_predictions.lm_head.dense.weight": (hidden, hidden),
        "lm_predictions.lm_head.dense.bias": (hidden,),
        "lm_predictions.lm_head.LayerNorm.weight": (hidden,),
        "lm_predictions.lm_head.LayerNorm.bias": (hidden,),
        "lm_predictions.lm_head.bias": (vocab,),
        "mask_predictions.dense.weight": (hidden, hidden),
        "mask_predictions.dense.bias": (hidden,),
        "mask_predictions.LayerNorm.weight": (hidden,),
        "mask_predictions.LayerNorm.bias": (hidden,),
        "mask_predictions.classifier.weight": (1, hidden),
        "mask_predictions.classifier.bias": (1,),
    }.items():
        state[name] = torch.randn(shape)
    state = {key: value.half().contiguous() for key, value in state.items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return state


@pytest.mark.parametrize(("official", "version"), [(OFFICIAL_V3_CONFIG, "v3"), (OFFICIAL_V1_CONFIG, "v1")])
def test_official_checkpoint_loads_with_every_tensor_accounted_for(official, version, tmp_path):
    state = write_official_checkpoint(tmp_path, official, version)
    config = DebertaConfig.from_pretrained(tmp_path)
    assert config.model_type == "posformers-deberta"
    assert config.projection_layout == ("fused" if version == "v1" else "separate")
    assert config.pos_att_type == official["pos_att_type"].split("|")
    if version == "v1":  # absent fields mean what they mean to transformers / the official code
        assert (config.position_buckets, config.share_att_key, config.norm_rel_ebd) == (-1, False, "none")
    used = set()
    for head, own_keys in ((DebertaForMaskedLM, "lm_predictions."), (DebertaForReplacedTokenDetection, "mask_")):
        model, info = head.from_pretrained(tmp_path, output_loading_info=True, dtype=torch.float32)
        assert not info["missing_keys"] and not info["mismatched_keys"], info
        loaded = model.state_dict()
        for key, value in state.items():
            if key in loaded:
                assert torch.equal(loaded[key], value.float()), key
                used.add(key)
        assert all(key.startswith(("lm_predictions.", "mask_predictions.")) for key in info["unexpected_keys"])
        assert any(key.startswith(own_keys) for key in used)
        input_ids, attention_mask, _ = make_batch()
        with torch.no_grad():
            assert torch.isfinite(model(input_ids, attention_mask=attention_mask).logits).all()
    assert used == set(state), set(state) - used


def test_official_config_fields_and_defaults(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "vocab_size": 99}))
    bare = DebertaConfig.from_pretrained(tmp_path)  # transformers' DebertaV2Config defaults
    assert (bare.hidden_size, bare.relative_attention, bare.position_biased_input) == (1536, False, True)
    assert (bare.pos_att_type, bare.position_buckets, bare.conv_kernel_size) == ([], -1, 0)
    (tmp_path / "config.json").write_text(json.dumps({**OFFICIAL_V3_CONFIG, "conv_kernel_size": 3, "conv_act": "gelu"}))
    v2 = DebertaConfig.from_pretrained(tmp_path)
    assert (v2.conv_kernel_size, v2.conv_act, v2.position_buckets, v2.norm_rel_ebd) == (3, "gelu", 32, "layer_norm")
    # AutoConfig keeps reading official files as transformers' own classes: the names do not collide
    assert type(AutoConfig.from_pretrained(tmp_path)) is transformers.DebertaV2Config


# The config.json files published with three checkpoints (microsoft/deberta-base, microsoft/deberta-v2-xlarge,
# microsoft/deberta-v3-base), one per version: the fields of the tiny official files above at their real sizes.
OFFICIAL_CONFIG_FILES = {
    "deberta-base": dict(
        OFFICIAL_V1_CONFIG,
        hidden_size=768,
        intermediate_size=3072,
        num_attention_heads=12,
        num_hidden_layers=12,
        vocab_size=50265,
    ),
    "deberta-v2-xlarge": dict(
        OFFICIAL_V3_CONFIG,
        attention_head_size=64,
        conv_act="gelu",
        conv_kernel_size=3,
        hidden_size=1536,
        intermediate_size=6144,
        num_attention_heads=24,
        num_hidden_layers=24,
        position_buckets=256,
        vocab_size=128100,
    ),
    "deberta-v3-base": dict(
        OFFICIAL_V3_CONFIG,
        hidden_size=768,
        intermediate_size=3072,
        num_attention_heads=12,
        num_hidden_layers=12,
        position_buckets=256,
        vocab_size=128100,
    ),
}


@pytest.mark.parametrize("name", sorted(OFFICIAL_CONFIG_FILES))
def test_preset_is_the_model_its_official_config_file_describes(name, tmp_path):
    """A preset and the official config.json, read the way `from_pretrained` reads it, give the same architecture."""
    (tmp_path / "config.json").write_text(json.dumps(OFFICIAL_CONFIG_FILES[name]))
    official, preset = DebertaConfig.from_pretrained(tmp_path), DebertaConfig.from_preset(name)
    fields = set(OFFICIAL_CONFIG_FILES[name]) | set(PRESETS[name]) | {"conv_kernel_size", "conv_act", "head_dim"}
    for field in sorted(fields - {"model_type", "attention_head_size"}):  # head_dim stands for attention_head_size
        assert getattr(preset, field) == getattr(official, field), field


def test_defaults_are_deberta_v3_base_and_presets_take_overrides():
    assert DebertaConfig().to_dict() == DebertaConfig.from_preset("deberta-v3-base").to_dict()
    check_preset_overrides(DebertaConfig, "deberta-v3-large", num_hidden_layers=2, emd_steps=0)


# ---------------------------------------------------------------------------------------------------------------------
# Backends, padding, precision, training
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_sdpa_equals_eager(variant):
    torch.manual_seed(0)
    emd = {"emd_steps": 0} if "embedding_size" in VARIANTS[variant][1] else {}  # the EMD needs hidden-wide positions
    sdpa = DebertaForMaskedLM(ours_variant(variant, **emd)).eval()
    # The default on every device: the fused kernel is opt-in (compared with eager in test_fused_attention.py).
    assert sdpa.config._attn_implementation == "sdpa"
    sdpa.set_attn_implementation("sdpa")
    eager = DebertaForMaskedLM(ours_variant(variant, **emd))
    eager.load_state_dict(sdpa.state_dict())
    eager.set_attn_implementation("eager")
    eager.eval()
    input_ids, attention_mask, _ = make_batch(seq_len=40, pad_from=(None, 30, 3))
    with torch.no_grad():
        a = sdpa(input_ids, attention_mask=attention_mask).logits
        b = eager(input_ids, attention_mask=attention_mask).logits
    assert max_diff(a, b, attention_mask) <= TOL


def test_three_dimensional_attention_mask_equals_padding_mask():
    torch.manual_seed(0)
    model = DebertaModel(tiny_config(DebertaConfig, conv_kernel_size=3)).eval()
    input_ids, attention_mask, _ = make_batch()
    pairwise = attention_mask[:, None, :] * attention_mask[:, :, None]  # the official (B, L, L) form
    with torch.no_grad():
        a = model(input_ids, attention_mask=attention_mask).last_hidden_state
        b = model(input_ids, attention_mask=pairwise).last_hidden_state
    assert max_diff(a, b, attention_mask) <= TOL


@pytest.mark.parametrize("variant", ["v2-conv", "absolute-only"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_without_nan(dtype, implementation, variant):
    torch.manual_seed(0)
    model = DebertaForMaskedLM(ours_variant(variant)).eval()
    model.set_attn_implementation(implementation)
    input_ids, attention_mask, _ = make_batch(seq_len=40, pad_from=(None, 20, 5))
    attention_mask[2] = 0  # a row that is entirely padding
    with torch.no_grad():
        reference = model(input_ids, attention_mask=attention_mask).logits
        with torch.autocast("cpu", dtype=dtype):
            autocast = model(input_ids, attention_mask=attention_mask).logits
        cast = model.to(dtype)(input_ids, attention_mask=attention_mask).logits
    assert torch.isfinite(cast).all() and torch.isfinite(autocast).all()
    rows = attention_mask[:2]
    assert max_diff(cast[:2].float(), reference[:2], rows) < 0.1


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = DebertaForMaskedLM(tiny_config(DebertaConfig, conv_kernel_size=3))
    input_ids, attention_mask, _ = make_batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    plain = check_activation_checkpointing(
        model, lambda model: model(input_ids, attention_mask=attention_mask, labels=labels).loss
    )
    assert "deberta.encoder.rel_embeddings.weight" in plain
    assert "deberta.embeddings.position_embeddings.weight" in plain  # the EMD is trained too


@pytest.mark.parametrize("variant", ["v1", "v3"])
def test_sdpa_gradients_equal_eager_gradients(variant):
    torch.manual_seed(0)
    model = DebertaForMaskedLM(ours_variant(variant)).train()
    input_ids, attention_mask, _ = make_batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)

    def grads(implementation):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        model(input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    sdpa, eager = grads("sdpa"), grads("eager")
    for name in eager:
        assert torch.allclose(sdpa[name], eager[name], atol=1e-5), name


def test_dropout_is_active_in_training_only():
    torch.manual_seed(0)
    model = DebertaModel(tiny_config(DebertaConfig, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    input_ids, attention_mask, _ = make_batch()
    model.train()
    a = model(input_ids, attention_mask=attention_mask).last_hidden_state
    b = model(input_ids, attention_mask=attention_mask).last_hidden_state
    assert (a - b).abs().max() > 1e-4
    model.eval()
    with torch.no_grad():
        assert torch.equal(
            model(input_ids, attention_mask=attention_mask).last_hidden_state,
            model(input_ids, attention_mask=attention_mask).last_hidden_state,
        )


def test_long_inputs_without_absolute_positions():
    torch.manual_seed(0)
    model = DebertaModel(tiny_config(DebertaConfig, max_position_embeddings=64, position_buckets=32)).eval()
    with torch.no_grad():
        out = model(torch.randint(1, 99, (1, 150))).last_hidden_state
    assert out.shape == (1, 150, 32) and torch.isfinite(out).all()
    mlm = DebertaForMaskedLM(tiny_config(DebertaConfig, max_position_embeddings=64, position_buckets=32))
    with pytest.raises(ValueError, match="longer than max_position_embeddings=64"):
        mlm(torch.randint(1, 99, (1, 65)))


@pytest.mark.parametrize("variant", ["v1", "v3", "v2-c2p-unshared"])
def test_inference_caches_and_buffers_give_the_training_path_outputs(variant):
    """In inference the position projections are cached across calls and the (L x L) buffers shared by the layers;
    every output must equal the uncached, freshly allocated computation (autograd on)."""
    torch.manual_seed(0)
    model = DebertaForMaskedLM(ours_variant(variant)).eval()
    for length in (17, 40, 9):  # cached projections are sliced per length
        input_ids, attention_mask, _ = make_batch(seq_len=length, pad_from=(None, length - 4, 3))
        kwargs = dict(attention_mask=attention_mask, output_hidden_states=True)
        expected = model(input_ids, **kwargs)
        with torch.inference_mode():
            cached = model(input_ids, **kwargs)
        with torch.no_grad():
            cached_again = model(input_ids, **kwargs)
        for a, b, c in zip(expected.hidden_states, cached.hidden_states, cached_again.hidden_states):
            assert max_diff(a.detach(), b, attention_mask) <= TOL and torch.equal(b, c)
        assert max_diff(expected.logits.detach(), cached.logits, attention_mask) <= TOL


def test_cached_position_projections_follow_a_fused_optimizer_step():
    """Fused AdamW (Trainer's default) updates the parameters without bumping their in-place version: evaluation after
    a training step must not reuse the projections cached before it."""
    torch.manual_seed(0)
    model = DebertaModel(tiny_config(DebertaConfig, initializer_range=0.2)).eval()
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        model(input_ids, attention_mask=attention_mask)  # fills the caches
    model.train()
    model(input_ids, attention_mask=attention_mask).last_hidden_state.sum().backward()
    torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True).step()
    model.eval()
    reference = DebertaModel(tiny_config(DebertaConfig)).eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        actual = model(input_ids, attention_mask=attention_mask).last_hidden_state
        expected = reference(input_ids, attention_mask=attention_mask).last_hidden_state
    assert max_diff(actual, expected, attention_mask) <= TOL


def test_cached_position_projections_follow_weight_changes(tmp_path):
    torch.manual_seed(0)
    model = DebertaModel(tiny_config(DebertaConfig)).eval()
    input_ids, attention_mask, _ = make_batch()

    def run(m):
        with torch.no_grad():
            return m(input_ids, attention_mask=attention_mask).last_hidden_state

    run(model)  # fills the caches
    with torch.no_grad():
        model.encoder.rel_embeddings.weight.mul_(3.0)
        model.encoder.LayerNorm.bias.add_(0.5)
        model.encoder.layer[1].attention.self.key_proj.weight.add_(0.1)
    model.save_pretrained(tmp_path)
    fresh = DebertaModel.from_pretrained(tmp_path).eval()
    assert max_diff(run(model), run(fresh), attention_mask) <= TOL
    model.load_state_dict(DebertaModel(tiny_config(DebertaConfig)).state_dict())  # copy_ into the parameters
    reference = DebertaModel(tiny_config(DebertaConfig))
    reference.load_state_dict(model.state_dict())
    assert max_diff(run(model), run(reference.eval()), attention_mask) <= TOL
    half = run(model.to(torch.bfloat16))  # new storage and dtype
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()


def test_flex_attention_is_refused_with_a_pointer_to_the_fused_kernel():
    """ "flex_attention" means transformers' FlexAttention kernel, which cannot add the disentangled scores."""
    with pytest.raises(ValueError, match="attn_implementation='posformers_fused'"):
        DebertaModel._from_config(tiny_config(DebertaConfig), attn_implementation="flex_attention")
    model = DebertaModel(tiny_config(DebertaConfig))
    with pytest.raises(ValueError, match="attn_implementation='posformers_fused'"):
        model.set_attn_implementation("flex_attention")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kernel", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_is_refused_in_one_line_of_posformers(tmp_path, kernel):
    """FlashAttention cannot add the disentangled scores: one line saying so, not transformers' request to add
    support on a Hub page made from the folder's path (https://huggingface.co//tmp/...)."""
    DebertaModel(tiny_config(DebertaConfig)).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as refused:
        DebertaModel.from_pretrained(tmp_path, attn_implementation=kernel)
    assert str(refused.value) == (
        f"attn_implementation='{kernel}': FlashAttention takes no position scores, which DebertaModel's attention "
        "adds to every score; leave attn_implementation unset or use 'posformers_fused', the model's own "
        "FlexAttention kernel"
    )
    with pytest.raises(ValueError, match="FlashAttention takes no position scores"):
        DebertaModel(tiny_config(DebertaConfig, attn_implementation=kernel))


def test_masked_lm_returns_hidden_states_asked_for_by_the_config(tmp_path):
    """output_hidden_states from the config (as `from_pretrained(..., output_hidden_states=True)` sets it) reaches
    DebertaForMaskedLM's output, as it does the other heads'."""
    torch.manual_seed(0)
    model = DebertaForMaskedLM(tiny_config(DebertaConfig, emd_steps=2)).eval()
    model.save_pretrained(tmp_path)
    input_ids, attention_mask, _ = make_batch()
    for loaded in (
        DebertaForMaskedLM.from_pretrained(tmp_path, output_hidden_states=True).eval(),
        DebertaForSequenceClassification.from_pretrained(tmp_path, output_hidden_states=True).eval(),
    ):
        with torch.no_grad():
            output = loaded(input_ids, attention_mask=attention_mask)
        assert output.hidden_states is not None and len(output.hidden_states) == loaded.config.num_hidden_layers + 1
    with torch.no_grad():
        assert model(input_ids, attention_mask=attention_mask).hidden_states is None


@pytest.mark.parametrize("unpad_inputs", ["auto", "never", "always"])
def test_a_batch_of_padding_only_returns_zeros(unpad_inputs):
    """A batch whose every row is padding returns outputs, as transformers' DebertaV2 does, with zeros at the (padded)
    positions of every per-token output."""
    torch.manual_seed(0)
    config = tiny_config(DebertaConfig, conv_kernel_size=3, emd_steps=2, unpad_inputs=unpad_inputs, num_labels=3)
    input_ids = torch.zeros(2, 6, dtype=torch.long)
    attention_mask = torch.zeros(2, 6, dtype=torch.long)
    with torch.no_grad():
        base = DebertaModel(config).eval()(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        logits = DebertaForTokenClassification(config).eval()(input_ids, attention_mask=attention_mask).logits
        mlm = DebertaForMaskedLM(config).eval()(input_ids, attention_mask=attention_mask).logits
        classes = DebertaForSequenceClassification(config).eval()(input_ids, attention_mask=attention_mask).logits
    assert base.last_hidden_state.shape == (2, 6, config.hidden_size) and not base.last_hidden_state.any()
    assert all(not h.any() for h in base.hidden_states)
    assert logits.shape == (2, 6, 3) and not logits.any()
    assert mlm.shape == (2, 6, config.vocab_size) and not mlm.any()
    assert classes.shape == (2, 3) and torch.isfinite(classes).all()


def test_without_relative_attention_every_parameter_gets_a_gradient(tmp_path):
    """Nothing is built that no pass uses (DDP without find_unused_parameters needs a gradient for every
    parameter): without relative attention, no relative table and no LayerNorm of it; a checkpoint that carries that
    LayerNorm still loads, without a warning about it."""
    torch.manual_seed(0)
    config = tiny_config(DebertaConfig, relative_attention=False, position_biased_input=True, norm_rel_ebd="layer_norm")
    model = DebertaForMaskedLM(config).train()
    input_ids, attention_mask, _ = make_batch()
    model(input_ids, attention_mask=attention_mask, labels=input_ids).loss.backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["deberta.encoder.LayerNorm.weight"] = torch.ones(config.hidden_size)
    state["deberta.encoder.LayerNorm.bias"] = torch.zeros(config.hidden_size)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, info = DebertaForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("unpad_inputs", ["never", "always"])
def test_per_token_outputs_are_zero_at_padding_on_every_path(unpad_inputs, implementation):
    """last_hidden_state, every hidden_states entry and the per-token logits hold zeros at padded positions, padded
    or padding-free, and agree on real tokens."""
    torch.manual_seed(0)
    config = tiny_config(DebertaConfig, conv_kernel_size=3, emd_steps=2, unpad_inputs=unpad_inputs)
    model = DebertaForMaskedLM(config).eval()
    model.set_attn_implementation(implementation)
    input_ids, attention_mask, _ = make_batch()
    padding = ~attention_mask.bool()
    with torch.no_grad():
        output = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        states = model.deberta(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert not output.logits[padding].any()
    for hidden in (states.last_hidden_state, *states.hidden_states, *output.hidden_states):
        assert not hidden[padding].any()


# ---------------------------------------------------------------------------------------------------------------------
# Save/load, Auto classes, remote code, the Hub
# ---------------------------------------------------------------------------------------------------------------------


def test_save_load_round_trip_and_auto_classes(tmp_path):
    torch.manual_seed(0)
    model = DebertaForMaskedLM(tiny_config(DebertaConfig, conv_kernel_size=3, emd_steps=3)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "posformers-deberta" and saved["auto_map"] == AUTO_MAP
    assert {"configuration_deberta.py", "modeling_deberta.py"} <= {p.name for p in tmp_path.iterdir()}
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is DebertaConfig and config.emd_steps == 3 and config.pos_att_type == ["p2c", "c2p"]
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is DebertaForMaskedLM
    assert type(AutoModel.from_pretrained(tmp_path)) is DebertaModel
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        assert torch.equal(
            model(input_ids, attention_mask=attention_mask).logits,
            reloaded(input_ids, attention_mask=attention_mask).logits,
        )


def test_model_type_is_distinct_from_transformers():
    assert DebertaConfig.model_type == "posformers-deberta"
    assert transformers.CONFIG_MAPPING["deberta"] is transformers.DebertaConfig
    assert transformers.CONFIG_MAPPING["deberta-v2"] is transformers.DebertaV2Config
    assert transformers.CONFIG_MAPPING["posformers-deberta"] is DebertaConfig
    for auto_name, target in AUTO_MAP.items():
        if auto_name != "AutoConfig":
            model = getattr(transformers, auto_name).from_config(tiny_config(DebertaConfig))
            assert type(model).__name__ == target.rsplit(".", 1)[1]
            assert type(model).__module__.startswith("posformers.")


# ---------------------------------------------------------------------------------------------------------------------
# Bad configs and inputs
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pos_att_type": "c2p|x2y"}, r"pos_att_type has unknown entries \['x2y'\]"),
        ({"pos_att_type": ["c2p", "p2p"]}, "'p2p' is not supported"),
        ({"pos_att_type": "c2p|c2p"}, "lists an entry twice"),
        ({"talking_head": True}, "DebertaConfig.talking_head is not supported"),
        ({"position_buckets": 1}, "position_buckets"),
        ({"position_buckets": 2048}, "must be below max_relative_positions - 1"),
        ({"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd has unknown entries"),
        ({"projection_layout": "packed"}, "projection_layout must be one of"),
        ({"hidden_size": 30}, "must be divisible by num_attention_heads"),
        ({"attention_head_size": 16}, "must equal hidden_size"),
        ({"conv_kernel_size": 2}, "conv_kernel_size must be odd"),
        ({"conv_kernel_size": 3, "conv_groups": 5}, "conv_groups must be a positive divisor"),
        ({"conv_act": "swishy"}, "conv_act must be the name of an activation"),
        ({"hidden_act": "nope"}, "hidden_act must be the name of an activation"),
        ({"emd_steps": -1}, "emd_steps must be an integer >= 0"),
        ({"max_relative_positions": -5}, "max_relative_positions must be an integer >= -1"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be in"),
        ({"pad_token_id": 500}, "pad_token_id"),
        ({"clip_relative_positions": "false"}, "DebertaConfig.clip_relative_positions must be True or False"),
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(DebertaConfig, **overrides)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"relative_attention": False}, "position_biased_input and relative_attention are both false"),
        ({"relative_attention": True, "pos_att_type": "none"}, "pos_att_type names no relative position term"),
    ],
)
def test_a_deberta_without_any_position_information_is_refused(tmp_path, fields, named):
    """Neither absolute positions at the input nor a relative position term: the encoder could not tell word order
    (reversed input, reversed outputs), so the config is refused on creation and in a config.json, in one line."""
    with pytest.raises(ValueError, match=named) as refused:
        tiny_config(DebertaConfig, position_biased_input=False, **fields)
    assert "\n" not in str(refused.value) and "position_biased_input" in str(refused.value)
    (tmp_path / "config.json").write_text(json.dumps({**OFFICIAL_V3_CONFIG, **fields}))
    with pytest.raises(ValueError, match=f"^{tmp_path / 'config.json'}: .*{named}"):
        DebertaConfig.from_pretrained(tmp_path)
    # either source of positions alone is a valid DeBERTa
    tiny_config(DebertaConfig, position_biased_input=True, **fields)


def test_what_the_official_code_ignores_is_accepted(tmp_path):
    """bert_base.json (microsoft/DeBERTa experiments): position_buckets without relative attention is ignored, as
    the official code ignores it, with a logged note; pos_att_type "none" names no position term."""
    logger = sys.modules[DebertaConfig.__module__].logger  # the logger the config writes to, whatever its name
    # Whatever earlier tests left (an in-process script's --log_level on the "posformers" logger, a library's
    # logging.config.dictConfig disabling existing loggers, logging.disable): this logger emits warnings here.
    saved = (logger.level, logger.disabled, logging.root.manager.disable)
    logger.setLevel(logging.WARNING)
    logger.disabled = False
    logging.disable(logging.NOTSET)
    try:
        with CaptureLogger(logger) as captured:
            config = tiny_config(
                DebertaConfig,
                relative_attention=False,
                position_biased_input=True,
                position_buckets=256,
                pos_att_type="none",
            )
        # a note about a value the user never set tells nothing: the default buckets follow relative_attention
        with CaptureLogger(logger) as unset:
            absolute = tiny_config(DebertaConfig, relative_attention=False, position_biased_input=True)
    finally:
        logger.setLevel(saved[0])
        logger.disabled = saved[1]
        logging.disable(saved[2])
    assert (config.position_buckets, config.pos_att_type) == (-1, [])
    assert "position_buckets=256 is ignored" in captured.out
    assert (absolute.position_buckets, unset.out) == (-1, "")
    assert DebertaConfig().position_buckets == 256  # deberta-v3-base's, with relative attention
    assert DebertaModel(config).encoder.layer[0].attention.self.scaling == config.head_dim**-0.5
    # a config.json carrying the repository's `pooling` section: transformers ignores it, the official model ran it
    fields = {**OFFICIAL_V3_CONFIG, "pooling": {"dropout": 0.1, "hidden_act": "tanh"}}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    loaded = DebertaConfig.from_pretrained(tmp_path)
    assert (loaded.pooler_hidden_act, loaded.pooler_dropout, getattr(loaded, "pooling", None)) == ("tanh", 0.1, None)
    (tmp_path / "config.json").write_text(json.dumps({**fields, "pooler_hidden_act": "gelu"}))
    assert DebertaConfig.from_pretrained(tmp_path).pooler_hidden_act == "gelu"  # the field transformers read wins


def test_fields_changed_after_creation_are_checked_at_model_build():
    config = tiny_config(DebertaConfig)
    config.pos_att_type = ["c2p", "q2q"]
    with pytest.raises(ValueError, match="unknown entries"):
        DebertaModel(config)
    config = tiny_config(DebertaConfig, embedding_size=16)
    with pytest.raises(ValueError, match="embedding_size"):
        DebertaForMaskedLM(config)
    assert DebertaForMaskedLM(tiny_config(DebertaConfig, embedding_size=16, emd_steps=0)).lm_predictions.steps == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": torch.ones(2, 5, dtype=torch.long), "inputs_embeds": torch.zeros(2, 5, 32)}, "got both"),
        ({}, "got neither"),
        ({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 6)}, "attention_mask"),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "token_type_ids": torch.ones(2, 4, dtype=torch.long)},
            "token_type_ids has shape",
        ),
        ({"input_ids": torch.full((2, 5), 99)}, r"input_ids must lie in \[0, 99\)"),
        ({"input_ids": torch.ones(5, dtype=torch.long)}, "input_ids must have shape"),
        ({"inputs_embeds": torch.zeros(2, 5, 31)}, "inputs_embeds must have shape"),
        ({"input_ids": torch.ones(2, 0, dtype=torch.long)}, "empty"),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "position_ids": torch.full((1, 5), 600)},
            r"position_ids must lie in \[0, 512\)",
        ),
    ],
)
def test_bad_inputs_give_clear_errors(kwargs, message):
    model = DebertaForMaskedLM(tiny_config(DebertaConfig)).eval()
    with pytest.raises(ValueError, match=message):
        model(**kwargs)


def test_token_types_are_checked_only_when_the_model_has_them():
    with_types = DebertaModel(tiny_config(DebertaConfig, type_vocab_size=2)).eval()
    with pytest.raises(ValueError, match="token_type_ids must lie"):
        with_types(torch.ones(1, 5, dtype=torch.long), token_type_ids=torch.full((1, 5), 2))
    # official v3 checkpoints: type_vocab_size 0, token types ignored
    without = DebertaModel(tiny_config(DebertaConfig)).eval()
    with torch.no_grad():
        plain = without(torch.ones(1, 5, dtype=torch.long)).last_hidden_state
        typed = without(torch.ones(1, 5, dtype=torch.long), token_type_ids=torch.ones(1, 5, dtype=torch.long))
    assert torch.equal(plain, typed.last_hidden_state)


def test_multiple_choice_needs_a_choice_dimension():
    with pytest.raises(ValueError, match="num_choices"):
        DebertaForMultipleChoice(tiny_config(DebertaConfig))(torch.ones(2, 5, dtype=torch.long))
