"""Stopping on answers (betaprm.adaptive_vote) and the answer-level ACA variants: the
unweighted unbounded-horizon rule against Adaptive-Consistency's own Beta rule, re-written
here from their source; ESC's window; DeepConf's filter and consensus; pruning while a
candidate is written and its token accounting; the variants on the chain-arithmetic world
(resumed equals uninterrupted, the final vote, the tokens)."""

import json

import numpy as np
import pytest
from scipy import integrate

from betaprm import adaptive_vote as av
from betaprm.aca import ACAConfig, ACAState, Candidate, Task, run_aca, summarize
from betaprm.generation.base import Completion, step_token_split
from betaprm.selection import weighted_vote
from betaprm.synth import SynthPolicy, World, synth_answer, synth_is_correct, synth_tasks
from betaprm.synth.experiment import BayesScorer
from betaprm.types import StepScores


def _ac_beta_rule(answers) -> float:
    """Adaptive-Consistency's BetaStoppingCriteria.should_stop probability, as their source
    computes it: the two most common answers' counts a, b and
    int_0.5^1 x^a (1-x)^b dx / int_0^1 x^a (1-x)^b dx."""
    from collections import Counter

    most = Counter(answers).most_common(2)
    a, b = (most[0][1], 0) if len(most) == 1 else (most[0][1], most[1][1])
    num = integrate.quad(lambda x: x**a * (1 - x) ** b, 0.5, 1)[0]
    return num / integrate.quad(lambda x: x**a * (1 - x) ** b, 0, 1)[0]


@pytest.mark.parametrize(
    "answers", [["7"] * 4, ["7", "7", "7", "8"], ["7", "8", "7", "9", "7", "7"], ["1", "2"], ["3"] * 9 + ["4"] * 5]
)
def test_unweighted_unbounded_rule_is_adaptive_consistency(answers):
    w, u = np.ones(len(answers)), np.zeros(len(answers))
    prob, leader = av.leader_stays(answers, w, u, None, np.random.default_rng(0))
    assert prob == pytest.approx(_ac_beta_rule(answers), abs=1e-9)
    assert leader == max(dict.fromkeys(answers), key=answers.count)


def test_leader_stays_behaves_as_a_probability_of_the_budget_left():
    rng = np.random.default_rng
    answers = ["7", "7", "7", "8"]
    w, u = np.ones(4), np.zeros(4)
    assert av.leader_stays(answers, w, u, 0, rng(0)) == (1.0, "7")  # nothing left to change it
    probs = [av.leader_stays(answers, w, u, r, rng(1), n_sims=4000)[0] for r in (1, 4, 12, 40)]
    assert all(a >= b - 0.02 for a, b in zip(probs, probs[1:]))  # more draws to come: less sure
    assert probs[0] == 1.0  # one draw cannot overturn 3 to 1
    # Weights: the same answers, the leader's votes weak and the rival's strong, is less sure.
    strong_rival = np.array([0.3, 0.3, 0.3, 0.9])
    assert av.leader_stays(answers, strong_rival, u, 8, rng(2))[0] < av.leader_stays(answers, w, u, 8, rng(2))[0]
    # Spread (learned reliability): an uncertain margin is less sure than the same margin known exactly.
    close = np.array([0.5, 0.5, 0.5, 1.4])
    exact = av.leader_stays(answers, close, np.zeros(4), None, rng(3))[0]
    spread = av.leader_stays(answers, close, np.full(4, 0.4), None, rng(3), n_sims=4000)[0]
    assert spread != exact and 0 < spread < 1
    # No stated answer: nothing to stop on.
    assert av.leader_stays([None, None], np.ones(2), np.zeros(2), 4, rng(0)) == (0.0, None)


