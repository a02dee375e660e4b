"""LittleBird base (12 x 768 x 12 heads, block 64, pack 64) vs transformers' long-input encoders of the same size:
BigBirdModel (block_sparse, block 64, 3 random blocks) and LongformerModel (window 512), with BERT (sdpa, dense
attention) as the yardstick of an encoder this size. The models do not compute the same function (no shared weights):
the comparison is the cost of reading a long document.

`littlebird-scaling` times LittleBird alone from 1024 to 16384 tokens, to check that the cost grows linearly.
"""

import torch
from transformers import BertConfig, BertModel, BigBirdConfig, BigBirdModel, LongformerConfig, LongformerModel

import posformers

from .harness import ModelEntry, Suite, Target, random_token_inputs

BASE = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
)
DEFAULT_SEQ_LENS = (4096,)


def _littlebird():
    torch.manual_seed(0)
    return posformers.LittleBirdModel(posformers.LittleBirdConfig(**BASE, block_size=64, pack_length=64))


# ids from 5 up: past the special tokens of a BERT vocabulary
_make_inputs = random_token_inputs(BASE["vocab_size"], first_id=5)


def build_suite(max_seq_len: int) -> Suite:
    positions = max(4096, max_seq_len)

    def bigbird():
        torch.manual_seed(0)
        config = BigBirdConfig(
            **BASE, attention_type="block_sparse", block_size=64, num_random_blocks=3, max_position_embeddings=positions
        )
        return BigBirdModel(config, add_pooling_layer=False)

    def longformer():
        torch.manual_seed(0)
        config = LongformerConfig(**BASE, attention_window=512, max_position_embeddings=positions + 2, pad_token_id=1)
        return LongformerModel(config, add_pooling_layer=False)

    def bert_sdpa():
        torch.manual_seed(0)
        config = BertConfig(**BASE, max_position_embeddings=positions, attn_implementation="sdpa")
        return BertModel(config, add_pooling_layer=False)

    return Suite(
        name="littlebird",
        models=[
            ModelEntry("posformers", _littlebird, "posformers.LittleBirdModel (block 64, pack 64)"),
            ModelEntry("hf-bigbird", bigbird, "transformers.BigBirdModel, block_sparse, block 64, 3 random blocks"),
            ModelEntry("hf-longformer", longformer, "transformers.LongformerModel, attention_window 512"),
            ModelEntry("hf-bert-sdpa", bert_sdpa, "transformers.BertModel, sdpa (dense attention), no pooler"),
        ],
        candidate="posformers",
        references=["hf-bigbird", "hf-longformer", "hf-bert-sdpa"],
        make_inputs=_make_inputs,
        config=BASE,
        targets=[
            Target("forward", 4096, "hf-bigbird", 0.50),
            Target("forward", 4096, "hf-longformer", 0.60),
            Target("forward", 4096, "hf-bigbird", 0.70, metric="memory"),
        ],
        notes=[
            "Inputs: random input_ids and an all-ones attention_mask; different weights per model (no shared "
            "architecture), so outputs are not compared."
        ],
    )


def build_scaling_suite(max_seq_len: int) -> Suite:
    return Suite(
        name="littlebird-scaling",
        models=[ModelEntry("posformers", _littlebird, "posformers.LittleBirdModel (block 64, pack 64)")],
        candidate="posformers",
        references=[],
        make_inputs=_make_inputs,
        config=BASE,
        targets=[Target("forward", 8192, "posformers", 4.6, reference_seq_len=2048)],
        notes=["Linear cost: the forward time at 8192 tokens should stay within 4.6x the time at 2048."],
    )
