"""ProcessBench's protocol in the chain-arithmetic world, where the first wrong step is known.

Writes ProcessBench-format records (id, generator, problem, steps, final_answer_correct,
label, subset) for fresh problems, one policy trace each: ``label`` is the first step whose
own arithmetic is wrong (its written result differs from the operation applied to the
value written before it), -1 when there is none. Subsets: ``short`` (4-6 operations) and
``long`` (7-8). Then evaluates, with ``betaprm eval-steps`` itself, each PRM in --models
(threshold 0.5 as published, and chosen on a validation part), and the exact Bayes belief
of the world for reference. The Bayes belief cannot see errors at recall steps (``?``, the
hidden value), and neither can a PRM: the ceiling is below 100.

    python benchmarks/processbench_world.py --out DIR [--models DEMO/standard_prm,DEMO/betaprm]

(DEMO: the --out folder of ``betaprm demo``, which keeps both PRMs.) Problems are drawn
with their own seed; by chance a few may equal training problems of the demo.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def first_error(world, problem, values) -> int:
    prev = problem.start
    for s, v in enumerate(values):
        if int(problem.apply(s, prev)) != int(v):
            return s
        prev = v
    return -1


def make_records(world, n: int, seed: int) -> tuple[list[dict], list]:
    rng = np.random.default_rng(seed)
    problems = world.sample_problems(n, seed, prefix="pb")
    records, traces = [], []
    for p in problems:
        (tr,) = world.sample_traces(p, 1, rng)
        records.append(
            {
                "id": p.id,
                "generator": "chain-world policy",
                "problem": p.question,
                "steps": tr.steps,
                "final_answer_correct": bool(tr.correct),
                "label": first_error(world, p, tr.values),
                "subset": "short" if p.T <= 6 else "long",
            }
        )
        traces.append(tr)
    return records, traces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the records and results")
    ap.add_argument("--models", default="", help="comma-separated PRM directories to evaluate")
    ap.add_argument("--problems", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7001, help="problem seed (not a demo seed)")
    ap.add_argument("--world-config", default=None, help="a world JSON (default: the demo's world)")
    args = ap.parse_args()

    from betaprm.cli import main as cli
    from betaprm.evaluation.processbench import evaluate_processbench, read_processbench, table
    from betaprm.synth import World, WorldConfig

    world = World(WorldConfig.from_json(args.world_config) if args.world_config else WorldConfig())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records, traces = make_records(world, args.problems, args.seed)
    data = out / "chain_processbench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    n_err = sum(r["label"] != -1 for r in records)
    print(
        f"{data}: {len(records)} items, {n_err} with a wrong step ({sum(r['final_answer_correct'] for r in records)} "
        "with a correct final answer)"
    )
    results = {}
    items = read_processbench(data)
    bayes = [world.bayes_belief(tr.problem, tr.values)[0] for tr in traces]
    for thr in ("0.5", "val"):
        res = evaluate_processbench(items, bayes, thr if thr == "val" else 0.5)
        results[f"bayes/{thr}"] = {k: v for k, v in res.items() if k != "predictions"}
        print(f"\nexact Bayes belief (mean), threshold {thr} -> {res['threshold']:.3f}\n{table(res)}")
    for model in [m for m in args.models.split(",") if m]:
        for thr in ("0.5", "val"):
            name = f"{Path(model).name}/{thr}"
            print(f"\n$ betaprm eval-steps --model {model} --data {data} --threshold {thr}")
            cli(
                [
                    "eval-steps",
                    "--model",
                    model,
                    "--data",
                    str(data),
                    "--threshold",
                    thr,
                    "--out",
                    str(out / f"{Path(model).name}_{thr}.json"),
                ]
            )
            res = json.loads((out / f"{Path(model).name}_{thr}.json").read_text())
            results[name] = {k: v for k, v in res.items() if k not in ("predictions", "provenance")}
    (out / "results.json").write_text(
        json.dumps({"problems": args.problems, "seed": args.seed, "results": results}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
