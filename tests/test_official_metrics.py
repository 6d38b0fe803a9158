"""ProcessBench and PRMBench metrics against the official code, re-implemented here from
its source independently of ``betaprm.evaluation`` (the blocks are the repositories' own,
with only their inputs adapted), on the official records vendored in ``tests/data``.

- ProcessBench (QwenLM/ProcessBench): the metric block shared by ``code/run_eval.py`` and
  ``code/run_eval_prm_rlhflow.py`` on the main branch, the average F1 and the argmax step
  rule of the community ``code/run_eval_prm_trl.py`` (pull request 12).
- PRMBench (ssmisya/PRMBench at a1ae4eab): ``load_data_function``, ``evaluate_function`` and
  ``eval_on_hallucination_step`` of ``mr_eval/tasks/prmtest_classified/task.py``, and
  ``get_prmscore_from_current_res_dict`` of ``form_latex_strs.ipynb``.

Numbers must agree to the bit, undefined ones (nan) included.
"""

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from betaprm.evaluation.prmbench import GROUPS, evaluate_prmbench, read_prmbench
from betaprm.evaluation.processbench import evaluate_processbench, read_processbench

DATA = Path(__file__).parent / "data"


def same(a, b) -> bool:
    """Equal to the bit, or both undefined (nan / None)."""
    undefined = (
        a is None or (isinstance(a, float) and math.isnan(a)),
        b is None or (isinstance(b, float) and math.isnan(b)),
    )
    return all(undefined) if any(undefined) else float(a) == float(b)


# ---------------------------------------------------------------- ProcessBench, official


def find_first_zero(tensor):
    zeros = (tensor == 0).nonzero()
    return zeros[0].item() if zeros.numel() > 0 else -1


