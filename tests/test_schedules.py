"""Periodic jobs (pyqueue.ops.schedules): parsing and refusals, tick computation and the
keep_done_ms window as pure functions of an injected clock, the scheduler against a
server, three workers scheduling the same ticks at once (each tick added once, run
once), and, marked slow, three ``pyqueue worker`` processes killed and restarted at
random (each tick added once, run at least once)."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer

from pyqueue import InvalidArgument, Job, Outcome, OutcomeUnknown, Queue
from pyqueue.cli import main
from pyqueue.protocol.core import parse_duration_ms
from pyqueue.ops.schedules import (
    ENQUEUE_MARGIN_MS,
    MAX_ROUND_S,
    Due,
    Schedule,
    Scheduler,
    due,
    parse_schedule,
    server_now_ms,
    window_ms,
)
from pyqueue.ops.service import Services
from pyqueue.worker import Worker

TESTS = Path(__file__).resolve().parent
KEEP = 300_000  # the default keep_done_ms
#: 2025-11-22 17:00:00 UTC, a Saturday.
HOUR = 1763830800


def server_ms(r: Any) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def ms(*args: int) -> int:
    """A UTC date as unix milliseconds."""
    return int(datetime(*args, tzinfo=timezone.utc).timestamp()) * 1000


# -- parsing and refusals ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("60s", 60_000), ("5m", 300_000), ("1h", 3_600_000), ("90000ms", 90_000), ("2d", 172_800_000), ("1s", 1_000)],
)
def test_durations(text: str, expected: int) -> None:
    assert parse_duration_ms(text) == expected


def test_the_command_line_forms() -> None:
    assert parse_schedule("report=60s", "q") == Schedule("report", "q", every_ms=60_000)
    assert parse_schedule("report=90000ms", "q", "every") == Schedule("report", "q", every_ms=90_000)
    assert parse_schedule("hourly=0 * * * *", "q") == Schedule("hourly", "q", cron="0 * * * *")
    assert parse_schedule("r@other=5m", "q") == Schedule("r", "other", every_ms=300_000)
    # A queue name may hold '=' (cron expressions and intervals never do): split at the last.
    assert parse_schedule("r@a=b=1h", "q") == Schedule("r", "a=b", every_ms=3_600_000)
    assert parse_schedule("six@q2=*/10 * * * * *", "q", "cron") == Schedule("six", "q2", cron="*/10 * * * * *")
    # --cron takes the text as a cron expression even where it could read as an interval.
    with pytest.raises(InvalidArgument, match="cron"):
        parse_schedule("x=60s", "q", "cron")


@pytest.mark.parametrize(
    ("spec", "kind", "message"),
    [
        ("report", "auto", "NAME=WHEN"),
        ("=60s", "auto", "NAME=WHEN"),
        ("report=", "auto", "NAME=WHEN"),
        ("report@=60s", "auto", "NAME=WHEN"),
        ("a:b=60s", "auto", "separates the name"),
        ("a b=60s", "auto", "schedule name"),
        ("x" * 65 + "=60s", "auto", "schedule name"),
        ("r\n=60s", "auto", "schedule name"),
        ("r=1500ms", "every", "whole number of seconds"),
        ("r=500ms", "every", r"every_ms must be in \[1000"),
        ("r=0s", "every", r"every_ms must be in \[1000"),
        ("r=60", "every", "unit"),
        ("r=1.5s", "every", "unit"),
        ("r=0 * * * *", "every", "unit"),
        ("r=61 * * * *", "cron", "bad cron expression"),
        ("r=* * *", "cron", "bad cron expression"),
        ("r=0 0 31 2 *", "cron", "bad cron expression"),  # never: cronsim refuses it
        ("r@bad{queue}=60s", "auto", "queue"),
    ],
)
def test_bad_command_line_forms_are_refused(spec: str, kind: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_schedule(spec, "q", kind)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of every_ms and cron"),
        ({"every_ms": 60_000, "cron": "* * * * *"}, "exactly one of every_ms and cron"),
        ({"every_ms": 2_500}, "whole number of seconds"),
        ({"every_ms": 999}, "every_ms"),
        ({"every_ms": 60.0}, "every_ms must be an int"),
        ({"every_ms": True}, "every_ms must be an int"),
        ({"cron": 5}, "cron must be a str"),
        ({"every_ms": 1_000, "max_attempts": 0}, "max_attempts"),
        ({"every_ms": 1_000, "payload": 5}, "payload"),
    ],
)
def test_bad_schedules_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Schedule("s", "q", **kwargs)


def test_a_worker_refuses_schedules_it_cannot_keep_exactly_once() -> None:
    every = Schedule("s", "q", every_ms=1_000)
    with pytest.raises(InvalidArgument, match="not one of this worker's queues"):
        Worker(["q"], print, schedules=[Schedule("s", "other", every_ms=1_000)])
    with pytest.raises(InvalidArgument, match="keep_done_ms > 0"):
        Worker(["q"], print, keep_done_ms=0, schedules=[every])
    with pytest.raises(InvalidArgument, match="unique"):
        Worker(["q", "r"], print, schedules=[every, Schedule("s", "r", cron="* * * * *")])
    with pytest.raises(InvalidArgument, match="Schedule objects"):
        Worker(["q"], print, schedules=["s=1s"])  # type: ignore[list-item]
    Worker(["q"], print, keep_done_ms=0)  # no schedule: keep_done_ms=0 stays allowed


def test_the_worker_command_refuses_bad_schedules_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing runs: the refusal comes before registration (cmd_worker would os._exit).
    base = ["--url", "embedded", "worker", "handlers:slow", "-q", "q", "-q", "r"]
    assert main([*base, "--every", "a:b=60s"]) == 2
    assert "separates the name" in capsys.readouterr().err
    assert main([*base, "--every", "x@other=60s"]) == 2
    assert "not one of this worker's queues" in capsys.readouterr().err
    assert main([*base, "--cron", "x=99 * * * *"]) == 2
    assert "bad cron expression" in capsys.readouterr().err
    assert main([*base, "--every", "x=1s", "--keep-done-ms", "0"]) == 2
    assert "keep_done_ms > 0" in capsys.readouterr().err
    assert main([*base, "--every", "x=1s", "--cron", "x@r=* * * * *"]) == 2
    assert "unique" in capsys.readouterr().err
    assert main([*base, "--schedule-attempts", "7"]) == 2
    assert "none is given" in capsys.readouterr().err
    assert main([*base, "--every", "x=1s", "--schedule-attempts", "0"]) == 2
    assert "max_attempts" in capsys.readouterr().err


# -- ticks (pure: the clock is an argument) -------------------------------------------------


def test_interval_ticks_are_multiples_of_the_interval_since_the_epoch() -> None:
    s = Schedule("s", "q", every_ms=5_000)
    assert s.latest_tick(1_000_000) == 1_000 and s.next_tick(1_000_000) == 1_005
    assert s.latest_tick(1_004_999) == 1_000 and s.next_tick(1_004_999) == 1_005
    assert s.latest_tick(1_005_000) == 1_005 and s.next_tick(1_005_000) == 1_010
    assert s.latest_tick(0) == 0 and s.latest_tick(4_999) == 0
    rng = random.Random(7)
    for every_s in (1, 7, 60, 3_600, 86_400):
        s = Schedule("s", "q", every_ms=every_s * 1_000)
        for _ in range(200):
            now = rng.randrange(2**41)
            latest, upcoming = s.latest_tick(now), s.next_tick(now)
            assert latest is not None and upcoming is not None
            assert latest % every_s == 0 and latest * 1000 <= now < upcoming * 1000 == (latest + every_s) * 1000
    assert s.job_id(HOUR) == f"s:{HOUR}"


def test_cron_ticks_in_utc() -> None:
    hourly = Schedule("report", "q", cron="0 * * * *")
    assert hourly.latest_tick(HOUR * 1000) == HOUR  # a tick at now is due
    assert hourly.latest_tick(HOUR * 1000 - 1) == HOUR - 3_600
    assert hourly.latest_tick(HOUR * 1000 + 3_599_999) == HOUR
    assert hourly.next_tick(HOUR * 1000 - 1) == HOUR
    assert hourly.next_tick(HOUR * 1000) == HOUR + 3_600
    assert hourly.job_id(HOUR) == "report:1763830800"
    # Weekdays at 09:30 UTC (2025-11-22 is a Saturday): Friday's, then Monday's.
    weekdays = Schedule("w", "q", cron="30 9 * * 1-5")
    now = ms(2025, 11, 22, 12, 0)
    assert weekdays.latest_tick(now) == ms(2025, 11, 21, 9, 30) // 1000
    assert weekdays.next_tick(now) == ms(2025, 11, 24, 9, 30) // 1000
    # Six fields: seconds first.
    assert Schedule("x", "q", cron="*/20 * * * * *").latest_tick(HOUR * 1000 + 59_999) == HOUR + 40


def test_a_cron_expression_and_the_interval_it_spells_give_the_same_ticks() -> None:
    rng = random.Random(11)
    for cron, every_ms in (("*/15 * * * *", 900_000), ("0 */6 * * *", 21_600_000), ("*/5 * * * * *", 5_000)):
        a, b = Schedule("a", "q", cron=cron), Schedule("b", "q", every_ms=every_ms)
        for _ in range(100):
            now = HOUR * 1000 + rng.randrange(-(10**10), 10**10)
            assert (a.latest_tick(now), a.next_tick(now)) == (b.latest_tick(now), b.next_tick(now)), (cron, now)


def test_the_window_is_keep_done_ms_less_a_margin() -> None:
    assert window_ms(KEEP) == KEEP - ENQUEUE_MARGIN_MS == 240_000
    assert window_ms(10_000) == 5_000  # the margin is at most half of it
    assert window_ms(1) == 1


def test_a_round_enqueues_only_the_latest_due_tick_within_the_window() -> None:
    s = Schedule("s", "q", every_ms=10_000)
    t = HOUR
    # First round of a process: the latest tick.
    assert due(s, t * 1000 + 3_000, KEEP, None) == Due(enqueue=t)
    # Already sent by this process: nothing.
    assert due(s, t * 1000 + 9_999, KEEP, t) == Due()
    # Next tick: it.
    assert due(s, (t + 10) * 1000, KEEP, t) == Due(enqueue=t + 10)
    # Behind by five ticks: the latest only, never a backlog; the one before it passed over.
    assert due(s, (t + 50) * 1000 + 1, KEEP, t) == Due(enqueue=t + 50, passed_over=t + 40)
    # The window: enqueued up to the last ms before t + window, expired from then on.
    hourly = Schedule("h", "q", cron="0 * * * *")
    assert due(hourly, HOUR * 1000 + window_ms(KEEP) - 1, KEEP, None) == Due(enqueue=HOUR)
    assert due(hourly, HOUR * 1000 + window_ms(KEEP), KEEP, None) == Due(expired=HOUR)
    assert due(hourly, HOUR * 1000 + 3_000_000, KEEP, HOUR - 3_600) == Due(expired=HOUR)
    assert due(hourly, HOUR * 1000 + 3_000_000, KEEP, HOUR) == Due()  # warned once, then quiet
    # A longer keep_done_ms keeps the window open longer.
    assert due(hourly, HOUR * 1000 + 3_000_000, 3_600_000, None) == Due(enqueue=HOUR)


# -- the scheduler on a server, with an injected clock ------------------------------------


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self, _queue: Queue) -> int:
        return self.now_ms


def test_a_tick_is_added_once_however_many_schedulers_send_it_also_after_its_ack(r: redis.Redis) -> None:
    q = Queue("q", r)
    s = Schedule("s", "q", every_ms=3_600_000, payload=b"hi", max_attempts=2)
    clock = Clock(HOUR * 1000 + 1_500)
    first = Scheduler([s], {"q": q}, KEEP, clock=clock)
    assert first.round() == MAX_ROUND_S  # the next tick is a minute away: capped
    first.round()  # remembered: not sent again
    assert (q.stats().enqueued, q.stats().duplicates) == (1, 0)
    (job,) = q.lease()
    assert (job.id, job.payload, job.max_attempts) == (f"s:{HOUR}", b"hi", 2)
    Scheduler([s], {"q": q}, KEEP, clock=clock).round()  # a second worker, while it runs
    assert q.ack(job) is Outcome.OK
    clock.now_ms += 200_000  # still inside the window: the tombstone answers
    late = Scheduler([s], {"q": q}, KEEP, clock=clock)  # a worker started after the ack
    late.round()
    assert (late.added, late.duplicates) == (0, 1)
    assert (q.stats().enqueued, q.stats().duplicates, q.stats().ready) == (1, 2, 0)


def test_a_tick_older_than_the_window_is_skipped_and_logged_once(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    q = Queue("q", r)
    s = Schedule("daily", "q", cron="0 0 * * *")
    clock = Clock(ms(2025, 11, 22, 10, 0))  # ten hours after the last tick
    scheduler = Scheduler([s], {"q": q}, KEEP, clock=clock)
    with caplog.at_level(logging.WARNING, "pyqueue.ops.schedules"):
        scheduler.round()
        clock.now_ms += 60_000
        scheduler.round()
    assert q.stats().enqueued == 0
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"daily:{ms(2025, 11, 22) // 1000}" in warnings[0].getMessage()
    clock.now_ms = ms(2025, 11, 23, 0, 0, 2)  # the next tick, on time
    scheduler.round()
    assert q.get(f"daily:{ms(2025, 11, 23) // 1000}").state == "ready"


def test_a_round_sleeps_until_the_next_tick_and_wakes_past_it(r: redis.Redis) -> None:
    q = Queue("q", r)
    clock = Clock(HOUR * 1000 + 300)
    scheduler = Scheduler([Schedule("a", "q", every_ms=1_000), Schedule("b", "q", every_ms=60_000)], {"q": q}, KEEP,
                          clock=clock)
    assert 0.7 < scheduler.round() < 0.71
    clock.now_ms = HOUR * 1000 + 1_000  # exactly the next tick
    scheduler.round()
    assert [q.get(f"a:{t}").state for t in (HOUR, HOUR + 1)] == ["ready", "ready"]


def test_enqueue_errors_are_retried_next_round_and_never_end_the_thread(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    q = Queue("q", r)
    fail = {"enqueue": 1, "clock": 2}
    real_enqueue = q.enqueue

    def flaky_enqueue(*args: Any, **kwargs: Any) -> Any:
        if fail["enqueue"]:
            fail["enqueue"] -= 1
            raise OutcomeUnknown("connection lost")
        return real_enqueue(*args, **kwargs)

    q.enqueue = flaky_enqueue  # type: ignore[method-assign]
    s = Schedule("s", "q", every_ms=60_000)
    clock = Clock(HOUR * 1000)
    scheduler = Scheduler([s], {"q": q}, KEEP, clock=clock)
    with caplog.at_level(logging.WARNING, "pyqueue.ops.schedules"):
        assert scheduler.round() == MAX_ROUND_S
        assert q.stats().enqueued == 0 and "enqueue failed" in caplog.text
        scheduler.round()  # the same tick, again
    assert q.get(f"s:{HOUR}").state == "ready"

    def flaky_clock(queue: Queue) -> int:
        if fail["clock"]:
            fail["clock"] -= 1
            raise (redis.ConnectionError("down") if fail["clock"] else RuntimeError("a bug"))
        return HOUR * 1000 + 60_000

    scheduler.clock = flaky_clock
    scheduler.start()
    deadline = time.monotonic() + 10
    while q.stats().enqueued < 2:
        assert time.monotonic() < deadline, "the scheduler thread gave up after errors"
        time.sleep(0.05)
    scheduler.join()
    assert scheduler.thread is not None and not scheduler.thread.is_alive()


def test_the_server_clock_is_read_through_the_queue(r: redis.Redis) -> None:
    before = server_ms(r)
    assert before <= server_now_ms(Queue("q", r)) <= server_ms(r)
    assert before <= server_now_ms(Queue("p", r, partitions=3)) <= server_ms(r)


# -- three workers at once ------------------------------------------------------------------


def present_ticks(q: Queue, name: str, first: int, last: int) -> list[int]:
    """The ticks in [first, last] whose job exists (in any state, or acked: done)."""
    return [t for t in range(first, last + 1) if q.get(f"{name}:{t}").state != "unknown"]


def test_three_workers_enqueue_each_tick_once_and_run_it_once(r: redis.Redis) -> None:
    q = Queue("ticks", r)
    seen: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            seen.append(job.id)

    start_ms = server_ms(r)
    workers = [
        Worker(["ticks"], handler, redis=r, block_ms=200, concurrency=2,
               schedules=[Schedule("tick", "ticks", every_ms=1_000)])
        for _ in range(3)
    ]
    threads = [threading.Thread(target=w.run, kwargs={"install_signal_handlers": False}, daemon=True) for w in workers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while any(w.service is None for w in workers):
        assert time.monotonic() < deadline, "workers did not register"
        time.sleep(0.01)
    all_up_ms = server_ms(r)
    time.sleep(3.6)
    end_ms = server_ms(r)
    # Every tick enqueued by now has run (a condition, not a duration: on a slow machine
    # the last tick's job may take longer than a fixed pause to run).
    deadline = time.monotonic() + 15
    while not {f"tick:{t}" for t in present_ticks(q, "tick", start_ms // 1000 - 1, end_ms // 1000 + 2)} <= set(seen):
        assert time.monotonic() < deadline, "the ticks enqueued did not all run"
        time.sleep(0.01)
    for w in workers:
        w.stop("test finished")
    for t in threads:
        t.join(15)
        assert not t.is_alive()

    stats = q.stats()
    present = present_ticks(q, "tick", start_ms // 1000 - 1, end_ms // 1000 + 2)
    expected = range(-(-all_up_ms // 1000), end_ms // 1000 + 1)  # every tick while all three ran
    assert len(expected) >= 3
    assert set(expected) <= set(present)
    assert stats.enqueued == len(present)  # no tick was added twice
    assert stats.duplicates >= len(expected)  # the other workers sent them too
    assert sum(w._scheduler.added for w in workers if w._scheduler) == len(present)
    # Each ran once; a tick enqueued after the wait above, as the workers stopped, may
    # not have run.
    assert len(seen) == len(set(seen)) and set(seen) <= {f"tick:{t}" for t in present}
    assert {f"tick:{t}" for t in present if t <= end_ms // 1000} <= set(seen)
    assert stats.acked == len(present) and stats.ready == stats.leased == 0


# -- the command, in processes ------------------------------------------------------------


def spawn(server: RedisServer, *args: str, runs: str = "runs", sleep_s: float = 0.0) -> subprocess.Popen[bytes]:
    """A ``pyqueue worker handlers:slow`` process (tests/handlers.py records each run's
    job id in ``test:{runs}:<runs>``); its log goes to ``proc.log_path``."""
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PQ_TEST_URL=server.url(), PQ_TEST_SLEEP_S=str(sleep_s), PQ_TEST_RUNS=runs)
    log_path = server.directory / f"schedules-worker-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "--url", server.url(), "worker", "handlers:slow", *args],
            env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


@pytest.fixture
def real(redis_server: RedisServer) -> redis.Redis:
    client = redis_server.client()
    client.flushall()
    return client


def test_the_worker_command_runs_interval_and_cron_schedules(redis_server: RedisServer, real: redis.Redis) -> None:
    proc = spawn(redis_server, "-q", "main", "-q", "other", "--block-ms", "500",
                 "--every", "tick=1s", "--cron", "six@other=*/1 * * * * *", "--schedule-attempts", "7")
    try:
        deadline = time.monotonic() + 15
        while real.llen("test:{runs}:runs") < 4:
            assert proc.poll() is None, proc.log_path.read_text()  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, proc.log_path.read_text()  # type: ignore[attr-defined]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    ran = {x.decode() for x in real.lrange("test:{runs}:runs", 0, -1)}
    assert {x.split(":")[0] for x in ran} == {"tick", "six"}
    assert Queue("main", real).stats().enqueued >= 1 and Queue("other", real).stats().enqueued >= 1
    assert b"scheduler started: tick@main every 1s, 7 attempts, six@other cron '*/1 * * * * *', 7 attempts" in \
        proc.log_path.read_bytes()  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_workers_killed_and_restarted_at_random_add_each_tick_once_and_run_it(
    redis_server: RedisServer, real: redis.Redis
) -> None:
    """Three ``pyqueue worker --every tick=1s`` processes; every ~2 s one of them, at
    random, is SIGKILLed (by its PID) and started again, for 15 s. Then the survivors
    are stopped and one clean worker drains what the killed ones left. Every tick of the
    covered window was added exactly once (the ``enqueued`` counter equals the number
    of distinct tick ids; the other sends are counted duplicates) and ran at least once."""
    args = ["-q", "ticks", "--every", "tick=1s", "--concurrency", "2", "--block-ms", "1000", "--lease-ms", "2000",
            "--renew-ms", "500", "--expire-ms", "2000"]
    q = Queue("ticks", real)
    rng = random.Random()
    start_ms = server_ms(real)
    procs = [spawn(redis_server, *args, sleep_s=0.3) for _ in range(3)]
    kills = 0
    try:
        deadline = time.monotonic() + 20
        while q.stats().enqueued == 0:
            assert time.monotonic() < deadline, "no tick was enqueued"
            time.sleep(0.05)
        covered_from_ms = server_ms(real)
        chaos_until = time.monotonic() + 15
        while time.monotonic() < chaos_until:
            time.sleep(rng.uniform(1.5, 2.5))
            i = rng.randrange(len(procs))
            procs[i].kill()  # SIGKILL, by PID
            procs[i].wait(10)
            kills += 1
            procs[i] = spawn(redis_server, *args, sleep_s=0.3)
        covered_to_ms = server_ms(real)
        # Stop them once registered (a process still starting would die of the SIGTERM).
        deadline = time.monotonic() + 20
        while not {p.pid for p in procs} <= {s.pid for s in Services(real).list() if s.alive}:
            assert time.monotonic() < deadline, "restarted workers did not register"
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(20)
    assert all(proc.returncode == 0 for proc in procs)
    end_ms = server_ms(real)

    # What the killed workers held: scrubbed (their registrations expired) or reclaimed.
    def drain(job: Job) -> None:
        real.rpush("test:{runs}:runs", job.id)

    Worker(["ticks"], drain, redis=real, renew_ms=200, expire_ms=1_000, block_ms=3_000, lease_ms=2_000).run(
        burst=True, install_signal_handlers=False
    )
    stats = q.stats()
    assert (stats.ready, stats.scheduled, stats.leased, stats.dead) == (0, 0, 0, 0)
    present = present_ticks(q, "tick", start_ms // 1000 - 1, end_ms // 1000 + 1)
    expected = range(covered_from_ms // 1000 + 1, covered_to_ms // 1000)
    runs = [x.decode() for x in real.lrange("test:{runs}:runs", 0, -1)]
    assert kills >= 5 and len(expected) >= 14
    assert set(expected) <= set(present), sorted(set(expected) - set(present))
    assert stats.enqueued == len(present), "a tick was added twice"
    assert stats.duplicates >= len(expected)
    assert set(runs) == {f"tick:{t}" for t in present}  # each ran at least once, nothing else ran
    print(f"\n{kills} kills, {len(present)} ticks added once each, {stats.duplicates} duplicate sends, "
          f"{len(runs)} runs ({len(runs) - len(present)} again after a kill)")
