"""The demo's training data: the offset mix of the training traces, labels from the world's own policy."""

from dataclasses import replace

import numpy as np
import pytest

from betaprm.errors import BetaPRMInputError
from betaprm.synth import SynthPolicy, World, WorldConfig
from betaprm.synth.experiment import label_records, training_traces
from betaprm.synth.recipe import DemoConfig


def _offsets(world, traces):
    """Error offsets of the verifiable steps, each against the value written before."""
    out = []
    for t in traces:
        p, prev = t.problem, t.problem.start
        for k in range(p.T):
            if p.ops[k][0] != "?":
                out.append((t.values[k] - p.apply(k, prev)) % world.M)
            prev = t.values[k]
    return np.array(out)


def test_train_near_miss_changes_the_training_traces_only():
    w = World()
    problems = w.sample_problems(300, 5, "t")
    cfg = replace(DemoConfig(), traces_per_train_problem=2)
    default = training_traces(w, problems, 12, cfg.error_boost, cfg.traces_per_train_problem, cfg.train_near_miss)
    policy = SynthPolicy(w, seed=12, error_boost=cfg.error_boost)
    same = [t for p in problems for t in policy.sample_traces(p, 2)]
    assert [t.steps for t in default] == [t.steps for t in same]  # the default is the world's own offset mix

    off = _offsets(w, default)
    near = np.isin(off, (1, w.M - 1)).sum() / max((off > 0).sum(), 1)
    assert 0.45 < near < 0.75  # the world's near_miss, 0.6

    far = training_traces(w, problems, 12, cfg.error_boost, cfg.traces_per_train_problem, 0.0)
    off = _offsets(w, far)
    assert (off > 0).sum() > 100 and not np.isin(off, (1, w.M - 1)).any()
    assert ((off > 0) & (off % 2 == 0)).sum() > 50  # errors that keep the parity of the result

    # The labels still come from the world's policy: an answer step's count is all or nothing.
    recs = label_records(w, SynthPolicy(w, seed=11), far[:40], 8, "x")
    for t, r in zip(far[:40], recs):
        assert r["mc_correct"][-1] == (8 if t.correct else 0)


def test_train_near_miss_must_be_a_probability():
    with pytest.raises(BetaPRMInputError, match="train_near_miss must be in"):
        DemoConfig(train_near_miss=-0.1)


def test_check_lr_must_be_positive():
    with pytest.raises(BetaPRMInputError, match="check_lr must be > 0"):
        DemoConfig(check_lr=0)


