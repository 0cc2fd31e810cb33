"""The dashboard's task view (pyqueue/dashboard/taskview.py, ``pyqueue dashboard
--worker-metrics URL``): runs by outcome and p50/p99 durations per task and queue, read
from the workers' Prometheus pages (real prometheus_client registries, served over
HTTP), summed over every URL, with a worker that does not answer named and the others
still shown. The page in a real browser: tests/test_dashboard_browser.py."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
from conftest import free_ports

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from pyqueue import InvalidArgument  # noqa: E402
from pyqueue.cli import main  # noqa: E402
from pyqueue.dashboard.app import DashboardConfig, create_app  # noqa: E402
from pyqueue.dashboard.taskview import Histogram, check_urls, read_task_view  # noqa: E402
from pyqueue.tasks.telemetry import TaskMetrics  # noqa: E402


def test_quantiles_interpolate_within_a_bucket_as_histogram_quantile_does() -> None:
    h = Histogram({0.1: 10, 0.5: 30, 1.0: 40, float("inf"): 40})
    assert h.count == 40
    assert h.quantile(0.5) == pytest.approx(0.3)  # rank 20: half way through (0.1, 0.5]
    assert h.quantile(0.99) == pytest.approx(0.98)  # rank 39.6: 96 % through (0.5, 1]
    assert h.quantile(0.1) == pytest.approx(0.04)  # in the first bucket, from 0
    # A quantile in the unbounded bucket is its lower bound ("at least"); none without runs.
    assert Histogram({1.0: 5, float("inf"): 10}).quantile(0.99) == 1.0
    assert Histogram({1.0: 0, float("inf"): 0}).quantile(0.5) is None
    assert Histogram().quantile(0.5) is None


def registry_with(runs: dict[tuple[str, str, str], int], seconds: dict[tuple[str, str], list[float]]) -> CollectorRegistry:
    """A registry as a worker's TaskMetrics fills it: ``runs`` (task, queue, outcome) ->
    count; ``seconds`` (task, queue) -> the durations its runs took."""
    registry = CollectorRegistry()
    metrics = TaskMetrics(registry)
    for (task, queue, outcome), n in runs.items():
        metrics.runs.labels(task, queue, outcome).inc(n)
    for (task, queue), values in seconds.items():
        for value in values:
            metrics.run_seconds.labels(task, queue).observe(value)
    return registry


@pytest.fixture
def serve_page() -> Iterator[Callable[[CollectorRegistry], str]]:
    """``serve_page(registry)`` -> the URL of a metrics page serving it, as a worker's
    ``--metrics-port`` does (prometheus_client's exposition), until the test ends."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def serve(registry: CollectorRegistry) -> str:
        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_view_sums_every_workers_page_and_names_one_that_does_not_answer(
    serve_page: Callable[[CollectorRegistry], str],
) -> None:
    one = serve_page(registry_with({("send", "emails", "ok"): 3, ("send", "emails", "retried"): 1},
                                   {("send", "emails"): [0.02, 0.03, 0.04, 0.2]}))
    two = serve_page(registry_with({("send", "emails", "ok"): 1, ("send", "emails", "dead"): 1,
                                    ("report", "reports", "time_limited"): 2},
                                   {("send", "emails"): [0.03, 3.0], ("report", "reports"): [40.0, 50.0]}))
    (closed,) = free_ports(1)
    down = f"http://127.0.0.1:{closed}/metrics"
    view = read_task_view([one, two, down])
    assert [(s["url"], s["ok"]) for s in view["sources"]] == [(one, True), (two, True), (down, False)]
    assert "Connection refused" in view["sources"][2]["error"] or "URLError" in view["sources"][2]["error"]
    by_task = {(t["task"], t["queue"]): t for t in view["tasks"]}
    assert list(by_task) == [("send", "emails"), ("report", "reports")]  # by queue, then task
    send = by_task[("send", "emails")]
    assert (send["runs"], send["outcomes"]["ok"], send["failures"], send["outcomes"]["dead"]) == (6, 4, 2, 1)
    # Six runs: 0.02, 0.03, 0.03, 0.04, 0.2, 3.0 s. The median falls in (0.025, 0.05] (runs
    # 2 to 4), the 99th percentile in (2.5, 5]: estimated within those buckets.
    assert 0.025 < send["run_p50_s"] <= 0.05 and 2.5 < send["run_p99_s"] <= 5.0
    assert send["wait_p50_s"] is None  # no first attempt observed
    report = by_task[("report", "reports")]
    assert (report["runs"], report["failures"], report["outcomes"]["time_limited"]) == (2, 2, 2)
    assert 30.0 < report["run_p50_s"] <= 60.0


def test_the_app_serves_the_view_and_tells_the_page_it_has_one(serve_page: Callable[[CollectorRegistry], str]) -> None:
    url = serve_page(registry_with({("send", "emails", "ok"): 2}, {("send", "emails"): [0.1, 0.1]}))
    r = fakeredis.FakeRedis()
    with TestClient(create_app(DashboardConfig(r, fresh_s=0, worker_metrics=[url])), base_url="http://127.0.0.1") as c:
        body = c.get("/api/tasks").json()
        assert [(t["task"], t["runs"]) for t in body["tasks"]] == [("send", 2)]
        assert '"task_view": true' in c.get("/").text
    with TestClient(create_app(DashboardConfig(r, fresh_s=0)), base_url="http://127.0.0.1") as c:
        assert c.get("/api/tasks").json() == {"sources": [], "tasks": [], "error": ""}
        assert '"task_view": false' in c.get("/").text


def test_a_url_that_is_not_http_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidArgument, match="http://HOST:PORT/metrics"):
        check_urls(["127.0.0.1:9100/metrics"])
    with pytest.raises(InvalidArgument):
        create_app(DashboardConfig(fakeredis.FakeRedis(), worker_metrics=["file:///etc/passwd"]))
    assert main(["dashboard", "--port", "0", "--worker-metrics", "ftp://x/metrics"]) == 2
    assert "http://HOST:PORT/metrics" in capsys.readouterr().err
