"""Results and records: frozen dataclasses, one per thing a call returns."""

from __future__ import annotations

import enum
import json
import threading
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Any


class Outcome(enum.Enum):
    """The answer of a fenced call (ack, release, nack, extend) for one job.

    ``bool(outcome)`` is true only for :attr:`OK`, so ``if queue.ack(job):`` reads as
    "this call completed the job".
    """

    #: The receipt was the job's current lease and the call took effect.
    OK = "ok"
    #: The job exists, but under another lease or in another state: this lease lost it
    #: (it expired and was reclaimed, or the worker was scrubbed). Nothing changed.
    #: After a call sent twice (redis-py retries on connection errors), a nack or
    #: release whose first send took effect also answers STALE.
    STALE = "stale"
    #: No such job: acked before (possibly by this very call, if its reply was lost and
    #: it was sent again), purged, or never enqueued. Nothing changed.
    GONE = "gone"

    def __bool__(self) -> bool:
        return self is Outcome.OK


class CancelFlag:
    """``Job.cancelled``: a :class:`threading.Event` in what it offers (``is_set``,
    ``set``, ``wait``, ``clear``), made for one per leased job: a plain flag, with the
    Event (a lock and a condition, about 3 µs to make) made only when a handler waits
    on it, which few do. Safe between threads: the worker sets it from its heartbeat
    while the handler checks or waits."""

    __slots__ = ("_flag", "_event")

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def __bool__(self) -> bool:
        """Whether the flag is set (``if job.cancelled:`` reads as ``is_set()``)."""
        return self._flag

    def set(self) -> None:
        self._flag = True
        event = self._event
        if event is not None:
            event.set()

    def clear(self) -> None:
        self._flag = False
        event = self._event
        if event is not None:
            event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set, or ``timeout`` seconds; True if it is set."""
        if self._flag:
            return True
        with _EVENT_MADE:
            if self._event is None:
                self._event = threading.Event()
        # A set() that ran before the Event existed did not set it: the flag says so.
        # (set() writes the flag before it reads _event, and this reads the flag after
        # _event was written: one of the two sees the other.)
        if self._flag:
            self._event.set()
        return self._event.wait(timeout)

    def __repr__(self) -> str:
        return f"<CancelFlag {'set' if self._flag else 'unset'}>"


#: Guards the making of a CancelFlag's Event (two waiters must share one).
_EVENT_MADE = threading.Lock()


@dataclass(frozen=True)
class Job:
    """One lease of one job, as returned by ``lease``.

    ``fence`` increases with every lease in the queue: pass it to downstream stores so
    they can reject writes from a worker whose lease was lost (a zombie). ``receipt``
    names this lease; ``ack``/``nack``/``extend``/``release`` take it.
    """

    id: str
    queue: str
    payload: bytes
    fence: int
    attempt: int
    max_attempts: int
    deadline_ms: int
    receipt: str
    #: When the job was sent (enqueued), on the Redis server's clock; kept through
    #: retries and a dead-letter replay. None for a job enqueued by scripts older than
    #: contract v5 (lua/README.md section 10).
    enqueued_ms: int | None = None
    #: Set by the worker when it learns, at a lease extension (every third of
    #: ``lease_ms``), that this lease ended without it: the job was cancelled
    #: (``Queue.cancel``), or the lease was lost (reclaimed after its deadline, or
    #: scrubbed). Either way what the handler returns no longer matters: the worker
    #: neither acks nor nacks it. A long handler checks ``job.cancelled.is_set()``
    #: between steps, or waits on it instead of sleeping.
    cancelled: CancelFlag = field(default_factory=CancelFlag, compare=False, repr=False)

    @property
    def enqueued_at(self) -> datetime | None:
        """``enqueued_ms`` as an aware UTC datetime (None when unknown)."""
        return None if self.enqueued_ms is None else datetime.fromtimestamp(self.enqueued_ms / 1000, timezone.utc)

    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        """The payload parsed as JSON (see ``Queue.enqueue_json``)."""
        return json.loads(self.payload)


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue with ``enqueue_many``. Defaults as ``Queue.enqueue``."""

    payload: bytes | str
    job_id: str | None = None
    delay_ms: int = 0
    max_attempts: int | None = None
    #: -5..5; a higher level is leased sooner (``Queue.enqueue``).
    priority: int = 0
    #: The job's group for fair scheduling, or None (``Queue.enqueue``).
    group: str | None = None
    #: Not leased within this many ms of the send: it ends as ``expired``, never run.
    expires_ms: int | None = None
    #: With ``key``: debounce (run once, this long after the key's last send, with its
    #: arguments) or throttle (at most one job per key per window); ``Queue.enqueue``.
    debounce_ms: int | None = None
    throttle_ms: int | None = None
    key: str | None = None
    #: The key of the job's sequence: the jobs of one key run one at a time, in send
    #: order (``Queue.enqueue``); and what its dead head does: "block" (the default) or "skip".
    sequence: str | None = None
    on_failure: str = "block"
    #: A keyed rate limit (``Queue.enqueue``): the jobs sent with one ``rate_key`` are
    #: leased no faster than ``rate_limit`` (a :class:`RateLimit`, or its text such as
    #: "100/m"), each taking ``cost`` permits.
    rate_key: str | None = None
    rate_limit: RateLimit | str | None = None
    cost: int = 1
    #: The task it runs (the task layer sets it): a queue that keeps indexes
    #: (``Queue.set_indexes``) lists the job under it, for ``Queue.search(task=)``.
    task: str | None = None


