"""Generation against several servers of one model (``--base-url A,B``): calls spread over
the replicas, a call that fails on one goes to another, a replica that keeps failing is set
aside, and the run stops only when every replica fails. Real HTTP on 127.0.0.1 (the
chain-arithmetic policy behind ``tests/synth_server.py``), no mock of the client."""

import argparse
import contextlib
import io
import json
import logging
from collections import Counter

import pytest

from betaprm.cli import main
from betaprm.cli.flags import add_config_args, config_from_args
from betaprm.errors import BetaPRMInputError
from betaprm.generation import GenerationError, GenerationRequest, Sampling, TextFormat
from betaprm.generation.factory import BackendOptions
from betaprm.generation.openai import OpenAIGenerator
from betaprm.generation.replicas import Replicas, split_urls
from betaprm.synth import World

from .synth_server import SynthServer
from .test_label import _write_traces


def _key(body) -> str:
    return json.dumps(body, sort_keys=True)


def _label(src, out, urls, *extra):
    return main(
        ["label", "--backend", "openai", "--policy", "synth-policy", "--input", str(src), "--out", str(out)]
        + [a for u in urls for a in ("--base-url", u)]
        + ["--n", "4", "--seed", "3", "--concurrency", "4", "--disable-tqdm", *extra]
    )


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Six traces to label and the one-server run's records, summary line and request bodies."""
    world = World()
    problems = world.sample_problems(6, 9, "rep")
    tmp = tmp_path_factory.mktemp("replicas")
    src = tmp / "traces.jsonl"
    _write_traces(src, problems, world)
    srv = SynthServer(problems)
    out = tmp / "one.jsonl"
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            assert _label(src, out, [srv.url]) == 0
    finally:
        srv.close()
    assert not srv.failed
    return problems, src, out.read_text().splitlines(), buf.getvalue(), srv.answered


@pytest.mark.parametrize("failing", ["half-500", "half-drop"])
def test_a_replica_failing_half_its_calls_changes_nothing(traces, tmp_path, capsys, failing):
    """Two servers, one answering every second call with HTTP 500 (or dropping the
    connection): the run ends, every call it failed went to the other replica with the same
    body (seed included), every request was answered once, and the records and the token
    count equal the one-server run's."""
    problems, src, want, one_summary, one_bodies = traces
    good, flaky = SynthServer(problems), SynthServer(problems, mode=failing)
    out = tmp_path / "two.jsonl"
    try:
        assert _label(src, out, [flaky.url, good.url]) == 0
    finally:
        good.close()
        flaky.close()
    summary = capsys.readouterr().out
    assert sorted(out.read_text().splitlines()) == sorted(want)
    assert summary.split(" tokens generated")[0].split()[-1] == one_summary.split(" tokens generated")[0].split()[-1]
    # Each request answered exactly once, by one replica or the other; the failing one did take a share.
    answered = Counter(_key(b) for b in good.answered + flaky.answered)
    assert answered == Counter(_key(b) for b in one_bodies)
    assert flaky.failed and flaky.answered and good.answered
    # A call that failed on the flaky replica was answered by the good one, unchanged.
    good_bodies = {_key(b) for b in good.answered}
    assert all(_key(b) in good_bodies for b in flaky.failed)
    assert all("seed" in b for b in flaky.failed)


