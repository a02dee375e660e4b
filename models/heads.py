"""What the task heads of the three models share: classification over real tokens of packed or padded batches,
extractive span selection (including Splinter's question-aware span selection, QASS), the multiple-choice reshapes,
and the head classes (`EncoderForTokenClassification`, ...) that each model's head classes subclass.

A head plans its pass once, with its base model's `packing_for`, hands that plan to the base model (`packing=`) and
reads the same plan for its own outputs (`run_base_model`).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import is_torchdynamo_compiling

from .packing import flattened_restarts, pack_padded, zero_padding


def per_item_loss(loss: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """A loss that is the mean over this batch's labels (those != -100), as their sum divided by `num_items_in_batch`
    where transformers' Trainer passes it: the labels of the whole optimizer step, over the processes and the
    accumulated batches. Trainer then multiplies the loss by the number of processes (DDP averages the gradients) and
    does not divide it by the accumulation steps: a mean left as it is came out that many times too large, in the
    logs and in the gradients."""
    if num_items_in_batch is None:
        return loss
    count = labels.ne(-100).sum().to(loss.device)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss * count / num_items_in_batch


def flatten_choices(tensor: torch.Tensor | None, dims: int = 2) -> torch.Tensor | None:
    """(B, C, ...) -> (B * C, ...), a tensor of `dims` dimensions with the choices folded into the batch."""
    return tensor.reshape(-1, *tensor.shape[-dims + 1 :]) if tensor is not None else None


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
    """A head's pass through its base model: one plan (`packing_for`, which takes a flattened batch's keywords out of
    `kwargs`), the pass on that plan with return_dict=True, and both back, as the head reads the plan too."""
    base = head.base_model
    packing = base.packing_for(input_ids, inputs_embeds, attention_mask, position_ids, output_attentions, kwargs)
    outputs = base(
        input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        position_ids=position_ids,
        inputs_embeds=inputs_embeds,
        output_attentions=output_attentions,
        output_hidden_states=output_hidden_states,
        packing=packing,
        return_dict=True,
        **kwargs,
    )
    return outputs, packing


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


class OnlyMLMHead(nn.Module):
    """BERT's `cls` module of a masked-LM model: its `predictions` head (transform, decoder tied to the word
    embeddings, bias), under the names BERT-format checkpoints use."""

    def __init__(self, predictions: nn.Module):
        super().__init__()
        self.predictions = predictions

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.predictions(sequence_output)


def replace_decoder(prediction_head: nn.Module, new_embeddings: nn.Module) -> None:
    """`set_output_embeddings` of a head holding `decoder` and `bias` (transformers' default looks for `lm_head`)."""
    prediction_head.decoder = new_embeddings
    if new_embeddings.bias is not None:
        prediction_head.bias = new_embeddings.bias


def head_output(output_class, base_outputs, config, return_dict, **fields):
    """A head's `output_class` holding `fields` and its base model's hidden_states and attentions, or its tuple when
    `return_dict` (else `config.return_dict`) is off."""
    fields = {"hidden_states": base_outputs.hidden_states, "attentions": base_outputs.attentions, **fields}
    output = output_class(**fields)
    return output if (return_dict if return_dict is not None else config.return_dict) else output.to_tuple()


def flatten_choice_batch(
    head: nn.Module,
    input_ids,
    attention_mask,
    token_type_ids,
    position_ids,
    inputs_embeds,
    output_attentions,
    output_hidden_states,
    kwargs: dict,
) -> tuple[int, dict]:
    """A multiple-choice batch (batch, num_choices, seq_len) as one batch of (batch * num_choices) sequences: the
    number of choices and the base model's keyword arguments (with `kwargs` and return_dict=True). A flattened batch
    (restarting position_ids) has no choices to compare and is refused."""
    attention_mask, position_ids = flatten_choices(attention_mask), flatten_choices(position_ids)
    refuse_flattened(head, position_ids, attention_mask, kwargs)
    reference = input_ids if input_ids is not None else inputs_embeds
    if reference is None or reference.dim() < 3:
        raise ValueError(
            f"{type(head).__name__} expects input_ids of shape (batch, num_choices, seq_len) or inputs_embeds of "
            "shape (batch, num_choices, seq_len, embedding width)"
        )
    num_choices = reference.shape[1]
    inputs = dict(
        input_ids=flatten_choices(input_ids),
        attention_mask=attention_mask,
        token_type_ids=flatten_choices(token_type_ids),
        position_ids=position_ids,
        inputs_embeds=flatten_choices(inputs_embeds, dims=3),
        output_attentions=output_attentions,
        output_hidden_states=output_hidden_states,
        return_dict=True,
        **kwargs,
    )
    return num_choices, inputs


def choice_loss(logits: torch.Tensor, labels, num_items_in_batch=None) -> torch.Tensor | None:
    """Cross-entropy over the choices (transformers' loss mapping has no multiple-choice entry)."""
    if labels is None:
        return None
    return per_item_loss(F.cross_entropy(logits, labels.to(logits.device)), labels, num_items_in_batch)


class ClassificationHead(nn.Module):
    """Dropout, dense, activation, dropout and projection on the first token's states (RoBERTa's classification head):
    (sequences, hidden) -> (sequences, num_outputs). activation: a name in ACT2FN, or "hidden_act" for the model's
    own (transformers' RoFormer)."""

    def __init__(self, config, num_outputs: int, activation: str = "tanh"):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, num_outputs)
        self.act = ACT2FN[config.hidden_act if activation == "hidden_act" else activation]

    def forward(self, first_token_states: torch.Tensor) -> torch.Tensor:
        states = self.dropout(self.act(self.dense(self.dropout(first_token_states))))
        return self.out_proj(states)


