"""What the heads of the three models share: the standard losses of transformers' loss mapping (`self.loss_function`),
checked against cross-entropy written out here, with the Trainer's keyword arguments (`num_items_in_batch`) passed
through the base model to the loss."""

import pytest
import torch
import torch.nn.functional as F
from helpers.modeling import make_batch, tiny_config

from posformers import (
    DebertaConfig,
    DebertaForMaskedLM,
    DebertaForQuestionAnswering,
    DebertaForTokenClassification,
    LittleBirdConfig,
    LittleBirdForMaskedLM,
    LittleBirdForQuestionAnswering,
    LittleBirdForSequenceClassification,
    LittleBirdForTokenClassification,
    RoFormerConfig,
    RoFormerForMaskedLM,
    RoFormerForQuestionAnswering,
    RoFormerForSequenceClassification,
    RoFormerForTokenClassification,
)

CONFIGS = {"roformer": RoFormerConfig, "deberta": DebertaConfig, "littlebird": LittleBirdConfig}
MLM = {"roformer": RoFormerForMaskedLM, "deberta": DebertaForMaskedLM, "littlebird": LittleBirdForMaskedLM}
TOKEN = {
    "roformer": RoFormerForTokenClassification,
    "deberta": DebertaForTokenClassification,
    "littlebird": LittleBirdForTokenClassification,
}
QA = {
    "roformer": RoFormerForQuestionAnswering,
    "deberta": DebertaForQuestionAnswering,
    "littlebird": LittleBirdForQuestionAnswering,
}
# DeBERTa keeps its official sequence-classification loss (negative labels ignored, soft labels): tested in its file.
SEQUENCE = {"roformer": RoFormerForSequenceClassification, "littlebird": LittleBirdForSequenceClassification}


def build(heads, model, **overrides):
    torch.manual_seed(0)
    return heads[model](tiny_config(CONFIGS[model], **overrides)).eval()


def summed_cross_entropy(logits, labels, ignore_index=-100):
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=ignore_index, reduction="sum")


# Per-token heads: their config overrides and labels (-100 = unlabelled) for a batch.
TOKEN_LEVEL = {
    "mlm": (MLM, {}, lambda ids, mask: ids.masked_fill((mask == 0) | (ids % 3 == 0), -100)),
    "token_classification": (TOKEN, {"num_labels": 3}, lambda ids, mask: (ids % 3).masked_fill(mask == 0, -100)),
}


@pytest.mark.parametrize("model", sorted(CONFIGS))
@pytest.mark.parametrize("kind", sorted(TOKEN_LEVEL))
def test_token_loss_is_the_mean_over_labelled_tokens_or_over_num_items_in_batch(kind, model):
    heads, overrides, make_labels = TOKEN_LEVEL[kind]
    head = build(heads, model, **overrides)
    input_ids, attention_mask, _ = make_batch()
    labels = make_labels(input_ids, attention_mask)
    with torch.no_grad():
        out = head(input_ids, attention_mask=attention_mask, labels=labels)
        total = summed_cross_entropy(out.logits, labels)
        torch.testing.assert_close(out.loss, total / (labels != -100).sum())
        # what the Trainer passes under gradient accumulation: the labelled tokens of all accumulated batches
        accumulated = head(input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=torch.tensor(97))
    torch.testing.assert_close(accumulated.loss, total / 97)


@pytest.mark.parametrize("model", sorted(QA))
def test_qa_loss_averages_start_and_end_and_ignores_positions_outside_the_input(model):
    head = build(QA, model)
    input_ids, attention_mask, _ = make_batch(seq_len=17)
    starts, ends = torch.tensor([1, 3, 40]), torch.tensor([4, 3, 2])  # 40 lies outside: ignored, as in transformers
    with torch.no_grad():
        out = head(input_ids, attention_mask=attention_mask, start_positions=starts, end_positions=ends)
    start_loss = F.cross_entropy(out.start_logits[:2], starts[:2])
    end_loss = F.cross_entropy(out.end_logits, ends)
    torch.testing.assert_close(out.loss, (start_loss + end_loss) / 2)


@pytest.mark.parametrize("model", sorted(SEQUENCE))
def test_sequence_classification_loss_follows_the_label_type(model):
    input_ids, attention_mask, _ = make_batch()
    head = build(SEQUENCE, model, num_labels=3)
    with torch.no_grad():
        single = head(input_ids, attention_mask=attention_mask, labels=torch.tensor([0, 2, 1]))
    torch.testing.assert_close(single.loss, F.cross_entropy(single.logits, torch.tensor([0, 2, 1])))
    assert head.config.problem_type == "single_label_classification"

    head = build(SEQUENCE, model, num_labels=3)
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    with torch.no_grad():
        multi = head(input_ids, attention_mask=attention_mask, labels=targets)
    torch.testing.assert_close(multi.loss, F.binary_cross_entropy_with_logits(multi.logits, targets))

    head = build(SEQUENCE, model, num_labels=1)
    values = torch.tensor([0.5, 1.0, -1.0])
    with torch.no_grad():
        regression = head(input_ids, attention_mask=attention_mask, labels=values)
    torch.testing.assert_close(regression.loss, F.mse_loss(regression.logits.squeeze(-1), values))
