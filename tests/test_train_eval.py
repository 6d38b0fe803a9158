"""Evaluation while training: held-out metrics every --eval-steps through the Trainer's own
evaluation flow, the best checkpoint (best_metric, load_best_model_at_end), --eval-fraction's
split by problem, resume with the evaluation history, ProcessBench-format held-out data."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from betaprm import BetaPRM
from betaprm.data.records import read_records
from betaprm.errors import BetaPRMInputError
from betaprm.evaluation.calibration import evaluate_counts, flat_counts
from betaprm.evaluation.processbench import evaluate_processbench, read_processbench
from betaprm.scoring import score_traces
from betaprm.train import TrainConfig, train
from betaprm.train.checkpoints import read_state
from betaprm.train.evaluate import split_by_question

from .helpers import make_counts, make_lm_dir, train_config

COUNTS_KEYS = ("eval_loss", "eval_nll", "eval_mae", "eval_ece", "eval_brier", "eval_coverage", "eval_runtime")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_lm_dir(tmp_path_factory.mktemp("lm") / "lm")


def _with_problems(path: Path, n_problems: int) -> Path:
    """make_counts' records, each given one of ``n_problems`` question texts."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, r in enumerate(rows):
        r["question"] = f"add these {i % n_problems}"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    return _with_problems(make_counts(tmp_path_factory.mktemp("data") / "counts.jsonl", n=48), 12)


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    return make_counts(tmp_path_factory.mktemp("held") / "held.jsonl", n=16, seed=7)


def cfg(lm_dir, counts, out, **kw):
    return train_config(lm_dir, counts, out, **{"save_steps": 2, "eval_steps": 2, **kw})


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def evals(history):
    return {h["step"]: h for h in history if "eval_nll" in h or "eval_f1" in h}


def test_held_out_metrics_are_logged_every_eval_steps_and_match_scoring(tmp_path, lm_dir, counts, held_out):
    out = tmp_path / "run"
    report = "tensorboard" if _has("tensorboard") else "none"
    prm, trainer, _ = train(cfg(lm_dir, counts, out, eval_data=str(held_out), save_steps=4, report_to=report))
    got = evals(trainer.state.log_history)
    assert sorted(got) == [2, 4, 6]  # every --eval-steps, the last step included
    for h in got.values():
        for key in COUNTS_KEYS:
            assert np.isfinite(h[key]), key
        assert 0 <= h["eval_coverage"] <= 1 and 0 <= h["eval_ece"] <= 1
        assert h["eval_loss"] >= h["eval_nll"]  # + lambda_reg * regulariser (>= 0)
    # The Trainer's best-model bookkeeping, lower nll being better.
    state = trainer.state
    assert trainer.args.metric_for_best_model == "eval_nll" and trainer.args.greater_is_better is False
    assert state.best_metric == min(h["eval_nll"] for h in got.values())
    # trainer_state.json of a checkpoint holds the evaluations up to it.
    saved = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert sorted(evals(saved["log_history"])) == [2, 4]
    # The last evaluation is that of the saved model, scored as `betaprm score` scores.
    final = BetaPRM.from_pretrained(out)
    recs = read_records(held_out).records
    scores = score_traces(final, [(r.question, r.steps) for r in recs])
    res = evaluate_counts(*flat_counts(recs, scores), beta=True)
    assert got[6]["eval_nll"] == pytest.approx(res["nll"]["beta_binomial"], rel=1e-4)
    assert got[6]["eval_ece"] == pytest.approx(res["ece"], abs=1e-4)
    assert got[6]["eval_coverage"] == pytest.approx(res["intervals"]["beta_binomial_0.9"]["coverage"])
    mu, _, k, n = flat_counts(recs, scores)
    assert got[6]["eval_mae"] == pytest.approx(float(np.abs(mu - k / n).mean()), rel=1e-4)
    # The run summary and the model card carry them.
    summary = json.loads((out / "train_summary.json").read_text())["evaluation"]
    assert summary["metric_for_best_model"] == "eval_nll" and summary["best_metric"] == state.best_metric
    assert summary["final_model_is"] == "last step" and summary["final_model"]["step"] == 6
    assert [e["step"] for e in summary["history"]] == [2, 4, 6]
    card = (out / "README.md").read_text()
    assert "eval_nll" in card and f"{got[6]['eval_nll']:.4g}" in card
    if report == "tensorboard":  # the loggers get them as they get the training loss
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        (events,) = {p.parent for p in out.glob("runs/**/events.out.tfevents.*")}
        acc = EventAccumulator(str(events))
        acc.Reload()
        assert [e.step for e in acc.Scalars("eval/nll")] == [2, 4, 6]
        assert acc.Scalars("eval/nll")[-1].value == pytest.approx(got[6]["eval_nll"], rel=1e-6)
        assert {"eval/coverage", "eval/ece", "eval/mae", "train/loss"} <= set(acc.Tags()["scalars"])


