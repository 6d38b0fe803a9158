"""Numbers past float range and hostile config files: one number check (``betaprm.numeric``)
for records, requests, config files and flags, config files without YAML aliases and with
``1e-5`` read as a number, ``~`` in path options, and threshold options checked at start.
Each docstring says what the code did before."""

import json
import math

import pytest

from betaprm.cli import build_parser, main
from betaprm.cli.eval_steps import EvalStepsConfig
from betaprm.cli.flags import config_from_args
from betaprm.data.jsonl import BadJSON, loads_strict
from betaprm.errors import BetaPRMInputError
from betaprm.numeric import NumberRefused, number, shown
from betaprm.serve_requests import RequestError, number_field, parse_json
from betaprm.train import TrainConfig

HUGE = int("1" + "0" * 400)  # beyond float range: float() and math.isfinite raise OverflowError
GOOD = {"id": "ok", "question": "2+2?", "steps": ["2+2=4", "answer 4"], "mc_correct": [7, 8], "mc_total": 8}


def refused(capsys, code, *names) -> str:
    """``code`` (main's) is 2 and the one message names every one of ``names``, no traceback."""
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    for n in names:
        assert n in out + err, (n, out + err)
    return out + err


def records(path, *rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def laughs(depth: int) -> str:
    """The "billion laughs" YAML: one option whose value nests nine aliases of the level
    before, ``depth`` levels (9**depth items behind a few hundred bytes)."""
    lines = ["seed: [", '  &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"],']
    lines += [f"  &a{i} [{','.join([f'*a{i - 1}'] * 9)}]," for i in range(1, depth)]
    return "\n".join([*lines, "]"]) + "\n"


# ---------------------------------------------------------------- the parser itself


def test_huge_integers_are_refused_by_size_never_converted():
    """Before: no one check; ``math.isfinite(10**400)`` raised OverflowError where it was used."""
    for kw in ({}, {"integer": True}, {"low": 0, "high": 1}, {"low": 0}):
        with pytest.raises(NumberRefused, match="401 digits") as e:
            number(HUGE, "--x", **kw)
        assert len(str(e.value)) < 200
    with pytest.raises(NumberRefused, match="--seed must be an integer, got 9223372036854775808"):
        number(2**63, "--seed", integer=True)
    assert number(2**63 - 1, "--seed", integer=True) == 2**63 - 1
    with pytest.raises(NumberRefused, match="401 digits"):
        number("1" + "0" * 400, "--seed", integer=True, text=True)


def test_text_numbers_bools_and_signed_zero():
    assert number("1e-5", "--lr", text=True) == 1e-5
    assert number(" 12 ", "--n", integer=True, text=True) == 12
    zero = number("-0", "--x", text=True)
    assert zero == 0 and math.copysign(1, zero) == 1  # -0.0 comes back as 0.0
    assert math.copysign(1, number(-0.0, "x")) == 1
    assert number("-0", "--n", integer=True, text=True) == 0
    for text in ("nan", "inf", "-inf", "1e400", "Infinity", "abc", ""):
        with pytest.raises(NumberRefused, match="must be a finite number"):
            number(text, "--lam", text=True)
    for value in (True, False):
        with pytest.raises(NumberRefused, match=f"got {value}"):
            number(value, "x")
        with pytest.raises(NumberRefused):
            number(value, "x", integer=True)
    with pytest.raises(NumberRefused, match="must be an integer, got 2.5"):
        number(2.5, "n", integer=True)
    with pytest.raises(NumberRefused, match="got '5'"):
        number("5", "n")  # text only where text is expected (a flag), not in JSON


def test_ranges_and_the_one_message_shape():
    assert number(0.5, "x", low=0, high=1) == 0.5 and number(1, "x", low=0, high=1) == 1
    assert number(0, "x", low=0) == 0
    with pytest.raises(NumberRefused) as e:
        number(float("nan"), "--threshold", low=0, high=1)
    assert str(e.value) == "--threshold must be a finite number in [0, 1], got nan"
    with pytest.raises(NumberRefused, match=r"must be a finite number > 0, got 0"):
        number(0, "kappa", low=0, low_open=True)
    with pytest.raises(NumberRefused, match=r"in \[0, 1\), got 1"):
        number(1.0, "p", low=0, high=1, high_open=True)
    with pytest.raises(NumberRefused, match=r"must be an integer <= 3, got 4"):
        number(4, "n", integer=True, high=3)


def test_values_in_messages_are_cut():
    assert len(shown("x" * 10**6)) <= 80
    assert shown(10**400) == "an integer of 401 digits"
    nested = ["lol"] * 9
    for _ in range(9):
        nested = [nested] * 9  # 9**10 items behind a few hundred list objects
    assert len(shown(nested)) <= 80  # not walked whole


# ---------------------------------------------------------------- records


def test_a_400_digit_count_is_a_problem_of_its_record(tmp_path, capsys):
    """Before: `validate` and `train` crashed (OverflowError traceback, exit 1) on
    ``mc_correct: [1000...0]``, even with --on-error skip."""
    bad = json.dumps({**GOOD, "id": "big"}).replace("[7, 8]", f"[{HUGE}, 8]")
    path = records(tmp_path / "r.jsonl", GOOD, bad)
    msg = refused(capsys, main(["validate", path]), f"{path}:2: field 'mc_correct[0]'", "401 digits")
    assert "1 good records, 1 bad" in msg
    # The same for every count and score field: no OverflowError anywhere.
    pool = {"id": "p", "question": "q", "candidates": [{"steps": ["a"], "mu": [HUGE], "kappa": [HUGE]}]}
    path = records(tmp_path / "pool.jsonl", pool)
    refused(capsys, main(["validate", "--kind", "pool", path]), "candidates[0].mu[0]", "401 digits")
    path = records(tmp_path / "n.jsonl", {**GOOD, "mc_total": HUGE})
    refused(capsys, main(["validate", path]), "mc_total[0]", "from 1 to 16,777,216")


def test_train_skips_a_record_with_a_400_digit_count(tmp_path, capsys):
    """Before: `train --on-error skip` crashed (OverflowError, exit 1) instead of skipping it."""
    from .helpers import make_counts, make_lm_dir

    lm = make_lm_dir(tmp_path / "lm", hidden=16, layers=1)
    good = make_counts(tmp_path / "good.jsonl", n=8).read_text()
    bad = json.dumps({**GOOD, "id": "big"}).replace("[7, 8]", f"[{HUGE}, 8]")
    data = tmp_path / "data.jsonl"
    data.write_text(good + bad + "\n")
    out = tmp_path / "run"
    common = ["train", "--model", str(lm), "--data", str(data), "--output-dir", str(out), "--use-cpu"]
    refused(capsys, main(common), f"{data}:9: field 'mc_correct[0]'", "--on-error skip")
    argv = [*common, "--on-error", "skip", "--max-steps", "1", "--global-batch-size", "4", "--save-steps", "1"]
    assert main(argv) == 0, capsys.readouterr()
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [9] and "401 digits" in rejects[0]["reasons"][0]


def test_a_number_beyond_float_range_is_refused_where_it_is_read(tmp_path, capsys):
    """Before: ``1e400`` was read as infinity; the message showed ``Infinity``, not what the
    file says."""
    with pytest.raises(BadJSON, match="'1e400', beyond float range"):
        loads_strict('{"mu": [1e400]}')
    pool = {"id": "p", "question": "q", "candidates": [{"steps": ["a"], "mu": [0.5], "kappa": [2.0]}]}
    path = records(tmp_path / "pool.jsonl", json.dumps(pool).replace("2.0", "1e400"))
    refused(capsys, main(["validate", "--kind", "pool", path]), f"{path}:1", "1e400", "float range")


# ---------------------------------------------------------------- requests


def test_request_numbers_are_checked_by_size_first():
    """Before: a 400-digit ``lam`` was a 500 (math.isfinite raised OverflowError)."""
    with pytest.raises(
        RequestError, match="field 'lam' must be a finite number in \\[-100, 100\\], got an integer of"
    ):
        number_field({"lam": HUGE}, "lam", 0.5, -100.0, 100.0, "in [-100, 100]")
    with pytest.raises(RequestError, match="field 'tau' must be a finite number >= 0"):
        number_field({"tau": True}, "tau", None, 0.0, math.inf, ">= 0")
    assert number_field({}, "lam", 0.5, -100.0, 100.0, "in [-100, 100]") == 0.5
    with pytest.raises(RequestError, match="'1e400', beyond float range") as e:
        parse_json(b'{"question": "q", "steps": ["a"], "lam": 1e400}')
    assert e.value.status == 400


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from betaprm import BetaPRM

    from .helpers import make_lm_dir
    from .test_serve import Server

    d = tmp_path_factory.mktemp("serve")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm", hidden=16, layers=1))).save_pretrained(d / "prm")
    s = Server(d / "prm")
    yield s
    s.stop()


def test_a_400_digit_lam_is_a_400_not_a_500(server):
    """Before: 500 Internal Server Error (OverflowError in the request check)."""
    raw = b'{"question": "q", "steps": ["a"], "lam": ' + str(HUGE).encode() + b"}"
    status, res = server.request("POST", "/v1/score", raw=raw)
    assert status == 400 and "field 'lam'" in res["error"] and "401 digits" in res["error"], res
    assert len(res["error"]) < 300
    assert server.request("POST", "/v1/score", {"question": "q", "steps": ["a"]})[0] == 200


# ---------------------------------------------------------------- config files


def test_yaml_aliases_are_refused_before_anything_expands_them(tmp_path, capsys):
    """Before: the type error's message ``str()``-ed the value: a 539-byte file of nested
    aliases grew to gigabytes (a smaller one printed a message without saying why)."""
    small = tmp_path / "small.yaml"
    small.write_text(laughs(5))
    refused(capsys, main(["eval-bon", "--config", str(small)]), f"--config {small}:3", "YAML alias")
    full = tmp_path / "laughs.yaml"
    full.write_text(laughs(9))
    assert len(full.read_bytes()) < 540
    refused(capsys, main(["eval-bon", "--config", str(full)]), f"--config {full}", "YAML alias")
    merge = tmp_path / "merge.yaml"
    merge.write_text("base: &b {seed: 1}\n<<: *b\n")
    refused(capsys, main(["eval-bon", "--config", str(merge)]), f"--config {merge}:2", "YAML alias")


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_yaml_numbers_in_exponent_form_are_numbers(tmp_path):
    """Before: PyYAML read ``learning_rate: 1e-5`` as the text '1e-5' and the file was
    refused ("expected a finite number"), though ``--learning-rate 1e-5`` worked."""
    cfg = tmp_path / "trl.yaml"
    cfg.write_text("learning_rate: 1e-5\nweight_decay: 1E-2\nmax_grad_norm: 1.0e0\nlogging_steps: 10\nseed: 3\n")
    ns = parse("train", "--config", str(cfg), "--model", "m", "--data", "d.jsonl")
    c = config_from_args(TrainConfig, ns)
    assert (c.learning_rate, c.weight_decay, c.max_grad_norm, c.logging_steps, c.seed) == (1e-5, 0.01, 1.0, 10, 3)
    assert (
        c.learning_rate
        == config_from_args(
            TrainConfig, parse("train", "--model", "m", "--learning-rate", "1e-5", "--data", "d.jsonl")
        ).learning_rate
    )
    # Quoted, it is text, refused for a number option as before.
    cfg.write_text('learning_rate: "1e-5"\n')
    with pytest.raises(BetaPRMInputError, match="learning_rate must be a finite number, got '1e-5'"):
        config_from_args(TrainConfig, parse("train", "--config", str(cfg), "--model", "m", "--data", "d.jsonl"))


def test_a_400_digit_number_in_a_config_file_is_refused(tmp_path, capsys):
    """Before: OverflowError traceback (math.isfinite of the integer), exit 1."""
    for suffix in (".yaml", ".json"):
        cfg = tmp_path / f"c{suffix}"
        cfg.write_text(json.dumps({"val_fraction": HUGE, "seed": HUGE}))  # JSON is YAML too
        msg = refused(capsys, main(["eval-bon", "--config", str(cfg)]), f"--config {cfg}", "val_fraction", "seed")
        assert "401 digits" in msg and len(msg) < 1000


def test_a_trl_keys_warning_shows_a_bounded_value(capsys):
    """Before: the warning took ``repr`` of the whole value: an integer over 4300 digits
    raised ValueError, a nested one was turned into text whole."""
    from betaprm.train.hf_names import from_file_keys

    nested = ["lol"] * 9
    for _ in range(9):
        nested = [nested] * 9
    from_file_keys(TrainConfig, {"step_separator": 10**5000, "max_prompt_length": nested}, "c.yaml")
    err = capsys.readouterr().err
    assert "step_separator: an integer of 5001 digits" in err and "max_prompt_length: [[[" in err
    assert max(len(line) for line in err.splitlines()) < 400


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1.5", "-0.1"])
def test_eval_steps_threshold_must_be_a_probability(tmp_path, capsys, value):
    """Before: ``--threshold nan`` (inf, 1.5) passed and printed a meaningless table, exit 0."""
    code = main(
        ["eval-steps", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.jsonl"), f"--threshold={value}"]
    )
    refused(capsys, code, "--threshold must be a number in [0, 1], val or auto")
    for ok in ("0", "0.5", "1", "val", "auto"):
        assert EvalStepsConfig(model="m", data="d", threshold=ok).threshold == ok


def test_other_thresholds_and_probabilities_are_checked_at_start():
    """Before: each was accepted and decided nothing (every step cut, or none; every step
    one class), or reached torch or the sampler only once work had started."""
    from betaprm.aca import ACAConfig, final_selector_problems
    from betaprm.generation.factory import BackendOptions
    from betaprm.search import SearchConfig

    with pytest.raises(BetaPRMInputError, match="p_bad must be a probability"):
        ACAConfig(p_bad=1.5)
    with pytest.raises(BetaPRMInputError, match="p_bad must be a probability"):
        SearchConfig(p_bad=float("nan"))
    assert final_selector_problems("rb", -0.1) == ["final_tau must be a sigma threshold >= 0, got -0.1"]
    with pytest.raises(BetaPRMInputError, match="--hard-threshold must be in"):
        TrainConfig(model="m", data="d.jsonl", hard_threshold=1.5)
    with pytest.raises(BetaPRMInputError, match="--lora-dropout must be a probability"):
        TrainConfig(model="m", data="d.jsonl", lora_dropout=1.0)
    problems = BackendOptions(backend="synth", top_p=1.5, temperature=float("nan")).backend_problems()
    assert any("--top-p" in p for p in problems) and any("--temperature" in p for p in problems)


def test_non_finite_and_huge_flags_are_refused_naming_the_flag(tmp_path, capsys):
    """Before: ``--lam nan`` (an option without a check of its own) was taken, and a
    400-digit ``--seed`` went on to numpy."""
    common = ["eval-steps", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.jsonl")]
    refused(capsys, main([*common, "--lam", "nan"]), "--lam must be a finite number, got nan")
    refused(capsys, main([*common, "--seed", str(HUGE)]), "--seed must be an integer, got an integer of 401 digits")
    # A flag's own check, which words the range, comes first.
    refused(capsys, main([*common, "--val-fraction", "nan"]), "--val-fraction must be in (0, 1), got nan")
    with pytest.raises(SystemExit) as e:
        main(["convert", "--from", "trl", "--input", "x", "--output", "y", "--er-eta", "nan"])
    assert e.value.code == 2
    assert "--er-eta: must be a finite number, got 'nan'" in capsys.readouterr().err


# ---------------------------------------------------------------- ~ in paths


def test_a_tilde_path_is_the_home_folder_and_shown_expanded(tmp_path, monkeypatch, capsys):
    """Before: ``--model '~/w/ckpt'`` (quoted, so the shell left it) was read, but named
    ``~/w/ckpt`` as the model's id; ``validate '~/r.jsonl'`` and ``--config '~/c.yaml'`` were
    "no such file"."""
    from betaprm.hub import resolve_model

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "w" / "ckpt").mkdir(parents=True)
    src = resolve_model("~/w/ckpt")
    assert src.name == str(tmp_path / "w" / "ckpt") and src.path == tmp_path / "w" / "ckpt"
    records(tmp_path / "r.jsonl", GOOD)
    assert main(["validate", "~/r.jsonl"]) == 0
    assert str(tmp_path / "r.jsonl") in capsys.readouterr().out
    (tmp_path / "c.yaml").write_text("data: ~/d.jsonl\nout: ~/res.json\n")
    cfg = config_from_args(EvalStepsConfig, parse("eval-steps", "--config", "~/c.yaml", "--model", "~/w/ckpt"))
    assert (cfg.model, cfg.data, cfg.out) == tuple(str(tmp_path / p) for p in ("w/ckpt", "d.jsonl", "res.json"))
    # A hub name and a relative path stay as they are.
    cfg = config_from_args(EvalStepsConfig, parse("eval-steps", "--model", "owner/name", "--data", "d~.jsonl"))
    assert (cfg.model, cfg.data) == ("owner/name", "d~.jsonl")
