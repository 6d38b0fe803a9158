"""A checkpoint saved by the paper authors' code, converted by `betaprm convert-model --from
authors`, scores as their code scores it; and the `layernorm-linear` kappa head (theirs) as an
option of betaprm's own models.

Their side is re-implemented here, independently, from reading their code in
github.com/JinYuanLi0012/Beta-Binomial-PRM (MIT); none of it is imported or copied:

- the checkpoint's layout: src/internvl/model/internvl_chat/modeling_internvl_chat_beta_binom.py
  (``InternVLChatModel``: ``vision_model``, ``mlp1`` = LayerNorm, Linear, GELU, Linear,
  ``language_model``, ``kappa_head`` = LayerNorm, Linear) and configuration_internvl_chat.py,
  configuration_intern_vit.py (config.json's fields);
- their forward at scoring time: ``extract_feature`` and ``pixel_shuffle`` (ps_version v2) of
  the same modeling file, ``InternVisionModel`` of modeling_intern_vit.py (embeddings with
  bicubic-resampled position embeddings, pre-norm layers with layer scales ``ls1``/``ls2``,
  fused ``qkv``, no final norm), the image features written over the ``<IMG_CONTEXT>``
  embeddings, the language model's last hidden state;
- their scoring: ``batch_prm_mu_kappa`` of eval/prm/evaluate_mathvista_prm_beta_binomial.py
  (the same in aca/prm_infer_v1.py): the prompt ``Question: ...\\nProcess: s1<prm>s2<prm>`` as
  the assistant message after an empty user message of InternVL's conversation template
  (src/internvl/conversation.py, the MPT separator style: an empty message writes only its
  role), ``<image>\\n`` first when there is an image, replaced by ``<img>`` + ``<IMG_CONTEXT>`` x
  (tokens per tile x tiles) + ``</img>``; mu = softmax over the Yes/No logits at each
  ``<prm>``, kappa = softplus(kappa_head(h)) + 1e-3 on the last hidden state.

The language model on their side is a plain transformers ``Qwen2ForCausalLM`` (or
``LlamaForCausalLM``) holding their
``language_model.*`` weights; the vision tower, projector and kappa head are computed by hand
from their weights.

InternLM2 (the language model of InternVL2.5-8B, the paper's) is re-implemented by hand as well,
from InternVL's github.com/OpenGVLab/InternVL (MIT), none of it imported or copied:

- its forward from internvl_chat/internvl/model/internlm2/modeling_internlm2.py: RMSNorm
  (float32 variance), the fused ``attention.wqkv`` read as (key-value head, its query heads then
  its key then its value, head size), rotary embeddings (``rotate_half``; dynamic NTK scaling
  leaves the base alone within ``max_position_embeddings``), eager attention divided by
  sqrt(head size), ``wo``, the MLP ``w2(silu(w1 x) * w3 x)``, the final norm, ``output``;
- its tokenizer from tokenization_internlm2.py (``InternLM2Tokenizer``) under transformers
  4.48's ``PreTrainedTokenizer.tokenize``: the text cut at every added token, each piece between
  them encoded by sentencepiece (a small sentencepiece-BPE encoder written here from
  sentencepiece's documented BPE: spaces as ``▁``, user-defined pieces kept whole, the adjacent
  pair whose union is the highest-scoring piece merged first, leftmost among equals, characters
  that are no piece as ``<0x..>`` bytes), BOS first. The sentencepiece model is written with
  protobuf, laid out like InternLM2's (byte pieces, merges by score, the placeholder pieces
  ``[UNUSED_TOKEN_141..146]`` last, named by tokenizer_config.json's added_tokens_decoder).
"""

import json
import math
import random
import re
from collections import Counter

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from betaprm.cli import main
from betaprm.model import BetaPRM, KappaHead, LayerNormKappaHead
from betaprm.scoring import score_traces
from betaprm.tiny import train_bytelevel_tokenizer