def test_evaluation_changes_nothing_of_the_training(tmp_path, lm_dir, counts, held_out):
    """The held-out pass takes no random numbers and leaves the model in training mode: the
    weights are those of the same run without it."""
    a, _, _ = train(cfg(lm_dir, counts, tmp_path / "a", max_steps=4, save_steps=4, eval_data=str(held_out)))
    b, _, _ = train(cfg(lm_dir, counts, tmp_path / "b", max_steps=4, save_steps=4, eval_steps=0))
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


def test_load_best_model_at_end_ends_with_the_best_checkpoint(tmp_path, lm_dir, counts, held_out):
    out = tmp_path / "best"
    # A learning rate this high makes the held-out NLL jump after the first steps, so the best
    # checkpoint is an early one (step 2 on this data and seed), not the last.
    prm, trainer, _ = train(
        cfg(
            lm_dir,
            counts,
            out,
            eval_data=str(held_out),
            load_best_model_at_end=True,
            learning_rate=1e-1,
            max_steps=8,
            save_total_limit=2,
        )
    )
    got = evals(trainer.state.log_history)
    assert sorted(got) == [2, 4, 6, 8]
    best_step = min(got, key=lambda s: got[s]["eval_nll"])
    assert best_step < 8 and trainer.state.best_metric == got[best_step]["eval_nll"]
    best = Path(trainer.state.best_model_checkpoint)
    assert best.name == f"checkpoint-{best_step}" and best.is_dir()  # kept by the rotation
    want = read_state(best / "model.safetensors")
    last = read_state(out / "checkpoint-8" / "model.safetensors")
    final = BetaPRM.from_pretrained(out).state_dict()
    for k, v in want.items():
        torch.testing.assert_close(final[k], v, rtol=0, atol=0, msg=k)
    assert any(not torch.equal(final[k], last[k]) for k in want)  # not the last step's weights
    summary = json.loads((out / "train_summary.json").read_text())["evaluation"]
    assert summary["final_model_is"] == "best checkpoint" and summary["final_model"]["step"] == best_step
    assert f"{got[best_step]['eval_nll']:.4g}" in (out / "README.md").read_text()


def test_eval_fraction_holds_out_whole_problems_deterministically(tmp_path, lm_dir, counts):
    recs = read_records(counts).records
    train_a, held_a = split_by_question(recs, 0.25, seed=3)
    train_b, held_b = split_by_question(list(reversed(recs)), 0.25, seed=3)
    assert {r.question for r in train_a}.isdisjoint({r.question for r in held_a})
    assert len({r.question for r in held_a}) == 3 and len(train_a) + len(held_a) == len(recs)
    assert {r.id for r in held_a} == {r.id for r in held_b}  # the records' order does not matter
    assert any({r.id for r in split_by_question(recs, 0.25, seed=s)[1]} != {r.id for r in held_a} for s in range(4))
    with pytest.raises(BetaPRMInputError, match="--eval-fraction"):
        split_by_question(recs[:1], 0.5, seed=0)
    out = tmp_path / "frac"
    _, trainer, _ = train(cfg(lm_dir, counts, out, eval_fraction=0.25, seed=3, max_steps=2))
    assert sorted(evals(trainer.state.log_history)) == [2]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["records"] == {"loaded": 48, "rejected": 0, "held_out": len(held_a)}
    assert summary["truncation"]["records"] == len(train_a)
    assert summary["run"]["settings"]["eval_fraction"] == 0.25  # a resume must keep the split


