"""Every script's header states its plain-case cost, and that is what it costs on a real
server.

The ``Cost`` paragraph of each ``lua/*.lua`` header, right before ``Errors``, starts with
the plain-case cost: the Redis commands the script runs itself (its ``redis.call`` /
``redis.pcall`` calls, not the EVALSHA that runs it) in its common call on a plain queue
(no groups or priorities, no event stream, not paused, no rate limit, no flows), with
one job or one receipt where it takes several, in the state a steady busy queue is in::

    Cost     plain case (one job, a queue with no optional feature on): 9 commands

A script with two common cases states two figures, in the order of its cases in
:data:`CASES`::

    Cost     plain case: 14 commands (ack one, lease one); 10 (lease one)

The figures are read from the whole paragraph: every integer followed by ``command`` or
``commands``, and every integer right after ``; `` and followed by `` (``.

How a call is measured: each case sets up its state through the public API (``Queue``,
``Services``), then makes the call through the driver's own method. The driver's
``scripts.execute`` is wrapped so that the one step that runs the script measured is
bracketed by ``CONFIG RESETSTAT`` + ``INFO commandstats`` and a second ``INFO
commandstats`` on another connection; every other step of the verb (the partition-count
guard, reads the verb makes before or after) runs outside that window. The script is
loaded just before the window opens, so no NOSCRIPT reply or SCRIPT LOAD lands in it.
The window must hold exactly one EVALSHA, the INFO that opened it, and otherwise only
commands the script's source names: those are the script's cost.

Real server only (fakeredis keeps no command statistics): without redis-server these
tests skip, and under ``CI=true`` they fail (conftest.require_redis_server).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from conftest import RedisServer

from pyqueue import NewJob, Outcome, Queue
from pyqueue.protocol.core import ScriptCall
from pyqueue.drivers.queue import transport_of
from pyqueue.drivers.scripts import lua_dir, lua_source
from pyqueue.ops.service import RunningJob, Services

#: The commands that run a script; the window must hold exactly one EVALSHA of them.
SCRIPT_CALLS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"})


# -- the headers -------------------------------------------------------------------------


def header(name: str) -> str:
    """The header comment of ``lua/<name>.lua``, ending with a newline."""
    return lua_source(name).split("\n]]\n", 1)[0] + "\n"


#: A header paragraph: its label line and the indented lines after it.
PARAGRAPH = r"^{label} +\S.*\n(?:[ \t]+\S.*\n)*"


def cost_paragraph(text: str) -> re.Match[str] | None:
    """The ``Cost`` paragraph of a header (``Cost:`` inside a description is not one)."""
    return re.search(PARAGRAPH.format(label="Cost"), text, re.M)


def stated_costs(text: str) -> list[int]:
    """The plain-case figures a header states, in order (see the module docstring); []
    when its Cost paragraph does not start with a plain case."""
    m = cost_paragraph(text)
    if m is None:
        return []
    words = " ".join(m.group(0).split())
    if not words.startswith("Cost plain case"):
        return []
    return [int(a or b) for a, b in re.findall(r"\b(\d+)(?= commands?\b)|(?<=; )(\d+)(?= \()", words)]


# -- measuring -----------------------------------------------------------------------------


def commandstats(admin: redis.Redis) -> Counter[str]:
    """INFO commandstats as command -> calls (refused calls too: a command a script sent
    counts even when the server refused it)."""
    out: Counter[str] = Counter()
    for key, stat in admin.info("commandstats").items():
        out[key.removeprefix("cmdstat_")] += int(stat["calls"]) + int(stat.get("rejected_calls", 0))
    return out


@contextmanager
def measuring(scripts: Any, script: str, admin: redis.Redis) -> Iterator[list[Counter[str]]]:
    """While open, each step running ``script`` that ``scripts.execute`` gets runs in a
    window of its own (see the module docstring); the list gets each window's commands."""
    original = scripts.execute
    windows: list[Counter[str]] = []

    def execute(step: Any) -> Any:
        if not (isinstance(step, ScriptCall) and step.script == script):
            return original(step)
        admin.script_load(lua_source(script))  # cached before the window: no NOSCRIPT in it
        admin.config_resetstat()
        before = commandstats(admin)
        try:
            return original(step)
        finally:
            windows.append(commandstats(admin) - before)

    scripts.execute = execute  # an instance attribute: the transport's own method stays as it was
    try:
        yield windows
    finally:
        del scripts.execute


def commands_named(name: str) -> set[str]:
    """The Redis commands ``lua/<name>.lua`` calls (lowercase), directly or through
    call_chunked."""
    return {c.lower() for c in re.findall(r"(?:redis\.p?call|call_chunked)\(\s*['\"](\w+)['\"]", lua_source(name))}


