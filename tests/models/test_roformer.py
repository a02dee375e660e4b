"""RoFormer: parity with transformers' RoFormer, rotary variants against readable references, and robustness."""

import json
import math
import warnings

import pytest
import torch
import transformers
from helpers.data import DATA_DIR
from helpers.modeling import (
    check_activation_checkpointing,
    check_preset_overrides,
    make_batch,
    max_diff,
    reload_as,
    sim_generation_reference,
    tiny_config,
    tiny_fields,
)
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM
from transformers.loss.loss_utils import ForQuestionAnsweringLoss

import posformers
from posformers import (
    RoFormerConfig,
    RoFormerForCausalLM,
    RoFormerForMaskedLM,
    RoFormerForMultipleChoice,
    RoFormerForQuestionAnswering,
    RoFormerForSequenceClassification,
    RoFormerForTokenClassification,
    RoFormerModel,
    convert_rope_layout,
)
from posformers.modeling_roformer import rope_inverse_frequencies

TINY = tiny_fields(RoFormerConfig.model_type)
TOL = 1e-5


# ---------------------------------------------------------------------------------------------------------------------
# Parity with transformers' RoFormer
# ---------------------------------------------------------------------------------------------------------------------

HEADS = [
    ("RoFormerModel", RoFormerModel, "last_hidden_state", {}),
    ("RoFormerForMaskedLM", RoFormerForMaskedLM, "logits", {}),
    ("RoFormerForCausalLM", RoFormerForCausalLM, "logits", {"is_decoder": True}),
    ("RoFormerForSequenceClassification", RoFormerForSequenceClassification, "logits", {"num_labels": 3}),
    ("RoFormerForTokenClassification", RoFormerForTokenClassification, "logits", {"num_labels": 5}),
    ("RoFormerForQuestionAnswering", RoFormerForQuestionAnswering, "start_logits", {}),
]
VARIANTS = [{}, {"rotary_value": True}, {"embedding_size": 16}]


def head_labels(name, input_ids, attention_mask):
    """Labels for each head, so that losses are compared too."""
    if name in ("RoFormerForMaskedLM", "RoFormerForCausalLM"):
        return {"labels": input_ids.masked_fill(attention_mask == 0, -100)}
    if name == "RoFormerForSequenceClassification":
        return {"labels": torch.tensor([0, 2, 1])}
    if name == "RoFormerForTokenClassification":
        return {"labels": (input_ids % 5).masked_fill(attention_mask == 0, -100)}
    if name == "RoFormerForQuestionAnswering":
        return {"start_positions": torch.tensor([1, 3, 40]), "end_positions": torch.tensor([4, 3, 2])}
    return {}


@pytest.mark.parametrize("variant", VARIANTS, ids=["plain", "rotary_value", "embedding_size"])
@pytest.mark.parametrize(("name", "our_class", "field", "head_kwargs"), HEADS, ids=[h[0] for h in HEADS])
def test_parity_with_transformers(name, our_class, field, head_kwargs, variant, tmp_path):
    torch.manual_seed(0)
    reference_config = transformers.RoFormerConfig(**TINY, **variant, **head_kwargs)
    reference = getattr(transformers, name)(reference_config).eval()
    ours = reload_as(reference, our_class, tmp_path)
    input_ids, attention_mask, token_type_ids = make_batch()
    labels = head_labels(name, input_ids, attention_mask)
    with torch.no_grad():
        expected = reference(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **labels
        )
        actual = ours(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **labels)
    if field == "start_logits":
        # Ours masks padded positions (torch.finfo.min) so the loss does not depend on padding; transformers' does not
        padding = attention_mask == 0
        expected.start_logits = expected.start_logits.masked_fill(padding, torch.finfo(torch.float32).min)
        expected.end_logits = expected.end_logits.masked_fill(padding, torch.finfo(torch.float32).min)
        expected.loss = ForQuestionAnsweringLoss(expected.start_logits, expected.end_logits, **labels)
    if labels:
        assert abs(expected.loss.item() - actual.loss.item()) <= TOL
    if field == "start_logits":
        assert max_diff(expected.end_logits, actual.end_logits, attention_mask) <= TOL
    if getattr(expected, field).shape[:2] == attention_mask.shape:
        diff = max_diff(getattr(expected, field), getattr(actual, field), attention_mask)
    else:
        diff = (getattr(expected, field) - getattr(actual, field)).abs().max().item()
    assert diff <= TOL, f"{name} {variant}: max abs diff {diff}"


def test_parity_multiple_choice(tmp_path):
    torch.manual_seed(0)
    reference = transformers.RoFormerForMultipleChoice(transformers.RoFormerConfig(**TINY)).eval()
    ours = reload_as(reference, RoFormerForMultipleChoice, tmp_path)
    input_ids = torch.randint(1, 99, (2, 3, 12))
    labels = torch.tensor([0, 2])
    with torch.no_grad():
        expected, actual = reference(input_ids, labels=labels), ours(input_ids, labels=labels)
    assert (expected.logits - actual.logits).abs().max() <= TOL
    assert abs(expected.loss.item() - actual.loss.item()) <= TOL


