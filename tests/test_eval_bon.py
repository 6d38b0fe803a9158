"""betaprm eval-bon: selectors on pool files with answers checked by math-verify or by
an LLM judge behind a real local HTTP server; failed checks counted apart."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from betaprm.cli import main


def _pool(i, gold="7"):
    """Candidate 0 (the single pass) is wrong; two wrong candidates share answer 8 (the
    majority); the right one has the highest mean mu; the last is wrong with high min mu."""
    c = [
        {"steps": ["3 + 5 = 9", "The answer is \\boxed{9}"], "mu": [0.5, 0.4], "kappa": [4, 4]},
        {"steps": ["3 + 5 = 8", "The answer is \\boxed{8}"], "mu": [0.6, 0.5], "kappa": [4, 4]},
        {"steps": ["3 + 5 = 8", "so the answer is 8"], "mu": [0.55, 0.5], "kappa": [4, 4]},
        {"steps": ["3 + 4 = 7", "The answer is \\boxed{7}"], "mu": [0.95, 0.9], "kappa": [4, 4]},
    ]
    return {"id": f"p{i}", "question": f"problem {i}: what is 3 + 4?", "answer": gold, "candidates": c}


def _write(path, n=40, bad_gold_at=None):
    path.write_text("".join(json.dumps(_pool(i, "$$" if i == bad_gold_at else "7")) + "\n" for i in range(n)))
    return path


def test_selectors_by_hand(tmp_path, capsys):
    a, b = _write(tmp_path / "benchA.jsonl"), _write(tmp_path / "benchB.jsonl", 30)
    out = tmp_path / "res.json"
    assert main(["eval-bon", "--pools", f"{a},{b}", "--out", str(out), "--plots", str(tmp_path / "plots")]) == 0
    r = json.loads(out.read_text())
    for name in ("benchA", "benchB"):
        s = r["benchmarks"][name]["selectors"]
        assert s["single_pass"]["acc"] == 0.0 and s["majority_vote"]["acc"] == 0.0 and s["oracle"]["acc"] == 1.0
        assert s["mean"]["acc"] == 1.0 and s["weighted_vote"]["acc"] == 0.0  # 8 has weight 0.55 + 0.525 > 0.925
        assert s["lin"]["acc"] == 1.0 and s["rb"]["acc"] == 1.0
    assert r["avg_gain_vs_single_pass"]["mean"] == 1.0
    assert (tmp_path / "plots" / "best_of_n_benchA.png").stat().st_size > 0
    assert "| top-1 S_RB |" in capsys.readouterr().out


def test_failed_checks_are_not_wrong(tmp_path):
    a = _write(tmp_path / "bench.jsonl", 40, bad_gold_at=None)
    lines = a.read_text().splitlines()
    bad = json.loads(lines[5])
    bad["answer"] = "$$"  # math-verify cannot read this reference: every check of it fails
    lines[5] = json.dumps(bad)
    a.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    # --skip-tuned: every problem is tested, p5 too (--val-fraction 0.01 left no validation
    # problem here, which now stops eval-bon instead of dropping the tuned selectors).
    assert main(["eval-bon", "--pools", str(a), "--out", str(out), "--skip-tuned"]) == 0
    r = json.loads(out.read_text())["benchmarks"]["bench"]
    assert r["answer_checks_failed"] == 4 and r["n_test"] == 40 and r["n_val"] == 0
    s = r["selectors"]["mean"]
    assert s["check_failed"] == 1 and s["n"] == 39 and s["acc"] == 1.0


class _Judge:
    """A real local OpenAI-compatible judge: yes when the candidate answer equals the
    reference (``broken``: an answer that is neither), every prompt recorded."""

    def __init__(self, broken=False):
        self.calls = 0
        self.prompts = []
        judge = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.calls += 1
                text = body["messages"][0]["content"]
                judge.prompts.append(text)
                gold = text.split("Reference answer: ")[1].split("\n")[0]
                pred = text.split("Candidate answer: ")[1].split("\n")[0]
                reply = "maybe" if broken else ("Yes." if gold.strip() == pred.strip() else "no")
                data = json.dumps(
                    {"choices": [{"message": {"content": reply}}], "usage": {"completion_tokens": 1}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("broken", [False, True])
def test_llm_judge_through_a_real_server(tmp_path, broken):
    a = _write(tmp_path / "bench.jsonl", 20)
    out = tmp_path / "r.json"
    j = _Judge(broken)
    try:
        assert (
            main(["eval-bon", "--pools", str(a), "--out", str(out), "--judge-url", j.url, "--judge-model", "judge"])
            == 0
        )
    finally:
        j.close()
    r = json.loads(out.read_text())
    assert j.calls == 80 and r["judge"] == "judge"
    b = r["benchmarks"]["bench"]
    if broken:  # a judge that does not answer yes/no: every check failed, nothing counted wrong
        assert b["answer_checks_failed"] == 80 and b["selectors"]["mean"]["n"] == 0
    else:
        assert (
            b["answer_checks_failed"] == 0
            and b["selectors"]["mean"]["acc"] == 1.0
            and b["selectors"]["single_pass"]["acc"] == 0.0
        )


def test_unscored_pools_need_a_model(tmp_path, capsys):
    p = tmp_path / "raw.jsonl"
    rec = _pool(0)
    for c in rec["candidates"]:
        del c["mu"], c["kappa"]
    p.write_text(json.dumps(rec) + "\n")
    assert main(["eval-bon", "--pools", str(p)]) == 2
    assert "give --model to score them" in capsys.readouterr().err


def test_bad_pool_scores_stop_or_are_skipped_and_counted(tmp_path, capsys):
    """Fails before this change: a NaN, 7.0 or a wrong number of scores were taken as
    they were (every top-1 selector picked the NaN candidate)."""
    a = _write(tmp_path / "bench.jsonl", 40)
    lines = a.read_text().splitlines()
    for j, (field, value) in enumerate([("mu", [float("nan"), 0.4]), ("mu", [7.0, 0.4]), ("kappa", [4])]):
        rec = json.loads(lines[j])
        rec["candidates"][0][field] = value
        lines[j] = json.dumps(rec)  # json.dumps writes NaN, as a careless writer would
    a.write_text("\n".join(lines) + "\n")
    assert main(["eval-bon", "--pools", str(a)]) == 2
    err = capsys.readouterr().err
    assert "bench.jsonl:1: field '(line)': not valid JSON (NaN" in err
    assert "bench.jsonl:2: field 'candidates[0].mu[0]': must be a finite number in [0, 1], got 7.0" in err
    assert "bench.jsonl:3: field 'candidates[0].kappa': has 1 values for 2 steps" in err
    out = tmp_path / "r.json"
    assert main(["eval-bon", "--pools", str(a), "--on-error", "skip", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["benchmarks"]["bench"]
    assert r["pool_records_rejected"] == 3 and r["n_test"] + r["n_val"] == 37
    rejects = [json.loads(x) for x in open(tmp_path / "bench.jsonl.rejects.jsonl")]
    assert [x["line"] for x in rejects] == [1, 2, 3] and "NaN" in rejects[0]["raw"]
