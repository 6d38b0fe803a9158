"""Reading chat-templated text back: the question and the response of an RL rollout.

OpenRLHF sends a remote reward model each rollout's ``prompt`` (the conversation rendered
with the policy tokenizer's chat template, ending with the generation prompt) and its
``query`` (that prompt followed by the response, decoded with its special tokens, e.g. a
closing ``<|im_end|>``). A PRM wants the plain question and the steps, so
``ChatTemplateReader`` learns where a template puts a user message's content by rendering
probe conversations with sentinel contents, once, and then cuts real prompts at those
places: exact for any template that writes a user message's content verbatim between
fixed text, as ChatML (Qwen, SmolLM), Llama 3, Gemma and Mistral do. No torch here.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable

from .errors import BetaPRMInputError
from .hub import resolve_model

__all__ = ["ChatTemplateReader", "load_policy_tokenizer", "reward_reader", "reward_traces", "special_tokens"]

# Sentinel contents: plain words no template changes, none a part of another, the two
# assistant ones ending differently so that no content character joins a learned marker.
_SYS, _U1, _U2, _AX, _AY = "BPRMsysQ7", "BPRMuserK3", "BPRMuserW5", "BPRMasstX1", "BPRMasstY2"


def special_tokens(tokenizer) -> set[str]:
    """Every special token text of ``tokenizer``: ``all_special_tokens`` and the added
    tokens marked special (``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``, ...)."""
    out = set(getattr(tokenizer, "all_special_tokens", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out.update(t.content for t in added.values() if getattr(t, "special", False))
    return {t for t in out if isinstance(t, str) and t}


def _common_suffix(texts: list[str]) -> str:
    s = texts[0]
    for t in texts[1:]:
        n = 0
        while n < min(len(s), len(t)) and s[-1 - n] == t[-1 - n]:
            n += 1
        s = s[len(s) - n :]
    return s


def _common_prefix(texts: list[str]) -> str:
    s = texts[0]
    for t in texts[1:]:
        n = 0
        while n < min(len(s), len(t)) and s[n] == t[n]:
            n += 1
        s = s[:n]
    return s


class ChatTemplateReader:
    """Finds the last user message and the response in chat-templated text.

    ``tokenizer``: the one whose chat template rendered the prompts (``None`` or one
    without a template: prompts are read as plain text). ``strip``: the special tokens
    removed from questions and responses (by default the tokenizer's); ``keep``: texts
    never removed (the PRM's marker, which a request must not smuggle in).

    What the probes learn: ``user_prefix``, the text right before any user message's
    content (e.g. ``<|im_end|>\\n<|im_start|>user\\n``: the common end of the text before
    the first and a later user message); ``prompt_ends``, the text after the last user
    message's content in a prompt with the generation prompt
    (``<|im_end|>\\n<|im_start|>assistant\\n``); ``user_suffix``, the text after a user
    message's content wherever it stands (``<|im_end|>\\n``); ``user_opening``, the text before
    the content of a conversation's first user message (``<|im_start|>user\\n``, or a default
    system prompt and then that), and ``user_turns``, the texts from the end of an earlier
    message's content to a user message's content (``<|im_end|>\\n<|im_start|>user\\n``). A
    user's text may hold ``user_prefix`` itself ("A user: asked 2+3" with a ``user: `` template,
    a literal ``<|im_start|>user\\n``); only an occurrence that the opening or a turn leads up to
    starts a message.
    """

    def __init__(self, tokenizer=None, *, strip: Iterable[str] | None = None, keep: Iterable[str] = ()):
        self.user_prefix = ""
        self.user_suffix = ""
        self.prompt_ends: tuple[str, ...] = ()
        self.user_opening = ""
        self.user_turns: tuple[str, ...] = ()
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            self._learn(tokenizer)
        tokens = set(special_tokens(tokenizer) if strip is None and tokenizer is not None else strip or ())
        tokens -= set(keep)
        alternatives = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
        self._specials = re.compile(alternatives) if tokens else None
        # A run of special tokens (padding), matched in one call: no Python loop per token.
        self._run = re.compile(f"(?:{alternatives})*" if tokens else "")

    @property
    def has_template(self) -> bool:
        """Whether the role markers were learned (else prompts are plain text)."""
        return bool(self.user_prefix)

    def _learn(self, tokenizer) -> None:
        def render(messages, gen=True):
            try:
                return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            except Exception:  # a template refusing a conversation shape is one probe less
                return None

        def around(text, content):
            if not isinstance(text, str) or text.count(content) != 1:
                return None
            before, after = text.split(content)
            return before, after

        user = lambda c: {"role": "user", "content": c}  # noqa: E731
        asst = lambda c: {"role": "assistant", "content": c}  # noqa: E731
        first = around(render([user(_U1)]), _U1)
        with_system = around(render([{"role": "system", "content": _SYS}, user(_U1)]), _U1)
        no_gen = around(render([user(_U1)], gen=False), _U1)
        multi = [render([user(_U1), asst(a), user(_U2)]) for a in (_AX, _AY)]
        later, later_first = [around(m, _U2) for m in multi], [around(m, _U1) for m in multi]
        if first is None:
            return
        befores = [first[0]] + [x[0] for x in later if x is not None]
        prefix = _common_suffix(befores)
        if len(befores) == 1 and with_system is not None:
            # No multi-turn probe rendered: the text before a user message after a system
            # one narrows the marker, unless the template merges the two (Gemma).
            narrower = _common_suffix([first[0], with_system[0]])
            prefix = narrower if narrower.strip() else prefix
        if not prefix.strip():
            return
        # Start the marker at a whole special token (Llama 3's ``<|begin_of_text|>`` and
        # ``<|eot_id|>`` share their last characters, which are no marker).
        specials = special_tokens(tokenizer)
        if not any(prefix.startswith(t) for t in specials):
            starts = [prefix.find(t) for t in specials if t in prefix]
            prefix = prefix[min(starts) :] if starts else prefix
        self.user_prefix = prefix
        self.user_opening = first[0] if first[0].endswith(prefix) else ""
        # What leads from an earlier message's content (the assistant's, the system's) to a
        # user's: the text between the two sentinels.
        turns = [m.split(a, 1)[1].split(_U2, 1)[0] for a, m, x in zip((_AX, _AY), multi, later) if x and a in m]
        if with_system is not None and _SYS in with_system[0]:
            turns.append(with_system[0].split(_SYS, 1)[1])
        self.user_turns = tuple(sorted(set(t for t in turns if t.endswith(prefix)), key=len, reverse=True))
        ends = [first[1]] + [x[1] for x in [with_system, *later] if x is not None]
        self.prompt_ends = tuple(sorted(set(e for e in ends if e), key=len, reverse=True))
        afters = [first[1]] + [x[1] for x in [no_gen, *later_first] if x is not None]
        suffix = _common_prefix(afters)
        self.user_suffix = suffix if suffix.strip() else ""

    def clean(self, text: str) -> str:
        """``text`` without special tokens, stripped."""
        if self._specials is not None:
            text = self._specials.sub("", text)
        return text.strip()

    def question(self, prompt: str) -> str:
        """The content of the last user message of a rendered ``prompt`` (cleaned); the
        prompt itself (cleaned) when it holds no role markers of the template."""
        return self.clean(self._last_user(prompt))

    def _last_user(self, prompt: str) -> str:
        if not self.has_template:
            return prompt
        body, ended = prompt, False
        for end in self.prompt_ends:
            if body.endswith(end):
                body, ended = body[: len(body) - len(end)], True
                break
        start = self._last_user_start(body)
        if start is None:
            return prompt  # not rendered with this template: plain text
        content = body[start:]
        if not ended and self.user_suffix:
            if content.endswith(self.user_suffix):  # a prompt without the generation prompt
                content = content[: len(content) - len(self.user_suffix)]
            else:
                j = content.find(self.user_suffix)
                if j >= 0:
                    content = content[:j]
        return content

    def _last_user_start(self, body: str) -> int | None:
        """Where the content of the last user message of ``body`` starts: after the last
        ``user_prefix`` that the template's opening (after any padding) or one of its turns
        leads up to; after the first ``user_prefix`` when none does (a prompt cut at its
        start), so that marker text inside a question never cuts it; None without one.
        Linear in the prompt: each occurrence is checked against texts of fixed length."""
        prefix, n = self.user_prefix, len(self.user_prefix)
        opening = self.user_opening
        lead = self._run.match(body).end()  # the padding before the opening
        first, end = None, len(body)
        while (i := body.rfind(prefix, 0, end)) >= 0:
            c = i + n
            if any(body.endswith(t, 0, c) for t in self.user_turns) or (
                opening and body.endswith(opening, 0, c) and c - len(opening) <= lead
            ):
                return c
            first, end = c, c - 1
        return first

    def split(self, query: str) -> tuple[str, str] | None:
        """``(prompt, response)`` of a templated ``query`` (a prompt followed by its
        response): the cut is after the last generation prompt; ``None`` when the query
        holds none."""
        best = None
        for end in self.prompt_ends:
            k = query.rfind(end)
            if k >= 0 and (best is None or k + len(end) > best):
                best = k + len(end)
        if best is None or not self.has_template:
            return None
        return query[:best], query[best:]

    def response(self, query: str, prompt: str) -> str | None:
        """The response in ``query`` (uncleaned): what follows ``prompt`` when the query
        starts with it (after any special tokens, the left padding of older OpenRLHF),
        else what follows the last generation prompt; ``None`` when neither is found."""
        # The prompt's first occurrence, which only special tokens may precede: one search
        # (linear in CPython), not one comparison per token of the padding (quadratic on a
        # long run of them).
        pos = query.find(prompt)
        if pos == 0 or (pos > 0 and self._run.match(query, 0, pos).end() == pos):
            return query[pos + len(prompt) :]
        cut = self.split(query)
        return None if cut is None else cut[1]


def load_policy_tokenizer(name, trust_remote_code: bool = False):
    """``--policy-tokenizer``: a tokenizer folder or hub name, loaded with transformers'
    AutoTokenizer; it must have a chat template (that is what it is for)."""
    from transformers import AutoTokenizer

    path = resolve_model(name, flag="--policy-tokenizer", files="tokenizer").path
    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise BetaPRMInputError(f"--policy-tokenizer {name}: cannot load a tokenizer from it ({e})") from None
    if not getattr(tok, "chat_template", None):
        raise BetaPRMInputError(
            f"--policy-tokenizer {name}: the tokenizer has no chat template, so it cannot tell where a prompt's "
            "question is; leave the option out when the policy's prompts are plain text"
        )
    return tok


def reward_reader(prm, settings) -> ChatTemplateReader:
    """/get_reward's reader of prompts and queries (``settings``: a ``ServeSettings``): the
    chat template of the policy tokenizer, else of the PRM's tokenizer; special tokens of
    both are removed, the PRM's marker is not (a request holding it is refused)."""
    policy = settings.policy_tokenizer
    if isinstance(policy, (str, os.PathLike)):
        policy = load_policy_tokenizer(policy, settings.trust_remote_code)
    own = getattr(prm, "tokenizer", None)
    strip = special_tokens(own) if own is not None else set()
    if policy is not None:
        strip |= special_tokens(policy)
    reader = ChatTemplateReader(policy if policy is not None else own, strip=strip, keep=[prm.config.marker])
    if not reader.has_template:
        logging.getLogger(__name__).warning(
            "/get_reward: %s no chat template, so prompts are read as plain text (the whole prompt is the question); "
            "start with --policy-tokenizer NAME if the policy's prompts are chat-templated",
            "the policy tokenizer has" if policy is not None else "the PRM's tokenizer has",
        )
    return reader


