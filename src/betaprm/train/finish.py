"""What comes after a run's last step: the model card's facts, the upload to the hub, and
the end of a multi-process run's process group."""

from __future__ import annotations

import torch.distributed as dist

from ..card import license_of
from ..errors import BetaPRMInputError
from ..hub import resolve_model
from .config import TrainConfig


def card_of(cfg: TrainConfig, record: dict) -> dict:
    """The model card's settings for the final model (``betaprm.card.model_card``): its hub
    name, licence (``--license``, else the base model's card's) and training data (its
    fingerprint from the run ``record``)."""
    return {
        "name": cfg.push_to_hub,
        "license": cfg.license or license_of(resolve_model(cfg.model).path),
        "data": {"name": cfg.data, "fingerprint": record["settings"]["data"]},
    }


def end_process_group() -> None:
    """Close the process group a multi-process run opened (torchrun, accelerate launch), all
    ranks together. Left to interpreter exit, gloo's threads can be torn down while still
    joinable and abort a process that has finished its work (SIGABRT, "terminate called
    without an active exception"), which the launcher reports as a failed run."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


HUB_IGNORE = ["checkpoint-*", "runs/*", "rejects.jsonl", "*.lock"]
"""What --push-to-hub leaves out of --output-dir: resumable checkpoints, logs, rejects."""


def push_to_hub(folder, repo_id: str, private: bool = False) -> str:
    """Upload the final BetaPRM directory (``HUB_IGNORE`` left out) to ``repo_id`` through
    ``huggingface_hub``, creating the repository when missing; returns its URL."""
    from huggingface_hub import HfApi  # the hub client: loaded only for an upload

    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            ignore_patterns=HUB_IGNORE,
            commit_message="betaprm train: final BetaPRM",
        )
    except Exception as e:  # network, authentication, permissions: the model is saved locally either way
        raise BetaPRMInputError(
            f"--push-to-hub {repo_id}: the upload failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); the "
            f"model is saved in {folder}: log in (`hf auth login` or HF_TOKEN) and upload it with `hf upload "
            f"{repo_id} {folder}`"
        ) from None
    return str(url)
