"""``transformers`` ``generate`` for any local causal LM."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Completion, GenerationRequest
from .text import Sampling, TextFormat


class TransformersGenerator:
    """Samples continuations with ``model.generate`` (left-padded batches of prompts).

    ``n_tokens`` counts the tokens the model generated for a completion, its end-of-
    sequence token included and padding excluded; the prompt and kept steps are not
    counted.
    """

    def __init__(self, model, tokenizer, fmt: TextFormat | None = None, sampling: Sampling | None = None, batch_size: int = 8, seed: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.fmt = fmt or TextFormat()
        self.sampling = sampling or Sampling()
        self.batch_size = batch_size
        self.seed = seed
        if tokenizer.pad_token_id is None:
            # generate needs a pad id for batches; eos is the usual choice.
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_pretrained(cls, path: str, fmt: TextFormat | None = None, sampling: Sampling | None = None, device: str | None = None, dtype: str = "auto", **kwargs) -> TransformersGenerator:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        return cls(model.to(device).eval(), tok, fmt, sampling, **kwargs)

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return set(ids)

    @torch.no_grad()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        eos = self._eos_ids()
        out: list[list[Completion]] = [[] for _ in requests]
        # Flatten to (request index, copy) so that batches hold batch_size sequences.
        jobs = [(i, j) for i, r in enumerate(requests) for j in range(r.n)]
        prompts = [self.fmt.prompt_text(r.question, list(r.prefix), self.tokenizer) for r in requests]
        self.tokenizer.padding_side = "left"
        s = self.sampling
        for b in range(0, len(jobs), self.batch_size):
            chunk = jobs[b : b + self.batch_size]
            # One seed per batch, from the first request's seed when it has one: the same
            # requests in the same order give the same completions.
            first = requests[chunk[0][0]]
            torch.manual_seed(first.seed if first.seed is not None else self.seed + b)
            enc = self.tokenizer([prompts[i] for i, _ in chunk], return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
            gen = self.model.generate(
                **enc,
                do_sample=s.temperature > 0,
                temperature=s.temperature if s.temperature > 0 else None,
                top_p=s.top_p if s.temperature > 0 else None,
                top_k=s.top_k if s.temperature > 0 and s.top_k > 0 else None,
                max_new_tokens=s.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :].tolist()
            for (i, _), toks in zip(chunk, new):
                n = len(toks)
                for k, t in enumerate(toks):
                    if t in eos:
                        n = k + 1
                        break
                text = self.tokenizer.decode(toks[:n], skip_special_tokens=True)
                out[i].append(Completion(self.fmt.split_steps(text), n))
        return out
