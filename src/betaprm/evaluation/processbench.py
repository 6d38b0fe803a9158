"""ProcessBench (Zheng et al. 2024, Qwen): find the first wrong step of a solution.

Records: ``id``, ``generator``, ``problem``, ``steps``, ``final_answer_correct`` and
``label``, the index (0-based) of the first wrong step, or -1 when every step is right.
The hub data set's splits (gsm8k, math, olympiadbench, omnimath) are its subsets.

Where each rule comes from (QwenLM/ProcessBench):

- The metrics are the block every evaluation script of the repository shares (main
  branch: ``code/run_eval.py``, ``code/run_eval_prm_rlhflow.py``): an item is right when
  its predicted first error equals ``label`` exactly; per subset ``acc1`` is the mean over
  the erroneous items, ``acc2`` over the correct ones, ``f1 = 2 * acc1 * acc2 / (acc1 +
  acc2)``, all in percent, with no guard: a subset without erroneous or without correct
  items has a nan accuracy (``np.mean([])``), and its F1 is nan; so is an F1 whose
  accuracies are both 0 (0/0). Those are reported as undefined (``None`` in JSON, ``n/a``
  in the table, with the reason), never as 0.
- The average F1 is the plain mean of the subsets' F1, as the community script for PRMs
  scored by two-class logits prints it (``code/run_eval_prm_trl.py``, pull request 12, not
  on the main branch): nan when any subset's F1 is.
- The step rule is that same community script's: the predicted first error is the first
  step the PRM does not call correct, -1 when it calls every step correct; a step is
  correct when the correct class wins ``torch.argmax`` of the two-class logits, which
  breaks a tie towards the first class (the error), so a step is correct only when its
  probability is *strictly above* 0.5. The same strict ``>`` holds here for any
  threshold. (The main branch's PRM script asks a generative PRM step by step and stops at
  the first step not judged ``+``: the same first-error rule.)

Every step is scored: a trace longer than the model's positions is an error naming the
item (``--truncate error``, the default). ``--truncate steps`` is opt-in: a cut trace has
scores for its first steps only, and its prediction comes from those (the first flagged
one, else -1), as a script that loops over the scores it has would; the output counts the
items cut (``n_truncated``) and those whose prediction rests on the cut (``n_undecided``:
no flagged step among the scored ones).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.records import read_objects, short_repr
from ..data.sources import iter_splits
from ..errors import BetaPRMInputError

SUBSET_ORDER = ("gsm8k", "math", "olympiadbench", "omnimath")
SUBSET_TITLES = {"gsm8k": "GSM8K", "math": "MATH", "olympiadbench": "OlympiadBench", "omnimath": "Omni-MATH"}


@dataclass
class PBItem:
    id: str
    problem: str
    steps: list[str]
    label: int  # index of the first wrong step, -1 when all are right
    subset: str


def read_processbench(spec, flag: str = "--data") -> list[PBItem]:
    """ProcessBench records from any source (``data.sources``): a hub name or folder with
    the four splits (each split is a subset), or a file (the subset is the record's
    ``subset`` or ``source`` field, else the file's stem, e.g. ``gsm8k.json``)."""
    items, seen = [], set()
    for split, rows in iter_splits(spec, flag):
        default = split or Path(str(spec)).stem
        where_name = f"{spec}:{split}" if split else str(spec)
        for where, r in read_objects(
            where_name, ("problem", "steps"), "a ProcessBench item (id, problem, steps, label)", flag, rows=rows
        ):
            steps, label = r["steps"], r.get("label")
            if not isinstance(r["problem"], str):
                raise BetaPRMInputError(f"{where}: field 'problem' must be a string, got {short_repr(r['problem'])}")
            if not isinstance(steps, list) or not all(isinstance(s, str) and s.strip() for s in steps):
                raise BetaPRMInputError(
                    f"{where}: field 'steps' must be a non-empty list of non-empty strings, got {short_repr(steps)}"
                )
            if isinstance(label, bool) or not isinstance(label, int) or not -1 <= label < len(steps):
                raise BetaPRMInputError(
                    f"{where}: field 'label' must be the index of the first wrong step (0 to {len(steps) - 1}) or -1 "
                    f"when all steps are right, got {short_repr(label)}"
                )
            subset = str(r.get("subset", r.get("source", default)))
            rid = str(r.get("id", f"{subset}-{len(items)}"))
            if (subset, rid) in seen:
                raise BetaPRMInputError(f"{where}: id {rid!r} appears twice in subset {subset!r}; ids must be unique")
            seen.add((subset, rid))
            items.append(PBItem(rid, r["problem"], steps, label, subset))
    if not items:
        raise BetaPRMInputError(f"{flag} {spec}: no ProcessBench items")
    return items


def predicted_first_error(scores: np.ndarray, threshold: float) -> int:
    """The first scored step whose score is not above ``threshold``; -1 when none is."""
    flagged = np.flatnonzero(~(np.asarray(scores, dtype=np.float64) > threshold))
    return int(flagged[0]) if len(flagged) else -1


def _official_f1(acc1: float, acc2: float) -> float:
    """``2 * acc1 * acc2 / (acc1 + acc2)`` with the official script's nan where it has one
    (a nan accuracy, or 0/0)."""
    if acc1 != acc1 or acc2 != acc2 or acc1 + acc2 == 0:
        return float("nan")
    return 2 * acc1 * acc2 / (acc1 + acc2)


def undefined_reason(m: dict) -> str | None:
    """Why a subset's F1 is undefined (nan in the official script), or None."""
    if not m["n_error"]:
        return "no erroneous items"
    if not m["n_correct"]:
        return "no correct items"
    if m["error_acc"] == 0 and m["correct_acc"] == 0:
        return "both accuracies are 0"
    return None


def subset_metrics(
    labels: Sequence[int], preds: Sequence[int], n_steps: Sequence[int], n_scored: Sequence[int]
) -> dict:
    """Error accuracy, correct accuracy and F1 in percent, as the official script computes
    them (nan where it is undefined there), and the truncation counts."""
    labels = np.asarray(labels)
    match = np.array([p == y for p, y in zip(preds, labels)], dtype=bool)
    err, cor = labels != -1, labels == -1
    # np.mean of an empty list is nan in the official script too; say so instead of warning.
    acc1 = float(match[err].mean() * 100) if err.any() else float("nan")
    acc2 = float(match[cor].mean() * 100) if cor.any() else float("nan")
    cut = [s < n for s, n in zip(n_scored, n_steps)]
    return {
        "error_acc": acc1,
        "correct_acc": acc2,
        "f1": _official_f1(acc1, acc2),
        "n_error": int(err.sum()),
        "n_correct": int(cor.sum()),
        "n_truncated": int(sum(cut)),
        "n_undecided": int(sum(c and p == -1 for c, p in zip(cut, preds))),
    }


def split_by_problem(items: Sequence[PBItem], val_fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Validation and test indices; one problem (subset and problem text) sits on one side."""
    val, test = [], []
    for i, it in enumerate(items):
        h = zlib.crc32(f"{seed}/{it.subset}/{it.problem}".encode()) / 0xFFFFFFFF
        (val if h < val_fraction else test).append(i)
    return val, test


def _match_intervals(items, scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each item the thresholds t with a right prediction form an interval [lo, hi):
    an erroneous item with label L is right when min(s_0..s_{L-1}) > t >= s_L; a correct
    one when t < min(s). (Empty intervals have lo >= hi.) Returns lo, hi, is_error."""
    lo, hi, err = [], [], []
    for it, s in zip(items, scores):
        s = np.asarray(s, dtype=np.float64)
        if it.label == -1:
            lo.append(-np.inf)
            hi.append(s.min() if len(s) else np.inf)
            err.append(False)
        else:
            L = it.label
            lo.append(s[L] if L < len(s) else np.inf)
            hi.append(s[:L].min() if L > 0 else np.inf)
            err.append(True)
    return np.array(lo), np.array(hi), np.array(err)


def average_f1_curve(
    items: Sequence[PBItem], scores: Sequence[np.ndarray], thresholds, choosing: bool = False
) -> np.ndarray:
    """The average F1 in percent (the mean over subsets of the harmonic mean of error and
    correct accuracy) at each of ``thresholds``, exactly as ``evaluate_processbench`` would
    report it there: nan where the official script's is (a subset without items of one kind,
    or both its accuracies 0). ``choosing``: the rule ``choose_threshold`` maximises
    instead, where an F1 whose accuracies are both 0 counts as 0."""
    lo, hi, err = _match_intervals(items, scores)
    thresholds = np.asarray(thresholds, dtype=np.float64)
    subsets = np.array([it.subset for it in items])
    ok = lo < hi
    f1s = []
    for sub in sorted(set(subsets.tolist())):
        m = subsets == sub
        # right(t) = #{lo <= t} - #{hi <= t} over non-empty intervals, per class.
        acc = []
        for cls in (True, False):
            sel = m & ok & (err == cls)
            right = np.searchsorted(np.sort(lo[sel]), thresholds, "right") - np.searchsorted(
                np.sort(hi[sel]), thresholds, "right"
            )
            n = int((m & (err == cls)).sum())
            acc.append(100 * right / n if n else np.full(len(thresholds), np.nan))
        a1, a2 = acc
        with np.errstate(invalid="ignore", divide="ignore"):
            f1s.append(np.where(a1 + a2 > 0, 2 * a1 * a2 / (a1 + a2), 0.0 if choosing else np.nan))
    return np.mean(f1s, axis=0)


def choose_threshold(items: Sequence[PBItem], scores: Sequence[np.ndarray]) -> tuple[float, float]:
    """The threshold with the highest average F1 (the reported metric: the mean over
    subsets of the harmonic mean of error and correct accuracy) on ``items``, and that F1 in
    percent; ties go to the lowest threshold. Exact: every item is right on one interval of
    thresholds, so only the interval ends need trying. Every subset needs items of both
    kinds (otherwise its F1 is undefined whatever the threshold). While choosing, an F1
    whose accuracies are both 0 (undefined in the official script) counts as 0
    (``average_f1_curve(..., choosing=True)``)."""
    lo, hi, err = _match_intervals(items, scores)
    subsets = np.array([it.subset for it in items])
    for sub in sorted(set(subsets.tolist())):
        m = subsets == sub
        if err[m].all() or not err[m].any():
            kind = "erroneous" if err[m].all() else "correct"
            raise BetaPRMInputError(
                f"the validation part of subset {sub!r} holds only {kind} items, so no threshold can be chosen on "
                "it; give more problems (or a larger --limit), change --val-fraction / --seed, or fix --threshold"
            )
    cands = np.unique(np.concatenate([lo[np.isfinite(lo)], hi[np.isfinite(hi)], [-np.inf]]))
    f1 = average_f1_curve(items, scores, cands, choosing=True)
    i = int(np.argmax(f1))  # the first maximum: the lowest threshold
    tau = float(cands[i])
    if not np.isfinite(tau):  # nothing flagged is best: any threshold below every score
        tau = float(np.min(np.concatenate([np.asarray(s, dtype=np.float64) for s in scores]))) - 1.0
    return tau, float(f1[i])


def evaluate_processbench(
    items: Sequence[PBItem],
    step_scores: Sequence[np.ndarray],
    threshold: float | str = 0.5,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> dict:
    """Per-subset and average metrics. ``threshold``: a number, or ``"val"`` to choose it on
    ``val_fraction`` of the problems (split by problem) and report on the rest."""
    idx = list(range(len(items)))
    res: dict = {}
    if threshold == "val":
        val, idx = split_by_problem(items, val_fraction, seed)
        if not val or not idx:
            raise BetaPRMInputError(
                f"the split by problem left {len(val)} validation and {len(idx)} test items; give more problems or "
                "change --val-fraction"
            )
        threshold, val_f1 = choose_threshold([items[i] for i in val], [step_scores[i] for i in val])
        res.update(threshold_chosen_on="validation", n_val_items=len(val), val_average_f1=val_f1)
    threshold = float(threshold)
    preds = {i: predicted_first_error(step_scores[i], threshold) for i in idx}
    # ProcessBench's subsets in the paper's order, any others in order of first appearance
    first = {}
    for i in idx:
        first.setdefault(items[i].subset, len(first))
    subsets = sorted(
        first, key=lambda s: (SUBSET_ORDER.index(s) if s in SUBSET_ORDER else len(SUBSET_ORDER), first[s])
    )
    per = {}
    for sub in subsets:
        mine = [i for i in idx if items[i].subset == sub]
        per[sub] = subset_metrics(
            [items[i].label for i in mine],
            [preds[i] for i in mine],
            [len(items[i].steps) for i in mine],
            [len(step_scores[i]) for i in mine],
        )
    res.update(
        threshold=threshold,
        subsets=per,
        average_f1=float(np.mean([m["f1"] for m in per.values()])),  # nan when any subset's is, as there
        undefined={sub: why for sub, m in per.items() if (why := undefined_reason(m))},
        n_items=len(idx),
        predictions={f"{items[i].subset}/{items[i].id}": preds[i] for i in idx},
    )
    return res


def table(res: dict) -> str:
    """The paper's layout: error / correct / F1 per subset, then the average F1; an
    undefined number is ``n/a``, with the reasons below the table."""
    subs = list(res["subsets"])
    head = "| " + " | ".join(f"{SUBSET_TITLES.get(s, s)} error | correct | F1" for s in subs) + " | Avg. F1 |"
    sep = "|" + "---|" * (3 * len(subs) + 1)

    def f(x):
        return "n/a" if x is None or x != x else f"{x:.1f}"

    row = (
        "| "
        + " | ".join(f"{f(m['error_acc'])} | {f(m['correct_acc'])} | {f(m['f1'])}" for m in res["subsets"].values())
        + f" | {f(res['average_f1'])} |"
    )
    notes = [
        f"n/a: {SUBSET_TITLES.get(s, s)} F1 is undefined ({why}), as in the official script"
        for s, m in res["subsets"].items()
        if (why := undefined_reason(m))
    ]
    if notes:
        notes.append("n/a: the average F1 is undefined when any subset's F1 is (the official mean is nan)")
    return "\n".join([head, sep, row, *notes])
