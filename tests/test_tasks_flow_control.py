"""Flow control in the task layer (``@tasks.task(debounce=, throttle=, key=, expires=)``,
``sequence=``, ``rate_limit=`` with ``rate_key=`` and ``cost=``
and the same per send with ``fn.options(...)``): a debounced task runs once per quiet
window with its last arguments, a throttled one once per window, an expired one never.
Through the real scripts and a real worker, on the testing helper's moving clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pyqueue import InvalidArgument, RateLimit
from pyqueue.tasks import TaskResultMissing, Tasks, current_job


def test_a_debounced_task_runs_once_per_key_after_a_quiet_window_with_its_last_arguments() -> None:
    tasks = Tasks()
    ran: list[tuple[int, str]] = []

    @tasks.task(name="reindex", debounce=5, key=lambda user_id, **_: f"user-{user_id}", keep_result=3600)
    def reindex(user_id: int, version: str) -> str:
        ran.append((user_id, version))
        return version

    with tasks.testing() as t:
        first = reindex.send(7, "v1")
        t.advance(3)
        second = reindex.send(7, "v2")
        other = reindex.send(8, "w1")
        assert (first.added, second.added, second.id, second.by_key) == (True, False, first.id, "debounced")
        assert other.added and other.id != first.id
        assert t.drain(advance=False) == 0  # nothing due yet: the window moved with the second send
        assert t.drain() == 2
        assert sorted(ran) == [(7, "v2"), (8, "w1")]
        assert first.result(timeout=1) == "v2" and second.result(timeout=1) == "v2"
        assert t.stats().debounced == 1


def test_a_throttled_task_runs_once_per_window_and_later_sends_name_the_windows_job() -> None:
    tasks = Tasks()
    ran: list[int] = []

    @tasks.task(name="sync", throttle=timedelta(minutes=1), key=lambda account, **_: account)
    def sync(account: str, n: int) -> None:
        ran.append(n)

    with tasks.testing() as t:
        first = sync.send("a", 1)
        dropped = sync.send("a", 2)
        assert (dropped.added, dropped.id, dropped.by_key) == (False, first.id, "throttled")
        t.drain()
        t.advance(60)
        again = sync.send("a", 3)
        assert again.added
        t.drain()
        assert ran == [1, 3]
        assert t.stats().throttled == 1


def test_an_expired_task_never_runs_and_its_result_is_missing() -> None:
    tasks = Tasks()
    ran: list[int] = []

    @tasks.task(name="otp", expires=30, keep_result=3600)
    def otp(n: int) -> None:
        ran.append(n)

    with tasks.testing() as t:
        late = otp.send(1)
        t.advance(31)
        fresh = otp.send(2)
        assert t.drain() == 1
        assert ran == [2]
        assert late.state() == "expired" and fresh.state() == "done"
        with pytest.raises(TaskResultMissing):
            late.result(timeout=1)
        assert t.stats().expired_total == 1


def test_per_send_options_and_a_key_function_that_answers_none() -> None:
    tasks = Tasks()
    ran: list[str] = []

    @tasks.task(name="ping", debounce=10, key=lambda who, **_: None if who == "vip" else who)
    def ping(who: str) -> None:
        ran.append(who)

    with tasks.testing() as t:
        assert ping.send("vip").added and ping.send("vip").added  # no key: not debounced
        late = ping.options(expires=1, debounce=None, key=None).send("x")
        t.advance(2)
        t.drain()
        assert ran == ["vip", "vip"] and late.state() == "expired"


@pytest.mark.parametrize(("options", "message"), [
    ({"debounce": 5}, "need key="),
    ({"throttle": 5, "debounce": 5, "key": "k"}, "not both"),
    ({"debounce": 0, "key": "k"}, "debounce must be at least 1 ms"),
    ({"expires": "soon"}, "expires must be seconds"),
    ({"key": 7, "debounce": 1}, "key must be a str or a function"),
])
def test_mistaken_flow_control_options_are_refused_at_registration(options: dict[str, Any], message: str) -> None:
    tasks = Tasks()
    with pytest.raises(InvalidArgument, match=message):
        tasks.task(name="t", **options)(lambda: None)


def test_a_key_function_must_answer_a_str() -> None:
    tasks = Tasks()

    @tasks.task(name="t", throttle=5, key=lambda n, **_: n)
    def t_(n: int) -> None:
        pass

    with tasks.testing():
        with pytest.raises(InvalidArgument, match="key must return the key as a str or None"):
            t_.send(3)


def test_a_flow_step_with_flow_control_is_refused_and_nothing_is_sent() -> None:
    from pyqueue.tasks import chain

    tasks = Tasks()

    @tasks.task(name="a")
    def a() -> int:
        return 1

    @tasks.task(name="b", expires=60)
    def b(x: int) -> int:
        return x

    with tasks.testing() as t:
        with pytest.raises(InvalidArgument, match="a flow.s step cannot have expires, debounce, throttle, sequence or rate_limit"):
            chain(a.s(), b.s()).send()
        assert t.stats().enqueued == 0
        chain(a.s(), b.options(expires=None).s()).send()
        assert t.drain() == 2


def test_a_sequenced_task_runs_one_job_per_key_at_a_time_in_send_order_through_retries() -> None:
    tasks = Tasks()
    ran: list[tuple[str, int, int]] = []

    @tasks.task(name="apply", sequence=lambda order_id, **_: order_id, backoff=60, max_attempts=3)
    def apply(order_id: str, step: int) -> None:
        from pyqueue import current_job

        ran.append((order_id, step, current_job().attempt))
        if step == 1 and current_job().attempt == 1:
            raise ConnectionError("try again in a minute")

    with tasks.testing(raise_errors=False) as t:
        sent = [apply.send("o1", step) for step in range(3)] + [apply.send("o2", 0)]
        assert [s.state() for s in sent] == ["ready", "sequenced", "sequenced", "ready"]
        assert t.drain() == 5  # o1: 0, 1 (fails), 1 again a minute later, 2; o2: 0
        assert t.stats().sequenced == 0
    assert [r for r in ran if r[0] == "o1"] == [("o1", 0, 1), ("o1", 1, 1), ("o1", 1, 2), ("o1", 2, 1)]
    assert ("o2", 0, 1) in ran


def test_a_sequence_option_with_debounce_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="one key per job"):
        Tasks().task(name="t", sequence="k", debounce=1, key="k")(lambda: None)


def test_a_sequence_with_on_failure_skip_goes_on_past_a_dead_job() -> None:
    tasks = Tasks()
    ran: list[int] = []

    @tasks.task(name="apply", sequence=lambda key, **_: key, on_failure="skip", max_attempts=1)
    def apply(key: str, step: int) -> None:
        if step == 1:
            raise ValueError("bad change")
        ran.append(step)

    with tasks.testing(raise_errors=False) as t:
        sent = [apply.send("k", step) for step in range(3)]
        t.drain()
        assert [s.state() for s in sent] == ["done", "dead", "done"]
    assert ran == [0, 2]
    with pytest.raises(InvalidArgument, match="on_failure is a sequence's"):
        Tasks().task(name="t", on_failure="skip")(lambda: None)


# -- keyed rate limits -------------------------------------------------------------------


def test_a_rate_limited_task_runs_each_keys_jobs_no_faster_than_its_limit() -> None:
    tasks = Tasks()
    runs: list[tuple[str, int, int]] = []

    @tasks.task(name="call_api", rate_limit="2/s", rate_key=lambda account, **_: account)
    def call_api(account: str, n: int) -> None:
        # When it was leased, on the server's clock (its deadline less the lease time): a
        # reading of the clock here would come a varying while after.
        runs.append((account, n, current_job().job.deadline_ms - t.lease_ms))

    with tasks.testing() as t:
        for n in range(4):
            call_api.send("a", n)
        call_api.send("b", 0)
        assert t.drain() == 5
        a_runs = [ms for account, _, ms in runs if account == "a"]
        assert [n for account, n, _ in runs if account == "a"] == [0, 1, 2, 3]
        # a's permits are 500 ms apart (a run may start a little after its permit, the
        # next one's does not move); b ran at once, before a's second.
        assert all(ms - a_runs[0] >= 500 * k for k, ms in enumerate(a_runs)), a_runs
        assert [account for account, _, _ in runs][:2] == ["a", "b"]
        assert t.stats().deferred >= 3  # once each, and again for a job whose turn a late lease took


def test_a_task_wide_limit_without_a_key_and_a_cost_per_run() -> None:
    tasks = Tasks()
    runs: list[int] = []

    @tasks.task(name="import_rows", rate_limit=RateLimit(10, 1000, burst=10), cost=lambda rows, **_: len(rows))
    def import_rows(rows: list[int]) -> None:
        runs.append(current_job().job.deadline_ms - t.lease_ms)

    with tasks.testing() as t:
        import_rows.send(list(range(8)))
        import_rows.send(list(range(5)))  # 8 + 5 > 10: waits for 3 more permits, 300 ms
        assert t.drain() == 2
        assert 300 <= runs[1] - runs[0] < 1000, runs
        with pytest.raises(InvalidArgument, match="cost"):
            import_rows.send(list(range(11)))  # more than the burst: it could never run


def test_a_task_holds_its_key_after_a_429_and_runs_again_when_it_is_free() -> None:
    tasks = Tasks()
    runs: list[tuple[int, int]] = []

    @tasks.task(name="webhook", rate_limit="100/s", rate_key=lambda host, **_: host, max_attempts=5)
    def webhook(host: str, n: int) -> None:
        runs.append((n, current_job().job.deadline_ms - t.lease_ms))
        if n == 0 and current_job().attempt == 1:
            current_job().defer_key(30)  # the host said Retry-After: 30

    with tasks.testing() as t:
        webhook.send("h", 0)
        webhook.send("h", 1)
        assert t.drain() == 3
        # Both waited out the 30 s: the retry of 0, and 1, held back by the key.
        assert runs[0][0] == 0 and sorted(n for n, _ in runs[1:]) == [0, 1]
        assert all(ms - runs[0][1] >= 30_000 for _, ms in runs[1:]), runs


@pytest.mark.parametrize(("options", "message"), [
    ({"rate_key": "k"}, "rate_key and cost are a rate limit's"),
    ({"cost": 3}, "rate_key and cost are a rate limit's"),
    ({"rate_limit": "2/s", "cost": 2}, "over the rate limit's burst"),
    ({"rate_limit": "2/week"}, "COUNT/PERIOD"),
    ({"rate_limit": "2/s", "cost": 0}, "cost must be an int >= 1"),
    ({"rate_limit": "2/s", "rate_key": ""}, "rate_key must be 1..256 bytes"),
])
def test_mistaken_rate_options_are_refused_at_registration(options: dict[str, Any], message: str) -> None:
    tasks = Tasks()
    with pytest.raises(InvalidArgument, match=message):
        tasks.task(name="t", **options)(lambda: None)


def test_a_rate_key_function_answering_none_sends_that_job_unlimited() -> None:
    tasks = Tasks()

    @tasks.task(name="t", rate_limit="1/h", rate_key=lambda vip, **_: None if vip else "all")
    def t_(vip: bool) -> None:
        pass

    with tasks.testing() as t:
        for vip in (False, False, True, True):
            t_.send(vip)
        assert t.drain(advance=False) == 3  # both VIP sends and one of the others
        assert t.stats().deferred == 1
