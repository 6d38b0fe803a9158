"""The demo's models: a word-level tokenizer and a small Llama pretrained on error-free
traces (the backbone), then the standard PRM and the BetaPRM fine-tuned from it through
``betaprm.train`` with the same budget and seed, each scoring the pools.

Progress goes to ``log``, a callable taking one line: the two PRMs may train in worker
processes, whose lines are sent back and logged in order by the parent.

Over 400 lines because the backbone's two pretraining stages and the PRMs' training belong
together: each stage consumes what the one before it saves.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..batching import first_fit_rows, pack_rows
from ..errors import BetaPRMInputError
from ..formatting import TraceFormat, encode_traces, format_trace
from ..model import BetaPRM
from ..scoring import score_traces
from ..tiny import tiny_causal_lm, word_tokenizer
from ..train.config import TrainConfig
from ..train.run import train
from .policy import SynthPolicy
from .processes import exit_with_parent


def _warmup_cosine(opt, steps):
    """Linear warm-up over the first 5% of ``steps``, then cosine decay to 0 (the
    backbone's pretraining and check pretraining)."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / (0.05 * steps)) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )


def demo_tokenizer(world, traces, marker="<prm>"):
    """The demo's word-level tokenizer, from ``(question, steps)`` pairs: one token per word
    of the traces as the PRM sees them ("Question:", connectives, operators) and per number
    the world can write, plus ``marker``. Shorter sequences than byte-level BPE (about 0.75x
    here), so more traces per second of training."""
    from tokenizers import AddedToken

    texts = [format_trace(question, steps).replace(marker, " ") for question, steps in traces]
    tokenizer = word_tokenizer(texts, words=[str(v) for v in range(world.M)])
    tokenizer.add_tokens([AddedToken(marker, special=True, normalized=False)], special_tokens=True)
    return tokenizer


def new_backbone(cfg, vocab_size: int):
    """The demo's Llama of ``cfg``'s sizes, freshly initialised from ``cfg.seed``."""
    return tiny_causal_lm(
        vocab_size,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=4,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=512,
        tie_word_embeddings=cfg.tie_embeddings,
        seed=cfg.seed,
    )


def pretrain(cfg, world, tokenizer, marker, log, device="cpu"):
    """A small Llama trained as a language model on error-free traces, in the PRM's format."""
    torch.manual_seed(cfg.seed)
    model = new_backbone(cfg, len(tokenizer)).to(device).train()
    # No KV cache: with one, transformers builds a plain causal mask and ignores the packed
    # position ids, so packed traces would attend to the ones before them in their row.
    model.config.use_cache = False
    clean = SynthPolicy(world, seed=cfg.seed + 101, error_boost=0.0)
    marker_id = tokenizer.convert_tokens_to_ids(marker)
    fmt = TraceFormat(marker=marker, marker_repeat=cfg.marker_repeat)  # the PRM's layout
    # A budget in optimiser steps, not tokens: the arithmetic is learned step by step, and a
    # token budget buys fewer steps on longer chains (290 instead of 443 on
    # benchmarks/worlds/long_chains.json), after which check pretraining stalled at the
    # parity half of the check (benchmarks/RESULTS.md).
    steps, batch, n_tokens = cfg.pretrain_steps, 32, 0
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr, weight_decay=0.01)
    sched = _warmup_cosine(opt, steps)
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
        n_tokens += sum(map(len, ids))
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
    log(f"  pretrained on {n_tokens / 1e6:.2f}M tokens")
    checked = check_pretrain(model, cfg, world, tokenizer, fmt, log, device) if cfg.check_steps else 0
    return model.cpu().eval(), checked


