"""What the dashboard shows, read through the driver's own verbs: one ``stats`` call per
queue and one ``Services.list`` per namespace per sample, kept in a bounded ring buffer.

Why sample on the server rather than let the page read Redis at each poll: the charts
must show the last minutes as soon as the page opens (a page that started sampling on
load would show nothing), and every open tab then shares one reader. A sample costs
O(queues) script calls whatever the number of jobs; the sampler takes one every
``every_s`` seconds for the history, and a page's poll reuses the latest sample while it
is younger than ``fresh_s``, so N tabs polling cost no more than one.

This module imports no web framework, so it can be tested and reused on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis as redis_lib

from pyqueue.clients import Client, bytes_client
from pyqueue.discovery import logical_queues
from pyqueue.errors import PyQueueError
from pyqueue.models import Stats
from pyqueue.queue import Queue, stats_many
from pyqueue.service import Services, ServiceInfo

log = logging.getLogger("pyqueue.dashboard")

#: The per-queue figures kept at each history point, in this order: enough for the
#: charts (backlog, lag, and throughput as the slope of ``acked``), few enough that
#: 1,000 queues over ten minutes stay a few megabytes.
SERIES = ("ready", "leased", "dead", "lag_ms", "acked")
#: Throughput is measured over this window (or since the first sample, if younger).
RATE_WINDOW_MS = 60_000


@dataclass(frozen=True)
class QueueRow:
    """One logical queue at one sample: its stats (summed over partitions) and its
    throughput (acks answered OK per second over the last minute)."""

    name: str
    partitions: int
    stats: Stats
    acked_per_s: float


@dataclass(frozen=True)
class WorkerRow:
    """One registered worker as ``Services.list`` reads it, with its namespace."""

    namespace: str
    info: ServiceInfo


@dataclass(frozen=True)
class Snapshot:
    """Everything the page shows at one moment. ``now_ms`` is the Redis server's clock
    (the one every deadline uses), so ages on the page agree with the scripts'."""

    now_ms: int
    queues: list[QueueRow]
    workers: list[WorkerRow]
    #: Why the last read failed (the page shows it and keeps polling); "" if it did not.
    error: str = ""
    #: ``time.monotonic()`` when it was taken (for freshness, not shown).
    taken_at: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class Point:
    """One history point: the server time and, per queue, the :data:`SERIES` values."""

    t_ms: int
    values: dict[str, tuple[int, ...]]


