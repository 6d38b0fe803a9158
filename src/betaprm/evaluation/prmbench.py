"""PRMBench (Song et al. 2025): step-level error detection in nine error categories.

Records (the classified jsonl files of the PRMBench repository): ``idx``,
``classification``, ``original_question`` / ``modified_question``, ``original_process`` /
``modified_process`` (lists of steps), ``modified_steps`` and ``error_steps`` (1-based
step numbers), ``reason``.

What is scored, as its evaluator (``mr_eval/tasks/prmtest_classified/task.py``) builds it:
every record's modified process, with the steps in ``error_steps`` as the negative class
and all others positive; and, once per ``idx``, the original process of each
``redundency`` record as a ``correct`` item (all steps positive), reported on its own row
and left out of the overall score, as there.

Metrics, as its evaluator and its table notebook (``form_latex_strs.ipynb``) compute them:
a step is predicted positive when its score is strictly above the threshold (0.5, the
evaluator's ``validity_threshold``); TP / FP / TN / FN are pooled over all steps of a
category (and over all categories for the overall row); F1 of the positive class and of
the negative class with its guards as there (a precision or recall over no steps is -1,
and so is an F1 whose precision and recall sum to 0);
PRMScore = 0.5 * F1 + 0.5 * negative F1, except ``multi_solutions`` (no wrong steps):
its F1 alone; clipped at 0. The ``correct`` row (originals, no wrong steps either) is not
in the evaluator's tables; here its PRMScore is its F1 alone, like ``multi_solutions``, so a
perfect model scores 1 there (the two-class formula would give it 0.5 * 1 + 0.5 * -1 = 0).
A record repeated with the same ``classification`` and ``idx`` is read once, as the
evaluator keys its items by them. The overall PRMScore comes from the pooled counts, not from
the mean of the categories; a group's score (simplicity, soundness, sensitivity) is the
unweighted mean of its categories' PRMScores.

Records as the official data has them, read as its evaluator reads them (its loop runs
over the steps that were scored, ``for idx in range(len(labels))``): an ``error_steps``
number past the last step is never visited (the record is scored on its steps; 100 records
of the release list one, 16 of them none inside the solution), and an empty step is scored
like any other (3 records). Such records are counted (``irregular``), never refused.

Not reproduced: the evaluator's separate redundancy labels for ``redundency`` and
``circular`` (``step_level_redundancy_labels``), which only models with a redundancy
output (ReasonEval) produce; a PRM with one score per step is judged on validity, as the
evaluator does for every other model. Steps without a score (``--truncate steps``, opt-in)
are skipped, as the same loop skips them, and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..data.records import read_objects, short_repr
from ..data.sources import iter_splits
from ..errors import BetaPRMInputError

CATEGORIES = {
    "redundency": "NR.",
    "circular": "NCL.",
    "counterfactual": "ES.",
    "step_contradiction": "SC.",
    "domain_inconsistency": "DC.",
    "confidence": "CI.",
    "missing_condition": "PS.",
    "deception": "DR.",
    "multi_solutions": "MS.",
}
GROUPS = {
    "simplicity": ("redundency", "circular"),
    "soundness": ("counterfactual", "step_contradiction", "domain_inconsistency", "confidence"),
    "sensitivity": ("missing_condition", "deception", "multi_solutions"),
}
CORRECT = "correct"


@dataclass
class PRMBenchItem:
    id: str
    question: str
    steps: list[str]
    error_steps: set[int]  # 0-based; as in the official data, some may lie past the last step
    category: str

    @property
    def error_past_end(self) -> bool:
        return any(e >= len(self.steps) for e in self.error_steps)

    @property
    def error_below_one(self) -> bool:
        return any(e < 0 for e in self.error_steps)


def read_prmbench(spec, flag: str = "--data") -> list[PRMBenchItem]:
    """The evaluated items of PRMBench records (see the module docstring), from any source."""
    items, originals, seen = [], set(), set()
    for split, rows in iter_splits(spec, flag):
        name = f"{spec}:{split}" if split else str(spec)
        what = "a PRMBench item (idx, classification, modified_question, modified_process, error_steps)"
        for where, r in read_objects(name, ("classification", "modified_process"), what, flag, rows=rows):
            cat = r["classification"]
            if cat not in CATEGORIES:
                raise BetaPRMInputError(
                    f"{where}: field 'classification' is {short_repr(cat)}; PRMBench's categories are "
                    f"{', '.join(CATEGORIES)}"
                )
            idx = r.get("idx")
            if isinstance(idx, bool) or not isinstance(idx, (str, int)) or idx == "":
                raise BetaPRMInputError(f"{where}: field 'idx' must be a string or an integer, got {short_repr(idx)}")

            def steps_of(key, where=where, r=r):
                # Empty steps occur in the official data; its evaluator scores them like any other.
                s = r.get(key)
                if not isinstance(s, list) or not s or not all(isinstance(x, str) for x in s):
                    raise BetaPRMInputError(
                        f"{where}: field {key!r} must be a non-empty list of strings, got {short_repr(s)}"
                    )
                return s

            def question_of(key, where=where, r=r):
                q = r.get(key, r.get("question"))
                if not isinstance(q, str) or not q.strip():
                    raise BetaPRMInputError(f"{where}: field {key!r} must be a non-empty string, got {short_repr(q)}")
                return q

            if f"{cat}_{idx}" in seen:
                continue  # the evaluator keys items by classification and idx: the first one counts
            seen.add(f"{cat}_{idx}")
            steps = steps_of("modified_process")
            errs = r.get("error_steps", [])
            # A number outside the steps (past the last, or below 1) is kept: the evaluator's
            # loop over the steps never visits it (module docstring).
            if not isinstance(errs, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in errs):
                raise BetaPRMInputError(f"{where}: field 'error_steps' must list step numbers, got {short_repr(errs)}")
            items.append(
                PRMBenchItem(f"{cat}_{idx}", question_of("modified_question"), steps, {e - 1 for e in errs}, cat)
            )
            if cat == "redundency" and str(idx) not in originals:
                originals.add(str(idx))
                items.append(
                    PRMBenchItem(
                        f"{CORRECT}_{idx}",
                        question_of("original_question"),
                        steps_of("original_process"),
                        set(),
                        CORRECT,
                    )
                )
    if not items:
        raise BetaPRMInputError(f"{flag} {spec}: no PRMBench items")
    return items


def _counts(items, step_scores, threshold) -> tuple[np.ndarray, int]:
    """[TP, FP, TN, FN] with the positive class = a correct step, and the unscored steps."""
    tp = fp = tn = fn = skipped = 0
    for it, s in zip(items, step_scores):
        pred_pos = np.asarray(s, dtype=np.float64) > threshold
        skipped += len(it.steps) - len(pred_pos)
        for j, p in enumerate(pred_pos):
            if j in it.error_steps:
                fp, tn = fp + bool(p), tn + (not p)
            else:
                tp, fn = tp + bool(p), fn + (not p)
    return np.array([tp, fp, tn, fn]), skipped


def f1_pair(c: np.ndarray) -> tuple[float, float]:
    """(F1 of the positive class, F1 of the negative class) from [TP, FP, TN, FN], with the
    evaluator's -1 for an undefined precision, recall or F1."""
    tp, fp, tn, fn = (int(x) for x in c)

    def f1(hit, false_pos, false_neg):
        p = hit / (hit + false_pos) if hit + false_pos else -1
        r = hit / (hit + false_neg) if hit + false_neg else -1
        return 2 * p * r / (p + r) if p + r != 0 else -1

    # + 0.0 turns the formula's -0.0 (a 0 precision times a -1 recall) into 0.0
    return float(f1(tp, fp, fn)) + 0.0, float(f1(tn, fn, fp)) + 0.0


