"""Redis Sentinel (issue #19): ``redis+sentinel://`` URLs wherever pyqueue takes a URL,
clients whose every connection (the worker's blocking twin and undecoded twin too)
asks the sentinels where the master is, and a Worker that serves on through a
failover -- a ``SENTINEL FAILOVER`` and a SIGKILLed master -- losing nothing.

The real-server tests run on the session's ``redis_sentinel`` group (conftest: a
master, a replica, three sentinels with ``down-after-milliseconds`` 1000). A failover
swaps master and replica; every test asks the group which node is the master now.

"0 lost" is checked as tests/test_cluster_faults.py checks it (its Tally, instrument
and Producer are reused): every preloaded and every acknowledged enqueue ran and got
exactly one OK ack answer, none ran twice, and the counters agree. The worker and the
producer use ``wait_replicas=1``: replication is asynchronous, and a write the old
master answered but never passed on is lost with it (README, "What pyqueue
guarantees"); with ``WAIT 1`` such a write raises NotReplicated and is sent again, so
the test may demand exactly 0 lost instead of hoping for it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import RedisSentinelGroup
from redis.sentinel import Sentinel, SentinelConnectionPool
from test_cluster_faults import Producer, Tally, instrument, wait_until

from pyqueue import InvalidArgument, Job, NewJob, Queue, connect
from pyqueue.aio import AsyncQueue
from pyqueue.cli import main
from pyqueue.drivers.clients import (
    SENTINEL_PORT,
    blocking_twin,
    bytes_client,
    parse_sentinel_url,
    redact_url,
    reset_default_clients,
)
from pyqueue.tasks import Tasks
from pyqueue.worker import EXIT_OK, Worker

PRELOADED = 300  # jobs in the queue before the worker starts
PRODUCED = 600  # jobs a producer thread enqueues while the fault happens
PRODUCER_RATE = 100  # jobs/s


# -- the URL, without a server -----------------------------------------------------------


def test_a_sentinel_url_lists_the_sentinels_names_the_service_and_carries_the_masters_options() -> None:
    parsed = parse_sentinel_url(
        "redis+sentinel://app:s%40cret@s1,s2:26380,[::1]:26381/orders"
        "?db=2&socket_timeout=3&sentinel_password=watch&sentinel_username=eye&client_name=w1"
    )
    assert parsed.sentinels == [("s1", SENTINEL_PORT), ("s2", 26380), ("::1", 26381)]
    assert parsed.service_name == "orders"
    # user:password@ is the master's (and its replicas'); the sentinels have their own.
    assert parsed.master == {"username": "app", "password": "s@cret", "db": 2, "socket_timeout": 3.0, "client_name": "w1"}
    assert parsed.sentinel == {"username": "eye", "password": "watch"}
    tls = parse_sentinel_url("rediss+sentinel://:pw@s1/orders?ssl_ca_certs=/etc/ca.pem&ssl_check_hostname=false")
    assert tls.master == {"password": "pw", "ssl": True, "ssl_ca_certs": "/etc/ca.pem", "ssl_check_hostname": False}
    assert tls.sentinel == {"ssl": True, "ssl_ca_certs": "/etc/ca.pem", "ssl_check_hostname": False}


def test_connect_gives_a_master_client_whose_sentinels_get_their_own_credentials() -> None:
    # Nothing listens: connect() sends nothing.
    client = connect("redis+sentinel://:master-pw@127.0.0.1:1,127.0.0.1:2/svc?sentinel_password=s-pw&db=1")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "svc" and pool.is_master
    assert pool.connection_kwargs["password"] == "master-pw" and pool.connection_kwargs["db"] == 1
    assert pool.connection_kwargs["decode_responses"] is False
    manager = pool.sentinel_manager
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in manager.sentinels] == [("127.0.0.1", 1), ("127.0.0.1", 2)]
    assert {s.connection_pool.connection_kwargs.get("password") for s in manager.sentinels} == {"s-pw"}
    client.close()


@pytest.mark.parametrize("url, says", [
    ("redis+sentinel://s1:26379", "names no service"),
    ("redis+sentinel://s1:26379/svc/0", "names no service"),
    ("redis+sentinel://s1:port/svc", "not a sentinel's host"),
    ("redis+sentinel:///svc", "not a sentinel's host"),
    ("redis+sentinel://s1/svc?db=zero", "invalid value for 'db'"),
    ("redis+sentinel://s1/svc?ssl_ca_certs=/ca.pem", "does not use TLS"),
    ("sentinel://s1/svc", "must start with"),
])
def test_a_malformed_sentinel_url_is_one_clear_error_everywhere(
    url: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidArgument, match=says):
        connect(url)
    # The CLI: one line and exit 2, no traceback.
    assert main(["--url", url, "stats", "q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyqueue: InvalidArgument:") and "Traceback" not in err
    monkeypatch.setenv("PYQUEUE_URL", url)
    reset_default_clients()
    try:
        with pytest.raises(InvalidArgument, match="PYQUEUE_URL"):
            Queue("q")
    finally:
        monkeypatch.delenv("PYQUEUE_URL")
        reset_default_clients()


def test_passwords_of_a_sentinel_url_are_hidden_in_logs_and_on_the_dashboard() -> None:
    from pyqueue.dashboard.server import public_label

    url = "redis+sentinel://u:pw@s1:1,s2:2/svc?sentinel_password=spw&db=1"
    assert redact_url(url) == public_label(url) == "redis+sentinel://u:***@s1:1,s2:2/svc?sentinel_password=***&db=1"


# -- on real sentinels ---------------------------------------------------------------------


@pytest.fixture
def group(redis_sentinel: RedisSentinelGroup) -> RedisSentinelGroup:
    redis_sentinel.flushall()
    return redis_sentinel


def test_every_entry_point_reaches_the_master_through_the_sentinels(
    group: RedisSentinelGroup, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = group.url()
    master = group.node(group.master_port())
    # pyqueue.connect, Queue.from_url
    q = Queue("q", connect(url))
    assert q.enqueue(b"a", job_id="j1").added
    assert Queue.from_url(url, "q").enqueue(b"b", job_id="j2").added
    assert master.hlen(q.spec.keys.jobs) == 2
    # The CLI's --url
    assert main(["--url", url, "enqueue", "q", "c", "--id", "j3"]) == 0
    assert main(["--url", url, "stats", "q"]) == 0
    assert "3" in capsys.readouterr().out
    # PYQUEUE_URL, for the blocking and the async driver
    monkeypatch.setenv("PYQUEUE_URL", url)
    reset_default_clients()
    try:
        assert Queue("q").enqueue(b"d", job_id="j4").added

        async def from_asyncio() -> None:
            async with AsyncQueue("q") as aq:
                assert (await aq.enqueue(b"e", job_id="j5")).added
                assert (await aq.stats()).ready == 5

        asyncio.run(from_asyncio())
    finally:
        monkeypatch.delenv("PYQUEUE_URL")
        reset_default_clients()
    # Tasks(url=), sending from blocking code and from asyncio
    tasks = Tasks(url=url)

    @tasks.task(name="triple", queue="tq")
    def triple(n: int) -> int:
        return n * 3

    triple.send(1)

    async def send_async() -> None:
        await triple.asend(2)
        await tasks.aredis.aclose()

    asyncio.run(send_async())
    assert Queue("tq", master).stats().ready == 2
    tasks.close()
    master.close()


def test_a_worker_runs_on_redis_pys_own_master_for_client_with_twins_that_follow_the_master(
    group: RedisSentinelGroup,
) -> None:
    # The crash of issue #19: blocking_twin rebuilt a SentinelConnectionPool without its
    # service name and manager.
    sentinel = Sentinel([("127.0.0.1", p) for p in group.sentinel_ports], socket_timeout=5)
    client = sentinel.master_for(group.SERVICE, decode_responses=True, socket_timeout=5)
    for twin in (blocking_twin(client, 30), bytes_client(client)):
        pool = twin.connection_pool
        assert isinstance(pool, SentinelConnectionPool) and pool.service_name == group.SERVICE
        assert pool.sentinel_manager is sentinel and pool is not client.connection_pool
        assert twin.ping()
    assert blocking_twin(client, 30).connection_pool.connection_kwargs["socket_timeout"] == 30
    assert bytes_client(client).connection_pool.connection_kwargs["decode_responses"] is False
    q = Queue("q", client)
    q.enqueue_many([NewJob(bytes([i]), job_id=f"j{i}") for i in range(20)])
    seen: list[str] = []
    assert Worker(["q"], lambda job: seen.append(job.id), redis=client).run(burst=True, install_signal_handlers=False) == EXIT_OK
    assert sorted(seen) == sorted(f"j{i}" for i in range(20)) and q.stats().acked == 20
    client.close()


class Load:
    """A queue preloaded with PRELOADED jobs, a Worker thread (concurrency 4,
    ``wait_replicas=1``) on a ``redis+sentinel://`` client with instrumented queues,
    and a Producer of PRODUCED more on a client of its own. Leases and the registration
    outlast the ~10 s in which a SENTINEL FAILOVER's old master refuses to confirm
    writes (a lease that expired meanwhile would run its job again: at least once)."""

    def __init__(self, group: RedisSentinelGroup) -> None:
        self.client = connect(group.url())
        self.producer_client = connect(group.url())
        self.queue = Queue("busy", self.client)
        self.preloaded = [f"j{i}" for i in range(PRELOADED)]
        self.queue.enqueue_many([NewJob(b"x", job_id=j) for j in self.preloaded])
        self.tally = Tally()
        self.worker = Worker(["busy"], self.tally.handler, redis=self.client, concurrency=4, block_ms=1_000,
                             lease_ms=30_000, renew_ms=1_000, expire_ms=30_000, wait_replicas=1)
        instrument(self.worker, self.tally)
        self.exit: dict[str, int] = {}
        self.thread = threading.Thread(target=self._run, daemon=True, name="worker")
        self.producer = Producer(Queue("busy", self.producer_client, wait_replicas=1), "p", PRODUCED, PRODUCER_RATE)

    def _run(self) -> None:
        self.exit["code"] = self.worker.run(install_signal_handlers=False)

    def start(self) -> None:
        self.thread.start()
        self.producer.start()
        wait_until(lambda: self.tally.handled() >= 100, 30, "the worker did not start draining")

    def finish(self) -> None:
        self.producer.join(60)
        assert not self.producer.is_alive(), "the producer did not finish"

        def drained() -> bool:
            s = self.queue.stats()
            return s.ready == 0 and s.scheduled == 0 and s.leased == 0

        wait_until(drained, 40, "the queue was not drained")
        assert self.thread.is_alive() and self.worker.exit_reason == "", (self.worker.exit_reason, self.exit)
        self.worker.stop("test finished")
        self.thread.join(30)
        assert self.exit.get("code") == EXIT_OK, (self.exit, self.worker.exit_reason)

    def close(self) -> None:
        if self.thread.is_alive():
            self.worker.stop("test finished")
            self.thread.join(30)
        self.client.close()
        self.producer_client.close()


@pytest.mark.parametrize("fault", ["sentinel failover", "master sigkilled"])
def test_a_worker_follows_the_master_across_a_failover_and_loses_nothing(
    group: RedisSentinelGroup, fault: str, capsys: pytest.CaptureFixture[str]
) -> None:
    load = Load(group)
    old = group.master_port()
    try:
        load.start()
        # SENTINEL FAILOVER as it is: the old master stays writable until the sentinels
        # demote it about 10 s later; meanwhile writes there are not replicated.
        fault_at, new = group.kill_master() if fault == "master sigkilled" else group.failover(demote=False)
        settled_s = time.monotonic() - fault_at
        assert new != old and group.master_port() == new
        wait_until(lambda: load.tally.first_served_after(fault_at + settled_s) is not None, 30,
                   "the worker did not serve a job leased from the new master")
        served_s = (load.tally.first_served_after(fault_at + settled_s) or 0.0) - fault_at
        pause_s = load.tally.longest_pause(fault_at - 1, fault_at + settled_s + 1)
        load.finish()
        ids = load.preloaded + load.producer.answered
        assert len(load.producer.answered) == PRODUCED, load.producer.failures[:5]
        lost = set(ids) - set(load.tally.runs)
        assert not lost, f"{len(lost)} jobs lost, e.g. {sorted(lost)[:5]}"
        assert set(load.tally.runs) == set(ids), "a job nobody enqueued ran"
        twice = {i: n for i, n in load.tally.runs.items() if n != 1}
        assert not twice, f"jobs that ran more than once: {dict(list(twice.items())[:10])}"
        acked_twice = {i: n for i, n in load.tally.oks.items() if n > 1}
        assert not acked_twice, f"jobs acked OK more than once: {acked_twice}"
        # An ack the killed master ran and passed on, whose answer died with it, is sent
        # again (replay-safe) to the promoted replica, which answers that the lease is
        # gone: the worker logs "finished but its lease was lost". Accounted for when the
        # job is done there, acked once (the counters below).
        unanswered = set(ids) - set(load.tally.oks)
        assert unanswered <= set(load.tally.not_ok), f"jobs never acked: {sorted(unanswered - set(load.tally.not_ok))[:5]}"
        assert all(load.queue.get(i).state == "done" for i in unanswered), "a job without an OK ack is not done"
        assert fault == "master sigkilled" or not unanswered, f"ack answers lost without a kill: {sorted(unanswered)[:5]}"
        stats = load.queue.stats()
        assert (stats.enqueued, stats.acked) == (len(ids), len(ids)), stats
        with capsys.disabled():
            print(f"\n[sentinel] {fault}: master {old} -> {new}, sentinels settled {settled_s:.2f} s after it, "
                  f"longest pause between handler starts {pause_s:.2f} s, first job from the new master "
                  f"{served_s:.2f} s after it; {len(ids)} jobs, 0 lost, 0 run twice, 0 acked twice, "
                  f"{len(unanswered)} ack answers lost with the old master (acked once all the same); "
                  f"slowest enqueue {load.producer.slowest_s * 1000:.0f} ms, {len(load.producer.failures)} re-sent")
    finally:
        load.close()