class Sampler:
    """Samples the queues and workers; keeps the latest snapshot and a bounded history.

    Args:
        redis: a client of the queues' server or cluster.
        prefix: the key prefix.
        queues: only these queues (default: every queue found by discovery, refreshed
            every ``rediscover_s``; discovery SCANs every primary, so it is not repeated
            at every sample).
        namespaces: the service namespaces whose workers to list.
        every_s: seconds between history points.
        history_s: how much history to keep (the ring buffer holds
            ``history_s / every_s`` points, then drops the oldest).
        fresh_s: a poll reuses the latest snapshot while it is younger than this.
        rediscover_s: seconds between discoveries of new queues.
    """

    def __init__(
        self,
        redis: Client,
        *,
        prefix: str = "pq",
        queues: Sequence[str] | None = None,
        namespaces: Sequence[str] = ("workers",),
        every_s: float = 5.0,
        history_s: float = 600.0,
        fresh_s: float = 1.0,
        rediscover_s: float = 30.0,
    ) -> None:
        if every_s <= 0 or history_s < every_s:
            raise PyQueueError(f"need 0 < every_s <= history_s, got every_s={every_s}, history_s={history_s}")
        self.redis = bytes_client(redis)
        self.prefix = prefix
        self.names = list(queues) if queues else None
        self.services = [Services(self.redis, namespace=ns, prefix=prefix) for ns in namespaces]
        self.every_s = every_s
        self.fresh_s = fresh_s
        self.rediscover_s = rediscover_s
        self.points: deque[Point] = deque(maxlen=int(history_s / every_s) + 1)
        self._queues: dict[str, Queue] = {}
        self._discovered_at = -1e18
        self._latest: Snapshot | None = None
        self._last_point_at = -1e18
        # One reader at a time: concurrent polls wait for the sample in progress and
        # then share it instead of each reading every queue again.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- queues ------------------------------------------------------------------------

    def _discover(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._discovered_at >= self.rediscover_s:
            found = logical_queues(self.redis, self.prefix, self.names)
            self._queues = {q.name: q for q in found}
            self._discovered_at = now

    def queue(self, name: str) -> Queue | None:
        """The logical queue ``name`` as discovered (partitioned queues by their logical
        name only); discovers again once if it is not known yet."""
        with self._lock:
            if name not in self._queues:
                self._discover(force=time.monotonic() - self._discovered_at > 1.0)
            return self._queues.get(name)

    # -- sampling ----------------------------------------------------------------------

    def snapshot(self, *, max_age_s: float | None = None) -> Snapshot:
        """The latest snapshot, read anew if it is older than ``max_age_s`` (default
        ``fresh_s``)."""
        limit = self.fresh_s if max_age_s is None else max_age_s
        with self._lock:
            latest = self._latest
            if latest is None or time.monotonic() - latest.taken_at > limit:
                latest = self._take()
            return latest

    def invalidate(self) -> None:
        """Make the next poll read anew (after an action changed the queues)."""
        with self._lock:
            if self._latest is not None:
                self._latest = Snapshot(self._latest.now_ms, self._latest.queues, self._latest.workers,
                                        self._latest.error, taken_at=-1e18)

    def _take(self) -> Snapshot:
        """Read every queue's stats and every namespace's workers (the lock is held)."""
        started = time.monotonic()
        try:
            self._discover()
            queues = list(self._queues.values())
            stats = list(zip(queues, stats_many(queues)))  # one pipelined round trip per primary
            workers = [WorkerRow(s.namespace, info) for s in self.services for info in s.list()]
            now_ms = max((s.now_ms for _, s in stats), default=0) or _server_ms(self.redis)
        except (PyQueueError, redis_lib.RedisError) as exc:
            log.warning("dashboard: reading the queues failed: %s", exc)
            previous = self._latest
            self._latest = Snapshot(
                previous.now_ms if previous else 0, previous.queues if previous else [],
                previous.workers if previous else [], f"{type(exc).__name__}: {exc}", taken_at=started,
            )
            return self._latest
        window = [p for p in self.points if now_ms - p.t_ms <= RATE_WINDOW_MS]
        rows = [QueueRow(q.name, q.partitions, s, _rate(window, q.name, s.acked, now_ms)) for q, s in stats]
        rows.sort(key=lambda row: row.name)
        self._latest = Snapshot(now_ms, rows, workers, "", taken_at=started)
        if started - self._last_point_at >= self.every_s * 0.95:
            self.points.append(Point(now_ms, {r.name: tuple(getattr(r.stats, f) for f in SERIES) for r in rows}))
            self._last_point_at = started
        return self._latest

    def history(self, since_ms: int = -1) -> list[Point]:
        """The history points taken after ``since_ms`` (server time), oldest first."""
        with self._lock:
            return [p for p in self.points if p.t_ms > since_ms]

    # -- the background thread ---------------------------------------------------------

    def start(self) -> None:
        """Sample every ``every_s`` in a daemon thread until :meth:`stop`."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="pyqueue-dashboard-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                failed = False
                if time.monotonic() - self._last_point_at >= self.every_s * 0.95:
                    failed = bool(self._take().error)
                wait = self.every_s - (time.monotonic() - self._last_point_at)
            # After a failed read, try again a period later, not in a tight loop.
            self._stop.wait(self.every_s if failed else max(0.05, wait))


def _rate(window: list[Point], name: str, acked: int, now_ms: int) -> float:
    """Acks per second since the oldest point of ``window`` that has the queue."""
    index = SERIES.index("acked")
    for point in window:
        if name in point.values:
            elapsed = now_ms - point.t_ms
            if elapsed <= 0:
                return 0.0
            # A counter that went down belongs to a queue deleted and made again.
            return max(0, acked - point.values[name][index]) * 1000 / elapsed
    return 0.0


def _server_ms(client: Client) -> int:
    """The Redis server's clock in ms (when there is no queue to read it from)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000
