"""What the demo's PRMs learned, measured against the world's truth: calibration of mu
and kappa against the exact Bayes belief and the true q, and where mu catches (or misses)
the first error of a trace, split by the parity of the error."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..beta import beta_binomial_nll
from ..evaluation.metrics import auroc, spearman, within_problem_auroc


def kappa_star(mean: np.ndarray, var: np.ndarray, settled: float = 1e6) -> np.ndarray:
    """The concentration of the Beta with a belief's own mean and variance:
    ``mean (1 - mean) / var - 1``; ``settled`` where the belief is certain (var 0)."""
    return np.where(var > 1e-12, mean * (1 - mean) / np.maximum(var, 1e-12) - 1, settled)


class StepArrays(NamedTuple):
    """Per step of every test candidate, flattened: a PRM's mu and kappa, the true q, and the
    Bayes belief's mean and variance."""

    mu: np.ndarray
    q: np.ndarray
    kappa: np.ndarray
    bayes_mean: np.ndarray
    bayes_var: np.ndarray


def calibration(pools, scores, held_records, held_scores, beta: bool):
    from scipy.stats import beta as beta_dist
    from scipy.stats import binom

    mu = np.concatenate([s.mu for sc in scores for s in sc])
    kappa = np.concatenate([s.kappa for sc in scores for s in sc])
    sigma = np.concatenate([s.sigma for sc in scores for s in sc])
    q = np.concatenate([qq for p in pools for qq in p.q_true])
    bm = np.concatenate([b.mean for p in pools for b in p.bayes])
    bv = np.concatenate([b.var for p in pools for b in p.bayes])
    blo = np.concatenate([b.lo for p in pools for b in p.bayes])
    bhi = np.concatenate([b.hi for p in pools for b in p.bayes])
    k = np.concatenate([r["mc_correct"] for r in held_records]).astype(float)
    n = np.concatenate([[r["mc_total"]] * len(r["steps"]) for r in held_records]).astype(float)
    hmu = np.concatenate([s.mu for s in held_scores])
    hkappa = np.concatenate([s.kappa for s in held_scores])
    res = {"mu_mae_bayes": float(np.abs(mu - bm).mean()), "mu_mae_true": float(np.abs(mu - q).mean())}
    if pools[0].parity:  # against the best belief of an observer whose step check sees only parity
        pm = np.concatenate([m.mean for p in pools for m in p.parity])
        pv = np.concatenate([m.var for p in pools for m in p.parity])
        res["mu_mae_parity_check"] = float(np.abs(mu - pm).mean())
    if beta:
        import torch

        res["bb_nll"] = float(
            beta_binomial_nll(
                torch.tensor(hmu, dtype=torch.float64),
                torch.tensor(hkappa, dtype=torch.float64),
                torch.tensor(k),
                torch.tensor(n),
            ).mean()
        )
        unsettled = bv > 1e-12  # settled: the Bayes belief is certain, kappa* infinite
        kstar = kappa_star(bm, bv)
        res["spearman_kappa_bayes"] = spearman(kappa, kstar)
        # Settled steps have counts all 0 or all N, which favour a *small* kappa unless mu is
        # exactly 0 or 1: the same rank correlation without them, and their share.
        res["spearman_kappa_bayes_unsettled"] = spearman(kappa[unsettled], kstar[unsettled])
        res["share_settled"] = float(1 - unsettled.mean())
        res["spearman_sigma_bayes_std"] = spearman(sigma, np.sqrt(bv))
        if pools[0].parity:
            res["spearman_kappa_parity_check"] = spearman(kappa, kappa_star(pm, pv))
        # kappa is fitted to how far the counts fall from this model's own mu, so it should
        # track the model's own error, which includes its bias against the Bayes mean.
        res["spearman_sigma_own_error"] = spearman(sigma, np.abs(mu - q))
        a, b = mu * kappa + 1e-6, (1 - mu) * kappa + 1e-6
        lo, hi = beta_dist.ppf(0.05, a, b), beta_dist.ppf(0.95, a, b)
        tol = 1e-6  # q is exactly 0 or 1 once the outcome is settled; a Beta puts no mass there
        res["coverage90"] = float(np.mean((q >= lo - tol) & (q <= hi + tol)))
        res["width90"] = float(np.mean(hi - lo))
        res["bayes_coverage90"] = float(np.mean((q >= blo - tol) & (q <= bhi + tol)))
        res["bayes_width90"] = float(np.mean(bhi - blo))
        # The best any Beta can do: the Beta with the Bayes belief's own mean and variance
        # (kappa*; a point at the mean where the belief is certain). The belief over q is
        # discrete, a Beta is not, so a perfect BetaPRM's interval is this one, not Bayes's.
        sa, sb = np.maximum(bm * kstar, 1e-6), np.maximum((1 - bm) * kstar, 1e-6)
        slo = np.where(unsettled, beta_dist.ppf(0.05, sa, sb), bm)
        shi = np.where(unsettled, beta_dist.ppf(0.95, sa, sb), bm)
        res["bayes_beta_coverage90"] = float(np.mean((q >= slo - tol) & (q <= shi + tol)))
        res["bayes_beta_width90"] = float(np.mean(shi - slo))
        res["kappa_median"] = float(np.median(kappa))
    else:
        # A point estimate claims q = mu exactly: its likelihood of the counts is binomial.
        res["bb_nll"] = float(-binom.logpmf(k, n, np.clip(hmu, 1e-6, 1 - 1e-6)).mean())
    return res, StepArrays(mu, q, kappa, bm, bv)


