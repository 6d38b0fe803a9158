"""The record format, and loading that reports every problem instead of losing data.

A *counts* record (training data) has ``id``, ``question``, ``steps``, ``mc_correct``
(K per step), ``mc_total`` (N per step, or one N for all), and optionally ``images``,
``answer``, ``source`` and ``soft``. A *pool* record (Best-of-N / scoring input) has
``id``, ``question``, ``candidates`` (a list of ``{"steps": [...]}``) and optionally
``answer``, ``images``, ``source``.

Every problem is reported with file, line, field and a fix. With ``on_error="fail"``
loading stops with all problems listed (exit status 2 from the CLI); with ``"skip"``
bad records are left out, written to a rejects file with their reasons, and counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BetaPRMInputError

KINDS = ("counts", "pool")
MAX_SHOWN = 30


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one record."""

    line: int
    field: str
    message: str
    fix: str

    def render(self, source: str) -> str:
        return f"{source}:{self.line}: field '{self.field}': {self.message}; fix: {self.fix}"


@dataclass
class Record:
    """A validated counts record. ``mc_correct`` may be fractional only when ``soft``."""

    id: str
    question: str
    steps: list[str]
    mc_correct: list[float]
    mc_total: list[int]
    images: list[str] = field(default_factory=list)
    answer: str | None = None
    source: str | None = None
    soft: bool = False
    line: int = 0


@dataclass
class LoadResult:
    """What loading gave: the good records, and the rejected lines with their problems."""

    records: list[Any]
    rejected: list[tuple[int, list[Problem]]]
    source: str

    @property
    def n_rejected(self) -> int:
        return len(self.rejected)

    def summary(self) -> str:
        return f"{self.source}: {len(self.records)} records loaded, {self.n_rejected} rejected"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def _check_steps(obj, line, prefix, marker, problems):
    steps = obj.get("steps") if isinstance(obj, dict) else None
    if not isinstance(steps, list) or not steps:
        problems.append(Problem(line, prefix + "steps", f"must be a non-empty list of strings, got {_short(steps)}", "give the reasoning steps as a JSON list of strings"))
        return None
    for i, s in enumerate(steps):
        if not isinstance(s, str):
            problems.append(Problem(line, f"{prefix}steps[{i}]", f"must be a string, got {_short(s)}", "write every step as a string"))
        elif not s.strip():
            problems.append(Problem(line, f"{prefix}steps[{i}]", "is empty", "remove the empty step (and its counts) or fill in its text"))
        elif marker in s:
            problems.append(Problem(line, f"{prefix}steps[{i}]", f"contains the marker text {marker!r}", f"remove {marker!r} from the step text, or train with another --marker"))
    return steps


def _short(x, n=60) -> str:
    s = json.dumps(x, ensure_ascii=False) if not isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[: n - 3] + "..."


def _check_images(obj, line, base_dir: Path | None, problems) -> list[str]:
    images = obj.get("images", obj.get("image"))
    if images is None:
        return []
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        problems.append(Problem(line, "images", f"must be a list of file paths, got {_short(images)}", "give image paths as a JSON list of strings"))
        return []
    resolved = []
    for i, p in enumerate(images):
        path = Path(p)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            problems.append(Problem(line, f"images[{i}]", f"file not found: {path}", "fix the path (relative paths are taken from the data file's folder) or add the image"))
        resolved.append(str(path))
    return resolved


