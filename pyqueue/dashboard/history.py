"""What the dashboard shows, read through the driver's own verbs: one ``stats`` call per
queue and one ``Services.list`` per namespace per sample, kept in a bounded ring buffer.

Why sample on the server rather than let the page read Redis at each poll: the charts
must show the last minutes as soon as the page opens (a page that started sampling on
load would show nothing), and every open tab then shares one reader. A sample costs
O(queues) script calls whatever the number of jobs; the sampler takes one every
``every_s`` seconds for the history, and a page's poll reuses the latest sample while it
is younger than ``fresh_s``, so N tabs polling cost no more than one.

The task census (which task names have jobs waiting that no live worker advertises,
:mod:`pyqueue.tasks.census`) decodes up to 200 jobs per queue, so it is not read at every
sample: each queue's waiting task names are read at most every ``census_s`` seconds and
kept with the time they were read; the comparison with the live workers' advertised
names is made anew at every sample (the workers are listed anyway), so a worker that
registers clears its tasks at the next poll. Queues of raw jobs show nothing.

This module imports no web framework, so it can be tested and reused on its own; it
imports the task layer (:mod:`pyqueue.tasks.census`) when it samples, not when imported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import redis as redis_lib

from pyqueue.drivers.clients import Client, bytes_client
from pyqueue.ops.discovery import logical_queues
from pyqueue.protocol.errors import PyQueueError
from pyqueue.protocol.models import Stats
from pyqueue.drivers.queue import Queue, stats_many
from pyqueue.ops.service import Services, ServiceInfo

log = logging.getLogger("pyqueue.dashboard")

#: The per-queue figures kept at each history point, in this order: enough for the
#: charts (backlog, lag, and throughput as the slope of ``acked``), few enough that
#: 1,000 queues over ten minutes stay a few megabytes.
SERIES = ("ready", "leased", "dead", "lag_ms", "acked")
#: Throughput is measured over this window (or since the first sample, if younger).
RATE_WINDOW_MS = 60_000
#: A queue's waiting task names are read again after this many seconds (the census
#: decodes up to 200 jobs per queue).
CENSUS_S = 10.0
#: The time after which one sample reads no more censuses (the one under way is
#: finished, and at least one is read); queues left over are read at the next samples,
#: those never read first, then the oldest. A poll that samples waits about this long,
#: plus one queue's census, once per ``census_s`` at most.
CENSUS_BUDGET_S = 0.5


@dataclass(frozen=True)
class Census:
    """A queue's waiting task names as sampled (:func:`pyqueue.tasks.census.waiting_tasks`):
    name -> how many of the sampled jobs name it, and when the sample was read."""

    waiting: dict[str, int]
    #: Server time of the sample the census was read with; 0 if never read.
    taken_ms: int
    #: ``time.monotonic()`` when it was read (for the period, not shown).
    taken_at: float


@dataclass(frozen=True)
class QueueRow:
    """One logical queue at one sample: its stats (summed over partitions) and its
    throughput (acks answered OK per second over the last minute)."""

    name: str
    partitions: int
    stats: Stats
    acked_per_s: float
    #: Task names with jobs waiting (a sample) that no live worker of the queue
    #: advertises, with their sampled job counts: most jobs first, then by name.
    unserved: tuple[tuple[str, int], ...] = ()
    #: Server time when the waiting task names were read (0: not read yet).
    census_ms: int = 0


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
        census_s: seconds between two reads of a queue's waiting task names (see
            :data:`CENSUS_S`; tests: 0, read at every sample).
        census_budget_s: the most time a sample spends reading censuses.
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
        census_s: float = CENSUS_S,
        census_budget_s: float = CENSUS_BUDGET_S,
    ) -> None:
        if every_s <= 0 or history_s < every_s:
            raise PyQueueError(f"need 0 < every_s <= history_s, got every_s={every_s}, history_s={history_s}")
        if census_s < 0 or census_budget_s < 0:
            raise PyQueueError(f"need census_s >= 0 and census_budget_s >= 0, got {census_s}, {census_budget_s}")
        self.redis = bytes_client(redis)
        self.prefix = prefix
        self.names = list(queues) if queues else None
        self.services = [Services(self.redis, namespace=ns, prefix=prefix) for ns in namespaces]
        self.every_s = every_s
        self.fresh_s = fresh_s
        self.rediscover_s = rediscover_s
        self.census_s = census_s
        self.census_budget_s = census_budget_s
        #: Queue name -> its latest census (queues no longer found are dropped).
        self.censuses: dict[str, Census] = {}
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
        self._census(stats, now_ms)
        served = _served([w.info for w in workers])
        window = [p for p in self.points if now_ms - p.t_ms <= RATE_WINDOW_MS]
        rows = []
        for q, s in stats:
            census = self.censuses.get(q.name)
            rows.append(QueueRow(
                q.name, q.spec.partitions, s, _rate(window, q.name, s.acked, now_ms),
                unserved=_unserved(census.waiting if census else {}, served.get(q.name, set())),
                census_ms=census.taken_ms if census else 0,
            ))
        rows.sort(key=lambda row: row.name)
        self._latest = Snapshot(now_ms, rows, workers, "", taken_at=started)
        if started - self._last_point_at >= self.every_s * 0.95:
            self.points.append(Point(now_ms, {r.name: tuple(getattr(r.stats, f) for f in SERIES) for r in rows}))
            self._last_point_at = started
        return self._latest

    def _census(self, stats: list[tuple[Queue, Stats]], now_ms: int) -> None:
        """Read the waiting task names of the queues whose census is older than
        ``census_s`` (never read first, then the oldest), for at most
        ``census_budget_s`` (at least one queue is read). A queue with nothing ready or
        scheduled needs no read: nothing waits (the lock is held)."""
        found = {q.name for q, _ in stats}
        for gone in [name for name in self.censuses if name not in found]:
            del self.censuses[gone]
        now = time.monotonic()
        stale: list[tuple[float, Queue]] = []
        for q, s in stats:
            census = self.censuses.get(q.name)
            if s.ready + s.scheduled == 0:
                # Known empty; read as soon as jobs wait again, not a period later.
                self.censuses[q.name] = Census({}, now_ms, -1e18)
            elif census is None or now - census.taken_at >= self.census_s:
                stale.append((census.taken_at if census else -1e18, q))
        if not stale:
            return
        from pyqueue.tasks.census import waiting_tasks  # the task layer, above the engine

        stale.sort(key=lambda entry: entry[0])
        deadline = now + self.census_budget_s
        for _, q in stale:
            try:
                census = Census(dict(waiting_tasks(q)), now_ms, time.monotonic())
            except (PyQueueError, redis_lib.RedisError) as exc:
                # Keep what was read before; try again a period later, not at every poll.
                log.warning("dashboard: reading the task names waiting in %s failed: %s", q.name, exc)
                previous = self.censuses.get(q.name)
                census = Census(previous.waiting if previous else {}, previous.taken_ms if previous else 0,
                                time.monotonic())
            self.censuses[q.name] = census
            if time.monotonic() >= deadline:
                break  # the rest at the next samples

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


def _served(services: Iterable[ServiceInfo]) -> dict[str, set[str]]:
    """Queue name -> the task names its live workers advertise."""
    from pyqueue.tasks.census import served_tasks  # the task layer, above the engine

    return served_tasks(services)


def _unserved(waiting: dict[str, int], served: set[str]) -> tuple[tuple[str, int], ...]:
    """The waiting task names not in ``served``, most sampled jobs first, then by name."""
    return tuple(sorted(((name, n) for name, n in waiting.items() if name not in served),
                        key=lambda entry: (-entry[1], entry[0])))


def _server_ms(client: Client) -> int:
    """The Redis server's clock in ms (when there is no queue to read it from)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000
