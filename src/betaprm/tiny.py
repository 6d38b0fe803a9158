"""Tiny, locally built models and tokenizers: for tests, benchmarks and the demo.

Nothing here downloads anything. A byte-level BPE tokenizer is trained on the given
texts, and a random-init causal LM is built from a config, so every code path that
real backbones take can run on a laptop CPU in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["tiny_causal_lm", "train_bytelevel_tokenizer"]


def train_bytelevel_tokenizer(texts: Iterable[str], vocab_size: int = 512, extra_tokens=("Yes", "No")):
    """Train a byte-level BPE tokenizer on ``texts``; returns a transformers tokenizer.

    ``extra_tokens`` are added as ordinary (non-special) vocabulary entries so that the
    reward words are single tokens, as they are in real LLM vocabularies.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    if extra_tokens:
        tok.add_tokens(list(extra_tokens))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|pad|>",
    )


def tiny_causal_lm(
    vocab_size: int,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
):
    """A random-init ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` built from a config."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    raise ValueError(f"arch must be 'llama' or 'qwen2', got {arch!r}")
