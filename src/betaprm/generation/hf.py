"""``transformers`` ``generate`` for any local causal LM."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import BetaPRMInputError
from ..hub import resolve_model, unreadable_model
from .base import Completion, GenerationRequest
from .text import Sampling, TextFormat


class TransformersGenerator:
    """Samples continuations with ``model.generate`` (left-padded batches of prompts).

    ``n_tokens`` counts the tokens the model generated for a completion, its end-of-
    sequence token included and padding excluded; the prompt and kept steps are not
    counted. A ``generate`` call holds at most ``batch_size`` sequences and at most
    ``max_batch_tokens`` tokens (sequences x (longest prompt + ``max_new_tokens``)), so
    long prompts make smaller batches instead of running out of memory.
    """

    takes_images = False  # text prompts only: problems with images are refused before generation

    def __init__(
        self,
        model,
        tokenizer,
        fmt: TextFormat | None = None,
        sampling: Sampling | None = None,
        batch_size: int = 8,
        seed: int = 0,
        max_batch_tokens: int = 16384,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.fmt = fmt or TextFormat()
        self.sampling = sampling or Sampling()
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.seed = seed
        if tokenizer.pad_token_id is None:
            # generate needs a pad id for batches; eos is the usual choice.
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        fmt: TextFormat | None = None,
        sampling: Sampling | None = None,
        device: str | None = None,
        dtype: str = "auto",
        **kwargs,
    ) -> TransformersGenerator:
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # The same rules as every --model: a folder, or a hub name through the cache (a
        # revision checked); a folder without weights or damaged files is the input's fault.
        source = resolve_model(path, flag="--policy")
        try:
            tok = AutoTokenizer.from_pretrained(source.path)
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype)
        except (OSError, ValueError, SafetensorError) as e:
            raise unreadable_model(source, e, "--policy") from None
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        return cls(model.to(device).eval(), tok, fmt, sampling, **kwargs)

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return set(ids)

    def _batches(self, jobs, prompt_lengths):
        """(start index, jobs) in order: consecutive jobs while the batch stays within
        ``batch_size`` sequences and ``max_batch_tokens`` tokens; one job may exceed it."""
        out, start, width = [], 0, 0
        for k, (i, _) in enumerate(jobs):
            w = max(width, prompt_lengths[i] + self.sampling.max_new_tokens)
            n = k - start
            if n and (n + 1 > self.batch_size or (n + 1) * w > self.max_batch_tokens):
                out.append((start, jobs[start:k]))
                start, w = k, prompt_lengths[i] + self.sampling.max_new_tokens
            width = w
        if start < len(jobs):
            out.append((start, jobs[start:]))
        return out

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if any(r.images for r in requests):
            raise BetaPRMInputError(
                "--backend transformers generates from text only; for problems with images serve a vision-language "
                "policy (e.g. `vllm serve`) and use --backend openai"
            )
        eos = self._eos_ids()
        out: list[list[Completion]] = [[] for _ in requests]
        # Flatten to (request index, copy) so that batches hold batch_size sequences.
        jobs = [(i, j) for i, r in enumerate(requests) for j in range(r.n)]
        prompts = [self.fmt.prompt_text(r.question, list(r.prefix), self.tokenizer) for r in requests]
        self.tokenizer.padding_side = "left"
        s = self.sampling
        lengths = [len(x) for x in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        for b, chunk in self._batches(jobs, lengths):
            # One seed per batch, from the first request's seed when it has one: the same
            # requests in the same order give the same completions.
            first = requests[chunk[0][0]]
            torch.manual_seed(first.seed if first.seed is not None else self.seed + b)
            enc = self.tokenizer(
                [prompts[i] for i, _ in chunk], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(self.model.device)
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
