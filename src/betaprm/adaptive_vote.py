"""Stopping on answers: when a pool's vote is settled enough to stop sampling.

ACA's paper rule stops on one candidate (its lower bound above every rival's upper bound);
these rules stop on the *vote* over final answers, as Adaptive-Consistency, Early-Stopping
Self-Consistency and DeepConf do, with each candidate's vote weighted by its PRM belief
(docs/aca.md derives the posterior):

- ``vote_weights``: a candidate's weight ``w = max(0, S_lin) = max(0, mean_t(mu_t - lam
  sigma_t))`` and its spread ``u = mean_t sigma_t`` (the same score and uncertainty ACA's
  bounds use), or 1 and 0 for an unweighted vote;
- ``leader_stays``: the posterior probability that the answer leading the weighted vote is
  still leading when the budget is spent, by Monte Carlo over the weights' uncertainty, the
  answer distribution (a Dirichlet over the weighted counts) and the draws still to come;
  with an unbounded horizon, Adaptive-Consistency's Beta rule on the weighted totals (their
  rule exactly when the weights are 1);
- ``window_agrees``: ESC's rule, the last window of samples all give one answer;
- ``consensus``: DeepConf's rule, the leader's share of the (filtered) weighted vote;
- ``kept``: DeepConf's filter, the top fraction of the votes by weight;
- ``prune_level`` and ``prune_step``: a candidate stopped while it is written, at the first
  step whose upper bound ``mu_t + c sigma_t`` falls below a level learned on the first batch.

Pure numpy, no model: the numbers come from ``StepScores``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .types import StepScores

__all__ = ["consensus", "kept", "leader_stays", "prune_level", "prune_step", "vote_weights", "window_agrees"]


def vote_weights(pool: Sequence[StepScores], lam: float, weighted: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(w, u)``: each candidate's vote weight ``max(0, mean(mu - lam sigma))`` and the
    spread of that weight, ``mean(sigma)``; unweighted: ones and zeros."""
    if not weighted:
        return np.ones(len(pool)), np.zeros(len(pool))
    w = np.array([max(0.0, float(np.mean(s.mu - lam * s.sigma))) for s in pool])
    u = np.array([float(np.mean(s.sigma)) for s in pool])
    return w, u


def _groups(answers: Sequence[Hashable | None]) -> tuple[list, np.ndarray]:
    """The distinct answers (None abstains) in order of first appearance, and each
    candidate's group index (-1: abstains)."""
    order: dict = {}
    idx = np.full(len(answers), -1)
    for i, a in enumerate(answers):
        if a is not None:
            idx[i] = order.setdefault(a, len(order))
    return list(order), idx


