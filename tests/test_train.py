"""Training: objectives, optimiser groups, float32 loss, truncation, logging, resume, LoRA."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from betaprm import BetaPRM
from betaprm.data.records import Record, read_records
from betaprm.formatting import fit_to_length
from betaprm.train import PRMTrainer, TrainConfig, train
from betaprm.train.dataset import CountsCollator, encode_records

from .helpers import make_counts, make_lm_dir, train_config


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_lm_dir(tmp_path_factory.mktemp("lm") / "lm")


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    return make_counts(tmp_path_factory.mktemp("data") / "counts.jsonl")


def cfg(lm_dir, counts, out, **kw):
    return train_config(lm_dir, counts, out, **kw)


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_fit_to_length_keeps_whole_steps():
    M = 99
    ids = [1, 2, 5, M, 6, 7, M, 8, 9, 9, M]
    assert fit_to_length(ids, M, 20) == (ids, 3)
    assert fit_to_length(ids, M, 9) == ([1, 2, 5, M, 6, 7, M], 2)
    assert fit_to_length(ids, M, 6) == ([1, 2, 5, M], 1)
    assert fit_to_length(ids, M, 3) == ([], 0)


def test_truncation_keeps_labels_on_the_right_markers(lm_dir):
    prm = BetaPRM.from_backbone(str(lm_dir))
    recs = [
        Record("a", "q", ["one step here", "two step here", "three step here"], [8, 5, 1], [8, 8, 8]),
        Record("b", "q", ["short"], [3], [8]),
    ]
    full = encode_records(prm, recs, max_length=10_000)
    n_full = len(full[0]["input_ids"])
    marker_pos = [i for i, t in enumerate(full[0]["input_ids"]) if t == prm.config.marker_id]
    # Room for exactly two steps of record a.
    ds = encode_records(prm, recs, max_length=marker_pos[1] + 2)
    assert ds[0]["mc_correct"] == [8, 5] and ds[0]["mc_total"] == [8, 8]
    assert ds[0]["input_ids"] == full[0]["input_ids"][: marker_pos[1] + 1]
    assert ds.stats.truncated_records == 1 and ds.stats.dropped_steps == 1 and ds.stats.records == 2
    # The kept markers give the same scores as in the untruncated trace (causal model).
    batch = CountsCollator(0)([ds[0]])
    with torch.no_grad():
        cut = prm(batch["input_ids"], attention_mask=batch["attention_mask"])
        whole = prm(torch.tensor([full[0]["input_ids"]]))
    assert cut.mu.shape == batch["mc_correct"].shape == (2,)
    torch.testing.assert_close(cut.mu, whole.mu[:2])
    rej = encode_records(prm, recs, max_length=marker_pos[1] + 2, truncation="reject")
    assert len(rej) == 1 and rej.stats.rejected_too_long == 1
    assert n_full > marker_pos[1] + 2


def test_collator_orders_labels_like_the_model(lm_dir):
    prm = BetaPRM.from_backbone(str(lm_dir))
    recs = [Record("a", "q", ["x", "y"], [1, 2], [8, 8]), Record("b", "q", ["z", "w", "v"], [3, 4, 5], [8, 8, 9])]
    ds = encode_records(prm, recs, max_length=512)
    batch = CountsCollator(0)([ds[0], ds[1]])
    assert batch["mc_correct"].tolist() == [1, 2, 3, 4, 5] and batch["mc_total"].tolist() == [8, 8, 8, 8, 9]
    out = prm(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert out.row.tolist() == [0, 0, 1, 1, 1]


def test_optimizer_groups_and_logging(tmp_path, lm_dir, counts):
    prm, trainer, _ = train(cfg(lm_dir, counts, tmp_path / "run"))
    groups = trainer.optimizer.param_groups
    head_ids = {id(p) for p in prm.kappa_head.parameters()}
    head_groups = [g for g in groups if {id(p) for p in g["params"]} & head_ids]
    assert len(head_groups) == 1 and {id(p) for p in head_groups[0]["params"]} == head_ids
    body_lr = [g["initial_lr"] for g in groups if g is not head_groups[0]]
    assert head_groups[0]["initial_lr"] == pytest.approx(10 * 1e-3) and body_lr == [1e-3, 1e-3]
    assert head_groups[0]["weight_decay"] == 0.0
    names = {id(p): n for n, p in prm.named_parameters()}
    no_decay = [
        names[id(p)] for g in groups if g["weight_decay"] == 0.0 and g is not head_groups[0] for p in g["params"]
    ]
    decay = [names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]]
    assert no_decay and all("norm" in n or "bias" in n for n in no_decay)
    assert not any("norm" in n for n in decay)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3
    for h in logs:
        for key in ("nll", "reg", "kappa_mean", "kappa_p90", "mu_mean"):
            assert np.isfinite(h[key]), key
        assert h["loss"] == pytest.approx(h["nll"] + 0.05 * h["reg"], rel=1e-4)
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["truncation"]["records"] == 96 and summary["config"]["objective"] == "beta-binomial"
    assert (tmp_path / "run" / "checkpoint-3" / "model.safetensors").exists()
    assert not list((tmp_path / "run").glob("**/training_args.bin"))


def test_aux_lm_loss_is_logged_and_added(tmp_path, lm_dir, counts):
    prm, trainer, _ = train(cfg(lm_dir, counts, tmp_path / "aux", aux_lm_weight=0.5, max_steps=4, save_steps=100))
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for h in logs:
        assert h["lm"] > 0
        assert h["loss"] == pytest.approx(h["nll"] + 0.05 * h["reg"] + 0.5 * h["lm"], rel=1e-4)


def test_loss_is_float32_for_a_bf16_backbone(lm_dir, counts):
    prm = BetaPRM.from_backbone(str(lm_dir))
    prm.backbone.to(torch.bfloat16)
    ds = encode_records(prm, read_records(counts).records[:4], max_length=512)
    from transformers import TrainingArguments

    trainer = PRMTrainer(
        model=prm,
        args=TrainingArguments(output_dir="/tmp/unused", use_cpu=True, report_to="none", remove_unused_columns=False),
        train_dataset=ds,
        data_collator=CountsCollator(0),
        objective="beta-binomial",
        lambda_reg=0.05,
        hard_threshold=0.5,
        head_lr_multiplier=10,
    )
    batch = CountsCollator(0)([ds[i] for i in range(4)])
    out_dtype = {}
    prm.backbone.base_model.register_forward_hook(lambda m, a, o: out_dtype.update(h=o.last_hidden_state.dtype))
    loss = trainer.compute_loss(prm, dict(batch))
    assert out_dtype["h"] == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(prm.kappa_head.weight.grad).all()


@pytest.mark.parametrize("objective", ["soft-ce", "hard-ce"])
def test_standard_prm_objectives(tmp_path, lm_dir, counts, objective):
    prm, trainer, _ = train(
        cfg(lm_dir, counts, tmp_path / objective, objective=objective, max_steps=4, save_steps=100)
    )
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["loss"] == pytest.approx(h["ce"], rel=1e-5) and "nll" not in h for h in logs)
    # No reliability channel: kappa stays at its initial value.
    assert all(h["kappa_mean"] == pytest.approx(4.0, rel=1e-5) for h in logs)
    assert BetaPRM.from_pretrained(tmp_path / objective).score("add these", [["1 + 2 = 3"]])[0].kappa[
        0
    ] == pytest.approx(4.0, rel=1e-5)


def test_resume_matches_uninterrupted_run(tmp_path, lm_dir, counts):
    full, trainer_a, _ = train(cfg(lm_dir, counts, tmp_path / "a", max_steps=6, save_steps=3))
    # A second run starts from the first run's step-3 checkpoint and finishes the job.
    shutil.copytree(tmp_path / "a" / "checkpoint-3", tmp_path / "b" / "checkpoint-3")
    resumed, trainer_b, _ = train(
        cfg(lm_dir, counts, tmp_path / "b", max_steps=6, save_steps=3, resume_from_checkpoint="last")
    )
    a, b = params(full), params(resumed)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    # The trained head really was restored (not re-initialised): it moved from init.
    init = BetaPRM.from_backbone(str(lm_dir)).kappa_head.bias.detach()
    assert not torch.allclose(resumed.kappa_head.bias.detach(), init)
    # Logged losses agree at every logging step whose window does not straddle the
    # resume point (step 4 averages steps 3-4 in one run and step 4 alone in the other).
    la = {h["step"]: h["loss"] for h in trainer_a.state.log_history if "loss" in h}
    lb = {h["step"]: h["loss"] for h in trainer_b.state.log_history if "loss" in h}
    assert la.keys() == lb.keys() == {2, 4, 6}
    assert lb[2] == pytest.approx(la[2], rel=1e-6) and lb[6] == pytest.approx(la[6], rel=1e-5)


def test_lora_trains_adapters_head_and_marker_row(tmp_path, lm_dir, counts):
    pytest.importorskip("peft")
    before = BetaPRM.from_backbone(str(lm_dir))
    base_w = before.backbone.model.layers[0].mlp.up_proj.weight.detach().clone()
    emb_before = before.backbone.get_input_embeddings().weight.detach().clone()
    prm, trainer, _ = train(
        cfg(
            lm_dir,
            counts,
            tmp_path / "lora",
            lora_r=4,
            lora_target_modules="q_proj,v_proj,up_proj",
            max_steps=4,
            save_steps=2,
        )
    )
    # After training the adapters are merged: the saved model is a plain BetaPRM.
    loaded = BetaPRM.from_pretrained(tmp_path / "lora")
    assert type(loaded.backbone).__name__ == "LlamaForCausalLM"
    merged_w = loaded.backbone.model.layers[0].mlp.up_proj.weight
    assert not torch.allclose(merged_w, base_w)  # the adapter's update is in the weights
    emb = loaded.backbone.get_input_embeddings().weight
    mid = loaded.config.marker_id
    changed_rows = (emb - emb_before).abs().sum(1).nonzero().flatten().tolist()
    assert changed_rows == [mid]  # only the marker row of the embedding trained
    assert not torch.allclose(loaded.kappa_head.bias, before.kappa_head.bias)
    a = prm.score("add these", [["1 + 2 = 3", "3 + 3 = 7"]])[0]
    b = loaded.score("add these", [["1 + 2 = 3", "3 + 3 = 7"]])[0]
    np.testing.assert_allclose(a.mu, b.mu, atol=1e-5)
    np.testing.assert_allclose(a.kappa, b.kappa, rtol=1e-5)


def test_bad_config_is_one_clear_error(lm_dir, counts):
    from betaprm.errors import BetaPRMInputError

    with pytest.raises(BetaPRMInputError) as e:
        TrainConfig(model="", data="", objective="mse", global_batch_size=0)
    msg = str(e.value)
    assert (
        "--model is required" in msg
        and "--objective must be one of" in msg
        and "--global-batch-size must be >= 1" in msg
    )
    with pytest.raises(BetaPRMInputError, match="not a multiple"):
        train(cfg(lm_dir, counts, "/tmp/x", global_batch_size=6, per_device_train_batch_size=4))


def test_group_by_length_batches_similar_lengths(tmp_path, lm_dir, counts):
    """--group-by-length reaches the Trainer's sampler: each batch of the epoch spans a
    narrower range of lengths than random batches, and training runs with it."""
    from betaprm.train.dataset import LengthBucketSampler

    prm, trainer, _ = train(cfg(lm_dir, counts, tmp_path / "g", group_by_length=True, max_steps=2, save_steps=100))
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthBucketSampler)
    lengths = [len(x["input_ids"]) for x in trainer.train_dataset]
    order = list(sampler)
    assert sorted(order) == list(range(len(lengths)))  # every trace once

    def mean_spread(idx):
        return np.mean([np.ptp([lengths[i] for i in idx[j : j + 8]]) for j in range(0, len(idx) - 7, 8)])

    assert mean_spread(order) < mean_spread(list(np.random.default_rng(0).permutation(len(lengths))))
    assert not isinstance(
        train(cfg(lm_dir, counts, tmp_path / "r", max_steps=1, save_steps=100))[1]._get_train_sampler(),
        LengthBucketSampler,
    )


def test_non_finite_training_stops_before_writing_nan_weights(tmp_path, lm_dir, counts, capsys, monkeypatch):
    """Fails before this change: a diverging run logged ``grad_norm nan``, saved a model
    whose every tensor was NaN and exited 0."""
    from betaprm.cli import main
    from betaprm.model import CONFIG_NAME
    from betaprm.train import TrainConfig

    # The config refuses a rate of 1e30 (tests/test_outputs_safety.py); here it only forces
    # the divergence the guard must catch, so the check is passed a sane rate.
    checks = TrainConfig.__post_init__

    def lenient(self):
        lr, self.learning_rate = self.learning_rate, 1e-3
        checks(self)
        self.learning_rate = lr

    monkeypatch.setattr(TrainConfig, "__post_init__", lenient)

    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "--model",
            str(lm_dir),
            "--data",
            str(counts),
            "--output-dir",
            str(out),
            "--global-batch-size",
            "8",
            "--per-device-train-batch-size",
            "4",
            "--learning-rate",
            "1e30",
            "--warmup-ratio",
            "0",
            "--max-steps",
            "6",
            "--save-steps",
            "1",
            "--use-cpu",
            "--report-to",
            "none",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "training stopped at optimiser step" in err and "non-finite" in err and "Traceback" not in err
    assert "in the batch of records 'r" in err  # the batch is named by record ids
    assert not (out / CONFIG_NAME).exists()  # no final model
    # Every checkpoint written before the stop holds finite weights.
    from safetensors.torch import load_file

    ckpts = sorted(out.glob("checkpoint-*"))
    for c in ckpts:
        assert all(torch.isfinite(t).all() for t in load_file(c / "model.safetensors").values()), c


def test_length_buckets_are_homogeneous_shuffled_and_cover_every_example_once():
    from betaprm.train.dataset import LengthBucketSampler

    lengths = [((i * 37) % 101) + 5 for i in range(203)]
    s = LengthBucketSampler(lengths, batch_size=8, seed=3, group=5)
    batches = s.batches()
    assert sorted(i for b in batches for i in b) == list(range(203))  # each example once
    assert list(s) == [i for b in batches for i in b]  # a DataLoader batching in order gets these
    full = [b for b in batches if len(b) == 8]
    assert len(full) == 203 // 8 and all(len(b) < 8 for b in batches[len(full) :])
    # within a batch the lengths are close: far tighter than random batches
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in full) / len(full)
    assert spread < 25
    # batch order is not sorted by length (no longest-first sawtooth), and depends on seed and epoch
    firsts = [max(lengths[i] for i in b) for b in full]
    assert firsts != sorted(firsts) and firsts != sorted(firsts, reverse=True)
    again = LengthBucketSampler(lengths, batch_size=8, seed=3, group=5).batches()
    assert again == batches
    s.set_epoch(1)
    assert s.batches() != batches


def test_group_by_length_trains_and_resumes_like_the_uninterrupted_run(tmp_path, lm_dir, counts):
    full, _, _ = train(cfg(lm_dir, counts, tmp_path / "a", max_steps=6, save_steps=3, group_by_length=True))
    shutil.copytree(tmp_path / "a" / "checkpoint-3", tmp_path / "b" / "checkpoint-3")
    resumed, _, _ = train(
        cfg(
            lm_dir,
            counts,
            tmp_path / "b",
            max_steps=6,
            save_steps=3,
            group_by_length=True,
            resume_from_checkpoint="last",
        )
    )
    a, b = params(full), params(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


# ---------------------------------------------------------------------- packing
def test_pack_rows_lays_every_trace_out_once_without_padding_between():
    from betaprm.batching import pack_rows

    feats = [{"input_ids": list(range(10 * (i + 1), 10 * (i + 1) + n)), "i": i} for i, n in enumerate([5, 2, 3, 4, 1])]
    order, batch = pack_rows(feats, pad_id=0)
    ids, pos, keep = batch["input_ids"], batch["position_ids"], batch["lm_keep"]
    assert ids.shape == (3, 5)  # first-fit decreasing into rows of 5: [5], [4, 1], [3, 2]
    assert sorted(f["i"] for f in order) == [0, 1, 2, 3, 4]
    laid = [ids[r, pos[r] == 0].tolist() for r in range(3)]  # every segment starts at position 0
    assert [f["i"] for f in order] == [0, 3, 4, 2, 1] and laid == [[10], [40, 50], [30, 20]]
    for f in order:  # each trace whole, in order, at positions 0..n-1
        r, c = (ids == f["input_ids"][0]).nonzero()[0].tolist()
        n = len(f["input_ids"])
        assert ids[r, c : c + n].tolist() == f["input_ids"] and pos[r, c : c + n].tolist() == list(range(n))
    # Next-token pairs only inside a trace: row 1 is [40..43 | 50], row 2 [30 31 32 | 20 21].
    assert keep[1].tolist() == [True, True, True, False] and keep[2].tolist() == [True, True, False, True]


@pytest.mark.parametrize("objective", ["beta-binomial", "soft-ce"])
def test_packed_batches_give_the_padded_loss_and_gradients(tmp_path, lm_dir, counts, objective):
    from transformers import TrainingArguments

    prm = BetaPRM.from_backbone(str(lm_dir)).train()
    loaded = read_records(str(counts), kind="counts")
    ds = encode_records(prm, loaded.records[:12], max_length=512)
    feats = [ds[i] for i in range(12)]
    trainer_cls = PRMTrainer
    losses, grads = [], []
    for pack in (False, True):
        trainer = trainer_cls(
            model=prm,
            args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
            objective=objective,
            lambda_reg=0.05,
            hard_threshold=0.5,
            head_lr_multiplier=1.0,
            aux_lm_weight=0.5,
            packing=pack,
        )
        batch = CountsCollator(0, pack=pack)(feats)
        batch.pop("record_index", None)
        if pack:
            assert batch["input_ids"].numel() < CountsCollator(0)(feats)["input_ids"].numel()
        prm.zero_grad()
        loss = trainer.compute_loss(prm, batch)
        loss.backward()
        losses.append(loss.item())
        grads.append({k: p.grad.clone() for k, p in prm.named_parameters() if p.grad is not None})
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6, msg=k)


def test_packed_training_matches_padded_training(tmp_path, lm_dir, counts):
    kw = dict(aux_lm_weight=0.3, save_steps=100, per_device_train_batch_size=8)
    a, _, _ = train(cfg(lm_dir, counts, tmp_path / "pad", packing=False, **kw))
    b, trainer, _ = train(cfg(lm_dir, counts, tmp_path / "pack", packing=True, **kw))
    assert not trainer.packing_unchecked  # some batch really did pack two traces into a row
    pa, pb = params(a), params(b)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-5, msg=k)


def test_packing_check_stops_a_backbone_whose_attention_ignores_position_ids(tmp_path, lm_dir, counts):
    """A real backbone with an attention function that masks causally over the whole row
    (as an architecture that builds its own mask would): packed traces would see each
    other, and the first packed batch says so."""
    from betaprm.errors import BetaPRMInputError

    from .helpers import leaky_attention_copy

    leaky = leaky_attention_copy(lm_dir, tmp_path / "leaky")
    with pytest.raises(BetaPRMInputError, match="packing check failed.*--no-packing"):
        train(cfg(leaky, counts, tmp_path / "out", packing=True))
    train(cfg(leaky, counts, tmp_path / "out2", packing=False, max_steps=2))  # padding needs no such mask


def test_packing_check_passes_under_bf16_autocast(tmp_path, lm_dir, counts):
    """bf16 rounds the packed and padded layouts differently; the check must not take that
    for traces that see each other (it once did, in benchmarks/train_vs_trl.py)."""
    run = cfg(
        lm_dir, counts, tmp_path / "bf16", precision="bf16", max_steps=4, save_steps=9, per_device_train_batch_size=8
    )
    _, trainer, _ = train(run)
    assert trainer.args.bf16 and not trainer.packing_unchecked  # a packed batch was checked and passed


# ---------------------------------------------------------------------- batches by tokens
def test_token_budget_batches_fit_the_budget_cover_every_example_once_and_split_for_processes():
    from betaprm.batching import batch_tokens
    from betaprm.train.dataset import TokenBudgetBatchSampler

    lengths = [((i * 37) % 101) + 5 for i in range(203)] + [700]  # one trace over the budget
    for packed in (True, False):
        s = TokenBudgetBatchSampler(lengths, 400, packed=packed, seed=3)
        batches = s.all_batches()
        assert sorted(i for b in batches for i in b) == list(range(204))  # each example once
        assert list(s) == batches and len(s) == len(batches)
        assert [203] in batches  # the long trace alone
        assert all(batch_tokens([lengths[i] for i in b], packed) <= 400 for b in batches if b != [203])
        assert len({len(b) for b in batches}) > 1  # many short traces or few long ones
        assert TokenBudgetBatchSampler(lengths, 400, packed=packed, seed=3).all_batches() == batches
        s.set_epoch(1)
        assert s.all_batches() != batches
    packed_b = TokenBudgetBatchSampler(lengths, 400, packed=True, seed=3).all_batches()
    padded_b = TokenBudgetBatchSampler(lengths, 400, packed=False, seed=3).all_batches()
    assert len(packed_b) < len(padded_b)  # packing fits more traces into the same positions
    # Grouped: similar lengths share a batch.
    grouped = TokenBudgetBatchSampler(lengths[:203], 400, packed=False, seed=3, group=5).all_batches()
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in grouped if len(b) > 1]
    assert np.mean(spread) < 30 and len(grouped) < len(padded_b)
    # Three processes: the count divides by three, nothing dropped or repeated.
    three = TokenBudgetBatchSampler(lengths, 400, packed=True, seed=3, world=3).all_batches()
    assert len(three) % 3 == 0 and sorted(i for b in three for i in b) == list(range(204))
    with pytest.raises(Exception, match="max_batch_tokens"):
        TokenBudgetBatchSampler(lengths, 0, packed=True)


def test_a_step_is_the_same_however_it_is_cut_into_micro_batches(tmp_path, lm_dir, counts):
    """The loss of an optimiser step is the mean over its scored steps: 2 micro-batches of 4
    traces give the weights of 1 batch of 8 (a mean of per-micro-batch means would not)."""
    kw = dict(aux_lm_weight=0.3, save_steps=100, objective="beta-binomial")
    a, _, _ = train(cfg(lm_dir, counts, tmp_path / "a", per_device_train_batch_size=4, **kw))
    b, _, _ = train(cfg(lm_dir, counts, tmp_path / "b", per_device_train_batch_size=8, **kw))
    pa, pb = params(a), params(b)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-5, msg=k)


def test_batch_rebalance_deals_each_random_step_into_length_sorted_micro_batches(tmp_path, lm_dir, counts):
    """The default sampler (transformers' BatchRebalanceSampler, seeded by --seed): an
    optimiser step's traces are a random draw, dealt into its micro-batches by length, so a
    micro-batch spans a narrower range of lengths than the step; --no-batch-rebalance keeps
    the Trainer's random sampler. That the model does not depend on the cut is
    test_a_step_is_the_same_however_it_is_cut_into_micro_batches."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    _, trainer, _ = train(cfg(lm_dir, counts, tmp_path / "r", global_batch_size=16, max_steps=1, save_steps=100))
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, BatchRebalanceSampler) and sampler.seed == 1
    lengths = [len(x["input_ids"]) for x in trainer.train_dataset]
    micro = list(sampler)  # 4 micro-batches per step of 16
    assert sorted(i for b in micro for i in b) == list(range(len(lengths)))  # every trace once
    steps = [micro[k : k + 4] for k in range(0, len(micro) - 3, 4)]
    inner = np.mean([np.ptp([lengths[i] for i in b]) for s in steps for b in s if len(b) > 1])
    whole = np.mean([np.ptp([lengths[i] for b in s for i in b]) for s in steps])
    assert inner < 0.6 * whole
    # What a step holds does not depend on how it is cut: its traces are the same draw.
    cut2 = train(cfg(lm_dir, counts, tmp_path / "c", global_batch_size=16, per_device_train_batch_size=8, max_steps=1))
    two = list(cut2[1]._get_train_sampler())
    assert [sorted(two[k] + two[k + 1]) for k in range(0, 8, 2)] == [sorted(sum(s, [])) for s in steps[:4]]
    off = train(cfg(lm_dir, counts, tmp_path / "o", batch_rebalance=False, max_steps=1, save_steps=100))[1]
    assert not isinstance(off._get_train_sampler(), BatchRebalanceSampler)
    # Recorded in the run's settings only where it orders the batches: a checkpoint from
    # before the flag (random order) resumes only with --no-batch-rebalance.
    from betaprm.train import run_record

    def recorded(**kw):
        return run_record(cfg(lm_dir, counts, tmp_path / "x", **kw))["settings"].get("batch_rebalance")

    assert (recorded(), recorded(batch_rebalance=False), recorded(group_by_length=True)) == (True, None, None)


