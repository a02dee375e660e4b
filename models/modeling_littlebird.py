"""PyTorch LittleBird (Lee, Han, Shin, EMNLP 2022, arXiv 2210.11870), as `docs/littlebird.md` specifies it, whose tags
are repeated here: [paper] from the paper, [recon] reconstructed, [choice] a decision of posformers. One layer, post-LN
[paper], with token states X (B, L, d) and pack states P (B, s, d):

    Cp = PackAttn(P, X)        queries P, keys/values X; padded keys masked          (B, s, d)
    P' = LayerNorm(Cp + P)     feeds the next layer (the last layer computes none)
    Cx = USWAttn(X, Cp)        unpack + sliding window, one joint softmax            (B, L, d)
    A  = LayerNorm(Cx + X)
    X' = LayerNorm(FFN(A) + A)

USWAttn gives each query token one softmax over the `s` unpacked keys K(Cp) and the 4 key blocks of its query block
(block 0, global as keys only, and a band of 3), with BiALiBi biases instead of position embeddings. Its kernels and
the padded/padding-free dispatch live in `littlebird_kernels.py`. Padding-free, every projection, feed-forward block
and LayerNorm runs on the real tokens as one (1, N, d) row; the attentions run per example, on length groups.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import is_torchdynamo_compiling
from transformers.utils.generic import can_return_tuple

from .attention import FusedKernelChoice
from .configuration_littlebird import LittleBirdConfig
from .heads import (
    EncoderForMaskedLM,
    EncoderForMultipleChoice,
    EncoderForQuestionAnswering,
    EncoderForQuestionSpanSelection,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
    SpanSelectionTransform,
)
from .hub_methods import HubMethods
from .inputs import check_inputs, check_padding_mask, check_per_token
from .layers import Intermediate, ResidualOutput, TokenEmbeddings
from .littlebird_kernels import (
    FEED_FORWARD_CHUNK_ELEMENTS,
    FLEX_ATTENTION_REFUSAL,
    BlockSparseLayout,
    GroupLayouts,
    attend_per_example,
    attention_plan,
    lean_feed_forward,
    unpack_sliding_window_kernel,
)
from .packing import UNPLANNED, PackedBatch, keep_states, pass_inputs, plan_packing, state_shower, zero_padding


class LittleBirdEmbeddings(TokenEmbeddings):
    """Word and token-type embeddings, LayerNorm, dropout; no absolute positions (BiALiBi is the only position
    signal, so there is no maximum length) [paper]. Also holds P0, the learned pack states fed to layer 1 [paper]."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.pack_embeddings = nn.Parameter(torch.empty(config.pack_length, config.hidden_size))


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's geometric slopes `2^(-8h/H)` for h = 1..H, float32 (H,): the initial BiALiBi alpha, beta, gamma [choice].

    The paper trains the slopes; U(0, 1) as in the public re-implementation saturates the softmax within 2 blocks.
    """
    heads = torch.arange(1, num_heads + 1, dtype=torch.float64)
    return (2.0 ** (-8.0 * heads / num_heads)).float()


def initial_slopes(config: LittleBirdConfig) -> torch.Tensor:
    """The value every BiALiBi slope (alpha, beta, gamma) starts from, per head (config.bialibi_init)."""
    if config.bialibi_init == "alibi":
        return alibi_slopes(config.num_attention_heads)
    return torch.full((config.num_attention_heads,), float(config.bialibi_init))


class LittleBirdProjections(nn.Module):
    """The query, key and value projections of both attentions, named like BERT's self-attention's so that they map
    one to one, and the head layout they share."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def heads(self, states: torch.Tensor) -> torch.Tensor:  # (B, l, d) -> (B, l, H, d_h)
        return states.view(*states.shape[:2], self.num_heads, self.head_dim)


