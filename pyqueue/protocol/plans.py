"""The plans of one logical queue, as one object: the :class:`QueuePlans` protocol that
a façade (:class:`pyqueue.Queue`, :class:`pyqueue.aio.AsyncQueue`) drives, and
:class:`SingleQueue`, the plans of a queue of one partition: each verb is its plan
function (:mod:`pyqueue.protocol.verbs`) over the queue's spec and memory.
:class:`pyqueue.drivers.partitioned.PartitionedQueue` is the other kind: K specs, and
plans that route to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from pyqueue.protocol.core import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    DEFAULT_MAX_RESULTS,
    DEFAULT_RESULT_TTL_MS,
    Plan,
)
from pyqueue.protocol.models import (
    SearchPage,
    Cancelled,
    SequenceSkipped,
    DeadPage,
    Enqueued,
    Extended,
    GroupsPage,
    Job,
    JobInfo,
    JobPage,
    JobResult,
    Leased,
    Nacked,
    NewJob,
    Outcome,
    Peeked,
    Promoted,
    Scrubbed,
    Stats,
)
from pyqueue.protocol.spec import QueueMemory, QueueSpec
from pyqueue.protocol.verbs import base, consume, control, flows, produce, reading
from pyqueue.protocol.verbs import search as search_plans
from pyqueue.protocol.verbs.search import DEFAULT_SCAN_MOST
from pyqueue.protocol.verbs import events as event_plans
from pyqueue.protocol.verbs import progress as progress_plans
from pyqueue.protocol.verbs import steps as step_plans
from pyqueue.protocol.verbs.events import EventPage, EventsSetting, Since
from pyqueue.protocol.verbs.flows import DEFAULT_FLOW_CHECK_MS, FlowDone, FlowRecord, Ref, Waiting
from pyqueue.protocol.verbs.progress import Progress
from pyqueue.protocol.verbs.steps import Committed, JobSteps, ParkAnswer, ParkKind, Signalled

P = ParamSpec("P")
T = TypeVar("T")


class QueuePlans(Protocol):
    """Every verb of one logical queue, as a plan (no I/O): what a façade drives. The
    verbs' semantics are documented on their plan functions
    (:mod:`pyqueue.protocol.verbs`); a partitioned queue's, where they differ, on
    :class:`pyqueue.drivers.partitioned.PartitionedQueue`."""

    @property
    def spec(self) -> QueueSpec:
        """The (logical) queue: name, keys, owner, settings."""
        ...

    @property
    def memory(self) -> QueueMemory:
        """What the queue object remembers between calls (shared by its partitions)."""
        ...

    def set_owner(self, owner: str) -> None:
        """Take every later lease as ``owner`` (a worker's service id)."""
        ...

    def check_partitions(self, *, record: bool = True) -> Plan[None]: ...

    def partition_stats(self, *, now_ms: int | None = None) -> Plan[list[Stats]]: ...

    # -- produce
    def enqueue(self, payload: bytes | str, *, job_id: str | None = None, delay_ms: int = 0, max_attempts: int | None = None, priority: int = 0, group: str | None = None, expires_ms: int | None = None, debounce_ms: int | None = None, throttle_ms: int | None = None, key: str | None = None, sequence: str | None = None, on_failure: str = "block", now_ms: int | None = None) -> Plan[Enqueued]: ...

    def enqueue_json(self, obj: Any, *, job_id: str | None = None, delay_ms: int = 0, max_attempts: int | None = None, priority: int = 0, group: str | None = None, expires_ms: int | None = None, debounce_ms: int | None = None, throttle_ms: int | None = None, key: str | None = None, sequence: str | None = None, on_failure: str = "block", now_ms: int | None = None) -> Plan[Enqueued]: ...

    def enqueue_many(self, jobs: Iterable[NewJob | bytes | str], *, now_ms: int | None = None) -> Plan[list[Enqueued]]: ...

    # -- consume
    def lease(self, lease_ms: int = DEFAULT_LEASE_MS, count: int = 1, *, now_ms: int | None = None) -> Plan[list[Job]]: ...

    def lease_call(self, *, ack: Sequence[Job] = (), count: int = 1, lease_ms: int = DEFAULT_LEASE_MS, limit: int = DEFAULT_MAINTENANCE_LIMIT, call: str | None = None, now_ms: int | None = None) -> Plan[Leased]: ...

    def ack(self, job: Job, *, now_ms: int | None = None) -> Plan[Outcome]: ...

    def ack_many(self, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]: ...

    def ack_and_lease(self, job: Job, *, lease_ms: int = DEFAULT_LEASE_MS, count: int = 1, call: str | None = None, now_ms: int | None = None) -> Plan[tuple[Outcome, list[Job]]]: ...

    def ack_result(self, job: Job, value: object, *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS, max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None) -> Plan[Outcome]: ...

    def ack_result_many(self, jobs: Sequence[Job], values: Sequence[object], *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS, max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None) -> Plan[list[Outcome]]: ...

    def nack(self, job: Job, error: str = '', *, delay_ms: int | None = None, backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS, backoff_cap_ms: int = DEFAULT_BACKOFF_CAP_MS, now_ms: int | None = None, final: bool = False) -> Plan[Nacked]: ...

    def extend(self, jobs: Iterable[Job], lease_ms: int = DEFAULT_LEASE_MS, *, now_ms: int | None = None) -> Plan[list[Extended]]: ...

    def release(self, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]: ...

    # -- reading
    def stats(self, *, now_ms: int | None = None) -> Plan[Stats]: ...

    def peek(self, *, now_ms: int | None = None) -> Plan[Peeked]: ...

    def get(self, job_id: str, *, with_payload: bool = False, now_ms: int | None = None) -> Plan[JobInfo]: ...

    def browse(self, state: str, start: int = 0, count: int = 50, *, now_ms: int | None = None) -> Plan[JobPage]: ...

    def result(self, job_id: str, *, now_ms: int | None = None) -> Plan[JobResult]: ...

    def results(self, job_ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[JobResult]]: ...

    def wait_result(self, job_id: str, timeout_ms: int, *, now_ms: int | None = None) -> Plan[JobResult]: ...

    # -- control
    def promote(self, limit: int = DEFAULT_MAINTENANCE_LIMIT, *, now_ms: int | None = None) -> Plan[Promoted]: ...

    def scrub(self, owner: str, *, limit: int = DEFAULT_MAINTENANCE_LIMIT, now_ms: int | None = None) -> Plan[Scrubbed]: ...

    def cancel(self, job_id: str, *, now_ms: int | None = None) -> Plan[Cancelled]: ...

    def cancel_many(self, job_ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[Cancelled]]: ...

    def sequence_skip(self, key: str, *, now_ms: int | None = None) -> Plan[SequenceSkipped]: ...

    def limit(self, count: int, period_ms: int = 1000, *, burst: int = 1) -> Plan[bool]: ...

    def set_group_limit(self, cap: int | None, *, group: str | None = None) -> Plan[bool]: ...

    def groups(self, offset: int = 0, limit: int = 100) -> Plan[GroupsPage]: ...

    def pause(self, *, now_ms: int | None = None) -> Plan[bool]: ...

    def resume(self, *, now_ms: int | None = None) -> Plan[bool]: ...

    def dead_list(self, offset: int = 0, limit: int = 100) -> Plan[DeadPage]: ...

    def dead_replay(self, ids: Sequence[str] | None = None, *, limit: int = 100, now_ms: int | None = None) -> Plan[int]: ...

    def dead_purge(self, ids: Sequence[str] | None = None, *, limit: int = 100) -> Plan[int]: ...

    # -- search
    def set_indexes(self, on: bool = True, *, now_ms: int | None = None) -> Plan[int | None]: ...

    def search(self, *, state: str | None = None, task: str | None = None, group: str | None = None, error: str | None = None, since_ms: int | None = None, until_ms: int | None = None, cursor: str = '', count: int = 100, scan_most: int = DEFAULT_SCAN_MOST, now_ms: int | None = None) -> Plan[SearchPage]: ...

    def promote_now(self, ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[str]]: ...

    # -- flows
    def flow_wait(self, job: NewJob, waits_for: Sequence[Ref], *, check_ms: int = DEFAULT_FLOW_CHECK_MS, now_ms: int | None = None) -> Plan[str]: ...

    def flow_done(self, job_id: str, ended: Sequence[tuple[str, str, str]], *, policy: str = 'fail', check_ms: int = DEFAULT_FLOW_CHECK_MS, now_ms: int | None = None) -> Plan[FlowDone]: ...

    def flow_due(self, limit: int = 100) -> Plan[list[Waiting]]: ...

    def flow_record(self, flow_id: str, record: bytes | str, keep_ms: int, *, now_ms: int | None = None) -> Plan[str]: ...

    def flow_show(self, flow_id: str, *, now_ms: int | None = None) -> Plan[FlowRecord | None]: ...

    # -- progress
    def progress(self, job: Job, value: bytes | str, *, now_ms: int | None = None) -> Plan[Outcome]: ...

    def progress_of(self, ids: Iterable[str]) -> Plan[dict[str, Progress]]: ...

    # -- durable steps
    def step(self, job: Job, name: str, value: bytes, *, lease_ms: int, now_ms: int | None = None) -> Plan[Committed]: ...

    def park(
        self, job: Job, kind: ParkKind, name: str, for_ms: int, *, lease_ms: int, now_ms: int | None = None
    ) -> Plan[ParkAnswer]: ...

    def signal(self, job_id: str, name: str, payload: bytes = b"", *, now_ms: int | None = None) -> Plan[Signalled]: ...

    def steps(self, job_id: str, *, now_ms: int | None = None) -> Plan[JobSteps]: ...

    # -- events
    def set_events(self, bound: int) -> Plan[EventsSetting]: ...

    def events(self, since: Since = None, count: int = 100, *, block_ms: int = 0) -> Plan[EventPage]: ...

    def recent_events(self, count: int = 50) -> Plan[EventPage]: ...



class Bound(Generic[P, T]):
    """A plan function bound to the spec and memory of the :class:`SingleQueue` it is
    read from (at each call, so a new owner is seen)."""

    def __init__(self, plan: Callable[Concatenate[QueueSpec, QueueMemory, P], Plan[T]]) -> None:
        self.plan = plan
        self.__doc__ = plan.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> Bound[P, T]: ...

    @overload
    def __get__(self, obj: SingleQueue, owner: type) -> Callable[P, Plan[T]]: ...

    def __get__(self, obj: SingleQueue | None, owner: type) -> Bound[P, T] | Callable[P, Plan[T]]:
        if obj is None:
            return self
        plan, queue = self.plan, obj

        def bound(*args: P.args, **kwargs: P.kwargs) -> Plan[T]:
            return plan(queue.spec, queue.memory, *args, **kwargs)

        return bound


class SingleQueue:
    """The plans of one queue (one partition): each verb is its plan function over
    this object's spec and memory. Also a partition of a partitioned queue (whose
    memory it shares)."""

    def __init__(self, spec: QueueSpec, memory: QueueMemory) -> None:
        self.spec, self.memory = spec, memory

    def __repr__(self) -> str:
        return f"SingleQueue({self.spec.name!r}, prefix={self.spec.prefix!r})"

    def set_owner(self, owner: str) -> None:
        self.spec = replace(self.spec, owner=owner)

    def check_partitions(self, *, record: bool = True) -> Plan[None]:
        return base.check_partitions(self.memory, record=record)

    enqueue = Bound(produce.enqueue)
    enqueue_json = Bound(produce.enqueue_json)
    enqueue_many = Bound(produce.enqueue_many)
    lease = Bound(consume.lease)
    lease_call = Bound(consume.lease_call)
    ack = Bound(consume.ack)
    ack_many = Bound(consume.ack_many)
    ack_and_lease = Bound(consume.ack_and_lease)
    ack_result = Bound(consume.ack_result)
    ack_result_many = Bound(consume.ack_result_many)
    nack = Bound(consume.nack)
    extend = Bound(consume.extend)
    release = Bound(consume.release)
    defer_key = Bound(consume.defer_key)
    stats = Bound(reading.stats)
    partition_stats = Bound(reading.partition_stats)
    peek = Bound(reading.peek)
    get = Bound(reading.get)
    browse = Bound(reading.browse)
    result = Bound(reading.result)
    results = Bound(reading.results)
    wait_result = Bound(reading.wait_result)
    promote = Bound(control.promote)
    scrub = Bound(control.scrub)
    cancel = Bound(control.cancel)
    cancel_many = Bound(control.cancel_many)
    sequence_skip = Bound(control.sequence_skip)
    limit = Bound(control.limit)
    set_group_limit = Bound(control.set_group_limit)
    set_rate_limit = Bound(control.set_rate_limit)
    set_budget = Bound(control.set_budget)
    set_result_budget = Bound(control.set_result_budget)
    set_tombstone_limit = Bound(control.set_tombstone_limit)
    set_indexes = Bound(search_plans.set_indexes)
    search = Bound(search_plans.search)
    promote_now = Bound(search_plans.promote_now)
    groups = Bound(control.groups)
    pause = Bound(control.pause)
    resume = Bound(control.resume)
    dead_list = Bound(control.dead_list)
    dead_replay = Bound(control.dead_replay)
    dead_purge = Bound(control.dead_purge)
    flow_wait = Bound(flows.flow_wait)
    flow_done = Bound(flows.flow_done)
    flow_due = Bound(flows.flow_due)
    flow_record = Bound(flows.flow_record)
    flow_show = Bound(flows.flow_show)
    progress = Bound(progress_plans.progress)
    progress_of = Bound(progress_plans.progress_of)
    step = Bound(step_plans.step)
    park = Bound(step_plans.park)
    signal = Bound(step_plans.signal)
    steps = Bound(step_plans.steps)
    set_events = Bound(event_plans.set_events)
    events = Bound(event_plans.events)
    recent_events = Bound(event_plans.recent_events)
