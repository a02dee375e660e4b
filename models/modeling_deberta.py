"""PyTorch DeBERTa v1, v2 and v3 (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention";
He et al. 2023, "DeBERTaV3").

Parameter names are those of the official checkpoints in Hugging Face format (`deberta.*`, `lm_predictions.lm_head.*`,
`mask_predictions.*`, `pooler.*`, `classifier.*`); v1 checkpoints keep their fused `in_proj` layout
(`config.projection_layout="fused"`). The attention kernels, the padded/packed dispatch and the inference caches live
in `deberta_kernels.py`. Padding-free passes (`config.unpad_inputs`, flattened batches) run the real tokens as one
packed (1, N) row; per-token outputs hold zeros at padded positions on either path.
"""

import copy
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    SequenceClassifierOutput,
)
from transformers.utils import ModelOutput, logging
from transformers.utils.generic import can_return_tuple

from .attention import FusedKernelChoice, flex_attention_refusal
from .configuration_deberta import DebertaConfig, parse_norm_rel_ebd
from .deberta_kernels import (
    AttentionPlan,
    InferenceCache,
    RelativePositions,
    disentangled_attention,
    projects_with_weights_only,
    sequence_convolution,
    token_and_pair_masks,
)
from .heads import (
    EncoderForQuestionAnswering,
    EncoderForQuestionSpanSelection,
    EncoderForTokenClassification,
    choice_loss,
    first_token_states,
    flatten_choice_batch,
    head_output,
    per_item_loss,
    replace_decoder,
    run_base_model,
)
from .hub_methods import HubMethods
from .inputs import check_inputs
from .layers import Intermediate, ResidualOutput
from .loading import checkpoint_names
from .packing import UNPLANNED, PackedBatch, keep_states, pass_inputs, plan_packing, state_shower, zero_padding

logger = logging.get_logger(__name__)


class DebertaEmbeddings(nn.Module):
    """Word (+ token type) (+ absolute position, when `position_biased_input`) embeddings, LayerNorm, padding zeroed.
    `with_positions`: the position table exists without being added here, for the Enhanced Mask Decoder to read."""

    def __init__(self, config: DebertaConfig, with_positions: bool = False):
        super().__init__()
        self.position_biased_input = config.position_biased_input
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        if config.position_biased_input or with_positions:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        if config.embedding_size != config.hidden_size:
            self.embed_proj = nn.Linear(config.embedding_size, config.hidden_size, bias=False)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, token_mask=None, inputs_embeds=None):
        """token_mask: (B, L) bool, True at real tokens, or None. Returns (B, L, hidden_size)."""
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.position_biased_input:
            if position_ids is None:
                position_ids = torch.arange(embeddings.shape[1], device=embeddings.device)[None]
            embeddings = embeddings + self.position_embeddings(position_ids)
        if hasattr(self, "embed_proj"):
            embeddings = self.embed_proj(embeddings)
        embeddings = self.LayerNorm(embeddings)
        if token_mask is not None:
            embeddings = embeddings * token_mask[..., None].to(embeddings.dtype)  # official MaskedLayerNorm
        return self.dropout(embeddings)


def log_bucket_position(relative_pos: torch.Tensor, bucket_size: int, max_position: int, clip: bool = True):
    """DeBERTa-v2's log buckets (official `make_log_bucket_position`) of integer distances `i - j`, any shape:
    distances up to `bucket_size // 2` are kept, farther ones share log-spaced buckets reaching `bucket_size - 1` at
    `max_position - 1`.

    clip: distances are first clipped to `±(max_position - 1)`, as in the microsoft/DeBERTa repository, in its float32
    arithmetic. Else transformers' port op for op (its log of the float32 ratio, not of the Python one: the two part
    at some bucket boundaries), whose buckets keep growing past `bucket_size - 1` beyond `max_position - 1`."""
    mid = bucket_size // 2
    relative_pos = relative_pos.long()
    if clip:
        relative_pos = relative_pos.clamp(-max_position + 1, max_position - 1)
        log_span = math.log((max_position - 1) / mid)
    else:
        log_span = torch.tensor((max_position - 1) / mid, dtype=torch.float32, device=relative_pos.device).log()
    abs_pos = relative_pos.abs()
    # Inside the window the log is not used; any value >= mid keeps it finite.
    far = abs_pos.clamp_min(mid).to(torch.float32)
    log_pos = torch.ceil(torch.log(far / mid) / log_span * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos, log_pos.long() * relative_pos.sign())