# InternVL's internvl2_5 conversation template, as their conversation.py registers it.
SYSTEM = "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。"
SEP = "<|im_end|>\n"
THEIR_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>", "<prm>"]
IMAGE, PATCH, VIT, HEADS, VIT_LAYERS = 56, 14, 32, 2, 2
LM_HIDDEN = 64
TOKENS_PER_TILE = (IMAGE // PATCH) ** 2 // 4  # downsample ratio 0.5

TRACES = [
    ("what is 3 + 4 ?", ["3 + 4 = 7", "so the answer is 7"]),
    ("compare 12 and 21 {braces} $x^2$", ["12 < 21", "the first is smaller", "answer 12"]),
]


def _randn(gen, *shape, scale=1.0, shift=0.0):
    return torch.randn(*shape, generator=gen) * scale + shift


def _their_checkpoint(path, seed=0, arch="Qwen2ForCausalLM", bias=False):
    """A checkpoint folder as their training saves it: config.json of InternVLChatModel (a Qwen2,
    Llama or InternLM2 language model, InternViT with qkv bias and layer norms), two safetensors
    shards with an index, and the tokenizer with their added tokens (<prm> last). ``bias``: an
    InternLM2 with biases on wqkv and wo."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    if arch == INTERNLM2:
        tok = _internlm2_tokenizer(path)
        llm, state = _internlm2_lm(gen, len(tok), bias)
    else:
        tok = train_bytelevel_tokenizer(
            ["Question: what is 3 + 4 ? Process: 3 + 4 = 7 so the answer is 7 compare 12 and 21"] * 20, vocab_size=320
        )
        tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
        tok.add_tokens(THEIR_TOKENS, special_tokens=True)  # their finetune script's token_list
        tok.save_pretrained(path)
        config_cls, lm_cls = _language_model(arch)
        llm_cfg = config_cls(
            vocab_size=len(tok),
            hidden_size=LM_HIDDEN,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            architectures=[arch],
        )
        torch.manual_seed(seed)
        lm = lm_cls(llm_cfg)
        state = {f"language_model.{k}": v.clone() for k, v in lm.state_dict().items()}
        llm = llm_cfg.to_dict()
        llm.update(attn_implementation="flash_attention_2", use_cache=False, torch_dtype="bfloat16", num_beams=1)
    v = "vision_model."
    state[v + "embeddings.class_embedding"] = _randn(gen, 1, 1, VIT, scale=0.5)
    state[v + "embeddings.patch_embedding.weight"] = _randn(gen, VIT, 3, PATCH, PATCH, scale=0.05)
    state[v + "embeddings.patch_embedding.bias"] = _randn(gen, VIT, scale=0.1)
    state[v + "embeddings.position_embedding"] = _randn(gen, 1, (IMAGE // PATCH) ** 2 + 1, VIT, scale=0.5)
    for i in range(VIT_LAYERS):
        p = f"{v}encoder.layers.{i}."
        for norm in ("norm1", "norm2"):
            state[p + norm + ".weight"] = _randn(gen, VIT, scale=0.2, shift=1.0)
            state[p + norm + ".bias"] = _randn(gen, VIT, scale=0.1)
        state[p + "ls1"] = _randn(gen, VIT, scale=0.3, shift=0.5)
        state[p + "ls2"] = _randn(gen, VIT, scale=0.3, shift=0.5)
        state[p + "attn.qkv.weight"] = _randn(gen, 3 * VIT, VIT, scale=0.3)
        state[p + "attn.qkv.bias"] = _randn(gen, 3 * VIT, scale=0.2)
        state[p + "attn.proj.weight"] = _randn(gen, VIT, VIT, scale=0.3)
        state[p + "attn.proj.bias"] = _randn(gen, VIT, scale=0.1)
        state[p + "mlp.fc1.weight"] = _randn(gen, 2 * VIT, VIT, scale=0.3)
        state[p + "mlp.fc1.bias"] = _randn(gen, 2 * VIT, scale=0.1)
        state[p + "mlp.fc2.weight"] = _randn(gen, VIT, 2 * VIT, scale=0.3)
        state[p + "mlp.fc2.bias"] = _randn(gen, VIT, scale=0.1)
    state["mlp1.0.weight"] = _randn(gen, 4 * VIT, scale=0.2, shift=1.0)
    state["mlp1.0.bias"] = _randn(gen, 4 * VIT, scale=0.1)
    state["mlp1.1.weight"] = _randn(gen, LM_HIDDEN, 4 * VIT, scale=0.2)
    state["mlp1.1.bias"] = _randn(gen, LM_HIDDEN, scale=0.1)
    state["mlp1.3.weight"] = _randn(gen, LM_HIDDEN, LM_HIDDEN, scale=0.2)
    state["mlp1.3.bias"] = _randn(gen, LM_HIDDEN, scale=0.1)
    # Their kappa head, trained: nothing at its initial values.
    state["kappa_head.0.weight"] = _randn(gen, LM_HIDDEN, scale=0.3, shift=1.0)
    state["kappa_head.0.bias"] = _randn(gen, LM_HIDDEN, scale=0.3)
    state["kappa_head.1.weight"] = _randn(gen, 1, LM_HIDDEN, scale=0.4)
    state["kappa_head.1.bias"] = torch.tensor([0.7])

    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: state[k].contiguous() for k in keys}, path / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {
        "architectures": ["InternVLChatModel"],
        "model_type": "internvl_chat",
        "auto_map": {"AutoModel": "modeling_internvl_chat.InternVLChatModel"},
        "template": "internvl2_5",
        "downsample_ratio": 0.5,
        "force_image_size": IMAGE,
        "select_layer": -1,
        "ps_version": "v2",
        "dynamic_image_size": True,
        "use_thumbnail": True,
        "min_dynamic_patch": 1,
        "max_dynamic_patch": 6,
        "use_backbone_lora": 0,
        "use_llm_lora": 0,
        "pad2square": False,
        "torch_dtype": "float32",
        "llm_config": llm,
        "vision_config": {
            "architectures": ["InternVisionModel"],
            "model_type": "intern_vit_6b",
            "hidden_size": VIT,
            "intermediate_size": 2 * VIT,
            "num_attention_heads": HEADS,
            "num_hidden_layers": VIT_LAYERS,
            "image_size": IMAGE,
            "patch_size": PATCH,
            "num_channels": 3,
            "qkv_bias": True,
            "qk_normalization": False,
            "norm_type": "layer_norm",
            "layer_norm_eps": 1e-6,
            "hidden_act": "gelu",
            "use_flash_attn": True,
            "drop_path_rate": 0.1,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "initializer_factor": 0.1,
        },
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path, state, config, tok


def _language_model(arch):
    import transformers

    return getattr(transformers, arch.replace("ForCausalLM", "Config")), getattr(transformers, arch)


# ------------------------------------------------------------------ their forward, by hand


def _their_vit(state, x):
    """InternVisionModel's last hidden state (tiles, 1 + patches, C)."""
    v = "vision_model."
    e = v + "embeddings."
    x = F.conv2d(x, state[e + "patch_embedding.weight"], state[e + "patch_embedding.bias"], PATCH)
    n, c, h, w = x.shape
    x = torch.cat([state[v + "embeddings.class_embedding"].expand(n, 1, -1), x.flatten(2).transpose(1, 2)], 1)
    pos = state[v + "embeddings.position_embedding"]
    grid = IMAGE // PATCH
    patch_pos = pos[:, 1:].reshape(1, grid, grid, -1).permute(0, 3, 1, 2)
    patch_pos = F.interpolate(patch_pos, size=(h, w), mode="bicubic", align_corners=False)
    x = x + torch.cat([pos[:, :1], patch_pos.reshape(1, -1, h * w).permute(0, 2, 1)], 1)
    d = c // HEADS
    for i in range(VIT_LAYERS):
        p = f"{v}encoder.layers.{i}."
        y = F.layer_norm(x, (c,), state[p + "norm1.weight"], state[p + "norm1.bias"], 1e-6)
        qkv = F.linear(y, state[p + "attn.qkv.weight"], state[p + "attn.qkv.bias"])
        q, k, val = qkv.reshape(n, -1, 3, HEADS, d).permute(2, 0, 3, 1, 4).unbind(0)
        att = ((q * d**-0.5) @ k.transpose(-2, -1)).softmax(-1)
        y = (att @ val).transpose(1, 2).reshape(n, -1, c)
        x = x + F.linear(y, state[p + "attn.proj.weight"], state[p + "attn.proj.bias"]) * state[p + "ls1"]
        y = F.layer_norm(x, (c,), state[p + "norm2.weight"], state[p + "norm2.bias"], 1e-6)
        y = F.gelu(F.linear(y, state[p + "mlp.fc1.weight"], state[p + "mlp.fc1.bias"]))
        y = F.linear(y, state[p + "mlp.fc2.weight"], state[p + "mlp.fc2.bias"])
        x = x + y * state[p + "ls2"]
    return x


def _their_image_features(state, pixel_values):
    """extract_feature: drop the class token, pixel shuffle (v2, scale 0.5), mlp1."""
    x = _their_vit(state, pixel_values)[:, 1:]
    n, t, c = x.shape
    side = int(math.isqrt(t))
    x = x.reshape(n, side, side, c)
    x = x.view(n, side, side // 2, c * 2).permute(0, 2, 1, 3).contiguous()
    x = x.view(n, side // 2, side // 2, c * 4).permute(0, 2, 1, 3).contiguous()
    x = x.reshape(n, -1, c * 4)
    x = F.layer_norm(x, (c * 4,), state["mlp1.0.weight"], state["mlp1.0.bias"], 1e-5)
    x = F.gelu(F.linear(x, state["mlp1.1.weight"], state["mlp1.1.bias"]))
    x = F.linear(x, state["mlp1.3.weight"], state["mlp1.3.bias"])
    return x


def _their_query(question, steps, tiles=0):
    """Their PRM prompt: internvl2_5's system turn, the empty user turn (its role only), the
    trace as the assistant turn, <image> replaced by the image tokens."""
    prompt = f"Question: {question}\nProcess: " + "<prm>".join(steps) + "<prm>"
    if tiles:
        prompt = "<image>\n" + prompt
    query = f"<|im_start|>system\n{SYSTEM}{SEP}<|im_start|>user\n<|im_start|>assistant\n{prompt}{SEP}"
    return query.replace("<image>", "<img>" + "<IMG_CONTEXT>" * TOKENS_PER_TILE * tiles + "</img>", 1)


def _their_scores(state, config, tok, question, steps, pixel_values=None):
    """(input_ids, mu, kappa) as their scoring computes them, in float32."""
    tiles = 0 if pixel_values is None else pixel_values.shape[0]
    ids = tok(_their_query(question, steps, tiles), return_tensors="pt")["input_ids"]
    llm = {k: v for k, v in config["llm_config"].items() if k not in ("attn_implementation", "torch_dtype")}
    internlm2 = llm["architectures"][0] == INTERNLM2
    if not internlm2:
        config_cls, lm_cls = _language_model(llm["architectures"][0])
        lm = lm_cls(config_cls(**llm)).eval()
        prefix = "language_model."
        lm.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    with torch.no_grad():
        if internlm2:
            embeds = state["language_model.model.tok_embeddings.weight"][ids].clone()
        else:
            embeds = lm.get_input_embeddings()(ids).clone()
        if tiles:
            ctx = ids == tok.convert_tokens_to_ids("<IMG_CONTEXT>")
            embeds[ctx] = _their_image_features(state, pixel_values).reshape(-1, LM_HIDDEN)
        # hidden_states[-1] of the transformers they ran (4.37+) is the final norm's output,
        # the base model's last_hidden_state; the logits are the LM head's on it.
        if internlm2:
            h = _their_internlm2(state, llm, embeds)
            logits = F.linear(h, state["language_model.output.weight"])
        else:
            h = lm.model(inputs_embeds=embeds).last_hidden_state
            logits = lm.lm_head(h)
        at = ids == tok.convert_tokens_to_ids("<prm>")
        yes_no = tok.convert_tokens_to_ids(["Yes", "No"])
        mu = torch.softmax(logits[at][:, yes_no], -1)[:, 0]
        hp = F.layer_norm(h[at], (LM_HIDDEN,), state["kappa_head.0.weight"], state["kappa_head.0.bias"], 1e-5)
        kappa = F.softplus(F.linear(hp, state["kappa_head.1.weight"], state["kappa_head.1.bias"]).squeeze(-1)) + 1e-3
    return ids[0].tolist(), mu.numpy(), kappa.numpy()


# ------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("authors")
    src, state, config, tok = _their_checkpoint(root / "theirs")
    out = root / "betaprm"
    assert main(["convert-model", "--from", "authors", "--input", str(src), "--output", str(out)]) == 0
    return src, out, state, config, tok


def test_text_traces_score_as_theirs(converted):
    from betaprm.formatting import encode_traces

    src, out, state, config, tok = converted
    prm = BetaPRM.from_pretrained(out)
    assert prm.config.kappa_head == "layernorm-linear" and isinstance(prm.kappa_head, LayerNormKappaHead)
    assert prm.config.kappa_min == 1e-3 and prm.config.reward_tokens == ("Yes", "No") and prm.is_vision
    ours = score_traces(prm, TRACES)
    for (q, steps), s in zip(TRACES, ours):
        ids, mu, kappa = _their_scores(state, config, tok, q, steps)
        assert encode_traces(prm.tokenizer, prm.config.marker_id, [(q, steps)], prm.config.trace_format)[0] == ids
        assert len(mu) == len(steps) == len(s.mu)
        np.testing.assert_allclose(s.mu, mu, atol=1e-5, rtol=0)
        np.testing.assert_allclose(s.kappa, kappa, atol=1e-5, rtol=1e-5)
        # Their head's weights matter: kappa is neither constant nor at a fresh head's value.
        assert np.ptp(kappa) > 1e-3 and not np.allclose(kappa, prm.config.kappa_init, atol=0.1)


def test_a_llama_language_model_converts(tmp_path):
    src, state, config, tok = _their_checkpoint(tmp_path / "theirs", seed=1, arch="LlamaForCausalLM")
    out = tmp_path / "betaprm"
    assert main(["convert-model", "--from", "authors", "--input", str(src), "--output", str(out)]) == 0
    prm = BetaPRM.from_pretrained(out)
    assert prm.backbone.config.text_config.model_type == "llama"
    for (q, steps), s in zip(TRACES, score_traces(prm, TRACES)):
        _, mu, kappa = _their_scores(state, config, tok, q, steps)
        np.testing.assert_allclose(s.mu, mu, atol=1e-5, rtol=0)
        np.testing.assert_allclose(s.kappa, kappa, atol=1e-5, rtol=1e-5)


def test_image_traces_score_as_theirs(converted, tmp_path):
    from PIL import Image

    from betaprm.vision import encode_multimodal

    src, out, state, config, tok = converted
    rng = np.random.default_rng(0)
    img = tmp_path / "wide.png"
    Image.fromarray((rng.random((60, 130, 3)) * 255).astype("uint8")).save(img)
    prm = BetaPRM.from_pretrained(out)
    q, steps = TRACES[0]
    enc = encode_multimodal(prm, [(q, steps, [str(img)])])
    tiles = enc["pixel_values"].shape[0]
    assert tiles > 2  # several tiles and the thumbnail: the dynamic tiling is exercised
    ids, mu, kappa = _their_scores(state, config, tok, q, steps, pixel_values=enc["pixel_values"])
    assert enc["input_ids"][0].tolist() == ids
    ours = score_traces(prm, [(q, steps, [str(img)])])[0]
    np.testing.assert_allclose(ours.mu, mu, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours.kappa, kappa, atol=1e-5, rtol=1e-5)
    text_only = _their_scores(state, config, tok, q, steps)
    assert np.abs(text_only[1] - mu).max() > 1e-4  # the image really changes the scores


def test_refusals_name_the_problem(converted, tmp_path, capsys):
    src, out, state, config, tok = converted
    inside = src / "converted"
    assert main(["convert-model", "--from", "authors", "--input", str(src), "--output", str(inside)]) == 2
    assert "inside the input folder" in capsys.readouterr().err and not inside.exists()
    assert main(["convert-model", "--from", "authors", "--input", str(src), "--output", str(out)]) == 2
    assert "not an empty folder" in capsys.readouterr().err

    bad = tmp_path / "phi3"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    cfg["llm_config"]["architectures"] = ["Phi3ForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(tmp_path / "o1")]) == 2
    assert "Phi3ForCausalLM, which cannot be converted" in capsys.readouterr().err
    # An InternLM2 checkpoint needs its sentencepiece model (the Qwen2 folder has none).
    cfg["llm_config"]["architectures"] = [INTERNLM2]
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(tmp_path / "o1")]) == 2
    assert "missing tokenizer.model" in capsys.readouterr().err

    (bad / "config.json").unlink()
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(tmp_path / "o2")]) == 2
    assert "missing config.json" in capsys.readouterr().err
    (bad / "config.json").write_text((src / "config.json").read_text())
    (bad / "model-00002-of-00002.safetensors").unlink()
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(tmp_path / "o3")]) == 2
    assert "missing weight files model-00002-of-00002.safetensors" in capsys.readouterr().err


