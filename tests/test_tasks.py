"""The task layer (pyqueue.tasks) on both backends: argument checks before anything is
sent, the JSON codec's extra types through a worker, every policy option, per-send
overrides, unknown task names and raw payloads, current_job(), Retry and Fail raised by
a task, unstorable results, connecting, and the send verbs.

Time limits have their own module (test_tasks_time_limit.py), and so does the testing
helper (test_tasks_testing.py). Tasks here are registered inside each test, so they
carry ``name=`` (a local function has no stable module.qualname).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import enum
import math
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta, timezone
from typing import Any

import pytest
import redis
from conftest import RedisServer, all_keys, async_client
from tasks_support import Serving, burst, job_state, serve, server_ms, wait_for  # noqa: F401 (serve: a fixture)

from pyqueue import InvalidArgument, Queue
from pyqueue.worker.aio import AsyncWorker
from pyqueue.drivers.clients import embedded_server
from pyqueue.tasks import (
    Backoff,
    Fail,
    Retry,
    SentTask,
    TaskDead,
    Tasks,
    TaskOptions,
    current_job,
)
from pyqueue.worker import Worker

FAST = {"backoff_base_ms": 1, "backoff_cap_ms": 5}


@pytest.fixture
def tasks(r: redis.Redis) -> Tasks:
    """A Tasks object on the test's server (fakeredis or the real redis-server)."""
    return Tasks(client=r)


def stats(tasks: Tasks, queue: str = "default") -> Any:
    return tasks.queue(queue).stats()


def dead_error(tasks: Tasks, job_id: str, queue: str = "default") -> str:
    info = job_state(tasks, queue, job_id)
    assert info.state == "dead", f"job {job_id} is {info.state}, not dead"
    return info.error


# -- arguments: checked before anything is sent ---------------------------------------


def test_a_call_that_does_not_fit_the_signature_raises_type_error_and_sends_nothing(tasks: Tasks, r: Any) -> None:
    @tasks.task(name="add")
    def add(a: int, b: int, *, scale: int = 1) -> int:
        return (a + b) * scale

    bad_calls: list[Callable[[], object]] = [
        lambda: add.send(1),  # type: ignore[call-arg]
        lambda: add.send(1, 2, 3),  # type: ignore[call-arg]
        lambda: add.send(1, 2, colour="red"),  # type: ignore[call-arg]
        lambda: add.send(1, 2, 3, scale=2),  # type: ignore[call-arg]
        lambda: add.send_in(5, 1),  # type: ignore[call-arg]
        lambda: add.send_at(dt.datetime.now(timezone.utc), b=2),  # type: ignore[call-arg]
        lambda: add.options(queue="other").send(1),  # type: ignore[call-arg]
        lambda: add.send_many([(1, 2), (1,)]),  # the first call is fine: still nothing sent
        lambda: add.s(1, 2, 3),  # type: ignore[call-arg]
    ]
    for call in bad_calls:
        with pytest.raises(TypeError, match="add"):
            call()
    assert all_keys(r) == []  # nothing at all reached Redis
    assert stats(tasks).enqueued == 0 and stats(tasks, "other").enqueued == 0
    assert add(1, 2, scale=3) == 9  # calling the task runs it here, now


def test_an_argument_that_does_not_travel_as_json_is_refused_and_nothing_is_sent(tasks: Tasks, r: Any) -> None:
    @tasks.task(name="take")
    def take(value: Any, **extra: Any) -> None:
        pass

    cyclic: list[Any] = []
    cyclic.append(cyclic)
    refused = [
        object(),
        float("nan"),
        float("inf"),
        -float("inf"),
        {1: "int key"},
        {("a", "b"): 1},
        {"$pq": "datetime", "v": "2020-01-01"},  # would arrive as a datetime
        {"nested": [{"deep": object()}]},
        [1, 2, {3}, complex(1, 2)],
        cyclic,
        threading.Lock(),
    ]
    for value in refused:
        with pytest.raises(InvalidArgument, match="take argument"):
            take.send(value)
        with pytest.raises(InvalidArgument):
            take.send(1, extra=value)
    with pytest.raises(InvalidArgument):
        take.send_many([(1,), (object(),)])
    assert all_keys(r) == []
    assert stats(tasks).enqueued == 0


class Colour(str):
    """A str subclass: travels as its plain value."""


class Size(str, enum.Enum):
    """A str-mixin Enum: travels as its value ("big"), not as str() gives it ("Size.BIG")."""

    BIG = "big"


class Level(enum.IntEnum):
    HIGH = 3


