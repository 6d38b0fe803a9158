"""Errors that mean "the input is wrong", as opposed to a bug.

The CLI turns a ``BetaPRMInputError`` into one message and exit status 2 (no traceback
unless ``--debug``). Messages name what was seen, what is allowed, and the fix.
"""


class BetaPRMInputError(ValueError):
    """Bad user input: a file, a record, a config value or a model/tokenizer pairing."""


class TrainingDivergedError(RuntimeError):
    """Training produced a non-finite loss or gradient; it stopped before the optimiser
    step that would have written NaN into the weights. The CLI exits with status 1."""


def redact_url(url: str) -> str:
    """``url`` fit for a message or a log line: userinfo (``user:password@``) becomes
    ``***@``. Every URL that enters a message goes through here, since a base URL may
    carry a password. The cut is at the last ``@`` before any ``?`` or ``#``, so a
    password holding ``@`` or ``/`` is hidden whole."""
    head, sep, rest = str(url).partition("://")
    if not sep:
        head, rest = "", head  # no scheme: "user:pass@host" is still hidden
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, cut)
    if at < 0:
        return url
    return f"{head}{sep}***{rest[at:]}"
