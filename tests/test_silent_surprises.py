"""Runs that used to go wrong without a word now say so: a global batch larger than the data
(every optimiser step an epoch), a warmup that never ends (one step at learning rate 0 leaves
the model as it was), a run of a handful of steps, and eval-bon with no validation problem
(S_lin, S_RB and the reliability-weighted vote dropped from the table)."""

import json
import logging

import pytest
import torch
from transformers import TrainerCallback

from betaprm.cli import main
from betaprm.evaluation.bon import TUNED, BonPool, NoValidationProblems, evaluate_pools
from betaprm.train import TrainConfig, train
from betaprm.train.checks import batch_warnings, optimiser_steps
from betaprm.types import StepScores

from .helpers import make_counts, make_lm_dir, train_config


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_lm_dir(tmp_path_factory.mktemp("lm") / "lm")


def cfg(lm_dir, data, out, **kw):
    return train_config(lm_dir, data, out, **{"logging_steps": 1, "save_steps": 100, **kw})


class Snapshot(TrainerCallback):
    """The trainable weights as the first optimiser step finds them."""

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.before = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


def changed(snap, prm) -> bool:
    after = dict(prm.named_parameters())
    return any(not torch.equal(v, after[k].detach()) for k, v in snap.before.items())


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("betaprm")]


# ---------------------------------------------------------------- training


def test_a_global_batch_larger_than_the_data_is_named(lm_dir, tmp_path, caplog):
    """Fails before this change: --global-batch-size 512 on 3 records trained without a word,
    each optimiser step a whole epoch (the summary said epoch 5 after 5 steps). 16 here: the
    same case in 4 forward passes per step rather than 128."""
    data = make_counts(tmp_path / "three.jsonl", n=3)
    with caplog.at_level(logging.WARNING, logger="betaprm"):
        _, trainer, _ = train(cfg(lm_dir, data, tmp_path / "o", global_batch_size=16, max_steps=2), quiet=True)
    said = [m for m in warnings_of(caplog) if "--global-batch-size 16" in m]
    assert len(said) == 1, warnings_of(caplog)
    msg = said[0]
    assert "larger than the data (3 traces after encoding)" in msg and "each step is a whole epoch" in msg
    assert "2 step(s) over 2 epoch(s)" in msg and "well below 3" in msg and "smaller --per-device-train" in msg
    assert "4 forward passes by repeating traces" in msg  # --batch-rebalance (the default) fills them from 3
    # What the warning says is what the Trainer did: two steps, two epochs.
    assert trainer.state.global_step == 2 and trainer.state.epoch == pytest.approx(2.0)


def test_a_warmup_that_never_ends_is_named_and_the_claim_holds(lm_dir, tmp_path, caplog):
    """Fails before this change: one optimiser step with the default --warmup-ratio 0.05 ran
    at learning rate 0, and the saved model was the starting one, silently."""
    data = make_counts(tmp_path / "c.jsonl", n=24)
    snap = Snapshot()
    with caplog.at_level(logging.WARNING, logger="betaprm"):
        prm, _, _ = train(cfg(lm_dir, data, tmp_path / "o", max_steps=1), quiet=True, callbacks=[snap])
    said = [m for m in warnings_of(caplog) if "warmup" in m]
    assert len(said) == 1, warnings_of(caplog)
    assert "learning rate 0" in said[0] and "weights do not change" in said[0] and "--warmup-ratio" in said[0]
    assert not changed(snap, prm)  # the warning's claim
    # Without warmup the same step trains, and nothing is said.
    caplog.clear()
    snap = Snapshot()
    with caplog.at_level(logging.WARNING, logger="betaprm"):
        prm, _, _ = train(
            cfg(lm_dir, data, tmp_path / "o2", max_steps=1, warmup_ratio=0.0), quiet=True, callbacks=[snap]
        )
    assert not [m for m in warnings_of(caplog) if "warmup" in m or "optimiser step" in m], warnings_of(caplog)
    assert changed(snap, prm)


