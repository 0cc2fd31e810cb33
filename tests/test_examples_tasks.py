"""The task examples run as a user runs them: ``python examples/<name>.py`` from the
repository root, a subprocess given 60 s, once on the embedded server (``PYQUEUE_URL``
unset) and once on the session's real redis-server (``PYQUEUE_URL=unix://...``; skipped
without the binary, a failure under ``CI=true``). Each must exit 0 and print the results
its tasks computed; on the real server, its jobs must be there afterwards (so the
example did use ``PYQUEUE_URL``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from conftest import RedisServer

from pyqueue import Queue, Stats

ROOT = Path(__file__).resolve().parent.parent


class Env:
    def __init__(self, variables: dict[str, str], client: redis.Redis | None) -> None:
        self.variables, self.client = variables, client

    def stats(self) -> Stats | None:
        """The example's queue on the real server (None on the embedded one: it lived
        and died with the example's process)."""
        return None if self.client is None else Queue("default", self.client).stats()


@pytest.fixture(params=["embedded", "real"])
def env(request: pytest.FixtureRequest) -> Env:
    variables = {k: v for k, v in os.environ.items() if k != "PYQUEUE_URL"}
    if request.param == "embedded":
        return Env(variables, None)
    server: RedisServer = request.getfixturevalue("redis_server")
    client = server.client()
    client.flushall()
    return Env({**variables, "PYQUEUE_URL": server.url()}, client)


def run_example(name: str, env: Env, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, f"examples/{name}.py", *args],
        cwd=ROOT, env=env.variables, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def site() -> Iterator[str]:
    """A page of seven words, served on a local port."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"one two  three\nfour\tfive six seven\n")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/page"
    server.shutdown()
    server.server_close()
    thread.join()


def words(path: str) -> int:
    return len((ROOT / path).read_text(encoding="utf-8").split())


def test_composition_counts_the_words_of_each_page(env: Env) -> None:
    before = {page: words(page) for page in ("README.md", "lua/README.md")}
    out = run_example("composition", env)
    lines = re.findall(r"^ \* http://127\.0\.0\.1:\d+/(\S+) has (\d+) words$", out, re.M)
    assert [page for page, _ in lines] == ["README.md", "lua/README.md"], out
    for page, count in lines:
        # Compared with the file before and after the run (someone may edit it meanwhile).
        assert int(count) in (before[page], words(page)), (page, count)
    stats = env.stats()
    if stats is not None:
        assert (stats.enqueued, stats.acked, stats.nacked, stats.dead) == (4, 4, 0, 0)


def test_composition_takes_uris_as_arguments(env: Env, site: str) -> None:
    out = run_example("composition", env, site, site + "?again")
    assert out.splitlines() == [f" * {site} has 7 words", f" * {site}?again has 7 words"]


def test_time_limit_as_dramatiq_dead_without_a_catch_done_with_one(env: Env) -> None:
    out = run_example("time_limit", env)
    # Two threads print at once (the main thread and a task's), and print() writes its
    # text and its newline separately: another line may land between them. So the text
    # of each line is looked for, not whole lines.
    limit = "pyqueue.worker.slots.TimeLimitExceeded: task {0} exceeded its time limit of 0.5s"
    assert f"long_running is dead: {limit.format('long_running')}" in out
    assert "long_running_with_catch is done" in out
    # long_running ran twice (max_attempts=2), the catching one once, and cleaned up.
    assert "long_running, attempt 1: sleeping..." in out
    assert "long_running, attempt 2: sleeping..." in out
    assert "long_running_with_catch, attempt 1: sleeping..." in out
    assert "long_running_with_catch, attempt 2: sleeping..." not in out
    assert out.count("long_running_with_catch: time limit exceeded, aborting...") == 1
    # Stopped at 0.5 s: about 5 lines a tenth of a second apart per attempt (a busy
    # machine may print a few more), not an endless loop.
    assert out.count("long_running, attempt 1: sleeping...") <= 15
    stats = env.stats()
    if stats is not None:
        assert (stats.enqueued, stats.acked, stats.dead) == (2, 1, 1)


def test_arq_retry_retries_defers_and_reads_the_results(env: Env) -> None:
    out = run_example("arq_retry", env)
    lines = out.splitlines()
    # The deferred job's state right after it was sent: due in a second (unless this
    # machine stalled for that long between the two calls).
    assert re.fullmatch(r"sent \w+ and \w+: (scheduled|ready|leased|done)", lines[0]), out
    flaky = re.search(r"^http://127\.0\.0\.1:\d+/flaky: attempt (\d+), (\S+) after it was sent$", out, re.M)
    deferred = re.search(r"^http://127\.0\.0\.1:\d+/deferred: attempt (\d+), 0:00:(\S+) after it was sent$", out, re.M)
    assert flaky is not None and deferred is not None, out
    assert flaky.group(1) == "3"  # two 503s, retried, then 200
    assert deferred.group(1) == "1"
    # Sent with send_in(1, ...): run no earlier than a second later (the server's clock
    # decides; the example measures with its own, hence the margin).
    assert timedelta(seconds=float(deferred.group(2))) >= timedelta(seconds=0.95)
    assert "results: 330 and 330" in lines
    assert lines[-1] == "worker stopped, session closed"  # the stop hook ran, last
    stats = env.stats()
    if stats is not None:
        assert (stats.enqueued, stats.acked, stats.nacked, stats.dead) == (2, 2, 2, 0)


def test_middleware_carries_the_request_id_logs_each_run_and_refuses_a_send_without_one(env: Env) -> None:
    out = run_example("middleware", env)
    lines = out.splitlines()
    assert re.fullmatch(r"resize attempt 1: retry \(request req-42, \d+\.\d{3}s\)", lines[0]), out
    assert re.fullmatch(r"resize attempt 2: ok \(request req-42, \d+\.\d{3}s\)", lines[1]), out
    assert lines[2:] == ["result: images/7.webp", "refused: middleware __main__.RequestLog failed in around_send: "
                         "LookupError: send tasks from inside a request"]
    stats = env.stats()
    if stats is not None:
        assert (stats.enqueued, stats.acked, stats.nacked, stats.dead) == (1, 1, 1, 0)


def test_the_readmes_middleware_code_is_the_examples() -> None:
    """docs/how-to/middleware.md (once README.md's "Middleware and tracing") shows
    examples/middleware.py's middleware: the same lines, so what the page shows is what
    the test above runs."""
    page = (ROOT / "docs" / "how-to" / "middleware.md").read_text(encoding="utf-8")
    block = next(b.split("```", 1)[0] for b in page.split("```python\n")[1:] if "class RequestLog" in b)
    assert "class RequestLog" in block
    assert block in (ROOT / "examples" / "middleware.py").read_text(encoding="utf-8")
