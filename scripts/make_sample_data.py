"""Write src/betaprm/resources/sample_counts.jsonl: the small bundled counts file that
`betaprm demo` trains on until the chain-arithmetic world (betaprm.synth) exists.

Traces of short modular-arithmetic chains, some with an arithmetic slip; K of N=8 for
each step is drawn from Binomial(N, q) with q the chance that the rest of the chain is
finished without (another) slip. Deterministic: `python scripts/make_sample_data.py`.
"""

import json
import random
from pathlib import Path

N = 8
SLIP = 0.12


def main(path=Path(__file__).resolve().parents[1] / "src/betaprm/resources/sample_counts.jsonl", n_records=96, seed=1):
    rng = random.Random(seed)
    lines = []
    for i in range(n_records):
        v = rng.randint(0, 9)
        ops = [(rng.choice("+*"), rng.randint(1, 9)) for _ in range(rng.randint(2, 5))]
        question = f"start {v} ; " + " ; ".join(f"{o} {d}" for o, d in ops)
        steps, k = [], []
        ok = True
        for t, (o, d) in enumerate(ops):
            w = (v + d) % 10 if o == "+" else (v * d) % 10
            if rng.random() < SLIP:
                w = (w + rng.choice([1, 9])) % 10
                ok = False
            steps.append(f"{v} {o} {d} = {w}")
            left = len(ops) - t - 1
            q = (1 - SLIP) ** left if ok else 0.02
            k.append(sum(rng.random() < q for _ in range(N)))
            v = w
        lines.append({"id": f"sample-{i:03d}", "question": question, "steps": steps, "mc_correct": k, "mc_total": N})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    print(f"wrote {len(lines)} records to {path}")


if __name__ == "__main__":
    main()