def step_diagnostics(pools, scores):
    """Where a PRM's mu goes wrong, from the truth of each step.

    ``first_error_auroc``: at verifiable steps k >= 1 whose prefix is error-free, the AUROC
    of the drop in logit mu from step k-1 to k for erroneous against correct steps (does the
    step score catch the first error; the Bayes belief catches nearly all).
    ``first_error_auroc_odd`` / ``_even`` (even modulus only): the same, erroneous steps
    split by the parity of their error offset against all correct steps. An odd offset
    changes the parity of the result, an even one keeps it: a PRM that checks only the
    parity (the mod-2 half of arithmetic mod 10) catches the first and misses the second.
    ``clean_bias_by_step``: mean of mu - Bayes mean at step k on error-free prefixes, per k
    (a PRM that checks each step but trusts long traces less than it should drifts down).
    ``scores`` is per pool a list of per-trace mu arrays."""
    drops, offs, bias = [], [], {}
    for pool, sc in zip(pools, scores):
        for tr, mu, bayes in zip(pool.traces, sc, pool.bayes):
            logit = np.log(np.clip(mu, 1e-6, 1 - 1e-6)) - np.log(np.clip(1 - mu, 1e-6, 1 - 1e-6))
            for k, off, verifiable in clean_prefix_steps(pool.problem, tr.values):
                if verifiable and k >= 1:
                    drops.append(logit[k - 1] - logit[k])
                    offs.append(off)
                if off == 0:
                    bias.setdefault(k + 1, []).append(mu[k] - bayes.mean[k])
    out = {
        "first_error_auroc": auroc(drops, np.array(offs) > 0),
        "clean_bias_by_step": [float(np.mean(bias[k])) for k in sorted(bias)],
    }
    # Parity splits arithmetic mod an even modulus only; each kind is reported where it occurred.
    if pools and pools[0].problem.modulus % 2 == 0:
        out.update({f"first_error_auroc_{k}": v for k, v in parity_split_auroc(drops, offs).items()})
    return out


def clean_prefix_steps(problem, values):
    """``(k, offset, verifiable)`` for each step of a trace's written ``values`` up to and
    including its first error (offset != 0); the offset is the written result minus the
    correct result of the step applied to the written value before it."""
    prev = problem.start
    for k in range(problem.T):
        off = (values[k] - problem.apply(k, prev)) % problem.modulus
        yield k, off, problem.ops[k][0] != "?"
        if off:
            return  # the prefix is no longer error-free
        prev = values[k]


def error_kinds(problem, values) -> tuple[int | None, bool]:
    """``(first, recall)`` of a trace's written ``values``: the first op step whose
    verifiable result is wrong (None if none is) and whether any recall step is wrong (no
    step check can see those). A step is wrong when its result differs from the step
    applied to the written value before it."""
    prev, first, recall = problem.start, None, False
    for k, v in enumerate(values):
        if v != problem.apply(k, prev):
            if problem.ops[k][0] == "?":
                recall = True
            elif first is None:
                first = k
        prev = v
    return first, recall


