"""What :class:`pyqueue.Queue` and :class:`pyqueue.aio.AsyncQueue` share: the
constructor's arguments, made into a :class:`~pyqueue.protocol.spec.QueueSpec` once,
and the verbs, each declared once as the plan it runs (:class:`~pyqueue.protocol.core.Verb`).
A façade composes the plans of its queue (:func:`~pyqueue.drivers.partitioned.queue_plans`:
a single queue's, or a partitioned queue's) with its driver's transport; its public
names are the verbs, ``name``, ``spec`` and ``from_url``.

The floors above (worker, tasks, ops) reach the rest through the functions here
(:func:`plans_of`, :func:`physical`) and in each driver's module (its transport, and
driving a plan of their own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pyqueue.drivers.partitioned import PartitionedQueue, queue_plans
from pyqueue.protocol.core import (
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_PREFIX,
    Verb,
)
from pyqueue.protocol.plans import QueuePlans
from pyqueue.protocol.spec import DEFAULT_COALESCE_ENQUEUES, QueueMemory, QueueSpec, random_owner
from pyqueue.protocol.verbs import consume, control, flows, produce, reading
from pyqueue.protocol.verbs import search as search_plans
from pyqueue.protocol.verbs import events as event_plans
from pyqueue.protocol.verbs import progress as progress_plans
from pyqueue.protocol.verbs import steps as step_plans

F = TypeVar("F", bound="QueueFacade")


class QueueFacade:
    """One named queue's verbs (arguments: see :class:`pyqueue.Queue`). A driver adds
    its transport (``_open``, ``_execute``)."""

    _plans: QueuePlans
    #: The driver's transport: its scripts on its client (set by ``_open``).
    _scripts: Any

    def __init__(
        self,
        name: str,
        redis: Any = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        owner: str | None = None,
        keep_done_ms: int = DEFAULT_KEEP_DONE_MS,
        partitions: int = 1,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        coalesce_enqueues: bool = DEFAULT_COALESCE_ENQUEUES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        lua_directory: Path | None = None,
    ) -> None:
        spec = QueueSpec(
            name, prefix, owner if owner is not None else random_owner(), keep_done_ms, max_payload_bytes,
            partitions, wait_replicas, wait_timeout_ms, coalesce_enqueues,
        )
        self._plans = queue_plans(spec, QueueMemory(spec))
        self._parts: list[Any] | None = None
        self._open(redis, lua_directory)

    def _open(self, redis: Any, lua_directory: Path | None) -> None:
        """Set up the driver's client and transport for ``self.spec``."""
        raise NotImplementedError

    @classmethod
    def _sharing(cls: type[F], plans: QueuePlans, scripts: Any) -> F:
        """A façade of this driver over ``plans`` (a partition's) and the transport
        ``scripts`` of another (its logical queue's): what :func:`parts_of` makes."""
        queue = cls.__new__(cls)
        queue._plans, queue._scripts, queue._parts = plans, scripts, None
        return queue

    @property
    def name(self) -> str:
        """The queue's name (a partitioned queue's logical name)."""
        return self._plans.spec.name

    @property
    def spec(self) -> QueueSpec:
        """The queue: its name, keys, lease owner and settings, validated."""
        return self._plans.spec

    def __repr__(self) -> str:
        spec = self._plans.spec
        partitions = f", partitions={spec.partitions}" if spec.partitions > 1 else ""
        return f"{type(self).__name__}({spec.name!r}, prefix={spec.prefix!r}{partitions})"

    enqueue = Verb(produce.enqueue)
    enqueue_json = Verb(produce.enqueue_json)
    enqueue_many = Verb(produce.enqueue_many)
    lease = Verb(consume.lease)
    lease_call = Verb(consume.lease_call)
    ack = Verb(consume.ack)
    ack_many = Verb(consume.ack_many)
    ack_and_lease = Verb(consume.ack_and_lease)
    ack_result = Verb(consume.ack_result)
    ack_result_many = Verb(consume.ack_result_many)
    nack = Verb(consume.nack)
    extend = Verb(consume.extend)
    release = Verb(consume.release)
    defer_key = Verb(consume.defer_key)
    stats = Verb(reading.stats)
    partition_stats = Verb(reading.partition_stats)
    peek = Verb(reading.peek)
    get = Verb(reading.get)
    browse = Verb(reading.browse)
    result = Verb(reading.result)
    results = Verb(reading.results)
    wait_result = Verb(reading.wait_result)
    promote = Verb(control.promote)
    scrub = Verb(control.scrub)
    cancel = Verb(control.cancel)
    cancel_many = Verb(control.cancel_many)
    sequence_skip = Verb(control.sequence_skip)
    limit = Verb(control.limit)
    set_group_limit = Verb(control.set_group_limit)
    set_rate_limit = Verb(control.set_rate_limit)
    set_budget = Verb(control.set_budget)
    set_result_budget = Verb(control.set_result_budget)
    set_tombstone_limit = Verb(control.set_tombstone_limit)
    set_indexes = Verb(search_plans.set_indexes)
    search = Verb(search_plans.search)
    promote_now = Verb(search_plans.promote_now)
    groups = Verb(control.groups)
    pause = Verb(control.pause)
    resume = Verb(control.resume)
    dead_list = Verb(control.dead_list)
    dead_replay = Verb(control.dead_replay)
    dead_purge = Verb(control.dead_purge)
    flow_wait = Verb(flows.flow_wait)
    flow_done = Verb(flows.flow_done)
    flow_due = Verb(flows.flow_due)
    flow_record = Verb(flows.flow_record)
    flow_show = Verb(flows.flow_show)
    progress = Verb(progress_plans.progress)
    progress_of = Verb(progress_plans.progress_of)
    step = Verb(step_plans.step)
    park = Verb(step_plans.park)
    signal = Verb(step_plans.signal)
    steps = Verb(step_plans.steps)
    set_events = Verb(event_plans.set_events)
    events = Verb(event_plans.events)
    recent_events = Verb(event_plans.recent_events)


def plans_of(queue: QueueFacade) -> QueuePlans:
    """The plans ``queue`` drives: its spec (or a partitioned queue's specs), the
    partition-count guard's plan (``check_partitions``, which a worker runs at start),
    and ``set_owner`` (a worker takes its leases as its service)."""
    return queue._plans


def parts_of(queue: F) -> list[F]:
    """The physical queues of ``queue``: for a partitioned queue, one queue of the same
    driver per partition (``<name>#<p>``) on its transport, whose partition-count guard
    and lease owner are the logical queue's (a worker serves each); else ``[queue]``.
    The same objects on every call."""
    if queue._parts is None:
        plans = queue._plans
        if isinstance(plans, PartitionedQueue):
            queue._parts = [type(queue)._sharing(part, queue._scripts) for part in plans.parts]
        else:
            queue._parts = [queue]
    return list(queue._parts)


def client_of(queue: QueueFacade) -> Any:
    """The client ``queue`` talks through (its transport's)."""
    return queue._scripts.client


def physical(queue: F) -> F:
    """``queue``, made a queue addressed by its own name (such as one partition
    ``<name>#<p>``, named by a job or by a dead service's registration): it never
    records or checks a partition count (its logical queue does)."""
    queue._plans.memory.partitions_checked = True
    return queue
