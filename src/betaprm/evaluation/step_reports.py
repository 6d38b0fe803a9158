"""What ``eval-steps`` reports beside a benchmark's metrics, for its three formats
(``processbench``, ``prmbench``, ``visualprocessbench``): the ``--limit`` sample, one record
per evaluated item (``--log-samples``) and the metric against the threshold (the plot).

Each works on the items the format's reader returns and on the scores (numbers, no model).
A subset is a ProcessBench subset, a PRMBench category or a VisualProcessBench data source;
an item's class is whether its solution has a wrong step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import prmbench
from .prmbench import CORRECT
from .processbench import average_f1_curve, predicted_first_error
from .sampling import limit_per_group
from .steps import split_by_problem


def subset_of(fmt: str, item) -> str:
    return item.subset if fmt == "processbench" else item.category if fmt == "prmbench" else item.source


def has_error(fmt: str, item) -> bool:
    """The item's class for ``--limit``: does its solution have a wrong step (among its
    steps: a PRMBench error step past the last is never visited)?"""
    if fmt == "processbench":
        return item.label != -1
    if fmt == "prmbench":
        return any(0 <= e < len(item.steps) for e in item.error_steps)
    return -1 in item.labels


_DRAWN = ("n_items", "of_items", "n_error", "of_error", "n_correct", "of_correct")


def limit_items(fmt: str, items: Sequence, n: int, seed: int = 0) -> tuple[list, dict]:
    """At most ``n`` items of each subset, drawn by class in the subset's proportions
    (``sampling.limit_per_group``), in the data's order; and what was drawn of what:
    ``{"per_subset": n, "seed": seed, "subsets": {subset: {n_items, of_items, n_error,
    of_error, n_correct, of_correct}}}``."""
    groups = [subset_of(fmt, it) for it in items]
    classes = [has_error(fmt, it) for it in items]
    keep = limit_per_group(groups, classes, n, seed)
    drawn: dict[str, dict] = {}
    for g, c in zip(groups, classes):
        d = drawn.setdefault(g, dict.fromkeys(_DRAWN, 0))
        d["of_items"] += 1
        d["of_error" if c else "of_correct"] += 1
    for i in keep:
        d = drawn[groups[i]]
        d["n_items"] += 1
        d["n_error" if classes[i] else "n_correct"] += 1
    return [items[i] for i in keep], {"per_subset": n, "seed": seed, "subsets": drawn}


def describe_sample(sample: dict) -> str:
    """One line for the printed output: what ``limit_items`` drew of what."""
    parts = [
        f"{g} {d['n_items']} of {d['of_items']} ({d['n_error']} of {d['of_error']} erroneous, {d['n_correct']} of "
        f"{d['of_correct']} correct)"
        for g, d in sample["subsets"].items()
    ]
    return (
        f"--limit {sample['per_subset']} (seed {sample['seed']}), drawn by class within each subset: "
        + "; ".join(parts)
        + ". The metrics below are on this sample, not on the whole benchmark"
    )


def step_labels(fmt: str, items: Sequence, n_scored: Sequence[int]) -> list[np.ndarray]:
    """Per item, one label per scored step: 1 correct, -1 wrong, 0 unlabelled (a
    VisualProcessBench neutral step; a ProcessBench step after the first error). With
    ``--truncate steps`` an item may have fewer scores than steps: only the scored enter."""
    if fmt == "visualprocessbench":
        return [np.array(it.labels[:n]) for it, n in zip(items, n_scored)]
    if fmt == "processbench":
        return [
            np.array(
                (
                    [1] * len(it.steps)
                    if it.label == -1
                    else [1] * it.label + [-1] + [0] * (len(it.steps) - it.label - 1)
                )[:n]
            )
            for it, n in zip(items, n_scored)
        ]
    return [np.array([-1 if j in it.error_steps else 1 for j in range(n)]) for it, n in zip(items, n_scored)]


def sample_records(
    fmt: str, items: Sequence, scores: Sequence, step_scores: Sequence, res: dict, val_fraction: float, seed: int
) -> list[dict]:
    """One record per evaluated item (``--log-samples``), in the data's order: what was
    scored, the scores (``mu``, ``kappa``, ``sigma`` and the ``step_score`` compared with the
    threshold), the prediction at the threshold used, the truth and whether they match.
    ``split``: ``test`` for the items the reported metrics are computed on (every item with
    a fixed threshold), ``validation`` for those the threshold was chosen on. ``res``: the
    format's evaluation; ``val_fraction`` and ``seed``: its split (VisualProcessBench)."""
    tau = res["threshold"]
    test = set(split_by_problem(items, val_fraction, seed)[1]) if fmt == "visualprocessbench" else set()
    out = []
    for i, (it, sc, st) in enumerate(zip(items, scores, step_scores)):
        st = np.asarray(st, dtype=np.float64)
        r = {"id": it.id, "subset": subset_of(fmt, it)}
        if fmt == "processbench":
            r["split"] = "test" if f"{it.subset}/{it.id}" in res["predictions"] else "validation"
            r["problem"] = it.problem
        else:
            r["split"] = "test" if fmt == "prmbench" or i in test else "validation"
            r["question"] = it.question
        r.update(steps=it.steps, **sc.to_dict(), step_score=st.tolist(), threshold=tau)
        if fmt == "processbench":
            pred = predicted_first_error(st, tau)
            r.update(predicted_first_error=pred, label=it.label, match=pred == it.label)
        elif fmt == "prmbench":
            # 1-based step numbers, as the data gives them; a number outside the scored steps is never visited
            truth = sorted(e + 1 for e in it.error_steps)
            pred = [j + 1 for j, x in enumerate(st) if not x > tau]
            r.update(
                error_steps=truth,
                predicted_error_steps=pred,
                match=set(pred) == {e for e in truth if 1 <= e <= len(st)},
            )
        else:
            pred = [1 if x >= tau else -1 for x in st]
            r.update(
                labels=it.labels,
                predicted=pred,
                match=all(p == lab for p, lab in zip(pred, it.labels) if lab != 0),
            )
        out.append(r)
    return out