def prm_score(c: np.ndarray, category: str | None) -> float:
    f_pos, f_neg = f1_pair(c)
    s = f_pos if category in ("multi_solutions", CORRECT) else 0.5 * f_pos + 0.5 * f_neg
    return max(s, 0.0)


def evaluate_prmbench(
    items: Sequence[PRMBenchItem], step_scores: Sequence[np.ndarray], threshold: float = 0.5
) -> dict:
    """Per-category, per-group and overall F1 / negative F1 / PRMScore (fractions, not percent)."""
    per, total, skipped = {}, np.zeros(4, int), 0
    for cat in [*CATEGORIES, CORRECT]:
        mine = [i for i, it in enumerate(items) if it.category == cat]
        if not mine:
            continue
        c, sk = _counts([items[i] for i in mine], [step_scores[i] for i in mine], threshold)
        skipped += sk
        f_pos, f_neg = f1_pair(c)
        per[cat] = {
            "f1": f_pos,
            "negative_f1": f_neg,
            "prm_score": prm_score(c, cat),
            "counts": dict(zip(("tp", "fp", "tn", "fn"), (int(x) for x in c))),
            "n_items": len(mine),
        }
        if cat != CORRECT:
            total += c
    f_pos, f_neg = f1_pair(total)
    groups = {
        g: float(np.mean([per[c]["prm_score"] for c in cats])) if all(c in per for c in cats) else None
        for g, cats in GROUPS.items()
    }
    return {
        "threshold": float(threshold),
        "overall": {"f1": f_pos, "negative_f1": f_neg, "prm_score": prm_score(total, None)},
        "categories": per,
        "groups": groups,
        "n_items": len(items),
        "n_unscored_steps": int(skipped),
        "n_truncated_items": sum(len(s) < len(it.steps) for it, s in zip(items, step_scores)),
        "irregular": irregular(items),
    }


def irregular(items: Sequence[PRMBenchItem]) -> dict:
    """How many items the official data gives in shapes its evaluator reads leniently:
    error steps past the last step (and of those, none inside), empty steps."""
    past = [it for it in items if it.error_past_end]
    return {
        "error_step_past_end": len(past),
        "no_error_step_inside": sum(all(e >= len(it.steps) for e in it.error_steps) for it in past),
        "error_step_below_one": sum(it.error_below_one for it in items),
        "empty_step": sum(any(not s.strip() for s in it.steps) for it in items),
    }


def describe_irregular(counts: dict) -> str | None:
    """One line for the printed output, or None when every item is regular."""
    parts = []
    if counts["error_step_past_end"]:
        parts.append(
            f"{counts['error_step_past_end']} items list an error step past their last step "
            f"({counts['no_error_step_inside']} of them none inside the solution): those numbers are never visited"
        )
    if counts["error_step_below_one"]:
        parts.append(f"{counts['error_step_below_one']} items list an error step below 1: never visited either")
    if counts["empty_step"]:
        parts.append(f"{counts['empty_step']} items have an empty step, scored like any other")
    if not parts:
        return None
    return "warning: " + "; ".join(parts) + " (as PRMBench's evaluator reads them)"


def table(res: dict) -> str:
    """PRMBench's leaderboard layout: overall, then each group's categories and their mean (percent)."""
    head, row = ["Overall"], [res["overall"]["prm_score"]]
    for g, cats in GROUPS.items():
        for c in cats:
            head.append(CATEGORIES[c].rstrip("."))
            row.append(res["categories"].get(c, {}).get("prm_score", float("nan")))
        head.append(f"Avg ({g})")
        row.append(res["groups"][g] if res["groups"][g] is not None else float("nan"))
    cells = ["-" if x != x else f"{100 * x:.1f}" for x in row]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(cells) + " |"])
