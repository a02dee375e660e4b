"""What the task heads of the three models share: classification over real tokens of packed or padded batches,
extractive span selection (including Splinter's question-aware span selection, QASS) and the multiple-choice reshapes.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.utils import is_torchdynamo_compiling

from .packing import PackedBatch, flattened_restarts, pack_padded, plan_packing, zero_padding


def maybe_tuple(output, return_dict, config):
    """The head's `ModelOutput`, or its tuple when `return_dict` (else `config.return_dict`) is off."""
    return_dict = return_dict if return_dict is not None else config.return_dict
    return output if return_dict else output.to_tuple()


def count_choices(head: nn.Module, input_ids, inputs_embeds) -> int:
    """The choice dimension of a multiple-choice input, or a clear error for an input without one."""
    reference = input_ids if input_ids is not None else inputs_embeds
    if reference is None or reference.dim() < 3:
        raise ValueError(
            f"{type(head).__name__} expects input_ids of shape (batch, num_choices, seq_len) or inputs_embeds of "
            "shape (batch, num_choices, seq_len, embedding width)"
        )
    return reference.shape[1]


def flatten_choices(tensor: torch.Tensor | None, dims: int = 2) -> torch.Tensor | None:
    """(B, C, ...) -> (B * C, ...), a tensor of `dims` dimensions with the choices folded into the batch."""
    return tensor.reshape(-1, *tensor.shape[-dims + 1 :]) if tensor is not None else None


def input_packing(config, input_ids, inputs_embeds, attention_mask, position_ids, kwargs: dict) -> PackedBatch | None:
    """The packing `plan_packing` gives a head's inputs, planned by the head itself rather than read off the base
    model's output (call it after the base model, which has checked the inputs). Where the base model's own pass
    ruled packing out (output_attentions), a padded batch may be packed here: the heads' outputs on it are the same
    either way (per-token outputs hold zeros at padding on both paths); packed, token heads skip padded positions."""
    reference = input_ids if input_ids is not None else inputs_embeds
    cu_seq_lens = kwargs.get("cu_seq_lens_q", kwargs.get("cu_seq_lens_k"))
    shape = tuple(reference.shape[:2])
    return plan_packing(config, shape, attention_mask, position_ids, cu_seq_lens, device=reference.device)


def run_base_model(
    head,
    input_ids,
    attention_mask,
    token_type_ids,
    position_ids,
    inputs_embeds,
    output_attentions,
    output_hidden_states,
    kwargs: dict,
):
    """A head's pass through its base model (`head.base_model`, with return_dict=True): its outputs, and the packing
    they come in (`input_packing`), which the heads read."""
    outputs = head.base_model(
        input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        position_ids=position_ids,
        inputs_embeds=inputs_embeds,
        output_attentions=output_attentions,
        output_hidden_states=output_hidden_states,
        return_dict=True,
        **kwargs,
    )
    return outputs, input_packing(head.config, input_ids, inputs_embeds, attention_mask, position_ids, kwargs)


def run_on_real_tokens(
    head: Callable[[torch.Tensor], torch.Tensor], hidden_states: torch.Tensor, packing, attention_mask=None
):
    """A token-level head on the real tokens only: pack -> head -> unpack, zeros at padded positions (their labels are
    -100, so the loss is unchanged). hidden_states: the base model's `last_hidden_state`, (B, L, d) or (1, N, d) for a
    flattened batch; returns the head's output in that layout.

    A padded pass's batch is packed here by its 2D `attention_mask`: its states at padding are zeros, and a head's
    LayerNorm over a constant vector has a backward of 0 * inf = NaN in float16 (1 / sqrt(eps) overflows). An exported
    graph (ONNX), which cannot take shapes from the mask's values, runs the head on every position and zeroes padding.
    """
    if packing is None and attention_mask is not None and attention_mask.dim() == 2:
        if torch.compiler.is_exporting():
            return zero_padding(head(hidden_states), attention_mask)
        packing = pack_padded(attention_mask)
    if packing is None or packing.flattened:
        return head(hidden_states)
    return packing.unpack(head(packing.pack(hidden_states)))