def test_parity_losses_and_attentions(tmp_path):
    torch.manual_seed(0)
    reference = transformers.RoFormerForMaskedLM(transformers.RoFormerConfig(**TINY)).eval()
    ours = reload_as(reference, RoFormerForMaskedLM, tmp_path)
    input_ids, _, _ = make_batch(pad_from=(None, None, None))
    labels = input_ids.clone()
    labels[:, ::2] = -100
    with torch.no_grad():
        expected = reference(input_ids, labels=labels, output_attentions=True, output_hidden_states=True)
        actual = ours(input_ids, labels=labels, output_attentions=True, output_hidden_states=True)
    assert abs(expected.loss.item() - actual.loss.item()) <= TOL
    assert len(actual.attentions) == len(expected.attentions) == 2
    for a, b in zip(expected.attentions, actual.attentions):
        assert (a - b).abs().max() <= TOL
    assert len(actual.hidden_states) == 3
    for a, b in zip(expected.hidden_states, actual.hidden_states):
        assert (a - b).abs().max() <= TOL


def test_hf_checkpoint_positions_table_is_ignored_and_rebuilt(tmp_path):
    reference = transformers.RoFormerModel(transformers.RoFormerConfig(**TINY))
    reference.save_pretrained(tmp_path)
    ours = RoFormerModel.from_pretrained(tmp_path)
    assert ours.config.model_type == "posformers-roformer"
    fresh = RoFormerModel(ours.config)
    assert torch.equal(ours.rotary_emb.cos_cached, fresh.rotary_emb.cos_cached)
    assert torch.equal(ours.rotary_emb.sin_cached, fresh.rotary_emb.sin_cached)
    # transformers' table is [sin | cos] of the same angles
    table = reference.encoder.embed_positions.weight
    half = table.shape[1] // 2
    assert torch.allclose(table[:, :half], ours.rotary_emb.sin_cached, atol=1e-6)
    assert torch.allclose(table[:, half:], ours.rotary_emb.cos_cached, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# Backends, padding, long inputs
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_decoder", [False, True], ids=["encoder", "decoder"])
def test_sdpa_equals_eager(is_decoder):
    torch.manual_seed(0)
    config = tiny_config(RoFormerConfig, is_decoder=is_decoder)
    sdpa = RoFormerModel(config).eval()
    eager = RoFormerModel(tiny_config(RoFormerConfig, is_decoder=is_decoder))
    eager.load_state_dict(sdpa.state_dict())
    eager.set_attn_implementation("eager")
    eager.eval()
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    input_ids, attention_mask, token_type_ids = make_batch()
    with torch.no_grad():
        a = sdpa(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        b = eager(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
    assert max_diff(a, b, attention_mask) <= TOL


def test_encoder_attention_is_never_causal():
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig)).eval()
    input_ids, _, _ = make_batch(batch=1, pad_from=(None,))
    changed = input_ids.clone()
    changed[0, -1] = (changed[0, -1] % 98) + 1
    with torch.no_grad():
        first = model(input_ids).last_hidden_state[0, 0]
        second = model(changed).last_hidden_state[0, 0]
    assert (first - second).abs().max() > 1e-4, "the first token did not see the last one: attention is causal"


def test_longer_than_max_position_embeddings_works_and_warns(caplog):
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig, max_position_embeddings=16)).eval()
    input_ids = torch.randint(1, 99, (1, 40))
    with torch.no_grad():
        out = model(input_ids).last_hidden_state
    assert out.shape == (1, 40, 32) and torch.isfinite(out).all()
    # the on-the-fly table continues the cached one exactly
    on_the_fly, _ = model.rotary_emb.rotation(torch.arange(40)[None], 40, torch.float32)
    cached, _ = model.rotary_emb.rotation(torch.arange(16)[None], 16, torch.float32)
    assert torch.allclose(on_the_fly[:, :16], cached, atol=1e-7)
    with pytest.raises(IndexError):
        transformers.RoFormerModel(transformers.RoFormerConfig(**{**TINY, "max_position_embeddings": 16}))(input_ids)


def test_position_ids_shift_matches_offset_positions():
    """Relative positions: shifting every position by the same amount leaves softmax attention unchanged."""
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig)).eval()
    input_ids = torch.randint(1, 99, (2, 9))
    with torch.no_grad():
        base = model(input_ids).last_hidden_state
        shifted = model(input_ids, position_ids=torch.arange(9)[None] + 20).last_hidden_state
    assert (base - shifted).abs().max() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_without_nan(dtype):
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(tiny_config(RoFormerConfig)).eval()
    input_ids, attention_mask, _ = make_batch()
    attention_mask[2] = 0  # a row that is entirely padding
    with torch.no_grad():
        cast = model.to(dtype)(input_ids, attention_mask=attention_mask).logits
        with torch.autocast("cpu", dtype=dtype):
            autocast = model.float()(input_ids, attention_mask=attention_mask).logits
    assert torch.isfinite(cast).all() and torch.isfinite(autocast).all()


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(tiny_config(RoFormerConfig))
    input_ids, attention_mask, _ = make_batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    check_activation_checkpointing(
        model, lambda model: model(input_ids, attention_mask=attention_mask, labels=labels).loss
    )


@pytest.mark.slow
def test_torch_compile():
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(tiny_config(RoFormerConfig)).eval()
    input_ids, attention_mask, _ = make_batch()
    compiled = torch.compile(model)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask).logits
        actual = compiled(input_ids, attention_mask=attention_mask).logits
    assert max_diff(expected, actual, attention_mask) <= 1e-4


