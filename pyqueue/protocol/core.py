"""The core both drivers share: everything that does no I/O (DESIGN §10).

A driver verb is written once, as a *plan*: a generator that validates its arguments,
yields the calls it needs (:class:`ScriptCall`, :class:`Pipelined`, :class:`Commands`),
receives each reply, and returns the parsed result. A plan never touches a socket, so
the same plan runs on both transports:

* :func:`drive` (:class:`pyqueue.Queue`, a :class:`SyncDriver`) executes each step with
  redis-py's blocking client;
* :func:`drive_async` (:class:`pyqueue.aio.AsyncQueue`, an :class:`AsyncDriver`) awaits
  each step with ``redis.asyncio``.

A verb is declared once, as ``enqueue = Verb(produce.enqueue)`` on the façade both
drivers share (:mod:`pyqueue.drivers.facade`); the :class:`Verb` descriptor turns it
into a plain method on a sync driver and into a coroutine method on an async one (mypy
sees both signatures). A transport raises
pyqueue errors (already mapped, see :mod:`pyqueue.protocol.errors`) into the plan at the step
that failed, so a plan can react, and a plan that does not simply lets them through.

Also here: argument validation and the script ABI (:func:`script_call` builders, one
per ``lua/*.lua``, keys and ARGV in header order).
"""

from __future__ import annotations

import inspect
import json
import math
import re
import os
from binascii import crc_hqx
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeGuard, TypeVar, Union, overload

from pyqueue.protocol.errors import CorruptRecord, InvalidArgument, PayloadTooLarge, PyQueueError
from pyqueue.protocol.models import Job, NewJob, Outcome, RateLimit

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_PREFIX = "pq"
DEFAULT_LEASE_MS = 30_000
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_MS = 1_000
DEFAULT_BACKOFF_CAP_MS = 3_600_000
#: How long an acked job's id stays a duplicate for enqueue (its tombstone): long enough
#: for any retry of a lost enqueue reply, by redis-py or by the caller, to find it.
DEFAULT_KEEP_DONE_MS = 300_000
#: Most jobs promoted and most expired leases reclaimed by one call.
DEFAULT_MAINTENANCE_LIMIT = 100
#: Scripts accept at most this many jobs, receipts or ids per call.
MAX_BATCH = 1000
MAX_ID_BYTES = 256
#: Most partitions of one logical queue.
MAX_PARTITIONS = 1024
MAX_ERROR_BYTES = 65536
MAX_LEASE_MS = 604_800_000
#: How long a job's result is kept (ack_result), and how many results a queue keeps.
DEFAULT_RESULT_TTL_MS = 3_600_000
DEFAULT_MAX_RESULTS = 10_000
#: The largest result lua/ack_result.lua stores, encoded (see :func:`encode_result`).
MAX_RESULT_BYTES = 524_288
#: The largest payload a queue object sends unless it is told otherwise
#: (``max_payload_bytes``). Redis takes values up to 512 MB, but one that size stalls
#: the server for every client while it is read and copied, and one over it makes
#: Redis drop the connection (after redis-py has sent it again three times): a payload
#: this large belongs in object storage, with its key as the payload.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
#: The most payload bytes one enqueue call carries, one batch or coalesced enqueues
#: together (and the most ``max_payload_bytes`` may be): Redis closes a client whose
#: request passes its client-query-buffer-limit (1 GiB by default).
MAX_CALL_PAYLOAD_BYTES = 256 * 1024 * 1024
#: Coalesced enqueues weigh a job by its payload in these units (at least 1), and a
#: call carries at most MAX_BATCH units: at most MAX_BATCH jobs and about
#: MAX_CALL_PAYLOAD_BYTES.
_PAYLOAD_UNIT = MAX_CALL_PAYLOAD_BYTES // MAX_BATCH

Arg = Union[bytes, str, int]

# -- validation ----------------------------------------------------------------------


def check_int(value: object, name: str, lo: int, hi: int) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) in [lo, hi]; else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            raise InvalidArgument(f"{name} must be an integer, got {value!r}")
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


#: A character a job id must not hold (a control character).
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f]")