def test_presets_change_defaults_and_keep_explicit_settings():
    long = DemoConfig(long=True).effective()
    assert (long.num_layers, long.hidden_size, long.n_train_problems, long.prm_steps, long.train_near_miss) == (
        8,
        96,
        12_000,
        6600,
        0.3,
    )
    assert long.n_test_problems == DemoConfig().effective().n_test_problems  # what the preset does not name stays
    # a setting given explicitly wins over the preset, for --long and --quick alike
    assert DemoConfig(long=True, prm_steps=3000).effective().prm_steps == 3000
    assert DemoConfig(quick=True, prm_steps=7).effective().prm_steps == 7
    assert DemoConfig(quick=True).effective().prm_steps == 120
    # an explicit setting equal to the default recipe's still wins (it used to be taken as unset)
    assert DemoConfig(quick=True, hidden_size=128, num_layers=4).effective().hidden_size == 128
    assert DemoConfig(long=True, train_near_miss=0.6).effective().train_near_miss == 0.6
    base = DemoConfig().effective()
    assert (
        base.n_train_problems,
        base.n_test_problems,
        base.hidden_size,
        base.num_layers,
        base.prm_steps,
        base.train_near_miss,
    ) == (12_000, 1000, 96, 8, 1500, 0.3)
    assert (base.intermediate_size, long.intermediate_size) == (192, 384)
    # the default freezes half the backbone's layers in PRM training, --quick one of its three, --long none
    assert (base.prm_freeze_layers, DemoConfig(quick=True).effective().prm_freeze_layers) == (4, 1)
    assert long.prm_freeze_layers == 0
    with pytest.raises(BetaPRMInputError, match="prm_freeze_layers 4 > num_layers 3"):
        DemoConfig(num_layers=3).effective()  # said before any work, not when the PRMs start training
    assert DemoConfig(num_layers=3, prm_freeze_layers=2).effective().prm_freeze_layers == 2
    # the PRMs' step of 32 traces in two length-sorted forward passes (betaprm train --batch-rebalance)
    assert (base.prm_micro_batches, long.prm_micro_batches) == (2, 1)
    with pytest.raises(BetaPRMInputError, match="prm_batch 30 is not a multiple of prm_micro_batches 4"):
        DemoConfig(prm_batch=30, prm_micro_batches=4).effective()
    assert base.effective() == base
    # on a GPU the default run is the long recipe; --quick stays quick (torch sees no GPU
    # here, so the device is pinned through the one method that asks torch)
    gpu = DemoConfig()
    gpu.torch_device = lambda: "cuda"
    assert gpu.recipe() == "long" and gpu.effective().prm_steps == 6600
    gpu_quick = DemoConfig(quick=True)
    gpu_quick.torch_device = lambda: "cuda"
    assert gpu_quick.recipe() == "quick" and gpu_quick.effective().prm_steps == 120
    import torch

    assert DemoConfig().device == "auto"
    assert DemoConfig().recipe() == ("long" if torch.cuda.is_available() else "default")
    with pytest.raises(BetaPRMInputError, match="--quick and --long"):
        DemoConfig(quick=True, long=True)


def test_step_diagnostics_split_by_offset_parity_only_for_an_even_modulus():
    from betaprm.synth.diagnostics import step_diagnostics
    from betaprm.synth.experiment import sample_pools

    for modulus in (5, 6):
        w = World(WorldConfig(modulus=modulus))
        pools = sample_pools(w, SynthPolicy(w, seed=1, error_boost=3.0), w.sample_problems(80, 2, "d"), 6)
        d = step_diagnostics(pools, [[b.mean for b in p.bayes] for p in pools])
        assert d["first_error_auroc"] > 0.9
        if modulus == 5:
            assert "first_error_auroc_odd" not in d and not pools[0].parity
        else:
            assert d["first_error_auroc_odd"] > 0.9 and d["first_error_auroc_even"] > 0.9
            par = step_diagnostics(pools, [[m.mean for m in p.parity] for p in pools])
            assert par["first_error_auroc_odd"] > 0.9 and par["first_error_auroc_even"] < 0.7


def test_help_states_the_recipe_and_preset_values():
    """The help of each preset-controlled setting names the default recipe's value and each
    preset's, as BASE and PRESETS hold them (the help is written by hand)."""
    from dataclasses import fields

    from betaprm.demo import BASE, PRESETS

    helps = {f.name: f.metadata["help"] for f in fields(DemoConfig)}
    for key, value in BASE.items():
        assert f"({value}" in helps[key], key
    for preset, values in PRESETS.items():
        for key, value in values.items():
            assert f"--{preset} {value}" in helps[key], (preset, key)