def _farthest_bucket(distance: int, bucket_size: int, max_position: int, clip: bool = True) -> int:
    """An upper bound of `|log_bucket_position(d)|` over `|d| <= distance` (float64, one bucket of margin)."""
    mid = bucket_size // 2
    if clip:
        distance = min(distance, max_position - 1)
    if distance <= mid:
        return distance
    return math.ceil(math.log(distance / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid + 1


def relative_positions(length: int, config: DebertaConfig, device, cache=None) -> RelativePositions:
    """The relative embedding row of every query/key pair of a length-L self-attention, with the official clamping.

    The official code scores query i against key j with row `clamp(bucket(i - j) + k, 0, 2k - 1)` of the relative
    embedding table (k = `config.relative_span`; `bucket` is the identity without `position_buckets`, and clips the
    distance first with `config.clip_relative_positions`). v1 slices its table to the span the length needs first;
    that selects the same rows, so one formula covers v1, v2 and v3.
    """
    span, clip = config.relative_span, config.clip_relative_positions
    buckets, max_position = config.position_buckets, config.max_relative_distance
    distances = torch.arange(-(length - 1), length, device=device)  # i - j, from -(L-1) to L-1
    if buckets > 0:
        distances = log_bucket_position(distances, buckets, max_position, clip)
    rows = (distances + span).clamp(0, 2 * span - 1)  # (2L - 1,), non-decreasing in i - j
    if torch.compiler.is_exporting():
        farthest = span  # an exported graph (ONNX) serves every length: all rows, no Python math on the length
    else:
        farthest = _farthest_bucket(length - 1, buckets, max_position, clip) if buckets > 0 else length - 1
    first_row = max(span - farthest, 0)
    num_rows = min(span + farthest, 2 * span - 1) - first_row + 1
    return RelativePositions(rows - first_row, first_row, num_rows, cache)


class DisentangledSelfAttention(nn.Module):
    """Content-to-content plus content-to-position and position-to-content attention (DeBERTa eq. 4), scaled by
    `1 / sqrt(head_dim * (1 + len(pos_att_type)))`. With `share_att_key` (v2/v3) the relative embeddings are projected
    by the content query/key projections, else by their own. The kernel runs in `disentangled_attention`."""

    _PROJECTIONS = ("in_proj", "query_proj", "key_proj", "pos_proj", "pos_q_proj", "pos_key_proj", "pos_query_proj")

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        all_head_size = self.num_heads * self.head_dim
        self.fused = config.projection_layout == "fused"
        if self.fused:
            # v1: per head, rows [query, key, value] of one bias-free projection; the query and value biases apart.
            self.in_proj = nn.Linear(config.hidden_size, 3 * all_head_size, bias=False)
            self.q_bias = nn.Parameter(torch.zeros(all_head_size))
            self.v_bias = nn.Parameter(torch.zeros(all_head_size))
        else:
            self.query_proj = nn.Linear(config.hidden_size, all_head_size)
            self.key_proj = nn.Linear(config.hidden_size, all_head_size)
            self.value_proj = nn.Linear(config.hidden_size, all_head_size)
        self.pos_att_type = list(config.pos_att_type)
        self.scaling = (self.head_dim * (1 + len(self.pos_att_type))) ** -0.5
        self.share_att_key = config.share_att_key
        if config.relative_attention:
            self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)
            if not self.share_att_key and "c2p" in self.pos_att_type:
                if self.fused:
                    self.pos_proj = nn.Linear(config.hidden_size, all_head_size, bias=False)
                else:
                    self.pos_key_proj = nn.Linear(config.hidden_size, all_head_size)
            if not self.share_att_key and "p2c" in self.pos_att_type:
                if self.fused:
                    self.pos_q_proj = nn.Linear(config.hidden_size, all_head_size)
                else:
                    self.pos_query_proj = nn.Linear(config.hidden_size, all_head_size)
        self.attention_dropout = config.attention_probs_dropout_prob

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(..., L, H * D) -> (..., H, L, D)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-2, -3)

    def _fused_parts(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`in_proj(states)` split into query, key and value (v1 interleaves them per head), each (..., H, L, D)."""
        qkv = self.in_proj(states).unflatten(-1, (self.num_heads, 3, self.head_dim))
        return tuple(part.transpose(-2, -3) for part in qkv.unbind(-2))

    def project_content(self, hidden_states: torch.Tensor, query_states: torch.Tensor | None):
        """Queries from `query_states` (default: `hidden_states`), keys and values from `hidden_states`; (B, H, L, D)"""
        if not self.fused:
            query = self._heads(self.query_proj(hidden_states if query_states is None else query_states))
            return query, self._heads(self.key_proj(hidden_states)), self._heads(self.value_proj(hidden_states))
        query, key, value = self._fused_parts(hidden_states)
        if query_states is not None:  # the EMD: a second call, so that a wrapped in_proj (LoRA) adapts it too
            query = self._fused_parts(query_states)[0]
        query = query + self.q_bias.view(self.num_heads, 1, self.head_dim)
        value = value + self.v_bias.view(self.num_heads, 1, self.head_dim)
        return query, key, value

    def project_positions(self, key_rows: torch.Tensor, query_rows: torch.Tensor):
        """Scaled position keys of `key_rows` (for c2p) and position queries of `query_rows` (for p2c), each
        (H, R, D), or None when the term is off. Rows are relative embeddings, (R, hidden)."""
        pos_key = pos_query = None
        if "c2p" in self.pos_att_type:
            if self.share_att_key:
                pos_key = self._fused_parts(key_rows)[1] if self.fused else self._heads(self.key_proj(key_rows))
            else:
                pos_key = self._heads((self.pos_proj if self.fused else self.pos_key_proj)(key_rows))
            pos_key = pos_key * self.scaling
        if "p2c" in self.pos_att_type:
            if not self.share_att_key:
                pos_query = self._heads((self.pos_q_proj if self.fused else self.pos_query_proj)(query_rows))
            elif self.fused:
                pos_query = self._fused_parts(query_rows)[0] + self.q_bias.view(self.num_heads, 1, self.head_dim)
            else:
                pos_query = self._heads(self.query_proj(query_rows))
            pos_query = pos_query * self.scaling
        return pos_key, pos_query

    def position_projections(self, rel_embeddings: torch.Tensor, positions: RelativePositions):
        """Position keys (in reverse row order) and queries of the rows `positions` uses, of the whole (2k, hidden)
        relative table `rel_embeddings`; in inference sliced from the cached projections of the whole table."""
        if positions.cache is not None and projects_with_weights_only(self):
            return positions.cache.position_projections(self, rel_embeddings, positions)
        # A pass with autograd may be followed by an optimizer step that does not bump the parameters' in-place
        # version (fused AdamW, Trainer's default), which the cache key would then miss: drop the cached entry.
        self._position_cache = None
        rows = self.pos_dropout(rel_embeddings[positions.first_row : positions.first_row + positions.num_rows])
        return self.project_positions(rows.flip(0), rows)

    def __setattr__(self, name, value):
        # Replacing a projection (peft wraps it, and unwraps it after merge_and_unload has added the adapters to the
        # weights through `.data`, which no version counter sees) drops the cached projections of the relative table.
        if name in self._PROJECTIONS:
            self.__dict__.pop("_position_cache", None)
        super().__setattr__(name, value)

    def forward(
        self,
        hidden_states: torch.Tensor,
        rel_embeddings: torch.Tensor | None,
        query_states: torch.Tensor | None = None,
        *,
        attention_plan: AttentionPlan,
        output_attentions: bool = False,
        **kwargs,
    ):
        """hidden_states: (B, L, hidden), or a packed pass's (1, N, hidden) tokens. `**kwargs` (e.g. the Trainer's
        `num_items_in_batch`) are accepted and unused. Returns ((B, L, hidden), weights or None)."""
        query, key, value = self.project_content(hidden_states, query_states)
        pos_key = pos_query = None
        positions = attention_plan.positions
        if rel_embeddings is not None and positions is not None and self.pos_att_type:
            pos_key, pos_query = self.position_projections(rel_embeddings, positions)
        return disentangled_attention(self, query, key, value, pos_key, pos_query, attention_plan, output_attentions)


class DebertaAttention(nn.Module):
    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = ResidualOutput(config, config.hidden_size)

    def forward(self, hidden_states, rel_embeddings, query_states=None, **kwargs):
        context, weights = self.self(hidden_states, rel_embeddings, query_states, **kwargs)
        residual = hidden_states if query_states is None else query_states
        return self.output(context, residual), weights


class DebertaLayer(GradientCheckpointingLayer):
    """One transformer layer. Tensors that carry gradients are positional (`hidden_states`, `rel_embeddings`,
    `query_states`), as reentrant gradient checkpointing needs; the `AttentionPlan` is a keyword argument."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.attention = DebertaAttention(config)
        self.intermediate = Intermediate(config)
        self.output = ResidualOutput(config, config.intermediate_size)

    def forward(self, hidden_states, rel_embeddings=None, query_states=None, *, attention_plan, **kwargs):
        attention_output, weights = self.attention(
            hidden_states, rel_embeddings, query_states, attention_plan=attention_plan, **kwargs
        )
        layer_output = self.output(self.intermediate(attention_output), attention_output)
        return layer_output, weights