# ---------------------------------------------------------------------------------------------------------------------
# Rotary variants against readable references
# ---------------------------------------------------------------------------------------------------------------------


def reference_frequencies(config, seq_len):
    """theta_i written out from the papers / transformers' rope utilities, one formula per scaling type."""
    d, base = config.rope_dim, config.rope_parameters["rope_theta"]
    scaling = config.rope_parameters
    kind, factor = scaling.get("rope_type"), scaling.get("factor", 1.0)
    if kind == "dynamic" and seq_len > config.max_position_embeddings:
        base = base * (factor * seq_len / config.max_position_embeddings - (factor - 1)) ** (d / (d - 2))
    thetas = [base ** (-2 * i / d) for i in range(d // 2)]
    if kind == "linear":
        return [t / factor for t in thetas], 1.0
    if kind == "yarn":
        original = scaling["original_max_position_embeddings"]

        def dim_for(rotations):
            return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(math.floor(dim_for(32)), 0), min(math.ceil(dim_for(1)), d - 1)
        blended = []
        for i, t in enumerate(thetas):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            blended.append(t / factor * ramp + t * (1 - ramp))
        return blended, 0.1 * math.log(factor) + 1.0
    return thetas, 1.0


def reference_rotate(x, position, thetas, scale, layout):
    """Apply the 2x2 rotation of each pair to one vector x (D,), written as explicit matrices."""
    out = x.clone().double()
    r = 2 * len(thetas)
    for i, theta in enumerate(thetas):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + r // 2)
        angle = position * theta
        rotation = (
            torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64)
            * scale
        )
        out[[a, b]] = rotation @ x[[a, b]].double()
    return out


def reference_attention(attention_module, hidden, mask, thetas, scale, layout, kernel, rotary_value):
    """One attention module, computed position by position. hidden: (L, hidden); mask: (L,) of 0/1."""
    heads, head_dim = attention_module.num_heads, attention_module.head_dim
    q_all = attention_module.query(hidden).double().view(-1, heads, head_dim)
    k_all = attention_module.key(hidden).double().view(-1, heads, head_dim)
    v_all = attention_module.value(hidden).double().view(-1, heads, head_dim)
    L = hidden.shape[0]
    out = torch.zeros(L, heads, head_dim, dtype=torch.float64)
    for h in range(heads):
        v = [reference_rotate(v_all[n, h], n, thetas, scale, layout) if rotary_value else v_all[n, h] for n in range(L)]
        for m in range(L):
            if kernel == "softmax":
                qm = reference_rotate(q_all[m, h], m, thetas, scale, layout)
                scores = torch.stack(
                    [
                        qm @ reference_rotate(k_all[n, h], n, thetas, scale, layout) / math.sqrt(head_dim)
                        if mask[n]
                        else torch.tensor(-1e30, dtype=torch.float64)
                        for n in range(L)
                    ]
                )
                weights = torch.softmax(scores, dim=0)
                out[m, h] = sum(weights[n] * v[n] for n in range(L))
            else:
                phi = lambda t: torch.nn.functional.elu(t) + 1  # noqa: E731
                qm = phi(q_all[m, h])
                numerator = sum(
                    (
                        reference_rotate(qm, m, thetas, scale, layout)
                        @ reference_rotate(phi(k_all[n, h]), n, thetas, scale, layout)
                    )
                    * v[n]
                    for n in range(L)
                    if mask[n]
                )
                denominator = sum(qm @ phi(k_all[n, h]) for n in range(L) if mask[n])
                out[m, h] = numerator / denominator
    return out.reshape(L, heads * head_dim)


ROTARY_CASES = {
    "full": {},
    "partial_rotary_factor": {"partial_rotary_factor": 0.5},
    "rotary_dim": {"rotary_dim": 2},
    "half_layout_partial": {"rope_layout": "half", "rotary_dim": 4},
    "theta": {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    "rotary_value": {"rotary_value": True, "rotary_dim": 4},
    "linear_scaling": {"rope_parameters": {"rope_type": "linear", "factor": 4.0}},
    "dynamic_ntk": {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8},
    "yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}},
    "linear_kernel": {"attention_kernel": "linear"},
    "linear_kernel_partial_half": {"attention_kernel": "linear", "rotary_dim": 4, "rope_layout": "half"},
}


@pytest.mark.parametrize("case", ROTARY_CASES.values(), ids=ROTARY_CASES.keys())
def test_attention_matches_readable_reference(case):
    torch.manual_seed(0)
    config = tiny_config(RoFormerConfig, num_hidden_layers=1, **case)
    model = RoFormerModel(config).eval()
    attention = model.encoder.layer[0].attention.self
    seq_len = 12
    hidden = torch.randn(1, seq_len, 32)
    mask = torch.ones(1, seq_len, dtype=torch.long)
    mask[0, 9:] = 0
    thetas, scale = reference_frequencies(config, seq_len)
    expected = reference_attention(
        attention, hidden[0], mask[0], thetas, scale, config.rope_layout, config.attention_kernel, config.rotary_value
    )
    cos, sin = model.rotary_emb.rotation(torch.arange(seq_len)[None], seq_len, torch.float32)
    from transformers.masking_utils import create_bidirectional_mask

    # the attention plan of a padded pass: the mask its kernel takes
    plan = create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=mask)
    if config.attention_kernel == "linear":
        plan = mask.bool()
    with torch.no_grad():
        actual, _ = attention(hidden, plan, (cos, sin))
    diff = (actual[0, :9].double() - expected[:9]).abs().max().item()
    assert diff <= TOL, f"max abs diff {diff}"


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 3.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "mscale": 0.7,
            "mscale_all_dim": 1.0,
            "beta_fast": 16,
            "beta_slow": 2,
        },
    ],
    ids=["linear", "dynamic", "yarn", "yarn_mscale"],
)
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_scaled_frequencies_match_transformers_rope_utilities(scaling, partial):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ours = tiny_config(
        RoFormerConfig, rope_parameters=scaling, partial_rotary_factor=partial, max_position_embeddings=64
    )
    llama = LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        max_position_embeddings=64,
        rope_parameters={**scaling, "rope_theta": 10000.0, "partial_rotary_factor": partial},
    )
    seq_len = 200
    expected, expected_scale = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](llama, "cpu", seq_len=seq_len)
    actual, scale = rope_inverse_frequencies(ours, seq_len)
    assert torch.allclose(actual.float(), expected, rtol=1e-6)
    assert scale == pytest.approx(expected_scale)


