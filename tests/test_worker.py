"""The worker: priority, outcomes, wake-ups without polling, heartbeats, remote and
signal shutdown, and recovery of a dead worker's jobs (in-process on both backends;
real processes and signals on a real redis-server).

Timing bounds here are generous on purpose: each proves a mechanism (a wake-up that
beats the block period by seconds), not a speed; speeds are measured in bench/.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer, all_keys

from pyqueue.protocol.core import enqueue_call, lease_call
from pyqueue.cli import main
from pyqueue.drivers.clients import node_for_key
from pyqueue.drivers.scripts import lua_source

from pyqueue import InvalidArgument, Job, NewJob, Outcome, Queue
from pyqueue.ops.service import Services
import pyqueue.worker.fetch as fetch_module
from pyqueue.worker import EXIT_MISCONFIGURED, EXIT_OK, EXIT_REGISTRATION_LOST, Retry, Worker
from pyqueue.drivers.queue import transport_of

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True

TESTS = Path(__file__).resolve().parent


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds * 1000 + micros // 1000)


class Running:
    """A worker running in a thread, stopped at the end of the test."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while worker.service is None:
            assert time.monotonic() < deadline, "worker did not register"
            time.sleep(0.01)

    def stop(self) -> None:
        self.worker.stop("test finished")
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def running(r: redis.Redis) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(queues: list[str], handler: Callable[[Job], object], **kwargs: Any) -> Running:
        kwargs.setdefault("block_ms", 5_000)
        run = Running(Worker(queues, handler, redis=r, **kwargs))
        started.append(run)
        return run

    yield start
    for run in started:
        if run.thread.is_alive():
            run.stop()


def test_burst_drains_every_queue_always_leasing_from_the_first_non_empty(r: redis.Redis) -> None:
    high, low = Queue("high", r), Queue("low", r)
    low.enqueue_many([NewJob(b"", job_id=f"low{i}") for i in range(5)])
    high.enqueue_many([NewJob(b"", job_id=f"high{i}") for i in range(5)])
    seen: list[str] = []

    def handler(job: Job) -> None:
        if job.id == "high2":
            low.enqueue(b"", job_id="late-low")
            high.enqueue(b"", job_id="late-high")
        seen.append(job.id)

    # prefetch=0: strict lease order (Pace: as the pace turns on, the fetch loop and the
    # commit loop lease at once, and their jobs may start in either order).
    Worker(["high", "low"], handler, redis=r, prefetch=0).run(burst=True, install_signal_handlers=False)
    assert seen[:6] == [f"high{i}" for i in range(5)] + ["late-high"]
    assert sorted(seen[6:]) == sorted([f"low{i}" for i in range(5)] + ["late-low"])
    assert high.stats().acked == 6 and low.stats().acked == 6


