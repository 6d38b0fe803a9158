"""betaprm aca"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ..aca import ACAConfig, ACASettings, best_of_n_curve, final_selector_problems, run_aca, summarize
from ..data.records import read_objects
from ..errors import BetaPRMInputError
from ..evaluation import plots
from ..options import opt as _f
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
}

HELP = "Adaptive Computation Allocation: Best-of-N that stops early and repairs uncertain prefixes"
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

    def __post_init__(self):
        bad = self.problem_checks()
        # S_RB without --final-tau is tuned (or falls back to S_lin) when the run starts.
        bad += final_selector_problems(self.final, self.final_tau, tau_required=False)
        if bad:
            raise BetaPRMInputError("bad aca configuration:\n  " + "\n  ".join(bad))

    def aca_config(self, final_lam: float, final_tau: float | None) -> ACAConfig:
        """The ``ACAConfig`` of this run's variant, with the final selector's lambda and tau."""
        settings = {f.name: getattr(self, f.name) for f in fields(ACASettings)}
        settings.update(final_lam=final_lam, final_tau=final_tau)
        if self.variant == "best-of-n":
            del settings["n0"]
            return ACAConfig.best_of_n(**settings)
        return ACAConfig(
            **settings,
            early_stop=self.variant != "no-early-stop",
            uncertainty={"reward-only": "none", "proxy": "proxy"}.get(self.variant, "learned"),
        )


def add_arguments(parser):
    add_config_args(parser, ACACommandConfig)


def run(args):
    return run_with_output(config_from_args(ACACommandConfig, args), _run, NOT_RESULTS | {"plots", "baseline"})


def _run(cfg):
    r = setup(cfg)
    final_lam, final_tau = cfg.final_lam, cfg.final_tau
    if cfg.final == "rb" and final_tau is None and r.world is not None:
        n_val = 300
        res = tune_rb_on_world(r.world, r.scorer, cfg.budget, cfg.seed, final_lam, n_val=n_val)
        print(
            f"S_RB tuned on {n_val} validation problems: lambda {res.lam}, tau {res.tau:.4f} (q {res.q}), "
            f"validation accuracy {res.val_accuracy:.3f}"
        )
        final_lam, final_tau = res.lam, res.tau
    elif cfg.final == "rb" and final_tau is None:
        print("betaprm aca: no --final-tau for S_RB on a problems file: the final choice uses S_lin (lambda 0.5)")
        cfg.final = "lin"
    aca_cfg = cfg.aca_config(final_lam if final_lam is not None else 0.5, final_tau)
    records = run_aca(
        r.tasks,
        r.generator,
        r.scorer,
        aca_cfg,
        r.answer_of,
        r.is_correct,
        out=cfg.out,
        write_candidates=cfg.write_candidates,
    )
    r.close()  # stops math-verify's worker process (on an error above, the exit does)
    s = summarize(records)
    extra = f", mean pool {s['mean_pool_size']:.1f}, stops {s['stop_reasons']}"
    print(summary_line(cfg.variant, s, cfg.out, extra))
    if cfg.plots:
        _plot(cfg, records, s, final_lam, final_tau)
    return 0


def _plot(cfg, records, s, final_lam, final_tau):
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
