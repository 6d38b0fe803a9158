import random

import pytest

from betaprm.errors import BetaPRMInputError
from betaprm.formatting import TraceFormat, encode_trace, encode_traces, format_trace
from betaprm.model import add_marker_token

from .conftest import fresh_tokenizer, random_steps


def test_default_template_layout():
    text = format_trace("what is 1+1?", ["1+1=2", "answer 2"])
    assert text == "Question: what is 1+1?\nProcess: 1+1=2<prm>answer 2<prm>"


def test_custom_template_and_separator_keep_braces_in_text():
    fmt = TraceFormat(template="Q {question} || {process} end", step_separator="\n")
    text = format_trace("a {process} b \\frac{1}{2}", ["s1", "{question}"], fmt)
    assert text == "Q a {process} b \\frac{1}{2} || s1<prm>\n{question}<prm> end"


@pytest.mark.parametrize(
    "template", ["no fields", "{question} only", "{question}{process}{other}", "{question}{process}{process}"]
)
def test_bad_templates_are_rejected(template):
    with pytest.raises(BetaPRMInputError, match="template"):
        TraceFormat(template=template)


def test_step_with_marker_text_is_a_clear_error():
    with pytest.raises(BetaPRMInputError, match=r"step 2 contains the marker text '<prm>'"):
        format_trace("q", ["fine", "bad <prm> step"])
    with pytest.raises(BetaPRMInputError, match="the question contains the marker"):
        format_trace("q <prm>", ["fine"])
    with pytest.raises(BetaPRMInputError, match="non-empty list"):
        format_trace("q", [])


def _check_alignment(tok, fmt=TraceFormat(), n_traces=200, seed=0):
    marker_id = tok.convert_tokens_to_ids(fmt.marker)
    rng = random.Random(seed)
    traces = [
        ("Compute $\\int_0^1 x\\,dx$; answer Yes or No? 温度", random_steps(rng, rng.randint(1, 9)))
        for _ in range(n_traces)
    ]
    encoded = encode_traces(tok, marker_id, traces, fmt)
    for (_, steps), ids in zip(traces, encoded):
        assert sum(t == marker_id for t in ids) == len(steps)
        assert tok.decode(ids[: ids.index(marker_id) + 1]).endswith(steps[0] + fmt.marker)
    # Each step's text sits between consecutive markers (no token straddles a marker).
    for (_, steps), ids in zip(traces[:50], encoded[:50]):
        cuts = [i for i, t in enumerate(ids) if t == marker_id]
        for j in range(1, len(steps)):
            between = tok.decode(ids[cuts[j - 1] + 1 : cuts[j]])
            assert between.strip() == (fmt.step_separator + steps[j]).strip()


def test_marker_count_equals_steps_local_bpe(bpe_tokenizer):
    tok = fresh_tokenizer(bpe_tokenizer)
    tok.add_tokens(["<prm>"], special_tokens=True)
    _check_alignment(tok)
    _check_alignment(tok, TraceFormat(step_separator="\n\n"))


def test_marker_count_equals_steps_smollm2(smollm2_tokenizer):
    tok = fresh_tokenizer(smollm2_tokenizer)
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken("<prm>", special=True, normalized=False)], special_tokens=True)
    _check_alignment(tok)
    _check_alignment(tok, TraceFormat(chat_template=True))


def test_smollm2_chat_template_puts_trace_in_assistant_turn(smollm2_tokenizer):
    tok = fresh_tokenizer(smollm2_tokenizer)
    tok.add_tokens(["<prm>"], special_tokens=True)
    text = format_trace("q?", ["a", "b"], TraceFormat(chat_template=True), tok)
    assert "<|im_start|>assistant\nQuestion: q?\nProcess: a<prm>b<prm>" in text


def test_chat_template_without_one_is_an_error(bpe_tokenizer):
    tok = fresh_tokenizer(bpe_tokenizer)
    with pytest.raises(BetaPRMInputError, match="no chat template"):
        format_trace("q", ["a"], TraceFormat(chat_template=True), tok)


def test_marker_that_is_not_special_is_caught(bpe_tokenizer):
    # If the marker were an ordinary string, BPE could split or merge it: the count
    # check must refuse rather than misalign.
    tok = fresh_tokenizer(bpe_tokenizer)
    fake_id = tok.convert_tokens_to_ids("Yes")
    with pytest.raises(BetaPRMInputError, match="marker tokens for 2 steps"):
        encode_trace(tok, fake_id, "q", ["a", "b"])


def test_add_marker_is_idempotent(bpe_tokenizer):
    from betaprm.tiny import tiny_causal_lm

    tok = fresh_tokenizer(bpe_tokenizer)
    model = tiny_causal_lm(len(tok))
    first = add_marker_token(model, tok, "<prm>")
    rows = model.get_input_embeddings().weight.shape[0]
    assert add_marker_token(model, tok, "<prm>") == first
    assert model.get_input_embeddings().weight.shape[0] == rows


def test_marker_repeat_reads_the_last_of_each_run(bpe_tokenizer):
    from betaprm.formatting import fit_to_length, read_positions

    fmt = TraceFormat(marker_repeat=2)
    assert format_trace("q", ["a", "b"], fmt) == "Question: q\nProcess: a<prm><prm>b<prm><prm>"
    with pytest.raises(BetaPRMInputError, match="step 2 is empty"):
        format_trace("q", ["a", ""], fmt)
    M = 7
    ids = [1, 2, M, M, 3, M, M, 4, 5, M, M]
    assert read_positions(ids, M, 2) == [3, 6, 10]
    assert fit_to_length(ids, M, 9, repeat=2) == ([1, 2, M, M, 3, M, M], 2)
    assert fit_to_length(ids, M, 6, repeat=2) == ([1, 2, M, M], 1)  # a lone first marker of a run is not a step
    tok = fresh_tokenizer(bpe_tokenizer)
    tok.add_tokens(["<prm>"], special_tokens=True)
    mid = tok.convert_tokens_to_ids("<prm>")
    enc = encode_trace(tok, mid, "q", ["x", "y", "z"], fmt)
    assert sum(t == mid for t in enc) == 6
