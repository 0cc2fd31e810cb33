"""``pyqueue worker module:tasks`` and the task layer in the CLI: a Tasks object served
from the current directory, a bad target refused in one line with exit 2, and
``pyqueue stats`` / ``pyqueue services`` showing which task names are waiting with no
live worker serving them. On a real redis-server and a cluster (worker processes need
a server they share)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_cli import url  # noqa: F401 (the fixture: a real server's or a cluster node's URL)

from pyqueue import Queue, Tasks, connect
from pyqueue.cli import main
from pyqueue.ops.service import Services

APP = textwrap.dedent(
    """
    from pyqueue import Tasks
    tasks = Tasks()

    @tasks.task(name="app.add", keep_result=60)
    def add(a, b):
        return a + b

    @tasks.task(name="app.shout", queue="loud")
    async def shout(text):
        return text.upper()
    """
)


def pyqueue(*args: str, cwd: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYQUEUE_URL=url)
    env.pop("PYTHONPATH", None)  # the app is found through the current directory alone
    return subprocess.run([sys.executable, "-m", "pyqueue", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_worker_of_a_tasks_object_in_the_current_directory_serves_every_task_queue(tmp_path: Path, url: str) -> None:
    (tmp_path / "app.py").write_text(APP)
    sys.path.insert(0, str(tmp_path))
    try:
        import app  # the producer's copy of the same module

        app.tasks.bind(connect(url))
        added = app.add.send(2, 3)
        shouted = app.shout.send("hi")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("app", None)
    done = pyqueue("worker", "app:tasks", "--burst", "--block-ms", "200", cwd=tmp_path, url=url)
    assert done.returncode == 0, done.stderr
    assert added.result(timeout=5) == 5
    assert Queue.from_url(url, "loud").stats().acked == 1
    assert shouted.state() == "done"  # acked (its tombstone): the async task ran on an AsyncWorker


@pytest.mark.parametrize("target, says", [
    ("nomodule:tasks", "cannot import 'nomodule'"),
    ("app:missing", "has no attribute 'missing'"),
    ("app:VALUE", "not a function of a Job or a pyqueue.Tasks"),
    ("app", "must be module:function or module:tasks"),
])
def test_a_bad_worker_target_is_one_line_and_exit_2(tmp_path: Path, url: str, target: str, says: str) -> None:
    (tmp_path / "app.py").write_text(APP + "\nVALUE = 42\n")
    done = pyqueue("worker", target, "-q", "default", cwd=tmp_path, url=url)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if "WARNING" not in line]
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_stats_lists_task_names_waiting_with_no_live_worker_serving_them(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = Tasks(url=url)

    @tasks.task(name="billing.charge")
    def charge(cents: int) -> None: ...

    @tasks.task(name="billing.refund")
    def refund(cents: int) -> None: ...

    charge.send(100)
    charge.send_in(60, 200)  # scheduled jobs count too
    refund.send(50)
    services = Services(connect(url))
    served = services.register(["default"], tasks=["billing.refund"])
    try:
        assert main(["--url", url, "stats"]) == 0
        out = capsys.readouterr().out
        assert "no live worker serving them" in out
        row = next(line for line in out.splitlines() if "billing.charge" in line)
        assert row.split() == ["default", "billing.charge", "2"]
        assert "billing.refund" not in out.split("no live worker")[1]
        assert main(["--url", url, "services"]) == 0
        assert "billing.refund" in capsys.readouterr().out
    finally:
        services.deregister(served)
    # No live worker at all: both names are listed.
    assert main(["--url", url, "stats"]) == 0
    out = capsys.readouterr().out.split("no live worker")[1]
    assert "billing.charge" in out and "billing.refund" in out
