"""RoFormer base: posformers' RoFormerModel (sdpa, its default) vs transformers' RoFormerModel (eager, its only
attention) vs transformers' BertModel with sdpa, all built at the same size with the same weights.

BERT has no rotary embedding: it is the "cost of an encoder this size with the same attention kernel" yardstick, so
the posformers / BERT ratio is what rotary positions (and posformers' code around them) cost.
"""

import torch
from transformers import BertConfig, BertModel
from transformers import RoFormerConfig as HFRoFormerConfig
from transformers import RoFormerModel as HFRoFormerModel

import posformers

from .harness import ModelEntry, SharedWeights, Suite, Target, random_token_inputs

# RoFormer base (junnyu/roformer_chinese_base sizes), with the released dropout 0.1; it only acts when the train
# workload is run with --dropout.
BASE = dict(
    vocab_size=50000,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    type_vocab_size=2,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
)
# transformers' sinusoidal table, not present in the other two models.
HF_ROFORMER_ONLY = ("encoder.embed_positions.weight",)
# BERT's learned absolute positions: not in RoFormer, so left at BERT's own (seeded) initialisation.
BERT_ONLY = ("embeddings.position_embeddings.weight",)


def _expect_attention(model, implementation: str):
    actual = model.config._attn_implementation
    if actual != implementation:
        raise RuntimeError(f"{type(model).__module__}.{type(model).__name__} runs {actual!r}, not {implementation!r}")
    return model


def build_suite(max_seq_len: int) -> Suite:
    # transformers' RoFormer raises IndexError past max_position_embeddings and BERT's table must cover every
    # position, so every model is sized to the longest benchmarked length (at least the released 512).
    size = dict(BASE, max_position_embeddings=max(512, max_seq_len))

    def hf_roformer():
        torch.manual_seed(0)
        return _expect_attention(HFRoFormerModel(HFRoFormerConfig(**size)), "eager")

    weights = SharedWeights(hf_roformer)

    def hf_roformer_shared():
        return weights.load_into(hf_roformer())

    def posformers_roformer():
        model = posformers.RoFormerModel(posformers.RoFormerConfig(**size))
        return _expect_attention(weights.load_into(model, allowed_unexpected=HF_ROFORMER_ONLY), "sdpa")

    def bert_sdpa():
        torch.manual_seed(0)
        model = BertModel(BertConfig(**size, attn_implementation="sdpa"), add_pooling_layer=False)
        model = weights.load_into(model, allowed_missing=BERT_ONLY, allowed_unexpected=HF_ROFORMER_ONLY)
        return _expect_attention(model, "sdpa")

    return Suite(
        name="roformer",
        models=[
            ModelEntry("posformers", posformers_roformer, "posformers.RoFormerModel, attn_implementation sdpa"),
            ModelEntry("hf-roformer", hf_roformer_shared, "transformers.RoFormerModel (eager attention only)"),
            ModelEntry("hf-bert-sdpa", bert_sdpa, "transformers.BertModel, sdpa, no pooler, same size"),
        ],
        candidate="posformers",
        references=["hf-roformer", "hf-bert-sdpa"],
        make_inputs=random_token_inputs(size["vocab_size"]),
        config=size,
        equivalent=["hf-roformer", "posformers"],
        targets=[
            Target("forward", 512, "hf-roformer", 0.85),
            Target("forward", 512, "hf-bert-sdpa", 1.10),
        ],
        profile_functions=[
            "posformers.modeling_roformer:apply_rotary",
            "posformers.modeling_roformer:create_bidirectional_mask",
            "posformers.modeling_roformer:check_inputs",
            "transformers.models.roformer.modeling_roformer:create_bidirectional_mask",
            "transformers.models.bert.modeling_bert:create_bidirectional_mask",
        ],
        notes=[
            "Inputs: random input_ids in [1, vocab) and an all-ones attention_mask (what a tokenizer returns for an "
            "unpadded batch); no token_type_ids.",
            f"All three models: max_position_embeddings = {size['max_position_embeddings']}; BERT's position "
            "embeddings and the absence of a pooler are its only differences from RoFormer's parameters.",
        ],
    )
