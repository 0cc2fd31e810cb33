"""OpenTelemetry tracing of tasks, as a middleware (``pip install pyqueue-redis[otel]``)::

    from pyqueue.contrib.otel import Tracing

    tasks.middleware(Tracing())                 # the global tracer provider
    tasks.middleware(Tracing(tracer_provider=provider))

Register it in the producer and in the worker (the module that defines the tasks is
imported by both). Nothing is traced unless it is registered: ``import pyqueue`` never
imports OpenTelemetry, and this module needs only ``opentelemetry-api`` (spans go
wherever the application's SDK sends them; without an SDK they are no-ops).

**Spans** (names and attributes after OpenTelemetry's messaging semantic conventions):

* one ``PRODUCER`` span per send (``send``, ``send_in``, ``send_at``, ``asend``, each job
  of ``send_many``), named ``send <queue>``, a child of the span current in the caller;
* one ``CONSUMER`` span per run of a task's function in a worker, named
  ``process <queue>``: every attempt is a span of its own, so a retried job shows as
  several runs, each with its ``pyqueue.job.attempt``.

Attributes: ``messaging.system`` = ``"pyqueue"`` (the convention's list has no entry for
a queue on Redis; the system is this library, whatever the server); ``messaging.operation.name``
and ``messaging.operation.type`` = ``"send"`` or ``"process"``;
``messaging.destination.name`` = the queue; ``messaging.message.id`` = the job id (a
producer span gets it once the send returns); ``pyqueue.task.name``; on consumer spans
``pyqueue.job.attempt``, ``pyqueue.job.max_attempts`` and ``pyqueue.job.outcome``, how
the run ends as far as the worker knows then: ``ok``, ``retry``, ``dead``, ``time_limit``
or ``cancelled`` (:class:`~pyqueue.tasks.HookOutcome`); on a producer span whose job was
there already (``unique``), ``pyqueue.job.added`` = false. A send or run that raised
records the exception (an ``exception`` event), ``error.type`` = its class's qualified
name, and the status ERROR; so does a retry's run, since its function raised.

**Context** travels in the envelope's ``meta`` as W3C Trace Context: ``traceparent``
and, when there is one, ``tracestate`` (``propagator=`` takes another
``TextMapPropagator``, e.g. a composite one with baggage). A consumer span's **parent**
is the producer span (not a link): one trace then holds the request that sent the job,
the send and every run of it, retries included, each run a sibling span under the same
send, which is what a trace viewer shows best for a job sent once and run by one
consumer at a time. A job sent without trace context starts a trace of its own. The
consumer span is the current span while the task's function runs (sync or ``async
def``), so spans the task makes are its children; in a batch task's batch, where one call
runs many jobs, each job gets its consumer span (parent: its own producer span) but none
is made current.

On ``on_worker_stop`` the tracer provider is flushed (``force_flush``, when it has one),
so a worker's last spans are exported before its process exits.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pyqueue.protocol.version import VERSION
from pyqueue.tasks.handle import SentTask
from pyqueue.tasks.middleware import HookOutcome, Middleware, Sending
from pyqueue.tasks.run import TaskRun
from pyqueue.worker.endings import error_text

#: ``messaging.system``: this library (see the module docstring).
SYSTEM = "pyqueue"


class Tracing(Middleware):
    """The tracing middleware (see the module docstring).

    Args:
        tracer_provider: where spans go; None: the global one (``trace.set_tracer_provider``),
            looked up when this object is made.
        propagator: how context is written into and read from the envelope's ``meta``;
            None: W3C Trace Context (``traceparent``, ``tracestate``).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 propagator: TextMapPropagator | None = None) -> None:
        self.tracer_provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.tracer = trace.get_tracer("pyqueue.contrib.otel", VERSION, tracer_provider=self.tracer_provider)
        self.propagator = propagator if propagator is not None else TraceContextTextMapPropagator()

    def around_send(self, message: Sending) -> Generator[None, HookOutcome[SentTask[Any]], None]:
        span = self.tracer.start_span(f"send {message.queue}", kind=SpanKind.PRODUCER, attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": message.queue,
            "pyqueue.task.name": message.task_name,
        })
        # Not made current: the send is one call with nothing under it to trace, and the
        # sends of one send_many are open at once (their contexts would interleave).
        self.propagator.inject(message.meta, context=trace.set_span_in_context(span))
        outcome = yield
        if outcome.value is not None:
            span.set_attribute("messaging.message.id", outcome.value.id)
            if not outcome.value.added:
                span.set_attribute("pyqueue.job.added", False)
        _end(span, outcome.error)

    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        parent = self.propagator.extract(run.meta, context=otel_context.Context())
        span = self.tracer.start_span(f"process {run.queue}", context=parent, kind=SpanKind.CONSUMER, attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": run.queue,
            "messaging.message.id": run.id,
            "pyqueue.task.name": run.task,
            "pyqueue.job.attempt": run.attempt,
            "pyqueue.job.max_attempts": run.max_attempts,
        })
        token = None if run.in_batch else otel_context.attach(trace.set_span_in_context(span))
        try:
            outcome = yield
        finally:  # detached even when the worker closes the hook without an outcome
            if token is not None:
                otel_context.detach(token)
        span.set_attribute("pyqueue.job.outcome", outcome.ending)
        _end(span, outcome.error)

    def on_worker_stop(self) -> None:
        flush = getattr(self.tracer_provider, "force_flush", None)
        if callable(flush):
            flush()


def _end(span: trace.Span, error: BaseException | None) -> None:
    if error is not None:
        span.record_exception(error)
        span.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}")
        span.set_status(Status(StatusCode.ERROR, error_text(error)))
    span.end()
