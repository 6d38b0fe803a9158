"""The one dataclass-field helper every config uses, ``opt(default, help_text)``, and the
defaults that several configs share (kept here, without torch, for the CLI's ``--help``).

The CLI builds each ``--flag`` from a config field and its ``metadata["help"]``
(``betaprm.cli.flags``); extra keyword arguments go into the same metadata.
"""

from __future__ import annotations

from dataclasses import field

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "opt"]

DEFAULT_MAX_BATCH_TOKENS = 16384
"""Padded tokens per forward pass when scoring: memory follows tokens, not traces. With
SDPA attention a forward's activations grow with batch x longest trace, so this bounds
them whatever the mix of long and short traces."""


def opt(default, help_text, **kw):
    """A dataclass field with ``default`` and ``metadata={"help": help_text, **kw}``."""
    return field(default=default, metadata={"help": help_text, **kw})