def _check_counts(obj, line, n_steps, problems):
    k = obj.get("mc_correct")
    n = obj.get("mc_total")
    soft = obj.get("soft", False)
    if not isinstance(soft, bool):
        problems.append(Problem(line, "soft", f"must be true or false, got {_short(soft)}", "set soft to true only for fractional (soft-label) counts"))
        soft = False
    if not isinstance(k, list):
        problems.append(Problem(line, "mc_correct", f"must be a list with one count per step, got {_short(k)}", "give K (successful continuations) for every step"))
        return None, None
    if _is_int(n):
        n = [n] * len(k)
    if not isinstance(n, list):
        problems.append(Problem(line, "mc_total", f"must be an integer or a list of integers, got {_short(n)}", "give N (continuations sampled) per step or once for all steps"))
        return None, None
    if n_steps is not None and len(k) != n_steps:
        problems.append(Problem(line, "mc_correct", f"has {len(k)} counts for {n_steps} steps", "give exactly one count per step; never pad or drop counts"))
    if len(n) != len(k):
        problems.append(Problem(line, "mc_total", f"has {len(n)} totals for {len(k)} counts", "give one N per step, or a single integer"))
        return None, None
    ok = True
    for i, (kk, nn) in enumerate(zip(k, n)):
        if not _is_int(nn):
            problems.append(Problem(line, f"mc_total[{i}]", f"N must be an integer count, got {_short(nn)}", "write N as a whole number of continuations"))
            ok = False
            continue
        if nn < 1:
            problems.append(Problem(line, f"mc_total[{i}]", f"N = {nn} < 1", "N counts sampled continuations and must be at least 1"))
            ok = False
        if not _is_number(kk) or (not soft and not _is_int(kk)):
            problems.append(
                Problem(line, f"mc_correct[{i}]", f"K must be an integer count, got {_short(kk)}",
                        'write K as a whole number; for soft labels store K = p*N and set "soft": true (what `betaprm convert --from trl --soft-n N` writes)')
            )
            ok = False
            continue
        if kk < 0:
            problems.append(Problem(line, f"mc_correct[{i}]", f"K = {kk} < 0", "K counts successful continuations and cannot be negative"))
            ok = False
        elif _is_int(nn) and kk > nn:
            problems.append(Problem(line, f"mc_correct[{i}]", f"K = {kk} > N = {nn}", "K (successes) cannot exceed N (continuations); check the column order"))
            ok = False
    return (k, n) if ok else (None, None)


def validate_object(obj, line: int, kind: str = "counts", marker: str = "<prm>", base_dir: Path | None = None, seen_ids: set | None = None, check_images: bool = True):
    """Check one parsed JSON object. Returns ``(record_or_None, problems)``."""
    problems: list[Problem] = []
    if not isinstance(obj, dict):
        return None, [Problem(line, "(record)", f"must be a JSON object, got {_short(obj)}", "write one JSON object per line")]
    rid = obj.get("id")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or rid == "":
        problems.append(Problem(line, "id", f"missing or not a string: {_short(rid)}", "give every record a unique string id"))
    elif seen_ids is not None:
        if str(rid) in seen_ids:
            problems.append(Problem(line, "id", f"duplicate id {str(rid)!r}", "make ids unique within the file"))
        seen_ids.add(str(rid))
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        problems.append(Problem(line, "question", f"missing or empty: {_short(question)}", "give the problem text as a non-empty string"))
    elif marker in question:
        problems.append(Problem(line, "question", f"contains the marker text {marker!r}", f"remove {marker!r} from the question"))
    for opt in ("answer", "source"):
        if obj.get(opt) is not None and not isinstance(obj[opt], (str, int, float)):
            problems.append(Problem(line, opt, f"must be a string, got {_short(obj[opt])}", f"write {opt} as a string"))
    images = _check_images(obj, line, base_dir, problems) if check_images else list(obj.get("images") or [])
    if kind == "counts":
        steps = _check_steps(obj, line, "", marker, problems)
        k, n = _check_counts(obj, line, len(steps) if isinstance(steps, list) else None, problems)
        if problems:
            return None, problems
        answer = obj.get("answer")
        return Record(str(rid), question, list(steps), list(k), list(n), images, None if answer is None else str(answer), obj.get("source"), bool(obj.get("soft", False)), line), []
    if kind == "pool":
        cands = obj.get("candidates")
        if not isinstance(cands, list) or not cands:
            problems.append(Problem(line, "candidates", f"must be a non-empty list of {{'steps': [...]}} objects, got {_short(cands)}", "list the candidate solutions, each with its steps"))
        else:
            for j, c in enumerate(cands):
                if not isinstance(c, dict):
                    problems.append(Problem(line, f"candidates[{j}]", f"must be an object with 'steps', got {_short(c)}", 'write each candidate as {"steps": [...]}'))
                else:
                    _check_steps(c, line, f"candidates[{j}].", marker, problems)
        if problems:
            return None, problems
        return obj, []
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any, Problem | None]]:
    """(line number, parsed object or None, problem or None) for each non-blank line."""
    with open(path, encoding="utf-8") as f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield i, json.loads(raw), None
            except json.JSONDecodeError as e:
                yield i, None, Problem(i, "(line)", f"not valid JSON ({e.msg} at column {e.colno})", "fix the JSON syntax on this line")


