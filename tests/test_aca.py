"""The ACA controller: its rules checked by hand on small pools, its accounting and
invariants on the chain-arithmetic world (the real policy, and the exact Bayes belief as
a real, cheap Scorer), the variants, and a killed `betaprm aca` process resuming."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from betaprm.aca import ACAConfig, ACAState, Candidate, Task, run_aca, summarize
from betaprm.errors import BetaPRMInputError
from betaprm.generation import GenerationRequest
from betaprm.scoring import StepScores
from betaprm.synth import (
    SynthPolicy,
    World,
    synth_answer,
    synth_is_correct,
    synth_tasks,
)
from betaprm.synth.experiment import BayesScorer
from betaprm.synth.frontiers import CachedScorer


def _state(cands, **kw):
    """An ACA state holding hand-made candidates: (answer, mu list, sigma list)."""
    cfg = ACAConfig(final="lin", **kw)
    s = ACAState(Task("t", "q"), cfg)
    for i, (ans, mu, sig) in enumerate(cands):
        s.cands.append(
            Candidate(
                [f"s{j}" for j in range(len(mu))],
                1,
                0,
                answer=ans,
                scores=StepScores(np.array(mu, float), np.ones(len(mu)), np.array(sig, float)),
            )
        )
    return s


# ---------------------------------------------------------------- the rules, by hand


def test_stops_when_best_is_reliably_ahead():
    # S = mean(mu - 0.5 sigma); U = mean(sigma). Best: S = 0.9 - 0.025 = 0.875, LCB = 0.875 - 0.015 = 0.86.
    # Rival: S = 0.5 - 0.05 = 0.45, UCB = 0.45 + 0.03 = 0.48 < 0.86 -> stop.
    s = _state([(1, [0.9, 0.9], [0.05, 0.05]), (2, [0.5, 0.5], [0.1, 0.1])])
    s.decide()
    assert s.done and s.stop_reason == "confident"
    assert s.rounds[-1]["lcb"] == pytest.approx(0.86) and s.rounds[-1]["max_rival_ucb"] == pytest.approx(0.48)


def test_repairs_the_highest_ucb_rival_at_the_earliest_bad_step():
    # Best (answer 1): S = 0.8 - 0.5*0.3 = 0.65, LCB = 0.65 - 0.09 = 0.56.
    # Rival A (answer 2): mu (0.9, 0.25, 0.9), sigma 0.3 -> S = 0.533, UCB = 0.623 > 0.56: no stop.
    # Rival B (answer 3): S = 0.4 - 0.05 = 0.35, UCB 0.38. Target: A (highest UCB).
    # Cut: earliest step with mu - 1.0*sigma < 0.3 among non-final steps: step 0 has 0.6, step 1 has -0.05 -> 1.
    s = _state([(1, [0.8, 0.8, 0.8], [0.3] * 3), (2, [0.9, 0.25, 0.9], [0.3] * 3), (3, [0.4, 0.4, 0.4], [0.1] * 3)])
    s.decide()
    assert not s.done
    r = s.rounds[-1]
    assert (r["action"], r["repaired"], r["cut"], r["new"]) == ("repair", 1, 1, 4)
    assert s.next_req.prefix == ["s0"] and s.next_req.n == 4


def test_cut_falls_back_to_the_largest_sigma_and_never_the_answer_step():
    # No step below p_bad: the non-final step with the largest sigma (step 1), not the last step (sigma 0.4).
    s = _state([(1, [0.95] * 3, [0.3] * 3), (2, [0.9, 0.9, 0.9], [0.1, 0.2, 0.4])])
    s.decide()
    assert s.rounds[-1]["repaired"] == 1 and s.rounds[-1]["cut"] == 1


def test_same_answer_candidates_are_not_rivals():
    # Identical scores: without the answer rule the best could never beat its twin.
    s = _state([(7, [0.6, 0.6], [0.2, 0.2])] * 4)
    s.decide()
    assert s.done and s.stop_reason == "confident" and s.rounds[-1]["rivals"] == 0


def test_budget_and_no_early_stop():
    s = _state([(1, [0.9], [0.01]), (2, [0.1], [0.01])], early_stop=False, budget=4, n0=2, m=4)
    s.decide()
    assert not s.done and s.next_req.n == 2  # the batch is cut to what the budget leaves
    s2 = _state([(1, [0.9], [0.01])] * 4, early_stop=False, budget=4, n0=4)
    s2.decide()
    assert s2.done and s2.stop_reason == "budget"


def test_uncertainty_variants():
    cands = [(1, [0.8, 0.8], [0.3, 0.3]), (2, [0.7, 0.7], [0.3, 0.3])]
    learned = _state(cands)
    learned.decide()
    assert not learned.done  # 0.65 - 0.09 = 0.56 < 0.55 + 0.09
    none = _state(cands, uncertainty="none")
    none.decide()  # sigma = 0: a plain score margin, 0.8 > 0.7
    assert none.done and none.rounds[-1]["lcb"] == pytest.approx(0.8)
    margin = _state(cands, uncertainty="none", stop_margin=0.2)
    margin.decide()
    assert not margin.done
    proxy = _state(cands, uncertainty="proxy")  # sigma = sqrt(mu (1 - mu)) = 0.4 and 0.458
    proxy.decide()
    assert proxy.rounds[-1]["lcb"] == pytest.approx(0.8 - 0.5 * 0.4 - 0.3 * 0.4)


def test_bad_config_collects_all_problems():
    with pytest.raises(
        BetaPRMInputError,
        match=r"n0 \(20\) must not exceed budget.*uncertainty must be one of.*final 'rb' needs final_tau",
    ):
        ACAConfig(n0=20, uncertainty="maybe")


# ---------------------------------------------------------------- on the world


@pytest.fixture(scope="module")
def world_setup():
    world = World()
    problems = world.sample_problems(60, seed=11, prefix="t")
    return world, problems


def _run(world, problems, cfg, out=None, scorer=None):
    scorer = scorer or BayesScorer(world, problems)
    gen = SynthPolicy(world, seed=0)
    return run_aca(
        synth_tasks(problems), gen, scorer, cfg, synth_answer, synth_is_correct, out=out, progress=False
    ), scorer


def test_variants_sharing_a_cached_scorer_get_their_own_records(world_setup):
    """The demo runs each PRM's ACA variants through one CachedScorer: the early-stopping
    variant after the no-early-stop one reads its rounds back instead of scoring them,
    and its records equal a run of its own."""
    world, problems = world_setup
    stop, no_stop = ACAConfig(final="lin"), ACAConfig(final="lin", early_stop=False)
    alone, alone_scorer = _run(world, problems, stop)
    cached = CachedScorer(BayesScorer(world, problems))
    full, _ = _run(world, problems, no_stop, scorer=cached)
    n_full = cached.scorer.n_scored
    distinct = {(r["question"], tuple(c["steps"])) for r in full for c in r["candidates"]}
    assert n_full == len(cached.cache) == len(distinct) < sum(len(r["candidates"]) for r in full)  # repeats too
    again, _ = _run(world, problems, stop, scorer=cached)
    assert json.dumps(again) == json.dumps(alone)
    # Its pools are prefixes of the full budget's: nothing new to score.
    assert cached.scorer.n_scored == n_full < n_full + alone_scorer.n_scored


def test_aca_accounting_on_the_world(world_setup):
    world, problems = world_setup
    recs, scorer = _run(world, problems, ACAConfig(final="lin"))
    assert [r["id"] for r in recs] == [p.id for p in problems]
    by_id = {p.id: p for p in problems}
    n_cands = 0
    for r in recs:
        cands = r["candidates"]
        n_cands += len(cands)
        assert r["pool_size"] == len(cands) <= 16 and len(cands) in (4, 8, 12, 16)
        # Tokens: every generated step's words (the synth policy's count), prefixes excluded.
        assert r["tokens"] == sum(c["n_tokens"] for c in cands)
        for c in cands:
            if c["parent"] is None:
                assert c["cut"] is None and c["round"] == 0 or c["cut"] is None
            else:
                parent = cands[c["parent"]]
                assert c["steps"][: c["cut"]] == parent["steps"][: c["cut"]]
                assert c["n_tokens"] == sum(len(s.split()) for s in c["steps"][c["cut"] :])
            assert len(c["steps"]) == by_id[r["id"]].T + 1
        assert r["correct"] == (cands[r["chosen"]]["answer"] == by_id[r["id"]].answer)
        assert r["rounds"][-1]["action"] == "stop" and r["stop_reason"] in ("confident", "budget")
    # Every candidate scored exactly once.
    assert scorer.n_scored == n_cands
    s = summarize(recs)
    assert s["n"] == 60 and s["tokens"] == sum(r["tokens"] for r in recs)


def test_best_of_n_variant_is_one_round_of_n(world_setup):
    world, problems = world_setup
    recs, _ = _run(world, problems[:10], ACAConfig.best_of_n(final="lin"))
    assert all(r["pool_size"] == 16 and len(r["rounds"]) == 1 and r["stop_reason"] == "budget" for r in recs)
    assert all(c["parent"] is None for r in recs for c in r["candidates"])


def test_aca_with_the_exact_belief_saves_tokens_without_losing_accuracy(world_setup):
    """With the Bayes belief as the scorer (what a perfect BetaPRM would report), ACA must
    spend fewer tokens than Best-of-16 at comparable accuracy."""
    world, problems = world_setup
    aca, _ = _run(world, problems, ACAConfig(final="lin"))
    bon, _ = _run(world, problems, ACAConfig.best_of_n(final="lin"))
    a, b = summarize(aca), summarize(bon)
    assert a["tokens"] < 0.8 * b["tokens"]
    assert a["acc"] >= b["acc"] - 0.1


def test_batched_equals_one_by_one(world_setup):
    """Lockstep over many problems gives the records that running each alone gives."""
    world, problems = world_setup
    together, _ = _run(world, problems[:12], ACAConfig(final="lin"))
    alone = [_run(world, [p], ACAConfig(final="lin"))[0][0] for p in problems[:12]]
    assert together == alone


# ---------------------------------------------------------------- kill and resume


@pytest.mark.slow
def test_killed_aca_process_resumes_without_loss_or_duplicates(tmp_path):
    """SIGKILL a real `betaprm aca` run mid-way; the rerun ends with every problem once,
    and the records equal an uninterrupted run's."""
    from betaprm.model import BetaPRM
    from tests.helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    BetaPRM.from_backbone(str(lm)).save_pretrained(tmp_path / "prm")
    base = [
        sys.executable,
        "-m",
        "betaprm",
        "aca",
        "--model",
        str(tmp_path / "prm"),
        "--n-problems",
        "300",
        "--final",
        "lin",
        "--batch-size",
        "32",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full = tmp_path / "full.jsonl"
    subprocess.run(base + ["--out", str(full)], check=True, env=env, capture_output=True)
    part = tmp_path / "part.jsonl"
    proc = subprocess.Popen(base + ["--out", str(part)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and (not part.exists() or part.stat().st_size == 0):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = sum(1 for line in part.read_bytes().split(b"\n") if line.strip())
    assert proc.returncode == -signal.SIGKILL and 0 < n_before < 300, (
        f"the kill should land mid-run, found {n_before} records"
    )
    subprocess.run(base + ["--out", str(part)], check=True, env=env, capture_output=True)
    got = [json.loads(line) for line in part.read_text().splitlines()]
    want = {r["id"]: r for r in map(json.loads, full.read_text().splitlines())}
    assert sorted(r["id"] for r in got) == sorted(want) and len(got) == 300
    for r in got:
        w = want[r["id"]]
        assert (r["chosen"], r["tokens"], r["pool_size"], r["stop_reason"]) == (
            w["chosen"],
            w["tokens"],
            w["pool_size"],
            w["stop_reason"],
        )
        assert [c["steps"] for c in r["candidates"]] == [c["steps"] for c in w["candidates"]]


def test_request_seeds_make_runs_reproducible(world_setup):
    world, problems = world_setup
    a, _ = _run(world, problems[:5], ACAConfig(final="lin", seed=3))
    b, _ = _run(world, problems[:5], ACAConfig(final="lin", seed=3))
    c, _ = _run(world, problems[:5], ACAConfig(final="lin", seed=4))
    assert a == b and a != c
    assert GenerationRequest("q").seed is None


def test_cli_aca_plot_against_a_best_of_n_baseline(tmp_path):
    """`betaprm aca --plots` draws the run over the Best-of-n curve of a best-of-n run."""
    from betaprm.cli import main
    from betaprm.model import BetaPRM
    from tests.helpers import make_lm_dir

    BetaPRM.from_backbone(str(make_lm_dir(tmp_path / "lm"))).save_pretrained(tmp_path / "prm")
    common = ["aca", "--model", str(tmp_path / "prm"), "--n-problems", "12", "--final", "lin"]
    assert main([*common, "--variant", "best-of-n", "--out", str(tmp_path / "bon.jsonl")]) == 0
    assert (
        main(
            [
                *common,
                "--out",
                str(tmp_path / "aca.jsonl"),
                "--plots",
                str(tmp_path / "p"),
                "--baseline",
                str(tmp_path / "bon.jsonl"),
            ]
        )
        == 0
    )
    assert (tmp_path / "p" / "aca_tokens.png").stat().st_size > 0
    recs = [json.loads(line) for line in (tmp_path / "bon.jsonl").read_text().splitlines()]
    assert all(r["candidates"][r["chosen"]]["correct"] == r["correct"] for r in recs)


def test_cli_aca_frontier_of_runs_at_several_knob_values(tmp_path, capsys):
    """`betaprm aca --plots --frontier`: runs at other c-stop values and of another variant
    become frontiers (aca_frontier.png); this run is compared with each at its own tokens,
    with the numbers the frontier module gives for the same records."""
    from betaprm.cli import main
    from betaprm.evaluation import frontier
    from betaprm.model import BetaPRM
    from tests.helpers import make_lm_dir

    BetaPRM.from_backbone(str(make_lm_dir(tmp_path / "lm"))).save_pretrained(tmp_path / "prm")
    common = ["aca", "--model", str(tmp_path / "prm"), "--n-problems", "12", "--final", "lin"]
    runs = {"aca0": ["--c-stop", "0"], "aca1": ["--c-stop", "1"], "ro": ["--variant", "reward-only"]}
    for name, flags in runs.items():
        assert main([*common, *flags, "--out", str(tmp_path / f"{name}.jsonl")]) == 0
    capsys.readouterr()
    others = ",".join(str(tmp_path / f"{n}.jsonl") for n in runs)
    out = tmp_path / "aca03.jsonl"
    assert (
        main([*common, "--c-stop", "0.3", "--out", str(out), "--plots", str(tmp_path / "p"), "--frontier", others])
        == 0
    )
    printed = capsys.readouterr().out
    assert (tmp_path / "p" / "aca_frontier.png").stat().st_size > 0

    def point(path, knob):
        recs = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["id"])
        return frontier.Point(knob, sum(r["tokens"] for r in recs), np.array([float(r["correct"]) for r in recs]))

    this = point(out, 0.3)
    aca = [this, point(tmp_path / "aca0.jsonl", 0.0), point(tmp_path / "aca1.jsonl", 1.0)]
    ro = [point(tmp_path / "ro.jsonl", 0.0)]
    assert (
        "frontier aca (c_stop): "
        + "; ".join(f"{r['knob']:g}: {r['tokens']:.0f} tokens, {r['acc']:.3f}" for r in frontier.curve(aca))
        in printed
    )
    m = frontier.matched(this, ro)
    want = "outside its tokens" if m is None else f"{m['diff']:+.3f} [{m['ci'][0]:+.3f}, {m['ci'][1]:+.3f}]"
    assert f"this run minus reward-only: {want}" in printed
    # Records on other problems are refused, by name.
    assert main([*common, "--n-problems", "6", "--out", str(tmp_path / "six.jsonl")]) == 0
    bad = [*common, "--out", str(tmp_path / "x.jsonl"), "--plots", str(tmp_path / "p")]
    assert main([*bad, "--frontier", str(tmp_path / "six.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "six.jsonl: its records are not on this run's problems" in err
    assert not (tmp_path / "x.jsonl").exists()  # refused before any work


def test_tune_rb_on_world_uses_the_validation_split_only():
    """S_RB's (lambda, tau) come from Best-of-budget pools of the world's validation
    problems (the demo's split seeds), which are the only traces scored."""
    from betaprm.selection import PAPER_LAMBDAS, PAPER_QS
    from betaprm.synth.experiment import split_seeds, tune_rb_on_world

    world = World()
    val = world.sample_problems(20, split_seeds(5).val_problems, "val")
    scorer = BayesScorer(world, val)  # a question outside the validation split raises KeyError
    res = tune_rb_on_world(world, scorer, 4, 5, n_val=20)
    assert scorer.n_scored == 20 * 4
    assert res.lam in PAPER_LAMBDAS and res.q in PAPER_QS and np.isfinite(res.tau)
    fixed = tune_rb_on_world(world, BayesScorer(world, val), 4, 5, lam=0.7, n_val=20)
    assert fixed.lam == 0.7


def test_best_of_n_curve_picks_through_the_selector_registry():
    from betaprm.aca import best_of_n_curve

    def cand(mu, correct, n):
        return {
            "mu": mu,
            "kappa": [4.0] * len(mu),
            "sigma": [0.1] * len(mu),
            "correct": correct,
            "n_tokens": n,
            "answer": None,
        }

    recs = [
        {"candidates": [cand([0.2], False, 3), cand([0.9], True, 5)]},
        {"candidates": [cand([0.8], True, 2), cand([0.1], None, 4)]},
    ]  # a failed check is never counted right
    xs, ys = best_of_n_curve(recs, "mean")
    assert xs == [5, 14] and ys == [0.5, 1.0]


def test_cli_aca_frontier_refuses_damaged_runs_by_line_and_counts_only_judged_problems(tmp_path, capsys):
    """Fails before this change: a settings file without the knob, a string knob, a record
    without ``tokens`` or with string ``tokens`` were tracebacks; a repeated record counted
    its tokens twice; problems without a reference answer were misses in the frontier but
    left out of the summary's accuracy."""
    from betaprm.cli import aca as aca_cli
    from betaprm.cli import main
    from betaprm.model import BetaPRM
    from betaprm.provenance import meta_path
    from tests.helpers import make_lm_dir

    BetaPRM.from_backbone(str(make_lm_dir(tmp_path / "lm"))).save_pretrained(tmp_path / "prm")
    common = ["aca", "--model", str(tmp_path / "prm"), "--n-problems", "6", "--final", "lin"]
    good = tmp_path / "good.jsonl"
    assert main([*common, "--c-stop", "1", "--out", str(good)]) == 0
    lines = good.read_text().splitlines()
    meta = json.loads(meta_path(good).read_text())

    def damaged(name, settings=None, records=None):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(records or lines) + "\n")
        meta_path(path).write_text(json.dumps({**meta, "settings": {**meta["settings"], **(settings or {})}}))
        return path

    first = json.loads(lines[0])
    cases = {
        "no-knob": (damaged("no-knob", settings={"c_stop": None}), "the settings' 'c_stop'"),
        "str-knob": (damaged("str-knob", settings={"c_stop": "high"}), "the settings' 'c_stop'"),
        "no-tokens": (
            damaged("no-tokens", records=[json.dumps({k: v for k, v in first.items() if k != "tokens"}), *lines[1:]]),
            "no-tokens.jsonl:1: field 'tokens'",
        ),
        "str-tokens": (
            damaged("str-tokens", records=[json.dumps({**first, "tokens": "12"}), *lines[1:]]),
            "str-tokens.jsonl:1: field 'tokens'",
        ),
        "twice": (damaged("twice", records=[*lines, lines[0]]), "twice.jsonl:7: problem"),
    }
    for name, (path, message) in cases.items():
        out = tmp_path / f"x-{name}.jsonl"
        code = main([*common, "--out", str(out), "--plots", str(tmp_path / "p"), "--frontier", str(path)])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, (name, err)
        assert not out.exists()  # refused before any work
    # Problems without a reference answer: left out of the frontier's accuracy and tokens,
    # as the summary leaves them out of its accuracy.
    recs = [(f"f:{i}", json.loads(line)) for i, line in enumerate(lines, 1)]
    recs[0][1]["answer"] = None
    ids = aca_cli._judged_ids([r for _, r in recs])
    point = aca_cli._run_point("aca", {"c_stop": 1.0}, recs, ids, "this run")
    judged = [r for _, r in recs[1:]]
    assert len(point.hits) == 5 and point.hits.mean() == pytest.approx(np.mean([bool(r["correct"]) for r in judged]))
    assert point.tokens == sum(r["tokens"] for r in judged)
