"""The demo's recipe: ``DemoConfig`` (every setting with its help text, the flags of
``betaprm demo``) and the presets ``--quick`` and ``--long`` fill in."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import BetaPRMInputError
from ..options import opt as _f


@dataclass
class DemoConfig:
    out: str = _f("outputs/demo", "folder for data, models, results.json and plots")
    world_config: str | None = _f(
        None, "JSON file of chain-arithmetic world settings (default: the world of docs/design.md section 6)"
    )
    seed: int = _f(0, "random seed for problems, models and training")
    quick: bool = _f(False, "a small run with the same steps (smaller data, backbone and budgets)")
    long: bool = _f(
        False,
        "the larger recipe: MLP width 384, 6,600 steps per PRM, the whole backbone fine-tuned (the default on a GPU, "
        "meant for one)",
    )
    n_train_problems: int | None = _f(None, "training problems (12000; --quick 500)")
    traces_per_train_problem: int = _f(2, "policy traces per training problem")
    error_boost: float = _f(
        2.0,
        "training traces only: multiply the error rates of verifiable steps (+, *) by this: more errors a PRM can see",
    )
    train_near_miss: float | None = _f(
        None,
        "training traces only: share of errors that are off by +-1 (0.3; the world's own is its near_miss); lower "
        "puts more errors that keep the result's parity into training, so that a parity check alone does not fit",
    )
    n_val_problems: int | None = _f(None, "validation problems, for selector tuning (300; --quick 60)")
    n_test_problems: int | None = _f(None, "test problems, the Best-of-N pools (1000; --quick 150)")
    n_candidates: int = _f(16, "candidates per pool")
    hidden_size: int | None = _f(None, "backbone width (96)")
    num_layers: int | None = _f(None, "backbone depth (8; --quick 3)")
    intermediate_size: int | None = _f(None, "backbone MLP width (192; --long 384)")
    tie_embeddings: bool = _f(
        False,
        "tie the backbone's output layer to its input embeddings: the written result and the predicted one in one "
        "space",
    )
    pretrain_steps: int | None = _f(
        None,
        "language-model pretraining steps of 32 error-free traces (450; --quick 90): steps, not tokens, so that "
        "longer chains do not get fewer",
    )
    pretrain_lr: float = _f(2e-3, "pretraining learning rate")
    check_steps: int | None = _f(
        None,
        "at most this many steps of check pretraining after the language modelling (2000; --quick 100; 0: none): "
        "the backbone also learns to spot results that the pretraining replaced (ELECTRA-style, no MC counts), as a "
        "pretrained LLM can check arithmetic. It stops earlier once the check has formed (--check-until)",
    )
    check_until: float = _f(
        0.05,
        "check pretraining keeps its learning rate up until its replaced-result loss, over the last 100 steps, is "
        "under this (the check has formed), then decays it over --check-decay-steps; 0: never early, a fixed "
        "--check-steps",
    )
    check_decay_steps: int | None = _f(None, "check pretraining's learning-rate decay, in steps (200; --quick 20)")
    check_lr: float = _f(1e-3, "check pretraining's peak learning rate (AdamW)")
    check_batch: int = _f(32, "traces per check-pretraining step")
    prm_steps: int | None = _f(None, "optimiser steps for each PRM (1500; --quick 120, --long 6600)")
    prm_batch: int = _f(32, "traces per PRM optimiser step")
    prm_micro_batches: int | None = _f(
        None,
        "forward passes per PRM optimiser step (2; --long 1): the step's random traces dealt into them by length "
        "(betaprm train --batch-rebalance), so each pass pads less; the same batches and loss as one pass",
    )
    prm_freeze_layers: int | None = _f(
        None,
        "PRM training: freeze the backbone's embeddings and bottom N layers (4; --quick 1, --long 0; betaprm train "
        "--freeze-layers): no backward pass through them, so a step costs less, and the step check that check "
        "pretraining puts in those layers is kept as it is",
    )
    prm_lr: float | None = _f(
        None,
        "PRM learning rate (0.001; --long 0.0003: --long fine-tunes the whole backbone, the layers that hold check "
        "pretraining's step check included)",
    )
    prm_weight_decay: float = _f(0.05, "PRM AdamW weight decay (betaprm train --weight-decay)")
    prm_schedule: str = _f(
        "cosine",
        "PRM learning-rate schedule after the warm-up (a transformers scheduler name: cosine, constant_with_warmup, "
        "linear)",
    )
    head_lr_multiplier: float = _f(
        1.0,
        "kappa head learning rate / prm_lr (the paper uses 10 at lr 1e-5 on 8B models)",
    )
    aux_lm_weight: float = _f(1.0, "auxiliary language-model loss during PRM training")
    marker_repeat: int = _f(1, "markers per step, scores read at the last (2 gives the small model an extra position)")
    kappa_detach: bool = _f(
        True,
        "BetaPRM: stop the kappa head's gradient at the backbone (only mu's loss shapes the backbone)",
    )
    parallel_prms: bool = _f(
        True,
        "train the two PRMs at the same time in two processes: on CPU (2 or more threads) with half the threads each "
        "(the same PRMs as one after the other with that thread count); on a GPU, sharing it. On CPU ACA's variants "
        "run in two processes too, one per PRM. From Python, call run_demo under if __name__ == '__main__' (the "
        "workers are spawned)",
    )
    group_by_length: bool = _f(
        False,
        "PRM training batches from traces of similar length (betaprm train --group-by-length): faster steps, less "
        "mixed batches",
    )
    prm_step_weights: str = _f(
        "batch",
        "PRM training: batch (each optimiser step's loss the mean over its own scored steps) or data (over the data's "
        "mean count: every step weighs the same, as in random batches, also when --group-by-length makes batches of "
        "unequal step counts); betaprm train --step-weights",
    )
    aca: bool = _f(True, "also run Adaptive Computation Allocation and its ablations on the test problems")
    aca_frontier: bool = _f(
        True,
        "with --aca: run each ACA variant at every value of its own knob (stopping bounds, score margin, budget) "
        "for its accuracy-against-tokens frontier, compared at matched tokens (about 4x ACA's time)",
    )
    threads: int = _f(0, "torch CPU threads (0: torch's default)")
    device: str = _f(
        "auto",
        "cpu, cuda or auto (cuda when torch sees a GPU). On a GPU the run takes the --long recipe unless --quick "
        "is given (the steps run in fp32; numbers differ slightly from a CPU's)",
    )
    backbone: str | None = _f(
        None, "a backbone directory saved by an earlier demo run (its OUT/backbone): skips pretraining"
    )
    reuse_prms: bool = _f(
        False,
        "reuse the backbone and both PRMs that a finished run with the same settings left in --out (its "
        "results.json says which): skips pretraining and training, reruns scoring, tuning, ACA and the report",
        added=True,
    )

    def __post_init__(self):
        bad = [
            f"{k} must be >= 1, got {getattr(self, k)}"
            for k in (
                "n_train_problems",
                "traces_per_train_problem",
                "n_val_problems",
                "n_test_problems",
                "n_candidates",
                "hidden_size",
                "num_layers",
                "intermediate_size",
                "pretrain_steps",
                "prm_steps",
                "prm_batch",
                "prm_micro_batches",
            )
            if getattr(self, k) is not None and getattr(self, k) < 1
        ]
        if self.n_candidates < 2:
            bad.append("n_candidates must be >= 2 for Best-of-N")
        if self.train_near_miss is not None and not 0 <= self.train_near_miss <= 1:
            bad.append(f"train_near_miss must be in [0, 1], got {self.train_near_miss}")
        if self.quick and self.long:
            bad.append("--quick and --long are two different runs: choose one")
        # Checked here, not minutes later when the PRMs start training.
        if self.check_steps is not None and self.check_steps < 0:
            bad.append(f"check_steps must be >= 0, got {self.check_steps}")
        if self.check_decay_steps is not None and self.check_decay_steps < 1:
            bad.append(f"check_decay_steps must be >= 1, got {self.check_decay_steps}")
        if self.check_batch < 1:
            bad.append(f"check_batch must be >= 1, got {self.check_batch}")
        if self.check_lr <= 0:
            bad.append(f"check_lr must be > 0, got {self.check_lr}")
        if self.check_until < 0:
            bad.append(f"check_until must be >= 0, got {self.check_until}")
        if self.prm_freeze_layers is not None and self.prm_freeze_layers < 0:
            bad.append(f"prm_freeze_layers must be >= 0, got {self.prm_freeze_layers}")
        if self.prm_weight_decay < 0:
            bad.append(f"prm_weight_decay must be >= 0, got {self.prm_weight_decay}")
        if self.prm_step_weights not in ("batch", "data"):
            bad.append(f"prm_step_weights must be batch or data, got {self.prm_step_weights!r}")
        from transformers import SchedulerType

        if self.prm_schedule not in {t.value for t in SchedulerType}:
            bad.append(
                f"prm_schedule must be a transformers scheduler name (cosine, linear, ...), got {self.prm_schedule!r}"
            )
        if self.device not in ("cpu", "cuda", "auto"):
            bad.append(f"device must be cpu, cuda or auto, got {self.device!r}")
        if bad:
            raise BetaPRMInputError("bad demo configuration: " + "; ".join(bad))

    def torch_device(self) -> str:
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise BetaPRMInputError("--device cuda: torch sees no CUDA GPU here; use --device cpu (or auto)")
        return "cuda" if self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available()) else "cpu"

    def recipe(self) -> str:
        """quick, long or default: --long is the default on a GPU (``--device cuda``, or
        ``auto`` with one present)."""
        if self.quick:
            return "quick"
        return "long" if self.long or self.torch_device() == "cuda" else "default"

    def effective(self) -> DemoConfig:
        """The settings of the run: a setting left unset (None) takes the value of ``--quick``
        or ``--long`` if one is on, else the default recipe's; a setting given is kept, even
        when it equals the default recipe's."""
        preset = {**BASE, **PRESETS.get(self.recipe(), {})}
        eff = replace(self, **{k: v for k, v in preset.items() if getattr(self, k) is None})
        if eff.prm_batch % eff.prm_micro_batches:
            raise BetaPRMInputError(
                f"bad demo configuration: prm_batch {eff.prm_batch} is not a multiple of prm_micro_batches "
                f"{eff.prm_micro_batches}; change one of them (--prm-batch, --prm-micro-batches)"
            )
        if not eff.backbone and eff.prm_freeze_layers > eff.num_layers:
            raise BetaPRMInputError(
                f"bad demo configuration: prm_freeze_layers {eff.prm_freeze_layers} > num_layers {eff.num_layers}; "
                f"freeze at most {eff.num_layers} (--prm-freeze-layers)"
            )
        return eff