# ------------------------------------------------------------------ InternLM2: their tokenizer and forward, by hand

INTERNLM2 = "InternLM2ForCausalLM"
# InternLM2's chat tokens: added_tokens_decoder names its last six pieces so.
CHAT_TOKENS = ["<|plugin|>", "<|interpreter|>", "<|action_end|>", "<|action_start|>", "<|im_end|>", "<|im_start|>"]
SP_NORMAL, SP_UNKNOWN, SP_CONTROL, SP_USER, SP_BYTE = 1, 2, 3, 4, 6  # sentencepiece_model.proto's piece types
CORPUS = [
    SYSTEM,
    "Question: what is 3 + 4 ?\nProcess: 3 + 4 = 7 so the answer is 7",
    "compare 12 and 21 {braces} $x^2$ 12 < 21 the first is smaller answer 12",
    "system user assistant 用户 助手 数学 答案是 12",
    *(["Yes", "No", "Yes, the step is right.", "No, the step is wrong."] * 8),
]


def _bpe_pieces(corpus, rounds=220):
    """A small sentencepiece-style BPE vocabulary: spaces as ▁, words cut before each ▁, the most
    frequent adjacent pair merged in each round (the first seen among equals); merged pieces,
    then the characters, each scored by its rank (higher first)."""
    words = Counter()
    for line in corpus:
        for w in re.findall(r"▁*[^▁]+|▁+", line.replace(" ", "▁")):
            words[tuple(w)] += 1
    chars = sorted({c for w in words for c in w})
    merged = []
    for _ in range(rounds):
        pairs = Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += n
        if not pairs or max(pairs.values()) < 2:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: kv[1])
        merged.append(a + b)
        new = Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += n
        words = new
    return [p for p in merged if p not in chars] + chars