def reward_traces(queries: list, prompts, reader: ChatTemplateReader, separator: str, allow_no_prompts: bool):
    """``(question, steps)`` of each query of a ``/get_reward`` body; ``BetaPRMInputError``
    (a 400) naming the query that cannot be read."""
    if prompts is None and not allow_no_prompts:
        raise BetaPRMInputError(
            "field 'prompts' is missing: /get_reward reads the question from each query's prompt; send 'prompts' "
            "(OpenRLHF does), or start the server with --allow-no-prompts to read the question and the response from "
            "the chat-templated query alone"
        )
    if prompts is not None and (not isinstance(prompts, list) or len(prompts) != len(queries)):
        raise BetaPRMInputError(f"'prompts' must be a list with one prompt per query ({len(queries)})")
    traces = []
    for i, q in enumerate(queries):
        if not isinstance(q, str) or (prompts is not None and not isinstance(prompts[i], str)):
            raise BetaPRMInputError(f"query[{i}] and its prompt must be strings")
        if prompts is None:
            cut = reader.split(q)
            if cut is None:
                raise BetaPRMInputError(
                    f"query[{i}] holds no generation prompt of the chat template "
                    + ("" if reader.has_template else "(the server knows none: see --policy-tokenizer) ")
                    + "to tell the prompt from the response; send 'prompts'"
                )
            prompt, response = cut
        else:
            prompt, response = prompts[i], reader.response(q, prompts[i])
            if response is None:
                raise BetaPRMInputError(
                    f"query[{i}] does not start with its prompt, nor holds the chat template's generation prompt to "
                    "tell where the response starts"
                )
        steps = [s.strip() for s in reader.clean(response).split(separator) if s.strip()]
        if not steps:
            raise BetaPRMInputError(f"query[{i}] has no response text after its prompt to score")
        traces.append((reader.question(prompt), steps))
    return traces
