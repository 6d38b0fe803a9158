"""The demo trains its two PRMs, and scores its pools with them, at the same time in two
worker processes on CPU: the same PRMs and scores as one after the other in this process
with the same thread count."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from betaprm.synth import World
from betaprm.synth.experiment import demo_data
from betaprm.synth.recipe import DemoConfig
from betaprm.synth.training import PRM_JOBS, build_backbone, train_prms


def test_parallel_prms_equal_sequential_training(tmp_path):
    world = World()
    eff = DemoConfig(
        quick=True,
        n_train_problems=40,
        n_val_problems=2,
        n_test_problems=2,
        pretrain_tokens=5000,
        prm_steps=4,
        prm_batch=8,
    ).effective()
    traces, records, val_pools, *_ = demo_data(world, eff, seed=3)
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
from betaprm.synth.training import exit_with_parent

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
