"""A task's policy: its options, how they travel in the envelope, and what the worker
decides with them (retry after how long, or fail at once).

Durations here are seconds (int or float) or a ``timedelta``, as in asyncio, Celery and
arq; the engine below takes milliseconds (``_ms``).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any, TypedDict

from pyqueue.protocol.core import check_group, check_job_id, check_key, check_priority, check_rate
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import RateLimit
from pyqueue.worker.endings import seconds_to_ms
from pyqueue.worker.slots import DEFAULT_TIME_LIMIT_GRACE_S

Duration = float | timedelta
#: A job id from the call's arguments, or True for a hash of the task and its arguments.
Unique = Callable[..., str] | bool
#: ``retry_on`` / ``fail_on``: an exception class, or a tuple or list of them.
ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...] | list[type[BaseException]]


@dataclass(frozen=True)
class Backoff:
    """How long to wait before a retry, by attempt (1 = the first failure).

    ``Backoff.fixed(5)``; ``Backoff.exponential(base=1, cap=3600)`` (base * 2^(attempt-1),
    capped, with full jitter in its upper half, as the engine's own); or a function of
    the attempt returning seconds (``backoff=lambda attempt: 10 * attempt``): a
    module-level function, so a per-send override can name it in the envelope.
    """

    kind: str  # "fixed" | "exponential" | "function"
    base_ms: int = 0
    cap_ms: int = 0
    function: Callable[[int], Duration] | None = None

    @staticmethod
    def fixed(delay: Duration) -> Backoff:
        return Backoff("fixed", base_ms=seconds_to_ms(delay, "backoff"))

    @staticmethod
    def exponential(base: Duration = 1, cap: Duration = 3600) -> Backoff:
        base_ms, cap_ms = seconds_to_ms(base, "backoff base"), seconds_to_ms(cap, "backoff cap")
        if base_ms < 1 or cap_ms < base_ms:
            raise InvalidArgument("exponential backoff needs 0 < base <= cap")
        return Backoff("exponential", base_ms=base_ms, cap_ms=cap_ms)

    @staticmethod
    def of(value: object) -> Backoff | None:
        """A task's ``backoff=`` option: None (the worker's default), a number of seconds
        or a timedelta (fixed), a :class:`Backoff`, or a function of the attempt."""
        if value is None or isinstance(value, Backoff):
            return value
        if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
            return Backoff.fixed(value)
        if callable(value):
            return Backoff("function", function=value)
        raise InvalidArgument(f"backoff must be seconds, a timedelta, a Backoff or a function of the attempt, got {value!r}")

    def delay_ms(self, attempt: int) -> int:
        if self.kind == "fixed":
            return self.base_ms
        if self.kind == "exponential":
            d: int = min(self.cap_ms, self.base_ms * 2 ** min(attempt - 1, 60))
            return d // 2 + random.randrange(d // 2 + 1)
        assert self.function is not None
        return seconds_to_ms(self.function(attempt), "the backoff function's delay")

    def to_json(self) -> Any:
        if self.kind == "function":
            return {"function": qualified_name(self.function, "a backoff function")}
        return {self.kind: [self.base_ms, self.cap_ms]}

    @staticmethod
    def from_json(value: Any, functions: Mapping[str, Callable[[int], Duration]]) -> Backoff:
        """A per-send backoff from an envelope. A function is looked up by name among
        ``functions`` (the backoff functions the worker's tasks register): a payload
        never names arbitrary code to call."""
        ((kind, arg),) = value.items()
        if kind == "function":
            function = functions.get(arg)
            if function is None:
                raise ValueError(f"backoff function {arg!r} is not the backoff of any task of this worker")
            return Backoff("function", function=function)
        if kind not in ("fixed", "exponential"):
            raise ValueError(f"unknown backoff {kind!r}")
        return Backoff(kind, base_ms=int(arg[0]), cap_ms=int(arg[1]))


class TaskOptionsDict(TypedDict, total=False):
    """A task's options as keywords, one home for their names and types: the options of
    ``@tasks.task(...)``, of ``Tasks(...)`` (the defaults of every task registered on
    it) and of ``fn.options(...)`` (one send's, which also takes ``job_id``:
    :class:`SendOptionsDict`). Those take ``**options: Unpack[TaskOptionsDict]``, so a
    type checker refuses a misspelt option or a value of the wrong type;
    :meth:`TaskOptions.build` checks them again at run time (``InvalidArgument``), for
    the options a type checker does not see (a dict passed with ``**``).

    Durations are seconds (int or float) or a ``timedelta``; None, where a key takes
    it, is "not set" (the worker's or the engine's default), as in :class:`TaskOptions`.
    """

    #: The queue its jobs go to (a non-empty str); not set: ``Tasks(default_queue=)``.
    queue: str
    #: Runs in all, the first included (1..10,000); None: the engine's default (5).
    max_attempts: int | None
    #: The delay before a retry: seconds or a timedelta (fixed), a :class:`Backoff`, or
    #: a function of the attempt (1 = the first failure) giving seconds (module-level
    #: for a per-send one, which the envelope names); None: the worker's backoff.
    backoff: Backoff | Duration | Callable[[int], Duration] | None
    #: Only these exceptions retry, any other is dead at once; None: every Exception retries.
    retry_on: ExceptionTypes | None
    #: These exceptions are dead at once, whatever ``retry_on`` says (None: none).
    fail_on: ExceptionTypes | None
    #: A job older than this (from when it was due) when leased is dead without running.
    max_age: Duration | None
    #: How long a run may take (at least 1 ms): at the limit it gets TimeLimitExceeded;
    #: caught and returned from, the job is acked; let through, it is retried or dead.
    time_limit: Duration | None
    #: How long the run may go on after its time limit before it is stopped for good,
    #: its job ended as TimeLimitExceeded whatever it does (default 5 s; 0: at once).
    time_limit_grace: Duration | None
    #: True: the job id is a hash of the task and its arguments; a function of the
    #: arguments (by name, defaults included) giving the job id; False or None: a
    #: random id. A second send under an id that exists is a duplicate (``added`` false).
    unique: Unique | None
    #: Keep the return value this long for ``sent.result()`` (at least 1 ms); None: not kept.
    keep_result: Duration | None
    #: The priority level, -5..5: a higher level is leased sooner.
    priority: int
    #: The fair-scheduling group: a str, or a function of the arguments (by name,
    #: defaults included) giving one or None; None: no group.
    group: str | Callable[..., str | None] | None
    #: Not started within this long of the send: the job ends ``expired``, never run
    #: and never retried (unlike ``max_age``, which makes it a failure: dead).
    expires: Duration | None
    #: With ``key``: run once, this long after the key's last send, with the last
    #: send's arguments; sends while it runs make one more run.
    debounce: Duration | None
    #: With ``key``: at most one job per key per window; later sends in the window
    #: add nothing (``sent.added`` false, ``sent.id`` the window's job).
    throttle: Duration | None
    #: The key of ``debounce`` or ``throttle``: a str, or a function of the arguments
    #: (by name, defaults included) giving one, or None (that send is not keyed).
    key: str | Callable[..., str | None] | None
    #: The sequence key: the jobs sent with one key run one at a time, in send order (a
    #: dead one stops the key until replayed, purged or skipped: ``pyqueue sequence
    #: skip``). A str, or a function of the arguments giving one, or None (not in one).
    sequence: str | Callable[..., str | None] | None
    #: With ``sequence``: what a dead job of the key does: "block" (the default: the key
    #: waits until it is replayed and succeeds, purged, or skipped) or "skip" (the next runs).
    on_failure: str
    #: At most this many runs per period for each rate key, across all workers: "100/m",
    #: "5/s", "20/500ms" (evenly spaced), or a :class:`pyqueue.RateLimit` (with a burst).
    #: A job over its key's limit waits, scheduled at its permit's time, without holding
    #: a worker or using an attempt; other keys' jobs run meanwhile.
    rate_limit: RateLimit | str | None
    #: The key the limit is counted per (a tenant, an API key): a str, or a function of
    #: the arguments giving one, or None from the function (that send is not limited).
    #: Default: the task's name (one limit for the whole task).
    rate_key: str | Callable[..., str | None] | None
    #: The permits one run takes (1..the limit's burst): an int, or a function of the
    #: arguments giving one (``cost=lambda rows, **_: len(rows)``). Default 1.
    cost: int | Callable[..., int]


class SendOptionsDict(TaskOptionsDict, total=False):
    """The options of ``fn.options(...)``: a task's options (:class:`TaskOptionsDict`)
    and the job id of the sends made through it."""

    #: The job id (1..256 UTF-8 bytes, no control characters), in place of ``unique``'s
    #: or a random one: a send under an id whose job exists (or whose tombstone lasts,
    #: ``keep_done_ms``) adds nothing and its handle names that job (``added`` false).
    job_id: str


def qualified_name(obj: object, what: str) -> str:
    """``module:qualname`` of a module-level function or class, checked to resolve."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or "<" in qualname:
        raise InvalidArgument(f"{what} set for one send must be importable (a module-level name), got {obj!r}")
    return f"{module}:{qualname}"


def resolve_exception(name: str) -> type[BaseException]:
    """The exception class a ``module:qualname`` of a per-send ``retry_on``/``fail_on``
    names, found among the modules this process has imported already: a payload never
    makes a worker import a module, and what it names must be an exception class.

    Raises:
        ValueError: the module is not imported, the name is missing, or not an exception.
    """
    module, _, qualname = name.partition(":")
    target: Any = sys.modules.get(module)
    if target is None:
        raise ValueError(f"{name}: module {module!r} is not imported by this worker")
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not (isinstance(target, type) and issubclass(target, BaseException)):
        raise ValueError(f"{name} is not an exception class of this worker")
    return target


def exception_types(value: object, name: str) -> tuple[type[BaseException], ...]:
    """``retry_on`` / ``fail_on``: an exception class or a tuple of them."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidArgument(f"{name} takes exception classes, got {item!r}")
    return tuple(items)


#: The options that act when sending (the job's queue, record and id), not in the envelope.
_SEND_TIME = frozenset(("queue", "max_attempts", "unique", "priority", "group", "job_id", "expires_ms", "debounce_ms",
                        "throttle_ms", "key", "sequence", "on_failure", "rate_limit", "rate_key", "cost"))


@dataclass(frozen=True)
class TaskOptions:
    """A task's policy. None means "not set": the worker's or the engine's default."""

    queue: str = "default"
    #: Runs in all (the engine's max_attempts); None: the engine's default (5... see Queue).
    max_attempts: int | None = None
    backoff: Backoff | None = None
    #: Only these exceptions retry (others fail at once); None: every Exception retries.
    retry_on: tuple[type[BaseException], ...] | None = None
    #: These exceptions fail at once, whatever retry_on says.
    fail_on: tuple[type[BaseException], ...] = ()
    #: Not run when older than this (ms since it was sent): dead with a clear error.
    max_age_ms: int | None = None
    time_limit_ms: int | None = None
    #: After time_limit, how long the run may go on before it is stopped for good; None:
    #: the worker's default (pyqueue.worker.slots.DEFAULT_TIME_LIMIT_GRACE_S).
    time_limit_grace_ms: int | None = None
    unique: Unique | None = None
    #: Keep the return value as the job's result for this long; None: no result kept.
    keep_result_ms: int | None = None
    #: The job's priority level, -5..5 (Queue.enqueue): a higher level is leased sooner.
    priority: int = 0
    #: The job's group for fair scheduling (Queue.enqueue): a str, or a function of the
    #: task's arguments giving it (or None: no group); None: no group. A function (here
    #: and for ``unique``) gets the arguments by name, defaults included
    #: (:meth:`pyqueue.tasks.task.Signature.call_by_name`).
    group: str | Callable[..., str | None] | None = None
    #: Flow control (``Queue.enqueue``): the job's expiry, and its debounce or throttle
    #: window with the key (a str, or a function of the arguments like ``group``).
    expires_ms: int | None = None
    debounce_ms: int | None = None
    throttle_ms: int | None = None
    key: str | Callable[..., str | None] | None = None
    #: The job's sequence key (``Queue.enqueue(sequence=)``): a str, or a function of the
    #: arguments like ``group``.
    sequence: str | Callable[..., str | None] | None = None
    #: What the sequence's dead job does: "block" or "skip" (``Queue.enqueue(on_failure=)``).
    on_failure: str = "block"
    #: A keyed rate limit (``Queue.enqueue(rate_key=, rate_limit=, cost=)``): the limit,
    #: its key (a str or a function of the arguments like ``group``; None: the task's
    #: name) and each run's cost (an int or such a function).
    rate_limit: RateLimit | None = None
    rate_key: str | Callable[..., str | None] | None = None
    cost: int | Callable[..., int] = 1
    #: The job id of one send (``fn.options(job_id=...)``), in place of ``unique``'s or
    #: a random one; None: those. Never a task's own option, nor a ``Tasks`` default.
    job_id: str | None = None

    @staticmethod
    def build(base: TaskOptions | None = None, **given: Any) -> TaskOptions:
        """Options from a task's or a send's keyword arguments (the keys of
        :class:`SendOptionsDict`; seconds or timedelta for durations), on top of
        ``base``. (``job_id`` is one send's: :func:`task_options` refuses it as a task's
        option or a default before calling this.)

        Raises:
            InvalidArgument: an unknown option, or a value of the wrong kind.
        """
        out: dict[str, Any] = {}
        for key, value in given.items():
            if key == "queue":
                if not isinstance(value, str) or not value:
                    raise InvalidArgument(f"queue must be a queue name, got {value!r}")
                out["queue"] = value
            elif key == "max_attempts":
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000):
                    raise InvalidArgument(f"max_attempts must be an int in [1, 10000], got {value!r}")
                out["max_attempts"] = value
            elif key == "backoff":
                out["backoff"] = Backoff.of(value)
            elif key == "retry_on":
                out["retry_on"] = None if value is None else exception_types(value, "retry_on")
            elif key == "fail_on":
                out["fail_on"] = exception_types(value or (), "fail_on")
            elif key in ("max_age", "time_limit", "time_limit_grace", "keep_result", "expires", "debounce", "throttle"):
                ms = None if value is None else seconds_to_ms(value, key)
                if key in ("time_limit", "keep_result", "expires", "debounce", "throttle") and ms is not None and ms < 1:
                    raise InvalidArgument(f"{key} must be at least 1 ms, got {value!r}")
                out[f"{key}_ms"] = ms
            elif key == "unique":
                if value is not None and type(value) is not bool and not callable(value):
                    raise InvalidArgument(
                        f"unique must be a function of the arguments giving the job id, True, or False/None (a random id), "
                        f"got {value!r}"
                    )
                out["unique"] = None if value is False else value
            elif key == "priority":
                out["priority"] = check_priority(value)
            elif key == "group":
                if value is not None and not callable(value):
                    check_group(value)
                out["group"] = value
            elif key in ("key", "sequence"):
                if value is not None and not callable(value) and not isinstance(value, str):
                    raise InvalidArgument(f"{key} must be a str or a function of the arguments giving one, got {value!r}")
                out[key] = value
            elif key == "rate_limit":
                out["rate_limit"] = None if value is None else check_rate(value)
            elif key == "rate_key":
                if value is not None and not callable(value):
                    check_key(value, "rate_key")
                out["rate_key"] = value
            elif key == "cost":
                if not callable(value) and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                    raise InvalidArgument(f"cost must be an int >= 1 or a function of the arguments giving one, "
                                          f"got {value!r}")
                out["cost"] = value
            elif key == "on_failure":
                if value not in ("block", "skip"):
                    raise InvalidArgument(f"on_failure must be 'block' or 'skip' (what a sequence's dead job does), "
                                          f"got {value!r}")
                out["on_failure"] = value
            elif key == "job_id":
                out["job_id"] = None if value is None else check_job_id(value)
            else:
                raise InvalidArgument(f"unknown task option {key!r}; known: {', '.join(SendOptionsDict.__annotations__)}")
        built = replace(base or TaskOptions(), **out)
        if built.debounce_ms is not None and built.throttle_ms is not None:
            raise InvalidArgument("a task is debounced or throttled, not both")
        if (built.debounce_ms is not None or built.throttle_ms is not None) and built.key is None:
            raise InvalidArgument("debounce and throttle need key=: a str, or a function of the arguments giving one")
        if built.sequence is not None and (built.debounce_ms is not None or built.throttle_ms is not None):
            raise InvalidArgument("a task in a sequence is not debounced or throttled too (one key per job)")
        if built.on_failure != "block" and built.sequence is None:
            raise InvalidArgument("on_failure is a sequence's: give sequence= too")
        if built.rate_limit is None and (built.rate_key is not None or built.cost != 1):
            raise InvalidArgument("rate_key and cost are a rate limit's: give rate_limit= too (\"100/m\")")
        if built.rate_limit is not None and isinstance(built.cost, int) and built.cost > built.rate_limit.burst:
            raise InvalidArgument(f"cost {built.cost} is over the rate limit's burst ({built.rate_limit.burst}): "
                                  "such a run could never start")
        return built

    @property
    def time_limit_grace_s(self) -> float:
        """The grace after the time limit, in seconds (the worker's default when not set)."""
        return DEFAULT_TIME_LIMIT_GRACE_S if self.time_limit_grace_ms is None else self.time_limit_grace_ms / 1000

    def fails_at_once(self, error: BaseException) -> bool:
        """Whether ``error`` sends the job to the dead letters now instead of retrying."""
        if self.fail_on and isinstance(error, self.fail_on):
            return True
        return self.retry_on is not None and not isinstance(error, self.retry_on)

    def retry_delay_ms(self, attempt: int) -> int | None:
        """The delay before the retry after failed ``attempt``; None: the worker's backoff."""
        return None if self.backoff is None else self.backoff.delay_ms(attempt)

    # -- in the envelope: only what differs from the registered task -----------------

    def overrides(self, base: TaskOptions) -> dict[str, Any]:
        """The options of this send that differ from the task's and that its worker
        applies (queue, max_attempts, unique, priority, group and job_id act at send
        time), as plain JSON."""
        out: dict[str, Any] = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(base, f.name)
            if f.name in _SEND_TIME or mine == theirs:
                continue
            if f.name == "backoff":
                out[f.name] = None if mine is None else mine.to_json()
            elif f.name in ("retry_on", "fail_on"):
                out[f.name] = None if mine is None else [qualified_name(t, f.name) for t in mine]
            else:
                out[f.name] = mine
        return out

    def with_overrides(
        self, opts: Mapping[str, Any], functions: Mapping[str, Callable[[int], Duration]] = {}
    ) -> TaskOptions:
        """These options with an envelope's ``opts`` applied (the worker side).
        ``functions``: the backoff functions a per-send backoff may name.

        Raises:
            InvalidArgument: an override that does not parse or resolve.
        """
        out: dict[str, Any] = {}
        try:
            for key, value in opts.items():
                if key == "backoff":
                    out[key] = None if value is None else Backoff.from_json(value, functions)
                elif key in ("retry_on", "fail_on"):
                    types = tuple(resolve_exception(name) for name in value) if value is not None else None
                    out[key] = types if key == "retry_on" else (types or ())
                elif key in ("max_age_ms", "time_limit_ms", "time_limit_grace_ms", "keep_result_ms"):
                    # As build() takes them: a time limit or a result of 0 ms is refused.
                    lowest = 0 if key in ("max_age_ms", "time_limit_grace_ms") else 1
                    if value is not None and (type(value) is not int or not lowest <= value <= 2**40):
                        raise InvalidArgument(f"{key} must be an integer number of ms in [{lowest}, 2^40]")
                    out[key] = value
                # Unknown keys come from a newer producer: ignored, as the envelope's rule says.
        except (ImportError, AttributeError, ValueError, TypeError, KeyError) as exc:
            raise InvalidArgument(f"a per-send option does not resolve on this worker: {exc!r}") from None
        return replace(self, **out)