def test_the_warnings_by_case():
    """batch_warnings alone (no model): what is said, and the runs that stay quiet."""

    def says(n, **kw):
        return batch_warnings(TrainConfig(model="m", data="d", **kw), n, world=1)

    # The paper's defaults on a real data set: nothing to say.
    assert says(100_000) == []
    assert says(96, global_batch_size=8, max_steps=6) == []
    # Epochs that make only a handful of steps.
    (few,) = says(96, global_batch_size=32)
    assert "only 3 optimiser step(s)" in few and "--num-train-epochs 1 x 3 step(s) per epoch" in few
    assert "the first at learning rate 0" in few and "smaller --global-batch-size" in few
    # An explicit --max-steps is what the user asked for: said only when warmup takes part of it.
    assert says(96, global_batch_size=8, max_steps=2, warmup_ratio=0.0) == []
    (short,) = says(96, global_batch_size=8, max_steps=3)
    assert "--max-steps 3" in short and "1 of them warm up" in short
    # A warmup as long as the run.
    (whole,) = says(96, global_batch_size=8, max_steps=5, warmup_ratio=0.9)
    assert "is 5 warmup steps, the whole run" in whole and "never reaches --learning-rate" in whole
    # A scheduler without warmup: one step is one step.
    assert says(96, global_batch_size=8, max_steps=1, lr_scheduler_type="constant") == []
    # A global batch larger than the data, run by epochs: one step, which the warmup then takes.
    big, warm = says(3, global_batch_size=512)
    assert "--global-batch-size 512 is larger than the data (3 traces" in big and "1 step(s) over 1 epoch(s)" in big
    assert "one optimiser step" in warm and "learning rate 0" in warm
    # --gradient-accumulation-steps gives the global batch: per-device x steps x devices.
    cfg_ga = TrainConfig(model="m", data="d", per_device_train_batch_size=2, gradient_accumulation_steps=4)
    assert optimiser_steps(cfg_ga, 80, world=2) == (5, 5)
    (ga_big, _) = batch_warnings(cfg_ga, 10, world=2)
    assert "--global-batch-size 16 is larger than the data (10 traces" in ga_big


# ---------------------------------------------------------------- eval-bon


def _pool(i):
    c = [
        {"steps": ["3 + 5 = 8", "The answer is \\boxed{8}"], "mu": [0.6, 0.5], "kappa": [4, 4]},
        {"steps": ["3 + 4 = 7", "The answer is \\boxed{7}"], "mu": [0.95, 0.9], "kappa": [4, 4]},
    ]
    return {"id": f"p{i}", "question": f"problem {i}: what is 3 + 4?", "answer": "7", "candidates": c}


def test_eval_bon_without_validation_problems_stops_unless_told(tmp_path, capsys):
    """Fails before this change: with no problem in the validation split (40 problems at
    --val-fraction 0.01), eval-bon printed its table without S_lin, S_RB and the
    reliability-weighted vote ("tuned": {}) and exited 0. Now it stops, as eval-steps does,
    naming the selectors and the fixes; --skip-tuned asks for the untuned selectors alone."""
    pools = tmp_path / "bench.jsonl"
    pools.write_text("".join(json.dumps(_pool(i)) + "\n" for i in range(40)))
    out = tmp_path / "r.json"
    assert main(["eval-bon", "--pools", str(pools), "--val-fraction", "0.01", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "none of its 40 problems falls in the validation split (--val-fraction 0.01, --seed 0)" in err
    assert "S_lin" in err and "S_RB" in err and "reliability-weighted vote" in err
    assert "a larger --val-fraction" in err and "--skip-tuned" in err and "Traceback" not in err
    assert not out.exists()

    assert main(["eval-bon", "--pools", str(pools), "--skip-tuned", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "--skip-tuned:" in printed and "left out; every problem tested" in printed
    res = json.loads(out.read_text())
    bench = res["benchmarks"]["bench"]
    assert bench["n_test"] == 40 and bench["n_val"] == 0 and bench["tuned"] == {}
    assert not set(TUNED) & set(bench["selectors"]) and bench["selectors"]["mean"]["acc"] == 1.0
    assert res["provenance"]["settings"]["skip_tuned"] is True  # it changes the results: recorded

    # A split with validation problems keeps every selector.
    assert main(["eval-bon", "--pools", str(pools), "--out", str(out)]) == 0
    bench = json.loads(out.read_text())["benchmarks"]["bench"]
    assert set(TUNED) <= set(bench["selectors"]) and bench["n_val"] > 0


def test_evaluate_pools_refuses_what_it_would_drop():
    """The library alike: scored pools without validation problems raise; unscored pools
    (no tuned selector either way) and tune=False do not."""
    sc = [StepScores([0.6, 0.5], [4.0, 4.0], None), StepScores([0.95, 0.9], [4.0, 4.0], None)]
    pools = [BonPool(f"p{i}", f"problem {i}: what is 3 + 4?", ["8", "7"], [False, True], sc) for i in range(40)]
    with pytest.raises(NoValidationProblems, match="lin, rb, reliability_vote"):
        evaluate_pools(pools, val_fraction=0.01)
    res = evaluate_pools(pools, val_fraction=0.01, tune=False)
    assert res["n_test"] == 40 and not set(TUNED) & set(res["selectors"])
    unscored = [BonPool(p.id, p.question, p.answers, p.correct, None) for p in pools]
    assert evaluate_pools(unscored, val_fraction=0.01)["n_test"] == 40
