"""`eval-steps --limit`, `--log-samples` and the plots' labels: a sample stratified by class
keeps every F1 defined where the file's first items would not; the logged items give back
the summary's metrics; each plot names what it draws and marks the threshold on the curve it
was chosen on."""

import json
from pathlib import Path

import numpy as np
import pytest

from betaprm.cli import main
from betaprm.evaluation import plots
from betaprm.evaluation.processbench import (
    average_f1_curve,
    choose_threshold,
    evaluate_processbench,
    read_processbench,
)
from betaprm.evaluation.sampling import allocate, limit_per_group, stratified_sample
from betaprm.evaluation.step_reports import limit_items

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def tiny_prm_dir(tmp_path_factory):
    from betaprm.model import BetaPRM
    from tests.helpers import make_lm_dir

    d = tmp_path_factory.mktemp("prm")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm"))).save_pretrained(d / "prm")
    return str(d / "prm")


@pytest.fixture(scope="module")
def pb_ordered(tmp_path_factory):
    """ProcessBench subsets in the official files' order, erroneous items first, three
    erroneous to one correct (as Omni-MATH has them): the vendored sample's 5 erroneous
    items of each subset copied 9 times and its 5 correct ones 3 times (each copy a new id
    and problem text), 60 items a subset, of which the first 45 are erroneous."""
    d = tmp_path_factory.mktemp("pb") / "pb"
    d.mkdir()
    for f in sorted((DATA / "processbench_sample").glob("*.json")):
        rows = json.loads(f.read_text())
        out = []
        for correct, copies in ((False, 9), (True, 3)):
            for c in range(copies):
                out += [
                    {**r, "id": f"{r['id']}-copy{c}", "problem": f"{r['problem']} (copy {c})"}
                    for r in rows
                    if (r["label"] == -1) == correct
                ]
        (d / f.name).write_text(json.dumps(out))
    return d


# ---------------------------------------------------------------- the sampler


def test_stratified_sample_keeps_proportions_and_order_and_is_seeded():
    classes = [True] * 30 + [False] * 15
    a = stratified_sample(classes, n=12, seed=0)
    assert a == sorted(a) and len(a) == 12
    assert sum(classes[i] for i in a) == 8  # 12 * 30/45
    assert stratified_sample(classes, n=12, seed=0) == a
    assert stratified_sample(classes, n=12, seed=1) != a
    assert stratified_sample(classes, n=100, seed=3) == list(range(45))  # all of a smaller pool
    b = stratified_sample(classes, per_class=4, seed=0)
    assert sum(classes[i] for i in b) == 4 and len(b) == 8
    # a rare class still gets one item when n allows, so an F1 needing both kinds is defined
    assert allocate({True: 99, False: 1}, 5) == {True: 4, False: 1}
    assert allocate({True: 7, False: 3}, 5) == {True: 3, False: 2}  # largest remainder: 3.5 / 1.5 -> tie to False
    with pytest.raises(ValueError, match="exactly one"):
        stratified_sample(classes, n=3, per_class=3)


def test_limit_per_group_draws_each_group_on_its_own():
    groups = ["a"] * 20 + ["b"] * 20
    classes = [i % 4 == 0 for i in range(40)]
    both = limit_per_group(groups, classes, 8, seed=5)
    alone = limit_per_group(groups[:20], classes[:20], 8, seed=5)
    assert [i for i in both if i < 20] == alone  # adding group b leaves group a's sample as it was
    assert sum(1 for i in both if i >= 20) == 8 and sum(classes[i] for i in alone) == 2