def test_extra_types_round_trip_through_a_worker_into_the_function_and_back_as_a_result(tasks: Tasks) -> None:
    received: list[Any] = []

    @tasks.task(name="echo", keep_result=60)
    def echo(value: Any, *, more: Any = None) -> Any:
        received.append((value, more))
        return value

    value = {
        "aware": dt.datetime(2024, 3, 1, 12, 30, 15, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        "utc": dt.datetime(2024, 3, 1, 12, 30, tzinfo=timezone.utc),
        "naive": dt.datetime(2024, 3, 1, 12, 30, 15, 7),
        "date": dt.date(1999, 12, 31),
        "time": dt.time(23, 59, 58, 999),
        "time_aware": dt.time(8, 0, tzinfo=timezone.utc),
        "timedelta": timedelta(days=3, seconds=7, microseconds=11),
        "negative_timedelta": timedelta(seconds=-1.5),
        "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "decimal": decimal.Decimal("3.14159265358979323846264338327950288"),
        "decimal_exp": decimal.Decimal("-1.50E+10"),
        "bytes": bytes(range(256)),
        "empty_bytes": b"",
        "set": {1, 2, 3},
        "frozenset": frozenset({"a", "b"}),
        "set_of_tuples": {(1, 2), (3, 4)},
        "set_of_datetimes": {dt.date(2020, 1, 1), dt.date(2021, 1, 1)},
        "plain": [None, True, False, 0, -1, 2**62, 1.5, "é ☃ \u0000", {"k": []}],
        "str_subclass": Colour("red"),
        "str_enum": Size.BIG,
        "int_enum": Level.HIGH,
        "enum_keys": {Size.BIG: Level.HIGH},
    }
    handle = echo.send(value, more={"when": dt.date(2000, 1, 1), "ids": {uuid.UUID(int=1)}})
    assert burst(tasks) == 0
    got = handle.result(timeout=5)
    ((arrived, more),) = received
    expected = dict(value, frozenset={"a", "b"}, str_subclass="red", str_enum="big", int_enum=3, enum_keys={"big": 3})
    for seen in (arrived, got):
        assert seen == expected
        for key, item in expected.items():
            assert type(seen[key]) is type(item), key  # a naive datetime stays naive, Decimal stays Decimal...
        assert seen["aware"].utcoffset() == timedelta(hours=5, minutes=30)
        assert seen["naive"].tzinfo is None
        assert str(seen["decimal"]) == str(value["decimal"])  # not a float on the way
    assert more == {"when": dt.date(2000, 1, 1), "ids": {uuid.UUID(int=1)}}


# -- every policy option ----------------------------------------------------------------


def test_queue_option_sends_to_that_queue_and_the_worker_serves_it(tasks: Tasks) -> None:
    ran: list[str] = []

    @tasks.task(name="mail", queue="emails")
    def mail(to: str) -> None:
        ran.append(to)

    @tasks.task(name="plain")
    def plain() -> None:
        ran.append("plain")

    handle = mail.send("a@example.com")
    assert handle.queue == "emails" and isinstance(handle, SentTask) and handle.added
    assert stats(tasks, "emails").ready == 1 and stats(tasks).ready == 0
    assert tasks.queue_names() == ["emails", "default"]
    plain.send()
    assert burst(tasks) == 0
    assert sorted(ran) == ["a@example.com", "plain"]
    assert stats(tasks, "emails").acked == 1 and stats(tasks).acked == 1


def test_max_attempts_runs_the_task_that_many_times_then_it_is_dead(tasks: Tasks) -> None:
    calls: list[int] = []

    @tasks.task(name="flaky", max_attempts=3, backoff=0)
    def flaky() -> None:
        calls.append(current_job().attempt)
        raise ValueError(f"attempt {current_job().attempt} failed")

    handle = flaky.send()
    assert job_state(tasks, "default", handle.id).max_attempts == 3
    assert burst(tasks) == 0
    assert calls == [1, 2, 3]
    assert dead_error(tasks, handle.id) == "ValueError: attempt 3 failed"
    with pytest.raises(TaskDead, match="attempt 3 failed") as dead:
        handle.result(timeout=5)
    assert dead.value.job_id == handle.id and dead.value.task == "flaky"


def test_each_kind_of_backoff_schedules_the_retry_from_the_failure(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    def fail() -> None:
        raise RuntimeError("try again later")

    fixed = tasks.task(name="fixed", backoff=30)(fail)
    fixed_td = tasks.task(name="fixed_td", backoff=timedelta(minutes=2))(lambda: fail())
    expo = tasks.task(name="expo", backoff=Backoff.exponential(base=10, cap=100))(lambda: fail())
    by_attempt = tasks.task(name="by_attempt", backoff=lambda attempt: 7 * attempt)(lambda: fail())
    sent = {name: t.send() for name, t in [("fixed", fixed), ("fixed_td", fixed_td), ("expo", expo), ("by_attempt", by_attempt)]}
    worker = serve(tasks)
    wait_for(
        lambda: all(job_state(tasks, "default", h.id).state == "scheduled" for h in sent.values()), what="four retries"
    )
    delays = {}
    for name, handle in sent.items():
        info = job_state(tasks, "default", handle.id)
        assert info.attempts == 1
        delays[name] = info.due_ms - info.now_ms  # the time left, a little less than the delay
    worker.stop()
    assert 30_000 - 3_000 <= delays["fixed"] <= 30_000
    assert 120_000 - 3_000 <= delays["fixed_td"] <= 120_000
    assert 5_000 - 3_000 <= delays["expo"] <= 10_000  # base 10 s on the first failure, jittered in its upper half
    assert 7_000 - 3_000 <= delays["by_attempt"] <= 7_000


def test_backoff_values_by_attempt() -> None:
    expo = Backoff.exponential(base=1, cap=30)
    for attempt, (low, high) in {1: (500, 1000), 2: (1000, 2000), 3: (2000, 4000), 5: (8000, 16000), 9: (15000, 30000)}.items():
        for _ in range(20):
            assert low <= expo.delay_ms(attempt) <= high
    assert Backoff.exponential(base=2, cap=3600).delay_ms(10_000) <= 3_600_000  # no overflow at huge attempts
    assert Backoff.of(1.5) == Backoff.fixed(1.5) and Backoff.fixed(1.5).delay_ms(9) == 1500
    assert Backoff.of(timedelta(seconds=2)) == Backoff.fixed(2)
    assert Backoff.of(lambda attempt: timedelta(seconds=attempt)).delay_ms(3) == 3000
    for bad in (-1, "5", float("nan"), True):
        with pytest.raises(InvalidArgument):
            Backoff.of(bad)
    with pytest.raises(InvalidArgument):
        Backoff.exponential(base=10, cap=5)


def test_retry_on_retries_only_those_errors_the_others_are_dead_at_once(tasks: Tasks) -> None:
    calls: dict[str, int] = {"net": 0, "bug": 0}

    @tasks.task(name="net", retry_on=(ConnectionError, TimeoutError), max_attempts=3, backoff=0)
    def net(kind: str) -> None:
        calls[kind] += 1
        raise (ConnectionError("reset by peer") if kind == "net" else ValueError("bad data"))

    retried, failed = net.send("net"), net.send("bug")
    assert burst(tasks) == 0
    assert calls == {"net": 3, "bug": 1}
    assert dead_error(tasks, retried.id) == "ConnectionError: reset by peer"
    assert dead_error(tasks, failed.id) == "ValueError: bad data"
    assert job_state(tasks, "default", failed.id).attempts == 1


def test_fail_on_errors_are_dead_at_once_with_their_type_and_message(tasks: Tasks) -> None:
    calls: list[int] = []

    @tasks.task(name="charge", fail_on=(KeyError, PermissionError), max_attempts=5, backoff=0)
    def charge(account: str) -> None:
        calls.append(1)
        if account == "gone":
            raise KeyError(account)
        raise PermissionError(f"card of {account} declined")

    gone, declined = charge.send("gone"), charge.send("bob")
    assert burst(tasks) == 0
    assert len(calls) == 2
    assert dead_error(tasks, gone.id) == "KeyError: 'gone'"
    assert dead_error(tasks, declined.id) == "PermissionError: card of bob declined"
    assert stats(tasks).nacked == 2 and stats(tasks).dead == 2


def test_fail_on_wins_over_retry_on() -> None:
    policy = TaskOptions.build(retry_on=LookupError, fail_on=KeyError)
    assert policy.fails_at_once(KeyError("x")) and not policy.fails_at_once(IndexError("x"))
    assert policy.fails_at_once(ValueError("x"))  # not in retry_on


def test_max_age_a_job_too_old_when_leased_is_dead_and_never_runs(tasks: Tasks) -> None:
    ran: list[int] = []

    @tasks.task(name="notify", max_age=0.3, max_attempts=5)
    def notify(n: int) -> None:
        ran.append(n)

    @tasks.task(name="patient", max_age=60)
    def patient(n: int) -> None:
        ran.append(n)

    stale = notify.send(1)
    time.sleep(0.5)
    fresh = patient.send(2)
    assert burst(tasks) == 0
    assert ran == [2]
    error = dead_error(tasks, stale.id)
    assert error.startswith("max_age exceeded") and "not run" in error
    assert job_state(tasks, "default", stale.id).attempts == 1  # dead at once, not retried
    assert job_state(tasks, "default", fresh.id).state == "done"


def test_unique_a_function_of_the_arguments_gives_the_job_id_and_a_second_send_is_a_duplicate(tasks: Tasks) -> None:
    @tasks.task(name="welcome", unique=lambda user_id, **_: f"welcome:{user_id}")
    def welcome(user_id: int, *, lang: str = "en") -> None:
        pass

    first = welcome.send(7)
    second = welcome.send(7, lang="fr")  # the same id: a duplicate, whatever else differs
    other = welcome.send(8)
    assert (first.id, first.added) == ("welcome:7", True)
    assert (second.id, second.added) == ("welcome:7", False)
    assert (other.id, other.added) == ("welcome:8", True)
    assert stats(tasks).enqueued == 2 and stats(tasks).duplicates == 1

    # A send may turn it off (a random id), or name its own.
    fresh = welcome.options(unique=False).send(7)
    assert fresh.added and fresh.id != "welcome:7"
    custom = welcome.options(unique=lambda user_id, **_: f"custom:{user_id}").send(7)
    assert (custom.id, custom.added) == ("custom:7", True)
    assert stats(tasks).enqueued == 4
    with pytest.raises(InvalidArgument, match="unique"):
        welcome.options(unique="welcome:7")

    @tasks.task(name="bad_unique", unique=lambda x: x)
    def bad_unique(x: Any) -> None:
        pass

    with pytest.raises(InvalidArgument, match="unique"):
        bad_unique.send(5)
    assert stats(tasks).enqueued == 4


def test_unique_true_hashes_the_call(tasks: Tasks) -> None:
    @tasks.task(name="report", unique=True)
    def report(day: dt.date, options: dict[str, Any], tags: set[str] = frozenset(), *, fmt: str = "pdf") -> None:  # type: ignore[assignment]
        pass

    day = dt.date(2024, 1, 31)
    first = report.send(day, {"a": 1, "b": [1, 2]}, {"x", "y", "z"})
    # The same call: key order, set order and positional-or-keyword make no difference.
    same = [
        report.send(day, {"b": [1, 2], "a": 1}, {"z", "y", "x"}),
        report.send(day=day, options={"a": 1, "b": [1, 2]}, tags={"y", "x", "z"}),
        report.send(day, {"a": 1, "b": [1, 2]}, {"x", "y", "z"}, fmt="pdf"),
    ]
    different = [
        report.send(dt.date(2024, 2, 1), {"a": 1, "b": [1, 2]}, {"x", "y", "z"}),
        report.send(day, {"a": 1, "b": [2, 1]}, {"x", "y", "z"}),
        report.send(day, {"a": 1, "b": [1, 2]}, {"x", "y", "z"}, fmt="csv"),
    ]
    assert first.added and first.id.startswith("report:")
    assert all(h.id == first.id and not h.added for h in same)
    assert all(h.added for h in different) and len({h.id for h in different} | {first.id}) == 4
    assert stats(tasks).enqueued == 4


def test_keep_result_returns_the_decoded_value_without_it_result_is_none_once_done(tasks: Tasks) -> None:
    @tasks.task(name="kept", keep_result=60)
    def kept(n: int) -> dict[str, Any]:
        return {"n": n, "when": dt.date(2024, 5, 1), "raw": b"\x00"}

    @tasks.task(name="not_kept")
    def not_kept(n: int) -> int:
        return n * 2

    a, b = kept.send(21), not_kept.send(21)
    assert a.keeps_result and not b.keeps_result
    assert burst(tasks) == 0
    assert a.result(timeout=5) == {"n": 21, "when": dt.date(2024, 5, 1), "raw": b"\x00"}
    assert b.result(timeout=5) is None
    assert tasks.queue("default").result(b.id).state == "done"


def test_result_of_a_cancelled_job_is_missing_if_a_result_was_asked_for(tasks: Tasks) -> None:
    from pyqueue.tasks import TaskResultMissing

    @tasks.task(name="kept", keep_result=60)
    def kept() -> int:
        return 1

    @tasks.task(name="unkept")
    def unkept() -> int:
        return 1

    a, b = kept.send(), unkept.send()
    assert tasks.queue("default").cancel(a.id).cancelled and tasks.queue("default").cancel(b.id).cancelled
    with pytest.raises(TaskResultMissing, match="cancelled"):
        a.result(timeout=5)
    assert b.result(timeout=5) is None


def test_result_waits_for_a_running_worker_and_times_out_while_pending(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    from pyqueue.tasks import ResultTimeout

    gate = threading.Event()

    @tasks.task(name="slow", keep_result=60)
    def slow() -> str:
        gate.wait(10)
        return "finally"

    handle = slow.send()
    serve(tasks)
    with pytest.raises(ResultTimeout):
        handle.result(timeout=0.3)
    gate.set()
    assert handle.result(timeout=10) == "finally"


def test_per_send_options_override_each_registered_option(tasks: Tasks, serve: Callable[..., Serving]) -> None:
    ran: list[str] = []

    @tasks.task(name="job", queue="main", max_attempts=5, backoff=60)
    def job(mode: str) -> str:
        ran.append(mode)
        if mode == "spin":
            while True:
                time.sleep(0.005)
        if mode == "fail":
            raise ValueError("no")
        return mode.upper()

    kept = job.options(queue="side", keep_result=timedelta(minutes=1), max_attempts=2).send("keep")
    assert (kept.queue, kept.keeps_result) == ("side", True)
    assert job_state(tasks, "side", kept.id).max_attempts == 2
    limited = job.options(queue="side", time_limit=0.3, max_attempts=1).send("spin")
    failed = job.options(queue="side", fail_on=ValueError).send("fail")
    backed_off = job.options(queue="side", backoff=Backoff.fixed(0)).options(max_attempts=2).send("fail")
    plain = job.send("plain")
    assert (plain.queue, plain.keeps_result) == ("main", False)
    assert job_state(tasks, "main", plain.id).max_attempts == 5
    serve(tasks, queues=["main", "side"], backoff_base_ms=60_000, backoff_cap_ms=60_000)
    assert kept.result(timeout=10) == "KEEP"
    assert plain.result(timeout=10) is None
    wait_for(lambda: job_state(tasks, "side", limited.id).state == "dead", what="the time-limited job's death")
    assert "TimeLimitExceeded" in dead_error(tasks, limited.id, "side")
    wait_for(lambda: job_state(tasks, "side", failed.id).state == "dead", what="the fail_on job's death")
    assert job_state(tasks, "side", failed.id).attempts == 1  # fail_on, not the task's 5 attempts
    wait_for(lambda: job_state(tasks, "side", backed_off.id).state == "dead", what="two quick attempts")
    assert ran.count("fail") == 3  # 1 (fail_on) + 2 (backoff 0, max_attempts 2)
    # The registered policy is unchanged by a per-send override.
    assert job.policy.queue == "main" and job.policy.time_limit_ms is None and job.policy.keep_result_ms is None


def test_durations_take_int_float_and_timedelta_and_bad_ones_are_refused(tasks: Tasks) -> None:
    @tasks.task(name="d", time_limit=2, max_age=1.5, keep_result=timedelta(hours=1), backoff=timedelta(milliseconds=250))
    def d() -> None:
        pass

    p = d.policy
    assert (p.time_limit_ms, p.max_age_ms, p.keep_result_ms) == (2000, 1500, 3_600_000)
    assert p.backoff is not None and p.backoff.delay_ms(1) == 250
    o = d.options(time_limit=timedelta(seconds=0.5), max_age=3, keep_result=0.25).opts
    assert (o.time_limit_ms, o.max_age_ms, o.keep_result_ms) == (500, 3000, 250)
    for option in ("time_limit", "max_age", "keep_result", "backoff"):
        for bad in (-1, -0.5, timedelta(seconds=-1), "5", "5s", float("nan"), float("inf"), [1], True):
            with pytest.raises(InvalidArgument):
                tasks.task(name=f"bad_{option}", **{option: bad})(lambda: None)
            with pytest.raises(InvalidArgument):
                d.options(**{option: bad})
    for option in ("time_limit", "keep_result"):
        with pytest.raises(InvalidArgument):  # nothing to run, or to keep, in 0 s
            d.options(**{option: 0})
    for bad_attempts in (0, -1, 1.5, "3", True, 10_001):
        with pytest.raises(InvalidArgument):
            d.options(max_attempts=bad_attempts)
    with pytest.raises(InvalidArgument, match="unknown task option"):
        d.options(timeout=5)
    with pytest.raises(InvalidArgument):
        d.send_in(-1)
    with pytest.raises(InvalidArgument):
        d.send_in("1h")  # type: ignore[arg-type]
    assert stats(tasks).enqueued == 0


def test_a_per_send_option_that_cannot_travel_is_refused_before_sending(tasks: Tasks) -> None:
    class Local(Exception):
        pass

    @tasks.task(name="t")
    def t() -> None:
        pass

    with pytest.raises(InvalidArgument, match="importable"):
        t.options(fail_on=Local).send()
    with pytest.raises(InvalidArgument, match="importable"):
        t.options(backoff=lambda attempt: 1).send()
    assert stats(tasks).enqueued == 0


# -- unknown task names and payloads that are not envelopes -----------------------------


def test_a_job_of_an_unknown_task_is_never_acked_it_is_retried_then_dead_with_a_clear_error(r: Any) -> None:
    producer, consumer = Tasks(client=r), Tasks(client=r)

    @producer.task(name="x", max_attempts=2)
    def x() -> None:
        pass

    @consumer.task(name="y")
    def y() -> None:
        pass

    handle = x.send()
    consumer_y = y.send()
    assert burst(consumer) == 0
    q = consumer.queue("default")
    info = q.get(handle.id)
    assert info.state == "dead" and info.attempts == 2
    assert "unknown task 'x'" in info.error
    s = q.stats()
    assert s.acked == 1 and s.nacked == 2  # only y was acked
    assert q.get(consumer_y.id).state == "done"
    with pytest.raises(TaskDead, match="unknown task 'x'"):
        handle.result(timeout=5)


def test_a_raw_payload_in_a_task_queue_ends_dead_as_not_a_task_envelope(tasks: Tasks, r: Any) -> None:
    @tasks.task(name="t")
    def t() -> None:
        pass

    q = Queue("default", r)
    q.enqueue(b"hello", job_id="raw", max_attempts=2)
    q.enqueue(b'["not", "an", "object"]', job_id="list", max_attempts=1)
    q.enqueue(b'{"v": 99, "task": "t"}', job_id="future", max_attempts=1)
    q.enqueue(b'{"v": 1, "task": "t", "args": {"a": 1}}', job_id="malformed", max_attempts=1)
    q.enqueue(b'{"v": 1, "task": "t", "args": [{"$pq": "martian", "v": 1}]}', job_id="tag", max_attempts=1)
    assert burst(tasks) == 0
    assert "not a task envelope" in q.get("raw").error and q.get("raw").attempts == 2
    assert "not a task envelope" in q.get("list").error
    assert "version 99" in q.get("future").error
    assert "malformed task envelope" in q.get("malformed").error
    assert "martian" in q.get("tag").error
    assert q.stats().acked == 0


# -- current_job() --------------------------------------------------------------------------


def test_current_job_inside_sync_and_async_tasks_and_outside(r: Any) -> None:
    seen: dict[str, Any] = {}
    for label, use_async in (("sync", False), ("async", True)):
        tasks = Tasks(client=r)

        if use_async:

            @tasks.task(name=f"{label}_limited", time_limit=30)
            async def limited() -> None:
                await asyncio.sleep(0)
                seen["limited"] = current_job()

            @tasks.task(name=f"{label}_free")
            async def free() -> None:
                seen["free"] = current_job()

        else:

            @tasks.task(name=f"{label}_limited", time_limit=30)
            def limited() -> None:
                seen["limited"] = current_job()

            @tasks.task(name=f"{label}_free")
            def free() -> None:
                seen["free"] = current_job()

        seen.clear()
        before = server_ms(r)
        a, b = limited.send(), free.send()
        worker_kind = AsyncWorker if use_async else Worker
        assert type(tasks.worker()) is worker_kind
        assert burst(tasks) == 0
        run_a, run_b = seen["limited"], seen["free"]
        assert (run_a.id, run_a.task, run_a.attempt, run_a.queue) == (a.id, f"{label}_limited", 1, "default")
        assert (run_b.id, run_b.task) == (b.id, f"{label}_free")
        assert run_a.max_attempts == 5 and run_a.fence > 0 and not run_a.cancelled
        for run in (run_a, run_b):
            assert run.enqueued_at is not None and run.enqueued_at.tzinfo is not None
            assert abs(run.enqueued_ms - before) < 2_000, label
            assert abs((dt.datetime.now(timezone.utc) - run.enqueued_at).total_seconds()) < 10
        assert run_a.deadline is not None
        assert 30_000 - 2_000 <= run_a.deadline_ms - run_a.enqueued_ms <= 30_000 + 2_000
        assert run_b.deadline is None and run_b.deadline_ms is None
    with pytest.raises(LookupError, match="outside a running task"):
        current_job()


# -- Retry and Fail raised by a task ---------------------------------------------------


def test_retry_from_an_error_keeps_the_real_error_when_the_job_dies(tasks: Tasks) -> None:
    @tasks.task(name="parse", max_attempts=2)
    def parse(text: str) -> None:
        try:
            int(text)
        except ValueError as exc:
            raise Retry(delay=0) from exc

    @tasks.task(name="implicit", max_attempts=2)
    def implicit() -> None:
        try:
            {}["missing"]
        except KeyError:
            raise Retry(delay_ms=0)  # noqa: B904 (raised while handling: its context is the error)

    @tasks.task(name="bare", max_attempts=1)
    def bare() -> None:
        raise Retry()

    @tasks.task(name="reasoned", max_attempts=1)
    def reasoned() -> None:
        raise Retry(reason="the bank was closed")

    handles = [parse.send("abc"), implicit.send(), bare.send(), reasoned.send()]
    assert burst(tasks) == 0
    errors = [dead_error(tasks, h.id) for h in handles]
    assert errors[0] == "ValueError: invalid literal for int() with base 10: 'abc'"
    assert errors[1] == "KeyError: 'missing'"
    assert errors[2] == "retry requested by the handler"
    assert errors[3] == "the bank was closed"


def test_retry_delay_schedules_the_retry(tasks: Tasks, serve: Callable[..., Serving]) -> None:
    @tasks.task(name="later", max_attempts=3)
    def later() -> None:
        raise Retry(delay=timedelta(seconds=40))

    handle = later.send()
    worker = serve(tasks)
    wait_for(lambda: job_state(tasks, "default", handle.id).state == "scheduled", what="the retry")
    info = job_state(tasks, "default", handle.id)
    assert 40_000 - 3_000 <= info.due_ms - info.now_ms <= 40_000
    worker.stop()


def test_a_task_that_calls_sys_exit_fails_like_any_other_error(tasks: Tasks) -> None:
    import sys

    calls: list[int] = []

    @tasks.task(name="quits", max_attempts=2)
    def quits() -> None:
        calls.append(1)
        sys.exit(3)

    handle = quits.send()
    assert burst(tasks) == 0
    assert len(calls) == 2
    assert dead_error(tasks, handle.id) == "SystemExit: 3"


def test_fail_sends_the_job_to_the_dead_letters_at_once_with_its_reason(tasks: Tasks) -> None:
    calls: list[int] = []

    @tasks.task(name="fail", max_attempts=5)
    def fail(reason: str | None) -> None:
        calls.append(1)
        if reason is None:
            try:
                raise OSError("disk full")
            except OSError as exc:
                raise Fail() from exc
        raise Fail(reason)

    given, from_cause = fail.send("customer closed the account"), fail.send(None)
    assert burst(tasks) == 0
    assert len(calls) == 2
    assert dead_error(tasks, given.id) == "customer closed the account"
    assert dead_error(tasks, from_cause.id) == "OSError: disk full"
    assert job_state(tasks, "default", given.id).attempts == 1


def test_retry_takes_delay_ms_or_delay_not_both() -> None:
    assert Retry(delay_ms=1500).delay_ms == 1500
    assert Retry(delay=1.5).delay_ms == 1500
    assert Retry(delay=5).delay_ms == 5000
    assert Retry(delay=timedelta(minutes=1)).delay_ms == 60_000
    assert Retry(250, "why").delay_ms == 250 and Retry(250, "why").reason == "why"
    assert Retry().delay_ms is None
    with pytest.raises(InvalidArgument, match="not both"):
        Retry(delay_ms=1, delay=1)
    for bad in (-1, "5", float("nan")):
        with pytest.raises(InvalidArgument):
            Retry(delay=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        Retry(delay_ms=-1)


# -- results that cannot be stored ----------------------------------------------------------


def test_an_unstorable_result_fails_once_to_the_dead_letters(tasks: Tasks) -> None:
    calls: list[str] = []

    @tasks.task(name="produce", keep_result=60, max_attempts=5)
    def produce(kind: str) -> Any:
        calls.append(kind)
        if kind == "object":
            return object()
        if kind == "nan":
            return {"x": math.nan}
        if kind == "huge":
            return "x" * (600 * 1024)
        return "fine"

    @tasks.task(name="unkept", max_attempts=5)
    def unkept() -> object:
        calls.append("unkept")
        return object()  # nobody asked for it: not stored, the job is done

    handles = {kind: produce.send(kind) for kind in ("object", "nan", "huge", "ok")}
    other = unkept.send()
    assert burst(tasks) == 0
    assert sorted(calls) == ["huge", "nan", "object", "ok", "unkept"]  # each ran exactly once
    for kind in ("object", "nan", "huge"):
        error = dead_error(tasks, handles[kind].id)
        assert error.startswith("the result cannot be stored"), error
        assert job_state(tasks, "default", handles[kind].id).attempts == 1
    assert "object" in dead_error(tasks, handles["object"].id)
    assert handles["ok"].result(timeout=5) == "fine"
    assert other.result(timeout=5) is None


# -- connecting ----------------------------------------------------------------------------


def test_tasks_without_arguments_uses_the_embedded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYQUEUE_URL", raising=False)
    tasks = Tasks()
    queue = f"embedded-{uuid.uuid4().hex}"
    ran: list[int] = []

    @tasks.task(name="emb", queue=queue, keep_result=60)
    def emb(n: int) -> int:
        ran.append(n)
        return n + 1

    assert tasks.redis.connection_pool.connection_kwargs["server"] is embedded_server()
    handle = emb.send(1)
    assert Queue(queue).stats().ready == 1  # any Queue made without a client sees it
    assert burst(tasks) == 0
    assert ran == [1] and handle.result(timeout=5) == 2


def test_tasks_with_a_url(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    tasks = Tasks(url=redis_server.url())

    @tasks.task(name="u", keep_result=60)
    def u(n: int) -> int:
        return n * 3

    handle = u.send(5)
    assert Queue("default", redis_server.client()).stats().ready == 1

    async def from_asyncio() -> Any:
        # The asyncio twin of pyqueue.connect's client (its settings and retry policy).
        sent = await u.asend(7)
        await asyncio.to_thread(burst, tasks)
        value = await sent.aresult(timeout=5)
        await tasks.aredis.aclose()
        return value

    assert asyncio.run(from_asyncio()) == 21
    assert handle.result(timeout=5) == 15
    retry = tasks.aredis.connection_pool.connection_kwargs["retry"]
    assert retry._retries == tasks.redis.connection_pool.connection_kwargs["retry"]._retries == 3
    with pytest.raises(InvalidArgument, match="not both"):
        Tasks(url=redis_server.url(), client=redis_server.client())
    with pytest.raises(InvalidArgument):
        Tasks(client="redis://localhost")


def test_tasks_with_an_asyncio_client_sends_with_asend_and_reads_with_aresult(r: Any) -> None:
    aclient = async_client(r)
    tasks = Tasks(client=aclient)

    @tasks.task(name="square", keep_result=60)
    def square(n: int) -> int:
        return n * n

    async def main() -> tuple[int, int]:
        first = await square.asend(7)
        later = await square.asend_in(0.2, 8)
        assert first.added and Queue("default", r).stats().enqueued == 2
        # The worker needs a blocking client: made from the asyncio one's settings.
        assert await asyncio.to_thread(burst, tasks, block_ms=2_000) == 0  # waits for the one due in 0.2 s
        got = await first.aresult(timeout=5), await later.aresult(timeout=5)
        await aclient.aclose()
        return got

    assert asyncio.run(main()) == (49, 64)


def test_a_sync_worker_refuses_async_tasks_and_tasks_worker_picks_an_async_worker(tasks: Tasks, r: Any) -> None:
    @tasks.task(name="sync_one")
    def sync_one() -> None:
        pass

    assert type(tasks.worker()) is Worker

    @tasks.task(name="async_one", keep_result=60)
    async def async_one() -> str:
        await asyncio.sleep(0)
        return "awaited"

    with pytest.raises(InvalidArgument, match="async"):
        Worker(["default"], tasks.dispatcher(), redis=r)
    with pytest.raises(InvalidArgument, match="async"):
        tasks.run_worker(Worker(["default"], _noop, redis=r))
    worker = tasks.worker()
    assert isinstance(worker, AsyncWorker)
    handle = async_one.send()
    assert burst(tasks) == 0
    assert handle.result(timeout=5) == "awaited"


def _noop(job: Any) -> None:
    pass


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_start_and_stop_hooks_run_once_around_the_jobs(tasks: Tasks, use_async: bool) -> None:
    events: list[str] = []

    @tasks.task(name="work")
    def work() -> None:
        events.append("job")

    if use_async:

        @tasks.on_worker_start
        async def started() -> None:
            events.append("start")

        @tasks.on_worker_stop
        async def stopped() -> None:
            events.append("stop")

    else:
        tasks.on_worker_start(lambda: events.append("start"))
        tasks.on_worker_stop(lambda: events.append("stop"))

    work.send()
    work.send()
    assert burst(tasks) == 0
    assert events == ["start", "job", "job", "stop"]
    assert isinstance(tasks.worker(), AsyncWorker) is use_async  # an async hook needs the event loop


def test_a_failing_start_hook_stops_the_worker_before_any_job(tasks: Tasks) -> None:
    ran: list[str] = []

    @tasks.task(name="work")
    def work() -> None:
        ran.append("job")

    @tasks.on_worker_start
    def broken() -> None:
        raise RuntimeError("no database")

    work.send()
    with pytest.raises(RuntimeError, match="no database"):
        burst(tasks)
    assert ran == [] and stats(tasks).ready == 1


# -- the send verbs and names ----------------------------------------------------------------


def test_send_at_schedules_on_the_server_clock(tasks: Tasks, r: Any) -> None:
    @tasks.task(name="at")
    def at() -> None:
        pass

    in_an_hour = dt.datetime.now(timezone.utc) + timedelta(hours=1)
    aware = at.send_at(in_an_hour)
    with pytest.raises(InvalidArgument, match="aware datetime"):
        at.send_at(in_an_hour.replace(tzinfo=None))  # naive: local time or UTC? refused
    other_zone = at.send_at(in_an_hour.astimezone(timezone(timedelta(hours=-7))))
    past = at.send_at(dt.datetime(2000, 1, 1, tzinfo=timezone.utc))
    in_ten = at.send_in(timedelta(minutes=10))
    now = server_ms(r)
    for handle in (aware, other_zone):
        info = job_state(tasks, "default", handle.id)
        assert info.state == "scheduled"
        assert abs(info.due_ms - (now + 3_600_000)) <= 2_000
    assert abs(job_state(tasks, "default", in_ten.id).due_ms - (now + 600_000)) <= 2_000
    assert job_state(tasks, "default", past.id).state == "ready"
    with pytest.raises(InvalidArgument, match="datetime"):
        at.send_at(3600)  # type: ignore[arg-type]


def test_send_many_enqueues_every_call_in_one_call(tasks: Tasks, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []

    @tasks.task(name="many")
    def many(n: int, *, times: int = 1) -> None:
        ran.append(n * times)

    queue = tasks.queue("default")
    calls: list[int] = []
    original = queue.enqueue_many

    def counting(jobs: Any, **kwargs: Any) -> Any:
        jobs = list(jobs)
        calls.append(len(jobs))
        return original(jobs, **kwargs)

    monkeypatch.setattr(queue, "enqueue_many", counting)
    handles = many.send_many([(1,), many.s(2, times=10), (3,)])
    assert calls == [3]
    assert len({h.id for h in handles}) == 3 and all(h.added for h in handles)
    assert stats(tasks).enqueued == 3
    assert burst(tasks) == 0
    assert sorted(ran) == [1, 3, 20]
    assert many.send_many([]) == []

    @tasks.task(name="other")
    def other() -> None:
        pass

    with pytest.raises(InvalidArgument, match="send_many"):
        many.send_many([other.s()])


def module_level_task(n: int) -> int:
    return n


def test_task_names_default_to_module_and_qualname_and_a_name_is_taken_once(tasks: Tasks) -> None:
    task = tasks.task(module_level_task)
    assert task.name == f"{module_level_task.__module__}.module_level_task"
    assert tasks.task(module_level_task).name == task.name  # the same function again: fine
    named = tasks.task(name="billing.charge")(lambda: None)
    assert named.name == "billing.charge" and set(tasks.tasks) == {task.name, "billing.charge"}

    def impostor(n: int) -> int:
        return -n

    with pytest.raises(InvalidArgument, match="taken"):
        tasks.task(name="billing.charge")(impostor)
    with pytest.raises(InvalidArgument, match="taken"):
        tasks.task(name=task.name)(impostor)
    with pytest.raises(InvalidArgument, match="name="):
        tasks.task(impostor)  # a local function: no stable name
    with pytest.raises(InvalidArgument, match="name="):
        tasks.task(lambda: None)
    for bad in ("", "a b", "a,b", "x" * 201, "emails/send", "café", "tab\tname", "line\n"):
        with pytest.raises(InvalidArgument, match="task name"):
            tasks.task(name=bad)(impostor)

    def gen() -> Any:
        yield 1

    with pytest.raises(InvalidArgument, match="plain or async def"):
        tasks.task(name="gen")(gen)
    assert tasks.tasks["billing.charge"] is named
    widest = tasks.task(name="A-Za-z0-9_.:<>-" + "x" * 185, unique=True)(impostor)
    handle = widest.send(1)
    assert len(handle.id) <= 256
    assert burst(tasks) == 0  # a worker advertises every name it serves when it registers


def test_close_closes_the_clients_tasks_made_and_never_a_given_one(redis_server: RedisServer) -> None:
    made = Tasks(url=redis_server.url())

    @made.task(name="c.x")
    def x() -> None: ...

    x.send()
    client = made.redis
    assert client.connection_pool._created_connections >= 1  # type: ignore[union-attr]
    made.close()
    assert made.redis is not client  # a new connection is made on the next use
    given = redis_server.client()
    Tasks(client=given).close()
    assert given.ping()

    async def async_side() -> None:
        tasks = Tasks(url=redis_server.url())

        @tasks.task(name="c.y")
        def y() -> None: ...

        await y.asend()
        await tasks.aclose()

    asyncio.run(async_side())
