"""ProcessBench and PRMBench evaluation: metrics computed by hand on fixtures, the
official ProcessBench rule on ties, and `betaprm eval-steps` on both formats end to end."""

import json

import numpy as np
import pytest
import torch

from betaprm.errors import BetaPRMInputError
from betaprm.evaluation.prmbench import evaluate_prmbench, read_prmbench
from betaprm.evaluation.processbench import (
    PBItem,
    choose_threshold,
    evaluate_processbench,
    predicted_first_error,
    read_processbench,
)


@pytest.fixture(scope="module")
def tiny_prm_dir(tmp_path_factory):
    from betaprm.model import BetaPRM
    from tests.helpers import make_lm_dir

    d = tmp_path_factory.mktemp("prm")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm"))).save_pretrained(d / "prm")
    return str(d / "prm")


# ---------------------------------------------------------------- ProcessBench


def _pb(label, n, subset="gsm8k", i=[0]):
    i[0] += 1
    return PBItem(f"x{i[0]}", f"problem {i[0]}", [f"step {j}" for j in range(n)], label, subset)


def test_processbench_metrics_by_hand():
    items = [
        _pb(2, 4),  # first error found exactly
        _pb(1, 3),  # flagged too early (step 0)
        _pb(0, 3),  # flagged too late (step 2)
        _pb(1, 3),  # nothing flagged: predicted -1
        _pb(-1, 2),  # correct, nothing flagged
        _pb(-1, 2),  # correct, its last step exactly at the threshold: flagged
        _pb(-1, 2),  # correct, just above
        _pb(-1, 3, "math"),
        _pb(0, 2, "math"),
    ]
    scores = [
        [0.9, 0.8, 0.3, 0.9],
        [0.4, 0.2, 0.9],
        [0.9, 0.9, 0.1],
        [0.9, 0.9, 0.9],
        [0.9, 0.7],
        [0.9, 0.5],
        [0.6, 0.51],
        [0.7, 0.8, 0.2],
        [0.1, 0.9],
    ]
    r = evaluate_processbench(items, [np.array(s) for s in scores], 0.5)
    g = r["subsets"]["gsm8k"]
    # erroneous: 1 of 4 located; correct: 2 of 3 unflagged
    assert g["error_acc"] == pytest.approx(25.0) and g["correct_acc"] == pytest.approx(200 / 3)
    f1 = 2 * 25 * (200 / 3) / (25 + 200 / 3)
    assert g["f1"] == pytest.approx(f1) and (g["n_error"], g["n_correct"]) == (4, 3)
    m = r["subsets"]["math"]
    assert (m["error_acc"], m["correct_acc"]) == (100.0, 0.0) and m["f1"] == 0.0
    assert r["average_f1"] == pytest.approx((f1 + 0.0) / 2)
    assert list(r["subsets"]) == ["gsm8k", "math"]
    assert r["predictions"]["gsm8k/" + items[5].id] == 1 and r["predictions"]["gsm8k/" + items[3].id] == -1


def _official_rule(logits: torch.Tensor) -> int:
    """QwenLM/ProcessBench code/run_eval_prm_trl.py: argmax over the two classes per step
    (index 0 = error), then the first zero, -1 when there is none."""
    pred = torch.argmax(logits, dim=-1)
    zeros = (pred == 0).nonzero()
    return zeros[0].item() if zeros.numel() > 0 else -1


def test_processbench_rule_matches_the_official_script_on_ties():
    """Logits with exact ties (mu exactly 0.5) and near-ties: our rule on mu = softmax over
    (Yes, No), as BetaPRM computes it, against the official argmax rule on the same logits."""
    rng = np.random.default_rng(0)
    disagreements = 0
    for _ in range(400):
        n = int(rng.integers(1, 7))
        no = torch.tensor(rng.choice([-1.0, 0.0, 0.5, 2.0], n), dtype=torch.float32)
        delta = torch.tensor(rng.choice([0.0, 0.0, 1e-3, -1e-3, 0.7, -0.7], n), dtype=torch.float32)
        yes = no + delta
        mu = torch.softmax(torch.stack([yes, no], -1), -1)[:, 0]  # BetaPRM's mu, float32
        official = _official_rule(torch.stack([no, yes], -1))  # class 0 = error
        disagreements += predicted_first_error(mu.numpy(), 0.5) != official
    assert disagreements == 0


