"""The chain-arithmetic world (docs/design.md section 6): problems, the policy, exact truth.

A problem is a start digit and T operations modulo ``modulus``: ``+ d`` and ``* d`` are
*verifiable* (an observer can recompute the result), ``?`` is a *recall* step that adds
a hidden value ``h`` known to the policy and never shown to the PRM. A latent level z
(easy/hard) sets the policy's error rates and is written in the question only with
probability ``p_visible``.

The policy writes each step from the value it wrote before; a step errs with
probability ``e(op, z)``, adding a nonzero offset (+-1 with total probability
``near_miss``, else uniform over the other offsets). With ``d_t = (v_t - c_t) mod M`` the
offset between written and true values, ``+``/``?`` steps give ``d_t = d_{t-1} + eps``
and ``* k`` gives ``d_t = k d_{t-1} + eps``; the trace is correct iff ``d_T = 0``. That
makes the prefix success probability ``q_t`` a small dynamic programme, and the best
belief anyone could form from what a PRM sees a forward filter over ``(d, z)``.

Just over 400 lines: the world, its exact ``q_t`` and its Bayes filter share the offset
dynamics above and are checked against each other by brute force in the tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ..data.jsonl import load_json_file
from ..data.records import short_repr
from ..errors import BetaPRMInputError

LEVELS = ("easy", "hard")
OPS = ("+", "*", "?")


MAX_MODULUS = 1_000  # the exact filters hold (M, M) tables
MAX_OPS = 1_000


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_prob(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1


def _prob_table(d) -> bool:
    """A dict with exactly the ops as keys and probabilities as values."""
    return isinstance(d, dict) and set(d) == set(OPS) and all(_is_prob(x) for x in d.values())


def _show(x) -> str:
    return short_repr(x, 80)


@dataclass
class WorldConfig:
    """The world's parameters (docs/design.md section 6); JSON keys are these field names."""

    modulus: int = 10
    min_ops: int = 4
    max_ops: int = 8
    op_probs: dict = field(default_factory=lambda: {"+": 0.40, "*": 0.40, "?": 0.20})
    error_rates: dict = field(
        default_factory=lambda: {"easy": {"+": 0.03, "*": 0.08, "?": 0.05}, "hard": {"+": 0.10, "*": 0.25, "?": 0.30}}
    )
    near_miss: float = 0.6
    p_hard: float = 0.5
    p_visible: float = 0.25
    mc_n: int = 16
    connectives: list = field(default_factory=lambda: ["so", "then", "next", "now"])

    def __post_init__(self):
        p = []
        if not (_is_int(self.modulus) and 4 <= self.modulus <= MAX_MODULUS):
            p.append(f"modulus must be an integer in [4, {MAX_MODULUS}], got {_show(self.modulus)}")
        if not (_is_int(self.min_ops) and _is_int(self.max_ops) and 1 <= self.min_ops <= self.max_ops <= MAX_OPS):
            p.append(
                f"need 1 <= min_ops <= max_ops <= {MAX_OPS} (integers), got {_show(self.min_ops)}, "
                f"{_show(self.max_ops)}"
            )
        if not (_prob_table(self.op_probs) and abs(sum(self.op_probs.values()) - 1) <= 1e-9):
            p.append(
                f"op_probs must be an object giving probabilities summing to 1 for exactly {list(OPS)}, got "
                f"{_show(self.op_probs)}"
            )
        if not (
            isinstance(self.error_rates, dict)
            and set(self.error_rates) == set(LEVELS)
            and all(_prob_table(v) and all(x < 1 for x in v.values()) for v in self.error_rates.values())
        ):
            p.append(
                f"error_rates must map easy and hard to a rate in [0, 1) for each of {list(OPS)}, got "
                f"{_show(self.error_rates)}"
            )
        for name in ("near_miss", "p_hard", "p_visible"):
            if not _is_prob(getattr(self, name)):
                p.append(f"{name} must be a number in [0, 1], got {_show(getattr(self, name))}")
        if not (_is_int(self.mc_n) and 1 <= self.mc_n <= 2**24):
            p.append(f"mc_n must be an integer in [1, 2**24], got {_show(self.mc_n)}")
        if not (
            isinstance(self.connectives, list)
            and self.connectives
            and all(isinstance(c, str) and c.strip() and not re.search(r"\d", c) for c in self.connectives)
        ):
            p.append(f"connectives must be a non-empty list of words without digits, got {_show(self.connectives)}")
        if p:
            raise BetaPRMInputError("bad world config: " + "; ".join(p))

    @classmethod
    def from_dict(cls, data: dict, source: str = "world config") -> "WorldConfig":
        if not isinstance(data, dict):
            raise BetaPRMInputError(f"{source}: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise BetaPRMInputError(f"{source}: unknown keys {unknown}; allowed: {sorted(cls.__dataclass_fields__)}")
        try:
            return cls(**data)
        except BetaPRMInputError as e:
            raise BetaPRMInputError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path) -> "WorldConfig":
        return cls.from_dict(load_json_file(path, "--world-config", "a JSON object of world settings"), str(path))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Problem:
    """One chain. ``ops[s] = (op, k)``: ``k`` is the operand for + and *, 0 for ?;
    ``hidden[s]`` is the recalled value h for ? steps (0 otherwise)."""

    id: str
    start: int
    ops: list
    hidden: list
    level: int
    visible: bool
    modulus: int

    @property
    def T(self) -> int:
        return len(self.ops)

    @property
    def question(self) -> str:
        parts = [f"start {self.start}"] + [f"{op} {k}" if op != "?" else "?" for op, k in self.ops]
        parts.append(f"level {LEVELS[self.level] if self.visible else '?'}")
        return " ; ".join(parts)

    def apply(self, s: int, v):
        """The correct result of op s (0-based) applied to value(s) v."""
        op, k = self.ops[s]
        if op == "+":
            return (v + k) % self.modulus
        if op == "*":
            return (v * k) % self.modulus
        return (v + self.hidden[s]) % self.modulus

    def true_values(self) -> list[int]:
        vals, v = [], self.start
        for s in range(self.T):
            v = int(self.apply(s, v))
            vals.append(v)
        return vals

    @property
    def answer(self) -> int:
        return self.true_values()[-1]


