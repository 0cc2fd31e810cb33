"""The version has one home (pyqueue/protocol/version.py reads the installed
distribution, ``pyqueue-redis``), and ``pyqueue --version`` prints it (issue #35)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import pyqueue
from pyqueue.cli import main
from pyqueue.protocol.version import DISTRIBUTION, VERSION

ROOT = Path(__file__).resolve().parent.parent


def test_the_distribution_is_named_as_pyproject_names_it() -> None:
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("[project]\n", 1)[1].split("\n[", 1)[0]
    fields = dict(re.findall(r'^(name|version) = "([^"]+)"$', project, re.M))  # (tomllib is 3.11+)
    assert DISTRIBUTION == fields["name"] == "pyqueue-redis"
    assert VERSION == version(DISTRIBUTION) == fields["version"] == pyqueue.__version__


def test_pyqueue_version_prints_the_installed_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"pyqueue {VERSION}\n"


def test_the_installed_command_answers_version() -> None:
    done = subprocess.run([sys.executable, "-m", "pyqueue", "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"pyqueue {VERSION}"), done.stderr
