"""betaprm aca"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..aca import (
    ACAConfig,
    ACASettings,
    best_of_n_curve,
    best_of_n_points,
    cut_problems,
    final_selector_problems,
    run_aca,
    summarize,
)
from ..data.records import read_objects
from ..errors import BetaPRMInputError
from ..evaluation import frontier, plots
from ..numeric import number, shown
from ..options import opt as _f
from ..provenance import meta_path
from ..synth.experiment import tune_rb_on_world
from .flags import add_config_args, config_from_args
from .problems import NOT_RESULTS, GenerationOptions, ProblemOptions, run_with_output, setup, summary_line
from .scoring_options import BatchOptions

# --variant: the paper's ablations, each what it runs.
VARIANTS = {
    "aca": "ACA with the learned uncertainty (BetaPRM), final choice by S_RB",
    "no-early-stop": "always spend the budget, still repairing uncertain prefixes",
    "reward-only": "sigma = 0 (for a standard PRM): the stopping test is a score margin",
    "proxy": "sigma = sqrt(mu(1-mu)) (for a standard PRM)",
    "best-of-n": "all --budget candidates at once (the baseline)",
    "vote": "answer-level: stop when the reliability-weighted vote's leader stays ahead through the budget with "
    "probability --stop-threshold (weights and their spread from mu and kappa), fresh samples, later candidates "
    "stopped while written once reliably bad, final choice by the vote",
    "vote-sigma0": "vote with sigma = 0: weights mean(mu), no spread (what kappa adds)",
    "vote-runner-up": "vote, later batches continue the runner-up answer's best candidate from its uncertain step",
    "adaptive-consistency": "Adaptive-Consistency: unweighted Beta rule on the two leading answers, majority vote",
    "esc": "Early-Stopping Self-Consistency: stop when a window (--m samples, also the first batch) agrees",
    "deepconf": "DeepConf-style with the PRM's mu (no kappa): votes weighted by mean mu, the top --keep-top kept, "
    "later candidates stopped below the first batch's level, stop at vote share --stop-threshold",
}
# The answer-level variants' mechanisms (ACAConfig fields); the others are the paper's.
ANSWER_LEVEL = {
    "vote": dict(stop_rule="vote", allocate="fresh", prune=True, final_vote=True),
    "vote-sigma0": dict(stop_rule="vote", allocate="fresh", prune=True, final_vote=True, uncertainty="none"),
    "vote-runner-up": dict(stop_rule="vote", allocate="runner-up", prune=True, final_vote=True),
    "adaptive-consistency": dict(stop_rule="ac", allocate="fresh", weighted=False, final_vote=True),
    "esc": dict(stop_rule="window", allocate="fresh", weighted=False, final_vote=True),
    "deepconf": dict(
        stop_rule="consensus", allocate="fresh", prune=True, final_vote=True, uncertainty="none", keep_top=0.9
    ),
}

HELP = "Adaptive Computation Allocation: Best-of-N that stops early (on a candidate or on the vote) and repairs"
DESCRIPTION = (
    """Run ACA (paper section 5) with a trained PRM as the scorer.

