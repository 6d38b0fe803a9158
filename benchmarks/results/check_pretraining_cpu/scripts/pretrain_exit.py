# ruff: noqa: E402, E501, E731
# The probe script as run for benchmarks/RESULTS.md (entry "the step check learned before the PRMs"), kept as it was.
"""Pretrain the demo backbone (same data, steps, seed as synth.training.pretrain) with an extra
early-exit LM loss: lm_head(norm(hidden_states[EXIT])) also predicts the next token."""

import os
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4] / "src"))
import torch
from transformers import PreTrainedTokenizerFast

from betaprm.synth import World
from betaprm.synth import training as T
from betaprm.synth.recipe import DemoConfig

seed = int(sys.argv[1])
out = sys.argv[2]
EXIT = int(sys.argv[3])
W = float(os.environ.get("EXIT_W", "1.0"))
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
tok = PreTrainedTokenizerFast.from_pretrained(os.environ["BB"])
cfg = DemoConfig(seed=seed).effective()
world = World()
from transformers import LlamaForCausalLM

orig_forward = LlamaForCausalLM.forward


def forward(self, input_ids=None, position_ids=None, labels=None, **kw):
    out = orig_forward(
        self, input_ids=input_ids, position_ids=position_ids, labels=labels, output_hidden_states=True, **kw
    )
    if labels is not None and self.training:
        h = self.model.norm(out.hidden_states[EXIT])
        lg = self.lm_head(h)[:, :-1]
        l2 = torch.nn.functional.cross_entropy(
            lg.reshape(-1, lg.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        out.loss = out.loss + W * l2
    return out


LlamaForCausalLM.forward = forward
m = T.pretrain(cfg, world, tok, "<prm>", print)
LlamaForCausalLM.forward = orig_forward
m.save_pretrained(out)
tok.save_pretrained(out)
print("saved", out)
