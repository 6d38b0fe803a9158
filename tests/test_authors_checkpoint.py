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
"""

import json
import math

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


def _their_checkpoint(path, seed=0, arch="Qwen2ForCausalLM"):
    """A checkpoint folder as their training saves it: config.json of InternVLChatModel (a Qwen2
    or Llama language model, InternViT with qkv bias and layer norms), two safetensors shards
    with an index, and the tokenizer with their added tokens (<prm> last)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    tok = train_bytelevel_tokenizer(
        ["Question: what is 3 + 4 ? Process: 3 + 4 = 7 so the answer is 7 compare 12 and 21"] * 20, vocab_size=320
    )
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.add_tokens(THEIR_TOKENS, special_tokens=True)  # their finetune script's token_list
    tok.save_pretrained(path)

    gen = torch.Generator().manual_seed(seed)
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
    llm = llm_cfg.to_dict()
    llm.update(attn_implementation="flash_attention_2", use_cache=False, torch_dtype="bfloat16", num_beams=1)
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
    config_cls, lm_cls = _language_model(llm["architectures"][0])
    lm = lm_cls(config_cls(**llm)).eval()
    lm.load_state_dict({k[len("language_model.") :]: v for k, v in state.items() if k.startswith("language_model.")})
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids).clone()
        if tiles:
            ctx = ids == tok.convert_tokens_to_ids("<IMG_CONTEXT>")
            embeds[ctx] = _their_image_features(state, pixel_values).reshape(-1, LM_HIDDEN)
        # hidden_states[-1] of the transformers they ran (4.37+) is the final norm's output,
        # the base model's last_hidden_state; the logits are the LM head's on it.
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

    bad = tmp_path / "internlm2"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    cfg["llm_config"]["architectures"] = ["InternLM2ForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert "InternLM2ForCausalLM, which cannot be converted" in err and "tokenizer" in err

    (bad / "config.json").unlink()
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(tmp_path / "o2")]) == 2
    assert "missing config.json" in capsys.readouterr().err
    (bad / "config.json").write_text((src / "config.json").read_text())
    (bad / "model-00002-of-00002.safetensors").unlink()
    assert main(["convert-model", "--from", "authors", "--input", str(bad), "--output", str(tmp_path / "o3")]) == 2
    assert "missing weight files model-00002-of-00002.safetensors" in capsys.readouterr().err


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
