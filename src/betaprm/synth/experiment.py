"""The demo's experiment in the chain-arithmetic world: its splits, training records,
Best-of-N pools with the truth of every step, and the ACA table on the test problems.

Everything here is deterministic in the seed (``split_seeds``), so a later script (or
``betaprm aca --seed S``) rebuilds a run's exact test split.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..aca import ACAConfig, Scorer, run_aca, summarize
from ..evaluation.metrics import bootstrap_ci
from ..selection import candidate_scores, tune
from ..selectors import hit
from ..types import StepScores
from .policy import SynthPolicy, mc_label, synth_answer, synth_is_correct, synth_tasks
from .processes import exit_with_parent
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


class CachedScorer:
    """A scorer that scores each distinct trace once: ACA's variants on one PRM share
    their first rounds (the same seeded requests give the same candidates) and the
    no-early-stop variant's rounds hold the early-stopping one's, so the second variant
    is mostly read back. The scores are those of the wrapped scorer."""

    def __init__(self, scorer):
        self.scorer = scorer
        self.cache: dict = {}

    def __call__(self, traces):
        keys = [(t[0], tuple(t[1])) for t in traces]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if todo:
            self.cache.update(zip(todo, self.scorer([(q, list(steps)) for q, steps in todo])))
        return [self.cache[k] for k in keys]


def _aca_variants(world: World, problems, prm, acfgs, tokenizer, seed: int) -> list[list[dict]]:
    """ACA variants' records on ``problems``, one list per config in ``acfgs``, all on one
    PRM through one ``CachedScorer``. Each variant draws from its own policy from the
    run's ACA seed, so its records do not depend on which variants ran before it or where."""
    from ..scoring import PRMScorer  # torch: this module stays torch-free for the CLI (split_seeds)

    def count(text):
        return len(tokenizer.encode(text, add_special_tokens=False))

    scorer = CachedScorer(PRMScorer(prm, 64))
    return [
        run_aca(
            synth_tasks(problems),
            SynthPolicy(world, seed=split_seeds(seed).aca_policy, count_tokens=count),
            scorer,
            acfg,
            synth_answer,
            synth_is_correct,
            progress=False,
        )
        for acfg in acfgs
    ]


def _aca_variants_job(world_cfg, problems, prm_dir: str, acfgs, tokenizer_dir: str, seed: int, threads: int):
    """``_aca_variants`` in a worker process with ``threads`` torch threads, the PRM and the
    tokenizer loaded from the run's folder."""
    import torch
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    from ..model import BetaPRM

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    prm = BetaPRM.from_pretrained(prm_dir, device="cpu").eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    return _aca_variants(World(world_cfg), problems, prm, acfgs, tokenizer, seed)


def aca_table(
    world: World,
    test_pools: list[Pool],
    vanilla_hits: np.ndarray,
    models: dict,
    tuned: dict,
    tokenizer,
    seed: int,
    run_dir=None,
    threads: int = 1,
) -> tuple[dict, dict]:
    """The paper's tables 4-5 on the test problems: vanilla Best-of-N (the scored test
    pools picked by BetaPRM's S_RB, whose per-problem hits are ``vanilla_hits``) against ACA
    and its ablations, each with accuracy, CI and generated tokens. Returns the table and
    the (tokens, accuracy) point of each variant for the plot.

    With ``run_dir`` (the demo's folder: the PRMs in ``run_dir/NAME``, the tokenizer in
    ``run_dir/backbone``) and ``threads`` >= 2, each PRM's variants run in a worker process
    of their own with half the threads, as the PRMs train: the policy's Python and the small
    model's scoring keep one thread each busier than two threads one process. Each variant
    draws from its own policy, so the records equal a sequential run's at the workers'
    thread count."""
    problems = [p.problem for p in test_pools]
    rb = dict(final="rb", final_lam=tuned["rb"].lam, final_tau=tuned["rb"].tau, seed=seed)
    # BetaPRM's ACA with S_RB as the final choice (the paper's main table); the standard
    # PRM's variants rank with S_lin of their own sigma (the paper's ablation).
    variants = {
        "aca": ("betaprm", ACAConfig(**rb)),
        "aca_no_early_stop": ("betaprm", ACAConfig(early_stop=False, **rb)),
        "aca_reward_only": ("standard_prm", ACAConfig(uncertainty="none", final="lin", seed=seed)),
        "aca_proxy": ("standard_prm", ACAConfig(uncertainty="proxy", final="lin", seed=seed)),
    }
    # Grouped by PRM: each group's variants share one scoring cache (CachedScorer), the
    # one that spends the whole budget first.
    groups: dict[str, list[str]] = {}
    for name in sorted(variants, key=lambda name: name != "aca_no_early_stop"):
        groups.setdefault(variants[name][0], []).append(name)
    if run_dir is not None and threads >= 2:
        with ProcessPoolExecutor(
            len(groups),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=exit_with_parent,
            initargs=(os.getpid(),),
        ) as ex:
            futures = {
                model: ex.submit(
                    _aca_variants_job,
                    world.cfg,
                    problems,
                    str(Path(run_dir) / model),
                    [variants[name][1] for name in names],
                    str(Path(run_dir) / "backbone"),
                    seed,
                    max(1, threads // len(groups)),
                )
                for model, names in groups.items()
            }
            got = {model: future.result() for model, future in futures.items()}
    else:
        got = {
            model: _aca_variants(world, problems, models[model], [variants[n][1] for n in names], tokenizer, seed)
            for model, names in groups.items()
        }
    by_name = {name: recs for model, names in groups.items() for name, recs in zip(names, got[model])}
    records = {name: by_name[name] for name in variants}  # in table order
    pool_tokens = [
        [sum(len(tokenizer.encode(st, add_special_tokens=False)) for st in t.steps) for t in p.traces]
        for p in test_pools
    ]
    table = {
        "vanilla_bon": {
            "acc": float(vanilla_hits.mean()),
            "ci": list(bootstrap_ci(vanilla_hits, seed=seed)),
            "tokens": int(sum(map(sum, pool_tokens))),
        }
    }
    points = {}
    for name, recs in records.items():
        hit = np.array([float(r["correct"]) for r in recs])
        summ = summarize(recs)
        tokens = summ["tokens"]
        table[name] = {
            "acc": summ["acc"],
            "ci": list(bootstrap_ci(hit, seed=seed)),
            "tokens": tokens,
            "token_reduction": 1 - tokens / table["vanilla_bon"]["tokens"],
            "mean_pool_size": summ["mean_pool_size"],
            "stop_reasons": summ["stop_reasons"],
        }
        if name == "aca":  # the same pools, final choice by S_lin (the ablation's shared rule)
            lin = [
                float(
                    bool(
                        r["candidates"][
                            int(
                                np.argmax(
                                    candidate_scores(
                                        [StepScores(c["mu"], c["kappa"], c["sigma"]) for c in r["candidates"]],
                                        "lin",
                                        0.5,
                                    )
                                )
                            )
                        ]["correct"]
                    )
                )
                for r in recs
            ]
            table["aca_lin"] = {
                "acc": float(np.mean(lin)),
                "ci": list(bootstrap_ci(np.array(lin), seed=seed)),
                "tokens": tokens,
                "token_reduction": table[name]["token_reduction"],
            }
        points[name.replace("_", " ")] = (tokens, table[name]["acc"])
    n = len(test_pools[0].traces)
    table["bon_curve"] = {
        "n": list(range(1, n + 1)),
        "tokens": [int(sum(sum(t[:k]) for t in pool_tokens)) for k in range(1, n + 1)],
    }
    return table, points


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