def official_processbench(items_by_config: dict, logits_by_config: dict) -> tuple[dict, float]:
    """The official per-step rule and metric block, per config (subset), then the mean."""
    all_f1_scores, out = [], {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # np.mean([]) and 0/0, as there
        for config, items in items_by_config.items():
            res_data = []
            for e, logits in zip(items, logits_by_config[config]):
                pred = torch.argmax(logits, dim=-1)
                res_data.append({"label": e["label"], "match": find_first_zero(pred) == e["label"]})
            data1 = [e for e in res_data if e["label"] != -1]
            data2 = [e for e in res_data if e["label"] == -1]
            acc1 = np.mean([e["match"] for e in data1]) * 100
            acc2 = np.mean([e["match"] for e in data2]) * 100
            f1 = 2 * acc1 * acc2 / (acc1 + acc2)
            all_f1_scores.append(f1)
            out[config] = (acc1, acc2, f1)
        return out, np.mean(all_f1_scores)


def _pb_case(rng, rows_by_config, drop=None):
    """Random two-class logits per step (class 0 = error; ties included), the official
    result, and ours on mu = softmax(yes, no)[yes] as BetaPRM computes it."""
    if drop:
        rows_by_config = {c: [r for r in rows if drop(c, r)] for c, rows in rows_by_config.items()}
    logits = {}
    for c, rows in rows_by_config.items():
        logits[c] = []
        for r in rows:
            no = torch.tensor(rng.choice([-1.0, 0.0, 1.0], len(r["steps"])), dtype=torch.float32)
            # mostly-positive steps, so that some items are predicted right
            yes = no + torch.tensor(rng.choice([0.0, 2.0, 2.0, 2.0, -2.0], len(r["steps"])), dtype=torch.float32)
            logits[c].append(torch.stack([no, yes], -1))
    official, official_avg = official_processbench(rows_by_config, logits)
    items, scores = [], []
    for c, rows in rows_by_config.items():
        for r, lg in zip(rows, logits[c]):
            items.append(r)
            scores.append(torch.softmax(lg.flip(-1), -1)[:, 0].numpy())  # (yes, no) -> mu
    return official, official_avg, items, scores


@pytest.fixture(scope="module")
def pb_rows():
    rows = {}
    for f in sorted((DATA / "processbench_sample").glob("*.json")):
        rows[f.stem] = json.loads(f.read_text())
    assert set(rows) == {"gsm8k", "math", "olympiadbench", "omnimath"}
    return rows


@pytest.mark.parametrize("case", ["all", "no_correct_items", "no_error_items", "all_wrong"])
def test_processbench_equals_the_official_code(pb_rows, case):
    """Every subset's accuracies and F1 and the average, as the official code computes
    them, undefined ones included (fails on the earlier code, which reported 0 and a finite
    average where the official numbers are nan)."""
    drop = {
        "all": None,
        "no_correct_items": lambda c, r: not (c == "math" and r["label"] == -1),
        "no_error_items": lambda c, r: not (c == "gsm8k" and r["label"] != -1),
        "all_wrong": None,
    }[case]
    rng = np.random.default_rng(["all", "no_correct_items", "no_error_items", "all_wrong"].index(case))
    official, official_avg, rows, scores = _pb_case(rng, pb_rows, drop)
    if case == "all_wrong":  # every step flagged: erroneous items with label > 0 and correct items all missed
        rows_by = {c: [r for r in rs if r["label"] != 0] for c, rs in pb_rows.items()}
        logits = {c: [torch.tensor([[1.0, 0.0]] * len(r["steps"])) for r in rs] for c, rs in rows_by.items()}
        official, official_avg = official_processbench(rows_by, logits)
        rows = [r for rs in rows_by.values() for r in rs]
        scores = [np.full(len(r["steps"]), 0.2) for r in rows]
    path_items = read_processbench(DATA / "processbench_sample")
    by_key = {(it.subset, it.id): it for it in path_items}
    subset_of = {id(r): c for c, rs in pb_rows.items() for r in rs}
    items = [by_key[(subset_of[id(r)], r["id"])] for r in rows]
    ours = evaluate_processbench(items, scores, 0.5)
    assert list(ours["subsets"]) == list(official)
    for c, (acc1, acc2, f1) in official.items():
        m = ours["subsets"][c]
        assert same(m["error_acc"], acc1) and same(m["correct_acc"], acc2) and same(m["f1"], f1), c
    assert same(ours["average_f1"], official_avg)
    if case != "all":
        assert math.isnan(ours["average_f1"]) and ours["undefined"]


def test_processbench_undefined_is_null_in_json_and_na_in_the_table(pb_rows):
    from betaprm.evaluation.processbench import table
    from betaprm.provenance import finite_or_null

    items = [
        it for it in read_processbench(DATA / "processbench_sample") if not (it.subset == "math" and it.label == -1)
    ]
    res = evaluate_processbench(items, [np.full(len(it.steps), 0.9) for it in items], 0.5)
    assert res["undefined"] == {"math": "no correct items"}
    js = json.loads(json.dumps(finite_or_null(res), allow_nan=False))
    assert js["subsets"]["math"]["f1"] is None and js["average_f1"] is None and js["subsets"]["gsm8k"]["f1"] == 0.0
    text = table(res)
    assert "| n/a |" in text.splitlines()[2] and "MATH F1 is undefined (no correct items)" in text


# ---------------------------------------------------------------- PRMBench, official


def official_load(rows):
    meta_data, filter_dict = [], {}
    for item in rows:
        item_idx = item["idx"]
        classification = item["classification"]
        if classification == "redundency":
            correct_idx = f"correct_{item_idx}"
            if filter_dict.get(correct_idx) is None:
                meta_data.append(
                    dict(
                        idx=correct_idx,
                        question=item["original_question"],
                        steps=item["original_process"],
                        error_steps=[],
                        classification="correct",
                    )
                )
                filter_dict[correct_idx] = 1
        classification_idx = f"{classification}_{item_idx}"
        if filter_dict.get(classification_idx) is None:
            meta_data.append(
                dict(
                    idx=classification_idx,
                    question=item["modified_question"],
                    steps=item["modified_process"],
                    error_steps=item["error_steps"],
                    classification=classification,
                )
            )
            filter_dict[classification_idx] = 1
    return meta_data


def eval_on_hallucination_step(hallucination_steps, labels):
    hallucination_steps = [i - 1 for i in hallucination_steps]
    POSITIVE_LABEL = 1
    TP = FP = TN = FN = 0
    for idx in range(len(labels)):
        if idx in hallucination_steps:
            if labels[idx] == POSITIVE_LABEL:
                FP += 1
            else:
                TN += 1
        else:
            if labels[idx] == POSITIVE_LABEL:
                TP += 1
            else:
                FN += 1
    return dict(TP=TP, FP=FP, TN=TN, FN=FN)


def official_f1s(m):
    TP, FP, FN, TN = m["TP"], m["FP"], m["FN"], m["TN"]
    precision = TP / (TP + FP) if (TP + FP) != 0 else -1
    recall = TP / (TP + FN) if (TP + FN) != 0 else -1
    f1 = 2 * precision * recall / (precision + recall) if (precision + recall) != 0 else -1
    negative_precision = TN / (TN + FN) if (TN + FN) != 0 else -1
    negative_recall = TN / (TN + FP) if (TN + FP) != 0 else -1
    negative_f1 = (
        2 * negative_precision * negative_recall / (negative_precision + negative_recall)
        if (negative_precision + negative_recall) != 0
        else -1
    )
    return f1, negative_f1


def get_prmscore(f1, negative_f1, classification=None):
    if classification in ["multi_solutions"]:
        prm_score = f1
    else:
        prm_score = f1 * 0.5 + negative_f1 * 0.5
    return prm_score if prm_score > 0 else 0


def official_prmbench(rows, scores_by_idx, threshold=0.5):
    """Per-class and total f1 / negative f1 / PRMScore from validity labels ``score > threshold``."""
    meta = official_load(rows)
    per, total = {}, dict(TP=0, FP=0, TN=0, FN=0)
    for m in meta:
        labels = [item > threshold for item in scores_by_idx[m["idx"]]]
        r = eval_on_hallucination_step(m["error_steps"], labels)
        acc = per.setdefault(m["classification"], dict(TP=0, FP=0, TN=0, FN=0))
        for k in acc:
            acc[k] += r[k]
            if m["classification"] != "correct":
                total[k] += r[k]
    classes = {c: (*official_f1s(v), get_prmscore(*official_f1s(v), c)) for c, v in per.items()}
    f1, nf1 = official_f1s(total)
    return meta, classes, (f1, nf1, get_prmscore(f1, nf1))


def test_prmbench_reads_every_official_record_and_equals_the_official_code():
    """The vendored official records, error steps past the end and empty steps included,
    are all read (the earlier code refused the first such record) and scored exactly as the
    official evaluator scores them, for several thresholds."""
    path = DATA / "prmbench_sample.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    items = read_prmbench(path)
    meta = official_load(rows)
    assert [it.id for it in sorted(items, key=lambda i: i.id)] == sorted(m["idx"] for m in meta)
    from betaprm.evaluation.prmbench import irregular

    counts = irregular(items)
    assert counts == {"error_step_past_end": 5, "no_error_step_inside": 2, "error_step_below_one": 0, "empty_step": 3}
    rng = np.random.default_rng(0)
    for threshold in (0.5, 0.3, 0.7):
        # scores on a grid with values exactly at the threshold
        scores = {it.id: rng.choice([0.1, 0.3, 0.5, 0.7, 0.9], len(it.steps)) for it in items}
        _, classes, overall = official_prmbench(rows, scores, threshold)
        ours = evaluate_prmbench(items, [scores[it.id] for it in items], threshold)
        assert set(ours["categories"]) == set(classes)
        for c, (f1, nf1, score) in classes.items():
            m = ours["categories"][c]
            if c == "correct":  # not in the evaluator's tables; ours is its F1 alone (module docstring)
                assert same(m["f1"], f1) and same(m["negative_f1"], nf1)
                continue
            assert same(m["f1"], f1) and same(m["negative_f1"], nf1) and same(m["prm_score"], score), c
        assert all(
            same(a, b)
            for a, b in zip(
                (ours["overall"]["f1"], ours["overall"]["negative_f1"], ours["overall"]["prm_score"]), overall
            )
        )
        for g, cats in GROUPS.items():
            want = sum(classes[c][2] for c in cats) / len(cats)
            assert same(ours["groups"][g], want)


def test_eval_steps_reads_the_official_prmbench_records_and_counts_the_irregular(tmp_path, capsys):
    """`betaprm eval-steps` on official PRMBench records with error steps past the end and
    empty steps: exit 0, every record scored, and a note naming how many (the earlier code
    stopped at the first such record with exit 2)."""
    from betaprm.cli import main
    from betaprm.model import BetaPRM
    from tests.helpers import make_lm_dir

    BetaPRM.from_backbone(str(make_lm_dir(tmp_path / "lm"))).save_pretrained(tmp_path / "prm")
    out = tmp_path / "r.json"
    args = ["eval-steps", "--model", str(tmp_path / "prm"), "--data", str(DATA / "prmbench_sample.jsonl")]
    # the tiny model has 1,024 positions, fewer than some solutions need
    assert main([*args, "--truncate", "steps", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "5 items list an error step past their last step (2 of them none inside the solution)" in printed
    assert "3 items have an empty step, scored like any other" in printed
    res = json.loads(out.read_text())
    assert res["irregular"] == {
        "error_step_past_end": 5,
        "no_error_step_inside": 2,
        "error_step_below_one": 0,
        "empty_step": 3,
    }
    assert res["n_items"] == len(read_prmbench(DATA / "prmbench_sample.jsonl")) and res["model_kind"] == "beta"
    assert res["n_truncated_items"] > 0 and f"--truncate steps cut {res['n_truncated_items']} of" in printed