@dataclass(frozen=True)
class RateLimit:
    """At most ``count`` leases per ``period_ms``, up to ``burst`` of them at once after a
    quiet spell (a GCRA, as :meth:`Queue.limit`'s: in any window of ``period_ms`` at most
    ``count + burst - 1`` start). Its text form is ``COUNT/PERIOD`` (``100/s``, ``5/m``,
    ``20/500ms``), parsed by :func:`pyqueue.protocol.core.parse_rate`."""

    count: int
    period_ms: int
    burst: int = 1

    def __str__(self) -> str:
        return f"{self.count}/{self.period_ms}ms" + (f" (burst {self.burst})" if self.burst != 1 else "")


@dataclass(frozen=True)
class Enqueued:
    """The answer of enqueue for one job: ``added`` is false for a duplicate id, and for
    a send its key gave to another job (``by_key``)."""

    job_id: str
    added: bool
    #: None, or how the job's key decided: "debounced" (``job_id`` is the key's pending
    #: job, which now runs with this send's arguments) or "throttled" (the send was
    #: dropped: ``job_id`` is the job of the key's window).
    by_key: str | None = None

    @property
    def id(self) -> str:
        """The job's id, by the name every other record uses (``Job.id``, ``JobInfo.id``,
        ``JobResult.id``); ``job_id`` stays for the code written against it."""
        return self.job_id


@dataclass(frozen=True)
class Leased:
    """The full answer of one lease call."""

    jobs: list[Job]
    #: One outcome per receipt acked first (ack-and-lease), in order.
    acks: list[Outcome]
    #: The server clock when the call ran.
    now_ms: int
    #: When fewer jobs than asked were leased: the earliest time a scheduled job is due or
    #: a lease expires (now_ms if maintenance stopped at its limit); -1 if neither.
    next_due_ms: int


@dataclass(frozen=True)
class Nacked:
    """The answer of nack: where the job went, if the receipt was current."""

    outcome: Outcome
    #: "scheduled" (retry at at_ms) or "dead"; None unless outcome is OK.
    state: str | None
    at_ms: int


@dataclass(frozen=True)
class Extended:
    """The answer of extend for one lease."""

    outcome: Outcome
    #: The new deadline; 0 unless outcome is OK.
    deadline_ms: int


@dataclass(frozen=True)
class Promoted:
    """The answer of promote."""

    promoted: int
    reclaimed: int
    dead: int
    #: A limit was reached: call again.
    more: bool
    next_due_ms: int


