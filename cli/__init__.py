"""The console scripts' entry points (`posformers-glue`, `posformers-qa`, ...).

`posformers-<script> --help` prints the script's help from `help/<script>.txt` without importing torch, transformers or
posformers: importing posformers registers its models with transformers' Auto classes, which loads torch and the
model code (seconds), and the help needs none of it. Every other command line runs the script's `main`. The texts are
what the scripts print themselves at 100 columns; `python -m posformers_cli` writes them again after an option
changes, and a test checks that they are current.

This is a package of its own, outside `posformers`, because importing any module of `posformers` first imports the
package, and with it the models.
"""

import importlib
import sys
from importlib.resources import files

# Console script -> the module whose `main(argv=None)` runs it.
SCRIPTS = {
    "posformers-convert": "posformers.conversion.cli",
    "posformers-export": "posformers.integrations.export",
    "posformers-glue": "posformers.finetune.run_glue",
    "posformers-littlebird-recipe": "posformers.finetune.littlebird_recipe",
    "posformers-mc": "posformers.finetune.run_mc",
    "posformers-ner": "posformers.finetune.run_ner",
    "posformers-pretrain": "posformers.finetune.run_pretrain",
    "posformers-qa": "posformers.finetune.run_qa",
}
HELP_FLAGS = (["--help"], ["-h"])


def help_text(script: str) -> str:
    return files(__name__).joinpath("help", f"{script}.txt").read_text(encoding="utf-8")


def launch(script: str):
    """Run `script` on the command line: its shipped help for a lone --help (or -h), else its module's `main`."""
    if sys.argv[1:] in HELP_FLAGS:
        sys.stdout.write(help_text(script))
        return None
    return importlib.import_module(SCRIPTS[script]).main()


def entry_point(script: str):
    """The function `[project.scripts]` names for `script`."""

    def main():
        return launch(script)

    main.__qualname__ = main.__name__ = script.removeprefix("posformers-").replace("-", "_")
    return main


convert = entry_point("posformers-convert")
export = entry_point("posformers-export")
glue = entry_point("posformers-glue")
littlebird_recipe = entry_point("posformers-littlebird-recipe")
mc = entry_point("posformers-mc")
ner = entry_point("posformers-ner")
pretrain = entry_point("posformers-pretrain")
qa = entry_point("posformers-qa")