def script_commands(name: str, window: Counter[str]) -> Counter[str]:
    """The commands of a window but the bookkeeping and the EVALSHA, checked to hold
    nothing the Python side could have sent."""
    inside = Counter(window)
    opened = inside.pop("info", 0)
    inside.pop("config|resetstat", None)  # counted before the first read, so 0 here
    calls = {cmd: inside.pop(cmd) for cmd in list(inside) if cmd in SCRIPT_CALLS}
    assert opened == 1 and calls == {"evalsha": 1}, (
        f"{name}: a window should hold the INFO that opened it and one EVALSHA: {dict(window)}"
    )
    foreign = sorted(cmd for cmd in inside if cmd.split("|", 1)[0] not in commands_named(name))
    assert not foreign, f"{name}: the window holds commands {name}.lua never sends: {foreign} ({dict(window)})"
    return inside


def breakdown(commands: Counter[str]) -> str:
    return ", ".join(f"{cmd.upper()} x{n}" if n > 1 else cmd.upper() for cmd, n in sorted(commands.items()))


# -- the cases -----------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """A plain queue ``q``, a service namespace ``ns``, and their raw client."""

    q: Queue
    services: Services
    r: redis.Redis


#: A case's setup: puts the world in the case's state through the public API, and
#: returns the call to measure (which checks its own answer: the case happened).
Setup = Callable[[World], Callable[[], None]]


def leased(q: Queue, *jobs: NewJob) -> list[Any]:
    """Enqueue ``jobs`` and lease them all."""
    q.enqueue_many(list(jobs))
    got = q.lease(count=len(jobs))
    assert len(got) == len(jobs)
    return got


def busy(q: Queue) -> None:
    """A steady busy queue, READY empty: jobs were enqueued, leased and acked (their
    tombstones in force, none expired), maintenance ran, the wake marker is up (a busy
    worker leases again without waiting for it)."""
    q.ack_many(leased(q, NewJob(b"a"), NewJob(b"b")))
    q.enqueue(b"c")  # raises the marker
    assert len(q.lease()) == 1


def maintenance_not_due(w: World) -> None:
    """As just after a maintenance run (lease.lua runs one at most every 50 ms, so a
    slow test machine could otherwise reach the next): ``next_maintenance_ms`` (lua/
    lease.lua, KEYS 8) an hour ahead."""
    w.r.hset(w.q.spec.keys.counters, "next_maintenance_ms", int(time.time() * 1000) + 3_600_000)


def case_set_budget(w: World) -> Callable[[], None]:
    def call() -> None:
        assert w.q.set_budget(1 << 20) is True

    return call


def case_set_result_budget(w: World) -> Callable[[], None]:
    def call() -> None:
        assert w.q.set_result_budget(1 << 20) is True

    return call


def case_set_tombstone_limit(w: World) -> Callable[[], None]:
    def call() -> None:
        assert w.q.set_tombstone_limit(10_000) is True

    return call


def case_set_indexes(w: World) -> Callable[[], None]:
    def call() -> None:
        assert w.q.set_indexes(True) is not None

    return call


def case_search(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"x", job_id="dies", max_attempts=1)
    (job,) = w.q.lease()
    w.q.nack(job, "boom")

    def call() -> None:
        page = w.q.search(state="dead")
        assert [j.id for j in page.jobs] == ["dies"] and page.cursor == ""

    return call


def case_promote_now(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"x", job_id="later", delay_ms=3_600_000)

    def call() -> None:
        assert w.q.promote_now(["later"]) == ["later"]

    return call


def case_set_rate_limit(w: World) -> Callable[[], None]:
    def call() -> None:
        assert w.q.set_rate_limit("acct", "10/s") is True

    return call


def case_defer_key(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"x", rate_key="acct", rate_limit="10/s")
    (job,) = w.q.lease()

    def call() -> None:
        assert w.q.defer_key(job, 1000) is not None

    return call


def case_sequence_skip(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"head", sequence="k", max_attempts=1)
    w.q.enqueue(b"next", sequence="k")
    (job,) = w.q.lease()
    w.q.nack(job, "boom")

    def call() -> None:
        assert w.q.sequence_skip("k").status == "skipped"

    return call


def case_enqueue(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"waiting")
    return lambda: None if w.q.enqueue(b"x") else pytest.fail("not added")


def case_ack_and_lease(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))
    w.q.enqueue(b"next")
    maintenance_not_due(w)

    def call() -> None:
        outcome, jobs = w.q.ack_and_lease(job)
        assert outcome is Outcome.OK and len(jobs) == 1

    return call


def case_lease(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"next")
    maintenance_not_due(w)

    def call() -> None:
        assert len(w.q.lease()) == 1

    return call


def case_ack(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))

    def call() -> None:
        assert w.q.ack(job) is Outcome.OK

    return call


def case_ack_result(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))

    def call() -> None:
        assert w.q.ack_result(job, "done") is Outcome.OK

    return call