def first_token_states(hidden_states: torch.Tensor, packing) -> torch.Tensor:
    """Each sequence's first token, what sequence-level heads read: (B, L, d) -> (B, d) for a padded batch,
    (1, N, d) -> (num_sequences, d) for a flattened one."""
    if packing is not None and packing.flattened:
        return packing.first_tokens(hidden_states)
    return hidden_states[:, 0]


def span_logits(qa_outputs: nn.Module, hidden_states: torch.Tensor, attention_mask, packing):
    """Start and end logits of an extractive-QA head, `torch.finfo(dtype).min` wherever there is no real token, so
    padding never wins an argmax and the loss does not depend on padding.

    hidden_states: the base model's `last_hidden_state`. Padded batch: (B, L) logits, with the 2D attention_mask's
    padding masked whether or not the pass was packed. Flattened batch: (num_sequences, longest sequence) logits,
    each sequence's own, filled beyond its length.
    """
    if packing is not None:
        logits = qa_outputs(packing.pack(hidden_states))
        logits = packing.unpack(logits, fill=torch.finfo(logits.dtype).min)
    else:
        logits = qa_outputs(hidden_states)
        if attention_mask is not None and attention_mask.dim() == 2:
            padding = ~attention_mask.to(device=logits.device, dtype=torch.bool)
            logits = logits.masked_fill(padding[..., None], torch.finfo(logits.dtype).min)
    start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
    return start_logits, end_logits


def refuse_flattened(head: nn.Module, position_ids, attention_mask, kwargs: dict) -> None:
    """A head that cannot take a flattened batch (one row, position_ids restarting at 0 per sequence, no padding)
    says so. Restarting position_ids with padding in the mask are a padded row's (`generate` numbers a left-padded
    prompt so)."""
    # The mask is read only for a one-row batch with position_ids: an exported graph (ONNX) cannot branch on values.
    one_row = position_ids is not None and position_ids.dim() == 2 and position_ids.shape[0] == 1
    has_padding = one_row and attention_mask is not None and not bool(attention_mask.bool().all())
    if kwargs.get("cu_seq_lens_q") is not None or (one_row and not has_padding and flattened_restarts(position_ids, 1)):
        raise ValueError(
            f"{type(head).__name__} cannot take a flattened batch (position_ids restarting at 0 within a row); "
            "pass padded sequences with an attention_mask"
        )


def sequence_grid(tensor: torch.Tensor, packing, fill: float = 0.0) -> torch.Tensor:
    """A per-token tensor in its (sequences, width, ...) layout: a padded batch's (B, L, ...) as it is, a flattened
    batch's (1, N, ...) unpacked to one row per sequence with `fill` past each sequence's end."""
    if packing is not None and packing.flattened:
        return packing.unpack(tensor, fill=fill)
    return tensor


def real_token_mask(attention_mask, packing) -> torch.Tensor | None:
    """(sequences, width) bool, True at real tokens, for a 2D attention_mask or a flattened batch; else None (a 4D or
    no mask: every position counts)."""
    if packing is not None and packing.flattened:
        ones = torch.ones(1, packing.num_tokens, 1, dtype=torch.bool, device=packing.indices.device)
        return packing.unpack(ones, fill=False)[..., 0]
    if attention_mask is not None and attention_mask.dim() == 2:
        return attention_mask.bool()
    return None


def find_questions(input_ids: torch.Tensor, question_token_id: int, packing) -> torch.Tensor:
    """(sequences, Q) long: the position of every `question_token_id` token in each sequence, left-aligned, -1 where
    a sequence holds fewer than Q, the most any holds. input_ids: (B, L), or (1, N) for a flattened batch."""
    ids = sequence_grid(input_ids[..., None], packing, fill=-1)[..., 0]
    is_question = ids == question_token_id
    most = int(is_question.sum(-1).max()) if ids.numel() else 0
    width = ids.shape[1]
    columns = torch.arange(width, device=ids.device).expand_as(ids)
    positions = torch.where(is_question, columns, width).sort(-1).values[:, :most]
    return positions.masked_fill(positions == width, -1)


