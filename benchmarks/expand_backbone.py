"""Grow a saved causal-LM backbone by N decoder layers on top, each a copy of the top layer
with its attention and MLP output projections zeroed (LLaMA Pro's block expansion), so the
grown model computes exactly what the original did until training moves the new layers.

    python benchmarks/expand_backbone.py SRC DST [--layers 1]

Llama-family layers only (``self_attn.o_proj`` and ``mlp.down_proj``). Used by the probes in
benchmarks/RESULTS.md (``benchmarks/step_check_probe.py --backbone DST``): does depth above the
layers that predict each result help a PRM learn to check it?
"""

from __future__ import annotations

import argparse
import copy


def main(argv=None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="a saved causal-LM directory (config, weights, tokenizer)")
    ap.add_argument("dst", help="where to save the grown model and its tokenizer")
    ap.add_argument("--layers", type=int, default=1, help="decoder layers to add on top")
    a = ap.parse_args(argv)
    model = AutoModelForCausalLM.from_pretrained(a.src)
    layers = model.model.layers
    for _ in range(a.layers):
        new = copy.deepcopy(layers[-1])
        with torch.no_grad():
            new.self_attn.o_proj.weight.zero_()
            new.mlp.down_proj.weight.zero_()
        new.self_attn.layer_idx = len(layers)
        layers.append(new)
    model.config.num_hidden_layers = len(layers)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = list(model.config.layer_types) + [model.config.layer_types[-1]] * a.layers
    model.save_pretrained(a.dst)
    AutoTokenizer.from_pretrained(a.src).save_pretrained(a.dst)
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    before = AutoModelForCausalLM.from_pretrained(a.src).eval()(x).logits
    after = AutoModelForCausalLM.from_pretrained(a.dst).eval()(x).logits
    change = float((before - after).abs().max())
    print(f"{a.dst}: {len(layers)} layers; largest logit change from the original {change:.2g}")


if __name__ == "__main__":
    main()
