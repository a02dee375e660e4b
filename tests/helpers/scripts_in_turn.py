"""Several fine-tuning scripts, one after the other, in one process: under torchrun, the distributed runs of several
scripts for the cost of one launch (a torchrun launch spends most of its time starting the processes).

    python -m torch.distributed.run ... tests/helpers/scripts_in_turn.py <runs.json>

runs.json: [["run_mc", [<posformers-mc arguments>]], ["run_ner", [...]], ...]. The scripts share one process group:
each script's `main` ends by destroying its own (finetune/distributed.py, exit_on_lost_process), and a second one
set up under the same torchrun rendezvous finds the first one's stale addresses in the launcher's store. So each
script runs without that end (its `main` as written, inside the wrappers), and this file ends the group once.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from posformers.finetune.distributed import exit_on_lost_process
from posformers.finetune.errors import exit_on_data_error


@exit_on_data_error
@exit_on_lost_process
def main(argv: list[str]) -> dict:
    for script, script_argv in json.loads(Path(argv[0]).read_text(encoding="utf-8")):
        # exit_on_data_error(exit_on_lost_process(main)): two wrappers down, functools.wraps keeps each in __wrapped__
        importlib.import_module(f"posformers.finetune.{script}").main.__wrapped__.__wrapped__(script_argv)
    return {}


if __name__ == "__main__":
    main(sys.argv[1:])
