"""Step-level beam search and DVTS on the chain-arithmetic world: the real policy stepping one
step at a time, the exact Bayes belief as the scorer; accuracy, token accounting, the
reliability options, a backend that cannot stop after a step, and problems without answers."""

import numpy as np
import pytest

from betaprm.aca import summarize
from betaprm.errors import BetaPRMInputError
from betaprm.generation import GenerationRequest
from betaprm.generation.base import Completion
from betaprm.search import SearchConfig, run_search
from betaprm.synth import SynthPolicy, World, synth_answer, synth_is_correct, synth_tasks
from betaprm.synth.experiment import BayesScorer
from betaprm.synth.world import WorldConfig


@pytest.fixture(scope="module")
def world():
    return World(WorldConfig())


@pytest.fixture(scope="module")
def problems(world):
    return world.sample_problems(150, 11, "s")


def run(world, problems, gen=None, **kw):
    gen = gen or SynthPolicy(world, seed=5)
    cfg = SearchConfig(**kw)
    recs = run_search(
        synth_tasks(problems), gen, BayesScorer(world, problems), cfg, synth_answer, synth_is_correct, progress=False
    )
    return recs, summarize(recs)


def test_one_step_requests_cost_one_step(world, problems):
    p = problems[0]
    (one,) = SynthPolicy(world, seed=1).generate([GenerationRequest(p.question, [], 3, p, max_steps=1)])
    assert all(len(c.steps) == 1 and c.finished is False for c in one)
    assert all(c.n_tokens == len(c.steps[0].split()) for c in one)
    (full,) = SynthPolicy(world, seed=1).generate([GenerationRequest(p.question, [], 2, p)])
    assert all(c.finished and c.steps[-1].startswith("answer") for c in full)


@pytest.mark.parametrize("method", ["beam", "dvts"])
def test_search_beats_a_single_sample_and_counts_its_tokens(world, problems, method):
    single = np.mean([t.correct for p in problems for t in SynthPolicy(world, seed=9).sample_traces(p, 4)])
    recs, s = run(world, problems, method=method, n=8, width=4)
    assert s["acc"] > single + 0.15, (s["acc"], single)
    # Tokens: every generated step is paid for once; a search of 8 beams over T+1 steps
    # generates about 8 (T + 1) steps' worth, far less than 8 whole traces per round.
    for r, p in zip(recs, problems):
        assert r["pool_size"] >= 1 and r["rounds"] <= p.T + 1
        assert r["generated_completions"] <= 8 * (p.T + 1)
    steps_words = np.mean([len(t.steps[0].split()) for t in SynthPolicy(world, seed=3).sample_traces(problems[0], 4)])
    assert s["tokens"] <= 8 * sum(p.T + 1 for p in problems) * steps_words * 1.3


def test_reliability_options_run_and_pruning_saves_nothing_it_should_not(world, problems):
    _, plain = run(world, problems, n=8, width=2)
    _, ucb = run(world, problems, n=8, width=2, rank="ucb", c=0.5)
    _, pruned = run(world, problems, n=8, width=2, prune=True, c=0.5)
    for s in (ucb, pruned):
        assert s["acc"] > plain["acc"] - 0.1 and s["n"] == len(problems)


def test_a_backend_that_returns_whole_completions_is_cut_to_one_step_and_charged_for_all(world, problems):
    class Whole:
        """Ignores max_steps and does not say whether it finished (like the text backends)."""

        def __init__(self):
            self.inner = SynthPolicy(world, seed=5)

        def generate(self, requests):
            out = self.inner.generate(
                [GenerationRequest(r.question, r.prefix, r.n, r.problem, r.seed) for r in requests]
            )
            return [[Completion(c.steps, c.n_tokens) for c in cs] for cs in out]

    _, exact = run(world, problems[:40], n=4, width=2)
    _, whole = run(world, problems[:40], gen=Whole(), n=4, width=2)
    assert whole["tokens"] > 1.5 * exact["tokens"]  # the discarded rest of each completion is paid for
    assert whole["acc"] > 0.5


def test_without_reference_answers_the_choice_is_returned(world, problems):
    cfg = SearchConfig(method="dvts", n=4, width=2)
    recs = run_search(
        synth_tasks(problems[:5]),
        SynthPolicy(world, seed=1),
        BayesScorer(world, problems),
        cfg,
        synth_answer,
        progress=False,
    )
    assert all(r["correct"] is None and r["chosen_answer"] is not None for r in recs)


def test_bad_search_configuration_is_one_clear_error():
    with pytest.raises(BetaPRMInputError, match="multiple of width"):
        SearchConfig(n=6, width=4)
    with pytest.raises(BetaPRMInputError, match="method"):
        SearchConfig(method="mcts")
