"""The demo's compute-for-accuracy runs on its test problems: ACA and its ablations, each
at every value of its own knob (``ACA_KNOBS``), and Best-of-n for every n, as frontiers of
accuracy against generated tokens (``evaluation.frontier``), compared at matched tokens
(``FRONTIER_PAIRS``); and the per-problem outcomes that runs over seeds and worlds pool
(``per_problem_json``, read by ``benchmarks/reliability_claims.py``).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from ..aca import ACAConfig, run_aca, summarize
from ..evaluation import frontier
from ..evaluation.frontier import Point
from ..evaluation.metrics import bootstrap_ci
from ..selection import candidate_scores
from ..types import StepScores
from .experiment import BON_ROWS, Pool, bon_hits, split_seeds
from .policy import SynthPolicy, synth_answer, synth_is_correct, synth_tasks
from .processes import exit_with_parent
from .world import World


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


class CachedPolicy:
    """A generator that answers each seeded request once: ACA's variants ask the same seeded
    requests (their first batch, fresh samples of the same round), and a seeded request's
    completions depend on nothing else, so later variants read them back. Unseeded requests
    go to the wrapped generator every time."""

    def __init__(self, generator):
        self.generator = generator
        self.cache: dict = {}

    def generate(self, requests):
        def key(r):
            return (r.question, tuple(r.prefix), r.n, r.seed, r.max_steps)

        todo = [r for r in requests if r.seed is None or key(r) not in self.cache]
        todo = list({(key(r) if r.seed is not None else id(r)): r for r in todo}.values())
        fresh = dict(zip(map(id, todo), self.generator.generate(todo))) if todo else {}
        for r in todo:
            if r.seed is not None:
                self.cache[key(r)] = fresh[id(r)]
        return [fresh[id(r)] if r.seed is None else self.cache[key(r)] for r in requests]


def _aca_variants(world: World, problems, prm, acfgs, tokenizer, seed: int) -> list[list[dict]]:
    """ACA variants' records on ``problems``, one list per config in ``acfgs``, all on one
    PRM through one ``CachedScorer``. Each variant draws from its own policy from the
    run's ACA seed, so its records do not depend on which variants ran before it or where."""
    from ..scoring import PRMScorer  # torch: this module stays torch-free for the CLI (split_seeds)

    @functools.cache  # a step's text recurs across candidates and variants: encode it once
    def count(text):
        return len(tokenizer.encode(text, add_special_tokens=False))

    scorer = CachedScorer(PRMScorer(prm, 64))
    policy = CachedPolicy(SynthPolicy(world, seed=split_seeds(seed).aca_policy, count_tokens=count))
    return [
        run_aca(
            synth_tasks(problems),
            policy,
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
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in the demo's log
    prm = BetaPRM.from_pretrained(prm_dir, device="cpu").eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    return _aca_variants(World(world_cfg), problems, prm, acfgs, tokenizer, seed)


# Each ACA variant's own knob, swept for its frontier of accuracy against generated tokens:
# (ACAConfig field, values, the value of its row in the ACA table). Fixed here, never chosen
# on the test problems: the stopping bounds' width (c_stop) for the variants with a sigma,
# the score margin for reward-only ACA (sigma = 0: c_stop has no effect), the budget for the
# variant that never stops early.
# The answer-level variants sweep their stopping threshold (ESC its window, which is also its
# first batch); 0.95 is Adaptive-Consistency's and DeepConf's published default. The grid
# reaches down to 0.3 so that every frontier has a point below half of Best-of-16's tokens.
_THRESHOLDS = ("stop_threshold", (0.3, 0.5, 0.8, 0.95, 0.99), 0.95)
ACA_KNOBS = {
    "aca": ("c_stop", (0.0, 0.05, 0.1, 0.2, 0.3, 0.6), 0.3),
    "aca_no_early_stop": ("budget", (4, 8, 12, 16), 16),
    "aca_reward_only": ("stop_margin", (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5), 0.0),
    "aca_proxy": ("c_stop", (0.0, 0.05, 0.1, 0.2, 0.3, 0.6), 0.3),
    "aca_authors": ("c_stop", (0.0, 0.05, 0.1, 0.2, 0.3, 0.6), 0.3),
    "vote": _THRESHOLDS,
    "vote_sigma0": _THRESHOLDS,
    "vote_runner_up": _THRESHOLDS,
    "adaptive_consistency": _THRESHOLDS,
    "esc": ("m", (2, 4, 8), 4),
    "deepconf": _THRESHOLDS,
}
# Frontier pairs the demo compares at matched tokens: (A, B, what the difference isolates).
FRONTIER_PAIRS = (
    ("aca", "aca_reward_only", "learned sigma vs none"),
    ("aca", "aca_proxy", "learned sigma vs the proxy sqrt(mu(1-mu))"),
    ("aca", "bon_betaprm_rb", "ACA vs Best-of-n with the same PRM and final selector"),
    ("aca", "aca_authors", "our ACA rules vs the paper authors' orchestrator's (the same BetaPRM)"),
    ("vote", "bon_betaprm_reliability_vote", "the adaptive reliability vote vs Best-of-n's reliability vote"),
    ("vote", "adaptive_consistency", "the reliability-weighted adaptive vote vs Adaptive-Consistency"),
    ("vote", "esc", "the reliability-weighted adaptive vote vs Early-Stopping Self-Consistency"),
    ("vote", "deepconf", "learned reliability vs a DeepConf-style filter on the standard PRM's mu"),
    ("vote", "vote_sigma0", "what kappa adds to the adaptive vote (sigma = 0: weights mean mu)"),
    ("vote", "aca", "stopping on the vote vs stopping on one candidate"),
)


def answer_level_variants(vote_lam: float, seed: int) -> dict:
    """The demo's answer-level variants: ``{name: (PRM, ACAConfig fields)}``. The BetaPRM's
    votes are weighted by S_lin at the reliability vote's lambda (tuned on the validation
    pools); ``vote_sigma0`` is the same with sigma = 0; the unweighted rules need no PRM (the
    standard PRM's scores are only recorded); DeepConf-style runs on the standard PRM's mu."""
    vote = dict(stop_rule="vote", allocate="fresh", prune=True, final_vote=True, final="lin", seed=seed)
    vote.update(lam=vote_lam, final_lam=vote_lam)
    unweighted = dict(allocate="fresh", weighted=False, final_vote=True, final="lin", seed=seed)
    return {
        "vote": ("betaprm", vote),
        "vote_sigma0": ("betaprm", {**vote, "uncertainty": "none"}),
        "vote_runner_up": ("betaprm", {**vote, "allocate": "runner-up"}),
        # Unweighted: no PRM decides anything (the standard PRM's scores are only recorded); run
        # beside the standard PRM's variants, which balances the two worker processes.
        "adaptive_consistency": ("standard_prm", {**unweighted, "stop_rule": "ac"}),
        "esc": ("standard_prm", {**unweighted, "stop_rule": "window"}),
        "deepconf": (
            "standard_prm",
            dict(
                stop_rule="consensus",
                allocate="fresh",
                prune=True,
                final_vote=True,
                final="lin",
                seed=seed,
                uncertainty="none",
                keep_top=0.9,
            ),
        ),
    }


def _aca_grid(frontier: bool) -> list[tuple[str, float]]:
    """(variant, knob value) of every ACA run: each variant's table value, and with
    ``frontier`` its whole knob sweep."""
    return [
        (name, value)
        for name, (_, values, default) in ACA_KNOBS.items()
        for value in (values if frontier else (default,))
    ]


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
    frontier: bool = False,
    pool_tokens: list[list[int]] | None = None,
) -> tuple[dict, dict, dict]:
    """The paper's tables 4-5 on the test problems: vanilla Best-of-N (the scored test
    pools picked by BetaPRM's S_RB, whose per-problem hits are ``vanilla_hits``) against ACA
    and its ablations, each with accuracy, CI and generated tokens. Returns the table, the
    (tokens, accuracy) point of each variant for the plot, and the runs of each variant as
    ``evaluation.frontier.Point``s (``{variant: [Point per knob value]}``; with
    ``frontier`` every value of ``ACA_KNOBS``, else its table value only). ``pool_tokens``:
    the test pools' ``pool_token_counts``, when the caller has them already.

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
        "aca": ("betaprm", dict(rb)),
        "aca_no_early_stop": ("betaprm", dict(early_stop=False, **rb)),
        "aca_reward_only": ("standard_prm", dict(uncertainty="none", final="lin", seed=seed)),
        "aca_proxy": ("standard_prm", dict(uncertainty="proxy", final="lin", seed=seed)),
        # The authors' rule set (aca_rules): their final choice is the top S_lin.
        "aca_authors": ("betaprm", dict(rules="authors", final="lin", seed=seed)),
        **answer_level_variants(tuned["reliability_vote"], seed),
    }

    def config(name, value):
        knob = {ACA_KNOBS[name][0]: value, **({"n0": value} if name == "esc" else {})}  # ESC: every batch a window
        return ACAConfig(**{**variants[name][1], **knob})

    runs = {(name, value): (variants[name][0], config(name, value)) for name, value in _aca_grid(frontier)}
    # Grouped by PRM: each group's runs share one scoring cache (CachedScorer), the ones
    # that spend the most first.
    groups: dict[str, list[tuple[str, float]]] = {}
    for key in sorted(runs, key=lambda key: (key[0] != "aca_no_early_stop", -runs[key][1].budget)):
        groups.setdefault(runs[key][0], []).append(key)
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
                    [runs[key][1] for key in keys],
                    str(Path(run_dir) / "backbone"),
                    seed,
                    max(1, threads // len(groups)),
                )
                for model, keys in groups.items()
            }
            got = {model: future.result() for model, future in futures.items()}
    else:
        got = {
            model: _aca_variants(world, problems, models[model], [runs[key][1] for key in keys], tokenizer, seed)
            for model, keys in groups.items()
        }
    by_key = {key: recs for model, keys in groups.items() for key, recs in zip(keys, got[model])}
    if pool_tokens is None:
        pool_tokens = pool_token_counts(test_pools, tokenizer)
    table = {
        "vanilla_bon": {
            "acc": float(vanilla_hits.mean()),
            "ci": list(bootstrap_ci(vanilla_hits, seed=seed)),
            "tokens": int(sum(map(sum, pool_tokens))),
        }
    }
    points = {}
    sweeps: dict[str, list[Point]] = {name: [] for name in variants}
    for name, value in _aca_grid(frontier):
        recs = by_key[(name, value)]
        sweeps[name].append(Point(value, float(sum(r["tokens"] for r in recs)), _hits(recs)))
    for name in variants:  # the table: each variant at its table value, in table order
        recs = by_key[(name, ACA_KNOBS[name][2])]
        hit = _hits(recs)
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
            lin = []
            for r in recs:
                pool = [StepScores(c["mu"], c["kappa"], c["sigma"]) for c in r["candidates"]]
                lin.append(float(bool(r["candidates"][int(np.argmax(candidate_scores(pool, "lin", 0.5)))]["correct"])))
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
    return table, points, sweeps


def _hits(records) -> np.ndarray:
    return np.array([float(bool(r["correct"])) for r in records])


def pool_token_counts(test_pools: list[Pool], tokenizer) -> list[list[int]]:
    """Generated tokens of every candidate of every pool (its steps, as the policy wrote them)."""
    return [
        [sum(len(tokenizer.encode(st, add_special_tokens=False)) for st in t.steps) for t in p.traces]
        for p in test_pools
    ]


def bon_frontiers(pools: list[Pool], scores: dict, tuned: dict, pool_tokens: list[list[int]]) -> dict:
    """Best-of-n for n = 1 .. the pool size, for every row of ``BON_ROWS``: one
    ``evaluation.frontier.Point`` per n (its knob), with the tokens of the pools' first n
    candidates; ``{row key: [Point, ...]}``."""
    out: dict[str, list[Point]] = {key: [] for key, *_ in BON_ROWS}
    for n in range(1, len(pools[0].traces) + 1):
        tokens = float(sum(sum(t[:n]) for t in pool_tokens))
        for key, hits in bon_hits(pools, scores, tuned, n=n).items():
            out[key].append(Point(n, tokens, hits.astype(np.float64)))
    return out


def frontier_results(aca_sweeps: dict | None, bon_sweeps: dict, seed: int) -> tuple[dict, dict]:
    """``results.json``'s ``aca_frontier`` / ``bon_frontier`` curves (``evaluation.frontier.curve``)
    and ``frontier_comparisons``: for each pair of ``FRONTIER_PAIRS`` whose frontiers ran,
    which one dominates and A's table point against B at matched tokens."""
    curves = {"bon_frontier": {key: frontier.curve(pts, seed) for key, pts in bon_sweeps.items()}}
    sweeps = {f"bon_{key}": pts for key, pts in bon_sweeps.items()}
    if aca_sweeps:
        curves["aca_frontier"] = {
            name: {"knob": ACA_KNOBS[name][0], "table_value": ACA_KNOBS[name][2], "points": frontier.curve(pts, seed)}
            for name, pts in aca_sweeps.items()
        }
        sweeps.update(aca_sweeps)
    comparisons = {}
    for a, b, what in FRONTIER_PAIRS:
        if a not in sweeps or b not in sweeps:
            continue
        table_point = next(p for p in sweeps[a] if p.knob == ACA_KNOBS.get(a, (None, None, p.knob))[2])
        m = frontier.matched(table_point, sweeps[b], seed=seed)
        comparisons[f"{a}_vs_{b}"] = {
            "what": what,
            **frontier.dominance(sweeps[a], sweeps[b]),
            "matched_at_table_point": None if m is None else {k: v for k, v in m.items() if k != "d"},
        }
    return curves, comparisons


def per_problem_json(bon_sweeps: dict, aca_sweeps: dict | None, held_nll: dict) -> dict:
    """A run's per-problem outcomes (``OUT/per_problem.json``), from which runs over seeds
    and worlds pool (``read_per_problem``): every Best-of-n row's and ACA run's hits on the
    test problems with its tokens, and each PRM's NLL of every held-out step's counts."""
    return {
        "bon": {key: [p.to_json() for p in pts] for key, pts in bon_sweeps.items()},
        "aca": {name: [p.to_json() for p in pts] for name, pts in (aca_sweeps or {}).items()},
        "held_out_nll": {name: [round(float(x), 6) for x in v] for name, v in held_nll.items()},
    }


def read_per_problem(path) -> dict:
    """``per_problem_json``'s file read back: ``{"bon": {key: [Point]}, "aca": {variant:
    [Point]}, "held_out_nll": {prm: array}}``."""
    d = json.loads(Path(path).read_text())
    return {
        "bon": {k: [Point.from_json(p) for p in v] for k, v in d["bon"].items()},
        "aca": {k: [Point.from_json(p) for p in v] for k, v in d["aca"].items()},
        "held_out_nll": {k: np.asarray(v) for k, v in d["held_out_nll"].items()},
    }
