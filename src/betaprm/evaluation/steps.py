"""Step-level error detection, VisualProcessBench protocol (paper appendix A.4).

Every annotated step gets a score: ``mu`` for a standard PRM (and a zero-shot backbone),
``mu - lam * sigma`` (lam = 0.5) for a BetaPRM. A step is predicted correct when its score
is at least a threshold. The threshold is one global value per model, chosen to maximise
the overall F1 on a validation part (``val_fraction`` of the problems, split by problem so
that no problem's steps sit on both sides) and applied to the rest.

Metrics (neutral steps, label 0, ignored):

- **overall**: micro-F1 over all annotated test steps and both classes (correct,
  erroneous); with two classes and one prediction per step this equals the accuracy;
- **per source**: macro-F1 on that source's steps, the mean of the F1 of the correct
  class and the F1 of the erroneous class.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.records import read_objects, short_repr
from ..data.sources import base_dir, iter_rows
from ..errors import BetaPRMInputError


@dataclass
class BenchItem:
    id: str
    question: str
    steps: list[str]
    labels: list[int]  # 1 correct, 0 neutral, -1 incorrect
    source: str
    images: list[str]


def read_visualprocessbench(path, flag: str = "--data") -> list[BenchItem]:
    """VisualProcessBench records: ``question``, ``response`` with ``steps`` and
    ``process_correctness``, ``data_source``, optional ``image`` (str or list) and ``id``.
    The first bad line raises with its line and field; ``flag`` is named when the file
    is missing."""
    items, root = [], base_dir(path)
    for i, (where, r) in enumerate(
        read_objects(
            path,
            ("question",),
            "a VisualProcessBench item (question, response, data_source)",
            flag,
            rows=iter_rows(path, flag),
        ),
        1,
    ):
        if not isinstance(r["question"], str):
            raise BetaPRMInputError(f"{where}: field 'question' must be a string, got {short_repr(r['question'])}")
        resp = r.get("response")
        if not isinstance(resp, dict):
            raise BetaPRMInputError(
                f"{where}: field 'response' must be an object with 'steps' and 'process_correctness'"
            )
        steps, labels = resp.get("steps"), resp.get("process_correctness")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s.strip() for s in steps):
            raise BetaPRMInputError(f"{where}: field 'response.steps' must be a non-empty list of non-empty strings")
        if not isinstance(labels, list) or len(labels) != len(steps):
            n = len(labels) if isinstance(labels, list) else type(labels).__name__
            raise BetaPRMInputError(
                f"{where}: field 'response.process_correctness' must have one label per step ({len(steps)} steps, "
                f"got {n})"
            )
        bad = [
            j
            for j, lab in enumerate(labels)
            if isinstance(lab, bool) or not isinstance(lab, int) or lab not in (1, 0, -1)
        ]
        if bad:
            seen = short_repr([labels[j] for j in bad][:5], 80)
            raise BetaPRMInputError(
                f"{where}: field 'response.process_correctness' holds {seen} (first at step {bad[0] + 1}); allowed: "
                "1 (correct), 0 (neutral), -1 (incorrect)"
            )
        image = r.get("image", r.get("images"))
        images = [] if image in (None, "", []) else [image] if isinstance(image, str) else image
        if not isinstance(images, list) or not all(isinstance(p, str) and p for p in images):
            raise BetaPRMInputError(
                f"{where}: field 'image' must be an image path or a list of paths, got {short_repr(image)}"
            )
        for key in ("id", "data_source"):
            if key in r and (isinstance(r[key], (bool, dict, list)) or r[key] is None):
                raise BetaPRMInputError(f"{where}: field {key!r} must be a string, got {short_repr(r[key])}")
        images = [str(p if Path(p).is_absolute() or root is None else root / p) for p in images]
        items.append(
            BenchItem(str(r.get("id", i)), r["question"], steps, labels, str(r.get("data_source", "all")), images)
        )
    return items


def split_by_problem(items: Sequence[BenchItem], val_fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices of validation and test items; a problem (same source and question) is on
    one side only. Deterministic: a hash of the problem decides."""
    if not 0 < val_fraction < 1:
        raise BetaPRMInputError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    val, test = [], []
    for i, it in enumerate(items):
        h = zlib.crc32(f"{seed}/{it.source}/{it.question}".encode()) / 0xFFFFFFFF
        (val if h < val_fraction else test).append(i)
    return val, test


