"""pyqueue.contrib.flask with real Flask from PyPI, on the example app
(``examples/flask_app.py``, README.md's "Flask"): config from ``app.config``
(``PYQUEUE_URL``, ``PYQUEUE_PREFIX``), a route that sends, and a task reading
``current_app`` run by a ``flask pyqueue worker --burst`` process on the session's real
redis-server, and by a worker in this process on fakeredis. Skipped without Flask or
redis-server, except under ``CI=true``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from conftest import IN_CI, RedisServer

from pyqueue import Queue

try:
    import flask
except ImportError:
    if IN_CI:
        raise  # the test extra installs it
    pytest.skip("flask is not installed", allow_module_level=True)
assert flask.__name__ == "flask"

from examples import flask_app  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("PYQUEUE_URL", raising=False)
    yield
    flask_app.pq.tasks.bind(fakeredis.FakeRedis())  # the module's object outlives the test: leave the server alone


def test_a_worker_process_runs_the_task_in_the_app_context_with_the_apps_config(
    app_env: None, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis_server.client()
    client.flushall()
    monkeypatch.setenv("FLASK_PYQUEUE_URL", redis_server.url())
    monkeypatch.setenv("FLASK_PYQUEUE_PREFIX", "shop")
    monkeypatch.setenv("FLASK_GREETING", "Bonjour")
    app = flask_app.create_app()
    assert app.config["PYQUEUE_PREFIX"] == "shop"
    job = app.test_client().post("/greet/Ada").get_json()["job"]
    sent = flask_app.greet.send("Grace")
    done = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "examples.flask_app", "pyqueue", "worker", "--burst",
         "--block-ms", "200"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # Its start and its stop are logged, as `pyqueue worker` logs them.
    assert "service workers." in done.stderr and " started: queues default" in done.stderr, done.stderr
    assert " ended: burst: every queue is drained" in done.stderr, done.stderr
    assert sent.result(timeout=5) == "Bonjour, Grace!"
    queue = Queue("default", client, prefix="shop")  # PYQUEUE_PREFIX was honoured, on both sides
    assert queue.result(job).value == "Bonjour, Ada!"
    assert queue.stats().acked == 2
    assert not Queue("default", client).stats().enqueued  # nothing under the default prefix


def test_an_in_process_worker_runs_the_task_in_the_app_context(app_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASK_PYQUEUE_URL", "embedded")
    app = flask_app.create_app()
    app.config["GREETING"] = "Hi"
    sent = flask_app.greet.send("Linus")
    worker = flask_app.pq.tasks.worker(block_ms=50)
    assert flask_app.pq.tasks.run_worker(worker, burst=True, install_signal_handlers=False) == 0
    assert sent.result(timeout=5) == "Hi, Linus!"
    with pytest.raises(RuntimeError, match="Working outside of application context"):
        flask_app.greet("outside")  # called here, not in a worker: no app context


def test_the_cli_group_is_on_the_app() -> None:
    app: Any = flask_app.create_app()
    result = app.test_cli_runner().invoke(args=["pyqueue", "worker", "--help"])
    assert result.exit_code == 0 and "--burst" in result.output


def test_the_docs_flask_code_is_the_example() -> None:
    """docs/how-to/flask.md (once README.md's "Flask") shows examples/flask_app.py."""
    page = (ROOT / "docs" / "how-to" / "flask.md").read_text(encoding="utf-8")
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert "pq.init_app(app)" in block
    assert block in (ROOT / "examples" / "flask_app.py").read_text(encoding="utf-8")
