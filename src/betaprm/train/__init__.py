"""Training a BetaPRM (or the standard soft-label PRM) with the transformers Trainer.

- ``config``: ``TrainConfig``, the options of ``betaprm train`` (torch-free);
- ``run``: ``train`` and its building blocks;
- ``trainer``: ``PRMTrainer``, the Trainer subclass (loss, optimiser groups, samplers);
- ``checkpoints``: the checkpoint format and the run record a resume must match;
- ``dataset``: counts records -> token ids, the batch samplers and the collator.

This package stays torch-free on import: ``TrainConfig`` and ``OBJECTIVES`` come at once,
the other names from their modules on first use.
"""

from __future__ import annotations

import importlib

from .config import OBJECTIVES, TrainConfig

# Heavy dependency (torch, transformers): the names below load their module on first use
# (PEP 562), so `from betaprm.train import TrainConfig` and `betaprm train --help` do not
# import torch, while `from betaprm.train import train` keeps working.
_LAZY = {
    "train": "run",
    "load_or_create": "run",
    "freeze_bottom": "run",
    "apply_lora": "run",
    "hard_label_warning": "run",
    "card_of": "finish",
    "end_process_group": "finish",
    "push_to_hub": "finish",
    "HUB_FILES": "finish",
    "hub_files": "finish",
    "open_hub_repo": "finish",
    "upload_command": "finish",
    "PRMTrainer": "trainer",
    "NonFiniteStop": "trainer",
    "save_state": "checkpoints",
    "read_state": "checkpoints",
    "load_state": "checkpoints",
    "run_record": "checkpoints",
    "RunRecorder": "checkpoints",
    "STATE_NAME": "checkpoints",
    "RUN_NAME": "checkpoints",
    "NOT_RESULTS": "checkpoints",
}

__all__ = ["OBJECTIVES", "TrainConfig", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
