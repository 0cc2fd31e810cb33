"""Running batch tasks (``@tasks.task(batch=N)``, :class:`~pyqueue.tasks.task.BatchTask`):
the jobs of one lease call, one call of the task's function.

A worker serves a batch task's queue in batches (:mod:`pyqueue.worker.batch`) and calls
:meth:`BatchDispatch.run` with each batch. The answer is one outcome per job, which the
worker turns into that job's ack or nack:

* a job whose payload is not an envelope of this batch task (another task sent to its
  queue with a per-send ``queue=``, a raw job, a newer envelope version), or whose
  per-send options do not resolve: retried with the backoff, then dead, with its own
  error (:class:`~pyqueue.tasks.dispatch.Undeliverable`); never given to the function;
* one older than ``max_age``: dead, not run; one that does not carry exactly one item:
  dead (a retry would not change it);
* the others' items go to the function, in lease order. Its result at a job's position
  is that job's outcome: a value acks it (kept with ``keep_result``), an exception
  instance fails it as if a single run had raised it (``retry_on``, ``fail_on``,
  ``backoff``, max attempts; a :class:`Retry` or :class:`Fail` as given). The function
  raising fails each of those jobs so, and so does an answer that is not a list of one
  result per item (:class:`~pyqueue.worker.batch_endings.BatchError`).

The batch's time limit is the smallest ``time_limit`` among its jobs, counted from the
lease of its first job; at the limit the heartbeat ends every job still running with
:class:`~pyqueue.TimeLimitExceeded` under each job's policy (:mod:`pyqueue.worker.slots`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job, Result
from pyqueue.worker.batch import BatchSlot
from pyqueue.worker.batch_endings import outcomes_of
from pyqueue.worker.slots import LimitEnding, Slot, TimeLimitExceeded, current_slot
from pyqueue.tasks import envelope
from pyqueue.tasks.codec import to_json
from pyqueue.tasks.middleware import Chain, Hook
from pyqueue.tasks.policy import TaskOptions
from pyqueue.tasks.run import TaskRun, Undeliverable, batch_var
from pyqueue.tasks.task import BatchTask
from pyqueue.worker import Fail, Retry
from pyqueue.worker.endings import error_text


class Endings(Protocol):
    """What a batch needs of the dispatcher it runs for (a
    :class:`~pyqueue.tasks.dispatch.Dispatcher`, declared above this module): its run
    hooks, and how it decides a job's policy and ending, as for a single run."""

    @property
    def run_hooks(self) -> tuple[Hook, ...]: ...

    def options_for(self, task: BatchTask[Any, Any], env: envelope.Envelope, job: Job, slot: Slot | None) -> TaskOptions: ...

    def resume(self, chain: Chain[TaskRun, object], run: TaskRun, opts: TaskOptions, value: object,
               error: BaseException | None, ending: object) -> object: ...

    def hook_failure(self, error: BaseException, opts: TaskOptions, job: Job) -> Retry | Fail: ...


class BatchRun(TaskRun):
    """A job of a batch task's batch (``in_batch``)."""

    __slots__ = ()
    in_batch = True