class LittleBirdPackAttention(LittleBirdProjections):
    """PackAttn: multi-head attention of the pack states over the tokens, with its own Q/K/V/O [choice], no position
    bias, padded keys masked (the pack states never are). Its forward returns Cp, before the residual, as USWAttn
    reads it; `update` gives P' = LayerNorm(Cp + P).

    The last layer's P' would feed nothing, so that layer has no update (`updates_pack=False`): no LayerNorm, whose
    parameters would get no gradient (plain DDP refuses such parameters), and P passes through unchanged [choice].
    """

    def __init__(self, config: LittleBirdConfig, updates_pack: bool = True):
        super().__init__(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if updates_pack else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, query, key, value, key_mask, output_attentions=False):
        """query (B, s, d) of the pack states, key and value (B, L, d) of the tokens, key_mask (B, 1, 1, L) additive
        or None -> Cp (B, s, d), weights (B, H, s, L) or None."""
        batch, pack_length, _ = query.shape
        query, key, value = (self.heads(states).transpose(1, 2) for states in (query, key, value))  # (B, H, l, d_h)
        dropout = self.attention_dropout if self.training else 0.0
        weights = None
        if output_attentions:
            scores = torch.matmul(query, key.transpose(2, 3)) * self.scaling
            if key_mask is not None:
                scores = scores + key_mask
            weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(scores.dtype)
            context = torch.matmul(F.dropout(weights, p=dropout, training=self.training), value)
        else:
            # The mask is the dtype's most negative finite value, not -inf: a sequence that is all padding gets
            # finite (uniform) weights instead of NaN.
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, dropout_p=dropout)
        return self.dense(context.transpose(1, 2).reshape(batch, pack_length, -1)), weights

    def update(self, pack_context, pack_states):
        """P' = LayerNorm(Cp + P), the next layer's pack states; P itself in the last layer, which has no update."""
        if self.LayerNorm is None:
            return pack_states
        return self.LayerNorm(self.dropout(pack_context) + pack_states)


class LittleBirdSelfAttention(LittleBirdProjections):
    """USWAttn's projections and BiALiBi slopes; named like BERT's self-attention so that its Q/K/V map one to one.

    The same K and V projections serve the unpacked keys Cp and the tokens X [paper: K(Cp), K(X)]. alpha, beta and
    gamma are per-head, per-layer, trainable [paper].
    """

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        self.config = config
        self.alpha = nn.Parameter(torch.empty(config.num_attention_heads))
        self.beta = nn.Parameter(torch.empty(config.num_attention_heads))
        self.gamma = nn.Parameter(torch.empty(config.num_attention_heads))

    def forward(self, query, key, value, pack_context, layout: BlockSparseLayout, output_attentions=False):
        """The tokens' projections query, key, value (B, L, d) and Cp (B, s, d) -> context (B, L, d), weights (B, H,
        n, b, w) or None, from the kernel `config._attn_implementation` selects (`unpack_sliding_window_kernel`)."""
        dropout = self.attention_dropout if self.training else 0.0
        query_heads = self.heads(query)
        kernel = unpack_sliding_window_kernel(
            self.config._attn_implementation, query_heads, self.alpha, dropout, output_attentions
        )
        context, weights = kernel(
            query_heads,
            self.heads(key),
            self.heads(value),
            self.heads(self.key(pack_context)),
            self.heads(self.value(pack_context)),
            self.alpha,
            self.beta,
            self.gamma,
            layout,
            scaling=self.scaling,
            dropout=dropout,
            need_weights=output_attentions,
        )
        return context.reshape(query.shape), weights


