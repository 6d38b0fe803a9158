"""Monte Carlo labelling: counts K_t of N_t for every step of a trace (docs/design.md section 5).

For each step t of a trace, ``n`` continuations are sampled from the prefix that ends at
step t, through any ``Generator``; each continuation's final answer is checked against
the reference. ``K_t`` counts the correct ones and ``N_t`` the checked ones: an answer
check that *fails* (math-verify raised or timed out) is recorded in ``mc_failed`` and
left out of ``N_t``, never counted as wrong. A continuation that states no answer is
wrong. The last step is the complete trace: its own answer decides (K_T = N or 0), as
the synthetic world's labeller does.

Records are appended per trace, so a killed run resumes where it stopped (ids already in
the output are skipped; each request's seed derives from the seed, the id and the step).
A trace whose steps all failed their checks cannot be a training record; it goes to the
``failed`` file with the reason.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from .data.records import problem_fields, read_objects
from .errors import BetaPRMInputError
from .generation.base import GenerationRequest
from .progress import progress_bar
from .provenance import (
    completed_ids,
    json_line,  # strict JSON: a NaN raises before its record is written
)


@dataclass
class LabelItem:
    id: str
    question: str
    steps: list[str]
    answer: Any = None
    handle: Any = None
    source: str | None = None


def read_traces(path: str, marker: str = "<prm>") -> list:
    """Traces to label, with file:line errors. Steps and questions may not hold ``marker``
    (the records written would not train); non-string fields are refused, never
    converted."""
    items, seen = [], set()
    for where, r in read_objects(
        path, ("id", "question", "answer"), "id, question, answer and steps or candidates", flag="--input"
    ):
        rid, question, answer = problem_fields(r, where, marker)
        source = r.get("source")
        if source is not None and not isinstance(source, str):
            raise BetaPRMInputError(
                f"{where}: field 'source' must be a string, got {type(source).__name__}; fix: write the subset name "
                "as a string"
            )
        if "steps" in r:
            traces = [(rid, "steps", r["steps"])]
        elif isinstance(r.get("candidates"), list) and r["candidates"]:
            traces = []
            for j, c in enumerate(r["candidates"]):
                if not isinstance(c, dict):
                    raise BetaPRMInputError(
                        f"{where}: field 'candidates[{j}]' must be an object {{\"steps\": [...]}}, got "
                        f"{type(c).__name__}"
                    )
                traces.append((f"{rid}/{j}", f"candidates[{j}].steps", c.get("steps")))
        else:
            raise BetaPRMInputError(
                f"{where}: neither 'steps' nor a non-empty 'candidates' list is present; fix: give the trace's steps "
                "or candidates with steps"
            )
        for tid, field_name, steps in traces:
            if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s.strip() for s in steps):
                raise BetaPRMInputError(
                    f"{where}: field '{field_name}' (trace {tid!r}) must be a non-empty list of non-empty strings"
                )
            if any(marker in s for s in steps):
                k = next(k for k, s in enumerate(steps) if marker in s)
                raise BetaPRMInputError(
                    f"{where}: field '{field_name}[{k}]' contains the marker text {marker!r}; fix: remove it "
                    "(records holding it cannot be trained on)"
                )
            if tid in seen:
                raise BetaPRMInputError(f"{where}: id {tid!r} appears twice; ids must be unique")
            seen.add(tid)
            items.append(LabelItem(tid, question, list(steps), answer, source=source))
    return items


def _seed(seed: int, item_id: str, t: int) -> int:
    return zlib.crc32(f"{seed}/{item_id}/{t}".encode()) & 0x7FFFFFFF


def label_traces(
    items: Sequence[LabelItem],
    generator,
    n: int,
    answer_of: Callable[[list[str]], Hashable | None],
    check_many: Callable[[list[tuple[LabelItem, Hashable | None]]], list[bool | None]],
    out,
    failed_out=None,
    seed: int = 0,
    chunk: int = 8,
    progress: bool = True,
) -> dict:
    """Label ``items`` into ``out`` (JSONL, appended). Returns counts for a summary."""
    done = completed_ids(out)
    failed_done = completed_ids(failed_out) if failed_out else set()
    todo = [it for it in items if it.id not in done and it.id not in failed_done]
    stats = {
        "traces": len(items),
        "already_done": len(items) - len(todo),
        "labelled": 0,
        "failed_traces": 0,
        "failed_checks": 0,
        "tokens": 0,
    }
    bar = None
    if progress and todo:
        bar = progress_bar(len(todo), "labelling", "trace")
    try:
        with open(out, "a", encoding="utf-8") as fh:
            for start in range(0, len(todo), chunk):
                part = todo[start : start + chunk]
                reqs, where = [], []
                for it in part:
                    for t in range(len(it.steps) - 1):  # the last step is the whole trace
                        reqs.append(
                            GenerationRequest(it.question, it.steps[: t + 1], n, it.handle, _seed(seed, it.id, t))
                        )
                        where.append((it, t))
                comps = generator.generate(reqs) if reqs else []
                pairs, slots = [], []
                for (it, t), cs in zip(where, comps):
                    for c in cs:
                        stats["tokens"] += c.n_tokens
                        pairs.append((it, answer_of(it.steps[: t + 1] + list(c.steps))))
                        slots.append((it.id, t))
                for it in part:
                    pairs.append((it, answer_of(it.steps)))
                    slots.append((it.id, len(it.steps) - 1))
                verdicts = check_many(pairs)
                tally: dict[tuple[str, int], list[int]] = {}
                for (iid, t), v, (it, _) in zip(slots, verdicts, pairs):
                    k, m, f = tally.setdefault((iid, t), [0, 0, 0])
                    w = n if t == len(it.steps) - 1 else 1  # the whole trace's own answer counts n times
                    if v is None:
                        tally[(iid, t)] = [k, m, f + w]
                    else:
                        tally[(iid, t)] = [k + w * bool(v), m + w, f]
                for it in part:
                    rows = [tally[(it.id, t)] for t in range(len(it.steps))]
                    rec = {
                        "id": it.id,
                        "question": it.question,
                        "steps": it.steps,
                        "mc_correct": [r[0] for r in rows],
                        "mc_total": [r[1] for r in rows],
                    }
                    if it.answer is not None:
                        rec["answer"] = it.answer if isinstance(it.answer, (str, int, float)) else str(it.answer)
                    if it.source:
                        rec["source"] = it.source
                    nfail = sum(r[2] for r in rows)
                    stats["failed_checks"] += nfail
                    if nfail:
                        rec["mc_failed"] = [r[2] for r in rows]
                    if any(r[1] == 0 for r in rows):
                        stats["failed_traces"] += 1
                        bad = [t for t, r in enumerate(rows) if r[1] == 0]
                        rec["reason"] = f"every answer check failed at steps {bad}: no count to train on"
                        if failed_out:
                            with open(failed_out, "a", encoding="utf-8") as ff:
                                ff.write(json_line(rec))
                    else:
                        fh.write(json_line(rec))
                        stats["labelled"] += 1
                fh.flush()
                if bar:
                    bar.update(len(part))
    finally:
        if bar:
            bar.close()
    return stats