def test_dynamic_ntk_only_changes_long_inputs():
    torch.manual_seed(0)
    plain = RoFormerModel(tiny_config(RoFormerConfig, max_position_embeddings=16)).eval()
    dynamic = RoFormerModel(
        tiny_config(RoFormerConfig, max_position_embeddings=16, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    ).eval()
    dynamic.load_state_dict(plain.state_dict())
    short, long = torch.randint(1, 99, (1, 12)), torch.randint(1, 99, (1, 40))
    with torch.no_grad():
        assert torch.allclose(plain(short)[0], dynamic(short)[0], atol=TOL)
        assert (plain(long)[0] - dynamic(long)[0]).abs().max() > 1e-5
        positions = torch.arange(40)[None]
        plain_cos, _ = plain.rotary_emb.rotation(positions, 40, torch.float32)
        dynamic_cos, _ = dynamic.rotary_emb.rotation(positions, 40, torch.float32)
    assert not torch.allclose(plain_cos, dynamic_cos, atol=1e-3)


@pytest.mark.parametrize(
    "extra",
    [{}, {"rotary_value": True}, {"rotary_dim": 4}, {"attention_kernel": "linear"}],
    ids=["plain", "rotary_value", "partial", "linear_kernel"],
)
def test_layout_conversion_gives_identical_outputs(extra):
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(tiny_config(RoFormerConfig, **extra)).eval()
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        interleaved = model(input_ids, attention_mask=attention_mask).logits
        convert_rope_layout(model, "half")
        assert model.config.rope_layout == "half"
        half = model(input_ids, attention_mask=attention_mask).logits
        convert_rope_layout(model, "interleaved")
        back = model(input_ids, attention_mask=attention_mask).logits
    assert max_diff(interleaved, half, attention_mask) <= TOL
    assert max_diff(interleaved, back, attention_mask) <= TOL


def test_layouts_differ_without_conversion():
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig)).eval()
    other = RoFormerModel(tiny_config(RoFormerConfig, rope_layout="half")).eval()
    with torch.no_grad():  # sharper attention, so that positions matter
        for name, param in model.named_parameters():
            if ".query." in name or ".key." in name:
                param.mul_(4)
    other.load_state_dict(model.state_dict())
    input_ids = torch.randint(1, 99, (1, 10))
    with torch.no_grad():
        assert (model(input_ids)[0] - other(input_ids)[0]).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# RoFormer-v2 options, heads, presets
# ---------------------------------------------------------------------------------------------------------------------


def test_v2_options_remove_biases_and_use_parameter_free_rms_norm():
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(tiny_config(RoFormerConfig, norm_type="rms_norm", use_bias=False)).eval()
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if "bias" in n], names
    assert not [n for n in names if "LayerNorm" in n], names
    embeddings = model.roformer.embeddings
    x = torch.randn(2, 5, 32)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12)
    assert torch.allclose(embeddings.LayerNorm(x), expected, atol=1e-6)
    logits = model(torch.randint(1, 99, (2, 7))).logits
    assert logits.shape == (2, 7, 99)
    assert model.cls.predictions.decoder.weight is model.roformer.embeddings.word_embeddings.weight


def test_mlm_decoder_is_tied_to_word_embeddings(tmp_path):
    model = RoFormerForMaskedLM(tiny_config(RoFormerConfig))
    assert model.cls.predictions.decoder.weight is model.roformer.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path)
    reloaded = RoFormerForMaskedLM.from_pretrained(tmp_path)
    assert reloaded.cls.predictions.decoder.weight is reloaded.roformer.embeddings.word_embeddings.weight


