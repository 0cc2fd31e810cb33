"""Find jobs by what they are, and act on them in bulk: ``pyqueue search QUEUE --state dead
--task send_invoice --error TimeoutError --since 10:00 --replay``.

Two ways to find, one way to act:

- :class:`JobFilter` and :func:`matching` read ``Queue.search`` pages (lua/search.lua):
  any state, by task and group on a queue that keeps indexes (``Queue.set_indexes``),
  by state, error class and time on any queue.
- :class:`DeadFilter` and :func:`dead_matching` read the dead letters page by page
  (lua/dead_list.lua, 1000 a call) and filter them here, with any test of a dead job
  (its payload too): what ``pyqueue dead`` uses on a queue without indexes.

The ids found are collected first, then acted on 1000 a call by scripts that check
each job's state again in the same call: ``dead_replay`` and ``dead_purge`` skip a job
that is no longer dead, ``cancel`` one that has ended, ``promote_now`` one that is no
longer scheduled. So a job is never moved twice, nor retried after its ack, and the
counts returned are what the scripts did: "replayed 35 of 37 found (2 moved meanwhile
by others)". Read-only with ``dry_run``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyqueue.drivers.queue import Queue
from pyqueue.protocol.core import MAX_BATCH
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import DeadJob, JobEntry
from pyqueue.protocol.verbs.search import check_search


#: A time of day, ``10:00`` or ``10:00:30``: today by the server's clock (:func:`parse_when`).
CLOCK = re.compile(r"\d{1,2}:\d{2}(:\d{2})?")


def parse_when(text: str, name: str, now_ms: int | None) -> int:
    """``10:00`` or ``10:00:30`` (today, UTC, by ``now_ms``: the server's clock), or a
    date and time (``2026-11-29T10:00``, what a datetime-local field sends; UTC unless it
    says otherwise), as unix ms. InvalidArgument naming the field otherwise."""
    try:
        if CLOCK.fullmatch(text):
            if now_ms is None:
                raise ValueError("no clock")
            clock = datetime.time.fromisoformat(text if len(text.split(":")[0]) == 2 else "0" + text)
            today = datetime.datetime.fromtimestamp(now_ms / 1000, datetime.timezone.utc).date()
            when = datetime.datetime.combine(today, clock, datetime.timezone.utc)
        else:
            when = datetime.datetime.fromisoformat(text)
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.timezone.utc)
        ms = int(when.timestamp() * 1000)
    except (ValueError, OverflowError):
        raise InvalidArgument(f"{name} is HH:MM (today, by the server's clock, UTC) or a date and time "
                              f"(2026-11-29T10:00, UTC unless it says otherwise), got {text!r}") from None
    if not 0 <= ms <= 2**50:
        raise InvalidArgument(f"{name} is out of range: {text!r}")
    return ms



@dataclass(frozen=True)
class JobFilter:
    """Which jobs, for ``Queue.search``: every field given must hold (none: every job).
    ``task`` and ``group`` need the queue's indexes (``Queue.set_indexes``)."""

    #: ready, scheduled, waiting, sequenced, leased or dead
    state: str | None = None
    task: str | None = None
    group: str | None = None
    #: A dead job's exception class (as :class:`DeadFilter`'s); implies dead.
    error: str | None = None
    #: A dead job died, any other was sent, at or after / before this time (ms, server clock).
    since_ms: int | None = None
    until_ms: int | None = None

    def __post_init__(self) -> None:
        check_search(self.state, self.task, self.group, self.error, self.since_ms, self.until_ms, 1)

    def search_args(self) -> dict[str, Any]:
        """The keyword arguments of ``Queue.search``."""
        return {"state": self.state, "task": self.task, "group": self.group, "error": self.error,
                "since_ms": self.since_ms, "until_ms": self.until_ms}


def matching(queue: Queue, where: JobFilter, *, page_size: int = 500) -> Iterator[JobEntry]:
    """The jobs of ``queue`` that ``where`` finds, page after page of ``Queue.search``
    until its cursor is spent (each page one atomic read: a job that moves meanwhile may
    be seen twice or missed)."""
    cursor = ""
    while True:
        page = queue.search(cursor=cursor, count=page_size, **where.search_args())
        yield from page.jobs
        cursor = page.cursor
        if not cursor:
            return


#: The bulk actions, the state each acts on (None: any), and the verb of its answer.
BULK_ACTIONS = {"replay": ("dead", "replayed"), "purge": ("dead", "purged"), "cancel": (None, "cancelled"),
                "promote": ("scheduled", "promoted")}


def act_matching(queue: Queue, action: str, where: JobFilter, *, dry_run: bool = False) -> BulkResult:
    """Do ``action`` to every job ``where`` finds: ``replay`` dead jobs (to READY,
    attempts reset), ``purge`` dead jobs (deleted), ``cancel`` jobs in any state (ended,
    their ids tombstoned), ``promote`` scheduled jobs (due now). A filter whose state is
    not the action's is refused (InvalidArgument); one without a state gets it."""
    if action not in BULK_ACTIONS:
        raise InvalidArgument(f"action must be one of {', '.join(BULK_ACTIONS)}, got {action!r}")
    state, _verb = BULK_ACTIONS[action]
    if state is not None and where.state not in (None, state):
        raise InvalidArgument(f"{action} acts on {state} jobs: the filter's state is {where.state!r}")
    if state is not None and where.state is None:
        where = JobFilter(**{**where.search_args(), "state": state})
    acts: dict[str, Callable[[list[str]], int]] = {
        "replay": queue.dead_replay,
        "purge": queue.dead_purge,
        "cancel": lambda ids: sum(c.state not in ("done", "unknown") for c in queue.cancel_many(ids)),
        "promote": lambda ids: len(queue.promote_now(ids)),
    }
    return _bulk(list(dict.fromkeys(job.id for job in matching(queue, where))), dry_run, acts[action])


@dataclass(frozen=True)
class DeadFilter:
    """Which dead letters: every field given must hold (none given: all of them)."""

    #: The error's exception class: the name before the error text's first ``:`` is
    #: this, or ends with ``.`` and this ("TimeoutError" finds "TimeoutError: ..." and
    #: "asyncio.exceptions.TimeoutError: ...").
    error: str | None = None
    #: Died at or after / before this time (ms, server clock).
    since_ms: int | None = None
    until_ms: int | None = None
    #: Any other test of a dead job (the CLI's ``--task``: the task its payload names).
    match: Callable[[DeadJob], bool] | None = None

    def __post_init__(self) -> None:
        if self.error is not None and (not isinstance(self.error, str) or not self.error or ":" in self.error):
            raise InvalidArgument(f"error is an exception class name (TimeoutError), got {self.error!r}")
        for name in ("since_ms", "until_ms"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidArgument(f"{name} is a time in ms, got {value!r}")

    def holds(self, job: DeadJob) -> bool:
        if self.since_ms is not None and job.dead_ms < self.since_ms:
            return False
        if self.until_ms is not None and job.dead_ms >= self.until_ms:
            return False
        if self.error is not None:
            cls = job.error.split(":", 1)[0].strip()
            if cls != self.error and not cls.endswith("." + self.error):
                return False
        return self.match is None or self.match(job)


def dead_matching(queue: Queue, where: DeadFilter) -> Iterator[DeadJob]:
    """The dead letters of ``queue`` that ``where`` finds, oldest first, read a page at
    a time (a job that dies or is replayed meanwhile may be seen or missed: each page is
    one atomic read, the whole is not)."""
    offset = 0
    while True:
        page = queue.dead_list(offset, MAX_BATCH)
        for job in page.jobs:
            if where.holds(job):
                yield job
        if len(page.jobs) < MAX_BATCH:
            return
        offset += len(page.jobs)


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action found and did."""

    #: The jobs the filter found.
    found: int
    #: How many the scripts moved (replayed, purged, cancelled, promoted): fewer than
    #: ``found`` when others moved some meanwhile; 0 with ``dry_run``.
    done: int
    #: The first ids found (at most 10), to show.
    sample: list[str]


def replay_matching(queue: Queue, where: DeadFilter, *, dry_run: bool = False) -> BulkResult:
    """Replay the dead letters ``where`` finds (see the module)."""
    return _bulk([job.id for job in dead_matching(queue, where)], dry_run, queue.dead_replay)


def purge_matching(queue: Queue, where: DeadFilter, *, dry_run: bool = False) -> BulkResult:
    """Purge the dead letters ``where`` finds (see the module)."""
    return _bulk([job.id for job in dead_matching(queue, where)], dry_run, queue.dead_purge)


def _bulk(ids: Sequence[str], dry_run: bool, act: Callable[[list[str]], int]) -> BulkResult:
    """``act`` on ``ids``, found first (acting while paging would move a rank-paged read
    under it), 1000 a call; what the scripts did."""
    done = 0
    if not dry_run:
        for start in range(0, len(ids), MAX_BATCH):
            done += act(list(ids[start : start + MAX_BATCH]))
    return BulkResult(found=len(ids), done=done, sample=list(ids[:10]))
