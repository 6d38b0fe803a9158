"""benchmarks/demo_sweep.py: flags, resume and the per-recipe summary (the demo runs themselves
are covered by the quick-demo CLI test)."""

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np

spec = importlib.util.spec_from_file_location("demo_sweep", Path(__file__).parents[1] / "benchmarks" / "demo_sweep.py")
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)


def _result(auroc):
    cal = {"mu_mae_bayes": 0.2}
    return {
        "verification": {"standard_prm_auroc": auroc, "betaprm_auroc": auroc + 0.1},
        "calibration": {
            "standard_prm": cal,
            "betaprm": {**cal, "spearman_kappa_bayes": 0.3, "coverage90": 0.9, "width90": 0.8, "bayes_width90": 0.5},
        },
        "comparisons": {
            "betaprm_rb_minus_standard_prm_mean": {"diff": 0.01},
            "best_betaprm_minus_majority_vote": {"diff": 0.04},
        },
        "seconds": 1.0,
    }


def test_flags_follow_the_demo_cli():
    assert sweep._flags({"marker_repeat": 2, "kappa_detach": False, "quick": True, "prm_lr": 5e-4}) == [
        "--marker-repeat",
        "2",
        "--no-kappa-detach",
        "--quick",
        "--prm-lr",
        "0.0005",
    ]


def test_summary_is_mean_and_sd_over_seeds():
    s = sweep.summarize({"a": {1: _result(0.6), 2: _result(0.8)}})["a"]
    assert s["seeds"] == [1, 2]
    assert np.isclose(s["auroc_std"]["mean"], 0.7) and np.isclose(s["auroc_std"]["sd"], np.std([0.6, 0.8], ddof=1))
    assert np.isclose(s["auroc_beta"]["mean"], 0.8) and np.isclose(s["width_minus_bayes"]["mean"], 0.3)


def test_a_finished_run_is_not_run_again(tmp_path):
    done = tmp_path / "base" / "seed7"
    done.mkdir(parents=True)
    (done / "results.json").write_text(json.dumps(_result(0.5)))
    args = argparse.Namespace(out=str(tmp_path), device="cpu", threads=1, timeout=1)
    name, seed, res, how = sweep.run_one("base", {}, 7, args)
    assert (name, seed, how) == ("base", 7, "cached") and res["verification"]["standard_prm_auroc"] == 0.5
