"""Calibration on held-out Monte Carlo counts: does a PRM's belief predict K of N?

For every labelled step with counts ``K`` of ``N`` and the PRM's ``mu`` (and ``kappa``):

- **NLL of the counts** (nats per step, the binomial coefficient included, so the three are
  comparable): under the Beta-Binomial at ``(mu, kappa)`` (a BetaPRM), under the binomial at
  ``mu`` (what a point estimate claims: q = mu exactly), and under the binomial at one
  constant rate (the pooled ``sum K / sum N`` of these same counts: a baseline that knows the
  test set's base rate, so slightly optimistic).
- **ECE and Brier of mu against K/N**: ``bins`` equal-width bins of ``mu``, each weighted by its
  share of steps; Brier = mean (mu - K/N)^2. K/N is itself a noisy estimate of q, so
  neither reaches 0 even for a perfect PRM (``brier_constant`` gives the base-rate scale).
- **Predictive intervals of K**: the central ``level`` interval of the model's predictive
  distribution of K (Beta-Binomial for a BetaPRM, binomial at ``mu`` for a point estimate);
  coverage = share of steps whose K falls inside, width = mean (hi - lo) / N. A discrete
  central interval holds at least ``level`` of the mass, so a calibrated model covers at
  least ``level``.
- **sigma against error** (a BetaPRM): Spearman of sigma with |mu - K/N|, and the binned
  means the plot draws.

``evaluate_counts`` is the one implementation: ``betaprm eval-calibration`` and the
demo's held-out table both call it.
"""

from __future__ import annotations

import numpy as np

from .metrics import spearman
from .tables import markdown_table

LEVELS = (0.5, 0.9)


def _binomial_nll(k, n, p) -> np.ndarray:
    """-log Binomial(k; n, p), with the Gamma form of the coefficient (k may be fractional)."""
    from scipy.special import gammaln, xlog1py, xlogy

    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1) + xlogy(k, p) + xlog1py(n - k, -p))


def _interval(dist, level):
    tail = (1 - level) / 2
    return dist.ppf(tail), dist.ppf(1 - tail)


TABLE_MAX_N = 256
"""Largest N whose Beta-Binomial intervals come from a table of the whole distribution
(one vectorised pmf call) instead of scipy's per-step quantile search, which costs about
0.15 ms a step; larger or fractional N take the search."""


def beta_binomial_interval(n, a, b, level):
    """``_interval`` of ``betabinom(n, a, b)``: the smallest k whose CDF reaches each tail,
    from the pmf of every k at once (the same definition as scipy's ``ppf``)."""
    from scipy.stats import betabinom

    dist = betabinom(n, a, b)
    if len(n) == 0 or n.max() > TABLE_MAX_N or not np.array_equal(n, np.round(n)):
        return _interval(dist, level)
    tail = (1 - level) / 2
    grid = np.arange(int(n.max()) + 1)
    cdf = np.cumsum(betabinom.pmf(grid[None, :], n[:, None], a[:, None], b[:, None]), axis=1)

    def first(q):
        reached = cdf >= q
        return np.where(reached.any(axis=1), reached.argmax(axis=1), n).astype(np.float64)

    return first(tail), first(1 - tail)


def expected_calibration_error(mu, target, bins: int = 10) -> tuple[float, list[dict]]:
    """ECE of ``mu`` against ``target`` (K/N) over equal-width bins, and the bins
    (lower edge, count, mean mu, mean target) for the reliability diagram."""
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(mu, edges[1:-1]), 0, bins - 1)
    ece, table = 0.0, []
    for b in range(bins):
        m = which == b
        if m.any():
            ece += m.mean() * abs(mu[m].mean() - target[m].mean())
            table.append(
                {
                    "lo": float(edges[b]),
                    "n": int(m.sum()),
                    "mu": float(mu[m].mean()),
                    "k_over_n": float(target[m].mean()),
                }
            )
    return float(ece), table


def step_nll(mu, kappa, k, n, beta: bool) -> np.ndarray:
    """-log P(K | N) of each step under the model's predictive distribution: the
    Beta-Binomial at (mu, kappa) when ``beta``, else the binomial at mu (nats, the
    coefficient included: the ``nll`` of ``evaluate_counts``, step by step)."""
    mu, k, n = (np.asarray(x, dtype=np.float64) for x in (mu, k, n))
    if not beta:
        return _binomial_nll(k, n, mu)
    import torch

    from ..beta import beta_binomial_nll

    kappa = np.asarray(kappa, dtype=np.float64)
    return beta_binomial_nll(*(torch.tensor(x, dtype=torch.float64) for x in (mu, kappa, k, n))).numpy()


