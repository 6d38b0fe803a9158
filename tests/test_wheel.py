"""The package as users get it: a wheel built from the source, installed into a fresh environment.

The fresh environment reuses the dependencies already installed here (torch, transformers, ...)
through a ``.pth`` line naming this environment's site-packages, so nothing is downloaded. That
site-packages holds betaprm only as an editable install (``__editable__.betaprm-*.pth``, naming
``src/``), and a path named in a ``.pth`` line is not itself scanned for ``.pth`` files: the new
environment imports the wheel's betaprm, never the source tree, which the test checks."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COUNTS = {"id": "w-1", "question": "2+2?", "steps": ["2+2=4", "answer 4"], "mc_correct": [7, 8], "mc_total": 8}


def run(cmd, cwd, env, timeout=300):
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def build_wheel(tmp_path: Path, env) -> Path:
    """Build from a copy of the source, so the build's egg-info and build/ never land in the tree."""
    pytest.importorskip("build", reason="`python -m build` comes with the test extra: pip install -e '.[test]'")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignore)
    out = tmp_path / "wheels"
    # --no-isolation: the build backend is this environment's setuptools (nothing downloaded).
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)], tmp_path, env)
    wheels = sorted(out.glob("betaprm-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["HF_HUB_OFFLINE"] = "1"
    wheel = build_wheel(tmp_path, env)

    # What the wheel holds: every module, the PEP 561 marker, the licence in its dist-info.
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(metadata).decode()
        licences = [n for n in names if ".dist-info/licenses/" in n]
        assert [n.rsplit("/", 1)[-1] for n in licences] == ["LICENSE"], licences
        assert "Apache License" in z.read(licences[0]).decode()
    assert "betaprm/py.typed" in names
    assert "License-Expression: Apache-2.0" in meta
    assert "Classifier: Typing :: Typed" in meta
    modules = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "betaprm").rglob("*.py")}
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"

    # A fresh environment; the wheel goes in before the dependencies are made visible, so pip
    # sees no other betaprm (the editable install's metadata) when it installs this one.
    venv = tmp_path / "env"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    run([*pip, "install", "--quiet", "--no-deps", "--no-index", str(wheel)], tmp_path, env)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(run([str(python), "-c", where], tmp_path, env).stdout.strip())
    assert purelib.is_relative_to(venv)
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "_betaprm_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))

    work = tmp_path / "elsewhere"  # outside the source tree: no src/ on the path by accident
    work.mkdir()
    assert not work.resolve().is_relative_to(ROOT)
    betaprm = str(venv / "bin" / "betaprm")

    helped = run([betaprm, "--help"], work, env)
    assert "validate" in helped.stdout and "train" in helped.stdout

    counts = work / "counts.jsonl"
    counts.write_text(json.dumps(COUNTS) + "\n")
    run([betaprm, "validate", str(counts)], work, env)

    probe = (
        "import importlib.metadata as m, importlib.resources as r, json, betaprm\n"
        "print(json.dumps({'file': betaprm.__file__, 'version': m.version('betaprm'),"
        " 'typed': r.files('betaprm').joinpath('py.typed').is_file()}))"
    )
    found = json.loads(run([str(python), "-c", probe], work, env).stdout.strip().splitlines()[-1])
    assert Path(found["file"]).resolve().is_relative_to(venv.resolve()), found
    assert not Path(found["file"]).resolve().is_relative_to(ROOT), found
    assert found["typed"] is True
    assert found["version"] in wheel.name
