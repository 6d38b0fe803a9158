"""A real OpenAI-compatible HTTP server on 127.0.0.1 with the chain-arithmetic policy
behind it (for the generation, ACA and labelling tests)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from betaprm.generation import GenerationRequest
from betaprm.synth import SynthPolicy, World


class SynthServer:
    """A real HTTP server speaking the OpenAI chat/completions API with the
    chain-arithmetic policy behind it. ``mode``: ok, fail-twice (HTTP 500 twice, then
    ok), stall (sleeps past the client's timeout), garbage (not JSON), reject (HTTP 400),
    half-500 / half-drop (every second call answers HTTP 500 / closes the connection
    without an answer), down (every call answers HTTP 503). ``fail_after``: calls past
    this many answer HTTP 503. ``answered`` and ``failed`` hold the bodies of the calls
    answered with completions and of those failed on purpose."""

    def __init__(self, problems, mode="ok", fail_after=None):
        self.world = World()
        self.policy = SynthPolicy(self.world, seed=0)
        self.by_question = {p.question: p for p in problems}
        self.mode = mode
        self.calls = 0
        self.bodies = []
        self.answered = []
        self.failed = []
        self.fail_after = fail_after
        lock = threading.Lock()
        self.image_parts = []  # per request with images: its image URLs
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.calls += 1
                    server.bodies.append(body)
                    call = server.calls
                    half = server.mode.startswith("half-") and call % 2 == 0
                    fail = (
                        half or server.mode == "down" or (server.fail_after is not None and call > server.fail_after)
                    )
                    if fail:
                        server.failed.append(body)
                if fail and server.mode == "half-drop":
                    self.close_connection = True  # no status line: the client reads an early end
                    return
                if fail:
                    return self._send(500 if half else 503, b'{"error": "replica failing"}')
                if server.mode == "stall":
                    time.sleep(1.5)
                if server.mode == "fail-twice" and server.calls <= 2:
                    return self._send(500, b'{"error": "overloaded"}')
                if server.mode == "garbage":
                    return self._send(200, b"<html>proxy error</html>")
                if server.mode == "reject":
                    return self._send(400, b'{"error": "model not found"}')
                msgs = body["messages"]
                user = msgs[0]["content"]
                if isinstance(user, list):  # text and image_url parts (problems with images)
                    server.image_parts.append([p["image_url"]["url"] for p in user if p["type"] == "image_url"])
                    user = next(p["text"] for p in user if p["type"] == "text")
                question = user.split("\n\n")[0]  # the instruction follows a blank line
                prefix = msgs[1]["content"].split("\n\n") if len(msgs) > 1 else []
                prefix = [s for s in prefix if s]
                one = body.get("stop") == ["\n\n"]  # stop at the step boundary, as vLLM does
                (comps,) = server.policy.generate(
                    [
                        GenerationRequest(
                            question,
                            prefix,
                            1,
                            server.by_question[question],
                            body.get("seed"),
                            max_steps=1 if one else None,
                        )
                    ]
                )
                c = comps[0]
                choice = {"message": {"role": "assistant", "content": "\n\n".join(c.steps)}, "finish_reason": "stop"}
                if one:
                    choice["stop_reason"] = None if c.finished else "\n\n"
                ans = {"choices": [choice], "usage": {"completion_tokens": c.n_tokens}}
                with lock:
                    server.answered.append(body)
                self._send(200, json.dumps(ans).encode())

            def _send(self, code, data):
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
