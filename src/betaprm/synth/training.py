"""The demo's models: a word-level tokenizer and a small Llama pretrained on error-free
traces (the backbone), then the standard PRM and the BetaPRM fine-tuned from it through
``betaprm.train`` with the same budget and seed, each scoring the pools.

Progress goes to ``log``, a callable taking one line: the two PRMs may train in worker
processes, whose lines are sent back and logged in order by the parent.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import BetaPRMInputError


def pretrain(cfg, world, tokenizer, marker, log, device="cpu"):
    """A small Llama trained as a language model on error-free traces, in the PRM's format."""
    import torch

    from ..data.dataset import pack_rows
    from ..formatting import TraceFormat, encode_traces
    from ..tiny import tiny_causal_lm
    from .policy import SynthPolicy

    torch.manual_seed(cfg.seed)
    model = (
        tiny_causal_lm(
            len(tokenizer),
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=4,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=512,
            tie_word_embeddings=cfg.tie_embeddings,
            seed=cfg.seed,
        )
        .to(device)
        .train()
    )
    clean = SynthPolicy(world, seed=cfg.seed + 101, error_boost=0.0)
    marker_id = tokenizer.convert_tokens_to_ids(marker)
    fmt = TraceFormat(marker=marker, marker_repeat=cfg.marker_repeat)  # the PRM's layout
    probe = encode_traces(
        tokenizer,
        marker_id,
        [
            (t.problem.question, t.steps)
            for p in world.sample_problems(50, cfg.seed + 7, "x")
            for t in clean.sample_traces(p, 1)
        ],
        fmt,
    )
    per_trace = np.mean([len(x) for x in probe])
    batch = 32
    steps = max(1, int(cfg.pretrain_tokens / (per_trace * batch)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / (0.05 * steps)) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    problems = world.sample_problems(steps * batch, cfg.seed + 1000, "pre")
    t0 = time.perf_counter()
    for s in range(steps):
        chunk = problems[s * batch : (s + 1) * batch]
        ids = encode_traces(
            tokenizer, marker_id, [(p.question, clean.sample_traces(p, 1)[0].steps) for p in chunk], fmt
        )
        # Packed like the PRM's batches (data/dataset.pack_rows): no padding, no attention
        # or loss across traces.
        _, packed = pack_rows([{"input_ids": x} for x in ids], tokenizer.pad_token_id)
        x, pos = packed["input_ids"].to(device), packed["position_ids"].to(device)
        labels = torch.full_like(x, -100)
        labels[:, 1:] = x[:, 1:].masked_fill(~packed["lm_keep"].to(device), -100)
        loss = model(input_ids=x, position_ids=pos, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (s + 1) % max(1, steps // 5) == 0 or s + 1 == steps:
            log(f"  pretraining step {s + 1}/{steps}  loss {loss.item():.3f}  ({time.perf_counter() - t0:.0f}s)")
    return model.cpu().eval()


def build_backbone(cfg, eff, world, train_traces, out, log, device="cpu"):
    """The word-level tokenizer and the pretrained backbone (or ``cfg.backbone`` reused),
    both saved to ``out/backbone``; returns ``(backbone, tokenizer, eff)`` with ``eff``'s
    sizes set to the backbone's."""
    from tokenizers import AddedToken

    from ..formatting import format_trace
    from ..tiny import word_tokenizer

    t0 = time.perf_counter()
    marker = "<prm>"
    if cfg.backbone:
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        if not (Path(cfg.backbone) / "config.json").is_file():
            raise BetaPRMInputError(f"--backbone {cfg.backbone}: not a saved backbone (config.json missing)")
        backbone = AutoModelForCausalLM.from_pretrained(cfg.backbone)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(cfg.backbone)
        eff = replace(
            eff,
            hidden_size=backbone.config.hidden_size,
            num_layers=backbone.config.num_hidden_layers,
            intermediate_size=backbone.config.intermediate_size,
        )
        log(f"backbone: reusing {cfg.backbone}")
    else:
        # One token per word of the traces as the PRM sees them ("Question:", connectives,
        # operators) and per number the world can write: shorter sequences than byte-level
        # BPE (about 0.75x here), so more traces per second of training.
        texts = [format_trace(t.problem.question, t.steps).replace(marker, " ") for t in train_traces[:2000]]
        tokenizer = word_tokenizer(texts, words=[str(v) for v in range(world.M)])
        tokenizer.add_tokens([AddedToken(marker, special=True, normalized=False)], special_tokens=True)
        backbone = pretrain(eff, world, tokenizer, marker, log, device)
    backbone.save_pretrained(out / "backbone")
    tokenizer.save_pretrained(out / "backbone")
    n_params = sum(p.numel() for p in backbone.parameters())
    how = (
        f"from {cfg.backbone}"
        if cfg.backbone
        else f"pretrained on {eff.pretrain_tokens / 1e6:.2f}M tokens of error-free traces"
    )
    log(
        f"backbone: Llama {eff.hidden_size}x{eff.num_layers} ({n_params / 1e6:.2f}M parameters, vocabulary "
        f"{len(tokenizer)}) {how} ({time.perf_counter() - t0:.0f}s)"
    )
    return backbone, tokenizer, eff


def train_prm(eff, out, name, objective, seed, device, log, callbacks=None):
    """One PRM fine-tuned from ``out/backbone`` on ``out/train_counts.jsonl`` through
    ``betaprm.train``; returns ``(prm, log_history)``."""
    from ..train import TrainConfig, train

    t0 = time.perf_counter()
    tc = TrainConfig(
        model=str(out / "backbone"),
        data=str(out / "train_counts.jsonl"),
        output_dir=str(out / name),
        objective=objective,
        learning_rate=eff.prm_lr,
        weight_decay=eff.prm_weight_decay,
        lr_scheduler_type=eff.prm_schedule,
        freeze_layers=eff.prm_freeze_layers,
        global_batch_size=eff.prm_batch,
        per_device_batch_size=eff.prm_batch,
        max_steps=eff.prm_steps,
        logging_steps=max(1, eff.prm_steps // 40),
        save_steps=10**9,
        save_total_limit=1,
        max_length=512,
        use_cpu=device == "cpu",
        precision="fp32",
        seed=seed,
        aux_lm_weight=eff.aux_lm_weight,
        marker_repeat=eff.marker_repeat,
        head_lr_multiplier=eff.head_lr_multiplier,
        kappa_detach=eff.kappa_detach and objective == "beta-binomial",
        group_by_length=eff.group_by_length,
        step_weights=eff.prm_step_weights,
        overwrite_output_dir=True,
    )  # the demo rewrites everything under --out
    prm, trainer, _ = train(tc, log=lambda *a: None, quiet=True, callbacks=callbacks)
    last = [h for h in trainer.state.log_history if "loss" in h][-1]
    log(
        f"{name} ({objective}): {eff.prm_steps} steps, final loss {last['loss']:.3f}, kappa mean "
        f"{last['kappa_mean']:.2f} ({time.perf_counter() - t0:.0f}s)"
    )
    return prm.eval(), trainer.state.log_history


PRM_JOBS = (("standard_prm", "soft-ce"), ("betaprm", "beta-binomial"))


def exit_with_parent(parent: int) -> None:
    """Process-pool initializer: the worker exits once its parent process is gone. A demo
    stopped with ``kill`` (not Ctrl-C, which reaches the whole process group) would otherwise
    leave its workers training for minutes."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def train_and_score(eff, out, name, objective, seed, device, traces, log):
    """``train_prm``, then the PRM's scores of ``traces`` (``(question, steps)`` pairs):
    ``(prm, log_history, scores, seconds spent scoring)``."""
    from ..scoring import score_traces

    prm, history = train_prm(eff, out, name, objective, seed, device, log)
    t0 = time.perf_counter()
    scores = score_traces(prm, traces, batch_size=64)
    return prm, history, scores, time.perf_counter() - t0


def _train_and_score_job(eff, out, name, objective, seed, device, traces, threads):
    """``train_and_score`` in a worker process with ``threads`` torch threads; the PRM
    itself stays in ``out/name`` (not sent back): ``(log line, log_history, scores, seconds)``."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    lines = []
    _, history, scores, seconds = train_and_score(eff, Path(out), name, objective, seed, device, traces, lines.append)
    return lines[-1], history, scores, seconds


def train_prms(eff, out, seed, device, log, traces):
    """Both PRMs, same budget and seed, each scoring ``traces``: ``({name: prm}, {name:
    log_history}, {name: scores})``. With ``parallel_prms`` the two train and score at the
    same time in two processes: on CPU with half the threads each (a model this small keeps
    one thread busier than two), on a GPU sharing it (its small
    kernels leave it mostly idle)."""
    import torch

    threads = torch.get_num_threads()
    models, histories, scores = {}, {}, {}
    if not (eff.parallel_prms and (device == "cuda" or threads >= 2)):
        seconds = 0.0
        for name, objective in PRM_JOBS:
            models[name], histories[name], scores[name], sec = train_and_score(
                eff, out, name, objective, seed, device, traces, log
            )
            seconds += sec
        log(f"scored {2 * len(traces)} candidates ({seconds:.0f}s)")
        return models, histories, scores

    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    from ..model import BetaPRM

    t0 = time.perf_counter()
    split = [max(1, (threads + 1) // 2), max(1, threads // 2)]  # an odd thread count: one more for the first
    with ProcessPoolExecutor(
        len(PRM_JOBS),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    ) as ex:
        futures = [
            ex.submit(_train_and_score_job, eff, str(out), name, objective, seed, device, traces, n)
            for (name, objective), n in zip(PRM_JOBS, split)
        ]
        wait(futures, return_when=FIRST_EXCEPTION)
        for (name, _), f in zip(PRM_JOBS, futures):
            if f.done() and f.exception() is not None:
                # Do not wait for the other PRM's training (long with --long) to see this.
                for proc in list((getattr(ex, "_processes", None) or {}).values()):
                    proc.terminate()
                raise RuntimeError(
                    f"training the {name} PRM failed in its worker process ({type(f.exception()).__name__}: "
                    f"{f.exception()}); "
                    "--no-parallel-prms trains in this process, with the full traceback"
                ) from f.exception()
        done = [f.result() for f in futures]
    for (name, _), (line, history, sc, _) in zip(PRM_JOBS, done):
        log(line)
        models[name], histories[name], scores[name] = (
            BetaPRM.from_pretrained(out / name, device=device).eval(),
            history,
            sc,
        )
    each = (
        "on one GPU"
        if device == "cuda"
        else f"{split[0]}{'' if split[0] == split[1] else ' and ' + str(split[1])} thread{'s' * (split[0] > 1)} each"
    )
    log(
        f"scored {2 * len(traces)} candidates ({max(d[3] for d in done):.0f}s; the two PRMs trained and scored at "
        f"the same time, {each}: {time.perf_counter() - t0:.0f}s in all)"
    )
    return models, histories, scores
