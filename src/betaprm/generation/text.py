"""How text backends turn a request into a prompt and generated text into steps.

Two things a model backend must agree on with the PRM:

- **step splitting** of generated text: ``blank-line`` (steps separated by an empty
  line, the common "step by step" layout), ``tags`` (``<step>...</step>`` blocks and a
  final ``<answer>...</answer>``), or ``regex`` (a user pattern that separates steps);
- **continuation** from kept steps: ``prefill`` writes the kept steps into the assistant
  turn and lets the model go on (chat template with ``continue_final_message``), and
  ``restate`` writes them into a new user prompt ("previous steps: ... continue"), as
  the paper's generator did for models without assistant prefill.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BetaPRMInputError
from ..options import opt as _f

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)?\s*[:=]?\s*(.+?)\s*\.?\s*$", re.IGNORECASE | re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i == -1:
            return None
        depth, j = 0, i
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j].strip()
            j += 1
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_answer(text: str) -> str | None:
    """The stated final answer of ``text``: the last ``\\boxed{}``, else an
    ``<answer>`` tag, else what follows "answer is"/"answer:" on the last line that has
    it; None when the text states no answer."""
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    for line in reversed(text.strip().splitlines()):
        m = _ANSWER_IS.search(line)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return None


_OPTION = re.compile(r"\(?([A-Z])\)?")
_MATH_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_WORD = re.compile(r"(?<![\\\w])[^\W\d_]{2,}")  # 2+ letters not after a backslash (\frac) or a digit (2xy)
BARE_MAX_CHARS = 60
"""A bare final answer is at most this long: a value, not a sentence."""


def bare_answer(step: str) -> str | None:
    """``step`` read as a bare final answer, or None: an option letter (``B``, ``(B)``,
    ``B.``) or a number or expression with no word in it (``12``, ``-3.5``, ``\\frac{1}{2}``,
    ``2\\sqrt{3}``, ``x = 5``; ``$...$`` and ``\\(...\\)`` unwrapped, one trailing full stop
    dropped), one line of at most ``BARE_MAX_CHARS`` characters. A word of two or more letters
    that is not a LaTeX command (``cm``, ``So``, ``sin``) makes it a sentence, not an answer:
    the rule errs on the side of reading no answer."""
    s = step.strip()
    for left, right in _MATH_WRAPPERS:
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : -len(right)].strip()
            break
    if s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    if not s or len(s) > BARE_MAX_CHARS or "\n" in s:
        return None
    m = _OPTION.fullmatch(s)
    if m:
        return m.group(1)
    if _WORD.search(s) or not re.search(r"[0-9A-Za-z\\]", s):
        return None
    return s


def final_answer(steps: Sequence[str], bare: bool = True) -> str | None:
    """The answer a trace ends with: the one its last step states (``extract_answer``),
    else the last step itself when it is a bare answer (``bare_answer``: ``12``, ``B``,
    ``\\frac{1}{2}``, as the paper's authors' pools end), else one stated anywhere in the
    whole text. ``bare=False`` leaves bare steps unread (a one-step generation whose step is
    a line of arithmetic has not ended its trace)."""
    if not steps:
        return None
    found = extract_answer(steps[-1])
    if found is None and bare:
        found = bare_answer(steps[-1])
    return found or extract_answer("\n".join(steps))


SPLITS = ("blank-line", "tags", "regex")
CONTINUATIONS = ("prefill", "restate")

_TAG = re.compile(r"<(step|answer)>(.*?)</\1>", re.DOTALL)


@dataclass
class TextFormat:
    """Prompt layout and step splitting for text generators."""

    split: str = _f("blank-line", "how generated text is cut into steps: blank-line, tags (<step>/<answer>) or regex")
    split_regex: str | None = _f(None, "with --split regex: the pattern between two steps, e.g. '\\n(?=Step \\d+:)'")
    continuation: str = _f(
        "prefill",
        "continue kept steps by prefilling the assistant turn (prefill) or by restating them in a new prompt "
        "(restate)",
    )
    instruction: str = _f(
        "Solve the problem step by step. Separate steps with a blank line and end with a final step 'The answer is "
        "\\boxed{ANSWER}'.",
        "text added after the question in the user turn",
    )
    restate_header: str = _f(
        "Previous steps (continue from here, do not repeat them):", "restate mode: the line before the kept steps"
    )
    system: str | None = _f(None, "optional system message")

    def __post_init__(self):
        problems = []
        if self.split not in SPLITS:
            problems.append(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if self.continuation not in CONTINUATIONS:
            problems.append(f"continuation must be one of {', '.join(CONTINUATIONS)}, got {self.continuation!r}")
        if self.split == "regex":
            if not self.split_regex:
                problems.append("split 'regex' needs split_regex (the pattern between two steps)")
            else:
                try:
                    re.compile(self.split_regex)
                except re.error as e:
                    problems.append(f"split_regex {self.split_regex!r} is not a valid regular expression: {e}")
        if problems:
            raise BetaPRMInputError("bad text format: " + "; ".join(problems))

    # ------------------------------------------------------------------ steps
    def split_steps(self, text: str) -> list[str]:
        """Generated text -> non-empty, stripped steps, in order. Nothing is dropped but
        whitespace: text outside tags (``tags`` mode) becomes a step of its own."""
        if self.split == "blank-line":
            parts = re.split(r"\n[ \t]*\n", text)
        elif self.split == "regex":
            parts = re.split(self.split_regex, text)
        else:
            parts, pos = [], 0
            for m in _TAG.finditer(text):
                parts.append(text[pos : m.start()])
                parts.append(m.group(2) if m.group(1) == "step" else f"<answer>{m.group(2).strip()}</answer>")
                pos = m.end()
            parts.append(text[pos:])
        return [p.strip() for p in parts if p and p.strip()]

    def step_stop(self) -> str | None:
        """A stop string that ends generation after one step (step-level search), where
        the layout has one: the blank line of ``blank-line``."""
        return "\n\n" if self.split == "blank-line" else None

    def join_steps(self, steps: list[str]) -> str:
        """Kept steps written back in the layout the model was asked for."""
        if self.split == "tags":
            return "".join(s if s.startswith("<answer>") else f"<step>{s}</step>" for s in steps)
        return "\n\n".join(steps)

    # ------------------------------------------------------------------ prompts
    def messages(self, question: str, prefix: list[str]) -> tuple[list[dict], bool]:
        """Chat messages for continuing ``prefix``; the flag says whether the last
        message is a prefilled assistant turn to continue."""
        user = f"{question}\n\n{self.instruction}".strip() if self.instruction else question
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        if not prefix:
            return msgs + [{"role": "user", "content": user}], False
        kept = self.join_steps(prefix)
        if self.continuation == "restate":
            return msgs + [{"role": "user", "content": f"{user}\n\n{self.restate_header}\n{kept}"}], False
        # A trailing separator makes the model start a new step, not extend the last one.
        sep = "" if self.split == "tags" else "\n\n"
        return msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": kept + sep}], True

    def prompt_text(self, question: str, prefix: list[str], tokenizer=None) -> str:
        """A plain-text prompt: the tokenizer's chat template when it has one, else
        ``question`` / instruction / kept steps separated by blank lines."""
        msgs, prefilled = self.messages(question, prefix)
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=not prefilled, continue_final_message=prefilled
            )
        return "\n\n".join(m["content"].rstrip("\n") for m in msgs) + "\n\n"


@dataclass
class Sampling:
    """Decoding settings shared by the model backends (defaults: the paper's, appendix A.5)."""

    temperature: float = _f(0.7, "sampling temperature")
    top_p: float = _f(0.9, "nucleus sampling")
    top_k: int = _f(30, "top-k sampling (-1 or 0: off)")
    max_new_tokens: int = _f(2048, "generated tokens per completion at most")

    def __post_init__(self):
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if problems:
            raise BetaPRMInputError("bad sampling settings: " + "; ".join(problems))