def replaced_trace(world, problem, rng, rate, proposal=None):
    """A trace of ``problem`` whose verifiable results are each replaced, with probability
    ``rate``, by another number, the chain going on from the written value as a policy's
    would: ``(step texts, replaced flag per op step)``. The replacement of op step s is the
    true result plus a nonzero offset: drawn from ``proposal[s]`` (a distribution over the
    values, the true one at 0, see ``lm_proposals``), or uniform without one."""
    values, flags, v = [], [], problem.start
    true = problem.true_values() if proposal is not None else None
    for s in range(problem.T):
        c, f = int(problem.apply(s, v)), False
        if problem.ops[s][0] != "?" and rng.random() < rate:
            if proposal is None:
                offset = int(rng.integers(1, world.M))
            else:
                offset = (int(rng.choice(world.M, p=proposal[s])) - true[s]) % world.M
            c, f = (c + offset) % world.M, True
        values.append(c)
        flags.append(f)
        v = c
    return world.step_texts(problem, values, 0, rng), flags


CHECK_REPLACE_RATE = 0.5  # share of verifiable results replaced in check pretraining (0.3 took off later)
CHECK_WINDOW = 100  # steps over which check pretraining's loss says whether the check has formed


def proposal_autocast(device):
    """bf16 autocast for ``lm_proposals``' forward pass where the hardware computes in bf16
    (a GPU with bf16, a CPU with AVX512-BF16 or AMX): a proposal distribution needs no more
    precision. Training stays in fp32. Elsewhere fp32: emulated bf16 is slower
    (benchmarks/RESULTS.md has the timings)."""
    device = torch.device(device)
    if device.type == "cuda":
        fast = torch.cuda.is_bf16_supported()
    else:  # torch.cpu's private probes: absent in some builds, then fp32
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        fast = any(getattr(torch.cpu, f, lambda: False)() for f in probes)
    return torch.autocast(device.type, dtype=torch.bfloat16) if fast else contextlib.nullcontext()


def lm_proposals(model, world, tokenizer, fmt, problems, rng, device="cpu") -> list[np.ndarray]:
    """ELECTRA's generator, from the backbone itself: per problem, a ``(T, M)`` array whose
    row s is the language model's distribution over op step s's result on the problem's
    error-free trace, the true value excluded (renormalised). Replacements drawn from it are
    the values the model itself finds plausible there: once it has learned the parity of
    the results, wrong values of the right parity, the errors a parity check cannot see.
    Uniform replacements let the check stop at parity on one seed of three (still there
    after 1,000 steps; benchmarks/RESULTS.md)."""
    texts = [world.step_texts(p, p.true_values(), 0, rng) for p in problems]
    marker_id = tokenizer.convert_tokens_to_ids(fmt.marker)
    ids = encode_traces(tokenizer, marker_id, [(p.question, t) for p, t in zip(problems, texts)], fmt)
    # The detection target carries (trace, step) codes, so the packed order maps back.
    codes = [[1000 * i + s for s in range(p.T)] for i, p in enumerate(problems)]
    x, pos, _, target = check_batch(ids, codes, marker_id, tokenizer.pad_token_id, fmt.marker_repeat)
    rows, cols = (target >= 0).nonzero(as_tuple=True)
    with torch.no_grad():
        with proposal_autocast(device):
            hidden = model.model(input_ids=x.to(device), position_ids=pos.to(device)).last_hidden_state
        # The result sits marker_repeat tokens before its last marker; one more back predicts it.
        at = hidden[rows.to(device), (cols - fmt.marker_repeat - 1).to(device)].float()
        logits = model.lm_head(at).double().cpu()
    number_ids = torch.tensor(tokenizer.convert_tokens_to_ids([str(v) for v in range(world.M)]))
    trace, step = np.divmod(target[rows, cols].long().numpy(), 1000)
    truths = [p.true_values() for p in problems]
    truth = torch.tensor([truths[i][s] for i, s in zip(trace, step)])
    logits = logits[:, number_ids]
    logits[torch.arange(len(truth)), truth] = -float("inf")
    prob = torch.softmax(logits, -1).numpy()
    out = [np.zeros((p.T, world.M)) for p in problems]
    for i, s, row in zip(trace, step, prob):
        out[i][s] = row / row.sum()  # rng.choice wants a sum of 1 to float64 rounding
    return out


