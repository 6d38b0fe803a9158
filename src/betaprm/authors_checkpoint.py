"""A checkpoint saved by the paper authors' code -> a BetaPRM folder.

The authors (github.com/JinYuanLi0012/Beta-Binomial-PRM, MIT) train an InternVL chat model,
their ``InternVLChatModel``: ``vision_model.*`` (InternViT), ``mlp1.*`` (the projector),
``language_model.*`` (a causal LM) and ``kappa_head.*`` (``LayerNorm -> Linear``), saved by
the Hugging Face Trainer with ``config.json`` (``model_type: internvl_chat``), safetensors and
the tokenizer that holds ``<prm>``. ``convert_authors_checkpoint`` writes the same model as a
BetaPRM folder that ``BetaPRM.from_pretrained`` loads without remote code:

- the backbone as transformers' own ``InternVLForConditionalGeneration``, its weights renamed
  by the table of transformers' InternVL conversion script (``convert_internvl_weights_to_hf.py``,
  which the transformers wheel does not ship: the table is restated below, and a strict load
  into the model checks that every weight found its place);
- the kappa head as ``layernorm-linear`` with their weights (kept in float32);
- the tokenizer, with the image tokens transformers' InternVL processor names, and an image
  processor with the checkpoint's tile settings (448-pixel tiles, 1-6 of them, ImageNet mean
  and std, as their scoring scripts use);
- ``betaprm_config.json`` with their marker, ``Yes``/``No``, ``kappa_min`` and a trace template
  that gives the token ids their scoring gives.

Their scoring (eval/prm/evaluate_*_beta_binomial.py, aca/prm_infer_v1.py) writes a trace as
``Question: {question}\\nProcess: {step 1}<prm>{step 2}<prm>...``, puts it in the assistant
message after an empty user message of the checkpoint's conversation template (InternVL's
``internvl2_5`` or ``Hermes-2``, with the template's own system message; an empty message
writes only its role), opens the assistant message with ``<image>\\n`` when there is an image,
and tokenises the whole text with the tokenizer's default special tokens. ``mu`` is the
softmax over the ``Yes``/``No`` logits at each ``<prm>``; ``kappa = softplus(head(h)) + 1e-3``
on the last hidden state (after the final norm), the ``kappa_min`` fixed in their model class.

Language models: Qwen2, Llama and InternLM2 (the language model of InternVL2/2.5 at 2B, 8B,
20B and 26B, the paper's InternVL2.5-8B among them). InternLM2 becomes transformers' Llama, as
transformers' script and InternLM's ``tools/convert2llama.py`` convert it: the names of
``_INTERNLM2_RENAMES``, the fused ``wqkv`` cut per key-value head (``split_wqkv``), ``output``
as ``lm_head``, ``bias`` (InternLM2's default True) as ``attention_bias`` with the biases cut
the same way, ``rms_norm_eps``, ``rope_theta`` and ``rope_scaling`` (dynamic NTK, which equals
InternLM2's within ``max_position_embeddings``; beyond it InternLM2 keeps its grown cache and
the two differ slightly). Its tokenizer, a remote-code class over a sentencepiece model, is
rebuilt without sentencepiece by ``spm_tokenizer.spm_bpe_tokenizer``, which refuses any
``tokenizer.model`` whose encoding it does not reproduce exactly. Tested on hand-made models in
InternLM2's layout (and, outside the test suite, against the real slow tokenizer on models
trained by sentencepiece); the real InternLM2 ``tokenizer.model`` was not available, so the
first real checkpoint should be checked: its ids against the authors' tokenizer
(``AutoTokenizer.from_pretrained(ckpt, trust_remote_code=True, use_fast=False)``) on their
training file's prompts.

Over 400 lines because reading their folder (config, shards, tokenizer), each problem with its
own message, the renaming and the writing are one conversion, tested as one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from .data.jsonl import BadJSON, load_json_file
from .errors import BetaPRMInputError
from .formatting import TraceFormat
from .provenance import check_paths
from .spm_tokenizer import spm_bpe_tokenizer

__all__ = ["AUTHORS_TEMPLATES", "authors_trace_template", "convert_authors_checkpoint"]

LANGUAGE_MODELS = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama", "InternLM2ForCausalLM": "llama"}
"""The authors' ``llm_config.architectures[0]`` values converted, and the transformers model type
(InternLM2 becomes Llama: ``_INTERNLM2_RENAMES``, ``split_wqkv``, ``_internlm2_values``)."""

_INTERNLM2 = "InternLM2ForCausalLM"

_REFUSED_LANGUAGE_MODELS = {
    "Phi3ForCausalLM": "transformers' InternVL model has no Phi-3 language model",
}

AUTHORS_TEMPLATES = {
    "internvl2_5": (
        "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。",
        "<|im_end|>\n",
    ),
    "Hermes-2": (
        "你是由上海人工智能实验室联合商汤科技开发的书生多模态大模型，英文名叫InternVL, 是一个有用无害的人工智能助手。",
        "<|im_end|>",
    ),
    "internlm2-chat": (
        "你是由上海人工智能实验室联合商汤科技开发的书生多模态大模型，英文名叫InternVL, 是一个有用无害的人工智能助手。",
        "<|im_end|>",
    ),
}
"""InternVL's ChatML-style conversation templates (name -> default system message, separator),
as their PRM scoring fills them: system, then each message as role + text + separator."""

IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
"""The tokens transformers' InternVLProcessor reads from the tokenizer by these names."""