def check_job_id(value: object) -> str:
    """Return ``value`` if it is a valid job id: 1..256 UTF-8 bytes, no control chars."""
    if not isinstance(value, str):
        raise InvalidArgument(f"job id must be a str, got {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_ID_BYTES or CONTROL_CHARACTERS.search(value) is not None:
        raise InvalidArgument(f"job id must be 1..{MAX_ID_BYTES} bytes without control characters, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"job id must be valid UTF-8, got {value!r}") from exc
    return value


def check_now(now_ms: int | None) -> None:
    """``now_ms`` overrides the server clock in tests; when given it must be sane."""
    if now_ms is not None:
        check_int(now_ms, "now_ms", 0, 2**53)


def check_owner(owner: object) -> str:
    """A lease owner: 1..64 characters of ``[A-Za-z0-9_.:-]``."""
    if not isinstance(owner, str) or not (1 <= len(owner) <= 64) or not all(
        c.isalnum() and c.isascii() or c in "_.:-" for c in owner
    ):
        raise InvalidArgument(f"owner must be 1..64 characters of [A-Za-z0-9_.:-], got {owner!r}")
    return owner


def as_payload(value: object) -> bytes:
    """Payload bytes: ``bytes`` as they are, ``str`` encoded as UTF-8. Never pickle."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise InvalidArgument(f"payload must be bytes or str (use enqueue_json for objects), got {type(value).__name__}")


#: What enqueue.lua takes per job: (id, payload, delay_ms, max_attempts, priority, group,
#: expires_ms, keys), as the script takes them ('' for 0 and for none; keys as
#: "<mode>|<window_ms>|<key>", "rate|<count>/<period_ms>/<burst>/<cost>|<key>", or both
#: joined by a newline, lua/README.md section 2.7).
JobTuple = tuple[str, bytes, int, int, int | str, str, int | str, str]

#: The most bytes of a debounce or throttle key.
MAX_KEY_BYTES = 256

#: Priority levels (lua/README.md section 2.1): a higher level is leased sooner.
PRIORITY_MIN, PRIORITY_MAX = -5, 5
#: The most bytes of a group key.
MAX_GROUP_BYTES = 128


def check_priority(value: object) -> int:
    """Return ``value`` if it is a priority level (an int in -5..5), else raise InvalidArgument."""
    return check_int(value, "priority", PRIORITY_MIN, PRIORITY_MAX)


def check_group(value: object) -> str:
    """Return ``value`` if it is a group key: a str of 1..128 UTF-8 bytes without ``|`` or
    control characters (the ring's members and the lexicographic index need both
    rules); else raise InvalidArgument."""
    if not isinstance(value, str):
        raise InvalidArgument(f"group must be a str, got {type(value).__name__}")
    raw = value.encode("utf-8")
    if not 1 <= len(raw) <= MAX_GROUP_BYTES or "|" in value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(f"group must be 1..{MAX_GROUP_BYTES} bytes without | or control characters, got {value!r}")
    return value


def new_id(group: str | None = None, partitions: int = 1) -> str:
    """A random job id (128 bits in hex). On a partitioned queue, a job of a group must
    live in its group's partition (so that the group's cap holds across the queue), and
    a job lives in the partition of its id: the id is drawn until it falls there
    (``partitions`` draws on average)."""
    job_id = os.urandom(16).hex()
    if group is not None and partitions > 1:
        home = partition_of(group, partitions)
        while partition_of(job_id, partitions) != home:
            job_id = os.urandom(16).hex()
    return job_id


def new_job(item: NewJob | bytes | str, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, partitions: int = 1) -> JobTuple:
    """Validate one job to enqueue (a random id when none is given: in its group's
    partition on a partitioned queue, :func:`new_id`). Raises InvalidArgument
    (PayloadTooLarge for a payload over ``max_payload_bytes``) before anything is sent."""
    new = item if isinstance(item, NewJob) else NewJob(item)
    payload = as_payload(new.payload)
    if len(payload) > max_payload_bytes:
        raise PayloadTooLarge(
            f"payload of {len(payload)} bytes is over this queue's max_payload_bytes ({max_payload_bytes}): "
            "store large data elsewhere (object storage) and enqueue its key"
        )
    priority = check_priority(new.priority)
    group = None if new.group is None else check_group(new.group)
    delay_ms = check_int(new.delay_ms, "delay_ms", 0, 2**40)
    key = key_arg(new, delay_ms)
    rate = rate_arg(new)
    if new.expires_ms is not None:
        check_int(new.expires_ms, "expires_ms", 1, 2**40)
        start_ms = new.debounce_ms if new.debounce_ms is not None else delay_ms
        if new.expires_ms <= start_ms:
            raise InvalidArgument(f"expires_ms ({new.expires_ms}) must be more than the job's delay or debounce window "
                                  f"({start_ms} ms): it could never start")
    # On a partitioned queue a keyed job lives in its key's partition, as a grouped one
    # in its group's (the key's state is kept there); a job with a flow key and a rate key
    # in different partitions is refused when it is sent (partitioned.enqueue_batch).
    flow_key = (new.sequence if new.sequence is not None else new.key) if key else None
    home = flow_key or new.rate_key or group
    return (
        check_job_id(new.job_id) if new.job_id is not None else new_id(home, partitions),
        payload,
        delay_ms,
        check_int(DEFAULT_MAX_ATTEMPTS if new.max_attempts is None else new.max_attempts, "max_attempts", 1, 10_000),
        priority or "",
        group or "",
        "" if new.expires_ms is None else new.expires_ms,
        "\n".join(part for part in (key, rate, task_arg(new.task)) if part),
    )


def task_arg(task: str | None) -> str:
    """A job's task name as enqueue.lua takes it ("task|<name>"; '' for none): a str of
    1..256 UTF-8 bytes without control characters, else InvalidArgument."""
    return "" if task is None else "task|" + check_key(task, "task")


def check_key(value: object, what: str = "key") -> str:
    """A debounce, throttle or sequence key: a str of 1..256 UTF-8 bytes without control
    characters; else InvalidArgument."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    raw = value.encode("utf-8")
    if not 1 <= len(raw) <= MAX_KEY_BYTES or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(f"{what} must be 1..{MAX_KEY_BYTES} bytes without control characters, got {value!r}")
    return value


def key_arg(new: NewJob, delay_ms: int) -> str:
    """A job's debounce, throttle or sequence key as enqueue.lua takes it ('' for none),
    or InvalidArgument for a key without a window, a window without a key, both windows,
    a delayed debounce, or a sequence with another key."""
    windows = [(mode, ms) for mode, ms in (("debounce", new.debounce_ms), ("throttle", new.throttle_ms)) if ms is not None]
    if new.on_failure not in ("block", "skip"):
        raise InvalidArgument(f"on_failure must be 'block' or 'skip' (what a sequence's dead head does), "
                              f"got {new.on_failure!r}")
    if new.sequence is not None:
        if windows or new.key is not None:
            raise InvalidArgument("a job of a sequence is not debounced or throttled too (one key per job)")
        return f"sequence|{new.on_failure}|{check_key(new.sequence, 'sequence')}"
    if new.on_failure != "block":
        raise InvalidArgument("on_failure is a sequence's: give sequence= too")
    if not windows:
        if new.key is not None:
            raise InvalidArgument("key needs debounce_ms or throttle_ms: what should the key do?")
        return ""
    if len(windows) > 1:
        raise InvalidArgument("a job is debounced or throttled, not both")
    mode, window_ms = windows[0]
    check_int(window_ms, f"{mode}_ms", 1, 2**40)
    if new.key is None:
        raise InvalidArgument(f"{mode}_ms needs a key: the jobs that share it are {mode}d together")
    check_key(new.key)
    if mode == "debounce" and delay_ms:
        raise InvalidArgument("a debounced job is due at the end of its window: give debounce_ms, not delay_ms")
    return f"{mode}|{window_ms}|{new.key}"


#: A duration's text: a whole number and a unit.
DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``90000ms``, ``60s``, ``5m``, ``1h`` or ``1d`` in milliseconds.

    Raises:
        InvalidArgument: another form.
    """
    match = DURATION.fullmatch(text.strip())
    if not match:
        raise InvalidArgument(f"an interval is a whole number with a unit ms, s, m, h or d (60s, 5m), got {text!r}")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def parse_rate(text: str, burst: int = 1) -> RateLimit:
    """``100/s``, ``5/m``, ``1/h``, ``20/500ms`` as a :class:`RateLimit` (the period a
    duration as :func:`parse_duration_ms` takes it, its number optional: ``s`` is ``1s``).

    Raises:
        InvalidArgument: another form, or a count, period or burst out of range.
    """
    count, sep, period = text.partition("/") if isinstance(text, str) else ("", "", "")
    if not sep or not count.isdigit() or int(count) == 0:
        raise InvalidArgument(f"a rate is COUNT/PERIOD (100/s, 5/m, 1/h, 20/500ms), got {text!r}")
    try:
        period_ms = parse_duration_ms(period if period[:1].isdigit() else "1" + period)
    except InvalidArgument:
        raise InvalidArgument(f"a rate is COUNT/PERIOD (100/s, 5/m, 1/h, 20/500ms), got {text!r}") from None
    return check_rate(RateLimit(int(count), period_ms, burst))


def check_rate(value: object, zero: bool = False) -> RateLimit:
    """A :class:`RateLimit` (or its text, :func:`parse_rate`) in the engine's ranges:
    count 1..1,000,000 (0 too with ``zero``: no limit), period_ms 1..86,400,000, burst
    1..1,000,000; else InvalidArgument."""
    rate = parse_rate(value) if isinstance(value, str) else value
    if not isinstance(rate, RateLimit):
        raise InvalidArgument(f"a rate limit is a RateLimit or its text (100/s, 5/m), got {type(value).__name__}")
    check_int(rate.count, "a rate limit's count", 0 if zero else 1, 1_000_000)
    check_int(rate.period_ms, "a rate limit's period_ms", 1, 86_400_000)
    check_int(rate.burst, "a rate limit's burst", 1, 1_000_000)
    return rate


def keys_of(value: str) -> list[str]:
    """The keys in a job's keys argument (:data:`JobTuple`'s last value): its flow key's
    and its rate key's, as they are given (not its task name)."""
    return [part.split("|", 2)[2] for part in value.split("\n") if not part.startswith("task|")] if value else []