def test_handler_exceptions_nack_with_backoff_until_dead(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue(b"", job_id="bad", max_attempts=3)
    attempts: list[int] = []

    def handler(job: Job) -> None:
        attempts.append(job.attempt)
        raise ValueError("no good")

    Worker(["q"], handler, redis=r, backoff_base_ms=1, backoff_cap_ms=5).run(burst=True, install_signal_handlers=False)
    assert attempts == [1, 2, 3]
    (dead,) = q.dead_list().jobs
    assert dead.id == "bad" and "ValueError: no good" in dead.error


def test_a_handler_can_ask_for_a_retry_after_a_delay_and_read_its_fence(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue(b"", job_id="j")
    starts: list[tuple[int, int, int]] = []

    def handler(job: Job) -> None:
        starts.append((job.attempt, job.fence, server_ms(r)))
        if job.attempt == 1:
            raise Retry(delay_ms=300)

    Worker(["q"], handler, redis=r).run(burst=True, install_signal_handlers=False)
    (a1, f1, t1), (a2, f2, t2) = starts
    assert (a1, a2) == (1, 2) and f2 > f1 > 0
    assert t2 - t1 >= 300
    assert q.stats().acked == 1 and q.stats().nacked == 1


def test_a_job_enqueued_while_the_worker_blocks_is_picked_up_at_once(
    r: redis.Redis, running: Callable[..., Running]
) -> None:
    got = threading.Event()
    running(["q"], lambda job: got.set(), block_ms=10_000)
    time.sleep(0.3)  # the worker is blocked by now
    Queue("q", r).enqueue(b"")
    assert got.wait(5), "not woken: it would have waited for the 10 s block period"


def test_a_delayed_job_starts_on_time_without_polling(r: redis.Redis, running: Callable[..., Running]) -> None:
    started: list[int] = []
    got = threading.Event()

    def handler(job: Job) -> None:
        started.append(server_ms(r))
        got.set()

    running(["q"], handler, block_ms=10_000)
    time.sleep(0.2)
    enqueued_at = server_ms(r)
    Queue("q", r).enqueue(b"", delay_ms=500)
    assert got.wait(5), "the delayed job did not start before the 10 s block period"
    assert started[0] >= enqueued_at + 500  # never early, on the server's clock


def test_running_jobs_leases_are_extended_by_the_heartbeat(r: redis.Redis, running: Callable[..., Running]) -> None:
    q = Queue("q", r)
    q.enqueue(b"")
    done = threading.Event()

    def handler(job: Job) -> None:
        time.sleep(1.0)  # more than three lease lengths
        done.set()

    running(["q"], handler, lease_ms=300)
    assert done.wait(10)
    time.sleep(0.2)
    stats = q.stats()
    assert (stats.acked, stats.reclaimed) == (1, 0)


def test_a_remote_stop_wakes_a_blocked_worker_which_deregisters_and_exits_0(
    r: redis.Redis, running: Callable[..., Running]
) -> None:
    run = running(["q"], lambda job: None, block_ms=10_000)
    assert run.worker.service is not None
    time.sleep(0.2)  # blocked by now
    assert Services(r).stop(run.worker.service.id)
    # Under 8 s, below block_ms: a worker that missed the wake-up would block 10 s. (5 s
    # once ran out in a loaded CI run on the cluster; not reproduced in 45 runs since.)
    run.thread.join(8)
    assert not run.thread.is_alive(), "the worker did not notice the stop"
    assert "remote stop requested" in run.worker.exit_reason and run.worker.exit_code == EXIT_OK
    assert r.llen("pq:{workers}:service:ids") == 0 and all_keys(r, "pq:{workers}:service:1*") == []


def test_a_lost_renewal_stops_the_worker_with_exit_75(r: redis.Redis, running: Callable[..., Running]) -> None:
    run = running(["q"], lambda job: None, renew_ms=100, expire_ms=1_000, block_ms=10_000)
    assert run.worker.service is not None
    # Another registration holds the key now (and keeps it alive: without the PERSIST the
    # key's 1 s TTL could run out while a loaded machine stops the worker, as once in CI).
    key = run.worker.service.keys.role("service")
    r.hset(key, mapping={"renewal": "theirs", "registration": "theirs"})
    r.persist(key)
    run.thread.join(5)
    assert not run.thread.is_alive()
    assert "lost its registration" in run.worker.exit_reason
    assert run.worker.exit_code == EXIT_REGISTRATION_LOST
    # Its deregistration left the key alone: it was not its own any more.
    assert r.hget(run.worker.service.keys.role("service"), "renewal") == b"theirs"


def test_an_emptied_redis_stops_the_worker_with_exit_75_not_0(r: redis.Redis, running: Callable[..., Running]) -> None:
    run = running(["q"], lambda job: None, renew_ms=100, expire_ms=1_000, block_ms=10_000)
    time.sleep(0.2)
    r.flushall()  # a restart without persistence
    run.thread.join(5)
    assert not run.thread.is_alive()
    assert run.worker.exit_code == EXIT_REGISTRATION_LOST, run.worker.exit_reason


def test_an_async_handler_is_refused_before_anything_runs(r: redis.Redis) -> None:
    async def handle(job: Job) -> None:
        pass

    class AsyncCallable:
        async def __call__(self, job: Job) -> None:
            pass

    Queue("q", r).enqueue(b"")
    for handler in (handle, AsyncCallable(), functools.partial(handle)):
        with pytest.raises(InvalidArgument, match="async"):
            Worker(["q"], handler, redis=r)  # type: ignore[arg-type]
    assert Queue("q", r).stats().ready == 1 and all_keys(r, "pq:{workers}:*") == []


def test_a_handler_that_returns_a_coroutine_gets_its_job_released_unrun_and_the_worker_exits_78(
    r: redis.Redis, running: Callable[..., Running]
) -> None:
    async def really(job: Job) -> None:
        raise AssertionError("never awaited, never run")

    q = Queue("q", r)
    q.enqueue(b"", job_id="j")
    run = running(["q"], lambda job: really(job))  # a plain function that returns a coroutine
    run.thread.join(5)
    assert not run.thread.is_alive()
    assert run.worker.exit_code == EXIT_MISCONFIGURED and "async" in run.worker.exit_reason
    stats = q.stats()
    assert (stats.ready, stats.acked, stats.released, stats.nacked) == (1, 0, 1, 0)  # not acked, not penalised


def test_an_idle_worker_reclaims_a_lease_that_expired_after_it_went_to_sleep(
    r: redis.Redis, running: Callable[..., Running]
) -> None:
    ran = threading.Event()
    running(["q"], lambda job: ran.set(), block_ms=300)
    time.sleep(0.2)  # the worker blocks, knowing of no deadline
    q = Queue("q", r, owner="a-worker-that-died-unregistered")
    # In one transaction, so the worker neither takes the job nor wakes: a job enqueued
    # and leased (200 ms) by a worker that then died without a registration.
    pipe = node_for_key(r, q.spec.keys.jobs).pipeline(transaction=True)  # one slot: fine on a cluster
    transport_of(q).call(enqueue_call(q.spec.keys, None, [("j", b"", 0, 5, "", "", "", "")]), client=pipe)
    transport_of(q).call(lease_call(q.spec.keys, None, q.spec.owner, "c1", 1, 200, 100, 0), client=pipe)
    pipe.delete(q.spec.keys.wake)
    pipe.execute()
    assert q.stats().leased == 1
    assert ran.wait(5), "the expired lease was never reclaimed by the idle worker"
    assert q.stats().reclaimed == 1


def test_a_job_in_the_last_of_fifty_idle_queues_costs_one_lease_call_and_no_peek(
    r: redis.Redis, running: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"q{i}" for i in range(50)]
    got = threading.Event()
    calls: list[str] = []
    peeks: list[int] = []
    at_start: list[tuple[list[str], list[int]]] = []  # what had been sent when the job started

    def handle(job: Job) -> None:
        at_start.append((list(calls), list(peeks)))
        got.set()

    run = running(names, handle, block_ms=10_000)
    # Blocked, after a full round that found every queue empty (on a busy machine that
    # round can take longer than any fixed sleep).
    wait_until(lambda: len(run.worker.fetch.known_empty) == len(names), 10, "no full round found every queue empty")
    time.sleep(0.1)
    for queue in run.worker.queues:
        original = queue.lease_call

        def spy(*args: Any, _name: str = queue.name, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kwargs)

        queue.lease_call = spy  # type: ignore[method-assign]
    real_peek_many = fetch_module.peek_many
    monkeypatch.setattr(fetch_module, "peek_many", lambda qs: peeks.append(len(qs)) or real_peek_many(qs))
    # Woken by q49's marker while the other 49 were empty: one lease call, no peek.
    Queue("q49", r).enqueue(b"")
    assert got.wait(5)
    # (Once the handler returns, the freed slot's lease round peeks as usual.)
    assert at_start == [(["q49"], [])], at_start


def test_a_killed_workers_jobs_are_scrubbed_and_finished_by_another_long_before_lease_expiry(
    r: redis.Redis, running: Callable[..., Running]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)])
    hold = threading.Event()
    victim = running(["q"], lambda job: hold.wait(10), concurrency=3, lease_ms=60_000, renew_ms=200, expire_ms=1_000)
    deadline = time.monotonic() + 5
    while q.stats().leased < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    victim.worker.kill()
    killed_at = time.monotonic()
    finished: list[str] = []
    running(["q"], lambda job: finished.append(job.id), renew_ms=200, expire_ms=1_000)
    while len(finished) < 3:
        assert time.monotonic() - killed_at < 10, "not recovered well before the 60 s leases expire"
        time.sleep(0.01)
    hold.set()  # the victim's handlers return: a killed process acks nothing
    time.sleep(0.3)
    stats = q.stats()
    assert sorted(finished) == ["j0", "j1", "j2"]
    assert (stats.acked, stats.scrubbed, stats.leased) == (3, 3, 0)
    assert victim.worker.service is not None
    assert r.zscore("pq:{workers}:service:expiry", str(victim.worker.service.id)) is None  # forgotten


