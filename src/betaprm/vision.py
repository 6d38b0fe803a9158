"""Vision-language backbones (transformers-native Qwen2.5-VL, InternVL, ...).

A vision-language BetaPRM is the same model as a text one: the marker, the Yes/No rows of
the LM head and the kappa head all sit on the language model; the processor turns a
trace's images into ``pixel_values`` (and ``image_grid_thw`` for Qwen2-VL models) and
expands the image placeholder written before the question into the image tokens. Only
the processor's image processor and the tokenizer are saved (the video processor is not
used).

Without torchvision, transformers cannot import its video processors, and
``ProcessorMixin``'s argument check of the (unused) video processor then fails
(``VIDEO_PROCESSOR_MAPPING`` has no ``_extra_content``). ``build_processor`` lets a
missing video processor through that check; this is the only place the workaround lives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from .batching import autocast, split_by_trace
from .errors import BetaPRMInputError
from .formatting import check_markers, format_trace

VISION_PREFIXES = ("visual.", "vision_tower.", "vision_model.")  # the vision encoders
PROCESSOR_SETTINGS = ("image_seq_length",)  # processor attributes that are not its parts
PROJECTOR_PARTS = ("merger.", "multi_modal_projector.", "mlp1.")  # trained with the LM


def is_vision_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def _allow_missing_video_processor() -> None:
    from transformers import processing_utils

    mixin = processing_utils.ProcessorMixin
    if getattr(mixin.check_argument_for_proper_class, "_betaprm", False):
        return
    original = mixin.check_argument_for_proper_class

    def check(self, argument_name, argument):
        if argument is None and "video" in argument_name:
            return None  # no video processor: betaprm feeds images only
        return original(self, argument_name, argument)

    check._betaprm = True
    mixin.check_argument_for_proper_class = check


def build_processor(processor_class: str, image_processor, tokenizer, **kwargs):
    """``processor_class`` (a transformers name, e.g. Qwen2_5_VLProcessor) from its parts."""
    import transformers

    cls = getattr(transformers, processor_class, None)
    if cls is None:
        raise BetaPRMInputError(f"transformers has no processor class {processor_class!r}")
    _allow_missing_video_processor()
    return cls(image_processor=image_processor, tokenizer=tokenizer, video_processor=None, **kwargs)


def load_processor(path, tokenizer, processor_class: str | None = None, processor_kwargs: dict | None = None):
    """The processor of a checkpoint directory: its image processor
    (``preprocessor_config.json``; transformers falls back to the PIL version without
    torchvision), ``tokenizer``, and the processor class named there or given."""
    from transformers import AutoImageProcessor

    path = Path(path)
    pre = path / "preprocessor_config.json"
    if not pre.is_file():
        raise BetaPRMInputError(
            f"{path}: a vision-language checkpoint needs preprocessor_config.json (its image processor settings)"
        )
    raw = json.loads(pre.read_text())
    processor_class = processor_class or raw.get("processor_class")
    if not processor_class and (path / "processor_config.json").is_file():
        processor_class = json.loads((path / "processor_config.json").read_text()).get("processor_class")
    if not processor_class:
        raise BetaPRMInputError(f"{pre}: no processor_class; pass processor= to BetaPRM.from_backbone")
    kwargs = dict(processor_kwargs or {})
    if not kwargs and (path / "processor_config.json").is_file():  # a checkpoint's own settings
        saved = json.loads((path / "processor_config.json").read_text())
        kwargs = {k: saved[k] for k in PROCESSOR_SETTINGS if k in saved}
    return build_processor(processor_class, AutoImageProcessor.from_pretrained(path), tokenizer, **kwargs)


def processor_kwargs(processor) -> dict:
    """Settings of the processor itself that must survive save/load."""
    return {k: getattr(processor, k) for k in PROCESSOR_SETTINGS if hasattr(processor, k)}


def image_placeholder(processor) -> str:
    """The text standing for one image before the processor expands it."""
    tok = processor.tokenizer
    vocab = tok.get_vocab()
    if "<|vision_start|>" in vocab and "<|vision_end|>" in vocab:  # Qwen2-VL family
        return f"<|vision_start|>{processor.image_token}<|vision_end|>"
    return processor.image_token


def load_images(paths: Sequence[str]):
    from PIL import Image

    out = []
    for p in paths:
        if hasattr(p, "convert"):  # an image already decoded (the reward server's data URLs)
            out.append(p.convert("RGB"))
            continue
        try:
            with Image.open(p) as im:
                out.append(im.convert("RGB"))
        except (OSError, ValueError) as e:
            raise BetaPRMInputError(f"cannot read image {p}: {e}") from None
    return out


def encode_multimodal(prm, traces: Sequence[tuple], images=None) -> dict:
    """Processor inputs for ``(question, steps[, image paths])`` traces, one batch:
    ``input_ids``, ``attention_mask`` (right padding), ``pixel_values`` and, for Qwen2-VL
    models, ``image_grid_thw``. Every trace is checked to hold one marker run per step."""
    proc = prm.processor
    fmt = prm.config.trace_format
    ph = image_placeholder(proc)
    texts, flat = [], []
    for tr in traces:
        q, steps = tr[0], tr[1]
        paths = list(tr[2]) if len(tr) > 2 and tr[2] else []
        # At the template's {images} field, or before the question.
        placeholders = ph * len(paths) + ("\n" if paths else "")
        texts.append(format_trace(q, steps, fmt, prm.tokenizer, images=placeholders))
        flat.extend(paths)
    proc.tokenizer.padding_side = "right"
    enc = proc(text=texts, images=load_images(flat) if flat else None, return_tensors="pt", padding=True)
    check_markers(enc["input_ids"].tolist(), traces, prm.config.marker_id, fmt)
    return dict(enc)


def freeze_vision(backbone, train_vision: bool = False) -> int:
    """Freeze the vision encoder (the projector and language model keep training) unless
    ``train_vision``; returns the number of frozen parameter tensors."""
    if train_vision:
        return 0
    n = 0
    for name, p in backbone.named_parameters():
        inner = name.split("model.", 1)[-1] if name.startswith("model.") else name
        if inner.startswith(VISION_PREFIXES) and not any(part in inner for part in PROJECTOR_PARTS):
            p.requires_grad_(False)
            n += 1
    return n


def score_multimodal(prm, traces: Sequence[tuple], batch_size: int = 8, progress=None):
    """``StepScores`` for ``(question, steps, image paths)`` traces, in order.

    Batches hold ``batch_size`` traces: an image's token count is only known after the
    processor has run, so vision-language scoring is not packed by tokens."""
    out: list = []
    was = prm.training
    prm.eval()
    try:
        for b in range(0, len(traces), batch_size):
            chunk = traces[b : b + batch_size]
            enc = {k: v.to(prm.device) for k, v in encode_multimodal(prm, chunk).items()}
            with torch.inference_mode(), autocast(prm.device):
                res = prm(**enc)
                out.extend(split_by_trace(res, len(chunk)))
            if progress is not None:
                progress(len(chunk))
    finally:
        prm.train(was)
    return out
