"""The Best-of-N selectors by name: how each picks one candidate of a pool, its label, and
which setting it reads from the values tuned on validation problems (``tune_selectors``).
``betaprm demo``, ``betaprm eval-bon`` and ``betaprm aca --plots`` all pick through here.

A pool is the candidates' final answers, their correctness (True / False / None for a
check that failed) and, for the PRM-based selectors, one ``StepScores`` per candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .selection import PAPER_LAMBDAS, candidate_scores, majority_vote, select, tune, weighted_vote
from .types import StepScores

Pick = Callable[[Sequence, Sequence[StepScores], dict], "int | None"]


@dataclass(frozen=True)
class Selector:
    label: str
    pick: Pick | None  # None: the oracle (pass@N), which reads the outcomes instead
    needs_scores: bool = True
    tuned: str | None = None  # the key of the tuned values it reads


def _reliability_vote(answers, scores, tuned):
    # Votes weighted by S_lin (mu - lambda sigma, clipped at 0): sure candidates weigh more.
    return weighted_vote(answers, np.clip(candidate_scores(scores, "lin", tuned["reliability_vote"]), 0, None))


SELECTORS: dict[str, Selector] = {
    "single_pass": Selector("single pass (first candidate)", lambda a, s, t: 0, needs_scores=False),
    "majority_vote": Selector("majority vote", lambda a, s, t: majority_vote(a), needs_scores=False),
    "mean": Selector("top-1 mean mu", lambda a, s, t: select(s, "mean")),
    "min": Selector("top-1 min mu", lambda a, s, t: select(s, "min")),
    "last": Selector("top-1 last mu", lambda a, s, t: select(s, "last")),
    "prod": Selector("top-1 prod mu", lambda a, s, t: select(s, "prod")),
    "lin": Selector("top-1 S_lin", lambda a, s, t: select(s, "lin", t["lin"].lam), tuned="lin"),
    "rb": Selector("top-1 S_RB", lambda a, s, t: select(s, "rb", t["rb"].lam, t["rb"].tau), tuned="rb"),
    "weighted_vote": Selector("mu-weighted vote", lambda a, s, t: weighted_vote(a, candidate_scores(s, "mean"))),
    "last_weighted_vote": Selector(
        "last-mu-weighted vote", lambda a, s, t: weighted_vote(a, candidate_scores(s, "last"))
    ),
    "reliability_vote": Selector("reliability-weighted vote (S_lin)", _reliability_vote, tuned="reliability_vote"),
    "oracle": Selector("oracle pass@N", None, needs_scores=False),
}


def pick(name: str, answers: Sequence, scores: Sequence[StepScores] | None, tuned: dict) -> int | None:
    """The index ``name`` picks (None: no candidate, e.g. a vote with no stated answer)."""
    sel = SELECTORS[name]
    if sel.pick is None:
        raise ValueError(f"{name} does not pick a candidate: it reads the outcomes (use hit)")
    return sel.pick(answers, scores, tuned)


def hit(
    name: str, answers: Sequence, correct: Sequence, scores: Sequence[StepScores] | None, tuned: dict
) -> float | None:
    """1.0 / 0.0 for the candidate ``name`` picks; None when that candidate's check failed
    (left out of an accuracy, never counted as wrong). The oracle: any candidate right."""
    if SELECTORS[name].pick is None:
        return float(any(c is not None and bool(c) for c in correct))
    i = pick(name, answers, scores, tuned)
    if i is None:
        return 0.0
    return None if correct[i] is None else float(bool(correct[i]))


def tune_selectors(
    scores: Sequence[Sequence[StepScores]], answers: Sequence[Sequence], correct: Sequence[Sequence]
) -> dict:
    """The tuned values on validation pools: S_lin's lambda, S_RB's lambda and q (its sigma
    threshold tau), and the reliability vote's lambda. A failed check counts as wrong here."""
    corr = [[bool(c) for c in cs] for cs in correct]
    tuned = {"lin": tune(scores, corr, "lin"), "rb": tune(scores, corr, "rb")}
    best = None
    for lam in (0.0,) + PAPER_LAMBDAS:  # ties keep the first
        acc = np.mean(
            [
                bool(i is not None and cs[i])
                for s, a, cs in zip(scores, answers, corr)
                for i in [weighted_vote(a, np.clip(candidate_scores(s, "lin", lam), 0, None))]
            ]
        )
        if best is None or acc > best[1]:
            best = (lam, acc)
    tuned["reliability_vote"] = best[0]
    return tuned