# The image settings of their scoring scripts: ImageNet mean and std, dynamic tiles.
_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]

# Their weight names -> transformers' InternVLForConditionalGeneration's: the table of
# transformers' convert_internvl_weights_to_hf.py (vision encoder, projector, language model),
# with the "model." prefixes transformers 5 puts before them. Applied in order to each name.
_RENAMES = [
    (r"^vision_model\.", "model.vision_tower."),
    (r"^(model\.vision_tower\.encoder)\.layers\.", r"\1.layer."),
    (r"\.embeddings\.class_embedding$", ".embeddings.cls_token"),
    (r"\.embeddings\.position_embedding$", ".embeddings.position_embeddings"),
    (r"\.embeddings\.patch_embedding\.", ".embeddings.patch_embeddings.projection."),
    (r"^(model\.vision_tower\..*)\.ls(\d)$", r"\1.lambda_\2"),
    (r"^(model\.vision_tower\..*)\.attn\.proj\.", r"\1.attention.projection_layer."),
    (r"^(model\.vision_tower\..*)\.attn\.", r"\1.attention."),
    (r"^(model\.vision_tower\..*)\.norm1\.", r"\1.layernorm_before."),
    (r"^(model\.vision_tower\..*)\.norm2\.", r"\1.layernorm_after."),
    (r"^mlp1\.0\.", "model.multi_modal_projector.layer_norm."),
    (r"^mlp1\.1\.", "model.multi_modal_projector.linear_1."),
    (r"^mlp1\.3\.", "model.multi_modal_projector.linear_2."),
    (r"^language_model\.model\.", "model.language_model."),
    (r"^language_model\.lm_head\.", "lm_head."),
]
# InternLM2's names -> Llama's (InternVL's internlm2/modeling_internlm2.py; the table of
# transformers' conversion script and of InternLM's tools/convert2llama.py), after _RENAMES.
_INTERNLM2_RENAMES = [
    (r"^model\.language_model\.tok_embeddings\.", "model.language_model.embed_tokens."),
    (r"^(model\.language_model\.layers\.\d+)\.attention\.wo\.", r"\1.self_attn.o_proj."),
    (r"^(model\.language_model\.layers\.\d+)\.feed_forward\.w1\.", r"\1.mlp.gate_proj."),
    (r"^(model\.language_model\.layers\.\d+)\.feed_forward\.w3\.", r"\1.mlp.up_proj."),
    (r"^(model\.language_model\.layers\.\d+)\.feed_forward\.w2\.", r"\1.mlp.down_proj."),
    (r"^(model\.language_model\.layers\.\d+)\.attention_norm\.", r"\1.input_layernorm."),
    (r"^(model\.language_model\.layers\.\d+)\.ffn_norm\.", r"\1.post_attention_layernorm."),
    (r"^language_model\.output\.", "lm_head."),
]
_HEAD_PREFIX = "kappa_head."


