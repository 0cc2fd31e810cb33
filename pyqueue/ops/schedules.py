"""Periodic jobs without a leader: every worker given a :class:`Schedule` enqueues one
job per tick, and each tick is enqueued exactly once however many workers do so.

::

    from pyqueue.ops.schedules import Schedule
    from pyqueue.worker import Worker

    Worker(["reports"], handle, schedules=[
        Schedule("report", "reports", cron="0 * * * *"),     # at the top of every hour (UTC)
        Schedule("sweep", "reports", every_ms=60_000),       # every minute
    ]).run()

or ``pyqueue worker app:handle -q reports --cron 'report=0 * * * *' --every sweep=60s``.

**Ticks.** A tick is a moment in unix seconds. An interval schedule's ticks are the
multiples of ``every_ms`` since the unix epoch (a 60 s schedule ticks at every whole
minute), so every worker computes the same ticks with no shared state; a cron
schedule's ticks are the moments its expression matches, in UTC (parsed by
`cronsim <https://pypi.org/project/cronsim/>`_; five fields, or six with seconds first).
The job of tick ``t`` of schedule ``name`` has the id ``<name>:<t>``, e.g.
``report:1763830800``, the schedule's payload and max_attempts.

**One clock.** Ticks are computed on the Redis server's clock (``TIME``, read with the
queue's read-only ``peek`` script, on the node that serves the queue), never on the
worker's: workers on hosts whose clocks disagree still agree on the ticks. (In a
cluster, each node's clock is assumed to agree with the others' to well within
``keep_done_ms``.)

**Exactly once, with no leader.** Every worker's scheduler enqueues every tick.
Enqueue is idempotent by id: an id that exists in any state is a duplicate
(``added=False``), and so is an id acked less than ``keep_done_ms`` ago (the ack leaves
a tombstone until ``ack time + keep_done_ms``). A scheduler enqueues tick ``t`` only
while the server's clock reads less than ``t + keep_done_ms`` (less a margin for the
enqueue call's own latency, :func:`window_ms`). The job of ``t`` was enqueued at or after
``t``, so it was acked at or after ``t``, and its tombstone lasts until at least
``t + keep_done_ms``: every later enqueue of ``t`` within the window finds the job or its
tombstone and is a duplicate. So each tick is added once: the first enqueue adds it, the
others (two per tick with three workers) are counted as ``duplicates`` in
``Queue.stats()``. The job then runs at least once, as every job does (a worker killed
while running it leaves it to be run again by another).

The rules that argument needs:

* the workers that *ack* a schedule's jobs must keep done ids at least as long as the
  scheduling workers' ``keep_done_ms`` (the default, 5 minutes, everywhere, is fine);
* ``keep_done_ms=0`` with schedules is refused (:class:`~pyqueue.protocol.errors.InvalidArgument`):
  with no tombstone a tick acked before another worker's enqueue of it would run twice;
* a tick job that went DEAD keeps its record, so its id stays a duplicate; one that is
  then *purged* (``dead_purge``) frees its id, and a scheduler still inside the tick's
  window enqueues it again.

**Missed ticks.** Each round (about every second, and at once after each tick) a
scheduler looks only at the *latest* tick of each schedule that is due (``<= now``):
it never enqueues a backlog. A tick older than the window, which no scheduler enqueued in
time (no worker ran then), is skipped and logged once at WARNING; ticks passed over
because a later one is already due are logged at INFO (another worker may well have
enqueued them).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

import redis as redis_lib
from cronsim import CronSim, CronSimError

from pyqueue.protocol.core import DURATION, as_payload, check_int, parse_duration_ms
from pyqueue.protocol.errors import InvalidArgument, PyQueueError
from pyqueue.protocol.keys import check_name
from pyqueue.drivers.facade import parts_of
from pyqueue.drivers.queue import Queue

log = logging.getLogger("pyqueue.ops.schedules")

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

#: Longest interval accepted (366 days).
MAX_EVERY_MS = 366 * 86_400_000
#: A scheduler stops enqueueing a tick this long before its window closes (at most half
#: the window): an enqueue call delayed in flight (timeouts, retries) must still reach the
#: server while a finished job's tombstone lasts. See :func:`window_ms`.
ENQUEUE_MARGIN_MS = 60_000
#: Longest sleep between two rounds of a scheduler (it also wakes at each tick).
MAX_ROUND_S = 1.0
#: Extra sleep past a tick, so the round after it reads a clock that has passed it.
TICK_SLACK_S = 0.002


@dataclass(frozen=True)
class Schedule:
    """A periodic job: one job per tick, with the id ``<name>:<tick>`` (the tick in unix
    seconds), enqueued into ``queue`` by every worker that has this schedule.

    Args:
        name: 1..64 characters of ``[A-Za-z0-9_.-]`` (no ``:``, which separates name and
            tick in the job id). Unique among a worker's schedules; workers that share a
            schedule must give it the same definition.
        queue: where its jobs go: one of the scheduling worker's queues (the worker
            checks).
        every_ms: an interval, a whole number of seconds (>= 1000 ms): ticks are the
            multiples of it since the unix epoch.
        cron: a cron expression, evaluated in UTC by cronsim (five fields, or six with
            seconds first). Exactly one of ``every_ms`` and ``cron``.
        payload: every tick job's payload (bytes, or str stored as UTF-8).
        max_attempts: every tick job's max attempts (default: the queue's default, 5).

    Raises:
        InvalidArgument: any of the above is malformed.
    """

    name: str
    queue: str
    every_ms: int | None = None
    cron: str | None = None
    payload: bytes | str = b""
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidArgument(
                f"schedule name must be 1..64 characters of [A-Za-z0-9_.-] (':' separates the name from the tick "
                f"in job ids), got {self.name!r}"
            )
        check_name(self.queue, f"schedule {self.name}: queue")
        if (self.every_ms is None) == (self.cron is None):
            raise InvalidArgument(f"schedule {self.name}: give exactly one of every_ms and cron")
        if self.every_ms is not None:
            check_int(self.every_ms, f"schedule {self.name}: every_ms", 1_000, MAX_EVERY_MS)
            if self.every_ms % 1_000:
                raise InvalidArgument(
                    f"schedule {self.name}: every_ms must be a whole number of seconds (ticks are unix seconds), "
                    f"got {self.every_ms}"
                )
        if self.cron is not None:
            if not isinstance(self.cron, str):
                raise InvalidArgument(f"schedule {self.name}: cron must be a str, got {type(self.cron).__name__}")
            try:
                CronSim(self.cron, _utc(0))
            except CronSimError as exc:
                raise InvalidArgument(f"schedule {self.name}: bad cron expression {self.cron!r}: {exc}") from None
        as_payload(self.payload)
        if self.max_attempts is not None:
            check_int(self.max_attempts, f"schedule {self.name}: max_attempts", 1, 10_000)

    def job_id(self, tick: int) -> str:
        """The id of the job of ``tick`` (unix seconds): ``<name>:<tick>``."""
        return f"{self.name}:{tick}"

    def latest_tick(self, now_ms: int) -> int | None:
        """The latest tick at or before ``now_ms`` (unix seconds), or None if there is none
        (a cron expression with no match in the 50 years before)."""
        if self.every_ms is not None:
            return (now_ms // self.every_ms) * self.every_ms // 1000
        assert self.cron is not None
        # CronSim in reverse steps back one second first: start just past now's second.
        return _cron_next(self.cron, _utc(now_ms // 1000 + 1), reverse=True)

    def next_tick(self, now_ms: int) -> int | None:
        """The earliest tick after ``now_ms`` (unix seconds), or None if there is none
        within 50 years."""
        if self.every_ms is not None:
            return (now_ms // self.every_ms + 1) * self.every_ms // 1000
        assert self.cron is not None
        return _cron_next(self.cron, _utc(now_ms // 1000), reverse=False)

    def describe(self) -> str:
        """``every 60s`` or ``cron '0 * * * *'``, then ``, 7 attempts`` if it sets them."""
        when = f"every {self.every_ms // 1000}s" if self.every_ms is not None else f"cron {self.cron!r}"
        return when if self.max_attempts is None else f"{when}, {self.max_attempts} attempts"


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


def _cron_next(expression: str, start: datetime, *, reverse: bool) -> int | None:
    try:
        return int(next(CronSim(expression, start, reverse=reverse)).timestamp())
    except StopIteration:
        return None


# -- the window and the decision of one round (pure) ----------------------------------


def window_ms(keep_done_ms: int) -> int:
    """How long after its time a tick may still be enqueued: ``keep_done_ms`` less the
    margin :data:`ENQUEUE_MARGIN_MS` (at most half of ``keep_done_ms``).

    Why: an enqueue of tick ``t`` that reaches the server after the tick's job was acked
    must find its tombstone, which lasts until at least ``t + keep_done_ms``. The check
    reads the clock before the enqueue is sent; the margin covers the time the call may
    then spend in flight (socket timeouts, redis-py's retries)."""
    return keep_done_ms - min(ENQUEUE_MARGIN_MS, keep_done_ms // 2)


@dataclass(frozen=True)
class Due:
    """What one round does with one schedule (:func:`due`)."""

    #: The tick to enqueue now, or None.
    enqueue: int | None = None
    #: A tick found too old to enqueue (its window closed): skip it, warn once.
    expired: int | None = None
    #: When a later tick was chosen: the tick before it, which this process passed over
    #: (it had sent an earlier tick): informational.
    passed_over: int | None = None


def due(schedule: Schedule, now_ms: int, keep_done_ms: int, last: int | None) -> Due:
    """The decision of one scheduler round for ``schedule`` at server time ``now_ms``,
    given ``last``, the latest tick this process already enqueued (or skipped) for it.

    Only the latest tick ``<= now_ms`` is considered (never a backlog): it is enqueued if
    it is newer than ``last`` and younger than :func:`window_ms` (``keep_done_ms``);
    if older, it is reported ``expired``."""
    tick = schedule.latest_tick(now_ms)
    if tick is None or (last is not None and tick <= last):
        return Due()
    if now_ms >= tick * 1000 + window_ms(keep_done_ms):
        return Due(expired=tick)
    passed_over = None
    if last is not None:
        before = schedule.latest_tick(tick * 1000 - 1)
        if before is not None and before > last:
            passed_over = before
    return Due(enqueue=tick, passed_over=passed_over)


# -- the CLI forms ---------------------------------------------------------------------


def parse_schedule(spec: str, default_queue: str, kind: Literal["every", "cron", "auto"] = "auto") -> Schedule:
    """A schedule from its command-line form ``NAME=WHEN`` or ``NAME@QUEUE=WHEN``.

    ``WHEN`` is an interval (``60s``, ``5m``, ``1h``, ``90000ms``; ``kind="every"``) or a
    cron expression (``0 * * * *``; ``kind="cron"``); ``"auto"`` takes an interval if it
    reads as one, else a cron expression. The queue defaults to ``default_queue``. The
    payload is empty.

    Raises:
        InvalidArgument: a malformed spec, name, interval or expression.
    """
    # Neither a cron expression nor an interval has an '=', a queue name may: split at the last.
    head, sep, when = spec.rpartition("=")
    if not sep or not head or not when.strip():
        raise InvalidArgument(f"a schedule is NAME=WHEN or NAME@QUEUE=WHEN, got {spec!r}")
    name, at, queue = head.partition("@")
    if at and not queue:
        raise InvalidArgument(f"a schedule is NAME=WHEN or NAME@QUEUE=WHEN, got {spec!r}")
    queue = queue or default_queue
    if kind == "every" or (kind == "auto" and DURATION.fullmatch(when.strip())):
        return Schedule(name, queue, every_ms=parse_duration_ms(when))
    return Schedule(name, queue, cron=when.strip())


def check_schedules(schedules: Sequence[Schedule], queues: Sequence[str], keep_done_ms: int) -> list[Schedule]:
    """A worker's schedules, checked: each a :class:`Schedule` of one of ``queues``, names
    unique, and ``keep_done_ms > 0`` if there is any.

    Raises:
        InvalidArgument: one of these rules broken.
    """
    out = list(schedules)
    for s in out:
        if not isinstance(s, Schedule):
            raise InvalidArgument(f"schedules must be pyqueue.ops.schedules.Schedule objects, got {type(s).__name__}")
        if s.queue not in queues:
            raise InvalidArgument(f"schedule {s.name}: queue {s.queue!r} is not one of this worker's queues {list(queues)}")
    names = [s.name for s in out]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InvalidArgument(f"schedule names must be unique (they make the job ids), repeated: {duplicated}")
    if out and keep_done_ms <= 0:
        raise InvalidArgument(
            "schedules need keep_done_ms > 0: with no tombstone of acked ids, a tick acked before another worker "
            "enqueued it would run twice"
        )
    return out


# -- the scheduler thread ----------------------------------------------------------------


def server_now_ms(queue: Queue) -> int:
    """The server clock of ``queue``'s node, in ms: one read-only ``peek`` call (of its
    first partition, for a partitioned queue)."""
    part: Queue = parts_of(queue)[0]
    return part.peek().now_ms


class Scheduler:
    """Enqueues the ticks of ``schedules`` into ``queues`` (logical queues by name), in a
    daemon thread (:meth:`start`) until ``stop`` is set. A worker runs one of these
    (``Worker(..., schedules=[...])``); it can also run alone.

    Each round: read the server clock once per queue that has schedules
    (:func:`server_now_ms`), decide each schedule with :func:`due`, and enqueue. The latest
    tick handled per schedule is remembered in this process, so a tick is sent once per
    process (the others' copies answer duplicate, logged at DEBUG). Then sleep until the
    earliest next tick, at most :data:`MAX_ROUND_S`; setting ``stop`` ends the sleep. An
    error (a connection lost, a server at its memory limit) is logged and the round is
    tried again one second later: the tick is still due, and enqueue is idempotent.

    Args:
        clock: tests only: read the time of a queue instead of its server.
    """

    def __init__(
        self,
        schedules: Sequence[Schedule],
        queues: Mapping[str, Queue],
        keep_done_ms: int,
        stop: threading.Event | None = None,
        *,
        clock: Callable[[Queue], int] | None = None,
    ) -> None:
        self.schedules = check_schedules(schedules, list(queues), keep_done_ms)
        self.queues = dict(queues)
        self.keep_done_ms = keep_done_ms
        self.stop = stop if stop is not None else threading.Event()
        self.clock = clock or server_now_ms
        #: schedule name -> the latest tick this process enqueued (or skipped as expired).
        self.last: dict[str, int] = {}
        #: Ticks this process added (the enqueue answered added) and found duplicate.
        self.added = 0
        self.duplicates = 0
        self.thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        """Run :meth:`loop` in a daemon thread."""
        self.thread = threading.Thread(target=self.loop, name="pyqueue-scheduler", daemon=True)
        self.thread.start()
        return self.thread

    def join(self, timeout_s: float = 5.0) -> None:
        """Set ``stop`` and wait for the thread."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout_s)

    def loop(self) -> None:
        """Rounds until ``stop`` is set; never raises."""
        log.info("scheduler started: %s", ", ".join(f"{s.name}@{s.queue} {s.describe()}" for s in self.schedules))
        while not self.stop.is_set():
            try:
                sleep_s = self.round()
            except (redis_lib.RedisError, PyQueueError) as exc:
                log.warning("scheduler round failed (%s); retrying in %.0f s", exc, MAX_ROUND_S)
                sleep_s = MAX_ROUND_S
            except Exception:  # never let a bug here take the worker down
                log.exception("scheduler round failed; retrying in %.0f s", MAX_ROUND_S)
                sleep_s = MAX_ROUND_S
            self.stop.wait(sleep_s)

    def round(self) -> float:
        """One round: enqueue what is due. Returns the seconds to sleep until the next.

        Raises:
            what the clock read raises; an enqueue error is logged, and the other
            schedules still run (the failed one is retried next round).
        """
        sleep_s = MAX_ROUND_S
        failed: BaseException | None = None
        by_queue: dict[str, list[Schedule]] = {}
        for s in self.schedules:
            by_queue.setdefault(s.queue, []).append(s)
        for name, schedules in by_queue.items():
            queue = self.queues[name]
            now_ms = self.clock(queue)
            for s in schedules:
                try:
                    self._one(queue, s, now_ms)
                except (redis_lib.RedisError, PyQueueError) as exc:
                    log.warning("schedule %s: enqueue failed (%s); retrying next round", s.name, exc)
                    failed = exc
                upcoming = s.next_tick(now_ms)
                if upcoming is not None:
                    sleep_s = min(sleep_s, max(0.0, (upcoming * 1000 - now_ms) / 1000) + TICK_SLACK_S)
        return MAX_ROUND_S if failed is not None else sleep_s

    def _one(self, queue: Queue, s: Schedule, now_ms: int) -> None:
        decision = due(s, now_ms, self.keep_done_ms, self.last.get(s.name))
        if decision.expired is not None:
            self.last[s.name] = decision.expired
            log.warning(
                "schedule %s: tick %s (%d s ago) was not enqueued in time, skipped: it is past keep_done_ms (%d ms, "
                "less a margin) and could run twice (no worker with this schedule ran then?)",
                s.name, s.job_id(decision.expired), now_ms // 1000 - decision.expired, self.keep_done_ms,
            )
            return
        if decision.enqueue is None:
            return
        if decision.passed_over is not None:
            log.info("schedule %s: ticks up to %s passed while this scheduler was behind; only the latest is enqueued",
                     s.name, s.job_id(decision.passed_over))
        tick = decision.enqueue
        answer = queue.enqueue(s.payload, job_id=s.job_id(tick), max_attempts=s.max_attempts)
        self.last[s.name] = tick
        if answer.added:
            self.added += 1
            log.info("schedule %s: enqueued %s", s.name, answer.job_id)
        else:
            self.duplicates += 1
            log.debug("schedule %s: %s was enqueued already (duplicate)", s.name, answer.job_id)
