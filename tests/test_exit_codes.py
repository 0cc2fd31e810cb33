"""The rows of README's exit-code table that the other tests do not reach (issue #19):
bad URLs and refused credentials exit 2 with one line and no traceback, a starting
worker gives up on refused credentials after AUTH_GRACE_S instead of retrying for ever
(and warns at the first refusal, once, naming the URL without its password: issue #36),
and SIGTERM or SIGINT while a worker is still starting (Redis unreachable) exits 0 at
once. The rows already tested elsewhere: 0 and 1 (tests/test_worker.py, signals), 75
(test_worker.py, a lost registration), 78 (test_worker.py, an async handler), and 2 for
a bad worker target (tests/test_cli_tasks.py, import, attribute and not-callable errors).
On a real redis-server that requires a password."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RedisServer, free_ports, require_redis_server

from pyqueue import AuthenticationFailed, OutcomeUnknown, Queue, Worker, connect
from pyqueue.worker import worker as worker_module
from pyqueue.cli import main

TESTS = Path(__file__).resolve().parent
PASSWORD = "s3cret"


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    """A redis-server that requires a password (on a unix socket)."""
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pyqueue-auth-") as tmp:
        server = RedisServer(Path(tmp))
        server.client().config_set("requirepass", PASSWORD)
        try:
            yield server
        finally:
            server.stop()


def url(server: RedisServer, password: str | None) -> str:
    return f"unix://{':' + password + '@' if password else ''}{server.socket}"


def pyqueue(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.Popen([sys.executable, "-m", "pyqueue", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def one_line(stderr: str) -> str:
    """The error line of a failed command: it must be the only line besides log lines."""
    lines = [line for line in stderr.splitlines() if line.strip() and " INFO " not in line and " WARNING " not in line]
    assert len(lines) == 1 and lines[0].startswith("pyqueue: ") and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("bad_url, says", [
    ("foo://host", "is not a URL pyqueue can connect to"),
    ("redis://127.0.0.1:notaport/0", "InvalidArgument"),
])
def test_a_bad_url_is_one_line_and_exit_2(bad_url: str, says: str) -> None:
    for command in (["stats"], ["worker", "handlers:slow", "-q", "q"]):
        proc = pyqueue("--url", bad_url, *command)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2 and says in one_line(stderr)


@pytest.mark.parametrize("password", ["wrong", None])
def test_refused_credentials_are_not_an_unknown_outcome_and_exit_2(locked: RedisServer, password: str | None) -> None:
    q = Queue.from_url(url(locked, password), "q")
    with pytest.raises(AuthenticationFailed) as refused:
        q.enqueue(b"never sent")
    assert not isinstance(refused.value, OutcomeUnknown)
    proc = pyqueue("--url", url(locked, password), "stats")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "AuthenticationFailed" in one_line(stderr)


def test_a_starting_worker_gives_up_on_refused_credentials_after_the_grace_period(
    locked: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "AUTH_GRACE_S", 0.5)
    started = time.monotonic()
    code = main(["--url", url(locked, "wrong"), "worker", "handlers:slow", "-q", "q"])
    assert code == 2
    assert 0.5 <= time.monotonic() - started < 10  # waited out the grace period, then gave up
    assert main(["--url", url(locked, PASSWORD), "stats"]) == 0  # the right password works


class Records(logging.Handler):
    """The records of logger "pyqueue"; ``warned`` is set at the first WARNING."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.warned = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.levelno >= logging.WARNING:
            self.warned.set()

    def count(self, level: int) -> int:
        return sum(1 for rec in self.records if rec.levelno == level)


def test_a_worker_refused_its_credentials_warns_once_at_the_first_failure_naming_the_url_without_the_password(
    locked: RedisServer,
) -> None:
    secret = "not-the-s3cret"
    records, logger = Records(), logging.getLogger("pyqueue")
    # The retries are INFO lines of "pyqueue.worker" (whose level an earlier test may
    # have set: `pyqueue demo` quiets it in its process).
    levels = {name: logging.getLogger(name).level for name in ("pyqueue", "pyqueue.worker")}
    for name in levels:
        logging.getLogger(name).setLevel(logging.INFO)
    logger.addHandler(records)
    codes: list[int] = []
    try:
        worker = Worker(["q"], lambda job: None, redis=connect(url(locked, secret)))
        started = time.monotonic()
        runner = threading.Thread(target=lambda: codes.append(worker.run(install_signal_handlers=False)))
        runner.start()
        try:
            assert records.warned.wait(30), "no warning at all"
            assert time.monotonic() - started < 2.0  # at the first failure, not seconds later
            deadline = time.monotonic() + 30
            while records.count(logging.INFO) < 2:  # two retries after it, still refused
                assert time.monotonic() < deadline and runner.is_alive(), "the worker did not retry"
                time.sleep(0.01)
        finally:
            worker.stop()
            runner.join(30)
    finally:
        logger.removeHandler(records)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    assert codes == [0]  # stopped while it retried: a requested stop
    (warning,) = [rec for rec in records.records if rec.levelno >= logging.WARNING]  # once, not per retry
    said = warning.getMessage()
    assert said.startswith(f"Redis at unix://:***@{locked.socket} refused this worker's credentials"), said
    assert "retrying for 10s" in said
    assert not any(secret in rec.getMessage() for rec in records.records)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_worker_retries_its_start_up_exits_0_at_once(signum: signal.Signals) -> None:
    (port,) = free_ports(1)  # nothing listens there: every start-up call fails and is retried
    proc = pyqueue("--url", f"redis://127.0.0.1:{port}/0", "worker", "handlers:slow", "-q", "q")
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    for line in proc.stderr:  # wait for the first retry
        if "retrying" in line:
            break
        assert time.monotonic() < deadline, "the worker never retried its start-up"
    time.sleep(0.3)  # inside a backoff wait now
    sent = time.monotonic()
    proc.send_signal(signum)
    assert proc.wait(10) == 0
    assert time.monotonic() - sent < 3
    proc.stderr.close()
    assert proc.stdout is not None
    proc.stdout.close()
