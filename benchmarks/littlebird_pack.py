"""Is LittleBird's pack memory s distinct slots, and does it leave a model converted from BERT close to its teacher?

    python -m benchmarks.littlebird_pack [--label NAME] [--variants current p0-unit ...]

Measured at base size (12 layers x 768 x 12 heads, block 64, pack 64), float32, eval mode, on 2048 tokens of real
text (SQuAD v1.1 dev paragraphs from tests/data, joined, bert-base-uncased WordPiece, [CLS] ... [SEP]):

- pack-state diversity after layer 1 (P'1) and of the final pack states (`pack_states`): mean pairwise cosine over the
  s states, and the effective rank of P'1, the participation ratio (sum sigma)^2 / sum sigma^2 of its singular values
  (s for s orthogonal states of equal norm, 1 for one state repeated);
- the pack attention of layer 1: its largest weight against the uniform 1 / L;
- per head of layer 1, the share of USWAttn attention mass on the s unpacked keys (mean over the tokens);

(a) for a LittleBird initialised as `LittleBirdForMaskedLM(config)` does, and (b) after
`posformers-convert littlebird --from bert` of a randomly initialised transformers `BertForMaskedLM` base; and (c)
the MLM loss on held-out real text (the 20 SQuAD paragraphs of tests/helpers/pretrain_corpus.py's validation split,
cut into windows of 128 tokens, 15% of the words masked with a fixed seed, all replaced by [MASK]) of a small BERT
teacher trained with `posformers-pretrain --objective mlm --model_type bert` on that corpus's training split (2 x 128
x 2 heads, 240 steps of 32 x 128 tokens, cached in benchmarks/results/littlebird_pack_teacher) and of its converted
student, before any training.

Variants change the converted or new model's fresh parameters after it is built, to compare initialisations without
editing the library: `current` (as the library initialises), `p0-0.02` (P0 ~ N(0, 0.02), the earlier one),
`p0-unit` (P0 ~ N(0, 1)), `p0-layernorm` (P0 ~ N(0, 0.02), each row then normalised to zero mean and unit
variance: what a LayerNorm with unit weight and zero bias on P0 computes at initialisation), `pack-from-teacher`
(`p0-unit`, and each layer's pack attention Q/K/V/O copied from the same layer's USWAttn Q/K/V/O: after conversion,
the teacher's attention). Every run is stored under `--label` in benchmarks/results/littlebird_pack.json, and the
table of all stored runs is written to benchmarks/results/littlebird_pack.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizer

import posformers

from .harness import REPO_ROOT, RESULTS_DIR, environment

VOCAB = REPO_ROOT / "tests" / "data" / "vocab" / "bert-base-uncased" / "vocab.txt"
TEACHER_DIR = RESULTS_DIR / "littlebird_pack_teacher"
SEQ_LEN, MLM_WINDOW, MLM_PROBABILITY, SEED = 2048, 128, 0.15, 0
TEACHER_OVERRIDES = "hidden_size=128,num_hidden_layers=2,num_attention_heads=2,intermediate_size=512"
VARIANTS = ("current", "p0-0.02", "p0-unit", "p0-layernorm", "pack-from-teacher")


def pretrain_corpus():
    """tests/helpers/pretrain_corpus.py, the corpus of the pre-training tests (importable with tests/ on the path)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    try:
        from helpers import pretrain_corpus
    finally:
        sys.path.pop(0)
    return pretrain_corpus


def tokenizer() -> BertTokenizer:
    """bert-base-uncased's WordPiece from its vocab.txt (`BertTokenizerFast(vocab_file=...)` ignores the file in
    transformers 5 and maps every word to [UNK]; `from_pretrained` of the folder reads it)."""
    return BertTokenizer.from_pretrained(VOCAB.parent)


