"""Warnings for training runs that would otherwise surprise silently: a global batch larger
than the data (every optimiser step is an epoch), a warmup that never ends, and a run of only a
few optimiser steps. Free of torch; ``train()`` logs what :func:`batch_warnings` returns once
the data is encoded (the number of traces is known then)."""

from __future__ import annotations

import math

from ..errors import BetaPRMInputError
from .config import TrainConfig, resolve_global_batch, uses_batch_rebalance

FEW_STEPS = 5
"""Fewer optimiser steps than this is "a handful": warned about when the epochs made it so."""

NO_WARMUP = ("constant", "reduce_lr_on_plateau")
"""transformers schedulers that take no warmup."""


def global_batch(cfg: TrainConfig, world: int) -> int:
    """Traces per optimiser step over all devices: --global-batch-size, or per-device x
    --gradient-accumulation-steps x devices when only the steps are given."""
    return resolve_global_batch(cfg, world).global_batch_size


def optimiser_steps(cfg: TrainConfig, n_traces: int, world: int) -> tuple[int, int]:
    """``(steps per epoch, steps in the run)`` as the Trainer counts them: an epoch of
    ``n_traces`` makes ceil(n / global batch) optimiser steps (at least one: a global batch
    larger than the data makes one step of all of it), the run --max-steps of them or
    ceil(--num-train-epochs x steps per epoch). With --max-batch-tokens the global batch is
    reached on average, so the counts are about right."""
    per_epoch = max(1, math.ceil(n_traces / global_batch(cfg, world)))
    total = cfg.max_steps if cfg.max_steps > 0 else math.ceil(cfg.num_train_epochs * per_epoch)
    return per_epoch, total


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    """The Trainer's warmup for --warmup-steps, else --warmup-ratio over ``total`` steps (0 for
    schedulers without one)."""
    if cfg.lr_scheduler_type in NO_WARMUP:
        return 0
    if cfg.warmup_steps:
        return int(cfg.warmup_steps)
    if cfg.warmup_ratio <= 0:
        return 0
    return math.ceil(total * cfg.warmup_ratio)


def batch_warnings(cfg: TrainConfig, n_traces: int, world: int = 1) -> list[str]:
    """What ``train`` should warn about before it starts, for ``n_traces`` encoded traces on
    ``world`` devices: each message says what will happen and which flags change it."""
    out = []
    batch = global_batch(cfg, world)
    per_epoch, total = optimiser_steps(cfg, n_traces, world)
    more_steps = (
        "a larger --max-steps"
        if cfg.max_steps > 0
        else "more --num-train-epochs (or --max-steps), a smaller --global-batch-size, or more data"
    )
    if batch > n_traces:
        epochs = math.ceil(total / per_epoch) if cfg.max_steps > 0 else cfg.num_train_epochs
        micro = batch // (cfg.per_device_train_batch_size * world) * world if not cfg.max_batch_tokens else 0
        repeat = (
            f"; --batch-rebalance fills the step's {micro} forward passes by repeating traces"
            if uses_batch_rebalance(cfg) and micro > n_traces
            else ""
        )
        pass_size = cfg.per_device_train_batch_size * world
        fix = (
            f"a --global-batch-size well below {n_traces} (a multiple of --per-device-train-batch-size x devices = "
            f"{pass_size}"
            + (", so a smaller --per-device-train-batch-size too" if pass_size > n_traces // 2 else "")
            + ")"
            if not cfg.max_batch_tokens
            else f"a --global-batch-size well below {n_traces}"
        )
        out.append(
            f"--global-batch-size {batch} is larger than the data ({n_traces} traces after encoding): every optimiser "
            f"step takes all {n_traces} traces, so each step is a whole epoch and the run makes {total} step(s) over "
            f"{epochs:g} epoch(s), not steps of {batch} traces{repeat}. For several steps per epoch give {fix}, or "
            "train on more records"
        )
    warm = warmup_steps(cfg, total)
    if total < 1:
        out.append(
            f"--num-train-epochs {cfg.num_train_epochs:g} makes no optimiser step: the saved model is the starting "
            "one. Give --num-train-epochs > 0 or --max-steps"
        )
    elif warm >= total:
        flag = f"--warmup-steps {cfg.warmup_steps}" if cfg.warmup_steps else f"--warmup-ratio {cfg.warmup_ratio:g}"
        if total == 1:
            what = (
                f"the run makes one optimiser step and {flag} makes it a warmup step, "
                "taken at learning rate 0: the weights do not change and the saved model is the starting one"
            )
        else:
            what = (
                f"{flag} of the run's {total} optimiser steps is {warm} warmup steps, "
                f"the whole run: the learning rate rises from 0 (the first step) and never reaches --learning-rate "
                f"{cfg.learning_rate:g}"
            )
        out.append(f"{what}. Lower {flag.split()[0]} (0: no warmup), or make more steps: {more_steps}")
    elif total < FEW_STEPS and (cfg.max_steps <= 0 or warm) and batch <= n_traces:  # else said above
        why = (
            f"--max-steps {total}"
            if cfg.max_steps > 0
            else f"--num-train-epochs {cfg.num_train_epochs:g} x {per_epoch} step(s) per epoch ({n_traces} traces "
            f"at --global-batch-size {batch})"
        )
        first = f"; {warm} of them warm up, the first at learning rate 0" if warm else ""
        out.append(f"the run makes only {total} optimiser step(s) ({why}){first}. For a trained model: {more_steps}")
    return out


def check_trackers(report_to: str) -> None:
    """Refuse a --report-to tracker the Trainer does not know or cannot load, before any data or
    model is read; the lists are transformers' own (``transformers.integrations``)."""
    from transformers.integrations import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

    names = [r.strip() for r in report_to.split(",") if r.strip() and r.strip() not in ("none", "all")]
    unknown = [r for r in names if r not in INTEGRATION_TO_CALLBACK]
    if unknown:
        raise BetaPRMInputError(
            f"--report-to {report_to}: {', '.join(map(repr, unknown))} is not a tracker transformers knows; choose "
            f"from {', '.join(sorted(INTEGRATION_TO_CALLBACK))}, or none"
        )
    missing = [r for r in names if r not in get_available_reporting_integrations()]
    if missing:
        raise BetaPRMInputError(
            f"--report-to {report_to}: {', '.join(missing)} is not installed; install it (`pip install "
            f"{' '.join(missing)}`) or leave it out of --report-to"
        )
