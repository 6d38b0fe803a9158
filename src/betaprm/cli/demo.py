"""betaprm demo"""

from ..synth.recipe import DemoConfig
from .flags import add_config_args, config_from_args

HELP = "the paper's Best-of-N and calibration tables in a world with exact ground truth (CPU)"
DESCRIPTION = """Run the whole pipeline in the chain-arithmetic world, where the true success
probability of every prefix and the best achievable belief are known exactly.

Generates problems and Monte Carlo labels, pretrains a small Llama as a language model,
fine-tunes a standard PRM (soft-ce) and a BetaPRM (beta-binomial) with the same budget,
scores Best-of-16 pools, tunes selectors on validation, and prints the Best-of-N,
verification and calibration tables. Writes results.json and PNG plots to --out.
The two PRMs train at the same time (two processes) unless --no-parallel-prms. --quick is a
small run with the same steps; --long is the larger recipe (wider backbone MLP, more PRM
steps, the whole backbone fine-tuned), meant for a GPU (--device cuda). Flags given
explicitly win over --quick and --long."""


def add_arguments(parser):
    add_config_args(parser, DemoConfig)


def run(args):
    from ..demo import run_demo  # torch, transformers: loaded when the demo runs, not for --help

    run_demo(config_from_args(DemoConfig, args))
    return 0
