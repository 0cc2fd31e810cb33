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
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pyqueue.protocol.models import Job

if TYPE_CHECKING:
    from pyqueue.worker.batch import BatchSpec


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
