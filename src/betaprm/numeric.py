"""One reader for every number betaprm takes in: record fields, request fields, config
files and flags.

``number(value, where, ...)`` returns ``value`` as a checked int or float, or raises
``NumberRefused``, one message shape everywhere: ``WHERE must be RULE, got VALUE``. A
number is refused when it is a bool, not finite, out of range, or an integer too large to
be a setting or a count: an integer's size is checked by its bits before anything turns it
into a float, since ``float()`` and ``math.isfinite`` raise ``OverflowError`` on a
400-digit integer. Text (a flag's) is read only when asked. A value shown in a message is at most ``MAX_SHOWN``
characters (``shown``): a message never prints a whole value, however large.
"""

from __future__ import annotations

import math
import reprlib

from .errors import BetaPRMInputError

__all__ = ["MAX_INT_BITS", "NumberRefused", "json_float", "number", "rule_text", "shown"]

MAX_INT_BITS = 63
"""An integer of more bits (above about 9.2e18) is refused: no count or setting needs one,
and torch and numpy hold integers in 64 bits."""
MAX_SHOWN = 80
"""Characters of a value shown in a message at most."""


class NumberRefused(BetaPRMInputError):
    """A number refused: ``where`` it came from, the ``rule`` it breaks and what was got
    (``got``, already shortened); ``reason`` is the message without ``where``."""

    def __init__(self, where: str, rule: str, got: str):
        self.where, self.rule, self.got = where, rule, got
        self.reason = f"must be {rule}, got {got}"
        super().__init__(f"{where} {self.reason}" if where else self.reason)


def _digits(n: int) -> int:
    """Decimal digits of ``abs(n)``, from its bits (``str`` of a huge integer is slow, and
    refused above 4300 digits)."""
    return max(1, int(abs(n).bit_length() * math.log10(2)) + 1)


# repr cut while it is made: 3 levels of 5 items at most, text and numbers cut, so the work
# is bounded too (a YAML value of nested aliases has billions of items behind a few bytes).
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 5, 5, 5, 5
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_SHOWN


def shown(value, limit: int = MAX_SHOWN) -> str:
    """``value`` for a message, at most ``limit`` characters: its repr, cut (``reprlib``:
    a nested value is never walked whole), a large integer by its number of digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 200:
        return f"an integer of {_digits(value)} digits"
    try:
        text = _REPR.repr(value[: limit + 1] if isinstance(value, str) else value)
    except ValueError:  # repr of an integer over 4300 digits inside a list
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def rule_text(integer: bool, low=None, high=None, low_open: bool = False, high_open: bool = False) -> str:
    """``an integer >= 1``, ``a finite number in [0, 1]``, ``a finite number > 0``, ..."""
    kind = "an integer" if integer else "a finite number"
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{_fmt(low)}, {_fmt(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {_fmt(low)}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {_fmt(high)}"
    return kind


def number(
    value,
    where: str,
    *,
    integer: bool = False,
    low=None,
    high=None,
    low_open: bool = False,
    high_open: bool = False,
    text: bool = False,
    what: str | None = None,
) -> int | float:
    """``value`` checked: an int (``integer``, and then no float is accepted) or an int or
    float (returned as given, ``-0.0`` as ``0.0``), finite, at most ``MAX_INT_BITS`` bits
    when an integer, within ``low``/``high`` (inclusive unless ``low_open``/``high_open``).
    ``text``: a string is read as a number (``"1e-5"``, ``" 12 "``; a flag, a config value);
    otherwise a string is refused like any other type. ``where`` names the value in the
    message (``"--lam"``, ``"field 'lam'"``); ``what`` replaces the rule's wording."""
    rule = what or rule_text(integer, low, high, low_open, high_open)

    def refuse(got=None):
        return NumberRefused(where, rule, got or shown(value))

    x = value
    if isinstance(x, str) and text:
        try:  # int() refuses text of over 4300 digits itself (sys.get_int_max_str_digits)
            x = int(x) if integer else float(x)
        except ValueError:
            raise refuse() from None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or (integer and not isinstance(x, int)):
        raise refuse()
    if isinstance(x, int):
        if x.bit_length() > MAX_INT_BITS:  # a range's bound says enough; else say why
            raise refuse(shown(x) + ("" if high is not None else ", larger than any count or setting (2**63)"))
    elif not math.isfinite(x):
        raise refuse()
    else:
        x = x + 0.0  # -0.0 becomes 0.0: a sign no setting means, which would show in outputs
    if low is not None and (x <= low if low_open else x < low):
        raise refuse()
    if high is not None and (x >= high if high_open else x > high):
        raise refuse()
    return x


def json_float(literal: str) -> float:
    """``json.loads``'s ``parse_float`` for input: a literal beyond float range (``1e400``)
    is refused (``NumberRefused``, a ``ValueError``) instead of read as infinity."""
    x = float(literal)
    if not math.isfinite(x):
        raise NumberRefused("", "a number within float range (about 1.8e308)", shown(literal))
    return x
