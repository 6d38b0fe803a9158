"""Accuracy-against-compute frontiers (evaluation.frontier) and the demo's frontier outputs."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from betaprm.evaluation.frontier import Point, acc_at, curve, dominance, hits_at, matched, pooled_paired

from .helpers import run_cli


def pt(knob, tokens, hits):
    return Point(knob, tokens, np.array(hits, dtype=float))


A = [pt(1, 100, [0, 0, 1, 0]), pt(2, 300, [1, 0, 1, 0]), pt(3, 500, [1, 1, 1, 0])]
B = [pt(0.5, 200, [0, 0, 0, 0]), pt(0.1, 450, [1, 1, 1, 1])]


def test_between_two_settings_the_frontier_is_their_mix_per_problem():
    # At 400 tokens A is half its 300-token and half its 500-token setting, problem by problem.
    np.testing.assert_allclose(hits_at(A, 400), [1, 0.5, 1, 0])
    np.testing.assert_allclose(hits_at(A, 300), [1, 0, 1, 0])
    assert hits_at(A, 99) is None and hits_at(A, 501) is None
    assert acc_at(B, 300) == pytest.approx(0.4)
    # Points are sorted by tokens whatever their order, and the curve says so.
    rows = curve(list(reversed(A)))
    assert [r["tokens"] for r in rows] == [100, 300, 500] and [r["acc"] for r in rows] == [0.25, 0.5, 0.75]
    assert all(r["ci"][0] <= r["acc"] <= r["ci"][1] for r in rows)
    # Two settings at the same tokens: the frontier is the better one.
    np.testing.assert_allclose(hits_at([pt(1, 10, [0, 0]), pt(2, 10, [1, 0])], 10), [1, 0])


def test_matched_is_the_paired_difference_at_a_points_tokens():
    m = matched(A[1], B)  # A at 300 tokens; B there is 3/5 of its 200 and 2/5 of its 450 setting
    np.testing.assert_allclose(m["d"], [0.6, -0.4, 0.6, -0.4])
    assert m["diff"] == pytest.approx(0.1) and m["a_acc"] == 0.5 and m["b_acc"] == pytest.approx(0.4)
    assert m["ci"][0] <= m["diff"] <= m["ci"][1]
    assert matched(A[0], B) is None  # 100 tokens: below B's range


def test_dominance_over_the_common_tokens():
    assert dominance(A, B)["verdict"] == "crossing"  # A above at 300 (0.5 > 0.4), below at 450
    hi = [pt(1, 100, [1, 1]), pt(2, 400, [1, 1])]
    lo = [pt(1, 200, [0, 1]), pt(2, 500, [1, 1])]
    d = dominance(hi, lo)
    assert d["verdict"] == "a" and d["range"] == [200, 400] and d["max_a_above_b"] == pytest.approx(0.5)
    assert dominance(lo, hi)["verdict"] == "b"
    assert dominance(hi, hi)["verdict"] == "equal"
    # No common tokens: the cheaper one wins when it is at least as accurate, else no verdict.
    assert dominance([pt(1, 1, [1])], [pt(1, 5, [1])])["verdict"] == "a"
    assert dominance([pt(1, 5, [1, 1])], [pt(1, 1, [1, 0]), pt(2, 2, [1, 1])])["verdict"] == "b"
    d = dominance([pt(1, 1, [0, 1])], [pt(1, 5, [1, 1])])
    assert d["verdict"] == "disjoint" and d["margin"] == pytest.approx(-0.5)


def test_pooled_paired_weighs_problems_and_resamples_runs():
    runs = [np.ones(100), np.zeros(300)]
    p = pooled_paired(runs, seed=1)
    assert p["diff"] == pytest.approx(0.25) and p["runs"] == 2 and p["problems"] == 400
    # Resampling the runs: with two very different runs the interval spans both.
    assert p["ci"][0] == pytest.approx(0.0) and p["ci"][1] == pytest.approx(1.0)
    same = pooled_paired([np.full(50, 0.1), np.full(50, 0.1)])
    assert same["ci"] == pytest.approx([0.1, 0.1])


def test_points_round_trip_through_json():
    p = pt(0.3, 1234.0, [1, 0, 1])
    q = Point.from_json(json.loads(json.dumps(p.to_json())))
    assert (q.knob, q.tokens) == (0.3, 1234.0) and np.array_equal(q.hits, p.hits)
    with pytest.raises(ValueError):
        pt(1, 1, [0.5]).to_json()


TINY = [
    "--quick",
    "--n-train-problems",
    "100",
    "--n-val-problems",
    "20",
    "--n-test-problems",
    "30",
    "--pretrain-steps",
    "10",
    "--check-steps",
    "0",
    "--prm-steps",
    "10",
]


def test_demo_writes_frontiers_that_agree_with_its_tables(tmp_path):
    """The demo (--quick, cut smaller) writes each ACA variant's frontier over its knob, the
    Best-of-n frontier of every selector, the comparisons at matched tokens, the plot and the
    per-problem outcomes, all consistent with its Best-of-N and ACA tables."""
    from betaprm.synth.frontiers import ACA_KNOBS, read_per_problem

    out = tmp_path / "claims" / "default" / "seed0"  # where benchmarks/reliability_claims.py reads it
    res = run_cli("demo", *TINY, "--seed", "0", "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    assert set(r["aca_frontier"]) == set(ACA_KNOBS)
    for name, (knob, values, table_value) in ACA_KNOBS.items():
        f = r["aca_frontier"][name]
        assert f["knob"] == knob and sorted(p["knob"] for p in f["points"]) == sorted(values)
        at_table = next(p for p in f["points"] if p["knob"] == table_value)
        assert at_table["tokens"] == r["aca"][name]["tokens"] and at_table["acc"] == r["aca"][name]["acc"]
    n = r["effective_config"]["n_candidates"]
    for key, rows in r["bon_frontier"].items():
        assert [p["knob"] for p in rows] == list(range(1, n + 1))
        assert rows[-1]["acc"] == r["bon"][key]["acc"] and [p["acc"] for p in rows] == r["best_of_n_curve"][key]
        assert rows[-1]["tokens"] == r["aca"]["vanilla_bon"]["tokens"]
    c = r["frontier_comparisons"]
    from betaprm.synth.frontiers import FRONTIER_PAIRS

    assert set(c) == {f"{a}_vs_{b}" for a, b, _ in FRONTIER_PAIRS}
    assert "vote_vs_adaptive_consistency" in c and "vote_vs_vote_sigma0" in c
    assert all(v["verdict"] in {"a", "b", "equal", "crossing", "disjoint"} for v in c.values())
    # The per-problem file reproduces every number it pools from.
    pp = read_per_problem(out / "per_problem.json")
    for name, f in r["aca_frontier"].items():
        assert sorted((p.tokens, p.acc) for p in pp["aca"][name]) == [(p["tokens"], p["acc"]) for p in f["points"]]
    assert pp["bon"]["betaprm_rb"][-1].acc == r["bon"]["betaprm_rb"]["acc"]
    assert len(pp["held_out_nll"]["betaprm"]) == r["held_out_counts"]["betaprm"]["n_steps"]
    assert np.mean(pp["held_out_nll"]["betaprm"]) == pytest.approx(
        r["held_out_counts"]["betaprm"]["nll"]["beta_binomial"], abs=1e-5
    )
    assert np.mean(pp["held_out_nll"]["standard_prm"]) == pytest.approx(
        r["held_out_counts"]["standard_prm"]["nll"]["binomial_at_mu"], abs=1e-5
    )
    assert (out / "aca_frontier.png").stat().st_size > 0
    assert "Frontiers: accuracy against generated tokens" in res.stdout

    # benchmarks/reliability_claims.py reads the run back (runs nothing) and pools its claims.
    spec = importlib.util.spec_from_file_location(
        "reliability_claims", Path(__file__).parents[1] / "benchmarks" / "reliability_claims.py"
    )
    claims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(claims)
    args = ["--out", str(tmp_path / "claims"), "--worlds", "default", "--seeds", "0", "--read-only"]
    claims.main([*args, "--demo-flags", " ".join(TINY), "--json", str(tmp_path / "c.json")])
    got = json.loads((tmp_path / "c.json").read_text())
    assert got["runs"] == [
        {
            "group": "default",
            "seed": 0,
            "seconds": r["seconds"],
            "cached": True,
            "frontier_comparisons": r["frontier_comparisons"],
        }
    ]
    c = got["claims"]
    want = r["bon"]["betaprm_rb"]["acc"] - r["bon"]["standard_prm_mean"]["acc"]
    assert c["S_RB vs standard PRM top-1"]["pooled"]["diff"] == pytest.approx(want)
    want = r["bon"]["betaprm_reliability_vote"]["acc"] - r["bon"]["standard_prm_vote"]["acc"]
    assert c["reliability vote vs standard weighted vote"]["pooled"]["diff"] == pytest.approx(want)
    m = r["frontier_comparisons"]["aca_vs_aca_reward_only"]["matched_at_table_point"]
    if m is not None:
        assert c["kappa-ACA vs reward-only ACA"]["pooled"]["diff"] == pytest.approx(m["diff"])
    m = r["frontier_comparisons"]["vote_vs_esc"]["matched_at_table_point"]
    if m is not None:
        assert c["adaptive vote vs ESC"]["pooled"]["diff"] == pytest.approx(m["diff"])
    want = r["aca"]["vote"]["acc"] - r["bon"]["betaprm_reliability_vote"]["acc"]
    assert c["adaptive vote vs Best-of-N reliability vote"]["pooled"]["diff"] == pytest.approx(want)
    h = r["held_out_counts"]
    want = h["betaprm"]["nll"]["beta_binomial"] - h["standard_prm"]["nll"]["binomial_at_mu"]
    assert c["held-out NLL, BetaPRM vs binomial"]["pooled"]["diff"] == pytest.approx(want, abs=1e-5)
    # Another recipe in the same folder is refused by name, never mixed in.
    with pytest.raises(SystemExit, match="prm_steps: 10 -> 11"):
        claims.main([*args, "--demo-flags", " ".join(TINY[:-1] + ["11"])])

    # benchmarks/kappa_mechanism.py splits the same claims by whether the level is written.
    spec = importlib.util.spec_from_file_location(
        "kappa_mechanism", Path(__file__).parents[1] / "benchmarks" / "kappa_mechanism.py"
    )
    mech = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mech)
    mech.main([str(out), "--fit-records", "50", "--json", str(tmp_path / "m.json")])
    m = json.loads((tmp_path / "m.json").read_text())[str(out)]
    problems = mech.test_problems(r)
    hidden = np.array([not p.visible for p in problems])
    assert m["share_hidden"] == pytest.approx(hidden.mean())
    for claim in ("S_RB vs standard PRM top-1", "reliability vote vs standard weighted vote"):
        by = m["claims"][claim]
        assert by["all"]["diff"] == pytest.approx(c[claim]["pooled"]["diff"])
        parts = [(by[g]["diff"], mask.sum()) for g, mask in (("hidden", hidden), ("written", ~hidden)) if mask.any()]
        assert sum(d * w for d, w in parts) / len(hidden) == pytest.approx(by["all"]["diff"])
    steps = m["steps"]
    assert steps["all"]["n_steps"] == r["held_out_counts"]["betaprm"]["n_steps"]
    assert steps["all"]["nll_minus"]["binomial (standard PRM)"]["diff"] == pytest.approx(want, abs=1e-5)
    # The best constant kappa on the held-out steps is at least as good as the training fit.
    nll = steps["all"]["nll_minus"]
    assert nll["best constant kappa (held-out)"]["diff"] >= nll["constant kappa (training fit)"]["diff"] - 1e-9

    # --reuse-prms: the same run again from the PRMs it left there, no training; the numbers are
    # the same, and it is read back by the claims script as the same settings.
    again = run_cli("demo", *TINY, "--seed", "0", "--out", str(out), "--reuse-prms", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing" in again.stdout and "pretraining step" not in again.stdout and "final loss" not in again.stdout
    r2 = json.loads((out / "results.json").read_text())
    assert r2["prms_trained_by"] == r["version"] and r2["config"]["reuse_prms"]
    assert r2["bon"] == r["bon"] and r2["aca_frontier"] == r["aca_frontier"] and r2["calibration"] == r["calibration"]
    claims.main([*args, "--demo-flags", " ".join(TINY), "--json", str(tmp_path / "c2.json")])
    # A run made before a setting existed ran as its default does: read back as that default, and
    # refused for another value.
    for key in ("config", "effective_config"):
        del r2[key]["check_batch"]
    (out / "results.json").write_text(json.dumps(r2))
    claims.main([*args, "--demo-flags", " ".join(TINY), "--json", str(tmp_path / "c3.json")])
    bad = run_cli("demo", *TINY, "--check-batch", "16", "--seed", "0", "--out", str(out), "--reuse-prms", timeout=600)
    assert bad.returncode != 0 and "check_batch: 32 there, 16 here" in bad.stderr
    # Other training settings are refused by name, before any work.
    bad = run_cli("demo", *TINY[:-1], "11", "--seed", "0", "--out", str(out), "--reuse-prms", timeout=600)
    assert bad.returncode != 0 and "prm_steps: 10 there, 11 here" in bad.stderr
    bad = run_cli("demo", *TINY, "--out", str(tmp_path / "empty"), "--reuse-prms", timeout=600)
    assert bad.returncode != 0 and "no finished demo run" in bad.stderr
    # A run that trains again in the folder takes its old results away first: stopped before it
    # writes its own (here by a backbone that is not there), it leaves nothing a --reuse-prms run
    # could take for the settings of the models in the folder.
    stopped = run_cli("demo", *TINY, "--out", str(out), "--backbone", str(tmp_path / "none"), timeout=600)
    assert stopped.returncode == 2 and "not a saved backbone" in stopped.stderr
    assert not (out / "results.json").exists()