class DebertaConvLayer(nn.Module):
    """DeBERTa-v2's convolution beside the first layer: LayerNorm(layer output + act(conv(layer input))), the layer
    input being the embeddings (as in the official code), padded positions zeroed before the activation and after."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        size, kernel_size = config.hidden_size, config.conv_kernel_size
        self.conv = nn.Conv1d(size, size, kernel_size, padding=(kernel_size - 1) // 2, groups=config.conv_groups)
        self.conv_act = ACT2FN[config.conv_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, residual_states, attention_plan: AttentionPlan):
        """hidden_states: encoder input, residual_states: first layer output, both (B, L, hidden) or packed."""
        out = sequence_convolution(self.conv, hidden_states, attention_plan)
        token_mask = attention_plan.token_mask
        if token_mask is not None:
            out = out.masked_fill(~token_mask[..., None], 0.0)
        out = self.conv_act(self.dropout(out))
        output = self.LayerNorm(residual_states + out)
        if token_mask is not None:
            output = output * token_mask[..., None].to(output.dtype)
        return output


class DebertaEncoder(nn.Module):
    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([DebertaLayer(config) for _ in range(config.num_hidden_layers)])
        if config.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size)
        if config.relative_attention and "layer_norm" in parse_norm_rel_ebd(config.norm_rel_ebd):
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if config.conv_kernel_size > 0:
            self.conv = DebertaConvLayer(config)

    def get_rel_embedding(self) -> torch.Tensor | None:
        """The relative embedding table, normalised when `norm_rel_ebd` says so: (2k, hidden), or None."""
        if not hasattr(self, "rel_embeddings"):
            return None
        table = self.rel_embeddings.weight
        return self.LayerNorm(table) if hasattr(self, "LayerNorm") else table

    def attention_plan(self, attention_mask, packing: PackedBatch | None, length: int, device) -> AttentionPlan:
        """What every layer reads in one pass: a padded batch's masks (from the user's `attention_mask`) or the
        packing, and the relative positions of L or of a packed pass's longest sequence (an `InferenceCache` with them
        in inference)."""
        positions_of = positions = None
        if self.config.relative_attention:
            norm = getattr(self, "LayerNorm", None)
            table = [self.rel_embeddings.weight, *(norm.parameters() if norm is not None else ())]
            cache = InferenceCache.for_pass(self, table)
            positions_of = functools.partial(relative_positions, config=self.config, device=device, cache=cache)
            positions = positions_of(max(packing.max_seqlen, 1) if packing is not None else length)
        if packing is not None:
            return AttentionPlan(packing=packing, positions=positions, positions_of=positions_of)
        token_mask, pair_mask = token_and_pair_masks(attention_mask, device)
        return AttentionPlan(token_mask, pair_mask, None, positions, positions_of)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_plan: AttentionPlan,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        show_states=keep_states,
        **kwargs,
    ) -> BaseModelOutput:
        """hidden_states: the embeddings, (B, L, hidden), or a packed pass's (1, N, hidden) tokens; show_states: how
        the hidden states are handed back (`state_shower`)."""
        all_hidden_states = None
        if output_hidden_states:
            shown, hidden_states = show_states(hidden_states)
            all_hidden_states = (shown,)
        all_attentions = () if output_attentions else None
        rel_embeddings = self.get_rel_embedding()
        embedding_output = hidden_states
        for i, layer_module in enumerate(self.layer):
            hidden_states, weights = layer_module(
                hidden_states,
                rel_embeddings,
                attention_plan=attention_plan,
                output_attentions=output_attentions,
                **kwargs,
            )
            if i == 0 and hasattr(self, "conv"):
                hidden_states = self.conv(embedding_output, hidden_states, attention_plan)
            if output_hidden_states:
                shown, hidden_states = show_states(hidden_states)
                all_hidden_states += (shown,)
            if output_attentions:
                all_attentions += (weights,)
        return BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions
        )


class DebertaPreTrainedModel(FusedKernelChoice, HubMethods, PreTrainedModel):
    """Kernels: transformers' choice ("sdpa" by default, on every device), plus "posformers_fused" (the fused kernel,
    `deberta_kernels.fused_attention`, opt-in)."""

    config_class = DebertaConfig
    config: DebertaConfig
    base_model_prefix = "deberta"
    _input_embed_layer = "word_embeddings"  # transformers' get/set_input_embeddings find embeddings.word_embeddings
    flex_attention_refusal = flex_attention_refusal("DeBERTa", "disentangled attention")
    # Flattened batches (DataCollatorWithFlattening: position_ids restarting per sequence) run per sequence; only
    # multiple choice refuses them.
    accepts_flattened_batches = True
    supports_gradient_checkpointing = True
    _no_split_modules = ["DebertaLayer"]
    _supports_sdpa = True
    # Official checkpoints carry the absolute position table (used by the EMD only) and the pre-training heads.
    # Without relative attention nothing reads the relative table's LayerNorm (norm_rel_ebd), so it is not built;
    # checkpoints that carry it still load.
    _keys_to_ignore_on_load_unexpected = [
        r"position_embeddings",
        r"^lm_predictions\.",
        r"^mask_predictions\.",
        r"(^|\.)encoder\.LayerNorm\.",
    ]

    @property
    def base_model_class(self) -> type:
        return DebertaModel

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, DisentangledSelfAttention) and module.fused:
            init.zeros_(module.q_bias)
            init.zeros_(module.v_bias)
        elif isinstance(module, DebertaLMPredictionHead):
            init.zeros_(module.bias)


def check_mask(attention_mask: torch.Tensor, shape: tuple[int, int]) -> None:
    """DeBERTa's mask rule: a (batch, seq_len) padding mask, or a (batch, seq_len, seq_len) mask of query/key pairs."""
    if tuple(attention_mask.shape) not in (shape, (*shape, shape[1])):
        raise ValueError(
            f"attention_mask must have shape (batch, seq_len) = {shape} or (batch, seq_len, seq_len), got "
            f"{tuple(attention_mask.shape)}"
        )


