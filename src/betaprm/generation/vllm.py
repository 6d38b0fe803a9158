"""vLLM's offline engine (``vllm.LLM``), imported only when this backend is built."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import BetaPRMInputError
from .base import Completion, GenerationError, GenerationRequest
from .text import Sampling, TextFormat


def _require_vllm():
    try:
        import vllm
    except ImportError:
        raise GenerationError(
            "the vllm backend needs the vllm package, which is not installed here "
            "(pip install vllm, on a machine with an NVIDIA GPU). Without it, use --backend openai "
            "against a running server or --backend transformers."
        ) from None
    import torch

    if not torch.cuda.is_available():
        raise GenerationError(
            "the vllm backend needs a CUDA GPU and none is visible (torch.cuda.is_available() is False); use "
            "--backend transformers on CPU"
        )
    return vllm


class VLLMGenerator:
    """Prompts are rendered with the model's own chat template (prefill or restate, as
    ``fmt`` says) and generated in one ``LLM.generate`` call; each request's ``n``
    completions come from one ``SamplingParams(n=...)``. ``n_tokens`` is the length of
    each output's ``token_ids``."""

    takes_images = False  # text prompts only: problems with images are refused before generation

    def __init__(
        self,
        model: str,
        fmt: TextFormat | None = None,
        sampling: Sampling | None = None,
        seed: int = 0,
        **engine_kwargs,
    ):
        vllm = _require_vllm()
        self.fmt = fmt or TextFormat()
        self.sampling = sampling or Sampling()
        self.seed = seed
        self._vllm = vllm
        self.llm = vllm.LLM(model=model, seed=seed, **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if any(r.images for r in requests):
            raise BetaPRMInputError(
                "--backend vllm (in process) generates from text only here; for problems with images run `vllm "
                "serve` with the vision-language policy and use --backend openai"
            )
        s = self.sampling
        params = [
            self._vllm.SamplingParams(
                n=r.n,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k if s.top_k > 0 else -1,
                max_tokens=s.max_new_tokens,
                seed=r.seed,
                stop=[self.fmt.step_stop()] if self._one_step(r) else None,
            )
            for r in requests
        ]
        prompts = [self.fmt.prompt_text(r.question, list(r.prefix), self.tokenizer) for r in requests]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            [
                Completion(
                    self.fmt.split_steps(o.text),
                    len(o.token_ids),
                    # One step asked: vLLM names the stop string it met, None at the end of text.
                    finished=(o.stop_reason is None and o.finish_reason == "stop") if self._one_step(r) else None,
                )
                for o in ro.outputs
            ]
            for r, ro in zip(requests, outs)
        ]

    def _one_step(self, r: GenerationRequest) -> bool:
        return r.max_steps == 1 and self.fmt.step_stop() is not None
