"""The demo trains its two PRMs, and scores its pools with them, at the same time in two
worker processes on CPU, and runs ACA's variants two at a time: the same PRMs, scores and
ACA table as one after the other in this process with the same thread count."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from betaprm.selectors import tune_selectors
from betaprm.synth import World
from betaprm.synth.experiment import demo_data
from betaprm.synth.frontiers import aca_table
from betaprm.synth.recipe import DemoConfig
from betaprm.synth.training import PRM_JOBS, build_backbone, train_prms


@pytest.mark.slow  # two small trainings twice over: 20 s idle; the workers' other checks stay fast
def test_parallel_prms_equal_sequential_training(tmp_path):
    world = World()
    eff = DemoConfig(
        quick=True,
        n_train_problems=40,
        n_val_problems=2,
        n_test_problems=2,
        pretrain_steps=2,
        prm_steps=4,
        prm_batch=8,
    ).effective()
    traces, records, val_pools, test_pools, _ = demo_data(world, eff, seed=3)
    to_score = [(p.problem.question, t.steps) for p in val_pools for t in p.traces]
    par, seq = tmp_path / "par", tmp_path / "seq"
    par.mkdir()
    (par / "train_counts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    build_backbone(eff, eff, world, traces, par, lambda *a: None)
    seq.mkdir()
    shutil.copytree(par / "backbone", seq / "backbone")
    shutil.copy(par / "train_counts.jsonl", seq)

    threads = torch.get_num_threads()
    lines = []
    try:
        torch.set_num_threads(2)  # the parallel path, with one thread per worker, on any machine
        models, histories, scores = train_prms(eff, par, 3, "cpu", lines.append, to_score)
        torch.set_num_threads(1)  # one after the other in this process (the --no-parallel-prms path)
        seq_lines = []
        ref_models, ref_histories, ref_all = train_prms(
            replace(eff, parallel_prms=False), seq, 3, "cpu", seq_lines.append, to_score
        )
        assert seq_lines[-1].startswith("scored 64 candidates (") and "same time" not in seq_lines[-1]
        for name, objective in PRM_JOBS:
            prm, history, ref_scores = ref_models[name], ref_histories[name], ref_all[name]
            ref = prm.state_dict()
            got = models[name].state_dict()
            assert ref.keys() == got.keys()
            assert all(torch.equal(ref[k], got[k]) for k in ref), name
            assert [h.get("loss") for h in history] == [h.get("loss") for h in histories[name]]
            assert len(scores[name]) == len(to_score) == 32
            for a, b in zip(ref_scores, scores[name]):  # the worker's scores, in order
                assert np.array_equal(a.mu, b.mu) and np.array_equal(a.kappa, b.kappa)
        # ACA's four variants: two worker processes of one thread against this process.
        k = eff.n_candidates
        tuned = tune_selectors(
            [scores["betaprm"][i * k : (i + 1) * k] for i in range(len(val_pools))],
            [p.answers for p in val_pools],
            [p.correct for p in val_pools],
        )
        tok = PreTrainedTokenizerFast.from_pretrained(par / "backbone")
        hits = np.ones(len(test_pools))
        got_table, got_points, got_sweeps = aca_table(
            world, test_pools, hits, {}, tuned, tok, 3, run_dir=par, threads=2
        )
        ref_table, ref_points, ref_sweeps = aca_table(world, test_pools, hits, ref_models, tuned, tok, 3)
        assert got_table == ref_table and got_points == ref_points
        assert {k: [(p.knob, p.tokens, p.hits.tolist()) for p in v] for k, v in got_sweeps.items()} == {
            k: [(p.knob, p.tokens, p.hits.tolist()) for p in v] for k, v in ref_sweeps.items()
        }
        assert list(got_table)[:6] == [
            "vanilla_bon",
            "aca",
            "aca_lin",
            "aca_no_early_stop",
            "aca_reward_only",
            "aca_proxy",
        ]
        assert got_table["aca_no_early_stop"]["mean_pool_size"] == k  # the variants are not all the same run
    finally:
        torch.set_num_threads(threads)
    assert "at the same time, 1 thread each" in lines[-1] and lines[-1].startswith("scored 64 candidates")
    assert not models["betaprm"].training


def test_a_failing_worker_is_named(tmp_path):
    """A PRM whose training fails in its worker: an error naming it, not a bare pool error."""
    eff = DemoConfig(quick=True, prm_steps=2).effective()
    (tmp_path / "train_counts.jsonl").write_text('{"id": "x"}\n')  # and no backbone
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(
            RuntimeError, match=r"training the (standard_prm|betaprm) PRM failed in its worker process"
        ):
            train_prms(eff, tmp_path, 0, "cpu", lambda *a: None, [])
    finally:
        torch.set_num_threads(threads)


PARENT = """
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from betaprm.synth.processes import exit_with_parent

def job(path):
    open(path, "w").write(str(os.getpid()))
    time.sleep(120)

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=exit_with_parent,
                             initargs=(os.getpid(),)) as ex:
        ex.submit(job, sys.argv[1]).result()
"""


def test_a_worker_exits_when_its_parent_is_killed(tmp_path):
    """The demo's PRM workers stop with the demo: a parent killed with SIGKILL, which runs no
    clean-up, leaves no worker running (the initializer ``train_prms`` gives its pool). Real
    processes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script, pid_file = tmp_path / "parent.py", tmp_path / "worker.pid"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(pid_file)])
    try:
        for _ in range(600):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        os.kill(worker, 0)  # running
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        for _ in range(100):
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            raise AssertionError("the worker outlived its parent by 10 s")
    finally:
        parent.kill()