class DebertaModel(DebertaPreTrainedModel):
    """The bare DeBERTa encoder. `with_positions` keeps the absolute position table even when it is not added to the
    input (the Enhanced Mask Decoder of `DebertaForMaskedLM` reads it)."""

    def __init__(self, config: DebertaConfig, with_positions: bool = False):
        super().__init__(config)
        config.validate_fields()  # fields may have been changed since the config was created
        self.embeddings = DebertaEmbeddings(config, with_positions=with_positions)
        self.encoder = DebertaEncoder(config)
        self.post_init()

    def packing_for(
        self, input_ids, inputs_embeds, attention_mask, position_ids, output_attentions, kwargs
    ) -> PackedBatch | None:
        """`plan_packing` for this pass, with what rules it out here; pops a flattened batch's keywords from kwargs."""
        reference, cu_seq_lens = pass_inputs(input_ids, inputs_embeds, attention_mask, position_ids, kwargs)
        if reference is None:
            return None
        blocker = None
        if output_attentions if output_attentions is not None else self.config.output_attentions:
            blocker = "output_attentions=True (attention weights exist only as a padded (B, H, L, L) tensor)"
        elif attention_mask is not None and attention_mask.dim() == 3:
            blocker = "a 3D attention_mask (pass the 2D padding mask to run padding-free)"
        shape = tuple(reference.shape[:2])
        return plan_packing(self.config, shape, attention_mask, position_ids, cu_seq_lens, blocker, reference.device)

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                packing: PackedBatch | None = UNPLANNED, **kwargs) -> BaseModelOutput:  # fmt: skip
        """`packing`: the plan of this pass (a head's `packing_for`; None: the padded path), else planned here."""
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        limit = config.max_position_embeddings if hasattr(self.embeddings, "position_embeddings") else None
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        size = config.embedding_size
        shape = check_inputs(
            config, self.dtype, *inputs, embedding_size=size, check_mask=check_mask, position_limit=limit
        )
        if packing is UNPLANNED:
            packing = self.packing_for(
                input_ids, inputs_embeds, attention_mask, position_ids, output_attentions, kwargs
            )
        device = input_ids.device if input_ids is not None else inputs_embeds.device
        if packing is None:
            restore = functools.partial(zero_padding, attention_mask=attention_mask)  # zeros at padding, as packed
        else:  # the real tokens as one (1, N) row
            restore = packing.restore
            input_ids, token_type_ids, inputs_embeds = map(
                packing.pack_input, (input_ids, token_type_ids, inputs_embeds)
            )
            position_ids = packing.position_ids() if position_ids is None else packing.pack_input(position_ids)
        attention_plan = self.encoder.attention_plan(attention_mask, packing, shape[1], device)
        embedding_output = self.embeddings(
            input_ids, token_type_ids, position_ids, attention_plan.token_mask, inputs_embeds
        )
        show_states = state_shower(restore, packing)
        encoder_outputs = self.encoder(
            embedding_output, attention_plan, output_attentions, output_hidden_states, show_states=show_states, **kwargs
        )
        hidden_states = encoder_outputs.hidden_states
        last_hidden_state = hidden_states[-1] if output_hidden_states else restore(encoder_outputs.last_hidden_state)
        return BaseModelOutput(
            last_hidden_state=last_hidden_state, hidden_states=hidden_states, attentions=encoder_outputs.attentions
        )