def authors_trace_template(template_name: str) -> str:
    """The ``TraceFormat`` template that writes a trace as their PRM scoring does with the
    conversation template ``template_name`` (``AUTHORS_TEMPLATES``)."""
    if template_name not in AUTHORS_TEMPLATES:
        raise BetaPRMInputError(
            f"unknown conversation template {template_name!r}; known: {', '.join(AUTHORS_TEMPLATES)}"
        )
    system, sep = AUTHORS_TEMPLATES[template_name]
    head = f"<|im_start|>system\n{system}{sep}<|im_start|>user\n<|im_start|>assistant\n"
    return _literal(head) + "{images}Question: {question}\nProcess: {process}" + _literal(sep)


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def rename_weight(name: str, internlm2: bool = False) -> str:
    """One of their backbone weight names as transformers' InternVL model names it (``attn.qkv``
    and InternLM2's ``attention.wqkv`` stay fused: ``split_weights`` splits them); ``internlm2``:
    the language model is InternLM2, named as Llama."""
    for pattern, replacement in _RENAMES + (_INTERNLM2_RENAMES if internlm2 else []):
        name = re.sub(pattern, replacement, name)
    return name


def split_wqkv(tensor, heads: int, kv_heads: int, where: str) -> tuple:
    """InternLM2's fused ``wqkv`` weight (or bias) -> Llama's (q, k, v). Its rows are grouped by
    key-value head: for each, its ``heads / kv_heads`` query heads, then its key head, then its
    value head, ``head_dim`` rows each; query head ``h * g + j`` belongs to key-value head ``h``,
    as in Llama's ``repeat_kv``."""
    g = heads // kv_heads
    rows = tensor.shape[0]
    if rows % (kv_heads * (g + 2)):
        raise BetaPRMInputError(
            f"{where}: {rows} rows, not a multiple of {kv_heads} key-value heads x ({g} query + 2) heads; the weights "
            "do not fit llm_config's num_attention_heads and num_key_value_heads"
        )
    rest = tuple(tensor.shape[1:])
    t = tensor.reshape(kv_heads, g + 2, rows // (kv_heads * (g + 2)), *rest)
    return (
        t[:, :g].reshape(-1, *rest).contiguous(),
        t[:, g].reshape(-1, *rest).contiguous(),
        t[:, g + 1].reshape(-1, *rest).contiguous(),
    )


def split_weights(state: dict, where: Path, llm: dict | None = None) -> tuple[dict, dict]:
    """Their state dict -> (the backbone's, in transformers' names; the kappa head's, without
    its prefix). Their vision attention's fused ``qkv`` is cut into thirds (query, key, value);
    with an InternLM2 ``llm`` (their ``llm_config``), its ``wqkv`` by ``split_wqkv``."""
    internlm2 = bool(llm) and (llm.get("architectures") or [""])[0] == _INTERNLM2
    if internlm2:
        heads = int(llm["num_attention_heads"])
        kv_heads = int(llm.get("num_key_value_heads") or heads)
    backbone, head, unknown = {}, {}, []
    for name, tensor in state.items():
        if name.startswith(_HEAD_PREFIX):
            head[name[len(_HEAD_PREFIX) :]] = tensor
            continue
        if not name.startswith(("vision_model.", "mlp1.", "language_model.")):
            unknown.append(name)
            continue
        new = rename_weight(name, internlm2)
        if ".attention.qkv." in new:
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0)):
                backbone[new.replace(".attention.qkv.", f".attention.{part}.")] = chunk.contiguous()
        elif internlm2 and ".attention.wqkv." in new:
            parts = split_wqkv(tensor, heads, kv_heads, f"{where}: {name}")
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), parts):
                backbone[new.replace(".attention.wqkv.", f".self_attn.{part}.")] = chunk
        else:
            backbone[new] = tensor
    if unknown:
        raise BetaPRMInputError(
            f"{where}: weights outside vision_model, mlp1, language_model and kappa_head: {_some(unknown)}; this is "
            "not a checkpoint of the authors' InternVL PRM (LoRA weights must be merged first)"
        )
    if sorted(head) != ["0.bias", "0.weight", "1.bias", "1.weight"]:
        raise BetaPRMInputError(
            f"{where}: the kappa head's weights are {sorted(head) or 'missing'}, not LayerNorm (kappa_head.0.*) and "
            "Linear (kappa_head.1.*): not a checkpoint of the authors' Beta-Binomial PRM"
        )
    return backbone, head