def test_no_token_type_embeddings():
    """Without token type embeddings the token_type_ids a tokenizer returns are ignored (the rule `check_inputs` holds
    for every model), but must still have the input's shape."""
    model = RoFormerModel(tiny_config(RoFormerConfig, type_vocab_size=0)).eval()
    assert not hasattr(model.embeddings, "token_type_embeddings")
    input_ids = torch.randint(1, 99, (1, 5))
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
        assert torch.equal(model(input_ids, token_type_ids=torch.ones(1, 5, dtype=torch.long))[0], expected)
    with pytest.raises(ValueError, match="token_type_ids"):
        model(input_ids, token_type_ids=torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize("summary_type", ["first", "last", "mean"])
def test_multiple_choice_summary(summary_type):
    torch.manual_seed(0)
    model = RoFormerForMultipleChoice(tiny_config(RoFormerConfig, summary_type=summary_type)).eval()
    input_ids = torch.randint(1, 99, (2, 3, 8))
    mask = torch.ones(2, 3, 8, dtype=torch.long)
    mask[..., 6:] = 0
    with torch.no_grad():
        logits = model(input_ids, attention_mask=mask).logits
        # "last" reads a padding token's state, which the base model returns with keep_padding_states (the head asks)
        hidden = model.roformer(input_ids.view(6, 8), attention_mask=mask.view(6, 8), keep_padding_states=True)[0]
    pooled = {"first": hidden[:, 0], "last": hidden[:, -1], "mean": hidden[:, :6].mean(1)}[summary_type]
    assert torch.allclose(logits, model.classifier(pooled).view(2, 3), atol=1e-6)


def test_preset_is_the_model_its_published_config_file_describes():
    """roformer-chinese-base against the config.json published with its vocabulary (tests/data). Not compared:
    max_position_embeddings, which only sizes the cached rotary table (no learned rows) and which that file states
    as 512 where the Hub checkpoint and transformers' default say 1536."""
    published = RoFormerConfig.from_pretrained(DATA_DIR / "vocab" / "roformer-chinese-base")
    preset = RoFormerConfig.from_preset("roformer-chinese-base")
    file_fields = json.loads((DATA_DIR / "vocab" / "roformer-chinese-base" / "config.json").read_text())
    ignored = {"architectures", "model_type", "transformers_version", "max_position_embeddings"}
    for field in sorted(set(file_fields) - ignored):
        assert getattr(preset, field) == getattr(published, field), field


def test_presets_take_overrides():
    check_preset_overrides(RoFormerConfig, "roformer-v2-chinese-char-base", num_hidden_layers=2, rope_layout="half")


def test_sequence_classification_losses():
    torch.manual_seed(0)
    input_ids, attention_mask, _ = make_batch()
    regression = RoFormerForSequenceClassification(tiny_config(RoFormerConfig, num_labels=1))
    out = regression(input_ids, attention_mask=attention_mask, labels=torch.tensor([0.5, 1.0, -1.0]))
    assert regression.config.problem_type == "regression" and out.loss.ndim == 0
    multi = RoFormerForSequenceClassification(
        tiny_config(RoFormerConfig, num_labels=3, problem_type="multi_label_classification")
    )
    out = multi(input_ids, attention_mask=attention_mask, labels=torch.tensor([[1.0, 0, 1], [0, 1, 0], [0, 0, 0]]))
    assert torch.isfinite(out.loss)


# ---------------------------------------------------------------------------------------------------------------------
# Causal LM
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_causal_lm_has_no_future_leakage(kernel):
    torch.manual_seed(0)
    model = RoFormerForCausalLM(tiny_config(RoFormerConfig, is_decoder=True, attention_kernel=kernel)).eval()
    input_ids = torch.randint(1, 99, (2, 10))
    changed = input_ids.clone()
    changed[:, 6:] = (changed[:, 6:] % 98) + 1
    with torch.no_grad():
        a, b = model(input_ids).logits, model(changed).logits
    assert (a[:, :6] - b[:, :6]).abs().max() <= TOL
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-4


@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_generation_with_cache_equals_without(kernel, implementation):
    torch.manual_seed(0)
    model = RoFormerForCausalLM(
        tiny_config(RoFormerConfig, is_decoder=True, attention_kernel=kernel, pad_token_id=0)
    ).eval()
    model.set_attn_implementation(implementation)
    prompt = torch.randint(1, 99, (2, 5))
    settings = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **settings)
        uncached = model.generate(prompt, use_cache=False, **settings)
        # incremental logits equal full-sequence logits
        full = model(cached).logits
        step = model(cached[:, :-1], use_cache=True)
        last = model(cached[:, -1:], past_key_values=step.past_key_values, use_cache=True).logits
    assert torch.equal(cached, uncached)
    assert (full[:, -1] - last[:, -1]).abs().max() <= TOL


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_bidirectional_prompt_generates_as_junnyus_causal_lm(implementation, tmp_path):
    torch.manual_seed(0)
    config = transformers.RoFormerConfig(**TINY, is_decoder=True, initializer_range=0.3)
    reference = transformers.RoFormerForCausalLM(config).eval()
    ours = reload_as(reference, RoFormerForCausalLM, tmp_path, bidirectional_prompt=True)
    ours.set_attn_implementation(implementation)
    prompt = torch.randint(1, 99, (2, 6))
    steps = 5
    with torch.no_grad():
        expected_tokens, expected_logits = sim_generation_reference(reference, prompt, steps)
        prompt_logits = ours(prompt).logits
        settings = dict(max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True)
        runs = {cache: ours.generate(prompt, cache_implementation=cache, **settings) for cache in ("dynamic", "static")}
    assert max_diff(prompt_logits, expected_logits[0]) <= TOL  # a forward pass without a cache: bidirectional
    for cache, generated in runs.items():
        assert torch.equal(generated.sequences, expected_tokens), cache
        for step, logits in enumerate(generated.logits):
            assert max_diff(logits, expected_logits[step][:, -1]) <= TOL, (cache, step)
    # the default stays strictly causal: the prompt's first position does not see the second
    causal = reload_as(reference, RoFormerForCausalLM, tmp_path / "causal")
    changed = prompt.clone()
    changed[:, 1] = changed[:, 1] % 98 + 1
    with torch.no_grad():
        assert max_diff(causal(prompt).logits[:, 0], causal(changed).logits[:, 0]) <= TOL
        assert max_diff(ours(prompt).logits[:, 0], ours(changed).logits[:, 0]) > 1e-3


