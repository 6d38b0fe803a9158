"""What a training run may write or delete, decided before it starts: a model continued in
its own folder, last run's rejects given as data, inputs under the checkpoint rotation;
resumes that change the evaluation; a best-model metric undefined at every evaluation."""

import json
import logging
import shutil

import pytest

from betaprm.cli import main
from betaprm.errors import BetaPRMInputError
from betaprm.train import train

from .helpers import make_counts, make_lm_dir, train_config


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_lm_dir(tmp_path_factory.mktemp("lm") / "lm")


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    return make_counts(tmp_path_factory.mktemp("data") / "counts.jsonl", n=24)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, lm_dir, counts):
    """A finished BetaPRM run folder (model, summary, checkpoints): copied by tests that touch it."""
    out = tmp_path_factory.mktemp("run") / "bprm"
    train(train_config(lm_dir, counts, out, max_steps=2, save_steps=1))
    return out


def _tree(folder):
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


def test_continuing_a_model_in_its_own_folder_with_overwrite_is_refused_before_anything_is_touched(
    tmp_path, trained, counts, capsys
):
    """Fails before this change: --overwrite-output-dir deleted betaprm_config.json,
    train_summary.json and the checkpoints of the --model folder before reading it; the
    run then stopped and the model no longer loaded."""
    run = shutil.copytree(trained, tmp_path / "bprm")
    before = _tree(run)
    code = main(
        [
            "train",
            "--model",
            str(run),
            "--data",
            str(counts),
            "--output-dir",
            str(run),
            "--overwrite-output-dir",
            "--max-steps",
            "1",
            "--use-cpu",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--overwrite-output-dir would delete" in err and "another --output-dir" in err
    assert _tree(run) == before
    from betaprm import BetaPRM

    BetaPRM.from_pretrained(run)  # still loads


def test_an_input_inside_a_checkpoint_folder_of_the_output_is_refused(tmp_path, trained, counts):
    """The checkpoint rotation (and --overwrite-output-dir) deletes checkpoint-* folders: a
    model read from one of them would be deleted under the run."""
    run = shutil.copytree(trained, tmp_path / "bprm")
    ckpt = sorted(run.glob("checkpoint-*"))[0]
    with pytest.raises(BetaPRMInputError, match="lies in a checkpoint folder of --output-dir"):
        train(train_config(str(ckpt), counts, run, overwrite_output_dir=True))
    assert ckpt.is_dir()


def test_last_runs_rejects_as_data_are_not_overwritten_by_this_runs_rejects(tmp_path, lm_dir, counts, capsys):
    """Fails before this change: the default rejects path (OUTPUT_DIR/rejects.jsonl) was
    checked only when given explicitly: a 25-line data file there became its 1 rejected
    line, exit 0."""
    out = tmp_path / "out"
    out.mkdir()
    data = out / "rejects.jsonl"
    lines = counts.read_text().splitlines()[:24] + ['{"id": "bad", "question": "q"}']
    data.write_text("\n".join(lines) + "\n")
    code = main(
        [
            "train",
            "--model",
            str(lm_dir),
            "--data",
            str(data),
            "--output-dir",
            str(out),
            "--on-error",
            "skip",
            "--max-steps",
            "1",
            "--use-cpu",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--rejects" in err and "is the input --data" in err
    assert data.read_text().splitlines() == lines


def _evals(history, key):
    return [h[key] for h in history if key in h]


def test_a_resume_with_another_best_metric_or_eval_data_is_refused(tmp_path, lm_dir, counts):
    """Fails before this change: a run evaluated by mae resumed under nll reported step 1's
    mae as the best nll, and the best checkpoint stayed on it."""
    held = make_counts(tmp_path / "held.jsonl", n=8, seed=3)
    other = make_counts(tmp_path / "other.jsonl", n=8, seed=4)
    kw = dict(eval_data=str(held), max_steps=4, save_steps=2, eval_steps=2)
    run = tmp_path / "a"
    train(train_config(lm_dir, counts, run, metric_for_best_model="mae", **kw))
    shutil.rmtree(run / "checkpoint-4")  # interrupted after step 2
    with pytest.raises(BetaPRMInputError, match="--metric-for-best-model: 'eval_mae' before, 'eval_nll' now"):
        train(train_config(lm_dir, counts, run, metric_for_best_model="nll", resume_from_checkpoint="last", **kw))
    with pytest.raises(BetaPRMInputError, match="--eval-data: "):
        train(
            train_config(
                lm_dir,
                counts,
                run,
                metric_for_best_model="mae",
                resume_from_checkpoint="last",
                **{**kw, "eval_data": str(other)},
            )
        )
    # The same evaluation resumes; a resume without evaluation has no best metric to mix.
    _, trainer, _ = train(
        train_config(lm_dir, counts, run, metric_for_best_model="mae", resume_from_checkpoint="last", **kw)
    )
    assert trainer.state.best_metric in _evals(trainer.state.log_history, "eval_mae")


def test_a_best_metric_undefined_at_every_evaluation_is_a_warning_naming_it(tmp_path, lm_dir, counts, caplog):
    """Fails before this change: --load-best-model-at-end with F1 nan at every evaluation
    (held-out items all correct) silently ended on the last step."""
    data = tmp_path / "pb.json"
    data.write_text(
        json.dumps(
            [
                {
                    "id": str(i),
                    "subset": "gsm8k",
                    "problem": f"add {i}",
                    "steps": ["1 + 2 = 3", "3 + 4 = 7"],
                    "label": -1,
                }
                for i in range(4)
            ]
        )
    )
    out = tmp_path / "pb"
    with caplog.at_level(logging.WARNING):
        train(
            train_config(
                lm_dir,
                counts,
                out,
                eval_data=str(data),
                max_steps=2,
                save_steps=1,
                eval_steps=1,
                load_best_model_at_end=True,
            )
        )
    warned = [r.getMessage() for r in caplog.records if "undefined (nan) at all" in r.getMessage()]
    assert warned and "eval_f1" in warned[0] and "kept the last step" in warned[0]
    summary = json.loads((out / "train_summary.json").read_text())["evaluation"]
    assert summary["final_model_is"] == "last step" and "eval_f1" in summary["warning"]
