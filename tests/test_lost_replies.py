"""Lost commands and lost replies, for every script (DESIGN §3.6, replay safety).

A loopback proxy (tests/proxy.py) sits between the driver and a real redis-server on
127.0.0.1 and, for one call of one script, either drops the command before it reaches
the server, swallows the reply after the server ran it, or delays the reply past the
client's socket timeout. Then:

(a) with the driver's retries on (``pyqueue.connect(url, retries=3)``), the call
    returns and the final state equals that of one call without faults;
(b) with retries off (``retries=0``), the call raises :class:`~pyqueue.OutcomeUnknown`;
    the caller sends the same call again (same job ids, receipts, call token) and the
    final state again equals that of one call.

"State" is the logical content of every key (``helpers.contents``), with explicit
``now_ms`` everywhere so that runs are comparable. The documented exceptions: a re-sent
``enqueue`` counts its jobs as ``duplicates``; a re-sent ack answers ``gone``, a
re-sent nack or release ``stale``, a re-sent lease returns the first run's leases with
``next_due_ms`` -1; service renewal tokens are random (compared as present, not by
value) and a renewal re-sent by redis-py keeps working.

``Services.register`` and ``Services.renew`` draw a fresh token on every call, so a
caller cannot repeat them with the same arguments; (b) for those two sends the same
script call twice (``Services.scripts``), which is what a retry by the caller means at
the contract level.

Three bugs these faults found are fixed and kept as tests: an enqueue re-sent after its
job was already acked added the job again (acks now leave a tombstone for
``keep_done_ms``); a renewal retried after ``OutcomeUnknown`` re-sends its token; a
worker retries a lost lease call with the same call token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import Blocking, require_redis_server
from crash_harness import RedisProcess
from helpers import T0, contents, sibling
from proxy import Fault, FaultProxy, Rule, evalsha_of

from pyqueue.protocol.verbs.steps import ParkAnswer, Signalled
from pyqueue.protocol.core import service_register_call, service_renew_call
from pyqueue import aio
from pyqueue.aio import AsyncQueue
from pyqueue import EventsSetting, Job, Leased, NewJob, Outcome, OutcomeUnknown, Queue, ServiceLost, connect
from pyqueue.drivers.scripts import SCRIPT_KEYS, lua_source
from pyqueue.ops.service import Service, Services
from pyqueue.worker import Worker

NOW = T0 + 60
#: A late reply: the client gives up after SHORT_TIMEOUT_S; the proxy answers after LATE_S.
SHORT_TIMEOUT_S, LATE_S = 0.5, 1.0
FAULTS = [Fault.DROP_COMMAND, Fault.SWALLOW_REPLY, Fault.DELAY_REPLY]


@dataclasses.dataclass
class World:
    """Handles into the state :func:`build` makes."""

    held: Job
    retry: Job
    last: Job
    service: Service
    rated: Job
    sized: Job
    indexed: Job
    resulting: Job
    limited: Job


def build(r: redis.Redis) -> World:
    """A queue with something in every role, and a live service, all at explicit times
    with explicit call tokens and owners (so that two builds are identical):

    READY r1..r3; LEASED held, retry (9 attempts), last (max 1 attempt), all until
    T0 + 100 s, r0 by the dead service ns.7, and 'expired' (deadline T0 + 5); SCHEDULED
    'due' (T0 + 10); waiting 'w0' (for r1 and r2), and the record of flow 'f0' (an hour); DEAD 'corpse'; a second queue 'held', paused; service ns.1 serving q, alive, and ns.2, dead and not
    yet forgotten; in queue 'seqs', sequence 'k' blocked by its dead head s0, s1 behind it;
    in queue 'rates', rate key 'api' (1 a minute): t0 LEASED with its permit, t1 deferred
    (SCHEDULED for the key's next permit, T0 + 60 s); in queue 'budgets', a byte budget
    of 10 with 5 bytes in use: b0 (3 bytes) LEASED, b1 (2 bytes) READY; in queue
    'indexes', which keeps indexes (since T0), jobs of task 't' in group 'g': x0 LEASED,
    x1 READY, x2 SCHEDULED (T0 + 60 s); in queue 'results', a results budget of 20 bytes
    with the sized result of k0 (12 bytes, an hour) kept and k1 LEASED; in queue
    'tombstones', a tombstone limit of 2 with the tombstones of d0 and d1 kept (acked at
    T0), d2 LEASED and d3 READY.
    """
    q = Queue("q", r, owner="setup")
    q.set_events(1000)  # a re-sent call must not write its events twice either
    q.enqueue(b"c", job_id="corpse", max_attempts=1, now_ms=T0)
    (corpse,) = q.lease_call(call="s1", now_ms=T0).jobs
    q.nack(corpse, "died", now_ms=T0)
    q.enqueue(b"e", job_id="expired", max_attempts=3, now_ms=T0)
    q.lease_call(call="s2", lease_ms=5, now_ms=T0)
    q.enqueue_many([NewJob(b"h", job_id="held"), NewJob(b"t", job_id="retry", max_attempts=9),
                    NewJob(b"l", job_id="last", max_attempts=1)], now_ms=T0)
    held, retry, last = q.lease_call(call="s3", count=3, lease_ms=100_000, now_ms=T0).jobs
    q.enqueue_many([NewJob(b"r", job_id=f"r{i}") for i in range(4)], now_ms=T0)
    Queue("q", r, owner="ns.7").lease_call(call="s4", count=1, lease_ms=100_000, now_ms=T0)
    q.enqueue(b"d", job_id="due", delay_ms=10, now_ms=T0)
    q.flow_wait(NewJob(b"w", job_id="w0"), [("q", "r1"), ("q", "r2")], now_ms=T0)
    q.flow_record("f0", b"{}", 3_600_000, now_ms=T0)
    Queue("held", r).pause(now_ms=T0)  # a paused queue, for the resume case
    seqs = Queue("seqs", r, owner="setup")  # a sequence blocked by its dead head s0, s1 behind it
    seqs.enqueue_many([NewJob(b"0", job_id="s0", sequence="k", max_attempts=1), NewJob(b"1", job_id="s1", sequence="k")],
                      now_ms=T0)
    (s0,) = seqs.lease_call(call="s5", now_ms=T0).jobs
    seqs.nack(s0, "died", now_ms=T0)
    rates = Queue("rates", r, owner="setup")
    rates.enqueue_many([NewJob(bytes([48 + i]), job_id=f"t{i}", rate_key="api", rate_limit="1/m") for i in range(2)],
                       now_ms=T0)
    (rated,) = rates.lease_call(call="s6", count=2, lease_ms=100_000, now_ms=T0).jobs
    budgets = Queue("budgets", r, owner="setup")
    budgets.set_budget(10)
    budgets.enqueue_many([NewJob(b"abc", job_id="b0"), NewJob(b"de", job_id="b1")], now_ms=T0)
    (sized,) = budgets.lease_call(call="s7", count=1, lease_ms=100_000, now_ms=T0).jobs
    indexes = Queue("indexes", r, owner="setup")
    indexes.set_indexes(True, now_ms=T0)
    indexes.enqueue_many([NewJob(bytes([48 + i]), job_id=f"x{i}", task="t", group="g", delay_ms=60_000 if i == 2 else 0)
                          for i in range(3)], now_ms=T0)
    (indexed,) = indexes.lease_call(call="s8", count=1, lease_ms=100_000, now_ms=T0).jobs
    results = Queue("results", r, owner="setup")
    results.set_result_budget(20)
    results.enqueue_many([NewJob(b"", job_id="k0"), NewJob(b"", job_id="k1")], now_ms=T0)
    k0, resulting = results.lease_call(call="s9", count=2, lease_ms=100_000, now_ms=T0).jobs
    results.ack_result(k0, b"abc", result_ttl_ms=3_600_000, now_ms=T0)  # "<T0>|babc": 12 bytes
    tombstones = Queue("tombstones", r, owner="setup")
    tombstones.set_tombstone_limit(2)
    tombstones.enqueue_many([NewJob(b"", job_id=f"d{i}") for i in range(4)], now_ms=T0)
    d0, d1, limited = tombstones.lease_call(call="s10", count=3, lease_ms=100_000, now_ms=T0).jobs
    tombstones.ack_many([d0, d1], now_ms=T0)
    services = Services(r, namespace="ns")
    service = services.register(["q"], host="h", pid=1, registration="live", now_ms=T0)
    dead = services.register(["q"], host="h", pid=2, expire_ms=1000, registration="dead", now_ms=T0 - 5000)
    r.delete(dead.keys.role("service"))  # expired (not left to the real clock: builds must be identical)
    return World(held, retry, last, service, rated, sized, indexed, resulting, limited)


Act = Callable[[Queue, Services, World], Any]


@dataclasses.dataclass(frozen=True)
class Case:
    """One script call: ``act`` through the driver; ``replayed`` maps the answer of one
    clean call to the answer of a call whose first send applied and whose reply was lost
    (the re-send's answer); ``same_call`` is what the caller sends twice in (b) when
    ``act`` cannot be repeated with the same arguments; ``duplicates`` is how many jobs
    a re-send counts as duplicates (in ``queue``)."""

    script: str
    act: Act
    replayed: Callable[[Any], Any] = lambda answer: answer
    same_call: Act | None = None
    same_call_replayed: Callable[[Any], Any] = lambda answer: answer
    duplicates: int = 0
    #: The queue whose ``duplicates`` counter a re-send raises.
    queue: str = "q"


def view(answer: Any) -> Any:
    """The comparable part of an answer: a lease's receipts and ack outcomes (a replay
    answers next_due_ms -1), a service's id (its token is random)."""
    if isinstance(answer, Leased):
        return [j.receipt for j in answer.jobs], answer.acks
    if isinstance(answer, Service):
        return answer.namespace, answer.id, answer.started_ms
    return answer


CASES: dict[str, Case] = {
    "enqueue": Case(
        "enqueue",
        lambda q, s, w: q.enqueue_many([NewJob(b"n1", job_id="n1"), NewJob(b"n2", job_id="n2", delay_ms=50)],
                                       now_ms=NOW),
        replayed=lambda a: [dataclasses.replace(e, added=False) for e in a],
        duplicates=2,
    ),
    "lease": Case("lease", lambda q, s, w: q.lease_call(count=2, lease_ms=1000, call="a1", now_ms=NOW)),
    "ack_and_lease": Case(
        "lease",
        lambda q, s, w: q.lease_call(ack=[w.held], count=2, lease_ms=1000, call="a1", now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, acks=[Outcome.GONE]),
    ),
    "ack": Case("ack", lambda q, s, w: q.ack_many([w.held, w.retry], now_ms=NOW), replayed=lambda a: [Outcome.GONE] * 2),
    "nack_to_scheduled": Case(
        "nack", lambda q, s, w: q.nack(w.retry, "boom", now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, outcome=Outcome.STALE, state=None, at_ms=0),
    ),
    "nack_to_dead": Case(
        "nack", lambda q, s, w: q.nack(w.last, "boom", now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, outcome=Outcome.STALE, state=None, at_ms=0),
    ),
    "extend": Case("extend", lambda q, s, w: q.extend([w.held, w.retry], 5000, now_ms=NOW)),
    "release": Case("release", lambda q, s, w: q.release([w.held, w.retry], now_ms=NOW), replayed=lambda a: [Outcome.STALE] * 2),
    "promote": Case(
        "promote", lambda q, s, w: q.promote(now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, promoted=0, reclaimed=0, dead=0),
    ),
    "scrub": Case(
        "scrub", lambda q, s, w: q.scrub("ns.7", now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, scrubbed=0, dead=0, more=False),
    ),
    "dead_replay": Case("dead_replay", lambda q, s, w: q.dead_replay(["corpse"], now_ms=NOW), replayed=lambda a: 0),
    "dead_purge": Case("dead_purge", lambda q, s, w: q.dead_purge(["corpse"]), replayed=lambda a: 0),
    "stats": Case("stats", lambda q, s, w: q.stats(now_ms=NOW)),
    "dead_list": Case("dead_list", lambda q, s, w: q.dead_list()),
    "service_register": Case(
        "service_register",
        lambda q, s, w: s.register(["q"], host="h", pid=2, registration="reg", now_ms=NOW),
        same_call=lambda q, s, w: s.scripts.call(service_register_call(
            s.keys.of(3), NOW, "h", 2, "q", 60_000, 1000, 10, "tok", "reg"
        )),
        same_call_replayed=lambda a: [b"retry", 4],
    ),
    "service_renew": Case(
        "service_renew",
        lambda q, s, w: s.renew(w.service, now_ms=NOW),
        same_call=lambda q, s, w: s.scripts.call(service_renew_call(w.service.keys, NOW, w.service.renewal, "tok", 60_000, 20)),
    ),
    "service_deregister": Case(
        "service_deregister", lambda q, s, w: s.deregister(w.service, now_ms=NOW), replayed=lambda a: (0, 0),
    ),
    "service_forget_dead": Case("service_deregister", lambda q, s, w: s.forget_dead(2, "dead", now_ms=NOW)),
    "service_stop": Case("service_stop", lambda q, s, w: s.stop(w.service.id, now_ms=NOW)),
    "peek": Case("peek", lambda q, s, w: q.peek(now_ms=NOW)),
    "ack_result": Case(
        "ack_result", lambda q, s, w: q.ack_result(w.held, {"n": 1}, now_ms=NOW), replayed=lambda a: Outcome.GONE
    ),
    "result": Case("result", lambda q, s, w: q.result("corpse", now_ms=NOW)),
    "cancel": Case(
        "cancel", lambda q, s, w: q.cancel("held", now_ms=NOW), replayed=lambda a: dataclasses.replace(a, state="done")
    ),
    "limit": Case("limit", lambda q, s, w: q.limit(50, 1000), replayed=lambda a: False),
    "set_group_limit": Case("set_group_limit", lambda q, s, w: q.set_group_limit(3), replayed=lambda a: False),
    "groups": Case("groups", lambda q, s, w: q.groups()),
    "pause": Case("pause", lambda q, s, w: q.pause(now_ms=NOW), replayed=lambda a: False),
    "resume": Case("resume", lambda q, s, w: sibling(q, "held").resume(now_ms=NOW), replayed=lambda a: False),
    "get": Case("get", lambda q, s, w: q.get("j0", with_payload=True, now_ms=NOW)),
    "flow_wait": Case(
        "flow_wait", lambda q, s, w: q.flow_wait(NewJob(b"w", job_id="w1"), [("q", "r1")], now_ms=NOW),
        replayed=lambda a: "armed",
    ),
    "flow_done_waiting": Case(
        "flow_done", lambda q, s, w: q.flow_done("w0", [("q", "r1", "ok")], now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, counted=0),
    ),
    "flow_done_release": Case(
        "flow_done", lambda q, s, w: q.flow_done("w0", [("q", "r1", "ok"), ("q", "r2", "failed")], policy="continue",
                                                 now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, state="gone", counted=0),
    ),
    "flow_record": Case(
        "flow_record", lambda q, s, w: q.flow_record("f1", b"{}", 60_000, now_ms=NOW), replayed=lambda a: "duplicate"
    ),
    "flow_show": Case("flow_show", lambda q, s, w: q.flow_show("f0", now_ms=NOW)),
    "browse": Case("browse", lambda q, s, w: q.browse("running", 0, 10, now_ms=NOW)),
    "progress": Case("progress", lambda q, s, w: q.progress(w.held, b'{"n": 1}', now_ms=NOW)),
    "progress_show": Case("progress_show", lambda q, s, w: q.progress_of(["held", "retry"])),
    "set_events": Case("set_events", lambda q, s, w: q.set_events(10), replayed=lambda a: EventsSetting(10, a.length)),
    "step": Case(
        "step", lambda q, s, w: q.step(w.held, "s1", b"j1", lease_ms=100_000, now_ms=NOW),
        replayed=lambda a: dataclasses.replace(a, status="exists"),
    ),
    "park": Case(
        "park", lambda q, s, w: q.park(w.retry, "sleep", "nap", 1000, lease_ms=100_000, now_ms=NOW),
        replayed=lambda a: ParkAnswer("stale", b"", -1),
    ),
    "signal": Case("signal", lambda q, s, w: q.signal("r1", "go", b"j1", now_ms=NOW),
                   replayed=lambda a: Signalled("duplicate")),
    "steps": Case("steps", lambda q, s, w: q.steps("held", now_ms=NOW)),
    "sequence_skip": Case("sequence_skip", lambda q, s, w: sibling(q, "seqs").sequence_skip("k", now_ms=NOW),
                          replayed=lambda a: dataclasses.replace(a, status="running")),
    "set_rate_limit": Case("set_rate_limit", lambda q, s, w: sibling(q, "rates").set_rate_limit("api", "5/s"),
                           replayed=lambda a: False),
    # A re-sent defer moves the key's state to the same time: the same answer.
    "defer_key": Case("defer_key", lambda q, s, w: sibling(q, "rates").defer_key(w.rated, 200_000, now_ms=NOW)),
    # Byte budgets: a re-sent set_budget finds the same budget; a re-sent sized enqueue
    # (its 5 bytes take the queue exactly to its budget) finds its job, counts a duplicate
    # and is not refused (it adds no byte); a re-sent ack of a sized job takes its size
    # off once.
    "set_budget": Case("set_budget", lambda q, s, w: sibling(q, "budgets").set_budget(1000), replayed=lambda a: False),
    "enqueue_sized": Case(
        "enqueue",
        lambda q, s, w: sibling(q, "budgets").enqueue_many([NewJob(b"fghij", job_id="b2")], now_ms=NOW),
        replayed=lambda a: [dataclasses.replace(e, added=False) for e in a],
        duplicates=1, queue="budgets",
    ),
    "ack_sized": Case("ack", lambda q, s, w: sibling(q, "budgets").ack(w.sized, now_ms=NOW),
                      replayed=lambda a: Outcome.GONE),
    # Indexes (lua/README.md section 2.8): a re-sent set_indexes finds them on since the
    # first send's time (the same answer); search is read only; a re-sent promote_now
    # finds its job due and makes none due; a re-sent indexed enqueue finds its job (its
    # members written once); a re-sent ack of a listed job removes its members once.
    "set_indexes": Case("set_indexes", lambda q, s, w: q.set_indexes(True, now_ms=NOW)),
    "search": Case("search", lambda q, s, w: sibling(q, "indexes").search(task="t", now_ms=NOW)),
    "promote_now": Case("promote_now", lambda q, s, w: sibling(q, "indexes").promote_now(["x2", "x1"], now_ms=NOW),
                        replayed=lambda a: []),
    "enqueue_indexed": Case(
        "enqueue",
        lambda q, s, w: sibling(q, "indexes").enqueue_many([NewJob(b"3", job_id="x3", task="t", group="g")],
                                                           now_ms=NOW),
        replayed=lambda a: [dataclasses.replace(e, added=False) for e in a],
        duplicates=1, queue="indexes",
    ),
    "ack_indexed": Case("ack", lambda q, s, w: sibling(q, "indexes").ack(w.indexed, now_ms=NOW),
                        replayed=lambda a: Outcome.GONE),
    # Results budgets (lua/README.md section 2, results): a re-sent set_result_budget finds
    # the same budget; a re-sent ack_result under a budget, whose result (12 bytes more)
    # took the sum past it and so deleted k0's first, finds its receipt gone: k0's size
    # is taken off once, and k1's kept once.
    "set_result_budget": Case("set_result_budget", lambda q, s, w: sibling(q, "results").set_result_budget(1000),
                              replayed=lambda a: False),
    "ack_result_sized": Case(
        "ack_result",
        lambda q, s, w: sibling(q, "results").ack_result(w.resulting, b"def", result_ttl_ms=3_600_000, now_ms=NOW),
        replayed=lambda a: Outcome.GONE),
    # Tombstone limits (lua/README.md section 2, tombstones): a re-sent
    # set_tombstone_limit finds the same limit; a re-sent ack under a limit, whose
    # tombstone took `done` past it and so deleted d0's, finds its receipt gone and
    # deletes no more (d1 and d2 kept); a re-sent cancel likewise (d2 and d3 kept), and
    # answers `done`: the cancelled job's tombstone, the latest, is kept.
    "set_tombstone_limit": Case("set_tombstone_limit",
                                lambda q, s, w: sibling(q, "tombstones").set_tombstone_limit(5),
                                replayed=lambda a: False),
    "ack_limited": Case("ack", lambda q, s, w: sibling(q, "tombstones").ack(w.limited, now_ms=NOW),
                        replayed=lambda a: Outcome.GONE),
    "cancel_limited": Case("cancel", lambda q, s, w: sibling(q, "tombstones").cancel("d3", now_ms=NOW),
                           replayed=lambda a: dataclasses.replace(a, state="done")),
}


def test_every_script_has_a_lost_reply_case() -> None:
    assert {case.script for case in CASES.values()} == set(SCRIPT_KEYS)


# -- the server, the proxy, and snapshots ----------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProcess]:
    """A redis-server of this module's own, on a free port of 127.0.0.1."""
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pyqueue-proxy-") as tmp, RedisProcess(Path(tmp), tcp=True) as srv:
        with srv.client() as c:  # every script in the cache: the faulted send is the real run, not NOSCRIPT
            for name in SCRIPT_KEYS:
                c.script_load(lua_source(name))
        yield srv


@pytest.fixture(scope="module")
def proxy(server: RedisProcess) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", server.port)) as p:
        yield p


@pytest.fixture
def direct(server: RedisProcess, proxy: FaultProxy) -> Iterator[redis.Redis]:
    """A client that bypasses the proxy: sets up and inspects the state."""
    proxy.disarm()
    with server.client() as c:
        c.flushall()
        yield c
    proxy.disarm()


_TOKEN = re.compile(rb"^pq:\{ns\}:service:\d+$")


def snapshot(r: redis.Redis) -> dict[bytes, object]:
    """Every key's logical content; a service key's random renewal token is replaced by
    a placeholder (present or not is still compared)."""
    out = contents(r)
    for key, value in out.items():
        if _TOKEN.match(key) and isinstance(value, dict) and b"renewal" in value:
            out[key] = {**value, b"renewal": b"<token>"}
    return out


def with_duplicates(state: dict[bytes, object], n: int, queue: str = "q") -> dict[bytes, object]:
    """``state`` with ``queue``'s duplicates counter raised by ``n``."""
    if not n:
        return state
    key = f"pq:{{{queue}}}:counters".encode()
    counters = dict(state[key])  # type: ignore[call-overload]
    counters[b"duplicates"] = str(int(counters.get(b"duplicates", 0)) + n).encode()
    return {**state, key: counters}


def through_proxy(proxy: FaultProxy, retries: int, fault: Fault | None) -> redis.Redis:
    """A driver client via the proxy; a short socket timeout where the reply comes late."""
    timeout = SHORT_TIMEOUT_S if fault is Fault.DELAY_REPLY else 10.0
    return connect(proxy.url, retries=retries, socket_timeout_s=timeout)


@contextlib.contextmanager
def actors(driver: str, proxy: FaultProxy, retries: int, fault: Fault | None) -> Iterator[tuple[Any, Any]]:
    """The queue and services a case acts through, via the proxy: the sync driver's, or
    the async driver's queue behind the blocking facade (conftest.Blocking; the async
    driver has no Services, so service cases run on the sync driver only)."""
    if driver == "sync":
        with through_proxy(proxy, retries, fault) as client:
            yield Queue("q", client, owner="actor"), Services(client, namespace="ns")
        return
    timeout = SHORT_TIMEOUT_S if fault is Fault.DELAY_REPLY else 10.0
    loop = asyncio.new_event_loop()
    client = aio.connect(proxy.url, retries=retries, socket_timeout_s=timeout)
    try:
        yield Blocking(AsyncQueue("q", client, owner="actor"), loop), None
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


def run_once(direct: redis.Redis, proxy: FaultProxy, act: Act, driver: str = "sync") -> tuple[Any, dict[bytes, object]]:
    """A fresh state, ``act`` through the proxy without faults: the answer and state of
    one clean call."""
    direct.flushall()
    world = build(direct)
    with actors(driver, proxy, 3, None) as (q, s):
        answer = act(q, s, world)
    return answer, snapshot(direct)


#: (case, driver): every case on the sync driver, the queue's cases on the async one too.
DRIVER_CASES = [(name, "sync") for name in CASES] + [(name, "async") for name in CASES if not name.startswith("service")]


def arm(proxy: FaultProxy, script: str, fault: Fault) -> Rule:
    """Apply ``fault`` to the next EVALSHA of ``script`` (by the SHA1 of its file, as
    every client computes it)."""
    sha = hashlib.sha1(lua_source(script).encode("utf-8")).hexdigest()
    return proxy.arm(fault, evalsha_of(sha), delay_s=LATE_S)


# -- (a) the driver's retries ----------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name.lower())
@pytest.mark.parametrize(("name", "via"), DRIVER_CASES)
def test_with_driver_retries_a_lost_command_or_reply_has_the_effect_of_one_call(
    name: str, via: str, fault: Fault, direct: redis.Redis, proxy: FaultProxy
) -> None:
    case = CASES[name]
    clean_answer, clean_state = run_once(direct, proxy, case.act, via)

    direct.flushall()
    world = build(direct)
    rule = arm(proxy, case.script, fault)
    with actors(via, proxy, 3, fault) as (q, s):
        answer = case.act(q, s, world)
    assert rule.fired == 1, "the fault was never applied"
    applied_twice = fault is not Fault.DROP_COMMAND  # the first send ran; redis-py sent it again
    expected = case.replayed(clean_answer) if applied_twice else clean_answer
    assert view(answer) == view(expected)
    assert snapshot(direct) == with_duplicates(clean_state, case.duplicates if applied_twice else 0, case.queue)


# -- (b) no retries: OutcomeUnknown, and the caller's same call ------------------------


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name.lower())
@pytest.mark.parametrize(("name", "via"), DRIVER_CASES)
def test_without_retries_a_lost_call_raises_outcome_unknown_and_the_callers_same_call_is_safe(
    name: str, via: str, fault: Fault, direct: redis.Redis, proxy: FaultProxy
) -> None:
    case = CASES[name]
    act = case.same_call or case.act
    replayed = case.same_call_replayed if case.same_call else case.replayed
    clean_answer, clean_state = run_once(direct, proxy, act, via)

    direct.flushall()
    world = build(direct)
    rule = arm(proxy, case.script, fault)
    with actors(via, proxy, 0, fault) as (q, s):
        with pytest.raises((OutcomeUnknown, redis.ConnectionError, redis.TimeoutError)) as raised:
            act(q, s, world)
        if case.same_call is None:  # the driver's call, not a raw script call
            assert raised.type is OutcomeUnknown
        assert rule.fired == 1
        answer = act(q, s, world)  # the caller's retry: the same arguments
    applied_twice = fault is not Fault.DROP_COMMAND
    expected = replayed(clean_answer) if applied_twice else clean_answer
    assert view(answer) == view(expected)
    assert snapshot(direct) == with_duplicates(clean_state, case.duplicates if applied_twice else 0, case.queue)


