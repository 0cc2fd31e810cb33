"""A task: a registered function, its policy, and how to send it (each send a
:class:`~pyqueue.tasks.flows.Signature`, sent by :mod:`pyqueue.tasks.sending`).

Sending checks everything it can before anything reaches Redis: the arguments are bound
to the function's signature (a wrong call raises ``TypeError`` in the caller, as calling
the function would) and must travel as JSON (:mod:`pyqueue.tasks.codec`). Then it is
one ``enqueue`` call: one round trip, and a duplicate id (``unique``, or a send's
``job_id``) is the engine's reported no-op.

Delivery: at least once, as every job (see :mod:`pyqueue.drivers.queue`). A task that must not
repeat a side effect checks ``current_job().fence`` against its store, or is idempotent.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, cast

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.worker.handler import BatchSpec
from pyqueue.tasks import envelope
from pyqueue.tasks.flows import Sender, Signature
from pyqueue.tasks.handle import SentTask
from pyqueue.tasks.policy import Duration, SendOptionsDict, TaskOptions
from pyqueue.protocol.verbs.steps import Signalled
from pyqueue.tasks.sending import asend, send_many
from pyqueue.tasks.steps import encode
from pyqueue.worker.endings import seconds_to_ms

if sys.version_info >= (3, 11):
    from typing import Unpack
elif TYPE_CHECKING:
    from typing_extensions import Unpack

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class TaskApp(Sender, Protocol):
    """What a task uses of the Tasks object it is registered on (a
    :class:`~pyqueue.tasks.Tasks`, declared above this module): what its calls use,
    and the server's clock from asyncio code."""

    async def aserver_now_ms(self) -> int: ...


