"""The chain-arithmetic policy behind the ``Generator`` protocol, and MC labelling.

Importing this module registers the policy as the generation backend ``synth``
(``generation.factory.register_backend``): ``build_generator`` makes it for options with
``backend="synth"``, given the ``World`` whose problems it continues."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import BetaPRMInputError
from ..generation.base import Completion, GenerationRequest
from ..generation.factory import register_backend
from ..types import Task
from .world import Problem, Trace, World, parse_value


class SynthPolicy:
    """Continues any prefix of a chain-arithmetic trace with the world's policy.

    The request's ``problem`` must be the ``Problem`` (the policy knows its hidden values
    and level). ``count_tokens`` gives the token cost of a generated step (the PRM
    tokenizer's count in the demo; words by default).
    """

    def __init__(
        self, world: World, seed: int = 0, count_tokens: Callable[[str], int] | None = None, error_boost: float = 1.0
    ):
        self.world = world
        self.rng = np.random.default_rng(seed)
        self.count_tokens = count_tokens or (lambda s: len(s.split()))
        self.error_boost = error_boost

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        out = []
        for req in requests:
            p: Problem = req.problem
            if not isinstance(p, Problem):
                raise TypeError("SynthPolicy needs GenerationRequest.problem to be a synth Problem")
            if len(req.prefix) > p.T:  # the answer step is already written: nothing to add
                out.append([Completion([], 0) for _ in range(req.n)])
                continue
            rng = self.rng if req.seed is None else np.random.default_rng(req.seed)
            prefix_vals = self.world.values_of(p, req.prefix)
            cont = self.world.continue_values(p, prefix_vals, req.n, rng, self.error_boost)
            comps = []
            for row in cont:
                values = list(prefix_vals) + [int(x) for x in row]
                steps = self.world.step_texts(p, values, len(prefix_vals), rng)
                # The policy writes step by step: stopping after max_steps costs only those.
                done = req.max_steps is None or len(steps) <= req.max_steps
                steps = steps if done else steps[: req.max_steps]
                per_step = [self.count_tokens(s) for s in steps]
                comps.append(Completion(steps, sum(per_step), finished=done, step_tokens=per_step))
            out.append(comps)
        return out

    def sample_traces(self, problem: Problem, n: int) -> list[Trace]:
        """n complete traces (steps, written values and token counts) from scratch."""
        (comps,) = self.generate([GenerationRequest(problem.question, [], n, problem)])
        return [Trace(problem, self.world.values_of(problem, c.steps), c.steps, c.n_tokens) for c in comps]


def mc_label(world: World, generator, trace: Trace, n: int) -> list[int]:
    """K_t for every step of ``trace``: of ``n`` continuations sampled through
    ``generator`` from the prefix ending at step t, how many end with the right answer
    (checked by the world: the last step's value against the problem's answer)."""
    p = trace.problem
    if type(generator) is SynthPolicy:
        return _synth_counts(generator, trace, n)
    reqs = [GenerationRequest(p.question, trace.steps[: t + 1], n, p) for t in range(len(trace.steps))]
    ks, answer = [], p.answer  # computed once: it walks the whole chain
    for t, comps in enumerate(generator.generate(reqs)):
        full_last = [c.steps[-1] if c.steps else trace.steps[t] for c in comps]
        ks.append(sum(parse_value(s) == answer for s in full_last))
    return ks


def _synth_counts(policy: SynthPolicy, trace: Trace, n: int) -> list[int]:
    """``mc_label`` for the world's own policy without writing the continuations' texts:
    only their final values decide K. The same random draws in the same order as
    ``SynthPolicy.generate`` (the errors, then one connective per written op step), so the
    counts are the same as through ``generate``, several times faster (the demo labels
    about 170,000 steps 16 times each)."""
    w, p, rng = policy.world, trace.problem, policy.rng
    answer, n_conn = p.answer, len(w.cfg.connectives)
    values = w.values_of(p, trace.steps)  # as written in the steps, as generate reads them
    ks = []
    for t in range(len(trace.steps)):
        if t + 1 > p.T:  # the answer step is written: every continuation ends with it
            ks.append(n * int(parse_value(trace.steps[t]) == answer))
            continue
        prefix = values[: t + 1]
        cont = w.continue_values(p, prefix, n, rng, policy.error_boost)
        rng.integers(n_conn, size=n * cont.shape[1])  # the connectives step_texts would draw
        final = cont[:, -1] if cont.shape[1] else np.full(n, prefix[-1])
        ks.append(int((final == answer).sum()))
    return ks


def synth_tasks(problems: Sequence[Problem]) -> list:
    """ACA / labeller tasks for chain-arithmetic problems (the Problem is the handle the
    policy continues)."""
    return [Task(p.id, p.question, p.answer, p) for p in problems]


def synth_answer(steps: Sequence[str]) -> int | None:
    """The value a chain-arithmetic trace ends with (None when the last step has none)."""
    try:
        return parse_value(steps[-1])
    except (BetaPRMInputError, IndexError):
        return None


def synth_is_correct(task, answer) -> bool:
    """The world's exact checker: the final value equals the true answer."""
    return answer is not None and int(answer) == int(task.handle.answer)


def synth_generator(opts, seed: int = 0, world: World | None = None, count_tokens=None) -> SynthPolicy:
    """The ``synth`` backend of ``generation.factory.build_generator``: the policy of
    ``world`` (default: the default world), seeded, counting tokens with ``count_tokens``
    (words by default). ``opts`` (the backend options) has nothing it reads."""
    return SynthPolicy(world or World(), seed=seed, count_tokens=count_tokens)


register_backend("synth", synth_generator, needs_policy=False)
