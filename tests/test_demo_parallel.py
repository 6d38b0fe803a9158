"""The demo trains its two PRMs, and scores its pools with them, at the same time in two
worker processes on CPU: the same PRMs and scores as one after the other in this process
with the same thread count."""

import json
import shutil

import numpy as np
import torch

from betaprm.demo import PRM_JOBS, DemoConfig, _backbone, _train_and_score, _train_prms, demo_data
from betaprm.synth import World


def test_parallel_prms_equal_sequential_training(tmp_path):
    world = World()
    eff = DemoConfig(quick=True, n_train_problems=40, n_val_problems=2, n_test_problems=2, pretrain_tokens=5000, prm_steps=4, prm_batch=8).effective()
    traces, records, val_pools, *_ = demo_data(world, eff, seed=3)
    to_score = [(p.problem.question, t.steps) for p in val_pools for t in p.traces]
    par, seq = tmp_path / "par", tmp_path / "seq"
    par.mkdir()
    (par / "train_counts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    _backbone(eff, eff, world, traces, par, lambda *a: None)
    seq.mkdir()
    shutil.copytree(par / "backbone", seq / "backbone")
    shutil.copy(par / "train_counts.jsonl", seq)

    threads = torch.get_num_threads()
    lines = []
    try:
        torch.set_num_threads(2)  # the parallel path, with one thread per worker, on any machine
        models, histories, scores = _train_prms(eff, par, 3, "cpu", lines.append, to_score)
        torch.set_num_threads(1)
        for name, objective in PRM_JOBS:
            prm, history, ref_scores, _ = _train_and_score(eff, seq, name, objective, 3, "cpu", to_score, lambda *a: None)
            ref = prm.state_dict()
            got = models[name].state_dict()
            assert ref.keys() == got.keys()
            assert all(torch.equal(ref[k], got[k]) for k in ref), name
            assert [h.get("loss") for h in history] == [h.get("loss") for h in histories[name]]
            assert len(scores[name]) == len(to_score) == 32
            for a, b in zip(ref_scores, scores[name]):  # the worker's scores, in order
                assert np.array_equal(a.mu, b.mu) and np.array_equal(a.kappa, b.kappa)
    finally:
        torch.set_num_threads(threads)
    assert "at the same time, 1 thread each" in lines[-1] and lines[-1].startswith("scored 64 candidates")
    assert not models["betaprm"].training
