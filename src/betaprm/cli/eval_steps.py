"""betaprm eval-steps"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..options import opt as _f
from ._scoring import ScoringOptions

HELP = "step-level error detection on VisualProcessBench-format data (F1, threshold tuned on a validation part)"
DESCRIPTION = """Step-level error detection, the protocol of the paper's appendix A.4.

--data: VisualProcessBench JSONL (question, response.steps, response.process_correctness with
1 correct / 0 neutral / -1 incorrect, data_source, optional image). Neutral steps are ignored.
Step score: mu - 0.5*sigma for a BetaPRM, mu for a standard PRM or a plain causal LM scored
zero-shot (the Yes/No logits at each marker; the "Base (w/o training)" row). One threshold is
swept on --val-fraction of the problems (split by problem) and applied to the rest. Prints the
overall micro-F1 and the per-source macro-F1; --out writes them as JSON."""


@dataclass
class EvalStepsConfig(ScoringOptions):
    model: str = _f("", "a BetaPRM directory, or a plain causal-LM directory (scored zero-shot)")
    data: str = _f("", "VisualProcessBench-format JSONL")
    out: str | None = _f(None, "write overall_f1, per_source, threshold and step counts here (JSON)")
    plots: str | None = _f(
        None,
        "write a reliability diagram (step mu against the step's label) and F1 against the threshold (PNG) into this "
        "folder",
    )
    score: str = _f("auto", "step score: auto (mu - lam*sigma for a beta-binomial model, else mu), mu, or mu-sigma")
    lam: float = _f(0.5, "lambda of mu - lambda*sigma")
    val_fraction: float = _f(0.2, "fraction of problems used to choose the threshold")
    seed: int = _f(0, "seed of the problem split")
    device: str = _f("auto", "auto, cpu, cuda, ...")
    ignore_images: bool = _f(False, "score records that have images as text only (for a text-only model)")
    trust_remote_code: bool = _f(False, "allow model code from the checkpoint")

    def __post_init__(self):
        from ..errors import BetaPRMInputError

        bad = [f"--{k} is required" for k in ("model", "data") if not getattr(self, k)]
        if self.score not in ("auto", "mu", "mu-sigma"):
            bad.append(f"--score must be auto, mu or mu-sigma, got {self.score!r}")
        if not 0 < self.val_fraction < 1:
            bad.append(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        bad += self.scoring_problems()
        if bad:
            raise BetaPRMInputError("bad eval-steps configuration: " + "; ".join(bad))


def add_arguments(parser):
    from ._config import add_config_args

    add_config_args(parser, EvalStepsConfig)


# Options that do not change the results (paths, batching, device): left out of the
# settings recorded in --out. The model and the data enter as fingerprints of their contents.
NOT_RESULTS = {"model", "data", "out", "plots", "device", "batch_size", "max_batch_tokens", "trust_remote_code"}


def result_settings(cfg) -> dict:
    from ..provenance import fingerprint, model_fingerprint, settings_of

    return {"model": model_fingerprint(cfg.model), "data": fingerprint(cfg.data), **settings_of(cfg, NOT_RESULTS)}


def run(args):
    import torch

    from ..errors import BetaPRMInputError
    from ..evaluation.steps import evaluate_steps, read_visualprocessbench
    from ..model import load_prm
    from ._config import config_from_args

    cfg = config_from_args(EvalStepsConfig, args)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    items = read_visualprocessbench(cfg.data)
    prm, kind = load_prm(cfg.model, device, cfg.trust_remote_code)
    with_images = sum(bool(it.images) for it in items)
    if with_images and not prm.is_vision and not cfg.ignore_images:
        raise BetaPRMInputError(
            f"{cfg.data}: {with_images} records have images but {cfg.model} is a text-only model; "
            "use a vision-language BetaPRM, or --ignore-images to score the text alone"
        )
    mode = cfg.score if cfg.score != "auto" else ("mu-sigma" if kind == "beta" else "mu")
    traces = [(it.question, it.steps, it.images) if prm.is_vision else (it.question, it.steps) for it in items]
    names = [f"{cfg.data}: item {it.id!r}" for it in items]
    scores = cfg.score_with_progress(prm, traces, names)
    step_scores = [s.mu - cfg.lam * s.sigma if mode == "mu-sigma" else s.mu for s in scores]
    res = evaluate_steps(items, step_scores, cfg.val_fraction, cfg.seed)
    res.update(
        model=cfg.model, model_kind=kind, score=mode if mode == "mu" else f"mu - {cfg.lam}*sigma", data=cfg.data
    )
    width = max([len("overall (micro-F1)")] + [len(k) for k in res["per_source"]])
    print(
        f"{cfg.model} ({kind}; step score {res['score']}); threshold {res['threshold']:.4f} chosen on "
        f"{res['n_val_items']} validation items"
    )
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
    if cfg.out:
        from ..provenance import write_result

        write_result(cfg.out, res, result_settings(cfg), {"model": cfg.model, "data": cfg.data})
    if cfg.plots:
        _plots(cfg, items, scores, step_scores, res)
    return 0


def _plots(cfg, items, scores, step_scores, res):
    import numpy as np

    from ..evaluation import plots
    from ..evaluation.steps import f1_scores

    out = Path(cfg.plots)
    out.mkdir(parents=True, exist_ok=True)
    # Labels of the scored steps only: with --truncate steps a trace's scores may cover
    # fewer steps than it has.
    labels = [np.array(it.labels[: len(s)]) for s, it in zip(scores, items)]
    mu = np.concatenate([s.mu[lab != 0] for s, lab in zip(scores, labels)])
    y = np.concatenate([(lab[lab != 0] == 1) for lab in labels]).astype(float)
    plots.reliability_diagram({"mu": (mu, y)}, out / "reliability.png")
    sc = np.concatenate([np.asarray(s)[lab != 0] for s, lab in zip(step_scores, labels)])
    ts = np.quantile(sc, np.linspace(0, 1, 41))
    plots.best_of_n_curves(
        {"micro-F1 (all steps)": (list(ts), [f1_scores(sc >= t, y.astype(bool))[0] for t in ts])},
        out / "f1_threshold.png",
        points={"chosen threshold": (res["threshold"], res["overall_f1"])},
        xlabel="threshold on the step score",
    )