def test_causal_lm_requires_decoder_config():
    with pytest.raises(ValueError, match="is_decoder=True"):
        RoFormerForCausalLM(tiny_config(RoFormerConfig))
    with pytest.raises(ValueError, match="is_decoder=False"):
        RoFormerForMaskedLM(tiny_config(RoFormerConfig, is_decoder=True))


# ---------------------------------------------------------------------------------------------------------------------
# Save/load, registration, real vocabularies
# ---------------------------------------------------------------------------------------------------------------------


def test_save_load_round_trip_and_auto_classes(tmp_path):
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(
        tiny_config(
            RoFormerConfig, rope_parameters={"rope_type": "linear", "factor": 2.0}, rotary_dim=4, rope_layout="half"
        )
    ).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.bin"))
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is RoFormerConfig
    assert config.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is RoFormerForMaskedLM
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is RoFormerModel
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        assert torch.equal(
            model(input_ids, attention_mask=attention_mask).logits,
            reloaded(input_ids, attention_mask=attention_mask).logits,
        )


# ---------------------------------------------------------------------------------------------------------------------
# Pooler (RoFormer-sim's sentence vector)
# ---------------------------------------------------------------------------------------------------------------------

POOLER_HEADS = [
    (RoFormerModel, {}),
    (RoFormerForMaskedLM, {}),
    (RoFormerForCausalLM, {"is_decoder": True}),
    (RoFormerForSequenceClassification, {"num_labels": 3}),
    (RoFormerForTokenClassification, {"num_labels": 5}),
    (RoFormerForQuestionAnswering, {}),
    (RoFormerForMultipleChoice, {}),
]


@pytest.mark.parametrize(("model_class", "kwargs"), POOLER_HEADS, ids=lambda v: getattr(v, "__name__", ""))
def test_pooler_is_off_by_default(model_class, kwargs):
    config = tiny_config(RoFormerConfig, **kwargs)
    assert config.add_pooling_layer is False and config.pooler_activation == "tanh"
    model = model_class(config)
    assert not [key for key in model.state_dict() if "pooler" in key]
    base = model.base_model
    assert base.pooler is None
    input_ids, attention_mask, _ = make_batch()
    output = base(input_ids, attention_mask=attention_mask, use_cache=False)
    assert output.pooler_output is None
    assert len(output.to_tuple()) == 1  # the tuple is transformers' RoFormer's: nothing added


@pytest.mark.parametrize(
    ("activation", "reference"),
    [("linear", lambda x: x), ("tanh", torch.tanh), ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))))],
)
def test_pooler_output_is_activation_of_dense_on_first_token(activation, reference):
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig, add_pooling_layer=True, pooler_activation=activation)).eval()
    assert sorted(key for key in model.state_dict() if "pooler" in key) == ["pooler.dense.bias", "pooler.dense.weight"]
    with torch.no_grad():
        model.pooler.dense.bias.normal_()  # a zero-initialised bias would hide a missing one
    input_ids, attention_mask, token_type_ids = make_batch()
    with torch.no_grad():
        output = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    weight, bias = model.pooler.dense.weight, model.pooler.dense.bias
    first = output.last_hidden_state[:, 0]
    expected = reference(first @ weight.T + bias)
    assert output.pooler_output.shape == (3, TINY["hidden_size"])
    assert (output.pooler_output - expected).abs().max().item() <= TOL
    assert torch.equal(output.to_tuple()[-1], output.pooler_output)  # last in the tuple, after transformers' fields


def test_pooler_round_trips_and_heads_carry_it(tmp_path):
    torch.manual_seed(0)
    config = tiny_config(RoFormerConfig, add_pooling_layer=True, pooler_activation="linear", is_decoder=True)
    model = RoFormerForCausalLM(config).eval()
    assert {"roformer.pooler.dense.weight", "roformer.pooler.dense.bias"} <= set(model.state_dict())
    with torch.no_grad():
        model.roformer.pooler.dense.bias.normal_()
    model.save_pretrained(tmp_path)
    saved = AutoConfig.from_pretrained(tmp_path)
    assert saved.add_pooling_layer is True and saved.pooler_activation == "linear"
    # the sentence vector of a RoFormer-sim-style causal LM: its encoder, bidirectional, pooled
    base = AutoModel.from_pretrained(tmp_path, is_decoder=False).eval()
    assert type(base) is RoFormerModel
    for key, value in model.roformer.state_dict().items():
        assert torch.equal(base.state_dict()[key], value), key
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        pooled = base(input_ids, attention_mask=attention_mask).pooler_output
        reference = RoFormerModel(
            tiny_config(RoFormerConfig, add_pooling_layer=True, pooler_activation="linear")
        ).eval()
        reference.load_state_dict(model.roformer.state_dict())
        assert torch.equal(pooled, reference(input_ids, attention_mask=attention_mask).pooler_output)
        reloaded = AutoModel.from_pretrained(tmp_path).eval()  # is_decoder as saved: causal, still pooled
        past = reloaded(input_ids[:, :5], use_cache=True)
        assert past.past_key_values is not None and past.pooler_output.shape == (3, TINY["hidden_size"])