def nack_case(max_attempts: int, state: str) -> Setup:
    def setup(w: World) -> Callable[[], None]:
        busy(w.q)
        (job,) = leased(w.q, NewJob(b"running", max_attempts=max_attempts))

        def call() -> None:
            nacked = w.q.nack(job, "boom")
            assert nacked.outcome is Outcome.OK and nacked.state == state, nacked

        return call

    return setup


def case_extend(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))

    def call() -> None:
        assert [e.outcome for e in w.q.extend([job])] == [Outcome.OK]

    return call


def case_release(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))

    def call() -> None:
        assert w.q.release([job]) == [Outcome.OK]

    return call


def promote_case(due: bool) -> Setup:
    def setup(w: World) -> Callable[[], None]:
        busy(w.q)
        w.q.enqueue(b"later", delay_ms=1 if due else 3_600_000)
        time.sleep(0.005)

        def call() -> None:
            promoted = w.q.promote()
            assert (promoted.promoted, promoted.reclaimed) == (int(due), 0), promoted

        return call

    return setup


def case_stats(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"waiting")

    def call() -> None:
        assert w.q.stats().ready == 1

    return call


def case_peek(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"waiting")

    def call() -> None:
        assert w.q.peek().ready == 1

    return call


def get_case(state: str) -> Setup:
    def setup(w: World) -> Callable[[], None]:
        busy(w.q)
        if state == "leased":
            leased(w.q, NewJob(b"running", job_id="j1"))
        else:
            w.q.enqueue(b"waiting", job_id="j1")

        def call() -> None:
            assert w.q.get("j1").state == state

        return call

    return setup


def case_result(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running", job_id="j1"))
    w.q.ack_result(job, "done")

    def call() -> None:
        assert w.q.result("j1").state == "ok"

    return call


def case_cancel(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"waiting", job_id="j1")

    def call() -> None:
        assert w.q.cancel("j1").state == "ready"

    return call


def case_limit(w: World) -> Callable[[], None]:
    busy(w.q)
    return lambda: None if w.q.limit(10, 1000) else pytest.fail("unchanged")


def case_set_group_limit(w: World) -> Callable[[], None]:
    busy(w.q)
    return lambda: None if w.q.set_group_limit(5) else pytest.fail("unchanged")


def case_groups(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"waiting", group="g")

    def call() -> None:
        page = w.q.groups()
        assert [(g.name, g.ready) for g in page.groups] == [("g", 1)], page

    return call


def case_pause(w: World) -> Callable[[], None]:
    busy(w.q)
    return lambda: None if w.q.pause() else pytest.fail("was paused")


def case_resume(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.pause()
    return lambda: None if w.q.resume() else pytest.fail("was not paused")


def one_dead(w: World) -> None:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"failing", job_id="j1", max_attempts=1))
    assert w.q.nack(job, "boom").state == "dead"


def case_dead_list(w: World) -> Callable[[], None]:
    one_dead(w)

    def call() -> None:
        assert [j.id for j in w.q.dead_list().jobs] == ["j1"]

    return call


def case_dead_replay(w: World) -> Callable[[], None]:
    one_dead(w)

    def call() -> None:
        assert w.q.dead_replay(["j1"]) == 1

    return call


def case_dead_purge(w: World) -> Callable[[], None]:
    one_dead(w)

    def call() -> None:
        assert w.q.dead_purge(["j1"]) == 1

    return call


def case_scrub(w: World) -> Callable[[], None]:
    busy(w.q)
    dead = Queue("q", w.r, owner="ns.7.dead1")  # a dead worker's lease, attempts to spare
    dead.enqueue(b"x")
    assert len(dead.lease()) == 1

    def call() -> None:
        scrubbed = w.q.scrub("ns.7.dead1")
        assert (scrubbed.scrubbed, scrubbed.dead) == (1, 0), scrubbed

    return call


def case_flow_wait(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"first", job_id="a")

    def call() -> None:
        assert w.q.flow_wait(NewJob(b"second", job_id="b"), [("q", "a")]) == "ok"

    return call


def flow_done_case(waits_for: int, state: str) -> Setup:
    def setup(w: World) -> Callable[[], None]:
        busy(w.q)
        refs = [("q", f"a{i}") for i in range(waits_for)]
        w.q.enqueue_many([NewJob(b"first", job_id=ref) for _, ref in refs])
        assert w.q.flow_wait(NewJob(b"then", job_id="b"), refs) == "ok"

        def call() -> None:
            done = w.q.flow_done("b", [("q", "a0", "ok")])
            assert (done.state, done.counted) == (state, 1), done

        return call

    return setup


def case_flow_record(w: World) -> Callable[[], None]:
    busy(w.q)
    return lambda: None if w.q.flow_record("f1", b"{}", 60_000) == "ok" else pytest.fail("not kept")


def case_flow_show(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.flow_record("f1", b"{}", 60_000)
    return lambda: None if w.q.flow_show("f1") else pytest.fail("not found")


def case_browse(w: World) -> Callable[[], None]:
    busy(w.q)
    w.q.enqueue(b"waiting")

    def call() -> None:
        assert w.q.browse("ready").total == 1

    return call


def case_progress(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))
    w.q.progress(job, b'{"done": 1}')

    def call() -> None:
        assert w.q.progress(job, b'{"done": 2}') is Outcome.OK

    return call


