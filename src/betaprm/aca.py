"""Adaptive Computation Allocation (paper section 5 and appendix A.5).

For each problem ACA samples ``n0`` candidates from scratch, scores them, and then either
stops or spends another batch of ``m`` samples, up to ``budget`` candidates in all:

- candidates are ranked by ``S(y) = mean_t (mu_t - lam * sigma_t)`` with uncertainty
  ``U(y) = mean_t sigma_t``; ``LCB = S - c_stop * U`` and ``UCB = S + c_stop * U``;
- it **stops** when ``LCB(best) > max UCB(competitors)``. Candidates with the same final
  answer as the best are not its competitors (identical correct traces would otherwise
  never let it stop; docs/design.md section 6); with no competitor left it stops too;
- otherwise it **repairs** the competitor with the highest UCB: the cut point is the
  earliest step with ``mu_t - c_cut * sigma_t < p_bad``, else the step with the largest
  ``sigma_t``; the steps before the cut are kept and ``m`` continuations are sampled from
  there. The final answer step is not a cut point (regenerating only the answer from an
  unchanged derivation spends tokens on nothing); a one-step candidate is cut at 0;
- the final choice is made by ``final`` (``rb``: S_RB, as in the paper's main table).

Variants run through the same code: ``early_stop=False`` (always spend the budget),
``uncertainty="none"`` (reward only: sigma = 0, so the stopping test is a score margin
``stop_margin``), ``uncertainty="proxy"`` (sigma = sqrt(mu (1 - mu)), for a standard PRM)
and ``repair=False`` with ``n0 = budget`` (plain Best-of-N).

Answer-level variants stop on the vote instead of on one candidate (``stop_rule``, the
rules in ``adaptive_vote``): the reliability-weighted vote's leader staying ahead through
the budget left (``vote``), Adaptive-Consistency (``ac``), ESC's window (``window``) and
DeepConf's consensus (``consensus``, with its ``keep_top`` filter); their later batches are
fresh samples or continue the runner-up answer's best candidate (``allocate``); ``prune``
stops a later candidate at the first step whose upper bound falls below a level learned on
the first batch (its tokens counted up to that step, its vote dropped); ``final_vote`` makes
the final choice by the weighted vote. docs/aca.md derives the rules.

``rules="authors"`` runs the paper authors' orchestrator's rule set instead of ours (their
``U``, rivals, cut filters, two draws per kept sample, whole-pool rescoring and top-1 S_lin:
``aca_rules``, and docs/aca.md's table of which and why).

Over 400 lines because the controller is one state machine: the paper's rule and the
answer-level rules share its rounds, allocation, token accounting and records.

All problems advance in lockstep, so each round is one generation call and one scoring
call over every problem still running (large batches for vLLM, servers and the PRM).
Candidates are scored once. Generated tokens are counted per call, prompt and kept
prefix excluded. Each finished problem appends one JSON line to ``out``; a rerun skips
the ids already there (each request carries a seed derived from the problem id and
round, so a resumed run draws what an uninterrupted one would).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from . import aca_rules
from . import adaptive_vote as av
from .distributed import Processes, task_records
from .errors import BetaPRMInputError
from .evaluation.frontier import Point
from .generation.base import GenerationRequest, step_token_split
from .options import opt as _f
from .selection import METHODS, TuneResult, candidate_scores, weighted_vote
from .selectors import hit
from .types import StepScores, Task

# The sigma ACA can use, each with what it is.
UNCERTAINTIES = {
    "learned": "BetaPRM",
    "proxy": "sqrt(mu(1-mu)), for a standard PRM",
    "none": "reward only",
}

# How a run decides to stop, each with what it is (docs/aca.md).
STOP_RULES = {
    "bounds": "the paper's: the best candidate's lower bound above every rival's upper bound",
    "vote": "the leading answer of the weighted vote stays ahead through the budget left, with this probability",
    "ac": "Adaptive-Consistency's Beta rule on the two leading (weighted) vote totals",
    "window": "Early-Stopping Self-Consistency: the last batch (the window) all gives one answer",
    "consensus": "DeepConf: the leading answer's share of the filtered weighted vote",
}
# Where a run's next batch goes.
ALLOCATIONS = {
    "repair": "continue the top rival's kept prefix (the paper's)",
    "fresh": "sample from scratch",
    "runner-up": "continue the runner-up answer's best candidate from its uncertain step",
}

Scorer = Callable[[Sequence[tuple[str, Sequence[str]]]], list[StepScores]]
"""Scores ``(question, steps)`` traces, one ``StepScores`` per trace (``PRMScorer``)."""


def final_selector_problems(final: str, final_tau: float | None, tau_required: bool = True) -> list[str]:
    """What is wrong with a final selector (ACA's, search's): ``final`` must be a method of
    ``selection.METHODS``, and S_RB (``rb``) needs its sigma threshold ``final_tau`` unless
    ``tau_required`` is False (the caller tunes it first)."""
    bad = []
    if final not in METHODS:
        bad.append(f"final must be one of {', '.join(METHODS)}, got {final!r}")
    if tau_required and final == "rb" and final_tau is None:
        bad.append("final 'rb' needs final_tau (S_RB's sigma threshold, tuned on validation pools)")
    if final_tau is not None and not final_tau >= 0:  # sigma >= 0: a negative threshold counts every step
        bad.append(f"final_tau must be a sigma threshold >= 0, got {final_tau}")
    return bad


def cut_problems(p_bad: float) -> list[str]:
    """What is wrong with a cut point's threshold (ACA's, search's repair): ``p_bad`` is
    compared with ``mu - c * sigma``, a probability's scale; outside [0, 1] (or nan) it cuts
    every step or none."""
    return [] if 0 <= p_bad <= 1 else [f"p_bad must be a probability in [0, 1], got {p_bad}"]


@dataclass
class ACASettings:
    """ACA's budget, stopping test, cut point, final selector and seed (what ``betaprm aca``
    takes as flags); ``ACAConfig`` adds which of ACA's mechanisms run. Defaults are the
    paper's (appendix A.5)."""

    n0: int = _f(4, "candidates sampled from scratch first")
    m: int = _f(4, "candidates per later batch")
    budget: int = _f(16, "candidates per problem at most (N)")
    lam: float = _f(0.5, "lambda of S_lin = mean(mu - lambda*sigma), the score of the stopping test")
    c_stop: float = _f(0.3, "width of the stopping test's bounds: S +- c_stop * mean(sigma)")
    c_cut: float = _f(1.0, "cut point: the earliest step with mu - c_cut*sigma < p_bad")
    p_bad: float = _f(0.3, "cut point threshold")
    stop_margin: float = _f(0.0, "stop only when LCB(best) exceeds max UCB(competitors) by more than this")
    final: str = _f("rb", f"final selector: {', '.join(METHODS)} (betaprm.selection; rb is S_RB)", choices=METHODS)
    final_lam: float = _f(0.5, "lambda of the final selector")
    final_tau: float | None = _f(None, "S_RB's sigma threshold (tune it on validation pools; required for rb)")
    final_vote: bool = _f(
        False,
        "final choice by the vote over final answers, each weighted by max(0, S_lin(final_lam)) (unweighted for "
        "the unweighted rules), instead of --final's top candidate",
    )
    stop_threshold: float = _f(
        0.95, "answer-level stopping: the probability (vote, ac) or vote share (consensus) at which a problem stops"
    )
    keep_top: float = _f(1.0, "vote only with this fraction of the candidates, those with the largest weights")
    prune_quantile: float = _f(
        0.1,
        "with pruning: the level a later candidate's upper bounds mu + c_cut*sigma must stay above while it is "
        "written, as this quantile of the first batch's lowest upper bounds",
    )
    rules: str = _f(
        "betaprm",
        "the rule set: " + "; ".join(f"{k}: {v}" for k, v in aca_rules.RULES.items()) + " (docs/aca.md)",
        choices=tuple(aca_rules.RULES),
        added=True,
    )
    oversample: float | None = _f(
        None,
        "draw round(n * this) samples for a batch of n and keep the n longest distinct ones, every drawn token "
        "counted (default: 1, or the authors' 2 with --rules authors)",
        added=True,
    )
    seed: int = _f(0, "sampling seed (each request's seed derives from it, the problem id and the round)")

    @property
    def draws(self) -> float:
        """``oversample`` with its default filled in."""
        if self.oversample is not None:
            return self.oversample
        return aca_rules.AUTHORS_OVERSAMPLE if self.rules == "authors" else 1.0

    def budget_problems(self) -> list[str]:
        """What is wrong with ``n0``, ``m``, ``budget`` and the answer-level settings (nothing:
        an empty list)."""
        bad = [f"{k} must be >= 1, got {getattr(self, k)}" for k in ("n0", "m", "budget") if getattr(self, k) < 1]
        if self.n0 > self.budget:
            bad.append(f"n0 ({self.n0}) must not exceed budget ({self.budget})")
        for name in ("stop_threshold", "prune_quantile"):
            if not 0 <= getattr(self, name) <= 1:
                bad.append(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 < self.keep_top <= 1:
            bad.append(f"keep_top must be a fraction in (0, 1], got {self.keep_top}")
        if self.rules not in aca_rules.RULES:
            bad.append(f"rules must be one of {', '.join(aca_rules.RULES)}, got {self.rules!r}")
        if self.oversample is not None and not 1 <= self.oversample <= 64:
            bad.append(f"oversample must be in [1, 64] (samples drawn per sample kept), got {self.oversample}")
        return bad


@dataclass
class ACAConfig(ACASettings):
    """ACA's parameters (``ACASettings``) and which of its mechanisms run: early stopping,
    repair, and the uncertainty it uses (the paper's ablations)."""

    early_stop: bool = _f(True, "stop when the best candidate is reliably ahead (False: always spend the budget)")
    repair: bool = _f(True, "later batches continue a competitor's kept prefix (False: sample them from scratch)")
    uncertainty: str = _f(
        "learned",
        "sigma used by ACA: " + ", ".join(f"{name} ({what})" for name, what in UNCERTAINTIES.items()),
        choices=tuple(UNCERTAINTIES),
    )
    stop_rule: str = _f("bounds", "when to stop: " + "; ".join(f"{k}: {v}" for k, v in STOP_RULES.items()))
    allocate: str = _f(
        "repair", "where later batches go (with repair): " + "; ".join(f"{k}: {v}" for k, v in ALLOCATIONS.items())
    )
    weighted: bool = _f(True, "answer-level rules and the final vote weigh each vote by the PRM (False: 1 each)")
    prune: bool = _f(False, "stop a later candidate while it is written once its prefix is reliably bad")

    def __post_init__(self):
        bad = self.budget_problems()
        bad += cut_problems(self.p_bad)
        if self.uncertainty not in UNCERTAINTIES:
            bad.append(f"uncertainty must be one of {', '.join(UNCERTAINTIES)}, got {self.uncertainty!r}")
        if self.stop_rule not in STOP_RULES:
            bad.append(f"stop_rule must be one of {', '.join(STOP_RULES)}, got {self.stop_rule!r}")
        if self.allocate not in ALLOCATIONS:
            bad.append(f"allocate must be one of {', '.join(ALLOCATIONS)}, got {self.allocate!r}")
        bad += final_selector_problems(self.final, self.final_tau)
        if bad:
            raise BetaPRMInputError("bad ACA configuration: " + "; ".join(bad))

    @classmethod
    def best_of_n(cls, **kw) -> ACAConfig:
        """Plain Best-of-N through the same code: all ``budget`` candidates at once."""
        budget = kw.pop("budget", 16)
        return cls(n0=budget, budget=budget, early_stop=False, repair=False, **kw)


@dataclass
class Candidate:
    steps: list[str]
    n_tokens: int
    round: int
    parent: int | None = None
    cut: int | None = None
    scores: StepScores | None = None
    answer: Hashable | None = None
    step_tokens: list[int] | None = None  # the new steps' generated tokens
    pruned: int | None = None  # the step at which it was stopped while written (None: it was not)

    @property
    def vote(self) -> Hashable | None:
        """The answer it votes for: none when it was stopped before its answer."""
        return None if self.pruned is not None else self.answer


def _sigma(s: StepScores, mode: str) -> np.ndarray:
    if mode == "learned":
        return s.sigma
    if mode == "proxy":
        return np.sqrt(s.mu * (1.0 - s.mu))
    return np.zeros_like(s.mu)


def _request_seed(seed: int, task_id: str, rnd: int) -> int:
    return zlib.crc32(f"{seed}/{task_id}/{rnd}".encode()) & 0x7FFFFFFF


class ACAState:
    """One problem's ACA run: its candidates (``cands``), rounds, generated tokens, the
    request of its next batch (``next_req``) and, once ``done``, its stop reason.
    ``decide`` applies the stopping test to the scored pool and plans the next batch;
    ``record`` is the finished problem's record."""

    def __init__(self, task: Task, cfg: ACAConfig):
        self.task, self.cfg = task, cfg
        self.cands: list[Candidate] = []
        self.rounds: list[dict] = []
        self.tokens = 0  # every generated token (the authors' "actual")
        self.tokens_kept = 0  # those of the kept samples (the authors' "effective")
        self.traces_scored = 0  # the PRM's work: the authors' rules rescore the pool every round
        self.done = False
        self.stop_reason = ""
        self.next_req = self._request([], cfg.n0, 0)
        self.next_n = cfg.n0  # samples the next batch keeps (its request draws more when oversampling)
        self.next_meta = (None, None)  # (parent, cut) of the next batch
        self.prune_level: float | None = None  # learned on the first batch (--prune)
        self.n_checked = 0  # candidates already checked for pruning

    def _request(self, prefix: list[str], n: int, rnd: int) -> GenerationRequest:
        t = self.task
        self.next_n = n
        return GenerationRequest(
            t.question,
            prefix,
            aca_rules.n_drawn(n, self.cfg.draws),
            t.handle,
            _request_seed(self.cfg.seed, t.id, rnd),
            images=list(t.images),
        )

    def view(self) -> list[StepScores]:
        """The pool's scores with ACA's sigma (learned, proxy or zero)."""
        return [StepScores(c.scores.mu, c.scores.kappa, _sigma(c.scores, self.cfg.uncertainty)) for c in self.cands]

    def decide(self) -> None:
        cfg = self.cfg
        pool = self.view()
        if cfg.prune:
            self._prune(pool)
        S = candidate_scores(pool, "lin", cfg.lam)
        U = np.array([aca_rules.uncertainty(p.sigma, cfg.rules) for p in pool])
        lcb, ucb = S - cfg.c_stop * U, S + cfg.c_stop * U
        best = int(np.argmax(S))
        rivals = aca_rules.rivals([c.answer for c in self.cands], best, cfg.rules)
        if cfg.rules == "authors":  # their repair targets: rivals whose UCB reaches the best's LCB
            rivals = [i for i in rivals if ucb[i] >= lcb[best]]
        max_ucb = float(max(ucb[rivals])) if rivals else None
        info = {
            "round": len(self.rounds),
            "pool_size": len(self.cands),
            "best": best,
            "lcb": float(lcb[best]),
            "max_rival_ucb": max_ucb,
            "rivals": len(rivals),
        }
        if cfg.stop_rule == "bounds":
            confident = max_ucb is None or lcb[best] - max_ucb > cfg.stop_margin
            if cfg.rules == "authors" and len(self.cands) < cfg.n0:  # theirs: no test on a short first batch
                confident = False
        else:
            confident = self._answers_settled(pool, info)
        if cfg.early_stop and confident:
            self._finish(info, "confident")
            return
        if len(self.cands) >= cfg.budget:
            self._finish(info, "budget")
            return
        if cfg.rules == "authors" and not rivals and cfg.early_stop:  # theirs: no plausible rival, stop
            self._finish(info, "confident")
            return
        n = min(cfg.m, cfg.budget - len(self.cands))
        rnd = len(self.rounds) + 1
        if not cfg.repair or cfg.allocate == "fresh":
            target = None
        elif cfg.allocate == "runner-up":
            target = self._runner_up(pool)
        else:
            others = rivals
            if cfg.rules == "betaprm" and not others:
                others = [i for i in range(len(self.cands)) if i != best]
            target = max(others, key=lambda i: (ucb[i], -i)) if others else None
        if target is None:
            self.next_req = self._request([], n, rnd)
            self.next_meta = (None, None)
            info.update(action="sample", new=n)
        else:
            cut = aca_rules.cut_point(
                self.cands[target].steps, pool[target].mu, pool[target].sigma, cfg.c_cut, cfg.p_bad, cfg.rules
            )
            self.next_req = self._request(list(self.cands[target].steps[:cut]), n, rnd)
            self.next_meta = (target, cut)
            info.update(action="repair", repaired=target, cut=cut, new=n)
        self.rounds.append(info)

    def _votes(self, pool: list[StepScores], lam: float) -> tuple[list, np.ndarray, np.ndarray]:
        """``(answers, w, u)`` of the vote: each candidate's answer (None: it abstains, having
        none, being stopped before it, or below the ``keep_top`` filter), weight and spread."""
        cfg = self.cfg
        w, u = av.vote_weights(pool, lam, cfg.weighted)
        answers = [c.vote for c in self.cands]
        voters = np.array([a is not None for a in answers])
        if cfg.keep_top < 1 and voters.any():
            keep = np.zeros(len(answers), dtype=bool)
            keep[voters] = av.kept(w[voters], cfg.keep_top)
            answers = [a if k else None for a, k in zip(answers, keep)]
        return answers, w, u

    def _answers_settled(self, pool: list[StepScores], info: dict) -> bool:
        """The answer-level stopping rules (``STOP_RULES``); what they measured goes into ``info``."""
        cfg = self.cfg
        answers, w, u = self._votes(pool, cfg.lam)
        if cfg.stop_rule == "window":
            last = max(c.round for c in self.cands)
            window = [c.vote for c in self.cands if c.round == last]
            info["window_agrees"] = av.window_agrees(window, len(window)) and len(window) > 1
            return info["window_agrees"]
        if cfg.stop_rule == "consensus":
            info["share"] = av.consensus(answers, w)
            return info["share"] >= cfg.stop_threshold
        # One generator per problem and round: a resumed run decides as an uninterrupted one.
        rng = np.random.default_rng([cfg.seed, zlib.crc32(str(self.task.id).encode()), len(self.rounds)])
        remaining = None if cfg.stop_rule == "ac" else cfg.budget - len(self.cands)
        prob, leader = av.leader_stays(answers, w, u, remaining, rng)
        info.update(leader_stays=prob, leader=leader)
        return leader is not None and prob >= cfg.stop_threshold

    def _runner_up(self, pool: list[StepScores]) -> int | None:
        """The best candidate (largest weight) of the answer second in the weighted vote, whose
        continuations can change the vote; None when one answer (or none) is in it."""
        answers, w, _ = self._votes(pool, self.cfg.lam)
        totals: dict = {}
        for a, x in zip(answers, w):
            if a is not None:
                totals[a] = totals.get(a, 0.0) + float(x)
        if len(totals) < 2:
            return None
        second = sorted(totals, key=lambda a: -totals[a])[1]
        return max((i for i, a in enumerate(answers) if a == second), key=lambda i: (w[i], -i))

    def _prune(self, pool: list[StepScores]) -> None:
        """Stop the candidates of later batches at the first new step whose upper bound fell
        below the level learned on the first batch: they keep the tokens up to that step and
        no longer vote. The PRM's belief at a step depends only on the text before it, so
        the step found here is where a run scoring each step as it is written would stop."""
        cfg = self.cfg
        if self.prune_level is None:
            self.prune_level = av.prune_level(pool, cfg.c_cut, cfg.prune_quantile)
            self.n_checked = len(self.cands)
            return
        for i in range(self.n_checked, len(self.cands)):
            c = self.cands[i]
            first = c.cut or 0
            t = av.prune_step(pool[i], cfg.c_cut, self.prune_level, first) if c.steps else None
            if t is not None:
                kept = sum((c.step_tokens or [])[: t + 1 - first])
                self.tokens -= c.n_tokens - kept
                self.tokens_kept -= c.n_tokens - kept
                c.n_tokens, c.pruned = kept, t
        self.n_checked = len(self.cands)

    def _finish(self, info: dict, reason: str) -> None:
        info["action"] = "stop"
        self.rounds.append(info)
        self.done, self.stop_reason = True, reason

    def record(self, is_correct, write_candidates: bool) -> dict:
        cfg = self.cfg
        pool = self.view()
        if cfg.rules == "authors":  # theirs: the top candidate by the stopping test's own score
            scores = candidate_scores(pool, "lin", cfg.lam)
        else:
            scores = candidate_scores(pool, cfg.final, cfg.final_lam, cfg.final_tau)
        chosen = int(np.argmax(scores))
        if cfg.final_vote:  # the answer with the most weight, by its best candidate
            answers, w, _ = self._votes(pool, cfg.final_lam)
            voted = weighted_vote(answers, w)
            chosen = chosen if voted is None else voted
        ans = self.cands[chosen].answer
        verdict: dict = {}  # one check per distinct final answer: many candidates share one

        def check(a):
            if a not in verdict:
                verdict[a] = is_correct(self.task, a)
            return verdict[a]

        rec = {
            "id": self.task.id,
            "question": self.task.question,
            "answer": self.task.answer,
            **({"images": self.task.images} if self.task.images else {}),
            "chosen": chosen,
            "chosen_answer": ans,
            "correct": check(ans),
            "stop_reason": self.stop_reason,
            "pool_size": len(self.cands),
            "tokens": self.tokens,
            **({"tokens_kept": self.tokens_kept} if cfg.draws > 1 else {}),
            **({"traces_scored": self.traces_scored} if cfg.rules == "authors" else {}),
            "rounds": self.rounds,
        }
        if write_candidates:
            rec["candidates"] = [
                {
                    "steps": c.steps,
                    "round": c.round,
                    "parent": c.parent,
                    "cut": c.cut,
                    "n_tokens": c.n_tokens,
                    **({"pruned_at": c.pruned} if c.pruned is not None else {}),
                    "answer": c.answer,
                    "correct": check(c.answer),
                    **c.scores.to_dict(),
                }
                for c in self.cands
            ]
        return rec


def run_aca(
    tasks: Sequence[Task],
    generator,
    scorer: Scorer,
    cfg: ACAConfig,
    answer_of: Callable[[list[str]], Hashable | None],
    is_correct: Callable[[Task, Hashable | None], bool | None],
    out=None,
    write_candidates: bool = True,
    progress: bool = True,
    procs: Processes | None = None,
) -> list[dict]:
    """Run ACA on ``tasks``; returns one record per task, in order (done ones read back
    from ``out`` when it already holds them). ``procs`` (``distributed.processes()``, under
    torchrun): the processes share the problems, each writing its part of ``out``; rank 0
    gets every record, the others their own (``distributed.SharedTaskRecords``)."""
    with task_records(out, [t.id for t in tasks], "ACA", procs, progress) as output:
        active = [ACAState(t, cfg) for t in output.todo(tasks)]
        while active:
            comps = generator.generate([s.next_req for s in active])
            new: list[tuple[ACAState, Candidate]] = []
            for s, cs in zip(active, comps):
                parent, cut = s.next_meta
                prefix = list(s.next_req.prefix)
                s.tokens += sum(c.n_tokens for c in cs)
                if s.cfg.draws > 1:
                    cs = [cs[i] for i in aca_rules.keep_longest([c.steps for c in cs], s.next_n)]
                for c in cs:
                    s.tokens_kept += c.n_tokens
                    steps = prefix + list(c.steps)
                    cand = Candidate(
                        steps,
                        c.n_tokens,
                        len(s.rounds),
                        parent,
                        cut,
                        answer=answer_of(steps) if steps else None,
                        step_tokens=step_token_split(c),
                    )
                    s.cands.append(cand)
                    new.append((s, cand))
            scorable = [(s, c) for s, c in new if c.steps]
            if cfg.rules == "authors":  # theirs: the whole pool rescored every round
                scorable = [(s, c) for s in active for c in s.cands if c.steps]
            for s, _ in scorable:
                s.traces_scored += 1
            scored = scorer([s.task.trace(c.steps) for s, c in scorable]) if scorable else []
            for (s, c), sc in zip(scorable, scored):
                c.scores = sc
            for s, c in new:
                if not c.steps:  # the backend returned nothing: a candidate nobody should pick
                    c.scores = StepScores(np.zeros(1), np.ones(1), np.zeros(1))
            still = []
            for s in active:
                s.decide()
                if s.done:
                    output.write(s.task.id, s.record(is_correct, write_candidates))
                else:
                    still.append(s)
            active = still
    return output.records()


def summarize(records: Sequence[dict]) -> dict:
    """Accuracy over the problems with a reference answer (a failed answer check counts as
    not correct and is counted apart; ``no_reference`` counts the others),
    generated tokens in all, mean pool size and the stop reasons."""
    # Problems given without a reference answer have a choice but no accuracy.
    judged = [r for r in records if r.get("answer") is not None]
    correct = np.array([bool(r["correct"]) for r in judged], dtype=float)
    reasons: dict[str, int] = {}
    for r in records:
        reasons[r["stop_reason"]] = reasons.get(r["stop_reason"], 0) + 1
    return {
        "n": len(records),
        "no_reference": len(records) - len(judged),
        "acc": float(correct.mean()) if len(judged) else float("nan"),
        "tokens": int(sum(r["tokens"] for r in records)),
        "mean_pool_size": float(np.mean([r["pool_size"] for r in records])) if records else float("nan"),
        "check_failed": int(sum(r["correct"] is None for r in judged)),
        "stop_reasons": reasons,
    }


def accuracy_phrase(s: dict) -> str:
    """``summarize``'s accuracy in words, saying when problems had no reference answer."""
    if s["n"] == s["no_reference"]:
        return "no reference answers (choices only)"
    judged = s["n"] - s["no_reference"]
    return f"accuracy {s['acc']:.3f}" + (f" on the {judged} with an answer" if s["no_reference"] else "")


def best_of_n_points(records: Sequence[dict], method: str, lam: float = 0.5, tau: float | None = None) -> list[Point]:
    """Best-of-n for n = 1 .. the smallest pool, from the records of a ``best-of-n`` run
    (their first n candidates, picked by the selector ``method`` of ``betaprm.selectors``
    with ``lam`` and ``tau``): one ``evaluation.frontier.Point`` per n (its knob), with the
    generated tokens of those candidates and the per-problem hits."""
    tuned = {method: TuneResult(method, lam, None, tau, float("nan"))}
    pools = [[StepScores(c["mu"], c["kappa"], c["sigma"]) for c in r["candidates"]] for r in records]
    points = []
    for n in range(1, min(len(p) for p in pools) + 1):
        hits, toks = [], 0
        for r, pool in zip(records, pools):
            cands = r["candidates"][:n]
            hits.append(
                bool(hit(method, [c.get("answer") for c in cands], [c["correct"] for c in cands], pool[:n], tuned))
            )
            toks += sum(c["n_tokens"] for c in cands)
        points.append(Point(n, float(toks), np.array(hits, dtype=np.float64)))
    return points


def best_of_n_curve(
    records: Sequence[dict], method: str, lam: float = 0.5, tau: float | None = None
) -> tuple[list[int], list[float]]:
    """Accuracy against generated tokens of Best-of-n (``best_of_n_points``) as two lists."""
    points = best_of_n_points(records, method, lam, tau)
    return [int(p.tokens) for p in points], [p.acc for p in points]