def test_model_type_is_distinct_from_transformers():
    assert RoFormerConfig.model_type == "posformers-roformer"
    assert transformers.CONFIG_MAPPING["roformer"] is transformers.RoFormerConfig
    assert transformers.CONFIG_MAPPING["posformers-roformer"] is RoFormerConfig
    for auto in (
        transformers.AutoModelForCausalLM,
        transformers.AutoModelForQuestionAnswering,
        transformers.AutoModelForMultipleChoice,
        transformers.AutoModelForTokenClassification,
        transformers.AutoModelForSequenceClassification,
    ):
        assert auto.from_config(
            tiny_config(RoFormerConfig, is_decoder=auto is transformers.AutoModelForCausalLM)
        ).__module__.startswith("posformers.")
    assert posformers.__version__


def test_real_vocabularies_run_through_the_model():
    bert_vocab = DATA_DIR / "vocab" / "bert-base-uncased"
    roformer_dir = DATA_DIR / "vocab" / "roformer-chinese-base"
    english = transformers.BertTokenizer.from_pretrained(bert_vocab)
    assert english.vocab_size == 30522
    chinese = transformers.RoFormerTokenizer.from_pretrained(roformer_dir)
    config = RoFormerConfig.from_pretrained(
        roformer_dir,
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=37,
        embedding_size=32,
    )
    assert config.vocab_size == chinese.vocab_size == 50000 and config.max_position_embeddings == 512
    model = RoFormerForMaskedLM(config).eval()
    batch = chinese(["今天天气非常好。", "旋转位置编码"], padding=True, return_tensors="pt")
    assert batch["input_ids"].max() < config.vocab_size and (batch["input_ids"] != chinese.unk_token_id).any()
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (*batch["input_ids"].shape, 50000) and torch.isfinite(logits).all()
    ids = english(["rotary position embedding", "hello"], padding=True, return_tensors="pt")
    english_model = RoFormerModel(tiny_config(RoFormerConfig, vocab_size=english.vocab_size)).eval()
    with torch.no_grad():
        assert torch.isfinite(english_model(**ids).last_hidden_state).all()


# ---------------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 30}, "divisible by num_attention_heads"),
        ({"rotary_dim": 3}, "rotary_dim must be even"),
        ({"rotary_dim": 16}, "at most the head dimension"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be in"),
        ({"rotary_dim": 4, "partial_rotary_factor": 1.0}, "disagrees with partial_rotary_factor"),
        ({"rope_layout": "blocks"}, "rope_layout must be one of"),
        ({"norm_type": "batch_norm"}, "norm_type must be one of"),
        ({"attention_kernel": "flash"}, "attention_kernel must be one of"),
        ({"summary_type": "attn"}, "summary_type must be one of"),
        ({"rope_parameters": {"rope_type": "ntk-by-parts", "factor": 2.0}}, "rope_type'] must be one of"),
        ({"rope_parameters": {"rope_type": "linear"}}, "needs the key"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 0.5}}, "must be a number >= 1"),
        ({"rope_parameters": ["linear", 2.0]}, "must be a dict"),
        ({"rope_parameters": {"rope_theta": 0}}, r"rope_parameters\['rope_theta'\] must be positive"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be in"),
        ({"pad_token_id": 500}, "pad_token_id"),
        ({"add_cross_attention": True}, "add_cross_attention"),
        ({"pooler_activation": "arctan"}, "pooler_activation must be the name of an activation"),
        ({"pooler_activation": None}, "pooler_activation must be the name of an activation"),
        ({"add_pooling_layer": "yes"}, "add_pooling_layer must be True or False"),
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(RoFormerConfig, **overrides)


def test_legacy_rope_scaling_type_key_is_accepted():
    config = tiny_config(RoFormerConfig, rope_scaling={"type": "linear", "factor": 2.0})
    assert config.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": torch.ones(2, 5, dtype=torch.long), "inputs_embeds": torch.zeros(2, 5, 32)}, "got both"),
        ({}, "got neither"),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 6)},
            "attention_mask has shape",
        ),
        ({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(5)}, "attention_mask must be"),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "token_type_ids": torch.ones(2, 4, dtype=torch.long)},
            "token_type_ids has shape",
        ),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "token_type_ids": torch.full((2, 5), 7)},
            "token_type_ids must",
        ),
        (
            {"input_ids": torch.ones(2, 5, dtype=torch.long), "position_ids": torch.arange(4)[None]},
            "position_ids has shape",
        ),
        ({"input_ids": torch.full((2, 5), 99)}, r"input_ids must lie in \[0, 99\)"),
        ({"input_ids": torch.ones(5, dtype=torch.long)}, "input_ids must have shape"),
        ({"inputs_embeds": torch.zeros(2, 5, 31)}, "inputs_embeds must have shape"),
        ({"input_ids": torch.ones(2, 0, dtype=torch.long)}, "empty"),
    ],
)
def test_bad_inputs_give_clear_errors(kwargs, message):
    model = RoFormerModel(tiny_config(RoFormerConfig)).eval()
    with pytest.raises(ValueError, match=message):
        model(**kwargs)


