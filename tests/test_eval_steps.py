"""betaprm eval-steps: the VisualProcessBench protocol, F1 values checked by hand."""

import json

import numpy as np
import pytest

from betaprm.cli import main
from betaprm.errors import BetaPRMInputError
from betaprm.evaluation.steps import (
    BenchItem,
    best_threshold,
    evaluate_steps,
    f1_scores,
    read_visualprocessbench,
    split_by_problem,
)


def test_f1_by_hand():
    pred = np.array([1, 1, 0, 0, 1], bool)
    y = np.array([1, 0, 0, 1, 1], bool)
    micro, f_pos, f_neg = f1_scores(pred, y)
    # accuracy 3/5; correct class tp 2 fp 1 fn 1 -> 4/6; erroneous class tp 1 fp 1 fn 1 -> 2/4
    assert (micro, f_pos, f_neg) == pytest.approx((0.6, 4 / 6, 0.5))


def test_threshold_is_the_lowest_best_one():
    s = np.array([0.1, 0.3, 0.8, 0.9])
    y = np.array([0, 0, 1, 1], bool)
    assert best_threshold(s, y) == 0.8
    assert (
        best_threshold(np.array([0.5, 0.6]), np.array([0, 0], bool)) == np.inf
    )  # all erroneous: predict none correct


def _items(n=40):
    return [
        BenchItem(f"i{i}", f"question {i % 20}", ["a", "b", "c"], [1, -1, 0], "srcA" if i % 2 else "srcB", [])
        for i in range(n)
    ]


def test_split_keeps_a_problem_on_one_side():
    items = _items()
    val, test = split_by_problem(items, 0.3)
    vq, tq = {items[i].question for i in val}, {items[i].question for i in test}
    assert not vq & tq and sorted(val + test) == list(range(40)) and val and test


def test_evaluate_by_hand():
    items = _items()
    val, test = split_by_problem(items, 0.3)
    scores = [None] * len(items)
    for i in val:  # separable on validation: correct 0.8, erroneous 0.3 -> threshold 0.8
        scores[i] = np.array([0.8, 0.3, 0.0])
    for j, i in enumerate(test):  # on test, every other item is scored the wrong way round
        scores[i] = np.array([0.85, 0.2, 0.99]) if j % 2 == 0 else np.array([0.7, 0.95, 0.99])
    r = evaluate_steps(items, scores, 0.3)
    assert r["threshold"] == 0.8 and r["n_steps"] == 2 * len(test) and r["val_f1"] == 1.0
    good = sum(1 for j in range(len(test)) if j % 2 == 0)
    assert r["overall_f1"] == pytest.approx(good / len(test))
    # Per source: macro-F1 of that source's steps, computed here from the counts.
    for src in ("srcA", "srcB"):
        idx = [j for j, i in enumerate(test) if items[i].source == src]
        g = sum(1 for j in idx if j % 2 == 0)
        b = len(idx) - g
        f_pos = 2 * g / (2 * g + b + b)  # correct steps: g predicted right; b missed; b erroneous steps called correct
        f_neg = 2 * g / (2 * g + b + b)
        assert r["per_source"][src] == pytest.approx((f_pos + f_neg) / 2)


def _write_bench(path, with_image=False):
    rows = []
    for i in range(30):
        rows.append(
            {
                "id": f"b{i}",
                "question": f"What is {i} + 1?",
                "image": "img.png" if with_image and i == 0 else None,
                "response": {
                    "steps": [f"{i} + 1 = {i + 1}", f"so the answer is {i + 1}"],
                    "process_correctness": [1, -1 if i % 3 == 0 else 1],
                },
                "data_source": ["MathVision", "MathVerse"][i % 2],
                "answer": str(i + 1),
            }
        )
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_cli_zero_shot_on_a_plain_lm(tmp_path, capsys):
    from tests.helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    data = tmp_path / "vpb.jsonl"
    _write_bench(data)
    out = tmp_path / "res.json"
    assert (
        main(
            [
                "eval-steps",
                "--model",
                str(lm),
                "--data",
                str(data),
                "--out",
                str(out),
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    assert all((tmp_path / "plots" / f).stat().st_size > 0 for f in ("reliability.png", "f1_threshold.png"))
    r = json.loads(out.read_text())
    assert (
        r["model_kind"] == "zero-shot" and r["score"] == "mu" and set(r["per_source"]) <= {"MathVision", "MathVerse"}
    )
    assert 0 <= r["overall_f1"] <= 1 and r["n_steps"] > 0
    assert "overall (micro-F1)" in capsys.readouterr().out


def test_bad_records_and_images_on_a_text_model(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"question": "q", "response": {"steps": ["a", "b"], "process_correctness": [1, 2]}}) + "\n"
    )
    with pytest.raises(BetaPRMInputError, match=r"bad.jsonl:1: .*holds \[2\]"):
        read_visualprocessbench(bad)
    from tests.helpers import make_lm_dir

    data = tmp_path / "vpb.jsonl"
    _write_bench(data, with_image=True)
    assert main(["eval-steps", "--model", str(make_lm_dir(tmp_path / "lm")), "--data", str(data)]) == 2
    assert "1 records have images but" in capsys.readouterr().err


def test_no_annotated_validation_step_is_an_error_not_threshold_inf():
    """Fails before this change: with every validation step neutral the threshold was
    chosen on nothing (``inf``) and an F1 reported."""
    items = _items()
    val, _ = split_by_problem(items, 0.3)
    for i in val:
        items[i] = BenchItem(items[i].id, items[i].question, ["a", "b", "c"], [0, 0, 0], items[i].source, [])
    scores = [np.array([0.8, 0.3, 0.1])] * len(items)
    with pytest.raises(
        BetaPRMInputError,
        match=r"the validation part \(\d+ items\) holds no scored step labelled correct or incorrect",
    ):
        evaluate_steps(items, scores, 0.3)


def test_steps_cut_off_by_the_model_are_counted_not_scored():
    items = _items()
    scores = [np.array([0.8])] * len(items)  # --truncate steps kept the first step only
    r = evaluate_steps(items, scores, 0.3)
    assert r["n_unscored_steps"] == len(items)  # the -1 step of every item; neutral ones not counted
    assert r["n_steps"] + r["n_val_steps"] == len(items)


def test_truncated_traces_with_plots(tmp_path, capsys):
    """--truncate steps with --plots: the plots use the scored steps' labels only (before
    the fix the label and score arrays differed in length: IndexError)."""
    from betaprm import BetaPRM
    from betaprm.tiny import tiny_causal_lm
    from tests.helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    prm = BetaPRM.from_backbone(str(lm))
    short = tiny_causal_lm(len(prm.tokenizer), hidden_size=32, num_layers=2, max_position_embeddings=24)
    short.save_pretrained(tmp_path / "short")
    prm.tokenizer.save_pretrained(tmp_path / "short")
    data = tmp_path / "vpb.jsonl"
    _write_bench(data)
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "eval-steps",
                "--model",
                str(tmp_path / "short"),
                "--data",
                str(data),
                "--out",
                str(out),
                "--truncate",
                "steps",
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    ), capsys.readouterr().err
    r = json.loads(out.read_text())
    assert r["n_unscored_steps"] > 0 and (tmp_path / "plots" / "reliability.png").stat().st_size > 0