def test_stop_finishes_running_jobs_and_releases_those_past_the_grace_period(
    r: redis.Redis, running: Callable[..., Running]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(2)])
    release = threading.Event()
    run = running(["q"], lambda job: release.wait(5), concurrency=2, grace_ms=200)
    while q.stats().leased < 2:
        time.sleep(0.01)
    run.stop()
    stats = q.stats()
    assert (stats.released, stats.ready, stats.leased) == (2, 2, 0)
    release.set()
    time.sleep(0.1)
    assert q.stats().acked == 0  # a released job's late result is dropped, not acked


# -- real processes, real signals ------------------------------------------------------


#: The sync handler runs on the thread-pool Worker, the async one on AsyncWorker (which
#: pyqueue worker picks for a coroutine function): the lifecycle tests run on both.
HANDLERS = ["handlers:slow", "handlers:slow_async"]


def spawn_worker(
    server: RedisServer, *args: str, sleep_s: float = 0.0, runs: str = "runs", handler: str = "handlers:slow"
) -> subprocess.Popen[bytes]:
    """A ``pyqueue worker`` process running ``handler`` (tests/handlers.py); its log goes
    to ``proc.log_path`` (a file, so no pipe is left open)."""
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PQ_TEST_URL=server.url(), PQ_TEST_SLEEP_S=str(sleep_s), PQ_TEST_RUNS=runs)
    log_path = server.directory / f"worker-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "--url", server.url(), "worker", handler, *args],
            env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def real(redis_server: RedisServer) -> redis.Redis:
    client = redis_server.client()
    client.flushall()
    return client