def test_word_tokenizer_gives_one_token_per_word_and_number(tmp_path):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from betaprm.formatting import encode_traces, format_trace
    from betaprm.tiny import word_tokenizer

    w = World(WorldConfig(modulus=12))
    traces = [t for p in w.sample_problems(20, 1, "t") for t in SynthPolicy(w, seed=2).sample_traces(p, 2)]
    texts = [format_trace(t.problem.question, t.steps).replace("<prm>", " ") for t in traces]
    tok = word_tokenizer(texts, words=[str(v) for v in range(w.M)])
    tok.add_tokens([AddedToken("<prm>", special=True, normalized=False)], special_tokens=True)
    marker = tok.convert_tokens_to_ids("<prm>")
    ids = encode_traces(tok, marker, [(t.problem.question, t.steps) for t in traces])  # checks one marker per step
    for t, x in zip(traces, ids):
        text = format_trace(t.problem.question, t.steps)
        assert len(x) == len(text.replace("<prm>", " <prm> ").split())  # one token per word
        assert tok.unk_token_id not in x
    assert {str(v) for v in range(12)} <= set(tok.get_vocab()) and {"Yes", "No"} <= set(tok.get_vocab())
    assert tok("seven")["input_ids"] == [tok.unk_token_id]  # a word it never saw
    tok.save_pretrained(tmp_path)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path)(texts[0])["input_ids"] == tok(texts[0])["input_ids"]


def test_value_prior_catches_a_scorer_that_reads_the_final_value_and_not_one_that_verifies():
    from betaprm.synth.diagnostics import value_prior
    from betaprm.synth.experiment import sample_pools
    from betaprm.types import StepScores

    w = World(WorldConfig())
    policy = SynthPolicy(w, seed=1, error_boost=2.0)
    val = sample_pools(w, policy, w.sample_problems(150, 3, "v"), 8)
    test = sample_pools(w, policy, w.sample_problems(150, 4, "t"), 8)
    full = value_prior(test, {}, val)
    prior = np.array(full["prior"])
    assert prior.max() - prior.min() > 0.2  # some final values are right far more often
    assert abs(full["prior_auroc"] - 0.5) < 0.1  # ... across problems: within one it says ~nothing

    def scores(f):
        return [
            [
                StepScores(np.full(len(t.steps), f(t, b)), np.ones(len(t.steps)), np.zeros(len(t.steps)))
                for t, b in zip(p.traces, p.bayes)
            ]
            for p in test
        ]

    # A scorer of the final value alone (plus a tiny tie-break), and the Bayes belief itself.
    shortcut = value_prior(test, {"value": scores(lambda t, b: prior[t.values[-1]] + 1e-6 * t.values[-1])}, val)
    assert shortcut["value"]["spearman_prior"] > 0.99
    best = int(np.argmax(prior))
    assert shortcut["value"]["pick_lift"][best] > 1.5  # it over-picks the likeliest value
    assert abs(shortcut["bayes"]["spearman_prior"]) < shortcut["value"]["spearman_prior"] - 0.3
    assert max(shortcut["bayes"]["pick_lift"]) < shortcut["value"]["pick_lift"][best]


def test_prm_training_knobs_are_checked_before_the_run_starts():
    with pytest.raises(BetaPRMInputError) as e:
        DemoConfig(prm_schedule="cosin", prm_step_weights="tokens", prm_freeze_layers=-1, prm_weight_decay=-1.0)
    msg = str(e.value)
    assert "prm_schedule must be a transformers scheduler name" in msg
    assert "prm_step_weights must be batch or data" in msg and "prm_freeze_layers must be >= 0" in msg
    assert "prm_weight_decay must be >= 0, got -1.0" in msg
    assert DemoConfig(prm_schedule="constant_with_warmup", prm_step_weights="data", prm_freeze_layers=2)


def _word_tokenizer_for(world, traces):
    from betaprm.synth.training import demo_tokenizer

    return demo_tokenizer(world, [(t.problem.question, t.steps) for t in traces])