class BatchDispatch:
    """The batch tasks of a dispatcher, by queue (see the module docstring)."""

    def __init__(self, dispatcher: Endings, tasks: Mapping[str, BatchTask[Any, Any]]) -> None:
        self.dispatcher = dispatcher
        self.by_queue: dict[str, BatchTask[Any, Any]] = {}
        for task in tasks.values():
            other = self.by_queue.setdefault(task.policy.queue, task)
            if other is not task:
                raise InvalidArgument(f"batch tasks {other.name} and {task.name} share queue {task.policy.queue!r}: "
                                      "a batch task's queue holds its jobs only")

    def run(self, jobs: list[Job]) -> list[object]:
        """Run a batch of one queue's jobs (a worker's batch handler); one outcome each."""
        name = jobs[0].queue
        # A partition "<queue>#<p>" serves its queue's batch task.
        task = self.by_queue.get(name) or self.by_queue.get(name.rpartition("#")[0])
        if task is None:  # not a batch task's queue: the worker was told otherwise
            return [Undeliverable(f"queue {name!r} has no batch task in this worker")] * len(jobs)
        return self.run_task(task, jobs)

    def run_task(self, task: BatchTask[Any, Any], jobs: list[Job]) -> list[object]:
        """Call ``task`` with the items of ``jobs``; one outcome per job."""
        slot = current_slot()
        out: list[object] = [None] * len(jobs)
        items: list[Any] = []
        runs: list[TaskRun] = []
        policies: list[TaskOptions] = []
        positions: list[int] = []
        for i, job in enumerate(jobs):
            try:
                env = envelope.decode(job.payload)
                if env.task != task.name:
                    raise Undeliverable(f"a job of task {env.task!r} in the queue of batch task {task.name!r}, which "
                                        "holds that task's jobs only: not run here")
                opts = self.dispatcher.options_for(task, env, job, slot)
                if len(env.args) != 1 or env.kwargs:
                    raise Fail(f"the arguments do not fit batch task {task.name}: one item per job, got "
                               f"{len(env.args)} arguments and {len(env.kwargs)} keyword arguments")
            except envelope.EnvelopeError as exc:
                out[i] = Undeliverable(f"{exc} (in the queue of batch task {task.name!r})")
                continue
            except (Retry, Fail) as exc:  # Undeliverable is a Retry
                out[i] = exc
                continue
            items.append(env.args[0])
            runs.append(BatchRun(job, task.name, env.sent_ms(job), None, env.meta))
            policies.append(opts)
            positions.append(i)
        chains: list[Chain[TaskRun, object]] | None = None
        if self.dispatcher.run_hooks and items:
            chains, kept = self.enter_hooks(runs, policies, positions, out)
            items, runs = [items[k] for k in kept], [runs[k] for k in kept]
            policies, positions = [policies[k] for k in kept], [positions[k] for k in kept]
        if not items:
            return out
        if slot is not None:
            slot.name = task.name
            self.limit(task, slot, runs, policies)
        error: BaseException | None = None
        returned: object = None
        token = batch_var.set(runs)
        try:
            if task.is_async:
                if slot is None:
                    raise InvalidArgument(f"task {task.name} is async: run it in an AsyncWorker")
                returned = slot.run_awaitable(_in_batch(runs, task.batch_fn(items)))
            else:
                returned = task.batch_fn(items)
        except TimeLimitExceeded as exc:
            # Interrupted at the time limit: the hooks see it, then each job ends by its
            # policy (the worker's batch endings).
            if chains is not None:
                for k in reversed(range(len(chains))):
                    self.dispatcher.resume(chains[k], runs[k], policies[k], None, exc, exc)
            raise
        except (Exception, SystemExit) as exc:
            # SystemExit as in a single run: the function's failure, not the worker's end.
            error = exc
        finally:
            batch_var.reset(token)
        results = outcomes_of(returned, error, len(items))
        for position, run, opts, outcome in zip(positions, runs, policies, results):
            out[position] = self.outcome(task, run.job, opts, outcome)
        if chains is not None:
            # Last entered, first resumed: hooks that set context variables (a current
            # span) unwind in order.
            for k in reversed(range(len(chains))):
                result = results[k]
                failed = result if isinstance(result, BaseException) else None
                out[positions[k]] = self.dispatcher.resume(chains[k], runs[k], policies[k],
                                                           None if failed else result, failed, out[positions[k]])
        return out

    def enter_hooks(self, runs: list[TaskRun], policies: list[TaskOptions], positions: list[int],
                    out: list[object]) -> tuple[list[Chain[TaskRun, object]], list[int]]:
        """Enter the run hooks of each job of a batch, in order; a job whose hook failed
        is not run (its ending in ``out``). Returns the chains of the others and their
        indexes in ``runs``."""
        chains: list[Chain[TaskRun, object]] = []
        kept: list[int] = []
        for k, run in enumerate(runs):
            chain: Chain[TaskRun, object] = Chain("around_run")
            error = chain.enter(self.dispatcher.run_hooks, run)
            if error is None:
                chains.append(chain)
                kept.append(k)
            else:
                ending = self.dispatcher.hook_failure(error, policies[k], run.job)
                out[positions[k]] = self.dispatcher.resume(chain, run, policies[k], None, error, ending)
        return chains, kept

    @staticmethod
    def outcome(task: BatchTask[Any, Any], job: Job, opts: TaskOptions, outcome: object) -> object:
        """One item's result as its job's outcome for the worker: None (ack), a
        :class:`Result` (ack with it), or a Retry or Fail (nack) by the job's policy."""
        if isinstance(outcome, BaseException):
            if isinstance(outcome, (Retry, Fail)):
                return outcome
            failed: Retry | Fail = Fail() if opts.fails_at_once(outcome) else Retry(opts.retry_delay_ms(job.attempt))
            failed.__cause__ = outcome  # its error text, as `raise ... from outcome` would keep it
            return failed
        if opts.keep_result_ms is None:
            return None
        try:
            return Result(to_json(outcome, f"{task.name} result"), opts.keep_result_ms)
        except InvalidArgument as exc:
            return Fail(f"the result cannot be stored: {exc}")

    @staticmethod
    def limit(task: BatchTask[Any, Any], slot: Slot, runs: list[TaskRun], policies: list[TaskOptions]) -> None:
        """Set the batch's time limit: the smallest of its jobs', each job ending at it by
        its own policy."""
        limits = [opts.time_limit_ms for opts in policies if opts.time_limit_ms is not None]
        if not limits:
            return
        limit_ms = min(limits)
        error = error_text(TimeLimitExceeded(f"batch task {task.name} exceeded its time limit of {limit_ms / 1000:g}s"))
        endings = {
            run.job.receipt: LimitEnding(
                error=error, delay_ms=opts.retry_delay_ms(run.job.attempt),
                final=opts.fails_at_once(TimeLimitExceeded()),
            )
            for run, opts in zip(runs, policies)
        }
        grace_s = min(opts.time_limit_grace_s for opts in policies)
        if isinstance(slot, BatchSlot):
            slot.limit_each(limit_ms / 1000, endings, grace_s)
        else:  # a batch of one job, run in a single job's slot
            slot.limit(limit_ms / 1000, endings[slot.job.receipt], grace_s)
        for run in runs:
            run.deadline_ms = slot.leased_at_ms + limit_ms


async def _in_batch(runs: list[TaskRun], coroutine: Any) -> Any:
    """Await a batch task's coroutine with :func:`~pyqueue.tasks.run.current_batch` set (it runs on the loop's thread)."""
    batch_var.set(runs)  # this task's own context copy: nothing to reset
    return await coroutine