def test_all_replicas_down_stops_clearly_and_a_resume_counts_once(traces, tmp_path, capsys):
    """Both servers stop answering partway: the run exits 1 naming both and their failure,
    with the traces finished so far written. A resume on two other servers of the same model
    (other URLs: not a setting of the output) labels the rest; every trace once, equal to the
    one-server run, and nothing finished before is asked for again."""
    problems, src, want, _, one_bodies = traces
    out = tmp_path / "lab.jsonl"
    first = [SynthServer(problems, fail_after=14) for _ in range(2)]
    try:
        rc = _label(src, out, [s.url for s in first], "--chunk", "1", "--max-retries", "1")
    finally:
        for s in first:
            s.close()
    err = capsys.readouterr().err
    assert rc == 1
    assert "all 2 --base-url servers failed" in err and "HTTP 503" in err
    assert all(s.url in err for s in first)
    done = out.read_text().splitlines()
    assert 0 < len(done) < len(want) and set(done) <= set(want)
    meta = (tmp_path / "lab.jsonl.meta.json").read_text()
    assert all(s.url.split("//")[1].split("/")[0] not in meta for s in first)  # the servers are not recorded

    again = [SynthServer(problems) for _ in range(2)]
    try:
        assert _label(src, out, [",".join(s.url for s in again)]) == 0
    finally:
        for s in again:
            s.close()
    summary = capsys.readouterr().out
    assert f"{len(done)} already done, {len(want) - len(done)} labelled" in summary
    lines = out.read_text().splitlines()
    assert sorted(lines) == sorted(want) and len({json.loads(x)["id"] for x in lines}) == len(lines)
    # Only the unfinished traces were asked for (one problem per trace), each request once.
    done_questions = {json.loads(x)["question"] for x in done}
    resumed = Counter(_key(b) for s in again for b in s.answered)
    assert sum(resumed.values()) == len(resumed) and set(resumed) <= {_key(b) for b in one_bodies}
    asked = {json.loads(k)["messages"][0]["content"].split("\n\n")[0] for k in resumed}
    assert asked and not asked & done_questions


def _client(urls, **kw):
    return OpenAIGenerator(
        urls, "synth-policy", TextFormat(instruction=""), Sampling(max_new_tokens=64), backoff=0.05, **kw
    )


def test_a_replica_that_keeps_failing_is_set_aside(caplog):
    """A replica that answers 503 to everything gets a few calls, then is set aside (a
    warning naming it): the good one takes the rest, and every request is answered."""
    problems = World().sample_problems(4, seed=3)
    good, down = SynthServer(problems), SynthServer(problems, mode="down")
    caplog.set_level(logging.WARNING, logger="betaprm")
    try:
        gen = _client([down.url, good.url], concurrency=1, fail_limit=2, cool_down=60)
        reqs = [GenerationRequest(p.question, [], 5, seed=i) for i, p in enumerate(problems)]
        out = gen.generate(reqs)
    finally:
        good.close()
        down.close()
    assert [len(o) for o in out] == [5] * 4 and len(good.answered) == 20
    # Two failures in a row set it aside; calls already on their way when it was may fail late.
    assert 2 <= down.calls <= 2 + 2
    stats = gen.replicas.stats()
    assert stats[down.url]["set_aside"] == 1 and stats[good.url]["failed"] == 0
    assert f"{down.url} keeps failing (last: HTTP 503: " in caplog.text and "set aside for 60 s" in caplog.text


def test_all_replicas_failing_names_each(caplog):
    problems = World().sample_problems(2, seed=3)
    servers = [SynthServer(problems, mode="down") for _ in range(2)]
    try:
        with pytest.raises(GenerationError, match=r"all 2 --base-url servers failed a request") as e:
            _client([s.url for s in servers], max_retries=1).generate([GenerationRequest(problems[0].question, [], 1)])
    finally:
        for s in servers:
            s.close()
    assert all(f"{s.url}: HTTP 503" in str(e.value) for s in servers)
    assert [s.calls for s in servers] == [2, 2]  # two rounds, each replica once in each


def test_a_set_aside_replica_is_still_tried_before_a_call_fails():
    """The good replica set aside by earlier failures, the other failing now (not yet set
    aside): once its rounds on the other are spent, the call goes to the set-aside one
    rather than fail without reaching it."""
    problems = World().sample_problems(2, seed=3)
    good, down = SynthServer(problems), SynthServer(problems, mode="down")
    try:
        gen = _client([good.url, down.url], max_retries=1, fail_limit=3, cool_down=60)
        for _ in range(3):
            gen.replicas.acquire(only=0)
            gen.replicas.release(0, "HTTP 500: earlier")  # the good one is now set aside
        (comps,) = gen.generate([GenerationRequest(problems[0].question, [], 1, seed=1)])
    finally:
        good.close()
        down.close()
    assert len(comps) == 1 and down.calls == 2 and len(good.answered) == 1