def case_progress_show(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running", job_id="j1"))
    w.q.progress(job, b'{"done": 1}')

    def call() -> None:
        assert set(w.q.progress_of(["j1"])) == {"j1"}

    return call


def case_step(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))
    w.q.step(job, "first", b"j1", lease_ms=30_000)  # the queue has step data: its flag is set

    def call() -> None:
        assert w.q.step(job, "second", b"j2", lease_ms=30_000).status == "ok"

    return call


def case_park(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running"))

    def call() -> None:
        assert w.q.park(job, "sleep", "nap", 60_000, lease_ms=30_000).status == "parked"

    return call


def case_signal(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running", job_id="j1"))
    w.q.park(job, "wait", "approved", 60_000, lease_ms=30_000)

    def call() -> None:
        assert w.q.signal("j1", "approved", b"jyes").status == "woke"

    return call


def case_steps(w: World) -> Callable[[], None]:
    busy(w.q)
    (job,) = leased(w.q, NewJob(b"running", job_id="j1"))
    w.q.step(job, "first", b"j1", lease_ms=30_000)

    def call() -> None:
        assert list(w.q.steps("j1").results) == ["first"]

    return call


def case_set_events(w: World) -> Callable[[], None]:
    busy(w.q)
    return lambda: None if w.q.set_events(1000) else pytest.fail("no answer")


def case_service_register(w: World) -> Callable[[], None]:
    w.services.register(["q"])  # the namespace has had a service; it lives
    return lambda: None if w.services.register(["q"]).id == 2 else pytest.fail("not the next id")


def case_service_renew(w: World) -> Callable[[], None]:
    svc = w.services.register(["q"])
    running = [RunningJob("q", "j1", int(time.time() * 1000))]

    def call() -> None:
        renewed = w.services.renew(svc, running=running)
        assert not renewed.stop and not renewed.dead

    return call


def case_service_deregister(w: World) -> Callable[[], None]:
    svc = w.services.register(["q"])
    return lambda: None if w.services.deregister(svc) == (1, 1) else pytest.fail("not removed")


def case_service_stop(w: World) -> Callable[[], None]:
    svc = w.services.register(["q"])
    return lambda: None if w.services.stop(svc.id) else pytest.fail("not stopped")


@dataclass(frozen=True)
class Case:
    script: str
    figure: int  # which figure of the script's Cost paragraph this case is (0: the first)
    what: str
    setup: Setup

    @property
    def id(self) -> str:
        return f"{self.script}-{re.sub(r'[^a-z0-9]+', '_', self.what.lower()).strip('_')}"


#: Every script's plain case(s); the figures of a script in the order its header states them.
CASES = [
    Case("ack", 0, "one current receipt", case_ack),
    Case("ack_result", 0, "one current receipt", case_ack_result),
    Case("browse", 0, "the ready page, one job in it", case_browse),
    Case("cancel", 0, "a ready job", case_cancel),
    Case("dead_list", 0, "a page of one dead job", case_dead_list),
    Case("dead_purge", 0, "one dead job", case_dead_purge),
    Case("dead_replay", 0, "one dead job", case_dead_replay),
    Case("enqueue", 0, "one job", case_enqueue),
    Case("extend", 0, "one current receipt", case_extend),
    Case("flow_done", 0, "the last job it waits for: released", flow_done_case(1, "released")),
    Case("flow_done", 1, "one of two: still waiting", flow_done_case(2, "waiting")),
    Case("flow_record", 0, "a new record", case_flow_record),
    Case("flow_show", 0, "a record in force", case_flow_show),
    Case("flow_wait", 0, "waits for one job", case_flow_wait),
    Case("get", 1, "a ready job", get_case("ready")),
    Case("get", 0, "a leased job", get_case("leased")),
    Case("groups", 0, "one group, one ready job", case_groups),
    Case("lease", 0, "ack one receipt and lease one job", case_ack_and_lease),
    Case("lease", 1, "lease one job", case_lease),
    Case("limit", 0, "cap an uncapped queue", case_limit),
    Case("nack", 0, "to scheduled", nack_case(3, "scheduled")),
    Case("nack", 1, "to dead", nack_case(1, "dead")),
    Case("pause", 0, "a running queue", case_pause),
    Case("peek", 0, "a queue with a ready job", case_peek),
    Case("progress", 0, "a job's next value", case_progress),
    Case("progress_show", 0, "one id", case_progress_show),
    Case("promote", 0, "one due job", promote_case(due=True)),
    Case("promote", 1, "nothing due", promote_case(due=False)),
    Case("release", 0, "one current receipt", case_release),
    Case("result", 0, "a kept result", case_result),
    Case("resume", 0, "a paused queue", case_resume),
    Case("scrub", 0, "one lease of a dead service", case_scrub),
    Case("service_deregister", 0, "a live service itself", case_service_deregister),
    Case("service_register", 0, "a namespace that has had a service", case_service_register),
    Case("service_renew", 0, "a live service running one job", case_service_renew),
    Case("service_stop", 0, "a live service", case_service_stop),
    Case("sequence_skip", 0, "a dead head with one job behind it", case_sequence_skip),
    Case("set_events", 0, "opt in", case_set_events),
    Case("set_group_limit", 0, "the default cap", case_set_group_limit),
    Case("set_rate_limit", 0, "set a key's limit", case_set_rate_limit),
    Case("set_budget", 0, "a queue's first budget", case_set_budget),
    Case("set_result_budget", 0, "a queue's first results budget", case_set_result_budget),
    Case("set_tombstone_limit", 0, "a queue's first tombstone limit", case_set_tombstone_limit),
    Case("set_indexes", 0, "turn a queue's indexes on", case_set_indexes),
    Case("search", 0, "state dead, one dead job", case_search),
    Case("promote_now", 0, "one scheduled job", case_promote_now),
    Case("defer_key", 0, "a job with a rate key", case_defer_key),
    Case("stats", 0, "a queue with a ready job", case_stats),
    Case("step", 0, "a step of a queue with step data", case_step),
    Case("park", 0, "a first sleep", case_park),
    Case("signal", 0, "a job parked for it", case_signal),
    Case("steps", 0, "a job with one step", case_steps),
]

SCRIPTS = sorted(path.stem for path in lua_dir().glob("*.lua"))


def test_the_cost_line_reads_as_expected() -> None:
    def stated(paragraph: str) -> list[int]:
        return stated_costs(f"Returns  x\n{paragraph}\nErrors   y\n")

    assert stated("Cost     plain case (one job, a queue with no optional feature on): 9 commands") == [9]
    assert stated("Cost     plain case: 12 commands (ack one, lease one); 9 (lease one)") == [12, 9]
    assert stated("Cost     plain case: 12 commands (ack one, lease one);\n         9 commands (lease one)") == [12, 9]
    assert stated("Cost     plain case (one receipt): 1\n         command") == [1]
    assert stated("Cost     plain case (a job, past 10,000 leases (rare)): 5 commands. O(1) with 2 (x)") == [5]
    assert stated("Cost     O(1): 3 commands") == []  # no plain case stated
    assert stated_costs("Cost: O(log n), 4 commands\nErrors   y\n") == []  # a description, not the paragraph


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_header_states_its_plain_case_cost_before_errors(name: str) -> None:
    text = header(name)
    paragraph = cost_paragraph(text)
    figures = stated_costs(text)
    cases = [c for c in CASES if c.script == name]
    assert cases, f"{name}.lua: no plain case measured here; add one to CASES in tests/test_costs.py"
    expected = sorted({c.figure for c in cases})
    shown = "\n".join(f"  figure {i}: {'; '.join(c.what for c in cases if c.figure == i)}" for i in expected)
    assert paragraph and figures, (
        f"{name}.lua: its header has no 'Cost     plain case ...: N commands' line (right before Errors); "
        f"the cases measured, in order:\n{shown}"
    )
    assert len(figures) == len(expected), (
        f"{name}.lua states {len(figures)} plain-case figure(s) {figures}, the test measures {len(expected)}:\n{shown}"
    )
    after = text[paragraph.end():]
    assert after.startswith("Errors ") or ("\nErrors " not in text and not after.strip()), (
        f"{name}.lua: the Cost paragraph should come right before Errors, not before {after.splitlines()[:1]}"
    )


@pytest.fixture
def world(redis_server: RedisServer) -> Iterator[World]:
    client = redis_server.client()
    client.flushall()
    yield World(Queue("q", client), Services(client, namespace="ns"), client)
    client.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_plain_case_costs_what_the_header_states(case: Case, world: World, redis_server: RedisServer) -> None:
    call = case.setup(world)
    scripts = world.services.scripts if case.script.startswith("service_") else transport_of(world.q)
    admin = redis_server.client(decode_responses=True)
    try:
        with measuring(scripts, case.script, admin) as windows:
            call()
    finally:
        admin.close()
    assert len(windows) == 1, f"{case.script}: the call ran {case.script}.lua {len(windows)} times, not once"
    inside = script_commands(case.script, windows[0])
    measured = sum(inside.values())
    figures = stated_costs(header(case.script))
    stated = figures[case.figure] if case.figure < len(figures) else None
    assert stated == measured, (
        f"{case.script}.lua, plain case '{case.what}' (figure {case.figure} of its Cost line): "
        f"the header states {stated if stated is not None else 'nothing'}, measured {measured} commands: "
        f"{breakdown(inside)}"
    )


def measured_commands(world: World, redis_server: RedisServer, script: str, call: Callable[[], Any]) -> int:
    """How many commands one run of ``script`` in ``call`` sent (as the plain cases count)."""
    admin = redis_server.client(decode_responses=True)
    try:
        with measuring(transport_of(world.q), script, admin) as windows:
            call()
    finally:
        admin.close()
    assert len(windows) == 1
    return sum(script_commands(script, windows[0]).values())


def test_flow_control_costs_what_the_headers_state_and_nothing_on_a_queue_without_it(
    world: World, redis_server: RedisServer
) -> None:
    # lua/enqueue.lua and lease.lua state the plain figures and, beside them, what each
    # flow-control feature adds (section 2.7); a queue that uses none pays the plain figure.
    q = world.q
    busy(q)
    plain = measured_commands(world, redis_server, "enqueue", lambda: q.enqueue(b"x"))
    added = {
        "expiry": measured_commands(world, redis_server, "enqueue", lambda: q.enqueue(b"x", expires_ms=60_000)),
        "throttle, adds": measured_commands(world, redis_server, "enqueue",
                                            lambda: q.enqueue(b"x", throttle_ms=60_000, key="t")),
        "throttled": measured_commands(world, redis_server, "enqueue",
                                       lambda: q.enqueue(b"x", throttle_ms=60_000, key="t")),
        "debounce, adds": measured_commands(world, redis_server, "enqueue",
                                            lambda: q.enqueue(b"x", debounce_ms=60_000, key="d")),
        "debounced": measured_commands(world, redis_server, "enqueue",
                                       lambda: q.enqueue(b"x", debounce_ms=60_000, key="d")),
    }
    assert (plain, {k: v - plain for k, v in added.items()}) == (
        8, {"expiry": 3, "throttle, adds": 5, "throttled": 0, "debounce, adds": 5, "debounced": 6})
    # lease: a queue that never had an expiry pays the plain figure; one that had pays +1
    # for a job without one, +2 for a job with one (leased in time), +5 for one that expired.
    costs = {}
    for name, options, wait in (("no expiry", {}, 0), ("in time", {"expires_ms": 60_000}, 0),
                                ("expired", {"expires_ms": 1}, 0.01)):
        w = World(Queue(f"e-{name.replace(' ', '-')}", world.r), world.services, world.r)
        busy(w.q)
        w.q.enqueue(b"marker", expires_ms=60_000)  # the queue has had an expiry: counters `expiry`
        w.q.ack(w.q.lease()[0])
        w.q.enqueue(b"x", **options)
        maintenance_not_due(w)
        time.sleep(wait)
        costs[name] = measured_commands(w, redis_server, "lease", lambda w=w: w.q.lease())
    base = Queue("e-base", world.r)
    wb = World(base, world.services, world.r)
    busy(base)
    base.enqueue(b"x")
    maintenance_not_due(wb)
    lease_base = measured_commands(wb, redis_server, "lease", lambda: base.lease())
    assert (lease_base, {k: v - lease_base for k, v in costs.items()}) == (10, {"no expiry": 1, "in time": 2, "expired": 5})
    # Sequences: enqueue of a head and of a job behind it; an ack of a head that hands its
    # key on, and of a job without a sequence in a queue that has them (ack.lua).
    sq = World(Queue("seq", world.r), world.services, world.r)
    busy(sq.q)
    head = measured_commands(sq, redis_server, "enqueue", lambda: sq.q.enqueue(b"h", sequence="s"))
    behind = measured_commands(sq, redis_server, "enqueue", lambda: sq.q.enqueue(b"b", sequence="s"))
    sq.q.enqueue(b"plain")
    jobs = {j.payload: j for j in sq.q.lease(count=2)}
    hand_on = measured_commands(sq, redis_server, "ack", lambda: sq.q.ack(jobs[b"h"]))
    flagged = measured_commands(sq, redis_server, "ack", lambda: sq.q.ack(jobs[b"plain"]))
    plain_ack = stated_costs(header("ack"))[0]
    assert (head - plain, behind - plain, hand_on - plain_ack, flagged - plain_ack) == (4, 5, 12, 1)
    # Rate keys: enqueue of a rated job; in a queue with rate keys, a lease of a plain job,
    # of a rated job whose permit is due, and of one deferred instead; an ack of a rated job.
    rq = World(Queue("rates", world.r), world.services, world.r)
    busy(rq.q)
    rated = measured_commands(rq, redis_server, "enqueue",
                              lambda: rq.q.enqueue(b"r", rate_key="acct", rate_limit="1/h"))
    (first,) = rq.q.lease()
    rq.q.ack(first)
    leases = {}
    for name, options in (("plain", {}), ("rated", {"rate_key": "other", "rate_limit": "1/h"}),
                          ("deferred", {"rate_key": "other", "rate_limit": "1/h"})):
        rq.q.enqueue(b"x", **options)
        maintenance_not_due(rq)
        leases[name] = measured_commands(rq, redis_server, "lease", lambda: rq.q.lease())
    rq.q.enqueue(b"y", rate_key="third", rate_limit="1/h")
    (job,) = rq.q.lease()
    rated_ack = measured_commands(rq, redis_server, "ack", lambda: rq.q.ack(job))
    assert (rated - plain, {k: v - lease_base for k, v in leases.items()}, rated_ack - plain_ack) == (
        4, {"plain": 1, "rated": 5, "deferred": 4}, 2)
    # Byte budgets: enqueue and ack of a job sized under a budget (the first enqueue also
    # sets the `sized` flag: measured after it).
    bq = World(Queue("budget", world.r), world.services, world.r)
    busy(bq.q)
    bq.q.set_budget(1 << 30)
    bq.q.enqueue(b"first")
    sized = measured_commands(bq, redis_server, "enqueue", lambda: bq.q.enqueue(b"x"))
    jobs = bq.q.lease(count=3)
    sized_ack = measured_commands(bq, redis_server, "ack", lambda: bq.q.ack(jobs[-1]))
    sized_wait = measured_commands(bq, redis_server, "flow_wait",
                                   lambda: bq.q.flow_wait(NewJob(b"w", job_id="w1"), [("budget", "a")]))
    plain_wait = stated_costs(header("flow_wait"))[0]
    assert (sized - plain, sized_ack - plain_ack, sized_wait - plain_wait) == (3, 3, 3)
    # Indexes (section 2.8): enqueue of a job with a task and a group in a queue that
    # keeps indexes (the first also sets the `indexed` flag: measured after it), and, in
    # such a queue, the ack of an indexed job and of one sent without task or group; the
    # ack part of a lease of an indexed job.
    iq = World(Queue("indexed", world.r), world.services, world.r)
    busy(iq.q)
    iq.q.set_indexes(True)
    iq.q.enqueue(b"first", task="t")
    indexed = measured_commands(iq, redis_server, "enqueue", lambda: iq.q.enqueue(b"x", task="t"))
    jobs = iq.q.lease(count=3)
    by_payload = {j.payload: j for j in jobs}
    indexed_ack = measured_commands(iq, redis_server, "ack", lambda: iq.q.ack(by_payload[b"x"]))
    iq.q.enqueue(b"plain")
    (plain_job,) = [j for j in iq.q.lease(count=3) if j.payload == b"plain"]
    unindexed_ack = measured_commands(iq, redis_server, "ack", lambda: iq.q.ack(plain_job))
    iq.q.enqueue(b"next", task="t")
    maintenance_not_due(iq)
    ack_lease = measured_commands(iq, redis_server, "lease", lambda: iq.q.ack_and_lease(by_payload[b"first"]))
    plain_ack_lease = stated_costs(header("lease"))[0]
    # cancel of an indexed ready job and dead_purge of an indexed dead job, in that queue.
    iq.q.enqueue(b"cancel me", job_id="to-cancel", task="t")
    cancelled = measured_commands(iq, redis_server, "cancel", lambda: iq.q.cancel("to-cancel"))
    iq.q.enqueue(b"dies", job_id="to-purge", task="t", max_attempts=1)
    (dying,) = iq.q.lease()
    iq.q.nack(dying, "boom")
    purged = measured_commands(iq, redis_server, "dead_purge", lambda: iq.q.dead_purge(["to-purge"]))
    listed_wait = measured_commands(iq, redis_server, "flow_wait",
                                    lambda: iq.q.flow_wait(NewJob(b"w", job_id="w1", task="t"), [("indexed", "a")]))
    assert (indexed - plain, indexed_ack - plain_ack, unindexed_ack - plain_ack, ack_lease - plain_ack_lease,
            cancelled - stated_costs(header("cancel"))[0], purged - stated_costs(header("dead_purge"))[0],
            listed_wait - plain_wait) == (4, 4, 1, 4, 4, 4, 4)


def test_results_budgets_cost_what_ack_results_header_states_and_nothing_without_one(
    world: World, redis_server: RedisServer
) -> None:
    # lua/ack_result.lua: a queue without a results budget pays the plain figures (ack and
    # ack_result); under one, ack_result pays +3 (+1 more in the call that first sizes a
    # result, which sets `rsized`) and +5 more in a call that deletes the oldest result to
    # stay within it; once the budget is lifted, +2 (it still takes trimmed results' sizes
    # off). ack pays nothing for it.
    plain_ack, plain_ack_result = stated_costs(header("ack"))[0], stated_costs(header("ack_result"))[0]
    q = world.q
    busy(q)
    jobs = leased(q, NewJob(b"a"), NewJob(b"b"))
    assert measured_commands(world, redis_server, "ack_result", lambda: q.ack_result(jobs[0], "x")) == plain_ack_result
    assert measured_commands(world, redis_server, "ack", lambda: q.ack(jobs[1])) == plain_ack
    stored = len(f"{int(time.time() * 1000)}|") + 2  # "<finished_ms>|" + "s" + "x"
    rq = World(Queue("results", world.r), world.services, world.r)
    busy(rq.q)
    rq.q.set_result_budget(2 * stored)
    jobs = leased(rq.q, *(NewJob(bytes([97 + i])) for i in range(4)))
    first = measured_commands(rq, redis_server, "ack_result", lambda: rq.q.ack_result(jobs[0], "x"))
    within = measured_commands(rq, redis_server, "ack_result", lambda: rq.q.ack_result(jobs[1], "x"))
    trimming = measured_commands(rq, redis_server, "ack_result", lambda: rq.q.ack_result(jobs[2], "x"))
    assert rq.q.result(jobs[0].id).state == "done" and rq.q.result(jobs[2].id).state == "ok"
    assert measured_commands(rq, redis_server, "ack", lambda: rq.q.ack(jobs[3])) == plain_ack
    rq.q.set_result_budget(None)
    (last,) = leased(rq.q, NewJob(b"e"))
    lifted = measured_commands(rq, redis_server, "ack_result", lambda: rq.q.ack_result(last, "x"))
    assert (first - plain_ack_result, within - plain_ack_result, trimming - within, lifted - plain_ack_result) == (
        4, 3, 5, 2)
    figures = " ".join(cost_paragraph(header("ack_result")).group(0).split())  # type: ignore[union-attr]
    assert "under a results budget +3 (+1 in the call that first sizes a result), +5 more" in figures
    assert "once the budget is lifted +2" in figures


def test_tombstone_limits_cost_what_the_headers_state_and_nothing_without_one(
    world: World, redis_server: RedisServer
) -> None:
    # lua/ack.lua, ack_result.lua, lease.lua (its acks and expiries) and cancel.lua: with a
    # tombstone limit (set_tombstone_limit.lua) a call that writes tombstones pays +1 (the
    # ZCARD of `done` after its ZADD) and +1 more when `done` is past the limit (the
    # ZREMRANGEBYRANK of the earliest-expiring); a queue without one pays the plain figures
    # (it reads `done_max` in the HMGET of `counters` it makes anyway).
    plain = {name: stated_costs(header(name))[0] for name in ("ack", "ack_result", "lease", "cancel")}

    def calls(w: World) -> dict[str, int]:
        """Each writer of tombstones once, in its plain case, on ``w``'s busy queue."""
        q = w.q
        jobs = leased(q, NewJob(b"a"), NewJob(b"b"), NewJob(b"c"))
        q.enqueue(b"next")
        (waiting,) = q.enqueue_many([NewJob(b"waiting")])
        maintenance_not_due(w)

        def cancel() -> None:
            assert q.cancel(waiting.job_id).state == "ready"

        return {
            "ack": measured_commands(w, redis_server, "ack", lambda: q.ack(jobs[0])),
            "ack_result": measured_commands(w, redis_server, "ack_result", lambda: q.ack_result(jobs[1], "x")),
            "lease": measured_commands(w, redis_server, "lease", lambda: q.ack_and_lease(jobs[2])),
            "cancel": measured_commands(w, redis_server, "cancel", cancel),
        }

    busy(world.q)
    assert calls(world) == plain
    tq = World(Queue("tombstones", world.r), world.services, world.r)
    busy(tq.q)
    assert tq.q.set_tombstone_limit(1000) is True
    below = calls(tq)
    assert tq.r.zcard(tq.q.spec.keys.done) < 1000
    assert tq.q.set_tombstone_limit(2) is True
    past = calls(tq)
    assert tq.r.zcard(tq.q.spec.keys.done) == 2
    assert tq.q.set_tombstone_limit(None) is True
    lifted = calls(tq)
    assert ({k: v - plain[k] for k, v in below.items()}, {k: v - plain[k] for k, v in past.items()}, lifted) == (
        dict.fromkeys(plain, 1), dict.fromkeys(plain, 2), plain)
    # lease's expiries: a job that expired unrun, leased with and without a limit past it.
    expired = {}
    for name, limit in (("no limit", None), ("past", 1)):
        w = World(Queue(f"x-{name.replace(' ', '-')}", world.r), world.services, world.r)
        busy(w.q)
        w.q.set_tombstone_limit(limit)
        w.q.enqueue(b"marker", expires_ms=60_000)  # the queue has had an expiry: counters `expiry`
        w.q.ack(w.q.lease()[0])
        w.q.enqueue(b"x", expires_ms=1)
        maintenance_not_due(w)
        time.sleep(0.01)
        expired[name] = measured_commands(w, redis_server, "lease", lambda w=w: w.q.lease())
    assert expired["past"] - expired["no limit"] == 2
    for name in ("ack", "ack_result", "lease", "cancel"):
        figures = " ".join(cost_paragraph(header(name)).group(0).split())  # type: ignore[union-attr]
        assert "with a tombstone limit" in figures and "+1, +1 more when past it" in figures, name
