"""BERT's layer pieces around attention, shared by the encoders: the projection of a block's output back onto the
residual stream (`ResidualOutput`: BERT's SelfOutput and Output), the first half of the feed-forward block
(`Intermediate`) and, for RoFormer and LittleBird, the embeddings without positions (`TokenEmbeddings`). Module names
are BERT's (`dense`, `LayerNorm`, `word_embeddings`), so checkpoints load unchanged."""

import torch
from torch import nn
from transformers.activations import ACT2FN


class Intermediate(nn.Module):
    """dense (hidden_size -> intermediate_size), then the activation."""

    def __init__(self, config, bias: bool = True):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class ResidualOutput(nn.Module):
    """norm(dropout(dense(x)) + residual): BERT's SelfOutput (input_size = hidden_size, after attention) and Output
    (input_size = intermediate_size, after the feed-forward block). `norm`: LayerNorm(hidden_size) unless given."""

    def __init__(self, config, input_size: int, bias: bool = True, norm: nn.Module | None = None):
        super().__init__()
        self.dense = nn.Linear(input_size, config.hidden_size, bias=bias)
        self.LayerNorm = norm if norm is not None else nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class TokenEmbeddings(nn.Module):
    """Word and token-type embeddings, then `norm` and dropout, with no absolute positions (RoFormer and LittleBird
    put positions inside attention). Without token_type_ids every token gets type 0; with `type_vocab_size=0` there
    is no token-type table and token_type_ids are ignored. `size`: the embedding width (hidden_size unless given);
    `norm`: LayerNorm(size) unless given."""

    def __init__(self, config, size: int | None = None, norm: nn.Module | None = None):
        super().__init__()
        size = size or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, size, padding_idx=config.pad_token_id)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, size)
        self.LayerNorm = norm if norm is not None else nn.LayerNorm(size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, inputs_embeds=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))
