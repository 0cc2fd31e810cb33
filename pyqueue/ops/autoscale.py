"""The autoscaling signal: how many jobs a worker could take now, per queue, as JSON for
KEDA's ``metrics-api`` scaler (``pyqueue metrics`` serves it on ``/backlog``).

A queue's **backlog** counts the jobs that more workers would lease sooner: its ready
jobs and its scheduled jobs already due, less those of groups at their cap (``Queue.
set_group_limit``: more workers would not run them); none while the queue is paused;
and at most its burst while it has a rate limit (``Queue.limit``: the limit, not the
workers, bounds its pace). Jobs waiting for a rate key's permit, behind a sequence's
head or for a signal are scheduled or sequenced, not ready: not counted. One ``stats``
call per queue, and one ``groups`` page for a queue with groups at their cap.

A KEDA ``ScaledObject`` (docs/how-to/deploying.md)::

    triggers:
      - type: metrics-api
        metadata:
          url: "http://pyqueue-metrics:9808/backlog?queue=emails"
          valueLocation: "backlog"
          targetValue: "20"          # jobs per worker replica
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyqueue.drivers.queue import Queue
from pyqueue.protocol.models import Stats

#: Groups read to find the ready jobs of groups at their cap (one page).
GROUPS_SCANNED = 1000


@dataclass(frozen=True)
class Backlog:
    """A queue's autoscaling signal (see the module)."""

    queue: str
    #: Jobs a worker could lease now: what to scale on.
    backlog: int
    ready: int
    due: int
    #: Ready jobs of groups at their cap (not in ``backlog``).
    at_cap: int
    paused: bool
    #: Leases per second of its rate limit (0: none); with one, ``backlog`` is at most its burst.
    rate_per_second: float
    lag_seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "backlog": self.backlog, "ready": self.ready, "due": self.due,
                "at_cap": self.at_cap, "paused": self.paused, "rate_per_second": self.rate_per_second,
                "lag_seconds": self.lag_seconds}


def backlog_of(queue: Queue, stats: Stats | None = None) -> Backlog:
    """``queue``'s :class:`Backlog` (``stats``: its stats, if read already)."""
    stats = stats if stats is not None else queue.stats()
    at_cap = 0
    if stats.groups_at_cap:
        at_cap = sum(g.ready for g in queue.groups(0, GROUPS_SCANNED).groups if g.parked)
    backlog = 0 if stats.paused else max(0, stats.ready + stats.due - at_cap)
    rate = stats.rate_limit * 1000 / stats.rate_period_ms if stats.rate_limit else 0.0
    if stats.rate_limit:
        backlog = min(backlog, stats.rate_burst)
    return Backlog(queue.name, backlog, stats.ready, stats.due, at_cap, stats.paused, rate, stats.lag_ms / 1000)


def backlog_app(client: Any, prefix: str, queues: list[str] | None, fallback: Any) -> Any:
    """A WSGI app: ``GET /backlog`` answers every queue's :class:`Backlog` (``{"queues":
    [...]}``, the queues named, or every queue found), ``GET /backlog?queue=NAME`` that
    one queue's as one object (404 for a queue that does not exist); any other path goes
    to ``fallback`` (the Prometheus app)."""
    import json
    from urllib.parse import parse_qs

    from pyqueue.ops.discovery import discover_queues, logical_queues, open_queue

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != "/backlog":
            return fallback(environ, start_response)
        wanted = parse_qs(environ.get("QUERY_STRING", "")).get("queue")
        body: dict[str, Any]
        try:
            if wanted:
                name = wanted[0]
                if name not in discover_queues(client, prefix):
                    status, body = "404 Not Found", {"error": f"no queue {name!r} under prefix {prefix!r}"}
                else:
                    status, body = "200 OK", backlog_of(open_queue(client, name, prefix)).as_json()
            else:
                status = "200 OK"
                body = {"queues": [backlog_of(q).as_json() for q in logical_queues(client, prefix, queues)]}
        except Exception as exc:  # an unreachable Redis: an error KEDA reports, not a crash
            status, body = "503 Service Unavailable", {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    return app