def threshold_curves(
    fmt: str, items: Sequence, step_scores: Sequence, labels: Sequence, res: dict, val_fraction: float, seed: int
) -> tuple[dict, dict, str]:
    """The benchmark's own metric against the threshold, for ``plots.metric_vs_threshold``:
    ``(curves, marks, ylabel)``, curves as label -> (thresholds, values, drawstyle), marks as
    label -> (threshold, value). The threshold used is marked on the curve it was chosen on
    (the validation part's, at its peak), or, when fixed, on the reported items' curve.
    ``labels``: ``step_labels``."""
    if fmt == "processbench":
        return _processbench_curves(items, step_scores, res)
    if fmt == "visualprocessbench":
        return _visualprocessbench_curves(items, step_scores, labels, res, val_fraction, seed)
    return _prmbench_curves(items, step_scores, labels, res)


def _grid(values, *extra) -> np.ndarray:
    """Every distinct score (where a metric of the threshold can change), the extra
    thresholds, and one point beyond each end."""
    v = np.unique(np.concatenate([np.asarray(values, dtype=np.float64), [x for x in extra if np.isfinite(x)]]))
    pad = 0.02 * ((v[-1] - v[0]) or 1.0)
    return np.concatenate([[v[0] - pad], v, [v[-1] + pad]])


