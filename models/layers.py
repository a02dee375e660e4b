"""BERT's layer pieces around attention, shared by the three encoders: the projection of a block's output back onto
the residual stream (`ResidualOutput`: BERT's SelfOutput and Output) and the first half of the feed-forward block
(`Intermediate`). Module names are BERT's (`dense`, `LayerNorm`), so checkpoints load unchanged."""

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
