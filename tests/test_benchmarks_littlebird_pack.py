"""benchmarks/littlebird_pack.py: its text is real WordPiece tokens, its diversity measures mean what they say (the
pack tests use them too), and its held-out MLM batch masks what it labels."""

from __future__ import annotations

import pytest
import torch

from benchmarks import littlebird_pack


@pytest.fixture(scope="module")
def tokenizer():
    return littlebird_pack.tokenizer()


def test_long_text_is_real_wordpieces(tokenizer):
    ids = littlebird_pack.long_text_ids(tokenizer)
    assert ids.shape == (1, littlebird_pack.SEQ_LEN)
    assert ids[0, 0] == tokenizer.cls_token_id and ids[0, -1] == tokenizer.sep_token_id
    assert (ids == tokenizer.unk_token_id).float().mean() < 0.01
    # the SQuAD paragraphs after those of the pre-training corpus (150 for training, 20 held out)
    first = littlebird_pack.pretrain_corpus().squad_contexts()[170]
    assert tokenizer.decode(ids[0, 1:20]).split()[:5] == first.lower().split()[:5]


def test_diversity_measures():
    orthogonal = torch.eye(8, 32) * 3.0
    repeated = torch.randn(1, 32).expand(8, -1)
    assert littlebird_pack.pairwise_cosine(orthogonal) == pytest.approx(0.0)
    assert littlebird_pack.pairwise_cosine(repeated) == pytest.approx(1.0)
    assert littlebird_pack.effective_rank(orthogonal) == pytest.approx(8.0)
    assert littlebird_pack.effective_rank(repeated) == pytest.approx(1.0)
    two_groups = torch.cat((orthogonal[:1].expand(4, -1), orthogonal[1:2].expand(4, -1)))
    assert littlebird_pack.pairwise_cosine(two_groups) == pytest.approx(3 / 7)  # 4 * 3 * 2 equal pairs of 8 * 7
    assert littlebird_pack.effective_rank(two_groups) == pytest.approx(2.0)


def test_held_out_mlm_batch_masks_what_it_labels(tokenizer, tmp_path):
    corpus = littlebird_pack.pretrain_corpus().write_corpus(tmp_path)
    batch = littlebird_pack.held_out_mlm_batch(tokenizer, corpus)
    labelled = batch["labels"] != -100
    assert batch["input_ids"].shape[1] <= littlebird_pack.MLM_WINDOW
    assert (batch["input_ids"][labelled] == tokenizer.mask_token_id).all()
    assert (batch["attention_mask"][labelled] == 1).all()
    share = labelled.sum() / (batch["attention_mask"].sum() - 2 * batch["input_ids"].shape[0])
    assert 0.12 < share < 0.18