def leader_stays(
    answers: Sequence[Hashable | None],
    w: np.ndarray,
    u: np.ndarray,
    remaining: int | None,
    rng: np.random.Generator,
    alpha0: float = 1.0,
    n_sims: int = 500,
) -> tuple[float, Hashable | None]:
    """``(probability, leader)``: the posterior probability that the answer with the largest
    total weight now is still the largest after ``remaining`` more samples; None: an
    unbounded horizon, Adaptive-Consistency's question instead (is the leader's share of
    the answer distribution above the runner-up's).

    Each of ``n_sims`` simulations draws every candidate's weight from ``N(w, u)`` clipped at
    0 (so ``u``, the PRM's uncertainty, is how far a vote may be off). With ``remaining``
    draws to come, the answer distribution is drawn from ``Dirichlet(alpha0 + weighted
    counts)`` over the answers seen plus one bucket for an answer not yet seen, then the
    draws' answers from it, each carrying the simulation's mean weight (all draws of the new
    bucket count as one answer: the most a new answer could gather). With an unbounded
    horizon the probability is Adaptive-Consistency's Beta rule on the two leading weighted
    totals ``a`` and ``b``: ``P(x > 1/2)`` for ``x ~ Beta(a + 1, b + 1)``, averaged over the
    weight draws; with weights 1 and spreads 0 it is their rule exactly."""
    names, idx = _groups(answers)
    if not names:
        return 0.0, None
    k = len(names)
    onehot = np.zeros((len(answers), k))
    voted = idx >= 0
    onehot[np.flatnonzero(voted), idx[voted]] = 1.0
    totals = w @ onehot
    first = np.array([int(np.flatnonzero(idx == j)[0]) for j in range(k)])
    leader = int(max(range(k), key=lambda j: (totals[j], -first[j])))  # ties: the first seen, as the vote
    if remaining == 0:
        return 1.0, names[leader]
    spread = u[voted].any()
    draws = rng.standard_normal((n_sims if spread else 1, int(voted.sum())))
    ws = np.clip(w[voted][None, :] + u[voted][None, :] * draws, 0, None)
    sims = ws @ onehot[voted]  # (sims, k): each simulation's weighted totals
    others = np.delete(sims, leader, axis=1).max(axis=1) if k > 1 else np.zeros(len(sims))
    if remaining is None:
        from scipy.special import betainc  # scipy: loaded when an unbounded-horizon rule runs

        return float(np.mean(1.0 - betainc(sims[:, leader] + 1.0, others + 1.0, 0.5))), names[leader]
    if len(sims) == 1:
        sims, ws = np.repeat(sims, n_sims, axis=0), np.repeat(ws, n_sims, axis=0)
    mean_w = ws.mean(axis=1, keepdims=True)
    p = _dirichlet(rng, np.concatenate([alpha0 + sims, np.full((n_sims, 1), alpha0)], axis=1))
    future = rng.multinomial(remaining, p)  # one row of draws per simulation
    final = np.concatenate([sims, np.zeros((n_sims, 1))], axis=1) + mean_w * future
    others = np.delete(final, leader, axis=1).max(axis=1)
    return float(np.mean(final[:, leader] > others)), names[leader]


def _dirichlet(rng: np.random.Generator, alpha: np.ndarray) -> np.ndarray:
    """One Dirichlet draw per row of ``alpha`` (row-wise parameters, all > 0)."""
    g = rng.standard_gamma(alpha)
    return g / g.sum(axis=1, keepdims=True)


def window_agrees(answers: Sequence[Hashable | None], window: int) -> bool:
    """ESC's rule: the last ``window`` samples all give one (stated) answer."""
    last = list(answers)[-window:]
    return len(last) == window and last[0] is not None and all(a == last[0] for a in last)


def kept(w: np.ndarray, keep: float) -> np.ndarray:
    """DeepConf's filter: a mask of the ``keep`` fraction of votes with the largest weights
    (at least one; ties at the cut kept)."""
    if keep >= 1 or len(w) == 0:
        return np.ones(len(w), dtype=bool)
    n = max(1, int(np.ceil(keep * len(w))))
    cut = np.sort(w)[::-1][n - 1]
    return w >= cut


def consensus(answers: Sequence[Hashable | None], w: np.ndarray) -> float:
    """The leading answer's share of the total weight of the stated answers (0: none)."""
    names, idx = _groups(answers)
    if not names:
        return 0.0
    totals = np.array([w[idx == j].sum() for j in range(len(names))])
    return float(totals.max() / totals.sum()) if totals.sum() > 0 else 0.0


def _ucb(s: StepScores, c: float) -> np.ndarray:
    return s.mu + c * s.sigma


def prune_level(first_batch: Sequence[StepScores], c: float, q: float) -> float:
    """The level a written prefix's upper bound must stay above: the ``q`` quantile of the
    first batch's lowest upper bounds ``min_t (mu_t + c sigma_t)`` (DeepConf's warm-up
    threshold, on the PRM's per-step belief)."""
    lows = [float(_ucb(s, c).min()) for s in first_batch if len(s.mu)]
    return float(np.quantile(lows, q)) if lows else -np.inf


def prune_step(s: StepScores, c: float, level: float, first: int = 0) -> int | None:
    """The step (index) at which a candidate written step by step would have been stopped:
    the first step from ``first`` on, before its answer step, whose upper bound is below
    ``level``; None: it runs to its answer."""
    ucb = _ucb(s, c)
    for t in range(first, len(ucb) - 1):
        if ucb[t] < level:
            return t
    return None