def test_limit_on_processbench_files_keeps_proportions_and_follows_the_seed(pb_ordered):
    items = read_processbench(pb_ordered)
    head = [it for sub in ("gsm8k", "math") for it in [x for x in items if x.subset == sub][:40]]
    assert all(it.label != -1 for it in head)  # the first 40 items of every subset: all erroneous
    r = evaluate_processbench(head, [np.full(len(it.steps), 0.9) for it in head], 0.5)
    assert r["undefined"] == {"gsm8k": "no erroneous items"} or set(r["undefined"].values()) == {"no correct items"}
    kept, sample = limit_items("processbench", items, 40, 0)
    again, _ = limit_items("processbench", items, 40, 0)
    other, _ = limit_items("processbench", items, 40, 1)
    ids = [(it.subset, it.id) for it in kept]
    assert ids == [(it.subset, it.id) for it in again]
    assert ids != [(it.subset, it.id) for it in other]
    for sub, d in sample["subsets"].items():
        mine = [it for it in kept if it.subset == sub]
        assert len(mine) == d["n_items"] == 40 and d["of_items"] == 60
        assert sum(it.label == -1 for it in mine) == d["n_correct"] == 10  # 40 * 15/60: the file's proportion
    positions = [items.index(it) for it in kept]
    assert positions == sorted(positions)  # in the file's order


def test_average_f1_curve_is_the_reported_metric_and_the_chosen_peak():
    items = read_processbench(DATA / "processbench_sample")
    rng = np.random.default_rng(0)
    scores = [rng.uniform(0, 1, len(it.steps)) for it in items]
    ts = np.array([-1.0, 0.1, 0.3, 0.5, 0.7, 0.95, 2.0])
    curve = average_f1_curve(items, scores, ts)
    for t, f in zip(ts, curve):
        want = evaluate_processbench(items, scores, float(t))["average_f1"]
        assert (np.isnan(f) and np.isnan(want)) or f == pytest.approx(want)
    tau, best = choose_threshold(items, scores)
    grid = np.unique(np.concatenate([*scores, [tau]]))
    chosen = average_f1_curve(items, scores, grid, choosing=True)
    assert best == pytest.approx(chosen.max()) == pytest.approx(chosen[np.searchsorted(grid, tau)])


# ---------------------------------------------------------------- the command


def _spy_plots(monkeypatch):
    figs = {}
    for name in ("metric_vs_threshold", "reliability_diagram"):
        real = getattr(plots, name)

        def spy(*a, _real=real, _name=name, **k):
            figs[_name] = _real(*a, **k)
            return figs[_name]

        monkeypatch.setattr(plots, name, spy)
    return figs


def _curves_and_marks(fig):
    ax = fig.axes[0]
    lines = {ln.get_label(): (ln.get_xdata(), ln.get_ydata()) for ln in ax.get_lines() if ln.get_label()[0] != "_"}
    marks = {c.get_label(): tuple(c.get_offsets()[0]) for c in ax.collections}
    return ax, lines, marks


def _at(line, x):
    xs, ys = line
    return ys[int(np.flatnonzero(np.asarray(xs) == x)[0])]