class LittleBirdAttention(nn.Module):
    """USWAttn (`self`) and its output projection (`output`), under BERT's attention names; the layer calls them in
    turn, as a padding-free pass attends per example between the two."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.self = LittleBirdSelfAttention(config)
        # the output projection exists so that a BERT/RoBERTa self-attention maps onto USWAttn one to one [choice]
        self.output = ResidualOutput(config, config.hidden_size)


class LittleBirdLayer(GradientCheckpointingLayer):
    """Pack attention, then unpack + sliding-window attention, then the feed-forward block; post-LN [paper]."""

    def __init__(self, config: LittleBirdConfig, updates_pack: bool = True):
        super().__init__()
        self.pack_attention = LittleBirdPackAttention(config, updates_pack)
        self.attention = LittleBirdAttention(config)
        self.intermediate = Intermediate(config)
        self.output = ResidualOutput(config, config.intermediate_size)
        self.feed_forward_chunk = max(1, FEED_FORWARD_CHUNK_ELEMENTS // config.intermediate_size)

    def forward(
        self, hidden_states, pack_states, attention_plan: BlockSparseLayout | GroupLayouts, output_attentions=False
    ):
        """hidden_states: (B, L, d) with the batch's `BlockSparseLayout`, or the real tokens as one (1, N, d) row with
        the `GroupLayouts` of a padding-free pass; pack_states: (B or rows, s, d). Every projection runs on
        hidden_states as given; the attentions per example (`attend_per_example`)."""
        pack_attention, attention = self.pack_attention, self.attention.self
        pack_query = pack_attention.query(pack_states)

        def attend(layout, rows, pack_key, pack_value, query, key, value):  # one padded batch of examples
            pack_query_rows = pack_query if rows is None else pack_query.index_select(0, rows)
            pack_context, pack_weights = pack_attention(
                pack_query_rows, pack_key, pack_value, layout.pack_key_mask, output_attentions
            )
            context, weights = attention(query, key, value, pack_context, layout, output_attentions)
            return context, pack_context, weights, pack_weights

        context, pack_context, weights, pack_weights = attend_per_example(
            attention_plan,
            attend,
            pack_states,
            pack_attention.key(hidden_states),
            pack_attention.value(hidden_states),
            attention.query(hidden_states),
            attention.key(hidden_states),
            attention.value(hidden_states),
        )
        pack_states = pack_attention.update(pack_context, pack_states)
        attention_output = self.attention.output(context, hidden_states)
        tokens = attention_output.flatten(0, 1)
        layer_output = torch.cat([self.feed_forward(chunk) for chunk in tokens.split(self.feed_forward_chunk)])
        return layer_output.view_as(attention_output), pack_states, weights, pack_weights

    def feed_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """X' = LayerNorm(FFN(A) + A) on (tokens, d); the activation is recomputed in backward (`lean_feed_forward`)."""
        return lean_feed_forward(self.intermediate, self.output, tokens, self.gradient_checkpointing and self.training)


@dataclass
class LittleBirdModelOutput(BaseModelOutput):
    """transformers' `BaseModelOutput` plus the pack states, which every layer carries beside the tokens.

    attentions (`tuple(torch.FloatTensor)`, *optional*): per layer, the unpack + sliding-window weights in the blocked
        layout, `(batch, heads, num_blocks, block_size, keys_per_block)`: keys are `ceil(pack_length / block_size)`
        pack blocks (unpacked keys, then padding), then the 4 window blocks of `window_key_blocks`.
    pack_states (`torch.FloatTensor` of shape `(batch_size, pack_length, hidden_size)`): the final pack states, those
        the last layer reads (it computes no update, which nothing would read); not used by the heads.
    pack_hidden_states (`tuple(torch.FloatTensor)`, *optional*): P0 and the pack states after each layer (the last
        layer's repeat the ones before it). pack_attentions (*optional*): per layer, `(batch, heads, s, L)` weights.
    """

    pack_states: torch.FloatTensor | None = None
    pack_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    pack_attentions: tuple[torch.FloatTensor, ...] | None = None