@pytest.mark.parametrize("handler", HANDLERS)
def test_sigterm_lets_running_jobs_finish_leaves_the_rest_and_deregisters(
    redis_server: RedisServer, real: redis.Redis, handler: str
) -> None:
    q = Queue("q", real)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(6)])
    proc = spawn_worker(redis_server, "-q", "q", "--concurrency", "2", "--grace-ms", "10000", sleep_s=1.0, handler=handler)
    wait_until(lambda: q.stats().leased == 2, 10, "worker did not start two jobs")
    proc.send_signal(signal.SIGTERM)
    proc.wait(20)
    out = proc.log_path.read_bytes()  # type: ignore[attr-defined]
    assert proc.returncode == 0, out.decode()
    stats = q.stats()
    assert (stats.acked, stats.ready, stats.leased, stats.released) == (2, 4, 0, 0)
    assert real.keys("pq:{workers}:service:1*") == [] and real.llen("pq:{workers}:service:ids") == 0
    assert b"received SIGTERM" in out


@pytest.mark.parametrize("handler", HANDLERS)
def test_sigterm_past_the_grace_period_releases_running_jobs(redis_server: RedisServer, real: redis.Redis, handler: str) -> None:
    q = Queue("q", real)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(2)])
    proc = spawn_worker(redis_server, "-q", "q", "--concurrency", "2", "--grace-ms", "200", sleep_s=60.0, handler=handler)
    wait_until(lambda: q.stats().leased == 2, 10, "worker did not start two jobs")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0  # the stuck handlers do not keep the process alive
    stats = q.stats()
    assert (stats.released, stats.ready, stats.leased) == (2, 2, 0)