# -- what the cases above imply, spelled out -------------------------------------------


def test_a_swallowed_ack_reply_retried_acks_once_and_answers_gone(direct: redis.Redis, proxy: FaultProxy) -> None:
    world = build(direct)
    rule = arm(proxy, "ack", Fault.SWALLOW_REPLY)
    with through_proxy(proxy, 3, None) as client:
        q = Queue("q", client)
        assert q.ack(world.held) is Outcome.GONE  # the lost reply said ok
        assert rule.ran.is_set()
        assert q.ack(world.held) is Outcome.GONE
    assert direct.hexists("pq:{q}:jobs", "held") == 0
    assert Queue("q", direct).stats(now_ms=NOW).acked == 1


def test_a_swallowed_lease_reply_retried_returns_the_same_leases_and_leases_nothing_more(
    direct: redis.Redis, proxy: FaultProxy
) -> None:
    build(direct)
    rule = arm(proxy, "lease", Fault.SWALLOW_REPLY)
    with through_proxy(proxy, 3, None) as client:
        jobs = Queue("q", client, owner="actor").lease_call(count=2, lease_ms=1000, call="c1", now_ms=NOW).jobs
    assert rule.ran.is_set()
    assert [j.id for j in jobs] == ["expired", "r1"]  # the reclaimed lease first, then READY's head
    mine = direct.zrangebylex("pq:{q}:owners", "[actor|", "(actor}")
    assert sorted(mine) == sorted(j.receipt.encode() for j in jobs)


