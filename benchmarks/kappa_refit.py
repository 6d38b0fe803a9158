"""Is BetaPRM's kappa short of training, or of what its hidden state carries? A diagnostic.

Takes a finished ``betaprm demo`` run, keeps its BetaPRM's backbone and ``mu`` fixed, and
fits the kappa head again (the same linear head on the same stop-gradient hidden state,
the same Beta-Binomial likelihood and evidence regulariser, on the same training counts)
to convergence, full batch. Then it recomputes the demo's calibration numbers on the run's
test split for the trained head and the refitted one:

    python benchmarks/kappa_refit.py --run outputs/demo [--steps 3000] [--lr 0.01]

If the refitted head reaches what the trained one did not (Spearman(kappa, kappa*),
interval width), kappa was short of training (e.g. a faster kappa head would help); if not,
the hidden state at the marker does not carry it. ``mu`` is unchanged, so every
Best-of-N and verification number is too. Writes ``RUN/kappa_refit.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path


def marker_features(prm, token_ids, batch_size=64):
    """Per trace, in order: (hidden state at each marker (M, H), mu (M,))."""
    import torch

    from betaprm.batching import pad_batch, pad_id

    grabbed = []
    hook = prm.kappa_head.register_forward_hook(lambda mod, inp, out: grabbed.append(inp[0].detach()))
    feats = []
    prm.eval()
    try:
        for i in range(0, len(token_ids), batch_size):
            ids, mask = pad_batch(token_ids[i : i + batch_size], pad_id(prm.tokenizer))
            grabbed.clear()
            with torch.no_grad():
                out = prm(ids, attention_mask=mask)
            h, row = grabbed[0], out.row
            for b in range(ids.shape[0]):
                sel = row == b
                feats.append((h[sel].float(), out.mu[sel].float()))
    finally:
        hook.remove()
    return feats


def main(argv=None):
    import torch
    from transformers.utils import logging as hf_logging

    from betaprm.beta import beta_binomial_nll, beta_std, evidence_regularizer
    from betaprm.formatting import encode_traces
    from betaprm.model import BetaPRM
    from betaprm.scoring import StepScores
    from betaprm.synth import World, WorldConfig
    from betaprm.synth.diagnostics import calibration
    from betaprm.synth.experiment import demo_data
    from betaprm.synth.recipe import DemoConfig
    from betaprm.train import TrainConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="folder of a finished betaprm demo run (results.json, betaprm/)")
    ap.add_argument("--steps", type=int, default=3000, help="full-batch Adam steps for the refit")
    ap.add_argument("--lr", type=float, default=0.01, help="Adam learning rate for the refit")
    ap.add_argument(
        "--scales",
        type=float,
        nargs="+",
        default=[0.5, 1, 2, 3, 4, 6],
        help="also report coverage and width with the trained head's kappa times each of these",
    )
    ap.add_argument(
        "--lambda-reg",
        type=float,
        default=TrainConfig.__dataclass_fields__["lambda_reg"].default,
        help="evidence regulariser weight (default: betaprm train's, which the demo uses)",
    )
    a = ap.parse_args(argv)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    run = Path(a.run)
    res0 = json.loads((run / "results.json").read_text())
    # The settings the run actually used (its presets applied), not the flags it was given.
    c = res0.get("effective_config", res0["config"])
    cfg = DemoConfig(**{k: v for k, v in c.items() if k in DemoConfig.__dataclass_fields__})
    world = World(WorldConfig.from_dict(res0["world"]) if "world" in res0 else WorldConfig())
    t0 = time.perf_counter()
    _, train_records, _, test_pools, held_records = demo_data(world, cfg.effective(), cfg.seed)
    want = res0.get("effective_config", {}).get("n_test_problems")
    if want is not None and len(test_pools) != want:
        raise SystemExit(f"{run}: rebuilt {len(test_pools)} test pools, the run had {want}: not the run's data")
    print(f"rebuilt the run's data ({time.perf_counter() - t0:.0f}s)")
    prm = BetaPRM.from_pretrained(run / "betaprm")
    enc = lambda pairs: encode_traces(prm.tokenizer, prm.config.marker_id, pairs, prm.config.trace_format)  # noqa: E731

    t0 = time.perf_counter()
    train_f = marker_features(prm, enc([(r["question"], r["steps"]) for r in train_records]))
    test_f = marker_features(prm, enc([(p.problem.question, t.steps) for p in test_pools for t in p.traces]))
    held_f = marker_features(prm, enc([(r["question"], r["steps"]) for r in held_records]))
    print(
        f"hidden states at {sum(len(m) for _, m in train_f)} training, {sum(len(m) for _, m in test_f)} test markers "
        f"({time.perf_counter() - t0:.0f}s)"
    )

    h = torch.cat([f[0] for f in train_f])
    mu = torch.cat([f[1] for f in train_f])
    k = torch.cat([torch.tensor(r["mc_correct"], dtype=torch.float32) for r in train_records])
    n = torch.cat([torch.full((len(r["steps"]),), float(r["mc_total"])) for r in train_records])
    trained = prm.kappa_head
    refit = copy.deepcopy(trained).requires_grad_(True)

    def loss_of(head):  # the trainer's beta-binomial loss, mean over markers, with mu fixed
        prm.kappa_head = head  # kappa through the model's own kappa_from_hidden
        kappa = prm.kappa_from_hidden(h)
        return beta_binomial_nll(mu, kappa, k, n).mean() + a.lambda_reg * evidence_regularizer(mu, kappa, k, n).mean()

    opt = torch.optim.Adam(refit.parameters(), lr=a.lr)
    with torch.no_grad():
        start = float(loss_of(trained))
    for step in range(a.steps):
        loss = loss_of(refit)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % max(1, a.steps // 5) == 0:
            print(f"  refit step {step + 1}/{a.steps}: training loss {loss.item():.4f} (trained head: {start:.4f})")

    out = {
        "run": str(run),
        "steps": a.steps,
        "lr": a.lr,
        "training_loss": {"trained_head": start, "refit_head": float(loss_of(refit).detach())},
    }
    k_per = len(test_pools[0].traces)

    def scores(feats):  # with the head now in prm.kappa_head
        out_ = []
        with torch.no_grad():
            for hh, mm in feats:
                kap = prm.kappa_from_hidden(hh)
                out_.append(StepScores(mm.numpy(), kap.numpy(), beta_std(mm, kap).numpy()))
        return out_

    for name, head in (("trained_head", trained), ("refit_head", refit)):
        prm.kappa_head = head
        test_sc = scores(test_f)
        pooled = [test_sc[i * k_per : (i + 1) * k_per] for i in range(len(test_pools))]
        cal, _ = calibration(test_pools, pooled, held_records, scores(held_f), beta=True)
        out[name] = {
            key: cal[key]
            for key in (
                "mu_mae_bayes",
                "bb_nll",
                "spearman_kappa_bayes",
                "spearman_kappa_bayes_unsettled",
                "share_settled",
                "spearman_kappa_parity_check",
                "spearman_sigma_bayes_std",
                "coverage90",
                "width90",
                "bayes_width90",
                "kappa_median",
            )
        }
    # Is the interval too wide for this mu, or is kappa too low? The trained head's kappa times
    # a constant: if only a coverage below 0.85 brings the width near the Bayes belief's, the
    # width is what calibrated intervals around this mu need.
    prm.kappa_head = trained
    test_sc = scores(test_f)
    out["kappa_scaled"] = []
    held_sc = scores(held_f)

    def scaled(sc, c):  # the same mu, kappa times c, sigma from both
        kap = sc.kappa * c
        return StepScores(sc.mu, kap, beta_std(torch.tensor(sc.mu), torch.tensor(kap)).numpy())

    for scale in a.scales:
        pooled = [[scaled(s_, scale) for s_ in test_sc[i * k_per : (i + 1) * k_per]] for i in range(len(test_pools))]
        cal, _ = calibration(test_pools, pooled, held_records, [scaled(s_, scale) for s_ in held_sc], beta=True)
        out["kappa_scaled"].append(
            {"scale": scale, "coverage90": cal["coverage90"], "width90": cal["width90"], "bb_nll": cal["bb_nll"]}
        )
    out["bayes_beta"] = {
        "coverage90": cal["bayes_beta_coverage90"],
        "width90": cal["bayes_beta_width90"],
        "bayes_width90": cal["bayes_width90"],
    }
    out["demo_results"] = {
        key: res0["calibration"]["betaprm"][key] for key in ("spearman_kappa_bayes", "coverage90", "width90", "bb_nll")
    }
    (run / "kappa_refit.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'':<28}{'trained head':>14}{'refit head':>14}")
    for key in (
        "bb_nll",
        "spearman_kappa_bayes",
        "spearman_kappa_bayes_unsettled",
        "share_settled",
        "spearman_kappa_parity_check",
        "spearman_sigma_bayes_std",
        "coverage90",
        "width90",
        "kappa_median",
    ):
        print(f"{key:<28}{out['trained_head'][key]:>14.3f}{out['refit_head'][key]:>14.3f}")
    print(
        "trained head's kappa x c:  "
        + "  ".join(
            f"c={r['scale']:g}: coverage {r['coverage90']:.3f} width {r['width90']:.3f} NLL {r['bb_nll']:.3f}"
            for r in out["kappa_scaled"]
        )
    )
    print(
        f"Beta at the Bayes mean and kappa*: coverage {out['bayes_beta']['coverage90']:.3f}, width "
        f"{out['bayes_beta']['width90']:.3f} (Bayes belief's own width {out['bayes_beta']['bayes_width90']:.3f})"
    )
    print(
        f"(the run's own results.json: Spearman {out['demo_results']['spearman_kappa_bayes']:.3f}, coverage "
        f"{out['demo_results']['coverage90']:.3f}, width {out['demo_results']['width90']:.3f}; Bayes width "
        f"{out['trained_head']['bayes_width90']:.3f})"
    )
    return out


if __name__ == "__main__":
    main()
