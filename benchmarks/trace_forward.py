"""How much code a reader walks through on each model's default forward: one traced pass per entry point.

    python -m benchmarks.trace_forward [--json PATH] [--functions]

Each entry point (DeBERTa sequence classification, RoFormer masked LM, LittleBird question answering, and transformers'
BERT sequence classification as the yardstick) runs one forward on CPU, in eval mode, on a right-padded batch of
3 x 16 with a 2D attention mask, at a tiny size. `sys.setprofile` records every Python function that starts running;
the counts are over the named functions (not lambdas or comprehensions) defined in the model's package (posformers'
`models/`, or transformers' `modeling_bert.py` for BERT):

- functions: distinct functions that ran;
- files: distinct files they live in, with each file's share of the lines;
- lines: the source lines of those functions (each counted once, whole);
- longest: the longest of them, in lines.

The counts are a property of the code, not of the machine: two runs give the same numbers. A change to a model's
default path shows here (`--functions` lists every function that ran).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

BATCH, WIDTH, LENGTHS = 3, 16, (16, 11, 5)


@dataclass
class Trace:
    entry_point: str
    functions: int
    files: int
    lines: int
    longest: str
    longest_lines: int
    lines_per_file: dict[str, int]
    listing: list[str] = field(default_factory=list)


def tiny_models() -> dict[str, torch.nn.Module]:
    """The entry points at a tiny size, seeded, in eval mode."""
    import transformers

    import posformers

    torch.manual_seed(0)
    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=99)
    deberta = posformers.DebertaConfig(**size, num_labels=3)
    roformer = posformers.RoFormerConfig(**size)
    littlebird = posformers.LittleBirdConfig(**size)
    bert = transformers.BertConfig(**size, num_labels=3)
    return {
        "DebertaForSequenceClassification": posformers.DebertaForSequenceClassification(deberta),
        "RoFormerForMaskedLM": posformers.RoFormerForMaskedLM(roformer),
        "LittleBirdForQuestionAnswering": posformers.LittleBirdForQuestionAnswering(littlebird),
        "transformers BertForSequenceClassification": transformers.BertForSequenceClassification(bert),
    }


def padded_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 99, (BATCH, WIDTH), generator=generator)
    attention_mask = (torch.arange(WIDTH)[None] < torch.tensor(LENGTHS)[:, None]).long()
    return {"input_ids": input_ids.masked_fill(attention_mask == 0, 0), "attention_mask": attention_mask}


def traced_functions(model: torch.nn.Module, inputs: dict, roots: tuple[str, ...]) -> set:
    """The code objects of the named functions under `roots` (file path prefixes) that ran in one forward."""
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(roots) and not code.co_name.startswith("<"):
                seen.add(code)

    sys.setprofile(profile)
    try:
        model(**inputs)
    finally:
        sys.setprofile(None)
    return seen


def source_lines(code) -> int:
    try:
        return len(inspect.getsourcelines(code)[0])
    except (OSError, TypeError):
        return 0


def trace(name: str, model: torch.nn.Module, inputs: dict, roots: tuple[str, ...], base: Path) -> Trace:
    with torch.no_grad():
        codes = traced_functions(model, inputs, roots)
    sizes = {code: source_lines(code) for code in codes}
    per_file = Counter()
    for code, size in sizes.items():
        per_file[Path(code.co_filename).name] += size
    longest = max(sizes, key=sizes.get)
    listing = sorted(
        f"{Path(code.co_filename).relative_to(base)}:{code.co_firstlineno} {code.co_qualname} ({size})"
        for code, size in sizes.items()
    )
    return Trace(
        entry_point=name,
        functions=len(codes),
        files=len(per_file),
        lines=sum(sizes.values()),
        longest=f"{Path(longest.co_filename).name}:{longest.co_firstlineno} {longest.co_qualname}",
        longest_lines=sizes[longest],
        lines_per_file=dict(per_file.most_common()),
        listing=listing,
    )


def run() -> list[Trace]:
    import transformers

    import posformers

    models_dir = Path(posformers.__file__).parent
    bert_file = Path(inspect.getsourcefile(transformers.BertForSequenceClassification))
    inputs = padded_batch()
    traces = []
    for name, model in tiny_models().items():
        model.eval()
        if name.startswith("transformers"):
            roots, base = (str(bert_file),), bert_file.parent
        else:
            roots, base = (str(models_dir) + "/",), models_dir
        traces.append(trace(name, model, inputs, roots, base))
    return traces


def format_table(traces: list[Trace]) -> str:
    rows = [
        "| entry point | functions | files | lines | longest function |",
        "|---|---|---|---|---|",
    ]
    for t in traces:
        files = ", ".join(f"{name.removesuffix('.py')} {lines}" for name, lines in t.lines_per_file.items())
        rows.append(
            f"| {t.entry_point} | {t.functions} | {t.files} ({files}) | {t.lines} | {t.longest} ({t.longest_lines}) |"
        )
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_forward", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the counts (and each function that ran) to this file")
    parser.add_argument("--functions", action="store_true", help="list every function that ran, per entry point")
    args = parser.parse_args(argv)
    traces = run()
    print(format_table(traces))
    if args.functions:
        for t in traces:
            print(f"\n{t.entry_point}:")
            print("\n".join(f"  {line}" for line in t.listing))
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in traces], indent=2) + "\n")


if __name__ == "__main__":
    main()