def _sp_model(path, user_defined=("▁▁▁▁",), **normalizer):
    """tokenizer.model as InternLM2's: <unk> <s> </s>, the 256 byte pieces, BPE pieces scored by
    rank, user-defined pieces, and the six placeholders [UNUSED_TOKEN_141..146] last; identity
    normaliser, no dummy prefix (``normalizer`` overrides its fields). Returns the pieces as
    (text, score, type)."""
    from transformers.convert_slow_tokenizer import import_protobuf

    pb2 = import_protobuf()
    pieces = [("<unk>", 0.0, SP_UNKNOWN), ("<s>", 0.0, SP_CONTROL), ("</s>", 0.0, SP_CONTROL)]
    pieces += [(f"<0x{b:02X}>", 0.0, SP_BYTE) for b in range(256)]
    pieces += [(p, -float(i), SP_NORMAL) for i, p in enumerate(_bpe_pieces(CORPUS))]
    pieces += [(p, 0.0, SP_USER) for p in user_defined]
    pieces += [(f"[UNUSED_TOKEN_{i}]", 0.0, SP_USER) for i in range(141, 147)]
    m = pb2.ModelProto()
    for text, score, kind in pieces:
        m.pieces.add(piece=text, score=score, type=kind)
    m.trainer_spec.model_type = 2  # BPE
    m.trainer_spec.vocab_size = len(pieces)
    m.trainer_spec.byte_fallback = True
    spec = dict(name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False, escape_whitespaces=True)
    spec.update(normalizer)
    for k, v in spec.items():
        setattr(m.normalizer_spec, k, v)
    path.write_bytes(m.SerializeToString())
    return pieces


