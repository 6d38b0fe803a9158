"""The chain-arithmetic world: exact ground truth for PRM calibration and reliability."""

from .policy import SynthPolicy, mc_label
from .world import Problem, Trace, World, WorldConfig, parse_value

__all__ = ["Problem", "SynthPolicy", "Trace", "World", "WorldConfig", "mc_label", "parse_value"]
