"""A stratified sample of the official ProcessBench, one file per subset.

    python benchmarks/processbench_sample.py --data DIR --per-class 40 --out outputs/pb_sample

``--data``: a folder with the benchmark's four JSON files (gsm8k.json, math.json,
olympiadbench.json, omnimath.json, as the QwenLM/ProcessBench repository and the hub data
set give them). From each subset, ``--per-class`` items whose solution has an error and as
many whose solution is right, drawn with ``--seed`` and kept in the file's order, so every
subset's F1 (which needs both kinds) is defined and the subsets weigh alike. With
``--max-chars`` only items whose problem and steps are at most that long are drawn (a cap on
scoring time, stated with the results). Records are written unchanged: ``betaprm eval-steps
--data OUT`` reads the folder as the benchmark (file stem = subset).

``tests/data/processbench_sample/`` was made with ``--per-class 5 --seed 0 --max-chars 1500``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from betaprm.evaluation.sampling import stratified_sample

SUBSETS = ("gsm8k", "math", "olympiadbench", "omnimath")


def sample(rows: list[dict], per_class: int, seed: int, max_chars: int | None) -> list[dict]:
    """``per_class`` erroneous and ``per_class`` correct rows (fewer where a class has
    fewer), in the file's order: ``betaprm.evaluation.sampling.stratified_sample``, the
    sampler of ``eval-steps --limit``, over the rows that fit ``max_chars``."""
    size = [len(r["problem"]) + sum(map(len, r["steps"])) for r in rows]
    fit = [i for i in range(len(rows)) if max_chars is None or size[i] <= max_chars]
    picked = stratified_sample([rows[i]["label"] == -1 for i in fit], per_class=per_class, seed=seed)
    return [rows[fit[j]] for j in picked]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="folder with the four official subset files")
    ap.add_argument("--out", required=True, help="folder to write the sample into (one file per subset)")
    ap.add_argument("--per-class", type=int, default=40, help="erroneous and correct items per subset (each)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draw")
    ap.add_argument("--max-chars", type=int, default=None, help="draw only items at most this long (characters)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(SUBSETS):
        rows = json.loads((Path(args.data) / f"{name}.json").read_text())
        part = sample(rows, args.per_class, args.seed + i, args.max_chars)
        (out / f"{name}.json").write_text(json.dumps(part, indent=1, ensure_ascii=False) + "\n")
        n_err = sum(r["label"] != -1 for r in part)
        print(f"{name}: {len(part)} of {len(rows)} items ({n_err} erroneous, {len(part) - n_err} correct)")


if __name__ == "__main__":
    main()