@pytest.mark.parametrize("handler", HANDLERS)
def test_a_second_signal_exits_at_once(redis_server: RedisServer, real: redis.Redis, handler: str) -> None:
    q = Queue("q", real)
    q.enqueue(b"")
    proc = spawn_worker(redis_server, "-q", "q", "--grace-ms", "60000", sleep_s=30.0, handler=handler)
    wait_until(lambda: q.stats().leased == 1, 10, "worker did not start the job")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(5) != 0
    assert q.stats().leased == 1  # left to expire or to be scrubbed


@pytest.mark.parametrize("handler", HANDLERS)
def test_a_worker_stopped_remotely_drains_on_the_first_sigterm_and_exits_0(
    redis_server: RedisServer, real: redis.Redis, handler: str
) -> None:
    q = Queue("q", real)
    q.enqueue(b"", job_id="j")
    proc = spawn_worker(redis_server, "-q", "q", "--grace-ms", "20000", sleep_s=1.5, handler=handler)
    wait_until(lambda: q.stats().leased == 1, 10, "worker did not start the job")
    assert Services(real).stop(1)
    time.sleep(0.3)  # the worker is stopping on its own, its job still running
    proc.send_signal(signal.SIGTERM)  # the first signal: not a reason to exit at once
    assert proc.wait(10) == 0, proc.log_path.read_text()  # type: ignore[attr-defined]
    assert q.stats().acked == 1


@pytest.mark.parametrize("handler", HANDLERS)
def test_pyqueue_stop_exits_0_and_an_emptied_redis_exits_75(redis_server: RedisServer, real: redis.Redis, handler: str) -> None:
    stopped = spawn_worker(redis_server, "-q", "q", "--renew-ms", "200", "--expire-ms", "1000", handler=handler)
    wait_until(lambda: real.llen("pq:{workers}:service:ids") == 1, 10, "worker did not register")
    assert main(["--url", redis_server.url(), "stop", "1"]) == 0
    assert stopped.wait(10) == 0
    lost = spawn_worker(redis_server, "-q", "q", "--renew-ms", "200", "--expire-ms", "1000", handler=handler)
    wait_until(lambda: real.llen("pq:{workers}:service:ids") == 1, 10, "worker did not register")
    real.flushall()  # what a restart without persistence leaves
    assert lost.wait(10) == EXIT_REGISTRATION_LOST
    assert b"lost its registration" in lost.log_path.read_bytes()  # type: ignore[attr-defined]


def test_a_worker_resumed_after_its_registration_expired_leases_nothing(
    redis_server: RedisServer, real: redis.Redis
) -> None:
    q = Queue("q", real)
    proc = spawn_worker(redis_server, "-q", "q", "--renew-ms", "200", "--expire-ms", "1000", "--block-ms", "10000")
    wait_until(lambda: real.llen("pq:{workers}:service:ids") == 1, 10, "worker did not register")
    time.sleep(0.3)  # blocked in BZPOPMIN
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(1.5)  # past expire_ms: the registration is gone
        q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)])  # its BZPOPMIN answers, unread
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(10) == EXIT_REGISTRATION_LOST
    assert q.stats().leased_total == 0 and q.stats().ready == 3  # it renewed (and failed) before any lease


def test_sigkill_of_a_worker_process_its_jobs_finish_elsewhere_exactly_once(
    redis_server: RedisServer, real: redis.Redis
) -> None:
    q = Queue("q", real)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(20)])
    victim = spawn_worker(redis_server, "-q", "q", "--concurrency", "4", "--lease-ms", "60000", "--renew-ms", "200",
                          "--expire-ms", "1000", sleep_s=30.0)
    wait_until(lambda: real.llen("test:{runs}:runs") == 4, 10, "victim did not start four jobs")
    victim.kill()
    victim.wait()
    killed_at = time.monotonic()
    rescuer = spawn_worker(redis_server, "-q", "q", "--concurrency", "4", "--renew-ms", "200", "--expire-ms", "1000")
    try:
        wait_until(lambda: q.stats().acked == 20, 15, "jobs not finished well before the 60 s leases expire")
        recovered_s = time.monotonic() - killed_at
    finally:
        rescuer.send_signal(signal.SIGTERM)
        assert rescuer.wait(10) == 0
    stats = q.stats()
    assert (stats.acked, stats.scrubbed, stats.leased, stats.ready, stats.dead) == (20, 4, 0, 0, 0)
    runs = [x.decode() for x in real.lrange("test:{runs}:runs", 0, -1)]
    assert sorted(set(runs)) == sorted(f"j{i}" for i in range(20))
    assert len(runs) == 24  # the four the victim held ran twice: at least once, acked once
    assert recovered_s < 15


