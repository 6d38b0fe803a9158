"""Nothing leaves the machine that the user did not ask to send: a problems file's image
paths stay inside its folder (or --image-root), must decode as images within the caps, and
go only to a policy that takes images with a PRM that scores them, all checked before any
request, against a real local server that records what reaches it; and a password in a
URL never appears in a message or a log line."""

import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from betaprm.cli import main
from betaprm.errors import BetaPRMInputError, redact_url
from betaprm.generation import GenerationError, GenerationRequest
from betaprm.generation.openai import OpenAIGenerator

KEY_ENV = "BETAPRM_TEST_IMAGE_KEY"
SECRET = "the-secret-file-contents-7f3a"
PASSWORD = "hunter2-pw-9c1e"
CHAT = {
    "choices": [{"message": {"role": "assistant", "content": "The answer is \\boxed{7}"}}],
    "usage": {"completion_tokens": 5},
}


class _Recorder:
    """A real HTTP server on 127.0.0.1 that records every request (path, headers, body)
    and answers each with one chat completion."""

    def __init__(self):
        self.requests = []
        server = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append((self.path, dict(self.headers), body))
                data = json.dumps(CHAT).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _png(path, size=(28, 28)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), 200, dtype="uint8")).save(path, format="PNG")
    return path


def _closed_port() -> int:
    """A local port nothing listens on: a request to it fails at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def text_prm(tmp_path_factory):
    from betaprm import BetaPRM

    from .helpers import make_lm_dir

    d = tmp_path_factory.mktemp("prm")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm", hidden=16, layers=1))).save_pretrained(d / "prm")
    return d / "prm"


@pytest.fixture(scope="module")
def vision_prm(tmp_path_factory):
    from betaprm.model import BetaPRM
    from betaprm.tiny import save_vlm_dir, tiny_vlm

    d = tmp_path_factory.mktemp("vprm")
    model, proc = tiny_vlm("qwen2_5_vl")
    save_vlm_dir(model, proc, d / "vlm")
    BetaPRM.from_backbone(str(d / "vlm")).save_pretrained(d / "prm")
    return d / "prm"


def _aca(srv_url, problems, model, out, *extra):
    return main(
        [
            "aca",
            "--backend",
            "openai",
            "--policy",
            "m",
            "--base-url",
            srv_url,
            "--api-key-env",
            KEY_ENV,
            "--problems",
            str(problems),
            "--model",
            str(model),
            "--final",
            "lin",
            "--budget",
            "2",
            "--n0",
            "2",
            "--max-retries",
            "0",
            "--out",
            str(out),
            *extra,
        ]
    )


def _write_problems(path, images):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"id": "p0", "question": "What is 3 + 4?", "answer": "7"}]
    lines.append({"id": "p1", "question": "What is 2 + 5?", "answer": "7", "images": images})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _bad_image_case(tmp_path, case, monkeypatch):
    """The problems file (in tmp/a/b) and what its images field names, for each way out."""
    (tmp_path / "secret.txt").write_text(SECRET)
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    if case == "parent":
        images = ["../../secret.txt"]
    elif case == "absolute":
        images = ["/etc/hostname"] if os.path.isfile("/etc/hostname") else [str(tmp_path / "secret.txt")]
    elif case == "symlink":
        (folder / "pic.png").symlink_to(tmp_path / "secret.txt")
        images = ["pic.png"]
    elif case == "not-an-image":
        (folder / "notes.png").write_text(SECRET)
        images = ["notes.png"]
    elif case == "too-many-pixels":
        monkeypatch.setattr("betaprm.image_files.MAX_IMAGE_PIXELS", 28 * 28 - 1)
        images = [_png(folder / "big.png").name]
    elif case == "too-many-bytes":
        monkeypatch.setattr("betaprm.image_files.MAX_IMAGE_BYTES", 50)
        images = [_png(folder / "big.png").name]
    else:  # a decompression bomb: Pillow warns past its own pixel limit, and that warning is an error
        from PIL import Image

        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 28 * 28 - 1)
        images = [_png(folder / "bomb.png").name]
    return _write_problems(folder / "problems.jsonl", images)


BAD_IMAGES = {
    "parent": "outside",
    "absolute": "outside",
    "symlink": "outside",
    "not-an-image": "not an image",
    "too-many-pixels": "over the cap",
    "too-many-bytes": "larger than 50 bytes",
    "bomb": "decompression bomb",
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_image_paths_that_are_not_images_inside_the_folder_are_refused_and_nothing_is_sent(
    tmp_path, capsys, monkeypatch, text_prm, case
):
    """Fails before this change: `../../secret.txt` and `/etc/hostname` were read and sent,
    base64-encoded as data:text/plain, to the policy server with the bearer key; nothing
    checked the folder, the content or the size of an image path."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    problems = _bad_image_case(tmp_path, case, monkeypatch)
    with _Recorder() as srv:
        rc = _aca(srv.url, problems, text_prm, tmp_path / "out.jsonl")
    assert rc == 2
    assert srv.requests == []  # not even the problem without images went out
    err = capsys.readouterr().err
    assert f"{problems}:2" in err and "field 'images'" in err and "fix:" in err, err
    assert BAD_IMAGES[case] in err, err
    assert SECRET not in err


