"""Helpers shared by the GPU checks: score records with a BetaPRM, compare two runs' scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def read_jsonl(path, n=None):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:n] if n else rows


def score_records(prm, records):
    """mu and kappa per record, as plain lists (records carry question, steps and maybe images)."""
    from betaprm.scoring import score_traces

    traces = [(r["question"], r["steps"], r.get("images") or []) for r in records]
    out = score_traces(prm, traces)
    return [{"id": r["id"], "mu": s.mu.tolist(), "kappa": s.kappa.tolist()} for r, s in zip(records, out)]


def compare(a, b):
    """Largest differences between two score lists of the same records: |mu| and |log kappa|."""
    assert [x["id"] for x in a] == [x["id"] for x in b], "the two score lists cover other records"
    mu_a, mu_b = (np.concatenate([x["mu"] for x in s]) for s in (a, b))
    k_a, k_b = (np.concatenate([x["kappa"] for x in s]) for s in (a, b))
    return {
        "max_abs_dmu": float(np.max(np.abs(mu_a - mu_b))),
        "mean_abs_dmu": float(np.mean(np.abs(mu_a - mu_b))),
        "max_abs_dlog_kappa": float(np.max(np.abs(np.log(k_a) - np.log(k_b)))),
        "n_steps": int(mu_a.size),
    }


def write_json(path, obj):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2) + "\n")
