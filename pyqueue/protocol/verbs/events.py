"""A queue's event stream (lua/README.md section 2.5): a queue opts in with
``set_events`` (lua/set_events.lua), and from then on the scripts that change a job's
state append its events to the stream ``<prefix>:{<queue>}:events`` in the same call,
so an event is written exactly when its change is, never without it and never lost
between subscribing and reading: a reader keeps the number of the last event it read
and asks for what follows. The stream keeps the newest ``bound`` events; an event's
number (its ID ``0-<n>``) counts every event ever written, so a reader learns how many
were trimmed before it read them (:attr:`EventPage.missed`).

Reading is a plain ``XRANGE`` / ``XREAD`` (no state changes): no script."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from pyqueue.protocol.core import Commands, Plan, check_int, set_events_call, text
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.spec import QueueSpec, QueueMemory
from pyqueue.protocol.verbs.base import run

#: The largest bound a stream may have (lua/set_events.lua).
MAX_EVENTS_BOUND = 10_000_000
#: The most events one read returns.
MAX_EVENTS_PAGE = 1000
#: The event types the scripts write (lua/README.md section 2.5).
EVENT_TYPES = ("enqueued", "leased", "progress", "acked", "retried", "dead", "released", "cancelled", "step", "sleeping",
               "waiting", "signalled", "debounced", "throttled", "expired", "skipped", "deferred")

Since = Union[int, Literal["now"], None]


@dataclass(frozen=True)
class Event:
    """One event of a queue's stream."""

    #: Its number: one more than the event before it in this queue's stream.
    seq: int
    #: One of :data:`EVENT_TYPES`.
    type: str
    job_id: str
    #: When the script that wrote it ran (ms, server clock).
    at_ms: int
    #: The attempt it concerns (leased, progress, acked, retried, dead, released), else None.
    attempt: int | None = None
    #: The other fields, by type: ``due_ms`` (enqueued later, retried), ``owner`` and
    #: ``deadline_ms`` (leased), ``value`` (progress), ``error`` (retried, dead: its
    #: first 1024 bytes), ``state`` (cancelled), ``replayed`` and ``waiting`` (enqueued),
    #: ``send`` (debounced, throttled: the id the send carried), ``reason`` (expired),
    #: ``key`` and ``next`` (skipped), ``until_ms`` (deferred: when it is due again).
    fields: Mapping[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``pyqueue events --json``, the dashboard)."""
        out: dict[str, Any] = {"seq": self.seq, "type": self.type, "id": self.job_id, "at_ms": self.at_ms}
        if self.attempt is not None:
            out["attempt"] = self.attempt
        out.update(self.fields)
        return out


@dataclass(frozen=True)
class EventPage:
    """What one read of a queue's events found."""

    events: list[Event]
    #: The number to pass as ``since`` to read what follows: the last event's, or the
    #: ``since`` read from when there was none.
    last: int
    #: Events after ``since`` that the stream's bound trimmed before this read (0 when
    #: read from the oldest kept event).
    missed: int


@dataclass(frozen=True)
class EventsSetting:
    """What ``set_events`` found and left."""

    #: The bound before the call (0: the queue had not opted in).
    previous: int
    #: The stream's length after it.
    length: int


def check_since(since: object) -> Since:
    """``since`` as ``events`` takes it: None, ``"now"``, or an event number >= 0."""
    if since is None or since == "now":
        return since
    return check_int(since, "since", 0, 2**63 - 1)


def parse_event(entry_id: Any, raw: Any) -> Event:
    """One stream entry (its ID and fields, in redis-py's RESP2 or RESP3 shape)."""
    seq_text = text(entry_id)
    if not seq_text.startswith("0-"):
        raise InvalidArgument(f"an event stream entry must have an ID 0-<n>, got {seq_text!r}")
    if not isinstance(raw, dict):
        raw = dict(zip(raw[::2], raw[1::2]))
    fields = {text(k): text(v) for k, v in raw.items()}
    kind, job_id, at_ms = fields.pop("type", ""), fields.pop("id", ""), int(fields.pop("ms", "0"))
    attempt = fields.pop("attempt", None)
    return Event(int(seq_text[2:]), kind, job_id, at_ms, int(attempt) if attempt is not None else None, fields)


