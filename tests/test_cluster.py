"""Redis Cluster: the driver, services and worker on a real cluster of 3 primaries and 3
replicas (the ``redis_cluster`` fixture), with queues on different primaries, and a
slot held half-migrated while scripts run."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import RedisClusterProcesses, RedisServer
from redis.cluster import RedisCluster
from redis.crc import key_slot

from pyqueue import Job, NewJob, NotReplicated, Outcome, OutcomeUnknown, Queue, connect
from pyqueue.cli import main
from pyqueue.drivers.clients import bytes_client, primaries
from pyqueue.drivers.queue import peek_many
from pyqueue.ops.service import Services
from pyqueue.drivers.waiting import slot_groups
from pyqueue.worker import EXIT_OK, Worker

#: Clients these tests open by URL are left to the garbage collector: collected after
#: each test (conftest.collected_garbage), not in a later one.
pytestmark = pytest.mark.usefixtures("collected_garbage")


def on_distinct_primaries(client: RedisCluster, count: int) -> list[str]:
    """``count`` queue names whose keys live on ``count`` different primaries."""
    names: dict[str, str] = {}
    for i in range(1000):
        name = f"q{i}"
        node = client.get_node_from_key(f"pq:{{{name}}}:jobs").name
        names.setdefault(node, name)
        if len(names) == count:
            return list(names.values())
    raise AssertionError("could not spread queues over the primaries")


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_connect_finds_the_cluster_from_a_plain_url_and_takes_the_explicit_scheme(
    redis_cluster: RedisClusterProcesses,
) -> None:
    port = redis_cluster.ports[0]
    assert isinstance(connect(f"redis://127.0.0.1:{port}/0"), RedisCluster)
    assert isinstance(connect(f"redis+cluster://127.0.0.1:{port}"), RedisCluster)
    assert not isinstance(connect(f"redis://127.0.0.1:{port}/0", cluster=False), RedisCluster)


def test_every_verb_works_on_queues_spread_over_the_primaries(cluster: RedisCluster) -> None:
    names = on_distinct_primaries(cluster, 3)
    queues = [Queue(name, cluster) for name in names]
    for q in queues:
        assert q.enqueue_many([NewJob(b"a", job_id="a"), NewJob(b"b", job_id="b", max_attempts=1)])[0].added
        assert not q.enqueue(b"a", job_id="a").added  # a duplicate, on every primary
        q.enqueue(b"later", job_id="later", delay_ms=60_000)
        a, b = q.lease(count=2, lease_ms=60_000)
        assert q.extend([a], 120_000)[0].outcome is Outcome.OK
        assert q.ack(a) is Outcome.OK and q.ack(a) is Outcome.GONE
        assert q.nack(b, "boom").state == "dead"
        assert [d.id for d in q.dead_list().jobs] == ["b"] and q.dead_replay(["b"]) == 1
        (again,) = q.lease(lease_ms=60_000)
        assert q.release([again]) == [Outcome.OK]
        assert q.scrub(q.spec.owner).scrubbed == 0
        assert q.promote().promoted == 0
        stats = q.stats()
        assert (stats.ready, stats.scheduled, stats.acked, stats.dead, stats.done) == (1, 1, 1, 0, 1)
    peeked = peek_many(queues)
    assert [(p.ready, p.next_due_ms > p.now_ms) for p in peeked] == [(1, True)] * 3


def test_peeks_and_script_calls_reload_scripts_flushed_on_every_primary(cluster: RedisCluster) -> None:
    queues = [Queue(name, cluster) for name in on_distinct_primaries(cluster, 3)]
    for q in queues:
        q.enqueue(b"")
    for node in primaries(cluster):
        node.script_flush()
    assert [p.ready for p in peek_many(queues)] == [1, 1, 1]
    for node in primaries(cluster):
        node.script_flush()
    assert all(q.lease() for q in queues)


def test_a_decoding_cluster_client_gets_an_undecoded_twin(redis_cluster: RedisClusterProcesses) -> None:
    decoding = redis_cluster.client(decode_responses=True)
    twin = bytes_client(decoding)
    assert twin is not decoding and isinstance(twin, RedisCluster)
    q = Queue("bin", decoding)
    q.enqueue(b"\xff\x00 not utf-8")
    assert q.lease()[0].payload == b"\xff\x00 not utf-8"


def test_the_service_lifecycle_runs_in_the_namespaces_own_slot(cluster: RedisCluster) -> None:
    services = Services(cluster)
    service = services.register(["a", "b"])
    assert services.renew(service).stop is False
    assert services.check(service) == "ok" and services.stop(service.id)
    assert services.check(service) == "stop" and services.renew(service).stop
    assert services.deregister(service) == (1, 1)


def test_wake_keys_on_different_slots_are_waited_on_separately(cluster: RedisCluster) -> None:
    keys = [f"pq:{{{name}}}:wake" for name in on_distinct_primaries(cluster, 3)] + ["pq:{q0}:other"]
    groups = slot_groups(cluster, keys)
    assert len(groups) == len({key_slot(k.encode()) for k in keys})
    assert [k for group in groups for k in group] != [] and all(
        len({key_slot(k.encode()) for k in group}) == 1 for group in groups
    )


def test_a_worker_on_three_primaries_wakes_for_each_queue_and_a_remote_stop(cluster: RedisCluster) -> None:
    names = on_distinct_primaries(cluster, 3)
    ran: list[str] = []
    got = threading.Event()

    def handle(job: Job) -> None:
        ran.append(job.queue)
        got.set()

    worker = Worker(names, handle, redis=cluster, block_ms=10_000)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.service is not None, 10, "the worker did not register")
        for name in reversed(names):  # each wakes the idle worker on its own primary
            time.sleep(0.3)  # blocked again by now
            got.clear()
            Queue(name, cluster).enqueue(b"")
            assert got.wait(5), f"a job in {name} did not wake the worker before its 10 s block period"
        assert ran == list(reversed(names))
        time.sleep(0.3)
        assert worker.service is not None and Services(cluster).stop(worker.service.id)
        thread.join(5)  # the private wake key is in yet another slot: it wakes the worker too
        assert not thread.is_alive() and worker.exit_code == EXIT_OK, worker.exit_reason
    finally:
        worker.stop("test finished")
        thread.join(15)


def _migrating(cluster: RedisCluster, name: str) -> tuple[redis.Redis, redis.Redis, int, str]:
    """Put the slot of queue ``name`` in MIGRATING on its primary and IMPORTING on
    another; return (source, target, slot, target node id)."""
    slot = key_slot(f"pq:{{{name}}}:jobs".encode())
    source_node = cluster.get_node_from_key(f"pq:{{{name}}}:jobs")
    target_node = next(n for n in cluster.get_primaries() if n.name != source_node.name)
    source, target = source_node.redis_connection, target_node.redis_connection
    source_id, target_id = source.cluster("myid"), target.cluster("myid")
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    return source, target, slot, target_id


def _finish_migration(cluster: RedisCluster, source: redis.Redis, target: redis.Redis, slot: int, target_id: str) -> None:
    port = target.get_connection_kwargs()["port"]
    while True:
        keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        if not keys:
            break
        source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
    for node in cluster.get_primaries():
        node.redis_connection.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


def test_a_script_call_in_a_slot_held_half_migrated_waits_it_out_and_runs_once(cluster: RedisCluster) -> None:
    (name,) = on_distinct_primaries(cluster, 1)
    q = Queue(name, cluster)
    q.enqueue(b"", job_id="before")  # some of the queue's keys exist, the rest are absent
    source, target, slot, target_id = _migrating(cluster, name)
    result: dict[str, Any] = {}

    def enqueue() -> None:
        started = time.monotonic()
        result["enqueued"] = q.enqueue(b"", job_id="during")
        result["took_s"] = time.monotonic() - started

    thread = threading.Thread(target=enqueue)
    thread.start()
    time.sleep(2.0)  # held half-migrated: every call answers TRYAGAIN (declared keys missing)
    assert thread.is_alive(), "the call did not wait for the migration"
    _finish_migration(cluster, source, target, slot, target_id)
    thread.join(30)
    assert result["enqueued"].added and result["took_s"] >= 2.0
    stats = q.stats()
    assert (stats.ready, stats.enqueued) == (2, 2)  # ran exactly once, on the new primary
    assert cluster.get_node_from_key(q.spec.keys.jobs).redis_connection.cluster("myid") == target_id


@pytest.mark.parametrize("jobs", [300])
def test_a_busy_queue_loses_nothing_while_its_slot_migrates(cluster: RedisCluster, jobs: int) -> None:
    (name,) = on_distinct_primaries(cluster, 1)
    q = Queue(name, cluster)
    q.enqueue_many([NewJob(str(i).encode(), job_id=f"j{i}") for i in range(jobs)])
    ran: list[str] = []
    worker = Worker([name], lambda job: ran.append(job.id), redis=cluster, concurrency=4, block_ms=1_000)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(ran) >= jobs // 4, 20, "the worker did not start draining")
        source, target, slot, target_id = _migrating(cluster, name)
        time.sleep(1.5)
        _finish_migration(cluster, source, target, slot, target_id)
        wait_until(lambda: q.stats().acked == jobs, 60, "not every job was acked after the migration")
        assert thread.is_alive(), f"the worker stopped: {worker.exit_reason}"
    finally:
        worker.stop("test finished")
        thread.join(15)
    assert sorted(set(ran)) == sorted(f"j{i}" for i in range(jobs))
    assert len(ran) == jobs  # none ran twice: no lease was lost in the move


def test_cli_stats_without_names_lists_the_queues_of_every_primary(
    redis_cluster: RedisClusterProcesses, cluster: RedisCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    names = on_distinct_primaries(cluster, 3)
    for name in names:
        Queue(name, cluster).enqueue(b"")
    assert main(["--url", f"redis://127.0.0.1:{redis_cluster.ports[0]}/0", "stats"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in names), out


def test_the_demo_passes_on_the_cluster(redis_cluster: RedisClusterProcesses) -> None:
    redis_cluster.flushall()
    proc = subprocess.run(
        [sys.executable, "-m", "pyqueue", "--url", f"redis://127.0.0.1:{redis_cluster.ports[0]}/0", "demo",
         "--jobs", "2000"],
        capture_output=True, timeout=110,
    )
    out = proc.stdout.decode()
    assert proc.returncode == 0, out + proc.stderr.decode()[-3000:]
    assert "[FAILED]" not in out and out.count("[ok]") >= 6


def test_wait_replicas_confirms_writes_and_says_when_too_few_replicas_did(cluster: RedisCluster) -> None:
    (name,) = on_distinct_primaries(cluster, 1)
    # A cluster just created may still be syncing its replicas: wait for the link.
    primary = cluster.get_node_from_key(f"pq:{{{name}}}:jobs").redis_connection
    wait_until(lambda: primary.info("replication").get("connected_slaves", 0) >= 1
               and "online" in str(primary.info("replication").get("slave0", "")), 30, "the replica did not sync")
    q = Queue(name, cluster, wait_replicas=1)  # each primary has one replica
    assert q.enqueue(b"", job_id="a").added
    (job,) = q.lease()
    assert q.ack(job) is Outcome.OK
    assert q.stats().acked == 1  # reads send no WAIT
    greedy = Queue(name, cluster, wait_replicas=2, wait_timeout_ms=200)  # there is only one replica
    with pytest.raises(NotReplicated) as raised:
        greedy.enqueue(b"", job_id="b")
    assert raised.value.replicas < 2 and isinstance(raised.value, OutcomeUnknown)
    assert Queue(name, cluster).stats().ready == 1  # it ran on the primary: re-sending is safe
    assert not q.enqueue(b"", job_id="b").added


def test_wait_replicas_on_one_server_without_replicas_raises_not_replicated(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.flushall()
    q = Queue("solo", r, wait_replicas=1, wait_timeout_ms=20)
    with pytest.raises(NotReplicated):
        q.enqueue(b"")
    assert Queue("solo", r).stats().ready == 1


def test_cli_dead_list_without_a_name_covers_the_queues_of_every_primary(
    redis_cluster: RedisClusterProcesses, cluster: RedisCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    names = on_distinct_primaries(cluster, 3)
    for name in names:
        q = Queue(name, cluster)
        q.enqueue(b"", job_id=f"dead-{name}", max_attempts=1)
        q.nack(q.lease()[0], f"broken in {name}")
    url = f"redis://127.0.0.1:{redis_cluster.ports[0]}/0"
    assert main(["--url", url, "dead", "list"]) == 0
    out = capsys.readouterr().out
    assert all(f"dead-{name}" in out and f"broken in {name}" in out for name in names), out
    assert main(["--url", url, "dead", "purge"]) == 2  # only list goes over every queue
