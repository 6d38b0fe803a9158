"""betaprm eval-calibration"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data.records import check_kind, read_records
from ..distributed import process_device
from ..errors import BetaPRMInputError
from ..evaluation import plots
from ..evaluation.calibration import evaluate_counts, flat_counts, table
from ..options import opt as _f
from .flags import add_config_args, config_from_args
from .scoring_options import ScoringOptions, check_eval_outputs, evaluation_settings, write_evaluation

HELP = "does the PRM's belief predict held-out Monte Carlo counts? (NLL, ECE, Brier, interval coverage, plots)"
DESCRIPTION = """Calibration on held-out count records (K of N per step, the training format).

Per labelled step: the NLL of the counts under the model's Beta-Binomial (a BetaPRM), under
the binomial at mu (a point estimate) and under one constant rate (the pooled K/N of this
file); ECE and Brier of mu against K/N; coverage and width of the 50% and 90% predictive
intervals of K; Spearman of sigma with |mu - K/N|. --plots writes a reliability diagram
and sigma against error. --data takes JSONL, .json, parquet, a save_to_disk folder or a
hub name (NAME[:SPLIT]). The records must not have been trained on."""


@dataclass
class EvalCalibrationConfig(ScoringOptions):
    model: str = _f(
        "",
        "a BetaPRM or standard PRM: a folder, or a hub name OWNER/NAME[@REVISION]",
        required=True,
    )
    data: str = _f(
        "", "held-out count records: JSONL, .json, parquet, a save_to_disk folder or a hub name", required=True
    )
    out: str | None = _f(None, "write the metrics as JSON here")
    plots: str | None = _f(None, "write reliability.png and sigma_error.png into this folder")
    bins: int = _f(10, "equal-width bins of mu for the ECE and the reliability diagram")
    device: str = _f("auto", "auto, cpu, cuda, ...")
    trust_remote_code: bool = _f(False, "allow model code from the checkpoint")

    def __post_init__(self):
        bad = []  # required flags: checked by config_from_args (options.field_problems)
        if self.bins < 1:
            bad.append(f"--bins must be >= 1, got {self.bins}")
        bad += self.scoring_problems()
        if bad:
            raise BetaPRMInputError("bad eval-calibration configuration: " + "; ".join(bad))


def add_arguments(parser):
    add_config_args(parser, EvalCalibrationConfig)


def run(args):
    from ..model import load_prm

    cfg = config_from_args(EvalCalibrationConfig, args)
    check_eval_outputs(cfg, ("reliability.png", "sigma_error.png"))
    device = process_device(cfg.device)  # under torchrun: this process's GPU
    check_kind(cfg.data, "counts", "--data")  # a file of another kind: one line, before the model loads
    prm, kind = load_prm(cfg.model, device, cfg.trust_remote_code, dtype=cfg.dtype)
    loaded = read_records(cfg.data, kind="counts", marker=prm.config.marker, flag="--data")
    records = loaded.records
    if not records:
        raise BetaPRMInputError(f"--data {cfg.data}: no count records")
    if any(r.images for r in records) and not prm.is_vision:
        raise BetaPRMInputError(f"--data {cfg.data}: records have images but {cfg.model} is a text-only model")
    traces = [(r.question, r.steps, r.images) if prm.is_vision else (r.question, r.steps) for r in records]
    names = [f"{cfg.data}: record {r.id!r}" for r in records]
    # Under torchrun each process scores its share; rank 0 gets every score and reports.
    scores = cfg.score_with_progress(
        prm, traces, names, resume=(cfg.out, evaluation_settings(cfg)) if cfg.out else None
    )
    if scores is None:
        return 0
    mu, kappa, k, n = flat_counts(records, scores)
    res = evaluate_counts(mu, kappa, k, n, beta=kind == "beta", bins=cfg.bins)
    res.update(model=cfg.model, model_kind=kind, data=cfg.data, n_records=len(records))
    name = "BetaPRM" if kind == "beta" else "standard PRM" if kind == "standard" else kind
    print(f"{cfg.model} ({kind}) on {len(records)} records, {res['n_steps']} labelled steps")
    print(table({name: res}))
    if all(r.mc_total == [1] * len(r.steps) for r in records):
        print("every step has N = 1 (hard labels): the NLLs compare Bernoulli likelihoods; kappa is not tested")
    if cfg.out:
        write_evaluation(cfg, res)
    if cfg.plots:
        out = Path(cfg.plots)
        out.mkdir(parents=True, exist_ok=True)
        plots.reliability_diagram(
            {name: (mu, k / n)}, out / "reliability.png", bins=cfg.bins, ylabel="observed success fraction K/N"
        )
        if kind == "beta":
            plots.sigma_vs_error({name: res["sigma_error_bins"]}, out / "sigma_error.png")
    return 0
