"""The chain-arithmetic world: exact ground truth for PRM calibration and reliability.

Importing it registers the world's policy as the generation backend ``synth``
(``generation.factory.register_backend``)."""

from .policy import SynthPolicy, mc_label, synth_answer, synth_is_correct, synth_tasks
from .world import Problem, Trace, World, WorldConfig, parse_value

__all__ = [
    "Problem",
    "SynthPolicy",
    "Trace",
    "World",
    "WorldConfig",
    "mc_label",
    "parse_value",
    "synth_answer",
    "synth_is_correct",
    "synth_tasks",
]
