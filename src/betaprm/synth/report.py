"""The demo's printed report and figures: Markdown tables of its ``results.json`` and
its plots."""

from __future__ import annotations

from ..evaluation import plots
from ..evaluation.calibration import table as counts_table
from ..evaluation.tables import markdown_table
from .diagnostics import kappa_star
from .experiment import BON_ROWS

NAMES = {key: label for key, _, _, label in BON_ROWS}
ACA_LABELS = {
    "aca": "ACA (BetaPRM, S_RB)",
    "aca_lin": "ACA (BetaPRM, final S_lin)",
    "aca_no_early_stop": "ACA w/o early stop (BetaPRM, S_RB)",
    "aca_reward_only": "ACA reward-only (standard PRM, sigma = 0)",
    "aca_proxy": "ACA proxy sigma (standard PRM, sqrt(mu(1-mu)))",
    "aca_authors": "ACA, the authors' rules (BetaPRM, top S_lin)",
    "vote": "adaptive reliability vote (BetaPRM)",
    "vote_sigma0": "adaptive vote, sigma = 0 (BetaPRM mu)",
    "vote_runner_up": "adaptive reliability vote, runner-up repair",
    "adaptive_consistency": "Adaptive-Consistency (majority)",
    "esc": "ESC, window agreement (majority)",
    "deepconf": "DeepConf-style (standard PRM mu)",
}
ADAPTIVE_VOTES = ("vote", "vote_sigma0", "vote_runner_up", "adaptive_consistency", "esc", "deepconf")


