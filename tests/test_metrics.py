"""The Prometheus exporter: names, types and values against ``stats()``, partitioned
queues, workers, a scrape while a worker runs, and ``pyqueue metrics`` over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from conftest import RedisServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pyqueue import NewJob, Queue
from pyqueue.ops.metrics import COUNTERS, STATES, PyQueueCollector
from pyqueue.ops.service import Services
from pyqueue.worker import Worker

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True


def scrape(collector: PyQueueCollector) -> dict[str, Any]:
    """The exposition text as Prometheus parses it: family name -> (type, samples)."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {f.name: (f.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
            for f in text_string_to_metric_families(text)}


def busy(r: Any) -> tuple[Queue, Queue]:
    q = Queue("emails", r)
    q.set_result_budget(10_000)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}", max_attempts=1) for i in range(6)])
    q.enqueue(b"", job_id="later", delay_ms=60_000)
    a, b, c = q.lease(count=3)
    q.ack_result(a, b"r" * 100)
    q.nack(b, "boom")
    p = Queue("orders", r, partitions=3)
    p.set_budget(30_000)  # each partition 10,000
    p.enqueue_many([NewJob(b"x" * 10) for _ in range(9)])
    return q, p


def test_every_counter_and_state_matches_stats_with_prometheus_names_and_types(r: Any) -> None:
    q, p = busy(r)
    families = scrape(PyQueueCollector(r))
    for queue in (q, p):
        stats = queue.stats()
        labels = (("queue", queue.name),)
        for name, (field, _) in COUNTERS.items():
            kind, samples = families[f"pyqueue_{name}"]
            assert kind == "counter" and samples[(f"pyqueue_{name}_total", labels)] == getattr(stats, field), name
        kind, samples = families["pyqueue_jobs"]
        assert kind == "gauge"
        for state in STATES:
            assert samples[("pyqueue_jobs", (("queue", queue.name), ("state", state)))] == getattr(stats, state)
        # Lag grows with the server clock: read at the scrape, before these stats.
        assert 0 <= families["pyqueue_lag_seconds"][1][("pyqueue_lag_seconds", labels)] <= stats.lag_ms / 1000
        assert families["pyqueue_partitions"][1][("pyqueue_partitions", labels)] == queue.spec.partitions
        assert families["pyqueue_payload_bytes"][1][("pyqueue_payload_bytes", labels)] == stats.bytes
        assert families["pyqueue_budget_bytes"][1][("pyqueue_budget_bytes", labels)] == stats.budget_bytes
        assert families["pyqueue_result_bytes"][1][("pyqueue_result_bytes", labels)] == stats.result_bytes
        assert (families["pyqueue_result_budget_bytes"][1][("pyqueue_result_budget_bytes", labels)]
                == stats.result_budget_bytes)
    assert (q.stats().result_bytes, q.stats().result_budget_bytes) == (len(f"{q.stats().now_ms}|") + 101, 10_000)
    # A partitioned queue once, as its sum: its partitions are not reported again.
    assert not any("orders#" in str(key) for _, samples in families.values() for key in samples)
    assert families["pyqueue_acked"][1][("pyqueue_acked_total", (("queue", "emails"),))] == 1
    assert families["pyqueue_dead"][1][("pyqueue_dead_total", (("queue", "emails"),))] == 1


def test_named_queues_only_and_workers_per_namespace(r: Any) -> None:
    busy(r)
    services = Services(r)
    a = services.register(["emails"])
    services.register(["emails"])
    services.stop(a.id)
    families = scrape(PyQueueCollector(r, queues=["emails"]))
    assert {labels for (_, labels) in families["pyqueue_enqueued"][1]} == {(("queue", "emails"),)}
    workers = families["pyqueue_workers"][1]
    assert workers[("pyqueue_workers", (("namespace", "workers"), ("state", "alive")))] == 1
    assert workers[("pyqueue_workers", (("namespace", "workers"), ("state", "stopping")))] == 1


def test_a_scrape_while_a_worker_drains_sees_counters_only_grow(r: Any) -> None:
    q = Queue("emails", r)
    q.enqueue_many([NewJob(b"") for _ in range(300)])
    worker = Worker(["emails"], lambda job: time.sleep(0.001), redis=r, concurrency=4)
    thread = threading.Thread(target=worker.run, kwargs={"burst": True, "install_signal_handlers": False})
    thread.start()
    collector = PyQueueCollector(r, queues=["emails"])
    seen: list[float] = []
    while thread.is_alive() or not seen:
        seen.append(scrape(collector)["pyqueue_acked"][1][("pyqueue_acked_total", (("queue", "emails"),))])
        time.sleep(0.01)
    thread.join(30)
    seen.append(scrape(collector)["pyqueue_acked"][1][("pyqueue_acked_total", (("queue", "emails"),))])
    assert seen == sorted(seen) and seen[-1] == 300 and len(seen) >= 2


def test_pyqueue_metrics_serves_the_text_format_over_http(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.flushall()
    busy(r)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyqueue", "--url", redis_server.url(), "metrics", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert "http://127.0.0.1:" in line, line
        url = next(word for word in line.split() if word.endswith("/metrics"))
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        assert 'pyqueue_enqueued_total{queue="emails"} 7.0' in body
        assert "# TYPE pyqueue_jobs gauge" in body
        # The autoscaling signal on the same port (pyqueue.ops.autoscale).
        backlog = url.replace("/metrics", "/backlog")
        with urllib.request.urlopen(backlog + "?queue=emails", timeout=10) as response:
            assert response.headers["Content-Type"] == "application/json"
            one = json.loads(response.read())
        assert (one["queue"], one["backlog"], one["paused"]) == ("emails", 3, False)
        with urllib.request.urlopen(backlog, timeout=10) as response:
            every = json.loads(response.read())
        assert sorted(q["queue"] for q in every["queues"]) == ["emails", "orders"]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(backlog + "?queue=nosuch", timeout=10)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        proc.terminate()
        code = proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0


@pytest.mark.parametrize("queues", [1, 100])
def test_a_scrape_costs_one_stats_call_per_queue(redis_server: RedisServer, queues: int) -> None:
    r = redis_server.client()
    r.flushall()
    for i in range(queues):
        Queue(f"q{i}", r).enqueue(b"")
    collector = PyQueueCollector(r)
    r.config_resetstat()
    scrape(collector)
    calls = {name: v["calls"] for name, v in r.info("commandstats").items()}
    assert calls["cmdstat_evalsha"] == queues  # lua/stats.lua once per queue, whatever the jobs


def test_groups_at_their_cap_and_the_largest_groups_are_reported(r: Any) -> None:
    q = Queue("tenants", r)
    q.set_group_limit(1)
    q.enqueue_many([NewJob(b"", group=g) for g in "A" * 5 + "B" * 3 + "C"])
    q.lease(count=2)  # A and B at their cap of 1, C still waiting
    families = scrape(PyQueueCollector(r, queues=["tenants"]))
    groups = families["pyqueue_groups"][1]
    assert groups[("pyqueue_groups", (("queue", "tenants"), ("state", "at_cap")))] == 2
    assert groups[("pyqueue_groups", (("queue", "tenants"), ("state", "waiting")))] == 1
    largest = families["pyqueue_group_ready_jobs"][1]
    assert {dict(labels)["group"]: value for (_, labels), value in largest.items()} == {"A": 4, "B": 2, "C": 1}
