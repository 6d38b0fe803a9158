"""The user-facing text keeps its promises: a short README, every cited file present (or,
once removed, named with a commit that has it), no issue or session talk, and each long module
saying why it is long."""

import ast
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
CITED = re.compile(r"`((?:src|docs|benchmarks|tests|configs)/[^`\s]+)`")
# a script named inside a command (`python benchmarks/x.py ...`), not after `COMMIT:`
SCRIPT = re.compile(r"(?<![\w/.:-])((?:src|benchmarks|tests)/[\w/.-]*\w\.(?:py|sh))\b")
# a removed file: "`benchmarks/x.py` (removed; at commit abc1234)" in the same section
REMOVED = r"`{}`,? \(?removed; at commit ([0-9a-f]{{7,40}})\b"


def _in_commit(path, commit):
    """Whether ``commit`` has ``path`` (True where there is no git history to ask, as in an sdist)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return True
    done = subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT, capture_output=True)
    return done.returncode == 0


def test_readme_is_a_short_guide():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_every_cited_file_exists():
    missing = []
    for path in TEXTS:
        for section in re.split(r"(?m)^## ", path.read_text()):
            for cited in {*CITED.findall(section), *SCRIPT.findall(section)}:
                cited = cited.rstrip(".,;:)")
                if any(c in cited for c in "*<>{}") or re.search(r"\b(OUT|DIR|NAME)\b", cited):
                    continue  # a pattern or a placeholder, not a file
                for part in cited.split(","):  # `a/x.json`, `b.json` style lists
                    if not part or (ROOT / part).exists() or "/" not in part:
                        continue
                    note = re.search(REMOVED.format(re.escape(part)), section)
                    if note is None:
                        missing.append(f"{path.name}: {part}")
                    elif not _in_commit(part, note.group(1)):
                        missing.append(f"{path.name}: {part} is not in commit {note.group(1)}")
    assert not missing, missing


def test_no_issue_or_session_talk():
    pattern = re.compile(r"\bissue #?\d|\bitem \d|\bsessions?\b", re.IGNORECASE)
    hits = [f"{p.name}: {m.group(0)}" for p in TEXTS for m in pattern.finditer(p.read_text())]
    assert not hits, hits


def test_long_modules_say_why():
    long = []
    for path in (ROOT / "src" / "betaprm").rglob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 400 and "400 lines" not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(str(path.relative_to(ROOT)))
    assert not long, long