def format_results(r: dict) -> str:
    """The demo's tables (Best-of-N, verification, calibration, with ACA its table) as
    Markdown, from its results (``results.json``)."""
    n = r["effective_config"]["n_candidates"]
    rows = [[NAMES.get(k, k), f"{v['acc']:.3f}", f"[{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]"] for k, v in r["bon"].items()]
    parts = [
        f"Best-of-{n}, {r['effective_config']['n_test_problems']} test problems (95% bootstrap intervals)",
        markdown_table(rows, ["selector", "accuracy", "95% CI"]),
    ]
    c = r["comparisons"]
    a, b = c["betaprm_rb_minus_standard_prm_mean"], c["best_betaprm_minus_majority_vote"]
    parts.append(
        f"BetaPRM S_RB - standard PRM: {a['diff']:+.3f} [{a['ci'][0]:+.3f}, {a['ci'][1]:+.3f}] (paired bootstrap)"
    )
    parts.append(
        f"best BetaPRM selector on validation ({NAMES[b['selector']]}) - majority vote: {b['diff']:+.3f} "
        f"[{b['ci'][0]:+.3f}, {b['ci'][1]:+.3f}]"
    )
    t = r["tuned"]
    parts.append(
        f"tuned on validation: S_RB lambda {t['rb']['lambda']}, q {t['rb']['q']} (tau {t['rb']['tau']:.3f}); S_lin "
        f"lambda {t['lin']['lambda']}; reliability vote lambda {t['reliability_vote_lambda']}"
    )
    v = r["verification"]
    parts.append("\nVerification: within-problem AUROC of the final-step mu (0.5 = no verification)")
    split = all(
        f"{k}_first_error_auroc_{x}" in v for k in ("standard_prm", "betaprm", "bayes") for x in ("odd", "even")
    )
    names = [("standard PRM", "standard_prm"), ("BetaPRM", "betaprm"), ("Bayes belief", "bayes")]
    if "parity_check_auroc" in v:
        names.append(("parity-check observer", "parity_check"))
    rows = [
        [m, f"{v[k + '_auroc']:.3f}", f"{v[k + '_first_error_auroc']:.3f}"]
        + ([f"{v[k + '_first_error_auroc_odd']:.3f}", f"{v[k + '_first_error_auroc_even']:.3f}"] if split else [])
        for m, k in names
    ]
    parts.append(
        markdown_table(
            rows, ["model", "AUROC", "first-error AUROC"] + (["odd offset", "even offset"] if split else [])
        )
    )
    parts.append(
        "first-error AUROC: the drop in logit mu at a verifiable step after an error-free prefix, erroneous vs "
        "correct steps;"
        " odd / even: errors whose offset changes / keeps the parity of the result"
    )
    if "parity_check_auroc" in v:
        parts.append(
            "parity-check observer: the best belief given only the parity of each step's error (mu MAE vs Bayes "
            f"mean {v['parity_check_mu_mae_bayes']:.3f})"
        )
    for name, label in (("standard_prm", "standard PRM"), ("betaprm", "BetaPRM")):
        parts.append(
            f"mu - Bayes mean on error-free prefixes, steps 1..{len(r['clean_bias_by_step'][name])}, {label}: "
            + " ".join(f"{x:+.2f}" for x in r["clean_bias_by_step"][name])
        )
    if "value_prior" in r:
        parts.append(value_prior_table(r["value_prior"]))
    cs, cb = r["calibration"]["standard_prm"], r["calibration"]["betaprm"]
    parts.append("\nCalibration against the truth (test pools; NLL on held-out MC counts)")
    rows = [
        ["mu MAE vs Bayes mean", f"{cs['mu_mae_bayes']:.3f}", f"{cb['mu_mae_bayes']:.3f}"],
        ["mu MAE vs true q", f"{cs['mu_mae_true']:.3f}", f"{cb['mu_mae_true']:.3f}"],
        ["NLL of counts (standard: binomial at mu)", f"{cs['bb_nll']:.3f}", f"{cb['bb_nll']:.3f}"],
        ["Spearman(kappa, kappa*)", "-", f"{cb['spearman_kappa_bayes']:.3f}"],
        [
            "same, unsettled steps only (share settled)",
            "-",
            f"{cb['spearman_kappa_bayes_unsettled']:.3f} ({cb['share_settled']:.2f})",
        ],
        *(
            [
                [
                    "mu MAE vs parity-check observer's mean",
                    f"{cs['mu_mae_parity_check']:.3f}",
                    f"{cb['mu_mae_parity_check']:.3f}",
                ],
                ["Spearman(kappa, parity-check observer's kappa*)", "-", f"{cb['spearman_kappa_parity_check']:.3f}"],
            ]
            if "mu_mae_parity_check" in cb
            else []
        ),
        ["Spearman(sigma, Bayes std)", "-", f"{cb['spearman_sigma_bayes_std']:.3f}"],
        ["Spearman(sigma, |mu - q|), its own error", "-", f"{cb['spearman_sigma_own_error']:.3f}"],
        ["90% interval coverage of q (Bayes)", "-", f"{cb['coverage90']:.3f} ({cb['bayes_coverage90']:.3f})"],
        ["90% interval mean width (Bayes)", "-", f"{cb['width90']:.3f} ({cb['bayes_width90']:.3f})"],
        [
            "Beta at Bayes mean and kappa*: coverage, width",
            "-",
            f"{cb['bayes_beta_coverage90']:.3f}, {cb['bayes_beta_width90']:.3f}",
        ],
    ]
    parts.append(markdown_table(rows, ["metric", "standard PRM", "BetaPRM"]))
    if "held_out_counts" in r:
        h = r["held_out_counts"]
        parts.append(
            "\nCalibration on the held-out MC counts (OUT/held_out_counts.jsonl; the same as `betaprm "
            "eval-calibration`)"
        )
        parts.append(counts_table({"standard PRM": h["standard_prm"], "BetaPRM": h["betaprm"]}))
    if "aca" in r:
        a = r["aca"]
        names = {"vanilla_bon": f"vanilla Best-of-{n} (BetaPRM S_RB)", **ACA_LABELS}
        base = a["vanilla_bon"]["tokens"]
        rows = [
            [
                names[k],
                f"{a[k]['acc']:.3f}",
                f"[{a[k]['ci'][0]:.3f}, {a[k]['ci'][1]:.3f}]",
                f"{a[k]['tokens']}",
                "-"
                if k == "vanilla_bon"
                else f"{1 - a[k]['tokens'] / base:+.1%}".replace("+", "-", 1)
                if a[k]["tokens"] <= base
                else f"+{a[k]['tokens'] / base - 1:.1%}",
                "-" if k == "vanilla_bon" else f"{a[k]['mean_pool_size']:.1f}" if "mean_pool_size" in a[k] else "",
            ]
            for k in names
            if k in a
        ]
        parts.append(
            f"\nAdaptive Computation Allocation, budget {n}, {r['effective_config']['n_test_problems']} test "
            "problems (tokens: generated, all problems)"
        )
        parts.append(markdown_table(rows, ["method", "accuracy", "95% CI", "tokens", "vs vanilla", "mean pool"]))
    if r.get("aca_frontier"):
        parts.append(frontier_table(r))
    return "\n".join(parts)


def frontier_table(r: dict) -> str:
    """Each ACA variant's frontier (its knob's settings: tokens, accuracy) and the pairs of
    ``FRONTIER_PAIRS`` compared: which frontier is higher where both reach, and the table
    point of A against B at the same tokens (paired over problems)."""
    rows = [
        [
            ACA_LABELS[name],
            f["knob"],
            "; ".join(f"{p['knob']:g}: {p['tokens'] / 1000:.0f}k {p['acc']:.3f}" for p in f["points"]),
        ]
        for name, f in r["aca_frontier"].items()
    ]
    rb = r["bon_frontier"]["betaprm_rb"]
    rows.append(
        [
            f"Best-of-n ({NAMES['betaprm_rb']})",
            "n",
            "; ".join(f"{p['knob']:g}: {p['tokens'] / 1000:.0f}k {p['acc']:.3f}" for p in rb[3::4]),
        ]
    )
    parts = [
        "\nFrontiers: accuracy against generated tokens over each method's own knob (knob value: tokens accuracy)",
        markdown_table(rows, ["method", "knob", "points"]),
    ]
    rows = []
    for key, c in r["frontier_comparisons"].items():
        m = c["matched_at_table_point"]
        rows.append(
            [
                key.replace("_vs_", " vs "),
                c["what"],
                {"a": key.split("_vs_")[0], "b": key.split("_vs_")[1]}.get(c["verdict"], c["verdict"]),
                "-" if m is None else f"{m['tokens'] / 1000:.0f}k",
                "-" if m is None else f"{m['diff']:+.3f} [{m['ci'][0]:+.3f}, {m['ci'][1]:+.3f}]",
            ]
        )
    parts.append("")
    parts.append(
        markdown_table(rows, ["A vs B", "what differs", "higher frontier", "A's table point", "A - B at its tokens"])
    )
    parts.append(
        "higher frontier: over the tokens both reach (a line between settings is a random mix of the two); "
        "crossing: each higher somewhere"
    )
    return "\n".join(parts)