def long_text_ids(tok: BertTokenizer) -> torch.Tensor:
    """(1, SEQ_LEN) ids: [CLS], SQuAD dev paragraphs after the corpus' training and held-out ones, [SEP]."""
    ids = []
    for context in pretrain_corpus().squad_contexts()[170:]:
        ids += tok(context, add_special_tokens=False)["input_ids"]
        if len(ids) >= SEQ_LEN - 2:
            break
    return torch.tensor([[tok.cls_token_id, *ids[: SEQ_LEN - 2], tok.sep_token_id]])


def held_out_mlm_batch(tok: BertTokenizer, corpus: dict) -> dict[str, torch.Tensor]:
    """The validation split's SQuAD paragraphs in windows of MLM_WINDOW tokens, right-padded, 15% masked."""
    lines = corpus["validation"].read_text(encoding="utf-8").splitlines()[:20]  # its SQuAD paragraphs
    windows = []
    for line in lines:
        ids = tok(line, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), MLM_WINDOW - 2):
            windows.append([tok.cls_token_id, *ids[start : start + MLM_WINDOW - 2], tok.sep_token_id])
    width = max(map(len, windows))
    input_ids = torch.tensor([w + [tok.pad_token_id] * (width - len(w)) for w in windows])
    attention_mask = (input_ids != tok.pad_token_id).long()
    special = (input_ids == tok.cls_token_id) | (input_ids == tok.sep_token_id) | ~attention_mask.bool()
    generator = torch.Generator().manual_seed(SEED)
    masked = (torch.rand(input_ids.shape, generator=generator) < MLM_PROBABILITY) & ~special
    labels = input_ids.masked_fill(~masked, -100)
    return {
        "input_ids": input_ids.masked_fill(masked, tok.mask_token_id),
        "attention_mask": attention_mask,
        "labels": labels,
    }


def train_teacher(corpus: dict) -> Path:
    """The small BERT teacher, trained once with posformers-pretrain and cached in TEACHER_DIR."""
    if (TEACHER_DIR / "config.json").is_file():
        return TEACHER_DIR
    from posformers.finetune import run_pretrain

    tokenizer_dir = RESULTS_DIR / "littlebird_pack_tokenizer"
    tokenizer().save_pretrained(tokenizer_dir)
    run_pretrain.main(
        ["--objective", "mlm", "--model_type", "bert",
         "--config_overrides", f"{TEACHER_OVERRIDES},max_position_embeddings=512",
         "--tokenizer_name", str(tokenizer_dir), "--train_file", str(corpus["train"]),
         "--validation_file", str(corpus["validation"]), "--max_seq_length", str(MLM_WINDOW),
         "--do_train", "--do_eval", "--max_steps", "240", "--per_device_train_batch_size", "32",
         "--learning_rate", "2e-3", "--warmup_steps", "20", "--output_dir", str(TEACHER_DIR),
         "--overwrite_output_dir", "--report_to", "none", "--save_strategy", "no", "--seed", str(SEED),
         "--logging_steps", "40", "--disable_tqdm", "true"]
    )  # fmt: skip
    return TEACHER_DIR


def convert(teacher_dir: Path, output: Path) -> posformers.LittleBirdForMaskedLM:
    from posformers.conversion import cli

    status = cli.main(
        ["littlebird", "--from", "bert", "--source", str(teacher_dir), "--output", str(output), "--vocab", str(VOCAB)]
    )
    if status:
        raise RuntimeError(f"posformers-convert littlebird --from bert {teacher_dir} failed ({status})")
    return posformers.LittleBirdForMaskedLM.from_pretrained(output, dtype=torch.float32).eval()