class _Sender(Generic[P, R]):
    """The send verbs, shared by a task and a task with per-send options."""

    task: Task[P, R]
    opts: TaskOptions

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """This call, checked and encoded, not sent (for ``send_many``, or as a flow's
        step: there it may lack its first argument, which the step before provides)."""
        return Signature(self.task, args, kwargs, self.opts, partial=True)

    def si(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """As :meth:`s`, for a flow's step that does not take the result of the step
        before it (an immutable signature)."""
        sig = Signature(self.task, args, kwargs, self.opts)
        sig.immutable = True
        return sig

    def send(self, *args: P.args, **kwargs: P.kwargs) -> SentTask[R]:
        """Enqueue a run of the task now; returns its handle (``.id``, ``.result()``).

        Raises:
            TypeError: the arguments do not fit the function's signature.
            InvalidArgument: an argument that does not travel as JSON, or a bad option.
        """
        return self._send(Signature(self.task, args, kwargs, self.opts), 0)

    def send_in(self, delay: Duration, *args: P.args, **kwargs: P.kwargs) -> SentTask[R]:
        """As :meth:`send`, to run no earlier than ``delay`` (seconds or a timedelta)
        from now on the Redis server's clock."""
        return self._send(Signature(self.task, args, kwargs, self.opts), seconds_to_ms(delay, "delay"))

    def send_at(self, when: datetime, *args: P.args, **kwargs: P.kwargs) -> SentTask[R]:
        """As :meth:`send`, to run no earlier than ``when`` (an aware datetime; a naive
        one is refused), compared with the Redis server's clock."""
        signature = Signature(self.task, args, kwargs, self.opts)
        return self._send(signature, self._delay_until(when, self.task.app.server_now_ms()))

    def send_many(self, calls: Iterable[Signature | tuple[Any, ...]]) -> list[SentTask[R]]:
        """Enqueue many runs: each item is ``fn.s(...)`` or a tuple of positional
        arguments. Every call is checked before any is sent; then one round trip per
        1,000 jobs (``enqueue_many``)."""
        signatures = [c if isinstance(c, Signature) else Signature(self.task, tuple(c), {}, self.opts) for c in calls]
        for sig in signatures:
            if sig.task is not self.task:
                raise InvalidArgument(f"send_many of {self.task.name} got a call of {sig.task.name}")
            if sig.awaits_input:
                raise TypeError(f"{sig!r} lacks an argument (only a flow's step gets the result before it as its first)")
        return send_many(self.task.app, signatures, self.task.app.server_now_ms())

    async def asend(self, *args: P.args, **kwargs: P.kwargs) -> SentTask[R]:
        """:meth:`send` from asyncio code, on the Tasks' asyncio client."""
        signature = Signature(self.task, args, kwargs, self.opts)
        app = self.task.app
        return await asend(app, [signature], await app.aserver_now_ms(), 0)

    async def asend_in(self, delay: Duration, *args: P.args, **kwargs: P.kwargs) -> SentTask[R]:
        """:meth:`send_in` from asyncio code."""
        signature = Signature(self.task, args, kwargs, self.opts)
        app = self.task.app
        return await asend(app, [signature], await app.aserver_now_ms(), seconds_to_ms(delay, "delay"))

    def signal(self, job_id: str, name: str, data: Any = None) -> Signalled:
        """Send the signal ``name`` with ``data`` (JSON, as an argument) to the run
        ``job_id`` of this task, in its queue: its ``current_job().wait_signal(name,
        ...)`` gets ``data``, whether it waits already (it is due at once) or reaches the
        wait later. Answers :class:`~pyqueue.protocol.verbs.steps.Signalled`: ``woke``
        or ``kept``; refused, writing nothing: ``unknown`` (the job has ended, or never
        was), ``dead``, ``duplicate`` (one signal per name: the first is kept),
        ``closed`` (its wait timed out already).

        Raises:
            InvalidArgument: a bad id or name, data that does not travel.
        """
        return self.task.app.queue(self.opts.queue).signal(job_id, name, encode(data, f"{self.task.name} signal {name!r}"))

    async def asignal(self, job_id: str, name: str, data: Any = None) -> Signalled:
        """:meth:`signal` from asyncio code."""
        payload = encode(data, f"{self.task.name} signal {name!r}")
        return await self.task.app.aqueue(self.opts.queue).signal(job_id, name, payload)

    def _send(self, signature: Signature, delay_ms: int) -> SentTask[R]:
        app = self.task.app
        return send_many(app, [signature], app.server_now_ms(), delay_ms)[0]

    @staticmethod
    def _delay_until(when: datetime, now_ms: int) -> int:
        if not isinstance(when, datetime):
            raise InvalidArgument(f"send_at takes a datetime, got {type(when).__name__}")
        if when.tzinfo is None or when.utcoffset() is None:
            # Python reads a naive datetime as local time, the server's clock is UTC: a
            # guess either way would be off by the zone on some machine. Refused.
            raise InvalidArgument(
                f"send_at takes an aware datetime (datetime.now(timezone.utc) + ..., or with tzinfo=), got the naive "
                f"{when.isoformat()}"
            )
        return max(0, round(when.timestamp() * 1000) - now_ms)


class Task(_Sender[P, R]):
    """A function registered with ``@tasks.task(...)``. Calling it runs it here, now;
    :meth:`send` runs it on a worker. ``policy`` holds its registered options."""

    #: How its jobs are run in batches (a :class:`BatchTask`); None: one job per call.
    batch: BatchSpec | None = None

    def __init__(self, app: TaskApp, fn: Callable[P, R], name: str, policy: TaskOptions) -> None:
        self.app, self.fn, self.name, self.policy = app, fn, name, policy
        #: How an argument error names where it is (made once: a send builds no text).
        self.argument_where = f"{name} argument"
        self.task, self.opts = self, policy
        self.signature = inspect.signature(fn)
        #: How many arguments a call may give by position alone when every parameter is
        #: positional (no keyword-only ones, no ``*args`` or ``**kwargs``), else -1: a
        #: call of exactly that many positional arguments binds as given.
        self.positional_arity = len(self.signature.parameters) if all(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in self.signature.parameters.values()
        ) else -1
        self.is_async = inspect.iscoroutinefunction(fn)
        #: Encodes this task's envelopes (its head encoded once).
        self.encode_envelope = envelope.Encoder(name)
        self.__doc__, self.__name__, self.__qualname__ = fn.__doc__, fn.__name__, fn.__qualname__
        self.__module__ = fn.__module__
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def options(self, **overrides: Unpack[SendOptionsDict]) -> Options[P, R]:
        """This task with options changed for the sends made through the result:
        ``fn.options(time_limit=5, queue="slow").send(...)``. Same keywords as
        ``@tasks.task`` (:class:`~pyqueue.tasks.policy.TaskOptionsDict`), durations in
        seconds or a timedelta, and ``job_id``: the sends' job id, in place of
        ``unique``'s or a random one (``fn.options(job_id="order-42").send(...)``). A
        send under an id whose job exists, or whose tombstone lasts (``keep_done_ms``
        after its ack), adds nothing: its handle's ``added`` is false and it names that
        job, as with ``unique``. A flow's steps take no ``job_id`` (a flow names them).

        Raises:
            InvalidArgument: an unknown option or a bad value (a ``job_id`` that is not
                1..256 UTF-8 bytes without control characters).
        """
        return Options(self, TaskOptions.build(self.policy, **overrides))

    def __repr__(self) -> str:
        return f"<task {self.name} on {self.policy.queue!r}>"


class Options(_Sender[P, R]):
    """A task with per-send options (``fn.options(...)``)."""

    def __init__(self, task: Task[P, R], options: TaskOptions) -> None:
        self.task, self.opts = task, options

    def options(self, **overrides: Unpack[SendOptionsDict]) -> Options[P, R]:
        """These options with more changed (:meth:`Task.options`)."""
        return Options(self.task, TaskOptions.build(self.opts, **overrides))


#: What a batch task's sends are checked against: one item (one positional argument) per job.
ITEM_SIGNATURE = inspect.Signature([inspect.Parameter("item", inspect.Parameter.POSITIONAL_ONLY)])


class BatchTask(Task[[T], R]):
    """A task run in batches: ``@tasks.task(batch=100, batch_wait=0.05)`` on a function
    of one parameter, the list of items of up to ``batch`` jobs, returning one result
    per item, in order::

        @tasks.task(batch=100, keep_result=60)
        def index(docs: list[dict]) -> list[str | Exception]:
            return [store(doc) if doc else ValueError("empty") for doc in docs]

        index.send({"id": 7})          # one job, one item
        index.send_many(docs)          # one job per item, one round trip per 1,000

    A send is one job carrying one item (any value that travels as JSON: send a dict or
    a list for several fields); ``send``, ``send_in``, ``send_at``, ``asend``,
    ``options(...)`` and ``s`` take that item. A worker calls the function with the
    items of the jobs one lease call returned (at most ``batch``; a short batch waits
    at most ``batch_wait`` seconds for more), in lease order. ``current_batch()`` gives
    the jobs (id, attempt, fence, cancelled, ...) in the same order.

    Each job's outcome is its item's result, exactly as a single job's return or raise:
    a value completes the job (kept as its result with ``keep_result``); an exception
    instance at its position fails that job alone, retried or dead by the task's policy
    (``retry_on``, ``fail_on``, ``backoff``, ``max_attempts``; :class:`~pyqueue.Retry`
    and :class:`~pyqueue.Fail` instances too). Raising fails every job of the batch
    the same way, and so does returning anything but a list of one result per item.
    ``time_limit`` limits the batch's run (the smallest limit among its jobs, from the
    lease of its first job): at the limit every job of the batch ends with
    :class:`~pyqueue.TimeLimitExceeded`. A batch takes one of the worker's
    ``concurrency`` slots.

    Its queue holds its jobs only (refused at registration otherwise): a job of another
    task found in it (a per-send ``queue=``) is not run, it is retried then dead with
    its own error. Calling the task runs the function here, on a list of items.
    Delivery: at least once, per job, as every task.
    """

    batch: BatchSpec

    def __init__(
        self, app: TaskApp, fn: Callable[[list[T]], Sequence[R | BaseException]], name: str, policy: TaskOptions,
        batch: BatchSpec,
    ) -> None:
        # Task's view of fn (a function of the sends' arguments) is wrong for a batch task:
        # its sends are checked against ITEM_SIGNATURE, and workers call batch_fn.
        super().__init__(app, cast("Callable[[T], R]", fn), name, policy)
        self.batch_fn = fn
        self.batch = batch
        self.signature = ITEM_SIGNATURE
        self.positional_arity = 1

    def __call__(self, items: list[T]) -> Sequence[R | BaseException]:  # type: ignore[override]
        return self.batch_fn(items)

    def options(self, **overrides: Unpack[SendOptionsDict]) -> BatchOptions[T, R]:
        """This task with options changed for the sends made through the result (the
        keywords of :meth:`Task.options`, ``job_id`` included; not ``batch``, which is
        the task's)."""
        return BatchOptions(self, TaskOptions.build(self.policy, **overrides))

    def send_many(self, items: Iterable[T]) -> list[SentTask[R]]:  # type: ignore[override]
        """Enqueue one job per item (an item may also be ``fn.s(item)``); every item is
        checked before any is sent, then one round trip per 1,000 jobs."""
        return _send_items(self, items)

    def __repr__(self) -> str:
        return f"<batch task {self.name} on {self.policy.queue!r}, batches of {self.batch.size}>"


class BatchOptions(Options[[T], R]):
    """A batch task with per-send options (``fn.options(...)``)."""

    def options(self, **overrides: Unpack[SendOptionsDict]) -> BatchOptions[T, R]:
        """These options with more changed (:meth:`BatchTask.options`)."""
        return BatchOptions(self.task, TaskOptions.build(self.opts, **overrides))

    def send_many(self, items: Iterable[T]) -> list[SentTask[R]]:  # type: ignore[override]
        """As :meth:`BatchTask.send_many`, with these options."""
        return _send_items(self, items)


def _send_items(sender: _Sender[[T], R], items: Iterable[T]) -> list[SentTask[R]]:
    """One job per item: a batch task's ``send_many`` (an item is never unpacked as a
    tuple of arguments, as ``Task.send_many`` does)."""
    signatures = [i if isinstance(i, Signature) else Signature(sender.task, (i,), {}, sender.opts) for i in items]
    for sig in signatures:
        if sig.task is not sender.task:
            raise InvalidArgument(f"send_many of {sender.task.name} got a call of {sig.task.name}")
    return send_many(sender.task.app, signatures, sender.task.app.server_now_ms())
