"""Backend options shared by ``betaprm aca`` and ``betaprm label``, and the builder."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .text import Sampling, TextFormat

BACKENDS = ("synth", "transformers", "openai", "vllm")


def _f(default, help_text):
    return field(default=default, metadata={"help": help_text})


@dataclass
class BackendOptions:
    backend: str = _f("synth", "synth (the chain-arithmetic policy), transformers (local model), openai (an OpenAI-compatible server: vLLM serve, SGLang, TGI, llama.cpp) or vllm (offline engine, GPU)")
    policy: str = _f("", "transformers/vllm: the policy model directory or hub id; openai: the served model name")
    base_url: str = _f("http://127.0.0.1:8000/v1", "openai: the server's base URL")
    endpoint: str = _f("chat", "openai: chat (/chat/completions; prefill through continue_final_message) or completions (/completions with a rendered prompt)")
    api_key_env: str = _f("OPENAI_API_KEY", "openai: environment variable holding the API key (unset: no key sent)")
    concurrency: int = _f(16, "openai: requests in flight at once")
    request_timeout: float = _f(120.0, "openai: seconds to wait for one answer")
    max_retries: int = _f(4, "openai: retries after a failed or timed-out call (exponential backoff)")
    gen_batch_size: int = _f(8, "transformers: sequences per generate call")
    split: str = _f("blank-line", "how generated text is cut into steps: blank-line, tags (<step>/<answer>) or regex")
    split_regex: str | None = _f(None, "with --split regex: the pattern between two steps")
    continuation: str = _f("prefill", "continue kept steps by prefilling the assistant turn (prefill) or by restating them in a new prompt (restate)")
    instruction: str = _f(TextFormat.instruction, "text after the question in the user turn (ask for the step layout --split expects)")
    temperature: float = _f(0.7, "sampling temperature")
    top_p: float = _f(0.9, "nucleus sampling")
    top_k: int = _f(30, "top-k sampling (0: off)")
    max_new_tokens: int = _f(2048, "generated tokens per completion at most")

    def _check_backend(self) -> list[str]:
        bad = []
        if self.backend not in BACKENDS:
            bad.append(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        elif self.backend != "synth" and not self.policy:
            bad.append(f"--backend {self.backend} needs --policy (the model to generate with)")
        if self.endpoint not in ("chat", "completions"):
            bad.append(f"--endpoint must be chat or completions, got {self.endpoint!r}")
        return bad


def build_generator(opts: BackendOptions, world=None, count_tokens=None, seed: int = 0):
    """The generator ``opts`` asks for. ``world`` and ``count_tokens`` serve the synth
    backend (which needs the world whose problems it continues)."""
    if opts.backend == "synth":
        from ..synth import SynthPolicy, World

        return SynthPolicy(world or World(), seed=seed, count_tokens=count_tokens)
    fmt = TextFormat(split=opts.split, split_regex=opts.split_regex, continuation=opts.continuation, instruction=opts.instruction)
    sampling = Sampling(temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k, max_new_tokens=opts.max_new_tokens)
    if opts.backend == "transformers":
        from .hf import TransformersGenerator

        return TransformersGenerator.from_pretrained(opts.policy, fmt, sampling, batch_size=opts.gen_batch_size, seed=seed)
    if opts.backend == "openai":
        from .openai import OpenAIGenerator

        return OpenAIGenerator(opts.base_url, opts.policy, fmt, sampling, endpoint=opts.endpoint, api_key=os.environ.get(opts.api_key_env) or None,
                               concurrency=opts.concurrency, timeout=opts.request_timeout, max_retries=opts.max_retries)
    from .vllm import VLLMGenerator

    return VLLMGenerator(opts.policy, fmt, sampling, seed=seed)