@torch.no_grad()
def apply_variant(model: posformers.LittleBirdForMaskedLM, variant: str) -> None:
    """Re-initialise the fresh parameters as `variant` says (see the module docstring)."""
    base = model.littlebird
    pack = base.embeddings.pack_embeddings
    generator = torch.Generator().manual_seed(SEED)
    if variant in ("p0-0.02", "p0-layernorm"):
        pack.copy_(torch.randn(pack.shape, generator=generator) * 0.02)
        if variant == "p0-layernorm":
            pack.copy_(torch.nn.functional.layer_norm(pack, pack.shape[-1:]))
    elif variant in ("p0-unit", "pack-from-teacher"):
        pack.copy_(torch.randn(pack.shape, generator=generator))
    if variant == "pack-from-teacher":
        for layer in base.encoder.layer:
            for name in ("query", "key", "value"):
                getattr(layer.pack_attention, name).load_state_dict(getattr(layer.attention.self, name).state_dict())
            layer.pack_attention.dense.load_state_dict(layer.attention.output.dense.state_dict())
    elif variant not in VARIANTS:
        raise ValueError(f"--variants: unknown variant {variant!r}; choose from {VARIANTS}")


def pairwise_cosine(states: torch.Tensor) -> float:
    """(s, d) -> mean cosine over the s (s - 1) ordered pairs of distinct states."""
    unit = torch.nn.functional.normalize(states.double(), dim=-1)
    similarity = unit @ unit.T
    count = states.shape[0]
    return float((similarity.sum() - similarity.diagonal().sum()) / (count * (count - 1)))


def effective_rank(states: torch.Tensor) -> float:
    """(s, d) -> participation ratio of the singular values, (sum sigma)^2 / sum sigma^2."""
    sigma = torch.linalg.svdvals(states.double())
    return float(sigma.sum() ** 2 / (sigma**2).sum())


@torch.no_grad()
def pack_diversity(model: posformers.LittleBirdForMaskedLM, input_ids: torch.Tensor) -> dict:
    config = model.config
    out = model.littlebird(input_ids, output_hidden_states=True, output_attentions=True)
    after_layer1 = out.pack_hidden_states[1][0]
    pack_columns = math.ceil(config.pack_length / config.block_size) * config.block_size
    weights = out.attentions[0][0]  # (H, n, b, w), first pack_columns keys are the unpacked ones
    real = weights.flatten(1, 2)[:, : input_ids.shape[1]]  # (H, L, w)
    return {
        "cosine_after_layer1": pairwise_cosine(after_layer1),
        "cosine_final": pairwise_cosine(out.pack_states[0]),
        "effective_rank_after_layer1": effective_rank(after_layer1),
        "p0_rms": float(out.pack_hidden_states[0][0].pow(2).mean().sqrt()),
        "pack_attention_max_weight_layer1": float(out.pack_attentions[0].max()),
        "pack_attention_uniform_weight": 1.0 / input_ids.shape[1],
        "unpack_mass_per_head_layer1": real[..., :pack_columns].sum(-1).mean(-1).tolist(),
    }


@torch.no_grad()
def mlm_loss(model, batch: dict) -> float:
    return float(model(**batch).loss)


def measure(variants: list[str], work: Path) -> dict:
    tok = tokenizer()
    corpus = pretrain_corpus().write_corpus(work / "corpus")
    input_ids = long_text_ids(tok)
    mlm_batch = held_out_mlm_batch(tok, corpus)
    teacher_dir = train_teacher(corpus)
    teacher = BertForMaskedLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    results = {"teacher_mlm_loss": mlm_loss(teacher, mlm_batch), "variants": {}}
    print(f"teacher MLM loss {results['teacher_mlm_loss']:.4f}", file=sys.stderr)

    torch.manual_seed(SEED)
    BertForMaskedLM(BertConfig()).save_pretrained(work / "bert-base-random")
    config = posformers.LittleBirdConfig.from_preset("littlebird-base")
    fresh = posformers.LittleBirdForMaskedLM(config).eval()
    converted = convert(work / "bert-base-random", work / "converted-base")
    student = convert(teacher_dir, work / "student")
    states = {name: {k: v.clone() for k, v in m.state_dict().items()} for name, m in
              (("fresh", fresh), ("converted", converted), ("student", student))}  # fmt: skip
    for variant in variants:
        for name, model in (("fresh", fresh), ("converted", converted), ("student", student)):
            model.load_state_dict(states[name])
            apply_variant(model, variant)
        row = {
            "init": pack_diversity(fresh, input_ids),
            "converted": pack_diversity(converted, input_ids),
            "student_mlm_loss": mlm_loss(student, mlm_batch),
        }
        results["variants"][variant] = row
        print(f"{variant}: {json.dumps(row)}", file=sys.stderr)
    results["mlm_windows"] = int(mlm_batch["input_ids"].shape[0])
    results["mlm_masked_tokens"] = int((mlm_batch["labels"] != -100).sum())
    return results


