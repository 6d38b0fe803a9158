"""Choosing one candidate from a pool of scored traces (pure numpy).

A *pool* is a sequence of ``StepScores``, one per candidate of one problem. Candidate
scores (``candidate_scores``):

=========  ==========================================================  ================
method     score of a candidate with steps t = 1..T                     parameters
=========  ==========================================================  ================
``mean``   mean_t mu_t (the standard PRM's ranking)
``min``    min_t mu_t
``last``   mu_T
``prod``   prod_t mu_t
``lin``    S_lin = mean_t (mu_t - lam * sigma_t)                        ``lam``
``rb``     S_RB  = mean_t mu_t - lam * mean_t 1[sigma_t > tau]          ``lam``, ``tau``
=========  ==========================================================  ================

``select`` takes the argmax, ties going to the lowest index. Votes over final answers
(``majority_vote``, ``weighted_vote``) return the index of a representative candidate
of the winning answer. ``tune`` picks hyperparameters on a *validation* split from the
paper's grid (lambda in {0.2, 0.5, 0.7, 1.0, 1.5}; tau at the q-th percentile of step
sigma, q in {0.7, 0.8, 0.9}); the tau it returns comes from the validation population.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .types import StepScores

__all__ = [
    "METHODS",
    "PAPER_LAMBDAS",
    "PAPER_QS",
    "TuneResult",
    "candidate_scores",
    "majority_vote",
    "method_problems",
    "select",
    "sigma_threshold",
    "tune",
    "weighted_vote",
]

PAPER_LAMBDAS = (0.2, 0.5, 0.7, 1.0, 1.5)
PAPER_QS = (0.7, 0.8, 0.9)
METHODS = ("mean", "min", "last", "prod", "lin", "rb")


def method_problems(method: str, tau: float | None, flag: str, tau_flag: str = "--tau") -> list[str]:
    """What is wrong with selecting by ``method`` (given as ``flag``): a name outside
    ``METHODS``, or S_RB (``rb``) without its sigma threshold ``tau``; empty when fine."""
    if method not in METHODS:
        return [f"{flag} must be one of {', '.join(METHODS)}, got {method!r}"]
    if method == "rb" and tau is None:
        return [f"{flag} rb needs {tau_flag} (S_RB's sigma threshold)"]
    return []


def _one(s: StepScores, method: str, lam: float, tau: float | None) -> float:
    mu, sigma = s.mu, s.sigma
    if len(mu) == 0:
        raise ValueError("a candidate with no steps cannot be scored")
    if method == "mean":
        return float(mu.mean())
    if method == "min":
        return float(mu.min())
    if method == "last":
        return float(mu[-1])
    if method == "prod":
        return float(np.prod(mu))
    if method == "lin":
        return float((mu - lam * sigma).mean())
    if method == "rb":
        if tau is None:
            raise ValueError("method 'rb' needs tau (see sigma_threshold)")
        return float(mu.mean() - lam * (sigma > tau).mean())
    raise ValueError(f"unknown selection method {method!r}; choose from {', '.join(METHODS)}")


def candidate_scores(
    pool: Sequence[StepScores], method: str = "mean", lam: float = 0.5, tau: float | None = None
) -> np.ndarray:
    """One score per candidate of ``pool`` (higher is better); shape (len(pool),)."""
    return np.array([_one(s, method, lam, tau) for s in pool], dtype=np.float64)


def select(pool: Sequence[StepScores], method: str = "mean", lam: float = 0.5, tau: float | None = None) -> int:
    """Index of the best candidate by ``method`` (ties: the lowest index)."""
    if len(pool) == 0:
        raise ValueError("cannot select from an empty pool")
    return int(np.argmax(candidate_scores(pool, method, lam, tau)))


def sigma_threshold(pools: Sequence[Sequence[StepScores]], q: float) -> float:
    """The q-th quantile (q in [0, 1]) of every step sigma in ``pools``: S_RB's tau."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q is a fraction in [0, 1], got {q}")
    sigmas = [s.sigma for pool in pools for s in pool]
    if not sigmas:
        raise ValueError("no step sigmas to take a percentile of")
    return float(np.quantile(np.concatenate(sigmas), q))


def _vote(answers: Sequence[Hashable | None], weights: Sequence[float]) -> int | None:
    totals: dict = {}
    first: dict = {}
    best_member: dict = {}
    for i, (a, w) in enumerate(zip(answers, weights)):
        if a is None:  # no parsable answer: abstains
            continue
        totals[a] = totals.get(a, 0.0) + float(w)
        first.setdefault(a, i)
        if a not in best_member or w > weights[best_member[a]]:
            best_member[a] = i
    if not totals:
        return None
    # Ties between answers go to the answer that appeared first in the pool.
    winner = max(totals, key=lambda a: (totals[a], -first[a]))
    return best_member[winner]


def majority_vote(answers: Sequence[Hashable | None]) -> int | None:
    """Index of the first candidate carrying the most frequent final answer.

    ``None`` answers abstain; returns ``None`` when no candidate has an answer. Ties
    between answers go to the one that appears first.
    """
    return _vote(answers, [1.0] * len(answers))


def weighted_vote(answers: Sequence[Hashable | None], weights: Sequence[float]) -> int | None:
    """Index of the highest-weighted candidate of the answer with the largest total
    weight (a PRM-weighted vote when ``weights`` are candidate scores, e.g. mean mu)."""
    if len(answers) != len(weights):
        raise ValueError(f"{len(answers)} answers but {len(weights)} weights")
    return _vote(answers, list(weights))


@dataclass(frozen=True)
class TuneResult:
    """Hyperparameters chosen on validation, with the validation top-1 accuracy."""

    method: str
    lam: float
    q: float | None
    tau: float | None
    val_accuracy: float

    def select(self, pool: Sequence[StepScores]) -> int:
        return select(pool, self.method, self.lam, self.tau)


def _accuracy(pools, correct, method, lam, tau) -> float:
    hits = [bool(c[select(p, method, lam, tau)]) for p, c in zip(pools, correct)]
    return float(np.mean(hits))


def tune(
    pools: Sequence[Sequence[StepScores]],
    correct: Sequence[Sequence[bool]],
    method: str = "rb",
    lambdas: Sequence[float] = PAPER_LAMBDAS,
    qs: Sequence[float] = PAPER_QS,
) -> TuneResult:
    """Grid-search ``lam`` (and ``q`` for ``rb``) for top-1 accuracy on validation pools.

    ``correct[i][j]``: whether candidate j of problem i is right. Ties between grid
    points go to the first in grid order (lambda-major), so the result is deterministic.
    """
    if len(pools) == 0 or len(pools) != len(correct):
        raise ValueError(f"need matching, non-empty pools and correct lists, got {len(pools)} and {len(correct)}")
    for i, (p, c) in enumerate(zip(pools, correct)):
        if len(p) != len(c):
            raise ValueError(f"problem {i}: {len(p)} scored candidates but {len(c)} correctness labels")
    if method == "rb":
        grid = [(lam, q, sigma_threshold(pools, q)) for lam in lambdas for q in qs]
    elif method == "lin":
        grid = [(lam, None, None) for lam in lambdas]
    elif method in METHODS:
        grid = [(0.0, None, None)]
    else:
        raise ValueError(f"unknown selection method {method!r}; choose from {', '.join(METHODS)}")
    best = None
    for lam, q, tau in grid:
        acc = _accuracy(pools, correct, method, lam, tau)
        if best is None or acc > best.val_accuracy:
            best = TuneResult(method, lam, q, tau, acc)
    return best
