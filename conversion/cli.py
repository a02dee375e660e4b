"""`posformers-convert <family> --from <format> --source PATH_OR_REPO_ID --output_dir DIR [options]` (also `python -m
posformers.conversion`).

Each family lives in its own module of this package (`FAMILIES`, with the line `posformers-convert --help` shows for
it), imported only when its subcommand runs, so a broken or missing family never stops the others. A family module
provides:

    SOURCES: dict[str, type[core.Source]]       `--from` value -> the source class that reads that format; the
                                                class's `help` describes the format in `--from`'s help
    add_arguments(parser: argparse.ArgumentParser) -> None
        adds the family's own options; `--from` and the common options (--source, --output_dir, --push_to_hub,
        --no_verify, --overwrite, --dtype) are already there

The conversion itself is `core.run_conversion(SOURCES[args.source_format](args), args)`, the same for every family.
`args.command_line` holds the command as typed, for the model card. A `ConversionError` is printed as
`error: <message>` and exits with status 1, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from posformers.conversion.core import DTYPES, ConversionError, resolve_source, run_conversion

PROG = "posformers-convert"
# family -> (module, one-line help shown even when the module cannot be imported)
FAMILIES = {
    "roformer": (
        "posformers.conversion.roformer",
        "RoFormer: ZhuiyiTechnology TF checkpoints (tf), HF-format directories (hf), junnyu's RoFormer-v2 (v2)",
    ),
    "deberta": (
        "posformers.conversion.deberta",
        "DeBERTa v1/v2/v3/mdeberta: HF-format checkpoints (hf) or the microsoft/DeBERTa repository's (original)",
    ),
    "littlebird": (
        "posformers.conversion.littlebird",
        "LittleBird initialised from a BERT or RoBERTa encoder (the paper's initialisation)",
    ),
}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    # The fine-tuning scripts' spellings (--output_dir, --push_to_hub), with the dashed ones kept as aliases.
    parser.add_argument(
        "--source",
        required=True,
        help="checkpoint file, prefix or directory to convert, or a Hub repo id (downloaded into the Hub cache)",
    )
    parser.add_argument(
        "--output_dir", "--output", dest="output", required=True, help="directory to write the posformers model into"
    )
    parser.add_argument(
        "--push_to_hub", "--push-to-hub", metavar="REPO_ID", help="upload the written directory to this Hub repo"
    )
    parser.add_argument(
        "--no_verify", "--no-verify", action="store_true", help="skip the comparison with the reference model"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --output directory")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the saved weights")


def build_parser(family: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `family`'s module is imported (for its options), the others just list their name."""
    parser = argparse.ArgumentParser(prog=PROG, description="Convert official checkpoints into posformers models.")
    subparsers = parser.add_subparsers(dest="family", metavar="family", required=True)
    for name, (_, help_text) in FAMILIES.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        add_common_arguments(subparser)
        if name == family:
            module = _family_module(name)
            formats = "; ".join(f"{fmt}: {source.help}" for fmt, source in module.SOURCES.items())
            subparser.add_argument(
                "--from", dest="source_format", required=True, choices=list(module.SOURCES), help=formats
            )
            module.add_arguments(subparser)
    return parser


def _family_module(family: str):
    module_name = FAMILIES[family][0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        raise ConversionError(f"the {family} converter is not available in this installation") from error


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    family = next((arg for arg in argv if not arg.startswith("-")), None)
    try:
        parser = build_parser(family if family in FAMILIES else None)
        args = parser.parse_args(argv)
        args.command_line = shlex.join([PROG, *argv])
        args.source, args.source_repo_id = resolve_source(args.source)
        source = _family_module(args.family).SOURCES[args.source_format](args)
        return run_conversion(source, args)
    except ConversionError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