def test_search_refuses_an_image_path_out_of_the_folder_before_sending(tmp_path, capsys, monkeypatch, text_prm):
    """Fails before this change: `betaprm search` sent `../../secret.txt` to the policy
    server as it sent any image path."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    problems = _bad_image_case(tmp_path, "parent", monkeypatch)
    argv = ["search", "--backend", "openai", "--policy", "m", "--api-key-env", KEY_ENV, "--problems", str(problems)]
    with _Recorder() as srv:
        rc = main([*argv, "--base-url", srv.url, "--model", str(text_prm), "--out", str(tmp_path / "s.jsonl")])
    assert rc == 2 and srv.requests == []
    err = capsys.readouterr().err
    assert f"{problems}:2: field 'images': '../../secret.txt' resolves to" in err and "outside" in err


def test_images_go_only_to_a_policy_that_takes_them_and_a_prm_that_scores_them(
    tmp_path, capsys, monkeypatch, text_prm, vision_prm
):
    """Fails before this change: a text-only PRM ran on problems with images (their images
    sent to the policy and then ignored), and the completions endpoint sent the problems
    before the first one with an image failed."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    _png(tmp_path / "p" / "img" / "a.png")
    problems = _write_problems(tmp_path / "p" / "problems.jsonl", ["img/a.png"])
    with _Recorder() as srv:
        rc_text = _aca(srv.url, problems, text_prm, tmp_path / "t.jsonl")
        err_text = capsys.readouterr().err
        rc_completions = _aca(srv.url, problems, vision_prm, tmp_path / "c.jsonl", "--endpoint", "completions")
        err_completions = capsys.readouterr().err
    assert rc_text == 2 and rc_completions == 2
    assert srv.requests == []
    assert f"{problems}:2: field 'images'" in err_text and "text-only PRM" in err_text and "fix:" in err_text
    assert f"{problems}:2: field 'images'" in err_completions and "--endpoint completions does not take images" in (
        err_completions
    )


