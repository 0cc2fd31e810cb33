"""One test (or a few) per invariant of DESIGN §3, named after it.

The random walks drive the real scripts with an explicit clock (no sleeps) through a
seeded mix of every transition, checking the invariant after each step. The
Hypothesis model test of the whole lifecycle is a separate, deeper check.
"""

from __future__ import annotations

import random
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
import lua_build
from helpers import T0, busy_queue, calls_touching_every_key, contents, dump_all, job_states, restore_all, sibling
from redis.cluster import key_slot

from pyqueue import Job, NewJob, Outcome, Queue
from pyqueue.protocol.keys import ROLES
from pyqueue.drivers.scripts import SCRIPT_KEYS, lua_dir
from pyqueue.drivers.queue import transport_of


class Walk:
    """A seeded random walk over every transition, recording what the answers promise."""

    def __init__(self, q: Queue, seed: int) -> None:
        self.q, self.rng, self.now = q, random.Random(seed), T0
        self.held: list[Job] = []
        self.enqueued: set[str] = set()
        self.acked_ok: Counter[str] = Counter()
        self.max_attempt_seen: dict[str, int] = {}

    def step(self) -> None:
        q, rng = self.q, self.rng
        op = rng.choice(["enqueue", "enqueue", "lease", "lease", "ack", "ack_and_lease", "nack", "extend",
                         "release", "clock", "promote", "replay"])
        if op == "enqueue":
            batch = [NewJob(rng.choice([b"", b"\xff", b"p" * rng.randint(0, 50)]), job_id=f"j{rng.randint(0, 40)}",
                            delay_ms=rng.choice([0, 0, 5, 50]), max_attempts=rng.randint(1, 4))
                     for _ in range(rng.randint(1, 3))]
            for item, e in zip(batch, q.enqueue_many(batch, now_ms=self.now)):
                if e.added:
                    self.enqueued.add(e.job_id)
        elif op == "lease":
            self.took(q.lease(lease_ms=rng.choice([1, 20, 100]), count=rng.randint(1, 3), now_ms=self.now))
        elif op in ("ack", "ack_and_lease", "nack", "release", "extend") and self.held:
            job = self.held.pop(rng.randrange(len(self.held)))
            if op == "ack":
                self.answered(job, q.ack(job))
            elif op == "ack_and_lease":
                outcome, jobs = q.ack_and_lease(job, lease_ms=rng.choice([1, 50]), now_ms=self.now)
                self.answered(job, outcome)
                self.took(jobs)
            elif op == "nack":
                q.nack(job, "err", delay_ms=rng.choice([None, 0, 10]), backoff_base_ms=5, now_ms=self.now)
            elif op == "release":
                q.release([job])
            else:
                q.extend([job], rng.choice([1, 100]), now_ms=self.now)
                self.held.append(job)
        elif op == "clock":
            self.now += rng.choice([0, 1, 10, 60, 200])
        elif op == "promote":
            q.promote(limit=rng.randint(1, 5), now_ms=self.now)
        elif op == "replay":
            ids = [d.id for d in q.dead_list(limit=rng.randint(1, 3)).jobs]
            q.dead_replay(ids, now_ms=self.now)
            for job_id in ids:  # a replayed job starts counting attempts again
                self.max_attempt_seen.pop(job_id, None)

    def took(self, jobs: list[Job]) -> None:
        for job in jobs:
            assert job.attempt >= self.max_attempt_seen.get(job.id, 0), "attempts went down"
            self.max_attempt_seen[job.id] = job.attempt
        self.held += jobs

    def answered(self, job: Job, outcome: Outcome) -> None:
        if outcome:
            self.acked_ok[job.id] += 1
            self.max_attempt_seen.pop(job.id, None)  # the id may be enqueued again: a new job

    def drain(self) -> None:
        """Run every remaining job to an end: lease, ack; let clocks pass for the rest."""
        for _ in range(10_000):
            self.now += 1_000_000  # past every delay and deadline
            jobs = self.q.lease(count=100, now_ms=self.now)
            if not jobs and self.q.stats(now_ms=self.now).scheduled == 0:
                return
            for job in jobs:
                self.answered(job, self.q.ack(job))
        pytest.fail("drain did not finish")


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_single_state_every_job_is_in_exactly_one_state(q: Queue, r: redis.Redis, seed: int) -> None:
    walk = Walk(q, seed)
    for _ in range(150):
        walk.step()
        for job_id, states in job_states(r, q).items():
            assert len(states) == 1, f"{job_id} is in {states}"


