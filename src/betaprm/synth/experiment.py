"""The demo's experiment in the chain-arithmetic world: its splits, training records,
Best-of-N pools with the truth of every step, the Best-of-N rows and the exact Bayes
scorer (ACA and the frontiers on the test problems: ``synth.frontiers``).

Everything here is deterministic in the seed (``split_seeds``), so a later script (or
``betaprm aca --seed S``) rebuilds a run's exact test split.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from ..aca import Scorer
from ..selection import tune
from ..selectors import hit
from ..types import StepScores
from .policy import SynthPolicy, mc_label
from .world import World


class SplitSeeds(NamedTuple):
    """The seeds of one demo run's parts, all derived from its seed."""

    train_problems: int
    val_problems: int
    test_problems: int
    label_policy: int  # the policy whose continuations make K of N
    train_policy: int  # the error-boosted policy that writes the training traces
    pool_policy: int  # the policy that writes the validation and test pools
    aca_policy: int  # the policy ACA samples from on the test problems


def split_seeds(seed: int) -> SplitSeeds:
    s = seed * 7919  # a prime stride: the seeds of two runs never overlap
    return SplitSeeds(s + 1, s + 2, s + 3, s + 11, s + 12, s + 13, s + 21)


def tune_rb_on_world(world, scorer: Scorer, budget: int, seed: int, lam: float | None = None, n_val: int = 300):
    """S_RB's (lambda, tau) tuned on Best-of-``budget`` pools of the chain-arithmetic
    world's validation split, never on its test problems; returns ``selection.tune``'s
    ``TuneResult``. The validation problems and pool policy are those ``betaprm demo --seed
    SEED`` tunes on (``split_seeds``). ``lam`` fixes lambda (None: tuned with tau)."""
    seeds = split_seeds(seed)
    val = world.sample_problems(n_val, seeds.val_problems, "val")
    pol = SynthPolicy(world, seed=seeds.pool_policy)
    pools = [pol.sample_traces(p, budget) for p in val]
    flat = scorer([(p.question, t.steps) for p, ts in zip(val, pools) for t in ts])
    k = budget
    scored = [flat[i * k : (i + 1) * k] for i in range(len(val))]
    return tune(
        scored, [[t.correct for t in ts] for ts in pools], "rb", **({"lambdas": (lam,)} if lam is not None else {})
    )


class Belief(NamedTuple):
    """A belief over q at each step of a trace: mean and variance, and (the Bayes belief
    only) its central 90% interval."""

    mean: np.ndarray
    var: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None


@dataclass
class Pool:
    """One problem's Best-of-N candidates with the truth: whether each final answer is
    right, the true q of every step, the exact Bayes belief, and (even modulus) the belief
    of an observer whose step check sees only parity."""

    problem: object
    traces: list
    answers: list
    correct: np.ndarray
    q_true: list = field(default_factory=list)
    bayes: list[Belief] = field(default_factory=list)
    parity: list[Belief] = field(default_factory=list)


def sample_pools(world: World, policy: SynthPolicy, problems, n: int) -> list[Pool]:
    pools = []
    for p in problems:
        traces = policy.sample_traces(p, n)
        table = world.q_table(p)
        parity = (
            [Belief(*world.bayes_belief(p, t.values, table, check_mod=2)) for t in traces] if world.M % 2 == 0 else []
        )
        pools.append(
            Pool(
                p,
                traces,
                [t.final for t in traces],
                np.array([t.correct for t in traces]),
                [world.true_q(p, t.values, table) for t in traces],
                [Belief(*world.bayes_summary(p, t.values, 0.9, table)) for t in traces],
                parity,
            )
        )
    return pools


def training_traces(
    world: World, problems, seed: int, error_boost: float, traces_per_problem: int, near_miss: float | None = None
) -> list:
    """The PRMs' training traces: the policy with verifiable errors enriched by
    ``error_boost`` and, with ``near_miss``, another mix of error offsets. Their labels
    always come from the world's own policy (``label_records``), so K of N stays the truth."""
    train_world = world if near_miss is None else World(replace(world.cfg, near_miss=near_miss))
    boosted = SynthPolicy(train_world, seed=seed, error_boost=error_boost)
    return [t for p in problems for t in boosted.sample_traces(p, traces_per_problem)]


def label_records(world: World, label_policy: SynthPolicy, traces, mc_n: int, prefix: str) -> list[dict]:
    """Training records: each step labelled with K of ``mc_n`` continuations."""
    return [
        {
            "id": f"{prefix}{i}",
            "question": t.problem.question,
            "steps": t.steps,
            "mc_correct": mc_label(world, label_policy, t, mc_n),
            "mc_total": mc_n,
        }
        for i, t in enumerate(traces)
    ]


