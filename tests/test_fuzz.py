"""Fuzzed input through the driver, on both backends.

* Any payload (arbitrary bytes, empty, up to 64 KiB) and any valid job id (1..256 UTF-8
  bytes without control characters: braces, '|', spaces, any Unicode) survive
  enqueue -> lease -> ack unchanged.
* Invalid ids (empty, control characters such as '\\r\\n' or '\\x00', more than 256 bytes,
  not encodable as UTF-8, not a str) and invalid numbers (NaN, infinities, negatives,
  zero where 1 is the least, huge ints, bools, strings, floats) raise InvalidArgument (a
  ValueError) before anything is sent: the client sends no command, the keyspace stays
  empty.

Each example gets an empty server: a fresh fakeredis server, or the session's
redis-server flushed. ``PYQUEUE_FUZZ_EXAMPLES`` sets the examples per test and backend
(default 500).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import RedisServer
from pyqueue import InvalidArgument, Job, NewJob, Outcome, Queue
from pyqueue.ops.service import Services

#: A failing @given test makes Hypothesis's pytest plugin write a patch with libcst, which
#: imports mypy_extensions.TypedDict (deprecated): under filterwarnings=error that warning
#: would turn the failure report into an INTERNALERROR that hides the falsifying example.
pytestmark = pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")

T0 = 1_000_000
EXAMPLES = int(os.environ.get("PYQUEUE_FUZZ_EXAMPLES", 500))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Connect = Callable[[], AbstractContextManager[redis.Redis]]


@pytest.fixture(scope="module", params=["fake", "real"])
def connect(request: pytest.FixtureRequest) -> Connect:
    """A factory of clients of an empty server of the backend: one per example."""
    if request.param == "fake":

        @contextmanager
        def fresh_fake() -> Iterator[redis.Redis]:
            client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
            try:
                yield client
            finally:
                client.close()

        return fresh_fake
    server: RedisServer = request.getfixturevalue("redis_server")

    @contextmanager
    def fresh_real() -> Iterator[redis.Redis]:
        client = server.client()
        try:
            client.flushall()
            yield client
        finally:
            client.close()

    return fresh_real


class Sent:
    """Records every command a client sends from now on (scripts included: redis-py
    runs them through the same ``execute_command``)."""

    def __init__(self, client: redis.Redis) -> None:
        self.commands: list[Any] = []
        send: Callable[..., Any] = client.execute_command

        def recording(*args: Any, **options: Any) -> Any:
            self.commands.append(args[0])
            return send(*args, **options)

        client.execute_command = recording  # type: ignore[method-assign]


# -- strategies -----------------------------------------------------------------------

#: Unicode without surrogates (not UTF-8 encodable) and without ASCII control characters
#: (0-31, 127); C1 controls (U+0080..U+009F) are allowed: their UTF-8 bytes are >= 0x80.
_ID_CHARS = st.one_of(
    st.sampled_from(list("{}| :-_.") + ["ü", "€", "😀", "\u0085", "\u00a0", "\u2028"]),
    st.characters(exclude_categories=["Cs"], exclude_characters="".join(map(chr, [*range(32), 127]))),
)
_SHORT = st.text(_ID_CHARS, min_size=1, max_size=12)


def padded_to(size: int) -> Callable[[str], str]:
    """Pad with 'x' (or cut) to exactly ``size`` UTF-8 bytes, keeping whole characters."""

    def pad(text: str) -> str:
        while len(text.encode("utf-8")) > size:
            text = text[:-1]
        return text + "x" * (size - len(text.encode("utf-8")))

    return pad


VALID_IDS = st.one_of(
    _SHORT,
    st.text(_ID_CHARS, min_size=1, max_size=60),
    _SHORT.map(padded_to(256)),  # the longest allowed
)
CONTROL = st.sampled_from([chr(c) for c in [*range(32), 127]] + ["\r\n"])
INVALID_IDS: st.SearchStrategy[Any] = st.one_of(
    st.just(""),
    st.tuples(st.text(_ID_CHARS, max_size=20), CONTROL, st.text(_ID_CHARS, max_size=20)).map("".join),
    _SHORT.map(padded_to(257)),  # one byte too long
    _SHORT.map(lambda text: text * 300),
    st.integers(129, 256).map(lambda n: "é" * n),  # at most 256 characters, but more than 256 bytes
    st.tuples(st.text(_ID_CHARS, max_size=10), st.sampled_from(["\ud800", "\udfff"])).map("".join),
    st.one_of(st.binary(min_size=1, max_size=10), st.integers(), st.floats(), st.booleans()),
)
#: Any bytes up to 64 KiB: mostly short, sometimes a pattern repeated to tens of KiB.
PAYLOADS = st.one_of(
    st.binary(max_size=300),
    st.tuples(st.binary(min_size=1, max_size=64), st.integers(1, 2048)).map(lambda t: (t[0] * t[1])[: 64 * 1024]),
)
#: Anything that is not an int in range: NaN, infinities, floats (5.0 too), bools,
#: strings of digits, negatives, zero, huge ints.
BAD_NUMBERS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 5.0, -1.5, True, False, "5", "", "1e3", b"7", 2**64, -(2**63)]),
    st.floats(),
    st.integers(max_value=0),
    st.integers(min_value=2**53),
    st.text(max_size=5),
    st.booleans(),
)


# -- round trips ------------------------------------------------------------------------


@given(job_id=VALID_IDS, payload=PAYLOADS)
@FUZZ
def test_any_valid_id_and_any_payload_survive_enqueue_lease_and_ack(connect: Connect, job_id: str, payload: bytes) -> None:
    with connect() as r:
        q = Queue("q", r, owner="w")
        assert q.enqueue(payload, job_id=job_id, now_ms=T0).added
        (job,) = q.lease(now_ms=T0)
        assert (job.id, job.payload, job.attempt, job.fence) == (job_id, payload, 1, 1)
        assert job.receipt == f"w|{job.receipt.split('|')[1]}|1|1|{job_id}"
        assert q.ack(job) is Outcome.OK
        assert q.ack(job) is Outcome.GONE
        assert r.hlen(q.spec.keys.jobs) == 0 and q.stats(now_ms=T0).acked == 1


@given(jobs=st.lists(st.tuples(VALID_IDS, PAYLOADS), min_size=1, max_size=5), error=st.text(max_size=200))
@FUZZ
def test_a_batch_of_valid_ids_and_payloads_survives_nack_to_dead_and_the_dead_letter_list(
    connect: Connect, jobs: list[tuple[str, bytes]], error: str
) -> None:
    with connect() as r:
        q = Queue("q", r, owner="w")
        added = q.enqueue_many([NewJob(p, job_id=i, max_attempts=1) for i, p in jobs], now_ms=T0)
        unique: dict[str, bytes] = {}  # the first of repeated ids is added, the others are duplicates
        expected_added = []
        for job_id, payload in jobs:
            expected_added.append(job_id not in unique)
            unique.setdefault(job_id, payload)
        assert [e.added for e in added] == expected_added
        leased = q.lease(count=len(jobs), now_ms=T0)
        assert {(job.id, job.payload) for job in leased} == {(i, unique[i]) for i in unique}
        for job in leased:
            assert q.nack(job, error, now_ms=T0).state == "dead"
        page = q.dead_list(limit=10)
        assert {(d.id, d.payload, d.error) for d in page.jobs} == {(i, unique[i], error) for i in unique}
        assert q.dead_replay([job.id for job in leased], now_ms=T0) == len(unique)
        assert q.dead_purge([job.id for job in leased]) == 0  # replayed: no longer dead


# -- rejected before anything is sent ----------------------------------------------------


@given(bad=INVALID_IDS)
@FUZZ
def test_an_invalid_id_is_rejected_before_anything_is_sent(connect: Connect, bad: Any) -> None:
    with connect() as r:
        q = Queue("q", r)
        sent = Sent(r)
        attempts: list[Callable[[], object]] = [
            lambda: q.enqueue(b"x", job_id=bad),
            lambda: q.enqueue_many([NewJob(b"ok", job_id="fine"), NewJob(b"x", job_id=bad)]),
            lambda: q.dead_replay([bad]),
            lambda: q.dead_purge(["fine", bad]),
        ]
        for attempt in attempts:
            with pytest.raises(InvalidArgument):
                attempt()
        assert sent.commands == []
        assert r.keys("*") == []


@dataclass(frozen=True)
class NumberArgument:
    """One numeric argument of one driver call, and the range of ints it accepts."""

    call: str
    lo: int
    hi: int
    send: Callable[[Queue, Services, Job, Any], object]


A_JOB = Job(id="j", queue="q", payload=b"", fence=1, attempt=1, max_attempts=1, deadline_ms=0, receipt="w|c|1|1|j")
NUMBER_ARGUMENTS = [
    NumberArgument("enqueue delay_ms", 0, 2**40, lambda q, s, j, v: q.enqueue(b"x", delay_ms=v)),
    NumberArgument("enqueue max_attempts", 1, 10_000, lambda q, s, j, v: q.enqueue(b"x", max_attempts=v)),
    NumberArgument("enqueue now_ms", 0, 2**53, lambda q, s, j, v: q.enqueue(b"x", now_ms=v)),
    NumberArgument("enqueue_many delay_ms", 0, 2**40, lambda q, s, j, v: q.enqueue_many([b"a", NewJob(b"x", delay_ms=v)])),
    NumberArgument("enqueue_many max_attempts", 1, 10_000, lambda q, s, j, v: q.enqueue_many([NewJob(b"x", max_attempts=v)])),
    NumberArgument("lease lease_ms", 1, 604_800_000, lambda q, s, j, v: q.lease(lease_ms=v)),
    NumberArgument("lease count", 0, 1000, lambda q, s, j, v: q.lease(count=v)),
    NumberArgument("lease now_ms", 0, 2**53, lambda q, s, j, v: q.lease(now_ms=v)),
    NumberArgument("lease_call limit", 1, 1000, lambda q, s, j, v: q.lease_call(limit=v)),
    NumberArgument("ack_and_lease count", 0, 1000, lambda q, s, j, v: q.ack_and_lease(j, count=v)),
    NumberArgument("ack_and_lease lease_ms", 1, 604_800_000, lambda q, s, j, v: q.ack_and_lease(j, lease_ms=v)),
    NumberArgument("nack delay_ms", 0, 2**40, lambda q, s, j, v: q.nack(j, delay_ms=v)),
    NumberArgument("nack backoff_base_ms", 1, 2**40, lambda q, s, j, v: q.nack(j, backoff_base_ms=v)),
    NumberArgument("nack backoff_cap_ms", 1, 2**40, lambda q, s, j, v: q.nack(j, backoff_cap_ms=v)),
    NumberArgument("nack now_ms", 0, 2**53, lambda q, s, j, v: q.nack(j, now_ms=v)),
    NumberArgument("extend lease_ms", 1, 604_800_000, lambda q, s, j, v: q.extend([j], v)),
    NumberArgument("extend now_ms", 0, 2**53, lambda q, s, j, v: q.extend([j], now_ms=v)),
    NumberArgument("promote limit", 1, 1000, lambda q, s, j, v: q.promote(v)),
    NumberArgument("promote now_ms", 0, 2**53, lambda q, s, j, v: q.promote(now_ms=v)),
    NumberArgument("scrub limit", 1, 1000, lambda q, s, j, v: q.scrub("ns.1", limit=v)),
    NumberArgument("scrub now_ms", 0, 2**53, lambda q, s, j, v: q.scrub("ns.1", now_ms=v)),
    NumberArgument("stats now_ms", 0, 2**53, lambda q, s, j, v: q.stats(now_ms=v)),
    NumberArgument("dead_list offset", 0, 2**31, lambda q, s, j, v: q.dead_list(v)),
    NumberArgument("dead_list limit", 1, 1000, lambda q, s, j, v: q.dead_list(0, v)),
    NumberArgument("dead_replay limit", 1, 1000, lambda q, s, j, v: q.dead_replay(limit=v)),
    NumberArgument("dead_replay now_ms", 0, 2**53, lambda q, s, j, v: q.dead_replay(["j"], now_ms=v)),
    NumberArgument("dead_purge limit", 1, 1000, lambda q, s, j, v: q.dead_purge(limit=v)),
    NumberArgument("register expire_ms", 1000, 86_400_000, lambda q, s, j, v: s.register(["q"], expire_ms=v)),
    NumberArgument("register capacity", 1, 100_000, lambda q, s, j, v: s.register(["q"], capacity=v)),
]


def accepted(value: Any, argument: NumberArgument) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and argument.lo <= value <= argument.hi


@given(argument=st.sampled_from(NUMBER_ARGUMENTS), value=BAD_NUMBERS)
@FUZZ
def test_a_bad_number_is_an_invalid_argument_raised_before_anything_is_sent(
    connect: Connect, argument: NumberArgument, value: Any
) -> None:
    assume(not accepted(value, argument))  # e.g. 0 is a fine count: not this test's business
    with connect() as r:
        q, services = Queue("q", r, owner="w"), Services(r, namespace="ns")
        sent = Sent(r)
        with pytest.raises(ValueError) as raised:  # InvalidArgument is a ValueError
            argument.send(q, services, A_JOB, value)
        assert isinstance(raised.value, InvalidArgument), f"{argument.call}({value!r}) raised {raised.value!r}"
        assert sent.commands == [], f"{argument.call}({value!r}) sent {sent.commands}"
        assert r.keys("*") == []


def test_just_outside_every_numeric_range_is_rejected_before_anything_is_sent(connect: Connect) -> None:
    for argument in NUMBER_ARGUMENTS:
        with connect() as r:
            q, services = Queue("q", r, owner="w"), Services(r, namespace="ns")
            sent = Sent(r)
            for value in (argument.lo - 1, argument.hi + 1):
                assert not accepted(value, argument)
                with pytest.raises(InvalidArgument):
                    argument.send(q, services, A_JOB, value)
            assert sent.commands == [] and r.keys("*") == [], argument.call
