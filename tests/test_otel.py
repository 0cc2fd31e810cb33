"""pyqueue.contrib.otel: the tracing middleware, with the OpenTelemetry SDK's in-memory
exporter. In-process (a worker run in this process, on both backends): the producer and
consumer spans' names, kinds and attributes, the context in the envelope's meta, one
consumer span per attempt, the exception recorded, the consumer span current inside
sync and async tasks, batch tasks, time limits. Across processes (a real redis-server):
the send here, the run in a ``pyqueue worker`` process exporting its spans to a file;
the consumer span continues the producer's trace, as its child. And ``import pyqueue``
does not import OpenTelemetry.

Skipped when the SDK is not installed, except under ``CI=true`` (the ``test`` extra
installs it), where that is an error."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import IN_CI, RedisServer
from tasks_support import burst

from pyqueue import Tasks, current_job
from pyqueue.tasks import Fail, Middleware, Sending

try:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
except ImportError:
    if IN_CI:
        raise  # the test extra installs the SDK: under CI its absence is a failure
    pytest.skip("opentelemetry-sdk is not installed", allow_module_level=True)

from pyqueue.contrib.otel import Tracing  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAST = {"backoff_base_ms": 1, "backoff_cap_ms": 5}
PRODUCER, CONSUMER = trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER


class Traced:
    """A Tasks object on the test's server with the tracing middleware, and its spans."""

    def __init__(self, client: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tasks = Tasks(client=client)
        self.tasks.middleware(Tracing(tracer_provider=self.provider))
        self.tracer = self.provider.get_tracer("test")

    def spans(self, kind: trace.SpanKind | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if kind is None or s.kind == kind]


@pytest.fixture
def traced(r: redis.Redis) -> Traced:
    return Traced(r)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_send_and_its_run_are_a_producer_span_and_its_child_consumer_span(traced: Traced) -> None:
    tasks = traced.tasks
    inside: list[Any] = []

    @tasks.task(name="billing.charge", queue="billing", keep_result=60)
    def charge(cents: int) -> int:
        inside.append(trace.get_current_span().get_span_context())
        return cents

    with traced.tracer.start_as_current_span("request") as request:
        sent = charge.send(500)
    (producer,) = traced.spans(PRODUCER)
    assert producer.name == "send billing"
    assert producer.parent is not None and producer.parent.span_id == request.get_span_context().span_id
    assert attributes(producer) == {
        "messaging.system": "pyqueue", "messaging.operation.name": "send", "messaging.operation.type": "send",
        "messaging.destination.name": "billing", "messaging.message.id": sent.id, "pyqueue.task.name": "billing.charge",
    }
    # The context travels in the envelope's meta as W3C trace context.
    payload = tasks.queue("billing").get(sent.id, with_payload=True).payload
    assert payload is not None
    meta = json.loads(payload)["meta"]
    ctx = producer.get_span_context()
    version, trace_id, span_id, flags = meta["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert int(flags, 16) & 1  # sampled

    burst(tasks, **FAST)
    assert sent.result(timeout=5) == 500
    (consumer,) = traced.spans(CONSUMER)
    assert consumer.name == "process billing"
    assert consumer.context is not None and consumer.context.trace_id == ctx.trace_id
    assert consumer.parent is not None and consumer.parent.span_id == ctx.span_id
    assert attributes(consumer) == {
        "messaging.system": "pyqueue", "messaging.operation.name": "process", "messaging.operation.type": "process",
        "messaging.destination.name": "billing", "messaging.message.id": sent.id, "pyqueue.task.name": "billing.charge",
        "pyqueue.job.attempt": 1, "pyqueue.job.max_attempts": 5, "pyqueue.job.outcome": "ok",
    }
    assert consumer.status.status_code == trace.StatusCode.UNSET
    assert inside == [consumer.context]  # the consumer span is current inside the task


def test_each_attempt_is_a_consumer_span_and_failures_are_recorded(traced: Traced) -> None:
    tasks = traced.tasks

    @tasks.task(name="flaky", max_attempts=3)
    def flaky() -> None:
        if current_job().attempt < 3:
            raise ConnectionError(f"attempt {current_job().attempt} failed")

    @tasks.task(name="doomed", max_attempts=2)
    def doomed() -> None:
        raise ValueError("always")

    @tasks.task(name="refused")
    def refused() -> None:
        raise Fail("bad input")

    sent = flaky.send(), doomed.send(), refused.send()
    burst(tasks, **FAST)
    producers = {s.attributes["messaging.message.id"]: s for s in traced.spans(PRODUCER) if s.attributes}
    runs: dict[str, list[ReadableSpan]] = {}
    for span in sorted(traced.spans(CONSUMER), key=lambda s: s.start_time or 0):
        assert span.attributes is not None
        runs.setdefault(str(span.attributes["pyqueue.task.name"]), []).append(span)
    outcomes = {name: [(s.attributes or {})["pyqueue.job.attempt"] for s in spans] for name, spans in runs.items()}
    assert outcomes == {"flaky": [1, 2, 3], "doomed": [1, 2], "refused": [1]}
    endings = {name: [(s.attributes or {})["pyqueue.job.outcome"] for s in spans] for name, spans in runs.items()}
    assert endings == {"flaky": ["retry", "retry", "ok"], "doomed": ["retry", "dead"], "refused": ["dead"]}
    # Every run of a job is a child of the job's one producer span: one trace per send.
    for sent_task, name in zip(sent, ["flaky", "doomed", "refused"]):
        producer = producers[sent_task.id]
        for run in runs[name]:
            assert run.parent is not None and run.parent.span_id == producer.context.span_id
            assert run.context is not None and run.context.trace_id == producer.context.trace_id
    failed = runs["flaky"][0]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.status.description == "ConnectionError: attempt 1 failed"
    assert (failed.attributes or {})["error.type"] == "builtins.ConnectionError"
    (event,) = failed.events
    assert event.name == "exception" and (event.attributes or {})["exception.message"] == "attempt 1 failed"
    assert runs["flaky"][2].status.status_code == trace.StatusCode.UNSET and not runs["flaky"][2].events
    assert (runs["refused"][0].attributes or {})["error.type"] == "pyqueue.worker.endings.Fail"


def test_the_consumer_span_is_current_in_an_async_task(traced: Traced) -> None:
    tasks = traced.tasks

    @tasks.task(name="aio", keep_result=60)
    async def aio() -> str:
        await asyncio.sleep(0)
        with traced.tracer.start_as_current_span("inside"):
            pass
        return format(trace.get_current_span().get_span_context().span_id, "016x")

    sent = aio.send()
    burst(tasks, **FAST)
    (consumer,) = traced.spans(CONSUMER)
    assert consumer.context is not None
    assert sent.result(timeout=5) == format(consumer.context.span_id, "016x")
    (inside,) = [s for s in traced.spans() if s.name == "inside"]
    assert inside.parent is not None and inside.parent.span_id == consumer.context.span_id


def test_each_job_of_a_batch_has_its_consumer_span_under_its_own_producer(traced: Traced) -> None:
    tasks = traced.tasks

    @tasks.task(name="index", batch=10, max_attempts=1)
    def index(items: list[int]) -> list[int | Exception]:
        return [ValueError("odd") if x % 2 else x for x in items]

    sent = index.send_many([1, 2, 3])
    burst(tasks, **FAST)
    producers = {(s.attributes or {})["messaging.message.id"]: s for s in traced.spans(PRODUCER)}
    consumers = {(s.attributes or {})["messaging.message.id"]: s for s in traced.spans(CONSUMER)}
    assert set(consumers) == {s.id for s in sent}
    for s in sent:
        consumer = consumers[s.id]
        assert consumer.parent is not None and consumer.parent.span_id == producers[s.id].context.span_id
    assert [(consumers[s.id].attributes or {})["pyqueue.job.outcome"] for s in sent] == ["dead", "ok", "dead"]


def test_a_run_stopped_at_its_time_limit_is_marked_so(traced: Traced) -> None:
    tasks = traced.tasks

    @tasks.task(name="slow", time_limit=0.2, max_attempts=1)
    def slow() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # bytecode: the time limit's exception lands
            pass

    slow.send()
    burst(tasks, **FAST)
    (consumer,) = traced.spans(CONSUMER)
    assert (consumer.attributes or {})["pyqueue.job.outcome"] == "time_limit"
    assert (consumer.attributes or {})["error.type"] == "pyqueue.worker.slots.TimeLimitExceeded"


def test_a_refused_send_ends_its_producer_span_with_the_error(traced: Traced) -> None:
    tasks = traced.tasks

    class Refuse(Middleware):
        def around_send(self, message: Sending) -> None:
            raise PermissionError("no tenant")

    tasks.middleware(Refuse())  # inside Tracing: the producer span sees the refusal

    @tasks.task(name="job")
    def job() -> None:
        pass

    with pytest.raises(Exception, match="no tenant"):
        job.send()
    (producer,) = traced.spans(PRODUCER)
    assert producer.status.status_code == trace.StatusCode.ERROR
    assert "messaging.message.id" not in (producer.attributes or {})
    assert (producer.attributes or {})["error.type"] == "pyqueue.tasks.middleware.MiddlewareError"


# -- across processes --------------------------------------------------------------------

APP = textwrap.dedent(
    '''
    """Tasks traced to a file of JSON lines (the worker process's spans)."""
    import json
    import os

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from pyqueue import Tasks, current_job
    from pyqueue.contrib.otel import Tracing


    class JsonLines(SpanExporter):
        def __init__(self, path):
            self.path = path

        def export(self, spans):
            with open(self.path, "a", encoding="utf-8") as out:
                for span in spans:
                    out.write(json.dumps({
                        "name": span.name, "kind": span.kind.name, "trace_id": span.context.trace_id,
                        "span_id": span.context.span_id, "parent_id": span.parent.span_id if span.parent else None,
                        "attributes": dict(span.attributes),
                    }) + "\\n")
            return SpanExportResult.SUCCESS


    tasks = Tasks()
    if "SPANS_FILE" in os.environ:  # the worker process; the test process adds its own
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(JsonLines(os.environ["SPANS_FILE"])))
        tasks.middleware(Tracing(tracer_provider=provider))


    @tasks.task(name="otel_app.flaky", max_attempts=3, backoff=0)
    def flaky(n):
        if current_job().attempt == 1:
            raise ValueError("the first attempt fails")
        return n
    '''
)


def test_the_run_in_a_worker_process_continues_the_trace_of_the_send(tmp_path: Path, redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.flushall()
    (tmp_path / "otel_app.py").write_text(APP)
    sys.path.insert(0, str(tmp_path))
    try:
        import otel_app  # the producer's copy of the module the worker serves

        traced = Traced(client)
        otel_app.tasks.bind(client)
        otel_app.tasks.middleware(Tracing(tracer_provider=traced.provider))
        with traced.tracer.start_as_current_span("request"):
            sent = otel_app.flaky.send(7)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("otel_app", None)
    spans_file = tmp_path / "spans.jsonl"
    env = dict(os.environ, SPANS_FILE=str(spans_file), PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    done = subprocess.run(
        [sys.executable, "-m", "pyqueue", "--url", redis_server.url(), "worker", "otel_app:tasks", "--burst",
         "--block-ms", "200"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sent.state() == "done"
    (producer,) = traced.spans(PRODUCER)
    runs = [json.loads(line) for line in spans_file.read_text(encoding="utf-8").splitlines()]
    assert [(r["name"], r["kind"], r["attributes"]["pyqueue.job.attempt"], r["attributes"]["pyqueue.job.outcome"])
            for r in runs] == [("process default", "CONSUMER", 1, "retry"), ("process default", "CONSUMER", 2, "ok")]
    for run in runs:
        assert run["trace_id"] == producer.context.trace_id
        assert run["parent_id"] == producer.context.span_id
        assert run["attributes"]["messaging.message.id"] == sent.id


def test_importing_pyqueue_does_not_import_opentelemetry() -> None:
    """pyqueue's own code loads no OpenTelemetry module. (redis-py itself imports parts
    of the SDK when it is installed, for its own metrics: those are counted out.)"""
    code = textwrap.dedent("""
        import sys
        import fakeredis, redis, redis.asyncio
        def otel():
            return {m for m in sys.modules if m.startswith("opentelemetry")}
        before = otel()
        import pyqueue, pyqueue.tasks, pyqueue.worker, pyqueue.worker.aio, pyqueue.cli
        pyqueue.Tasks, pyqueue.Middleware
        assert otel() == before, sorted(otel() - before)
        assert "pyqueue.contrib.otel" not in sys.modules
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