def test_check_pretraining_replaces_verifiable_results_and_targets_their_markers():
    """Check pretraining's traces: only verifiable results are replaced, by another number,
    and the chain goes on from the written value; in the packed batch the detection target
    sits at each op step's marker (1 where replaced) and at its result, and no
    language-model target at a replaced result."""
    import torch

    from betaprm.formatting import encode_traces
    from betaprm.synth.training import at_results, check_batch, replaced_trace
    from betaprm.synth.world import parse_value

    w = World()
    problems = w.sample_problems(40, 3, "c")
    rng = np.random.default_rng(0)
    made = [replaced_trace(w, p, rng, 0.5) for p in problems]
    n_replaced = 0
    for p, (steps, flags) in zip(problems, made):
        assert len(steps) == p.T + 1 and len(flags) == p.T
        prev = p.start
        for s, (text, replaced) in enumerate(zip(steps, flags)):
            v = parse_value(text)
            assert text.split()[1] == str(prev)  # the chain goes on from the written value
            if p.ops[s][0] == "?":
                assert not replaced and v == p.apply(s, prev)
            else:
                assert (v != p.apply(s, prev)) == replaced
            n_replaced += replaced
            prev = v
    assert 0.35 < n_replaced / sum(op[0] != "?" for p in problems for op in p.ops) < 0.65
    tok = _word_tokenizer_for(w, [t for p in problems[:5] for t in SynthPolicy(w, seed=1).sample_traces(p, 2)])
    marker = tok.convert_tokens_to_ids("<prm>")
    ids = encode_traces(tok, marker, [(p.question, steps) for p, (steps, _) in zip(problems, made)])
    x, pos, labels, target = check_batch(ids, [f for _, f in made], marker, tok.pad_token_id)
    assert int((x != tok.pad_token_id).sum()) == sum(map(len, ids))
    # the same targets at the results themselves: one position before each step's marker
    at_result, result_target = at_results(target)
    assert torch.equal(result_target, target[target >= 0])
    assert torch.equal(at_result[:, :-1], target[:, 1:] >= 0) and not at_result[:, -1].any()
    # each trace, found by its segment of position ids, gets its own targets back
    seen = 0
    for r in range(x.shape[0]):
        starts = [j for j in range(x.shape[1]) if pos[r, j] == 0]
        for a, b in zip(starts, starts[1:] + [x.shape[1]]):
            seq = x[r, a:b].tolist()
            i = next((k for k, t in enumerate(ids) if t == seq), None)
            if i is None:
                assert set(seq) == {tok.pad_token_id}  # the row's padding tail
                continue
            seen += 1
            flags = made[i][1]
            marks = [j for j, t in enumerate(seq) if t == marker]
            assert [target[r, a + m].item() for m in marks[:-1]] == [float(f) for f in flags]
            assert target[r, a + marks[-1]].item() == -1.0  # the answer step is not a check
            assert int((target[r, a:b] >= 0).sum()) == len(flags)
            assert labels[r, a].item() == -100
            masked = {j for j in range(1, len(seq)) if labels[r, a + j].item() == -100}
            assert masked == {marks[k] - 1 for k, f in enumerate(flags) if f}
            assert all(labels[r, a + j].item() == seq[j] for j in range(1, len(seq)) if j not in masked)
    assert seen == len(ids)