def heads_summary(masses: list[float]) -> str:
    return f"{min(masses):.1%} .. {max(masses):.1%}"


def write_table(stored: dict, path: Path) -> None:
    lines = [
        "# LittleBird pack memory: diversity at initialisation and after conversion from BERT",
        "",
        "`python -m benchmarks.littlebird_pack` (see its docstring). Base size, 2048 tokens of SQuAD text. Targets "
        "(distinct slots): mean pairwise cosine after layer 1 <= 0.3 and effective rank >= s/4 = 16, at initialisation "
        "and after conversion. Unpack mass: share of layer 1's USWAttn attention on the 64 unpacked keys, lowest .. "
        "highest head. Final pack states: the model's `pack_states` (after layer 12 before the fix; after layer 11 "
        "after it, the last layer computing no update). MLM loss: held-out SQuAD windows of 128 tokens, teacher "
        "(BERT 2 x 128) / its converted student before any training.",
        "",
        "| run | variant | model | P0 RMS | cosine after layer 1 | effective rank after layer 1 | cosine, final "
        "pack states | largest pack weight (uniform) | unpack mass, layer 1 | MLM loss: teacher / student |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, run in stored["runs"].items():
        for variant, row in run["results"]["variants"].items():
            for model in ("init", "converted"):
                m = row[model]
                loss = (
                    f"{run['results']['teacher_mlm_loss']:.4f} / {row['student_mlm_loss']:.4f}"
                    if model == "converted"
                    else ""
                )
                lines.append(
                    f"| {label} | {variant} | {'new' if model == 'init' else 'converted'} | {m['p0_rms']:.3f} | "
                    f"{m['cosine_after_layer1']:.3f} | {m['effective_rank_after_layer1']:.1f} | "
                    f"{m['cosine_final']:.3f} | {m['pack_attention_max_weight_layer1']:.2e} "
                    f"({m['pack_attention_uniform_weight']:.2e}) | {heads_summary(m['unpack_mass_per_head_layer1'])} "
                    f"| {loss} |"
                )
    lines += ["", "Runs:", ""]
    for label, run in stored["runs"].items():
        env = run["environment"]
        note = f" {run['note']}" if run.get("note") else ""
        lines.append(
            f"- {label}: commit {env.get('git_commit')}, {env.get('device_name')}, torch {env.get('torch')}.{note}"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="current", help="name of this run in the stored results")
    parser.add_argument("--variants", nargs="+", default=["current"], choices=VARIANTS)
    parser.add_argument("--note", default="", help="what the run measured (the code it ran), shown with its label")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    json_path = RESULTS_DIR / "littlebird_pack.json"
    stored = json.loads(json_path.read_text()) if json_path.is_file() else {"runs": {}}
    with tempfile.TemporaryDirectory() as work:
        results = measure(args.variants, Path(work))
    env = environment(torch.device("cpu"), torch.float32, torch.get_num_threads())
    stored["runs"][args.label] = {"environment": env, "note": args.note, "results": results}
    json_path.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")
    write_table(stored, RESULTS_DIR / "littlebird_pack.md")
    print((RESULTS_DIR / "littlebird_pack.md").read_text())


if __name__ == "__main__":
    main()
