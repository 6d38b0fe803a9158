"""Reading JSONL inputs of the commands, with file:line errors."""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..errors import BetaPRMInputError


def read_objects(path: str, required: tuple[str, ...], what: str) -> Iterator[tuple[str, dict]]:
    """(``path:line``, object) for each non-blank line; every ``required`` field present
    and non-empty, else an error naming the line, the field and ``what`` a line needs."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{i}"
            try:
                r = json.loads(line)
            except ValueError as e:
                raise BetaPRMInputError(f"{where}: not valid JSON ({e.msg}); each line must be one object") from None
            if not isinstance(r, dict):
                raise BetaPRMInputError(f"{where}: each line must be a JSON object with {what}")
            for k in required:
                if r.get(k) in (None, ""):
                    raise BetaPRMInputError(f"{where}: field {k!r} is missing or empty; each line needs {what}")
            yield where, r