Problems: the chain-arithmetic world's test split by default (the split `betaprm demo
--seed S` uses; answers checked exactly), or --problems FILE.jsonl with id, question and
answer per line (answers checked with math-verify; a check that fails is counted apart,
never as wrong; a line without answer is solved all the same, its record has the choice and
no verdict). Generation: --backend synth | transformers | openai | vllm.

Each problem appends one record to --out (rounds, cut points, stop reason, pool size,
generated tokens, the candidates with their scores); rerunning the same command skips the
problems already there. OUT.meta.json records the settings that made the records (a rerun
with other settings stops and names them); OUT.lock keeps a second process out of --out.
--variant picks the paper's ablations:
"""
    + "".join(f"  {name:<15}{what}\n" for name, what in VARIANTS.items())
    + """S_RB needs its sigma threshold: --final-tau, or, on the chain-arithmetic world, tuned on
its validation split when not given (--final rb); on a problems file without --final-tau
the final choice falls back to S_lin and says so."""
)


@dataclass
class ACACommandConfig(ProblemOptions, ACASettings, BatchOptions, GenerationOptions):
    """``betaprm aca``'s flags: ACA's settings (``ACASettings``; ``--variant`` sets which of
    its mechanisms run), the problems, the PRM's batching and the generator."""

    final_lam: float | None = _f(None, "lambda of the final selector (default: tuned with tau, else 0.5)")
    final_tau: float | None = _f(None, "S_RB's sigma threshold (default: tuned on the world's validation split)")
    variant: str = _f("aca", "which of ACA's mechanisms run (see above)", choices=VARIANTS)
    write_candidates: bool = _f(True, "keep every candidate's steps and scores in the records")
    plots: str | None = _f(None, "write aca_tokens.png (accuracy against generated tokens) into this folder")
    baseline: str | None = _f(
        None, "with --plots: records of a --variant best-of-n run, drawn as the Best-of-n curve (n = 1..budget)"
    )
    frontier: str | None = _f(
        None,
        "with --plots: records of other betaprm aca runs on the same problems, comma-separated (each with its "
        "OUT.meta.json), e.g. at other values of a variant's knob (--c-stop for aca and proxy, --stop-margin for "
        "reward-only, --budget for no-early-stop) or of another --variant: each variant's runs, this one "
        "included, drawn as one frontier of accuracy against tokens with 95%% bands (aca_frontier.png), and this "
        "run compared with each other variant's frontier (and --baseline's Best-of-n) at its own tokens",
    )

    def __post_init__(self):
        bad = self.problem_checks()
        # S_RB without --final-tau is tuned (or falls back to S_lin) when the run starts.
        bad += final_selector_problems(self.final, self.final_tau, tau_required=False)
        bad += cut_problems(self.p_bad)
        if bad:
            raise BetaPRMInputError("bad aca configuration:\n  " + "\n  ".join(bad))

    def aca_config(self, final_lam: float, final_tau: float | None) -> ACAConfig:
        """The ``ACAConfig`` of this run's variant, with the final selector's lambda and tau."""
        settings = {f.name: getattr(self, f.name) for f in fields(ACASettings)}
        settings.update(final_lam=final_lam, final_tau=final_tau)
        if self.variant == "best-of-n":
            del settings["n0"]
            return ACAConfig.best_of_n(**settings)
        if self.variant in ANSWER_LEVEL:
            mechanisms = ANSWER_LEVEL[self.variant]
            if self.variant == "esc":  # the window is every batch, the first included
                settings["n0"] = settings["m"]
            if "keep_top" in mechanisms and self.keep_top != 1.0:  # given: the user's filter
                mechanisms = {k: v for k, v in mechanisms.items() if k != "keep_top"}
            return ACAConfig(**{**settings, **mechanisms, "final_vote": True})
        return ACAConfig(
            **settings,
            early_stop=self.variant != "no-early-stop",
            uncertainty={"reward-only": "none", "proxy": "proxy"}.get(self.variant, "learned"),
        )


def add_arguments(parser):
    add_config_args(parser, ACACommandConfig)


# The knob each variant's frontier sweeps (an ACASettings field).
KNOBS = {
    "aca": "c_stop",
    "proxy": "c_stop",
    "reward-only": "stop_margin",
    "no-early-stop": "budget",
    "best-of-n": "budget",
    "vote": "stop_threshold",
    "vote-sigma0": "stop_threshold",
    "vote-runner-up": "stop_threshold",
    "adaptive-consistency": "stop_threshold",
    "esc": "m",
    "deepconf": "stop_threshold",
}


def run(args):
    return run_with_output(
        config_from_args(ACACommandConfig, args), _run, NOT_RESULTS | {"plots", "baseline", "frontier"}
    )


def _run(cfg):
    r = setup(cfg)
    say = print if r.procs.main else (lambda *a: None)  # under torchrun: said once, by rank 0
    final_lam, final_tau = cfg.final_lam, cfg.final_tau
    if cfg.rules == "authors":  # their final choice is part of their rule set: no S_RB to tune
        say(f"--rules authors: final choice by the top S_lin (lambda {cfg.lam}), as their orchestrator's")
        cfg.final, final_lam, final_tau = "lin", cfg.lam, None
    elif cfg.final == "rb" and final_tau is None and r.world is not None:
        n_val = 300
        # Every process tunes the same: no process waits for another's verdict.
        res = tune_rb_on_world(r.world, r.scorer, cfg.budget, cfg.seed, final_lam, n_val=n_val)
        say(
            f"S_RB tuned on {n_val} validation problems: lambda {res.lam}, tau {res.tau:.4f} (q {res.q}), "
            f"validation accuracy {res.val_accuracy:.3f}"
        )
        final_lam, final_tau = res.lam, res.tau
    elif cfg.final == "rb" and final_tau is None:
        say("betaprm aca: no --final-tau for S_RB on a problems file: the final choice uses S_lin (lambda 0.5)")
        cfg.final = "lin"
    aca_cfg = cfg.aca_config(final_lam if final_lam is not None else 0.5, final_tau)
    # --frontier's runs are read and checked against these problems before any work.
    judged = [t.id for t in r.tasks if t.answer is not None]  # the problems an accuracy counts
    others = _frontier_runs(cfg, judged) if cfg.plots and cfg.frontier else []
    records = run_aca(
        r.tasks,
        r.generator,
        r.scorer,
        aca_cfg,
        r.answer_of,
        r.is_correct,
        out=cfg.out,
        write_candidates=cfg.write_candidates,
        procs=r.procs,
    )
    r.close()  # stops math-verify's worker process (on an error above, the exit does)
    if not r.procs.main:  # under torchrun: rank 0 has every record, and reports
        return 0
    s = summarize(records)
    extra = f", mean pool {s['mean_pool_size']:.1f}, stops {s['stop_reasons']}"
    print(summary_line(cfg.variant, s, cfg.out, extra))
    if cfg.plots:
        _plot(cfg, records, s, final_lam, final_tau, others)
    return 0


def _plot(cfg, records, s, final_lam, final_tau, others=()):
    """This run as a point on accuracy against tokens, over the Best-of-n curve of a
    best-of-n run's records (its first n candidates, the same final selector)."""
    curve = {}
    if cfg.baseline:
        base = [
            r
            for _, r in read_objects(cfg.baseline, ("id",), "an ACA record of a --variant best-of-n run", "--baseline")
        ]
        method = cfg.final if final_tau is not None or cfg.final != "rb" else "lin"
        curve["Best-of-n (baseline records)"] = best_of_n_curve(
            base, method, final_lam if final_lam is not None else 0.5, final_tau
        )
    Path(cfg.plots).mkdir(parents=True, exist_ok=True)
    plots.best_of_n_curves(
        curve,
        Path(cfg.plots) / "aca_tokens.png",
        points={cfg.variant: (s["tokens"], s["acc"])},
        xlabel="generated tokens",
    )
    if cfg.frontier:
        _plot_frontiers(cfg, records, others, base if cfg.baseline else None, final_lam, final_tau)


def _label(settings: dict) -> str:
    """A run's name on a frontier: its variant, and the rule set when it is not ours."""
    rules = settings.get("rules", "betaprm")
    return settings["variant"] if rules == "betaprm" else f"{settings['variant']} ({rules}' rules)"


def _judged_ids(records) -> list:
    """The ids of the problems with a reference answer, in ``records``' order: those an
    accuracy counts (``aca.summarize``'s), so a frontier and the summary agree."""
    return [r["id"] for r in records if r.get("answer") is not None]


def _run_point(variant: str, settings: dict, records: list[tuple[str, dict]], ids: list, where: str) -> frontier.Point:
    """One run's records (``(path:line, record)``) as a frontier point at its variant's knob,
    over the problems ``ids`` (those with a reference answer, as ``summarize`` counts them):
    its hits in their order and the tokens it spent on them. Every record must be one
    problem once, with its tokens; the runs must be on the same problems."""
    knob = KNOBS[variant]
    x = number(settings.get(knob), f"{where}: the settings' {knob!r} ({variant}'s knob)", low=0)
    by_id = {}
    for line, r in records:
        if r["id"] in by_id:
            raise BetaPRMInputError(
                f"{line}: problem {shown(r['id'])} appears twice; a frontier point counts each problem once (its "
                "tokens would be counted twice); fix: remove the repeated line"
            )
        number(r.get("tokens"), f"{line}: field 'tokens'", integer=True, low=0)
        if not (r.get("correct") is None or isinstance(r["correct"], bool)):
            raise BetaPRMInputError(
                f"{line}: field 'correct' must be true, false or null, got {shown(r['correct'])}; give records "
                "written by betaprm aca"
            )
        by_id[r["id"]] = r
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise BetaPRMInputError(
            f"{where}: its records are not on this run's problems ({len(missing)} of them missing, e.g. "
            f"{shown(missing[0])}); a frontier compares runs on the same problems"
        )
    return frontier.Point(
        float(x),
        float(sum(by_id[i]["tokens"] for i in ids)),
        np.array([float(bool(by_id[i]["correct"])) for i in ids]),
    )


def _frontier_runs(cfg, ids: list) -> list[tuple[str, frontier.Point]]:
    """--frontier's runs as (variant, point at its knob), each checked to be on ``ids``."""
    runs = []
    for path in [p.strip() for p in cfg.frontier.split(",") if p.strip()]:
        meta = meta_path(path)
        try:
            settings = json.loads(meta.read_text(encoding="utf-8"))["settings"]
            variant = settings["variant"]
            KNOBS[variant]
            label = _label(settings)
        except (OSError, ValueError, KeyError, TypeError):
            raise BetaPRMInputError(
                f"--frontier {path}: {meta} is missing or not a betaprm aca settings file; give the records of "
                "betaprm aca runs, each with the OUT.meta.json it wrote"
            ) from None
        recs = list(read_objects(path, ("id",), "an ACA record", "--frontier"))
        runs.append((label, _run_point(variant, settings, recs, ids, f"--frontier {path}")))
    return runs


def _plot_frontiers(cfg, records, others, baseline, final_lam, final_tau):
    """--frontier: every variant's runs as one frontier (aca_frontier.png) and this run against
    the other variants' frontiers at its tokens, printed."""
    ids = _judged_ids(records)
    this = _run_point(
        cfg.variant, vars(cfg), [(f"{cfg.out}:{i}", r) for i, r in enumerate(records, 1)], ids, "this run"
    )
    mine = _label(vars(cfg))
    sweeps = {mine: [this]}
    for label, point in others:
        sweeps.setdefault(label, []).append(point)
    if baseline is not None:
        method = cfg.final if final_tau is not None or cfg.final != "rb" else "lin"
        by_id = {r["id"]: r for r in baseline}
        if any(i not in by_id for i in ids):
            raise BetaPRMInputError("--baseline: its records are not on this run's problems; give a run on the same")
        sweeps["Best-of-n (baseline)"] = best_of_n_points(
            [by_id[i] for i in ids], method, final_lam if final_lam is not None else 0.5, final_tau
        )
    curves = {label: frontier.curve(pts, seed=cfg.seed) for label, pts in sweeps.items()}
    plots.frontier_curves(curves, Path(cfg.plots) / "aca_frontier.png", xlabel="generated tokens")
    for label in sweeps:
        print(
            f"frontier {label} ({KNOBS.get(label.split(' (')[0], 'n')}): "
            + "; ".join(f"{r['knob']:g}: {r['tokens']:.0f} tokens, {r['acc']:.3f}" for r in curves[label])
        )
    for label, pts in sweeps.items():
        if label == mine:
            continue
        d = frontier.dominance(sweeps[mine], pts)
        m = frontier.matched(this, pts, seed=cfg.seed)
        higher = {"a": mine, "b": label}.get(d["verdict"], d["verdict"])
        at = (
            "outside its tokens"
            if m is None
            else f"{m['diff']:+.3f} [{m['ci'][0]:+.3f}, {m['ci'][1]:+.3f}] at {m['tokens']:.0f} tokens"
        )
        print(f"{mine} vs {label}: higher frontier {higher}; this run minus {label}: {at}")
    print(f"wrote {Path(cfg.plots) / 'aca_frontier.png'}")
