"""Progress bars: the one maker of every bar betaprm draws (``progress_bar``), the
``--disable-tqdm`` option of the commands that draw them, and ``TQDM_DISABLE`` honoured.

tqdm reads ``TQDM_DISABLE`` only as a default, which a caller's own ``disable=False`` overrides;
``progress_bar`` reads it at each call, so a bar made here is off whenever the variable is set
(to anything but ``""``, ``0``, ``false``, ``no`` or ``off``). ``--disable-tqdm`` turns off
betaprm's bars and transformers' and the hub's own (loading weights, downloads) for the rest of
the command. A bar written to a log (stderr not a terminal) ends with one line at 100%: tqdm
draws the final state when the last step arrives and again when the bar closes, which a log
shows as two lines; here only the closing draw is made.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

from .options import opt

__all__ = ["ProgressOptions", "bars_disabled", "bars_scope", "disable_bars", "progress_bar"]

DISABLE_HELP = (
    "no progress bars (betaprm's, and transformers' and the hub's while loading the model): for logs; "
    "TQDM_DISABLE=1 does the same"
)

_NOT_SET = ("", "0", "false", "no", "off")
_state = {"off": False, "restore_transformers": False}


@dataclass
class ProgressOptions:
    """The flag every command that draws progress bars shares."""

    disable_tqdm: bool = opt(False, DISABLE_HELP, result=False)


def bars_disabled() -> bool:
    """Whether bars are off: ``--disable-tqdm`` given to this command, or ``TQDM_DISABLE`` set."""
    return _state["off"] or os.environ.get("TQDM_DISABLE", "").strip().lower() not in _NOT_SET


def disable_bars() -> None:
    """``--disable-tqdm``: every bar off until the command's ``bars_scope`` ends, transformers'
    and the hub's own included (when transformers is installed; it is loaded for this)."""
    _state["off"] = True
    try:
        from transformers.utils import logging as hf_logging  # loaded by a run anyway, never by --help
    except ImportError:  # pragma: no cover - transformers is a dependency
        return
    if hf_logging.is_progress_bar_enabled():
        hf_logging.disable_progress_bar()
        _state["restore_transformers"] = True


@contextlib.contextmanager
def bars_scope():
    """One command's run: bars that ``disable_bars`` turned off inside come back after it (the
    CLI runs several commands in one process in tests and scripts)."""
    before = _state["off"]
    try:
        yield
    finally:
        _state["off"] = before
        if not before and _state["restore_transformers"]:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()
            _state["restore_transformers"] = False


def progress_bar(total: int, desc: str, unit: str = "it", disable: bool = False, **tqdm_kwargs):
    """A tqdm bar (``tqdm.auto``: a widget in notebooks) of ``total`` steps; off when ``disable``,
    ``--disable-tqdm`` or ``TQDM_DISABLE`` says so. Use it as tqdm's: ``update(n)``, ``close()``
    or ``with``; ``tqdm_kwargs`` go to tqdm (``file``, ``mininterval``, ...)."""
    if disable or bars_disabled():
        tqdm_kwargs["disable"] = True
    return _bar_class()(total=total, desc=desc, unit=unit, **tqdm_kwargs)


@functools.cache
def _bar_class():
    from tqdm.auto import tqdm  # loaded when a bar is made, not when the CLI parses its flags

    class Bar(tqdm):
        """tqdm whose last ``update`` leaves the final draw to ``close``: one 100% line in a log."""

        def update(self, n=1):
            if not self.disable and self.total is not None and self.n + n >= self.total:
                self.n += n
                return None
            return super().update(n)

    return Bar