def parity_split_auroc(scores, offsets) -> dict:
    """AUROC of ``scores`` (higher = more suspect) for erroneous against correct steps, with
    the erroneous ones split by the parity of their offset: ``{"odd": .., "even": ..}``, each
    only where that kind of error and correct steps both occur."""
    scores, offs = np.asarray(scores, dtype=float), np.asarray(offsets)
    out = {}
    for name, keep in (("odd", offs % 2 == 1), ("even", (offs % 2 == 0) & (offs > 0))):
        sel = keep | (offs == 0)
        if keep.any() and (offs == 0).any():
            out[name] = auroc(scores[sel], offs[sel] > 0)
    return out


def verification(test_scores: dict, test_pools, labels):
    """Within-problem AUROC of the final-step mu, and first-error AUROC (all, and split by
    the parity of the error) for each PRM, the Bayes belief and the parity-check observer."""
    verification = {
        f"{name}_auroc": within_problem_auroc([[s.mu[-1] for s in pool] for pool in test_scores[name]], labels)
        for name in test_scores
    }
    verification["bayes_auroc"] = within_problem_auroc([[b.mean[-1] for b in p.bayes] for p in test_pools], labels)
    steps = {
        name: step_diagnostics(test_pools, [[s.mu for s in pool] for pool in test_scores[name]])
        for name in test_scores
    }
    steps["bayes"] = step_diagnostics(test_pools, [[b.mean for b in p.bayes] for p in test_pools])
    if test_pools[0].parity:
        steps["parity_check"] = step_diagnostics(test_pools, [[m.mean for m in p.parity] for p in test_pools])
    for name, d in steps.items():
        verification.update({f"{name}_{k}": v for k, v in d.items() if k.startswith("first_error_auroc")})
    if test_pools[0].parity:
        # The ceiling of a parity-only step check: the best belief of an observer who sees
        # each verifiable step's error only modulo 2.
        verification["parity_check_auroc"] = within_problem_auroc(
            [[m.mean[-1] for m in p.parity] for p in test_pools], labels
        )
        verification["parity_check_mu_mae_bayes"] = float(
            np.abs(
                np.concatenate([m.mean for p in test_pools for m in p.parity])
                - np.concatenate([b.mean for p in test_pools for b in p.bayes])
            ).mean()
        )
    return verification, {name: d["clean_bias_by_step"] for name, d in steps.items() if name in test_scores}


def value_prior(test_pools, test_scores: dict, val_pools) -> dict:
    """Does a PRM judge the final value instead of the steps? A shortcut that needs no
    verification: in the chain world some final values are right more often than others
    (products mod 10 skew even and to 0; a +-1 error flips the parity), so ``P(correct |
    final value)`` alone separates right from wrong answers a little across problems, and
    misleads within one, where the right answer is fixed.

    ``prior``: that probability per final value, from the validation pools (never the test
    split); ``prior_auroc``: its within-problem AUROC on the test pools. Per scorer (test
    scores, plus the Bayes belief): ``pick_lift``, the share of its top-1 picks (by final-step
    mu) with each final value over that value's share among the candidates (1: no preference);
    ``top1_accuracy``; ``spearman_prior``, the rank correlation of its final-step mu with
    the prior over all test candidates (near 0 for a PRM that verifies, whatever the values)."""
    M = test_pools[0].problem.modulus
    right, seen = np.zeros(M), np.zeros(M)
    for p in val_pools:
        for a, c in zip(p.answers, p.correct):
            if a is not None:
                right[a] += c
                seen[a] += 1
    prior = right / np.maximum(seen, 1)
    answers = [[a if a is not None else 0 for a in p.answers] for p in test_pools]
    labels = [p.correct for p in test_pools]
    candidates = np.bincount([a for row in answers for a in row], minlength=M) / sum(map(len, answers))
    out = {
        "prior": prior.round(4).tolist(),
        "candidate_share": candidates.round(4).tolist(),
        "prior_auroc": within_problem_auroc([prior[row] for row in answers], labels),
    }
    finals = {name: [[s.mu[-1] for s in pool] for pool in sc] for name, sc in test_scores.items()}
    finals["bayes"] = [[b.mean[-1] for b in p.bayes] for p in test_pools]
    for name, mu in finals.items():
        picks = [int(np.argmax(m)) for m in mu]
        share = np.bincount([row[i] for row, i in zip(answers, picks)], minlength=M) / len(picks)
        out[name] = {
            "pick_lift": (share / np.maximum(candidates, 1e-12)).round(3).tolist(),
            "top1_accuracy": float(np.mean([lab[i] for lab, i in zip(labels, picks)])),
            "spearman_prior": spearman(
                np.concatenate([np.asarray(m) for m in mu]), np.concatenate([prior[row] for row in answers])
            ),
        }
    return out