# ---------------------------------------------------------------------------------------------------------------------
# The head classes. A model's head is `class RoFormerForTokenClassification(EncoderForTokenClassification,
# RoFormerPreTrainedModel): ...`: the head class builds the base model (its pretrained class's `base_model_class`,
# under `base_model_prefix`) and the head's modules, under the names checkpoints use, and writes the forward. A model
# whose head reads something else writes that head in its own file with the functions above.
# ---------------------------------------------------------------------------------------------------------------------


class EncoderForTokenClassification:
    """Token classification: dropout and a linear classifier on every real token (BERT's head)."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, packing = run_base_model(self, *inputs, output_attentions, output_hidden_states, kwargs)
        logits = run_on_real_tokens(
            lambda states: self.classifier(self.dropout(states)), outputs.last_hidden_state, packing, attention_mask
        )
        loss = self.loss_function(logits, labels, self.config, **kwargs) if labels is not None else None
        return head_output(TokenClassifierOutput, outputs, self.config, return_dict, loss=loss, logits=logits)


class EncoderForSequenceClassification:
    """Sequence classification: `ClassificationHead` on each sequence's first token, transformers' loss for the
    config's problem_type. `classifier_activation`: the head's activation (see `ClassificationHead`)."""

    classifier_activation = "tanh"

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        self.classifier = ClassificationHead(config, config.num_labels, self.classifier_activation)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, packing = run_base_model(self, *inputs, output_attentions, output_hidden_states, kwargs)
        logits = self.classifier(first_token_states(outputs.last_hidden_state, packing))
        loss = None
        if labels is not None:
            # transformers' regression and multi-label losses are means that ignore num_items_in_batch: all are taken
            # as means, then divided by it alike
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
            loss = per_item_loss(loss, labels, kwargs.get("num_items_in_batch"))
        return head_output(SequenceClassifierOutput, outputs, self.config, return_dict, loss=loss, logits=logits)


class EncoderForMultipleChoice:
    """Multiple choice: the choices of (batch, num_choices, seq_len) inputs run as one batch of sequences, each
    scored by `ClassificationHead` on its first token."""

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        self.classifier = ClassificationHead(config, 1)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> MultipleChoiceModelOutput | tuple:
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        num_choices, choices = flatten_choice_batch(self, *inputs, output_attentions, output_hidden_states, kwargs)
        outputs = self.base_model(**choices)
        logits = self.classifier(outputs.last_hidden_state[:, 0]).view(-1, num_choices)
        loss = choice_loss(logits, labels, kwargs.get("num_items_in_batch"))
        return head_output(MultipleChoiceModelOutput, outputs, self.config, return_dict, loss=loss, logits=logits)


class EncoderForMaskedLM:
    """Masked language modelling with BERT's head at `self.cls` (`OnlyMLMHead` over the model's
    `prediction_head_class`), run on the real tokens only."""

    prediction_head_class: type

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        self.cls = OnlyMLMHead(self.prediction_head_class(config))
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        replace_decoder(self.cls.predictions, new_embeddings)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, packing = run_base_model(self, *inputs, output_attentions, output_hidden_states, kwargs)
        logits = run_on_real_tokens(self.cls, outputs.last_hidden_state, packing, attention_mask)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return head_output(MaskedLMOutput, outputs, self.config, return_dict, loss=loss, logits=logits)


class EncoderForQuestionAnswering:
    """Extractive QA: start and end logits per token. Where an attention_mask is given, the logits at padded
    positions are `torch.finfo(dtype).min` (in every `unpad_inputs` mode), so padding never wins and the loss does
    not depend on it. A flattened batch gets (num_sequences, longest sequence) logits, one row per sequence, and
    takes start/end_positions per sequence. With `config.qa_head="span_selection"` the logits come from the
    span-selection head of the model's `...ForQuestionSpanSelection` (same name `qass`, same weights), asked by each
    example's one `config.question_token_id` token."""

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        if config.qa_head == "span_selection":
            self.qass = QuestionAwareSpanSelectionHead(config)
        else:
            self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, packing = run_base_model(self, *inputs, output_attentions, output_hidden_states, kwargs)
        hidden_states = outputs.last_hidden_state
        if self.config.qa_head == "span_selection":
            logits = single_question_logits(self.qass, self.config, input_ids, hidden_states, attention_mask, packing)
        else:
            logits = span_logits(self.qa_outputs, hidden_states, attention_mask, packing)
        start_logits, end_logits = logits
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        return head_output(
            QuestionAnsweringModelOutput,
            outputs,
            self.config,
            return_dict,
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
        )


