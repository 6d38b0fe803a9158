"""ACA under the paper authors' rules (``--rules authors``) takes their decisions.

The reference below is re-implemented, independently, from reading the authors' public
orchestrator (github.com/JinYuanLi0012/Beta-Binomial-PRM, MIT): ``aca/orchestrator_adaptive_bon.py``
(``score_and_annotate_candidates``, ``maybe_early_stop``, ``select_competitor_idx`` with
``ucb_runnerup``, ``pick_best_idx``, the round loop of ``run_one_item``),
``aca/utils_merge_and_cut.py`` (``CutConfig``, ``_is_gibberish``, ``pick_cutpoint``) and
``aca/gen_core_internvl25.py`` (``select_best_rollouts``). Their (c_cut, p_bad) here are the
run script's (``aca/scripts/run_orchestrator.sh``: 1.0, 0.3), the values their README's
command runs with; the orchestrator's argparse defaults (2.0, 0.5) are checked too.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from betaprm import aca_rules
from betaprm.aca import ACAConfig, ACAState, Candidate, run_aca
from betaprm.scoring import StepScores
from betaprm.synth import SynthPolicy, World, synth_answer, synth_is_correct, synth_tasks
from betaprm.synth.experiment import BayesScorer
from betaprm.types import Task

# ------------------------------------------------------------ their rules, re-implemented


def _their_norm(s):
    return re.sub(r"\s+", " ", ("" if s is None else str(s)).strip())


def _their_gibberish(s, min_chars=3, min_len=5, ratio=0.6, min_foreign=2):
    s = _their_norm(s)
    if not s or len(s) < min_chars or "\ufffd" in s:
        return True
    if len(s) < min_len:
        return False
    total = foreign = 0
    for ch in s:
        if ch.isalpha():
            total += 1
            if ord(ch) > 127 and not (0x4E00 <= ord(ch) <= 0x9FFF):
                foreign += 1
    return foreign >= min_foreign and total > 0 and foreign / float(total) >= ratio


_THEIR_CRITICAL = re.compile(r"(\d|=|\+|\-|\*|/|\^|\\frac|sqrt|\\sqrt)")


def _their_cut(steps, mu, sigma, c_cut, p_bad):
    T = min(len(steps), len(mu), len(sigma))
    if T <= 1:
        return 0
    cand = [i for i in range(T - 1) if _their_norm(steps[i]) and len(_their_norm(steps[i])) >= 3]
    cand = [i for i in cand if not _their_gibberish(steps[i])]
    if not cand:
        return 0
    for i in cand:
        if float(mu[i]) - c_cut * float(sigma[i]) < p_bad:
            return i
    critical = [i for i in cand if _THEIR_CRITICAL.search(_their_norm(steps[i]))]
    pool = critical if critical else cand
    return max(pool, key=lambda i: float(sigma[i]))


def _their_annotate(mus, sigmas, lam, c_stop):
    out = []
    for mu, sg in zip(mus, sigmas):
        steps = [m - lam * s for m, s in zip(mu, sg)]
        score = sum(steps) / len(steps)
        u = (sum(sg[:-1]) / (len(sg) - 1)) if len(sg) >= 2 else sum(sg) / len(sg)
        out.append((score, score - c_stop * u, score + c_stop * u))
    return out


def _their_round(mus, sigmas, steps, n0, n_total, lam=0.5, c_stop=0.3, c_cut=1.0, p_bad=0.3):
    """One pass of their loop on a scored pool: ("stop", best) or ("repair", competitor, cut)."""
    ann = _their_annotate(mus, sigmas, lam, c_stop)
    best = max(range(len(ann)), key=lambda i: ann[i][0])
    stop = False
    if len(ann) >= n0:
        other = max((ann[i][2] for i in range(len(ann)) if i != best), default=float("-inf"))
        stop = ann[best][1] > other
    if stop or len(ann) >= n_total:
        return ("stop", best)
    comp, comp_ucb = -1, float("-inf")
    for i in range(len(ann)):
        if i != best and ann[i][2] >= ann[best][1] and ann[i][2] > comp_ucb:
            comp, comp_ucb = i, ann[i][2]
    if comp < 0:
        return ("stop", best)
    return ("repair", comp, _their_cut(steps[comp], mus[comp], sigmas[comp], c_cut, p_bad))


def _their_select(seg_lists, k):
    seen, deduped = set(), []
    for segs in seg_lists:
        key = tuple(_their_norm(x) for x in segs if _their_norm(x))
        if key and key not in seen:
            seen.add(key)
            deduped.append(list(key))
    valid = [s for s in deduped if len(s) >= 2]
    valid.sort(key=lambda s: (len(s), sum(len(x) for x in s)), reverse=True)
    result = valid[:k]
    if len(result) < k:
        rest = [s for s in deduped if len(s) >= 1 and s not in result]
        rest.sort(key=lambda s: (len(s), sum(len(x) for x in s)), reverse=True)
        result.extend(rest[: k - len(result)])
    # Their server then returns, for each chosen list, the first unused raw sample with it.
    used, picked = set(), []
    for segs in result:
        for i, raw in enumerate(seg_lists):
            if i not in used and [_their_norm(x) for x in raw if _their_norm(x)] == segs:
                used.add(i)
                picked.append(i)
                break
    return picked


# ------------------------------------------------------------ random scored pools

_STEP_TEXTS = [
    "Add 3 and 4 to get 7.",
    "So x = 12",
    "ok",  # too short: never a cut point in theirs
    "  ",
    "Therefore the result follows.",  # computes nothing
    "\u0416\u0443\u0436\u0435 \u0444\u044b",  # garbled (Cyrillic letters)
    "Multiply by 2: 14",
    "x^2 + 1",
    "\u7b54\u6848\u662f\u5341\u4e8c",  # CJK: not garbled
    "bad \ufffd text",
]


def _random_pool(rng, size):
    answers, mus, sigmas, steps = [], [], [], []
    for _ in range(size):
        T = int(rng.integers(1, 6))
        steps.append([str(rng.choice(_STEP_TEXTS)) for _ in range(T - 1)] + [f"answer {rng.integers(3)}"])
        mu = rng.uniform(0.05, 0.95, T)
        if rng.random() < 0.3:  # ties in sigma
            sg = np.full(T, 0.1)
        else:
            sg = rng.uniform(0.0, 0.3, T)
        mus.append(mu)
        sigmas.append(sg)
        answers.append(int(rng.integers(3)))
    return answers, mus, sigmas, steps


def _state(answers, mus, sigmas, steps, **kw):
    s = ACAState(Task("t", "q"), ACAConfig(final="lin", rules="authors", **kw))
    for a, mu, sg, st in zip(answers, mus, sigmas, steps):
        s.cands.append(Candidate(list(st), 1, 0, answer=a, scores=StepScores(mu, np.ones(len(mu)), sg)))
    return s


@pytest.mark.parametrize("c_cut,p_bad", [(1.0, 0.3), (2.0, 0.5)])
def test_authors_rules_take_their_decisions_on_random_scored_pools(c_cut, p_bad):
    """Stop or repair, the repaired candidate, its cut point and the final pick, over 600
    random pools (short and garbled steps, same-answer candidates, ties in sigma, pools
    under n0): the same as their orchestrator's; and our own rules differ on some."""
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(600):
        size = int(rng.integers(1, 12))
        pool = _random_pool(rng, size)
        want = _their_round(pool[1], pool[2], pool[3], n0=4, n_total=16, c_cut=c_cut, p_bad=p_bad)
        s = _state(*pool, n0=4, budget=16, c_cut=c_cut, p_bad=p_bad)
        s.decide()
        if s.done:
            got = ("stop", int(s.record(lambda t, a: None, False)["chosen"]))
        else:
            parent, cut = s.next_meta
            got = ("repair", parent, cut)
            assert s.next_req.prefix == pool[3][parent][:cut]
        assert got == want
        ours = _state(*pool, n0=4, budget=16, c_cut=c_cut, p_bad=p_bad)
        ours.cfg.rules = "betaprm"
        ours.decide()
        differ += (ours.done, ours.next_meta) != (s.done, s.next_meta)
    assert differ > 30  # the two rule sets are not the same rules


