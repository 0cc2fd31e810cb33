"""The autoscaling signal (pyqueue.ops.autoscale): a queue's backlog counts only the jobs
a worker could take now; and the KEDA ScaledObject of docs/how-to/deploying.md reads
it. On fakeredis, a real redis-server and a Redis Cluster."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from pyqueue import Queue
from pyqueue.ops.autoscale import backlog_app, backlog_of

ON_CLUSTER = True
T0 = 1_000_000
DOCS = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "deploying.md"


def test_the_backlog_counts_ready_and_due_jobs(q: Queue) -> None:
    q.enqueue_many([b"a", b"b", b"c"])
    q.lease(count=1)  # (its maintenance would promote a due job: the jobs below come after)
    q.enqueue(b"later", delay_ms=60_000)
    q.enqueue(b"due", delay_ms=1)
    time.sleep(0.01)
    b = backlog_of(q)
    assert (b.ready, b.due, b.backlog, b.at_cap, b.paused) == (2, 1, 3, 0, False)


def test_a_paused_queue_has_no_backlog(q: Queue) -> None:
    q.enqueue(b"a")
    q.pause()
    assert backlog_of(q).backlog == 0
    q.resume()
    assert backlog_of(q).backlog == 1


def test_the_ready_jobs_of_groups_at_their_cap_are_not_counted(q: Queue) -> None:
    q.set_group_limit(1)
    for _ in range(4):
        q.enqueue(b"x", group="tenant")
    q.enqueue(b"y", group="other")
    q.lease(count=5)  # one of each group runs; tenant's other three wait at its cap
    b = backlog_of(q)
    assert (b.ready, b.at_cap, b.backlog) == (3, 3, 0)


def test_a_rate_limited_queue_counts_at_most_its_burst(q: Queue) -> None:
    q.enqueue_many([b"x"] * 50)
    q.limit(10, 1000, burst=5)
    b = backlog_of(q)
    assert (b.ready, b.backlog, b.rate_per_second) == (50, 5, 10.0)


def test_jobs_waiting_for_a_rate_keys_permit_are_not_counted(q: Queue) -> None:
    for _ in range(5):
        q.enqueue(b"x", rate_key="acct", rate_limit="1/h")
    q.lease(count=5)  # one runs, four wait for their permits
    assert backlog_of(q).backlog == 0


def call(app: Any, path: str, query: str = "") -> tuple[str, Any]:
    answer: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer["status"] = status

    body = b"".join(app({"PATH_INFO": path, "QUERY_STRING": query}, start_response))
    return answer["status"], body


def test_the_keda_scaled_object_of_the_docs_reads_the_endpoint(r: Any) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    scaled = next(yaml.safe_load(b) for b in blocks if "ScaledObject" in b)
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "metrics-api"
    meta = trigger["metadata"]
    path, _, query = meta["url"].split("9808", 1)[1].partition("?")
    queue = query.removeprefix("queue=")
    Queue(queue, r).enqueue_many([b"x"] * 7)
    def metrics(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"metrics"]

    app = backlog_app(r, "pq", None, fallback=metrics)
    status, body = call(app, path, query)
    assert status == "200 OK"
    # KEDA reads valueLocation (a GJSON path: here a top-level field) as the metric.
    assert json.loads(body)[meta["valueLocation"]] == 7
    assert int(meta["targetValue"]) > 0 and scaled["spec"]["minReplicaCount"] >= 1
    assert call(app, path, "queue=nosuch")[0] == "404 Not Found"
    assert call(app, "/metrics")[1] == b"metrics"
    status, body = call(app, path)
    assert status == "200 OK" and [q["queue"] for q in json.loads(body)["queues"]] == [queue]
