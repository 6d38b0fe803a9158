import json
import random

import numpy as np
import pytest
import torch

from betaprm import BetaPRM, BetaPRMInputError
from betaprm.formatting import encode_traces
from betaprm.tiny import tiny_causal_lm

from .conftest import fresh_tokenizer, random_steps


def make_prm(tok, arch="llama", tie=False, **kw):
    tok = fresh_tokenizer(tok)
    model = tiny_causal_lm(len(tok), arch=arch, tie_word_embeddings=tie)
    return BetaPRM.from_backbone(model, tok, **kw)


def traces(n=6, seed=0):
    rng = random.Random(seed)
    return [("What is 6 * 7? Answer Yes or No.", random_steps(rng, rng.randint(1, 7))) for _ in range(n)]


@pytest.mark.parametrize("tie", [False, True])
def test_marker_added_with_mean_initialised_rows(bpe_tokenizer, arch, tie):
    tok = fresh_tokenizer(bpe_tokenizer)
    model = tiny_causal_lm(len(tok), arch=arch, tie_word_embeddings=tie)
    before_in = model.get_input_embeddings().weight.detach().clone()
    before_out = model.get_output_embeddings().weight.detach().clone()
    prm = BetaPRM.from_backbone(model, tok)
    mid = prm.config.marker_id
    assert tok.convert_ids_to_tokens(mid) == "<prm>" and mid == len(bpe_tokenizer)
    w_in = model.get_input_embeddings().weight
    assert w_in.shape[0] == len(tok)
    torch.testing.assert_close(w_in[:mid], before_in)  # old rows untouched
    torch.testing.assert_close(w_in[mid], before_in.mean(0))
    torch.testing.assert_close(model.get_output_embeddings().weight[mid], before_out.mean(0))


def test_existing_marker_is_reused(bpe_tokenizer):
    tok = fresh_tokenizer(bpe_tokenizer)
    tok.add_tokens(["<prm>"], special_tokens=True)
    model = tiny_causal_lm(len(tok))
    rows = model.get_input_embeddings().weight.detach().clone()
    prm = BetaPRM.from_backbone(model, tok)
    assert prm.config.marker_id == len(tok) - 1
    assert torch.equal(model.get_input_embeddings().weight, rows)


def test_reward_tokens_must_be_single_tokens(bpe_tokenizer):
    with pytest.raises(BetaPRMInputError, match=r"'Definitely' is not a single token.*encodes to \["):
        make_prm(bpe_tokenizer, reward_tokens=("Definitely", "No"))
    with pytest.raises(BetaPRMInputError, match="two different"):
        make_prm(bpe_tokenizer, reward_tokens=("Yes", "Yes"))
    with pytest.raises(BetaPRMInputError, match="kappa_init must exceed"):
        make_prm(bpe_tokenizer, kappa_init=1e-4)
    with pytest.raises(BetaPRMInputError, match="no tokenizer"):
        BetaPRM.from_backbone(tiny_causal_lm(len(bpe_tokenizer)))


def test_mu_equals_slice_of_full_logits_and_kappa_starts_at_init(bpe_tokenizer, arch):
    prm = make_prm(bpe_tokenizer, arch=arch, kappa_init=4.0)
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, traces(1))[0]
    x = torch.tensor([ids])
    with torch.no_grad():
        out = prm(x)
        full = prm.backbone(x).logits[0]  # (S, V): the reference, never used by BetaPRM
    pos = [i for i, t in enumerate(ids) if t == prm.config.marker_id]
    yes, no = prm.config.reward_token_ids
    ref = torch.softmax(full[pos][:, [yes, no]], dim=-1)[:, 0]
    torch.testing.assert_close(out.mu, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.reward_logits, full[pos][:, [yes, no]], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.kappa, torch.full_like(out.kappa, 4.0), rtol=1e-6, atol=0)
    assert out.mu.dtype == torch.float32 and out.kappa.dtype == torch.float32


def test_forward_never_computes_full_vocab_logits(bpe_tokenizer):
    prm = make_prm(bpe_tokenizer)
    calls = []
    prm.backbone.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    prm.score("q", [["a", "b"], ["c"]])
    assert calls == []


