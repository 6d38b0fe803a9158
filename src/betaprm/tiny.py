"""Tiny, locally built models and tokenizers: for tests, benchmarks and the demo.

Nothing here downloads anything. A byte-level BPE tokenizer is trained on the given
texts, and a random-init causal LM is built from a config, so every code path that
real backbones take can run on a laptop CPU in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

__all__ = ["tiny_causal_lm", "train_bytelevel_tokenizer", "word_tokenizer"]


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


def word_tokenizer(texts: Iterable[str], words: Iterable[str] = (), extra_tokens=("Yes", "No")):
    """A word-level tokenizer: one token per whitespace-separated word of ``texts`` (plus
    ``words``, e.g. every number a world can write, and the reward words), ``<unk>`` for
    anything else. For synthetic languages with a small closed vocabulary, where it makes
    sequences shorter than byte-level BPE and gives every number and operator one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|pad|>", "<unk>"]
    vocab = dict.fromkeys(specials)
    for text in texts:
        vocab.update(dict.fromkeys(text.split()))
    vocab.update(dict.fromkeys(words))
    vocab.update(dict.fromkeys(extra_tokens))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|pad|>",
        unk_token="<unk>",
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


def tiny_vlm(kind: str = "qwen2_5_vl", texts: Iterable[str] = (), seed: int = 0):
    """A random-init vision-language model and its processor, built from configs offline:
    ``qwen2_5_vl`` (Qwen2.5-VL: vision tower with a patch merger, M-RoPE language model)
    or ``internvl`` (InternVL: vision tower, MLP projector, Qwen2 language model). The
    tokenizer is a byte-level BPE trained on ``texts`` with the image tokens added; the
    image processors are the PIL ones (no torchvision needed)."""
    import torch
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from .vision import build_processor

    base = train_bytelevel_tokenizer(
        list(texts) or ["Question: what is 3 + 4 ? Process: 3 + 4 = 7 so the answer is 7"] * 20, vocab_size=320
    )
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    torch.manual_seed(seed)
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
        base.add_tokens([AddedToken(s, special=True, normalized=False) for s in specials], special_tokens=True)
        ids = {s: base.convert_tokens_to_ids(s) for s in specials}
        cfg = Qwen2_5_VLConfig(
            text_config=dict(vocab_size=len(base), rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, **text),
            vision_config=dict(
                depth=2,
                hidden_size=32,
                intermediate_size=64,
                num_heads=2,
                out_hidden_size=64,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                fullatt_block_indexes=[1],
                window_size=56,
            ),
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            bos_token_id=base.bos_token_id,
            eos_token_id=base.eos_token_id,
            pad_token_id=base.pad_token_id,
        )
        model = Qwen2_5_VLForConditionalGeneration(cfg)
        proc = build_processor(
            "Qwen2_5_VLProcessor", Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56), base
        )
        return model.eval(), proc
    if kind == "internvl":
        from transformers import InternVLConfig, InternVLForConditionalGeneration
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

        sp = {
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        }
        base.add_tokens([AddedToken(s, special=True, normalized=False) for s in sp.values()], special_tokens=True)
        tok = PreTrainedTokenizerFast(
            tokenizer_object=base.backend_tokenizer,
            eos_token="<|endoftext|>",
            bos_token="<|endoftext|>",
            pad_token="<|pad|>",
            extra_special_tokens=sp,
        )
        cfg = InternVLConfig(
            text_config=dict(model_type="qwen2", vocab_size=len(tok), **text),
            vision_config=dict(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=64,
                image_size=[28, 28],
                patch_size=[14, 14],
            ),
            image_token_id=tok.context_image_token_id,
            downsample_ratio=0.5,
        )
        model = InternVLForConditionalGeneration(cfg)
        # image_seq_length = (28 / 14)^2 * 0.5^2 tokens per 28x28 tile
        proc = build_processor(
            "InternVLProcessor",
            GotOcr2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=False),
            tok,
            image_seq_length=1,
        )
        return model.eval(), proc
    raise ValueError(f"kind must be qwen2_5_vl or internvl, got {kind!r}")


def save_vlm_dir(model, processor, path) -> None:
    """Write a tiny vision-language model as a checkpoint directory the way real ones
    look: weights, tokenizer, image processor and ``processor_config.json``."""
    from .vision import processor_kwargs

    path = Path(path)
    model.save_pretrained(path)
    processor.tokenizer.save_pretrained(path)
    processor.image_processor.save_pretrained(path)
    (path / "processor_config.json").write_text(
        json.dumps({"processor_class": type(processor).__name__, **processor_kwargs(processor)})
    )
