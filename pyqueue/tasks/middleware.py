"""Middleware: code that runs around every send and every run of a Tasks object's tasks.

A middleware is an object registered with :meth:`Tasks.middleware
<pyqueue.tasks.Tasks.middleware>`, with any of these methods (subclass :class:`Middleware`
for the signatures; a method it does not define costs nothing)::

    class Timing(pyqueue.Middleware):
        def around_send(self, message):          # in the producer, around each send
            message.meta["tenant"] = current_tenant()    # travels in the envelope's meta
            outcome = yield                      # the send happens here
            print(message.task_name, outcome.value.id if outcome.error is None else outcome.error)

        def around_run(self, run):                # in the worker, around each run
            started = time.perf_counter()
            outcome = yield                      # the task's function runs here
            print(run.task, run.attempt, outcome.ending, time.perf_counter() - started)

    tasks.middleware(Timing())

**Around, as a generator.** A hook is a generator function (as for
``contextlib.contextmanager``) that yields once: the code before ``yield`` runs before the
send or the run, ``yield`` returns its :class:`HookOutcome`, and the code after it runs after.
A hook that is a plain function (it returns None) runs before only. The outcome is sent
in, never thrown in: a hook sees an error as ``outcome.error`` and cannot swallow or
replace it, except by raising its own (below). Hooks are synchronous, also around
``asend`` and ``async def`` tasks: a run hook runs in the worker's handler thread, around
the wait for the task's coroutine, and the context variables it sets (a current span) are
the coroutine's too.

**Order.** The first middleware registered is the outermost, on both sides: its code
before ``yield`` runs first and its code after ``yield`` runs last (dramatiq's and
Sidekiq's order). Register a middleware before the worker is made (:meth:`Tasks.worker`):
a worker keeps the run hooks it started with.

**Sending** (``fn.send``, ``send_in``, ``send_at``, ``send_many``, ``asend``,
``asend_in``, the same through ``fn.options(...)``, and sends inside ``tasks.testing()``):
``around_send(message)`` gets a :class:`Sending`: the task, its arguments (as checked, not
yet encoded), its options, and ``meta``, the keys this send adds to the envelope's
``meta`` (empty at first; plain JSON values; ``enqueued_ms``, ``delay_ms``, ``opts`` and ``flow``
are the layer's own and refused). Raising before ``yield`` refuses the send: nothing is
enqueued (for ``send_many``: none of its jobs) and the caller gets a
:class:`MiddlewareError` naming the middleware, the exception as its cause. The outcome's
``value`` is the :class:`~pyqueue.tasks.SentTask`. Raising after ``yield`` raises a
:class:`MiddlewareError` to the caller although the job was enqueued (its message says
so, with the job id): a caller that sends again sends twice.

**Running** (every task job a worker, or ``t.drain()``, runs; each job of a batch task's
batch too): ``around_run(run)`` gets the :class:`~pyqueue.tasks.TaskRun` that
``current_job()`` returns (id, queue, task, attempt, max_attempts, meta, deadline), and an
:class:`HookOutcome`: what the function returned or raised, and how the job ends
(:attr:`HookOutcome.ending`). A job that is not run (an unknown task, an envelope this worker
cannot read, older than ``max_age``) passes no hook. Hooks run inside the job's lease and
time limit.

**A middleware's error never loses a job.** An exception raised by a run hook (before
or after ``yield``) becomes the job's failure, as a :class:`MiddlewareError` whose text
names the middleware, and is logged (logger ``pyqueue.tasks``) with the middleware's
name: the job is nacked and retried with the task's backoff, dead at ``max_attempts``,
never acked, even when the task returned (it will run again: at least once, as every
task). ``retry_on`` and ``fail_on`` are the task's and do not apply to it. A hook may end
the job on purpose with :class:`~pyqueue.Retry` or :class:`~pyqueue.Fail`, as a task
does. When a hook fails before ``yield``, the function is not called, the hooks inside it
are not entered, and the hooks outside it see the error as their outcome.

**Worker hooks.** A middleware's ``on_worker_start()`` and ``on_worker_stop()`` run with
the Tasks object's own (``@tasks.on_worker_start``), in the order registered.

**Cost.** With no middleware (or none with a given hook) a send and a run make no call
and build nothing for middleware: the chains are only entered when not empty.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pyqueue.protocol.errors import PyQueueError
from pyqueue.worker.slots import Parked, TimeLimitExceeded
from pyqueue.worker import Fail, Retry
from pyqueue.worker.endings import error_text

if TYPE_CHECKING:
    from pyqueue.tasks.handle import SentTask
    from pyqueue.tasks.policy import TaskOptions
    from pyqueue.tasks.run import TaskRun

log = logging.getLogger("pyqueue.tasks")

V = TypeVar("V")
S = TypeVar("S")
#: What a hook returns: a generator that yields once (around), or None (before only).
Around = Generator[None, "HookOutcome[V]", None] | None

#: The envelope's ``meta`` keys the task layer writes; a send hook may not set them.
RESERVED_META = frozenset({"enqueued_ms", "delay_ms", "opts", "flow"})


class MiddlewareError(PyQueueError):
    """An exception raised by a middleware's hook, reported as that middleware's: the
    message names it and the hook (``middleware app.Audit failed in around_run: ...``),
    the exception is ``__cause__``. In a worker it fails the job by the task's backoff
    and ``max_attempts`` (:mod:`pyqueue.tasks.middleware`)."""

    def __init__(self, middleware: str, hook: str, error: BaseException, note: str = "") -> None:
        super().__init__(f"middleware {middleware} failed in {hook}: {error_text(error)}{note}")
        self.middleware, self.hook, self.error = middleware, hook, error
        self.__cause__ = error


class HookOutcome(Generic[V]):
    """What ``yield`` returns in a hook: how the send or the run went.

    ``value``: what the send returned (the :class:`~pyqueue.tasks.SentTask`) or the task
    returned (a batch task: this job's item's result); None when ``error`` is set.
    ``error``: the exception the send or the task raised (a batch task: the exception at
    this job's position, or the one its function raised), or a :class:`MiddlewareError`
    of a hook inside this one; None on success.

    ``ending`` (runs only; ``"sent"`` or ``"refused"`` for sends): how the job ends, as
    far as the worker knows when the hook resumes:

    * ``"ok"``: acked (with its result when ``keep_result`` is set);
    * ``"retry"``: nacked to run again after a delay (an error, :class:`~pyqueue.Retry`);
    * ``"dead"``: nacked to the dead letters (:class:`~pyqueue.Fail`, a ``fail_on`` or
      non-``retry_on`` error, a result that cannot be stored, or its last attempt);
    * ``"time_limit"``: it reached its time limit: acked if it caught
      :class:`~pyqueue.TimeLimitExceeded` and returned (``value`` is what it returned),
      else retried or dead by the task's policy;
    * ``"parked"``: it parked itself (``current_job().sleep`` or ``.wait_signal``): its
      lease ended with no attempt used, and it runs again at the sleep's end, at its
      signal or at its wait's timeout;
    * ``"cancelled"``: its end was decided without it (cancelled, or its lease lost).

    A hook outside one that fails sees ``"retry"`` or ``"dead"`` for that failure.
    """

    __slots__ = ("value", "error", "ending")

    def __init__(self, value: V | None, error: BaseException | None, ending: str) -> None:
        self.value, self.error, self.ending = value, error, ending

    def __repr__(self) -> str:
        return f"HookOutcome(value={self.value!r}, error={self.error!r}, ending={self.ending!r})"


class TaskInfo(Protocol):
    """The task of a send, as a send hook sees it: a :class:`~pyqueue.tasks.Task`
    (declared above this module)."""

    @property
    def name(self) -> str: ...

    @property
    def policy(self) -> TaskOptions: ...

    @property
    def fn(self) -> Callable[..., Any]: ...


class Sending:
    """One send as a send hook sees it (see the module docstring)."""

    __slots__ = ("task", "args", "kwargs", "options", "delay_ms", "meta")

    def __init__(
        self, task: TaskInfo, args: list[Any], kwargs: dict[str, Any], options: TaskOptions, delay_ms: int
    ) -> None:
        #: The task (its ``name``, ``policy``, ``fn``).
        self.task = task
        #: The call's arguments, checked against the signature (not to be changed).
        self.args, self.kwargs = args, kwargs
        #: This send's options (the task's, with ``fn.options(...)``'s overrides).
        self.options = options
        #: How long after now it is due (``send_in``, ``send_at``; 0: now).
        self.delay_ms = delay_ms
        #: The keys this send adds to the envelope's ``meta`` (a str key, a plain JSON value).
        self.meta: dict[str, Any] = {}

    @property
    def task_name(self) -> str:
        return self.task.name

    @property
    def queue(self) -> str:
        return self.options.queue

    def __repr__(self) -> str:
        return f"Sending(task={self.task.name!r}, queue={self.options.queue!r}, meta={self.meta!r})"


class Middleware:
    """The hooks a middleware may define (see the module docstring); each is optional,
    and one left as this class's is never called. Subclassing is not required: any
    object with some of these methods is a middleware."""

    def around_send(self, message: Sending) -> Around[SentTask[Any]]:
        """Around each send, in the producer."""
        return None

    def around_run(self, run: TaskRun) -> Around[object]:
        """Around each run of a task's function, in the worker's handler thread."""
        return None

    def on_worker_start(self) -> object:
        """Once in each worker process, before its first job."""
        return None

    def on_worker_stop(self) -> object:
        """Once in each worker process, after its last job."""
        return None


#: One registered hook: (the middleware's name, the bound method).
Hook = tuple[str, Callable[..., Any]]


def hook_of(middleware: object, method: str) -> Hook | None:
    """The hook ``method`` of ``middleware``, or None if it does not define one (or
    keeps :class:`Middleware`'s)."""
    function = getattr(type(middleware), method, None)
    if function is None or function is getattr(Middleware, method):
        return None
    return name_of(middleware), getattr(middleware, method)


def name_of(middleware: object) -> str:
    """How errors and logs name a middleware: its class's ``module.qualname``."""
    cls = type(middleware)
    return f"{cls.__module__}.{cls.__qualname__}"


class Chain(Generic[S, V]):
    """The hooks of one send or one run, entered (outermost first) and not yet resumed."""

    __slots__ = ("method", "entered", "subject")

    def __init__(self, method: str) -> None:
        self.method = method
        self.subject: object = None
        self.entered: list[tuple[str, Generator[None, HookOutcome[V], None]]] = []

    def enter(self, hooks: Sequence[Hook], subject: S) -> BaseException | None:
        """Run each hook up to its ``yield``, outermost first. Returns the error of the
        first hook that raised (the hooks inside it are not entered): a
        :class:`MiddlewareError`, or the Retry or Fail it raised, naming it; else None."""
        self.subject = subject
        for name, hook in hooks:
            try:
                step = hook(subject)
                if step is None:
                    continue
                next(step)
            except StopIteration:  # a generator that ended before yielding: before only
                continue
            except BaseException as exc:
                if isinstance(exc, (Retry, Fail)) and self.method == "around_run":  # a hook's word on the job's end
                    log.info("middleware %s ended %r in %s with %s", name, subject, self.method, type(exc).__name__)
                    return _deliberate(name, self.method, exc)
                if self.method == "around_run":  # a send's caller gets the error: not logged
                    log.warning("middleware %s failed in %s of %r", name, self.method, subject, exc_info=True)
                return MiddlewareError(name, self.method, exc)
            self.entered.append((name, step))
        return None

    def resume(self, outcome: HookOutcome[V], ending_of: Callable[[BaseException], str]) -> HookOutcome[V]:
        """Resume the entered hooks with ``outcome``, innermost first; an exception a hook
        raises becomes the outcome the hooks outside it see (``ending_of`` says how it
        ends the job). Returns the outcome the outermost hook saw, or one it raised."""
        while self.entered:
            name, step = self.entered.pop()
            try:
                step.send(outcome)
            except StopIteration:
                continue
            except BaseException as exc:
                if isinstance(exc, (Retry, Fail)) and self.method == "around_run":
                    error: BaseException = _deliberate(name, self.method, exc)
                else:
                    log.warning("middleware %s failed in %s of %r after %r", name, self.method, self.subject,
                                outcome, exc_info=True)
                    error = MiddlewareError(name, self.method, exc, _note(outcome))
            else:
                step.close()
                error = MiddlewareError(name, self.method, RuntimeError("the hook yielded more than once"))
                log.warning("%s", error)
            outcome = HookOutcome(None, error, ending_of(error))
        return outcome


def _note(outcome: HookOutcome[Any]) -> str:
    """What a hook that raised after ``yield`` was given, for its error's message."""
    if outcome.error is not None:
        return f" (the outcome it was given: {error_text(outcome.error)})"
    job_id = getattr(outcome.value, "id", None)
    return f" (after the send: job {job_id} was enqueued all the same)" if isinstance(job_id, str) else ""


def enter_sends(hooks: Sequence[Hook], messages: Sequence[Sending]) -> list[Chain[Sending, SentTask[Any]]]:
    """Enter the send hooks of each message, in order: their chains.

    Raises:
        MiddlewareError: a hook refused a send; the hooks entered so far were resumed
            with that refusal (nothing is sent).
    """
    chains: list[Chain[Sending, SentTask[Any]]] = []
    for message in messages:
        chain: Chain[Sending, SentTask[Any]] = Chain("around_send")
        chains.append(chain)
        error = chain.enter(hooks, message)
        if error is not None:
            resume_sends(chains, None, error)
            raise error
    return chains


def resume_sends(
    chains: Sequence[Chain[Sending, SentTask[Any]]], sent: Sequence[SentTask[Any]] | None, error: BaseException | None
) -> None:
    """Resume the send hooks of each message, last first (so context variables unwind
    in order), with what the send returned (``sent``, one per message) or raised.

    Raises:
        MiddlewareError: after a send that went through, the first error a hook raised
            (the jobs are enqueued). After a send that failed, hooks' errors are logged
            only: the caller gets the send's own error.
    """
    raised: BaseException | None = None
    ending = "refused" if error is not None or sent is None else "sent"
    for k in reversed(range(len(chains))):
        outcome: HookOutcome[SentTask[Any]] = HookOutcome(None, error, ending) if sent is None else HookOutcome(sent[k], None, ending)
        after = chains[k].resume(outcome, lambda _exc: ending)
        if after.error is not outcome.error and raised is None:
            raised = after.error
    if raised is not None and error is None:
        raise raised


def _deliberate(name: str, method: str, ending: Retry | Fail) -> Retry | Fail:
    """A Retry or Fail a hook raised, as the job's ending: its reason names the hook."""
    reason = f"middleware {name} ended the job in {method}: {ending.error_text()}"
    out: Retry | Fail = Retry(ending.delay_ms, reason) if isinstance(ending, Retry) else Fail(reason)
    out.__cause__ = ending
    return out


def run_ending(error: BaseException | None, final: bool, cancelled: bool, reached: bool = False) -> str:
    """:attr:`HookOutcome.ending` of a run: ``error`` is what it raised (None: it returned),
    ``final`` whether its nack is to the dead letters, ``cancelled`` whether its end
    was decided without it, ``reached`` whether it reached its time limit."""
    if reached or isinstance(error, TimeLimitExceeded):
        return "time_limit"
    if isinstance(error, Parked):
        return "parked"
    if cancelled:
        return "cancelled"
    if error is None:
        return "ok"
    return "dead" if final else "retry"
