"""Turning (question, steps) into token ids with exactly one marker after every step.

The alignment guarantee: the marker is a special token of the tokenizer, so it is never
merged with the text around it, and the text itself may not contain the marker string.
After tokenisation the number of marker tokens is checked against the number of steps;
a mismatch is an error, never a silent shift of labels onto the wrong steps.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import BetaPRMInputError

TRUNCATE_MODES = ("error", "steps")
"""What scoring does with a trace longer than the model's positions: stop, naming it, or
score the whole steps that fit."""

DEFAULT_TEMPLATE = "Question: {question}\nProcess: {process}"

__all__ = ["DEFAULT_TEMPLATE", "TraceFormat", "encode_trace", "encode_traces", "fit_to_length", "format_trace"]


@dataclass(frozen=True)
class TraceFormat:
    """How a trace is laid out as text before tokenisation."""

    template: str = DEFAULT_TEMPLATE
    """Text around the process; must contain ``{question}`` and ``{process}`` once each, and
    may contain ``{images}`` once: where a vision-language trace's image placeholders go
    (each image's, then a newline; nothing for a trace without images). Without it they go
    before the question."""
    marker: str = "<prm>"
    """The step marker written after every step; the PRM reads its scores there."""
    step_separator: str = ""
    """Text between a marker and the next step (the paper uses none)."""
    chat_template: bool = False
    """Wrap the formatted trace in the tokenizer's chat template, as the assistant turn
    after an empty user turn (the layout of the authors' InternVL PRMs)."""
    marker_repeat: int = 1
    """Write the marker this many times after each step and read the scores at the last
    one. 1 is the paper's layout; 2 gives a small model one more position (and so one
    more attention hop) to compare a step with what it expected (the chain-arithmetic
    demo uses it). Scores are still one per step."""

    def __post_init__(self):
        fields = _fields(self.template)
        if sorted(f for f in fields if f != "images") != ["process", "question"] or fields.count("images") > 1:
            raise BetaPRMInputError(
                f"template must contain {{question}} and {{process}} exactly once each, {{images}} at most "
                f"once, and no other fields; got fields {fields} in {self.template!r}. Write literal braces as "
                "'{{' and '}}'."
            )
        if not (isinstance(self.marker_repeat, int) and self.marker_repeat >= 1):
            raise BetaPRMInputError(f"marker_repeat must be an integer >= 1, got {self.marker_repeat!r}")
        if not self.marker:
            raise BetaPRMInputError("marker must be a non-empty string, e.g. '<prm>'")
        if self.marker in self.template.replace("{question}", "").replace("{process}", "").replace("{images}", ""):
            raise BetaPRMInputError(f"template {self.template!r} contains the marker {self.marker!r}")


def _fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def _check_text(text: str, what: str, marker: str) -> None:
    if not isinstance(text, str):
        raise BetaPRMInputError(f"{what} must be a string, got {type(text).__name__}: {text!r:.80}")
    if marker in text:
        raise BetaPRMInputError(
            f"{what} contains the marker text {marker!r}, which would add a scoring position "
            f"that belongs to no step: {text!r:.120}. Remove or escape it in the data, or "
            "choose another marker."
        )


def format_trace(
    question: str, steps: Sequence[str], fmt: TraceFormat = TraceFormat(), tokenizer=None, images: str = ""
) -> str:
    """The text of one trace: ``template`` with the question and ``s1<prm>s2<prm>...``.

    ``images``: the trace's image placeholder text (``betaprm.vision``), written at the
    template's ``{images}`` field, or before the question when it has none. With
    ``fmt.chat_template`` the text is wrapped by ``tokenizer``'s chat template.
    """
    _check_text(question, "the question", fmt.marker)
    if images and "images" not in _fields(fmt.template):
        question = images + question
    if isinstance(steps, str) or len(steps) == 0:
        raise BetaPRMInputError(f"steps must be a non-empty list of strings, got {steps!r:.80}")
    for i, step in enumerate(steps):
        _check_text(step, f"step {i + 1}", fmt.marker)
        if fmt.marker_repeat > 1 and not step:
            # Adjacent marker runs could not be told apart.
            raise BetaPRMInputError(f"step {i + 1} is empty, which marker_repeat > 1 cannot align; remove empty steps")
    process = fmt.step_separator.join(step + fmt.marker * fmt.marker_repeat for step in steps)
    # Literal pieces are joined by hand: str.format would choke on braces inside the
    # question (LaTeX!), and str.replace would re-scan substituted text.
    parts = []
    for literal, field, _, _ in string.Formatter().parse(fmt.template):
        parts.append(literal)
        if field is not None:
            parts.append({"question": question, "process": process, "images": images}[field])
    text = "".join(parts)
    if fmt.chat_template:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise BetaPRMInputError(
                "chat_template=True but the tokenizer has no chat template; set chat_template=False "
                "or use a tokenizer that has one"
            )
        messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": text}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    return text


def check_markers(encoded: Sequence[Sequence[int]], traces: Sequence[tuple], marker_id: int, fmt: TraceFormat) -> None:
    """Every encoded trace must hold ``len(steps) * marker_repeat`` marker tokens, or its
    scores would not line up with its steps."""
    for trace, ids in zip(traces, encoded):
        question, steps = trace[0], trace[1]
        found = sum(1 for t in ids if t == marker_id)
        if found != len(steps) * fmt.marker_repeat:
            raise BetaPRMInputError(
                f"the formatted trace holds {found} marker tokens for {len(steps)} steps "
                f"(x{fmt.marker_repeat} markers each), so scores "
                f"would not line up with steps (question {question!r:.60}). The tokenizer, chat "
                f"template or processor changed the marker {fmt.marker!r}; check that it is a special token of "
                "this tokenizer and that the chat template keeps the assistant text verbatim."
            )


def encode_traces(
    tokenizer, marker_id: int, traces: Sequence[tuple[str, Sequence[str]]], fmt: TraceFormat = TraceFormat()
) -> list[list[int]]:
    """Token ids of many ``(question, steps)`` traces, each verified to hold exactly
    ``len(steps)`` marker tokens. One batched tokenizer call for speed."""
    texts = [format_trace(q, s, fmt, tokenizer) for q, s in traces]
    # A chat template already writes the special tokens it wants (BOS and turn tags).
    encoded = tokenizer(texts, add_special_tokens=not fmt.chat_template)["input_ids"]
    check_markers(encoded, traces, marker_id, fmt)
    return encoded


def encode_trace(
    tokenizer, marker_id: int, question: str, steps: Sequence[str], fmt: TraceFormat = TraceFormat()
) -> list[int]:
    """Token ids of one trace; see ``encode_traces``."""
    return encode_traces(tokenizer, marker_id, [(question, steps)], fmt)[0]


def read_positions(ids: Sequence[int], marker_id: int, repeat: int = 1) -> list[int]:
    """Positions where a step's scores are read: the last marker of each run of ``repeat``."""
    pos = [i for i, t in enumerate(ids) if t == marker_id]
    return pos[repeat - 1 :: repeat]


def fit_to_length(ids: Sequence[int], marker_id: int, max_length: int, repeat: int = 1) -> tuple[list[int], int]:
    """Cut an encoded trace to at most ``max_length`` tokens, keeping only whole steps.

    Returns ``(ids, n_steps_kept)``: the tokens up to and including the last step marker
    (the last of its run of ``repeat``) that fits, so the kept markers are exactly the
    first ``n_steps_kept`` steps' and their labels stay aligned (the model is causal: a
    marker never sees later tokens). ``n_steps_kept == 0``: not even one step fits.
    """
    ids = list(ids)
    reads = read_positions(ids, marker_id, repeat)
    if len(ids) <= max_length:
        return ids, len(reads)
    fitting = [i for i in reads if i < max_length]
    return (ids[: fitting[-1] + 1], len(fitting)) if fitting else ([], 0)
