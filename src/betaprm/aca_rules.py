"""ACA's two rule sets: ours (``betaprm``) and the paper authors' orchestrator (``authors``).

The paper states ACA's rules briefly; its authors' public code (JinYuanLi0012/Beta-Binomial-PRM,
``aca/orchestrator_adaptive_bon.py``, ``aca/utils_merge_and_cut.py``,
``aca/gen_core_internvl25.py``) decides five things differently from ours. Each is one
function here, so ``ACAState`` runs either set and a test can hold both against theirs
(docs/aca.md says which and why, per rule):

- the uncertainty ``U(y)``: the mean sigma over all steps (ours) or without the final
  answer step (theirs);
- the rivals of the best candidate: those with another final answer (ours) or every other
  candidate (theirs);
- the cut point: the earliest step with ``mu - c_cut*sigma < p_bad``, else the most
  uncertain step, the answer step excluded (both); theirs also skips steps shorter than
  three characters and garbled ones, and takes its fallback among steps with a number or
  an operator when there are any;
- the batch: each kept sample drawn once (ours) or ``round(n * oversample)`` drawn and the
  ``n`` longest distinct ones kept (theirs: ``oversample`` 2), both counts reported;
- the final choice: the run's selector (ours) or the top candidate by the stopping test's
  own score ``S_lin`` (theirs).

Their rescoring of the whole pool every round is ``ACAState``'s (it changes no decision of
a deterministic PRM, only the PRM's work). No code of theirs is copied: each rule is
written from its description above.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

RULES = {
    "betaprm": "ours: U over all steps, rivals with another answer, the run's final selector",
    "authors": "the authors' orchestrator: U without the answer step, every other candidate a rival, their "
    "cut filters, two draws per kept sample (the longer kept), whole pool rescored, top-1 by S_lin",
}
AUTHORS_OVERSAMPLE = 2.0  # their generation server's oversample_factor

# A step is a fallback cut point in the authors' rules only if it computes something.
_COMPUTES = re.compile(r"(\d|=|\+|\-|\*|/|\^|\\frac|sqrt|\\sqrt)")
_MIN_STEP_CHARS = 3  # shorter steps are never cut points (theirs)


def norm_step(text: str) -> str:
    """A step as the authors compare steps: stripped, each run of whitespace one space."""
    return re.sub(r"\s+", " ", str(text).strip())


def garbled(step: str) -> bool:
    """The authors' test for a malformed step (never a cut point): empty or under three
    characters, a replacement character, or (five characters or more) at least two letters
    outside ASCII and CJK making up 60% or more of its letters."""
    s = norm_step(step)
    if len(s) < _MIN_STEP_CHARS or "\ufffd" in s:
        return True
    if len(s) < 5:
        return False
    letters = [ch for ch in s if ch.isalpha()]
    foreign = sum(1 for ch in letters if ord(ch) > 127 and not 0x4E00 <= ord(ch) <= 0x9FFF)
    return foreign >= 2 and foreign / len(letters) >= 0.6


def uncertainty(sigma: np.ndarray, rules: str) -> float:
    """``U(y)``: the mean sigma over the steps (``betaprm``) or over all but the final answer
    step when there are two or more (``authors``)."""
    if rules == "authors" and len(sigma) >= 2:
        return float(np.mean(sigma[:-1]))
    return float(np.mean(sigma))


def rivals(answers: Sequence, best: int, rules: str) -> list[int]:
    """The candidates the best one must be reliably ahead of: every other one (``authors``),
    or those whose final answer differs from the best one's (``betaprm``: identical correct
    traces would otherwise never let a run stop; all others when the best has no answer)."""
    best_answer = answers[best]
    return [
        i
        for i, a in enumerate(answers)
        if i != best and (rules == "authors" or best_answer is None or a != best_answer)
    ]


def cut_point(steps: Sequence[str], mu: np.ndarray, sigma: np.ndarray, c_cut: float, p_bad: float, rules: str) -> int:
    """Where a repair cuts a candidate (the steps before it are kept): the earliest step with
    ``mu - c_cut*sigma < p_bad``, else the step with the largest sigma (the first on ties);
    never the final answer step, and 0 for a one-step candidate. ``authors`` also skips
    steps under three characters and garbled ones (0 when none is left) and takes the
    fallback among the steps that compute something (a digit or an operator) when any do."""
    T = min(len(steps), len(mu), len(sigma)) if rules == "authors" else len(mu)
    if T <= 1:
        return 0
    eligible = list(range(T - 1))
    if rules == "authors":
        eligible = [t for t in eligible if not garbled(steps[t])]
        if not eligible:
            return 0
    low = [t for t in eligible if mu[t] - c_cut * sigma[t] < p_bad]
    if low:
        return low[0]
    if rules == "authors":
        eligible = [t for t in eligible if _COMPUTES.search(norm_step(steps[t]))] or eligible
    return max(eligible, key=lambda t: (sigma[t], -t))


def n_drawn(n: int, oversample: float) -> int:
    """Samples drawn for a batch that keeps ``n``: ``max(n, round(n * oversample))``."""
    return max(n, int(round(n * oversample)))


def keep_longest(segments: Sequence[Sequence[str]], n: int) -> list[int]:
    """The authors' choice of ``n`` samples among those drawn (indices into ``segments``, in
    their order of preference): distinct samples only (steps compared by ``norm_step``,
    empty steps dropped, an empty sample never kept), those with two or more steps first,
    each group longest first (more steps, then more characters; the earlier on ties)."""
    seen: dict[tuple, int] = {}
    for i, segs in enumerate(segments):
        key = tuple(s for s in map(norm_step, segs) if s)
        if key and key not in seen:
            seen[key] = i
    order = sorted(seen.items(), key=lambda kv: (-len(kv[0]), -sum(map(len, kv[0])), kv[1]))
    full = [i for key, i in order if len(key) >= 2]
    short = [i for key, i in order if len(key) < 2]
    return (full + short)[:n]