def test_a_renewal_whose_reply_was_swallowed_keeps_working(direct: redis.Redis, proxy: FaultProxy) -> None:
    world = build(direct)
    rule = arm(proxy, "service_renew", Fault.SWALLOW_REPLY)
    with through_proxy(proxy, 3, None) as client:
        services = Services(client, namespace="ns")
        services.renew(world.service, now_ms=NOW)
        assert rule.ran.is_set()
        services.renew(world.service, now_ms=NOW + 1)  # the token the driver holds is the stored one
    assert direct.hget("pq:{ns}:service:1", "renewal") == world.service.renewal.encode()


def test_a_swallowed_registration_reply_leaves_one_registration(direct: redis.Redis, proxy: FaultProxy) -> None:
    build(direct)
    rule = arm(proxy, "service_register", Fault.SWALLOW_REPLY)
    with through_proxy(proxy, 3, None) as client:
        service = Services(client, namespace="ns").register(["q"], host="h", pid=2, registration="reg", now_ms=NOW)
    assert rule.ran.is_set()
    assert service.id == 3 and direct.get("pq:{ns}:service:seq") == b"3"
    assert direct.lrange("pq:{ns}:service:ids", 0, -1) == [b"3", b"1"]  # 2 expired: listed no more
    assert direct.hget("pq:{ns}:service:3", "renewal") == service.renewal.encode()