def test_token_budget_training_fits_the_budget_and_resumes_in_a_later_epoch(tmp_path, lm_dir):
    from .helpers import make_counts

    data = make_counts(tmp_path / "small.jsonl", n=24, seed=5)
    kw = dict(max_batch_tokens=90, max_steps=8, save_steps=5, logging_steps=1)
    full, trainer, _ = train(cfg(lm_dir, data, tmp_path / "a", **kw))
    assert trainer.args.gradient_accumulation_steps >= 2
    assert trainer.state.epoch > 2  # the run goes over the data more than twice
    from betaprm.batching import batch_tokens

    sampler = trainer.token_batches
    sampler.set_epoch(0)
    assert all(batch_tokens([sampler.lengths[i] for i in b], True) <= 90 for b in sampler.all_batches())
    assert len({len(b) for b in sampler.all_batches()}) > 1
    shutil.copytree(tmp_path / "a" / "checkpoint-5", tmp_path / "b" / "checkpoint-5")
    # A checkpoint of a run from before --max-batch-tokens, recorded as max_tokens_per_batch, resumes.
    run_file = tmp_path / "b" / "checkpoint-5" / "betaprm_run.json"
    run = json.loads(run_file.read_text())
    run["settings"]["max_tokens_per_batch"] = run["settings"].pop("max_batch_tokens")
    run_file.write_text(json.dumps(run))
    resumed, trainer_b, _ = train(cfg(lm_dir, data, tmp_path / "b", resume_from_checkpoint="last", **kw))
    pa, pb = params(full), params(resumed)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=1e-6, msg=k)
    la = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    lb = {h["step"]: h["loss"] for h in trainer_b.state.log_history if "loss" in h}
    assert lb[8] == pytest.approx(la[8], rel=1e-5)


