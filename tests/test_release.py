"""The release (issue #35 item 2): ``python -m build`` makes the sdist and the wheel,
``twine check`` passes them, and the wheel installed in a fresh venv outside the
checkout runs ``pyqueue demo`` (the embedded default) and serves a task sent to a real
server with ``pyqueue worker`` (the Lua scripts come from inside the wheel)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent

APP = '''
from pyqueue import Tasks

tasks = Tasks()


@tasks.task(name="release.add", queue="release", keep_result=60)
def add(a: int, b: int) -> int:
    return a + b
'''

SEND = '''
import app
sent = app.add.send(2, 3)
print(sent.id)
'''

@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The built distributions' folder, and a venv (outside the checkout) with the wheel."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True,
                   capture_output=True, timeout=600)
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (wheel,) = out.glob("*.whl")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(wheel)], check=True, capture_output=True, timeout=600)
    return out, venv


def test_build_makes_an_sdist_and_a_wheel_that_twine_passes(wheel_venv: tuple[Path, Path]) -> None:
    out, _ = wheel_venv
    names = sorted(p.name for p in out.iterdir())
    assert any(n.endswith(".whl") and n.startswith("pyqueue_redis-") for n in names), names
    assert any(n.endswith(".tar.gz") and n.startswith("pyqueue_redis-") for n in names), names
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, out.iterdir())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this checkout on the path (the venv's pyqueue is the wheel's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYQUEUE_URL", "PYTEST_CURRENT_TEST")}
    return {**env, **extra}


def test_the_wheel_runs_the_demo_in_a_fresh_venv(wheel_venv: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = wheel_venv
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import pyqueue; print(pyqueue.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=60, check=True)
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout, where.stdout
    done = subprocess.run([str(venv / "bin" / "pyqueue"), "demo", "--jobs", "300", "--workers", "2"],
                          capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    version = subprocess.run([str(venv / "bin" / "pyqueue"), "--version"], capture_output=True, text=True,
                             cwd=tmp_path, env=clean_env(), timeout=60, check=True)
    assert version.stdout.startswith("pyqueue ") and "unknown" not in version.stdout


def test_the_wheel_serves_a_task_sent_to_a_real_server(
    wheel_venv: tuple[Path, Path], tmp_path: Path, redis_server: RedisServer
) -> None:
    _, venv = wheel_venv
    redis_server.client().flushall()
    python = str(venv / "bin" / "python")
    (tmp_path / "app.py").write_text(APP)
    env = clean_env(PYQUEUE_URL=redis_server.url())
    sent = subprocess.run([python, "-c", SEND], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.strip()
    worker = subprocess.run([str(venv / "bin" / "pyqueue"), "worker", "app:tasks", "--burst"], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=120)
    assert worker.returncode == 0, worker.stderr[-2000:]
    read = subprocess.run(
        [python, "-c", f"from pyqueue import Queue; print(Queue('release').result({job_id!r}).value)"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )
    assert read.returncode == 0 and read.stdout.strip() == "5", read.stdout + read.stderr