def rate_arg(new: NewJob) -> str:
    """A job's rate key as enqueue.lua takes it ('' for none), or InvalidArgument for a
    rate key without a limit, a limit without a key, or a cost out of 1..burst (a job
    costing more than the burst could never pass)."""
    if new.rate_key is None:
        if new.rate_limit is not None:
            raise InvalidArgument("rate_limit needs a rate_key: the jobs that share it share the limit")
        if new.cost != 1:
            raise InvalidArgument("cost is a rate limit's: give rate_key and rate_limit too")
        return ""
    check_key(new.rate_key, "rate_key")
    if new.rate_limit is None:
        raise InvalidArgument("rate_key needs a rate_limit (100/m, RateLimit(...)): how fast may its jobs run?")
    rate = check_rate(new.rate_limit)
    check_int(new.cost, f"cost (at most the burst, {rate.burst}: more could never pass)", 1, rate.burst)
    return f"rate|{rate.count}/{rate.period_ms}/{rate.burst}/{new.cost}|{new.rate_key}"


def new_batch(
    jobs: Iterable[NewJob | bytes | str], max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, partitions: int = 1
) -> list[JobTuple]:
    """Validate 1..1000 jobs to enqueue in one call, their payloads together at most
    MAX_CALL_PAYLOAD_BYTES."""
    batch = [new_job(item, max_payload_bytes, partitions) for item in jobs]
    if not 1 <= len(batch) <= MAX_BATCH:
        raise InvalidArgument(f"1..{MAX_BATCH} jobs per call, got {len(batch)}")
    if len(batch) > 1 and sum(len(job[1]) for job in batch) > MAX_CALL_PAYLOAD_BYTES:
        raise PayloadTooLarge(f"the payloads of one enqueue_many call must total at most {MAX_CALL_PAYLOAD_BYTES} "
                              "bytes: send them in several calls")
    return batch


