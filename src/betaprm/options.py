"""The one dataclass-field helper every config uses, ``opt(default, help_text)``, and the
defaults that several configs share (kept here, without torch, for the CLI's ``--help``).

The CLI builds each ``--flag`` from a config field and its ``metadata["help"]``
(``betaprm.cli.flags``); extra keyword arguments go into the same metadata. Two of them are
checked by ``field_problems`` (the CLI's generic check, and configs' ``__post_init__``):
``required=True`` (an empty or unset value is an error naming the flag) and
``choices=(...)`` (the allowed values, listed in ``--help``); ``old_values={"old": "new"}``
accepts a renamed value (the CLI says it is deprecated).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "KAPPA_HEADS", "field_problems", "flag_name", "opt"]

DEFAULT_MAX_BATCH_TOKENS = 16384
"""Padded tokens per forward pass when scoring: memory follows tokens, not traces. With
SDPA attention a forward's activations grow with batch x longest trace, so this bounds
them whatever the mix of long and short traces."""

KAPPA_HEADS = ("linear", "layernorm-linear")
"""The kappa head's forms (``BetaPRMConfig.kappa_head``): ``linear``, a bare linear map of the
marker's hidden state (zero weights at creation); ``layernorm-linear``, the paper authors' head,
a LayerNorm (eps 1e-5) before the linear map, whose weights start at N(0, 1e-3) as theirs do.
Both start with the bias that gives ``kappa_init``."""


def opt(default, help_text, *, required: bool = False, choices=None, **kw):
    """A dataclass field with ``default`` and ``metadata={"help": help_text, **kw}``;
    ``required``: the flag must be given (on the command line or in a --config file);
    ``choices``: the values allowed (a tuple, e.g. a registry's names)."""
    if required:
        kw["required"] = True
    if choices is not None:
        kw["choices"] = tuple(choices)
    return field(default=default, metadata={"help": help_text, **kw})


def flag_name(name: str) -> str:
    """A field's command-line flag: ``learning_rate`` -> ``--learning-rate``."""
    return "--" + name.replace("_", "-")


def field_problems(cls, values: dict | None = None) -> list[str]:
    """Every ``required`` field left empty, every value outside its field's ``choices`` and
    a ``seed`` outside numpy's 32 bits,
    worded with the flag. ``cls``: a config dataclass with ``values`` (name -> value, the
    defaults filling the rest), or a config instance (its values; a renamed value in
    ``old_values`` is replaced by the new one)."""
    instance = not isinstance(cls, type)
    bad = []
    for f in dataclasses.fields(cls):
        if instance:
            value = getattr(cls, f.name)
            if isinstance(value, str) and value in f.metadata.get("old_values", {}):
                value = f.metadata["old_values"][value]
                setattr(cls, f.name, value)
        elif f.name in values:
            value = values[f.name]
        else:
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if f.metadata.get("required") and value in ("", None):
            bad.append(f"{flag_name(f.name)} is required")
        if f.name == "seed" and isinstance(value, int) and not 0 <= value < 2**32:
            # numpy's generators and the Trainer take seeds of 32 bits, and refuse negatives
            bad.append(f"{flag_name(f.name)} must be an integer in [0, 2**32 - 1], got {value}")
        choices = f.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            bad.append(f"{flag_name(f.name)} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return bad
