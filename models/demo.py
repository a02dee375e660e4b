"""`make demo`: train a small RoFormer masked LM on text shipped here, save it, reload it with AutoModel, fill masks.

Runs offline on a CPU in well under a minute:

    python -m posformers.demo [--output-dir demo_output/roformer-mlm] [--steps 300]
"""

import argparse
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForMaskedLM, PreTrainedTokenizerFast, pipeline

from posformers import RoFormerConfig, RoFormerForMaskedLM

# A small corpus written for this demo: facts about the models posformers ships.
CORPUS = """\
rotary embeddings rotate queries and keys by an angle that grows with position .
the angle between two tokens depends only on their distance .
roformer uses rotary embeddings instead of absolute position embeddings .
deberta separates content and position in its attention scores .
deberta adds absolute positions only in the enhanced mask decoder .
littlebird reads long documents with sliding window attention .
littlebird packs the whole document into a few global tokens .
bialibi adds a linear bias that depends on the distance between tokens .
a masked language model predicts the hidden word from its context .
the encoder reads the whole sentence in both directions .
the decoder reads the sentence from left to right .
long documents need attention that grows linearly with length .
"""
MARKER = ".posformers-demo"


def build_tokenizer(lines: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the corpus, with BERT's special tokens."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = sorted({word for line in lines for word in line.split()})
    vocab = {token: i for i, token in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def masked_examples(tokenizer, lines: list[str]):
    """Every (sentence, word) pair once, with that word masked: the whole corpus as one small batch."""
    batch = tokenizer(lines, padding=True, return_tensors="pt")
    inputs, masks, labels = [], [], []
    for row, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        for position in range(1, length - 1):  # skip [CLS] and [SEP]
            input_ids = batch["input_ids"][row].clone()
            label = torch.full_like(input_ids, -100)
            label[position] = input_ids[position]
            input_ids[position] = tokenizer.mask_token_id
            inputs.append(input_ids)
            masks.append(batch["attention_mask"][row])
            labels.append(label)
    return torch.stack(inputs), torch.stack(masks), torch.stack(labels)


def train(model, tokenizer, lines, steps: int) -> float:
    """Full-batch masked-LM training over every masked position of the corpus."""
    input_ids, attention_mask, labels = masked_examples(tokenizer, lines)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss.item()


def prepare_output_dir(path: Path) -> None:
    """Refuse to write into a folder the demo did not create: nothing of the user's is overwritten."""
    if path.exists() and any(path.iterdir()) and not (path / MARKER).exists():
        raise SystemExit(f"{path} exists and was not made by this demo; pass another --output-dir")
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).touch()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("demo_output/roformer-mlm"))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    lines = CORPUS.strip().splitlines()
    tokenizer = build_tokenizer(lines)
    config = RoFormerConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = RoFormerForMaskedLM(config)
    print(f"RoFormer MLM: {sum(p.numel() for p in model.parameters()):,} parameters, vocab {tokenizer.vocab_size}")
    start = time.perf_counter()
    final_loss = train(model, tokenizer, lines, args.steps)
    print(f"trained {args.steps} steps in {time.perf_counter() - start:.1f}s, final loss {final_loss:.3f}")

    prepare_output_dir(args.output_dir)
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved to {args.output_dir} ({', '.join(sorted(p.name for p in args.output_dir.iterdir()))})")

    reloaded = AutoModelForMaskedLM.from_pretrained(args.output_dir)
    print(f"reloaded with AutoModelForMaskedLM as {type(reloaded).__module__}.{type(reloaded).__name__}")
    fill_mask = pipeline("fill-mask", model=reloaded, tokenizer=tokenizer, device="cpu")
    probes = [
        ("roformer uses [MASK] embeddings instead of absolute position embeddings .", "rotary"),
        ("littlebird reads long documents with sliding [MASK] attention .", "window"),
        ("deberta adds absolute positions only in the enhanced mask [MASK] .", "decoder"),
        ("the [MASK] reads the whole sentence in both directions .", "encoder"),
    ]
    correct = 0
    for text, answer in probes:
        top = fill_mask(text, top_k=3)
        guesses = ", ".join(f"{p['token_str']} ({p['score']:.2f})" for p in top)
        correct += top[0]["token_str"] == answer
        print(f"  {text}\n    -> {guesses}   [expected: {answer}]")
    print(f"{correct}/{len(probes)} masks filled correctly")


if __name__ == "__main__":
    main()