# The default recipe's values of the settings that the presets change.
BASE = dict(
    n_train_problems=12_000,
    n_val_problems=300,
    n_test_problems=1000,
    pretrain_steps=450,  # about 1M tokens on the default world
    # The check forms at step 600-800 on most seeds, after 1,000 on some: up to 2,000 steps,
    # fewer once it has formed (training.check_pretrain; benchmarks/RESULTS.md).
    check_steps=2000,
    check_decay_steps=200,
    # 1,500 rather than 1,000: BetaPRM mu MAE lower on 6 of 7 demo runs over three worlds, AUROC
    # within 0.01 (benchmarks/RESULTS.md, "1,500 PRM steps by default").
    prm_steps=1500,
    # Each step's random 32 traces in two length-sorted passes: the PRM phase 1.13-1.15x faster on
    # long chains, the same targets met or more (benchmarks/RESULTS.md, "two length-sorted passes").
    prm_micro_batches=2,
    prm_freeze_layers=4,
    prm_lr=1e-3,
    train_near_miss=0.3,
    hidden_size=96,
    num_layers=8,
    intermediate_size=192,
)
PRESETS = {
    "quick": dict(
        n_train_problems=500,
        n_val_problems=60,
        n_test_problems=150,
        pretrain_steps=90,
        check_steps=100,
        check_decay_steps=20,
        prm_steps=120,
        num_layers=3,
        prm_freeze_layers=1,
    ),
    # Found with a GPU sweep of probes (benchmarks/RESULTS.md; the script, benchmarks/probe_sweep.sh,
    # is at commit 0bbc6e2): the smallest budget seen to learn the mod-5 half of the step check,
    # not only parity.
    # One pass per step: the runs this preset was measured with (benchmarks/RESULTS.md).
    "long": dict(prm_steps=6600, intermediate_size=384, prm_freeze_layers=0, prm_lr=3e-4, prm_micro_batches=1),
}