@dataclass(frozen=True)
class Peeked:
    """The answer of peek: whether a queue has work for a lease call, read-only."""

    now_ms: int
    #: Jobs in READY.
    ready: int
    #: The earliest due time in SCHEDULED or lease deadline in LEASED; -1 if neither.
    next_due_ms: int

    @property
    def has_work(self) -> bool:
        """A lease call now would find a job: one is ready, due, or an expired lease
        waits to be reclaimed."""
        return self.ready > 0 or 0 <= self.next_due_ms <= self.now_ms


@dataclass(frozen=True)
class Scrubbed:
    """The answer of scrub: leases ended, of which jobs sent to DEAD, and whether a limit
    was reached (call again)."""

    scrubbed: int
    dead: int
    more: bool


@dataclass(frozen=True)
class Stats:
    """Counts per state, lag and counters of one queue, read in one atomic call."""

    now_ms: int
    ready: int
    scheduled: int
    #: Scheduled jobs already due, waiting for promotion.
    due: int
    leased: int
    #: Leases past their deadline, not yet reclaimed.
    expired: int
    dead: int
    #: Acked ids that enqueue still treats as duplicates (tombstones in force).
    done: int
    #: How long the job at the head of READY (or the earliest due scheduled job, if
    #: older) has been due.
    lag_ms: int
    enqueued: int
    duplicates: int
    leased_total: int
    acked: int
    nacked: int
    promoted: int
    reclaimed: int
    scrubbed: int
    released: int
    dead_total: int
    replayed: int
    purged: int
    #: When the queue was paused (``pause``); 0 while it is not.
    paused_ms: int = 0
    #: Jobs ``cancel`` ended, in any state.
    cancelled: int = 0
    #: The rate limit (``limit``): at most ``rate_limit`` leases per
    #: ``rate_period_ms``, ``rate_burst`` at once; 0 when the queue has none.
    rate_limit: int = 0
    rate_period_ms: int = 0
    rate_burst: int = 0
    #: Groups with ready jobs (fair scheduling, ``enqueue(group=...)``): with a free
    #: slot, and parked at their cap (``set_group_limit``).
    groups_waiting: int = 0
    groups_at_cap: int = 0
    #: Durable steps (``current_job().wait_signal``): jobs parked for a signal whose
    #: timeout has not passed (counted in ``scheduled`` too), and leases ended by a
    #: sleep or a wait (``parked``; not counted as attempts).
    waiting: int = 0
    parked: int = 0
    #: Flow control (lua/README.md section 2.7): jobs ended unrun past their expiry
    #: (``expired`` counts expired leases), sends debounced into a key's pending job,
    #: sends dropped inside a key's throttle window.
    expired_total: int = 0
    debounced: int = 0
    throttled: int = 0
    #: Jobs waiting behind their sequence's head (``enqueue(sequence=...)``), and dead
    #: heads let go by ``sequence_skip``.
    sequenced: int = 0
    skipped: int = 0
    #: Leases put off by a rate key's limit (``enqueue(rate_key=...)``): each such job
    #: was scheduled at its slot, when its permits will be due.
    deferred: int = 0
    #: Byte budgets (``Queue.set_budget``): the payload bytes of the jobs sized since the
    #: queue had a budget and not yet ended (dead ones included), and the budget (0: none).
    bytes: int = 0
    budget_bytes: int = 0
    #: Results budgets (``Queue.set_result_budget``): the bytes of the results sized since
    #: the queue had one, and the budget (0: none). The tombstone limit
    #: (``Queue.set_tombstone_limit``; 0: none).
    result_bytes: int = 0
    result_budget_bytes: int = 0
    tombstone_limit: int = 0

    @property
    def paused(self) -> bool:
        """Whether the queue is paused: it leases nothing until ``resume``."""
        return self.paused_ms > 0