def ack_outcomes(reply: Any) -> list[Outcome]:
    """The outcomes of lua/ack.lua's (or ack_result.lua's) reply: one per receipt."""
    return [Outcome(text(status)) for status in reply]


def receipts_of(jobs: Iterable[Job]) -> list[str]:
    """The receipts of 1..1000 leased jobs (InvalidArgument for anything else)."""
    out = []
    for job in jobs:
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a Job from lease, got {type(job).__name__}")
        out.append(job.receipt)
    if not 1 <= len(out) <= MAX_BATCH:
        raise InvalidArgument(f"1..{MAX_BATCH} jobs per call, got {len(out)}")
    return out


def check_ids(ids: Iterable[str]) -> list[str]:
    """At most 1000 valid job ids (a str is refused: it would be taken as its characters)."""
    if isinstance(ids, (str, bytes)):
        raise InvalidArgument(f"ids must be a list of job ids, got the {type(ids).__name__} {ids!r}")
    checked = [check_job_id(i) for i in ids]
    if len(checked) > MAX_BATCH:
        raise InvalidArgument(f"at most {MAX_BATCH} ids per call, got {len(checked)}")
    return checked


def text(value: Any) -> str:
    """A reply element as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def partition_of(job_id: str, partitions: int) -> int:
    """The partition of a job of a queue with ``partitions`` partitions: CRC16 (XMODEM,
    the checksum Redis Cluster hashes keys with, which every cluster client has) of the
    id's UTF-8 bytes, modulo ``partitions``. lua/README.md documents it for other
    languages; they must compute the same."""
    return crc_hqx(job_id.encode("utf-8"), 0) % partitions  # crc_hqx(data, 0) is CRC16-XMODEM


def partition_name(name: str, partition: int, partitions: int) -> str:
    """The name of one partition, a queue of its own: ``<name>#<p>``, or ``name`` itself
    when there is one partition."""
    return name if partitions == 1 else f"{name}#{partition}"


# -- steps: what a plan asks its transport to do ---------------------------------------


class Keys(Protocol):
    """Anything that names a key by role: QueueKeys, ServiceKeys (hashable, immutable)."""

    def role(self, name: str) -> str: ...

    def __hash__(self) -> int: ...


@dataclass(frozen=True)
class ScriptCall:
    """Run ``lua/<script>.lua`` once with the keys its header lists (by role, from
    ``keys``) and ``args``. The reply is the script's raw reply."""

    script: str
    keys: Keys
    args: Sequence[Arg]


@dataclass(frozen=True)
class Pipelined:
    """Run one read-only or replay-safe script once per (keys, args), in one round trip
    per server. The reply is one raw reply *or exception instance* per call, in order."""

    script: str
    calls: Sequence[tuple[Keys, Sequence[Arg]]]


@dataclass(frozen=True)
class Commands:
    """Plain commands on the server holding ``key``, pipelined on one connection. The
    reply is the list of their replies."""

    key: str
    commands: Sequence[tuple[Arg, ...]]


Step = Union[ScriptCall, Pipelined, Commands]
#: A verb's plan: yields steps, receives their replies, returns the verb's result.
Plan = Generator[Step, Any, T]


def plan_each(plans: Iterable[Plan[T]]) -> Plan[list[T]]:
    """The plans run one after another; their results in order (a comprehension cannot
    ``yield from``)."""
    out = []
    for plan in plans:
        out.append((yield from plan))
    return out


@dataclass(frozen=True)
class Finished(Generic[T]):
    """What :func:`resume` returns when a plan has returned."""

    value: T


def resume(plan: Plan[T], reply: Any = None, error: PyQueueError | None = None) -> Step | Finished[T]:
    """Hand a plan the outcome of its last step (a reply, or an error raised at the
    step); return its next step, or what it returned."""
    try:
        return plan.throw(error) if error is not None else plan.send(reply)
    except StopIteration as stop:
        return Finished(stop.value)


def drive(execute: Callable[[Step], Any], plan: Plan[T]) -> T:
    """Run ``plan`` to its end with blocking I/O: ``execute`` runs one step (and raises
    pyqueue errors, mapped), each error is raised into the plan at the step."""
    step = resume(plan)
    while not isinstance(step, Finished):
        try:
            step = resume(plan, execute(step))
        except PyQueueError as exc:
            step = resume(plan, error=exc)
    return step.value


async def drive_async(execute: Callable[[Step], Awaitable[Any]], plan: Plan[T]) -> T:
    """Run ``plan`` to its end with asyncio, as :func:`drive` does."""
    step = resume(plan)
    while not isinstance(step, Finished):
        reply, error = None, None
        try:
            reply = await execute(step)
        except PyQueueError as exc:
            error = exc
        step = resume(plan, reply, error)
    return step.value


class SyncDriver:
    """A façade whose verbs return their results: it runs plans with blocking I/O."""

    _plans: Any

    def _execute(self, step: Step) -> Any:
        """Run one step; raise pyqueue errors (mapped)."""
        raise NotImplementedError


