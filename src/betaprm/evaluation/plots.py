"""PNG plots for the evaluation commands (matplotlib, imported only when plotting)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def kappa_dynamics(log_history: list[dict], path, title: str = "kappa during training") -> None:
    """kappa mean and 90th percentile per logging step (the paper's figure 4)."""
    plt = _plt()
    rows = [h for h in log_history if "kappa_mean" in h]
    steps = [h["step"] for h in rows]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(steps, [h["kappa_mean"] for h in rows], label="mean")
    ax.plot(steps, [h["kappa_p90"] for h in rows], label="90th percentile")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("kappa")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)


def reliability_diagram(
    series: dict,
    path,
    bins: int = 10,
    ylabel: str = "true success probability",
    xlabel: str | None = None,
    min_count: int = 20,
):
    """Mean predicted mu against the mean target per mu bin (``bins`` equal-width bins of
    mu; a bin with fewer than ``min_count`` points is left out). Returns the Figure (closed,
    after saving), so what it says can be read back.

    ``series``: name -> (mu, target) arrays; ``ylabel`` names the target: the default is
    for the true q of the demo's world; observed outcomes (0/1 step labels, K/N) need their
    own name."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--")
    edges = np.linspace(0, 1, bins + 1)
    for name, (mu, target) in series.items():
        mu, target = np.asarray(mu), np.asarray(target)
        idx = np.clip(np.digitize(mu, edges) - 1, 0, bins - 1)
        xs, ys = [], []
        for b in range(bins):
            sel = idx == b
            if sel.sum() >= min_count:
                xs.append(mu[sel].mean())
                ys.append(target[sel].mean())
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel(xlabel or "predicted mu (mean per bin)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"reliability: {bins} equal-width bins of mu, >= {min_count} points each", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)
    return fig


def kappa_vs_bayes(kappa, kappa_star, path, cap: float = 1e3) -> None:
    """Scatter of predicted kappa against the Bayes belief's kappa* (log axes)."""
    plt = _plt()
    k = np.clip(np.asarray(kappa), 1e-3, cap)
    ks = np.clip(np.asarray(kappa_star), 1e-3, cap)
    rng = np.random.default_rng(0)
    sel = rng.choice(len(k), size=min(len(k), 5000), replace=False)
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    ax.scatter(ks[sel], k[sel], s=3, alpha=0.3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("kappa* (Bayes-optimal)")
    ax.set_ylabel("kappa (BetaPRM)")
    ax.set_title("reliability vs the truth")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)


def best_of_n_curves(curves: dict, path, points: dict | None = None, xlabel: str = "n (candidates)") -> None:
    """Accuracy against n (or tokens) per selector; ``points``: name -> (x, acc)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, (xs, ys) in curves.items():
        ax.plot(xs, ys, marker=".", label=name)
    for name, (x, y) in (points or {}).items():
        ax.scatter([x], [y], marker="*", s=80, label=name, zorder=3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)


def metric_vs_threshold(
    curves: dict,
    path,
    ylabel: str,
    marks: dict | None = None,
    xlabel: str = "threshold on the step score",
    title: str | None = None,
):
    """A metric against the decision threshold, one step curve per part of the data.

    ``curves``: label -> (thresholds, values, drawstyle), drawstyle ``steps-post`` for a
    metric that holds from each threshold up to the next (a rule "correct when above t"),
    ``steps-pre`` for one that holds up to each threshold ("at least t"); nan values leave
    a gap (undefined there). ``marks``: label -> (x, y), a star each (the threshold used,
    on the curve it was chosen on). Returns the Figure (closed, after saving)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, (xs, ys, style) in curves.items():
        ax.plot(xs, ys, drawstyle=style, label=name)
    for name, (x, y) in (marks or {}).items():
        ax.scatter([x], [y], marker="*", s=90, label=name, zorder=3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)
    return fig


def frontier_curves(curves: dict, path, xlabel: str = "generated tokens (all test problems)", families=None) -> None:
    """Accuracy against tokens, one line per method through its knob's settings, with the
    95% band of each point; ``curves``: label -> rows of ``evaluation.frontier.curve``.
    ``families``: family name -> the labels in it, each family drawn in shades of one colour
    (ACA, adaptive votes, Best-of-n); the legend sits beside the axes, over no curve."""
    plt = _plt()
    cmaps = ("Blues", "Greens", "Greys", "Oranges", "Purples", "Reds")
    colour = {}
    for (family, labels), cmap in zip((families or {}).items(), cmaps):
        shades = plt.get_cmap(cmap)(np.linspace(0.95, 0.45, max(len(labels), 1)))
        colour.update(zip(labels, shades))
    fig, ax = plt.subplots(figsize=(9, 4.6))
    for name, rows in curves.items():
        xs = [r["tokens"] for r in rows]
        line = ax.plot(xs, [r["acc"] for r in rows], marker=".", label=name, color=colour.get(name))[0]
        ax.fill_between(xs, [r["ci"][0] for r in rows], [r["ci"][1] for r in rows], alpha=0.12, color=line.get_color())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)


def sigma_vs_error(series: dict, path) -> None:
    """Mean |mu - K/N| against mean sigma in equal-count bins of sigma, with the line a
    calibrated sigma would follow on average (E|X - mean| <= sigma; it ignores the counts'
    own binomial noise, so points above it are expected at small N).

    ``series``: name -> list of ``{"sigma", "abs_error"}`` bins (``evaluation.calibration``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    top = 0.0
    for name, bins in series.items():
        xs, ys = [b["sigma"] for b in bins], [b["abs_error"] for b in bins]
        ax.plot(xs, ys, marker="o", label=name)
        top = max([top, *xs, *ys])
    ax.plot([0, top], [0, top], color="grey", lw=1, ls="--", label="|error| = sigma")
    ax.set_xlabel("sigma (binned)")
    ax.set_ylabel("mean |mu - K/N|")
    ax.set_title("reliability: sigma against error")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)
