"""Generation: the ``Generator`` protocol that the labeller, ACA and the demo sample through."""

from .base import Completion, GenerationRequest, Generator

__all__ = ["Completion", "GenerationRequest", "Generator"]