def test_processbench_truncated_items_are_counted_and_predicted_from_their_scored_steps():
    """--truncate steps: a cut item's prediction comes from its scored steps (-1 when none
    is flagged), as a script looping over the scores it has would; the counts say how many
    items were cut and how many rest on the cut (the earlier code counted them as misses)."""
    it = _pb(-1, 4)
    assert predicted_first_error(np.array([0.9, 0.9]), 0.5) == -1  # cut before any flag
    assert predicted_first_error(np.array([0.9, 0.2]), 0.5) == 1  # a flag among the scored steps decides
    r = evaluate_processbench([it, _pb(1, 3)], [np.array([0.9, 0.9]), np.array([0.9, 0.1, 0.9])], 0.5)
    g = r["subsets"]["gsm8k"]
    assert (g["n_truncated"], g["n_undecided"]) == (1, 1) and g["correct_acc"] == 100.0 and g["error_acc"] == 100.0


def test_threshold_choice_is_exact():
    """The interval sweep equals trying every threshold (each score, and below them all)."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        items, scores = [], []
        for _ in range(30):
            n = int(rng.integers(1, 6))
            items.append(_pb(int(rng.integers(-1, n)), n))
            scores.append(np.round(rng.random(n), 1))  # rounding makes ties
        tau, f1 = choose_threshold(items, scores)

        def f1_at(t):  # an undefined F1 (both accuracies 0) counts as 0 when choosing
            m = evaluate_processbench(items, scores, t)["subsets"]["gsm8k"]
            return 0.0 if np.isnan(m["f1"]) else m["f1"]

        cands = sorted({-np.inf, *np.concatenate(scores)})
        brute = [f1_at(t) for t in cands]
        assert f1 == pytest.approx(max(brute)) and f1_at(tau) == pytest.approx(f1)
        assert tau == cands[int(np.argmax(brute))]  # the lowest best threshold


def test_threshold_val_is_chosen_on_validation_only():
    items = [_pb(-1 if i % 2 else 1, 3) for i in range(60)]
    scores = [np.array([0.9, 0.8, 0.7]) if it.label == -1 else np.array([0.9, 0.3, 0.9]) for it in items]
    r = evaluate_processbench(items, scores, "val", val_fraction=0.3)
    assert r["threshold_chosen_on"] == "validation" and 0.3 <= r["threshold"] < 0.7 and r["val_average_f1"] == 100.0
    assert r["n_items"] + r["n_val_items"] == 60 and r["subsets"]["gsm8k"]["f1"] == 100.0


def _pb_rows(n=12):
    rows = []
    for i in range(n):
        label = -1 if i % 3 == 0 else i % 3 - 1
        rows.append(
            {
                "id": f"gsm8k-{i}",
                "generator": "Qwen2-7B-Instruct",
                "problem": f"What is {i} + {i}?",
                "steps": [f"{i} + {i} = {2 * i}.", "So the answer is", f"{2 * i}."],
                "final_answer_correct": label == -1,
                "label": label,
            }
        )
    return rows


def test_read_processbench_from_files_and_splits(tmp_path):
    rows = _pb_rows()
    (tmp_path / "gsm8k.json").write_text(json.dumps(rows))
    items = read_processbench(tmp_path / "gsm8k.json")
    assert [it.subset for it in items] == ["gsm8k"] * 12 and items[1].label == 0
    # a saved DatasetDict with the hub's split names: each split is a subset
    import datasets

    dd = datasets.DatasetDict(
        {"gsm8k": datasets.Dataset.from_list(rows[:6]), "math": datasets.Dataset.from_list(rows[6:])}
    )
    dd.save_to_disk(str(tmp_path / "pb"))
    items = read_processbench(tmp_path / "pb")
    assert [it.subset for it in items] == ["gsm8k"] * 6 + ["math"] * 6
    assert [it.steps for it in items] == [r["steps"] for r in rows]
    only = read_processbench(f"{tmp_path / 'pb'}:math")
    assert [it.id for it in only] == [r["id"] for r in rows[6:]]
    bad = rows[:1] + [{**rows[1], "label": 3}]
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(BetaPRMInputError, match=r"bad.jsonl:2: field 'label' must be the index"):
        read_processbench(tmp_path / "bad.jsonl")


# ---------------------------------------------------------------- PRMBench


def _prmbench_rows():
    def rec(idx, cat, process, errors, original=None):
        return {
            "original_question": f"q{idx}",
            "modified_question": f"q{idx} (modified)",
            "original_process": original or ["o1", "o2"],
            "modified_process": process,
            "modified_steps": errors,
            "error_steps": errors,
            "reason": "r",
            "idx": idx,
            "question": f"q{idx}",
            "classification": cat,
        }

    return [
        rec("p0", "redundency", ["a", "b", "c"], [2]),
        rec("p0", "redundency", ["x", "y"], [1]),  # same classification and idx: read once, as there
        rec("p3", "redundency", ["a", "b"], [2], original=["o3", "o4"]),
        rec("p1", "circular", ["a", "b", "c", "d"], [3, 4]),
        rec("p2", "multi_solutions", ["a", "b"], []),
    ]


def test_prmbench_metrics_by_hand(tmp_path):
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _prmbench_rows()))
    items = read_prmbench(tmp_path / "b.jsonl")
    cats = ["redundency", "correct", "redundency", "correct", "circular", "multi_solutions"]
    assert [it.category for it in items] == cats
    assert items[0].error_steps == {1} and items[1].steps == ["o1", "o2"] and items[1].question == "qp0"
    assert items[0].steps == ["a", "b", "c"] and items[3].steps == ["o3", "o4"]
    scores = [
        [0.9, 0.8, 0.2],  # steps +,-,+ : TP, FP, FN
        [0.7, 0.4],  # original, all +: TP, FN
        [0.5, 0.1],  # +,- : 0.5 is not above 0.5 -> FN; TN
        [0.9, 0.9],  # original: TP, TP
        [0.6, 0.2, 0.3, 0.9],  # +,+,-,- : TP, FN, TN, FP
        [0.6, 0.5],  # +,+ : TP, FN
    ]
    r = evaluate_prmbench(items, [np.array(x) for x in scores], 0.5)
    red, cir, ms, cor = (r["categories"][c] for c in ("redundency", "circular", "multi_solutions", "correct"))
    assert red["counts"] == {"tp": 1, "fp": 1, "tn": 1, "fn": 2}
    # positive: P 1/2, R 1/3 -> F1 0.4; negative: P 1/3, R 1/2 -> 0.4
    assert red["f1"] == pytest.approx(0.4) and red["negative_f1"] == pytest.approx(0.4)
    assert red["prm_score"] == pytest.approx(0.4)
    assert cir["counts"] == {"tp": 1, "fp": 1, "tn": 1, "fn": 1} and cir["prm_score"] == pytest.approx(0.5)
    # multi_solutions: no wrong step; negative precision 0/1 and recall undefined (-1): its F1
    # is 0 and PRMScore is the positive F1 alone, 2 * 1 * 0.5 / 1.5
    assert ms["f1"] == pytest.approx(2 / 3) and ms["negative_f1"] == 0 and ms["prm_score"] == pytest.approx(2 / 3)
    # the originals: TP 3, FN 1; no wrong step, so PRMScore is the positive F1 (P 1, R 3/4)
    assert cor["counts"] == {"tp": 3, "fp": 0, "tn": 0, "fn": 1} and cor["prm_score"] == pytest.approx(6 / 7)
    # overall pools every category but the originals: TP 3, FP 2, TN 2, FN 4
    f_pos = 2 * (3 / 5) * (3 / 7) / (3 / 5 + 3 / 7)
    f_neg = 2 * (2 / 6) * (2 / 4) / (2 / 6 + 2 / 4)
    assert r["overall"]["f1"] == pytest.approx(f_pos) and r["overall"]["negative_f1"] == pytest.approx(f_neg)
    assert r["overall"]["prm_score"] == pytest.approx((f_pos + f_neg) / 2)
    assert r["groups"]["simplicity"] == pytest.approx((0.4 + 0.5) / 2)
    assert r["groups"]["soundness"] is None  # a group with a missing category is not averaged


def test_prmbench_undefined_f1_and_clipping():
    from betaprm.evaluation.prmbench import PRMBenchItem

    # All steps wrong and all predicted wrong: positive precision and recall undefined -> -1,
    # PRMScore 0.5 * -1 + 0.5 * 1 = 0 after clipping at 0, as the evaluator's table does.
    it = PRMBenchItem("x", "q", ["a", "b"], {0, 1}, "confidence")
    r = evaluate_prmbench([it], [np.array([0.1, 0.2])])
    c = r["categories"]["confidence"]
    assert c["f1"] == -1 and c["negative_f1"] == 1 and c["prm_score"] == 0


def test_prmbench_bad_record(tmp_path):
    rows = _prmbench_rows()
    rows[3]["error_steps"] = [0, 9]  # outside the steps: read, never visited, counted (as the evaluator's loop)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from betaprm.evaluation.prmbench import irregular

    counts = irregular(read_prmbench(tmp_path / "b.jsonl"))
    assert counts["error_step_below_one"] == 1 and counts["error_step_past_end"] == 1
    rows[3]["error_steps"] = ["3"]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BetaPRMInputError, match=r"b.jsonl:4: field 'error_steps' must list step numbers, got"):
        read_prmbench(tmp_path / "b.jsonl")
    rows[3] = {**_prmbench_rows()[3], "classification": "typo"}
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BetaPRMInputError, match="categories are redundency, circular"):
        read_prmbench(tmp_path / "b.jsonl")


# ---------------------------------------------------------------- the command


def test_eval_steps_processbench_and_prmbench_commands(tmp_path, tiny_prm_dir, capsys):
    """`betaprm eval-steps` detects each format and reports what the evaluators compute on
    the model's own scores."""
    from betaprm.cli import main
    from betaprm.model import BetaPRM
    from betaprm.scoring import score_traces

    rows = _pb_rows()
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "pb.json"
    assert (
        main(["eval-steps", "--model", tiny_prm_dir, "--data", str(tmp_path / "gsm8k.jsonl"), "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "GSM8K error | correct | F1 | Avg. F1" in printed
    res = json.loads(out.read_text())
    assert res["format"] == "processbench" and res["threshold"] == 0.5 and res["score"] == "mu"
    prm = BetaPRM.from_pretrained(tiny_prm_dir)
    items = read_processbench(tmp_path / "gsm8k.jsonl")
    mus = [s.mu for s in score_traces(prm, [(it.problem, it.steps) for it in items])]
    want = evaluate_processbench(items, mus, 0.5)
    for key in ("error_acc", "correct_acc", "f1"):
        assert res["subsets"]["gsm8k"][key] == pytest.approx(want["subsets"]["gsm8k"][key])
    assert res["predictions"] == want["predictions"]

    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _prmbench_rows()))
    out = tmp_path / "prmbench.json"
    assert main(["eval-steps", "--model", tiny_prm_dir, "--data", str(tmp_path / "b.jsonl"), "--out", str(out)]) == 0
    assert "Avg (simplicity)" in capsys.readouterr().out
    res = json.loads(out.read_text())
    items = read_prmbench(tmp_path / "b.jsonl")
    mus = [s.mu for s in score_traces(prm, [(it.question, it.steps) for it in items])]
    want = evaluate_prmbench(items, mus, 0.5)
    assert res["overall"] == pytest.approx(want["overall"]) and res["format"] == "prmbench"
    assert res["categories"]["redundency"]["counts"] == want["categories"]["redundency"]["counts"]


def test_processbench_folder_of_subset_files_and_early_refusals(tmp_path):
    from betaprm.cli import main

    rows = _pb_rows()
    (tmp_path / "pb").mkdir()
    for name, part in (("gsm8k", rows[:6]), ("math", rows[6:])):
        (tmp_path / "pb" / f"{name}.json").write_text(json.dumps(part))
    items = read_processbench(tmp_path / "pb")  # a folder of files: each file a subset
    assert [it.subset for it in items] == ["gsm8k"] * 6 + ["math"] * 6
    # a validation part with one kind of item only cannot choose a threshold
    one_kind = [_pb(-1, 2) for _ in range(3)]
    with pytest.raises(BetaPRMInputError, match="holds only correct items"):
        choose_threshold(one_kind, [np.array([0.9, 0.9])] * 3)
    # refused before any model is loaded or any trace scored
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _prmbench_rows()))
    assert (
        main(
            [
                "eval-steps",
                "--model",
                str(tmp_path / "none"),
                "--data",
                str(tmp_path / "b.jsonl"),
                "--threshold",
                "val",
            ]
        )
        == 2
    )
    vpb = {"question": "q", "response": {"steps": ["a"], "process_correctness": [1]}}
    (tmp_path / "v.jsonl").write_text(json.dumps(vpb) + "\n")
    assert (
        main(
            [
                "eval-steps",
                "--model",
                str(tmp_path / "none"),
                "--data",
                str(tmp_path / "v.jsonl"),
                "--threshold",
                "0.5",
            ]
        )
        == 2
    )