@dataclass
class Trace:
    """A policy trace: written values v_1..v_T and the step texts (T op steps + answer)."""

    problem: Problem
    values: list
    steps: list
    n_tokens: int = 0

    @property
    def final(self) -> int:
        return self.values[-1]

    @property
    def correct(self) -> bool:
        return self.final == self.problem.answer


_LAST_INT = re.compile(r"(\d+)\s*$")


def parse_value(step: str) -> int:
    """The value a step wrote: the integer at its end ("so 3 + 4 = 7", "answer 7")."""
    m = _LAST_INT.search(step)
    if m is None:
        raise BetaPRMInputError(
            f"cannot read a value from the step {step!r}; chain-arithmetic steps end with the value they write"
        )
    return int(m.group(1))


def _choice_cdf(p: np.ndarray) -> np.ndarray:
    """The CDF numpy's ``Generator.choice(a, p=p)`` searches: its cumulative sum, scaled
    to end at exactly 1."""
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf


class World:
    """Sampling and exact computation for one ``WorldConfig``."""

    def __init__(self, cfg: WorldConfig | None = None):
        self.cfg = cfg or WorldConfig()
        M = self.cfg.modulus
        self.M = M
        # kernel[z][op] = P(eps | op, z) over eps in 0..M-1.
        self.kernel = np.zeros((2, len(OPS), M))
        for z, level in enumerate(LEVELS):
            for o, op in enumerate(OPS):
                e = self.cfg.error_rates[level][op]
                ker = np.zeros(M)
                ker[0] = 1 - e
                ker[1] += e * self.cfg.near_miss / 2
                ker[M - 1] += e * self.cfg.near_miss / 2
                others = list(range(2, M - 1))
                ker[others] += e * (1 - self.cfg.near_miss) / len(others)
                self.kernel[z, o] = ker
        self._cdfs: dict = {}  # sample_errors' CDFs by (level, op, boost)

    # ------------------------------------------------------------------ sampling
    def sample_problem(self, rng: np.random.Generator, pid: str) -> Problem:
        c = self.cfg
        T = int(rng.integers(c.min_ops, c.max_ops + 1))
        probs = np.array([c.op_probs[o] for o in OPS])
        ops, hidden = [], []
        for _ in range(T):
            op = OPS[int(rng.choice(3, p=probs))]
            if op == "?":
                ops.append(("?", 0))
                hidden.append(int(rng.integers(0, self.M)))
            else:
                ops.append((op, int(rng.integers(1, self.M))))
                hidden.append(0)
        level = int(rng.random() < c.p_hard)
        visible = bool(rng.random() < c.p_visible)
        return Problem(pid, int(rng.integers(0, self.M)), ops, hidden, level, visible, self.M)

    def sample_problems(self, n: int, seed: int, prefix: str = "p") -> list[Problem]:
        rng = np.random.default_rng(seed)
        return [self.sample_problem(rng, f"{prefix}{i}") for i in range(n)]

    def sample_errors(
        self, problem: Problem, s: int, n: int, rng: np.random.Generator, boost: float = 1.0
    ) -> np.ndarray:
        """n error offsets for op s. ``boost`` multiplies the error rate of verifiable
        steps (+ and *) only: it enriches training traces with errors a PRM can see
        (1.0 is the world's policy; 0.0 gives error-free verifiable steps)."""
        if boost == 0.0:
            return np.zeros(n, dtype=np.int64)  # error-free traces
        op = OPS.index(problem.ops[s][0])
        if problem.ops[s][0] == "?":
            boost = 1.0
        key = (problem.level, op, boost)
        cdf = self._cdfs.get(key)
        if cdf is None:
            ker = self.kernel[problem.level, op]
            if boost != 1.0:
                e = min(0.95, (1 - ker[0]) * boost)
                ker = ker.copy()
                ker[1:] *= e / max(1 - ker[0], 1e-12)
                ker[0] = 1 - e
            cdf = self._cdfs[key] = _choice_cdf(ker)
        # rng.choice(M, size=n, p=ker) without its per-call checks of p: the same uniform
        # draws and the same search, so the same offsets (tested against rng.choice).
        return cdf.searchsorted(rng.random(n), side="right").astype(np.int64, copy=False)

    def continue_values(
        self, problem: Problem, prefix_values: Sequence[int], n: int, rng: np.random.Generator, boost: float = 1.0
    ) -> np.ndarray:
        """(n, T - k) written values continuing from the k values already written."""
        k = len(prefix_values)
        v = np.full(n, prefix_values[-1] if k else problem.start, dtype=np.int64)
        out = np.zeros((n, problem.T - k), dtype=np.int64)
        for j, s in enumerate(range(k, problem.T)):
            v = (problem.apply(s, v) + self.sample_errors(problem, s, n, rng, boost)) % self.M
            out[:, j] = v
        return out

    def step_texts(self, problem: Problem, values: Sequence[int], first: int, rng: np.random.Generator) -> list[str]:
        """Texts of op steps ``first..T-1`` (0-based) and the answer step, for written
        ``values`` (all T of them)."""
        conns = self.cfg.connectives
        texts = []
        for s in range(first, problem.T):
            prev = problem.start if s == 0 else int(values[s - 1])
            op, k = problem.ops[s]
            c = conns[int(rng.integers(len(conns)))]
            body = f"{prev} {op} {k} = {int(values[s])}" if op != "?" else f"{prev} ? = {int(values[s])}"
            texts.append(f"{c} {body}")
        texts.append(f"answer {int(values[-1])}")
        return texts

    def sample_traces(self, problem: Problem, n: int, rng: np.random.Generator, boost: float = 1.0) -> list[Trace]:
        vals = self.continue_values(problem, [], n, rng, boost)
        return [Trace(problem, [int(x) for x in row], self.step_texts(problem, row, 0, rng)) for row in vals]

    def values_of(self, problem: Problem, steps: Sequence[str]) -> list[int]:
        """Written values v_1..v_k of op steps (the answer step, if present, excluded)."""
        ops_steps = steps[: problem.T]
        return [parse_value(s) for s in ops_steps]

    # ------------------------------------------------------------------ exact truth
    def _next_offset(self, problem: Problem, s: int, d: np.ndarray) -> np.ndarray:
        op, k = problem.ops[s]
        return (d * k) % self.M if op == "*" else d % self.M

    def q_table(self, problem: Problem) -> np.ndarray:
        """P[t, z, d] = P(final answer correct | offset d after t ops, level z); (T+1, 2, M)."""
        M, T = self.M, problem.T
        P = np.zeros((T + 1, 2, M))
        P[T, :, 0] = 1.0
        eps = np.arange(M)
        for s in range(T - 1, -1, -1):  # op s takes offset after s ops to after s+1
            base = self._next_offset(problem, s, np.arange(M))  # (M,)
            idx = (base[:, None] + eps[None, :]) % M  # (d, eps)
            op = OPS.index(problem.ops[s][0])
            for z in range(2):
                P[s, z] = (self.kernel[z, op][None, :] * P[s + 1, z][idx]).sum(1)
        return P

    def offsets(self, problem: Problem, values: Sequence[int]) -> np.ndarray:
        return (np.asarray(values) - np.asarray(problem.true_values()[: len(values)])) % self.M

    def true_q(self, problem: Problem, values: Sequence[int], table: np.ndarray | None = None) -> np.ndarray:
        """q per step of a full trace: T op steps then the answer step (same as step T)."""
        P = self.q_table(problem) if table is None else table
        d = self.offsets(problem, values)
        q = np.array([P[t + 1, problem.level, d[t]] for t in range(len(values))])
        return np.append(q, q[-1]) if len(values) == problem.T else q

    def _posteriors(self, problem: Problem, values: Sequence[int], check_mod: int | None = None):
        """The posterior over (z, d) after each written value, from what a PRM sees.

        Reads ``problem.ops`` (visible), ``problem.level`` only when ``visible``, and never
        ``problem.hidden``. A verifiable step reveals its error exactly (the observer can
        recompute the result), which updates the belief about z; a recall step reveals
        nothing (its written value is uniform because h is hidden), so the offset belief
        is convolved with each level's error kernel.

        ``check_mod``: an observer with a partial check, who sees a verifiable step's error
        only modulo this divisor of the modulus (2: parity only). It is the best belief of
        a PRM whose step check is that coarse (a diagnostic, not the Bayes belief).
        """
        if check_mod is not None and (check_mod < 1 or self.M % check_mod):
            raise ValueError(f"check_mod must divide the modulus {self.M}, got {check_mod}")
        M = self.M
        if problem.visible:
            prior_z = np.eye(2)[problem.level]
        else:
            prior_z = np.array([1 - self.cfg.p_hard, self.cfg.p_hard])
        post = np.zeros((2, M))
        post[:, 0] = prior_z
        prev = problem.start
        for s, w in enumerate(values):
            op, _ = problem.ops[s]
            o = OPS.index(op)
            base = self._next_offset(problem, s, np.arange(M))
            seen = (w - problem.apply(s, prev)) % M
            if op == "?":
                errs = np.arange(M)
            elif check_mod is None:
                errs = np.array([seen])
            else:  # every error with the same residue looks alike to this observer
                errs = np.arange(seen % check_mod, M, check_mod)
            # new[z, (d + e) mod M after the op] += post[z, d] * P(e | op, z), summed in the
            # order errors-then-offsets (as a loop of np.add.at would, to the last bit).
            bins = ((base[None, :] + errs[:, None]) % M).ravel()
            weights = post[:, None, :] * self.kernel[:, o, errs][:, :, None]
            new = np.stack([np.bincount(bins, weights[z].ravel(), minlength=M) for z in range(2)])
            post = new / new.sum()
            prev = w
            yield post

    def bayes_belief(
        self, problem: Problem, values: Sequence[int], table: np.ndarray | None = None, check_mod: int | None = None
    ):
        """Mean and variance of q_t under the Bayes posterior, per step; for a full trace
        (T values) the answer step repeats step T: (T+1,) each. ``check_mod``: see
        ``_posteriors`` (the belief of an observer with a partial step check)."""
        P = self.q_table(problem) if table is None else table
        means, vars_ = [], []
        for s, post in enumerate(self._posteriors(problem, values, check_mod)):
            q = P[s + 1]  # (2, M)
            m = float((post * q).sum())
            means.append(m)
            vars_.append(max(float((post * q * q).sum()) - m * m, 0.0))
        if len(values) == problem.T:
            means.append(means[-1])
            vars_.append(vars_[-1])
        return np.array(means), np.array(vars_)

    def bayes_summary(
        self, problem: Problem, values: Sequence[int], level: float = 0.9, table: np.ndarray | None = None
    ):
        """Per step: mean and variance of q under the Bayes posterior and the central
        ``level`` interval of that (discrete) posterior; (T+1,) arrays for a full trace."""
        P = self.q_table(problem) if table is None else table
        rows = []
        tail = (1 - level) / 2
        for s, post in enumerate(self._posteriors(problem, values)):
            q = P[s + 1].ravel()
            w = post.ravel()
            m = float(w @ q)
            order = np.argsort(q, kind="stable")
            cdf = np.cumsum(w[order])
            lo = q[order][np.searchsorted(cdf, tail - 1e-12)]
            hi = q[order][min(np.searchsorted(cdf, 1 - tail - 1e-12), len(q) - 1)]
            rows.append((m, max(float(w @ (q * q)) - m * m, 0.0), lo, hi))
        if len(values) == problem.T:
            rows.append(rows[-1])
        return tuple(np.array(col) for col in zip(*rows))
