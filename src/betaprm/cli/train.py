"""betaprm train"""

from ..train.config import TrainConfig
from .flags import add_config_args, config_from_args

HELP = "train a BetaPRM (beta-binomial) or a standard PRM (soft-ce, hard-ce) on counts records"
DESCRIPTION = """Train a process reward model on Monte Carlo counts (K of N per step).

  betaprm train --model PATH --data counts.jsonl --output-dir runs/betaprm
  betaprm train --model PATH --data counts.jsonl --objective soft-ce    # the standard PRM

Defaults are the paper's: AdamW, lr 1e-5, weight decay 0.05, cosine schedule with 5%
warmup, one epoch, global batch 512 by gradient accumulation, kappa head at 10x lr,
lambda_reg 0.05. Runs on one device, or on several with
  accelerate launch --num_processes 8 -m betaprm train ...    (or torchrun -m betaprm)
and DeepSpeed ZeRO-3 / FSDP through accelerate config files (configs/accelerate/).
Interrupted runs continue with --resume-from-checkpoint last."""


def add_arguments(parser):
    add_config_args(parser, TrainConfig)


def run(args):
    from ..train.finish import end_process_group  # torch: loaded when the command runs, not for --help
    from ..train.run import train

    train(config_from_args(TrainConfig, args))
    end_process_group()
    return 0
