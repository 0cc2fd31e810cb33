"""Running task jobs in a worker: the handler that routes a job to its task by name and
turns the task's policy into the engine's transitions.

How a run ends, and the transition it becomes (every one a script):

* it returns: ``ack`` (``ack_result`` with the value when ``keep_result`` is set);
* it raises :class:`~pyqueue.Retry`: ``nack`` after its delay, the attempt counted;
* it raises :class:`~pyqueue.Fail`, an exception in ``fail_on``, or one outside
  ``retry_on``: ``nack`` to the dead letters now, the exception's type and message kept;
* it raises anything else: ``nack`` with the task's backoff (the worker's by default),
  dead at ``max_attempts`` with that exception as its error;
* it reaches ``time_limit``: the worker interrupts it with
  :class:`~pyqueue.TimeLimitExceeded`; caught and returned from (within
  ``time_limit_grace``), the job is acked; let through, it is nacked under the same
  rules; past the grace the job ends so whatever the handler does
  (:mod:`pyqueue.worker.slots`);
* it is older than ``max_age`` when leased: dead at once, not run;
* its task name is unknown here, or its payload is not an envelope this worker reads:
  ``nack`` with the backoff, never ack (another worker version may know it), dead at
  ``max_attempts`` with the error ``unknown task 'name'``.

Middleware's run hooks (:mod:`pyqueue.tasks.middleware`) wrap the call of the function:
an error of theirs ends the job as a retry by the task's backoff, never an ack.

A batch task's jobs (``@tasks.task(batch=N)``) end the same way, each by its own item's
result (:mod:`pyqueue.tasks.batch`): the worker runs its queue in batches
(:meth:`Dispatcher.run_batch`); one of its jobs leased alone runs as a batch of one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job, Result
from pyqueue.worker.handler import HandlerSpec
from pyqueue.worker.slots import LimitEnding, Slot, TimeLimitExceeded, current_slot
from pyqueue.tasks import envelope
from pyqueue.tasks.batch import BatchDispatch
from pyqueue.tasks.codec import to_json
from pyqueue.tasks.flows import report_end, send_children, take_input
from pyqueue.tasks.middleware import Chain, Hook, HookOutcome, MiddlewareError, hook_of, run_ending
from pyqueue.tasks.policy import TaskOptions, qualified_name
from pyqueue.tasks.run import TaskRun, Undeliverable, job_var
from pyqueue.tasks.task import BatchTask, Task
from pyqueue.worker import Fail, Retry
from pyqueue.worker.endings import error_text
from pyqueue.worker.executor import is_async_handler

log = logging.getLogger("pyqueue.tasks")


class Dispatcher:
    """The worker handler of a :class:`~pyqueue.tasks.Tasks` object: routes each job to
    the task its envelope names (see the module docstring)."""

    def __init__(
        self, tasks: Mapping[str, Task[Any, Any]], raw: Callable[[Job], object] | None = None,
        middleware: Sequence[object] = (),
    ) -> None:
        self.tasks = tasks
        #: The middleware's ``around_run`` hooks, outermost first (empty: none is called).
        self.run_hooks: tuple[Hook, ...] = tuple(
            hook for m in middleware for hook in [hook_of(m, "around_run")] if hook is not None
        )
        #: Runs the jobs whose payload is not a task envelope (a queue moving from raw
        #: jobs to tasks); None: they are retried, then dead, as an unknown task.
        self.raw = raw
        #: The backoff functions of the tasks, by ``module:qualname``: the only functions
        #: a per-send ``backoff`` override may name (a payload never picks code to run).
        self.backoff_functions = {
            name: t.policy.backoff.function
            for t in tasks.values()
            if t.policy.backoff is not None and t.policy.backoff.function is not None
            for name in [_name_of(t.policy.backoff.function)] if name
        }
        #: Advertised in the worker's service registration.
        self.task_names = tuple(sorted(tasks))
        #: Any task needs an event loop: the worker must be an AsyncWorker.
        self.needs_event_loop = any(t.is_async for t in tasks.values()) or (
            raw is not None and is_async_handler(raw)
        )
        #: The batch tasks, by queue (each holds its task's jobs only).
        self.batches = BatchDispatch(self, {n: cast(BatchTask[Any, Any], t) for n, t in tasks.items() if t.batch})
        for name, task in tasks.items():
            batch_task = self.batches.by_queue.get(task.policy.queue)
            if batch_task is not None and batch_task is not task:
                raise InvalidArgument(f"task {name} is in queue {task.policy.queue!r} of batch task {batch_task.name}, "
                                      "which holds that task's jobs only: give it another queue=")
        #: The queues served in batches, and how (what a Worker reads to run them; see
        #: :mod:`pyqueue.worker.batch`). The other queues run one job per call.
        self.batch_queues = {queue: task.batch for queue, task in self.batches.by_queue.items()}

    def __call__(self, job: Job) -> object:
        slot = current_slot()
        try:
            env = envelope.decode(job.payload)
        except envelope.EnvelopeError as exc:
            # A raw job runs with the raw handler; an envelope of a newer version (or a
            # malformed one) never does: retried, as another worker may read it.
            if self.raw is None or not isinstance(exc, envelope.NotAnEnvelope):
                raise Undeliverable(str(exc)) from None
            if is_async_handler(self.raw):
                if slot is None:
                    raise InvalidArgument("an async raw handler runs in an AsyncWorker") from None
                return slot.run_awaitable(self.raw(job))  # type: ignore[arg-type]
            return self.raw(job)
        task = self.tasks.get(env.task)
        if slot is not None:
            slot.name = env.task
        if task is None:
            raise Undeliverable(f"unknown task {env.task!r}")
        if task.batch is not None:  # a BatchTask
            return self.run_alone(cast(BatchTask[Any, Any], task), job)
        flow = env.meta.get("flow")
        if flow is not None and "input" in flow:  # a flow's step that waited: its input
            env = take_input(task.app, env, flow)
        opts = self.options_for(task, env, job, slot)
        enqueued_ms = env.sent_ms(job)
        deadline_ms = None
        if opts.time_limit_ms is not None and slot is not None:
            slot.limit(opts.time_limit_ms / 1000, self._limit_ending(task, opts, job), opts.time_limit_grace_s)
            deadline_ms = slot.leased_at_ms + opts.time_limit_ms
        run = TaskRun(job, task.name, enqueued_ms, deadline_ms, env.meta, task.app)
        if self.run_hooks:
            return self.run_around(task, opts, env, slot, run)
        token = job_var.set(run)
        try:
            # A sync task is called here, not through _call: one call less per job.
            value = _call(task, env, slot, run) if task.is_async else task.fn(*env.args, **env.kwargs)
            if run.children is not None:
                send_children(task.app, run)
        except (Retry, Fail, TimeLimitExceeded):
            raise
        except (Exception, SystemExit) as exc:
            # SystemExit (sys.exit() in the task's code) is the task's failure like any
            # other: let through, it would leave the job leased with nothing running it.
            # (KeyboardInterrupt is not: in drain's thread it is the user's Ctrl-C.)
            raise self.failure(task, opts, env, job, exc)  # its cause: exc
        finally:
            job_var.reset(token)
        return None if opts.keep_result_ms is None else self.result(task, opts, value)

    def handler_spec(self) -> HandlerSpec:
        """What the worker reads of this dispatcher besides calling it
        (:mod:`pyqueue.worker.handler`): its task names, the end hook of flow steps, its
        batch tasks' queues, and whether it needs an event loop."""
        return HandlerSpec(
            task_names=self.task_names, job_ended=self.job_ended, reports_end=self.reports_end,
            needs_event_loop=self.needs_event_loop, batch_queues=self.batch_queues,
            run_batch=self.run_batch,
        )

    @staticmethod
    def reports_end(job: Job) -> bool:
        """Whether :meth:`job_ended` wants to hear of ``job``: a flow step's. The worker's
        handler thread waits for the ack of such a job only (one substring test)."""
        return b'"flow"' in job.payload

    def job_ended(self, job: Job, how: str) -> None:
        """The worker's hook once its ack ('ok') or dead-nack ('dead') of ``job`` answered
        OK: a flow step's end is reported to the steps waiting for it
        (:func:`pyqueue.tasks.flows.report_end`). Other jobs cost one substring test."""
        if b'"flow"' in job.payload:
            task = self.tasks.get(envelope.decode(job.payload).task)
            if task is not None:
                report_end(task.app, job, how)

    def failure(self, task: Task[Any, Any], opts: TaskOptions, env: envelope.Envelope, job: Job,
                exc: BaseException) -> Retry | Fail:
        """How a job whose task raised ``exc`` (an Exception or SystemExit, not Retry,
        Fail or TimeLimitExceeded) ends: :class:`Fail` now or :class:`Retry` by the
        task's policy, ``exc`` as its cause (its error text)."""
        if isinstance(exc, TypeError):
            # Checked only when the call failed (nothing on the happy path): arguments
            # that do not fit the function (a producer of another version) fail at once,
            # since a retry would fail the same way.
            try:
                task.signature.bind(*env.args, **env.kwargs)
            except TypeError as bind_error:
                unfit = Fail(f"the arguments do not fit task {task.name}: {bind_error}")
                unfit.__suppress_context__ = True
                return unfit
        failed = Fail() if opts.fails_at_once(exc) else Retry(delay_ms=opts.retry_delay_ms(job.attempt))
        failed.__cause__ = exc
        return failed

    @staticmethod
    def result(task: Task[Any, Any], opts: TaskOptions, value: object) -> Result | None:
        """What a job whose task returned ``value`` is acked with: its result when the
        task keeps one, else None.

        Raises:
            Fail: the value cannot be stored as JSON.
        """
        if opts.keep_result_ms is not None:
            try:
                encoded = to_json(value, f"{task.name} result")
            except InvalidArgument as exc:
                raise Fail(f"the result cannot be stored: {exc}") from None
            return Result(encoded, opts.keep_result_ms)
        return None

    def run_around(self, task: Task[Any, Any], opts: TaskOptions, env: envelope.Envelope, slot: Slot | None,
                   run: TaskRun) -> object:
        """A run inside the middleware's run hooks (:mod:`pyqueue.tasks.middleware`):
        the ending is decided as without them, then a hook's error replaces it."""
        chain: Chain[TaskRun, object] = Chain("around_run")
        error: BaseException | None = chain.enter(self.run_hooks, run)
        value: object = None
        if error is None:
            token = job_var.set(run)
            try:
                value = _call(task, env, slot, run)
                if run.children is not None:
                    send_children(task.app, run)
            except BaseException as exc:  # every exception: the hooks see it, then as above
                error = exc
            finally:
                job_var.reset(token)
        ending: object
        if error is None:
            try:
                ending = self.result(task, opts, value)
            except Fail as unstorable:
                ending = unstorable
        elif isinstance(error, MiddlewareError):
            ending = self.hook_failure(error, opts, run.job)
        elif isinstance(error, (Retry, Fail, TimeLimitExceeded)) or not isinstance(error, (Exception, SystemExit)):
            ending = error
        else:
            ending = self.failure(task, opts, env, run.job, error)
        ending = self.resume(chain, run, opts, value, error, ending)
        if isinstance(ending, BaseException):
            raise ending
        return ending

    def resume(self, chain: Chain[TaskRun, object], run: TaskRun, opts: TaskOptions, value: object,
               error: BaseException | None, ending: object) -> object:
        """Resume a run's entered hooks with its outcome: ``value`` returned or ``error``
        raised (by the function, or a hook before ``yield``), and ``ending``, the job's
        ending decided without them (None or a Result: ack; an exception: nack). Returns
        that ending, or the one a hook's error makes (:meth:`hook_failure`)."""
        job = run.job
        if error is None and isinstance(ending, BaseException):
            error = ending  # a result that cannot be stored
        slot = current_slot()
        outcome = HookOutcome(value if error is None else None, error,
                              run_ending(error, self.is_final(ending, job), job.cancelled.is_set(),
                                         slot is not None and slot.reached))
        after = chain.resume(outcome, lambda exc: "dead" if self.is_final(self.hook_failure(exc, opts, job), job)
                             else "retry")
        if after.error is error:
            return ending
        assert after.error is not None
        return self.hook_failure(after.error, opts, job)

    @staticmethod
    def hook_failure(error: BaseException, opts: TaskOptions, job: Job) -> Retry | Fail:
        """How a job ends on a hook's error: a Retry or Fail the hook raised as given,
        else a retry by the task's backoff (``retry_on`` and ``fail_on`` are about the
        task's own errors), the error as its cause."""
        if isinstance(error, (Retry, Fail)):
            return error
        failed = Retry(delay_ms=opts.retry_delay_ms(job.attempt))
        failed.__cause__ = error
        return failed

    @staticmethod
    def is_final(ending: object, job: Job) -> bool:
        """Whether ``ending`` sends the job to the dead letters."""
        return isinstance(ending, Fail) or isinstance(ending, Retry) and job.attempt >= job.max_attempts

    def options_for(self, task: Task[Any, Any], env: envelope.Envelope, job: Job, slot: Slot | None) -> TaskOptions:
        """The policy of one job of ``task``: the task's, with the envelope's per-send
        overrides.

        Raises:
            Undeliverable: an override that does not resolve on this worker.
            Fail: the job is older than its ``max_age`` (it is not run).
        """
        opts = task.policy
        if env.opts:
            try:
                opts = opts.with_overrides(env.opts, self.backoff_functions)
            except InvalidArgument as exc:
                raise Undeliverable(str(exc)) from None
        enqueued_ms = env.sent_ms(job)
        if opts.max_age_ms is not None and enqueued_ms is not None and slot is not None:
            # The age counts from when the job was due: a send_in(60) is not old at 60 s.
            age_ms = slot.server_now_ms() - enqueued_ms - env.delay_ms
            if age_ms > opts.max_age_ms:
                raise Fail(f"max_age exceeded: due {age_ms / 1000:.3f}s ago, max_age is {opts.max_age_ms / 1000:g}s; not run")
        return opts

    def run_batch(self, jobs: list[Job]) -> list[object]:
        """The worker's batch handler of the batch tasks' queues (:attr:`batch_queues`):
        runs the jobs of one queue as one call of its batch task; one outcome per job
        (:mod:`pyqueue.tasks.batch`)."""
        return self.batches.run(jobs)

    def run_alone(self, task: BatchTask[Any, Any], job: Job) -> object:
        """A job of a batch task leased alone (``t.drain()``, or sent to a queue served
        one job at a time): a batch of one."""
        (outcome,) = self.batches.run_task(task, [job])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    @staticmethod
    def _limit_ending(task: Task[Any, Any], opts: TaskOptions, job: Job) -> LimitEnding:
        error = TimeLimitExceeded(f"task {task.name} exceeded its time limit of {(opts.time_limit_ms or 0) / 1000:g}s")
        return LimitEnding(
            error=error_text(error), delay_ms=opts.retry_delay_ms(job.attempt), final=opts.fails_at_once(error)
        )


def _name_of(function: object) -> str:
    """``module:qualname`` of a function, or '' for one without a stable name."""
    try:
        return qualified_name(function, "a backoff function")
    except InvalidArgument:
        return ""


def _call(task: Task[Any, Any], env: envelope.Envelope, slot: Slot | None, run: TaskRun) -> object:
    """Call a task's function with the envelope's arguments (await it on the worker's
    loop if it is ``async def``)."""
    if task.is_async:
        if slot is None:
            raise InvalidArgument(f"task {task.name} is async: run it in an AsyncWorker")
        return slot.run_awaitable(_in_context(run, task.fn(*env.args, **env.kwargs)))
    return task.fn(*env.args, **env.kwargs)


async def _in_context(run: TaskRun, coroutine: Any) -> Any:
    """Await a task's coroutine with :func:`current_job` set (it runs on the loop's thread)."""
    job_var.set(run)  # this task's own context copy: nothing to reset
    return await coroutine
