"""Partitioned queues: one logical queue over K partitions (K hash tags), on fakeredis, a
real server and the real cluster (where the partitions spread over the primaries)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from binascii import crc_hqx
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisServer, all_keys, dump_all

from pyqueue import InvalidArgument, Job, NewJob, Outcome, Queue
from pyqueue.cli import main
from pyqueue.drivers.partitioned import PartitionedQueue
from pyqueue.drivers.queue import partition_of
from pyqueue.worker import Worker

#: Also on the Redis Cluster backend (conftest.BACKENDS).
from pyqueue.worker.executor import PARTITION_STREAK

from pyqueue.drivers.facade import plans_of
from helpers import queue_parts
ON_CLUSTER = True
#: And on the async driver too (conftest.Blocking).
ASYNC_TOO = True

TESTS = Path(__file__).resolve().parent
K = 3


def ids_per_partition(count: int, partitions: int = K) -> dict[int, list[str]]:
    """``count`` job ids for each partition."""
    out: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while min(len(v) for v in out.values()) < count:
        job_id = f"j{i}"
        part = out[partition_of(job_id, partitions)]
        if len(part) < count:
            part.append(job_id)
        i += 1
    return out


def test_a_jobs_partition_is_crc16_xmodem_of_its_id_modulo_k() -> None:
    # The function other languages must reproduce (lua/README.md): CRC16-XMODEM, the one
    # Redis Cluster hashes keys with ("123456789" -> 0x31C3, its check value).
    assert crc_hqx(b"123456789", 0) == 0x31C3
    assert partition_of("123456789", 7) == 0x31C3 % 7
    assert partition_of("ü", 5) == crc_hqx("ü".encode(), 0) % 5
    assert partition_of("{tag}x", 3) == crc_hqx(b"{tag}x", 0) % 3  # the whole id, braces too


def test_partitions_are_queues_of_their_own_hash_tags(r: Any) -> None:
    q = Queue("orders", r, partitions=K)
    assert isinstance(plans_of(q), PartitionedQueue) and [p.name for p in queue_parts(q)] == ["orders#0", "orders#1", "orders#2"]
    q.enqueue_many([NewJob(b"", job_id=i) for ids in ids_per_partition(1).values() for i in ids])
    keys = {k.decode() for k in all_keys(r)}
    assert {f"pq:{{orders#{p}}}:jobs" for p in range(K)} <= keys
    assert r.hget("pq:{orders}:counters", "partitions") == b"3"  # the record


def test_every_verb_works_across_partitions_with_per_job_uniqueness(r: Any) -> None:
    q = Queue("orders", r, partitions=K)
    ids = [i for ids in ids_per_partition(2).values() for i in ids]
    answers = q.enqueue_many([NewJob(i.encode(), job_id=i, max_attempts=1) for i in ids])
    assert [a.job_id for a in answers] == ids and all(a.added for a in answers)  # in input order
    assert not q.enqueue(b"again", job_id=ids[0]).added  # a duplicate in its partition
    assert q.stats().ready == len(ids) and [s.ready for s in q.partition_stats()] == [2, 2, 2]
    assert q.peek().ready == len(ids)
    jobs = q.lease(count=10, lease_ms=60_000)
    assert jobs and len({j.queue for j in jobs}) == 1  # one partition per lease call
    leased: list[Job] = list(jobs)
    while len(leased) < len(ids):
        leased += q.lease(count=10, lease_ms=60_000)
    assert sorted(j.id for j in leased) == sorted(ids) and {j.queue for j in leased} == {p.name for p in queue_parts(q)}
    assert [e.outcome for e in q.extend(leased, 120_000)] == [Outcome.OK] * len(ids)
    first, second, rest = leased[0], leased[1], leased[2:]
    assert q.nack(first, "boom").state == "dead" and q.release([second]) == [Outcome.OK]
    assert q.ack_many(rest) == [Outcome.OK] * len(rest)
    assert q.ack_many(rest) == [Outcome.GONE] * len(rest)
    assert not q.enqueue(b"", job_id=rest[0].id).added  # its tombstone, in its partition
    assert [d.id for d in q.dead_list().jobs] == [first.id]
    assert q.dead_replay() == 1 and q.dead_purge([first.id]) == 0
    stats = q.stats()
    assert (stats.ready, stats.acked, stats.dead, stats.released, stats.nacked) == (2, len(rest), 0, 1, 1)
    assert q.promote().promoted == 0 and q.scrub(q.spec.owner).scrubbed == 0


def test_lease_rotates_over_partitions_so_none_waits(r: Any) -> None:
    q = Queue("orders", r, partitions=K)
    per = ids_per_partition(5)
    q.enqueue_many([NewJob(b"", job_id=i) for ids in per.values() for i in ids])
    served = [q.lease(lease_ms=60_000)[0].queue for _ in range(9)]
    assert Counter(served) == {f"orders#{p}": 3 for p in range(K)}


def test_a_different_partition_count_is_refused_before_anything_is_sent(r: Any) -> None:
    Queue("orders", r, partitions=K).enqueue(b"")
    before = dump_all(r)
    for wrong in (1, 2, 4):
        with pytest.raises(InvalidArgument, match="3 partition"):
            Queue("orders", r, partitions=wrong).enqueue(b"")
        with pytest.raises(InvalidArgument, match="3 partition"):
            Worker(["orders"], lambda job: None, redis=r, partitions={"orders": wrong} if wrong > 1 else None).run(
                burst=True, install_signal_handlers=False
            )
    assert dump_all(r) == before
    # And the other way round: a queue first used with one partition refuses three.
    Queue("plain", r).enqueue(b"")
    with pytest.raises(InvalidArgument, match="1 partition"):
        Queue("plain", r, partitions=K).stats()


def test_bad_partition_arguments_are_refused(r: Any) -> None:
    for bad in (0, -1, 1025, True, 1.5):
        with pytest.raises(InvalidArgument):
            Queue("orders", r, partitions=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="'#'"):
        Queue("or#ders", r, partitions=2)
    with pytest.raises(InvalidArgument, match="does not serve"):
        Worker(["a"], lambda job: None, redis=r, partitions={"b": 2})


def test_a_worker_drains_a_partitioned_queue_before_a_lower_one_and_serves_every_partition(r: Any) -> None:
    q = Queue("high", r, partitions=K)
    per = ids_per_partition(3 * PARTITION_STREAK)
    q.enqueue_many([NewJob(b"", job_id=i) for ids in per.values() for i in ids][:1000])
    Queue("low", r).enqueue(b"", job_id="low-1")
    order: list[str] = []
    worker = Worker(["high", "low"], lambda job: order.append(job.queue), redis=r, partitions={"high": K})
    assert worker.run(burst=True, install_signal_handlers=False) == 0
    assert order[-1] == "low" and order.count("low") == 1  # priority kept
    high = order[:-1]
    assert Counter(high) == {f"high#{p}": 3 * PARTITION_STREAK for p in range(K)}
    # Fairness: while every partition still has jobs, no slot runs more than its streak of
    # one in a row, so each waits at most (K - 1) streaks per slot. One thread, and one
    # slot more that the default prefetch ("auto") holds for these short jobs: 2 slots.
    busy_until = min(max(i for i, name in enumerate(high) if name == f"high#{p}") for p in range(K))
    runs, longest = 1, 1
    for a, b in zip(high[:busy_until], high[1:busy_until]):
        runs = runs + 1 if a == b else 1
        longest = max(longest, runs)
    assert longest <= 2 * PARTITION_STREAK


def spawn_worker(url: str, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", PQ_TEST_URL=url)
    return subprocess.Popen(
        [sys.executable, "-m", "pyqueue", "--url", url, "worker", "handlers:slow", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def test_sigkilled_workers_lose_nothing_across_partitions(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.flushall()
    q = Queue("orders", r, partitions=K)
    ids = [f"j{i}" for i in range(600)]
    q.enqueue_many([NewJob(b"", job_id=i) for i in ids])
    args = ("-q", "orders", "--partitions", f"orders={K}", "--concurrency", "4", "--renew-ms", "200",
            "--expire-ms", "1000", "--lease-ms", "60000")
    victims = [spawn_worker(redis_server.url(), *args) for _ in range(2)]
    try:
        deadline = time.monotonic() + 20
        while r.llen("test:{runs}:runs") < 100:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.01)
        victims[0].send_signal(signal.SIGKILL)
        victims[0].wait()
        deadline = time.monotonic() + 60
        while q.stats().acked < len(ids):
            assert time.monotonic() < deadline, f"only {q.stats().acked} of {len(ids)} acked"
            time.sleep(0.05)
    finally:
        for proc in victims[1:]:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
    stats = q.stats()
    runs = Counter(x.decode() for x in r.lrange("test:{runs}:runs", 0, -1))
    assert set(runs) == set(ids)  # lost: 0
    assert (stats.acked, stats.ready, stats.leased, stats.dead) == (len(ids), 0, 0, 0)  # acked once each
    # Redelivered: at most what the victim held, its 4 threads' jobs and, these jobs being
    # short, the 4 the default prefetch ("auto") holds beyond them (ran, their acks unsent).
    assert sum(runs.values()) - len(ids) <= 4 + 4


def test_the_cli_shows_a_partitioned_queue_and_its_partitions(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    r = redis_server.client()
    r.flushall()
    Queue("orders", r, partitions=K).enqueue_many([NewJob(b"") for _ in range(30)])
    assert main(["--url", redis_server.url(), "enqueue", "orders", "x", "--id", "cli-1"]) == 0
    assert main(["--url", redis_server.url(), "stats"]) == 0
    out = capsys.readouterr().out
    assert "orders (3 partitions)" in out and all(f"orders#{p}" in out for p in range(K))
    assert Queue("orders", r, partitions=K).stats().enqueued == 31