class DemoData(NamedTuple):
    train_traces: list
    train_records: list[dict]
    val_pools: list[Pool]
    test_pools: list[Pool]
    held_records: list[dict]  # the first candidate of each test pool, labelled: held-out counts


def demo_data(world: World, recipe, seed: int) -> DemoData:
    """The demo's data for ``seed`` and a recipe (``DemoConfig.effective()``)."""
    s = split_seeds(seed)
    train_p = world.sample_problems(recipe.n_train_problems, s.train_problems, "train")
    val_p = world.sample_problems(recipe.n_val_problems, s.val_problems, "val")
    test_p = world.sample_problems(recipe.n_test_problems, s.test_problems, "test")
    label_policy = SynthPolicy(world, seed=s.label_policy)
    train_traces = training_traces(
        world, train_p, s.train_policy, recipe.error_boost, recipe.traces_per_train_problem, recipe.train_near_miss
    )
    train_records = label_records(world, label_policy, train_traces, world.cfg.mc_n, "train")
    pool_policy = SynthPolicy(world, seed=s.pool_policy)
    val_pools = sample_pools(world, pool_policy, val_p, recipe.n_candidates)
    test_pools = sample_pools(world, pool_policy, test_p, recipe.n_candidates)
    held_records = label_records(world, label_policy, [p.traces[0] for p in test_pools], world.cfg.mc_n, "held")
    return DemoData(train_traces, train_records, val_pools, test_pools, held_records)


# The demo's Best-of-N rows, in table order: (key, scorer, selector in betaprm.selectors, label).
# Scorers: the two PRMs' scores, or the exact Bayes belief; None for those that need no scores.
BON_ROWS = (
    ("single_pass", None, "single_pass", "single pass"),
    ("majority_vote", None, "majority_vote", "majority vote"),
    ("standard_prm_mean", "standard_prm", "mean", "standard PRM, top-1 mean mu"),
    ("betaprm_mean", "betaprm", "mean", "BetaPRM, top-1 mean mu"),
    ("betaprm_rb", "betaprm", "rb", "BetaPRM, top-1 S_RB"),
    ("betaprm_lin", "betaprm", "lin", "BetaPRM, top-1 S_lin"),
    ("standard_prm_vote", "standard_prm", "weighted_vote", "standard PRM, weighted vote"),
    ("betaprm_vote", "betaprm", "weighted_vote", "BetaPRM, weighted vote"),
    ("betaprm_reliability_vote", "betaprm", "reliability_vote", "BetaPRM, reliability-weighted vote"),
    ("bayes_top1", "bayes", "last", "Bayes belief, top-1"),
    ("bayes_vote", "bayes", "last_weighted_vote", "Bayes belief, weighted vote"),
    ("oracle", None, "oracle", "oracle pass@n"),
)


def bayes_scores(pools: list[Pool]) -> list[list]:
    """The exact Bayes belief's means as ``StepScores`` (one list per pool), for selectors."""
    return [[StepScores(b.mean, np.ones_like(b.mean), None) for b in pool.bayes] for pool in pools]


def bon_hits(pools: list[Pool], scores: dict, tuned: dict, n: int | None = None) -> dict[str, np.ndarray]:
    """Per-problem hits (0/1) of every row of ``BON_ROWS`` on pools cut to their first ``n``
    candidates; ``scores``: per scorer name, one list of ``StepScores`` per pool (the Bayes
    rows read ``scores["bayes"]``, made by ``bayes_scores`` when absent)."""
    if "bayes" not in scores:
        scores = {**scores, "bayes": bayes_scores(pools)}
    out = {key: [] for key, *_ in BON_ROWS}
    for i, pool in enumerate(pools):
        k = n or len(pool.traces)
        by = {name: sc[i][:k] for name, sc in scores.items()}
        for key, scorer, selector, _ in BON_ROWS:
            out[key].append(hit(selector, pool.answers[:k], pool.correct[:k], by.get(scorer), tuned))
    return {k: np.array(v) for k, v in out.items()}


class BayesScorer:
    """Scores chain-arithmetic traces (whole or partial) with the exact Bayes belief: mu =
    posterior mean of q_t, kappa = the moment-matched kappa*; the scorer of an ideal PRM,
    for ACA and search. Counts the traces it is asked to score."""

    def __init__(self, world: World, problems):
        self.world = world
        self.by_q = {p.question: p for p in problems}
        self.n_scored = 0

    def __call__(self, traces):
        out = []
        for q, steps in traces:
            p = self.by_q[q]
            m, v = self.world.bayes_belief(p, self.world.values_of(p, steps))
            m = np.clip(m, 1e-4, 1 - 1e-4)
            k = np.clip(m * (1 - m) / np.maximum(v, 1e-9) - 1, 1e-3, 1e6)
            out.append(StepScores.from_mu_kappa(m, k))
        self.n_scored += len(traces)
        return out