class TheirInternLM2Tokenizer:
    """InternLM2Tokenizer's ids (tokenization_internlm2.py; transformers 4.48's
    PreTrainedTokenizer.tokenize): the text cut at every added token (the longest at the first
    place one starts), each piece between them encoded by sentencepiece, BOS first."""

    def __init__(self, pieces, added):
        self.pieces = pieces
        self.id = {text: i for i, (text, _, _) in enumerate(pieces)}
        self.score = {text: s for text, s, kind in pieces if kind in (SP_NORMAL, SP_USER)}
        self.user = sorted((t for t, _, kind in pieces if kind == SP_USER), key=len, reverse=True)
        self.added = dict(added)  # content -> id
        self.added_longest_first = sorted(self.added, key=len, reverse=True)

    def __len__(self):
        return max([len(self.pieces) - 1, *self.added.values()]) + 1

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self.added.get(tokens, self.id.get(tokens, 0))
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def sp_encode(self, text):
        """sentencepiece's BPE encoding of one piece of text."""
        text = text.replace(" ", "▁")
        symbols, i = [], 0  # [piece, frozen]
        while i < len(text):
            user = next((u for u in self.user if text.startswith(u, i)), None)
            symbols.append([user or text[i], user is not None])
            i += len(user or text[i])
        while True:
            best = None
            for j in range(len(symbols) - 1):
                (a, fa), (b, fb) = symbols[j], symbols[j + 1]
                if not (fa or fb) and a + b in self.score and (best is None or self.score[a + b] > best[0]):
                    best = (self.score[a + b], j)
            if best is None:
                break
            j = best[1]
            symbols[j : j + 2] = [[symbols[j][0] + symbols[j + 1][0], False]]
        ids = []
        for piece, _ in symbols:
            if piece in self.score:
                ids.append(self.id[piece])
            else:  # byte fallback
                ids += [self.id[f"<0x{b:02X}>"] for b in piece.encode()]
        return ids

    def encode(self, text):
        ids, start, i = [self.id["<s>"]], 0, 0
        while i < len(text):
            token = next((t for t in self.added_longest_first if text.startswith(t, i)), None)
            if token is None:
                i += 1
                continue
            if i > start:
                ids += self.sp_encode(text[start:i])
            ids.append(self.added[token])
            i = start = i + len(token)
        if start < len(text):
            ids += self.sp_encode(text[start:])
        return ids

    def __call__(self, text, return_tensors=None):
        return {"input_ids": torch.tensor([self.encode(text)])}


def _internlm2_tokenizer(path, **normalizer):
    """tokenizer.model, tokenizer_config.json, special_tokens_map.json and added_tokens.json as
    InternLM2Tokenizer saves them after their training added its tokens; returns their side."""
    pieces = _sp_model(path / "tokenizer.model", **normalizer)
    n = len(pieces)
    decoder = {0: "<unk>", 1: "<s>", 2: "</s>"}
    decoder.update({n - 6 + i: t for i, t in enumerate(CHAT_TOKENS)})
    decoder.update({n + i: t for i, t in enumerate(THEIR_TOKENS)})
    entry = dict(lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    specials = list(reversed(CHAT_TOKENS)) + THEIR_TOKENS
    config = {
        "added_tokens_decoder": {str(i): {"content": t, **entry} for i, t in sorted(decoder.items())},
        "additional_special_tokens": specials,
        "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer", None]},
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "extra_special_tokens": {},
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": "</s>",
        "tokenizer_class": "InternLM2Tokenizer",
        "unk_token": "<unk>",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    special_map = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>"}
    (path / "special_tokens_map.json").write_text(json.dumps({"additional_special_tokens": specials, **special_map}))
    (path / "added_tokens.json").write_text(json.dumps({t: n + i for i, t in enumerate(THEIR_TOKENS)}))
    return TheirInternLM2Tokenizer(pieces, {t: i for i, t in decoder.items()})


def _internlm2_lm(gen, vocab_size, bias):
    """llm_config and language_model.* weights of an InternLM2ForCausalLM in their layout: fused
    wqkv with 4 query heads over 2 key-value heads, ``output`` apart from the embeddings; with
    ``bias``, biases on wqkv and wo (llm_config then omits "bias": InternLM2Config's default is
    True)."""
    heads, kv_heads, inter, layers = 4, 2, 128, 2
    d = LM_HIDDEN // heads
    llm = {
        "architectures": [INTERNLM2],
        "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config"},
        "model_type": "internlm2",
        "attn_implementation": "flash_attention_2",
        "bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": LM_HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 4096,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_scaling": {"type": "dynamic", "factor": 2.0},
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.37.2",
        "use_cache": False,
        "vocab_size": vocab_size,
    }
    if bias:
        del llm["bias"]
    p = "language_model.model."
    state = {p + "tok_embeddings.weight": _randn(gen, vocab_size, LM_HIDDEN)}
    for i in range(layers):
        q = f"{p}layers.{i}."
        state[q + "attention_norm.weight"] = _randn(gen, LM_HIDDEN, scale=0.2, shift=1.0)
        state[q + "ffn_norm.weight"] = _randn(gen, LM_HIDDEN, scale=0.2, shift=1.0)
        state[q + "attention.wqkv.weight"] = _randn(gen, (heads + 2 * kv_heads) * d, LM_HIDDEN, scale=0.3)
        state[q + "attention.wo.weight"] = _randn(gen, LM_HIDDEN, heads * d, scale=0.2)
        if bias:
            state[q + "attention.wqkv.bias"] = _randn(gen, (heads + 2 * kv_heads) * d, scale=0.5)
            state[q + "attention.wo.bias"] = _randn(gen, LM_HIDDEN, scale=0.2)
        state[q + "feed_forward.w1.weight"] = _randn(gen, inter, LM_HIDDEN, scale=0.2)
        state[q + "feed_forward.w3.weight"] = _randn(gen, inter, LM_HIDDEN, scale=0.2)
        state[q + "feed_forward.w2.weight"] = _randn(gen, LM_HIDDEN, inter, scale=0.2)
    state[p + "norm.weight"] = _randn(gen, LM_HIDDEN, scale=0.2, shift=1.0)
    state["language_model.output.weight"] = _randn(gen, vocab_size, LM_HIDDEN, scale=0.3)
    return llm, state


