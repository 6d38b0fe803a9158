"""The package's imports, counted, and the CLI's start, timed.

    python benchmarks/import_graph.py [--src DIR] [--runs 5]

Counts the import statements of ``src/betaprm`` (or ``--src DIR``, e.g. an older checkout's
``src``) at module level and inside functions (those of betaprm modules apart), lists every
import circle (modules that reach each other, read by grimp, which sees imports inside
functions too), and times ``betaprm --help`` and ``betaprm train --help`` in fresh processes
(median of ``--runs``; wall time and peak memory), noting whether torch was loaded.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def count_imports(pkg: Path) -> dict:
    top = inside = inside_own = 0
    for path in sorted(pkg.rglob("*.py")):

        def walk(node, in_function):
            nonlocal top, inside, inside_own
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if not in_function:
                        top += 1
                        continue
                    inside += 1
                    own = isinstance(child, ast.ImportFrom) and (
                        child.level or (child.module or "").startswith("betaprm")
                    )
                    inside_own += bool(own)
                walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        walk(ast.parse(path.read_text()), False)
    return {"module_level": top, "inside_functions": inside, "inside_functions_of_betaprm_modules": inside_own}


def circles(src: Path) -> list[list[str]]:
    code = f"""
import json, sys
sys.path.insert(0, {str(src)!r})
import grimp
g = grimp.build_graph("betaprm")
mods = sorted(g.modules)
edges = {{m: set(g.find_modules_directly_imported_by(m)) for m in mods}}
reach = {{}}
def closure(m):
    seen, todo = set(), [m]
    while todo:
        for w in edges[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen
reach = {{m: closure(m) for m in mods}}
groups = {{}}
for m in mods:
    if m in reach[m]:
        groups.setdefault(frozenset(w for w in reach[m] if m in reach[w]), None)
print(json.dumps(sorted(sorted(g) for g in groups)))
"""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def time_help(src: Path, argv: list[str], runs: int) -> dict:
    code = (
        "import sys, contextlib, io, resource\n"
        "from betaprm.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit): main(sys.argv[1:])\n"
        "print('torch' in sys.modules, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    times, rss, torch = [], [], None
    for _ in range(runs):
        start = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, check=True)
        times.append(time.perf_counter() - start)
        loaded, kb = p.stdout.split()[-2:]
        torch = loaded == "True"
        rss.append(int(kb) / 1024)
    return {
        "argv": argv,
        "median_s": round(statistics.median(times), 3),
        "peak_rss_mb": round(max(rss)),
        "torch": torch,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(ROOT / "src"), help="the folder holding the betaprm package")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per timed command")
    args = ap.parse_args()
    src = Path(args.src).resolve()
    out = {
        "imports": count_imports(src / "betaprm"),
        "circles": circles(src),
        "help": [time_help(src, argv, args.runs) for argv in (["--help"], ["train", "--help"])],
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
