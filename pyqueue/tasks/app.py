"""``pyqueue.Tasks``: the registry of tasks, their connection, and their workers."""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload


from pyqueue.aio import AsyncQueue
from pyqueue.drivers.clients import Client
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job
from pyqueue.drivers.queue import DEFAULT_PREFIX, Queue
from pyqueue.ops.service import TASK_NAME
from pyqueue.tasks.connection import Connection
from pyqueue.tasks.middleware import Hook as MiddlewareHook, hook_of
from pyqueue.tasks.policy import Duration, TaskOptions, TaskOptionsDict, app_defaults, task_options
from pyqueue.tasks.serving import TaskServing
from pyqueue.tasks.task import BatchTask, Task
from pyqueue.tasks.testing import TaskTesting
from pyqueue.worker.handler import MAX_BATCH_WAIT_MS, BatchSpec
from pyqueue.worker.endings import seconds_to_ms

if sys.version_info >= (3, 11):
    from typing import Unpack
elif TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("pyqueue.tasks")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
M = TypeVar("M")
Hook = Callable[[], object]

#: The longest task name (ASCII): ``unique=True`` job ids are the name and 33 more
#: characters, within the engine's 256-byte job ids.
MAX_NAME_BYTES = 200


class Tasks(TaskServing):
    """A set of tasks and the Redis they are sent to.

    ``Tasks()`` connects as every entry point does: to ``PYQUEUE_URL`` when it is set,
    else to the embedded in-process server, and logs once which (see
    :func:`pyqueue.drivers.clients.default_client`). ``Tasks(url=...)`` names a server;
    ``Tasks(client=...)`` takes a redis-py client, blocking or asyncio (the other kind is
    made from its connection settings when needed: workers and ``send`` need a blocking
    one, ``asend`` an asyncio one).

    ``default_queue`` is the queue of tasks that do not name one.

    **Defaults of every task.** The other keywords are task options
    (:class:`~pyqueue.tasks.policy.TaskOptionsDict`: ``queue``, ``max_attempts``,
    ``backoff``, ``retry_on``, ``fail_on``, ``max_age``, ``time_limit``, ``unique``,
    ``keep_result``, ``priority``, ``group``), checked as ``@tasks.task`` checks them,
    and each is the default of every task registered on this object:
    ``Tasks(max_attempts=7, time_limit=30)``. A task's own option replaces the default
    (``@tasks.task(max_attempts=3)``; ``max_attempts=None`` gives it back the engine's
    default), and ``fn.options(...)`` replaces either for the sends made through it.
    They are read when a task is registered (:attr:`defaults` holds them): the task's
    :attr:`~pyqueue.tasks.task.Task.policy` holds them, and a worker applies them as
    its task's own. ``queue=`` is the same as ``default_queue=`` (give one of them).
    ``job_id`` is one send's, never a default (``InvalidArgument``).

    ``partitions`` names the partitioned queues among the tasks' queues, with their
    partition counts (``{"orders": 6}``: README "Partitioned queues"): sends, results
    and flows go to the partition of each job's id, and :meth:`worker` serves every
    partition. A count that differs from the one recorded in Redis (or from the
    worker's ``partitions=``) is refused (``InvalidArgument``), never absorbed.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        prefix: str = DEFAULT_PREFIX,
        default_queue: str | None = None,
        partitions: Mapping[str, int] | None = None,
        **defaults: Unpack[TaskOptionsDict],
    ) -> None:
        #: The options every task registered here starts from (``Tasks(...)``'s task options).
        self.defaults = app_defaults(default_queue, defaults)
        #: Its clients, queues and server clock (:mod:`pyqueue.tasks.connection`).
        self.connection = Connection(url, client, prefix, partitions)
        self._tasks: dict[str, Task[Any, Any]] = {}
        self._lock = threading.Lock()
        self._raw: Callable[[Job], object] | None = None
        self.on_start: list[Hook] = []
        self.on_stop: list[Hook] = []
        self._middleware: list[object] = []
        #: The middleware's ``around_send`` hooks, outermost first (pyqueue.tasks.sending).
        self.send_hooks: tuple[MiddlewareHook, ...] = ()

    # -- registering -----------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(  # batch= picks this one; the next takes the other keywords
        self, *, batch: int, batch_wait: Duration = 0, name: str | None = None, **options: Unpack[TaskOptionsDict]
    ) -> Callable[[Callable[[list[T]], Sequence[R | BaseException]]], BatchTask[T, R]]: ...

    @overload
    def task(
        self, *, name: str | None = None, **options: Unpack[TaskOptionsDict]
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(  # type: ignore[misc]
        self, fn: Any = None, /, *, name: str | None = None, batch: int | None = None,
        batch_wait: Duration | None = None, **options: Unpack[TaskOptionsDict],
    ) -> Any:
        """Register a function (plain or ``async def``) as a task: ``@tasks.task`` or
        ``@tasks.task(queue=..., max_attempts=..., backoff=..., retry_on=..., fail_on=...,
        max_age=..., time_limit=..., unique=..., keep_result=..., priority=..., group=...)``
        (:class:`~pyqueue.tasks.policy.TaskOptionsDict`: a type checker checks their names
        and types). An option not given is this object's default (``Tasks(...)``'s
        options), else unset. Its name is ``module.qualname`` unless ``name=`` gives
        one: keep it stable, since queued jobs name it. Durations are seconds (int or
        float) or a ``timedelta``.
        ``priority`` (-5..5) and ``group`` (a str, or a function of the task's arguments
        giving one, e.g. ``group=lambda account_id, **_: account_id``) are the engine's
        fair scheduling (``Queue.enqueue``, ``Queue.set_group_limit``).

        ``batch=N`` (1..1000) makes a :class:`~pyqueue.tasks.task.BatchTask`: the
        function takes the list of items of up to N jobs and returns one result per
        item; each send is one job of one item; a short batch waits at most
        ``batch_wait`` seconds (default 0) for more. Its queue must hold its jobs only.

        Raises:
            InvalidArgument: a bad option (an unknown one too, given through ``**``: a
                type checker sees only the ones written out), ``job_id`` (one send's:
                ``fn.options(job_id=...)``), a name taken by another function, a
                function that cannot be a task (a generator, a lambda without
                ``name=``), or a queue shared with a batch task.
        """
        given: dict[str, Any] = dict(options)
        if "batch_wait_ms" in given:
            raise InvalidArgument("the task layer takes durations in seconds: batch_wait=0.05, not batch_wait_ms=50")
        policy = task_options(self.defaults, given, "@tasks.task()")
        spec = _batch_spec(batch, batch_wait)

        def register(fn: Callable[..., Any]) -> Task[Any, Any]:
            if not callable(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
                raise InvalidArgument(f"a task is a plain or async def function, got {fn!r}")
            task_name = name if name is not None else f"{_module_name(fn)}.{fn.__qualname__}"
            if "<" in task_name and name is None:
                raise InvalidArgument(f"{fn.__qualname__} has no stable name (a lambda or a local function): give name=")
            _check_name(task_name)
            if spec is not None:
                _check_batch_function(fn, task_name)
            with self._lock:
                other = self._tasks.get(task_name)
                if other is not None and other.fn is not fn:
                    raise InvalidArgument(f"task name {task_name!r} is taken by {other.fn!r}")
                for shared in self._tasks.values():
                    if shared.name != task_name and shared.policy.queue == policy.queue and (spec or shared.batch):
                        batch_task = task_name if spec else shared.name
                        raise InvalidArgument(
                            f"tasks {shared.name} and {task_name} share queue {policy.queue!r}, which batch task "
                            f"{batch_task} needs for its jobs only: give one of them another queue="
                        )
                task = Task(self, fn, task_name, policy) if spec is None else BatchTask(self, fn, task_name, policy, spec)
                self._tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def raw_handler(self, handler: Callable[[Job], object]) -> Callable[[Job], object]:
        """Register a handler (``handler(job)``, plain or ``async def``) for the jobs in
        these tasks' queues whose payload is not a task envelope: raw jobs, while a queue
        moves from the handler API to tasks. Without one such jobs are retried, then
        dead with the error "not a task envelope"."""
        self._raw = handler
        return handler

    def middleware(self, middleware: M, *, outermost: bool = False) -> M:
        """Register a middleware: an object with any of ``around_send``,
        ``around_run``, ``on_worker_start`` and ``on_worker_stop``
        (:class:`~pyqueue.tasks.middleware.Middleware`; what they see, and how an error
        in one ends a job, are in :mod:`pyqueue.tasks.middleware`). The first registered
        is the outermost on both sides: its code before ``yield`` runs first, its code
        after ``yield`` last. Its send hook applies from the next send; its run hook to
        the workers (and ``t.drain()`` calls) made from now on. Its worker hooks join
        the ones registered with :meth:`on_worker_start` and :meth:`on_worker_stop`, in
        registration order. Returns ``middleware``.

        ``outermost=True`` puts it before every middleware registered so far (and its
        worker hooks before every worker hook so far), as if registered first: what
        ``pyqueue worker --metrics-port`` does with its
        :class:`~pyqueue.tasks.telemetry.TaskMetrics`, registered after the app's own
        middleware, so that it sees the ending they make and times them too.

        Raises:
            InvalidArgument: it defines none of those four methods, or is registered
                already.
        """
        send, run = hook_of(middleware, "around_send"), hook_of(middleware, "around_run")
        start, stop = hook_of(middleware, "on_worker_start"), hook_of(middleware, "on_worker_stop")
        if send is None and run is None and start is None and stop is None:
            raise InvalidArgument(f"{middleware!r} is no middleware: it defines none of around_send, around_run, "
                                  "on_worker_start, on_worker_stop")
        with self._lock:
            if any(m is middleware for m in self._middleware):
                raise InvalidArgument(f"middleware {middleware!r} is registered already")
            self._middleware.insert(0 if outermost else len(self._middleware), middleware)
            if send is not None:
                self.send_hooks = (send, *self.send_hooks) if outermost else (*self.send_hooks, send)
        if start is not None:
            self.on_start.insert(0 if outermost else len(self.on_start), start[1])
        if stop is not None:
            self.on_stop.insert(0 if outermost else len(self.on_stop), stop[1])
        return middleware

    def on_worker_start(self, hook: Hook) -> Hook:
        """Run ``hook()`` (plain or ``async def``) once in each worker process before it
        leases its first job; an exception stops the worker before it registers.

        Raises:
            InvalidArgument: ``hook`` cannot be called without arguments.
        """
        self.on_start.append(_no_argument_hook(hook, "on_worker_start"))
        return hook

    def on_worker_stop(self, hook: Hook) -> Hook:
        """Run ``hook()`` once in each worker process after its last job ended.

        Raises:
            InvalidArgument: ``hook`` cannot be called without arguments.
        """
        self.on_stop.append(_no_argument_hook(hook, "on_worker_stop"))
        return hook

    @property
    def default_queue(self) -> str:
        """The queue of the tasks that do not name one (``Tasks(default_queue=)``, the
        ``queue`` of :attr:`defaults`); set, it applies to the tasks registered after."""
        return self.defaults.queue

    @default_queue.setter
    def default_queue(self, queue: str) -> None:
        self.defaults = TaskOptions.build(self.defaults, queue=queue)

    @property
    def tasks(self) -> dict[str, Task[Any, Any]]:
        """The registered tasks by name."""
        return dict(self._tasks)

    def queue_names(self) -> list[str]:
        """The queues the tasks name, in the order they were first named."""
        return list(dict.fromkeys(t.policy.queue for t in self._tasks.values()))

    # -- connecting: pyqueue/tasks/connection.py; these pass through ---------------

    @property
    def prefix(self) -> str:
        return self.connection.prefix

    @property
    def redis(self) -> Client:
        """The blocking client (made on first use)."""
        return self.connection.redis

    @property
    def aredis(self) -> Any:
        """The asyncio client (made on first use, from the blocking one's settings)."""
        return self.connection.aredis

    def queue(self, name: str) -> Queue:
        """The :class:`~pyqueue.Queue` named ``name`` on this connection."""
        return self.connection.queue(name)

    def aqueue(self, name: str) -> AsyncQueue:
        """The :class:`~pyqueue.aio.AsyncQueue` named ``name`` on the asyncio client."""
        return self.connection.aqueue(name)

    def server_now_ms(self) -> int:
        """The Redis server's clock as this process estimates it (:class:`Connection`)."""
        return self.connection.server_now_ms()

    async def aserver_now_ms(self) -> int:
        return await self.connection.aserver_now_ms()

    def bind(self, client: Any, *, prefix: str | None = None) -> None:
        """Send and serve through ``client`` (blocking or asyncio) from now on, and under
        ``prefix`` if given: for a program that makes its client from its own settings
        after the module defining the tasks was imported."""
        self.connection.bind(client, prefix=prefix)

    def close(self) -> None:
        """Close the blocking clients this object made (never a given one)."""
        self.connection.close()

    async def aclose(self) -> None:
        """:meth:`close`, and the asyncio clients this object made."""
        await self.connection.aclose()

    # -- testing ---------------------------------------------------------------------

    @contextmanager
    def testing(self, **options: Any) -> Iterator[TaskTesting]:
        """An isolated embedded server for the block (see :mod:`pyqueue.tasks.testing`)."""
        with TaskTesting(self, **options) as t:
            yield t

    def __repr__(self) -> str:
        return f"<Tasks {len(self._tasks)} tasks on {self.queue_names()}>"


def _check_name(name: object) -> None:
    """A task name: what a worker can advertise in its registration
    (:data:`pyqueue.ops.service.TASK_NAME`: 1..200 characters of ``[A-Za-z0-9_.:<>-]``).

    Raises:
        InvalidArgument: any other name (checked here, at registration, rather than
            when a worker of these tasks starts).
    """
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise InvalidArgument(f"task name must be 1..{MAX_NAME_BYTES} characters of [A-Za-z0-9_.:<>-], got {name!r}")


def _no_argument_hook(hook: Hook, where: str) -> Hook:
    """``hook``, checked to be callable without arguments, as the worker calls it (an
    arq-style ``startup(ctx)`` is refused here, not when a worker starts).

    Raises:
        InvalidArgument: it is not callable, or needs an argument.
    """
    if not callable(hook):
        raise InvalidArgument(f"{where} takes a function, got {type(hook).__name__}")
    if not _callable_with(hook):
        name = getattr(hook, "__name__", repr(hook))
        raise InvalidArgument(
            f"{where} hook {name} takes arguments, but is called with none (arq passes a ctx dict; here, keep "
            f"what it would hold in module state or a closure): def {name}() -> None"
        )
    return hook


def _callable_with(fn: Callable[..., object], *args: object) -> bool:
    """Whether ``fn``'s signature takes ``args`` (a function without a signature to
    read, such as a builtin, is taken as it is)."""
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        return False
    except ValueError:
        pass
    return True


def _batch_spec(batch: object, batch_wait: Duration | None) -> BatchSpec | None:
    """A batch task's spec from its options; None without ``batch``.

    Raises:
        InvalidArgument: ``batch`` not an int in [1, 1000], ``batch_wait`` negative or
            beyond 600 seconds, or ``batch_wait`` without ``batch``.
    """
    if batch is None:
        if batch_wait is not None:
            raise InvalidArgument("batch_wait is how long a batch task's batch waits to fill: give batch=N with it")
        return None
    wait_ms = seconds_to_ms(batch_wait if batch_wait is not None else 0, "batch_wait")
    if wait_ms > MAX_BATCH_WAIT_MS:
        raise InvalidArgument(f"batch_wait must be at most {MAX_BATCH_WAIT_MS // 1000} seconds, got {batch_wait!r}")
    return BatchSpec.of(batch, wait_ms)


def _check_batch_function(fn: Callable[..., object], name: str) -> None:
    """A batch task's function takes one argument, the list of items.

    Raises:
        InvalidArgument: it cannot be called with one positional argument.
    """
    if not _callable_with(fn, []):
        raise InvalidArgument(
            f"batch task {name}: its function takes one argument, the list of items of a batch "
            f"(def {getattr(fn, '__name__', 'fn')}(items: list[...]) -> list[...])"
        )


def _module_name(fn: Callable[..., object]) -> str:
    """The module part of a task's default name. A function of the script being run
    (``__main__``) is named after the module ``python -m`` ran; in a script run by path
    there is none that a worker would import, so it stays ``__main__`` and a warning says
    to give ``name=``."""
    module = fn.__module__
    if module != "__main__":
        return module
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name)
    log.warning(
        "task %s is defined in the script being run: its name is __main__.%s here, and a worker that imports the "
        "script as a module will not know it by that name; give it name=", fn.__qualname__, fn.__qualname__,
    )
    return module