def _off_tokens(positions: torch.Tensor, real: torch.Tensor | None, width: int) -> torch.Tensor:
    """Where `positions` (sequences, Q) miss the real tokens of their sequence: outside [0, width) or on padding."""
    inside = (positions >= 0) & (positions < width)
    if real is not None:
        inside = inside & real.to(positions.device).gather(1, positions.clamp(0, width - 1))
    return ~inside


def check_span_selection(question_positions, start_positions, end_positions, real, shape) -> None:
    """question_positions (sequences, Q): a real token or -1; start/end_positions: given together, of the same shape,
    on real tokens wherever the question is asked. Values are not read while compiling."""
    rows, width = shape
    named = {
        "question_positions": question_positions,
        "start_positions": start_positions,
        "end_positions": end_positions,
    }
    if (start_positions is None) != (end_positions is None):
        raise ValueError("start_positions and end_positions must be given together")
    for name, positions in named.items():
        if positions is None:
            continue
        if positions.is_floating_point() or positions.dim() != 2 or positions.shape[0] != rows:
            raise ValueError(
                f"{name} must be an integer tensor of shape (batch, num_questions) with batch={rows} (one row per "
                f"sequence), got {positions.dtype} {tuple(positions.shape)}"
            )
        if positions.shape != question_positions.shape:
            raise ValueError(
                f"{name} must have the shape of question_positions {tuple(question_positions.shape)}, got "
                f"{tuple(positions.shape)}"
            )
    if is_torchdynamo_compiling():
        return
    asked = question_positions >= 0
    for name, positions in named.items():
        if positions is None:
            continue
        wrong = _off_tokens(positions, real, width) & (
            question_positions != -1 if positions is question_positions else asked
        )
        if bool(wrong.any()):
            row, column = (int(i) for i in wrong.nonzero()[0])
            hint = " (-1 marks an absent question)" if positions is question_positions else ""
            raise ValueError(
                f"{name}[{row}, {column}] = {int(positions[row, column])} is not a real token of sequence {row}{hint}"
            )


def question_span_logits(qass: nn.Module, hidden_states: torch.Tensor, question_positions, attention_mask, packing):
    """Start and end logits (sequences, Q, width) of the span each question token points at, `torch.finfo(dtype).min`
    wherever there is no real token and on the rows of absent questions (question_positions -1).

    hidden_states: the base model's `last_hidden_state`, (B, L, d), or (1, N, d) for a flattened batch (whose
    question_positions count within each sequence). On the padding-free path the head's token transforms run on the
    real tokens only.
    """
    states = sequence_grid(hidden_states, packing)  # (sequences, width, d)
    index = question_positions.to(states.device).clamp_min(0)
    question_states = states.gather(1, index[..., None].expand(-1, -1, states.shape[-1]))  # (sequences, Q, d)
    tokens = packing.pack(hidden_states) if packing is not None else hidden_states
    start_logits, end_logits = qass(tokens, question_states, packing)
    blocked = (question_positions < 0).to(states.device)[..., None]  # (sequences, Q, 1)
    real = real_token_mask(attention_mask, packing)
    if real is not None:
        blocked = blocked | ~real.to(states.device)[:, None, :]
    lowest = torch.finfo(start_logits.dtype).min
    return start_logits.masked_fill(blocked, lowest), end_logits.masked_fill(blocked, lowest)


def span_selection_loss(start_logits, end_logits, start_positions, end_positions, question_positions) -> torch.Tensor:
    """Mean over the asked questions (question_positions >= 0) of (CE(start) + CE(end)) / 2; logits (sequences, Q,
    width). A batch without a question gives 0, still attached to the graph."""
    asked = (question_positions >= 0).to(start_logits.device)
    start_loss = F.cross_entropy(start_logits[asked], start_positions.to(asked.device)[asked], reduction="sum")
    end_loss = F.cross_entropy(end_logits[asked], end_positions.to(asked.device)[asked], reduction="sum")
    return (start_loss + end_loss) / 2 / asked.sum().clamp_min(1)