def test_an_idle_worker_sends_about_one_command_per_block_period(
    redis_server: RedisServer, real: redis.Redis
) -> None:
    proc = spawn_worker(redis_server, "-q", "q", "--block-ms", "500", "--renew-ms", "15000")
    try:
        wait_until(lambda: real.llen("pq:{workers}:service:ids") == 1, 10, "worker did not register")
        time.sleep(1.0)  # past start-up
        real.config_resetstat()
        time.sleep(3.0)
        stats = real.info("commandstats")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    calls = {name: v["calls"] for name, v in stats.items() if name not in ("cmdstat_config|resetstat", "cmdstat_info")}
    # 3 s / 0.5 s = 6 block periods: a BZPOPMIN each, then one lease call (it reclaims what
    # expired meanwhile), and a read of the service key (HMGET) at most every period.
    # INFO counts the commands a script runs too: those of lua/lease.lua are allowed.
    assert calls.get("cmdstat_bzpopmin", 0) <= 7 and calls.get("cmdstat_evalsha", 0) <= 7, calls
    in_lease = set(re.findall(r"redis\.call\('([A-Z]+)'", lua_source("lease")))
    allowed = {"bzpopmin", "evalsha", "hmget"} | {c.lower() for c in in_lease}
    assert {name.removeprefix("cmdstat_") for name in calls} <= allowed, calls


def test_the_service_namespace_may_live_on_another_server(r: redis.Redis) -> None:
    import fakeredis

    services_server = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    q = Queue("q", r)
    q.enqueue_many([b"a", b"b"])
    done: list[str] = []
    worker = Worker(["q"], lambda job: done.append(job.id), redis=r, service_redis=services_server)
    worker.run(burst=True, install_signal_handlers=False)
    assert len(done) == 2 and q.stats().acked == 2
    assert services_server.get("pq:{workers}:service:seq") == b"1"
    assert all_keys(r, "pq:{workers}:*") == []  # nothing of the namespace on the queues' server
    services_server.close()


def test_a_worker_cut_off_from_redis_warns_while_it_cannot_serve_and_exits_75_once_its_registration_expired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #19: a worker that could not reach its server served nothing, said nothing
    and never exited. It warns at least every few seconds while it cannot serve, and once
    no renewal got through for expire_ms it stops with exit 75 (its shutdown's release and
    deregistration fail too, and are logged, not raised)."""
    caplog.set_level(logging.WARNING, logger="pyqueue")
    server = RedisServer(tmp_path)
    try:
        Queue("q", server.client()).enqueue(b"x")
        worker = Worker(["q"], lambda job: None, redis=server.client(), block_ms=500, renew_ms=500, expire_ms=2_000)
        codes: list[int] = []
        runner = threading.Thread(target=lambda: codes.append(worker.run(install_signal_handlers=False)))
        runner.start()
        time.sleep(1.0)
        server.process.kill()
        server.process.wait()
        cut_at = time.monotonic()
        runner.join(90)
        assert codes == [EXIT_REGISTRATION_LOST], worker.exit_reason
        assert "no renewal got through" in (worker.exit_reason or "")
        warnings = sorted(rec.created for rec in caplog.records if rec.levelno == logging.WARNING
                          and rec.created >= time.time() - (time.monotonic() - cut_at))
        assert warnings, "nothing was logged while the worker could not serve"
        gaps = [b - a for a, b in zip(warnings, warnings[1:])]
        assert max(gaps, default=0.0) < 10, gaps
    finally:
        server.stop()
