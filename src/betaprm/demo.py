"""``betaprm demo``: the paper's Best-of-N and calibration tables in the chain-arithmetic
world, where the truth is known (docs/design.md section 6), on CPU.

The pipeline uses the same ``BetaPRM``, trainer and scorer as real backbones:

1. problems split into train / validation / test; training traces from the policy (with
   verifiable errors enriched by ``error_boost``), each step labelled with K of ``mc_n``
   real continuations of the (unboosted) policy (``synth.experiment``);
2. a word-level tokenizer; a small Llama pretrained as a language model on
   error-free traces, saved, and the start of both PRMs (``synth.training``);
3. a standard PRM (``soft-ce``) and a BetaPRM (``beta-binomial``) fine-tuned with the
   same budget and seed through ``betaprm.train``;
4. Best-of-``n_candidates`` pools for validation and test problems, scored by both; the
   selectors' hyperparameters tuned on validation only (``betaprm.selectors``);
5. diagnostics against the truth (``synth.diagnostics``), tables and plots (``synth.report``),
   ``results.json`` (with config, seed and version) and plots.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from .errors import BetaPRMInputError
from .evaluation.calibration import evaluate_counts, flat_counts, step_nll
from .evaluation.metrics import bootstrap_ci, paired_bootstrap
from .provenance import version
from .scoring import score_traces
from .selectors import tune_selectors
from .synth import World, WorldConfig, diagnostics
from .synth.experiment import bayes_scores, bon_hits, demo_data
from .synth.frontiers import aca_table, bon_frontiers, frontier_results, per_problem_json, pool_token_counts
from .synth.recipe import BASE, PRESETS, DemoConfig
from .synth.report import demo_plots, format_results
from .synth.training import build_backbone, load_backbone, load_prms, train_prms

__all__ = ["BASE", "PRESETS", "DemoConfig", "format_results", "run_demo"]

logger = logging.getLogger(__name__)
BETAPRM_SELECTORS = ("betaprm_mean", "betaprm_rb", "betaprm_lin", "betaprm_vote", "betaprm_reliability_vote")


# Settings that leave the trained PRMs as they are: a --reuse-prms run may change them.
NOT_TRAINING = ("out", "threads", "device", "parallel_prms", "aca", "aca_frontier", "reuse_prms", "backbone")


def check_reusable(cfg: DemoConfig) -> str:
    """With ``--reuse-prms``: the version that trained the PRMs in ``cfg.out``, after checking
    that a finished run left them there with the settings of ``cfg``; a clear error otherwise.
    The settings compared are those the runs take effect with (the same flags on a GPU host
    are the --long recipe), and the world's contents, not its file's path."""
    out = Path(cfg.out)
    summary = out / "results.json"
    needed = [summary, out / "backbone" / "config.json"]
    needed += [out / d / f for d in ("standard_prm", "betaprm") for f in ("config.json", "train_summary.json")]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise BetaPRMInputError(
            f"--reuse-prms: no finished demo run in {out} ({', '.join(missing)} missing); run without --reuse-prms "
            "to train the PRMs there first"
        )
    skip = set(NOT_TRAINING) | {"world_config"}
    try:
        before = json.loads(summary.read_text())
        if before["config"].get("backbone"):  # its sizes were read from that backbone, the one in OUT/backbone
            skip |= {"hidden_size", "num_layers", "intermediate_size"}
        have = {k: v for k, v in before["effective_config"].items() if k not in skip}
        have["world"] = before["world"]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise BetaPRMInputError(f"--reuse-prms: {summary} is not a demo run's results.json ({e})") from e
    want = {k: v for k, v in asdict(cfg.effective()).items() if k not in skip}
    want["world"] = (WorldConfig.from_json(cfg.world_config) if cfg.world_config else WorldConfig()).to_dict()
    want = json.loads(json.dumps(want))
    # A setting newer than that run is not in its results: the run ran as that setting's default
    # does (a new setting keeps the old behaviour by default), so it is compared with the default.
    default = DemoConfig(quick=cfg.quick, long=cfg.long, device=cfg.device).effective()
    have = {**json.loads(json.dumps({k: v for k, v in asdict(default).items() if k in want})), **have}
    diff = sorted(k for k in want if want[k] != have[k])
    if diff:
        raise BetaPRMInputError(
            f"--reuse-prms: the PRMs in {out} were trained with other settings ("
            + ", ".join(f"{k}: {have[k]!r} there, {want[k]!r} here" for k in diff)
            + "); give the same settings, or run without --reuse-prms (in another --out to keep these)"
        )
    return str(before.get("prms_trained_by") or before.get("version"))


def run_demo(cfg: DemoConfig, log=None) -> dict:
    """Run the demo (module docstring) and return its results (also in ``OUT/results.json``).
    Progress and the tables go to ``log`` (a callable taking one line; default: this
    module's logger at INFO). With ``parallel_prms`` (the default) the PRMs train in spawned
    worker processes, so a script that calls this must do so under ``if __name__ == "__main__":``."""
    import torch
    from transformers.utils import logging as hf_logging

    log = log or logger.info
    t_start = time.perf_counter()
    eff = cfg.effective()
    device = cfg.torch_device()
    trained_by = check_reusable(cfg) if cfg.reuse_prms else None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    world_cfg = WorldConfig.from_json(cfg.world_config) if cfg.world_config else WorldConfig()
    world = World(world_cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    log(f"betaprm {version()} demo ({cfg.recipe()} run, seed {cfg.seed}, {device}) -> {out}")

    # 1. data
    t0 = time.perf_counter()
    data = demo_data(world, eff, cfg.seed)
    val_pools, test_pools = data.val_pools, data.test_pools
    with open(out / "train_counts.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in data.train_records)
    with open(out / "held_out_counts.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in data.held_records)
    n_steps = sum(len(r["steps"]) for r in data.train_records)
    log(
        f"data: {len(data.train_records)} training traces ({n_steps} labelled steps, K of {world_cfg.mc_n}), "
        f"{len(val_pools)} validation and {len(test_pools)} test pools of {eff.n_candidates} "
        f"({time.perf_counter() - t0:.0f}s)"
    )

    # 2. tokenizer and pretrained backbone, 3. the two PRMs, same budget and seed, and 4. their
    # scores of the validation and test pools
    pooled = val_pools + test_pools
    traces = [(p.problem.question, t.steps) for p in pooled for t in p.traces]
    if cfg.reuse_prms:
        _, tokenizer, eff = load_backbone(out / "backbone", eff)
        log(f"backbone: reusing {out / 'backbone'} (Llama {eff.hidden_size}x{eff.num_layers})")
        models, histories, flat = load_prms(out, device, log, traces)
    else:
        # The models are about to be replaced: an earlier run's results no longer describe them
        # (a later --reuse-prms must not take them for that run's).
        (out / "results.json").unlink(missing_ok=True)
        _, tokenizer, eff = build_backbone(cfg, eff, world, data.train_traces, out, log, device)
        models, histories, flat = train_prms(eff, out, cfg.seed, device, log, traces)
    k, nv = eff.n_candidates, len(val_pools)
    sc = {
        name: {
            "val": [f[i * k : (i + 1) * k] for i in range(nv)],
            "test": [f[i * k : (i + 1) * k] for i in range(nv, len(pooled))],
        }
        for name, f in flat.items()
    }
    held = {
        name: score_traces(m, [(r["question"], r["steps"]) for r in data.held_records], batch_size=64)
        for name, m in models.items()
    }

    # 5. evaluation: tune on validation, report on test
    tuned = tune_selectors(sc["betaprm"]["val"], [p.answers for p in val_pools], [p.correct for p in val_pools])
    test_scores = {name: s["test"] for name, s in sc.items()}
    selectable = {**test_scores, "bayes": bayes_scores(test_pools)}  # made once for every cut below
    hits = bon_hits(test_pools, selectable, tuned)
    bon = {k: {"acc": float(v.mean()), "ci": list(bootstrap_ci(v, seed=cfg.seed))} for k, v in hits.items()}
    # "The best BetaPRM selector" is chosen on validation, never on test.
    val_hits = bon_hits(val_pools, {name: s["val"] for name, s in sc.items()}, tuned)
    best_beta = max(BETAPRM_SELECTORS, key=lambda k: val_hits[k].mean())
    comparisons = {
        "betaprm_rb_minus_standard_prm_mean": paired_bootstrap(
            hits["betaprm_rb"], hits["standard_prm_mean"], seed=cfg.seed
        ),
        "best_betaprm_minus_majority_vote": {
            "selector": best_beta,
            **paired_bootstrap(hits[best_beta], hits["majority_vote"], seed=cfg.seed),
        },
    }
    # Best-of-n for every n: accuracy against the pools' tokens (the frontier of its knob, n).
    pool_tokens = pool_token_counts(test_pools, tokenizer)
    bon_sweeps = bon_frontiers(test_pools, selectable, tuned, pool_tokens)
    curves = {key: [p.acc for p in pts] for key, pts in bon_sweeps.items()}
    verification, clean_bias = diagnostics.verification(test_scores, test_pools, [p.correct for p in test_pools])
    shortcut = diagnostics.value_prior(test_pools, test_scores, val_pools)
    cal, arrays, counts_cal, held_nll = {}, {}, {}, {}
    for name in models:
        cal[name], arrays[name] = diagnostics.calibration(
            test_pools, sc[name]["test"], data.held_records, held[name], beta=name == "betaprm"
        )
        # The same numbers as `betaprm eval-calibration --model OUT/NAME --data OUT/held_out_counts.jsonl`.
        counts = flat_counts(data.held_records, held[name])
        counts_cal[name] = evaluate_counts(*counts, beta=name == "betaprm")
        held_nll[name] = step_nll(*counts, beta=name == "betaprm")

    results = {
        "config": asdict(cfg),
        "effective_config": asdict(eff),
        "world": world_cfg.to_dict(),
        "seed": cfg.seed,
        "version": version(),
        **({"prms_trained_by": trained_by} if trained_by else {}),
        "bon": bon,
        "comparisons": comparisons,
        "best_of_n_curve": {"n": list(range(1, eff.n_candidates + 1)), **curves},
        "tuned": {
            "rb": {
                "lambda": tuned["rb"].lam,
                "q": tuned["rb"].q,
                "tau": tuned["rb"].tau,
                "val_acc": tuned["rb"].val_accuracy,
            },
            "lin": {"lambda": tuned["lin"].lam, "val_acc": tuned["lin"].val_accuracy},
            "reliability_vote_lambda": tuned["reliability_vote"],
        },
        "verification": verification,
        "calibration": cal,
        "held_out_counts": counts_cal,
        "clean_bias_by_step": clean_bias,
        "value_prior": shortcut,
    }
    aca, aca_sweeps = None, None
    if eff.aca:
        t0 = time.perf_counter()
        # On CPU the variants run two at a time in worker processes, as the PRMs train.
        parallel = eff.parallel_prms and device == "cpu"
        aca = aca_table(
            world,
            test_pools,
            hits["betaprm_rb"],
            models,
            tuned,
            tokenizer,
            cfg.seed,
            run_dir=out if parallel else None,
            threads=torch.get_num_threads(),
            frontier=eff.aca_frontier,
            pool_tokens=pool_tokens,
        )
        aca, aca_sweeps = aca[:2], aca[2]
        results["aca"] = aca[0]
        runs = sum(map(len, aca_sweeps.values()))
        took = time.perf_counter() - t0
        log(f"ACA: {len(aca_sweeps)} variants ({runs} runs) on {len(test_pools)} test problems ({took:.0f}s)")
    curves_json, results["frontier_comparisons"] = frontier_results(aca_sweeps, bon_sweeps, cfg.seed)
    results.update(curves_json)
    # Per-problem outcomes, for pooling runs over seeds and worlds (benchmarks/reliability_claims.py).
    (out / "per_problem.json").write_text(
        json.dumps(per_problem_json(bon_sweeps, aca_sweeps, held_nll), separators=(",", ":")) + "\n"
    )
    results["seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    demo_plots(out, histories, arrays, curves, eff.n_candidates, aca, held_out=counts_cal["betaprm"], results=results)

    log("\n" + format_results(results))
    log(
        f"\nwrote {out / 'results.json'} and plots (kappa_dynamics, reliability, kappa_vs_bayes, sigma_error, "
        f"best_of_n{', aca_tokens' if eff.aca else ''}, aca_frontier .png) in {results['seconds']:.0f}s"
    )
    return results