def _some(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


# ---------------------------------------------------------------------------- the files


def _check_folders(src: Path, out: Path) -> None:
    if not src.is_dir():
        what = "is not a folder" if src.exists() else "does not exist"
        raise BetaPRMInputError(f"--input {src}: {what}; give the checkpoint folder the authors' training saved")
    s, o = src.resolve(), out.resolve()
    if o == s or s in o.parents:
        raise BetaPRMInputError(
            f"--output {out}: is inside the input folder {src}; writing there would change the input; fix: give "
            "--output a folder outside it"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BetaPRMInputError(f"--output {out}: exists and is not an empty folder; give a new or empty folder")
    check_paths(inputs=[("--input", src)], folders=[("--output", out)])  # a folder that can be made and written


def _weight_files(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise BetaPRMInputError(f"{index}: no weight_map; the checkpoint is damaged")
        files = [src / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise BetaPRMInputError(f"{src}: missing weight files {_some(missing)} named in {index.name}")
        return files
    if (src / "model.safetensors").is_file():
        return [src / "model.safetensors"]
    pickles = sorted(p.name for p in src.glob("pytorch_model*.bin"))
    if pickles:
        raise BetaPRMInputError(
            f"{src}: the weights are pickle files ({_some(pickles)}), which betaprm does not load; save them as "
            "safetensors first (model.save_pretrained(..., safe_serialization=True) in the authors' environment)"
        )
    raise BetaPRMInputError(f"{src}: missing model.safetensors (or model.safetensors.index.json and its shards)")


def _check_tokenizer_files(src: Path, arch: str) -> None:
    if not (src / "tokenizer_config.json").is_file():
        raise BetaPRMInputError(f"{src}: missing tokenizer_config.json (the tokenizer saved with the model)")
    if arch == _INTERNLM2 and not (src / "tokenizer.model").is_file():
        raise BetaPRMInputError(
            f"{src}: missing tokenizer.model, the sentencepiece model of InternLM2's tokenizer (InternLM2Tokenizer "
            "saves it beside tokenizer_config.json); copy it from the checkpoint the training started from"
        )
    if not any((src / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer.model")):
        raise BetaPRMInputError(
            f"{src}: missing the tokenizer's vocabulary (tokenizer.json, or vocab.json and merges.txt, or "
            "tokenizer.model)"
        )


def _json(path: Path) -> dict:
    try:
        data = load_json_file(path, what="a JSON file")
    except BadJSON as e:
        raise BetaPRMInputError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise BetaPRMInputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_authors_config(src: Path) -> dict:
    """Their ``config.json``, checked for what the conversion needs; every problem in one message."""
    cfg_file = src / "config.json"
    if not cfg_file.is_file():
        raise BetaPRMInputError(f"{src}: missing config.json (the InternVLChatModel config their training saved)")
    raw = _json(cfg_file)
    if raw.get("model_type") != "internvl_chat" and "InternVLChatModel" not in (raw.get("architectures") or []):
        raise BetaPRMInputError(
            f"{cfg_file}: model_type {raw.get('model_type')!r}, architectures {raw.get('architectures')!r}: not an "
            "InternVL chat model (model_type internvl_chat) saved by the authors' code"
        )
    problems = []
    llm, vision = raw.get("llm_config"), raw.get("vision_config")
    if not isinstance(llm, dict) or not isinstance(vision, dict):
        raise BetaPRMInputError(f"{cfg_file}: llm_config and vision_config must be objects")
    arch = (llm.get("architectures") or [""])[0]
    if arch in _REFUSED_LANGUAGE_MODELS:
        problems.append(
            f"llm_config.architectures is {arch}, which cannot be converted: {_REFUSED_LANGUAGE_MODELS[arch]} "
            f"(converted: {', '.join(LANGUAGE_MODELS)})"
        )
    elif arch not in LANGUAGE_MODELS:
        problems.append(f"llm_config.architectures is {arch!r}; converted: {', '.join(LANGUAGE_MODELS)}")
    if raw.get("template") not in AUTHORS_TEMPLATES:
        problems.append(f"template is {raw.get('template')!r}; known: {', '.join(AUTHORS_TEMPLATES)}")
    if raw.get("ps_version", "v1") != "v2":
        problems.append(
            f"ps_version is {raw.get('ps_version', 'v1')!r}: transformers' InternVL shuffles pixels as 'v2' (v1 "
            "leaves image features transposed)"
        )
    for lora in ("use_backbone_lora", "use_llm_lora"):
        if raw.get(lora):
            problems.append(f"{lora} is {raw[lora]}: merge the LoRA weights into the model and save it again first")
    if arch == _INTERNLM2:
        problems += _internlm2_problems(llm)
    size = raw.get("force_image_size") or vision.get("image_size")
    if vision.get("image_size") not in (None, size):
        problems.append(
            f"force_image_size {size} differs from vision_config.image_size {vision.get('image_size')}: the position "
            "embeddings are for the latter"
        )
    if problems:
        raise BetaPRMInputError(f"{cfg_file}: " + "; ".join(problems))
    return raw


def _internlm2_problems(llm: dict) -> list[str]:
    """What of an InternLM2 llm_config has no Llama equivalent."""
    problems = []
    scaling = llm.get("rope_scaling")
    if scaling is not None and (
        not isinstance(scaling, dict)
        or scaling.get("type", scaling.get("rope_type")) not in ("dynamic", "linear")
        or not isinstance(scaling.get("factor"), (int, float))
        or isinstance(scaling.get("factor"), bool)
        or not scaling["factor"] >= 1
    ):
        problems.append(
            f"llm_config.rope_scaling is {scaling!r}; InternLM2's are type 'dynamic' or 'linear' with a factor >= 1 "
            "(or null)"
        )
    try:
        hidden, heads = int(llm["hidden_size"]), int(llm["num_attention_heads"])
        kv_heads = int(llm.get("num_key_value_heads") or heads)
    except (KeyError, TypeError, ValueError):
        return [*problems, "llm_config needs hidden_size, num_attention_heads (and num_key_value_heads) as integers"]
    if heads <= 0 or kv_heads <= 0 or hidden % heads or heads % kv_heads:
        problems.append(
            f"llm_config: hidden_size {hidden}, num_attention_heads {heads}, num_key_value_heads {kv_heads} do not "
            "split into whole heads and groups"
        )
    return problems


def _internlm2_values(llm: dict) -> dict:
    """InternLM2's settings that LlamaConfig names otherwise (configuration_internlm2.py):
    ``bias`` (default True) on wqkv and wo is Llama's ``attention_bias``; the head size is
    hidden / heads; the MLP has no bias."""
    values = {"attention_bias": bool(llm.get("bias", True)), "mlp_bias": False}
    values["head_dim"] = int(llm["hidden_size"]) // int(llm["num_attention_heads"])
    scaling = llm.get("rope_scaling")
    if scaling:  # {"type": "dynamic", "factor": 2.0}: the same NTK formula, within max_position_embeddings
        kind = scaling.get("type", scaling.get("rope_type"))
        values["rope_scaling"] = {"rope_type": kind, "factor": float(scaling["factor"])}
    return values


def _text_config(llm: dict):
    import transformers

    arch = llm["architectures"][0]
    cls = getattr(transformers, {"qwen2": "Qwen2Config", "llama": "LlamaConfig"}[LANGUAGE_MODELS[arch]])
    # The architecture's own settings (and the older rope keys transformers still reads);
    # the rest of a transformers 4 config (generation defaults, attention backend, dtype) stays behind.
    keep = {f.name for f in dataclasses.fields(cls)} | {"rope_theta", "rope_scaling", "head_dim"}
    keep -= {"transformers_version", "architectures", "dtype", "output_hidden_states", "return_dict"}
    values = {k: v for k, v in llm.items() if k in keep}
    if arch == _INTERNLM2:
        values.update(_internlm2_values(llm))
    values.update(tie_word_embeddings=False, use_cache=True)
    return cls(**values)


def _vision_config(vision: dict, image_size: int):
    from transformers import InternVLVisionConfig

    # Their InternVisionConfig's names -> transformers' (as transformers' conversion maps them).
    return InternVLVisionConfig(
        hidden_size=vision["hidden_size"],
        num_hidden_layers=vision["num_hidden_layers"],
        num_attention_heads=vision["num_attention_heads"],
        intermediate_size=vision["intermediate_size"],
        hidden_act=vision.get("hidden_act", "gelu"),
        layer_norm_eps=vision.get("layer_norm_eps", 1e-6),
        norm_type=vision.get("norm_type", "rms_norm"),
        attention_bias=vision.get("qkv_bias", False),
        use_qk_norm=vision.get("qk_normalization", True),
        attention_dropout=vision.get("attention_dropout", 0.0),
        projection_dropout=vision.get("dropout", 0.0),
        initializer_range=vision.get("initializer_range", 0.02),
        image_size=image_size,
        patch_size=vision.get("patch_size", 14),
        num_channels=vision.get("num_channels", 3),
        use_absolute_position_embeddings=True,
        use_mean_pooling=True,  # no final norm: their encoder's last hidden state is used as it is
    )


def _load_tokenizer(src: Path, arch: str):
    """Their tokenizer, with the named image tokens the processor reads; returns it and the
    ids of tokens this added (``<video>`` when it has none), which need embedding rows.
    InternLM2's (a remote-code class over a sentencepiece model) is rebuilt as a fast
    tokenizer that gives its ids (``spm_bpe_tokenizer``)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    if arch == _INTERNLM2:
        model_file, config_file = src / "tokenizer.model", src / "tokenizer_config.json"
        tok_config = _json(config_file)
        plain = spm_bpe_tokenizer(model_file, tok_config, config_file)
        tok = spm_bpe_tokenizer(model_file, tok_config, config_file, extra_special_tokens=dict(IMAGE_TOKENS))
        return _check_tokenizer(src, plain, tok)
    # AutoTokenizer also reads config.json, and warns that it does not know internvl_chat.
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        plain = AutoTokenizer.from_pretrained(src)
        tok = AutoTokenizer.from_pretrained(src, extra_special_tokens=dict(IMAGE_TOKENS))
    except (OSError, ValueError) as e:
        raise BetaPRMInputError(
            f"{src}: cannot load the tokenizer without remote code ({e}); the converted model must load with "
            "transformers' own tokenizer classes"
        ) from None
    finally:
        hf_logging.set_verbosity(level)
    return _check_tokenizer(src, plain, tok)


def _check_tokenizer(src: Path, plain, tok):
    """(tok, ids ``tok`` added to the checkpoint's tokens, how many the checkpoint has);
    refuses a tokenizer without their tokens."""
    vocab = plain.get_vocab()
    missing = [t for t in ("<prm>", "<img>", "</img>", "<IMG_CONTEXT>") if t not in vocab]
    if missing:
        raise BetaPRMInputError(
            f"{src}: the tokenizer has no {', '.join(missing)}; the authors' training adds <prm> and the image tokens"
        )
    added = [tok.convert_tokens_to_ids(t) for t in IMAGE_TOKENS.values() if t not in vocab]
    return tok, added, len(plain)


def _image_processor(raw: dict, image_size: int):
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    return GotOcr2ImageProcessorPil(
        size={"height": image_size, "width": image_size},
        crop_to_patches=bool(raw.get("dynamic_image_size", True)),
        min_patches=int(raw.get("min_dynamic_patch", 1)),
        max_patches=int(raw.get("max_dynamic_patch", 6)),
        image_mean=_IMAGENET_MEAN,
        image_std=_IMAGENET_STD,
    )


def convert_authors_checkpoint(src, out, *, kappa_min: float = 1e-3, kappa_init: float = 4.0) -> dict:
    """Convert the authors' checkpoint folder ``src`` into a BetaPRM folder ``out`` (new or
    empty); returns a summary (language model, template, image tokens per tile, weights).

    ``kappa_min``: the floor added to softplus, 1e-3 in their model class (their scoring
    never reads another); ``kappa_init``: only what a re-initialised head would start at."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    from .model import BetaPRM, BetaPRMConfig, LayerNormKappaHead, _single_token_id, init_token_rows
    from .vision import build_processor, processor_kwargs

    src, out = Path(src), Path(out)
    _check_folders(src, out)
    raw = read_authors_config(src)
    files = _weight_files(src)
    arch = raw["llm_config"]["architectures"][0]
    _check_tokenizer_files(src, arch)
    state = {}
    for f in files:
        try:
            state.update(load_file(f))
        except (OSError, SafetensorError) as e:
            raise BetaPRMInputError(f"{f}: cannot read the weights ({e}); the checkpoint is damaged") from None
    backbone_sd, head_sd = split_weights(state, src, raw["llm_config"])
    del state

    llm, vision = raw["llm_config"], raw["vision_config"]
    image_size = int(raw.get("force_image_size") or vision["image_size"])
    patch = int(vision.get("patch_size", 14))
    ratio = float(raw.get("downsample_ratio", 0.5))
    image_seq_length = int((image_size // patch) ** 2 * ratio**2)
    tokenizer, added_ids, known = _load_tokenizer(src, arch)

    config = InternVLConfig(
        text_config=_text_config(llm),
        vision_config=_vision_config(vision, image_size),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=image_seq_length,
        downsample_ratio=ratio,
        vision_feature_layer=int(raw.get("select_layer", -1)),
        vision_feature_select_strategy="default",  # their features drop the class token
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
    )
    dtype = next(iter(backbone_sd.values())).dtype
    config.dtype = dtype
    with torch.device("meta"):
        backbone = InternVLForConditionalGeneration(config)
    try:
        backbone.load_state_dict(backbone_sd, strict=True, assign=True)
    except RuntimeError as e:
        raise BetaPRMInputError(
            f"{src}: the weights do not fit transformers' InternVL model built from config.json: {e}"
        ) from None
    backbone.eval()
    if added_ids:
        init_token_rows(backbone, tokenizer, added_ids, known)

    processor = build_processor(
        "InternVLProcessor", _image_processor(raw, image_size), tokenizer, image_seq_length=image_seq_length
    )
    head = LayerNormKappaHead(config.text_config.hidden_size)
    head.load_state_dict({k: v.float() for k, v in head_sd.items()})
    template = authors_trace_template(raw["template"])
    _ = TraceFormat(template)  # validates it
    marker_id = tokenizer.convert_tokens_to_ids("<prm>")
    # Theirs are the ids of the tokens "Yes" and "No" (convert_tokens_to_ids); betaprm reads the
    # ids the words encode to: they must be the same tokens.
    theirs = tuple(tokenizer.convert_tokens_to_ids(["Yes", "No"]))
    ours = tuple(_single_token_id(tokenizer, w, "reward token") for w in ("Yes", "No"))
    if theirs != ours:
        raise BetaPRMInputError(
            f"{src}: the tokens Yes/No (ids {theirs}, what the authors' scoring reads) are not what the words encode "
            f"to ({ours}); this tokenizer cannot be scored the same way"
        )
    bcfg = BetaPRMConfig(
        marker="<prm>",
        reward_tokens=("Yes", "No"),
        kappa_init=kappa_init,
        kappa_min=kappa_min,
        kappa_head="layernorm-linear",
        template=template,
        marker_id=marker_id,
        reward_token_ids=ours,
        auto_class="AutoModelForImageTextToText",
        processor_class=type(processor).__name__,
        processor_kwargs=processor_kwargs(processor),
        objective="beta-binomial",
    )
    prm = BetaPRM(backbone, tokenizer, bcfg, kappa_head=head, processor=processor)
    prm.save_pretrained(out, card={"name": out.name})
    summary = {
        "language_model": llm["architectures"][0],
        "template": raw["template"],
        "image_tokens_per_tile": image_seq_length,
        "dtype": str(dtype).replace("torch.", ""),
        "parameters": sum(t.numel() for t in backbone_sd.values()),
        "added_tokens": [tokenizer.convert_ids_to_tokens(i) for i in added_ids],
    }
    (out / "converted_from.json").write_text(json.dumps({"source": src.name, **summary}, indent=2) + "\n")
    return summary