def test_least_busy_then_round_robin():
    t = [0.0]
    reps = Replicas(["http://a", "http://b", "http://c"], fail_limit=1, cool_down=10, clock=lambda: t[0])
    assert [reps.acquire() for _ in range(3)] == [0, 1, 2]
    reps.release(1)
    assert reps.acquire() == 1  # the only one with a free slot
    for i in (0, 1, 2):
        reps.release(i)
    assert reps.acquire() == 2 and reps.acquire() == 0  # ties in turn
    reps.release(2, "HTTP 503: x")  # set aside
    assert reps.acquire() == 1 and reps.acquire(avoid={0, 1}) is None
    t[0] = 11.0  # back, on probation
    assert reps.acquire(avoid={0, 1}) == 2


def test_base_url_lists_from_flags_and_config_files(tmp_path):
    parser = argparse.ArgumentParser()
    add_config_args(parser, BackendOptions)
    cfg = config_from_args(
        BackendOptions, parser.parse_args(["--base-url", "http://a:1/v1", "--base-url", "http://b:2/v1"])
    )
    assert cfg.base_url == "http://a:1/v1,http://b:2/v1"
    conf = tmp_path / "c.yaml"
    conf.write_text("base_url: [http://a:1/v1, http://b:2/v1]\n")
    cfg = config_from_args(BackendOptions, parser.parse_args(["--config", str(conf)]))
    assert split_urls(cfg.base_url) == ["http://a:1/v1", "http://b:2/v1"]
    # Blanks are dropped; the same server twice is refused (its password not shown).
    assert split_urls(" http://a/v1, ,http://b/v1,") == ["http://a/v1", "http://b/v1"]
    with pytest.raises(BetaPRMInputError, match=r"names 'http://\*\*\*@a/v1/?' twice"):
        split_urls("http://u:pw@a/v1,http://u:pw@a/v1/")
    with pytest.raises(BetaPRMInputError, match=r"'b:2' is not an http:// or https:// URL.*separated by commas"):
        OpenAIGenerator("http://a:1/v1,b:2", "m")


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    from betaprm.model import BetaPRM

    from .helpers import make_lm_dir

    d = tmp_path_factory.mktemp("prm")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm"))).save_pretrained(d / "prm")
    return d / "prm"


def test_aca_and_search_over_two_replicas_equal_one(tmp_path, prm_dir):
    """`aca` and `search` with a replica dropping every second connection: the records
    equal those of a run on one server (the seeds travel with the requests)."""
    problems = World().sample_problems(3, 21, "w")
    src = tmp_path / "problems.jsonl"
    src.write_text(
        "".join(json.dumps({"id": p.id, "question": p.question, "answer": str(p.answer)}) + "\n" for p in problems)
    )
    runs = {}
    for name, modes in (("one", ["ok"]), ("two", ["half-drop", "ok"])):
        servers = [SynthServer(problems, mode=m) for m in modes]
        common = ["--backend", "openai", "--policy", "synth", "--problems", str(src), "--model", str(prm_dir)]
        common += ["--base-url", ",".join(s.url for s in servers), "--disable-tqdm"]
        try:
            for cmd, extra in (("aca", ["--final", "lin", "--budget", "6"]), ("search", ["--n", "4", "--width", "2"])):
                out = tmp_path / f"{name}_{cmd}.jsonl"
                assert main([cmd, *common, *extra, "--out", str(out)]) == 0
                runs[name, cmd] = sorted(out.read_text().splitlines())
        finally:
            for s in servers:
                s.close()
        if name == "two":
            assert servers[0].failed and servers[0].answered
    assert runs["one", "aca"] == runs["two", "aca"] and runs["one", "search"] == runs["two", "search"]