class AsyncDriver:
    """A façade whose verbs are coroutines: it runs plans with asyncio."""

    _plans: Any

    async def _execute(self, step: Step) -> Any:
        """Run one step; raise pyqueue errors (mapped)."""
        raise NotImplementedError


class Verb(Generic[P, T]):
    """A façade's verb, declared once from the plan function it runs (``enqueue =
    Verb(produce.enqueue)``, a plan over a spec and a memory): on a :class:`SyncDriver` it is a method returning the
    result, on an :class:`AsyncDriver` a coroutine method. It runs the plan of the same
    name of the object's plans (``_plans``: a single queue's or a partitioned queue's),
    through the object's transport (``_execute``), so the logic of a verb is written
    once for both drivers and both kinds of queue."""

    def __init__(self, plan: Callable[Concatenate[Any, Any, P], Plan[T]]) -> None:
        self.__doc__ = plan.__doc__
        # inspect.signature shows the plan's parameters after the spec and the memory.
        signature = inspect.signature(plan)
        self.__signature__ = signature.replace(parameters=list(signature.parameters.values())[2:])

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Verb[P, T]: ...

    @overload
    def __get__(self, obj: AsyncDriver, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, obj: SyncDriver, owner: type) -> Callable[P, T]: ...

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        plan = getattr(obj._plans, self.name)
        execute = obj._execute
        if isinstance(obj, AsyncDriver):

            async def verb_async(*args: Any, **kwargs: Any) -> Any:
                return await drive_async(execute, plan(*args, **kwargs))

            verb: Callable[..., Any] = verb_async
        else:

            def verb(*args: Any, **kwargs: Any) -> Any:
                return drive(execute, plan(*args, **kwargs))

        verb.__name__, verb.__doc__ = self.name, self.__doc__
        verb.__signature__ = self.__signature__  # type: ignore[attr-defined]
        # Cached on the instance (a Verb is a non-data descriptor, so the instance's
        # entry wins from now on): a verb call costs no descriptor work after the first.
        obj.__dict__[self.name] = verb
        return verb


# -- batching: group commit and coalesced enqueues -----------------------------------

M = TypeVar("M")


class Batching(Generic[M]):
    """Who sends the next call of a batching scheme, and with what (no I/O, no locks:
    the sync users hold a lock around it, the async ones run on one loop).

    Members join; the first to join while no call is in flight leads: it takes the
    waiting members (itself among them) and sends one call for them all. Members that
    join while that call is in flight wait; when it ends, the first of them leads the
    next call. So a lone member is sent at once, and a burst shares calls."""

    def __init__(self) -> None:
        self.waiting: list[M] = []
        self.in_flight = False
        #: Batches taken so far, and the members they carried.
        self.calls = self.items = 0

    def join(self, member: M) -> bool:
        """Add ``member``; whether it leads (sends now) rather than waits."""
        self.waiting.append(member)
        lead = not self.in_flight
        self.in_flight = True
        return lead

    def take(self, weigh: Callable[[M], int], limit: int) -> list[M]:
        """The leader's batch: waiting members in order, while their weights sum to at
        most ``limit`` (always at least one)."""
        total, count = 0, 0
        for member in self.waiting:
            total += weigh(member)
            if count and total > limit:
                break
            count += 1
        batch, self.waiting = self.waiting[:count], self.waiting[count:]
        self.calls, self.items = self.calls + 1, self.items + count
        return batch

    def hand_over(self) -> M | None:
        """After a call: the member that leads the next one, or None (idle again)."""
        if self.waiting:
            return self.waiting[0]
        self.in_flight = False
        return None


def enqueue_size(step: ScriptCall) -> int:
    """How many jobs an enqueue call carries."""
    return int(step.args[1])


def enqueue_weight(step: ScriptCall) -> int:
    """What an enqueue call weighs when enqueues are coalesced: one unit per job, plus
    one per _PAYLOAD_UNIT bytes of their payloads, so that a coalesced call of at most
    MAX_BATCH units carries at most MAX_BATCH jobs and MAX_CALL_PAYLOAD_BYTES."""
    payload_bytes = sum(len(payload) for payload in step.args[3::8] if isinstance(payload, bytes))
    return int(step.args[1]) + payload_bytes // _PAYLOAD_UNIT


def coalescable(step: Step) -> TypeGuard[ScriptCall]:
    """Whether a step may share its call with others: an enqueue on the server clock."""
    return isinstance(step, ScriptCall) and step.script == "enqueue" and step.args[0] == ""


def merge_enqueues(steps: Sequence[ScriptCall]) -> ScriptCall:
    """One enqueue call carrying the jobs of ``steps`` (same keys, server clock), in
    order: what each would have done alone, done in one script run. A job whose id an
    earlier step of the batch used is a duplicate, as it would be sent after it."""
    if len(steps) == 1:
        return steps[0]
    args: list[Arg] = ["", sum(enqueue_size(s) for s in steps)]
    for step in steps:
        args += step.args[2:]
    return ScriptCall("enqueue", steps[0].keys, args)