def events_of(reply: Any) -> list[Event]:
    """The events of an XRANGE reply or of an XREAD reply on one stream ([] if none)."""
    if not reply:
        return []
    if isinstance(reply, dict):  # XREAD, RESP3
        entries = [entry for stream in reply.values() for entry in stream]
    elif isinstance(reply[0], (list, tuple)) and len(reply[0]) == 2 and isinstance(reply[0][1], list) and (
        reply[0][1] and isinstance(reply[0][1][0], (list, tuple))
    ):  # XREAD, RESP2: [[stream, [[id, fields], ...]]]
        entries = [entry for stream in reply for entry in stream[1]]
    else:  # XRANGE
        entries = reply
    return [parse_event(entry_id, raw) for entry_id, raw in entries]


def set_events(spec: QueueSpec, memory: QueueMemory, bound: int) -> Plan[EventsSetting]:
    """Opt this queue in to its event stream, keeping the newest ``bound`` events
    (1..10,000,000), or change the bound (a smaller one trims the stream now); 0
    opts out (the stream stays for its readers; opting in again continues its
    numbering). Every producer and worker of the queue writes events from its next
    call on: the setting lives in the queue's ``counters``, not in this object.
    Idempotent.

    Cost: a queue that has not opted in writes no event and pays one HGET per
    state-changing call; one that has, one XADD per event (and a TYPE per call).
    """
    check_int(bound, "bound", 0, MAX_EVENTS_BOUND)
    previous, length = yield from run(memory, set_events_call(spec.keys, bound))
    return EventsSetting(int(previous), int(length))


def events(spec: QueueSpec, memory: QueueMemory, since: Since = None, count: int = 100, *, block_ms: int = 0) -> Plan[EventPage]:
    """Up to ``count`` (1..1000) of this queue's events, oldest first: those after
    event number ``since`` (pass the last page's :attr:`EventPage.last` to read on,
    so nothing is skipped between reads), or from the oldest one kept (None), or
    only those written after this call started reading (``"now"``). With
    ``block_ms`` > 0 and nothing to read, waits up to that long for the next events
    (``XREAD BLOCK``) instead of answering an empty page at once. Read only.

    A queue that has not opted in (``set_events``) has no events: the page is empty.
    """
    since = check_since(since)
    check_int(count, "count", 1, MAX_EVENTS_PAGE)
    check_int(block_ms, "block_ms", 0, 86_400_000)
    key = spec.keys.events
    if since == "now":
        newest = events_of((yield Commands(key, [("XREVRANGE", key, "+", "-", "COUNT", 1)]))[0])
        since = newest[0].seq if newest else 0
    start = "-" if since is None else f"(0-{since}"
    events = events_of((yield Commands(key, [("XRANGE", key, start, "+", "COUNT", count)]))[0])
    if not events and block_ms > 0:
        after = "0-0" if since is None else f"0-{since}"
        block = ("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, after)
        events = events_of((yield Commands(key, [block]))[0])
    base = since if since is not None else (events[0].seq - 1 if events else 0)
    missed = events[0].seq - base - 1 if events else 0
    return EventPage(events, events[-1].seq if events else base, max(missed, 0))


def recent_events(spec: QueueSpec, memory: QueueMemory, count: int = 50) -> Plan[EventPage]:
    """The newest ``count`` (1..1000) events, oldest first (``tail``); ``last`` is the
    newest's number, to read on from with ``events(since=last)``. Read only."""
    check_int(count, "count", 1, MAX_EVENTS_PAGE)
    key = spec.keys.events
    events = events_of((yield Commands(key, [("XREVRANGE", key, "+", "-", "COUNT", count)]))[0])[::-1]
    return EventPage(events, events[-1].seq if events else 0, 0)

