"""betaprm eval-steps"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data.kinds import wrong_kind
from ..data.sources import iter_splits
from ..distributed import process_device
from ..errors import BetaPRMInputError
from ..evaluation import plots, prmbench, processbench
from ..evaluation.prmbench import CATEGORIES, CORRECT, describe_irregular, evaluate_prmbench, read_prmbench
from ..evaluation.processbench import evaluate_processbench, read_processbench
from ..evaluation.step_reports import describe_sample, limit_items, sample_records, step_labels, threshold_curves
from ..evaluation.steps import evaluate_steps, read_visualprocessbench
from ..numeric import NumberRefused, number
from ..options import opt as _f
from ..provenance import write_records
from .flags import add_config_args, config_from_args
from .scoring_options import ScoringOptions, check_eval_outputs, evaluation_settings, write_evaluation

HELP = "step-level error detection: VisualProcessBench, ProcessBench, PRMBench (F1, in each benchmark's own layout)"
DESCRIPTION = """Step-level error detection on three benchmarks' formats (--format, detected by default).

visualprocessbench  the paper's appendix A.4: question, response.steps, response.process_correctness
                    (1 correct / 0 neutral / -1 incorrect), data_source, optional image. Neutral
                    steps are ignored. A threshold is swept on --val-fraction of the problems (split
                    by problem) and applied to the rest; overall micro-F1 and per-source macro-F1.
processbench        id, problem, steps, label (index of the first wrong step, -1 if none). The
                    predicted first error is the first step whose score is not above the threshold
                    (the rule of the repository's community script for two-class PRMs, ties
                    flagged); per subset the accuracy on erroneous and on correct items and their
                    harmonic mean F1, then the mean F1 over subsets, as the official metric code
                    computes them: undefined (n/a, null in JSON) where it gives nan. A hub name or
                    a folder with the four splits is read whole (split = subset).
prmbench            PRMBench's classified records (modified_process, error_steps, classification):
                    F1, negative F1 and PRMScore per category, per group and overall, as its
                    evaluator computes them (step positive when its score is above the threshold).
                    Records as the official data has them are read as its evaluator reads them:
                    an error step past the last step is never visited, an empty step is scored;
                    the output counts both. A folder of its .jsonl files is read whole.

Every step is scored: a trace longer than the model's positions stops the run, naming it.
--truncate steps (opt-in) scores the whole steps that fit; the table says how many items it cut.

Step score (--score auto): mu for a standard PRM or a plain causal LM scored zero-shot (the
Yes/No logits at each marker); for a BetaPRM mu - 0.5*sigma when the threshold is chosen on
validation (visualprocessbench always; others with --threshold val), mu against a fixed
threshold (the published rule compares a probability with 0.5). --data takes JSONL, .json,
parquet, a save_to_disk folder or a hub name (NAME[:SPLIT]). --out writes the results as JSON.

--limit N evaluates at most N items of each subset (ProcessBench subset, VisualProcessBench
data source, PRMBench category), drawn with --seed by class (erroneous / all correct) in the
subset's own proportions, at least one of each: the official files list their erroneous items
first, so the first N items would leave every F1 undefined. The metrics are the official ones
on the sample; --out records the limit, the seed and what was drawn. --log-samples FILE writes
one JSON line per evaluated item (its steps, mu, kappa, sigma, the prediction, the truth and
whether they match), as lm-evaluation-harness's --log_samples."""


FORMATS = ("visualprocessbench", "processbench", "prmbench")


