"""What a payload may and may not make a task worker do: it never names code to run
(per-send backoff functions and exception classes are looked up, not imported), a
newer envelope is never run as a raw job, arguments that do not fit fail at once, and
max_age counts from when a delayed job was due. On fakeredis and a real redis-server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from tasks_support import burst, job_state

from pyqueue import NewJob
from pyqueue.protocol.models import Job
from pyqueue.tasks import Tasks, envelope


def slow_backoff(attempt: int) -> float:
    return 0.001 * attempt


@pytest.fixture
def tasks(r: redis.Redis) -> Tasks:
    return Tasks(client=r)


def send_raw(tasks: Tasks, payload: bytes, job_id: str, max_attempts: int = 1, queue: str = "default") -> None:
    tasks.queue(queue).enqueue_many([NewJob(payload, job_id=job_id, max_attempts=max_attempts)])


def payload(task: str, args: list[Any], meta: dict[str, Any] | None = None, v: Any = 1) -> bytes:
    return json.dumps({"v": v, "task": task, "args": args, "kwargs": {}, "meta": meta or {}}).encode()


def test_a_per_send_backoff_may_name_only_a_backoff_some_task_registered(tasks: Tasks) -> None:
    calls: list[int] = []

    @tasks.task(name="t.fails", backoff=slow_backoff)
    def fails(n: int) -> None:
        calls.append(n)
        raise ValueError("nope")

    # A payload that names json:dumps as its backoff: never called, the job retried.
    send_raw(tasks, payload("t.fails", [1], {"opts": {"backoff": {"function": "json:dumps"}}}), "evil")
    # One that names the registered backoff: applied.
    send_raw(tasks, payload("t.fails", [2], {"opts": {"backoff": {"function": f"{__name__}:slow_backoff"}}}), "fine")
    burst(tasks)
    assert "is not the backoff of any task of this worker" in job_state(tasks, "default", "evil").error
    assert calls == [2]  # the evil one never ran the task either
    assert "ValueError: nope" in job_state(tasks, "default", "fine").error


def test_per_send_exception_classes_are_looked_up_among_imported_modules_never_imported(tasks: Tasks) -> None:
    @tasks.task(name="t.raises")
    def raises() -> None:
        raise KeyError("k")

    import sys

    assert "antigravity" not in sys.modules
    send_raw(tasks, payload("t.raises", [], {"opts": {"fail_on": ["antigravity:Fly"]}}), "import-me")
    send_raw(tasks, payload("t.raises", [], {"opts": {"fail_on": ["os:system"]}}), "not-a-class")
    send_raw(tasks, payload("t.raises", [], {"opts": {"fail_on": ["builtins:KeyError"]}}, ), "ok", max_attempts=5)
    burst(tasks)
    assert "antigravity" not in sys.modules
    assert "is not imported by this worker" in job_state(tasks, "default", "import-me").error
    assert "is not an exception class" in job_state(tasks, "default", "not-a-class").error
    ok = job_state(tasks, "default", "ok")
    assert ok.state == "dead" and ok.attempts == 1 and "KeyError" in ok.error  # fail_on applied: dead at once


def test_a_newer_envelope_is_retried_never_run_as_a_raw_job(tasks: Tasks) -> None:
    raw_runs: list[str] = []

    @tasks.task(name="t.x")
    def x() -> None:
        pass

    @tasks.raw_handler
    def raw(job: Job) -> None:
        raw_runs.append(job.id)

    send_raw(tasks, payload("t.x", [], v=2), "v2")
    send_raw(tasks, payload("t.x", [], v=True), "vtrue")
    send_raw(tasks, payload("t.x", [], v=1.0), "vfloat")
    send_raw(tasks, b'{"v":1,"task":"t.x","args":[{"$pq":"nonsense","v":1}],"kwargs":{},"meta":{}}', "badtag")
    send_raw(tasks, b"plain bytes", "raw")
    burst(tasks)
    assert raw_runs == ["raw"]
    for job_id in ("v2", "vtrue", "vfloat"):
        assert "is not known to this worker" in job_state(tasks, "default", job_id).error
    assert "cannot read" in job_state(tasks, "default", "badtag").error


def test_arguments_that_do_not_fit_fail_at_once_but_a_typeerror_of_the_task_retries(tasks: Tasks) -> None:
    @tasks.task(name="t.add")
    def add(a: int, b: int) -> int:
        return a + b

    @tasks.task(name="t.bad")
    def bad() -> None:
        raise TypeError("the task's own bug")

    send_raw(tasks, payload("t.add", [1, 2, 3]), "extra", max_attempts=5)
    send_raw(tasks, payload("t.bad", []), "own", max_attempts=2)
    burst(tasks)
    extra = job_state(tasks, "default", "extra")
    assert extra.state == "dead" and extra.attempts == 1
    assert "the arguments do not fit task t.add" in extra.error
    own = job_state(tasks, "default", "own")
    assert own.state == "dead" and own.attempts == 2 and "the task's own bug" in own.error


def test_max_age_counts_from_when_a_delayed_job_was_due() -> None:
    tasks = Tasks()
    ran: list[int] = []

    @tasks.task(name="t.fresh", max_age=10)
    def fresh(n: int) -> None:
        ran.append(n)

    with tasks.testing() as t:
        fresh.send_in(60, 1)  # due in 60 s: at 60 s it is 0 s old, not 60
        late = fresh.send(2)
        t.advance(30)  # the second has waited 30 s since it was due: too old
        t.drain(raise_errors=False)
        assert ran == [1]
        assert late.state() == "dead"


def test_the_envelope_carries_the_delay_of_a_delayed_send(tasks: Tasks) -> None:
    @tasks.task(name="t.later")
    def later() -> None:
        pass

    sent = later.send_in(5)
    info = tasks.queue("default").get(sent.id, with_payload=True)
    assert info.payload is not None
    assert envelope.decode(info.payload).delay_ms == 5000
    assert envelope.decode(tasks.queue("default").get(later.send().id, with_payload=True).payload or b"").delay_ms == 0
