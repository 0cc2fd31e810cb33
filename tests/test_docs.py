"""The documentation site builds with no warning (``mkdocs build --strict``: a broken
link or anchor, a page missing from the navigation, a docstring mkdocstrings cannot
read), and its code blocks run: ``docs/conftest.py`` has Sybil collect every Python
block of docs/**.md, and the test below runs them as ``python -m pytest docs`` does, in
a process of their own (issue #35 item 3). Not in the suite's own collection: a page's
blocks share one namespace, so they must run in one process in order (pytest-xdist
would spread them over its workers), and docs/conftest.py would shadow
tests/conftest.py as the module ``conftest``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_strictly_without_a_warning(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert not re.search(r"^(WARNING|ERROR)\b", output, re.M), output
    assert (tmp_path / "site" / "tutorial" / "index.html").exists()
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "pyqueue worker" in cli and "--version" in cli  # generated from the parser
    api = (tmp_path / "site" / "reference" / "api" / "pyqueue" / "index.html").read_text(encoding="utf-8")
    assert "pyqueue.Queue" in api and "pyqueue.Tasks" in api


def test_every_page_is_in_the_navigation_and_every_python_block_is_collected() -> None:
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert {p for p in pages if f": {p}" not in nav} == set()
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:benchmark", "docs"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    collected = [line for line in done.stdout.splitlines() if line.startswith("docs/")]
    blocks = sum(len(re.findall(r"^\s*```python$", (ROOT / "docs" / p).read_text(encoding="utf-8"), re.M)) for p in pages)
    invisible = sum((ROOT / "docs" / p).read_text(encoding="utf-8").count("<!-- invisible-code-block: python") for p in pages)
    skips = sum(len(re.findall(r"<!-- skip: \w+", (ROOT / "docs" / p).read_text(encoding="utf-8"))) for p in pages)
    assert len(collected) == blocks + invisible + skips, done.stdout[-3000:]


def test_every_block_not_run_says_why() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if re.match(r"<!-- skip: (next|start) -->$", line):
                assert n > 0 and re.match(r"<!-- not run: .+ -->$", lines[n - 1]), f"{page}:{n + 1}"


def test_the_pages_python_blocks_run() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:benchmark",
                           "-p", "no:cacheprovider", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"^\d+ passed in ", done.stdout.splitlines()[-1]), done.stdout[-2000:]