@dataclass
class EvalStepsConfig(ScoringOptions):
    model: str = _f(
        "",
        "a BetaPRM, or a plain causal LM scored zero-shot: a folder, or a hub name OWNER/NAME[@REVISION]",
        required=True,
    )
    data: str = _f(
        "",
        "the benchmark's records: JSONL, .json, parquet, a save_to_disk folder or a hub name (NAME[:SPLIT])",
        required=True,
    )
    format: str = _f(
        "auto",
        "visualprocessbench, processbench, prmbench, or auto (from the first record's fields)",
        choices=("auto", *FORMATS),
    )
    threshold: str = _f(
        "auto",
        "a number (a step is correct when its score is above it), or val (chosen on --val-fraction of the problems); "
        "auto: val for visualprocessbench, 0.5 for processbench and prmbench (as published)",
    )
    out: str | None = _f(
        None, "write the results here (JSON): the printed table's numbers, the threshold, counts and settings"
    )
    limit: int | None = _f(
        None,
        "evaluate at most this many items of each subset (ProcessBench subset, VisualProcessBench data source, "
        "PRMBench category), drawn with --seed by class (erroneous / all correct) in the subset's proportions, at "
        "least one of each, so every F1 stays defined (lm-evaluation-harness's --limit, stratified); the official "
        "metrics on the sample",
    )
    log_samples: str | None = _f(
        None,
        "write one JSON line per evaluated item here: id, subset, steps, mu, kappa, sigma, the step score, the "
        "prediction, the truth and whether they match (lm-evaluation-harness's --log_samples); settings in "
        "FILE.meta.json",
    )
    plots: str | None = _f(
        None,
        "write a reliability diagram (step mu against the step's label) and F1 against the threshold (PNG) into this "
        "folder",
    )
    score: str = _f(
        "auto",
        "step score: mu, mu-sigma (mu - lam*sigma), or auto (mu - lam*sigma for a beta-binomial model when the "
        "threshold is chosen on validation, else mu)",
        choices=("auto", "mu", "mu-sigma"),
    )
    lam: float = _f(0.5, "lambda of mu - lambda*sigma")
    val_fraction: float = _f(0.2, "fraction of problems used to choose the threshold")
    seed: int = _f(0, "seed of the problem split (--threshold val) and of the --limit draw")
    device: str = _f("auto", "auto, cpu, cuda, ...")
    ignore_images: bool = _f(False, "score records that have images as text only (for a text-only model)")
    trust_remote_code: bool = _f(False, "allow model code from the checkpoint")

    def __post_init__(self):
        bad = []  # required flags and fixed choices: checked by config_from_args (options.field_problems)
        if self.threshold not in ("auto", "val"):
            try:  # a step score is a probability (mu): a threshold outside [0, 1], or nan, decides nothing
                number(self.threshold, "--threshold", low=0, high=1, text=True, what="a number in [0, 1], val or auto")
            except NumberRefused as e:
                bad.append(str(e))
        if self.format == "visualprocessbench" and self.threshold not in ("auto", "val"):
            bad.append("--format visualprocessbench always chooses its threshold on validation; drop --threshold")
        if not 0 < self.val_fraction < 1:
            bad.append(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        if self.limit is not None and self.limit < 1:
            bad.append(f"--limit must be at least 1 (items per subset), got {self.limit}")
        bad += self.scoring_problems()
        if bad:
            raise BetaPRMInputError("bad eval-steps configuration: " + "; ".join(bad))


def add_arguments(parser):
    add_config_args(parser, EvalStepsConfig)


def detect_format(spec) -> str:
    """The benchmark format from the first record's fields."""
    for _, rows in iter_splits(spec, "--data"):
        for line, obj, problem, _ in rows:
            if problem is not None:
                raise BetaPRMInputError(f"{spec}:{line}: {problem.message}; fix: {problem.fix}")
            if isinstance(obj, dict):
                if "response" in obj:
                    return "visualprocessbench"
                if "modified_process" in obj:
                    return "prmbench"
                if "label" in obj and "steps" in obj:
                    return "processbench"
            other = wrong_kind(obj, ("processbench", "prmbench", "visualprocessbench"), spec)
            if other:
                raise BetaPRMInputError(other)
            seen = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
            raise BetaPRMInputError(
                f"--data {spec}: cannot tell its format from the first record ({seen}); pass --format "
                + " | ".join(FORMATS)
            )
    raise BetaPRMInputError(f"--data {spec}: holds no records")


def run(args):
    from ..model import load_prm

    cfg = config_from_args(EvalStepsConfig, args)
    check_eval_outputs(cfg, ("reliability.png", "f1_threshold.png"), [("--log-samples", cfg.log_samples)])
    fmt = detect_format(cfg.data) if cfg.format == "auto" else cfg.format
    threshold = cfg.threshold if cfg.threshold != "auto" else ("val" if fmt == "visualprocessbench" else "0.5")
    # Refused before any scoring: a long benchmark run would otherwise end in this error.
    if fmt == "visualprocessbench" and threshold != "val":
        raise BetaPRMInputError(
            f"--data {cfg.data} is VisualProcessBench, whose protocol chooses the threshold on validation; drop "
            "--threshold"
        )
    if fmt == "prmbench" and threshold == "val":
        raise BetaPRMInputError(
            "--threshold val is not defined for prmbench (its evaluator uses a fixed 0.5); give a number"
        )
    device = process_device(cfg.device)  # under torchrun: this process's GPU
    items = _read(fmt, cfg.data)
    sample = None
    if cfg.limit is not None:
        items, sample = limit_items(fmt, items, cfg.limit, cfg.seed)
    prm, kind = load_prm(cfg.model, device, cfg.trust_remote_code, dtype=cfg.dtype)
    with_images = sum(bool(getattr(it, "images", None)) for it in items)
    if with_images and not prm.is_vision and not cfg.ignore_images:
        raise BetaPRMInputError(
            f"{cfg.data}: {with_images} records have images but {cfg.model} is a text-only model; "
            "use a vision-language BetaPRM, or --ignore-images to score the text alone"
        )
    if cfg.score != "auto":
        mode = cfg.score
    else:
        mode = "mu-sigma" if kind == "beta" and threshold == "val" else "mu"
    traces = [
        (it.question, it.steps, it.images)
        if prm.is_vision and fmt == "visualprocessbench"
        else (getattr(it, "question", None) or it.problem, it.steps)
        for it in items
    ]
    names = [f"{cfg.data}: item {it.id!r}" for it in items]
    # Under torchrun each process scores its share; rank 0 gets every score and reports.
    scores = cfg.score_with_progress(
        prm, traces, names, resume=(cfg.out, evaluation_settings(cfg)) if cfg.out else None
    )
    if scores is None:
        return 0
    step_scores = [s.mu - cfg.lam * s.sigma if mode == "mu-sigma" else s.mu for s in scores]
    score_name = mode if mode == "mu" else f"mu - {cfg.lam}*sigma"
    print(f"{cfg.model} ({kind}; step score {score_name}; {fmt})")
    if sample is not None:
        print(describe_sample(sample))
    if fmt == "visualprocessbench":
        res = _visualprocessbench(cfg, items, step_scores)
    elif fmt == "processbench":
        res = _processbench(cfg, items, step_scores, threshold)
    else:
        res = _prmbench(items, step_scores, threshold)
    res.update(model=cfg.model, model_kind=kind, score=score_name, data=cfg.data, format=fmt)
    if sample is not None:
        res["limit"] = sample
    if cfg.out:
        write_evaluation(cfg, res)
    if cfg.log_samples:
        write_records(
            cfg.log_samples,
            sample_records(fmt, items, scores, step_scores, res, cfg.val_fraction, cfg.seed),
            evaluation_settings(cfg),
            {"model": cfg.model, "data": cfg.data},
        )
    if cfg.plots:
        _plots(cfg, fmt, items, scores, step_scores, res)
    return 0


def _read(fmt, data):
    if fmt == "processbench":
        return read_processbench(data)
    if fmt == "prmbench":
        return read_prmbench(data)

    return read_visualprocessbench(data)


def _processbench(cfg, items, step_scores, threshold) -> dict:
    res = evaluate_processbench(
        items, step_scores, threshold if threshold == "val" else float(threshold), cfg.val_fraction, cfg.seed
    )
    where = (
        f"chosen on {res['n_val_items']} validation items (average F1 there {res['val_average_f1']:.1f})"
        if threshold == "val"
        else "fixed"
    )
    print(f"threshold {res['threshold']:.4f} ({where}); a step is correct when its score is above it")
    print(processbench.table(res))
    cut = sum(m["n_truncated"] for m in res["subsets"].values())
    undecided = sum(m["n_undecided"] for m in res["subsets"].values())
    print(
        f"{res['n_items']} items"
        + (
            f"; --truncate steps cut {cut} of them to the model's positions, and {undecided} of those have no flagged "
            "step among the scored ones (predicted -1 from the scored steps alone): not comparable with the official "
            "protocol, which scores every step"
            if cut
            else ""
        )
    )
    return res


def _prmbench(items, step_scores, threshold) -> dict:
    res = evaluate_prmbench(items, step_scores, float(threshold))
    print(f"threshold {res['threshold']:.4f}; a step is positive (correct) when its score is above it")
    print("PRMScore (percent)")
    print(prmbench.table(res))
    print("\n| category | items | F1 | negative F1 | PRMScore |\n|---|---|---|---|---|")
    for c, m in res["categories"].items():
        name = f"{c} ({CATEGORIES[c].rstrip('.')})" if c in CATEGORIES else f"{c} (originals, not in overall)"
        print(
            f"| {name} | {m['n_items']} | {100 * m['f1']:.1f} | {100 * m['negative_f1']:.1f} | "
            f"{100 * m['prm_score']:.1f} |"
        )
    o = res["overall"]
    print(
        f"| overall | {sum(m['n_items'] for c, m in res['categories'].items() if c != CORRECT)} | "
        f"{100 * o['f1']:.1f} | {100 * o['negative_f1']:.1f} | {100 * o['prm_score']:.1f} |"
    )
    if res["n_unscored_steps"]:
        print(
            f"--truncate steps cut {res['n_truncated_items']} of {res['n_items']} items to the model's positions: "
            f"{res['n_unscored_steps']} steps beyond them were skipped, as the evaluator's loop skips unscored steps"
        )
    note = describe_irregular(res["irregular"])
    if note:
        print(note)
    return res


def _visualprocessbench(cfg, items, step_scores) -> dict:
    res = evaluate_steps(items, step_scores, cfg.val_fraction, cfg.seed)
    width = max([len("overall (micro-F1)")] + [len(k) for k in res["per_source"]])
    print(f"threshold {res['threshold']:.4f} chosen on {res['n_val_items']} validation items")
    print(f"| {'subset':<{width}} | F1    |")
    print(f"|{'-' * (width + 2)}|-------|")
    print(f"| {'overall (micro-F1)':<{width}} | {100 * res['overall_f1']:5.2f} |")
    for k, v in res["per_source"].items():
        print(f"| {k:<{width}} | {100 * v:5.2f} |")
    print(f"{res['n_steps']} annotated test steps (neutral ignored)")
    if res["n_unscored_steps"]:
        print(
            f"{res['n_unscored_steps']} annotated steps lay beyond the model's positions and were left out "
            "(--truncate steps)"
        )
    return res


def _plots(cfg, fmt, items, scores, step_scores, res) -> dict:
    """reliability.png (mu against the observed step labels) and f1_threshold.png (the
    benchmark's own metric against the threshold, the threshold marked on the curve it was
    chosen on); returns the Figures by file name."""
    import numpy as np

    out = Path(cfg.plots)
    out.mkdir(parents=True, exist_ok=True)
    labels = step_labels(fmt, items, [len(s) for s in scores])
    mu = np.concatenate([s.mu[lab != 0] for s, lab in zip(scores, labels)])
    y = np.concatenate([(lab[lab != 0] == 1) for lab in labels]).astype(float)
    which = "steps up to the first error" if fmt == "processbench" else "labelled steps"
    figs = {
        "reliability.png": plots.reliability_diagram(
            {f"mu ({which}: {len(mu)})": (mu, y)},
            out / "reliability.png",
            ylabel="observed fraction correct (step labels)",
        )
    }
    curves, marks, ylabel = threshold_curves(fmt, items, step_scores, labels, res, cfg.val_fraction, cfg.seed)
    figs["f1_threshold.png"] = plots.metric_vs_threshold(curves, out / "f1_threshold.png", ylabel, marks)
    return figs