def test_window_filter_and_consensus():
    assert av.window_agrees(["1", "2", "3", "3", "3"], 3)
    assert not av.window_agrees(["3", "3", "2"], 3) and not av.window_agrees(["3", "3"], 3)
    assert not av.window_agrees([None, None, None], 3)
    assert av.kept(np.array([0.1, 0.9, 0.5, 0.7]), 0.5).tolist() == [False, True, False, True]
    assert av.kept(np.array([0.1, 0.2]), 1.0).all() and av.kept(np.array([0.3]), 0.1).tolist() == [True]
    assert av.consensus(["a", "b", "a", None], np.array([1.0, 1.0, 2.0, 5.0])) == pytest.approx(0.75)


def test_pruning_level_and_step():
    first = [
        StepScores(np.array(m), np.ones(len(m)), np.array(s))
        for m, s in [([0.9, 0.8], [0.0, 0.1]), ([0.4, 0.6], [0.1, 0.1])]
    ]
    level = av.prune_level(first, c=1.0, q=0.0)  # the lowest of the lowest upper bounds
    assert level == pytest.approx(0.5)
    s = StepScores(np.array([0.9, 0.3, 0.2, 0.1]), np.ones(4), np.array([0.1, 0.1, 0.1, 0.0]))
    assert av.prune_step(s, 1.0, level) == 1
    assert av.prune_step(s, 1.0, level, first=2) == 2
    assert av.prune_step(StepScores(np.array([0.9, 0.1]), np.ones(2), np.zeros(2)), 1.0, level) is None  # answer step


def test_step_tokens_split_sums_to_the_completion():
    c = Completion(["a", "bbbbbbb", "cc"], 23)
    split = step_token_split(c)
    assert sum(split) == 23 and split[1] > split[2] > 0
    assert step_token_split(Completion(["a", "b"], 5, step_tokens=[2, 3])) == [2, 3]
    assert step_token_split(Completion([], 0)) == []


def _state(cands, **kw):
    s = ACAState(Task("t", "q"), ACAConfig(final="lin", **kw))
    for ans, mu, sig in cands:
        s.cands.append(
            Candidate(
                ["x"] * len(mu), 1, 0, answer=ans, scores=StepScores(np.array(mu), np.ones(len(mu)), np.array(sig))
            )
        )
    return s


def test_the_final_vote_and_the_runner_up_by_hand():
    cands = [("7", [0.9, 0.6], [0.1, 0.1]), ("8", [0.95, 0.95], [0.0, 0.0]), ("7", [0.9, 0.6], [0.1, 0.1])]
    s = _state(cands, final_vote=True, final_lam=0.5)
    rec = s.record(lambda task, a: a == "7", write_candidates=False)
    # weights mean(mu - 0.5 sigma): 0.7, 0.95, 0.7; "7" gathers 1.4 against 0.95
    assert rec["chosen_answer"] == "7" and rec["chosen"] == weighted_vote(["7", "8", "7"], [0.7, 0.95, 0.7])
    assert _state(cands, final_vote=False).record(lambda t, a: a == "7", False)["chosen_answer"] == "8"
    ru = _state(cands, stop_rule="vote", allocate="runner-up", stop_threshold=1.0, budget=8)
    ru.decide()
    assert ru.rounds[-1]["repaired"] == 1  # the runner-up answer's best (only) candidate


@pytest.fixture(scope="module")
def world_problems():
    world = World()
    return world, world.sample_problems(40, seed=11, prefix="v")


VARIANTS = {
    "vote": dict(stop_rule="vote", allocate="fresh", prune=True, final_vote=True),
    "ac": dict(stop_rule="ac", allocate="fresh", weighted=False, final_vote=True),
    "esc": dict(stop_rule="window", allocate="fresh", weighted=False, final_vote=True, n0=4, m=4),
    "deepconf": dict(
        stop_rule="consensus", allocate="fresh", prune=True, final_vote=True, uncertainty="none", keep_top=0.9
    ),
}