class LittleBirdEncoder(nn.Module):
    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.config = config
        last = config.num_hidden_layers - 1
        self.layer = nn.ModuleList(
            [LittleBirdLayer(config, updates_pack=index < last) for index in range(config.num_hidden_layers)]
        )

    def forward(
        self,
        hidden_states,
        pack_states,
        attention_plan: BlockSparseLayout | GroupLayouts,
        output_attentions=False,
        output_hidden_states=False,
        show_states=keep_states,
        **kwargs,
    ) -> LittleBirdModelOutput:
        """attention_plan: built once per pass (`attention_plan`), read by every layer. show_states: how the hidden
        states are handed back (`state_shower`)."""
        all_hidden_states = None
        if output_hidden_states:
            shown, hidden_states = show_states(hidden_states)
            all_hidden_states = (shown,)
        all_pack_states = (pack_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_pack_attentions = () if output_attentions else None
        for layer_module in self.layer:
            hidden_states, pack_states, weights, pack_weights = layer_module(
                hidden_states, pack_states, attention_plan, output_attentions=output_attentions
            )
            if output_hidden_states:
                shown, hidden_states = show_states(hidden_states)
                all_hidden_states += (shown,)
                all_pack_states += (pack_states,)
            if output_attentions:
                all_attentions += (weights,)
                all_pack_attentions += (pack_weights,)
        return LittleBirdModelOutput(
            last_hidden_state=hidden_states,
            pack_states=pack_states,
            hidden_states=all_hidden_states,
            pack_hidden_states=all_pack_states,
            attentions=all_attentions,
            pack_attentions=all_pack_attentions,
        )


class LittleBirdPreTrainedModel(FusedKernelChoice, HubMethods, PreTrainedModel):
    """Kernels: "eager" (the block-sparse products, the default on every device), plus "posformers_fused"
    (LittleBird's FlexAttention kernel, `littlebird_kernels.fused_unpack_sliding_window_attention`)."""

    config_class = LittleBirdConfig
    config: LittleBirdConfig
    base_model_prefix = "littlebird"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LittleBirdLayer"]
    _input_embed_layer = "word_embeddings"  # transformers' get/set_input_embeddings find embeddings.word_embeddings
    # Flattened batches (transformers' DataCollatorWithFlattening) run as they are: the attention is per sequence in
    # every packed pass, so each flattened sequence gets its own blocks, BiALiBi positions and pack states.
    accepts_flattened_batches = True
    # Checkpoints saved before the last layer lost its pack LayerNorm (its output fed nothing) hold that LayerNorm:
    # loading ignores it. Every other layer still has one, so only the last layer's can be unexpected.
    _keys_to_ignore_on_load_unexpected = [r"encoder\.layer\.\d+\.pack_attention\.LayerNorm\.(weight|bias)$"]
    flex_attention_refusal = FLEX_ATTENTION_REFUSAL

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, LittleBirdEmbeddings):
            # P0 at the tokens' scale (unit RMS): at initializer_range it is swamped by the pooled tokens and the s
            # pack states collapse into one after layer 1 [choice: not in the paper; docs/littlebird.md, "P0"].
            init.normal_(module.pack_embeddings, mean=0.0, std=1.0)
        elif isinstance(module, LittleBirdSelfAttention):
            slopes = initial_slopes(self.config).to(module.alpha.device)
            for slope in (module.alpha, module.beta, module.gamma):
                init.copy_(slope, slopes)
        elif isinstance(module, LittleBirdLMPredictionHead):
            init.zeros_(module.bias)

    @property
    def base_model_class(self) -> type:
        return LittleBirdModel


def check_littlebird_mask(attention_mask: torch.Tensor, shape: tuple[int, int]) -> None:
    """LittleBird's rule for `check_inputs`: a (batch, seq_len) padding mask whose rows start with a real token."""
    check_padding_mask(attention_mask, shape)
    if is_torchdynamo_compiling():
        return
    real = attention_mask.bool()
    if (~real[:, 0] & real.any(-1)).any():
        # Positions and blocks count from the first token: left padding would move every real token. Padding between
        # real tokens after a real first one is Padding Insertion, which moves them on purpose.
        raise ValueError(
            "LittleBird needs right-padded input (real tokens first, then padding): the attention_mask has a padded "
            "first token before real ones. Pad on the right (tokenizer.padding_side = 'right')."
        )


def check_token_positions(position_ids: torch.Tensor, shape: tuple[int, int]) -> None:
    """position_ids outside a flattened batch must be what LittleBird reads anyway: 0, 1, 2, ... in every row."""
    check_per_token("position_ids", position_ids, shape)
    if is_torchdynamo_compiling():
        return
    if not bool((position_ids == torch.arange(shape[1], device=position_ids.device)).all()):
        raise ValueError(
            "position_ids must be 0, 1, 2, ... in every row (LittleBird's positions are the token indices) or mark a "
            "flattened batch (one row, restarting at 0 for each sequence)"
        )