def test_resume_keeps_the_evaluation_history_and_the_best_metric(tmp_path, lm_dir, counts, held_out):
    kw = dict(eval_data=str(held_out), max_steps=6, save_steps=2)
    _, trainer_a, _ = train(cfg(lm_dir, counts, tmp_path / "a", **kw))
    # An interrupted run: its checkpoint at step 4 is all there is; it resumes from there.
    shutil.copytree(tmp_path / "a" / "checkpoint-4", tmp_path / "b" / "checkpoint-4")
    _, trainer_b, _ = train(cfg(lm_dir, counts, tmp_path / "b", resume_from_checkpoint="last", **kw))
    ea, eb = evals(trainer_a.state.log_history), evals(trainer_b.state.log_history)
    assert sorted(eb) == [2, 4, 6]
    for step in (2, 4):  # from the checkpoint's trainer_state.json
        assert eb[step]["eval_nll"] == ea[step]["eval_nll"]
    assert eb[6]["eval_nll"] == pytest.approx(ea[6]["eval_nll"], rel=1e-5)
    assert trainer_b.state.best_metric == pytest.approx(trainer_a.state.best_metric, rel=1e-5)
    summary = json.loads((tmp_path / "b" / "train_summary.json").read_text())["evaluation"]
    assert [e["step"] for e in summary["history"]] == [2, 4, 6]


PB_ITEMS = [
    # subset, steps, label (first wrong step, -1: all right)
    ("gsm8k", ["1 + 2 = 3", "3 + 4 = 7"], -1),
    ("gsm8k", ["1 + 2 = 4", "4 + 4 = 8"], 0),
    ("gsm8k", ["2 + 2 = 4", "4 + 5 = 8", "8 + 1 = 9"], 1),
    ("math", ["5 + 4 = 9"], -1),
    ("math", ["6 + 1 = 7", "7 + 2 = 8"], 1),
]


def test_processbench_format_held_out_data_logs_the_official_f1(tmp_path, lm_dir, counts):
    data = tmp_path / "pb.json"
    data.write_text(
        json.dumps(
            [
                {"id": str(i), "subset": sub, "problem": f"add these {i}", "steps": steps, "label": label}
                for i, (sub, steps, label) in enumerate(PB_ITEMS)
            ]
        )
    )
    out = tmp_path / "pb"
    _, trainer, _ = train(cfg(lm_dir, counts, out, eval_data=str(data), max_steps=2))
    got = evals(trainer.state.log_history)
    assert sorted(got) == [2]
    h = got[2]
    assert {"eval_f1", "eval_f1_gsm8k", "eval_f1_math", "eval_error_acc_math", "eval_runtime"} <= set(h)
    assert trainer.args.metric_for_best_model == "eval_f1" and trainer.args.greater_is_better is True
    # The official metric of the saved model's mu at threshold 0.5.
    items = read_processbench(data)
    scores = score_traces(BetaPRM.from_pretrained(out), [(it.problem, it.steps) for it in items])
    res = evaluate_processbench(items, [s.mu for s in scores], threshold=0.5)
    for key, want in (("eval_f1", res["average_f1"]), ("eval_f1_math", res["subsets"]["math"]["f1"])):
        assert (math.isnan(h[key]) and math.isnan(want)) or h[key] == pytest.approx(want), key
    with pytest.raises(BetaPRMInputError, match="--metric-for-best-model nll"):
        train(cfg(lm_dir, counts, tmp_path / "pb2", eval_data=str(data), metric_for_best_model="nll"))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(eval_data="x.jsonl", eval_fraction=0.2), "--eval-data and --eval-fraction"),
        (dict(eval_fraction=0.2, load_best_model_at_end=True, save_steps=3, eval_steps=2), "multiple of --eval-steps"),
        (dict(eval_fraction=1.5), "--eval-fraction must be in"),
        (dict(eval_fraction=0.2, metric_for_best_model="accuracy"), "--metric-for-best-model must be one of"),
        (dict(eval_steps=5), "--eval-steps needs held-out data"),
        (dict(load_best_model_at_end=True), "--load-best-model-at-end needs held-out data"),
    ],
)
def test_bad_evaluation_flags_are_refused_by_name(lm_dir, counts, tmp_path, kw, message):
    with pytest.raises(BetaPRMInputError, match=message):
        cfg(lm_dir, counts, tmp_path / "x", **kw)