def test_a_renewal_that_raised_outcome_unknown_can_renew_again(direct: redis.Redis, proxy: FaultProxy) -> None:
    world = build(direct)
    arm(proxy, "service_renew", Fault.SWALLOW_REPLY)
    with through_proxy(proxy, 0, None) as client:
        services = Services(client, namespace="ns")
        with pytest.raises(OutcomeUnknown):
            services.renew(world.service, now_ms=NOW)
        services.renew(world.service, now_ms=NOW + 1)


def test_an_enqueue_resent_after_its_job_was_acked_does_not_add_it_again(
    direct: redis.Redis, proxy: FaultProxy
) -> None:
    arm(proxy, "enqueue", Fault.SWALLOW_REPLY)
    consumer = Queue("q", direct)
    with through_proxy(proxy, 0, None) as client:
        producer = Queue("q", client)
        with pytest.raises(OutcomeUnknown):
            producer.enqueue(b"x", job_id="once", now_ms=NOW)
        (job,) = consumer.lease(now_ms=NOW)  # the lost send added it; a worker runs it
        assert consumer.ack(job, now_ms=NOW) is Outcome.OK
        again = producer.enqueue(b"x", job_id="once", now_ms=NOW + 1)  # the caller re-sends the same call
    # The ack left a tombstone: the re-send is a duplicate, not a second run.
    assert not again.added and consumer.stats(now_ms=NOW + 1).ready == 0, "the acked job is back in READY"


def test_a_worker_whose_lease_reply_was_lost_runs_those_jobs_without_waiting_for_their_deadline(
    direct: redis.Redis, proxy: FaultProxy
) -> None:
    Queue("q", direct).enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)])
    arm(proxy, "lease", Fault.SWALLOW_REPLY)
    ran: list[str] = []
    with through_proxy(proxy, 0, None) as client:
        worker = Worker(["q"], lambda job: ran.append(job.id), redis=client, lease_ms=60_000, block_ms=500)
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        thread.start()
        try:
            deadline = time.monotonic() + 3  # far less than the 60 s lease
            while len(ran) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            worker.stop("test finished")
            thread.join(15)
    assert sorted(ran) == ["j0", "j1", "j2"], f"ran {ran}; still leased: {direct.zrange('pq:{q}:leased', 0, -1)}"
