"""Strict reading of JSON and JSONL input files, as bytes, in one pass.

A line that is not UTF-8, not JSON, holds NaN/Infinity, a number too long to read or
nesting too deep is a ``Problem`` of that line (file, line, field, fix), never an
exception; a JSONL line may be at most ``MAX_LINE_BYTES`` (64 MiB) long, and a longer one
is read past without being held in memory. Every JSONL reader goes through
``iter_jsonl``, whole JSON files through ``load_json_file``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BetaPRMInputError
from ..numeric import NumberRefused, json_float

MAX_LINE_BYTES = 64 << 20
"""Longest JSONL line read (64 MiB): reading a longer one would take several times its
size in memory (a 200 MB line, about 1 GB); it is a problem of that line instead."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one record."""

    line: int
    field: str
    message: str
    fix: str

    def render(self, source: str) -> str:
        return f"{source}:{self.line}: field '{self.field}': {self.message}; fix: {self.fix}"


class BadJSON(ValueError):
    """Text that is not acceptable JSON input; ``lineno`` is 1-based within the text
    (None where the parser does not say)."""

    def __init__(self, reason: str, lineno: int | None = None):
        super().__init__(reason)
        self.reason, self.lineno = reason, lineno


class _Refused(ValueError):
    pass


def _refuse_constant(name: str):
    raise _Refused(f"{name} is not a number JSON allows")


def loads_strict(text: str) -> Any:
    """``json.loads`` for input files. Refuses ``NaN`` / ``Infinity`` (Python's json
    accepts them) and a number beyond float range (``1e400``, which it reads as infinity),
    and turns an integer too long for Python (over 4300 digits) and nesting too deep to
    parse into ``BadJSON`` too, like a syntax error. (How large an integer may be is each
    field's rule: ``numeric.number``.)"""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=json_float)
    except json.JSONDecodeError as e:
        msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg  # "Invalid control character at"
        at = f"column {e.colno}" if e.lineno == 1 else f"line {e.lineno} column {e.colno}"
        raise BadJSON(f"not valid JSON ({msg} at {at})", e.lineno) from None
    except _Refused as e:
        raise BadJSON(f"not valid JSON ({e})") from None
    except NumberRefused as e:
        raise BadJSON(f"holds the number {e.got}, beyond float range (about 1.8e308): no field can use it") from None
    except ValueError:  # the only other ValueError json raises: int() on a too long literal
        raise BadJSON("holds an integer with more than 4300 digits, which no field can use") from None
    except RecursionError:
        raise BadJSON("nests lists or objects too deeply to read") from None


def decode_utf8(data: bytes) -> str:
    """Strict UTF-8; ``BadJSON`` with the line of the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise BadJSON(f"not valid UTF-8 (byte 0x{data[e.start]:02x} at byte {col} of the line)", line) from None


UTF8_FIX = "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"


def _name(path, flag: str | None) -> str:
    return f"{flag} {path}" if flag else str(path)


def open_input(path, flag: str | None = None):
    """An input file opened for reading bytes; a missing or unreadable file raises
    ``BetaPRMInputError`` naming ``flag`` (e.g. ``--data``)."""
    p = Path(path)
    if not p.is_file():
        raise BetaPRMInputError(
            f"{_name(path, flag)}: no such file" + (" (it is a folder)" if p.is_dir() else "") + "; check the path"
        )
    try:
        return open(p, "rb")
    except OSError as e:
        raise BetaPRMInputError(
            f"{_name(path, flag)}: cannot be read ({e.strerror}); check the file's permissions"
        ) from None


def load_json_file(path, flag: str | None = None, what: str = "JSON") -> Any:
    """A whole JSON file (a config, a .json list of records), parsed strictly; any damage
    raises ``BetaPRMInputError`` with the file and line."""
    with open_input(path, flag) as f:
        data = f.read()
    try:
        return loads_strict(decode_utf8(data).lstrip("\ufeff"))
    except BadJSON as e:
        fix = UTF8_FIX if "UTF-8" in e.reason else f"fix the file (it must be {what})"
        line = f":{e.lineno}" if e.lineno else ""
        raise BetaPRMInputError(f"{_name(path, flag)}{line}: {e.reason}; fix: {fix}") from None


def _lines(f) -> Iterator[bytes | int]:
    """The file's lines; one longer than ``MAX_LINE_BYTES`` comes as its length (an int),
    read past in blocks, never held whole."""
    while True:
        data = f.readline(MAX_LINE_BYTES + 1)
        if not data:
            return
        if len(data) <= MAX_LINE_BYTES or data.endswith(b"\n"):
            yield data
            continue
        n = len(data)
        while not data.endswith(b"\n"):
            data = f.readline(1 << 20)
            if not data:
                break
            n += len(data)
        yield n


def iter_jsonl(path, flag: str | None = None) -> Iterator[tuple[int, Any, Problem | None, str]]:
    """``(line number, parsed object or None, problem or None, raw text)`` for each
    non-blank line, in one pass over the file. A line that is not UTF-8 or not JSON, or
    longer than ``MAX_LINE_BYTES``, gives a problem and its raw text (undecodable bytes
    replaced by U+FFFD; a long line's first bytes), never an exception."""
    with open_input(path, flag) as f:
        for i, data in enumerate(_lines(f), 1):
            if isinstance(data, int):
                reason = f"is {data:,} bytes long, over the {MAX_LINE_BYTES:,} a record may take"
                fix = "split the record, or check that the file is JSONL (one record per line)"
                yield i, None, Problem(i, "(line)", reason, fix), f"<{data} bytes, not kept>"
                continue
            if i == 1 and data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]  # a UTF-8 byte order mark, as some editors write
            if not data.strip():
                continue
            data = data.rstrip(b"\r\n")
            try:
                text = decode_utf8(data)
            except BadJSON as e:
                yield i, None, Problem(i, "(line)", e.reason, UTF8_FIX), data.decode("utf-8", errors="replace")
                continue
            try:
                yield i, loads_strict(text), None, text
            except BadJSON as e:
                yield (
                    i,
                    None,
                    Problem(i, "(line)", e.reason, "fix the JSON on this line (one JSON object per line)"),
                    text,
                )