def evaluate_counts(mu, kappa, k, n, beta: bool, bins: int = 10, levels=LEVELS) -> dict:
    """The metrics of the module docstring for flat per-step arrays. ``beta``: the model
    gives a Beta belief (``kappa`` used); otherwise ``kappa`` is ignored. ``levels``: the
    intervals of K to report (each Beta-Binomial one costs a quantile search per step)."""
    from scipy.stats import binom

    mu, k, n = (np.asarray(x, dtype=np.float64) for x in (mu, k, n))
    rate = k / n
    pooled = float(k.sum() / n.sum())
    res: dict = {"n_steps": int(len(mu)), "constant_rate": pooled}
    nll = {
        "binomial_at_mu": float(_binomial_nll(k, n, mu).mean()),
        "constant": float(_binomial_nll(k, n, np.full_like(mu, pooled)).mean()),
    }
    ece, table = expected_calibration_error(mu, rate, bins)
    res.update(
        ece=ece,
        brier=float(((mu - rate) ** 2).mean()),
        brier_constant=float(((pooled - rate) ** 2).mean()),
        reliability_bins=table,
    )
    pb = binom(n, np.clip(mu, 0, 1))
    intervals = {}
    for level in levels:
        lo, hi = _interval(pb, level)
        intervals[f"binomial_at_mu_{level:g}"] = {
            "coverage": float(((k >= lo) & (k <= hi)).mean()),
            "width": float(((hi - lo) / n).mean()),
        }
    if beta:
        kappa = np.asarray(kappa, dtype=np.float64)
        nll["beta_binomial"] = float(step_nll(mu, kappa, k, n, beta=True).mean())
        # The same eps as the likelihood keeps both parameters positive at mu = 0 or 1.
        a, b = mu * kappa + 1e-6, (1 - mu) * kappa + 1e-6
        for level in levels:
            lo, hi = beta_binomial_interval(n, a, b, level)
            intervals[f"beta_binomial_{level:g}"] = {
                "coverage": float(((k >= lo) & (k <= hi)).mean()),
                "width": float(((hi - lo) / n).mean()),
            }
        sigma = np.sqrt(mu * (1 - mu) / (kappa + 1))
        err = np.abs(mu - rate)
        res["spearman_sigma_error"] = spearman(sigma, err) if len(mu) > 2 else float("nan")
        res["sigma_error_bins"] = _sigma_bins(sigma, err)
        res["kappa_median"] = float(np.median(kappa))
    res["nll"] = nll
    res["intervals"] = intervals
    return res


def _sigma_bins(sigma, err, bins: int = 10) -> list[dict]:
    """Steps in ``bins`` equal-count bins of sigma: mean sigma and mean |mu - K/N| per bin."""
    order = np.argsort(sigma, kind="stable")
    return [
        {"sigma": float(sigma[part].mean()), "abs_error": float(err[part].mean()), "n": int(len(part))}
        for part in np.array_split(order, min(bins, len(order)))
        if len(part)
    ]


def flat_counts(records, scores) -> tuple[np.ndarray, ...]:
    """Per-step (mu, kappa, K, N) of counts records and their ``StepScores``; a trace cut to
    the model's positions contributes its scored steps only."""
    mu, kappa, k, n = [], [], [], []
    for r, s in zip(records, scores):
        m = len(s.mu)
        steps_k = r["mc_correct"] if isinstance(r, dict) else r.mc_correct
        steps_n = r["mc_total"] if isinstance(r, dict) else r.mc_total
        steps_n = [steps_n] * len(steps_k) if isinstance(steps_n, (int, float)) else steps_n
        mu.append(s.mu)
        kappa.append(s.kappa)
        k.append(np.asarray(steps_k[:m], dtype=np.float64))
        n.append(np.asarray(steps_n[:m], dtype=np.float64))
    return tuple(np.concatenate(x) if x else np.zeros(0) for x in (mu, kappa, k, n))


def table(results: dict) -> str:
    """A markdown table of one or more models' results (name -> ``evaluate_counts`` output)."""
    names = list(results)

    def cell(name, get):
        try:
            v = get(results[name])
        except KeyError:
            return "-"
        return f"{v:.3f}"

    rows = [
        ["NLL of counts, Beta-Binomial (nats/step)", *[cell(m, lambda r: r["nll"]["beta_binomial"]) for m in names]],
        ["NLL of counts, binomial at mu", *[cell(m, lambda r: r["nll"]["binomial_at_mu"]) for m in names]],
        ["NLL of counts, constant rate", *[cell(m, lambda r: r["nll"]["constant"]) for m in names]],
        ["ECE of mu vs K/N", *[cell(m, lambda r: r["ece"]) for m in names]],
        [
            "Brier of mu vs K/N (constant)",
            *[f"{cell(m, lambda r: r['brier'])} ({results[m]['brier_constant']:.3f})" for m in names],
        ],
    ]
    for level in LEVELS:
        for kind, label in (("beta_binomial", "Beta-Binomial"), ("binomial_at_mu", "binomial at mu")):
            rows.append(
                [
                    f"{level:.0%} interval of K, {label}: coverage, width/N",
                    *[
                        (
                            f"{results[m]['intervals'][f'{kind}_{level:g}']['coverage']:.3f}, "
                            f"{results[m]['intervals'][f'{kind}_{level:g}']['width']:.3f}"
                        )
                        if f"{kind}_{level:g}" in results[m]["intervals"]
                        else "-"
                        for m in names
                    ],
                ]
            )
    rows.append(["Spearman(sigma, |mu - K/N|)", *[cell(m, lambda r: r["spearman_sigma_error"]) for m in names]])
    return markdown_table(rows, ["metric (held-out counts)", *names])
