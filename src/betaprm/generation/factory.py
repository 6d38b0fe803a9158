"""Backend options shared by ``betaprm aca``, ``search`` and ``label``, the backends by
name, and the builder.

The library's backends are ``transformers``, ``openai`` and ``vllm``; a layer above the
library adds its own with ``register_backend`` (the demo registers its chain-arithmetic
policy as ``synth`` when ``betaprm.synth`` is imported).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BetaPRMInputError
from ..options import opt as _f
from .openai import OpenAIGenerator
from .text import CONTINUATIONS, SPLITS, Sampling, TextFormat
from .vllm import VLLMGenerator


@dataclass(frozen=True)
class Backend:
    """A generation backend: ``build(opts, seed=..., **context)`` returns its generator;
    ``needs_policy``: it generates with the model ``opts.policy`` names."""

    build: Callable
    needs_policy: bool = True


_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, build: Callable, needs_policy: bool = True) -> None:
    """Make ``name`` a backend of ``BackendOptions`` and ``build_generator``:
    ``build(opts, seed=..., **context)`` gets the options, the sampling seed and whatever
    context the caller of ``build_generator`` passes on (a simulated policy's world, say)."""
    _BACKENDS[name] = Backend(build, needs_policy)


def backend_names() -> tuple[str, ...]:
    """The registered backends, the library's first."""
    return tuple(_BACKENDS)


# Settings of how generation runs (where, and how fast), not of what it produces: left out of
# the settings a resumed output is checked against. The server list is one of them: the served
# model (--policy) is recorded and compared, so a resume may reach other replicas of it (the
# per-request seeds draw the same on any), and a password in a URL is never written down.
RUNTIME_SETTINGS = frozenset(
    {
        "base_url",
        "api_key_env",
        "concurrency",
        "request_timeout",
        "max_retries",
        "gen_batch_size",
        "gen_max_batch_tokens",
    }
)


BACKEND_HELP = (
    "transformers (local model), openai (an OpenAI-compatible server: vLLM serve, SGLang, TGI, llama.cpp) or vllm "
    "(offline engine, GPU)"
)
"""The help of ``--backend`` for the library's backends (a layer that registers more says so in its own)."""


ENDPOINTS = ("chat", "completions")
"""--endpoint: the OpenAI-compatible server's /chat/completions or /completions."""


@dataclass
class BackendOptions:
    backend: str = _f("transformers", BACKEND_HELP)
    policy: str = _f("", "transformers/vllm: the policy model directory or hub id; openai: the served model name")
    base_url: str = _f(
        "http://127.0.0.1:8000/v1",
        "openai: the server's base URL; several servers of one model (replicas): their URLs separated by commas, or "
        "the flag repeated. Calls go to the least busy, a failed call to another, and a server that keeps failing "
        "is set aside for a while; the servers are not part of the settings a resumed --out must match",
        joined=",",
    )
    endpoint: str = _f(
        "chat",
        "openai: chat (/chat/completions; prefill through continue_final_message) or completions (/completions with "
        "a rendered prompt)",
        choices=ENDPOINTS,
    )
    api_key_env: str | None = _f(
        None,
        "openai: the NAME of an environment variable holding the API key, sent as 'Authorization: Bearer' "
        "(e.g. --api-key-env OPENAI_API_KEY); without it no key is sent",
    )
    concurrency: int = _f(16, "openai: requests in flight at once (on each --base-url server)")
    request_timeout: float = _f(
        120.0, "openai: seconds one call may take in all (connecting, sending and reading the whole answer)"
    )
    max_retries: int = _f(
        4,
        "openai: retries after a failed or timed-out call (exponential backoff); with several --base-url servers, "
        "rounds over all of them",
    )
    gen_batch_size: int = _f(8, "transformers: sequences per generate call")
    gen_max_batch_tokens: int = _f(
        16384,
        "transformers: tokens per generate call at most (sequences x (longest prompt + --max-new-tokens)); long "
        "prompts make smaller batches instead of running out of memory",
    )
    split: str = _f(
        "blank-line",
        "how generated text is cut into steps: blank-line, tags (<step>/<answer>) or regex",
        choices=SPLITS,
    )
    split_regex: str | None = _f(None, "with --split regex: the pattern between two steps")
    continuation: str = _f(
        "prefill",
        "continue kept steps by prefilling the assistant turn (prefill) or by restating them in a new prompt "
        "(restate)",
        choices=CONTINUATIONS,
    )
    instruction: str = _f(
        TextFormat.instruction, "text after the question in the user turn (ask for the step layout --split expects)"
    )
    temperature: float = _f(0.7, "sampling temperature")
    top_p: float = _f(0.9, "nucleus sampling")
    top_k: int = _f(30, "top-k sampling (0: off)")
    max_new_tokens: int = _f(2048, "generated tokens per completion at most")

    def backend_problems(self) -> list[str]:
        """What is wrong with these options, as flag-named messages (nothing: an empty list)."""
        bad = []
        if self.backend not in _BACKENDS:
            bad.append(f"--backend must be one of {', '.join(backend_names())}, got {self.backend!r}")
        elif _BACKENDS[self.backend].needs_policy and not self.policy:
            bad.append(f"--backend {self.backend} needs --policy (the model to generate with)")
        if not (math.isfinite(self.request_timeout) and self.request_timeout > 0):
            bad.append(f"--request-timeout must be a number of seconds > 0, got {self.request_timeout}")
        # Checked here, at the start, for every backend (generation.text.Sampling checks them
        # again, but only once a model backend builds its generator).
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            bad.append(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            bad.append(f"--top-p must be a probability in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1:
            bad.append(
                f"--top-k must be >= 0 (0: off) and --max-new-tokens >= 1, got {self.top_k} and {self.max_new_tokens}"
            )
        if self.gen_batch_size < 1 or self.gen_max_batch_tokens < 1:
            bad.append(
                f"--gen-batch-size and --gen-max-batch-tokens must be >= 1, got {self.gen_batch_size} and "
                f"{self.gen_max_batch_tokens}"
            )
        if self.endpoint not in ENDPOINTS:
            bad.append(f"--endpoint must be {' or '.join(ENDPOINTS)}, got {self.endpoint!r}")
        if self.api_key_env and self.backend != "openai":
            bad.append(
                "--api-key-env is for --backend openai (the only backend that talks HTTP), got --backend "
                f"{self.backend}"
            )
        elif self.api_key_env:
            bad += api_key_problems(self.api_key_env)
        return bad


def api_key_problems(env_name: str | None, flag: str = "--api-key-env") -> list[str]:
    """What is wrong with ``flag env_name`` (nothing when no name is given)."""
    if env_name and not os.environ.get(env_name, "").strip():
        return [
            f"{flag} {env_name}: the environment variable {env_name} is unset or empty; "
            f"set it to the API key (export {env_name}=...) or leave out {flag} to send no key"
        ]
    return []


def read_api_key(env_name: str | None, flag: str = "--api-key-env") -> str | None:
    """The API key held in environment variable ``env_name``; None when no name is given.
    A key is only ever read from a variable the user named: nothing is sent implicitly."""
    if not env_name:
        return None
    bad = api_key_problems(env_name, flag)
    if bad:
        raise BetaPRMInputError(bad[0])
    return os.environ[env_name].strip()


def build_generator(opts: BackendOptions, seed: int = 0, **context):
    """The generator ``opts.backend`` names, sampling from ``seed``; ``context`` goes to a
    registered backend's builder (the library's own take none)."""
    if opts.backend not in _BACKENDS:
        raise BetaPRMInputError(f"--backend must be one of {', '.join(backend_names())}, got {opts.backend!r}")
    return _BACKENDS[opts.backend].build(opts, seed=seed, **context)


def _text_format(opts: BackendOptions) -> tuple[TextFormat, Sampling]:
    fmt = TextFormat(
        split=opts.split, split_regex=opts.split_regex, continuation=opts.continuation, instruction=opts.instruction
    )
    sampling = Sampling(
        temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k, max_new_tokens=opts.max_new_tokens
    )
    return fmt, sampling


def _transformers(opts: BackendOptions, seed: int = 0):
    from .hf import TransformersGenerator  # imports torch: this module stays torch-free for the CLI's --help

    return TransformersGenerator.from_pretrained(
        opts.policy,
        *_text_format(opts),
        batch_size=opts.gen_batch_size,
        seed=seed,
        max_batch_tokens=opts.gen_max_batch_tokens,
    )


def _openai(opts: BackendOptions, seed: int = 0):
    return OpenAIGenerator(
        opts.base_url,
        opts.policy,
        *_text_format(opts),
        endpoint=opts.endpoint,
        api_key=read_api_key(opts.api_key_env),
        concurrency=opts.concurrency,
        timeout=opts.request_timeout,
        max_retries=opts.max_retries,
    )


def _vllm(opts: BackendOptions, seed: int = 0):
    return VLLMGenerator(opts.policy, *_text_format(opts), seed=seed)


register_backend("transformers", _transformers)
register_backend("openai", _openai)
register_backend("vllm", _vllm)
