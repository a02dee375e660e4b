"""DeBERTa-v3-base shape: posformers' DebertaModel (its default attention: sdpa on CPU, the fused kernel with CUDA)
vs transformers' DebertaV2Model (eager, its only attention) on the same weights, plus transformers' BertModel with
sdpa at the same size as the floor (what an encoder of this size costs without disentangled attention).
"""

import tempfile

import torch
from transformers import BertConfig, BertModel, DebertaV2Config, DebertaV2Model

import posformers

from .harness import ModelEntry, SharedWeights, Suite, Target, random_token_inputs

# microsoft/deberta-v3-base's config.json, vocabulary included.
V3_BASE = dict(
    vocab_size=128100,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    relative_attention=True,
    position_buckets=256,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    pos_att_type=["p2c", "c2p"],
    layer_norm_eps=1e-7,
    max_relative_positions=-1,
    position_biased_input=False,
    type_vocab_size=0,
)
DEFAULT_SEQ_LENS = (512, 2048)


def build_suite(max_seq_len: int) -> Suite:
    def hf_deberta():
        torch.manual_seed(0)
        return DebertaV2Model(DebertaV2Config(**V3_BASE))

    weights = SharedWeights(hf_deberta)

    def hf_deberta_shared():
        return weights.load_into(hf_deberta())

    def posformers_deberta():
        # The config goes through config.json as a user's official file would.
        with tempfile.TemporaryDirectory() as folder:
            DebertaV2Config(**V3_BASE).save_pretrained(folder)
            config = posformers.DebertaConfig.from_pretrained(folder)
        return weights.load_into(posformers.DebertaModel(config))

    def bert_sdpa():
        torch.manual_seed(0)
        size = {
            k: V3_BASE[k]
            for k in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "hidden_act",
            )
        }
        config = BertConfig(**size, max_position_embeddings=max(512, max_seq_len), attn_implementation="sdpa")
        return BertModel(config, add_pooling_layer=False)

    return Suite(
        name="deberta",
        models=[
            ModelEntry(
                "posformers",
                posformers_deberta,
                "posformers.DebertaModel, its default attention (sdpa on CPU, posformers_fused with CUDA)",
            ),
            ModelEntry("hf-deberta-v2", hf_deberta_shared, "transformers.DebertaV2Model (eager attention only)"),
            ModelEntry("hf-bert-sdpa", bert_sdpa, "transformers.BertModel, sdpa, no pooler, same size (the floor)"),
        ],
        candidate="posformers",
        references=["hf-deberta-v2", "hf-bert-sdpa"],
        make_inputs=random_token_inputs(V3_BASE["vocab_size"]),
        config=V3_BASE,
        equivalent=["hf-deberta-v2", "posformers"],
        targets=[
            Target("forward", 512, "hf-deberta-v2", 0.60),
            Target("forward", 2048, "hf-deberta-v2", 0.50),
        ],
        notes=[
            "Inputs: random input_ids and an all-ones attention_mask; DeBERTa-v3 has no token types.",
            "transformers' DeBERTa differs from the official model past 512 tokens (it skips the official clip of "
            "relative distances), so the equivalence check is reported at every length but only meaningful to 512.",
        ],
    )