def test_image_root_is_where_image_paths_resolve_and_stay(tmp_path, capsys):
    """Fails before this change: there was no --image-root; image paths resolved against
    the problems file's folder and could leave it."""
    from betaprm.cli.problems import read_problems

    pics = tmp_path / "pics"
    _png(pics / "a.png")
    problems = _write_problems(tmp_path / "p" / "problems.jsonl", ["a.png"])
    (task0, task1) = read_problems(str(problems), str(pics))
    assert task0.images == [] and task1.images == [str((pics / "a.png").resolve())]
    with pytest.raises(BetaPRMInputError, match=r"problems.jsonl:2: field 'images': no such file 'a.png'"):
        read_problems(str(problems))  # the default root is the problems file's folder
    _write_problems(problems, ["../p/problems.jsonl"])
    with pytest.raises(BetaPRMInputError, match="outside .*--image-root DIR"):
        read_problems(str(problems), str(pics))
    # --image-root is checked with the other options: a folder, and only with --problems.
    common = ["aca", "--model", "m", "--out", str(tmp_path / "o.jsonl")]
    assert main([*common, "--image-root", str(pics)]) == 2
    assert "give it with --problems" in capsys.readouterr().err
    bad_root = [*common, "--backend", "openai", "--policy", "m", "--problems", str(problems)]
    assert main([*bad_root, "--image-root", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_the_client_checks_every_image_before_sending_any_and_sends_the_decoded_type(tmp_path):
    """Fails before this change: requests ran concurrently and each read its own image, so
    the requests without images went out before a bad one failed; a text file went as
    data:text/plain; the MIME type came from the file name."""
    (tmp_path / "notes.png").write_text(SECRET)
    _png(tmp_path / "named.jpg")  # a PNG whatever its name
    plain, bad = GenerationRequest("q", [], 2), GenerationRequest("q", [], 1, images=[str(tmp_path / "notes.png")])
    with _Recorder() as srv:
        with pytest.raises(BetaPRMInputError, match="image not sent: .*notes.png' is not an image"):
            OpenAIGenerator(srv.url, "m", api_key="sk-test").generate([plain, bad])
        good = GenerationRequest("q", [], 1, images=[str(tmp_path / "named.jpg")])
        with pytest.raises(BetaPRMInputError, match="need --endpoint chat .*no request was sent"):
            OpenAIGenerator(srv.url, "m", endpoint="completions").generate([plain, good])
        assert srv.requests == []
        assert not OpenAIGenerator(srv.url, "m", endpoint="completions").takes_images
        (comps,) = OpenAIGenerator(srv.url, "m").generate([good])
    assert comps[0].n_tokens == 5 and len(srv.requests) == 1
    user = json.loads(srv.requests[0][2])["messages"][0]["content"]
    assert user[1]["image_url"]["url"].startswith("data:image/png;base64,")


# ---------------------------------------------------------------- passwords in URLs


def test_redact_url_hides_userinfo_whole():
    """Fails before this change: there was no redact_url."""
    assert redact_url("http://user:pw@host:8000/v1") == "http://***@host:8000/v1"
    assert redact_url("https://u:p@ss/w@host/v1?x=a@b") == "https://***@host/v1?x=a@b"
    assert redact_url("user:pw@host/v1") == "***@host/v1"
    assert redact_url("http://127.0.0.1:8000/v1?mail=a@b") == "http://127.0.0.1:8000/v1?mail=a@b"


def _no_password(*texts):
    for t in texts:
        assert PASSWORD not in t, t


def test_a_password_in_a_url_never_appears_in_a_message_or_a_log(tmp_path, capsys, caplog, text_prm):
    """Fails before this change: `--base-url http://user:PASSWORD@host` printed the password
    in every error message of a failed request (cannot connect, bad port, redirects), from
    the client, aca, label and the reward client."""
    import logging

    from betaprm.answers import LLMJudge
    from betaprm.reward import StepRewards

    caplog.set_level(logging.DEBUG)
    port = _closed_port()
    url = f"http://user:{PASSWORD}@127.0.0.1:{port}/v1"
    messages = []
    with pytest.raises(GenerationError) as e:
        OpenAIGenerator(url, "m", max_retries=0, timeout=5).generate([GenerationRequest("q", [], 1)])
    messages.append(str(e.value))
    assert "***@127.0.0.1" in str(e.value) and "cannot connect" in str(e.value)
    for bad in (f"http://user:{PASSWORD}@127.0.0.1:99999/v1", f"ftp://user:{PASSWORD}@127.0.0.1/v1"):
        with pytest.raises(BetaPRMInputError) as e:
            OpenAIGenerator(bad, "m")
        messages.append(str(e.value))
    with pytest.raises(BetaPRMInputError) as e:
        LLMJudge(f"http://user:{PASSWORD}@127.0.0.1:99999/v1", "judge")
    messages.append(str(e.value))
    judge = LLMJudge(url, "judge", max_retries=0, timeout=5)
    assert judge.check_many([("7", "7")]) == [None] and judge.failed == 1  # a failed check, not a message
    with pytest.raises(GenerationError) as e:
        StepRewards(url=f"http://user:{PASSWORD}@127.0.0.1:{port}", timeout=5).score(["q"], [["a step"]])
    messages.append(str(e.value))
    assert "***@127.0.0.1" in str(e.value)
    # The commands: a failed request ends with one message, exit status 1, and no password.
    problems = _write_problems(tmp_path / "problems.jsonl", [])
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "question": "q", "answer": "7", "steps": ["3 + 4 = 7", "The answer is 7"]}))
    common = ["--backend", "openai", "--policy", "m", "--base-url", url, "--max-retries", "0"]
    assert main(["label", *common, "--input", str(src), "--out", str(tmp_path / "l.jsonl")]) == 1
    assert main(["aca", *common, "--problems", str(problems), "--model", str(text_prm), "--final", "lin"]
                + ["--out", str(tmp_path / "a.jsonl")]) == 1  # fmt: skip
    out = capsys.readouterr()
    assert "***@127.0.0.1" in out.err
    _no_password(*messages, out.out, out.err, caplog.text)


def test_a_redirect_to_a_url_with_a_password_does_not_print_it():
    """Fails before this change: the refused redirect's Location was printed as sent."""

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(302)
            self.send_header("Location", f"http://admin:{PASSWORD}@127.0.0.1:1/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(BetaPRMInputError, match=r"redirect to 'http://\*\*\*@127\.0\.0\.1:1/") as e:
            url = f"http://user:{PASSWORD}@127.0.0.1:{httpd.server_address[1]}/v1"
            OpenAIGenerator(url, "m").generate([GenerationRequest("q", [], 1)])
    finally:
        httpd.shutdown()
        httpd.server_close()
    _no_password(str(e.value))