def _their_internlm2(state, llm, embeds):
    """InternLM2Model's last hidden state (after the final norm), eager attention, one sequence."""
    p = "language_model.model."
    heads, kv_heads, hidden = llm["num_attention_heads"], llm["num_key_value_heads"], llm["hidden_size"]
    d, g, eps, n = hidden // heads, heads // kv_heads, llm["rms_norm_eps"], embeds.shape[1]
    assert n <= llm["max_position_embeddings"]  # dynamic NTK keeps the base up to here

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)

    inv_freq = 1.0 / llm["rope_theta"] ** (torch.arange(0, d, 2).float() / d)
    emb = torch.cat([torch.outer(torch.arange(n).float(), inv_freq)] * 2, -1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.full((n, n), float("-inf")).triu(1)
    x = embeds
    for i in range(llm["num_hidden_layers"]):
        q_ = f"{p}layers.{i}."
        h = rms(x, state[q_ + "attention_norm.weight"])
        qkv = F.linear(h, state[q_ + "attention.wqkv.weight"], state.get(q_ + "attention.wqkv.bias"))
        qkv = qkv.view(1, n, kv_heads, g + 2, d)  # "b q (h gs d) -> b q h gs d"
        q = qkv[..., :g, :].reshape(1, n, heads, d).transpose(1, 2)  # "b q h gs d -> b q (h gs) d"
        k, v = qkv[..., -2, :].transpose(1, 2), qkv[..., -1, :].transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)  # repeat_kv
        att = (q @ k.transpose(-1, -2) / math.sqrt(d) + causal).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(1, n, hidden)
        x = x + F.linear(o, state[q_ + "attention.wo.weight"], state.get(q_ + "attention.wo.bias"))
        h = rms(x, state[q_ + "ffn_norm.weight"])
        gate = F.silu(F.linear(h, state[q_ + "feed_forward.w1.weight"]))
        up = gate * F.linear(h, state[q_ + "feed_forward.w3.weight"])
        x = x + F.linear(up, state[q_ + "feed_forward.w2.weight"])
    return rms(x, state[p + "norm.weight"])


def _random_texts(n, seed=0):
    """Texts mixing words of the vocabulary, Chinese (in it and not), digits, newlines, tabs, odd
    spaces (runs, NBSP, ideographic, zero-width), emoji, a literal ▁, and special tokens
    anywhere, next to spaces or mid-word."""
    rng = random.Random(seed)
    parts = [
        "Question", "Process", "answer", "Yes", "No", "the", "step", " is", "right", "wrong", "3 + 4 = 7",
        "12", "2025", "0.5", "你", "书生", "万象", "答案是", "龘", "鱻", "數學", "１２", "é", "🙂", "👍🏽",
        " ", "  ", "    ", "     ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "\u200b", "▁", "{x}", "$x^2$",
        "<prm>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<img>", "</img>", "<IMG_CONTEXT>",
    ]  # fmt: skip
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, 14))) for _ in range(n)]


@pytest.fixture(scope="module")
def internlm2(tmp_path_factory):
    root = tmp_path_factory.mktemp("internlm2")
    src, state, config, tok = _their_checkpoint(root / "theirs", seed=3, arch=INTERNLM2)
    out = root / "betaprm"
    assert main(["convert-model", "--from", "authors", "--input", str(src), "--output", str(out)]) == 0
    return src, out, state, config, tok


def test_internlm2_tokenizer_gives_their_ids(internlm2):
    """The converted folder's tokenizer (plain AutoTokenizer, no remote code, no sentencepiece)
    gives InternLM2Tokenizer's ids on hand-picked and random texts."""
    from transformers import AutoTokenizer

    src, out, state, config, theirs = internlm2
    ours = AutoTokenizer.from_pretrained(out)
    prm_tok = BetaPRM.from_pretrained(out).tokenizer
    assert type(ours).__name__ == "TokenizersBackend" and not (out / "tokenizer.model").exists()
    n = len(theirs.pieces)
    for i, t in enumerate(CHAT_TOKENS + THEIR_TOKENS):  # the placeholders renamed, their tokens after them
        assert ours.convert_tokens_to_ids(t) == (n - 6 + i) == theirs.convert_tokens_to_ids(t)
    assert ours.convert_tokens_to_ids("<prm>") == n + 9 and len(ours) == n + 11  # and <video>, the processor's
    assert ours.convert_tokens_to_ids(["Yes", "No"]) == theirs.convert_tokens_to_ids(["Yes", "No"])
    yes = theirs.convert_tokens_to_ids("Yes")
    assert yes > 2 + 256 and ours("Yes")["input_ids"] == [1, yes]  # a merged piece
    picked = [
        "", "Yes", " Yes", "No ", "Question: what is 3 + 4 ?\nProcess: 3 + 4 = 7<prm>so 7<prm>",
        "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n<|im_start|>assistant\n",
        "  leading and trailing  ", "a\tb\r\nc\n\nd", "數學🙂龘", "x<prm>y <prm> z<prm>", "<s>abc</s><unk>",
        "    four spaces", "five     spaces", "▁literal▁", "Yes, the step is right.",
    ]  # fmt: skip
    texts = picked + _random_texts(400)
    byte_ids = set(range(3, 259))
    assert any(set(theirs.encode(t)) & byte_ids for t in texts)  # byte fallback is exercised
    user_id = theirs.id["▁▁▁▁"]
    assert sum(user_id in theirs.encode(t) for t in texts) > 10  # so is the user-defined piece
    for text in texts:
        want = theirs.encode(text)
        assert ours(text)["input_ids"] == want, repr(text)
        assert prm_tok(text)["input_ids"] == want, repr(text)
    assert ours.decode(ours("a  b\n數學🙂 c")["input_ids"], skip_special_tokens=True) == "a  b\n數學🙂 c"