def frontier_plot_curves(r: dict) -> tuple[dict, dict]:
    """The frontiers ``aca_frontier.png`` draws, labelled: every ACA variant's sweep and
    Best-of-n (n = 1..N) by BetaPRM S_RB, the standard PRM's top-1, the two PRMs' votes and
    majority vote; and their colour families (ACA, adaptive votes, Best-of-n)."""
    out = {ACA_LABELS[name]: f["points"] for name, f in r.get("aca_frontier", {}).items()}
    families: dict[str, list[str]] = {"ACA": [], "adaptive vote": [], "Best-of-n": []}
    for name in r.get("aca_frontier", {}):
        families["adaptive vote" if name in ADAPTIVE_VOTES else "ACA"].append(ACA_LABELS[name])
    for key in ("betaprm_rb", "standard_prm_mean", "standard_prm_vote", "betaprm_reliability_vote", "majority_vote"):
        out[f"Best-of-n, {NAMES[key]}"] = r["bon_frontier"][key]
        families["Best-of-n"].append(f"Best-of-n, {NAMES[key]}")
    return out, families


def demo_plots(out, histories, arrays, curves, n_candidates, aca, held_out=None, results=None) -> None:
    """The demo's figures: kappa during training, reliability, kappa against kappa*,
    Best-of-n curves, (with ACA) accuracy against tokens, (with ``results``) the frontiers
    of accuracy against tokens, and (with ``held_out``, the BetaPRM's
    ``evaluation.calibration`` results) sigma against error on held-out counts."""
    plots.kappa_dynamics(histories["betaprm"], out / "kappa_dynamics.png", "BetaPRM kappa during training")
    std, beta = arrays["standard_prm"], arrays["betaprm"]
    plots.reliability_diagram(
        {"standard PRM": (std.mu, std.q), "BetaPRM": (beta.mu, beta.q), "Bayes belief": (beta.bayes_mean, beta.q)},
        out / "reliability.png",
    )
    plots.kappa_vs_bayes(beta.kappa, kappa_star(beta.bayes_mean, beta.bayes_var), out / "kappa_vs_bayes.png")
    if held_out is not None:
        plots.sigma_vs_error({"BetaPRM (held-out counts)": held_out["sigma_error_bins"]}, out / "sigma_error.png")
    ns = list(range(1, n_candidates + 1))
    plots.best_of_n_curves(
        {
            k: (ns, curves[k])
            for k in ("majority_vote", "standard_prm_mean", "betaprm_rb", "betaprm_vote", "bayes_vote", "oracle")
        },
        out / "best_of_n.png",
    )
    if aca is not None:
        table, points = aca
        plots.best_of_n_curves(
            {"Best-of-n, BetaPRM S_RB": (table["bon_curve"]["tokens"], curves["betaprm_rb"])},
            out / "aca_tokens.png",
            points=points,
            xlabel="generated tokens (all test problems)",
        )
    if results is not None and "bon_frontier" in results:
        curves, families = frontier_plot_curves(results)
        plots.frontier_curves(curves, out / "aca_frontier.png", families=families)


def value_prior_table(vp: dict) -> str:
    """The final-value shortcut (``synth.diagnostics.value_prior``) as a table."""
    rows = []
    for name, label in (("standard_prm", "standard PRM"), ("betaprm", "BetaPRM"), ("bayes", "Bayes belief")):
        d = vp[name]
        top = sorted(range(len(d["pick_lift"])), key=lambda v: -d["pick_lift"][v])[:3]
        rows.append(
            [
                label,
                f"{d['top1_accuracy']:.3f}",
                ", ".join(f"{v} ({d['pick_lift'][v]:.1f}x)" for v in top),
                f"{d['spearman_prior']:+.2f}",
            ]
        )
    return (
        "\nShortcut check: does top-1 (by final-step mu) pick final values rather than verified steps?\n"
        + markdown_table(rows, ["scorer", "top-1 accuracy", "most over-picked values", "Spearman(mu, prior)"])
        + "\nprior: P(correct | final value) on the validation pools, alone a within-problem AUROC of "
        f"{vp['prior_auroc']:.3f}; over-picked: share of top-1 picks / share among candidates"
    )
