"""A redis-server SIGKILLed under load and restarted on the same directory
(``appendonly yes``, ``appendfsync always``): no acknowledged write is lost, and the
driver recovers on its own (DESIGN §3.2, §7).

Each trial runs producers (enqueue with client-chosen ids) and consumers (lease with a
call token, then ack) on ONE shared :class:`Queue`, kills the server at a random
moment, restarts it on the same directory and socket path, lets the same threads and
the same ``Queue`` go on, and then checks what the clients recorded (Jepsen style):

* an enqueue that answered is durable: each of its ids is in the queue (in some state)
  or was acked;
* an ack that answered ``ok`` is durable: the job is gone and never leased again; an
  ack of a lease we hold that answers ``gone`` was applied by an earlier send whose
  reply was lost (possibly inside redis-py's own retries), and counts as *unknown*;
* a call in flight at the kill raises :class:`~pyqueue.OutcomeUnknown` and is recorded
  as *unknown*: it may or may not have applied. Every client re-sends the same call
  (same ids, same call token, same receipts) until it answers, which is safe: enqueue,
  lease and ack are replay-safe. An enqueue re-sent after a consumer acked the jobs its
  lost send added finds their tombstones and adds nothing: a job acked ``ok`` that is
  leased again, or left in the queue, is a violation;
* the restarted server has an empty script cache: the same ``Queue`` meets ``NOSCRIPT``
  and reloads its scripts without help (counted in the server's error stats).

CI runs 2 trials; ``PYQUEUE_DEEP=1`` runs ``PYQUEUE_DEEP_SERVER_TRIALS`` (default 20).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from conftest import require_redis_server
from crash_harness import RedisProcess, queue_states

from pyqueue import Job, NewJob, Outcome, OutcomeUnknown, Queue
from pyqueue.drivers.queue import transport_of

DEEP = os.environ.get("PYQUEUE_DEEP") == "1"
TRIALS = int(os.environ.get("PYQUEUE_DEEP_SERVER_TRIALS", "20")) if DEEP else 2
PRODUCERS, CONSUMERS = 2, 2
BATCH = 10
LEASE_MS = 10_000  # longer than any trial's downtime: no lease expires during a trial

T = TypeVar("T")


@dataclasses.dataclass
class Record:
    """What the clients saw, shared by the load threads (guarded by ``lock``)."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    #: ids of enqueue calls that answered (added, or a duplicate of our own earlier send)
    confirmed: set[str] = dataclasses.field(default_factory=set)
    #: ids of enqueue calls that never answered (the load stopped while re-sending)
    enqueue_unknown: set[str] = dataclasses.field(default_factory=set)
    #: jobs a re-sent enqueue answered as duplicates (its lost send had added them)
    resent_duplicates: int = 0
    #: id -> how many ack calls answered ok for it
    acked_ok: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: ids whose ack answered 'gone' (an earlier send of the same ack applied and its
    #: reply was lost), or whose ack never answered
    acked_unknown: set[str] = dataclasses.field(default_factory=set)
    #: acks answered 'gone' with no OutcomeUnknown raised: redis-py re-sent them itself
    hidden_retries: int = 0
    #: calls that raised OutcomeUnknown, by kind
    unknown: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: calls that answered after the restart, by thread
    answered_after_restart: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    violations: list[str] = dataclasses.field(default_factory=list)


class Load:
    """Producer and consumer threads on one shared Queue, recording every outcome."""

    def __init__(self, q: Queue, seed: int) -> None:
        self.q = q
        self.record = Record()
        self.stop = threading.Event()
        self.restarted = threading.Event()
        self.seed = seed
        self.threads = [threading.Thread(target=self._guard, args=(self._produce, f"producer-{i}"), daemon=True)
                        for i in range(PRODUCERS)]
        self.threads += [threading.Thread(target=self._guard, args=(self._consume, f"consumer-{i}"), daemon=True)
                         for i in range(CONSUMERS)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
            assert not t.is_alive(), f"{t.name} did not stop"

    def _guard(self, body: Callable[[str], None], name: str) -> None:
        try:
            body(name)
        except Exception as exc:  # a load thread must never die silently
            with self.record.lock:
                self.record.violations.append(f"{name} died: {type(exc).__name__}: {exc}")

    def _until_answered(self, name: str, kind: str, call: Callable[[], T]) -> tuple[T | None, bool]:
        """Send ``call`` until it answers; re-sending is safe (same arguments). Returns the
        answer (None if the load stopped first) and whether any send was unknown."""
        unknown = False
        delay = 0.01
        while True:
            try:
                answer = call()
            except OutcomeUnknown:
                unknown = True
                with self.record.lock:
                    self.record.unknown[kind] += 1
                if self.stop.wait(delay):
                    return None, True
                delay = min(delay * 2, 0.2)
                continue
            if self.restarted.is_set():
                with self.record.lock:
                    self.record.answered_after_restart[name] += 1
            return answer, unknown

    def _produce(self, name: str) -> None:
        rng = random.Random(f"{self.seed}-{name}")
        n = 0
        while not self.stop.is_set():
            ids = [f"{name}-{n + i}" for i in range(rng.randint(1, BATCH))]
            n += len(ids)
            jobs = [NewJob(b"x", job_id=i) for i in ids]
            with self.record.lock:
                self.record.enqueue_unknown.update(ids)
            added, unknown = self._until_answered(name, "enqueue", lambda: self.q.enqueue_many(jobs))
            if added is None:
                return
            with self.record.lock:
                self.record.enqueue_unknown.difference_update(ids)
                self.record.confirmed.update(ids)
                if unknown:
                    self.record.resent_duplicates += sum(not e.added for e in added)
            time.sleep(rng.uniform(0, 0.005))

    def _consume(self, name: str) -> None:
        rng = random.Random(f"{self.seed}-{name}")
        while not self.stop.is_set():
            call = secrets.token_hex(8)  # one token per logical call, re-sent on retry
            count = rng.randint(1, 5)
            leased, _ = self._until_answered(
                name, "lease", lambda: self.q.lease_call(count=count, lease_ms=LEASE_MS, call=call))
            if leased is None:
                return
            jobs = leased.jobs
            with self.record.lock:
                again = [j.id for j in jobs if self.record.acked_ok[j.id] or j.id in self.record.acked_unknown]
                if again:
                    self.record.violations.append(f"{name} leased acked jobs again: {again}")
            if not jobs:
                time.sleep(0.005)
                continue
            self._ack(name, jobs)

    def _ack(self, name: str, jobs: list[Job]) -> None:
        outcomes, unknown = self._until_answered(name, "ack", lambda: self.q.ack_many(jobs))
        with self.record.lock:
            if outcomes is None:
                self.record.acked_unknown.update(j.id for j in jobs)
                return
            for job, outcome in zip(jobs, outcomes):
                if outcome is Outcome.OK:
                    self.record.acked_ok[job.id] += 1
                elif outcome is Outcome.GONE:
                    # Nobody else can ack a lease we hold (no lease expires in a trial):
                    # an earlier send of this same ack applied and its reply was lost,
                    # either visibly (OutcomeUnknown, then our re-send) or inside
                    # redis-py's own retries, which hide the lost reply and return the
                    # re-send's answer, 'gone' (documented on Outcome.GONE).
                    self.record.acked_unknown.add(job.id)
                    if not unknown:
                        self.record.hidden_retries += 1
                else:
                    self.record.violations.append(f"{name}: ack of a held lease of {job.id} answered {outcome}")


@pytest.fixture
def workdir() -> Iterator[Path]:
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pyqueue-aof-") as tmp:
        yield Path(tmp)


def noscript_errors(server: RedisProcess) -> int:
    with server.client() as c:
        stats = c.info("errorstats")
    return int(stats.get("errorstat_NOSCRIPT", {}).get("count", 0))


@dataclasses.dataclass(frozen=True)
class Figures:
    """One trial's counts, for the summary line."""

    confirmed: int
    present: int
    acked_ok: int
    acked_unknown: int
    unknown_calls: dict[str, int]
    hidden_retries: int
    noscript: int
    resent_duplicates: int


def run_trial(workdir: Path, seed: int) -> Figures:
    """One kill and restart under load; returns figures, raises AssertionError on a
    violation."""
    rng = random.Random(seed)
    with RedisProcess(workdir, appendonly=True) as server:
        q = Queue.from_url(server.url, "aof")
        try:
            with Load(q, seed) as load:
                time.sleep(rng.uniform(0.3, 1.5))  # a random moment under load
                with server.client() as c:
                    applied_before = c.info("stats")["total_commands_processed"]
                server.kill()
                time.sleep(rng.uniform(0.0, 0.3))
                server.restart()
                load.restarted.set()
                deadline = time.monotonic() + 20
                time.sleep(0.5)
                # The same Queue object keeps working: every thread gets answers again.
                while len(load.record.answered_after_restart) < PRODUCERS + CONSUMERS:
                    answered = dict(load.record.answered_after_restart)
                    assert time.monotonic() < deadline, f"only these threads got answers after the restart: {answered}"
                    time.sleep(0.05)
            rec = load.record
            assert rec.violations == [], rec.violations
            noscript = noscript_errors(server)
            assert noscript >= 1, "the restarted server never answered NOSCRIPT: was its script cache empty?"
            with server.client() as c:
                states = queue_states(c, q)
            stats = q.stats()
        finally:
            transport_of(q).client.close()

    acked_ok = set(rec.acked_ok)
    twice = [i for i, n in rec.acked_ok.items() if n > 1]
    assert twice == [], f"ack answered ok twice for {twice}"
    lost = rec.confirmed - set(states) - acked_ok - rec.acked_unknown
    assert lost == set(), f"acknowledged enqueues lost: {sorted(lost)[:10]}"
    resurrected = acked_ok & set(states)
    assert resurrected == set(), f"jobs acked ok are back in the queue: {sorted(resurrected)[:10]}"
    stray = set(states) - rec.confirmed - rec.enqueue_unknown
    assert stray == set(), f"jobs nobody enqueued: {sorted(stray)[:10]}"
    not_single = {i: s for i, s in states.items() if len(s) != 1}
    assert not_single == {}, f"jobs not in exactly one state: {dict(list(not_single.items())[:10])}"
    # The server's derived ack count lies between the acks we know and those we might not.
    assert len(acked_ok) <= stats.acked <= len(acked_ok) + len(rec.acked_unknown), (stats, len(acked_ok))
    assert applied_before > 0 and rec.confirmed and acked_ok, "the load did nothing before the kill"
    return Figures(len(rec.confirmed), len(states), len(acked_ok), len(rec.acked_unknown), dict(rec.unknown),
                   rec.hidden_retries, noscript, rec.resent_duplicates)


@pytest.mark.timeout(120 + 30 * TRIALS if DEEP else 120)
def test_a_server_killed_under_load_keeps_every_acknowledged_enqueue_and_ack_and_the_driver_recovers(
    workdir: Path,
) -> None:
    figures = []
    for trial in range(TRIALS):
        trial_dir = workdir / f"trial-{trial}"
        trial_dir.mkdir()
        seed = random.randrange(2**32)
        try:
            figures.append(run_trial(trial_dir, seed))
        except AssertionError as exc:
            raise AssertionError(f"trial {trial} (seed {seed}): {exc}") from exc
    unknown: collections.Counter[str] = collections.Counter()
    for f in figures:
        unknown.update(f.unknown_calls)
    print(f"\nserver crash: {TRIALS} trials; enqueues confirmed {sum(f.confirmed for f in figures)} (left in the "
          f"queue {sum(f.present for f in figures)}), acks ok {sum(f.acked_ok for f in figures)}, acks unknown "
          f"{sum(f.acked_unknown for f in figures)} (of which answered 'gone' after redis-py's own re-send "
          f"{sum(f.hidden_retries for f in figures)}); calls with an unknown outcome {dict(unknown)} (re-sent "
          f"enqueues that found their jobs already added: {sum(f.resent_duplicates for f in figures)} jobs); NOSCRIPT "
          f"answers after restarts {sum(f.noscript for f in figures)}")