class DebertaLMPredictionHead(nn.Module):
    """The official MLM head (`lm_predictions.lm_head`): dense, activation, LayerNorm, then the decoder tied to the
    word embeddings plus a bias."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.transform_act_fn(self.dense(hidden_states))))


class DebertaEnhancedMaskDecoder(nn.Module):
    """The Enhanced Mask Decoder (DeBERTa section 3.2; official `EnhancedMaskDecoder`), then the LM head.

    Absolute positions enter here only: the last encoder layer runs `emd_steps` times (shared weights), keys and
    values from its own input and queries from that input plus the absolute position embeddings, each step feeding the
    next. With `emd_steps=0`, or a model that adds positions to its input, the LM head reads the encoder output.
    """

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.steps = config.emd_steps if config.uses_emd else 0
        self.lm_head = DebertaLMPredictionHead(config)

    def forward(self, sequence_output, deberta: "DebertaModel | None" = None, layer_input=None, attention_mask=None,
                position_ids=None, packing: PackedBatch | None = None) -> torch.Tensor:  # fmt: skip
        """sequence_output, layer_input: the outputs of the last layer and of the one before, (B, L, hidden); deberta:
        the base model, whose last layer and position table the EMD reuses. With `packing` the decoder runs on the
        packed real tokens. Returns the MLM logits (B, L, vocab), zeros at padding."""
        restore = functools.partial(zero_padding, attention_mask=attention_mask) if packing is None else packing.restore
        if packing is not None:
            sequence_output = packing.pack(sequence_output)
        if self.steps:
            if packing is not None:
                layer_input = packing.pack(layer_input)
                position_ids = packing.position_ids() if position_ids is None else packing.pack_input(position_ids)
            elif position_ids is None:
                position_ids = torch.arange(layer_input.shape[1], device=layer_input.device)[None]
            encoder = deberta.encoder
            plan = encoder.attention_plan(attention_mask, packing, layer_input.shape[1], layer_input.device)
            rel_embeddings = encoder.get_rel_embedding()
            query_states = layer_input + deberta.embeddings.position_embeddings(position_ids)
            for _ in range(self.steps):
                query_states, _ = encoder.layer[-1](layer_input, rel_embeddings, query_states, attention_plan=plan)
            sequence_output = query_states
        return restore(self.lm_head(sequence_output))


# transformers' DeBERTa MLM heads default to `legacy=True`, a BERT-style head under `cls.predictions.*` with the same
# layers as the official one (dense, activation, LayerNorm, tied decoder, bias). `DebertaForMaskedLM.from_pretrained`
# recognises that layout in local safetensors files and loads it with this mapping and `emd_steps=0` (such models were
# trained without an Enhanced Mask Decoder); elsewhere pass `key_mapping=LEGACY_MLM_KEY_MAPPING, emd_steps=0`.
LEGACY_MLM_KEY_MAPPING = {
    r"^cls\.predictions\.transform\.": "lm_predictions.lm_head.",
    r"^cls\.predictions\.bias": "lm_predictions.lm_head.bias",
    r"^cls\.predictions\.decoder\.": "lm_predictions.lm_head.decoder.",
}


class DebertaForMaskedLM(DebertaPreTrainedModel):
    _tied_weights_keys = {
        "lm_predictions.lm_head.decoder.weight": "deberta.embeddings.word_embeddings.weight",
        "lm_predictions.lm_head.decoder.bias": "lm_predictions.lm_head.bias",
    }

    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        if config.uses_emd and config.embedding_size != config.hidden_size:
            raise ValueError(
                "DebertaForMaskedLM: the Enhanced Mask Decoder adds absolute position embeddings to hidden states, "
                f"which needs embedding_size ({config.embedding_size}) == hidden_size ({config.hidden_size}); set "
                "emd_steps=0 to use the plain LM head"
            )
        self.deberta = DebertaModel(config, with_positions=config.uses_emd)
        self.lm_predictions = DebertaEnhancedMaskDecoder(config)
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        if "key_mapping" not in kwargs and any(
            name.startswith("cls.predictions.") for name in checkpoint_names(pretrained_model_name_or_path, kwargs)
        ):
            logger.warning(
                f"{pretrained_model_name_or_path}: transformers' legacy MLM head (cls.predictions.*), loaded with "
                "LEGACY_MLM_KEY_MAPPING and emd_steps=0"
            )
            kwargs["key_mapping"] = LEGACY_MLM_KEY_MAPPING
            if isinstance(config := kwargs.get("config"), DebertaConfig):
                kwargs["config"] = config = copy.deepcopy(config)
                config.emd_steps = 0
            else:
                kwargs.setdefault("emd_steps", 0)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    def get_output_embeddings(self):
        return self.lm_predictions.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        replace_decoder(self.lm_predictions.lm_head, new_embeddings)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> MaskedLMOutput | tuple:  # fmt: skip
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        decoder = self.lm_predictions
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        # the Enhanced Mask Decoder starts from the last layer's input
        all_states = output_hidden_states or bool(decoder.steps)
        outputs, packing = run_base_model(self, *inputs, output_attentions, all_states, kwargs)
        emd_inputs = {}
        if decoder.steps:
            emd_inputs = dict(deberta=self.deberta, layer_input=outputs.hidden_states[-2], position_ids=position_ids)
        logits = decoder(outputs.last_hidden_state, attention_mask=attention_mask, packing=packing, **emd_inputs)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        hidden_states = outputs.hidden_states if output_hidden_states else None
        return head_output(
            MaskedLMOutput, outputs, self.config, return_dict, loss=loss, logits=logits, hidden_states=hidden_states
        )


@dataclass
class DebertaForReplacedTokenDetectionOutput(ModelOutput):
    """Output of `DebertaForReplacedTokenDetection`: logits (B, L), one per token, > 0 meaning "replaced"."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class DebertaMaskPredictionHead(nn.Module):
    """DeBERTa-v3's discriminator head (official `mask_predictions`): LayerNorm(hidden + [CLS] hidden), dense,
    activation, one logit per token."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor, packing: PackedBatch | None = None, attention_mask=None):
        """hidden_states: (B, L, hidden) -> logits (B, L), zeros at padding. With `packing` only the real tokens are
        scored, each with its own sequence's first token; a flattened batch's (1, N, hidden) gives (1, N)."""
        if packing is None:
            return zero_padding(self.score(hidden_states, hidden_states[:, :1]), attention_mask)
        tokens = packing.pack(hidden_states)
        sequence_starts = packing.cu_seqlens[:-1].long()[packing.indices // packing.width]  # (N,)
        return packing.restore(self.score(tokens, tokens[:, sequence_starts]))

    def score(self, hidden_states: torch.Tensor, first_token_states: torch.Tensor) -> torch.Tensor:
        states = self.LayerNorm(first_token_states + hidden_states)
        return self.classifier(self.transform_act_fn(self.dense(states))).squeeze(-1)


class DebertaForReplacedTokenDetection(DebertaPreTrainedModel):
    """Replaced token detection (the ELECTRA-style objective of DeBERTa-v3): labels are 1 for replaced tokens, 0 for
    original ones; the loss is the mean binary cross-entropy over real (unpadded) tokens."""

    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        self.deberta = DebertaModel(config)
        self.mask_predictions = DebertaMaskPredictionHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> DebertaForReplacedTokenDetectionOutput | tuple:  # fmt: skip
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, packing = run_base_model(self, *inputs, output_attentions, output_hidden_states, kwargs)
        logits = self.mask_predictions(outputs.last_hidden_state, packing, attention_mask)
        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            active = labels != -100
            if attention_mask is not None and attention_mask.dim() == 2:
                active = active & attention_mask.to(device=logits.device, dtype=torch.bool)
            loss = BCEWithLogitsLoss()(logits[active].float(), labels[active].float())
            loss = per_item_loss(loss, labels, kwargs.get("num_items_in_batch"))
        return head_output(
            DebertaForReplacedTokenDetectionOutput, outputs, self.config, return_dict, loss=loss, logits=logits
        )


class DebertaContextPooler(nn.Module):
    """The official pooler: dropout, dense and activation on the first token."""

    def __init__(self, config: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.pooler_hidden_size)
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.activation = ACT2FN[config.pooler_hidden_act]

    def forward(self, first_token_states: torch.Tensor) -> torch.Tensor:  # (sequences, hidden)
        return self.activation(self.dense(self.dropout(first_token_states)))


def sequence_classification_loss(config, logits, labels, num_labels):
    """The official DeBERTa loss, which transformers' DeBERTa heads keep: regression for one label; cross-entropy over
    labels >= 0 for class indices; soft-label cross-entropy for a distribution per example; or `problem_type`'s."""
    labels = labels.to(logits.device)
    if config.problem_type is None:
        if num_labels == 1:
            return MSELoss()(logits.view(-1).to(labels.dtype), labels.view(-1))
        if labels.dim() == 1 or labels.size(-1) == 1:
            labels = labels.view(-1)
            keep = labels >= 0
            if not keep.any():
                return logits.sum() * 0.0
            return CrossEntropyLoss()(logits[keep].float(), labels[keep].long())
        return -(F.log_softmax(logits, dim=-1) * labels).sum(-1).mean()
    if config.problem_type == "regression":
        return MSELoss()(logits.squeeze(), labels.squeeze()) if num_labels == 1 else MSELoss()(logits, labels)
    if config.problem_type == "single_label_classification":
        return CrossEntropyLoss()(logits.view(-1, num_labels), labels.view(-1))
    return BCEWithLogitsLoss()(logits, labels)


