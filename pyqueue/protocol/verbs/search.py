"""Find jobs in any state, and act on what was found: indexes (lua/set_indexes.lua),
search pages (lua/search.lua) and "run it now" (lua/promote_now.lua). The bulk actions
built on them live in :mod:`pyqueue.ops.find`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pyqueue.protocol.core import (
    Plan,
    check_group,
    check_ids,
    check_int,
    check_key,
    check_now,
    promote_now_call,
    text,
    search_call,
    set_indexes_call,
)
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import JobEntry, SearchPage
from pyqueue.protocol.spec import QueueMemory, QueueSpec
from pyqueue.protocol.verbs.base import run

#: The states a search may ask for (lua/search.lua).
SEARCH_STATES = ("ready", "scheduled", "waiting", "sequenced", "leased", "dead")

#: The most jobs one ``search`` call reads before it answers what it found so far (and
#: a cursor): each script call reads at most 2000.
DEFAULT_SCAN_MOST = 100_000


def set_indexes(spec: QueueSpec, memory: QueueMemory, on: bool = True, *, now_ms: int | None = None) -> Plan[int | None]:
    """Keep the indexes that :meth:`search` reads by task and by group, or stop
    (lua/set_indexes.lua). With them on, each job sent with a task (the task layer's
    jobs) or a group is listed for its whole life, at enqueue, and unlisted by the
    script that ends it: a few commands per enqueue and per ending, and nothing for a
    queue that keeps none. Jobs sent before they were on are not listed. Returns since
    when (ms, server clock) the queue keeps indexes, or None."""
    if not isinstance(on, bool):
        raise InvalidArgument(f"on must be True or False, got {on!r}")
    check_now(now_ms)
    _changed, since_ms = yield from run(memory, set_indexes_call(spec.keys, now_ms, on))
    return None if int(since_ms) < 0 else int(since_ms)


def check_search(state: str | None, task: str | None, group: str | None, error: str | None,
                 since_ms: int | None, until_ms: int | None, count: int) -> None:
    """A search's filter, checked before anything is sent (InvalidArgument)."""
    if state is not None and state not in SEARCH_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(SEARCH_STATES)}, got {state!r}")
    if task is not None:
        check_key(task, "task")
    if group is not None:
        check_group(group)
    if error is not None:
        if not isinstance(error, str) or not error or ":" in error or len(error.encode()) > 256 \
                or any(ord(c) < 32 for c in error):
            raise InvalidArgument(f"error is an exception class name (TimeoutError), got {error!r}")
        if state not in (None, "dead"):
            raise InvalidArgument("only dead jobs have an error: state must be 'dead' or None")
    for name, value in (("since_ms", since_ms), ("until_ms", until_ms)):
        if value is not None:
            check_int(value, name, 0, 2**50)
    check_int(count, "count", 1, 500)


def search(
    spec: QueueSpec,
    memory: QueueMemory,
    *,
    state: str | None = None,
    task: str | None = None,
    group: str | None = None,
    error: str | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    cursor: str = "",
    count: int = 100,
    scan_most: int = DEFAULT_SCAN_MOST,
    now_ms: int | None = None,
) -> Plan[SearchPage]:
    """The jobs that match every filter given, at most ``count`` (1..500), read page by
    page (lua/search.lua) until ``count`` are found, the jobs are all read, or
    ``scan_most`` have been read; go on with the page's ``cursor`` (``""``: complete).

    Filters: ``state`` (ready, scheduled, waiting, sequenced, leased, dead); ``task``
    and ``group`` (these need the queue's indexes, :meth:`set_indexes`: without them
    InvalidArgument); ``error``, an exception class of a dead job ("TimeoutError"
    finds "TimeoutError: ..." and "asyncio.exceptions.TimeoutError: ..."; it implies
    dead); ``since_ms``/``until_ms`` bound when a dead job died, or when any other was
    sent (since inclusive, until exclusive).

    Each script call is one atomic read of at most 2000 jobs of the narrowest source
    (an index range, DEAD by time of death, SCHEDULED, LEASED, READY, or every job),
    checked against the whole filter in their state now. A job that moves between
    pages may be found twice or missed: act on what is found with scripts that check
    the state again (:mod:`pyqueue.ops.find`). Read only."""
    check_search(state, task, group, error, since_ms, until_ms, count)
    check_int(scan_most, "scan_most", 1, 2**40)
    if not isinstance(cursor, str):
        raise InvalidArgument(f"cursor must be a str from a search page, got {cursor!r}")
    check_now(now_ms)
    jobs: list[JobEntry] = []
    examined, since, latest = 0, None, 0
    while True:
        reply = yield from run(memory, search_call(spec.keys, now_ms, state or "", task or "", group or "",
                                                     error or "", since_ms, until_ms, cursor, count - len(jobs)))
        latest, cursor, examined = int(reply[0]), text(reply[1]), examined + int(reply[2])
        since = None if int(reply[3]) < 0 else int(reply[3])
        jobs += entries(spec.name, reply[4:])
        if len(jobs) >= count or not cursor or examined >= scan_most:
            return SearchPage(jobs=jobs, cursor=cursor, examined=examined, indexed_since_ms=since, now_ms=latest)


def entries(queue: str, flat: Sequence[Any]) -> list[JobEntry]:
    """search.lua's entries (10 values each) as JobEntry."""
    out = []
    for i in range(0, len(flat), 10):
        job_id, state, attempts, max_attempts, enqueued_ms, at_ms, task, group, extra, size = flat[i:i + 10]
        state, at = text(state), int(at_ms)
        entry = JobEntry(id=text(job_id), queue=queue, state=state, attempts=int(attempts),
                         max_attempts=int(max_attempts), enqueued_ms=int(enqueued_ms), task=text(task),
                         group=text(group), payload_bytes=int(size))
        if state == "dead":
            entry = replace(entry, dead_ms=at, error=text(extra))
        elif state == "leased":
            entry = replace(entry, deadline_ms=at, owner=text(extra))
        else:
            entry = replace(entry, due_ms=at)
        out.append(entry)
    return out


def promote_now(spec: QueueSpec, memory: QueueMemory, ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[str]]:
    """Make scheduled jobs due now (lua/promote_now.lua): each of ``ids`` (1..1000) that
    is SCHEDULED with a due time after now is due now, and a worker is woken; the next
    maintenance moves it to READY in the queue's order. An id in any other state now
    (leased, acked, cancelled, dead, parked for a signal, waiting for other jobs) is
    skipped: the state is checked in the same call. Returns the ids made due."""
    chosen = check_ids(ids)
    if not chosen:
        return []
    check_now(now_ms)
    reply = yield from run(memory, promote_now_call(spec.keys, now_ms, chosen))
    return [text(job_id) for job_id in reply[1:]]