class LittleBirdModel(LittleBirdPreTrainedModel):
    """The bare LittleBird encoder: final token states (zeros at padding), plus the final pack states. `position_ids`
    only mark a flattened batch (one row whose positions restart at 0 per sequence), which comes back flattened, with
    (num_sequences, s, d) pack states: LittleBird's positions are the token indices."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__(config)
        config.validate_fields()  # fields may have been changed since the config was created
        self.embeddings = LittleBirdEmbeddings(config)
        self.encoder = LittleBirdEncoder(config)
        self.post_init()

    def packing_for(
        self, input_ids, inputs_embeds, attention_mask, position_ids, output_attentions, kwargs: dict
    ) -> PackedBatch | None:
        """The pass's packing (`plan_packing`; None: the padded path), popping a flattened batch's keywords from
        `kwargs`. output_attentions, and padding between real tokens (Padding Insertion), rule packing out."""
        reference, cu_seq_lens = pass_inputs(input_ids, inputs_embeds, attention_mask, position_ids, kwargs)
        if reference is None:
            return None
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        blocker = (
            "output_attentions=True (the weights come in the padded blocked layout)" if output_attentions else None
        )
        shape = tuple(reference.shape[:2])
        return plan_packing(self.config, shape, attention_mask, position_ids, cu_seq_lens, blocker, reference.device)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        packing: PackedBatch | None = UNPLANNED,
        **kwargs,
    ) -> LittleBirdModelOutput:
        """`packing`: the plan of this pass (a head's `packing_for`; None: the padded path), else planned here."""
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        shape = check_inputs(
            config, self.dtype, *inputs, embedding_size=config.hidden_size, check_mask=check_littlebird_mask
        )
        if packing is UNPLANNED:
            packing = self.packing_for(
                input_ids, inputs_embeds, attention_mask, position_ids, output_attentions, kwargs
            )
        if position_ids is not None and (packing is None or not packing.flattened):
            check_token_positions(position_ids, shape)
        if packing is not None:
            input_ids, inputs_embeds, token_type_ids = map(
                packing.pack_input, (input_ids, inputs_embeds, token_type_ids)
            )

        embedding_output = self.embeddings(
            input_ids=input_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds
        )
        pack_states = self.embeddings.pack_embeddings.expand(packing.rows if packing else shape[0], -1, -1)
        restore = packing.restore if packing is not None else lambda states: zero_padding(states, attention_mask)
        encoder_outputs = self.encoder(
            embedding_output,
            pack_states,
            attention_plan(config, embedding_output, attention_mask, packing),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            show_states=state_shower(restore, packing),
            **kwargs,
        )
        if output_hidden_states:
            encoder_outputs.last_hidden_state = encoder_outputs.hidden_states[-1]
        else:
            encoder_outputs.last_hidden_state = restore(encoder_outputs.last_hidden_state)
        return encoder_outputs


class LittleBirdLMPredictionHead(nn.Module):
    """BERT's MLM head: transform (dense, activation, LayerNorm), then a decoder tied to the word embeddings."""

    def __init__(self, config: LittleBirdConfig):
        super().__init__()
        self.transform = SpanSelectionTransform(config)  # BERT's transform, the module the span-selection head uses
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))


class LittleBirdForMaskedLM(EncoderForMaskedLM, LittleBirdPreTrainedModel):
    prediction_head_class = LittleBirdLMPredictionHead
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "littlebird.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }


class LittleBirdForSequenceClassification(EncoderForSequenceClassification, LittleBirdPreTrainedModel): ...


class LittleBirdForMultipleChoice(EncoderForMultipleChoice, LittleBirdPreTrainedModel): ...


class LittleBirdForTokenClassification(EncoderForTokenClassification, LittleBirdPreTrainedModel): ...


class LittleBirdForQuestionAnswering(EncoderForQuestionAnswering, LittleBirdPreTrainedModel): ...


class LittleBirdForQuestionSpanSelection(EncoderForQuestionSpanSelection, LittleBirdPreTrainedModel): ...


# The names the posformers package exports from this file.
__all__ = [
    "LittleBirdForMaskedLM",
    "LittleBirdForMultipleChoice",
    "LittleBirdForQuestionAnswering",
    "LittleBirdForQuestionSpanSelection",
    "LittleBirdForSequenceClassification",
    "LittleBirdForTokenClassification",
    "LittleBirdModel",
    "LittleBirdModelOutput",
    "LittleBirdPreTrainedModel",
]