def test_beta_binomial_on_hard_labels_warns_once(lm_dir, tmp_path, caplog):
    """Every N = 1: the Beta-Binomial likelihood of one outcome is mu whatever kappa is, so
    training says plainly that kappa learns nothing, and names the alternatives."""
    import logging

    from betaprm.beta import beta_binomial_nll

    mu = torch.tensor([0.3, 0.3])
    nll = beta_binomial_nll(mu, torch.tensor([0.5, 500.0]), torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]))
    assert float(nll[0]) == pytest.approx(float(nll[1]), abs=1e-5)  # kappa does not enter
    hard = tmp_path / "hard.jsonl"
    rows = [json.loads(x) for x in open(make_counts(tmp_path / "c.jsonl", n=16))]
    hard.write_text(
        "".join(
            json.dumps({**r, "mc_correct": [int(k > 4) for k in r["mc_correct"]], "mc_total": 1}) + "\n" for r in rows
        )
    )
    with caplog.at_level(logging.WARNING, logger="betaprm.train"):
        train(cfg(lm_dir, hard, tmp_path / "o", max_steps=1, save_steps=100), quiet=True)
    msgs = [r.getMessage() for r in caplog.records if "N = 1" in r.getMessage()]
    assert len(msgs) == 1 and "kappa learns nothing" in msgs[0] and "soft-ce" in msgs[0] and "betaprm label" in msgs[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="betaprm.train"):
        train(cfg(lm_dir, hard, tmp_path / "o2", max_steps=1, save_steps=100, objective="soft-ce"), quiet=True)
    assert not [r for r in caplog.records if "N = 1" in r.getMessage()]