def split_enqueue_reply(reply: Sequence[Any], steps: Sequence[ScriptCall]) -> list[Any]:
    """Each step's own reply ``{added, duplicates, flags...}`` from a merged call's."""
    if len(steps) == 1:
        return [reply]
    out: list[Any] = []
    at = 2
    for step in steps:
        flags = list(reply[at : at + enqueue_size(step)])
        at += len(flags)
        # A flag is 1 (added), 0 (a duplicate) or the id of the job a key gave it to.
        added = sum(1 for f in flags if f == 1)
        out.append([added, sum(1 for f in flags if f == 0), *flags])
    return out


# -- the script ABI: one builder per lua/*.lua, ARGV in header order ------------------


def now_arg(now_ms: int | None) -> Arg:
    """'' tells a script to read the server clock; an explicit time is for tests only."""
    return "" if now_ms is None else now_ms


def enqueue_call(keys: Keys, now_ms: int | None, jobs: Sequence[JobTuple]) -> ScriptCall:
    """lua/enqueue.lua. ``jobs``: :data:`JobTuple` s."""
    args: list[Arg] = [now_arg(now_ms), len(jobs)]
    for job in jobs:
        args += job
    return ScriptCall("enqueue", keys, args)


def lease_call(
    keys: Keys,
    now_ms: int | None,
    owner: str,
    call: str,
    count: int,
    lease_ms: int,
    limit: int,
    keep_done_ms: int,
    ack_receipts: Sequence[str] = (),
) -> ScriptCall:
    """lua/lease.lua."""
    args: list[Arg] = [now_arg(now_ms), owner, call, count, lease_ms, limit, keep_done_ms, *ack_receipts]
    return ScriptCall("lease", keys, args)


def ack_call(keys: Keys, now_ms: int | None, keep_done_ms: int, receipts: Sequence[str]) -> ScriptCall:
    """lua/ack.lua."""
    return ScriptCall("ack", keys, [now_arg(now_ms), keep_done_ms, *receipts])


def ack_result_call(
    keys: Keys, now_ms: int | None, keep_done_ms: int, result_ttl_ms: int, max_results: int,
    pairs: Sequence[tuple[str, bytes]],
) -> ScriptCall:
    """lua/ack_result.lua: ``pairs`` of (receipt, encoded result)."""
    args: list[Arg] = [now_arg(now_ms), keep_done_ms, result_ttl_ms, max_results]
    for receipt, value in pairs:
        args += [receipt, value]
    return ScriptCall("ack_result", keys, args)


def result_call(keys: Keys, now_ms: int | None, job_id: str) -> ScriptCall:
    """lua/result.lua."""
    return ScriptCall("result", keys, [now_arg(now_ms), job_id])


