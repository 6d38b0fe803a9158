"""The chain-arithmetic world: the DP and the Bayes filter against brute force and Monte Carlo."""

import dataclasses
import itertools
import json

import numpy as np
import pytest

from betaprm.errors import BetaPRMInputError
from betaprm.generation import GenerationRequest, Generator
from betaprm.synth import Problem, SynthPolicy, World, WorldConfig, mc_label
from betaprm.synth.world import OPS

DESIGN_DEFAULTS = {
    "modulus": 10,
    "min_ops": 4,
    "max_ops": 8,
    "op_probs": {"+": 0.40, "*": 0.40, "?": 0.20},
    "error_rates": {"easy": {"+": 0.03, "*": 0.08, "?": 0.05}, "hard": {"+": 0.10, "*": 0.25, "?": 0.30}},
    "near_miss": 0.6,
    "p_hard": 0.5,
    "p_visible": 0.25,
    "mc_n": 16,
    "connectives": ["so", "then", "next", "now"],
}

SMALL = WorldConfig(
    modulus=5,
    min_ops=2,
    max_ops=3,
    error_rates={"easy": {"+": 0.1, "*": 0.2, "?": 0.15}, "hard": {"+": 0.3, "*": 0.4, "?": 0.45}},
)


def test_config_defaults_and_errors(tmp_path):
    assert WorldConfig().to_dict() == DESIGN_DEFAULTS
    with pytest.raises(BetaPRMInputError, match=r"unknown keys \['modulo'\]"):
        WorldConfig.from_dict({"modulo": 7})
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"modulus": 7, "p_visible": 0.5}))
    cfg = WorldConfig.from_json(f)
    assert cfg.modulus == 7 and cfg.p_visible == 0.5 and cfg.mc_n == 16
    with pytest.raises(BetaPRMInputError, match="op_probs"):
        WorldConfig(op_probs={"+": 0.5, "*": 0.6, "?": 0.0})


def _small_problems():
    w = World(SMALL)
    probs = []
    for ops in itertools.product([("+", 2), ("*", 3), ("*", 1), ("?", 0)], repeat=3):
        for level in (0, 1):
            probs.append(Problem("t", 1, list(ops), [4 if o == "?" else 0 for o, _ in ops], level, False, 5))
    return w, probs


def _brute_q(w, p, s0, d0):
    """P(d_T = 0 | offset d0 after s0 ops) by enumerating every error sequence."""
    total = 0.0
    rest = range(s0, p.T)
    for errs in itertools.product(range(w.M), repeat=len(rest)):
        prob, d = 1.0, d0
        for s, e in zip(rest, errs):
            prob *= w.kernel[p.level, OPS.index(p.ops[s][0]), e]
            op, k = p.ops[s]
            d = ((d * k) if op == "*" else d) % w.M
            d = (d + e) % w.M
        total += prob * (d == 0)
    return total


def test_dp_matches_brute_force():
    w, probs = _small_problems()
    for p in probs[:40]:
        P = w.q_table(p)
        for s0 in range(p.T + 1):
            for d0 in range(w.M):
                assert P[s0, p.level, d0] == pytest.approx(_brute_q(w, p, s0, d0), abs=1e-12)


def _brute_belief(w, p, values):
    """Mean and variance of q given the written values, by enumerating the hidden
    variables (level, recalled values, every step's error) and keeping the consistent ones."""
    M, t = w.M, len(values)
    prior = [1 - w.cfg.p_hard, w.cfg.p_hard]
    recall = [s for s in range(t) if p.ops[s][0] == "?"]
    P = w.q_table(p)
    weights, qs = [], []
    for z in (0, 1):
        for hs in itertools.product(range(M), repeat=len(recall)):
            hidden = list(p.hidden)
            for s, h in zip(recall, hs):
                hidden[s] = h
            q = dataclasses.replace(p, hidden=hidden)
            truth = q.true_values()
            for errs in itertools.product(range(M), repeat=t):
                prob = prior[z] * (1 / M) ** len(recall)
                v, ok = p.start, True
                for s, e in enumerate(errs):
                    prob *= w.kernel[z, OPS.index(p.ops[s][0]), e]
                    v = (q.apply(s, v) + e) % M
                    if v != values[s]:
                        ok = False
                        break
                if ok and prob > 0:
                    weights.append(prob)
                    qs.append(P[t, z, (values[-1] - truth[t - 1]) % M])
    wts = np.array(weights) / np.sum(weights)
    qs = np.array(qs)
    m = float(wts @ qs)
    return m, float(wts @ (qs * qs)) - m * m


def test_filter_matches_brute_force_over_hidden_variables():
    w, probs = _small_problems()
    np.random.default_rng(0)
    checked = 0
    for p in probs[::5]:
        for tr in SynthPolicy(w, seed=checked).sample_traces(p, 2):
            means, vars_ = w.bayes_belief(p, tr.values)
            for t in range(1, p.T + 1):
                m, v = _brute_belief(w, p, tr.values[:t])
                assert means[t - 1] == pytest.approx(m, abs=1e-10)
                assert vars_[t - 1] == pytest.approx(v, abs=1e-10)
                checked += 1
    assert checked > 50