def single_question_logits(qass: nn.Module, config, input_ids, hidden_states, attention_mask, packing):
    """Extractive QA from the span-selection head (`qa_head="span_selection"`): each sequence's one [QUESTION] token
    (`config.question_token_id`, placed after the question as Splinter does) points at the answer. Returns start and
    end logits (sequences, width)."""
    if config.question_token_id is None:
        raise ValueError(
            "config.qa_head='span_selection' needs config.question_token_id, the [QUESTION] token placed after "
            "each question; set it to the token's id"
        )
    if input_ids is None:
        raise ValueError("qa_head='span_selection' finds the [QUESTION] token in input_ids; pass input_ids")
    question_positions = find_questions(input_ids, config.question_token_id, packing)
    counts = (question_positions >= 0).sum(-1)
    if not is_torchdynamo_compiling() and bool((counts != 1).any()):
        example = int((counts != 1).nonzero()[0])
        raise ValueError(
            f"example {example} holds {int(counts[example])} [QUESTION] tokens (id {config.question_token_id}); "
            "qa_head='span_selection' needs exactly one per example, right after the question"
        )
    start_logits, end_logits = question_span_logits(
        qass, hidden_states, question_positions[:, :1], attention_mask, packing
    )
    return start_logits[:, 0], end_logits[:, 0]


class SpanSelectionTransform(nn.Module):
    """Dense, activation, LayerNorm: one of the four token transforms of the question-aware span-selection head."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class QuestionAwareSpanSelectionHead(nn.Module):
    """Question-aware span selection (QASS; Ram et al. 2021, "Few-Shot Question Answering by Pretraining Span
    Selection", sec. 3.2, the head of Splinter): a question token q asks where its answer starts and ends, and a token
    i answers with

        start(q, i) = s(x_i) . W_s s_q(x_q)        end(q, i) = e(x_i) . W_e e_q(x_q)

    where s, s_q, e, e_q are transforms (dense, activation, LayerNorm) and W_s, W_e bias-free d x d matrices.
    """

    def __init__(self, config):
        super().__init__()
        self.query_start_transform = SpanSelectionTransform(config)
        self.query_end_transform = SpanSelectionTransform(config)
        self.start_transform = SpanSelectionTransform(config)
        self.end_transform = SpanSelectionTransform(config)
        self.start_classifier = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.end_classifier = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, token_states: torch.Tensor, question_states: torch.Tensor, packing=None):
        """token_states: (B, L, d), or the (1, N, d) real tokens of `packing`; question_states: (B, Q, d), B the
        sequences. Returns start and end scores (B, Q, L) (L: the packing's width), unmasked."""
        start_tokens = self.start_transform(token_states)
        end_tokens = self.end_transform(token_states)
        if packing is not None:
            start_tokens, end_tokens = packing.unpack(start_tokens), packing.unpack(end_tokens)  # (B, L, d)
        start_queries = self.start_classifier(self.query_start_transform(question_states))  # (B, Q, d)
        end_queries = self.end_classifier(self.query_end_transform(question_states))
        return start_queries @ start_tokens.transpose(1, 2), end_queries @ end_tokens.transpose(1, 2)


class MaskedLMDecoderEmbeddings:
    """`get_output_embeddings` / `set_output_embeddings` for a masked-LM model laid out as BERT's, the decoder at
    `self.cls.predictions.decoder` and its bias at `self.cls.predictions.bias`, where transformers' defaults (which
    look for `lm_head`) find nothing. Inherit it before the model's `PreTrainedModel` base."""

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        if new_embeddings.bias is not None:
            self.cls.predictions.bias = new_embeddings.bias