def _processbench_curves(items, step_scores, res):
    """The average F1 against the threshold: on the validation part as it was maximised
    there (an F1 whose accuracies are both 0 as 0), and on the reported items as reported
    (undefined: a gap). A step is correct when its score is above the threshold, so each
    value holds from its threshold up to the next (``steps-post``)."""
    tau = res["threshold"]
    test = [i for i, it in enumerate(items) if f"{it.subset}/{it.id}" in res["predictions"]]
    val = sorted(set(range(len(items))) - set(test))
    grid = _grid(np.concatenate([np.asarray(s) for s in step_scores]), tau)
    curves = {}
    if val:
        f1 = average_f1_curve([items[i] for i in val], [step_scores[i] for i in val], grid, choosing=True)
        curves[f"validation part, {len(val)} items (chosen on; undefined F1 as 0)"] = (grid, f1, "steps-post")
    f1 = average_f1_curve([items[i] for i in test], [step_scores[i] for i in test], grid)
    gaps = "; gaps: undefined" if np.isnan(f1).any() else ""
    curves[f"{'test part' if val else 'all items'}, {len(test)} items (reported{gaps})"] = (grid, f1, "steps-post")
    avg = res["average_f1"]
    there = "n/a, undefined" if avg != avg else f"{avg:.1f}"
    if val:
        marks = {
            f"threshold {tau:.3f}: chosen here (max validation average F1)": (tau, res["val_average_f1"]),
            f"reported at that threshold ({there})": (tau, avg),
        }
    else:
        marks = {f"threshold {tau:g}: fixed, as reported ({there})": (tau, avg)}
    return curves, marks, "ProcessBench average F1 over subsets (%)"


def _visualprocessbench_curves(items, step_scores, labels, res, val_fraction, seed):
    """Step micro-F1 (the accuracy over both classes) against the threshold, on the
    validation part it was chosen on and on the test part. A step is correct when its score
    is at least the threshold, so each value holds up to its threshold (``steps-pre``)."""
    val, test = split_by_problem(items, val_fraction, seed)

    def part(idx):
        s = [np.asarray(step_scores[i], dtype=np.float64)[labels[i] != 0] for i in idx]
        lab = [labels[i][labels[i] != 0] == 1 for i in idx]
        return np.concatenate(s), np.concatenate(lab)

    (vs, vy), (ts, ty) = part(val), part(test)
    tau = res["threshold"]
    grid = _grid(np.concatenate([vs, ts]), tau)
    x_tau = tau if np.isfinite(tau) else grid[-1]  # above every score: nothing called correct

    def micro(s, y):
        good, bad = np.sort(s[y]), np.sort(s[~y])  # right: correct steps >= t, wrong steps < t
        right = len(good) - np.searchsorted(good, grid, "left") + np.searchsorted(bad, grid, "left")
        return right / max(len(s), 1)

    curves = {
        f"validation part, {len(vs)} steps (chosen on)": (grid, micro(vs, vy), "steps-pre"),
        f"test part, {len(ts)} steps (reported)": (grid, micro(ts, ty), "steps-pre"),
    }
    marks = {
        f"threshold {tau:.3f}: chosen here (max validation micro-F1)": (x_tau, res["val_f1"]),
        f"reported at that threshold ({res['overall_f1']:.3f})": (x_tau, res["overall_f1"]),
    }
    return curves, marks, "step micro-F1 (= step accuracy)"


def _prmbench_curves(items, step_scores, labels, res):
    """The overall PRMScore (pooled over the nine categories, as reported) against the
    threshold; a step is positive when its score is above it (``steps-post``)."""
    keep = [i for i, it in enumerate(items) if it.category != CORRECT]
    s = np.concatenate([np.asarray(step_scores[i], dtype=np.float64) for i in keep])
    pos = np.concatenate([labels[i] == 1 for i in keep])
    tau = res["threshold"]
    grid = _grid(s, tau)
    good, bad = np.sort(s[pos]), np.sort(s[~pos])
    tp = len(good) - np.searchsorted(good, grid, "right")  # correct steps above t
    fp = len(bad) - np.searchsorted(bad, grid, "right")  # wrong steps above t
    score = [100 * prmbench.prm_score(np.array([a, b, len(bad) - b, len(good) - a]), None) for a, b in zip(tp, fp)]
    curves = {f"all categories, {len(s)} steps (reported)": (grid, np.array(score), "steps-post")}
    there = 100 * res["overall"]["prm_score"]
    marks = {f"threshold {tau:g}: fixed, as reported ({there:.1f})": (tau, there)}
    return curves, marks, "PRMBench overall PRMScore (%)"
