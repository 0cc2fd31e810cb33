"""A running job's progress (lua/progress.lua, lua/progress_show.lua): written only under
the job's current lease, shown only while that lease runs, the latest value wins, and
the entries of ended leases are trimmed by later calls, never piling up. On both
drivers, fakeredis, a real redis-server and a Redis Cluster."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import all_keys, dump_all
from tasks_support import Serving, wait_for

from pyqueue import InvalidArgument, NewJob, Outcome, Queue
from pyqueue.tasks import Tasks, current_job
from pyqueue.tasks.run import TaskRun

ASYNC_TOO = True
ON_CLUSTER = True
T0 = 1_000_000


def test_only_the_current_lease_writes_and_its_value_shows_while_it_runs(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("p")
    q.enqueue(b"x", job_id="a", now_ms=T0)
    (job,) = q.lease(lease_ms=1_000, now_ms=T0)
    assert q.progress_of(["a"]) == {}
    assert q.progress(job, '{"step": 1}', now_ms=T0 + 1) is Outcome.OK
    assert q.progress(job, b'{"step": 2}', now_ms=T0 + 2) is Outcome.OK  # the latest wins
    shown = q.progress_of(["a", "nobody"])
    assert list(shown) == ["a"] and shown["a"].value == b'{"step": 2}' and shown["a"].written_ms == T0 + 2
    assert shown["a"].receipt == job.receipt and job.receipt.startswith(shown["a"].owner + "|")
    # The lease expires and the job is leased again: the zombie cannot write, and the
    # new lease starts without progress.
    (again,) = q.lease(lease_ms=1_000, now_ms=T0 + 5_000)
    assert again.id == "a" and again.receipt != job.receipt
    assert q.progress_of(["a"]) == {}
    assert q.progress(job, "zombie", now_ms=T0 + 5_001) is Outcome.STALE
    assert q.progress_of(["a"]) == {}
    assert q.progress(again, "mine", now_ms=T0 + 5_002) is Outcome.OK
    assert q.progress_of(["a"])["a"].value == b"mine"


@pytest.mark.parametrize("ending", ["ack", "nack", "release", "cancel"])
def test_every_ending_of_the_lease_hides_its_value_and_refuses_more(make_queue: Callable[..., Queue], ending: str) -> None:
    q = make_queue("p")
    q.enqueue(b"x", job_id="a")
    (job,) = q.lease()
    assert q.progress(job, "half") is Outcome.OK
    if ending == "ack":
        assert q.ack(job)
    elif ending == "nack":
        assert q.nack(job, "boom")
    elif ending == "release":
        assert q.release([job]) == [Outcome.OK]
    else:
        q.cancel("a")
    assert q.progress_of(["a"]) == {}
    assert q.progress(job, "after") is Outcome.STALE


def test_a_resent_call_has_one_effect(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("p")
    q.enqueue(b"x", job_id="a", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.progress(job, "v", now_ms=T0 + 1) is Outcome.OK
    before = dump_all(r)
    assert q.progress(job, "v", now_ms=T0 + 1) is Outcome.OK
    assert dump_all(r) == before


def test_entries_of_ended_leases_are_trimmed_and_running_ones_kept(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("p")
    q.enqueue_many([f"j{i}".encode() for i in range(50)])
    running = q.lease(count=20)
    ended = q.lease(count=30)
    # A millisecond per call: entries written or looked at in the same millisecond tie,
    # and ZRANGE orders ties by id, so the count below holds for calls in distinct ms.
    for i, job in enumerate(running + ended):
        assert q.progress(job, job.id, now_ms=T0 + i)
    assert q.ack_many(ended) == [Outcome.OK] * 30
    assert r.hlen(q.spec.keys.progress) == 50
    # Each call looks at the 11 entries looked at longest ago: ended ones go, running
    # ones are looked at again later. 50 entries: every one looked at within 5 calls.
    for i in range(5):
        q.progress(running[0], f"tick {i}", now_ms=T0 + 100 + i)
    assert r.hlen(q.spec.keys.progress) == r.zcard(q.spec.keys.progress_at) == 20
    shown = q.progress_of([job.id for job in running + ended])
    assert sorted(shown) == sorted(job.id for job in running)
    assert all(shown[j.id].value == j.id.encode() for j in running[1:])
    assert q.ack_many(running) == [Outcome.OK] * 20
    (last,) = q.enqueue_many([b"last"])
    (job,) = q.lease()
    for _ in range(2):
        q.progress(job, "end")
    assert r.hlen(q.spec.keys.progress) == 1


def test_bad_input_is_refused_before_anything_is_sent(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("p")
    q.enqueue(b"x", job_id="a")
    (job,) = q.lease()
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match="4096"):
        q.progress(job, b"x" * 4097)
    with pytest.raises(InvalidArgument, match="Job from lease"):
        q.progress(job.receipt, "v")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        q.progress_of([])
    with pytest.raises(InvalidArgument):
        q.progress_of(["bad\nid"])
    assert dump_all(r) == before
    assert q.progress(job, b"x" * 4096) is Outcome.OK


def test_a_partitioned_queue_writes_and_reads_in_each_jobs_partition(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("pp", partitions=4)
    q.enqueue_many([NewJob(b"x", job_id=f"j{i}") for i in range(12)])  # ids in every partition
    jobs = [job for _ in range(12) for job in q.lease(count=12)]
    assert len(jobs) == 12
    for job in jobs:
        assert q.progress(job, f"at {job.id}") is Outcome.OK
    shown = q.progress_of([job.id for job in jobs] + ["missing"])
    assert list(shown) == [job.id for job in jobs]  # in the order asked, the missing left out
    assert {shown[job.id].value for job in jobs} == {f"at {job.id}".encode() for job in jobs}
    keys = {k for k in all_keys(r) if k.endswith(b":progress")}
    assert len(keys) > 1  # spread over the partitions


# -- the task layer: current_job().progress and SentTask.progress -----------------------


def test_a_task_reports_progress_its_sender_reads_while_it_runs(r: Any) -> None:
    tasks = Tasks(client=r)
    go_on = threading.Event()
    told: list[bool] = []

    @tasks.task(name="crunch")
    def crunch(n: int) -> None:
        told.append(current_job().progress({"done": 0, "of": n}))
        go_on.wait(10)
        told.append(current_job().progress({"done": n, "of": n}))

    serving = Serving(tasks, concurrency=2, block_ms=50)
    try:
        sent = crunch.send(3)
        wait_for(lambda: sent.progress() == {"done": 0, "of": 3}, what="the first report")
        go_on.set()
        wait_for(lambda: sent.state() == "done", what="the run's end")
        assert sent.progress() is None and told == [True, True]  # ended: none shows
    finally:
        serving.stop()


def test_an_async_task_reports_with_aprogress_and_a_zombie_is_told_its_lease_ended(r: Any) -> None:
    tasks = Tasks(client=r)
    reported: list[tuple[bool, bool]] = []
    go_on = asyncio.Event()

    @tasks.task(name="acrunch")
    async def acrunch(n: int) -> None:
        first = await current_job().aprogress({"async": n})
        while not go_on.is_set():
            await asyncio.sleep(0.01)
        reported.append((first, await current_job().aprogress({"async": -n})))

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        assert serving.is_async
        sent = acrunch.send(5)
        wait_for(lambda: sent.progress() == {"async": 5}, what="the async report")
        tasks.queue("default").cancel(sent.id)  # its lease ends under it: a zombie from now on
        assert sent.progress() is None
        serving.worker._loop.call_soon_threadsafe(go_on.set)  # type: ignore[attr-defined]
        wait_for(lambda: bool(reported), what="the zombie's report")
        assert reported == [(True, False)]  # the zombie's report is refused
    finally:
        serving.stop()


def test_progress_must_be_small_json(r: Any) -> None:
    tasks = Tasks(client=r)
    q = tasks.queue("default")
    q.enqueue(b"{}", job_id="raw")
    (job,) = q.lease()
    run = TaskRun(job, "crunch", None, None, {}, tasks)
    with pytest.raises(InvalidArgument, match="4096 bytes"):
        run.progress("x" * 5000)
    with pytest.raises(InvalidArgument, match="crunch progress"):
        run.progress(object())
    assert q.progress_of(["raw"]) == {}
    assert run.progress({"ok": True}) and json.loads(q.progress_of(["raw"])["raw"].value) == {"ok": True}