@dataclass(frozen=True)
class GroupInfo:
    """One group with READY jobs (``Queue.groups``)."""

    name: str
    #: Its READY jobs, and its leases running now.
    ready: int
    running: int
    #: Its cap: its own, else the queue's default; 0: none.
    cap: int
    #: Parked: at its cap, skipped by lease until a lease of it ends.
    parked: bool
    #: Its place in the round: the lowest turn is served next (-1 while parked).
    turn: int
    #: The queue (a partition's name, on a partitioned queue).
    queue: str = ""


@dataclass(frozen=True)
class GroupsPage:
    """One page of ``Queue.groups``: the groups with READY jobs, parked ones first, then
    in the order lease serves them."""

    #: Groups with READY jobs in all (summed over partitions).
    total: int
    #: The default cap of every group (0: none).
    default_cap: int
    groups: list[GroupInfo]


@dataclass(frozen=True)
class DeadJob:
    """A job in DEAD, as listed by ``dead_list``."""

    id: str
    dead_ms: int
    attempts: int
    max_attempts: int
    error: str
    payload: bytes


@dataclass(frozen=True)
class DeadPage:
    """One page of DEAD, oldest first, and how many dead jobs there are in all."""

    total: int
    jobs: list[DeadJob]


@dataclass(frozen=True)
class SearchPage:
    """One page of ``Queue.search``: the jobs found (at most the count asked), and the
    cursor to go on from (``""``: the search is complete). ``examined``: the jobs read
    to find them. ``indexed_since_ms``: since when the queue keeps indexes (jobs sent
    before are not found by task or group), or None."""

    jobs: list[JobEntry]
    cursor: str
    examined: int
    indexed_since_ms: int | None
    now_ms: int


#: The due time of a job waiting for other jobs (lua/flow_wait.lua): never due by time.
WAITING_DUE_MS = 2**50


@dataclass(frozen=True)
class JobEntry:
    """One job of a :class:`JobPage` (``Queue.browse``, lua/browse.lua): what its state
    tells of it, never its payload. Fields a state has not are -1, '' or False.

    ready: ``attempts``, ``max_attempts``, ``group`` and ``priority``; scheduled:
    ``due_ms`` (:data:`WAITING_DUE_MS` for a job waiting for others: ``waiting``),
    ``attempts``, ``max_attempts``; running: ``owner`` (the service holding the lease),
    ``attempts`` (this run's attempt), ``max_attempts``, ``fence``, ``deadline_ms``;
    done: ``done_until_ms`` (its id a duplicate until then), ``has_result`` and
    ``finished_ms`` (``Queue.result`` answers the result)."""

    id: str
    #: The queue that holds it (a partition's name, on a partitioned queue).
    queue: str
    attempts: int = -1
    max_attempts: int = -1
    group: str = ""
    priority: int = 0
    due_ms: int = -1
    owner: str = ""
    fence: int = -1
    deadline_ms: int = -1
    done_until_ms: int = -1
    has_result: bool = False
    finished_ms: int = -1
    #: A job found by ``Queue.search``: its state ('ready', 'scheduled', 'waiting',
    #: 'sequenced', 'leased' or 'dead'; '' in a browse page, whose state is the page's),
    #: its task ('' when it was sent without one, or before the queue kept indexes),
    #: when it was sent, when it died and its last error (dead), its payload's size.
    state: str = ""
    task: str = ""
    enqueued_ms: int = -1
    dead_ms: int = -1
    error: str = ""
    payload_bytes: int = -1

    @property
    def waiting(self) -> bool:
        """A scheduled job that waits for other jobs to end (a flow's next step)."""
        return self.due_ms == WAITING_DUE_MS


@dataclass(frozen=True)
class JobPage:
    """One page of ``Queue.browse``: the jobs of ``state`` from rank ``start``, and how
    many jobs were in that state (``total``) at ``now_ms`` (server clock)."""

    state: str
    total: int
    start: int
    now_ms: int
    jobs: list[JobEntry]


@dataclass(frozen=True)
class Result:
    """What a handler returns to have its job's result kept for ``ttl_ms`` (default:
    the worker's ``keep_results_ms``, else one hour), whatever the worker's default;
    ``value`` is bytes, str or anything JSON-able."""

    value: Any
    ttl_ms: int | None = None


