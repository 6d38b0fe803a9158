"""betaprm serve"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..chat import load_policy_tokenizer
from ..errors import BetaPRMInputError
from ..generation.factory import api_key_problems, read_api_key
from ..options import opt as _f
from ..serve_requests import LOOPBACK, ServeOptions, default_allowed_hosts, listen_socket
from .flags import add_config_args, config_from_args
from .scoring_options import LoadOptions

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
                 --step-reliability (or "return_reliability": true in a request) adds
                 "step_kappa" and "step_sigma" beside "step_rewards".
GET  /health, GET /v1/models, GET /metrics (Prometheus: requests by route and status,
                 errors, latency, scored batch sizes, queue depth); --access-log writes one
                 line per request on stdout.

Requests arriving together are scored together (up to --max-batch-tokens, waiting at most
--max-wait-ms for more), with the same scores as `betaprm score`. Listens on 127.0.0.1 unless
--host says otherwise; --api-key-env NAME requires 'Authorization: Bearer KEY' on every route.
Only Host headers naming the loopback address with the port are answered (a web page cannot
reach the server through DNS rebinding); on 0.0.0.0 or behind a reverse proxy, list the host
names clients use with --allowed-hosts. POST bodies must be 'Content-Type: application/json'.
The port is bound before the model loads: one in use stops the command (exit 2).

Slow and hostile clients are bounded: a connection must send its headers within
--header-timeout and a body within --body-timeout, at most --max-connections are open, large
bodies wait, unread, for room under --max-buffered-bytes, and a body's JSON values are counted
(--max-json-values) before it is parsed; a client that leaves is one line in the log.

  curl -s localhost:8000/v1/score -H 'content-type: application/json' \\
       -d '{"question": "what is 3 + 4?", "steps": ["3 + 4 = 7", "The answer is 7"]}'"""


@dataclass
class ServeConfig(ServeOptions, LoadOptions):
    model: str = _f(
        "",
        "a BetaPRM (betaprm train output), or a plain causal LM scored zero-shot: a folder, or a hub name "
        "OWNER/NAME[@REVISION]",
        required=True,
    )
    host: str = _f(
        "127.0.0.1",
        "address to listen on (0.0.0.0 exposes the server to the network: set --api-key-env and --allowed-hosts then)",
    )
    port: int = _f(8000, "port to listen on")
    allowed_hosts: str | None = _f(
        None,
        "comma-separated Host header values the server answers ('name' on any port, 'name:port' on that one; '*' "
        "any): needed with --host 0.0.0.0 and behind a reverse proxy; default the loopback names with --port "
        "(127.0.0.1, localhost, [::1]), or the --host address with --port",
    )
    served_model_name: str | None = _f(
        None, "the model's name in /v1/models; default the folder's base name, or the hub name as given"
    )
    device: str = _f("auto", "auto (cuda when present), cpu, cuda, ...")
    policy_tokenizer: str | None = _f(
        None,
        "/get_reward: the policy's tokenizer (a folder or hub name, loaded with AutoTokenizer) whose chat template "
        "rendered OpenRLHF's prompts; without it the PRM's tokenizer's template is used",
    )
    api_key_env: str | None = _f(
        None, "the NAME of an environment variable holding a key that clients must send as 'Authorization: Bearer KEY'"
    )
    trust_remote_code: bool = _f(False, "allow model code from the checkpoint")

    def __post_init__(self):
        bad = []  # --model (required) and fixed choices: checked by config_from_args
        if not 0 < self.port < 65536:
            bad.append(f"--port must be in 1..65535, got {self.port}")
        if self.allowed_hosts is not None and not self.hosts():
            bad.append("--allowed-hosts must name at least one host (or '*' for any)")
        elif self.allowed_hosts is None and self.host in WILDCARDS:
            bad.append(
                f"--host {self.host or repr('')} answers on every address, so the Host names clients use are "
                "unknown: list them with --allowed-hosts (e.g. 'rm-node:5000,10.0.0.5:5000'), or '*' to answer any"
            )
        bad += self.option_problems()
        bad += api_key_problems(self.api_key_env)
        if bad:
            raise BetaPRMInputError("bad serve configuration: " + "; ".join(bad))

    def hosts(self) -> tuple[str, ...]:
        """The Host values the server answers (see --allowed-hosts)."""
        if self.allowed_hosts is not None:
            return tuple(h.strip() for h in self.allowed_hosts.split(",") if h.strip())

        if self.host in LOOPBACK:
            return default_allowed_hosts(self.port)
        return (f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}",)

    def model_name(self) -> str:
        """/v1/models' name: never a file path (it would tell clients the server's file layout)."""
        if self.served_model_name:
            return self.served_model_name
        if os.path.exists(self.model):
            return os.path.basename(os.path.abspath(self.model))
        return self.model  # a hub name OWNER/NAME[@REVISION], as given


WILDCARDS = ("0.0.0.0", "::", "")


def add_arguments(parser):
    add_config_args(parser, ServeConfig)


def run(args):
    cfg = config_from_args(ServeConfig, args)
    # The address first: one in use stops the command at once (exit 2), before the model loads.
    sock = listen_socket(cfg.host, cfg.port)
    try:
        return _serve(cfg, sock)
    finally:
        sock.close()


def _serve(cfg: ServeConfig, sock) -> int:
    import torch

    try:
        from ..serve import ServeSettings, create_app, run_server
    except ImportError as e:
        raise BetaPRMInputError(
            f"betaprm serve needs FastAPI, uvicorn and prometheus_client ({e}); pip install 'betaprm[serve]'"
        ) from None
    from ..model import load_prm

    # Before the model: a bad --policy-tokenizer stops at once.
    policy = load_policy_tokenizer(cfg.policy_tokenizer, cfg.trust_remote_code) if cfg.policy_tokenizer else None
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    prm, kind = load_prm(cfg.model, device, cfg.trust_remote_code, dtype=cfg.dtype)
    settings = ServeSettings(
        **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ServeOptions)},
        api_key=read_api_key(cfg.api_key_env),
        model_name=cfg.model_name(),
        model_kind=kind,
        policy_tokenizer=policy,
        trust_remote_code=cfg.trust_remote_code,
        allowed_hosts=cfg.hosts(),
        port=cfg.port,
    )
    app = create_app(prm, settings)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host

    def announce():  # once uvicorn accepts connections, never before
        print(f"serving {cfg.model} ({kind}) on http://{host}:{cfg.port}", flush=True)

    # uvicorn finishes in-flight requests on SIGTERM/SIGINT before it stops; 3 (uvicorn's
    # startup failure) when it never started.
    return 0 if run_server(app, sock, settings, announce) else 3