def encode_result(value: object) -> bytes:
    """A handler's return value as lua/ack_result.lua stores it: one kind byte, then
    ``b`` + the bytes, ``s`` + UTF-8 text, or ``j`` + JSON (anything else JSON-able;
    None is ``j`` + ``null``). Other languages read and write the same encoding.

    Raises:
        InvalidArgument: not bytes, str or JSON-able, or over MAX_RESULT_BYTES encoded.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        encoded = b"b" + bytes(value)
    elif isinstance(value, str):
        encoded = b"s" + value.encode("utf-8")
    else:
        try:
            encoded = b"j" + json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"a result must be bytes, str or JSON-able: {exc}") from None
    if len(encoded) > MAX_RESULT_BYTES:
        raise InvalidArgument(f"a result may hold at most {MAX_RESULT_BYTES} bytes encoded, got {len(encoded)}")
    return encoded


def decode_result(encoded: bytes) -> object:
    """The value :func:`encode_result` encoded.

    Raises:
        CorruptRecord: an unknown kind byte, or text or JSON that does not parse.
    """
    kind, body = encoded[:1], encoded[1:]
    try:
        if kind == b"b":
            return body
        if kind == b"s":
            return body.decode("utf-8")
        if kind == b"j":
            return json.loads(body)
    except ValueError as exc:
        raise CorruptRecord(f"a stored result does not parse: {exc}") from None
    raise CorruptRecord(f"a stored result has an unknown kind {kind!r}")


def nack_call(
    keys: Keys,
    now_ms: int | None,
    receipt: str,
    error: bytes,
    delay_ms: int | None,
    base_ms: int,
    cap_ms: int,
    final: bool = False,
) -> ScriptCall:
    """lua/nack.lua. ``final``: ARGV 7 ``1``, the job goes to DEAD now, whatever its
    attempt (``0``: only at max_attempts)."""
    delay: Arg = "" if delay_ms is None else delay_ms
    return ScriptCall("nack", keys, [now_arg(now_ms), receipt, error, delay, base_ms, cap_ms, int(final)])


def extend_call(keys: Keys, now_ms: int | None, lease_ms: int, receipts: Sequence[str]) -> ScriptCall:
    """lua/extend.lua."""
    return ScriptCall("extend", keys, [now_arg(now_ms), lease_ms, *receipts])


def release_call(keys: Keys, now_ms: int | None, receipts: Sequence[str]) -> ScriptCall:
    """lua/release.lua."""
    return ScriptCall("release", keys, [now_arg(now_ms), *receipts])


def promote_call(keys: Keys, now_ms: int | None, limit: int) -> ScriptCall:
    """lua/promote.lua."""
    return ScriptCall("promote", keys, [now_arg(now_ms), limit])


def stats_call(keys: Keys, now_ms: int | None) -> ScriptCall:
    """lua/stats.lua."""
    return ScriptCall("stats", keys, [now_arg(now_ms)])


def peek_call(keys: Keys, now_ms: int | None) -> ScriptCall:
    """lua/peek.lua."""
    return ScriptCall("peek", keys, [now_arg(now_ms)])


def get_call(keys: Keys, now_ms: int | None, job_id: str, with_payload: bool) -> ScriptCall:
    """lua/get.lua."""
    return ScriptCall("get", keys, [now_arg(now_ms), job_id, int(with_payload)])


def sequence_skip_call(keys: Keys, now_ms: int | None, key: str) -> ScriptCall:
    """lua/sequence_skip.lua."""
    return ScriptCall("sequence_skip", keys, [now_arg(now_ms), key])


def cancel_call(keys: Keys, now_ms: int | None, job_id: str, keep_done_ms: int) -> ScriptCall:
    """lua/cancel.lua."""
    return ScriptCall("cancel", keys, [now_arg(now_ms), job_id, keep_done_ms])


def set_budget_call(keys: Keys, max_bytes: int) -> ScriptCall:
    """lua/set_budget.lua."""
    return ScriptCall("set_budget", keys, [max_bytes])


def set_result_budget_call(keys: Keys, max_bytes: int) -> ScriptCall:
    """lua/set_result_budget.lua."""
    return ScriptCall("set_result_budget", keys, [max_bytes])


def set_tombstone_limit_call(keys: Keys, max_count: int) -> ScriptCall:
    """lua/set_tombstone_limit.lua."""
    return ScriptCall("set_tombstone_limit", keys, [max_count])


def set_indexes_call(keys: Keys, now_ms: int | None, on: bool) -> ScriptCall:
    """lua/set_indexes.lua."""
    return ScriptCall("set_indexes", keys, [now_arg(now_ms), 1 if on else 0])


def search_call(keys: Keys, now_ms: int | None, state: str, task: str, group: str, error: str,
                since_ms: int | None, until_ms: int | None, cursor: str, count: int) -> ScriptCall:
    """lua/search.lua."""
    return ScriptCall("search", keys, [now_arg(now_ms), state, task, group, error,
                                       "" if since_ms is None else since_ms, "" if until_ms is None else until_ms,
                                       cursor, count])


def promote_now_call(keys: Keys, now_ms: int | None, ids: Sequence[str]) -> ScriptCall:
    """lua/promote_now.lua."""
    return ScriptCall("promote_now", keys, [now_arg(now_ms), *ids])


def set_rate_limit_call(keys: Keys, key: str, limit: str) -> ScriptCall:
    """lua/set_rate_limit.lua. ``limit``: '' or "<count>/<period_ms>/<burst>"."""
    return ScriptCall("set_rate_limit", keys, [key, limit])


def defer_key_call(keys: Keys, now_ms: int | None, receipt: str, for_ms: int) -> ScriptCall:
    """lua/defer_key.lua."""
    return ScriptCall("defer_key", keys, [now_arg(now_ms), receipt, for_ms])


def limit_call(keys: Keys, count: int, period_ms: int, burst: int) -> ScriptCall:
    """lua/limit.lua."""
    return ScriptCall("limit", keys, [count, period_ms, burst])


def flow_wait_call(
    keys: Keys, now_ms: int | None, job: JobTuple, check_ms: int, waits_for: Sequence[tuple[str, str]]
) -> ScriptCall:
    """lua/flow_wait.lua. ``job``: a :data:`JobTuple` (its delay is not sent: a waiting
    job is due when its wait is over); ``waits_for``: (queue, job id) pairs."""
    job_id, payload, _delay, max_attempts, priority, group, expires_ms, key = job
    # The task name (its "task|" line) lists the job in the indexes, as enqueue's does.
    lines = [part for part in key.split("\n") if part]
    task = "\n".join(part for part in lines if part.startswith("task|"))
    if expires_ms != "" or len(lines) > (1 if task else 0):
        # flow_wait.lua takes neither: refused rather than dropped without a word.
        raise InvalidArgument(f"job {job_id!r} waits for other jobs: it cannot have an expiry, a debounce or a "
                              "throttle (give them to the first step of a flow)")
    refs = [f"{queue}\t{ref}" for queue, ref in waits_for]
    return ScriptCall("flow_wait", keys,
                      [now_arg(now_ms), job_id, payload, max_attempts, priority, group, check_ms, task, *refs])


def flow_done_call(
    keys: Keys, now_ms: int | None, job_id: str, policy: str, check_ms: int, ended: Sequence[tuple[str, str, str]]
) -> ScriptCall:
    """lua/flow_done.lua. ``ended``: (queue, job id, 'ok' or 'failed') of jobs that
    ``job_id`` waits for."""
    args: list[Arg] = [now_arg(now_ms), job_id, policy, check_ms]
    for queue, ref, how in ended:
        args += [f"{queue}\t{ref}", how]
    return ScriptCall("flow_done", keys, args)


def flow_record_call(keys: Keys, now_ms: int | None, flow_id: str, record: bytes, keep_ms: int) -> ScriptCall:
    """lua/flow_record.lua."""
    return ScriptCall("flow_record", keys, [now_arg(now_ms), flow_id, record, keep_ms])


def flow_show_call(keys: Keys, now_ms: int | None, flow_id: str) -> ScriptCall:
    """lua/flow_show.lua."""
    return ScriptCall("flow_show", keys, [now_arg(now_ms), flow_id])


def progress_call(keys: Keys, now_ms: int | None, receipt: str, value: bytes) -> ScriptCall:
    """lua/progress.lua."""
    return ScriptCall("progress", keys, [now_arg(now_ms), receipt, value])


def step_call(keys: Keys, now_ms: int | None, receipt: str, lease_ms: int, name: str, value: bytes) -> ScriptCall:
    """lua/step.lua."""
    return ScriptCall("step", keys, [now_arg(now_ms), receipt, lease_ms, name, value])


def park_call(keys: Keys, now_ms: int | None, receipt: str, kind: str, name: str, for_ms: int, lease_ms: int) -> ScriptCall:
    """lua/park.lua."""
    return ScriptCall("park", keys, [now_arg(now_ms), receipt, kind, name, for_ms, lease_ms])


def signal_call(keys: Keys, now_ms: int | None, job_id: str, name: str, payload: bytes) -> ScriptCall:
    """lua/signal.lua."""
    return ScriptCall("signal", keys, [now_arg(now_ms), job_id, name, payload])


def steps_call(keys: Keys, now_ms: int | None, job_id: str) -> ScriptCall:
    """lua/steps.lua."""
    return ScriptCall("steps", keys, [now_arg(now_ms), job_id])


def progress_show_call(keys: Keys, ids: Sequence[str]) -> ScriptCall:
    """lua/progress_show.lua."""
    return ScriptCall("progress_show", keys, list(ids))


def set_events_call(keys: Keys, bound: int) -> ScriptCall:
    """lua/set_events.lua."""
    return ScriptCall("set_events", keys, [bound])


def browse_call(keys: Keys, now_ms: int | None, state: str, start: int, count: int) -> ScriptCall:
    """lua/browse.lua."""
    return ScriptCall("browse", keys, [now_arg(now_ms), state, start, count])


def groups_call(keys: Keys, offset: int, limit: int) -> ScriptCall:
    """lua/groups.lua."""
    return ScriptCall("groups", keys, [offset, limit])


def set_group_limit_call(keys: Keys, group: str, cap: int | str) -> ScriptCall:
    """lua/set_group_limit.lua: ``group`` '' is the default cap; ``cap`` '' deletes a
    group's own cap."""
    return ScriptCall("set_group_limit", keys, [group, cap])