def test_limit_40_gives_defined_f1s_and_log_samples_give_back_the_metrics(
    tmp_path, tiny_prm_dir, pb_ordered, monkeypatch, capsys
):
    """--threshold 0 calls every step correct, so each subset's F1 is defined exactly when
    it holds both kinds (error accuracy 0, correct accuracy 100: F1 0), whatever the tiny
    model's scores; on the first 40 items it would be undefined everywhere."""
    figs = _spy_plots(monkeypatch)
    out, log = tmp_path / "r.json", tmp_path / "samples.jsonl"
    args = ["eval-steps", "--model", tiny_prm_dir, "--data", str(pb_ordered), "--limit", "40", "--seed", "3"]
    args += ["--threshold", "0", "--truncate", "steps", "--out", str(out), "--log-samples", str(log)]
    assert main([*args, "--plots", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out
    assert "--limit 40 (seed 3), drawn by class" in printed and "gsm8k 40 of 60 (30 of 45 erroneous" in printed
    res = json.loads(out.read_text())
    assert res["limit"]["per_subset"] == 40 and res["limit"]["seed"] == 3
    assert res["provenance"]["settings"]["limit"] == 40 and res["provenance"]["settings"]["seed"] == 3
    assert set(res["subsets"]) == {"gsm8k", "math", "olympiadbench", "omnimath"} and res["undefined"] == {}
    for m in res["subsets"].values():
        assert (m["n_error"], m["n_correct"]) == (30, 10)
        assert m["f1"] is not None and (m["error_acc"], m["correct_acc"], m["f1"]) == (0.0, 100.0, 0.0)

    # --log-samples: one line per item, its settings beside it, the summary's metrics recomputed
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == res["n_items"] == 160
    assert json.loads((tmp_path / "samples.jsonl.meta.json").read_text())["settings"] == res["provenance"]["settings"]
    for r in rows:
        assert {"id", "subset", "steps", "mu", "kappa", "sigma", "predicted_first_error", "label", "match"} <= set(r)
        assert len(r["mu"]) == len(r["kappa"]) == len(r["sigma"]) <= len(r["steps"])
        flagged = [j for j, s in enumerate(r["step_score"]) if not s > r["threshold"]]
        assert r["predicted_first_error"] == (flagged[0] if flagged else -1)
        assert r["match"] == (r["predicted_first_error"] == r["label"])
        assert res["predictions"][f"{r['subset']}/{r['id']}"] == r["predicted_first_error"]
    for sub, m in res["subsets"].items():
        mine = [r for r in rows if r["subset"] == sub and r["split"] == "test"]
        err = [r["match"] for r in mine if r["label"] != -1]
        cor = [r["match"] for r in mine if r["label"] == -1]
        assert (len(err), len(cor)) == (m["n_error"], m["n_correct"])
        assert 100 * np.mean(err) == pytest.approx(m["error_acc"]) and 100 * np.mean(cor) == pytest.approx(
            m["correct_acc"]
        )

    # the plots with a fixed threshold: the reported metric, the threshold marked on it
    ax, lines, marks = _curves_and_marks(figs["metric_vs_threshold"])
    assert ax.get_ylabel() == "ProcessBench average F1 over subsets (%)"
    assert ax.get_xlabel() == "threshold on the step score"
    (curve,) = lines.values()
    assert list(lines)[0].startswith("all items, 160 items (reported")
    ((label, (x, y)),) = marks.items()
    assert label.startswith("threshold 0: fixed, as reported (") and x == 0 and y == pytest.approx(res["average_f1"])
    assert _at(curve, 0.0) == pytest.approx(y)
    rel = figs["reliability_diagram"].axes[0]
    assert rel.get_ylabel() == "observed fraction correct (step labels)"
    assert rel.get_xlabel() == "predicted mu (mean per bin)" and "bins of mu" in rel.get_title()


def test_a_threshold_chosen_on_validation_is_marked_on_the_validation_curve_at_its_peak(
    tmp_path, tiny_prm_dir, pb_ordered, monkeypatch
):
    figs = _spy_plots(monkeypatch)
    out, log = tmp_path / "r.json", tmp_path / "s.jsonl"
    args = ["eval-steps", "--model", tiny_prm_dir, "--data", str(pb_ordered), "--limit", "16", "--seed", "1"]
    args += ["--threshold", "val", "--val-fraction", "0.5", "--truncate", "steps", "--out", str(out)]
    assert main([*args, "--log-samples", str(log), "--plots", str(tmp_path / "plots")]) == 0
    res = json.loads(out.read_text())
    ax, lines, marks = _curves_and_marks(figs["metric_vs_threshold"])
    assert ax.get_ylabel() == "ProcessBench average F1 over subsets (%)"
    val = next(v for k, v in lines.items() if k.startswith("validation part") and "chosen on" in k)
    test = next(v for k, v in lines.items() if k.startswith("test part") and "reported" in k)
    chosen = next(v for k, v in marks.items() if "chosen here (max validation average F1)" in k)
    assert chosen[0] == pytest.approx(res["threshold"]) and chosen[1] == pytest.approx(res["val_average_f1"])
    assert chosen[1] == pytest.approx(np.nanmax(val[1])) == pytest.approx(_at(val, chosen[0]))  # on the peak
    if res["average_f1"] is not None:
        reported = next(v for k, v in marks.items() if k.startswith("reported at that threshold ("))
        assert reported[1] == pytest.approx(res["average_f1"])
        assert _at(test, chosen[0]) == pytest.approx(res["average_f1"])
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(r["split"] == "validation" for r in rows) == res["n_val_items"]
    assert sum(r["split"] == "test" for r in rows) == res["n_items"] == len(res["predictions"])


def test_prmbench_and_visualprocessbench_with_limit_log_samples_and_plots(tmp_path, tiny_prm_dir, monkeypatch):
    from tests.test_eval_steps import _write_bench

    figs = _spy_plots(monkeypatch)
    out, log = tmp_path / "p.json", tmp_path / "p.jsonl"
    args = ["eval-steps", "--model", tiny_prm_dir, "--data", str(DATA / "prmbench_sample.jsonl"), "--limit", "1"]
    args += ["--truncate", "steps"]
    assert main([*args, "--out", str(out), "--log-samples", str(log), "--plots", str(tmp_path / "pp")]) == 0
    res = json.loads(out.read_text())
    assert all(m["n_items"] == 1 for m in res["categories"].values())
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == res["n_items"] == len(res["categories"])
    for cat, m in res["categories"].items():
        (r,) = [r for r in rows if r["subset"] == cat]
        wrong = {e - 1 for e in r["error_steps"]}
        pos = [s > r["threshold"] for s in r["step_score"]]
        tp = sum(p for j, p in enumerate(pos) if j not in wrong)
        tn = sum(not p for j, p in enumerate(pos) if j in wrong)
        assert (tp, tn) == (m["counts"]["tp"], m["counts"]["tn"])
        assert r["predicted_error_steps"] == [j + 1 for j, p in enumerate(pos) if not p]
    ax, lines, marks = _curves_and_marks(figs["metric_vs_threshold"])
    assert ax.get_ylabel() == "PRMBench overall PRMScore (%)"
    ((x, y),) = marks.values()
    assert x == 0.5 and y == pytest.approx(100 * res["overall"]["prm_score"])
    assert _at(next(iter(lines.values())), 0.5) == pytest.approx(y)

    data, out, log = tmp_path / "vpb.jsonl", tmp_path / "v.json", tmp_path / "v.jsonl"
    _write_bench(data)  # 30 items of two sources, every third with a wrong step
    args = ["eval-steps", "--model", tiny_prm_dir, "--data", str(data), "--limit", "12", "--val-fraction", "0.4"]
    assert main([*args, "--out", str(out), "--log-samples", str(log), "--plots", str(tmp_path / "vp")]) == 0
    res = json.loads(out.read_text())
    assert {d["n_items"] for d in res["limit"]["subsets"].values()} == {12}
    assert all(d["n_error"] == 4 for d in res["limit"]["subsets"].values())  # 12 * 5/15
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    test = [r for r in rows if r["split"] == "test"]
    assert len(test) == res["n_test_items"] and len(rows) - len(test) == res["n_val_items"]
    right = [p == lab for r in test for p, lab in zip(r["predicted"], r["labels"]) if lab != 0]
    assert len(right) == res["n_steps"] and np.mean(right) == pytest.approx(res["overall_f1"])
    ax, lines, marks = _curves_and_marks(figs["metric_vs_threshold"])
    assert ax.get_ylabel() == "step micro-F1 (= step accuracy)"
    chosen = next(v for k, v in marks.items() if "chosen here (max validation micro-F1)" in k)
    val = next(v for k, v in lines.items() if k.startswith("validation part"))
    assert chosen[1] == pytest.approx(res["val_f1"]) == pytest.approx(np.max(val[1]))
