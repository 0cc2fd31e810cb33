"""Find dead letters by what they are, and replay or purge them in bulk: ``pyqueue dead
replay QUEUE --task send_invoice --error TimeoutError --since 10:00``.

The dead letters are read page by page, oldest first (lua/dead_list.lua, 1000 a call),
and filtered here; the jobs found are then replayed (lua/dead_replay.lua) or purged
(lua/dead_purge.lua) 1000 ids a call. Each of those scripts re-checks every id it gets
and skips one that is no longer dead (replayed or purged meanwhile by someone else), so
a job is never moved twice, and the counts returned are what the scripts moved. The
read is O(dead letters) and holds only the ids found; a queue's dead letters are
meant to be few (``pyqueue memory``). Read-only with ``dry_run``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pyqueue.drivers.queue import Queue
from pyqueue.protocol.core import MAX_BATCH
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import DeadJob


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

    #: The dead letters the filter found.
    found: int
    #: How many the scripts moved (replayed or purged): fewer than ``found`` when
    #: others moved some meanwhile; 0 with ``dry_run``.
    done: int
    #: The first ids found (at most 10), to show.
    sample: list[str]


def replay_matching(queue: Queue, where: DeadFilter, *, dry_run: bool = False) -> BulkResult:
    """Replay the dead letters ``where`` finds (see the module)."""
    return _bulk(queue, where, dry_run, lambda ids: queue.dead_replay(ids))


def purge_matching(queue: Queue, where: DeadFilter, *, dry_run: bool = False) -> BulkResult:
    """Purge the dead letters ``where`` finds (see the module)."""
    return _bulk(queue, where, dry_run, lambda ids: queue.dead_purge(ids))


def _bulk(queue: Queue, where: DeadFilter, dry_run: bool, act: Callable[[list[str]], int]) -> BulkResult:
    # Every id first, then the actions: acting while paging would move the pages' offsets.
    ids = [job.id for job in dead_matching(queue, where)]
    done = 0
    if not dry_run:
        for start in range(0, len(ids), MAX_BATCH):
            done += act(ids[start : start + MAX_BATCH])
    return BulkResult(found=len(ids), done=done, sample=ids[:10])