def pause_call(keys: Keys, now_ms: int | None) -> ScriptCall:
    """lua/pause.lua."""
    return ScriptCall("pause", keys, [now_arg(now_ms)])


def resume_call(keys: Keys, now_ms: int | None) -> ScriptCall:
    """lua/resume.lua."""
    return ScriptCall("resume", keys, [now_arg(now_ms)])


def dead_list_call(keys: Keys, offset: int, limit: int) -> ScriptCall:
    """lua/dead_list.lua."""
    return ScriptCall("dead_list", keys, [offset, limit])


def dead_replay_call(keys: Keys, now_ms: int | None, ids: Sequence[str]) -> ScriptCall:
    """lua/dead_replay.lua."""
    return ScriptCall("dead_replay", keys, [now_arg(now_ms), *ids])


def dead_purge_call(keys: Keys, ids: Sequence[str]) -> ScriptCall:
    """lua/dead_purge.lua."""
    return ScriptCall("dead_purge", keys, list(ids))


def scrub_call(keys: Keys, now_ms: int | None, owner: str, limit: int) -> ScriptCall:
    """lua/scrub.lua."""
    return ScriptCall("scrub", keys, [now_arg(now_ms), owner, limit])


class ServiceKeyset(Keys, Protocol):
    """The keys of one service (:class:`pyqueue.protocol.keys.ServiceKeys`): also its id."""

    @property
    def id(self) -> int | None: ...


def service_register_call(
    keys: ServiceKeyset,
    now_ms: int | None,
    host: str,
    pid: int,
    queues: str,
    expire_ms: int,
    capacity: int,
    gc_limit: int,
    renewal: str,
    registration: str,
    tasks: str = "",
) -> ScriptCall:
    """lua/service_register.lua; ``keys.id`` is the id the caller expects. ``tasks``:
    the task names the service runs, comma-separated (ARGV 11; '' for none)."""
    args: list[Arg] = [
        now_arg(now_ms), keys.id or 0, host, pid, queues, expire_ms, capacity, gc_limit, renewal, registration, tasks
    ]
    return ScriptCall("service_register", keys, args)


def service_renew_call(
    keys: ServiceKeyset, now_ms: int | None, renewal: str, next_renewal: str, expire_ms: int, limit: int,
    running: str | None = None,
) -> ScriptCall:
    """lua/service_renew.lua; ``running`` (ARGV 7) only when given."""
    args: list[Arg] = [now_arg(now_ms), keys.id or 0, renewal, next_renewal, expire_ms, limit]
    return ScriptCall("service_renew", keys, args if running is None else [*args, running])


def service_deregister_call(
    keys: ServiceKeyset, now_ms: int | None, require_expired: bool, registration: str
) -> ScriptCall:
    """lua/service_deregister.lua."""
    return ScriptCall("service_deregister", keys, [now_arg(now_ms), keys.id or 0, int(require_expired), registration])


def service_stop_call(keys: ServiceKeyset, now_ms: int | None, registration: str) -> ScriptCall:
    """lua/service_stop.lua."""
    return ScriptCall("service_stop", keys, [now_arg(now_ms), keys.id or 0, registration])
