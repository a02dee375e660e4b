"""sentence-transformers module files next to a converted model whose sentence vector is its BERT-style pooler
(RoFormer-sim: `posformers-convert roformer ... --sentence-transformers`).

`SentenceTransformer(folder)` then computes the model's own vector, normalised: the Transformer module (the base model
as `AutoModel` loads it from the folder), [CLS] pooling, a Dense module holding the pooler's weights and activation,
and Normalize. sentence-transformers writes its own files: this module builds that pipeline, saves it to a scratch
folder, and copies in only what is not the model itself (modules.json, the sentence-transformers configs and the
module folders), so the converted weights, head and tokenizer stay as the conversion wrote them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from torch import nn

from posformers._extras import install_hint
from posformers.conversion.core import ConversionError

# pooler_activation -> the torch module sentence-transformers' Dense saves by class path
ACTIVATIONS = {"linear": nn.Identity, "tanh": nn.Tanh, "gelu": nn.GELU, "relu": nn.ReLU}
# sentence-transformers' files in the model's root folder (the Transformer module's own config among them)
ROOT_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")


def write_pooler_modules(folder: str | Path) -> list[str]:
    """Write the modules that make `folder` (a saved posformers model with a pooler) a SentenceTransformer whose
    embedding is the normalised `pooler_output`. Returns the names written."""
    try:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    except ImportError as error:
        raise ConversionError(
            f"--sentence-transformers needs sentence-transformers, the st extra: {install_hint('st')}"
        ) from error
    folder = Path(folder)
    transformer = Transformer(str(folder))
    model = transformer.model
    pooler = getattr(model, "pooler", None)
    if pooler is None:
        raise ConversionError("--sentence-transformers: the converted model has no pooler to take the sentence vector")
    activation = model.config.pooler_activation
    if activation not in ACTIVATIONS:
        raise ConversionError(
            f"--sentence-transformers: pooler_activation {activation!r} has no sentence-transformers Dense "
            f"equivalent here; one of {sorted(ACTIVATIONS)}"
        )
    hidden = model.config.hidden_size
    dense = Dense(
        hidden,
        pooler.dense.out_features,
        activation_function=ACTIVATIONS[activation](),
        init_weight=pooler.dense.weight.detach().clone(),
        init_bias=pooler.dense.bias.detach().clone(),
    )
    pipeline = SentenceTransformer(
        modules=[transformer, Pooling(hidden, pooling_mode="cls"), dense, Normalize()], similarity_fn_name="cosine"
    )
    with tempfile.TemporaryDirectory() as scratch:
        pipeline.save(scratch, create_model_card=False)
        written = [*ROOT_FILES, *(f"{index}_{type(module).__name__}" for index, module in enumerate(pipeline) if index)]
        for name in written:
            source = Path(scratch) / name
            if source.is_dir():
                shutil.copytree(source, folder / name)
            else:
                shutil.copy(source, folder / name)
    return written
