"""Best-of-N on candidate-pool files (the paper's table 1 protocol).

One pool file per benchmark (docs/design.md section 5: ``id``, ``question``, ``answer``,
``candidates`` with ``steps`` and, once scored, ``mu``/``kappa``/``sigma``). Every
candidate's final answer is checked against the reference once; each selector picks one
candidate per problem; selector hyperparameters (S_lin's lambda, S_RB's lambda and q) are
tuned on a validation part of the problems (split by problem) and accuracy is reported on
the rest with bootstrap intervals. A pick whose answer check failed is not counted as
wrong: it is left out of that selector's accuracy and counted in ``check_failed``. Scored
pools with no validation problem are refused (the tuned selectors would be missing), unless
``tune=False`` asks for the untuned selectors alone, tested on every problem.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..selectors import SELECTORS as REGISTRY
from ..selectors import hit, tune_selectors
from ..types import StepScores
from .metrics import bootstrap_ci

# The selectors eval-bon reports (betaprm.selectors), in table order, with their labels.
NAMES = (
    "single_pass",
    "majority_vote",
    "mean",
    "min",
    "last",
    "prod",
    "lin",
    "rb",
    "weighted_vote",
    "reliability_vote",
    "oracle",
)
SELECTORS = {name: REGISTRY[name].label for name in NAMES}


@dataclass
class BonPool:
    id: str
    question: str
    answers: list  # final answer per candidate (None: none stated)
    correct: list  # True / False / None (check failed) per candidate
    scores: list[StepScores] | None


class NoTestProblems(ValueError):
    """Every problem fell in the validation split (too few problems for ``val_fraction``)."""


class NoValidationProblems(ValueError):
    """No problem fell in the validation split, so the tuned selectors cannot be tuned."""


TUNED = tuple(n for n in NAMES if REGISTRY[n].tuned)
"""The selectors whose hyperparameters are tuned on the validation problems."""


def split_problems(pools: Sequence[BonPool], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    val, test = [], []
    for i, p in enumerate(pools):
        h = zlib.crc32(f"{seed}/{p.question}".encode()) / 0xFFFFFFFF
        (val if h < val_fraction else test).append(i)
    return val, test


def evaluate_pools(pools: Sequence[BonPool], val_fraction: float = 0.2, seed: int = 0, tune: bool = True) -> dict:
    """Per-selector accuracy on the test part, hyperparameters tuned on the validation part.

    Scored pools whose split leaves no validation problem raise ``NoValidationProblems``
    rather than drop the tuned selectors (``TUNED``) silently; ``tune=False`` leaves them out
    and tests every problem (no split)."""
    scored = all(p.scores is not None for p in pools)
    if tune:
        val, test = split_problems(pools, val_fraction, seed)
    else:
        val, test = [], list(range(len(pools)))
    if not test:
        raise NoTestProblems("no test problems left after the validation split")
    if tune and scored and not val:
        raise NoValidationProblems(
            f"no validation problems left by the split of {len(pools)} problems, so {', '.join(TUNED)} cannot be "
            "tuned; a larger val_fraction, another seed, or tune=False for the untuned selectors alone"
        )
    tuned = {}
    if scored and val:
        vp = [pools[i] for i in val]
        # Tuning needs known outcomes: a failed check counts as not correct here only.
        tuned = tune_selectors([p.scores for p in vp], [p.answers for p in vp], [p.correct for p in vp])
    names = [n for n in NAMES if (scored or not REGISTRY[n].needs_scores) and (tuned or not REGISTRY[n].tuned)]
    out = {}
    for name in names:
        hits, failed = [], 0
        for i in test:
            p = pools[i]
            h = hit(name, p.answers, p.correct, p.scores, tuned)
            if h is None:
                failed += 1
            else:
                hits.append(h)
        h = np.array(hits)
        out[name] = {
            "acc": float(h.mean()) if len(h) else float("nan"),
            "ci": list(bootstrap_ci(h, seed=seed)) if len(h) else [float("nan")] * 2,
            "n": len(h),
            "check_failed": failed,
        }
    return {
        "selectors": out,
        "tuned": {
            k: {"lambda": v.lam, "q": v.q, "tau": v.tau, "val_acc": v.val_accuracy}
            for k, v in tuned.items()
            if k in ("lin", "rb")
        }
        | ({"reliability_vote": {"lambda": tuned["reliability_vote"]}} if tuned else {}),
        "n_test": len(test),
        "n_val": len(val),
    }


def check_pools(
    records: Sequence[dict], answer_of: Callable, check_many: Callable, with_questions: bool = False
) -> list[BonPool]:
    """Pools with every candidate's answer read and checked once (``check_many`` takes
    (gold, answer) pairs and returns True/False/None; with ``with_questions`` also
    ``questions=``, one per pair, for a judge that reads them). A candidate that carries
    ``correct`` (judged already, as the paper's authors' pools are) keeps it unchecked."""
    pairs, questions, answers = [], [], []
    for r in records:
        ans = [answer_of(c["steps"]) for c in r["candidates"]]
        answers.append(ans)
        for c, a in zip(r["candidates"], ans):
            if "correct" not in c:
                pairs.append((r.get("answer"), a))
                questions.append(r["question"])
    verdicts = iter((check_many(pairs, questions=questions) if with_questions else check_many(pairs)) if pairs else [])
    pools = []
    for r, ans in zip(records, answers):
        correct = [c["correct"] if "correct" in c else next(verdicts) for c in r["candidates"]]
        sc = None
        if all("mu" in c for c in r["candidates"]):
            sc = [StepScores(c["mu"], c.get("kappa", [1.0] * len(c["mu"])), c.get("sigma")) for c in r["candidates"]]
        pools.append(BonPool(str(r["id"]), r["question"], ans, correct, sc))
    return pools