def test_linear_kernel_refuses_4d_masks():
    model = RoFormerModel(tiny_config(RoFormerConfig, attention_kernel="linear"))
    with pytest.raises(ValueError, match="takes a 2D attention_mask"):
        model(torch.ones(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))


def test_multiple_choice_needs_a_choice_dimension():
    model = RoFormerForMultipleChoice(tiny_config(RoFormerConfig))
    with pytest.raises(ValueError, match="num_choices"):
        model(torch.ones(2, 5, dtype=torch.long))


def test_output_attentions_with_flex_is_refused_clearly():
    model = RoFormerModel(tiny_config(RoFormerConfig))
    model.config._attn_implementation = "flex_attention"
    with warnings.catch_warnings(), pytest.raises(ValueError, match="output_attentions=True needs"):
        warnings.simplefilter("ignore")
        model(torch.ones(1, 5, dtype=torch.long), output_attentions=True)


@pytest.mark.slow
@pytest.mark.parametrize("is_decoder", [False, True], ids=["encoder", "decoder"])
def test_flex_attention_equals_sdpa(is_decoder):
    """flex_attention runs on CPU for inference only (torch has no CPU backward for it)."""
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig, is_decoder=is_decoder)).eval()
    input_ids, attention_mask, _ = make_batch()
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask).last_hidden_state
        model.set_attn_implementation("flex_attention")
        actual = model(input_ids, attention_mask=attention_mask).last_hidden_state
    assert max_diff(expected, actual, attention_mask) <= TOL


# ---------------------------------------------------------------------------------------------------------------------
# Edge cases transformers' RoFormer handles
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("unpad_inputs", ["auto", "always", "never"])
def test_batch_of_padding_only_returns_outputs(unpad_inputs, tmp_path):
    """A batch whose every row is padding runs as transformers' RoFormer does, with zeros at the padded positions."""
    torch.manual_seed(0)
    reference = transformers.RoFormerForTokenClassification(transformers.RoFormerConfig(**TINY, num_labels=3)).eval()
    ours = reload_as(reference, RoFormerForTokenClassification, tmp_path, unpad_inputs=unpad_inputs)
    input_ids, attention_mask = torch.randint(1, 99, (2, 6)), torch.zeros(2, 6, dtype=torch.long)
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        actual = ours(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert actual.logits.shape == expected.logits.shape
    assert not actual.logits.any()
    assert len(actual.hidden_states) == len(expected.hidden_states)
    assert not any(h.any() for h in actual.hidden_states)


def test_rotary_tables_are_rebuilt_after_meta_device_loading(tmp_path):
    torch.manual_seed(0)
    model = RoFormerModel(tiny_config(RoFormerConfig)).eval()
    model.save_pretrained(tmp_path)
    loaded = RoFormerModel.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.rotary_emb.cos_cached, model.rotary_emb.cos_cached)
    assert torch.equal(loaded.rotary_emb.sin_cached, model.rotary_emb.sin_cached)


@pytest.mark.parametrize("output", ["last_hidden_state", "hidden_states", "logits"])
def test_padded_positions_hold_zeros_on_every_path(output):
    """Per-token outputs at padded positions are zeros whether the batch ran padded or padding-free, so a row's outputs
    do not depend on the path its batch took."""
    torch.manual_seed(0)
    model_class = RoFormerModel if output != "logits" else RoFormerForTokenClassification
    model = model_class(tiny_config(RoFormerConfig, num_labels=3)).eval()
    input_ids, attention_mask, _ = make_batch()
    results = {}
    for mode in ("never", "always"):
        model.config.unpad_inputs = mode
        with torch.no_grad():
            result = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        states = getattr(result, output)
        results[mode] = torch.stack(states) if output == "hidden_states" else states[None]
        padding = attention_mask[None, ..., None].expand_as(results[mode]) == 0
        assert not results[mode][padding].any(), f"unpad_inputs={mode!r}: non-zero {output} at padded positions"
    torch.testing.assert_close(results["never"], results["always"], atol=1e-5, rtol=0)


def test_causal_lm_logits_hold_zeros_at_padding():
    """The decoder runs padded only; its per-token logits follow the same rule (a left-padded prompt, as `generate`
    pads it)."""
    torch.manual_seed(0)
    model = RoFormerForCausalLM(tiny_config(RoFormerConfig, is_decoder=True)).eval()
    torch.nn.init.normal_(model.cls.predictions.transform.LayerNorm.bias)  # the head maps zero states to non-zeros
    input_ids, attention_mask, _ = make_batch()
    attention_mask = attention_mask.flip(-1)
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask).logits
        last = model(input_ids, attention_mask=attention_mask, logits_to_keep=1).logits
    assert not logits[attention_mask == 0].any()
    assert logits[attention_mask == 1].abs().sum(-1).min() > 0
    torch.testing.assert_close(last, logits[:, -1:])
