"""Tasks on partitioned queues (``Tasks(partitions={"orders": 4})``, README
"Partitioned queues"): sends, unique ids, groups, results, flows and the testing
helper go to the partition of each job, a worker serves every partition, and a count
that disagrees (with Redis, or with the worker's ``partitions=``) is refused loudly.
On fakeredis, a real redis-server and a real Redis Cluster (where partitions are
the point: one logical queue over several slots)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from tasks_support import Serving

from pyqueue import InvalidArgument, Queue
from pyqueue.protocol.errors import PyQueueError
from pyqueue.drivers.queue import partition_of
from pyqueue.tasks import Tasks, chain
from helpers import queue_parts


ON_CLUSTER = True
K = 4


def make_tasks(r: Any, partitions: dict[str, int] | None = None) -> Tasks:
    tasks = Tasks(client=r, partitions={"orders": K} if partitions is None else partitions)

    @tasks.task(name="double", queue="orders", keep_result=60)
    def double(x: int) -> int:
        return 2 * x

    @tasks.task(name="once", queue="orders", unique=True, keep_result=60)
    def once(x: int) -> int:
        return x + 1

    @tasks.task(name="per_account", queue="orders", group=lambda account, **_: account, keep_result=60)
    def per_account(account: str, n: int) -> str:
        return f"{account}:{n}"

    @tasks.task(name="plain", queue="other", keep_result=60)
    def plain(x: int) -> int:
        return x

    return tasks


def partition_counts(r: Any) -> Counter[int]:
    """Jobs (of any state) per partition of "orders", from each partition's stats."""
    q = Queue("orders", r, partitions=K)
    return Counter({p: s.enqueued for p, s in enumerate(q.partition_stats())})


def test_sends_spread_over_the_partitions_and_a_worker_serving_them_all_runs_each_once(r: Any) -> None:
    tasks = make_tasks(r)
    double = tasks.tasks["double"]
    sent = [double.send(i) for i in range(40)] + double.send_many([(i,) for i in range(40, 60)])
    assert all(s.queue == "orders" for s in sent)
    counts = partition_counts(r)
    assert sum(counts.values()) == 60 and len(counts) == K, counts  # every partition got some
    for s in sent:  # each job lives in the partition of its id
        assert queue_parts(Queue("orders", r, partitions=K))[partition_of(s.id, K)].get(s.id).state == "ready"
    serving = Serving(tasks, concurrency=4, block_ms=50)
    try:
        assert [s.result(timeout=20) for s in sent] == [2 * i for i in range(60)]
    finally:
        assert serving.stop() == 0
    assert tasks.queue("orders").stats().acked == 60


def test_unique_and_grouped_sends_land_in_the_right_partition(r: Any) -> None:
    tasks = make_tasks(r)
    once, per_account = tasks.tasks["once"], tasks.tasks["per_account"]
    first, again = once.send(1), once.send(1)
    assert (first.added, again.added, again.id) == (True, False, first.id)
    grouped = [(account, per_account.send(account, n)) for account in ("acct-0", "acct-1", "acct-2") for n in range(4)]
    q = Queue("orders", r, partitions=K)
    for account, s in grouped:  # the engine drew each id in its group's partition
        home = partition_of(account, K)
        assert partition_of(s.id, K) == home and queue_parts(q)[home].get(s.id).state == "ready", (account, s.id)
    serving = Serving(tasks, concurrency=2, block_ms=50)
    try:
        assert first.result(timeout=20) == 2
        assert [s.result(timeout=20) for _, s in grouped] == [f"{a}:{n}" for a, _ in grouped[::4] for n in range(4)]
    finally:
        serving.stop()


def test_a_chain_through_a_partitioned_queue_passes_each_result_on(r: Any) -> None:
    tasks = make_tasks(r)
    double, plain = tasks.tasks["double"], tasks.tasks["plain"]
    serving = Serving(tasks, concurrency=4, block_ms=50)
    try:
        flow = chain(double.s(1), double.s(), double.s(), plain.s()).send()
        assert flow.result(timeout=30) == 8
        assert flow.show().counts() == {"done": 4}
    finally:
        serving.stop()


def test_the_testing_helper_drains_every_partition() -> None:
    tasks = Tasks(partitions={"orders": K})

    @tasks.task(name="double", queue="orders", keep_result=60)
    def double(x: int) -> int:
        return 2 * x

    with tasks.testing() as t:
        sent = [double.send(i) for i in range(20)]
        t.drain()
        assert [s.result(timeout=1) for s in sent] == [2 * i for i in range(20)]
        assert t.stats("orders").acked == 20


def test_a_partition_count_that_disagrees_is_refused(r: Any) -> None:
    make_tasks(r).tasks["double"].send(1)  # "orders" is recorded with K partitions
    unaware = make_tasks(r, partitions={})
    with pytest.raises(PyQueueError, match="partition"):
        unaware.tasks["double"].send(2)
    wrong = make_tasks(r, partitions={"orders": K + 1})
    with pytest.raises(PyQueueError, match="partition"):
        wrong.tasks["double"].send(3)
    assert Queue("orders", r, partitions=K).stats().enqueued == 1  # neither sent anything
    with pytest.raises(InvalidArgument, match="the Tasks object says 4 partitions, the worker was given 2"):
        make_tasks(r).worker(partitions={"orders": 2})


@pytest.mark.parametrize("bad", [{"orders": 0}, {"orders": "4"}, {"": 2}, [("orders", 4)], {"orders": 1025}])
def test_bad_partition_counts_are_refused_before_anything_connects(bad: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"Tasks\(partitions=\)"):
        Tasks(url="redis://127.0.0.1:1", partitions=bad)
