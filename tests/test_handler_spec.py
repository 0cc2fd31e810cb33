"""The worker reads what a handler offers beyond being callable from one declaration,
``handler_spec()`` (pyqueue.worker.handler), never by probing its attributes."""

from __future__ import annotations

import fakeredis
import pytest

from pyqueue import InvalidArgument, Worker
from pyqueue.protocol.models import Job
from pyqueue.worker.handler import BatchSpec
from pyqueue.worker.handler import PLAIN, DeclaredHandler, HandlerSpec, spec_of


def plain(job: Job) -> None:
    pass


class Declaring:
    def __init__(self, spec: HandlerSpec) -> None:
        self.spec = spec

    def __call__(self, job: Job) -> None:
        pass

    def handler_spec(self) -> HandlerSpec:
        return self.spec


def worker(handler: object) -> Worker:
    return Worker(["q"], handler, redis=fakeredis.FakeRedis())  # type: ignore[arg-type]


def test_a_plain_function_declares_nothing_even_with_look_alike_attributes() -> None:
    def look_alike(job: Job) -> None:
        pass

    look_alike.task_names = ("not.a.task",)  # type: ignore[attr-defined]
    look_alike.needs_event_loop = True  # type: ignore[attr-defined]
    look_alike.batch_queues = {"q": BatchSpec.of(5, 0)}  # type: ignore[attr-defined]
    assert spec_of(plain) is PLAIN and spec_of(look_alike) is PLAIN
    assert not isinstance(look_alike, DeclaredHandler)
    w = worker(look_alike)  # a sync worker takes it: it declares no event loop
    assert w.task_names == () and w.handler_spec is PLAIN


def test_a_declared_spec_is_what_the_worker_reads() -> None:
    ended: list[tuple[str, str]] = []
    spec = HandlerSpec(task_names=("a.b", "c.d"), job_ended=lambda job, how: ended.append((job.id, how)),
                       reports_end=lambda job: True)
    w = worker(Declaring(spec))
    assert w.task_names == ("a.b", "c.d") and w.handler_spec is spec
    assert w.endings.on_ended is spec.job_ended and w.endings.reports_end is spec.reports_end


def test_a_handler_that_declares_an_event_loop_is_refused_by_the_sync_worker() -> None:
    with pytest.raises(InvalidArgument, match="no event loop"):
        worker(Declaring(HandlerSpec(needs_event_loop=True)))


def test_batch_queues_without_run_batch_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="run_batch"):
        worker(Declaring(HandlerSpec(batch_queues={"q": BatchSpec.of(5, 0)})))


def test_a_handler_that_sets_its_own_batches_refuses_the_workers_batch() -> None:
    declared = Declaring(HandlerSpec(batch_queues={}, run_batch=lambda jobs: [None] * len(jobs)))
    with pytest.raises(InvalidArgument, match="sets its own batches"):
        Worker(["q"], declared, redis=fakeredis.FakeRedis(), batch=5)  # type: ignore[arg-type]