def test_empty_or_mismatched_held_out_data_is_refused_before_training(lm_dir, counts, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(BetaPRMInputError, match="--eval-data"):
        train(cfg(lm_dir, counts, tmp_path / "e", eval_data=str(empty)))
    assert not list((tmp_path / "e").glob("checkpoint-*"))
    with pytest.raises(BetaPRMInputError, match="f1 is for ProcessBench"):
        train(cfg(lm_dir, counts, tmp_path / "f", eval_fraction=0.25, metric_for_best_model="f1"))


def test_a_vision_language_prm_is_evaluated_on_its_image_records(tmp_path):
    from PIL import Image

    from betaprm.tiny import save_vlm_dir, tiny_vlm

    rng = np.random.default_rng(0)
    images = []
    for i, (w, h) in enumerate([(40, 30), (30, 50)]):
        images.append(str(tmp_path / f"img{i}.png"))
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(images[-1])
    model, proc = tiny_vlm("qwen2_5_vl")
    save_vlm_dir(model, proc, tmp_path / "vlm")
    data = tmp_path / "counts.jsonl"
    rows = [
        {
            "id": f"r{i}",
            "question": f"What is shown? {i % 6}",
            "steps": ["A square.", "It is red."][: 1 + i % 2],
            "images": [images[i % 2]],
            "mc_correct": rng.integers(0, 9, 1 + i % 2).tolist(),
            "mc_total": 8,
        }
        for i in range(24)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, trainer, _ = train(
        TrainConfig(
            model=str(tmp_path / "vlm"),
            data=str(data),
            output_dir=str(tmp_path / "out"),
            eval_fraction=0.34,
            max_steps=3,  # trains on after an evaluation at step 2
            save_steps=2,
            global_batch_size=4,
            learning_rate=1e-3,
            use_cpu=True,
        )
    )
    got = evals(trainer.state.log_history)
    assert sorted(got) == [2, 3]
    assert all(np.isfinite(h[k]) for h in got.values() for k in COUNTS_KEYS)


@pytest.mark.parametrize("objective", ["soft-ce", "hard-ce"])
def test_a_standard_prm_is_scored_by_the_binomial_at_its_mu(tmp_path, lm_dir, counts, held_out, objective):
    from betaprm.beta import soft_ce_loss

    out = tmp_path / objective
    _, trainer, _ = train(cfg(lm_dir, counts, out, eval_data=str(held_out), max_steps=2, objective=objective))
    (h,) = evals(trainer.state.log_history).values()
    recs = read_records(held_out).records
    mu, kappa, k, n = flat_counts(
        recs, score_traces(BetaPRM.from_pretrained(out), [(r.question, r.steps) for r in recs])
    )
    res = evaluate_counts(mu, kappa, k, n, beta=False)
    assert h["eval_nll"] == pytest.approx(res["nll"]["binomial_at_mu"], rel=1e-4)
    assert h["eval_coverage"] == pytest.approx(res["intervals"]["binomial_at_mu_0.9"]["coverage"])
    target = k if objective == "soft-ce" else (k / n > 0.5) * n
    ce = soft_ce_loss(*(torch.as_tensor(x, dtype=torch.float64) for x in (mu, target, n))).mean()
    assert h["eval_loss"] == pytest.approx(float(ce), rel=1e-4)


def test_load_best_model_at_end_with_lora_merges_the_best_adapters(tmp_path, lm_dir, counts, held_out):
    pytest.importorskip("peft")
    out = tmp_path / "lora"
    kw = dict(eval_data=str(held_out), load_best_model_at_end=True, metric_for_best_model="eval_mae", max_steps=4)
    prm, trainer, _ = train(cfg(lm_dir, counts, out, lora_r=4, learning_rate=1e-1, **kw))
    got = evals(trainer.state.log_history)
    best_step = min(got, key=lambda s: got[s]["eval_mae"])
    assert best_step < 4 and trainer.args.metric_for_best_model == "eval_mae"  # an earlier checkpoint wins
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    # The saved (merged) model scores the held-out data as the best checkpoint did.
    recs = read_records(held_out).records
    scores = score_traces(BetaPRM.from_pretrained(out), [(r.question, r.steps) for r in recs])
    mu, _, k, n = flat_counts(recs, scores)
    assert float(np.abs(mu - k / n).mean()) == pytest.approx(got[best_step]["eval_mae"], rel=1e-4)
