"""Errors that mean "the input is wrong", as opposed to a bug.

The CLI turns a ``BetaPRMInputError`` into one message and exit status 2 (no traceback
unless ``--debug``). Messages name what was seen, what is allowed, and the fix.
"""


class BetaPRMInputError(ValueError):
    """Bad user input: a file, a record, a config value or a model/tokenizer pairing."""


class TrainingDivergedError(RuntimeError):
    """Training produced a non-finite loss or gradient; it stopped before the optimiser
    step that would have written NaN into the weights. The CLI exits with status 1."""
