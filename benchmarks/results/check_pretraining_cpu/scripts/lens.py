# ruff: noqa: E402, E501, E731
# The probe script as run for benchmarks/RESULTS.md (entry "the step check learned before the PRMs"), kept as it was.
"""Logit lens: at each " =" of clean traces, which layer's hidden state (through the final
norm and the LM head) already predicts the written (correct) result? Also the mod-5 / parity part."""

import sys

import numpy as np
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4] / "src"))
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from betaprm.formatting import TraceFormat, encode_traces
from betaprm.synth import SynthPolicy, World

torch.set_num_threads(1)
bb = sys.argv[1]
m = AutoModelForCausalLM.from_pretrained(bb).eval()
tok = PreTrainedTokenizerFast.from_pretrained(bb)
w = World()
pol = SynthPolicy(w, seed=99, error_boost=0.0)
probs = w.sample_problems(200, 12345, "lens")
ids = encode_traces(
    tok,
    tok.convert_tokens_to_ids("<prm>"),
    [(p.question, pol.sample_traces(p, 1)[0].steps) for p in probs],
    TraceFormat(),
)
eq = tok.get_vocab()["="]
num = {tok.convert_tokens_to_ids(str(v)): v for v in range(10)}
numids = torch.tensor(sorted(num))
L = m.config.num_hidden_layers
hit = np.zeros(L + 1)
hit5 = np.zeros(L + 1)
hit2 = np.zeros(L + 1)
n = 0
for seq in ids:
    x = torch.tensor([seq])
    with torch.no_grad():
        hs = m(input_ids=x, output_hidden_states=True).hidden_states
    pos = [i for i, t in enumerate(seq) if t == eq]
    for k in range(L + 1):
        h = hs[k][0, pos]
        if k < L:
            h = m.model.norm(h)
        lg = m.lm_head(h)[:, numids]
        pred = np.array([num[int(numids[j])] for j in lg.argmax(-1)])
        true = np.array([num[seq[i + 1]] for i in pos])
        hit[k] += (pred == true).sum()
        hit5[k] += (pred % 5 == true % 5).sum()
        hit2[k] += (pred % 2 == true % 2).sum()
    n += len(pos)
for k in range(L + 1):
    print(f"layer {k}: result {hit[k] / n:.3f}  mod5 {hit5[k] / n:.3f}  parity {hit2[k] / n:.3f}")
