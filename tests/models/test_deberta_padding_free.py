"""DeBERTa's own padding-free behaviour: the relative-position cache its inference path keeps per group width, and the
absolute positions that v1's input embeddings and the Enhanced Mask Decoder read, packed. What every model keeps
(packed == padded for every head, case and DeBERTa version, flattened batches, what rules packing out, precision,
compilation, checkpointing) is in test_contracts.py."""

import torch
from helpers.modeling import make_batch, tiny_config
from helpers.padding_free import TOLERANCE
from helpers.registry import DEBERTA_VERSIONS

from posformers import DebertaConfig, DebertaForMaskedLM, DebertaModel


def build(model_class, version: str, **overrides):
    torch.manual_seed(0)
    return model_class(tiny_config(DebertaConfig, **{**DEBERTA_VERSIONS[version], **overrides})).eval()


def test_inference_cache_keys_on_the_group_width():
    """In inference (no autograd) the shared buffers and cached projections serve groups of several widths within
    each layer: outputs equal those of the training-mode path without the cache."""
    model = build(DebertaForMaskedLM, "v3", unpad_inputs="always")
    input_ids, attention_mask, _ = make_batch(batch=6, seq_len=40, pad_from=(None, 3, 30, 8, 39, 1))
    with torch.no_grad():
        cached = model(input_ids, attention_mask=attention_mask).logits
    uncached = model(input_ids, attention_mask=attention_mask).logits  # autograd on: no cache
    assert len(model.deberta.packing_for(input_ids, None, attention_mask, None, False, {}).groups()) > 1
    real = attention_mask.bool()
    assert (cached[real] - uncached[real]).abs().max() <= TOLERANCE


def test_v1_reads_position_ids_broadcast_over_the_batch_packed():
    """v1 adds absolute position embeddings to its input: (1, L) position_ids that broadcast over the batch (here
    reversed) are packed as the padded path reads them."""
    model = build(DebertaModel, "v1")
    input_ids, attention_mask, _ = make_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=torch.arange(17).flip(0)[None])
    real = attention_mask.bool()
    with torch.no_grad():
        model.config.unpad_inputs = "never"
        expected = model(**inputs).last_hidden_state
        model.config.unpad_inputs = "always"
        actual = model(**inputs).last_hidden_state
        default = model(input_ids, attention_mask=attention_mask).last_hidden_state
    assert (actual[real] - expected[real]).abs().max() <= TOLERANCE
    assert (default[real] - expected[real]).abs().max() > 1e-3  # the positions matter


def test_enhanced_mask_decoder_reads_the_given_position_ids_packed():
    model = build(DebertaForMaskedLM, "v3")
    input_ids, attention_mask, _ = make_batch()
    position_ids = torch.randint(0, 64, input_ids.shape, generator=torch.Generator().manual_seed(3))
    real = attention_mask.bool()
    with torch.no_grad():
        model.config.unpad_inputs = "never"
        expected = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        model.config.unpad_inputs = "always"
        actual = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        default = model(input_ids, attention_mask=attention_mask).logits
    assert (actual[real] - expected[real]).abs().max() <= TOLERANCE
    assert (default[real] - expected[real]).abs().max() > 1e-3  # the positions matter