def read_objects(path, required: tuple[str, ...] = (), what: str = "one JSON object") -> Iterator[tuple[str, dict]]:
    """(``path:line``, object) for each non-blank line of a JSONL input that is not a
    training record (problems, traces, benchmark items): stops at the first bad line with
    the line, the field and ``what`` a line needs; ``required`` fields must be non-empty."""
    for i, obj, problem in iter_jsonl(Path(path)):
        where = f"{path}:{i}"
        if problem is not None:
            raise BetaPRMInputError(f"{where}: {problem.message}; each line must be {what}")
        if not isinstance(obj, dict):
            raise BetaPRMInputError(f"{where}: each line must be a JSON object with {what}")
        for k in required:
            if obj.get(k) in (None, ""):
                raise BetaPRMInputError(f"{where}: field {k!r} is missing or empty; each line needs {what}")
        yield where, obj


def _fail_message(source: str, rejected: list[tuple[int, list[Problem]]]) -> str:
    probs = [p for _, ps in rejected for p in ps]
    shown = "\n  ".join(p.render(source) for p in probs[:MAX_SHOWN])
    more = f"\n  ... and {len(probs) - MAX_SHOWN} more" if len(probs) > MAX_SHOWN else ""
    return (
        f"{source}: {len(rejected)} bad records ({len(probs)} problems):\n  {shown}{more}\n"
        "Fix them, or pass --on-error skip to leave them out (they are written to a rejects file)."
    )


def _process(items: Iterable[tuple[int, Any, Problem | None]], source: str, kind: str, marker: str, base_dir, on_error: str, rejects: str | Path | None, raw_lookup=None) -> LoadResult:
    if on_error not in ("fail", "skip"):
        raise BetaPRMInputError(f"--on-error must be 'fail' or 'skip', got {on_error!r}")
    seen: set = set()
    records, rejected, rejected_objs = [], [], []
    for line, obj, parse_problem in items:
        if parse_problem is not None:
            rec, problems = None, [parse_problem]
        else:
            rec, problems = validate_object(obj, line, kind, marker, base_dir, seen)
        if problems:
            rejected.append((line, problems))
            rejected_objs.append(obj if parse_problem is None else (raw_lookup(line) if raw_lookup else None))
        else:
            records.append(rec)
    if rejected and on_error == "fail":
        raise BetaPRMInputError(_fail_message(source, rejected))
    if rejects is not None and rejected:
        with open(rejects, "w", encoding="utf-8") as f:
            for (line, problems), obj in zip(rejected, rejected_objs):
                f.write(json.dumps({"source": source, "line": line, "reasons": [p.render(source) for p in problems], "record": obj}, ensure_ascii=False) + "\n")
    return LoadResult(records, rejected, source)


def read_records(path, kind: str = "counts", marker: str = "<prm>", on_error: str = "fail", rejects: str | Path | None = None) -> LoadResult:
    """Load and validate a JSONL file of records (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise BetaPRMInputError(f"{path}: no such file")

    def raw_line(n):
        with open(p, encoding="utf-8") as f:
            for i, raw in enumerate(f, 1):
                if i == n:
                    return raw.rstrip("\n")
        return None

    return _process(iter_jsonl(p), str(path), kind, marker, p.parent, on_error, rejects, raw_line)


def records_from_rows(rows: Iterable[dict], source: str = "table", kind: str = "counts", marker: str = "<prm>", base_dir=None, on_error: str = "fail", rejects=None) -> LoadResult:
    """Validate rows of a ``datasets`` table (or any iterable of dicts); "line" is the
    1-based row number."""
    return _process(((i, dict(r), None) for i, r in enumerate(rows, 1)), source, kind, marker, base_dir, on_error, rejects)


def validate_file(path, kind: str = "counts", marker: str = "<prm>") -> tuple[LoadResult, str]:
    """Run every check; returns the result and a printable report."""
    res = read_records(path, kind=kind, marker=marker, on_error="skip")
    lines = [f"{path}: {len(res.records)} good records, {res.n_rejected} bad"]
    for _, problems in res.rejected:
        lines.extend("  " + p.render(str(path)) for p in problems)
    if kind == "counts" and res.records:
        n_steps = sum(len(r.steps) for r in res.records)
        lines.append(f"  {n_steps} steps; N per step from {min(min(r.mc_total) for r in res.records)} to {max(max(r.mc_total) for r in res.records)}")
    return res, "\n".join(lines)