@pytest.mark.parametrize("seed", SEEDS)
def test_no_loss_every_enqueued_job_is_eventually_acked_or_dead(q: Queue, r: redis.Redis, seed: int) -> None:
    walk = Walk(q, seed)
    for _ in range(150):
        walk.step()
    walk.drain()
    dead = {d.id for d in q.dead_list(limit=1000).jobs}
    # An id may be enqueued again after its ack: each ack answer ends one life of the id.
    assert walk.enqueued <= set(walk.acked_ok) | dead
    assert r.llen(q.spec.keys.ready) == 0 and r.zcard(q.spec.keys.leased) == 0 and r.zcard(q.spec.keys.scheduled) == 0
    assert set(k.decode() for k in r.hkeys(q.spec.keys.jobs)) == dead


@pytest.mark.parametrize("seed", SEEDS)
def test_fencing_no_job_ever_has_two_valid_leases(q: Queue, r: redis.Redis, seed: int) -> None:
    walk = Walk(q, seed)
    for _ in range(150):
        walk.step()
        leased_ids = [m.decode().split("|", 4)[4] for m in r.zrange(q.spec.keys.leased, 0, -1)]
        assert len(leased_ids) == len(set(leased_ids))


def test_fencing_a_stale_fence_changes_nothing_in_any_fenced_call(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", max_attempts=5, now_ms=T0)
    (old,) = q.lease(lease_ms=1, now_ms=T0)
    (new,) = q.lease(now_ms=T0 + 100)
    assert new.fence > old.fence
    before = dump_all(r)
    assert q.ack(old) is Outcome.STALE
    assert q.nack(old, now_ms=T0 + 100).outcome is Outcome.STALE
    assert q.extend([old], 10_000, now_ms=T0 + 100)[0].outcome is Outcome.STALE
    assert q.release([old]) == [Outcome.STALE]
    assert q.ack_and_lease(old, count=0, now_ms=T0 + 100)[0] is Outcome.STALE
    assert dump_all(r) == before


@pytest.mark.parametrize("seed", SEEDS)
def test_exactly_once_ack_answer_ok_at_most_once_per_life_of_a_job(q: Queue, seed: int) -> None:
    walk = Walk(q, seed)
    for _ in range(150):
        walk.step()
    walk.drain()
    stats = q.stats(now_ms=walk.now)
    assert sum(walk.acked_ok.values()) == stats.acked  # every OK is one ack, counted once


def test_exactly_once_ack_answer_under_concurrent_acks_of_one_receipt(q: Queue) -> None:
    q.enqueue_many([b"x"] * 20)
    jobs = q.lease(count=20)
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def hammer() -> None:
        for job in jobs:
            outcome = q.ack(job)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(Outcome.OK) == 20 and outcomes.count(Outcome.GONE) == 100


def test_exactly_once_ack_answer_when_two_workers_hold_the_same_job_in_turn(q: Queue) -> None:
    q.enqueue(b"x", now_ms=T0)
    (a,) = q.lease(lease_ms=10, now_ms=T0)
    (b,) = q.lease(lease_ms=10, now_ms=T0 + 100)
    assert [q.ack(b), q.ack(a), q.ack(b)] == [Outcome.OK, Outcome.GONE, Outcome.GONE]


@pytest.mark.parametrize("role", [role for role in SCRIPT_KEYS["lease"]
                                  if role not in ("steps", "waiting", "expires", "expired", "keyed", "sequenced",
                                                  "windows", "index")])
def test_check_before_write_a_failing_call_wrote_nothing(q: Queue, r: redis.Redis, role: str) -> None:
    # The exhaustive table is in test_bad_input.py; this runs lease, the widest script,
    # with each of its keys broken (the tombstones' key only matters when it acks; the
    # durable-step keys only on a queue with step data: tests/test_steps.py; the expiry,
    # sequence and rate keys only on a queue that has them: tests/test_flow_control.py,
    # tests/test_rate_limits.py; `index` only on a queue with listed jobs:
    # tests/test_bad_input.py's index cases).
    handles = busy_queue(q, fair=role in ("meta", "gready", "ring", "groups"))
    script, args = calls_touching_every_key(q, handles)["ack_and_lease" if role == "done" else "lease"]
    r.delete(q.spec.keys.role(role))
    r.set(q.spec.keys.role(role), "planted")
    before = dump_all(r)
    with pytest.raises(redis.ResponseError):
        transport_of(q).run(script, q.spec.keys, args)
    assert dump_all(r) == before


VARIANTS = ["enqueue", "lease", "ack_and_lease", "ack", "nack_to_scheduled", "nack_to_dead", "nack_final", "extend",
            "release", "promote", "stats", "dead_list", "dead_replay", "dead_purge"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_replay_safety_sending_a_call_twice_has_the_effect_of_one(q: Queue, r: redis.Redis, variant: str) -> None:
    script, args = calls_touching_every_key(q, busy_queue(q))[variant]
    start = dump_all(r)
    first_reply = transport_of(q).run(script, q.spec.keys, args)
    once, once_counters = contents(r), r.hgetall(q.spec.keys.counters)
    restore_all(r, start)
    transport_of(q).run(script, q.spec.keys, args)
    replay_reply = transport_of(q).run(script, q.spec.keys, args)
    twice, twice_counters = contents(r), r.hgetall(q.spec.keys.counters)
    if variant == "enqueue":
        # The one difference: `duplicates` counts the re-sent jobs as duplicate attempts.
        counters = q.spec.keys.counters.encode()
        once.pop(counters), twice.pop(counters)
        assert int(twice_counters.pop(b"duplicates", 0)) == int(once_counters.pop(b"duplicates", 0)) + 2
        assert twice_counters == once_counters
    assert twice == once
    if variant == "lease":
        assert replay_reply == first_reply  # the same jobs, the same receipts


def test_one_clock_deadlines_come_from_the_server_time(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x")
    seconds, micros = r.time()
    before_ms = seconds * 1000 + micros // 1000
    (job,) = q.lease(lease_ms=60_000)
    seconds, micros = r.time()
    after_ms = seconds * 1000 + micros // 1000
    assert before_ms + 60_000 <= job.deadline_ms <= after_ms + 60_000


def test_one_clock_no_python_module_reads_the_wall_clock_for_queue_decisions() -> None:
    package = Path(__file__).resolve().parent.parent / "pyqueue"
    for path in package.glob("*.py"):
        text = path.read_text()
        assert "time.time()" not in text and "datetime.now" not in text, path


def test_bounded_work_one_call_reclaims_and_promotes_at_most_limit(q: Queue) -> None:
    for i in range(3):
        q.enqueue_many([b"x"] * 1000, now_ms=T0)
        q.lease(lease_ms=1, count=1000, now_ms=T0)
    q.enqueue_many([NewJob(b"s", delay_ms=1) for _ in range(500)], now_ms=T0)
    result = q.promote(limit=100, now_ms=T0 + 10)
    assert (result.promoted, result.reclaimed, result.more) == (100, 100, True)
    leased = q.lease_call(count=1, limit=50, now_ms=T0 + 100)
    assert len(leased.jobs) == 1
    stats = q.stats(now_ms=T0 + 100)
    assert stats.reclaimed == 150 and stats.promoted == 150


def test_bounded_work_no_script_scans_the_keyspace() -> None:
    zscan = re.compile(r"""redis\.call\(\s*['"]ZSCAN['"]""", re.I)
    # One key's ZSCAN only in the helper find_lease, whose loop stops at max_pages...
    helpers = "".join(p.read_text() for p in (lua_dir() / "include").glob("*.lua"))
    assert len(zscan.findall(helpers)) == 1 and "until cursor == '0' or pages == max_pages" in helpers
    for path in lua_dir().glob("*.lua"):
        body = path.read_text()
        assert not re.search(r"""redis\.call\(\s*['"](KEYS|SCAN|SSCAN|HGETALL|HKEYS|HVALS|SMEMBERS)['"]""",
                             body, re.I), path
        # One HSCAN: search.lua's chunks over every job, each call with a COUNT of at most
        # SCAN_MOST (a page of the one key it was given, never the keyspace).
        hscans = re.findall(r"""redis\.call\(\s*['"]HSCAN['"],\s*(\w+),[^)]*'COUNT',\s*(\w+)\)""", body, re.I)
        assert len(hscans) == len(re.findall(r"""['"]HSCAN['"]""", body, re.I)), f"{path}: an HSCAN without COUNT"
        assert not hscans or path.name == "search.lua" and hscans == [("jobs_key", "limit")], path
        if hscans:
            assert "math.min(chunk, SCAN_MOST - examined)" in body and "math.min(tonumber(n), SCAN_MOST)" in body
        if hscans:
            assert re.search(r"^local SCAN_MOST, LEASES_MOST = 2000, 10000$", body, re.M), f"{path}: SCAN_MOST"
        own = lua_build.outside(body)
        assert not zscan.search(own), f"{path}: ZSCAN outside find_lease"
        # ...and every call passes a page limit fixed in the script (get and cancel).
        for limit in re.findall(r"find_lease\([^)]*,\s*([^,)]+)\)", own):
            assert path.name in ("get.lua", "cancel.lua"), path
            assert re.fullmatch(r"[A-Z_]+( - [A-Z_]+)?", limit.strip()), f"{path}: find_lease page limit {limit}"
            for name in re.findall(r"[A-Z_]+", limit):
                assert re.search(rf"local [A-Z_, ]*\b{name}\b[A-Z_, ]* = [\d, ]+", own), f"{path}: {name} not a constant"
        assert not re.search(r"ZRANGE[A-Z]*['\"],[^)]*,\s*0,\s*-1", body), f"{path}: unbounded range"


def test_cluster_safe_every_key_of_a_queue_has_one_hash_slot(q: Queue) -> None:
    slots = {key_slot(key.encode()) for key in q.spec.keys.all()}
    assert len(slots) == 1
    assert all(key.startswith("pq:{q}:") for key in q.spec.keys.all())


def test_cluster_safe_scripts_only_touch_keys_passed_in_keys() -> None:
    for path in lua_dir().glob("*.lua"):
        body = path.read_text()
        key_names = set()
        for names, values in re.findall(r"^local ([\w, ]+) =\s*((?:KEYS\[\d+\],?\s*)+)$", body, re.M):
            key_names |= {n.strip() for n in names.split(",")}
        assert key_names, f"{path.name} names no KEYS"
        # The fair-scheduling keys are bound as one table, `local F = fair_keys(n)`, from KEYS.
        fair = {f"F.{role}" for role in ("meta", "gready", "ring", "groups")}
        if re.search(r"^local F = fair_keys\(\d+\)$", body, re.M):
            key_names |= fair
        # A script may gather its keys in a table K (`local K = { jobs = jobs_key, ... }`,
        # then `K.a, K.b = a_key, b_key`) for the helpers and steps that take it.
        for fields in re.findall(r"^local K = \{([^}]*)\}$", body, re.M):
            key_names |= {f"K.{f}" for f, v in re.findall(r"(\w+) = (\w+)", fields) if v in key_names}
        for targets, values in re.findall(r"^(K\.\w+(?:, K\.\w+)*) = (\w+(?:, \w+)*)$", body, re.M):
            key_names |= {t for t, v in zip(targets.split(", "), values.split(", ")) if v in key_names}
        # The helpers of lua/include/ take the keys they touch from their callers.
        start, end = lua_build.include_span(body)
        for match in re.finditer(r"redis\.call\(\s*'(\w+)',\s*([^,)]+)", body):
            command, first = match.groups()
            if command in ("TIME",):
                continue
            in_helper = start <= match.start() < end
            allowed = key_names | {"key"}
            if in_helper:
                # A helper touches only keys its caller passes: a parameter named like a
                # key, or a field of a table of the caller's keys (K, F).
                defs = re.findall(r"^local function \w+\(([^)]*)\)", body[start:match.start()], re.M)
                params = {n.strip() for n in defs[-1].split(",")} if defs else set()
                allowed = {n for n in params if n == "key" or n.endswith("_key")} | fair
            assert first.strip() in allowed or in_helper and re.fullmatch(r"K\.\w+", first.strip()), (
                f"{path.name}: {match.group(0)}")


def undeclared_assignments(code: str) -> list[str]:
    """Plain-name assignment targets never declared local, a parameter or a loop variable.

    Scope-insensitive (a name declared anywhere earlier counts), which is enough to catch
    the mistake that matters: a forgotten `local`.
    """
    declared: set[str] = set()
    bad = []
    depth = 0  # open table constructors: `name = value` inside one is a field, not an assignment
    for line in code.splitlines():
        line = line.split("--", 1)[0]
        bare = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", line)  # braces in strings do not count
        inside, depth = depth > 0, depth + bare.count("{") - bare.count("}")
        if inside:
            continue
        for names in re.findall(r"\blocal\s+function\s+(\w+)\s*\(([^)]*)\)", line):
            declared |= {names[0], *(n.strip() for n in names[1].split(",") if n.strip())}
        for params in re.findall(r"\bfunction\s*\(([^)]*)\)", line):
            declared |= {n.strip() for n in params.split(",") if n.strip()}
        for names in re.findall(r"\blocal\s+(?!function)([\w\s,]+?)(?:=|$)", line):
            declared |= {n.strip() for n in names.split(",") if n.strip()}
        for names in re.findall(r"\bfor\s+([\w\s,]+?)\s+(?:=|in)\b", line):
            declared |= {n.strip() for n in names.split(",")}
        m = re.match(r"^\s*(?!local\b)([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=(?!=)", line)
        if m:
            bad += [n.strip() for n in m.group(1).split(",") if n.strip() not in declared]
    return bad


def test_the_global_checker_catches_a_missing_local() -> None:
    assert undeclared_assignments("local a = 1\na = 2\nfor i = 1, 2 do end\nb, a = 1, 2\n") == ["b"]


@pytest.mark.parametrize("path", sorted(lua_dir().glob("*.lua")), ids=lambda p: p.name)
def test_portable_scripts_use_lua51_base_only_and_no_globals(path: Path) -> None:
    body = path.read_text()
    assert not body.startswith("#!"), "no shebang: fakeredis and older servers reject it"
    for forbidden in (r"cmsgpack", r"\bbit\.", r"\bstruct\.", r"redis\.setresp", r"redis\.set_repl",
                      r"math\.random", r"\brequire\s*[(\'\"]", r"loadstring", r"dofile", r"\bos\.", r"\bio\."):
        assert not re.search(forbidden, body), forbidden
    code = body.split("\n]]\n", 1)[1]  # after the header comment
    assert undeclared_assignments(code) == [], "assignments to globals (Redis forbids creating globals)"
    assert set(SCRIPT_KEYS) >= {path.stem}


def test_every_lua_file_has_a_driver_wrapper() -> None:
    assert {p.stem for p in lua_dir().glob("*.lua")} == set(SCRIPT_KEYS)


def test_the_acked_counter_is_derived_consistently(q: Queue, r: redis.Redis) -> None:
    walk = Walk(q, 99)
    for _ in range(200):
        walk.step()
    s = q.stats(now_ms=walk.now)
    assert s.acked == s.leased_total - s.nacked - s.reclaimed - s.scrubbed - s.released - s.leased
    assert s.acked == sum(walk.acked_ok.values())


# -- indexes (lua/README.md section 2.8) ---------------------------------------------------


def index_members(job_id: str, entry: str) -> set[bytes]:
    """The `index` members an entry "x:<id>" = "<enqueued_ms>\\n<group>\\n<task>" names."""
    at, group, task = entry.split("\n", 2)
    assert at.isdigit(), entry
    return {f"{kind}\n{value}\n{int(at):015d}\n{job_id}".encode() for kind, value in (("t", task), ("g", group))
            if value}


def check_indexes(r: redis.Redis, q: Queue) -> None:
    """An `index` member exists exactly when its job exists with an entry `x:<id>` that
    names it; every entry is a live job's, sent when its record says, and names at least
    one member; every score is 0."""
    k = q.spec.keys
    records = {i.decode(): v for i, v in r.hgetall(k.jobs).items()}
    entries = {f.decode()[2:]: v.decode() for f, v in r.hgetall(k.keyed).items() if f.startswith(b"x:")}
    assert set(entries) <= set(records), f"index entries of jobs that are gone: {set(entries) - set(records)}"
    expected: set[bytes] = set()
    for job_id, entry in entries.items():
        named = index_members(job_id, entry)
        assert named, f"{job_id}: an entry that names no member: {entry!r}"
        sent = re.match(rb"^\d+\|\d+\|\d+:(\d+)\|", records[job_id])
        assert sent and sent.group(1).decode() == entry.split("\n", 1)[0], (job_id, records[job_id], entry)
        expected |= named
    members = r.zrange(k.index, 0, -1, withscores=True)
    assert {score for _, score in members} <= {0.0}
    assert {m for m, _ in members} == expected, (
        f"members without an entry: {sorted({m for m, _ in members} - expected)}, "
        f"entries without their members: {sorted(expected - {m for m, _ in members})}")


class IndexWalk(Walk):
    """A walk of a queue that keeps indexes: jobs with and without task names and
    groups, debounced into their keys' jobs, expiring, cancelled, purged, replayed and
    made due now, besides every transition of :class:`Walk`."""

    def step(self) -> None:
        q, rng = self.q, self.rng
        op = rng.choice(["send", "send", "walk", "walk", "walk", "cancel", "purge", "promote_now", "ack_result",
                         "search"])
        if op == "send":
            batch = []
            for _ in range(rng.randint(1, 3)):
                debounced = rng.random() < 0.2
                delay = 0 if debounced else rng.choice([0, 0, 5, 50])
                batch.append(NewJob(b"p", job_id=f"j{rng.randint(0, 40)}", task=rng.choice([None, "a", "b"]),
                                    group=rng.choice([None, "g1", "g2"]), max_attempts=rng.randint(1, 3),
                                    delay_ms=delay, debounce_ms=50 if debounced else None,
                                    key=f"k{rng.randint(0, 2)}" if debounced else None,
                                    expires_ms=rng.choice([None, None, 30]) if delay == 0 and not debounced else None))
            for e in q.enqueue_many(batch, now_ms=self.now):
                if e.added:
                    self.enqueued.add(e.job_id)
        elif op == "walk":
            super().step()
        elif op == "cancel":
            q.cancel(f"j{rng.randint(0, 40)}", now_ms=self.now)
        elif op == "purge":
            q.dead_purge([d.id for d in q.dead_list(limit=rng.randint(1, 3)).jobs])
        elif op == "promote_now":
            q.promote_now([f"j{rng.randint(0, 40)}" for _ in range(3)], now_ms=self.now)
        elif op == "ack_result" and self.held:
            job = self.held.pop(rng.randrange(len(self.held)))
            self.answered(job, q.ack_result(job, b"r", now_ms=self.now))
        elif op == "search":
            page = q.search(task=rng.choice(["a", "b"]), now_ms=self.now)
            assert all(j.task == page.jobs[0].task for j in page.jobs)


@pytest.mark.parametrize("seed", SEEDS)
def test_indexes_a_member_exists_exactly_while_its_job_does_with_its_entry(q: Queue, r: redis.Redis, seed: int) -> None:
    q.set_indexes(True, now_ms=T0)
    walk = IndexWalk(q, seed)
    most = 0
    for _ in range(200):
        walk.step()
        check_indexes(r, q)
        most = max(most, r.zcard(q.spec.keys.index))
        for job_id, states in job_states(r, q).items():
            assert len(states) == 1, f"{job_id} is in {states}"
    assert most >= 5, "the walk listed (almost) nothing"
    walk.drain()
    for job_id in [d.id for d in q.dead_list(limit=1000).jobs]:
        assert q.dead_purge([job_id]) == 1
        check_indexes(r, q)
    assert r.zcard(q.spec.keys.index) == 0 and not [f for f in r.hkeys(q.spec.keys.keyed) if f.startswith(b"x:")]



# -- results budgets (lua/README.md section 2, results) -------------------------------------


def check_result_sizes(r: redis.Redis, q: Queue) -> dict[str, int]:
    """`result_bytes` is the sum of the sizes `rb:<id>` in `keyed`, and every `rb:<id>`
    is the size of a result still kept: exactly the `HSTRLEN` of its field in `results`.
    Answers the sizes."""
    k = q.spec.keys
    sizes = {f.decode()[3:]: int(v) for f, v in r.hgetall(k.keyed).items() if f.startswith(b"rb:")}
    assert int(r.hget(k.counters, "result_bytes") or 0) == sum(sizes.values()), sizes
    for job_id, size in sizes.items():
        assert r.hstrlen(k.results, job_id) == size, f"{job_id}: size {size}, result {r.hget(k.results, job_id)!r}"
    return sizes


class ResultWalk(Walk):
    """A walk of a queue whose results budget is set, lowered, raised and lifted, acking
    with results of every size, some kept briefly, a few at most; its ids (a few, their
    tombstones short) come back once done, so their results are replaced. Besides every
    transition of :class:`Walk`."""

    def step(self) -> None:
        q, rng = self.q, self.rng
        op = rng.choice(["walk", "send", "send", "take", "take", "ack_result", "ack_result", "ack_result_many",
                         "budget", "tick"])
        if op == "walk":
            super().step()
        elif op == "send":
            batch = [NewJob(b"r", job_id=f"r{rng.randint(0, 7)}") for _ in range(rng.randint(1, 3))]
            for e in q.enqueue_many(batch, now_ms=self.now):
                if e.added:
                    self.enqueued.add(e.job_id)
        elif op == "take":
            self.took(q.lease(lease_ms=10_000, count=rng.randint(1, 3), now_ms=self.now))
        elif op == "budget":
            q.set_result_budget(rng.choice([None, 0, 60, 200, 1000]))
        elif op == "tick":
            self.now += rng.choice([5, 30])
        elif op.startswith("ack_result") and self.held:
            n = 1 if op == "ack_result" else rng.randint(1, 3)
            jobs = [self.held.pop(rng.randrange(len(self.held))) for _ in range(min(len(self.held), n))]
            values = [b"v" * rng.choice([0, 5, 40, 150]) for _ in jobs]
            outcomes = q.ack_result_many(jobs, values, result_ttl_ms=rng.choice([30, 500, 100_000]),
                                         max_results=rng.choice([3, 8, 100]), now_ms=self.now)
            for job, outcome in zip(jobs, outcomes):
                self.answered(job, outcome)


@pytest.mark.parametrize("seed", SEEDS)
def test_results_budget_the_sum_is_the_kept_results_sizes(q: Queue, r: redis.Redis, seed: int) -> None:
    walk = ResultWalk(Queue(q.name, r, keep_done_ms=20), seed)  # ids come back soon: results are replaced
    most = 0
    for _ in range(300):
        walk.step()
        most = max(most, len(check_result_sizes(r, q)))
        for job_id, states in job_states(r, q).items():
            assert len(states) == 1, f"{job_id} is in {states}"
    assert most >= 3, "the walk sized (almost) no result"


# -- tombstone limits (lua/README.md section 2, tombstones) ---------------------------------


class TombstoneWalk(Walk):
    """A walk of a queue whose tombstone limit is set, lowered, raised and lifted, while
    jobs end every way that leaves a tombstone: acks (some by an acker whose tombstones
    expire within 50 ms, so they are trimmed as expired or are the earliest-expiring),
    ack-and-lease, ack_result, cancels and expiries. Its ids come back, and are added
    again once their tombstones went. Besides every transition of :class:`Walk`.
    ``ended`` counts the tombstones the last step's acks and cancels wrote."""

    def __init__(self, q: Queue, seed: int) -> None:
        super().__init__(q, seed)
        self.brief = sibling(q, q.name, keep_done_ms=50)
        self.limit: int | None = None
        self.ended = 0

    def answered(self, job: Job, outcome: Outcome) -> None:
        super().answered(job, outcome)
        self.ended += bool(outcome)

    def step(self) -> None:
        q, rng = self.q, self.rng
        self.ended = 0
        op = rng.choice(["walk", "walk", "send", "send", "take", "ack", "ack", "ack_result", "cancel", "limit",
                         "tick"])
        if op == "walk":
            super().step()
        elif op == "send":
            batch = [NewJob(b"t", job_id=f"t{rng.randint(0, 30)}", expires_ms=rng.choice([None, None, 20]))
                     for _ in range(rng.randint(1, 4))]
            for e in q.enqueue_many(batch, now_ms=self.now):
                if e.added:
                    self.enqueued.add(e.job_id)
        elif op == "take":
            self.took(q.lease(lease_ms=10_000, count=rng.randint(1, 4), now_ms=self.now))
        elif op in ("ack", "ack_result") and self.held:
            jobs = [self.held.pop(rng.randrange(len(self.held))) for _ in range(min(len(self.held), rng.randint(1, 3)))]
            acker = rng.choice([q, self.brief])
            if op == "ack":
                outcomes = acker.ack_many(jobs, now_ms=self.now)
            else:
                outcomes = acker.ack_result_many(jobs, [b"r"] * len(jobs), now_ms=self.now)
            for job, outcome in zip(jobs, outcomes):
                self.answered(job, outcome)
        elif op == "cancel":
            state = q.cancel(f"t{rng.randint(0, 30)}", now_ms=self.now).state
            self.ended += state not in ("done", "unknown")
        elif op == "limit":
            self.limit = rng.choice([None, 1, 3, 8, 20])
            q.set_tombstone_limit(self.limit)
        elif op == "tick":
            self.now += rng.choice([5, 30, 100])


@pytest.mark.parametrize("seed", SEEDS)
def test_tombstone_limit_done_never_grows_past_it_and_shrinks_towards_a_lowered_one(
    q: Queue, r: redis.Redis, seed: int
) -> None:
    walk = TombstoneWalk(q, seed)
    full = 0
    for _ in range(300):
        before = r.zcard(q.spec.keys.done)
        walk.step()
        after, limit = r.zcard(q.spec.keys.done), walk.limit
        if limit is None:
            continue
        # Within the limit it stays within; past it (just lowered) it never grows.
        assert after <= max(limit, before), (before, after, limit)
        # A call that ends n jobs past the limit deletes up to n + 10: `done` comes down
        # by 10 a call, or to the limit.
        if walk.ended and before > limit:
            assert after <= max(limit, before - 10), (before, after, limit, walk.ended)
        full += after == limit
        for job_id, states in job_states(r, q).items():
            assert len(states) == 1, f"{job_id} is in {states}"
    assert full >= 10, "the walk (almost) never filled its tombstone limit"