@pytest.mark.parametrize("bias", [False, True])
def test_internlm2_traces_score_as_theirs(internlm2, tmp_path, bias):
    """Text traces (and, without bias, a tiled image) score as their InternLM2 forward: mu and
    kappa at every <prm> to 1e-5; the ids are theirs."""
    from betaprm.formatting import encode_traces

    if bias:
        src, state, config, tok = _their_checkpoint(tmp_path / "theirs", seed=4, arch=INTERNLM2, bias=True)
        out = tmp_path / "betaprm"
        assert main(["convert-model", "--from", "authors", "--input", str(src), "--output", str(out)]) == 0
    else:
        src, out, state, config, tok = internlm2
    prm = BetaPRM.from_pretrained(out)
    text = prm.backbone.config.text_config
    assert text.model_type == "llama" and text.attention_bias is bias and text.num_key_value_heads == 2
    assert text.rope_parameters["rope_type"] == "dynamic" and text.rope_parameters["factor"] == 2.0
    assert text.rope_parameters["rope_theta"] == 1e6 and text.rms_norm_eps == 1e-5
    assert not text.tie_word_embeddings and not getattr(text, "mlp_bias", False)
    traces = [*TRACES, ("数学: 12 + 9 = ?", ["12 + 9 = 21", "答案是 21"])]
    for (q, steps), s in zip(traces, score_traces(prm, traces)):
        ids, mu, kappa = _their_scores(state, config, tok, q, steps)
        assert encode_traces(prm.tokenizer, prm.config.marker_id, [(q, steps)], prm.config.trace_format)[0] == ids
        assert len(mu) == len(steps) == len(s.mu)
        np.testing.assert_allclose(s.mu, mu, atol=1e-5, rtol=0)
        np.testing.assert_allclose(s.kappa, kappa, atol=1e-5, rtol=1e-5)
        assert np.ptp(mu) > 1e-3 and np.ptp(kappa) > 1e-3  # not flat: the weights matter
    if bias:
        # Loaded in bf16 (as the GPU scores), the rotary frequencies stay float32.
        bf16 = BetaPRM.from_pretrained(out, dtype=torch.bfloat16)
        assert bf16.backbone.model.language_model.rotary_emb.inv_freq.dtype == torch.float32
        return
    from PIL import Image

    from betaprm.vision import encode_multimodal

    img = tmp_path / "wide.png"
    Image.fromarray((np.random.default_rng(1).random((60, 130, 3)) * 255).astype("uint8")).save(img)
    q, steps = TRACES[0]
    enc = encode_multimodal(prm, [(q, steps, [str(img)])])
    ids, mu, kappa = _their_scores(state, config, tok, q, steps, pixel_values=enc["pixel_values"])
    assert enc["input_ids"][0].tolist() == ids and enc["pixel_values"].shape[0] > 2
    ours = score_traces(prm, [(q, steps, [str(img)])])[0]
    np.testing.assert_allclose(ours.mu, mu, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours.kappa, kappa, atol=1e-5, rtol=1e-5)


def test_internlm2_wqkv_split_groups_query_heads_by_key_value_head():
    """Rows of wqkv per key-value head: its query heads, its key, its value."""
    from betaprm.authors_checkpoint import split_wqkv

    heads, kv_heads, d = 6, 2, 3
    rows = torch.arange((heads + 2 * kv_heads) * d).float()  # row r holds r
    q, k, v = split_wqkv(rows[:, None].repeat(1, 2), heads, kv_heads, "test")
    group = (heads // kv_heads + 2) * d  # 15 rows per key-value head
    assert q[:, 0].tolist() == [*range(0, 9), *range(15, 24)]
    assert k[:, 0].tolist() == [*range(9, 12), *range(24, 27)] and v[:, 0].tolist() == [*range(12, 15), *range(27, 30)]
    bq, bk, bv = split_wqkv(rows, heads, kv_heads, "test")  # a bias splits the same way
    assert torch.equal(bq, q[:, 0]) and torch.equal(bk, k[:, 0]) and torch.equal(bv, v[:, 0]) and group == 15


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"add_dummy_prefix": True}, ".add_dummy_prefix is true"),
        ({"remove_extra_whitespaces": True}, ".remove_extra_whitespaces is true"),
        ({"precompiled_charsmap": b"\x01\x02", "name": "nmt_nfkc"}, " has a precompiled_charsmap (nmt_nfkc"),
    ],
)
def test_internlm2_refuses_a_tokenizer_it_cannot_rebuild(internlm2, tmp_path, capsys, setting, message):
    """A sentencepiece model whose normaliser InternLM2's does not share is refused, naming the
    file, the setting and why, rather than converted into a tokenizer with other ids."""
    src = internlm2[0]
    bad = tmp_path / "theirs"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    _sp_model(bad / "tokenizer.model", **setting)
    out = tmp_path / "out"
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad / 'tokenizer.model'}: normalizer_spec{message}" in err and "cannot be rebuilt exactly" in err
    assert not out.exists() or not any(out.iterdir())