def _run(world, problems, cfg, out=None):
    return run_aca(
        synth_tasks(problems),
        SynthPolicy(world, seed=0, count_tokens=len),
        BayesScorer(world, problems),
        cfg,
        synth_answer,
        synth_is_correct,
        out=out,
        progress=False,
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_answer_level_variants_account_their_tokens_and_resume_alike(world_problems, tmp_path, name):
    world, problems = world_problems
    cfg = ACAConfig(final="lin", **VARIANTS[name])
    full = _run(world, problems, cfg)
    for r in full:
        assert r["tokens"] == sum(c["n_tokens"] for c in r["candidates"])  # pruned ones: up to their stop
        for c in r["candidates"]:
            if "pruned_at" in c:
                assert c["round"] > 0 and c["pruned_at"] < len(c["steps"]) - 1
                assert c["n_tokens"] == sum(len(s) for s in c["steps"][(c["cut"] or 0) : c["pruned_at"] + 1])
        votes = [None if "pruned_at" in c else c["answer"] for c in r["candidates"]]
        assert r["chosen_answer"] in votes
    # A run killed after some problems and resumed writes what an uninterrupted one does.
    out = tmp_path / "o.jsonl"
    _run(world, problems[:15], cfg, out)
    assert _run(world, problems, cfg, out) == full
    written = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}  # in finishing order
    assert len(written) == len(full) and all(written[r["id"]] == r for r in full)


def test_vote_stopping_spends_less_than_the_budget_and_keeps_the_votes_accuracy(world_problems):
    world, problems = world_problems
    bon = summarize(_run(world, problems, ACAConfig.best_of_n(final="lin", final_vote=True)))
    vote = summarize(_run(world, problems, ACAConfig(final="lin", **VARIANTS["vote"])))
    assert vote["tokens"] < 0.8 * bon["tokens"]
    assert vote["acc"] >= bon["acc"] - 0.1


def test_cli_answer_level_variants(tmp_path, capsys):
    from betaprm.cli import main
    from betaprm.model import BetaPRM
    from betaprm.provenance import meta_path
    from tests.helpers import make_lm_dir

    BetaPRM.from_backbone(str(make_lm_dir(tmp_path / "lm", hidden=16, layers=1))).save_pretrained(tmp_path / "prm")
    common = ["aca", "--model", str(tmp_path / "prm"), "--n-problems", "4", "--final", "lin", "--device", "cpu"]
    for variant in ("vote", "esc", "deepconf", "adaptive-consistency", "vote-sigma0", "vote-runner-up"):
        out = tmp_path / f"{variant}.jsonl"
        assert main([*common, "--variant", variant, "--m", "2", "--out", str(out)]) == 0, capsys.readouterr().err
        assert len(out.read_text().splitlines()) == 4
        assert json.loads(meta_path(out).read_text())["settings"]["variant"] == variant
    esc = [json.loads(line) for line in (tmp_path / "esc.jsonl").read_text().splitlines()]
    assert all(c["round"] > 0 or i < 2 for r in esc for i, c in enumerate(r["candidates"]))  # first window: --m
    assert main([*common, "--variant", "vote", "--stop-threshold", "1.5", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "stop_threshold must be in [0, 1]" in capsys.readouterr().err


def test_the_demos_policy_cache_changes_no_record(world_problems):
    """The demo's variants share one CachedPolicy: a seeded request is answered once and read
    back by later variants, and every variant's records equal a run with its own policy."""
    from betaprm.synth.frontiers import CachedPolicy, answer_level_variants

    world, problems = world_problems
    cfgs = [ACAConfig(**v) for _, v in answer_level_variants(0.5, 0).values()] + [ACAConfig(final="lin")]

    def run(policy, cfg):
        return run_aca(
            synth_tasks(problems),
            policy,
            BayesScorer(world, problems),
            cfg,
            synth_answer,
            synth_is_correct,
            progress=False,
        )

    shared = CachedPolicy(SynthPolicy(world, seed=9, count_tokens=len))
    assert [run(shared, c) for c in cfgs] == [run(SynthPolicy(world, seed=9, count_tokens=len), c) for c in cfgs]
    assert len(shared.cache) < sum(r["pool_size"] for r in run(shared, cfgs[0])) * len(cfgs)