def test_push_to_hub_uploads_the_final_betaprm(lm_dir, counts, tmp_path, monkeypatch):
    """--push-to-hub opens the repository before training and hands the final model's files,
    checkpoints and the training summary left out, to huggingface_hub. The hub cannot be
    reached from the tests, so HfApi is replaced by a stand-in that copies what
    upload_folder would send (with huggingface_hub's own pattern filter)."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import filter_repo_objects

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the stand-in below is the hub
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")

    remote = tmp_path / "remote"
    calls = []

    class StandInHfApi:
        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls.append(("create", repo_id, private, exist_ok))
            return f"https://hub.invalid/{repo_id}"

        def upload_folder(self, repo_id, folder_path, allow_patterns=None, ignore_patterns=None, commit_message=None):
            calls.append(("upload", repo_id))
            root = Path(folder_path)
            files = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
            for rel in filter_repo_objects(files, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns):
                (remote / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(root / rel, remote / rel)

    monkeypatch.setattr(huggingface_hub, "HfApi", StandInHfApi)
    out = tmp_path / "o"
    prm, _, _ = train(cfg(lm_dir, counts, out, max_steps=4, save_steps=2, push_to_hub="me/my-prm", hub_private=True))
    assert calls == [("create", "me/my-prm", True, True)] * 2 + [("upload", "me/my-prm")]  # before and after
    assert any(p.name.startswith("checkpoint-") for p in out.iterdir())
    assert not any(p.name.startswith("checkpoint-") for p in remote.iterdir())
    assert (out / "train_summary.json").is_file() and not (remote / "train_summary.json").exists()
    pushed = BetaPRM.from_pretrained(remote)
    for k, v in prm.state_dict().items():
        assert torch.equal(v, pushed.state_dict()[k]), k
    with pytest.raises(Exception, match="--push-to-hub must be NAME or OWNER/NAME"):
        cfg(lm_dir, counts, out, push_to_hub="a/b/c")


def test_freeze_layers_trains_only_what_is_above_them(tmp_path, lm_dir, counts):
    from betaprm.train import run_record

    before = BetaPRM.from_backbone(str(lm_dir)).state_dict()
    layers = len(BetaPRM.from_backbone(str(lm_dir)).backbone.model.layers)
    assert layers == 2
    train(cfg(lm_dir, counts, tmp_path / "frozen", freeze_layers=1, objective="beta-binomial", max_steps=4))
    after = BetaPRM.from_pretrained(tmp_path / "frozen").state_dict()
    frozen = [k for k in before if "embed_tokens" in k or ".layers.0." in k]
    above = [k for k in before if ".layers.1." in k and k.endswith("proj.weight")]
    assert frozen and above
    assert [k for k in frozen if not torch.equal(after[k], before[k])] == []
    assert all(not torch.equal(after[k], before[k]) for k in above)
    assert not torch.equal(after["kappa_head.weight"], before["kappa_head.weight"])
    assert not torch.equal(after["backbone.lm_head.weight"], before["backbone.lm_head.weight"])
    # Recorded in the run's settings (a resume must keep it), and only when on.
    summary = json.loads((tmp_path / "frozen" / "train_summary.json").read_text())
    assert summary["run"]["settings"]["freeze_layers"] == 1
    assert "freeze_layers" not in run_record(cfg(lm_dir, counts, tmp_path / "x"))["settings"]


def test_freeze_layers_refuses_what_it_cannot_do(tmp_path, lm_dir, counts):
    from betaprm.errors import BetaPRMInputError

    with pytest.raises(BetaPRMInputError, match="LoRA already freezes"):
        cfg(lm_dir, counts, tmp_path / "a", freeze_layers=1, lora_r=4)
    with pytest.raises(BetaPRMInputError, match="--freeze-layers must be >= 0"):
        cfg(lm_dir, counts, tmp_path / "a", freeze_layers=-1)
    with pytest.raises(BetaPRMInputError, match="the backbone has 2 decoder layers; freeze at most 2"):
        train(cfg(lm_dir, counts, tmp_path / "b", freeze_layers=3))


def test_negative_weight_decay_is_refused_before_training(tmp_path, lm_dir, counts):
    from betaprm.errors import BetaPRMInputError

    with pytest.raises(BetaPRMInputError, match="--weight-decay must be >= 0, got -0.1"):
        cfg(lm_dir, counts, tmp_path / "a", weight_decay=-0.1)


def test_step_weights_data_divides_every_step_by_the_datas_mean_count(tmp_path, lm_dir, counts):
    """--step-weights data: each optimiser step's summed losses over a fixed count (the data's
    mean scored steps and LM tokens per trace x the step's traces), so every scored step weighs
    the same whatever its batch; still independent of how a step is cut into micro-batches."""
    kw = dict(aux_lm_weight=0.3, save_steps=100, objective="beta-binomial", step_weights="data")
    a, ta, _ = train(cfg(lm_dir, counts, tmp_path / "a", per_device_train_batch_size=4, **kw))
    b, _, _ = train(cfg(lm_dir, counts, tmp_path / "b", per_device_train_batch_size=8, **kw))
    pa, pb = params(a), params(b)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-5, msg=k)
    records = [json.loads(line) for line in Path(counts).read_text().splitlines()]
    steps = sum(len(r["steps"]) for r in records) / len(records)
    marker = a.config.marker_id
    tokens = sum(sum(1 for t in e["input_ids"][1:] if t != marker) for e in ta.train_dataset.examples) / len(records)
    assert ta.fixed_counts == pytest.approx((8 * steps, 8 * tokens))
    # A step's batch returns the fixed count, not its own.
    batches = [ta.data_collator([ta.train_dataset[i] for i in range(j, j + 4)]) for j in (0, 4)]
    _, n = ta.get_batch_samples(iter(batches), 2, "cpu")
    assert n == pytest.approx(8 * steps) and ta._step_lm_tokens == pytest.approx(8 * tokens)
    c, _, _ = train(
        cfg(lm_dir, counts, tmp_path / "c", per_device_train_batch_size=8, **{**kw, "step_weights": "batch"})
    )
    assert any(not torch.equal(v, params(c)[k]) for k, v in pb.items())  # the weighting is in effect
    summary = json.loads((tmp_path / "a" / "train_summary.json").read_text())
    assert summary["run"]["settings"]["step_weights"] == "data"
    with pytest.raises(Exception, match="--step-weights must be one of batch, data, got 'tokens'"):
        cfg(lm_dir, counts, tmp_path / "d", step_weights="tokens")
