"""The house in layers (docs/layout.md): no import circle, imports inside functions only for
heavy or optional dependencies, a CLI whose help loads no torch, and tests and benchmarks
that use the public surface. The layer order itself is checked by `lint-imports`
(pyproject.toml), which `make test` runs before these tests."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "betaprm"

# Modules whose import loads torch (or fastapi): a torch-free module may import them inside
# the function that needs them, so that the CLI's --help, selection, ACA and the data tools
# start without torch. Any other betaprm import belongs at the top of the module.
HEAVY = (
    "beta",
    "batching",
    "vision",
    "scoring",
    "model",
    "train.run",
    "train.trainer",
    "train.checkpoints",
    "train.dataset",
    "train.evaluate",
    "train.finish",
    "tiny",
    "generation.hf",
    "serve",
    "reward",
    "demo",
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path):
    """(resolved module, node, inside a function) for every ``from ... import`` of the file."""
    tree = ast.parse(path.read_text())
    module, is_package = _module(path), path.name == "__init__.py"

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ImportFrom):
                yield _resolve(child, module, is_package), child, in_function
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child, in_function
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    return list(walk(tree, False))


def _is_heavy(target: str) -> bool:
    name = target.removeprefix("betaprm.")
    return any(name == h or name.startswith(h + ".") for h in HEAVY)


def test_no_import_circle():
    """No two modules reach each other through imports, at the top of a module or inside a
    function (grimp reads both)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("betaprm")
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    # Tarjan's strongly connected components: any with two or more modules is a circle.
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    assert circles == []


def test_imports_inside_functions_are_for_heavy_modules_only():
    """A betaprm module imported inside a function is a heavy one (torch, fastapi) imported
    by a module that is itself free of it; never a way around a circle."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        imports = _imports(path)
        top_heavy = any(t == "torch" or t.startswith("torch.") or _is_heavy(t) for t, _, f in imports if not f)
        for target, node, in_function in imports:
            if not in_function or not target.startswith("betaprm"):
                continue
            if top_heavy or not _is_heavy(target):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target}")
    assert bad == [], "move these imports to the top of their module:\n" + "\n".join(bad)


def test_cli_help_loads_no_torch():
    """`betaprm --help` and every `betaprm CMD --help` build and print without importing
    torch, transformers or the hub client: each command loads its heavy parts when it runs."""
    code = """
import contextlib, io, sys
from betaprm.cli import COMMANDS, build_parser
parser = build_parser()
for argv in [["--help"], *([name, "--help"] for name in COMMANDS)]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args(argv)
    assert "usage: betaprm" in out.getvalue(), argv
loaded = sorted(m for m in ("torch", "transformers", "huggingface_hub", "fastapi", "matplotlib") if m in sys.modules)
assert not loaded, f"--help imported {loaded}"
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_tests_and_benchmarks_use_public_names():
    """Tests and benchmarks import betaprm's public names only (a private one would tie them to
    a module's insides)."""
    bad = []
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("betaprm"):
                names = [(node.module or "")] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("betaprm")]
            else:
                continue
            private = [n for n in names for part in n.split(".") if part.startswith("_") and part != "__main__"]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {', '.join(private)}")
    assert bad == [], "\n".join(bad)


def test_layout_doc_matches_the_code():
    """docs/layout.md draws the layers pyproject.toml's contract enforces, in the same order,
    and names every module of the package (and none that is gone)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    text = (ROOT / "docs" / "layout.md").read_text()
    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    drawn = text.split("```")[1].strip().splitlines()
    assert [line.split("   ")[0].strip() for line in drawn] == layers
    files = {p.name for p in SRC.rglob("*.py")}
    tree = text.split("## One line per module")[1].split("```")[1].split("configs/accelerate/")[0]
    named = set(re.findall(r"\b[a-z_]+\.py\b", tree))
    assert files - named == set()
    assert named - files == set()
