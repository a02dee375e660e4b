"""How the fine-tuning scripts report a problem with what the user gave them.

Every problem with the user's input is a `ScriptError`: `OutputDirError`, `ArgumentError`, and `DataError` from
loaders: `DataError(message, path=..., row=..., column=...)`; `str(error)` reads
"train.tsv, line 12, column 'label': message". Where a bad example may be skipped (`--skip_bad_examples`), loaders
hand each error to `BadExamples.add`, which raises it unless skipping is on, and `BadExamples.summary()` says how
many were skipped. Scripts wrap `main` with `exit_on_data_error`, so a user sees one clean line and exit status 1
before any training starts; the wrapper also returns main's metrics to in-process callers (`main([...])`) and None
to the command line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


class ScriptError(Exception):
    """A problem with what the user gave the script; `exit_on_data_error` turns it into one line and exit status 1."""


class DataError(ScriptError):
    """Bad input data, reported with where it is: file, row (line number in a text file, index otherwise), column."""

    def __init__(self, message: str, *, path=None, row: int | None = None, column: str | None = None):
        self.message, self.path, self.row, self.column = message, path, row, column
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.row is not None:
            where.append(f"line {self.row}" if self.path is not None else f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        return f"{', '.join(where)}: {self.message}" if where else self.message


class OutputDirError(ScriptError):
    """The output folder cannot be used as asked (it holds a previous run, or the checkpoint to resume is missing)."""


class ArgumentError(ScriptError):
    """Arguments that cannot work together (no model or config given, a config.json without model_type, ...)."""


def exit_on_data_error(main: Callable) -> Callable:
    """Wrap a script's `main(argv=None)` so that a ScriptError (DataError, OutputDirError, ArgumentError) ends it with
    one line on stderr and exit status 1, and what main returns (its metrics) reaches in-process callers that pass
    argv, while the command line (argv None) gets None, i.e. exit status 0."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None):
        try:
            result = main(argv)
        except ScriptError as error:
            kind = {DataError: "data", OutputDirError: "output_dir", ArgumentError: "arguments"}.get(type(error), "")
            raise SystemExit(f"error ({kind}): {error}" if kind else f"error: {error}") from error
        # A console script runs `sys.exit(main())`, which reports any returned object but None as a failure: the
        # metrics go back only to callers that passed argv in-process.
        return None if argv is None else result

    return wrapper


class BadExamples:
    """Collects bad examples of one split: raises the first one, or counts them when skipping is on.

    bad = BadExamples(skip=data_args.skip_bad_examples, split="train")
    for ...:
        try: ...
        except DataError as error: bad.add(error); continue
    logger.warning(bad.summary())   # "train: skipped 3 bad examples; first: train.tsv, line 7: ..."
    """

    def __init__(self, skip: bool, split: str):
        self.skip, self.split = skip, split
        self.errors: list[DataError] = []

    def add(self, error: DataError) -> None:
        if not self.skip:
            raise error
        self.errors.append(error)

    def __len__(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        if not self.errors:
            return f"{self.split}: no bad examples"
        return f"{self.split}: skipped {len(self.errors)} bad example(s); first: {self.errors[0]}"
