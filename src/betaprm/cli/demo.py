"""betaprm demo"""

from ._config import add_config_args, config_from_args

HELP = "train a tiny BetaPRM end to end on CPU and print its scores"
DESCRIPTION = """Train a tiny BetaPRM end to end on CPU and print its step scores.

Builds a byte-level tokenizer and a random-init Llama, wraps it as a BetaPRM, trains
it with the Beta-Binomial objective on a counts file (the bundled sample by default),
and scores held-out traces. Writes the checkpoint, scores.jsonl and results.json to
--out. Takes well under a minute on 2 CPU cores."""


def add_arguments(parser):
    from ..demo import DemoConfig

    add_config_args(parser, DemoConfig)


def run(args):
    from ..demo import DemoConfig, run_demo

    run_demo(config_from_args(DemoConfig, args))
    return 0