class DebertaForSequenceClassification(DebertaPreTrainedModel):
    """The official head: the context pooler on the first token, dropout (`cls_dropout`), a linear classifier, and
    DeBERTa's own loss (`sequence_classification_loss`)."""

    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.deberta = DebertaModel(config)
        self.pooler = DebertaContextPooler(config)
        self.classifier = nn.Linear(config.pooler_hidden_size, config.num_labels)
        self.dropout = nn.Dropout(config.cls_dropout if config.cls_dropout is not None else config.hidden_dropout_prob)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> SequenceClassifierOutput | tuple:  # fmt: skip
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, packing = run_base_model(self, *inputs, output_attentions, output_hidden_states, kwargs)
        pooled_output = self.pooler(first_token_states(outputs.last_hidden_state, packing))
        logits = self.classifier(self.dropout(pooled_output))
        loss = None
        if labels is not None:
            # not self.loss_function: DeBERTa's own loss ignores negative labels and takes soft labels
            loss = sequence_classification_loss(self.config, logits, labels, self.num_labels)
            loss = per_item_loss(loss, labels, kwargs.get("num_items_in_batch"))
        return head_output(SequenceClassifierOutput, outputs, self.config, return_dict, loss=loss, logits=logits)


class DebertaForTokenClassification(EncoderForTokenClassification, DebertaPreTrainedModel): ...