class EncoderForQuestionSpanSelection:
    """Question-aware span selection (Splinter's QASS head), the model of recurring span selection pre-training: each
    [QUESTION] token of a passage points at the start and end of its answer span.

    question_positions (B, Q) long: the index of each question token, -1 where an example has fewer than Q. Without
    it, every token `config.question_token_id` is a question (left-aligned, -1 padded). start_positions /
    end_positions (B, Q): the answer's first and last token, ignored where the question is -1. Returns start and end
    logits (B, Q, L), `torch.finfo(dtype).min` at padding and on the rows of absent questions, and the loss: the
    mean over asked questions of (CE(start) + CE(end)) / 2. A flattened batch takes and gets the same per sequence
    (num_sequences, Q), positions counted within each sequence. The model's `...ForQuestionAnswering` with
    `config.qa_head="span_selection"` holds the same head under the same name and fine-tunes from this model's weights.
    """

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        self.qass = QuestionAwareSpanSelectionHead(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        question_positions=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        if question_positions is None and (self.config.question_token_id is None or input_ids is None):
            raise ValueError(
                f"{type(self).__name__} needs question_positions, or input_ids and config.question_token_id (the "
                "[QUESTION] token) to find them"
            )
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, packing = run_base_model(self, *inputs, output_attentions, output_hidden_states, kwargs)
        hidden_states = outputs.last_hidden_state
        if question_positions is None:
            question_positions = find_questions(input_ids, self.config.question_token_id, packing)
        real = real_token_mask(attention_mask, packing)
        width = packing.width if packing is not None else hidden_states.shape[1]
        rows = packing.rows if packing is not None and packing.flattened else hidden_states.shape[0]
        check_span_selection(question_positions, start_positions, end_positions, real, (rows, width))
        start_logits, end_logits = question_span_logits(
            self.qass, hidden_states, question_positions, attention_mask, packing
        )
        loss = None
        if start_positions is not None:
            loss = span_selection_loss(start_logits, end_logits, start_positions, end_positions, question_positions)
        return head_output(
            QuestionAnsweringModelOutput,
            outputs,
            self.config,
            return_dict,
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
        )
