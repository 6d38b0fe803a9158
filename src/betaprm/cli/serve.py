"""betaprm serve"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..options import opt as _f

HELP = "serve a PRM over HTTP for RL and search loops (/v1/score, OpenRLHF's /get_reward), with dynamic batching"
DESCRIPTION = """Serve a trained BetaPRM (or a plain causal LM, scored zero-shot) over HTTP.

POST /v1/score   {"question": ..., "steps": [...]} or {"items": [...]}  ->  mu, kappa, sigma per
                 step and the trace scores mean, min, last, prod, lin (and rb with --tau)
POST /get_reward {"query": [...], "prompts": [...], "labels": [...]}  ->  {"rewards": [...],
                 "scores": [...], "step_rewards": [...]}: OpenRLHF's remote reward model
                 (--reward.remote_url http://HOST:PORT/get_reward; older: --remote_rm_url). The
                 question is the last user message of the chat-templated prompt (read with the
                 template of --policy-tokenizer, else of the PRM's tokenizer; a prompt without
                 role markers is the question as it is); the response is the query after its
                 prompt, special tokens (<|im_end|>, padding) removed, cut into steps at
                 --step-separator; the reward is the --aggregate trace score. A request without
                 "prompts" is a 400 unless --allow-no-prompts.
GET  /health, GET /v1/models

Requests arriving together are scored together (up to --max-batch-tokens, waiting at most
--max-wait-ms for more), with the same scores as `betaprm score`. Listens on 127.0.0.1 unless
--host says otherwise; --api-key-env NAME requires 'Authorization: Bearer KEY'.

  curl -s localhost:8000/v1/score -H 'content-type: application/json' \\
       -d '{"question": "what is 3 + 4?", "steps": ["3 + 4 = 7", "The answer is 7"]}'"""


@dataclass
class ServeConfig:
    model: str = _f(
        "",
        "a BetaPRM (betaprm train output), or a plain causal LM scored zero-shot: a folder, or a hub name "
        "OWNER/NAME[@REVISION]",
    )
    host: str = _f(
        "127.0.0.1", "address to listen on (0.0.0.0 exposes the server to the network: set --api-key-env then)"
    )
    port: int = _f(8000, "port to listen on")
    device: str = _f("auto", "auto (cuda when present), cpu, cuda, ...")
    max_batch_tokens: int = _f(16384, "tokens per scoring batch (requests arriving together are scored together)")
    max_wait_ms: float = _f(5.0, "how long the first queued trace waits for others to join its batch")
    max_items: int = _f(256, "traces per request at most (413 above)")
    lam: float = _f(0.5, "lambda of S_lin and S_RB (a request may give its own 'lam')")
    tau: float | None = _f(
        None, "S_RB's sigma threshold (a request may give its own 'tau'); without it S_RB is not computed"
    )
    aggregate: str = _f("mean", "/get_reward's reward: mean, min, last, prod, lin or rb (rb needs --tau)")
    step_separator: str = _f("\n\n", "/get_reward: the text between two steps of a response")
    policy_tokenizer: str | None = _f(
        None,
        "/get_reward: the policy's tokenizer (a folder or hub name, loaded with AutoTokenizer) whose chat template "
        "rendered OpenRLHF's prompts; without it the PRM's tokenizer's template is used",
    )
    allow_no_prompts: bool = _f(
        False,
        "/get_reward: accept requests without 'prompts', reading the question and the response from the "
        "chat-templated query alone (the response starts after the template's last generation prompt)",
    )
    api_key_env: str | None = _f(
        None, "the NAME of an environment variable holding a key that clients must send as 'Authorization: Bearer KEY'"
    )
    trust_remote_code: bool = _f(False, "allow model code from the checkpoint")

    def __post_init__(self):
        from ..errors import BetaPRMInputError
        from ..generation.factory import api_key_problems
        from ..selection import METHODS

        bad = []
        if not self.model:
            bad.append("--model is required")
        if not 0 < self.port < 65536:
            bad.append(f"--port must be in 1..65535, got {self.port}")
        if self.max_batch_tokens < 1 or self.max_items < 1:
            bad.append("--max-batch-tokens and --max-items must be >= 1")
        if not (math.isfinite(self.max_wait_ms) and self.max_wait_ms >= 0):
            bad.append(f"--max-wait-ms must be a number >= 0, got {self.max_wait_ms}")
        if self.aggregate not in METHODS:
            bad.append(f"--aggregate must be one of {', '.join(METHODS)}, got {self.aggregate!r}")
        elif self.aggregate == "rb" and self.tau is None:
            bad.append("--aggregate rb needs --tau (S_RB's sigma threshold)")
        if not self.step_separator:
            bad.append("--step-separator must not be empty")
        bad += api_key_problems(self.api_key_env)
        if bad:
            raise BetaPRMInputError("bad serve configuration: " + "; ".join(bad))


def add_arguments(parser):
    from ._config import add_config_args

    add_config_args(parser, ServeConfig)


def run(args):
    import torch

    from ..errors import BetaPRMInputError

    try:
        import uvicorn

        from ..serve import ServeSettings, create_app
    except ImportError as e:
        raise BetaPRMInputError(
            f"betaprm serve needs FastAPI and uvicorn ({e}); pip install 'betaprm[serve]'"
        ) from None
    from ..chat import load_policy_tokenizer
    from ..generation.factory import read_api_key
    from ..model import load_prm
    from ._config import config_from_args

    cfg = config_from_args(ServeConfig, args)
    # Before the model: a bad --policy-tokenizer stops at once.
    policy = load_policy_tokenizer(cfg.policy_tokenizer, cfg.trust_remote_code) if cfg.policy_tokenizer else None
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    prm, kind = load_prm(cfg.model, device, cfg.trust_remote_code)
    print(f"serving {cfg.model} ({kind}) on http://{cfg.host}:{cfg.port}", flush=True)
    settings = ServeSettings(
        max_batch_tokens=cfg.max_batch_tokens,
        max_wait_ms=cfg.max_wait_ms,
        max_items=cfg.max_items,
        lam=cfg.lam,
        tau=cfg.tau,
        aggregate=cfg.aggregate,
        step_separator=cfg.step_separator,
        api_key=read_api_key(cfg.api_key_env),
        model_name=cfg.model,
        model_kind=kind,
        policy_tokenizer=policy,
        allow_no_prompts=cfg.allow_no_prompts,
        trust_remote_code=cfg.trust_remote_code,
    )
    app = create_app(prm, settings)
    # uvicorn finishes in-flight requests on SIGTERM/SIGINT before it stops.
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=60)
    return 0