class DebertaForQuestionAnswering(EncoderForQuestionAnswering, DebertaPreTrainedModel): ...


class DebertaForQuestionSpanSelection(EncoderForQuestionSpanSelection, DebertaPreTrainedModel): ...


class DebertaForMultipleChoice(DebertaPreTrainedModel):
    """Multiple choice with the context pooler on each choice's first token, as transformers' DeBERTa-v2 does."""

    def __init__(self, config: DebertaConfig):
        super().__init__(config)
        self.deberta = DebertaModel(config)
        self.pooler = DebertaContextPooler(config)
        self.dropout = nn.Dropout(config.cls_dropout if config.cls_dropout is not None else config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.pooler_hidden_size, 1)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> MultipleChoiceModelOutput | tuple:  # fmt: skip
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        num_choices, choices = flatten_choice_batch(self, *inputs, output_attentions, output_hidden_states, kwargs)
        outputs = self.deberta(**choices)
        pooled_output = self.pooler(outputs.last_hidden_state[:, 0])
        logits = self.classifier(self.dropout(pooled_output)).view(-1, num_choices)
        loss = choice_loss(logits, labels, kwargs.get("num_items_in_batch"))
        return head_output(MultipleChoiceModelOutput, outputs, self.config, return_dict, loss=loss, logits=logits)


# The names the posformers package exports from this file.
__all__ = [
    "LEGACY_MLM_KEY_MAPPING",
    "DebertaForMaskedLM",
    "DebertaForMultipleChoice",
    "DebertaForQuestionAnswering",
    "DebertaForQuestionSpanSelection",
    "DebertaForReplacedTokenDetection",
    "DebertaForReplacedTokenDetectionOutput",
    "DebertaForSequenceClassification",
    "DebertaForTokenClassification",
    "DebertaModel",
    "DebertaPreTrainedModel",
]