@dataclass(frozen=True)
class JobResult:
    """A job's outcome (``result`` / ``wait_result``; lua/result.lua).

    ``state``: ``ok`` (finished; ``value`` is what its handler returned, kept for the
    result's time to live), ``dead`` (``error`` is its last error), ``pending`` (not
    finished: ready, scheduled or leased; after ``wait_result``, its time ran out),
    ``done`` (ended with no result kept: acked without one, cancelled, or its result
    expired or was trimmed), or ``unknown`` (no trace of the id: not enqueued yet, or
    long gone; after ``wait_result``, nothing appeared in its time).
    """

    id: str
    queue: str
    state: str
    value: Any
    error: str
    #: When it finished (ok) or died (dead); -1 otherwise.
    finished_ms: int

    @property
    def finished(self) -> bool:
        """Whether the job has ended (``ok``, ``dead`` or ``done``), so that waiting
        longer can change nothing; ``pending`` and ``unknown`` (perhaps not enqueued
        yet) have not."""
        return self.state in ("ok", "dead", "done")


@dataclass(frozen=True)
class SequenceSkipped:
    """What ``sequence_skip`` did (lua/sequence_skip.lua): ``status`` ``skipped`` (the
    dead head left the sequence; ``next_id`` is the new head, '' when none was waiting),
    ``running`` (the head, ``next_id``, is not dead: nothing changed) or ``free`` (the
    key has no job)."""

    key: str
    status: str
    next_id: str


@dataclass(frozen=True)
class Cancelled:
    """What ``cancel`` did (lua/cancel.lua).

    ``state`` is the state the job was cancelled in (``ready``, ``scheduled``,
    ``leased``, ``dead`` or ``sequenced``), or, with nothing changed, ``done`` (it had already ended
    and its tombstone is in force) or ``unknown`` (no such job).
    """

    id: str
    queue: str
    state: str

    @property
    def cancelled(self) -> bool:
        """Whether this call ended the job."""
        return self.state in ("ready", "scheduled", "leased", "dead")


@dataclass(frozen=True)
class JobInfo:
    """What ``get`` knows of one job (lua/get.lua), read atomically.

    ``state`` is one of ``ready``, ``scheduled``, ``leased``, ``dead``, ``done`` (ended:
    acked, or cancelled, which leaves the same tombstone; its id a duplicate until
    ``done_until_ms``), ``expired`` (not leased before its ``expires_ms``: never run;
    ``due_ms`` is when it expired), ``unknown`` (never enqueued, purged, or ended with its tombstone
    gone), or ``ready_or_leased`` (the queue holds more than
    10,000 leases, more than one call scans for the job's). Fields a state does not have
    are -1, '' or None.
    """

    id: str
    queue: str
    state: str
    now_ms: int
    attempts: int
    max_attempts: int
    #: scheduled: when it is due; dead: when it died; else the record's due time.
    due_ms: int
    payload_bytes: int
    #: The payload only when asked for (``with_payload=True``): it may hold personal data.
    payload: bytes | None
    #: dead: its last error.
    error: str
    #: leased: the current lease's deadline, owner (a service) and fence.
    deadline_ms: int
    owner: str
    fence: int
    done_until_ms: int
    #: When it was sent, on the server's clock: -1 when unknown (done, unknown, or a
    #: record written before contract v5).
    enqueued_ms: int = -1

    @property
    def exists(self) -> bool:
        """Whether the job is in the queue (not done, not unknown)."""
        return self.state not in ("done", "unknown")

    @property
    def attempts_made(self) -> int:
        """Attempts made so far, counted from 1: those that ended (``attempts``, the
        record's count) and, for a leased job, the one running now (so a running first
        attempt is 1, its attempt number; lua/README.md section 2). -1 where ``get``
        knows none (a job done or unknown)."""
        if self.attempts < 0:
            return -1
        return self.attempts + 1 if self.state == "leased" else self.attempts