def test_spm_tokenizer_refuses_other_models(tmp_path):
    from transformers.convert_slow_tokenizer import import_protobuf

    from betaprm.errors import BetaPRMInputError
    from betaprm.spm_tokenizer import spm_bpe_tokenizer

    config = {"added_tokens_decoder": {}}
    model = tmp_path / "tokenizer.model"
    _sp_model(model)
    m = import_protobuf().ModelProto()
    m.ParseFromString(model.read_bytes())
    m.trainer_spec.model_type = 1  # unigram
    m.trainer_spec.byte_fallback = False
    model.write_bytes(m.SerializeToString())
    with pytest.raises(BetaPRMInputError, match="model_type is UNIGRAM, not BPE; trainer_spec.byte_fallback is false"):
        spm_bpe_tokenizer(model, config, tmp_path / "tokenizer_config.json")
    model.write_bytes(b"not a model")
    with pytest.raises(BetaPRMInputError, match="not a sentencepiece model"):
        spm_bpe_tokenizer(model, config, tmp_path / "tokenizer_config.json")
    _sp_model(model)
    clash = {"added_tokens_decoder": {"3": {"content": "<s>", "special": True}}}  # a piece renamed onto another
    with pytest.raises(BetaPRMInputError, match="the piece '<s>' is both id 1 and id 3"):
        spm_bpe_tokenizer(model, clash, tmp_path / "tokenizer_config.json")
    gap = {"added_tokens_decoder": {"100000": {"content": "<far>", "special": True}}}
    with pytest.raises(BetaPRMInputError, match="do not land on their ids"):
        spm_bpe_tokenizer(model, gap, tmp_path / "tokenizer_config.json")


# ------------------------------------------------------------------ the option in betaprm's own models


def test_layernorm_linear_head_trains_saves_and_reloads(tmp_path):
    from betaprm.beta import beta_binomial_nll
    from tests.helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    torch.manual_seed(0)
    prm = BetaPRM.from_backbone(str(lm), kappa_head="layernorm-linear", kappa_init=4.0)
    head = prm.kappa_head
    assert isinstance(head, LayerNormKappaHead) and head[0].eps == 1e-5
    assert head[0].weight.dtype == torch.float32 and torch.equal(head[0].weight, torch.ones_like(head[0].weight))
    std = head[1].weight.std().item()
    assert 5e-4 < std < 2e-3  # their N(0, 1e-3) start
    assert abs(F.softplus(head[1].bias).item() + 1e-3 - 4.0) < 1e-6
    start = {k: v.clone() for k, v in head.state_dict().items()}

    from betaprm.formatting import encode_traces

    traces = [("1 + 2 = ?", ["1 + 2 = 3", "so 3"]), ("4 + 5 = ?", ["4 + 5 = 9"])]
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, traces, prm.config.trace_format)
    width = max(map(len, ids))
    batch = torch.tensor([x + [prm.tokenizer.pad_token_id] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    k, n = torch.tensor([7.0, 2.0, 1.0]), torch.tensor([8.0, 8.0, 8.0])
    opt = torch.optim.AdamW(prm.parameters(), lr=1e-2)
    prm.train()
    for _ in range(3):
        out = prm(batch, attention_mask=mask)
        loss = beta_binomial_nll(out.mu, out.kappa, k, n).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    prm.eval()
    assert all(not torch.equal(v, start[k_]) for k_, v in head.state_dict().items())  # LayerNorm included
    prm.save_pretrained(tmp_path / "prm")
    saved = json.loads((tmp_path / "prm" / "betaprm_config.json").read_text())
    assert saved["kappa_head"] == "layernorm-linear"
    from safetensors.torch import load_file

    keys = sorted(load_file(tmp_path / "prm" / "kappa_head.safetensors"))
    assert keys == ["0.bias", "0.weight", "1.bias", "1.weight"]  # theirs, without "kappa_head."
    again = BetaPRM.from_pretrained(tmp_path / "prm")
    assert isinstance(again.kappa_head, LayerNormKappaHead)
    a, b = score_traces(prm, traces), score_traces(again, traces)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.mu, y.mu, atol=1e-6)
        np.testing.assert_allclose(x.kappa, y.kappa, atol=1e-5, rtol=1e-6)
    assert np.ptp(np.concatenate([s.kappa for s in a])) > 1e-4  # kappa now depends on the step


def test_train_flag_makes_a_layernorm_linear_head(tmp_path):
    from tests.helpers import make_counts, make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    data = make_counts(tmp_path / "counts.jsonl", n=16)
    out = tmp_path / "prm"
    args = ["train", "--model", str(lm), "--data", str(data), "--output-dir", str(out), "--max-steps", "2"]
    args += ["--global-batch-size", "8", "--per-device-train-batch-size", "8", "--use-cpu", "--kappa-head"]
    assert main([*args, "layernorm-linear"]) == 0
    prm = BetaPRM.from_pretrained(out)
    assert prm.config.kappa_head == "layernorm-linear" and isinstance(prm.kappa_head, LayerNormKappaHead)


def test_a_config_without_kappa_head_loads_as_linear(tmp_path):
    from tests.helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    prm = BetaPRM.from_backbone(str(lm))
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.5)
    prm.save_pretrained(tmp_path / "prm")
    cfg_file = tmp_path / "prm" / "betaprm_config.json"
    cfg = json.loads(cfg_file.read_text())
    assert cfg.pop("kappa_head") == "linear"
    cfg_file.write_text(json.dumps(cfg))  # as an older betaprm wrote it
    again = BetaPRM.from_pretrained(tmp_path / "prm")
    assert again.config.kappa_head == "linear" and type(again.kappa_head) is KappaHead
    traces = [("1 + 2 = ?", ["1 + 2 = 3", "so 3"])]
    np.testing.assert_allclose(score_traces(again, traces)[0].kappa, score_traces(prm, traces)[0].kappa, rtol=1e-6)
    # A config naming a form the head file does not hold is refused, naming both.
    cfg["kappa_head"] = "layernorm-linear"
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="cannot read the kappa head \\('layernorm-linear'"):
        BetaPRM.from_pretrained(tmp_path / "prm")
