"""The one dataclass-field helper every config uses: ``opt(default, help_text)``.

The CLI builds each ``--flag`` from a config field and its ``metadata["help"]``
(``betaprm.cli._config``); extra keyword arguments go into the same metadata.
"""

from __future__ import annotations

from dataclasses import field

__all__ = ["opt"]


def opt(default, help_text, **kw):
    """A dataclass field with ``default`` and ``metadata={"help": help_text, **kw}``."""
    return field(default=default, metadata={"help": help_text, **kw})
