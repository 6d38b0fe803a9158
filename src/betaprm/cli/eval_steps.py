"""betaprm eval-steps"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data.kinds import wrong_kind
from ..data.sources import iter_splits
from ..errors import BetaPRMInputError
from ..evaluation import plots, prmbench, processbench
from ..evaluation.prmbench import CATEGORIES, CORRECT, describe_irregular, evaluate_prmbench, read_prmbench
from ..evaluation.processbench import evaluate_processbench, read_processbench
from ..evaluation.steps import evaluate_steps, f1_scores, read_visualprocessbench
from ..numeric import NumberRefused, number
from ..options import opt as _f
from .flags import add_config_args, config_from_args
from .scoring_options import ScoringOptions, check_eval_outputs, write_evaluation

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
parquet, a save_to_disk folder or a hub name (NAME[:SPLIT]). --out writes the results as JSON."""


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
    seed: int = _f(0, "seed of the problem split")
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
    import torch

    from ..model import load_prm

    cfg = config_from_args(EvalStepsConfig, args)
    check_eval_outputs(cfg, ("reliability.png", "f1_threshold.png"))
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
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    items = _read(fmt, cfg.data)
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
    scores = cfg.score_with_progress(prm, traces, names)
    step_scores = [s.mu - cfg.lam * s.sigma if mode == "mu-sigma" else s.mu for s in scores]
    score_name = mode if mode == "mu" else f"mu - {cfg.lam}*sigma"
    print(f"{cfg.model} ({kind}; step score {score_name}; {fmt})")
    if fmt == "visualprocessbench":
        res = _visualprocessbench(cfg, items, step_scores)
    elif fmt == "processbench":
        res = _processbench(cfg, items, step_scores, threshold)
    else:
        res = _prmbench(items, step_scores, threshold)
    res.update(model=cfg.model, model_kind=kind, score=score_name, data=cfg.data, format=fmt)
    if cfg.out:
        write_evaluation(cfg, res)
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


def _plots(cfg, fmt, items, scores, step_scores, res):
    import numpy as np

    out = Path(cfg.plots)
    out.mkdir(parents=True, exist_ok=True)
    # Per step, whether it is correct: with --truncate steps a trace's scores may cover
    # fewer steps than it has, so only the scored steps enter.
    if fmt == "visualprocessbench":
        labels = [np.array(it.labels[: len(s)]) for s, it in zip(scores, items)]
    elif fmt == "processbench":
        # Steps after the first error are unlabelled in ProcessBench: only steps up to it enter.
        labels = [
            np.array(
                (
                    [1] * len(it.steps)
                    if it.label == -1
                    else [1] * it.label + [-1] + [0] * (len(it.steps) - it.label - 1)
                )[: len(s)]
            )
            for s, it in zip(scores, items)
        ]
    else:
        labels = [np.array([-1 if j in it.error_steps else 1 for j in range(len(s))]) for s, it in zip(scores, items)]
    mu = np.concatenate([s.mu[lab != 0] for s, lab in zip(scores, labels)])
    y = np.concatenate([(lab[lab != 0] == 1) for lab in labels]).astype(float)
    plots.reliability_diagram({"mu": (mu, y)}, out / "reliability.png")
    sc = np.concatenate([np.asarray(s)[lab != 0] for s, lab in zip(step_scores, labels)])
    ts = np.quantile(sc, np.linspace(0, 1, 41))

    # VisualProcessBench's rule: correct when score >= threshold; the others: > threshold.
    def pred(t):
        return sc >= t if fmt == "visualprocessbench" else sc > t

    plots.best_of_n_curves(
        {"step micro-F1 (all steps)": (list(ts), [f1_scores(pred(t), y.astype(bool))[0] for t in ts])},
        out / "f1_threshold.png",
        points={"threshold used": (res["threshold"], f1_scores(pred(res["threshold"]), y.astype(bool))[0])},
        xlabel="threshold on the step score",
    )
