"""Step-level search guided by a PRM: beam search and DVTS (diverse verifier tree search),
as search-and-learn defines them, with BetaPRM's reliability as an option.

A search grows partial traces one step at a time: each round, one generation call asks for
the next step of every beam that is kept (``GenerationRequest.max_steps = 1``), one scoring
call scores the new prefixes, and the beams are ranked by the PRM's score of their latest
step:

- ``beam``: ``n`` beams; each round keeps the best ``n / width`` unfinished ones and
  extends each ``width`` times (so ``n`` new steps per round);
- ``dvts``: ``n / width`` independent subtrees of ``width`` beams; each subtree keeps its
  single best beam and extends it ``width`` times: less pruning across subtrees, more diverse
  final answers.

``rank`` chooses the ranking score: ``mu`` (search-and-learn's), or ``ucb`` = ``mu + c *
sigma`` (optimism under BetaPRM's uncertainty: a step the PRM is unsure about is explored
before one it is sure is mediocre). With ``prune`` a beam whose upper bound ``mu + c * sigma``
is below another's lower bound ``mu - c * sigma`` is dropped even when a slot is free, and
the kept beams share its extensions (beam search only). With ``repair`` a kept beam whose
latest step looks wrong (``mu - c * sigma < p_bad``) is cut before its earliest
wrong-looking step and continued from there, as ACA repairs from its cut point (a wrong step
is not built on). A finished beam (its completion
wrote the final answer) leaves the search; the search ends when no beam is left unfinished or
after ``max_rounds`` rounds (then the kept beams are completed in one call). The final answer
is chosen among the finished beams by ``final`` (a selector of ``betaprm.selection``).

Generated tokens are counted as ACA counts them (per completion, prompt and kept prefix
excluded). A backend that cannot stop after one step returns whole completions: the search
keeps their first step and is charged for all their tokens (the synthetic policy stops
exactly). Records have ACA's form (``aca.summarize`` reads them).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .aca import cut_problems, final_selector_problems
from .distributed import Processes, task_records
from .errors import BetaPRMInputError
from .generation.base import GenerationRequest
from .options import opt as _f
from .selection import METHODS, candidate_scores
from .types import StepScores, Task

METHODS_SEARCH = ("beam", "dvts")
RANKS = ("mu", "ucb")


@dataclass
class SearchConfig:
    """Beam search / DVTS parameters (search-and-learn's defaults where it has them)."""

    method: str = _f("beam", "beam (beam search) or dvts (diverse verifier tree search)", choices=METHODS_SEARCH)
    n: int = _f(16, "beams: steps generated per round (beam) or subtrees x width (dvts)")
    width: int = _f(4, "extensions per kept beam (search-and-learn's beam_width)")
    max_rounds: int = _f(40, "rounds of one step each; then the kept beams are completed in one call")
    rank: str = _f("mu", "ranking score of a beam's latest step: mu, or ucb (mu + c * sigma)", choices=RANKS)
    c: float = _f(1.0, "width of the bounds mu +- c * sigma (rank ucb, prune)")
    prune: bool = _f(False, "beam: drop a beam whose upper bound is below another beam's lower bound")
    repair: bool = _f(
        False,
        "a kept beam whose latest step looks wrong (mu - c * sigma < p_bad) has that step written anew instead of "
        "being extended, as ACA repairs from its cut point",
    )
    p_bad: float = _f(0.3, "repair: the threshold of a wrong-looking step")
    final: str = _f(
        "last",
        f"selector of the final answer among finished beams: {', '.join(METHODS)} (betaprm.selection)",
        choices=METHODS,
    )
    final_lam: float = _f(0.5, "lambda of the final selector")
    final_tau: float | None = _f(None, "S_RB's sigma threshold (required for final rb)")
    seed: int = _f(0, "sampling seed (each request's seed derives from it, the problem id, round and beam)")

    def __post_init__(self):
        bad = []
        if self.method not in METHODS_SEARCH:
            bad.append(f"method must be one of {', '.join(METHODS_SEARCH)}, got {self.method!r}")
        if self.rank not in RANKS:
            bad.append(f"rank must be one of {', '.join(RANKS)}, got {self.rank!r}")
        if self.width < 1 or self.n < self.width or self.n % self.width:
            bad.append(f"n ({self.n}) must be a positive multiple of width ({self.width})")
        if self.max_rounds < 1:
            bad.append(f"max_rounds must be >= 1, got {self.max_rounds}")
        bad += cut_problems(self.p_bad)
        bad += final_selector_problems(self.final, self.final_tau)
        if bad:
            raise BetaPRMInputError("bad search configuration: " + "; ".join(bad))


@dataclass
class Beam:
    steps: list[str]
    group: int  # the DVTS subtree (0 for beam search)
    finished: bool = False
    scores: StepScores | None = None
    answer: Hashable | None = None


def _seed(seed: int, task_id: str, rnd: int, k: int) -> int:
    return zlib.crc32(f"{seed}/{task_id}/{rnd}/{k}".encode()) & 0x7FFFFFFF


class _Search:
    """One problem's search state."""

    def __init__(self, task: Task, cfg: SearchConfig):
        self.task, self.cfg = task, cfg
        groups = cfg.n // cfg.width if cfg.method == "dvts" else 1
        per_root = cfg.width if cfg.method == "dvts" else cfg.n
        # (prefix, group, how many extensions) of the next round
        self.plan = [([], g, per_root) for g in range(groups)]
        self.finished: list[Beam] = []
        self.tokens = 0
        self.rounds = 0
        self.generated = 0
        self.repairs = 0

    def requests(self, complete: bool) -> list[GenerationRequest]:
        return [
            GenerationRequest(
                self.task.question,
                list(prefix),
                n,
                self.task.handle,
                _seed(self.cfg.seed, self.task.id, self.rounds, k),
                images=list(self.task.images),
                max_steps=None if complete else 1,
            )
            for k, (prefix, _, n) in enumerate(self.plan)
        ]

    def _score(self, b: Beam) -> tuple[float, float]:
        mu, sig = float(b.scores.mu[-1]), float(b.scores.sigma[-1]) if b.scores.sigma is not None else 0.0
        return mu, sig

    def advance(self, beams: list[Beam]) -> None:
        """The round's new beams (scored): keep the finished, plan the next round."""
        cfg = self.cfg
        self.rounds += 1
        self.finished += [b for b in beams if b.finished]
        open_ = [b for b in beams if not b.finished]
        self.plan = []
        if not open_:
            return
        key = []
        for b in open_:
            mu, sig = self._score(b)
            key.append(mu + cfg.c * sig if cfg.rank == "ucb" else mu)
        key = np.array(key)
        if cfg.method == "dvts":
            for g in sorted({b.group for b in open_}):
                members = [i for i, b in enumerate(open_) if b.group == g]
                best = max(members, key=lambda i: (key[i], -i))
                self.plan.append((self._grow_from(open_[best]), g, cfg.width))
            return
        keep = sorted(range(len(open_)), key=lambda i: (-key[i], i))[: cfg.n // cfg.width]
        if cfg.prune:
            bounds = [self._score(open_[i]) for i in keep]
            best_lcb = max(m - cfg.c * s for m, s in bounds)
            keep = [i for i, (m, s) in zip(keep, bounds) if m + cfg.c * s >= best_lcb]
        # The kept beams share the round's n extensions (more each when some were pruned).
        share = [cfg.n // len(keep) + (1 if r < cfg.n % len(keep) else 0) for r in range(len(keep))]
        self.plan = [(self._grow_from(open_[i]), 0, k) for i, k in zip(keep, share)]

    def _grow_from(self, b: Beam) -> list[str]:
        """The prefix the next round continues: the beam, or, when its latest step looks
        wrong and ``repair`` is on, the steps before the earliest wrong-looking one (ACA's
        cut point), so that the wrong step is written anew."""
        mu, sig = self._score(b)
        if not self.cfg.repair or mu - self.cfg.c * sig >= self.cfg.p_bad:
            return b.steps
        s = b.scores
        sigma = s.sigma if s.sigma is not None else np.zeros_like(s.mu)
        cut = int(np.argmax(s.mu - self.cfg.c * sigma < self.cfg.p_bad))  # the earliest (the latest qualifies)
        self.repairs += 1
        return b.steps[:cut]

    def record(self, is_correct, write_candidates: bool) -> dict:
        cfg = self.cfg
        pool = self.finished
        rec = {"id": self.task.id, "question": self.task.question, "answer": self.task.answer}
        if self.task.images:
            rec["images"] = self.task.images
        if pool:
            scores = candidate_scores([b.scores for b in pool], cfg.final, cfg.final_lam, cfg.final_tau)
            chosen = int(np.argmax(scores))
            ans = pool[chosen].answer
        else:
            chosen, ans = None, None
        rec.update(
            chosen=chosen,
            chosen_answer=ans,
            correct=is_correct(self.task, ans) if is_correct is not None and pool else None,
            stop_reason=cfg.method,
            pool_size=len(pool),
            tokens=self.tokens,
            rounds=self.rounds,
            generated_completions=self.generated,
            repairs=self.repairs,
        )
        if write_candidates:
            rec["candidates"] = [{"steps": b.steps, "answer": b.answer, **b.scores.to_dict()} for b in pool]
        return rec


def run_search(
    tasks: Sequence[Task],
    generator,
    scorer: Callable,
    cfg: SearchConfig,
    answer_of: Callable[[list[str]], Hashable | None],
    is_correct: Callable[[Task, Hashable | None], bool | None] | None = None,
    write_candidates: bool = False,
    progress: bool = True,
    out=None,
    procs: Processes | None = None,
) -> list[dict]:
    """Beam search or DVTS on ``tasks`` in lockstep (one generation and one scoring call a
    round over every problem still searching); one record per task, in order. Without
    ``is_correct`` (no reference answers) a record has the choice and ``correct: None``.
    ``out``: a JSONL file each finished problem appends its record to; a rerun skips the
    problems already there (requests carry seeds derived from the problem, round and beam,
    so a resumed run draws what an uninterrupted one would). ``procs``: as ``aca.run_aca``'s."""
    with task_records(out, [t.id for t in tasks], "search", procs, progress, desc=cfg.method) as output:
        active = [_Search(t, cfg) for t in output.todo(tasks)]
        while active:
            plans = [
                (s, req, grp)
                for s in active
                for req, (_, grp, _) in zip(s.requests(s.rounds >= cfg.max_rounds), s.plan)
            ]
            comps = generator.generate([req for _, req, _ in plans])
            grown: list[tuple[_Search, Beam]] = []
            for (s, req, grp), cs in zip(plans, comps):
                for c in cs:
                    s.tokens += c.n_tokens
                    s.generated += 1
                    new = list(c.steps)
                    limit = req.max_steps
                    if c.finished is not None:
                        done = c.finished
                    else:  # a backend that does not stop after a step: keep its first one(s)
                        done = limit is None or len(new) <= limit
                    if limit is not None and len(new) > limit:
                        new = new[:limit]
                    steps = list(req.prefix) + new
                    if not new:  # nothing generated: the beam cannot go on
                        continue
                    grown.append((s, Beam(steps, grp, done, answer=answer_of(steps) if done else None)))
            scored = scorer([s.task.trace(b.steps) for s, b in grown]) if grown else []
            by_state: dict[int, list[Beam]] = {}
            for (s, b), sc in zip(grown, scored):
                b.scores = sc
                by_state.setdefault(id(s), []).append(b)
            still = []
            for s in active:
                s.advance(by_state.get(id(s), []))
                if s.plan:
                    still.append(s)
                    continue
                output.write(s.task.id, s.record(is_correct, write_candidates))
            active = still
    return output.records()
