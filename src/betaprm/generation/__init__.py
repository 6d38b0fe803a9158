"""Generation: the ``Generator`` protocol that the labeller, ACA and the demo sample through."""

from .base import Completion, GenerationError, GenerationRequest, Generator
from .text import Sampling, TextFormat

__all__ = ["Completion", "GenerationError", "GenerationRequest", "Generator", "Sampling", "TextFormat"]