def test_filter_never_reads_hidden_values_or_an_invisible_level():
    w = World()
    p = w.sample_problems(1, seed=3)[0]
    p = dataclasses.replace(p, visible=False, ops=[("?", 0)] + p.ops[1:], hidden=[7] + p.hidden[1:])
    tr = SynthPolicy(w, seed=0).sample_traces(p, 1)[0]
    a = w.bayes_belief(p, tr.values)
    b = w.bayes_belief(dataclasses.replace(p, hidden=[2] + p.hidden[1:], level=1 - p.level), tr.values)
    np.testing.assert_allclose(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1])


def test_dp_matches_monte_carlo_continuations():
    w = World()
    policy = SynthPolicy(w, seed=11)
    for p in w.sample_problems(4, seed=5):
        tr = policy.sample_traces(p, 1)[0]
        q = w.true_q(p, tr.values)
        for t in (0, p.T // 2):
            n = 4000
            (comps,) = policy.generate([GenerationRequest(p.question, tr.steps[: t + 1], n, p)])
            freq = np.mean([int(c.steps[-1].split()[-1]) == p.answer for c in comps])
            tol = 4 * np.sqrt(max(q[t] * (1 - q[t]), 1e-4) / n) + 1e-3  # 4 binomial sigmas
            assert abs(freq - q[t]) < tol, (p.question, t, freq, q[t])


def test_bayes_mean_is_calibrated_against_monte_carlo():
    # Over many problems and traces, among prefixes with Bayes mean near m, the
    # fraction of traces that end correct is m (the filter is the true posterior).
    w = World()
    policy = SynthPolicy(w, seed=2)
    ms, ys = [], []
    for p in w.sample_problems(1500, seed=9):
        tr = policy.sample_traces(p, 1)[0]
        means, _ = w.bayes_belief(p, tr.values)
        t = int(policy.rng.integers(0, p.T))
        ms.append(means[t])
        ys.append(tr.correct)
    ms, ys = np.array(ms), np.array(ys)
    edges = np.quantile(ms, np.linspace(0, 1, 6))
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (ms >= lo) & (ms <= hi)
        n = sel.sum()
        assert abs(ys[sel].mean() - ms[sel].mean()) < 4 * np.sqrt(0.25 / n), (lo, hi, ys[sel].mean(), ms[sel].mean())


def test_mc_labels_follow_q():
    w = World()
    policy = SynthPolicy(w, seed=4)
    p = w.sample_problems(1, seed=21)[0]
    tr = policy.sample_traces(p, 1)[0]
    q = w.true_q(p, tr.values)
    reps = np.array([mc_label(w, policy, tr, 16) for _ in range(300)])  # (300, T+1)
    assert reps.shape == (300, p.T + 1)
    np.testing.assert_allclose(reps.mean(0) / 16, q, atol=4 * np.sqrt(0.25 / (300 * 16)))
    assert set(reps[:, -1]) == {16 * int(tr.correct)}  # the answer step: no continuation


@pytest.mark.parametrize(
    "cfg, boost",
    [({}, 1.0), ({}, 2.0), ({"modulus": 12, "connectives": ["so"]}, 1.0), ({"min_ops": 6, "max_ops": 10}, 1.0)],
)
def test_mc_label_fast_path_matches_generate(cfg, boost):
    """mc_label skips writing the continuations for the world's own policy; the counts and
    the policy's random stream afterwards are the same as through generate (a subclass of
    SynthPolicy takes the generic path)."""

    class Generic(SynthPolicy):
        pass

    w = World(WorldConfig(**cfg))
    fast, slow = SynthPolicy(w, seed=9, error_boost=boost), Generic(w, seed=9, error_boost=boost)
    writer = SynthPolicy(w, seed=3, error_boost=2.0)
    for p in w.sample_problems(20, seed=5):
        for tr in writer.sample_traces(p, 3):
            assert mc_label(w, fast, tr, 8) == mc_label(w, slow, tr, 8)
    assert fast.rng.random() == slow.rng.random()


@pytest.mark.parametrize("boost", [1.0, 2.5, 0.0])
def test_error_draws_are_numpys_choice_from_the_kernel(boost):
    """sample_errors keeps each kernel's CDF instead of calling rng.choice(M, p=kernel) per
    step: the same offsets from the same random stream, so every seed's data is unchanged."""
    w = World(WorldConfig(modulus=12, min_ops=3, max_ops=6))
    problems = w.sample_problems(40, 2)
    fast, slow = np.random.default_rng(5), np.random.default_rng(5)
    for p in problems:
        for s in range(p.T):
            o = OPS.index(p.ops[s][0])
            ker = w.kernel[p.level, o].copy()
            if boost != 1.0 and p.ops[s][0] != "?":
                e = min(0.95, (1 - ker[0]) * boost)
                ker[1:] *= e / (1 - ker[0])
                ker[0] = 1 - e
            for n in (1, 16):
                got = w.sample_errors(p, s, n, fast, boost)
                want = np.zeros(n, dtype=np.int64) if boost == 0.0 else slow.choice(w.M, size=n, p=ker)
                assert got.dtype == np.int64 and np.array_equal(got, want)


def test_policy_is_a_generator_and_keeps_prefixes():
    w = World()
    policy = SynthPolicy(w, seed=0, count_tokens=len)
    assert isinstance(policy, Generator)
    p = w.sample_problems(1, seed=1)[0]
    tr = policy.sample_traces(p, 1)[0]
    assert len(tr.steps) == p.T + 1 and tr.steps[-1] == f"answer {tr.final}"
    assert p.question.startswith(f"start {p.start} ;") and p.question.endswith(("level ?", "level easy", "level hard"))
    (comps,) = policy.generate([GenerationRequest(p.question, tr.steps[:2], 5, p)])
    for c in comps:
        assert len(c.steps) == p.T + 1 - 2 and c.n_tokens == sum(len(s) for s in c.steps)
        assert c.steps[0].split()[1] == tr.steps[1].split()[-1]  # continues from the written value


def _brute_partial_belief(w, p, values, check_mod):
    """Mean of q for an observer who sees each verifiable step's error only modulo
    ``check_mod`` (and nothing of a recall step), by enumerating level and every error."""
    M, t = w.M, len(values)
    prior = [1 - w.cfg.p_hard, w.cfg.p_hard]
    if p.visible:
        prior = [float(p.level == 0), float(p.level == 1)]
    seen, prev = [], p.start
    for s in range(t):
        seen.append((values[s] - p.apply(s, prev)) % M)
        prev = values[s]
    P = w.q_table(p)
    num = den = 0.0
    for z in (0, 1):
        for errs in itertools.product(range(M), repeat=t):
            if any(p.ops[s][0] != "?" and e % check_mod != seen[s] % check_mod for s, e in enumerate(errs)):
                continue
            prob, d = prior[z], 0
            for s, e in enumerate(errs):
                prob *= w.kernel[z, OPS.index(p.ops[s][0]), e]
                op, k = p.ops[s]
                d = (((d * k) if op == "*" else d) + e) % M
            num += prob * P[t, z, d]
            den += prob
    return num / den


def test_partial_check_observer_matches_brute_force():
    """The diagnostic observer with a coarse step check (check_mod divides the modulus):
    check_mod = modulus is the exact filter, 1 learns nothing from any step."""
    w = World(dataclasses.replace(SMALL, modulus=6))
    checked = 0
    for i, ops in enumerate(itertools.product([("+", 2), ("*", 3), ("*", 5), ("?", 0)], repeat=3)):
        p = Problem("t", 1, list(ops), [4 if o == "?" else 0 for o, _ in ops], i % 2, i % 3 == 0, 6)
        for tr in SynthPolicy(w, seed=i).sample_traces(p, 1):
            exact = w.bayes_belief(p, tr.values)[0]
            np.testing.assert_allclose(w.bayes_belief(p, tr.values, check_mod=6)[0], exact)
            for c in (1, 2, 3, 6):
                means = w.bayes_belief(p, tr.values, check_mod=c)[0]
                for t in range(1, p.T + 1):
                    assert means[t - 1] == pytest.approx(_brute_partial_belief(w, p, tr.values[:t], c), abs=1e-10)
                    checked += 1
    assert checked > 300
    with pytest.raises(ValueError, match="divide the modulus 6"):
        w.bayes_belief(p, tr.values, check_mod=4)


def test_error_kinds_against_the_offsets():
    """error_kinds finds the first wrong verifiable step and any wrong recall step: with
    neither, the trace is correct; the first wrong step is where the offset first moves
    at a verifiable step."""
    from betaprm.synth.diagnostics import error_kinds

    w, rng, seen = World(), np.random.default_rng(4), set()
    for p in w.sample_problems(40, seed=6):
        for tr in w.sample_traces(p, 4, rng, boost=3.0):
            first, recall = error_kinds(p, tr.values)
            d = np.concatenate([[0], w.offsets(p, tr.values)])
            # a step errs when it is not the offset's own propagation (d * k for *, d otherwise)
            errs = [s for s in range(p.T) if d[s + 1] != w._next_offset(p, s, np.array(d[s]))]
            verifiable = [s for s in errs if p.ops[s][0] != "?"]
            assert first == (verifiable[0] if verifiable else None)
            assert recall == any(p.ops[s][0] == "?" for s in errs)
            if first is None and not recall:
                assert tr.correct
            seen.add((first is not None, recall))
    assert len(seen) == 4  # all four kinds occurred