def _f1(tp: int, fp: int, fn: int) -> float:
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def f1_scores(pred_correct: np.ndarray, is_correct: np.ndarray) -> tuple[float, float, float]:
    """(micro-F1 over both classes, F1 of the correct class, F1 of the erroneous class)."""
    p, y = pred_correct.astype(bool), is_correct.astype(bool)
    f_pos = _f1(int((p & y).sum()), int((p & ~y).sum()), int((~p & y).sum()))
    f_neg = _f1(int((~p & ~y).sum()), int((~p & y).sum()), int((p & ~y).sum()))
    micro = float((p == y).mean()) if len(y) else float("nan")
    return micro, f_pos, f_neg


def best_threshold(scores: np.ndarray, is_correct: np.ndarray) -> float:
    """The threshold (one of the scores, or above all of them) with the highest micro-F1;
    ties go to the lowest threshold."""
    cands = np.unique(np.concatenate([scores, [np.inf]]))
    best, best_f = cands[0], -1.0
    for t in cands:
        f = f1_scores(scores >= t, is_correct)[0]
        if f > best_f:
            best, best_f = t, f
    return float(best)


def evaluate_steps(
    items: Sequence[BenchItem], step_scores: Sequence[np.ndarray], val_fraction: float = 0.2, seed: int = 0
) -> dict:
    """Threshold on validation, F1 on test. ``step_scores[i]``: one score per step of item
    i, or fewer when the trace was cut to the model's positions (its later steps are left
    out and counted in ``n_unscored_steps``)."""
    val, test = split_by_problem(items, val_fraction, seed)
    if not val or not test:
        raise BetaPRMInputError(
            f"the split by problem left {len(val)} validation and {len(test)} test items; give more problems or "
            "change --val-fraction"
        )

    unscored = sum(sum(lab != 0 for lab in it.labels[len(sc) :]) for it, sc in zip(items, step_scores))

    def gather(idx):
        s, y, src = [], [], []
        for i in idx:
            for sc, lab in zip(step_scores[i], items[i].labels):
                if lab != 0:
                    s.append(sc)
                    y.append(lab == 1)
                    src.append(items[i].source)
        return np.array(s, float), np.array(y, bool), np.array(src)

    vs, vy, _ = gather(val)
    ts, ty, tsrc = gather(test)
    for part, n, idx in (("validation", len(vs), val), ("test", len(ts), test)):
        if n == 0:
            raise BetaPRMInputError(
                f"the {part} part ({len(idx)} items) holds no scored step labelled correct or incorrect (all neutral, "
                "or cut off), so "
                f"{'no threshold can be chosen' if part == 'validation' else 'there is nothing to score'}; "
                "give more annotated problems or change --val-fraction / --seed"
            )
    tau = best_threshold(vs, vy)
    micro, _, _ = f1_scores(ts >= tau, ty)
    per_source = {}
    for src in sorted(set(tsrc.tolist())):
        m = tsrc == src
        _, fp_, fn_ = f1_scores(ts[m] >= tau, ty[m])
        per_source[src] = (fp_ + fn_) / 2
    return {
        "overall_f1": micro,
        "per_source": per_source,
        "threshold": tau,
        "n_steps": int(len(ts)),
        "n_val_steps": int(len(vs)),
        "n_test_items": len(test),
        "n_val_items": len(val),
        "n_unscored_steps": int(unscored),
        "val_f1": f1_scores(vs >= tau, vy)[0],
    }