def task_options(base: TaskOptions | None, given: Mapping[str, Any], where: str) -> TaskOptions:
    """The options of a task, or the defaults of every task of a ``Tasks`` (``where``
    names which, for the error), on top of ``base``: :meth:`TaskOptions.build`, but
    never ``job_id``, which is one send's id.

    Raises:
        InvalidArgument: ``job_id`` among them, or what ``build`` refuses.
    """
    if "job_id" in given:
        raise InvalidArgument(
            f"{where} does not take job_id: it is one send's job id (fn.options(job_id=...).send(...)); every send "
            "under one id would be the same job (unique= derives an id from each call's arguments)"
        )
    return TaskOptions.build(base, **given)


def app_defaults(default_queue: str | None, given: Mapping[str, Any]) -> TaskOptions:
    """The defaults of every task of ``Tasks(default_queue=..., **given)``: ``queue`` is
    ``default_queue`` (or ``given``'s, not both), else ``"default"``.

    Raises:
        InvalidArgument: both name the queue, or what :func:`task_options` refuses.
    """
    options = dict(given)
    if default_queue is not None:
        if "queue" in options:
            raise InvalidArgument("Tasks(default_queue=) and Tasks(queue=) name the same thing: give one of them")
        options["queue"] = default_queue
    options.setdefault("queue", "default")
    return task_options(None, options, "Tasks()")