def test_garbled_and_keep_longest_match_theirs():
    texts = _STEP_TEXTS + ["", "a", "abcd", "\u00e9\u00e9\u00e9\u00e9\u00e9 x", "caf\u00e9 \u00e0 la", "12"]
    assert [aca_rules.garbled(t) for t in texts] == [_their_gibberish(t) for t in texts]
    rng = np.random.default_rng(1)
    for _ in range(300):
        samples = [
            [str(rng.choice(["a b", "a  b", "step two", "", "x = 1", "12"])) for _ in range(int(rng.integers(0, 4)))]
            for _ in range(int(rng.integers(1, 9)))
        ]
        k = int(rng.integers(1, 6))
        assert aca_rules.keep_longest(samples, k) == _their_select(samples, k)


def test_uncertainty_leaves_out_the_answer_step_only_in_theirs():
    sg = np.array([0.1, 0.2, 0.9])
    assert aca_rules.uncertainty(sg, "authors") == pytest.approx(0.15)
    assert aca_rules.uncertainty(sg, "betaprm") == pytest.approx(0.4)
    assert aca_rules.uncertainty(np.array([0.3]), "authors") == pytest.approx(0.3)


# ------------------------------------------------------------ a whole run


@pytest.fixture(scope="module")
def world_problems():
    world = World()
    return world, world.sample_problems(30, seed=5, prefix="r")


