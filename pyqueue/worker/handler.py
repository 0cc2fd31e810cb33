"""What a worker knows of its handler besides how to call it: a declared seam.

A handler is a callable of one :class:`~pyqueue.protocol.models.Job`. That is all a plain
function is, and all a worker needs to run one. A handler that offers more (the task
layer's dispatcher: the task names it serves, a hook for jobs that ended, queues it runs
in batches, an event loop it needs) says so by having a ``handler_spec()`` method that
answers a :class:`HandlerSpec` (:class:`DeclaredHandler`). The worker reads that one
declaration when it is made, and nothing else of the handler, so a handler's attribute
that happens to share a name with one of these is never taken for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyqueue.protocol.core import MAX_BATCH, check_int
from pyqueue.protocol.models import Job

#: The most jobs in one batch (one lease call).
MAX_BATCH_SIZE = MAX_BATCH
#: The longest ``batch_wait_ms``.
MAX_BATCH_WAIT_MS = 600_000


@dataclass(frozen=True)
class BatchSpec:
    """How one queue is served in batches: at most ``size`` jobs per handler call, and
    a batch that came back short waits at most ``wait_ms`` for more."""

    size: int
    wait_ms: int = 0

    @staticmethod
    def of(size: object, wait_ms: object = 0, what: str = "batch") -> BatchSpec:
        """A checked spec.

        Raises:
            InvalidArgument: ``size`` not an int in [1, 1000], or ``wait_ms`` not an int
                in [0, 600000].
        """
        return BatchSpec(
            check_int(size, what, 1, MAX_BATCH_SIZE), check_int(wait_ms, f"{what}_wait_ms", 0, MAX_BATCH_WAIT_MS)
        )


@dataclass(frozen=True)
class HandlerSpec:
    """What a handler declares beyond being callable. The defaults are a plain handler's."""

    #: The task names it serves, advertised in the worker's service registration.
    task_names: tuple[str, ...] = ()
    #: Called once a job's ack ('ok') or dead-nack ('dead') answered OK, with the job and
    #: how it ended (a task-layer flow step reports its end to the steps waiting for it).
    job_ended: Callable[[Job, str], None] | None = None
    #: Whether ``job_ended`` wants to hear of a job; the handler thread then waits for
    #: that job's ack, not only posts it (None: of every job, when ``job_ended`` is set).
    reports_end: Callable[[Job], bool] | None = None
    #: It runs coroutines: only an AsyncWorker can serve it.
    needs_event_loop: bool = False
    #: The queues it serves in batches, and how (queue name -> BatchSpec); with
    #: ``run_batch``, which takes the jobs of one batch and answers one result each. Not
    #: None (even empty) says the handler sets its own batches: a worker's ``batch=``
    #: is then refused.
    batch_queues: Mapping[str, BatchSpec] | None = None
    run_batch: Callable[[list[Job]], object] | None = None


@runtime_checkable
class DeclaredHandler(Protocol):
    """A handler that declares a :class:`HandlerSpec` (the task layer's dispatcher)."""

    def __call__(self, job: Job, /) -> object: ...

    def handler_spec(self) -> HandlerSpec: ...


#: What a plain handler declares: nothing.
PLAIN = HandlerSpec()


def spec_of(handler: object) -> HandlerSpec:
    """The spec ``handler`` declares, or :data:`PLAIN`."""
    return handler.handler_spec() if isinstance(handler, DeclaredHandler) else PLAIN