def check_schedule(opt, warmup, decay):
    """Warm-up, then a constant learning rate until ``.decay_from`` is set, then cosine
    decay to 0 over ``decay`` steps (a warmup-stable-decay schedule): check pretraining
    runs until the check has formed, which takes a different number of steps on each seed."""

    class Schedule(torch.optim.lr_scheduler.LambdaLR):
        decay_from = None

        def __init__(self):
            super().__init__(opt, self.factor)

        def factor(self, s):
            if self.decay_from is None or s < self.decay_from:
                return min(1.0, (s + 1) / warmup)
            return 0.5 * (1 + math.cos(math.pi * min(s - self.decay_from, decay) / decay))

    return Schedule()


def check_pretrain(model, cfg, world, tokenizer, fmt, log, device="cpu") -> int:
    """Replaced-result detection (ELECTRA's replaced-token detection, on results): the
    pretrained backbone goes on as a language model on traces whose verifiable results the
    pretraining itself replaced by values its own language model finds plausible there
    (``lm_proposals``, ``replaced_trace``; no MC counts and no world errors), and
    a linear head on the final hidden state at each op step's marker (and at the result
    itself) learns whether that result was replaced. The head is dropped afterwards: what
    stays is a backbone that checks a step where the PRM reads it, as a pretrained LLM can
    check arithmetic. A PRM learns that check from MC counts alone far more slowly
    (benchmarks/RESULTS.md).

    The check forms suddenly (the replaced-result loss falls from the parity plateau, about
    0.35, to under 0.05 within 100-200 steps), and when it does differs from seed to seed:
    step 600 on one, after step 1,000 on another (benchmarks/RESULTS.md). So the learning
    rate stays up until the loss at the marker, over the last ``CHECK_WINDOW`` steps, is
    under ``cfg.check_until``, then decays over ``cfg.check_decay_steps``; at most
    ``cfg.check_steps`` steps in all. Returns the number of steps taken."""
    import torch.nn.functional as F

    model.config.use_cache = False  # packed rows: see pretrain
    torch.manual_seed(cfg.seed + 2)
    head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
    params = list(model.parameters()) + list(head.parameters())
    steps, batch = cfg.check_steps, cfg.check_batch
    decay = max(1, min(cfg.check_decay_steps, steps))
    opt = torch.optim.AdamW(params, lr=cfg.check_lr, weight_decay=0.01)
    sched = check_schedule(opt, warmup=max(1, min(50, steps // 20)), decay=decay)
    rng = np.random.default_rng(cfg.seed + 2002)
    problems = world.sample_problems(steps * batch, cfg.seed + 2000, "check")
    marker_id = tokenizer.convert_tokens_to_ids(fmt.marker)
    pad = tokenizer.pad_token_id
    recent = collections.deque(maxlen=CHECK_WINDOW)
    if decay >= steps:  # no room to wait for the check: decay from the start
        sched.decay_from = 0
    last = steps  # the step check pretraining ends at: sooner once the decay has started
    t0 = time.perf_counter()
    s = 0
    while s < last:
        chunk = problems[s * batch : (s + 1) * batch]
        proposals = lm_proposals(model, world, tokenizer, fmt, chunk, rng, device)
        traces = [replaced_trace(world, p, rng, CHECK_REPLACE_RATE, q) for p, q in zip(chunk, proposals)]
        ids = encode_traces(tokenizer, marker_id, [(p.question, t) for p, (t, _) in zip(chunk, traces)], fmt)
        x, pos, labels, target = check_batch(ids, [f for _, f in traces], marker_id, pad, fmt.marker_repeat)
        x, pos, labels, target = x.to(device), pos.to(device), labels.to(device), target.to(device)
        hidden = model.model(input_ids=x, position_ids=pos).last_hidden_state
        logits = model.lm_head(hidden)
        lm = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        at_marker = target >= 0
        check = F.binary_cross_entropy_with_logits(head(hidden[at_marker]).squeeze(-1), target[at_marker])
        # The same target at the result itself, where the check is one hop shorter (the
        # result against the prediction one position back): learned there first, the marker
        # then copies it. With the marker alone, one seed of three was still at chance after
        # 1,000 steps (benchmarks/RESULTS.md).
        at_result, result_target = at_results(target, fmt.marker_repeat)
        check_result = F.binary_cross_entropy_with_logits(head(hidden[at_result]).squeeze(-1), result_target)
        loss = lm + check + check_result
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        s += 1
        recent.append(check.item())
        if sched.decay_from is None:
            formed = len(recent) == CHECK_WINDOW and sum(recent) / CHECK_WINDOW < cfg.check_until
            if formed or s == steps - decay:
                sched.decay_from, last = s, s + decay
                log(
                    f"  check pretraining: {'the check formed' if formed else 'the check has not formed'} by step "
                    f"{s} (replaced-result loss {sum(recent) / len(recent):.3f} over the last {len(recent)} "
                    f"steps); the learning rate decays over {decay} steps"
                )
        if s % max(1, min(steps, 1000) // 5) == 0 or s == last:
            log(
                f"  check pretraining step {s} (of at most {steps})  LM loss {lm.item():.3f}  replaced-result loss "
                f"{check.item():.3f} at the marker, {check_result.item():.3f} at the result  "
                f"({time.perf_counter() - t0:.0f}s)"
            )
    return s


def at_results(target, marker_repeat=1):
    """The result positions of ``check_batch``'s ``target`` (each op step's written
    result, ``marker_repeat`` tokens before its last marker) and their targets, in the same
    order as ``target[target >= 0]``."""
    at_marker = target >= 0
    at_result = torch.zeros_like(at_marker)
    at_result[:, :-marker_repeat] = at_marker[:, marker_repeat:]
    return at_result, target[:, marker_repeat:][at_marker[:, marker_repeat:]]


def check_batch(ids, flags, marker_id, pad_id, marker_repeat=1):
    """One check-pretraining batch, packed as in ``pretrain`` (no padding, no attention or
    loss across traces): ``input_ids``, ``position_ids``, language-model ``labels``
    (aligned with the inputs; -100 at each trace's first token, at padding and at replaced
    results) and the detection ``target`` (1.0 / 0.0 at the last marker of each op step,
    -1 elsewhere). ``flags[i][k]``: op step k of trace i was replaced."""
    lengths = [len(x) for x in ids]
    cap = max(lengths)
    rows = first_fit_rows(lengths)
    x = torch.full((len(rows), cap), pad_id, dtype=torch.long)
    pos = torch.zeros_like(x)
    labels = torch.full_like(x, -100)
    target = torch.full(x.shape, -1.0)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            seq = ids[i]
            n = len(seq)
            x[r, at : at + n] = torch.as_tensor(seq)
            pos[r, at : at + n] = torch.arange(n)
            labels[r, at + 1 : at + n] = torch.as_tensor(seq[1:])
            marks = [j for j, t in enumerate(seq) if t == marker_id][marker_repeat - 1 :: marker_repeat]
            for k, replaced in enumerate(flags[i]):  # marks[k] closes op step k; its result precedes its markers
                target[r, at + marks[k]] = float(replaced)
                if replaced:
                    labels[r, at + marks[k] - marker_repeat] = -100
            at += n
        pos[r, at:] = torch.arange(cap - at)
    return x, pos, labels, target


def load_backbone(folder, eff):
    """A backbone and its tokenizer saved by a demo run (its ``OUT/backbone``), and ``eff``
    with its sizes set to the backbone's: ``(backbone, tokenizer, eff)``."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    backbone = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    eff = replace(
        eff,
        hidden_size=backbone.config.hidden_size,
        num_layers=backbone.config.num_hidden_layers,
        intermediate_size=backbone.config.intermediate_size,
    )
    return backbone, tokenizer, eff


def build_backbone(cfg, eff, world, train_traces, out, log, device="cpu"):
    """The word-level tokenizer and the pretrained backbone (or ``cfg.backbone`` reused),
    both saved to ``out/backbone``; returns ``(backbone, tokenizer, eff)`` with ``eff``'s
    sizes set to the backbone's."""
    t0 = time.perf_counter()
    marker = "<prm>"
    if cfg.backbone:
        if not (Path(cfg.backbone) / "config.json").is_file():
            raise BetaPRMInputError(f"--backbone {cfg.backbone}: not a saved backbone (config.json missing)")
        backbone, tokenizer, eff = load_backbone(cfg.backbone, eff)
        if (eff.prm_freeze_layers or 0) > eff.num_layers:
            raise BetaPRMInputError(
                f"--prm-freeze-layers {eff.prm_freeze_layers}: the backbone {cfg.backbone} has {eff.num_layers} "
                f"layers; freeze at most {eff.num_layers}"
            )
        log(f"backbone: reusing {cfg.backbone}")
    else:
        tokenizer = demo_tokenizer(world, [(t.problem.question, t.steps) for t in train_traces[:2000]], marker)
        backbone, checked = pretrain(eff, world, tokenizer, marker, log, device)
    backbone.save_pretrained(out / "backbone")
    tokenizer.save_pretrained(out / "backbone")
    n_params = sum(p.numel() for p in backbone.parameters())
    how = (
        f"from {cfg.backbone}"
        if cfg.backbone
        else f"pretrained for {eff.pretrain_steps} steps on error-free traces"
        + (f", then {checked} steps of replaced-result detection" if eff.check_steps else "")
    )
    log(
        f"backbone: Llama {eff.hidden_size}x{eff.num_layers} ({n_params / 1e6:.2f}M parameters, vocabulary "
        f"{len(tokenizer)}) {how} ({time.perf_counter() - t0:.0f}s)"
    )
    return backbone, tokenizer, eff


def train_prm(eff, out, name, objective, seed, device, log, callbacks=None):
    """One PRM fine-tuned from ``out/backbone`` on ``out/train_counts.jsonl`` through
    ``betaprm.train``; returns ``(prm, log_history)``."""
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
        per_device_train_batch_size=eff.prm_batch // eff.prm_micro_batches,
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


def load_prms(out, device, log, traces):
    """``train_prms``'s result from the PRMs an earlier run of the same settings saved in
    ``out`` (``--reuse-prms``): each loaded, its training history read from its
    ``train_summary.json``, its scores of ``traces`` made again."""
    models, histories, scores = {}, {}, {}
    t0 = time.perf_counter()
    for name, objective in PRM_JOBS:
        models[name] = BetaPRM.from_pretrained(Path(out) / name, device=device).eval()
        histories[name] = json.loads((Path(out) / name / "train_summary.json").read_text())["log_history"]
        scores[name] = score_traces(models[name], traces, batch_size=64)
        log(f"{name} ({objective}): reusing {Path(out) / name}")
    log(f"scored {2 * len(traces)} candidates ({time.perf_counter() - t0:.0f}s)")
    return models, histories, scores


def train_and_score(eff, out, name, objective, seed, device, traces, log):
    """``train_prm``, then the PRM's scores of ``traces`` (``(question, steps)`` pairs):
    ``(prm, log_history, scores, seconds spent scoring)``."""
    prm, history = train_prm(eff, out, name, objective, seed, device, log)
    t0 = time.perf_counter()
    scores = score_traces(prm, traces, batch_size=64)
    return prm, history, scores, time.perf_counter() - t0


def _train_and_score_job(eff, out, name, objective, seed, device, traces, threads):
    """``train_and_score`` in a worker process with ``threads`` torch threads; the PRM
    itself stays in ``out/name`` (not sent back): ``(log line, log_history, scores, seconds)``."""
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