def test_batched_equals_one_by_one_and_one_pass_per_candidate(bpe_tokenizer, arch):
    prm = make_prm(bpe_tokenizer, arch=arch)
    with torch.no_grad():  # give the kappa head a non-constant output to compare
        prm.kappa_head.weight.normal_(0, 0.5)
    cands = [s for _, s in traces(11, seed=3)]
    rows_seen = []
    hook = prm.backbone.base_model.register_forward_hook(
        lambda m, a, kw, o: rows_seen.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    batched = prm.score("Q?", cands, batch_size=4)
    hook.remove()
    assert rows_seen == [4, 4, 3]  # 11 candidates, each in exactly one forward row
    single = [prm.score("Q?", [c], batch_size=1)[0] for c in cands]
    for b, s, c in zip(batched, single, cands):
        assert len(b) == len(c)
        np.testing.assert_allclose(b.mu, s.mu, atol=1e-5, rtol=0)
        np.testing.assert_allclose(b.kappa, s.kappa, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b.sigma, np.sqrt(b.mu * (1 - b.mu) / (b.kappa + 1)))
    assert len({round(float(k), 4) for b in batched for k in b.kappa}) > 1


def test_score_accepts_dict_candidates(bpe_tokenizer):
    prm = make_prm(bpe_tokenizer)
    a = prm.score("q", [{"steps": ["x", "y"]}])[0]
    b = prm.score("q", [["x", "y"]])[0]
    np.testing.assert_array_equal(a.mu, b.mu)


def test_save_load_round_trip(tmp_path, bpe_tokenizer, arch):
    prm = make_prm(bpe_tokenizer, arch=arch, kappa_init=2.5)
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    prm.save_pretrained(tmp_path / "ckpt")
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert "kappa_head.safetensors" in files and "model.safetensors" in files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))], files
    cfg = json.loads((tmp_path / "ckpt" / "betaprm_config.json").read_text())
    assert cfg["marker"] == "<prm>" and cfg["reward_tokens"] == ["Yes", "No"] and cfg["kappa_init"] == 2.5
    loaded = BetaPRM.from_pretrained(tmp_path / "ckpt")
    cands = [s for _, s in traces(5)]
    for a, b in zip(prm.score("Q?", cands), loaded.score("Q?", cands)):
        np.testing.assert_array_equal(a.mu, b.mu)
        np.testing.assert_array_equal(a.kappa, b.kappa)


def test_save_from_a_given_state_dict(tmp_path, bpe_tokenizer):
    # The path used when weights are sharded (DeepSpeed ZeRO-3, FSDP): a gathered state
    # dict is written instead of the live parameters.
    prm = make_prm(bpe_tokenizer, tie=True)
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    state = {k: v.clone() for k, v in prm.state_dict().items()}
    with torch.no_grad():
        for p in prm.parameters():
            p.zero_()  # the live weights are not what gets saved
    prm.save_pretrained(tmp_path / "c", state_dict=state)
    loaded = BetaPRM.from_pretrained(tmp_path / "c")
    for k, v in loaded.state_dict().items():
        torch.testing.assert_close(v, state[k], msg=k)


def test_remote_code_is_not_run_unless_asked(tmp_path, bpe_tokenizer):
    prm = make_prm(bpe_tokenizer)
    ckpt = tmp_path / "ckpt"
    prm.save_pretrained(ckpt)
    sentinel = tmp_path / "remote_code_ran"
    (ckpt / "modeling_evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('ran')\n")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    # Without trust_remote_code the native class is used and the file is never run...
    loaded = BetaPRM.from_pretrained(ckpt)
    assert type(loaded.backbone).__name__ == "LlamaForCausalLM"
    assert not sentinel.exists()
    # ...and the flag really reaches transformers: asked to trust, it imports the code.
    with pytest.raises(Exception):
        BetaPRM.from_pretrained(ckpt, trust_remote_code=True)
    assert sentinel.exists()


def test_reloaded_tokenizer_must_tokenise_as_saved(tmp_path, bpe_tokenizer):
    # transformers 5 would load a Qwen2Tokenizer (digit-splitting) for a qwen2 config
    # if the class were not pinned; forcing that class must be caught by the probe.
    prm = make_prm(bpe_tokenizer, arch="qwen2")
    prm.save_pretrained(tmp_path / "c")
    cfg = json.loads((tmp_path / "c" / "betaprm_config.json").read_text())
    assert cfg["tokenizer_class"] == "TokenizersBackend"
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    (tmp_path / "c" / "betaprm_config.json").write_text(json.dumps(cfg))
    with pytest.raises(BetaPRMInputError, match="tokenises a probe text differently"):
        BetaPRM.from_pretrained(tmp_path / "c")


