"""How much a parity-only step check costs in the chain-arithmetic world, without any model.

Compares the exact Bayes belief with the parity-check observer (the Bayes filter that sees each
verifiable step's error only modulo 2, ``World.bayes_belief(..., check_mod=2)``) on fresh
problems: within-problem AUROC of the final belief, mean absolute difference of the two means,
and the drift of the observer below the Bayes mean on error-free prefixes, step by step.

    python benchmarks/parity_observer.py [--problems 300] [--traces 8] [--seed 4242]
                                         [--backbone outputs/demo/backbone]

``--backbone``: also how often a demo backbone (pretrained on error-free traces) predicts
the result token of each step of fresh error-free traces, verifiable and recall steps apart.
"""

import argparse

import numpy as np

from betaprm.evaluation.metrics import within_problem_auroc
from betaprm.synth import SynthPolicy, World


def backbone_accuracy(path, problems, seed):
    """Share of verifiable (and of recall) steps whose written result the backbone predicts
    as its most likely next token after ``=``, on one error-free trace per problem."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from betaprm.formatting import encode_traces

    tok = PreTrainedTokenizerFast.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    marker = tok.convert_tokens_to_ids("<prm>")
    clean = SynthPolicy(World(), seed=seed, error_boost=0.0)
    hits = {"verifiable": [], "recall": []}
    for p in problems:
        tr = clean.sample_traces(p, 1)[0]
        ids = encode_traces(tok, marker, [(p.question, tr.steps)])[0]
        # the demo's word-level tokenizer writes "=" and "7" as tokens (byte-level BPE: " =", " 7")
        toks = [t.removeprefix("\u0120") for t in tok.convert_ids_to_tokens(ids)]
        with torch.no_grad():
            pred = model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
        for i in range(1, len(toks) - 1):
            if toks[i] == "=" and toks[i + 1].isdigit():
                hits["recall" if toks[i - 1] == "?" else "verifiable"].append(pred[i] == ids[i + 1])
    return {k: (float(np.mean(v)) if v else float("nan"), len(v)) for k, v in hits.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=300, help="fresh problems")
    ap.add_argument("--traces", type=int, default=8, help="policy traces per problem")
    ap.add_argument("--seed", type=int, default=4242, help="problem seed (the policy uses seed + 1)")
    ap.add_argument("--backbone", help="a demo backbone folder (OUT/backbone): also measure its arithmetic")
    a = ap.parse_args(argv)
    w = World()
    policy = SynthPolicy(w, seed=a.seed + 1)
    final = {"bayes": [], "parity": []}
    labels, diffs, drift = [], [], {}
    for p in w.sample_problems(a.problems, a.seed, "parity"):
        truth = p.true_values()
        traces = policy.sample_traces(p, a.traces)
        table = w.q_table(p)
        bm = [w.bayes_belief(p, t.values, table)[0] for t in traces]
        pm = [w.bayes_belief(p, t.values, table, check_mod=2)[0] for t in traces]
        final["bayes"].append([m[-1] for m in bm])
        final["parity"].append([m[-1] for m in pm])
        labels.append(np.array([t.correct for t in traces]))
        for t, b, q in zip(traces, bm, pm):
            diffs.append(np.abs(q - b))
            for k in range(p.T):
                if t.values[k] != truth[k]:
                    break
                drift.setdefault(k + 1, []).append(q[k] - b[k])
    print(f"{a.problems} problems x {a.traces} traces")
    print(
        f"within-problem AUROC: Bayes belief {within_problem_auroc(final['bayes'], labels):.3f}, parity-check "
        f"observer {within_problem_auroc(final['parity'], labels):.3f}"
    )
    print(f"mean |parity-check observer mean - Bayes mean|: {np.concatenate(diffs).mean():.3f}")
    print(
        "parity-check observer - Bayes mean on error-free prefixes, by step: "
        + " ".join(f"{np.mean(drift[k]):+.3f}" for k in sorted(drift))
    )
    if a.backbone:
        acc = backbone_accuracy(a.backbone, w.sample_problems(a.problems, a.seed + 2, "clean"), a.seed + 3)
        print(
            f"backbone {a.backbone}: predicts the written result of {acc['verifiable'][0]:.1%} of "
            f"{acc['verifiable'][1]} verifiable steps"
            f" and {acc['recall'][0]:.1%} of {acc['recall'][1]} recall steps (chance 10%) of error-free traces"
        )


if __name__ == "__main__":
    main()