def _run(world, problems, cfg, out=None):
    scorer = BayesScorer(world, problems)
    recs = run_aca(
        synth_tasks(problems), SynthPolicy(world, seed=0), scorer, cfg, synth_answer, synth_is_correct, out=out,
        progress=False,
    )
    return recs, scorer


def test_authors_run_reports_both_token_counts_and_rescores_the_pool(world_problems, tmp_path):
    """Two draws per kept sample: ``tokens`` counts all of them (their "actual"), ``tokens_kept``
    the kept ones (their "effective"), which are the candidates' own; every round rescores
    the whole pool; the final pick is the top S_lin; a killed-and-rerun file equals one run."""
    world, problems = world_problems
    cfg = ACAConfig(final="lin", rules="authors")
    recs, scorer = _run(world, problems, cfg)
    for r in recs:
        kept = sum(c["n_tokens"] for c in r["candidates"])
        assert r["tokens_kept"] == kept < r["tokens"]
        n_rounds = sum(1 for x in r["rounds"])
        sizes = [x["pool_size"] for x in r["rounds"]]
        assert r["traces_scored"] == sum(sizes) and n_rounds == len(sizes)
        S = [np.mean(np.array(c["mu"]) - 0.5 * np.array(c["sigma"])) for c in r["candidates"]]
        assert r["chosen"] == int(np.argmax(S))
    ours, _ = _run(world, problems, ACAConfig(final="lin"))
    assert sum(r["tokens"] for r in recs) != sum(r["tokens"] for r in ours)
    # Resumed == uninterrupted: the first third written, then the rest.
    out = tmp_path / "a.jsonl"
    first, _ = _run(world, problems[:10], cfg, out=out)
    again, _ = _run(world, problems, cfg, out=out)
    assert json.dumps(again) == json.dumps(recs)


def test_cli_rules_authors_labels_its_frontier_and_refuses_bad_values(tmp_path, capsys):
    from betaprm.cli import main
    from betaprm.model import BetaPRM
    from betaprm.provenance import meta_path
    from tests.helpers import make_lm_dir

    BetaPRM.from_backbone(str(make_lm_dir(tmp_path / "lm"))).save_pretrained(tmp_path / "prm")
    common = ["aca", "--model", str(tmp_path / "prm"), "--n-problems", "6"]
    assert main([*common, "--final", "lin", "--out", str(tmp_path / "ours.jsonl")]) == 0
    capsys.readouterr()
    # Settings newer than the outputs users hold are not recorded at their defaults: those resume.
    ours = json.loads(meta_path(tmp_path / "ours.jsonl").read_text())["settings"]
    assert "rules" not in ours and "oversample" not in ours
    out = tmp_path / "theirs.jsonl"
    flags = ["--rules", "authors", "--out", str(out), "--plots", str(tmp_path / "p")]
    assert main([*common, *flags, "--frontier", str(tmp_path / "ours.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert "--rules authors: final choice by the top S_lin" in printed
    assert "frontier aca (authors' rules) (c_stop)" in printed and "frontier aca (c_stop)" in printed
    assert json.loads(meta_path(out).read_text())["settings"]["rules"] == "authors"
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["tokens"] > rec["tokens_kept"] > 0
    assert main([*common, "--rules", "theirs", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert main([*common, "--oversample", "0.5", "--final", "lin", "--out", str(tmp_path / "y.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "theirs" in err and "oversample must be in [1, 64]" in err