def test_from_pretrained_errors_are_clear(tmp_path, bpe_tokenizer):
    with pytest.raises(BetaPRMInputError, match="is not a BetaPRM: no betaprm_config.json and no config.json"):
        BetaPRM.from_pretrained(tmp_path)
    prm = make_prm(bpe_tokenizer)
    prm.save_pretrained(tmp_path / "c")
    cfg = json.loads((tmp_path / "c" / "betaprm_config.json").read_text())
    cfg["lambda_typo"] = 1
    (tmp_path / "c" / "betaprm_config.json").write_text(json.dumps(cfg))
    with pytest.raises(BetaPRMInputError, match="unknown keys"):
        BetaPRM.from_pretrained(tmp_path / "c")


def test_from_backbone_path_and_smollm2_tokenizer(tmp_path, smollm2_tokenizer):
    # A plain causal-LM directory (as a user would have) wrapped via its path, with the
    # real SmolLM2 tokenizer saved beside it.
    tok = fresh_tokenizer(smollm2_tokenizer)
    model = tiny_causal_lm(len(tok), hidden_size=32, num_layers=1)
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    prm = BetaPRM.from_backbone(str(tmp_path / "lm"), chat_template=True)
    assert prm.config.reward_token_ids == tuple(tok.encode(w)[0] for w in ("Yes", "No"))
    scores = prm.score("What is 2+2?", [["2+2=4", "The answer is 4."]])
    assert len(scores[0]) == 2 and np.all((scores[0].mu > 0) & (scores[0].mu < 1))


def test_gradients_reach_backbone_and_head(bpe_tokenizer):
    from betaprm.beta import beta_binomial_nll

    prm = make_prm(bpe_tokenizer)
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, traces(2))
    width = max(map(len, ids))
    x = torch.tensor([i + [0] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    out = prm(x, attention_mask=mask)
    loss = beta_binomial_nll(out.mu, out.kappa, 3.0, 8.0).mean()
    loss.backward()
    assert prm.kappa_head.weight.grad.abs().sum() > 0
    lm_grad = prm.backbone.get_output_embeddings().weight.grad
    nonzero_rows = set(lm_grad.abs().sum(1).nonzero().flatten().tolist())
    assert nonzero_rows == set(prm.config.reward_token_ids)  # only the two reward rows


def test_marker_repeat_scores_one_value_per_step(bpe_tokenizer):
    prm = make_prm(bpe_tokenizer, marker_repeat=2)
    from betaprm.formatting import read_positions

    cands = [s for _, s in traces(4, seed=5)]
    scores = prm.score("Q?", cands)
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [("Q?", cands[0])], prm.config.trace_format)[0]
    with torch.no_grad():
        full = prm.backbone(torch.tensor([ids])).logits[0]
    pos = read_positions(ids, prm.config.marker_id, 2)
    yes, no = prm.config.reward_token_ids
    ref = torch.softmax(full[pos][:, [yes, no]], -1)[:, 0].numpy()
    assert [len(s) for s in scores] == [len(c) for c in cands]
    np.testing.assert_allclose(scores[0].mu, ref, atol=1e-6)


def test_reward_logits_through_the_head_module_equal_the_sliced_rows(bpe_tokenizer):
    # Under DeepSpeed ZeRO-3 (parameters carry ds_id) the reward logits come from running
    # the output head on the marker rows: the same numbers as slicing its two rows.
    tok = fresh_tokenizer(bpe_tokenizer)
    prm = BetaPRM.from_backbone(tiny_causal_lm(len(tok), hidden_size=32), tok)
    hidden = torch.randn(5, 32)
    sliced = prm.reward_logits(hidden)
    head = prm.backbone.get_output_embeddings()
    head.weight.ds_id = 0
    try:
        through_head = prm.reward_logits(hidden)
    finally:
        del head.weight.ds_id
    torch.testing.assert_close(through_head, sliced, rtol=1e-5, atol=1e-5)