def test_check_pretraining_trains_the_backbone_and_can_be_turned_off():
    import torch

    from betaprm.formatting import TraceFormat
    from betaprm.synth.training import check_pretrain
    from betaprm.tiny import tiny_causal_lm

    w = World()
    problems = w.sample_problems(5, 3, "c")
    tok = _word_tokenizer_for(w, [t for p in problems for t in SynthPolicy(w, seed=1).sample_traces(p, 2)])
    cfg = DemoConfig(quick=True, check_steps=3).effective()
    model = tiny_causal_lm(len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lines = []
    assert check_pretrain(model, cfg, w, tok, TraceFormat(), lines.append) == 3
    assert any("check pretraining step 3 (of at most 3)" in line and "replaced-result loss" in line for line in lines)
    assert all(not torch.equal(before[k], v) for k, v in model.state_dict().items() if "layers.1." in k)
    assert DemoConfig().effective().check_steps == 2000 and DemoConfig(quick=True).effective().check_steps == 100
    assert DemoConfig(check_steps=0).effective().check_steps == 0  # 0 turns it off, even for a preset
    # --check-lr reaches the optimiser: Adam's first steps move each weight by about the learning rate
    moved = []
    for lr in (1e-3, 1e-2):
        m = tiny_causal_lm(len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
        w0 = m.model.layers[1].mlp.down_proj.weight.detach().clone()
        lr_cfg = DemoConfig(quick=True, check_steps=3, check_lr=lr).effective()
        check_pretrain(m, lr_cfg, w, tok, TraceFormat(), lines.append)
        moved.append((m.model.layers[1].mlp.down_proj.weight.detach() - w0).abs().mean().item())
    assert moved[1] > 5 * moved[0], moved
    with pytest.raises(BetaPRMInputError, match="check_steps must be >= 0"):
        DemoConfig(check_steps=-1)


def test_check_batch_is_the_number_of_traces_per_check_step(monkeypatch):
    from betaprm.formatting import TraceFormat
    from betaprm.synth import training
    from betaprm.tiny import tiny_causal_lm

    w = World()
    problems = w.sample_problems(5, 3, "c")
    tok = _word_tokenizer_for(w, [t for p in problems for t in SynthPolicy(w, seed=1).sample_traces(p, 2)])
    sizes = []
    real = training.lm_proposals
    monkeypatch.setattr(
        training,
        "lm_proposals",
        lambda m, wd, t, f, chunk, *a: sizes.append(len(chunk)) or real(m, wd, t, f, chunk, *a),
    )
    model = tiny_causal_lm(len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    cfg = DemoConfig(quick=True, check_steps=2, check_batch=5).effective()
    training.check_pretrain(model, cfg, w, tok, TraceFormat(), lambda line: None)
    assert sizes == [5, 5] and DemoConfig().check_batch == 32
    with pytest.raises(BetaPRMInputError, match="check_batch must be >= 1"):
        DemoConfig(check_batch=0)


def test_check_pretraining_stops_once_the_check_has_formed(monkeypatch):
    """The learning rate stays up until the replaced-result loss over the last
    ``CHECK_WINDOW`` steps is under ``check_until``, then decays over ``check_decay_steps``
    to 0, and check pretraining ends there; a check that never forms runs the full
    ``check_steps``, decaying over its last ``check_decay_steps``."""
    import torch

    from betaprm.formatting import TraceFormat
    from betaprm.synth import training
    from betaprm.tiny import tiny_causal_lm

    sched = training.check_schedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 2, 4)
    lrs = [sched.factor(s) for s in range(6)]
    assert lrs == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]  # warm-up, then constant while nothing has formed
    sched.decay_from = 3
    lrs = [sched.factor(s) for s in range(9)]
    assert lrs[:3] == [0.5, 1.0, 1.0] and lrs[3] == 1.0 and lrs[3:8] == sorted(lrs[3:8], reverse=True)
    assert lrs[7] == pytest.approx(0.0) and lrs[8] == pytest.approx(0.0)

    w = World()
    problems = w.sample_problems(5, 3, "c")
    tok = _word_tokenizer_for(w, [t for p in problems for t in SynthPolicy(w, seed=1).sample_traces(p, 2)])
    monkeypatch.setattr(training, "CHECK_WINDOW", 2)
    schedule = training.check_schedule
    for until, want, said in [(100.0, 2 + 3, "the check formed by step 2"), (0.0, 8, "has not formed by step 5")]:
        cfg = DemoConfig(quick=True, check_steps=8, check_decay_steps=3, check_until=until).effective()
        model = tiny_causal_lm(len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
        lines = []
        assert training.check_pretrain(model, cfg, w, tok, TraceFormat(), lines.append) == want
        assert any(said in line and "decays over 3 steps" in line for line in lines), lines
    # No room to wait (check_steps <= check_decay_steps): a cosine decay over all of it.
    made = []
    monkeypatch.setattr(training, "check_schedule", lambda *a, **k: made.append(schedule(*a, **k)) or made[-1])
    cfg = DemoConfig(quick=True, check_steps=3, check_decay_steps=20).effective()
    model = tiny_causal_lm(len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    assert training.check_pretrain(model, cfg, w, tok, TraceFormat(), lambda line: None) == 3
    assert made[0].decay_from == 0 and made[0].factor(3) == pytest.approx(0.0)
    with pytest.raises(BetaPRMInputError, match="check_decay_steps must be >= 1"):
        DemoConfig(check_decay_steps=0)
    with pytest.raises(BetaPRMInputError, match="check_until must be >= 0"):
        DemoConfig(check_until=-0.1)


def test_pretraining_keeps_packed_traces_apart():
    """The backbone's pretraining packs several traces per row: with the model's KV cache on,
    transformers ignores the packed position ids and lets a trace attend to the ones before
    it. pretrain turns the cache off; then a packed trace's hidden states equal its own."""
    import torch

    from betaprm.formatting import encode_traces
    from betaprm.synth.training import check_batch, pretrain

    w = World()
    problems = w.sample_problems(6, 3, "c")
    tok = _word_tokenizer_for(w, [t for p in problems for t in SynthPolicy(w, seed=1).sample_traces(p, 2)])
    cfg = replace(DemoConfig(quick=True).effective(), hidden_size=32, num_layers=2, pretrain_steps=1, check_steps=1)
    model, checked = pretrain(cfg, w, tok, "<prm>", lambda line: None)
    assert checked == 1
    assert model.config.use_cache is False
    marker = tok.convert_tokens_to_ids("<prm>")
    ids = encode_traces(
        tok, marker, [(p.question, SynthPolicy(w, seed=2).sample_traces(p, 1)[0].steps) for p in problems]
    )
    # The demo's traces differ too little in length to share a row; one twice as long
    # makes rows that hold two.
    ids.append(ids[0] + ids[1])
    flags = [[False] * p.T for p in problems] + [[False] * (problems[0].T + problems[1].T + 1)]
    x, pos, _, _ = check_batch(ids, flags, marker, tok.pad_token_id)
    assert x.shape[0] < len(ids) - 1  # some row holds two traces
    with torch.no_grad():
        packed = model.model(input_ids=x, position_ids=pos).last_hidden_state
        for r in range(x.shape[0]):
            starts = [j for j in range(x.shape[1]) if pos[r, j] == 0]
            for a, b in zip(starts, starts[1:] + [x.shape[1]]):
                seq = x[r, a:b].tolist()
                if seq in ids:
                    alone = model.model(input_ids=torch.tensor([seq])).last_hidden_state[0]
                    assert torch.allclose(packed[r, a:b], alone, atol=1e-4)


def test_check_batch_with_two_markers_per_step_and_pretrain_without_check(monkeypatch):
    """With two markers per step the detection target sits at the second and the result
    before the first loses its LM target; ``check_steps=0`` skips check pretraining."""
    import torch

    from betaprm.formatting import TraceFormat, encode_traces
    from betaprm.synth import training
    from betaprm.synth.training import at_results, check_batch, replaced_trace

    w = World()
    problems = w.sample_problems(8, 5, "c")
    rng = np.random.default_rng(1)
    made = [replaced_trace(w, p, rng, 0.5) for p in problems]
    tok = _word_tokenizer_for(w, [t for p in problems for t in SynthPolicy(w, seed=1).sample_traces(p, 2)])
    marker = tok.convert_tokens_to_ids("<prm>")
    ids = encode_traces(
        tok, marker, [(p.question, s) for p, (s, _) in zip(problems, made)], TraceFormat(marker_repeat=2)
    )
    x, pos, labels, target = check_batch(ids, [f for _, f in made], marker, tok.pad_token_id, marker_repeat=2)
    from betaprm.batching import first_fit_rows

    rows = first_fit_rows([len(s) for s in ids])
    assert all(len(m) == 1 for m in rows)  # one trace per row here
    for r, (i,) in enumerate(rows):
        seq, flags = ids[i], made[i][1]
        marks = [j for j, t in enumerate(seq) if t == marker]
        assert [target[r, m].item() for m in marks[1:-2:2]] == [float(f) for f in flags]
        assert all(target[r, m].item() == -1.0 for m in marks[0::2])
        assert {j for j in range(1, len(seq)) if labels[r, j].item() == -100} == {
            marks[2 * k] - 1 for k, f in enumerate(flags) if f
        }
    # the result-position targets: the token before each op step's first marker
    at_result, result_target = at_results(target, marker_repeat=2)
    assert torch.equal(result_target, target[target >= 0])
    for r, (i,) in enumerate(rows):
        marks = [j for j, t in enumerate(ids[i]) if t == marker]
        assert at_result[r].nonzero().flatten().tolist() == [m - 1 for m in marks[0:-2:2]]
    called = []
    monkeypatch.setattr(training, "check_pretrain", lambda *a, **k: called.append(1))
    cfg = replace(DemoConfig(quick=True).effective(), hidden_size=32, num_layers=2, pretrain_steps=1)
    training.pretrain(replace(cfg, check_steps=0), w, tok, "<prm>", lambda line: None)
    assert called == []
    training.pretrain(replace(cfg, check_steps=2), w, tok, "<prm>", lambda line: None)
    assert called == [1]


@pytest.mark.parametrize("marker_repeat", [1, 2])
def test_lm_proposals_are_the_models_own_predictions_without_the_truth(marker_repeat, monkeypatch):
    """Check pretraining draws replacements from the backbone's language model: each op
    step's row is the model's softmax over the values at the position that predicts the
    result (the error-free trace read alone), the true value removed and the rest
    renormalised; packing the batch changes nothing, and a replacement drawn from a
    proposal takes one of the values it allows. In fp32; where the hardware has bf16 the
    proposals' forward pass runs in it, and they stay close to fp32's."""
    import contextlib

    import torch

    from betaprm.formatting import TraceFormat, encode_traces
    from betaprm.synth import training
    from betaprm.synth.training import lm_proposals, replaced_trace
    from betaprm.tiny import tiny_causal_lm

    w = World()
    problems = w.sample_problems(12, 4, "g")
    tok = _word_tokenizer_for(w, [t for p in problems for t in SynthPolicy(w, seed=1).sample_traces(p, 2)])
    model = tiny_causal_lm(len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    model.config.use_cache = False
    fmt = TraceFormat(marker_repeat=marker_repeat)
    marker = tok.convert_tokens_to_ids("<prm>")
    fast = lm_proposals(model, w, tok, fmt, problems, np.random.default_rng(0))
    monkeypatch.setattr(training, "proposal_autocast", lambda device: contextlib.nullcontext())
    props = lm_proposals(model, w, tok, fmt, problems, np.random.default_rng(0))
    for a, b in zip(fast, props):  # bf16 where the hardware has it (else the same fp32)
        np.testing.assert_allclose(a, b, atol=0.02)
        np.testing.assert_allclose(a.sum(1), 1.0)
    numbers = tok.convert_tokens_to_ids([str(v) for v in range(w.M)])
    texts_rng = np.random.default_rng(0)  # the same connectives as lm_proposals wrote
    for p, prop in zip(problems, props):
        truth = p.true_values()
        steps = w.step_texts(p, truth, 0, texts_rng)
        (ids,) = encode_traces(tok, marker, [(p.question, steps)], fmt)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
        marks = [j for j, t in enumerate(ids) if t == marker][marker_repeat - 1 :: marker_repeat]
        assert prop.shape == (p.T, w.M)
        for s in range(p.T):
            result = marks[s] - marker_repeat
            assert ids[result] == numbers[truth[s]]
            expect = torch.softmax(logits[result - 1, numbers], -1).numpy()
            expect[truth[s]] = 0
            np.testing.assert_allclose(prop[s], expect / expect.sum(), rtol=1e-4, atol=1e-9)
    rng = np.random.default_rng(2)
    only = np.zeros((problems[0].T, w.M))
    truth = problems[0].true_values()
    only[np.arange(problems[0].T), (np.array(truth) + 3) % w.M] = 1.0  # every proposal: the truth + 3
    steps, flags = replaced_trace(w, problems[0], rng, 1.0, only)
    prev = problems[0].start
    from betaprm.synth.world import parse_value

    for s, (text, f) in enumerate(zip(steps, flags)):
        v = parse_value(text)
        want = problems[0].apply(s, prev)
        assert v == (want + 3) % w.M if problems[0].ops[s][0] != "?" else v == want
        assert f == (problems[0].ops[s][0] != "?")
        prev = v


def test_a_reused_backbone_too_shallow_for_the_frozen_layers_is_refused_before_training(tmp_path):
    from betaprm.synth.training import build_backbone

    from .helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm", layers=2)
    cfg = DemoConfig(backbone=str(lm), out=str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    with pytest.raises(
        BetaPRMInputError, match=r"--prm-freeze-layers 4: the backbone .* has 2 layers; freeze at most 2"
    ):
        build_backbone(cfg, cfg.effective(), World(), [], tmp_path / "out", lambda *a: None)
    _, _, eff = build_backbone(
        cfg, replace(cfg.effective(), prm_freeze_layers=2), World(), [], tmp_path / "out", lambda *a: None
    )
    assert eff.num_layers == 2


def test_prm_micro_batches_reach_betaprm_train(monkeypatch, tmp_path):
    """--prm-micro-batches N: each PRM's step of --prm-batch traces runs as N length-sorted
    forward passes (betaprm train's per-device batch and batch rebalance); the step stays
    --prm-batch traces."""
    from betaprm.synth import training as train_module
    from betaprm.synth.training import train_prm

    seen = []

    class Seen(Exception):
        pass

    def spy(cfg, **kw):  # stops before any training: only the settings are checked
        seen.append(cfg)
        raise Seen

    monkeypatch.setattr(train_module, "train", spy)
    for n in (1, 4):
        with pytest.raises(Seen):
            train_prm(DemoConfig(prm_micro_batches=n).effective(), tmp_path, "p", "soft-ce", 0, "cpu", print)
    assert [(c.global_batch_size, c.per_device_train_batch_size, c.batch_rebalance) for c in seen] == [
        (32, 32, True),
        (32, 8, True),
    ]


def test_reuse_prms_compares_the_recipe_a_device_implies(tmp_path, monkeypatch):
    """--reuse-prms checks the settings the PRMs were trained with, also those the device
    implies: the same flags on a GPU host are the --long recipe, not the CPU run's."""
    import json
    from dataclasses import asdict

    import torch

    from betaprm.demo import check_reusable

    cfg = DemoConfig(out=str(tmp_path))
    for d in ("backbone", "standard_prm", "betaprm"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text("{}")
        (tmp_path / d / "train_summary.json").write_text('{"log_history": []}')
    with pytest.raises(BetaPRMInputError, match="no finished demo run"):
        check_reusable(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    results = {"config": asdict(cfg), "effective_config": asdict(cfg.effective()), "world": WorldConfig().to_dict()}
    (tmp_path / "results.json").write_text(json.dumps({**results, "version": "0.0.1"}))
    assert check_reusable(cfg) == "0.0.1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # device auto: the --long recipe
    with pytest.raises(BetaPRMInputError, match="prm_steps: 1500 there, 6600 here"):
        check_reusable(cfg)
    (tmp_path / "results.json").write_text(json.dumps({**results, "config": []}))
    with pytest.raises(BetaPRMInputError, match="not a demo run's results.json"):
        check_reusable(cfg)
