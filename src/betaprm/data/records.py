"""The record format, and loading that reports every problem instead of losing data.

A *counts* record (training data) has ``id``, ``question``, ``steps``, ``mc_correct``
(K per step), ``mc_total`` (N per step, or one N for all), and optionally ``images``,
``answer``, ``source`` and ``soft``. A *pool* record (Best-of-N / scoring input) has
``id``, ``question``, ``candidates`` (a list of ``{"steps": [...]}``, scored ones with
``mu``, ``kappa`` and optionally ``sigma`` per step, judged ones with ``correct``, a
boolean that stands in for checking the answer) and optionally ``answer``, ``images``,
``source``. Counts are at most 2**24 (exact in float32). Other fields are kept as they are
and not read (converters write ``meta``: where a record's counts came from).

Every problem is reported with file, line, field and a fix. With ``on_error="fail"``
loading stops with all problems listed (exit status 2 from the CLI); with ``"skip"``
bad records are left out, written to a rejects file with their reasons and raw text,
and counted. Files are read once, as bytes: a line that is not UTF-8, not JSON, holds
NaN/Infinity, a number too long to read or nesting too deep is a problem of that line,
never an exception. Every JSONL reader (``read_records``, ``read_objects``, the
converters) goes through ``iter_jsonl``; whole JSON files through ``load_json_file``;
parquet files, saved ``datasets`` folders and hub names through ``sources.iter_rows``,
which yields rows the same way. A JSONL line may be at most ``MAX_LINE_BYTES`` (64 MiB)
long; a longer one is a problem of its line, read past without being held in memory.

Over 400 lines because the format and its validation belong together: every field
rule is written once, next to the message that names its fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BetaPRMInputError
from ..numeric import NumberRefused, number
from .jsonl import Problem, iter_jsonl
from .kinds import wrong_kind
from .sources import base_dir, iter_rows

KINDS = ("counts", "pool")
MAX_SHOWN = 20  # problems listed; the rest counted
MAX_COUNT = 2**24
"""Largest N (and so K) a record may hold: float32, the training dtype, keeps every
integer up to 2**24 exact; above it counts would be rounded (or overflow to inf)."""
SCORE_FIELDS = ("mu", "kappa", "sigma")


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
    """An answer or source given as a number: an int of any size (never turned into a
    float: ``math.isfinite`` raises on a 400-digit one) or a finite float, never a bool."""
    return _is_int(x) or (isinstance(x, float) and math.isfinite(x))


def _check_steps(obj, line, prefix, marker, problems):
    steps = obj.get("steps") if isinstance(obj, dict) else None
    if not isinstance(steps, list) or not steps:
        problems.append(
            Problem(
                line,
                prefix + "steps",
                f"must be a non-empty list of strings, got {short_repr(steps)}",
                "give the reasoning steps as a JSON list of strings",
            )
        )
        return None
    for i, s in enumerate(steps):
        if not isinstance(s, str):
            problems.append(
                Problem(
                    line,
                    f"{prefix}steps[{i}]",
                    f"must be a string, got {short_repr(s)}",
                    "write every step as a string",
                )
            )
        elif not s.strip():
            problems.append(
                Problem(
                    line,
                    f"{prefix}steps[{i}]",
                    "is empty",
                    "remove the empty step (and its counts) or fill in its text",
                )
            )
        elif marker in s:
            problems.append(
                Problem(
                    line,
                    f"{prefix}steps[{i}]",
                    f"contains the marker text {marker!r}",
                    f"remove {marker!r} from the step text, or train with another --marker",
                )
            )
    return steps


def short_repr(x, n=60) -> str:
    if isinstance(x, str):
        s = repr(x[: n + 1])
    else:
        try:
            s = json.dumps(x, ensure_ascii=False)
        except (RecursionError, ValueError, TypeError):  # deep nesting, or a value JSON cannot write
            s = f"<{type(x).__name__}>"
    return s if len(s) <= n else s[: n - 3] + "..."


def _check_images(obj, line, base_dir: Path | None, problems, must_exist: bool = True) -> list[str]:
    images = obj.get("images", obj.get("image"))
    if images is None:
        return []
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(p, str) and p for p in images):
        problems.append(
            Problem(
                line,
                "images",
                f"must be a list of file paths, got {short_repr(images)}",
                "give image paths as a JSON list of strings",
            )
        )
        return []
    if not must_exist:
        return list(images)
    resolved = []
    for i, p in enumerate(images):
        path = Path(p)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            problems.append(
                Problem(
                    line,
                    f"images[{i}]",
                    f"file not found: {path}",
                    "fix the path (relative paths are taken from the data file's folder) or add the image",
                )
            )
        resolved.append(str(path))
    return resolved


def _check_counts(obj, line, n_steps, problems):
    k = obj.get("mc_correct")
    n = obj.get("mc_total")
    soft = obj.get("soft", False)
    if not isinstance(soft, bool):
        problems.append(
            Problem(
                line,
                "soft",
                f"must be true or false, got {short_repr(soft)}",
                "set soft to true only for fractional (soft-label) counts",
            )
        )
        soft = False
    if not isinstance(k, list):
        problems.append(
            Problem(
                line,
                "mc_correct",
                f"must be a list with one count per step, got {short_repr(k)}",
                "give K (successful continuations) for every step",
            )
        )
        return None, None
    if _is_int(n):
        n = [n] * len(k)
    if not isinstance(n, list):
        problems.append(
            Problem(
                line,
                "mc_total",
                f"must be an integer or a list of integers, got {short_repr(n)}",
                "give N (continuations sampled) per step or once for all steps",
            )
        )
        return None, None
    if n_steps is not None and len(k) != n_steps:
        problems.append(
            Problem(
                line,
                "mc_correct",
                f"has {len(k)} counts for {n_steps} steps",
                "give exactly one count per step; never pad or drop counts",
            )
        )
    if len(n) != len(k):
        problems.append(
            Problem(
                line,
                "mc_total",
                f"has {len(n)} totals for {len(k)} counts",
                "give one N per step, or a single integer",
            )
        )
        return None, None
    ok = True
    for i, (kk, nn) in enumerate(zip(k, n)):
        try:  # numeric.number: the type, then the range, and no float made of a 400-digit integer
            number(nn, "N", integer=True, low=1, high=MAX_COUNT, what=f"an integer count from 1 to {MAX_COUNT:,}")
        except NumberRefused as e:
            if not _is_int(nn):
                fix = "write N as a whole number of continuations"
            elif nn < 1:
                fix = "N counts sampled continuations and must be at least 1"
            else:
                fix = (
                    "use N <= 16,777,216 (2**24): float32 training would round larger counts; scale K and N down "
                    'together (fractional K needs "soft": true)'
                )
            problems.append(Problem(line, f"mc_total[{i}]", str(e), fix))
            ok = False
            if not _is_int(nn):
                continue
        try:
            number(kk, "K", integer=not soft, what=None if soft else "an integer count")
        except NumberRefused as e:
            problems.append(
                Problem(
                    line,
                    f"mc_correct[{i}]",
                    str(e),
                    'write K as a whole number; for soft labels store K = p*N and set "soft": true (what `betaprm '
                    "convert --from trl --soft-n N` writes)",
                )
            )
            ok = False
            continue
        if kk < 0:
            problems.append(
                Problem(
                    line,
                    f"mc_correct[{i}]",
                    f"K = {kk} < 0",
                    "K counts successful continuations and cannot be negative",
                )
            )
            ok = False
        elif _is_int(nn) and kk > nn:
            problems.append(
                Problem(
                    line,
                    f"mc_correct[{i}]",
                    f"K = {kk} > N = {nn}",
                    "K (successes) cannot exceed N (continuations); check the column order",
                )
            )
            ok = False
    return (k, n) if ok else (None, None)


def _check_scores(cand: dict, line, prefix, steps, problems) -> None:
    """A scored candidate carries mu and kappa together, and sigma or not (it is then
    derived from them): one finite number per step each, mu in [0, 1], kappa > 0,
    sigma >= 0."""
    present = [k for k in SCORE_FIELDS if k in cand]
    if not present:
        return
    missing = [k for k in ("mu", "kappa") if k not in cand]
    if missing:
        problems.append(
            Problem(
                line,
                prefix + missing[0],
                f"is missing while {', '.join(present)} is given",
                "give mu and kappa (and sigma) together: rescore with betaprm score, or give none of them",
            )
        )
        return
    n_steps = len(steps) if isinstance(steps, list) else None
    if "steps_scored" in cand:
        # Written by `betaprm score --truncate steps`: the scores cover the first
        # steps_scored steps, those that fit the model's positions.
        k = cand["steps_scored"]
        if not _is_int(k) or n_steps is None or not 1 <= k <= n_steps:
            problems.append(
                Problem(
                    line,
                    prefix + "steps_scored",
                    f"must be an integer from 1 to the number of steps ({n_steps}), got {short_repr(k)}",
                    "rescore the pool with betaprm score",
                )
            )
            return
        n_steps = k
    allowed = {"mu": dict(low=0, high=1), "kappa": dict(low=0, low_open=True), "sigma": dict(low=0)}
    for key in present:
        vals = cand[key]
        if not isinstance(vals, list):
            problems.append(
                Problem(
                    line,
                    prefix + key,
                    f"must be a list with one number per step, got {short_repr(vals)}",
                    "rescore the pool with betaprm score",
                )
            )
            continue
        if n_steps is not None and len(vals) != n_steps:
            problems.append(
                Problem(
                    line,
                    prefix + key,
                    f"has {len(vals)} values for {n_steps} steps",
                    "give one score per step; rescore the pool with betaprm score",
                )
            )
            continue
        for i, x in enumerate(vals):
            try:
                number(x, "", **allowed[key])
            except NumberRefused as e:
                problems.append(Problem(line, f"{prefix}{key}[{i}]", e.reason, "rescore the pool with betaprm score"))
                break


def validate_object(
    obj,
    line: int,
    kind: str = "counts",
    marker: str = "<prm>",
    base_dir: Path | None = None,
    seen_ids: set | None = None,
    check_images: bool = True,
):
    """Check one parsed JSON object. Returns ``(record_or_None, problems)``."""
    problems: list[Problem] = []
    if not isinstance(obj, dict):
        return None, [
            Problem(
                line, "(record)", f"must be a JSON object, got {short_repr(obj)}", "write one JSON object per line"
            )
        ]
    rid = obj.get("id")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or rid == "":
        problems.append(
            Problem(line, "id", f"missing or not a string: {short_repr(rid)}", "give every record a unique string id")
        )
    elif seen_ids is not None:
        if str(rid) in seen_ids:
            problems.append(Problem(line, "id", f"duplicate id {str(rid)!r}", "make ids unique within the file"))
        seen_ids.add(str(rid))
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        problems.append(
            Problem(
                line,
                "question",
                f"missing or empty: {short_repr(question)}",
                "give the problem text as a non-empty string",
            )
        )
    elif marker in question:
        problems.append(
            Problem(line, "question", f"contains the marker text {marker!r}", f"remove {marker!r} from the question")
        )
    for opt in ("answer", "source"):
        if obj.get(opt) is not None and not (isinstance(obj[opt], str) or _is_number(obj[opt])):
            problems.append(
                Problem(line, opt, f"must be a string, got {short_repr(obj[opt])}", f"write {opt} as a string")
            )
    images = _check_images(obj, line, base_dir, problems, must_exist=check_images)
    if kind == "counts":
        steps = _check_steps(obj, line, "", marker, problems)
        k, n = _check_counts(obj, line, len(steps) if isinstance(steps, list) else None, problems)
        if problems:
            return None, problems
        answer = obj.get("answer")
        return Record(
            str(rid),
            question,
            list(steps),
            list(k),
            list(n),
            images,
            None if answer is None else str(answer),
            obj.get("source"),
            bool(obj.get("soft", False)),
            line,
        ), []
    if kind == "pool":
        cands = obj.get("candidates")
        if not isinstance(cands, list) or not cands:
            problems.append(
                Problem(
                    line,
                    "candidates",
                    f"must be a non-empty list of {{'steps': [...]}} objects, got {short_repr(cands)}",
                    "list the candidate solutions, each with its steps",
                )
            )
        else:
            for j, c in enumerate(cands):
                if not isinstance(c, dict):
                    problems.append(
                        Problem(
                            line,
                            f"candidates[{j}]",
                            f"must be an object with 'steps', got {short_repr(c)}",
                            'write each candidate as {"steps": [...]}',
                        )
                    )
                else:
                    steps = _check_steps(c, line, f"candidates[{j}].", marker, problems)
                    _check_scores(c, line, f"candidates[{j}].", steps, problems)
                    if "correct" in c and not isinstance(c["correct"], bool):
                        problems.append(
                            Problem(
                                line,
                                f"candidates[{j}].correct",
                                f"must be true or false, got {short_repr(c['correct'])}",
                                "give the candidate's judged correctness as a boolean, or leave it out to have the "
                                "answer checked against the record's reference answer",
                            )
                        )
        if problems:
            return None, problems
        return obj, []
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def read_objects(
    path, required: tuple[str, ...] = (), what: str = "one JSON object", flag: str | None = None, rows=None
) -> Iterator[tuple[str, dict]]:
    """(``path:line``, object) for each non-blank line of an input that is not a training
    record (problems, traces, benchmark items): stops at the first bad line with the line,
    the field and ``what`` a line needs; ``required`` fields must be non-empty. ``flag``
    (e.g. ``--problems``) is named when the file is missing. ``rows``: the source's rows
    (``data.sources``) when the caller opened it already; a JSONL file otherwise."""
    for i, obj, problem, _ in iter_jsonl(path, flag) if rows is None else rows:
        where = f"{path}:{i}"
        if problem is not None:
            raise BetaPRMInputError(f"{where}: {problem.message}; fix: {problem.fix}; each line must be {what}")
        if not isinstance(obj, dict):
            raise BetaPRMInputError(f"{where}: got {short_repr(obj)}; each line must be a JSON object with {what}")
        for k in required:
            if obj.get(k) in (None, ""):
                raise BetaPRMInputError(f"{where}: field {k!r} is missing or empty; each line needs {what}")
        yield where, obj


def problem_fields(obj: dict, where: str, marker: str | None = None) -> tuple[str, str, str]:
    """``(id, question, answer)`` of a problem or trace line (``read_objects`` output) as
    strings: id a string or integer, question a non-empty string (without ``marker``),
    answer a string or number. Raises naming the line and field otherwise."""
    rid, question, answer = obj.get("id"), obj.get("question"), obj.get("answer")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise BetaPRMInputError(
            f"{where}: field 'id' must be a string, got {short_repr(rid)}; fix: give every line a unique string id"
        )
    if not isinstance(question, str) or not question.strip():
        raise BetaPRMInputError(
            f"{where}: field 'question' must be a non-empty string, got {short_repr(question)}; fix: write the "
            "problem text as a string"
        )
    if marker and marker in question:
        raise BetaPRMInputError(
            f"{where}: field 'question' contains the marker text {marker!r}; fix: remove it from the question"
        )
    if isinstance(answer, bool) or not (isinstance(answer, str) or _is_number(answer)) or answer == "":
        raise BetaPRMInputError(
            f"{where}: field 'answer' must be a string or a number, got {short_repr(answer)}; fix: write the "
            "reference answer as a string"
        )
    return str(rid), question, str(answer)


def _fail_message(source: str, rejected: list[tuple[int, list[Problem]]]) -> str:
    probs = [p for _, ps in rejected for p in ps]
    shown = "\n  ".join(p.render(source) for p in probs[:MAX_SHOWN])
    more = f"\n  ... and {len(probs) - MAX_SHOWN} more" if len(probs) > MAX_SHOWN else ""
    return (
        f"{source}: {len(rejected)} bad records ({len(probs)} problems):\n  {shown}{more}\n"
        "Fix them, or pass --on-error skip to leave them out (they are written to a rejects file)."
    )


def write_rejects(path, source: str, rejected: list[tuple[int, list[Problem], Any, str | None]]) -> None:
    """One JSON line per rejected input line: its reasons, the parsed ``record`` (the raw
    text when it did not parse) and the ``raw`` line as read."""
    with open(path, "w", encoding="utf-8") as f:
        for line, problems, obj, raw in rejected:
            entry = {
                "source": source,
                "line": line,
                "reasons": [p.render(source) for p in problems],
                "record": obj if obj is not None else raw,
            }
            if raw is not None:
                entry["raw"] = raw
            f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")


def _process(
    items: Iterable[tuple[int, Any, Problem | None, str | None]],
    source: str,
    kind: str,
    marker: str,
    base_dir,
    on_error: str,
    rejects: str | Path | None,
) -> LoadResult:
    if on_error not in ("fail", "skip"):
        raise BetaPRMInputError(f"--on-error must be 'fail' or 'skip', got {on_error!r}")
    seen: set = set()
    records, rejected, rejected_rows = [], [], []
    for line, obj, parse_problem, raw in items:
        if parse_problem is not None:
            rec, problems = None, [parse_problem]
        else:
            rec, problems = validate_object(obj, line, kind, marker, base_dir, seen)
            if problems and not records and (other := wrong_kind(obj, kind, source)):
                # A file of another kind: every row would fail alike, and skipping leaves none.
                raise BetaPRMInputError(other)
        if problems:
            rejected.append((line, problems))
            rejected_rows.append((line, problems, obj, raw))
        else:
            records.append(rec)
    if rejected and on_error == "fail":
        raise BetaPRMInputError(_fail_message(source, rejected))
    if rejects is not None and rejected:
        write_rejects(rejects, source, rejected_rows)
    return LoadResult(records, rejected, source)


def read_records(
    path,
    kind: str = "counts",
    marker: str = "<prm>",
    on_error: str = "fail",
    rejects: str | Path | None = None,
    flag: str | None = None,
) -> LoadResult:
    """Load and validate records (see the module docstring), in one pass, from any source
    ``data.sources`` opens (JSONL, .json, parquet, a save_to_disk folder, a hub name).
    ``flag`` (e.g. ``--data``) is named when the source is missing."""
    return _process(iter_rows(path, flag), str(path), kind, marker, base_dir(path), on_error, rejects)


def records_from_rows(
    rows: Iterable[dict],
    source: str = "table",
    kind: str = "counts",
    marker: str = "<prm>",
    base_dir=None,
    on_error: str = "fail",
    rejects=None,
) -> LoadResult:
    """Validate rows of a ``datasets`` table (or any iterable of dicts); "line" is the
    1-based row number."""
    return _process(
        ((i, dict(r), None, None) for i, r in enumerate(rows, 1)), source, kind, marker, base_dir, on_error, rejects
    )


def check_kind(path, kind: str, flag: str | None = None) -> None:
    """Stop at once, in one line, when ``path``'s first record is of another known kind than
    ``kind`` (``kinds.wrong_kind``): before a model loads for a file that no row of would pass."""
    for _, obj, problem, _ in iter_rows(path, flag):
        if problem is None and (other := wrong_kind(obj, kind, path)):
            raise BetaPRMInputError(other)
        return


def validate_file(path, kind: str = "counts", marker: str = "<prm>") -> tuple[LoadResult, str]:
    """Run every check; returns the result and a printable report."""
    res = read_records(path, kind=kind, marker=marker, on_error="skip")
    lines = [f"{path}: {len(res.records)} good records, {res.n_rejected} bad"]
    problems = [p for _, ps in res.rejected for p in ps]
    lines.extend("  " + p.render(str(path)) for p in problems[:MAX_SHOWN])
    if len(problems) > MAX_SHOWN:
        lines.append(f"  ... and {len(problems) - MAX_SHOWN} more problems")
    if kind == "counts" and res.records:
        n_steps = sum(len(r.steps) for r in res.records)
        lines.append(
            f"  {n_steps} steps; N per step from {min(min(r.mc_total) for r in res.records)} to "
            f"{max(max(r.mc_total) for r in res.records)}"
        )
    return res, "\n".join(lines)
