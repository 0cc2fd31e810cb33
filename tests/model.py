"""A plain-Python model of one queue and one service namespace, and a Hypothesis state
machine that drives the real scripts through the driver and compares after every step.

The model follows the scripts' documented semantics exactly (lua/README.md and the
script headers), including the parts that are easy to get approximately right:

* when ``lease`` runs maintenance (READY shorter than ``count``, or ``now_ms`` at or past
  ``next_maintenance_ms``), with the bounded ``limit``, and when it sets
  ``next_maintenance_ms`` (= now + 50 ms, only by a call that also wrote something else);
* the order of READY after maintenance (reclaimed leases at the head, earliest deadline
  first, promoted jobs at the tail) and of every sorted set (score, then member bytes);
* backoff with its fence-derived jitter, the wake marker, ``next_due_ms``, every counter.

After every step :meth:`LifecycleMachine.everything_agrees` compares the whole keyspace
with the model and checks the invariants of DESIGN §3 that a single process can observe:
single state, at most one valid lease per job, the ack answer ``ok`` at most once per job
life and exactly when the model says the receipt is current, attempts that never go
down within a job's life, fences that strictly increase, and ``stats`` (whose ``acked`` is
derived) equal to the model's counts.

``tests/test_model.py`` runs the machine on both backends; ``tests/test_mutations.py``
runs it against deliberately broken copies of ``lua/`` and expects it to fail.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from pyqueue import EventsSetting, Job, JobInfo, JobResult, NewJob, Outcome, Queue, ServiceLost
from pyqueue.protocol.core import decode_result, encode_result
from pyqueue.protocol.keys import QueueKeys, ServiceKeys
from pyqueue.protocol.models import (
    DeadJob,
    DeadPage,
    Enqueued,
    Extended,
    GroupInfo,
    GroupsPage,
    JobEntry,
    JobPage,
    Leased,
    Nacked,
    Peeked,
    Promoted,
    Scrubbed,
    Stats,
)
from pyqueue.drivers.queue import DEFAULT_MAINTENANCE_LIMIT, DEFAULT_MAX_ATTEMPTS
from pyqueue.drivers.scripts import Scripts
from pyqueue.ops.service import DEAD_LIMIT, DEFAULT_EXPIRE_MS, GC_LIMIT, Service, Services
from pyqueue.protocol.verbs.flows import WAIT_DUE_MS
from pyqueue.protocol.verbs.steps import JobSteps, parse_steps
from pyqueue.drivers.queue import check_partitions

#: The model's clock starts at a realistic server time (2023-11-14, in ms since the
#: epoch); steps go forwards and backwards from it.
T0 = 1_700_000_000_000
#: lease.lua / promote.lua: maintenance runs at most this often while READY is busy.
MAINTENANCE_INTERVAL_MS = 50
#: ack.lua / lease.lua trim expired tombstones once at least this many have expired.
TRIM_BATCH = 10
#: An error text in an event is cut to this many bytes (the helper EVENT_TEXT_BYTES).
EVENT_TEXT_BYTES = 1024
#: The machines' event stream bound (every machine opts its queue in).
EVENTS_BOUND = 30
#: The most expired tombstones a lease that acks nothing trims (the helper MAX_BATCH).
MAX_BATCH = 1000
#: ack_result.lua: the finished stream keeps this many entries.
STREAM_LENGTH = 1000
#: The helper READY positions of jobs with meta: tail = POS_MID + seq, head = POS_MID - seq.
POS_MID = 5_000_000_000_000_000
#: lease.lua's fair pick drops or parks at most this many ring entries beyond `count`.
STALE_BUDGET = 100
#: keep_done_ms of each worker's Queue: none, short, the default (expiry at the clock
#: steps the machine takes is where `<` versus `<=` bugs live).
KEEP_DONE_MS = {"solo": 50, "ns.1.r": 0, "ns.1.r0": 1000, "ns.2.r": 300_000}
QUEUE = "q"
NAMESPACE = "ns"
HOST, PID = "h", 1
#: Every registration the machine makes has this token, so owners are deterministic.
REGISTRATION = "r"
#: Lease owners, as services name them ("<ns>.<id>.<registration>"). "ns.1.r0" starts
#: with "ns.1.r" but must never be scrubbed with it: it is another registration of id 1
#: (one from before Redis lost its data). Calls that lease nothing go through "solo".
OWNERS = ("ns.1.r", "ns.1.r0", "ns.2.r")
#: Registration tokens a reaper may name when it forgets a service.
REGISTRATIONS = (REGISTRATION, "r0")
#: A small pool so duplicates, re-enqueues after ack and stale receipts are common; ids
#: with '|', braces, a space and non-ASCII exercise receipt parsing and key tags.
IDS = ("a", "b", "c", "d", "e", "f", "g", "a|b", "{x} y", "ü")
NEVER_ENQUEUED = "never"
#: Ids of jobs an example starts with, already run and acked (only their tombstones).
FINISHED_IDS = tuple(f"t{i}" for i in range(8))


# -- plain-Python model ---------------------------------------------------------------


@dataclass
class Record:
    """A job's record in the `jobs` hash."""

    attempts: int
    max_attempts: int
    due_ms: int
    payload: bytes
    #: When it was sent: kept through every rewrite (retries, replays).
    enqueued_ms: int

    def encode(self) -> bytes:
        return f"{self.attempts}|{self.max_attempts}|{self.due_ms}:{self.enqueued_ms}|".encode() + self.payload


@dataclass
class Lease:
    """One current lease (a member of `leased` and `owners`)."""

    receipt: str
    id: str
    fence: int
    attempt: int
    deadline_ms: int


@dataclass
class Meta:
    """A job's entry in `meta` (fair scheduling): "<priority>|<pos>|<group>"."""

    priority: int
    pos: str
    group: str

    def encode(self) -> bytes:
        return f"{self.priority}|{self.pos}|{self.group}".encode()

    def member(self, job_id: str) -> str:
        """Its member of `gready` while READY: "<group>|<rank>|<id>"."""
        return f"{self.group}|{chr(53 - self.priority)}{self.pos}|{job_id}"


@dataclass(frozen=True)
class LeaseAnswer:
    """What lua/lease.lua answers, as the model predicts it."""

    acks: list[str]
    jobs: list[Job]
    next_due_ms: int
    #: The call found the leases of an earlier run of the same (owner, call).
    replayed: bool


def receipt_id(receipt: str) -> str:
    """The job id in a receipt ``owner|call|fence|attempt|id`` (the id may contain '|')."""
    return receipt.split("|", 4)[4]


def zsorted(scores: dict[str, int]) -> list[str]:
    """Members in Redis sorted-set order: by score, then by member bytes."""
    return sorted(scores, key=lambda member: (scores[member], member.encode()))


def backoff_delay_ms(attempt: int, fence: int, base_ms: int, cap_ms: int) -> int:
    """nack.lua's backoff, with the same floating-point operations in the same order."""
    d = min(float(cap_ms), float(base_ms) * 2.0 ** min(attempt - 1, 60))
    jitter = (((fence % 1048576) * 2654435761) % 4294967296) % 1000 / 1000
    return math.floor(d / 2 + jitter * d / 2)


class QueueModel:
    """One queue as the scripts define it. Every method mirrors one script and returns
    what that script should answer."""

    def __init__(self, name: str = QUEUE) -> None:
        self.name = name
        self.jobs: dict[str, Record] = {}
        self.ready: list[str] = []
        self.scheduled: dict[str, int] = {}
        self.leases: dict[str, Lease] = {}  # receipt -> lease
        self.dead: dict[str, int] = {}
        self.errors: dict[str, bytes] = {}
        self.counters: Counter[str] = Counter()
        self.next_maintenance_ms: int | None = None
        self.wake = False
        #: Tombstones: acked id -> the ms until which enqueue treats it as a duplicate.
        self.done: dict[str, int] = {}
        #: Per id: bumped when the id is added and when a replay resets its attempts.
        self.epoch: Counter[str] = Counter()
        #: How many times `ok` was answered to an ack (ack, ack_many, ack-and-lease).
        self.acked_ok = 0
        #: pause.lua: when the queue was paused; None while it runs.
        self.paused_ms: int | None = None
        #: limit.lua: (count, period_ms, burst) while rate limited; lease.lua's GCRA
        #: time, as the "%.3f" text it stores.
        self.rate_limit: tuple[int, int, int] | None = None
        self.rate_tat: str | None = None
        #: ack_result.lua: id -> "<finished_ms>|<encoded value>", id -> expiry ms, and
        #: the ids of the finished stream's entries (at most STREAM_LENGTH).
        self.results: dict[str, bytes] = {}
        self.result_expiry: dict[str, int] = {}
        self.finished: list[str] = []
        #: Fair scheduling (lua/README.md section 2.1): the `fair` counter, `meta`,
        #: `gready` (members), `ring` (group -> turn, or -1 parked) and `groups`.
        self.fair = False
        self.meta: dict[str, Meta] = {}
        self.gready: set[str] = set()
        self.ring: dict[str, int] = {}
        self.groups: dict[str, int | str] = {}
        #: Flows (lua/README.md section 2.2): waiting job -> its next check, and the
        #: members "<id>\t<queue>\t<job id>" of what each waits for.
        self.fwait: dict[str, int] = {}
        self.fpending: set[str] = set()
        #: Flows' records: flow id -> record, and flow id -> when it goes.
        self.flows: dict[str, bytes] = {}
        self.flow_expiry: dict[str, int] = {}
        #: progress.lua: id -> (written_ms, the receipt that wrote it, value); and when
        #: each entry was written or last looked at by a trim.
        self.progress_entries: dict[str, tuple[int, str, bytes]] = {}
        self.progress_at: dict[str, int] = {}
        #: The event stream (lua/README.md section 2.5): its bound (0: not opted in), the
        #: number of the last event written, and the entries kept: (number, fields).
        self.events_bound = 0
        self.events_seq = 0
        self.events: list[tuple[int, dict[bytes, bytes]]] = []
        #: Durable steps (lua/README.md section 2.6): per job its entries ("s:<name>",
        #: "p:<name>", "g:<name>") with their values, in the order first written; the jobs
        #: parked for a signal, by their timeout; the `steps` flag of `counters`.
        self.steps: dict[str, dict[str, bytes]] = {}
        self.waiting: dict[str, int] = {}
        self.steps_flag = False

    def _emit(self, kind: str, job_id: str, now: int, **fields: Any) -> None:
        """The helper emit: one event, when the queue has opted in; the stream keeps
        the newest ``events_bound`` (exact MAXLEN)."""
        if not self.events_bound:
            return
        self.events_seq += 1
        entry = {b"type": kind.encode(), b"id": job_id.encode(), b"ms": str(now).encode()}
        for name, value in fields.items():
            entry[name.encode()] = value if isinstance(value, bytes) else str(value).encode()
        self.events = (self.events + [(self.events_seq, entry)])[-self.events_bound :]

    def _emit_failed(self, lease: Lease, record: Record, now: int, reason: str) -> None:
        """A lease that ended in failure at ``now`` (expired, scrubbed): 'dead' once its
        attempts are used up, else 'retried' (ready again now)."""
        if lease.attempt >= record.max_attempts:
            self._emit("dead", lease.id, now, attempt=lease.attempt, error=reason)
        else:
            self._emit("retried", lease.id, now, attempt=lease.attempt, due_ms=now, error=reason)

    def set_events(self, bound: int) -> tuple[int, int]:
        """set_events.lua: (the bound before, the stream's length after)."""
        previous = self.events_bound
        if bound and len(self.events) > bound:
            self.events = self.events[-bound:]
        self.events_bound = bound
        return previous, len(self.events)

    # -- fair scheduling: the helper helpers -----------------------------------------

    def _hincr(self, field: str, by: int) -> int:
        value = int(self.groups.get(field, 0)) + by
        self.groups[field] = value
        return value

    def _slots(self, group: str) -> tuple[int, int]:
        """group_slots: running leases, and the cap (c:<group>, else `cap`; 0: none)."""
        cap = self.groups.get(f"c:{group}", self.groups.get("cap", 0))
        return int(self.groups.get(f"r:{group}", 0)), int(cap)

    def _lex_range(self, group: str) -> list[str]:
        """ZRANGEBYLEX gready [<group>| (<group>}: the group's READY members, in order."""
        lo, hi = f"{group}|".encode(), f"{group}}}".encode()
        return sorted((m for m in self.gready if lo <= m.encode() < hi), key=str.encode)

    def _metas(self, ids: Sequence[str]) -> list[Meta | None]:
        """fair_meta: a copy of each id's meta, None for an id without one."""
        return [Meta(m.priority, m.pos, m.group) if (m := self.meta.get(i)) else None for i in ids]

    def _activate(self, group: str) -> None:
        if group in self.ring:
            return
        running, cap = self._slots(group)
        self.ring[group] = self._hincr("turn", 1) if cap == 0 or running < cap else -1

    def _release(self, metas: Iterable[Meta | None]) -> bool:
        """fair_release: each group's slots back in one step, the groups in the
        order they first appear; whether a parked group got a turn again."""
        counts: Counter[str] = Counter(meta.group for meta in metas if meta is not None and meta.group != "")
        woke = False
        for group, count in counts.items():  # a Counter keeps first-appearance order
            running = self._hincr(f"r:{group}", -count)
            if running <= 0 and group not in self.ring:  # kept at 0 while in the ring
                del self.groups[f"r:{group}"]
            if self.ring.get(group, 0) < 0:
                _, cap = self._slots(group)
                if cap == 0 or running < cap:
                    self.ring[group] = self._hincr("turn", 1)
                    woke = True
        return woke

    def _enter(self, ids: Sequence[str], metas: Sequence[Meta | None], head: bool) -> list[str]:
        """fair_enter: the ids with meta into `gready`; returns the others."""
        fair = [i for i, meta in enumerate(metas) if meta is not None]
        plain = [job_id for job_id, meta in zip(ids, metas) if meta is None]
        if not fair:
            return plain
        last = self._hincr("seq", len(fair))
        activate: list[str] = []
        for k, i in enumerate(fair, 1):
            meta = metas[i]
            assert meta is not None
            seq = last - k + 1 if head else last - len(fair) + k
            entry = Meta(meta.priority, f"{POS_MID - seq if head else POS_MID + seq:016d}", meta.group)
            self.gready.add(entry.member(ids[i]))
            self.meta[ids[i]] = entry
            if entry.group and entry.group not in activate:
                activate.append(entry.group)
        for group in activate:
            self._activate(group)
        return plain

    def _make_ready(self, ids: Sequence[str], head: bool) -> None:
        """make_ready: by their meta, to `gready` or to the head or tail of `ready`."""
        plain = self._enter(ids, self._metas(ids), head)
        self.ready = plain + self.ready if head else self.ready + plain

    def _finish(self, ids: Sequence[str]) -> None:
        """fair_finish: jobs that ended for good lose their meta and give their slots back."""
        metas = self._metas(ids)
        for job_id, meta in zip(ids, metas):
            if meta is not None:
                del self.meta[job_id]
        if self._release(metas):
            self.wake = True

    def _in_gready(self, job_id: str) -> bool:
        meta = self.meta.get(job_id)
        return meta is not None and meta.pos != "" and meta.member(job_id) in self.gready

    def _fair_pick(self, want: int) -> tuple[list[str], bool, bool]:
        """lease.lua's fair_pick: the ids picked, whether leasable work is left, and
        whether it stopped at its budget."""
        turn, uturn = int(self.groups.get("turn", 0)), int(self.groups.get("uturn", 0))
        default_cap = int(self.groups.get("cap", 0))
        budget = want + STALE_BUDGET
        in_turn = {g: score for g, score in self.ring.items() if score > 0}
        front = zsorted(in_turn)[:budget]
        plain, lane = self.ready[:want], self._lex_range("")[:want]
        entries = [(g, in_turn[g]) for g in front]
        state = {
            g: {"running": int(self.groups.get(f"r:{g}", 0)),
                "cap": int(self.groups[f"c:{g}"]) if f"c:{g}" in self.groups else default_cap,
                "taken": 0, "fate": None, "turn": 0}
            for g in front
        }
        picks: list[tuple[str, str | None]] = []
        qi = pi = li = steps = 0
        while len(picks) < want and steps < budget:
            steps += 1
            entry = entries[qi] if qi < len(entries) else None
            ungrouped = pi < len(plain) or li < len(lane)
            if entry is None and not ungrouped:
                break
            if ungrouped and (entry is None or uturn < entry[1]):
                member = lane[li] if li < len(lane) else None
                if member is not None and (ord(member[1]) < 53 or pi >= len(plain)):
                    picks.append((member[19:], member))
                    li += 1
                else:
                    picks.append((plain[pi], None))
                    pi += 1
                turn += 1
                uturn = turn
                continue
            qi += 1
            g = entry[0]
            st_ = state[g]
            if st_["cap"] != 0 and st_["running"] >= st_["cap"]:
                st_["fate"] = "park"
                continue
            two = self._lex_range(g)[st_["taken"] : st_["taken"] + 2]
            if not two:
                st_["fate"] = "drop"
                continue
            st_["taken"] += 1
            st_["running"] += 1
            turn += 1
            picks.append((two[0][len(g) + 19 :], two[0]))
            if len(two) == 1:
                st_["fate"] = "drop"
            elif st_["cap"] != 0 and st_["running"] >= st_["cap"]:
                st_["fate"] = "park"
            else:
                st_["fate"], st_["turn"] = "turn", turn
                entries.append((g, turn))
        for job_id, member in picks:
            assert job_id in self.jobs, f"the model picked {job_id!r}, which has no record"
            if member is not None:
                self.gready.discard(member)
        self.ready = self.ready[pi:]
        seen: set[str] = set()
        for g, _ in entries:
            st_ = state[g]
            if g in seen or st_["fate"] is None:
                continue
            seen.add(g)
            if st_["fate"] == "turn":
                self.ring[g] = st_["turn"]
            elif st_["fate"] == "park":
                self.ring[g] = -1
            else:
                self.ring.pop(g, None)
            if st_["taken"] > 0:
                self._hincr(f"r:{g}", st_["taken"])
            elif st_["fate"] == "drop" and st_["running"] <= 0:
                self.groups.pop(f"r:{g}", None)
        if steps > 0:
            self.groups["turn"], self.groups["uturn"] = turn, uturn
        left = qi < len(entries) or pi < len(plain) or li < len(lane) or len(plain) == want or len(front) == budget
        return [job_id for job_id, _ in picks], left, steps >= budget and len(picks) < want

    # -- queries ---------------------------------------------------------------------

    def state_of(self, job_id: str) -> str | None:
        if job_id in self.scheduled:
            return "scheduled"
        if job_id in self.dead:
            return "dead"
        if job_id in self.ready or self._in_gready(job_id):
            return "ready"
        if any(lease.id == job_id for lease in self.leases.values()):
            return "leased"
        return None

    def get(self, job_id: str, now: int) -> JobInfo:
        """get.lua: the job's state and what each state knows (payload included)."""
        none = dict(attempts=-1, max_attempts=-1, due_ms=-1, payload_bytes=-1, payload=None, error="",
                    deadline_ms=-1, owner="", fence=-1, done_until_ms=-1)
        record = self.jobs.get(job_id)
        if record is None:
            until = self.done.get(job_id, -1)
            state = "done" if until > now else "unknown"
            return JobInfo(job_id, self.name, state, now, **{**none, "done_until_ms": until if until > now else -1})
        known = {**none, "attempts": record.attempts, "max_attempts": record.max_attempts, "due_ms": record.due_ms,
                 "payload_bytes": len(record.payload), "payload": record.payload, "enqueued_ms": record.enqueued_ms}
        state = self.state_of(job_id)
        if state == "dead":
            known.update(due_ms=self.dead[job_id], error=self.errors.get(job_id, b"").decode("utf-8", "replace"))
        elif state == "scheduled":
            known.update(due_ms=self.scheduled[job_id])
            if self.waiting.get(job_id) == self.scheduled[job_id]:
                state = "waiting"  # parked for a signal (section 2.6)
        elif state == "leased":
            lease = next(lease for lease in self.leases.values() if lease.id == job_id)
            known.update(deadline_ms=lease.deadline_ms, owner=lease.receipt.split("|", 1)[0], fence=lease.fence)
        return JobInfo(job_id, self.name, str(state), now, **known)  # type: ignore[arg-type]

    def next_due_ms(self) -> int:
        """The earliest due_ms in SCHEDULED or deadline in LEASED; -1 if neither."""
        times = list(self.scheduled.values()) + [lease.deadline_ms for lease in self.leases.values()]
        return min(times) if times else -1

    def statuses(self, receipts: Sequence[str]) -> tuple[list[str], list[str]]:
        """The fenced answer per receipt (ok / stale / gone) and the receipts that are ok,
        once each, in order (a repeated receipt answers `gone` the second time)."""
        status: list[str] = []
        ok: list[str] = []
        for receipt in receipts:
            if receipt in self.leases and receipt not in ok:
                status.append("ok")
                ok.append(receipt)
            elif receipt in ok:
                status.append("gone")
            else:
                status.append("stale" if receipt_id(receipt) in self.jobs else "gone")
        return status, ok

    def job(self, receipt: str, owner_queue: str) -> Job:
        lease = self.leases[receipt]
        record = self.jobs[lease.id]
        return Job(
            id=lease.id,
            queue=owner_queue,
            payload=record.payload,
            fence=lease.fence,
            attempt=lease.attempt,
            max_attempts=record.max_attempts,
            deadline_ms=lease.deadline_ms,
            receipt=receipt,
            enqueued_ms=record.enqueued_ms,
        )

    # -- scripts ---------------------------------------------------------------------

    def enqueue(self, batch: Sequence[tuple[Any, ...]], now: int) -> list[bool]:
        """enqueue.lua: add each (id, payload, delay_ms, max_attempts[, priority, group])
        unless the id exists or has a tombstone in force (an expired one is left for acks
        to trim). A job with a group or a priority gets meta, and goes READY by it."""
        added: list[bool] = []
        ready_ids: list[str] = []
        ready_metas: list[Meta | None] = []
        call_is_fair = False
        for job in batch:
            job_id, payload, delay_ms, max_attempts = job[:4]
            priority, group = (job[4] or 0, job[5] or "") if len(job) > 4 else (0, "")
            meta = Meta(priority, "", group) if priority or group else None
            call_is_fair = call_is_fair or meta is not None
            if job_id in self.jobs or self.done.get(job_id, now) > now:
                added.append(False)
                self.counters["duplicates"] += 1
                continue
            added.append(True)
            self.counters["enqueued"] += 1
            self.epoch[job_id] += 1
            self.jobs[job_id] = Record(0, max_attempts, now + delay_ms, payload, now)
            if delay_ms:
                self._emit("enqueued", job_id, now, due_ms=now + delay_ms)
            else:
                self._emit("enqueued", job_id, now)
            if delay_ms == 0:
                ready_ids.append(job_id)
                ready_metas.append(meta)
            else:
                self.scheduled[job_id] = now + delay_ms
                if meta is not None:
                    self.meta[job_id] = meta
            self.wake = True
        if call_is_fair and any(added):
            self.fair = True
            ready_ids = self._enter(ready_ids, ready_metas, head=False)
        self.ready += ready_ids
        return added

    def _end_leases(self, receipts: Iterable[str]) -> None:
        for receipt in receipts:
            del self.leases[receipt]

    def _ack(self, receipts: Sequence[str], now: int, keep_done_ms: int) -> None:
        """Delete the acked jobs; trim expired tombstones (counted before any write, at
        least TRIM_BATCH at a time, at most TRIM_BATCH more than acked), then bury."""
        if not receipts:
            return
        ids = [self.leases[receipt].id for receipt in receipts]
        for receipt in receipts:
            self._emit("acked", self.leases[receipt].id, now, attempt=self.leases[receipt].attempt)
        self._bury(ids, now, keep_done_ms)
        self._end_leases(receipts)
        self._finish(ids)
        self.acked_ok += len(receipts)

    def _bury(self, ids: Sequence[str], now: int, keep_done_ms: int) -> None:
        """Delete the jobs' records and tombstone their ids (the helper bury): trim
        expired tombstones first (counted before any write, at least TRIM_BATCH at a
        time, at most TRIM_BATCH more than buried)."""
        for job_id in ids:
            del self.jobs[job_id]
        self._forget_steps(ids)
        self._trim_done(now, len(ids) + TRIM_BATCH)
        if keep_done_ms > 0:
            self.done.update((job_id, now + keep_done_ms) for job_id in ids)

    def _trim_done(self, now: int, most: int) -> None:
        """The helper trim_done: once at least TRIM_BATCH tombstones have expired,
        remove up to ``most`` of them, earliest expiry first."""
        expired = sum(1 for until in self.done.values() if until <= now)
        if expired >= TRIM_BATCH:
            for job_id in zsorted(self.done)[: min(expired, most)]:
                del self.done[job_id]

    def _fail(self, lease: Lease, now: int, due_ms: int | None = None) -> Record:
        """Persist a failed lease's attempt in the record (due_ms = now unless given)."""
        record = self.jobs[lease.id]
        record.attempts = lease.attempt
        record.due_ms = now if due_ms is None else due_ms
        return record

    def _to_dead(self, job_id: str, now: int, error: bytes) -> None:
        self.dead[job_id] = now
        self.errors[job_id] = error
        self.counters["dead"] += 1

    def ack(self, receipts: Sequence[str], now: int, keep_done_ms: int) -> list[str]:
        """ack.lua."""
        status, ok = self.statuses(receipts)
        self._ack(ok, now, keep_done_ms)
        return status

    def lease(
        self,
        owner: str,
        call: str,
        count: int,
        lease_ms: int,
        limit: int,
        acks: Sequence[str],
        now: int,
        keep_done_ms: int = 0,
    ) -> LeaseAnswer:
        """lease.lua, step by step: acks, replay check, maintenance, lease."""
        status, to_ack = self.statuses(acks)
        acking = set(to_ack)
        all_acked = all(s == "ok" for s in status)
        prior: list[str] = []
        if count > 0 and (not all_acked or not acks):
            prefix = f"{owner}|{call}|"
            prior = sorted((r for r in self.leases if r.startswith(prefix)), key=str.encode)[:count]
        if prior:
            jobs = [self.job(receipt, self.name) for receipt in prior]  # read before the acks' writes
            self._ack(to_ack, now, keep_done_ms)
            return LeaseAnswer(status, jobs, -1, replayed=True)

        fence = self.counters["leased"]
        if self.paused_ms is not None:
            count = 0  # a paused queue leases nothing; acks and maintenance go on
        # The rate limit (GCRA), with the script's float operations in the same order.
        spacing, rate_cut, tat, burst_ms = None, False, 0.0, 0.0
        if self.rate_limit is not None and count > 0:
            per, period_ms, burst = self.rate_limit
            spacing = period_ms / per
            burst_ms = burst * spacing
            tat = max(float(self.rate_tat or "0"), now)
            permits = max(0, math.floor((now + burst_ms - tat) / spacing + 1e-9))
            if permits < count:
                count, rate_cut = permits, True
        # A fair queue runs the steps below with count 0 and then the fair pick.
        want, fair_short = count, False
        if self.fair:
            if want > 0:
                fair_short = len(self.ready) + len(self.gready) < want or any(
                    lease.deadline_ms <= now for lease in self.leases.values()
                )
            count = 0
        maintain = (count > 0 and len(self.ready) < count) or fair_short or now >= (self.next_maintenance_ms or 0)
        promoted: list[str] = []
        reclaimed: list[Lease] = []
        to_dead: list[Lease] = []
        stopped_at_limit = False
        if maintain:
            promoted = [i for i in zsorted(self.scheduled) if self.scheduled[i] <= now][:limit]
            deadlines = {r: lease.deadline_ms for r, lease in self.leases.items()}
            expired = [r for r in zsorted(deadlines) if deadlines[r] <= now and r not in acking][:limit]
            stopped_at_limit = len(promoted) == limit or len(expired) == limit
            for receipt in expired:
                lease = self.leases[receipt]
                (to_dead if lease.attempt >= self.jobs[lease.id].max_attempts else reclaimed).append(lease)
        ready_seen = min(len(self.ready), count + 1) if count > 0 else 0
        order_length = len(reclaimed) + ready_seen + len(promoted)
        take = min(count, order_length)
        from_ready = max(0, min(take, len(reclaimed) + ready_seen) - len(reclaimed))
        wake = not acks and order_length > take and self.paused_ms is None and not rate_cut

        self._ack(to_ack, now, keep_done_ms)
        if maintain and not to_ack:
            self._trim_done(now, MAX_BATCH)  # a drained queue gets no acks to trim for it
        if maintain:
            for job_id in promoted:
                del self.scheduled[job_id]
            self._end_leases(lease.receipt for lease in reclaimed + to_dead)
            self._release(self._metas([lease.id for lease in reclaimed + to_dead]))
            for lease in reclaimed:
                self._fail(lease, now)
            for lease in to_dead:
                record = self._fail(lease, now)
                self._to_dead(lease.id, now, f"lease expired on attempt {lease.attempt} of {record.max_attempts}".encode())
            # The script writes the reclaimed ones' events, then the dead ones'.
            for lease in reclaimed + to_dead:
                record = self.jobs[lease.id]
                self._emit_failed(lease, record, now, f"lease expired on attempt {lease.attempt} of {record.max_attempts}")
            self.counters["reclaimed"] += len(reclaimed) + len(to_dead)
            self.counters["promoted"] += len(promoted)
            # Rate-limited, and written only by a call that writes something else first.
            if promoted or reclaimed or to_dead or to_ack or from_ready:
                self.next_maintenance_ms = now + MAINTENANCE_INTERVAL_MS
        if self.fair:
            self._make_ready([lease.id for lease in reclaimed], head=True)
            self._make_ready(promoted, head=False)
            taken: list[str] = []
            if want > 0:
                taken, left, short = self._fair_pick(want)
                stopped_at_limit = stopped_at_limit or short
                if not acks and left and self.paused_ms is None and not rate_cut:
                    self.wake = True
        else:
            order = [lease.id for lease in reclaimed] + self.ready + promoted
            taken, self.ready = order[:take], order[take:]
        jobs = []
        for job_id in taken:
            fence += 1
            attempt = self.jobs[job_id].attempts + 1
            receipt = f"{owner}|{call}|{fence}|{attempt}|{job_id}"
            self.leases[receipt] = Lease(receipt, job_id, fence, attempt, now + lease_ms)
            jobs.append(self.job(receipt, self.name))
            self._emit("leased", job_id, now, attempt=attempt, owner=owner, deadline_ms=now + lease_ms)
        self.counters["leased"] += len(jobs)
        self.wake = self.wake or wake
        if spacing is not None and jobs:
            tat += len(jobs) * spacing
            self.rate_tat = "%.3f" % tat
        next_due = -1
        if rate_cut and len(jobs) == want:
            assert spacing is not None
            next_due = math.ceil(tat + spacing - burst_ms)
        elif len(jobs) < want:
            next_due = now if stopped_at_limit else self.next_due_ms()
        return LeaseAnswer(status, jobs, next_due, replayed=False)

    def ack_result(
        self, pairs: Sequence[tuple[str, bytes]], now: int, keep_done_ms: int, ttl_ms: int, max_results: int
    ) -> list[str]:
        """ack_result.lua: ack as ack.lua; keep each acked job's result; trim the
        expired (n + TRIM_BATCH at most), then the oldest-expiring beyond the cap."""
        status, ok = self.statuses([receipt for receipt, _ in pairs])
        if not ok:
            return status
        value_of = {}
        for receipt, value in pairs:
            value_of.setdefault(receipt, value)
        stored = [(self.leases[receipt].id, value_of[receipt]) for receipt in ok]
        bound = len(pairs) + TRIM_BATCH
        ranked = zsorted(self.result_expiry)
        trim = [i for i in ranked if self.result_expiry[i] <= now][:bound]
        over = len(self.result_expiry) - len(trim) + len(stored) - max_results
        if over > 0:
            trim += ranked[len(trim) : len(trim) + min(over, bound)]
        self._ack(ok, now, keep_done_ms)
        for job_id in trim:
            self.results.pop(job_id, None)
            self.result_expiry.pop(job_id, None)
        for job_id, value in stored:
            self.results[job_id] = str(now).encode() + b"|" + value
            self.result_expiry[job_id] = now + ttl_ms
            self.finished = (self.finished + [job_id])[-STREAM_LENGTH:]
        return status

    def result(self, job_id: str, now: int) -> tuple[str, int, bytes]:
        """result.lua: (state, finished_ms, value or error)."""
        if job_id in self.jobs:
            if job_id in self.dead:
                return "dead", self.dead[job_id], self.errors.get(job_id, b"")
            return "pending", -1, b""
        if self.result_expiry.get(job_id, -1) > now and job_id in self.results:
            finished, _, value = self.results[job_id].partition(b"|")
            return "ok", int(finished), value
        return ("done" if self.done.get(job_id, -1) > now else "unknown"), -1, b""

    def cancel(self, job_id: str, now: int, keep_done_ms: int) -> str:
        """cancel.lua: the state the job was cancelled in, or done / unknown."""
        if job_id not in self.jobs:
            return "done" if self.done.get(job_id, -1) > now else "unknown"
        state = self.state_of(job_id)
        assert state is not None, f"{job_id} has a record but no state"
        if state == "dead":
            del self.dead[job_id]
            self.errors.pop(job_id, None)
        elif state == "scheduled":
            del self.scheduled[job_id]
        elif state == "ready":
            if self._in_gready(job_id):
                self.gready.discard(self.meta[job_id].member(job_id))
            else:
                self.ready.remove(job_id)
        else:
            self._end_leases([r for r, lease in self.leases.items() if lease.id == job_id])
            self.counters["cancelled_leased"] += 1
            if self._release(self._metas([job_id])):
                self.wake = True
        self.meta.pop(job_id, None)
        self._bury([job_id], now, keep_done_ms)
        self.counters["cancelled"] += 1
        self._emit("cancelled", job_id, now, state=state)
        return state

    def limit(self, count: int, period_ms: int, burst: int) -> bool:
        """limit.lua: whether this call changed the cap; a change raises the wake marker."""
        new = (count, period_ms, burst) if count > 0 else None
        if new == self.rate_limit:
            return False
        self.rate_limit = new
        if new is None:
            self.rate_tat = None
        self.wake = True
        return True

    def pause(self, now: int) -> bool:
        """pause.lua: whether this call paused the queue (the first time stands)."""
        if self.paused_ms is not None:
            return False
        self.paused_ms = now
        return True

    def resume(self) -> bool:
        """resume.lua: whether this call resumed the queue; it raises the wake marker."""
        if self.paused_ms is None:
            return False
        self.paused_ms, self.wake = None, True
        return True

    def nack(
        self, receipt: str, error: bytes, delay_ms: int | None, base_ms: int, cap_ms: int, now: int,
        final: bool = False,
    ) -> Nacked:
        """nack.lua; ``final``: to DEAD whatever the attempt."""
        if receipt not in self.leases:
            return Nacked(Outcome.STALE if receipt_id(receipt) in self.jobs else Outcome.GONE, None, 0)
        lease = self.leases.pop(receipt)
        record = self.jobs[lease.id]
        self.counters["nacked"] += 1
        if self._release(self._metas([lease.id])):
            self.wake = True
        if lease.attempt >= record.max_attempts or final:
            self._fail(lease, now)
            self._to_dead(lease.id, now, error)
            self.finished = (self.finished + [lease.id])[-STREAM_LENGTH:]  # waiters wake for it
            self._emit("dead", lease.id, now, attempt=lease.attempt, error=error[:EVENT_TEXT_BYTES])
            return Nacked(Outcome.OK, "dead", now)
        if delay_ms is None:
            delay_ms = backoff_delay_ms(lease.attempt, lease.fence, base_ms, cap_ms)
        due_ms = now + delay_ms
        self._fail(lease, now, due_ms)
        self.scheduled[lease.id] = due_ms
        self.wake = True
        self._emit("retried", lease.id, now, attempt=lease.attempt, due_ms=due_ms, error=error[:EVENT_TEXT_BYTES])
        return Nacked(Outcome.OK, "scheduled", due_ms)

    def extend(self, receipts: Sequence[str], lease_ms: int, now: int) -> list[Extended]:
        """extend.lua: deadlines only move later; every answer is read before any write."""
        answers: list[Extended] = []
        updates: dict[str, int] = {}
        for receipt in receipts:
            if receipt in self.leases:
                deadline = max(self.leases[receipt].deadline_ms, now + lease_ms)
                updates[receipt] = deadline
                answers.append(Extended(Outcome.OK, deadline))
            else:
                answers.append(Extended(Outcome.STALE if receipt_id(receipt) in self.jobs else Outcome.GONE, 0))
        for receipt, deadline in updates.items():
            self.leases[receipt].deadline_ms = deadline
        return answers

    def release(self, receipts: Sequence[str], now: int) -> list[str]:
        """release.lua: back to the head of READY in receipt order; no attempt counted."""
        status, ok = self.statuses(receipts)
        ids = [self.leases[r].id for r in ok]
        for receipt in ok:
            self._emit("released", self.leases[receipt].id, now, attempt=self.leases[receipt].attempt)
        self._end_leases(ok)
        self.counters["released"] += len(ok)
        self._release(self._metas(ids))
        self._make_ready(ids, head=True)
        self.wake = self.wake or bool(ok)
        return status

    def promote(self, limit: int, now: int) -> Promoted:
        """promote.lua: due jobs to the tail, expired leases to the head (or DEAD)."""
        promoted = [i for i in zsorted(self.scheduled) if self.scheduled[i] <= now][:limit]
        deadlines = {r: lease.deadline_ms for r, lease in self.leases.items()}
        expired = [self.leases[r] for r in zsorted(deadlines) if deadlines[r] <= now][:limit]
        if promoted or expired:  # with nothing due, promote writes nothing
            self.next_maintenance_ms = now + MAINTENANCE_INTERVAL_MS
        for job_id in promoted:
            del self.scheduled[job_id]
        self._make_ready(promoted, head=False)
        self.counters["promoted"] += len(promoted)
        self._end_leases(lease.receipt for lease in expired)
        self.counters["reclaimed"] += len(expired)
        woke = self._release(self._metas([lease.id for lease in expired]))
        to_ready = []
        dead = 0
        for lease in expired:
            record = self._fail(lease, now)
            if lease.attempt >= record.max_attempts:
                dead += 1
                self._to_dead(lease.id, now, f"lease expired on attempt {lease.attempt} of {record.max_attempts}".encode())
            else:
                to_ready.append(lease.id)
        for lease in expired:
            record = self.jobs[lease.id]
            self._emit_failed(lease, record, now, f"lease expired on attempt {lease.attempt} of {record.max_attempts}")
        self._make_ready(to_ready, head=True)
        self.wake = self.wake or bool(promoted or to_ready) or woke
        more = len(promoted) == limit or len(expired) == limit
        return Promoted(len(promoted), len(expired), dead, more, self.next_due_ms())

    def scrub(self, owner: str, limit: int, now: int) -> Scrubbed:
        """scrub.lua: every lease of `owner` ends now, in receipt byte order."""
        receipts = sorted((r for r in self.leases if r.startswith(owner + "|")), key=str.encode)[:limit]
        if not receipts:
            return Scrubbed(0, 0, False)
        to_ready = []
        dead = 0
        metas = self._metas([self.leases[receipt].id for receipt in receipts])
        ended = []
        for receipt in receipts:
            lease = self.leases.pop(receipt)
            ended.append(lease)
            record = self._fail(lease, now)
            if lease.attempt >= record.max_attempts:
                dead += 1
                self._to_dead(
                    lease.id, now, f"worker {owner} died on attempt {lease.attempt} of {record.max_attempts}".encode()
                )
            else:
                to_ready.append(lease.id)
        woke = self._release(metas)
        self._make_ready(to_ready, head=True)
        self.counters["scrubbed"] += len(receipts)
        for lease in ended:
            record = self.jobs[lease.id]
            self._emit_failed(lease, record, now, f"worker {owner} died on attempt {lease.attempt} of {record.max_attempts}")
        self.wake = self.wake or bool(to_ready) or woke
        return Scrubbed(len(receipts), dead, len(receipts) == limit)

    def _dead_ids(self, ids: Sequence[str]) -> list[str]:
        found: list[str] = []
        for job_id in ids:
            if job_id not in found and job_id in self.dead:
                found.append(job_id)
        return found

    def browse(self, state: str, start: int, count: int, now: int) -> JobPage:
        """browse.lua: one page of a state's jobs. Ready: the `ready` list from its head,
        then `gready` in member order; scheduled by due time, running by deadline (both
        then by member), done: the tombstones in force, whether a result is kept."""
        q = self.name
        entries: list[JobEntry]
        if state == "ready":
            rows = [(i, "", 0) for i in self.ready]
            for member in sorted(self.gready, key=str.encode):
                group, rest = member.split("|", 1)
                rows.append((rest[18:], group, 53 - ord(rest[0])))
            total = len(rows)
            entries = [JobEntry(i, q, attempts=self.jobs[i].attempts, max_attempts=self.jobs[i].max_attempts,
                                group=group, priority=priority) for i, group, priority in rows[start : start + count]]
        elif state == "scheduled":
            total = len(self.scheduled)
            entries = [JobEntry(i, q, due_ms=self.scheduled[i], attempts=self.jobs[i].attempts,
                                max_attempts=self.jobs[i].max_attempts)
                       for i in zsorted(self.scheduled)[start : start + count]]
        elif state == "running":
            total = len(self.leases)
            deadlines = {receipt: lease.deadline_ms for receipt, lease in self.leases.items()}
            entries = []
            for receipt in zsorted(deadlines)[start : start + count]:
                lease = self.leases[receipt]
                entries.append(JobEntry(lease.id, q, owner=receipt.split("|", 1)[0], attempts=lease.attempt,
                                        max_attempts=self.jobs[lease.id].max_attempts, fence=lease.fence,
                                        deadline_ms=lease.deadline_ms))
        else:
            in_force = {i: until for i, until in self.done.items() if until > now}
            total = len(in_force)
            entries = []
            for i in zsorted(in_force)[start : start + count]:
                kept = i in self.results and self.result_expiry.get(i, now) > now
                finished_ms = int(self.results[i].split(b"|", 1)[0]) if kept else -1
                entries.append(JobEntry(i, q, done_until_ms=in_force[i], has_result=kept, finished_ms=finished_ms))
        return JobPage(state=state, total=total, start=start, now_ms=now, jobs=entries)

    def dead_list(self, offset: int, limit: int) -> DeadPage:
        """dead_list.lua: oldest death first."""
        page = zsorted(self.dead)[offset : offset + limit]
        return DeadPage(
            total=len(self.dead),
            jobs=[
                DeadJob(
                    id=i,
                    dead_ms=self.dead[i],
                    attempts=self.jobs[i].attempts,
                    max_attempts=self.jobs[i].max_attempts,
                    error=self.errors.get(i, b"").decode("utf-8", "replace"),
                    payload=self.jobs[i].payload,
                )
                for i in page
            ],
        )

    def dead_replay(self, ids: Sequence[str], now: int) -> int:
        """dead_replay.lua: to the tail of READY with attempts reset."""
        moved = self._dead_ids(ids)
        for job_id in moved:
            record = self.jobs[job_id]
            record.attempts, record.due_ms = 0, now
            del self.dead[job_id]
            self.errors.pop(job_id, None)
            self.epoch[job_id] += 1
        self._make_ready(moved, head=False)
        self.counters["replayed"] += len(moved)
        for job_id in moved:
            self._emit("enqueued", job_id, now, replayed=1)
        self.wake = self.wake or bool(moved)
        return len(moved)

    def dead_purge(self, ids: Sequence[str]) -> int:
        """dead_purge.lua."""
        gone = self._dead_ids(ids)
        for job_id in gone:
            del self.dead[job_id], self.jobs[job_id]
            self.errors.pop(job_id, None)
            self.meta.pop(job_id, None)
        self._forget_steps(gone)
        self.counters["purged"] += len(gone)
        return len(gone)

    def stats(self, now: int) -> Stats:
        """stats.lua, with `acked` derived from the counters as the script derives it."""
        oldest: int | None = self.jobs[self.ready[0]].due_ms if self.ready else None
        if self.scheduled:
            first = min(self.scheduled.values())
            if first <= now and (oldest is None or first < oldest):
                oldest = first
        c = self.counters
        return Stats(
            now_ms=now,
            ready=len(self.ready) + len(self.gready),
            scheduled=len(self.scheduled),
            due=sum(1 for due in self.scheduled.values() if due <= now),
            leased=len(self.leases),
            expired=sum(1 for lease in self.leases.values() if lease.deadline_ms <= now),
            dead=len(self.dead),
            done=sum(1 for until in self.done.values() if until > now),
            lag_ms=max(0, now - oldest) if oldest is not None else 0,
            enqueued=c["enqueued"],
            duplicates=c["duplicates"],
            leased_total=c["leased"],
            acked=c["leased"] - c["nacked"] - c["reclaimed"] - c["scrubbed"] - c["released"] - c["cancelled_leased"]
            - c["parked"] - len(self.leases),
            nacked=c["nacked"],
            promoted=c["promoted"],
            reclaimed=c["reclaimed"],
            scrubbed=c["scrubbed"],
            released=c["released"],
            dead_total=c["dead"],
            replayed=c["replayed"],
            purged=c["purged"],
            paused_ms=self.paused_ms or 0,
            cancelled=c["cancelled"],
            rate_limit=self.rate_limit[0] if self.rate_limit else 0,
            rate_period_ms=self.rate_limit[1] if self.rate_limit else 0,
            rate_burst=self.rate_limit[2] if self.rate_limit else 0,
            groups_waiting=sum(1 for score in self.ring.values() if score > 0),
            groups_at_cap=sum(1 for score in self.ring.values() if score < 0),
            waiting=sum(1 for until in self.waiting.values() if until > now),
            parked=c["parked"],
        )

    def peek_ready(self) -> int:
        """peek.lua's `ready`: what lease could hand out now (0 while paused)."""
        if self.paused_ms is not None:
            return 0
        ungrouped = len(self._lex_range(""))
        in_turn = any(score > 0 for score in self.ring.values())
        return len(self.ready) + ungrouped + (len(self.gready) - ungrouped if in_turn else 0)

    def groups_page(self, offset: int, limit: int, queue: str) -> GroupsPage:
        """groups.lua: the ring's groups from rank ``offset``, at most ``limit``."""
        page = []
        for g in zsorted(self.ring)[offset : offset + limit]:
            running, cap = self._slots(g)
            page.append(GroupInfo(name=g, ready=len(self._lex_range(g)), running=running, cap=cap,
                                  parked=self.ring[g] < 0, turn=self.ring[g], queue=queue))
        return GroupsPage(total=len(self.ring), default_cap=int(self.groups.get("cap", 0)), groups=page)

    def set_group_limit(self, group: str, cap: int | str) -> tuple[int, int]:
        """set_group_limit.lua: (changed, unparked)."""
        field = "cap" if group == "" else f"c:{group}"
        old = self.groups.get(field)
        new = None if cap == "" or (group == "" and cap == 0) else str(cap)
        parked = sorted((g for g, score in self.ring.items() if score == -1), key=str.encode)
        if (None if old is None else str(old)) == new:
            return 0, 0
        if new is None:
            del self.groups[field]
        else:
            self.groups[field] = new
        self.fair = True
        unparked = 0
        for g in parked:
            if group in ("", g):
                running, limit = self._slots(g)
                if limit == 0 or running < limit:
                    self.ring[g] = self._hincr("turn", 1)
                    unparked += 1
        self.wake = self.wake or unparked > 0
        return 1, unparked

    # -- flows ------------------------------------------------------------------------

    def flow_wait(self, job_id: str, payload: bytes, max_attempts: int, check_ms: int, refs: Sequence[str],
                  now: int) -> str:
        """flow_wait.lua: add a job waiting for ``refs`` ("<queue>\t<job id>"), armed."""
        if job_id in self.fwait:
            return "armed"
        if job_id in self.jobs or self.done.get(job_id, now) > now:
            return "duplicate"
        self.counters["enqueued"] += 1
        self.epoch[job_id] += 1
        self.jobs[job_id] = Record(0, max_attempts, WAIT_DUE_MS, payload, now)
        self.scheduled[job_id] = WAIT_DUE_MS
        self.fwait[job_id] = now + check_ms
        self.fpending |= {f"{job_id}\t{ref}" for ref in refs}
        self._emit("enqueued", job_id, now, waiting=len(refs))
        return "ok"

    def flow_done(self, job_id: str, policy: str, check_ms: int, ended: Sequence[tuple[str, str]],
                  now: int) -> tuple[str, int]:
        """flow_done.lua: (state, counted) for ``ended`` ("<queue>\t<job id>", how)."""
        members = {m for m in self.fpending if m.startswith(job_id + "\t")}
        armed = job_id in self.fwait
        record = self.jobs.get(job_id) if armed else None
        seen: dict[str, str] = {}
        for ref, how in ended:
            seen.setdefault(f"{job_id}\t{ref}", how)
        counted = [m for m in seen if m in members]
        failed = any(seen[m] == "failed" for m in counted)
        left = len(members) > len(counted)
        if record is None:
            self.fwait.pop(job_id, None)
            self.fpending -= members
            return "gone", len(counted) if armed else 0
        if left and not (failed and policy == "fail"):
            self.fpending -= set(counted)
            self.fwait[job_id] = now + check_ms
            return "waiting", len(counted)
        self.fpending -= members
        del self.fwait[job_id]
        if self.scheduled.get(job_id) == WAIT_DUE_MS:
            record.due_ms = now
            self.scheduled[job_id] = now
            self.wake = True
        return "released", len(counted)

    def flow_record(self, flow_id: str, record: bytes, keep_ms: int, now: int) -> str:
        """flow_record.lua: the first TRIM_BATCH + 1 expired records (by expiry, then id)
        deleted, then the record kept unless one of this id is in force."""
        in_force = self.flow_expiry.get(flow_id, now) > now
        expired = sorted((at, i.encode()) for i, at in self.flow_expiry.items() if at <= now)
        for _, i in expired[: TRIM_BATCH + 1]:
            del self.flows[i.decode()], self.flow_expiry[i.decode()]
        if in_force:
            return "duplicate"
        self.flows[flow_id] = record
        self.flow_expiry[flow_id] = now + keep_ms
        return "ok"

    def flow_show(self, flow_id: str, now: int) -> tuple[bytes, int] | None:
        """flow_show.lua: the record in force, and when it goes."""
        if self.flow_expiry.get(flow_id, now) <= now:
            return None
        return self.flows[flow_id], self.flow_expiry[flow_id]

    def progress(self, receipt: str, value: bytes, now: int) -> str:
        """progress.lua: 'stale' unless ``receipt`` is a current lease; else the trim
        (the TRIM_BATCH + 1 entries looked at longest ago: an ended lease's goes, a
        running one's is looked at now), then the value stored."""
        if receipt not in self.leases:
            return "stale"
        for job_id in zsorted(self.progress_at)[: TRIM_BATCH + 1]:
            if self.progress_entries[job_id][1] in self.leases:
                self.progress_at[job_id] = now
            else:
                del self.progress_entries[job_id], self.progress_at[job_id]
        job_id = self.leases[receipt].id
        previous = self.progress_entries.get(job_id)
        if previous is None or previous[1:] != (receipt, value):  # a value that changed: an event
            self._emit("progress", job_id, now, attempt=self.leases[receipt].attempt, value=value)
        self.progress_entries[job_id] = (now, receipt, value)
        self.progress_at[job_id] = now
        return "ok"

    def progress_show(self, ids: Sequence[str]) -> dict[str, tuple[str, int, bytes]]:
        """progress_show.lua: each id's (receipt, written_ms, value) while the lease that
        wrote it runs."""
        shown = {}
        for job_id in ids:
            entry = self.progress_entries.get(job_id)
            if entry is not None and entry[1] in self.leases:
                shown[job_id] = (entry[1], entry[0], entry[2])
        return shown

    # -- durable steps (lua/README.md section 2.6) ------------------------------------

    def _forget_steps(self, ids: Iterable[str]) -> None:
        """The helper forget_steps: an ended job's entries and its `waiting` entry go."""
        for job_id in ids:
            if self.steps.pop(job_id, None) is not None:
                self.waiting.pop(job_id, None)

    def _put_entry(self, job_id: str, entry: str, value: bytes) -> None:
        self.steps.setdefault(job_id, {})[entry] = value
        self.steps_flag = True

    def _stale_or_gone(self, receipt: str) -> str:
        return "stale" if receipt_id(receipt) in self.jobs else "gone"

    def step(self, receipt: str, lease_ms: int, name: str, value: bytes, now: int) -> tuple[str, int]:
        """step.lua: (status, deadline_ms)."""
        if receipt not in self.leases:
            return self._stale_or_gone(receipt), -1
        lease = self.leases[receipt]
        entries = self.steps.get(lease.id, {})
        lease.deadline_ms = max(lease.deadline_ms, now + lease_ms)
        if f"s:{name}" in entries:
            return "exists", lease.deadline_ms
        parked = any(entry.startswith("p:") for entry in entries)
        self._put_entry(lease.id, f"s:{name}", value)
        if parked:
            self.waiting.pop(lease.id, None)
        self._emit("step", lease.id, now, name=name)
        return "ok", lease.deadline_ms

    def park(self, receipt: str, kind: str, name: str, for_ms: int, lease_ms: int, now: int) -> tuple[str, bytes, int]:
        """park.lua: (status, value, ms)."""
        if receipt not in self.leases:
            return self._stale_or_gone(receipt), b"", -1
        lease = self.leases[receipt]
        job_id = lease.id
        entries = self.steps.get(job_id, {})
        deadline = max(lease.deadline_ms, now + lease_ms)
        if f"s:{name}" in entries:
            lease.deadline_ms = deadline
            return "done", entries[f"s:{name}"], deadline
        park = entries.get(f"p:{name}")
        if park is not None:
            at, _, was = park.decode().partition("|")
            assert was == kind, "the machine parks each name as one kind"
            until, parked = int(at), True
        else:
            until, parked = now + for_ms, False
        signal = entries.get(f"g:{name}") if kind == "wait" else None
        if signal is not None or parked and now >= until:
            lease.deadline_ms = deadline
            if kind == "sleep":
                return "awake", b"", deadline
            self._put_entry(job_id, f"s:{name}", signal if signal is not None else b"t")
            if parked:
                self.waiting.pop(job_id, None)
            self._emit("step", job_id, now, name=name)
            return ("signalled" if signal is not None else "timeout"), signal or b"", deadline
        del self.leases[receipt]
        self.counters["parked"] += 1
        self._release(self._metas([job_id]))
        self.jobs[job_id].due_ms = until
        self.scheduled[job_id] = until
        if kind == "wait":
            self.waiting[job_id] = until
        if not parked:
            self._put_entry(job_id, f"p:{name}", f"{until}|{kind}".encode())
        self.steps_flag = True
        self.wake = True
        self._emit("waiting" if kind == "wait" else "sleeping", job_id, now, name=name, until_ms=until)
        return "parked", b"", until

    def signal(self, job_id: str, name: str, payload: bytes, now: int) -> str:
        """signal.lua: its status."""
        if job_id not in self.jobs:
            return "unknown"
        if job_id in self.dead:
            return "dead"
        entries = self.steps.get(job_id, {})
        if f"g:{name}" in entries:
            return "duplicate"
        if f"s:{name}" in entries:
            return "closed"
        until = self.waiting.get(job_id)
        wakes = f"p:{name}" in entries and until is not None and until == self.scheduled.get(job_id)
        self._put_entry(job_id, f"g:{name}", payload)
        if wakes:
            self.jobs[job_id].due_ms = now
            self.scheduled[job_id] = now
            del self.waiting[job_id]
            self.wake = True
        self._emit("signalled", job_id, now, name=name, woke=int(wakes))
        return "woke" if wakes else "kept"

    def job_steps(self, job_id: str, now: int) -> JobSteps:
        """steps.lua."""
        return parse_steps([now, *[x for entry, value in self.steps.get(job_id, {}).items() for x in (entry, value)]])

    def keyspace(self, keys: QueueKeys) -> dict[str, Any]:
        """Every key of the queue as :func:`read_keyspace` reads it (empty keys absent)."""
        counters: dict[bytes, bytes] = {name.encode(): str(v).encode() for name, v in self.counters.items() if v}
        counters[b"partitions"] = b"1"  # recorded by the machine's first queue object at start
        if self.next_maintenance_ms is not None:
            counters[b"next_maintenance_ms"] = str(self.next_maintenance_ms).encode()
        if self.paused_ms is not None:
            counters[b"paused"] = str(self.paused_ms).encode()
        if self.rate_limit is not None:
            counters[b"rate_limit"] = "/".join(map(str, self.rate_limit)).encode()
        if self.rate_tat is not None:
            counters[b"rate_tat"] = self.rate_tat.encode()
        if self.fair:
            counters[b"fair"] = b"1"
        if self.events_bound:
            counters[b"events"] = str(self.events_bound).encode()
        if self.steps_flag:
            counters[b"steps"] = b"1"
        steps: dict[bytes, bytes] = {}
        for job_id, entries in self.steps.items():
            steps[job_id.encode()] = ("\n" + "".join(f"{entry}\n" for entry in entries)).encode()
            steps.update({f"{job_id}\n{entry}".encode(): value for entry, value in entries.items()})
        out: dict[str, Any] = {
            keys.jobs: {i.encode(): record.encode() for i, record in self.jobs.items()},
            keys.ready: [i.encode() for i in self.ready],
            keys.scheduled: {i.encode(): float(due) for i, due in self.scheduled.items()},
            keys.leased: {r.encode(): float(lease.deadline_ms) for r, lease in self.leases.items()},
            keys.owners: {r.encode(): 0.0 for r in self.leases},
            keys.dead: {i.encode(): float(at) for i, at in self.dead.items()},
            keys.errors: {i.encode(): text for i, text in self.errors.items()},
            keys.counters: counters,
            keys.wake: {b"wake": 0.0} if self.wake else {},
            keys.done: {i.encode(): float(until) for i, until in self.done.items()},
            keys.results: {i.encode(): record for i, record in self.results.items()},
            keys.result_expiry: {i.encode(): float(at) for i, at in self.result_expiry.items()},
            keys.finished: [i.encode() for i in self.finished],
            keys.meta: {i.encode(): meta.encode() for i, meta in self.meta.items()},
            keys.gready: {m.encode(): 0.0 for m in self.gready},
            keys.ring: {g.encode(): float(score) for g, score in self.ring.items()},
            keys.groups: {f.encode(): str(v).encode() for f, v in self.groups.items()},
            keys.fwait: {i.encode(): float(at) for i, at in self.fwait.items()},
            keys.fpending: {m.encode(): 0.0 for m in self.fpending},
            keys.flows: {i.encode(): record for i, record in self.flows.items()},
            keys.flow_expiry: {i.encode(): float(at) for i, at in self.flow_expiry.items()},
            keys.progress: {
                i.encode(): f"{at}|{len(receipt.encode())}|{receipt}".encode() + value
                for i, (at, receipt, value) in self.progress_entries.items()
            },
            keys.progress_at: {i.encode(): float(at) for i, at in self.progress_at.items()},
            keys.events: [(f"0-{seq}".encode(), entry) for seq, entry in self.events],
            keys.steps: steps,
            keys.waiting: {i.encode(): float(until) for i, until in self.waiting.items()},
        }
        return {key: value for key, value in out.items() if value}


@dataclass
class ServiceRecord:
    """A service key's fields (the key exists while `alive`)."""

    started_ms: int
    renewed_ms: int
    renewal: str
    alive: bool = True
    #: When a remote stop marked the key (service_stop.lua), if it did.
    stop_ms: int | None = None
    #: The task names it registered with (the key's `tasks` field, absent when none).
    tasks: tuple[str, ...] = ()


@dataclass
class ServicesModel:
    """One service namespace (lua/service_*.lua)."""

    seq: int = 0
    ids: list[int] = field(default_factory=list)  # newest first
    expiry: dict[int, int] = field(default_factory=dict)
    queues: dict[int, str] = field(default_factory=dict)
    services: dict[int, ServiceRecord] = field(default_factory=dict)
    stopped: set[int] = field(default_factory=set)  # ids whose private wake marker is set

    def register(self, expire_ms: int, renewal: str, now: int, tasks: tuple[str, ...] = ()) -> int:
        service_id = self.seq + 1
        for listed in self.ids[-GC_LIMIT:]:
            expires = self.expiry.get(listed)
            if expires is None or expires <= now:
                self.ids.remove(listed)
        self.seq = service_id
        self.ids.insert(0, service_id)
        self.expiry[service_id] = now + expire_ms
        self.queues[service_id] = f"{REGISTRATION} {QUEUE}"
        self.services[service_id] = ServiceRecord(now, now, renewal, tasks=tasks)
        return service_id

    def alive(self, service_id: int) -> bool:
        record = self.services.get(service_id)
        return record is not None and record.alive

    def renew(
        self, service_id: int, expire_ms: int, renewal: str, now: int
    ) -> tuple[bool, list[tuple[int, str, list[str]]]] | None:
        """Whether a stop was asked, and the dead services listed (id, registration,
        queues); None when the renewal is lost (nothing written)."""
        dead = [i for i in sorted(self.expiry, key=lambda i: (self.expiry[i], str(i).encode())) if self.expiry[i] < now]
        listed = []
        for i in dead[:DEAD_LIMIT]:
            registration, _, served = self.queues.get(i, " ").partition(" ")
            listed.append((i, registration, [q for q in served.split(",") if q]))
        if not self.alive(service_id):
            return None
        record = self.services[service_id]
        record.renewed_ms, record.renewal = now, renewal
        if service_id not in self.expiry:
            self.queues[service_id] = f"{REGISTRATION} {QUEUE}"
        self.expiry[service_id] = now + expire_ms
        return record.stop_ms is not None, listed

    def _delete(self, service_id: int) -> tuple[int, int]:
        deleted = int(self.alive(service_id))
        self.services.pop(service_id, None)
        removed = int(service_id in self.ids)
        if removed:
            self.ids.remove(service_id)
        self.expiry.pop(service_id, None)
        self.queues.pop(service_id, None)
        self.stopped.discard(service_id)
        return deleted, removed

    def deregister(self, service_id: int) -> tuple[int, int]:
        return self._delete(service_id)

    def forget_dead(self, service_id: int, registration: str, now: int) -> bool:
        expires = self.expiry.get(service_id)
        entry = self.queues.get(service_id)
        if entry is not None and not entry.startswith(f"{registration} "):
            return False  # the id belongs to another registration
        if self.alive(service_id) or (expires is not None and expires > now):
            return False
        self._delete(service_id)
        return True

    def stop(self, service_id: int, now: int) -> bool:
        """Remote stop: a live service's key is marked (the first stop's time stands) and
        its private wake marker raised; nothing happens to a dead or unknown one."""
        if not self.alive(service_id):
            return False
        record = self.services[service_id]
        record.stop_ms = now if record.stop_ms is None else record.stop_ms
        self.stopped.add(service_id)
        return True

    def expire(self, service_id: int) -> None:
        if service_id in self.services:
            self.services[service_id].alive = False

    def expiring(self, now: int) -> list[int]:
        """Live services whose key's TTL has run out at `now` (Redis: now > expiry)."""
        return [i for i, record in self.services.items() if record.alive and self.expiry.get(i, now) < now]

    def keyspace(self, keys: ServiceKeys) -> dict[str, Any]:
        out: dict[str, Any] = {
            keys.role("seq"): str(self.seq).encode() if self.seq else None,
            keys.role("ids"): [str(i).encode() for i in self.ids],
            keys.role("expiry"): {str(i).encode(): float(t) for i, t in self.expiry.items()},
            keys.role("queues"): {str(i).encode(): q.encode() for i, q in self.queues.items()},
        }
        for service_id, record in self.services.items():
            if record.alive:
                fields = {
                    b"host": HOST.encode(),
                    b"pid": str(PID).encode(),
                    b"started": str(record.started_ms).encode(),
                    b"renewed": str(record.renewed_ms).encode(),
                    b"renewal": record.renewal.encode(),
                    b"registration": REGISTRATION.encode(),
                    b"queues": QUEUE.encode(),
                }
                if record.tasks:
                    fields[b"tasks"] = ",".join(record.tasks).encode()
                if record.stop_ms is not None:
                    fields[b"stop"] = str(record.stop_ms).encode()
                out[keys.of(service_id).role("service")] = fields
        for service_id in self.stopped:
            out[keys.of(service_id).role("wake")] = {b"stop": 0.0}
        return {key: value for key, value in out.items() if value}


def read_keyspace(client: redis.Redis, queue_keys: QueueKeys, service_keys: ServiceKeys) -> dict[str, Any]:
    """Every key in Redis with its value (hash: dict, list: list, zset: member -> score,
    string: bytes), read with ``KEYS *`` and one pipeline. A key that is not one of the
    queue's or the namespace's is reported under ``<unexpected>``."""
    return read_snapshot(client, queue_keys, service_keys)[0]


def read_snapshot(
    client: redis.Redis, queue_keys: QueueKeys, service_keys: ServiceKeys
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """:func:`read_keyspace`, and the replies it was read from, exactly as Redis gave them
    (every key's name, and its whole value in Redis's order: a hash's fields as HGETALL
    lists them, a stream's entries with their ids), as a comparable tuple: two equal
    snapshots mean every command reading these keys answers the same."""
    hashes = {queue_keys.jobs, queue_keys.errors, queue_keys.counters, queue_keys.results, queue_keys.meta,
              queue_keys.groups, queue_keys.flows, queue_keys.progress, queue_keys.steps, service_keys.role("queues")}
    lists = {queue_keys.ready, service_keys.role("ids")}
    zsets = {queue_keys.scheduled, queue_keys.leased, queue_keys.owners, queue_keys.dead, queue_keys.wake, queue_keys.done,
             queue_keys.result_expiry, queue_keys.gready, queue_keys.ring, queue_keys.fwait, queue_keys.fpending,
             queue_keys.flow_expiry, queue_keys.progress_at, queue_keys.waiting}
    zsets.add(service_keys.role("expiry"))
    strings = {service_keys.role("seq")}
    service_prefix = service_keys.role("seq")[: -len("seq")]
    names = sorted(k.decode() if isinstance(k, bytes) else k for k in client.keys("*"))
    pipe = client.pipeline(transaction=False)
    read: list[str] = []
    unexpected: list[str] = []
    for key in names:
        own = key[len(service_prefix) :] if key.startswith(service_prefix) else ""
        if key in hashes or own.isdigit():
            pipe.hgetall(key)
        elif key in lists:
            pipe.lrange(key, 0, -1)
        elif key in zsets or (own.endswith(":wake") and own[: -len(":wake")].isdigit()):
            pipe.zrange(key, 0, -1, withscores=True)
        elif key in strings:
            pipe.get(key)
        elif key == queue_keys.finished:
            pipe.xrange(key)  # read as the job ids of its entries (their ids carry the clock)
        elif key == queue_keys.events:
            pipe.xrange(key)  # read whole: entry ids (0-<n>) and fields
        else:
            unexpected.append(key)
            continue
        read.append(key)
    out: dict[str, Any] = {}
    replies = pipe.execute()
    snapshot: list[Any] = [tuple(names)]
    for key, value in zip(read, replies):
        if isinstance(value, dict):
            snapshot.append((key, tuple(value.items())))
        elif key in (queue_keys.finished, queue_keys.events):
            snapshot.append((key, tuple((entry, tuple(fields.items())) for entry, fields in value)))
        else:
            snapshot.append((key, tuple(value) if isinstance(value, list) else value))
        if key == queue_keys.finished:
            value = [fields[b"id"] for _, fields in value]
        elif key == queue_keys.events:
            value = [(entry, dict(fields)) for entry, fields in value]
        elif isinstance(value, list) and value and isinstance(value[0], (tuple, list)) and key not in lists:
            value = {member: float(score) for member, score in value}
        out[key] = value
    if unexpected:
        out["<unexpected>"] = unexpected
    return out, tuple(snapshot)


def check_states(observed: dict[str, Any], k: QueueKeys) -> dict[str, list[str]]:
    """helpers.job_states, on a keyspace :func:`read_keyspace` read (no further command):
    every job id found anywhere in the queue -> the states it is found in; and the
    structural rules each state relies on: READY holds no id twice, each member of
    `gready` matches its job's meta, meta only for jobs that exist, the owners index
    holds exactly the receipts of LEASED, every receipt parses, errors only for dead jobs."""
    states: dict[str, list[str]] = {}
    job_ids = {raw.decode() for raw in observed.get(k.jobs, {})}
    for job_id in job_ids:
        states.setdefault(job_id, [])
    ready = [i.decode() for i in observed.get(k.ready, [])]
    assert len(ready) == len(set(ready)), f"an id twice in READY: {ready}"
    for i in ready:
        states.setdefault(i, []).append("ready")
    metas = {i.decode(): v.decode() for i, v in observed.get(k.meta, {}).items()}
    for raw in observed.get(k.gready, {}):
        member = raw.decode()
        group, rest = member.split("|", 1)
        rank, job_id = rest[:17], rest[18:]
        assert rest[17] == "|" and job_id in metas, f"gready member {member!r} without its meta"
        priority, pos, meta_group = metas[job_id].split("|", 2)
        assert (meta_group, chr(53 - int(priority)) + pos) == (group, rank), f"{member!r} != meta {metas[job_id]!r}"
        states.setdefault(job_id, []).append("ready")
    assert set(metas) <= job_ids, "meta kept for a job that is gone"
    for raw in observed.get(k.scheduled, {}):
        states.setdefault(raw.decode(), []).append("scheduled")
    receipts = list(observed.get(k.leased, {}))
    assert set(receipts) == set(observed.get(k.owners, {})), "owners index out of step with LEASED"
    for raw in receipts:
        parts = raw.decode().split("|", 4)
        assert len(parts) == 5 and parts[2].isdigit() and parts[3].isdigit(), raw
        states.setdefault(parts[4], []).append("leased")
    dead = observed.get(k.dead, {})
    for raw in dead:
        states.setdefault(raw.decode(), []).append("dead")
    assert set(observed.get(k.errors, {})) <= set(dead), "an error kept for a job not dead"
    return states


def brief(value: Any, most: int = 800) -> str:
    """``repr(value)``, cut short (payloads can be 100 KiB)."""
    text = repr(value)
    return text if len(text) <= most else text[:most] + f"... ({len(text)} chars)"


def describe_difference(expected: dict[str, Any], observed: dict[str, Any]) -> str:
    """The keys whose values differ, each value abbreviated (payloads can be 100 KiB)."""

    lines = []
    for key in sorted(set(expected) | set(observed)):
        if expected.get(key) != observed.get(key):
            lines.append(f"  {key}:\n    model: {brief(expected.get(key))}\n    redis: {brief(observed.get(key))}")
    return "the model and Redis differ:\n" + "\n".join(lines)


# -- backends -------------------------------------------------------------------------


class Backend:
    """Where each example's empty Redis comes from."""

    name = "?"

    def fresh(self) -> redis.Redis:
        raise NotImplementedError

    def done(self, client: redis.Redis) -> None:
        """Called once per example, after it ran (passed or failed)."""


class FakeBackend(Backend):
    """fakeredis[lua] with a fresh FakeServer per example."""

    name = "fake"

    def fresh(self) -> redis.Redis:
        return fakeredis.FakeRedis(server=fakeredis.FakeServer())

    def done(self, client: redis.Redis) -> None:
        client.close()


class RealBackend(Backend):
    """A real redis-server, flushed before each example (the client is the caller's)."""

    name = "real"

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def fresh(self) -> redis.Redis:
        self.client.flushall()
        return self.client


# -- sizes ------------------------------------------------------------------------------


def model_size() -> tuple[int, int]:
    """(examples, steps per example) for one backend.

    CI size is 200 x 50. ``PYQUEUE_DEEP=1`` raises it to 5000 x 100;
    ``PYQUEUE_MODEL_EXAMPLES`` / ``PYQUEUE_MODEL_STEPS`` override either figure.
    """
    deep = os.environ.get("PYQUEUE_DEEP", "") == "1"
    examples = int(os.environ.get("PYQUEUE_MODEL_EXAMPLES", 5000 if deep else 200))
    steps = int(os.environ.get("PYQUEUE_MODEL_STEPS", 100 if deep else 50))
    return examples, steps


def model_settings(examples: int, steps: int, **overrides: Any) -> settings:
    """Hypothesis settings for the machine: no deadline (a step is a few script calls,
    whose time varies with the machine's load), no too-slow health check."""
    options: dict[str, Any] = {
        "max_examples": examples,
        "stateful_step_count": steps,
        "deadline": None,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    }
    options.update(overrides)
    return settings(**options)


# -- strategies -----------------------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, chosen with the given integer weights; shrinks towards the
    first one."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda k: table[k])


_SMALL_PAYLOADS = st.one_of(
    st.just(b""),
    st.binary(max_size=12),
    st.sampled_from([b"\xff\xfe\x00", b"\x80", b"|", b"0|0|0|", "ünï".encode(), b"a" * 300]),
    st.text(max_size=6),  # a str payload is stored as UTF-8
)
#: Mostly small payloads (empty, non-UTF-8, '|'), now and then one of about 100 KiB.
PAYLOADS: st.SearchStrategy[bytes | str] = st.integers(0, 24).flatmap(
    lambda k: st.integers(0, 255).map(lambda b: bytes([b]) * 100_000 + b"|end") if k == 0 else _SMALL_PAYLOADS
)
JOB_IDS = st.sampled_from(IDS)
#: Shared values (1, 10, 50, 1000, 60000) make deadlines, due times and clock steps meet
#: exactly, which is where `<` versus `<=` bugs live.
DELAYS = weighted((3, st.just(0)), (3, st.sampled_from([1, 10, 50, 1000, 60_000, 2**40])), (2, st.integers(0, 120)))
MAX_ATTEMPTS = st.sampled_from([1, 1, 1, 2, 2, 3, None, 10_000])
LEASE_MS = weighted((3, st.sampled_from([60_000, 1000, 604_800_000])), (3, st.sampled_from([1, 10, 50])), (1, st.integers(1, 120)))
COUNTS = st.sampled_from([1, 2, 3, 1, 2, 0])
LIMITS = st.sampled_from([DEFAULT_MAINTENANCE_LIMIT, 1, 2, 3])
#: Clock steps in ms: mostly forwards (onto the shared values, a little past them, or
#: past everything), sometimes backwards.
CLOCK_STEPS = weighted(
    (4, st.sampled_from([1, 10, 49, 50, 51, 1000, 60_000])),
    (2, st.integers(1, 200)),
    (2, st.integers(100_000, 10_000_000)),
    (1, st.sampled_from([-1, -50, -1000])),
    (1, st.integers(-100, -1)),
)
#: Or the clock moves exactly to the next moment something happens (± 1 ms), as a worker
#: sleeping until next_due_ms, or a heartbeat timer, would: the `<` versus `<=` cases.
TARGETS: dict[str, tuple[str, int]] = {
    "until due": ("due", 0),
    "until due - 1": ("due", -1),
    "until due + 1": ("due", 1),
    "until a service expires": ("expiry", 0),
    "until a service expires + 1": ("expiry", 1),
    "until a tombstone expires - 1": ("done", -1),
    "until a tombstone expires": ("done", 0),
}
Wait = int | str
CLOCK_MOVES: st.SearchStrategy[Wait] = weighted(
    (5, CLOCK_STEPS),
    (3, st.sampled_from(["until due", "until due - 1", "until due + 1"])),
    (2, st.sampled_from(["until a service expires", "until a service expires + 1"])),
    (1, st.sampled_from(["until a tombstone expires - 1", "until a tombstone expires"])),
)
#: How long a worker waited before a call: often not at all.
WAITS: st.SearchStrategy[Wait] = weighted((1, st.just(0)), (1, CLOCK_MOVES))
#: When a heartbeat fires: often right at (or just after) a service's expiry.
HEARTBEATS: st.SearchStrategy[Wait] = weighted(
    (1, WAITS), (1, st.sampled_from(["until a service expires", "until a service expires + 1"]))
)
ERRORS = st.sampled_from(["", "boom", "ünï | \n", "x" * 2000])
NACK_DELAYS = weighted((2, st.none()), (1, st.sampled_from([0, 1, 10, 50, 1000])))  # None: backoff
BACKOFF_BASES = st.sampled_from([1, 10, 1000])
BACKOFF_CAPS = st.sampled_from([1, 100, 3_600_000, 2**40])
#: One nack in eight is final: to DEAD at once, whatever the attempt (more would
#: empty the queue so often that the planted bugs of results and tombstones hide).
NACK_FINALS = st.sampled_from([False] * 7 + [True])
SERVICE_EXPIRES = st.sampled_from([60_000, 120_000, 3_600_000])  # >= 60 s: real TTLs never fire in a test
#: A quarter of the calls are sent twice: the reply was lost and redis-py re-sent the
#: identical call (DESIGN §3.6): the second send must have no further effect.
SENT_TWICE = st.sampled_from([False, False, False, True])
DEAD_IDS = st.lists(st.sampled_from(IDS + (NEVER_ENQUEUED,)), min_size=0, max_size=4)
SERVICE_ENDINGS = st.sampled_from(["deregister", "stop", "forget"])
#: The task names a service registers with (none, as plain workers do, or some).
SERVICE_TASKS = st.sampled_from([(), (), ("emails.send",), ("a.b:<locals>.f", "reports-monthly")])


def forged_jobs() -> st.SearchStrategy[Job]:
    """Receipts nobody was given: unknown ids, or known ids with a made-up fence."""
    return st.builds(
        lambda owner, fence, attempt, job_id: Job(
            id=job_id, queue=QUEUE, payload=b"", fence=fence, attempt=attempt, max_attempts=1, deadline_ms=0,
            receipt=f"{owner}|forged|{fence}|{attempt}|{job_id}",
        ),
        st.sampled_from(OWNERS),
        st.integers(1, 10_000),
        st.integers(1, 3),
        st.sampled_from(IDS + (NEVER_ENQUEUED,)),
    )


@dataclass(frozen=True)
class LeaseCall:
    """A lease call as sent, kept so it can be sent again (a retry after a lost reply)."""

    owner: str
    call: str
    count: int
    lease_ms: int
    limit: int
    acks: tuple[Job, ...]


# -- the state machine ------------------------------------------------------------------


class LifecycleMachine(RuleBasedStateMachine):
    """Drives every transition through the driver, with the model alongside."""

    backend: ClassVar[Backend] = FakeBackend()
    lua_directory: ClassVar[Path | None] = None
    #: For the run's report: examples started, and keyspace checks made (one after the
    #: start of each example and one after every step).
    examples_run: ClassVar[int] = 0
    checks_run: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).examples_run += 1
        self.r = self.backend.fresh()
        self.now = T0
        self.model = QueueModel()
        self.svc = ServicesModel()
        self.workers: dict[str, Queue] = {}
        self.q = self.worker("solo")
        check_partitions(self.q)  # what every queue object does at its first call
        # Every machine runs with the queue's event stream on (lua/README.md section 2.5),
        # with a bound small enough that the model's trimming is checked too.
        assert self.q.set_events(EVENTS_BOUND) == EventsSetting(*self.model.set_events(EVENTS_BOUND))
        self.services = Services(self.r, namespace=NAMESPACE)
        if self.lua_directory is not None:  # Services has no lua_directory option (yet)
            self.services.scripts = Scripts(self.services.redis, self.lua_directory)
        self.service_handles: dict[int, Service] = {}
        #: Every lease ever handed out, by receipt (stale ones are reused on purpose).
        self.known: dict[str, Job] = {}
        self.history: list[LeaseCall] = []
        self.calls = 0
        self.max_fence = 0
        self.ok_acks: Counter[tuple[str, int]] = Counter()
        self.attempts_seen: dict[str, tuple[int, int]] = {}
        self.steps = 0
        #: The read-only scripts' answers (stats, get, peek, dead_list) on the keyspace
        #: and clock of `answered_on`: see `read_only`.
        self.answered_on: tuple[Any, ...] | None = None
        self.answers: dict[tuple[Any, ...], Any] = {}

    def teardown(self) -> None:
        self.backend.done(self.r)

    def worker(self, owner: str) -> Queue:
        """The queue as seen by the worker whose leases are held by ``owner``."""
        if owner not in self.workers:
            self.workers[owner] = Queue(
                QUEUE, self.r, owner=owner, keep_done_ms=KEEP_DONE_MS[owner], lua_directory=self.lua_directory
            )
        return self.workers[owner]

    def fresh_call(self) -> str:
        self.calls += 1
        return f"k{self.calls}"

    # -- drawing leases ---------------------------------------------------------------

    def draw_job(self, data: st.DataObject) -> Job:
        """A lease to act on: usually a current one, sometimes any earlier (probably
        stale) one, sometimes a forged receipt. Drawn (and printed) by receipt."""
        current = list(self.model.leases)
        kind = data.draw(st.sampled_from(["current", "current", "current", "old", "forged"]), label="kind")
        if kind == "current" and current:
            return self.known[data.draw(st.sampled_from(current), label="receipt")]
        if kind != "forged" and self.known:
            return self.known[data.draw(st.sampled_from(list(self.known)), label="receipt")]
        return data.draw(forged_jobs(), label="forged")

    def draw_jobs(self, data: st.DataObject, most: int) -> list[Job]:
        return [self.draw_job(data) for _ in range(data.draw(st.integers(1, most), label="how many"))]

    # -- checking answers ---------------------------------------------------------------

    def check_acks(self, jobs: Sequence[Job], got: Sequence[Outcome], expected: Sequence[str]) -> None:
        """Ack answers equal the model's, and `ok` comes at most once per job life."""
        assert [o.value for o in got] == list(expected), f"ack answers {got} != model {expected}"
        for job, outcome in zip(jobs, got):
            if outcome is Outcome.OK:
                life = (job.id, self.model.epoch[job.id])
                self.ok_acks[life] += 1
                assert self.ok_acks[life] == 1, f"ack answered ok twice in one life of {job.id!r}"

    def check_lease(self, expected: LeaseAnswer, jobs: list[Job], leased: Leased | None) -> None:
        """The leased jobs, ack answers, clock and next_due_ms equal the model's; new
        fences are larger than every fence before."""
        assert jobs == expected.jobs, f"leased {brief(jobs)} != model {brief(expected.jobs)}"
        if leased is not None:
            assert leased.now_ms == self.now
            assert leased.next_due_ms == expected.next_due_ms, (
                f"next_due_ms {leased.next_due_ms} != model {expected.next_due_ms}"
            )
        if not expected.replayed:
            for job in jobs:
                assert job.fence > self.max_fence, f"fence {job.fence} not above {self.max_fence}"
                self.max_fence = job.fence
        for job in jobs:
            self.known.setdefault(job.receipt, job)

    # -- rules: producing -------------------------------------------------------------

    @initialize(
        batch=st.lists(st.tuples(JOB_IDS, PAYLOADS, DELAYS, MAX_ATTEMPTS), max_size=12),
        services=st.lists(SERVICE_EXPIRES, min_size=1, max_size=3),
        held=st.lists(st.tuples(st.sampled_from(OWNERS), st.integers(1, 3), LEASE_MS), max_size=3),
        finished=st.lists(st.sampled_from(IDS + FINISHED_IDS), unique=True, max_size=14),
    )
    def a_busy_start(
        self,
        batch: list[tuple[str, bytes | str, int, int | None]],
        services: list[int],
        held: list[tuple[str, int, int]],
        finished: list[str],
    ) -> None:
        """Each example starts with up to 14 jobs already run and acked (tombstones, enough
        to trim), up to 12 jobs, 1 to 3 services and some leases held by workers
        (Hypothesis enables only some rules per example: this keeps examples without
        `enqueue` or `lease` from idling)."""
        self.start(finished, lambda: self.enqueue(list(batch)) if batch else None, services, held)

    def start(
        self, finished: list[str], enqueue: Callable[[], None], services: list[int], held: list[tuple[str, int, int]]
    ) -> None:
        """a_busy_start's steps, `enqueue` its batch. The finished jobs ran 50 ms before
        the example's clock (T0): leased then, the first one acked by a worker that keeps
        tombstones 1000 ms, the others by one that keeps them 50 ms (expiring at T0), all
        but the last one then, the last one at T0, in a call that trims the expired
        tombstones (at least TRIM_BATCH of them once 12 jobs finished) beside one still
        in force."""
        if finished:
            self.set_clock(self.now - 50)
            self.enqueue([(job_id, b"", 0, None) for job_id in finished])
            call = LeaseCall("solo", self.fresh_call(), len(finished), 60_000, DEFAULT_MAINTENANCE_LIMIT, ())
            self.lease_call(call)
            jobs = [self.known[r] for r in self.model.leases if r.startswith(f"solo|{call.call}|")]
            for owner, part, waited in (("ns.1.r0", jobs[:1], 0), ("solo", jobs[1:-1], 0), ("solo", jobs[1:][-1:], 50)):
                self.set_clock(self.now + waited)
                if part:
                    got = self.worker(owner).ack_many(part, now_ms=self.now)
                    self.check_acks(part, got, self.model.ack([j.receipt for j in part], self.now, KEEP_DONE_MS[owner]))
        enqueue()
        for expire_ms in services:
            self.register_a_service(expire_ms)
        for owner, count, lease_ms in held:
            self.a_worker_leases_and_works(owner, count, lease_ms, "keep", None, 0)

    @rule(
        batch=st.lists(
            st.tuples(JOB_IDS, PAYLOADS, DELAYS, MAX_ATTEMPTS), min_size=1, max_size=4
        ),
        sent_twice=SENT_TWICE,
    )
    def enqueue(self, batch: list[tuple[str, bytes | str, int, int | None]], sent_twice: bool = False) -> None:
        """One job (Queue.enqueue) or a batch (enqueue_many); ids from a small pool, so
        duplicates are common. `sent_twice`: the reply was lost and the same call was sent
        again. (No random ids: ids order sorted sets, and an example must replay the same.)"""
        for send in range(1 + sent_twice):
            if len(batch) == 1:
                job_id, payload, delay_ms, max_attempts = batch[0]
                got = [self.q.enqueue(payload, job_id=job_id, delay_ms=delay_ms, max_attempts=max_attempts, now_ms=self.now)]
            else:
                got = self.q.enqueue_many(
                    [NewJob(p, job_id=i, delay_ms=d, max_attempts=m) for i, p, d, m in batch], now_ms=self.now
                )
            expected = self.model.enqueue(
                [(i, p.encode() if isinstance(p, str) else p, d, m or DEFAULT_MAX_ATTEMPTS) for i, p, d, m in batch],
                self.now,
            )
            assert got == [Enqueued(i, added) for (i, *_), added in zip(batch, expected)], f"enqueue: {got}"

    @precondition(lambda self: self.model.done)
    @rule(data=st.data(), off_by=st.sampled_from([-1, 0, 1]))
    def a_producer_resends_after_the_ack(self, data: st.DataObject, off_by: int) -> None:
        """A producer's enqueue arrives again after its job ran and was acked: 1 ms before
        its tombstone expires (a duplicate), or at or after that (the id is free again)."""
        job_id = data.draw(st.sampled_from(sorted(self.model.done)), label="acked id")
        self.set_clock(self.model.done[job_id] + off_by)
        self.enqueue([(job_id, b"again", 0, None)])

    # -- rules: leasing and acking ------------------------------------------------------

    def lease_call(self, sent: LeaseCall) -> None:
        """Send one lease call (ack some, lease some) and compare everything it answers."""
        worker = self.worker(sent.owner)
        receipts = [j.receipt for j in sent.acks]
        expected = self.model.lease(
            sent.owner, sent.call, sent.count, sent.lease_ms, sent.limit, receipts, self.now, KEEP_DONE_MS[sent.owner]
        )
        if len(sent.acks) == 1 and sent.limit == DEFAULT_MAINTENANCE_LIMIT:  # Queue.ack_and_lease
            outcome, jobs = worker.ack_and_lease(
                sent.acks[0], lease_ms=sent.lease_ms, count=sent.count, call=sent.call, now_ms=self.now
            )
            self.check_acks(sent.acks, [outcome], expected.acks)
            self.check_lease(expected, jobs, None)
            return
        leased = worker.lease_call(
            ack=sent.acks, count=sent.count, lease_ms=sent.lease_ms, limit=sent.limit, call=sent.call, now_ms=self.now
        )
        self.check_acks(sent.acks, leased.acks, expected.acks)
        self.check_lease(expected, leased.jobs, leased)

    @rule(
        owner=st.sampled_from(OWNERS),
        count=COUNTS,
        lease_ms=LEASE_MS,
        limit=LIMITS,
        woken=st.booleans(),
        waited=WAITS,
        sent_twice=SENT_TWICE,
    )
    def lease(
        self, owner: str, count: int, lease_ms: int, limit: int, woken: bool, waited: Wait, sent_twice: bool
    ) -> None:
        """A worker leases after waiting. `woken`: it was blocked on the wake marker
        (BZPOPMIN, here without blocking), which consumes the marker if it was raised.
        `sent_twice`: the reply was lost and the same call was sent again (it must return
        the same leases). Call tokens are the machine's ("k1", "k2"...), never random:
        receipts order sorted sets, and an example must replay exactly the same."""
        self.wait(waited)
        worker = self.worker(owner)
        if woken:
            popped = self.r.zpopmin(worker.spec.keys.wake)
            assert popped == ([(b"wake", 0.0)] if self.model.wake else []), "wake marker differs from the model"
            self.model.wake = False
        sent = LeaseCall(owner, self.fresh_call(), count, lease_ms, limit, ())
        self.history.append(sent)
        for _ in range(1 + sent_twice):
            self.lease_call(sent)

    @rule(
        owner=st.sampled_from(OWNERS),
        count=st.integers(1, 3),
        lease_ms=LEASE_MS,
        then=st.sampled_from(["keep", "ack", "nack", "keep", "release", "extend"]),
        delay_ms=NACK_DELAYS,
        waited=WAITS,
    )
    def a_worker_leases_and_works(
        self, owner: str, count: int, lease_ms: int, then: str, delay_ms: int | None, waited: Wait
    ) -> None:
        """The worker cycle in one step: after waiting, lease, then ack / nack / release /
        extend what was leased, or keep it (to finish, expire or be scrubbed later)."""
        self.wait(waited)
        worker, call = self.worker(owner), self.fresh_call()
        leased = worker.lease_call(count=count, lease_ms=lease_ms, call=call, now_ms=self.now)
        self.history.append(LeaseCall(owner, call, count, lease_ms, DEFAULT_MAINTENANCE_LIMIT, ()))
        expected = self.model.lease(owner, call, count, lease_ms, DEFAULT_MAINTENANCE_LIMIT, [], self.now)
        self.check_lease(expected, leased.jobs, leased)
        for job in leased.jobs:
            if then == "ack":
                expected_acks = self.model.ack([job.receipt], self.now, KEEP_DONE_MS[owner])
                self.check_acks([job], [worker.ack(job, now_ms=self.now)], expected_acks)
            elif then == "nack":
                got = worker.nack(job, "failed", delay_ms=delay_ms, backoff_base_ms=10, now_ms=self.now)
                assert got == self.model.nack(job.receipt, b"failed", delay_ms, 10, 3_600_000, self.now)
            elif then == "release":
                assert [o.value for o in worker.release([job], now_ms=self.now)] == self.model.release(
                    [job.receipt], self.now
                )
            elif then == "extend":
                assert worker.extend([job], lease_ms, now_ms=self.now) == self.model.extend([job.receipt], lease_ms, self.now)

    @rule(data=st.data(), sent_twice=SENT_TWICE)
    def ack(self, data: st.DataObject, sent_twice: bool) -> None:
        """Queue.ack of one lease, or ack_many of several (repeats allowed)."""
        jobs = self.draw_jobs(data, 3)
        for _ in range(1 + sent_twice):
            got = [self.q.ack(jobs[0], now_ms=self.now)] if len(jobs) == 1 else self.q.ack_many(jobs, now_ms=self.now)
            self.check_acks(jobs, got, self.model.ack([j.receipt for j in jobs], self.now, KEEP_DONE_MS["solo"]))

    @rule(
        data=st.data(),
        owner=st.sampled_from(OWNERS),
        count=COUNTS,
        lease_ms=LEASE_MS,
        limit=LIMITS,
        sent_twice=SENT_TWICE,
    )
    def ack_and_lease(
        self, data: st.DataObject, owner: str, count: int, lease_ms: int, limit: int, sent_twice: bool
    ) -> None:
        """Ack one or more leases and lease more in the same call (lua/lease.lua)."""
        sent = LeaseCall(owner, self.fresh_call(), count, lease_ms, limit, tuple(self.draw_jobs(data, 3)))
        self.history.append(sent)
        for _ in range(1 + sent_twice):
            self.lease_call(sent)

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def a_late_duplicate_of_a_lease_call(self, data: st.DataObject) -> None:
        """One of the last lease calls arrives again, later (a retry after a timeout)."""
        self.lease_call(data.draw(st.sampled_from(self.history[::-1][:4]), label="call"))

    # -- rules: failing, extending, giving back --------------------------------------

    @rule(
        data=st.data(),
        error=ERRORS,
        delay_ms=NACK_DELAYS,
        backoff_base_ms=BACKOFF_BASES,
        backoff_cap_ms=BACKOFF_CAPS,
        final=NACK_FINALS,
        sent_twice=SENT_TWICE,
    )
    def nack(
        self,
        data: st.DataObject,
        error: str,
        delay_ms: int | None,
        backoff_base_ms: int,
        backoff_cap_ms: int,
        final: bool,
        sent_twice: bool,
    ) -> None:
        """Fail a lease: explicit delay, or backoff (None); or final, to DEAD at once."""
        job = self.draw_job(data)
        for _ in range(1 + sent_twice):
            got = self.q.nack(
                job, error, delay_ms=delay_ms, backoff_base_ms=backoff_base_ms, backoff_cap_ms=backoff_cap_ms,
                now_ms=self.now, final=final,
            )
            expected = self.model.nack(
                job.receipt, error.encode(), delay_ms, backoff_base_ms, backoff_cap_ms, self.now, final
            )
            assert got == expected, f"nack answered {got}, model {expected}"

    @rule(data=st.data(), lease_ms=LEASE_MS, sent_twice=SENT_TWICE)
    def extend(self, data: st.DataObject, lease_ms: int, sent_twice: bool) -> None:
        jobs = self.draw_jobs(data, 3)
        for _ in range(1 + sent_twice):
            got = self.q.extend(jobs, lease_ms, now_ms=self.now)
            expected = self.model.extend([j.receipt for j in jobs], lease_ms, self.now)
            assert got == expected, f"extend answered {got}, model {expected}"

    @rule(data=st.data(), sent_twice=SENT_TWICE)
    def release(self, data: st.DataObject, sent_twice: bool) -> None:
        jobs = self.draw_jobs(data, 3)
        for _ in range(1 + sent_twice):
            got = [o.value for o in self.q.release(jobs, now_ms=self.now)]
            expected = self.model.release([j.receipt for j in jobs], self.now)
            assert got == expected, f"release answered {got}, model {expected}"

    # -- rules: maintenance ----------------------------------------------------------------

    @rule(
        limit=st.sampled_from([1, 2, 3, DEFAULT_MAINTENANCE_LIMIT]),
        waited=weighted((2, WAITS), (1, st.integers(100_000, 10_000_000))),
        sent_twice=SENT_TWICE,
    )
    def promote(self, limit: int, waited: Wait, sent_twice: bool) -> None:
        """After waiting (sometimes past everything due), promote until no limit is hit."""
        self.wait(waited)
        for _ in range(1 + sent_twice):
            for _ in range(100):
                got = self.q.promote(limit, now_ms=self.now)
                expected = self.model.promote(limit, self.now)
                assert got == expected, f"promote answered {got}, model {expected}"
                if not got.more:
                    break

    @rule(
        data=st.data(), value=st.sampled_from([b"raw", "text", {"n": 1}, None]),
        ttl_ms=st.sampled_from([10, 1000, 100_000]), max_results=st.sampled_from([1, 2, 1000]), sent_twice=SENT_TWICE,
    )
    def ack_result(self, data: st.DataObject, value: object, ttl_ms: int, max_results: int, sent_twice: bool) -> None:
        """Ack one lease keeping its result (small caps and short lives, so trimming
        happens); then its result reads back as the model says."""
        job = self.draw_job(data)
        for _ in range(1 + sent_twice):
            got = self.q.ack_result(job, value, result_ttl_ms=ttl_ms, max_results=max_results, now_ms=self.now)
            expected = self.model.ack_result(
                [(job.receipt, encode_result(value))], self.now, KEEP_DONE_MS["solo"], ttl_ms, max_results
            )
            self.check_acks([job], [got], expected)
        self.check_result(job.id)

    @rule(job_id=st.sampled_from(IDS + (NEVER_ENQUEUED,)))
    def check_result(self, job_id: str) -> None:
        """result answers as the model: ok with the value, dead, pending, done, unknown;
        now, and as of the instant a kept result expires (result takes the clock as an
        argument and writes nothing, so reading at a later time draws nothing more and
        changes nothing)."""
        expires_ms = self.model.result_expiry.get(job_id, -1)
        for now in (self.now, expires_ms) if expires_ms > self.now else (self.now,):
            got = self.q.result(job_id, now_ms=now)
            state, finished_ms, value = self.model.result(job_id, now)
            expected = JobResult(
                job_id, QUEUE, state, decode_result(value) if state == "ok" else None,
                value.decode("utf-8", "replace") if state == "dead" else "", finished_ms,
            )
            assert got == expected, f"result at {now} {got} != model {expected}"

    @rule(job_id=st.sampled_from(IDS + (NEVER_ENQUEUED,)), sent_twice=SENT_TWICE)
    def cancel(self, job_id: str, sent_twice: bool) -> None:
        """Cancel a job in whatever state it is (a leased one's lease ends with it); a
        re-send finds it done."""
        for _ in range(1 + sent_twice):
            got = self.q.cancel(job_id, now_ms=self.now)
            expected = self.model.cancel(job_id, self.now, self.q.spec.keep_done_ms)
            assert got.state == expected, f"cancel {job_id!r} answered {got.state}, model {expected}"

    @rule(
        count=st.sampled_from([0, 1, 3, 10]), period_ms=st.sampled_from([100, 1000, 5000]),
        burst=st.sampled_from([1, 2, 5]), sent_twice=SENT_TWICE,
    )
    def limit(self, count: int, period_ms: int, burst: int, sent_twice: bool) -> None:
        """Cap the lease rate (count 0 lifts the cap); a re-send changes nothing more."""
        for _ in range(1 + sent_twice):
            got, expected = self.q.limit(count, period_ms, burst=burst), self.model.limit(count, period_ms, burst)
            assert got == expected, f"limit answered {got}, model {expected}"

    @rule(pause=st.booleans(), sent_twice=SENT_TWICE)
    def pause_or_resume(self, pause: bool, sent_twice: bool) -> None:
        """Pause the queue (it leases nothing until resumed) or resume it; a re-send
        changes nothing more."""
        for _ in range(1 + sent_twice):
            if pause:
                got, expected = self.q.pause(now_ms=self.now), self.model.pause(self.now)
            else:
                got, expected = self.q.resume(now_ms=self.now), self.model.resume()
            assert got == expected, f"{'pause' if pause else 'resume'} answered {got}, model {expected}"

    @rule(owner=st.sampled_from(OWNERS), limit=LIMITS, sent_twice=SENT_TWICE)
    def scrub(self, owner: str, limit: int, sent_twice: bool) -> None:
        for _ in range(1 + sent_twice):
            got = self.q.scrub(owner, limit=limit, now_ms=self.now)
            expected = self.model.scrub(owner, limit, self.now)
            assert got == expected, f"scrub answered {got}, model {expected}"

    # -- rules: dead letters ----------------------------------------------------------------

    def check_dead_list(self, offset: int, limit: int) -> None:
        got = self.q.dead_list(offset, limit)
        expected = self.model.dead_list(offset, limit)
        assert got == expected, f"dead_list answered {brief(got)}, model {brief(expected)}"

    @rule(
        ids=st.one_of(st.none(), DEAD_IDS),
        limit=st.sampled_from([100, 1, 2]),
        offset=st.integers(0, 2),
        sent_twice=SENT_TWICE,
    )
    def dead_replay(self, ids: list[str] | None, limit: int, offset: int, sent_twice: bool) -> None:
        """List a page of dead letters, then replay the given ids (unknown, repeated or not
        dead ones are skipped), or the `limit` oldest (None); a re-send names the same ids."""
        self.check_dead_list(offset, limit)
        chosen = ids if ids is not None else [job.id for job in self.model.dead_list(0, limit).jobs]
        assert self.q.dead_replay(ids, limit=limit, now_ms=self.now) == self.model.dead_replay(chosen, self.now)
        if sent_twice:
            assert self.q.dead_replay(chosen, now_ms=self.now) == self.model.dead_replay(chosen, self.now)

    @rule(
        ids=st.one_of(st.none(), DEAD_IDS),
        limit=st.sampled_from([100, 1, 2]),
        offset=st.integers(0, 2),
        sent_twice=SENT_TWICE,
    )
    def dead_purge(self, ids: list[str] | None, limit: int, offset: int, sent_twice: bool) -> None:
        """List a page of dead letters, then purge the given ids, or the `limit` oldest."""
        self.check_dead_list(offset, limit)
        chosen = ids if ids is not None else [job.id for job in self.model.dead_list(0, limit).jobs]
        assert self.q.dead_purge(ids, limit=limit) == self.model.dead_purge(chosen)
        if sent_twice:
            assert self.q.dead_purge(chosen) == self.model.dead_purge(chosen)

    # -- rules: services ----------------------------------------------------------------

    @rule(expire_ms=SERVICE_EXPIRES, tasks=SERVICE_TASKS)
    def register_a_service(self, expire_ms: int, tasks: tuple[str, ...] = ()) -> None:
        service = self.services.register(
            [QUEUE], expire_ms=expire_ms, host=HOST, pid=PID, registration=REGISTRATION, tasks=tasks, now_ms=self.now
        )
        service_id = self.svc.register(expire_ms, service.renewal, self.now, tasks)
        assert (service.id, service.started_ms, service.owner) == (
            service_id, self.now, f"{NAMESPACE}.{service_id}.{REGISTRATION}"
        )
        assert {i.id: i.tasks for i in self.services.list(now_ms=self.now)}[service_id] == tasks
        self.service_handles[service.id] = service

    @precondition(lambda self: self.service_handles)
    @rule(data=st.data(), expire_ms=SERVICE_EXPIRES, limit=LIMITS, waited=HEARTBEATS)
    def renew_and_reap(self, data: st.DataObject, expire_ms: int, limit: int, waited: Wait) -> None:
        """A worker's heartbeat, after waiting: renew (lost if its key is gone), then scrub
        every dead service it reports in every queue it served, then forget it."""
        self.wait(waited)
        service = data.draw(st.sampled_from(list(self.service_handles.values())), label="service")
        if not self.svc.alive(service.id):
            with pytest.raises(ServiceLost):
                self.services.renew(service, expire_ms=expire_ms, now_ms=self.now)
            return
        renewed = self.services.renew(service, expire_ms=expire_ms, now_ms=self.now)
        expected = self.svc.renew(service.id, expire_ms, service.renewal, self.now)
        assert expected is not None
        assert renewed.stop == expected[0]
        assert [(d.id, d.registration, d.owner, d.queues) for d in renewed.dead] == [
            (i, reg, f"{NAMESPACE}.{i}.{reg}", qs) for i, reg, qs in expected[1]
        ]
        for gone in renewed.dead:
            for name in gone.queues:
                assert name == QUEUE
                for _ in range(100):
                    scrubbed = self.q.scrub(gone.owner, limit=limit, now_ms=self.now)
                    assert scrubbed == self.model.scrub(gone.owner, limit, self.now)
                    if not scrubbed.more:
                        break
            assert self.services.forget_dead(gone.id, gone.registration, now_ms=self.now) == self.svc.forget_dead(
                gone.id, gone.registration, self.now
            )

    @rule(data=st.data(), how=SERVICE_ENDINGS)
    def a_service_ends(self, data: st.DataObject, how: str) -> None:
        """A service deregisters itself, is stopped remotely (key marked, private wake
        marker raised), or a reaper forgets it (any id: unknown and live ones too, naming
        its registration or another). Keys whose TTL runs out expire as the clock moves
        (see `set_clock`)."""
        service_id = data.draw(st.integers(1, self.svc.seq + 1), label="service id")
        if how == "forget":
            registration = data.draw(st.sampled_from(REGISTRATIONS), label="registration")
            assert self.services.forget_dead(service_id, registration, now_ms=self.now) == self.svc.forget_dead(
                service_id, registration, self.now
            )
        elif service_id not in self.service_handles:
            return
        elif how == "deregister":
            got = self.services.deregister(self.service_handles[service_id], now_ms=self.now)
            assert got == self.svc.deregister(service_id)
        else:
            stopped = self.services.stop(service_id, now_ms=self.now)
            assert stopped == self.svc.stop(service_id, self.now)
            again = data.draw(st.sampled_from([None, None, 0, 1, 1000]), label="stopped again after")
            if again is not None:  # an operator's second `pyqueue stop`, or a re-sent call
                assert self.services.stop(service_id, now_ms=self.now + again) == stopped
                self.svc.stop(service_id, self.now + again)
            if stopped and data.draw(st.booleans(), label="renews at once"):
                # The stopped worker's next heartbeat: it learns of the stop, and renews.
                service = self.service_handles[service_id]
                renewed = self.services.renew(service, now_ms=self.now)
                expected = self.svc.renew(service_id, DEFAULT_EXPIRE_MS, service.renewal, self.now)
                assert expected is not None and renewed.stop and expected[0]

    # -- rules: time ----------------------------------------------------------------------

    @rule(waited=CLOCK_MOVES)
    def time_passes(self, waited: Wait) -> None:
        """The server clock moves: a little, exactly onto a deadline, past every deadline,
        or backwards (a failover to a server whose clock lags)."""
        self.wait(waited)

    def wait(self, waited: Wait) -> None:
        """Let `waited` ms pass, or move the clock to a target of TARGETS: the earliest due
        time or lease deadline, or service expiry, not before now."""
        if isinstance(waited, int):
            self.set_clock(self.now + waited)
            return
        what, off_by = TARGETS[waited]
        if what == "due":
            # Never onto a waiting job's due time (WAIT_DUE_MS, 2^50 ms: no server clock
            # gets there); at clocks from 1e14 ms fakeredis's Lua writes numbers as
            # "1.1258999068426e+15" in range bounds and ZADD scores (Redis's does not).
            times = [t for t in self.model.scheduled.values() if t < WAIT_DUE_MS]
            times += [lease.deadline_ms for lease in self.model.leases.values()]
        elif what == "done":
            times = list(self.model.done.values())
        else:
            times = list(self.svc.expiry.values())
        future = [t for t in times if t >= self.now]
        if future:
            self.set_clock(min(future) + off_by)

    def set_clock(self, now: int) -> None:
        """Move the server clock. Service keys whose TTL runs out on the way expire: the
        model's clock is not Redis's, so the machine deletes them as Redis would (a key
        expires when now > its expiry; a clock going back does not bring it back)."""
        self.now = max(0, now)
        for service_id in self.svc.expiring(self.now):
            self.r.delete(self.services.keys.of(service_id).role("service"))
            self.svc.expire(service_id)

    # -- after every step ------------------------------------------------------------

    @invariant()
    def everything_agrees(self) -> None:
        """The keyspace equals the model; the §3 invariants hold; stats agree."""
        type(self).checks_run += 1
        expected = {**self.model.keyspace(self.q.spec.keys), **self.svc.keyspace(self.services.keys)}
        observed, snapshot = read_snapshot(self.r, self.q.spec.keys, self.services.keys)
        assert observed == expected, describe_difference(expected, observed)
        if (snapshot, self.now) != self.answered_on:
            self.answered_on, self.answers = (snapshot, self.now), {}

        # Single state (DESIGN §3.1), and the structural checks job_states makes.
        for job_id, states in check_states(observed, self.q.spec.keys).items():
            assert len(states) == 1, f"{job_id!r} is in {states}"
            assert states[0] == self.model.state_of(job_id), f"{job_id!r}: {states} != model {self.model.state_of(job_id)}"

        # Fencing (§3.3): at most one valid lease per job.
        leased_ids = [receipt_id(r.decode()) for r in observed.get(self.q.spec.keys.leased, {})]
        assert len(leased_ids) == len(set(leased_ids)), f"two valid leases of one job: {leased_ids}"

        # Attempts never go down within a job's life (a dead_replay starts a new count).
        for raw_id, record in observed.get(self.q.spec.keys.jobs, {}).items():
            job_id = raw_id.decode()
            attempts = int(record.split(b"|", 1)[0])
            epoch = self.model.epoch[job_id]
            before = self.attempts_seen.get(job_id)
            if before is not None and before[0] == epoch:
                assert attempts >= before[1], f"attempts of {job_id!r} went down: {before[1]} -> {attempts}"
            self.attempts_seen[job_id] = (epoch, attempts)

        # dead_list agrees too: one page, whose offset and size vary from step to step.
        if self.model.dead:
            self.steps += 1
            offset, limit = self.steps % 3, 1 + self.steps % 2
            got = self.read_only("dead_list", offset, limit)
            expected_page = self.model.dead_list(offset, limit)
            assert got == expected_page, f"dead_list answered {brief(got)}, model {brief(expected_page)}"

        # Counters, counts and lag; `acked` (derived by the script) equals the ok answers.
        stats = self.read_only("stats")
        assert stats == self.model.stats(self.now), f"stats {stats} != model {self.model.stats(self.now)}"
        assert stats.acked == self.model.acked_ok == sum(self.ok_acks.values())

        # get agrees for three ids a step (rotating over all of them, and one never enqueued).
        looked_up = IDS + (NEVER_ENQUEUED,)
        for i in range(3):
            job_id = looked_up[(self.steps * 3 + i) % len(looked_up)]
            got, expected_info = self.read_only("get", job_id), self.model.get(job_id, self.now)
            assert got == expected_info, f"get({job_id!r}) answered {got}, model {expected_info}"
        self.steps += 1

        # peek (the many-queue worker's probe) agrees: READY's length and the next due time.
        peeked = self.read_only("peek")
        assert peeked == Peeked(self.now, self.model.peek_ready(), self.model.next_due_ms()), f"peek {peeked}"

    def read_only(self, verb: str, *args: Any) -> Any:
        """What the read-only script `verb` answers now, on the keyspace just read. Each
        is a function of the keys it reads, its arguments and the clock (it is given
        `now_ms`), so on a keyspace and clock equal to the last check's (a step that
        changed nothing: a stale ack, a read, a call sent twice), with the same
        arguments, its answer was already had: it is called once per keyspace, clock and
        arguments, and every check of its answer against the model is made every time.
        (A mutant that makes it write is seen by the next keyspace read: its writes make
        that keyspace another one.)"""
        key = (verb, *args)
        if key not in self.answers:
            if verb == "stats":
                self.answers[key] = self.q.stats(now_ms=self.now)
            elif verb == "get":
                self.answers[key] = self.q.get(args[0], with_payload=True, now_ms=self.now)
            elif verb == "peek":
                self.answers[key] = self.q.peek(now_ms=self.now)
            else:
                assert verb == "dead_list", verb
                self.answers[key] = self.q.dead_list(*args)
        return self.answers[key]


#: Fair scheduling's draws: groups whose lexicographic ranges touch ("a" and "a}": the
#: range of "a" must not hold "a}"'s members), a non-ASCII one, and priorities at the ends.
FAIR_GROUPS = st.sampled_from([None, "A", "A", "B", "a", "a}", "ü"])
PRIORITIES = st.sampled_from([0, 0, 1, -1, 5, -5])


class FairLifecycleMachine(LifecycleMachine):
    """The machine with fair scheduling (lua/README.md section 2.1): jobs with groups and
    priorities, and group caps, beside every rule of the plain machine. Each example
    starts with a default cap of 1, so that groups reach their cap and park often."""

    def __init__(self) -> None:
        super().__init__()
        assert self.q.set_group_limit(1) is True
        assert self.model.set_group_limit("", 1) == (1, 0)

    @initialize(
        batch=st.lists(st.tuples(JOB_IDS, PAYLOADS, DELAYS, MAX_ATTEMPTS, PRIORITIES, FAIR_GROUPS), max_size=12),
        services=st.lists(SERVICE_EXPIRES, min_size=1, max_size=3),
        held=st.lists(st.tuples(st.sampled_from(OWNERS), st.integers(1, 3), LEASE_MS), max_size=3),
        finished=st.lists(st.sampled_from(IDS + FINISHED_IDS), unique=True, max_size=14),
    )
    def a_busy_start(  # type: ignore[override]
        self,
        batch: list[tuple[str, bytes | str, int, int | None, int, str | None]],
        services: list[int],
        held: list[tuple[str, int, int]],
        finished: list[str],
    ) -> None:
        """The plain machine's start, its jobs with groups and priorities (and some
        without): the leases held from the start fill groups to their cap."""
        self.start(finished, lambda: self.enqueue_fair(batch, False) if batch else None, services, held)

    @rule(
        batch=st.lists(st.tuples(JOB_IDS, PAYLOADS, DELAYS, MAX_ATTEMPTS, PRIORITIES, FAIR_GROUPS), min_size=1, max_size=4),
        sent_twice=SENT_TWICE,
    )
    def enqueue_fair(self, batch: list[tuple[str, bytes | str, int, int | None, int, str | None]], sent_twice: bool) -> None:
        """Enqueue jobs with groups and priorities (and some without)."""
        for _ in range(1 + sent_twice):
            if len(batch) == 1:
                job_id, payload, delay_ms, max_attempts, priority, group = batch[0]
                got = [self.q.enqueue(payload, job_id=job_id, delay_ms=delay_ms, max_attempts=max_attempts,
                                      priority=priority, group=group, now_ms=self.now)]
            else:
                got = self.q.enqueue_many(
                    [NewJob(p, job_id=i, delay_ms=d, max_attempts=m, priority=pr, group=g) for i, p, d, m, pr, g in batch],
                    now_ms=self.now,
                )
            expected = self.model.enqueue(
                [(i, p.encode() if isinstance(p, str) else p, d, m or DEFAULT_MAX_ATTEMPTS, pr, g)
                 for i, p, d, m, pr, g in batch],
                self.now,
            )
            assert got == [Enqueued(i, added) for (i, *_), added in zip(batch, expected)], f"enqueue: {got}"

    @rule(offset=st.sampled_from([0, 0, 1]), limit=st.sampled_from([1, 2, 100]))
    def check_groups(self, offset: int, limit: int) -> None:
        """groups (read only) answers as the model: the ring's order, counts and caps."""
        got = self.q.groups(offset, limit)
        assert got == self.model.groups_page(offset, limit, QUEUE), f"groups {got} != model"

    @rule(group=st.sampled_from(["", "", "A", "a}"]), cap=st.sampled_from([None, 0, 1, 2, 3]), sent_twice=SENT_TWICE)
    def set_group_limit(self, group: str, cap: int | None, sent_twice: bool) -> None:
        """Set, change or lift the default cap or one group's own."""
        for _ in range(1 + sent_twice):
            got = self.q.set_group_limit(cap, group=group or None)
            arg: int | str = ("" if group else 0) if cap is None else cap
            changed, _ = self.model.set_group_limit(group, arg)
            assert got == bool(changed), f"set_group_limit answered {got}, model {changed}"


#: The rules of job control (issue #10). A mutation test of a script they do not touch
#: runs without them: each rule of the machine is drawn as often as any other, so every
#: rule added makes each other rule rarer per example.
JOB_CONTROL_RULES = ("cancel", "limit", "pause_or_resume", "ack_result", "check_result")


#: Jobs that wait for others: two ids of their own, and one of the plain pool (a
#: duplicate while that job exists).
FLOW_IDS = ("w0", "w1", "a")
#: What they wait for: jobs of this queue (which the machine also runs) and of another.
FLOW_REFS = st.lists(
    st.tuples(st.sampled_from([QUEUE, QUEUE, "other"]), st.sampled_from(IDS[:4] + (NEVER_ENQUEUED,))),
    min_size=1, max_size=4,
)
FLOW_CHECKS = st.sampled_from([1, 50, 1000])
#: Flows' records: a few ids, so records are kept again, found in force, or expired.
RECORD_IDS = tuple(f"f{i}" for i in range(14))


class FlowLifecycleMachine(LifecycleMachine):
    """The machine with flows (lua/README.md section 2.2): jobs that wait for others,
    armed, reported to (ok or failed, under either policy, sent twice, for jobs they do
    not wait for), cancelled, released and then leased like any job, beside every rule
    of the plain machine."""

    @rule(job_id=st.sampled_from(FLOW_IDS), payload=PAYLOADS, max_attempts=MAX_ATTEMPTS, check_ms=FLOW_CHECKS,
          refs=FLOW_REFS, sent_twice=SENT_TWICE)
    def flow_wait(self, job_id: str, payload: bytes | str, max_attempts: int | None, check_ms: int,
                  refs: list[tuple[str, str]], sent_twice: bool) -> None:
        for _ in range(1 + sent_twice):
            got = self.q.flow_wait(NewJob(payload, job_id=job_id, max_attempts=max_attempts), refs,
                                   check_ms=check_ms, now_ms=self.now)
            expected = self.model.flow_wait(
                job_id, payload.encode() if isinstance(payload, str) else payload, max_attempts or DEFAULT_MAX_ATTEMPTS,
                check_ms, [f"{queue}\t{ref}" for queue, ref in refs], self.now,
            )
            assert got == expected, f"flow_wait {job_id!r} answered {got}, model {expected}"

    @rule(data=st.data(), policy=st.sampled_from(["fail", "continue"]), check_ms=FLOW_CHECKS, sent_twice=SENT_TWICE)
    def flow_done(self, data: st.DataObject, policy: str, check_ms: int, sent_twice: bool) -> None:
        job_id = data.draw(st.sampled_from(FLOW_IDS), label="waiting job")
        waited = sorted(m.split("\t", 1)[1] for m in self.model.fpending if m.startswith(job_id + "\t"))
        refs = st.sampled_from(waited + [f"{QUEUE}\t{NEVER_ENQUEUED}", f"other\t{IDS[0]}"])
        ended = data.draw(st.lists(st.tuples(refs, st.sampled_from(["ok", "failed"])), max_size=4), label="ended")
        for _ in range(1 + sent_twice):
            got = self.q.flow_done(job_id, [(*ref.split("\t", 1), how) for ref, how in ended], policy=policy,
                                   check_ms=check_ms, now_ms=self.now)
            expected = self.model.flow_done(job_id, policy, check_ms, ended, self.now)
            assert (got.state, got.counted) == expected, f"flow_done {job_id!r}: {got}, model {expected}"

    @rule(data=st.data(), policy=st.sampled_from(["fail", "continue"]), how=st.sampled_from(["ok", "ok", "failed"]),
          sent_twice=SENT_TWICE)
    def flow_done_of_one(self, data: st.DataObject, policy: str, how: str, sent_twice: bool) -> None:
        """One job that a waiting job waits for ended, reported alone, as the worker that
        acked it reports it: while others are pending the waiting job stays armed,
        except for a failure under 'fail'. (flow_done's draws rarely hit a pending
        member alone: this rule does on every step with something armed.)"""
        pending = sorted(self.model.fpending)
        if not pending:
            return
        job_id, ref = data.draw(st.sampled_from(pending), label="pending member").split("\t", 1)
        for _ in range(1 + sent_twice):
            got = self.q.flow_done(job_id, [(*ref.split("\t", 1), how)], policy=policy, check_ms=1000, now_ms=self.now)
            expected = self.model.flow_done(job_id, policy, 1000, [(ref, how)], self.now)
            assert (got.state, got.counted) == expected, f"flow_done {job_id!r} {ref!r} {how}: {got}, model {expected}"

    @rule(job_id=st.sampled_from(FLOW_IDS), sent_twice=SENT_TWICE)
    def cancel_a_waiting_job(self, job_id: str, sent_twice: bool) -> None:
        self.cancel(job_id, sent_twice)

    @rule(ids=st.lists(st.sampled_from(RECORD_IDS), min_size=1, max_size=13), keep_ms=FLOW_CHECKS,
          record=st.sampled_from([b"{}", b"r" * 3, b"\x00\xff"]))
    def flow_record(self, ids: list[str], keep_ms: int, record: bytes) -> None:
        # Up to 13 at one time and clock: enough expired records to leave some after a trim.
        for flow_id in ids:
            got = self.q.flow_record(flow_id, record, keep_ms, now_ms=self.now)
            expected = self.model.flow_record(flow_id, record, keep_ms, self.now)
            assert got == expected, f"flow_record {flow_id!r} answered {got}, model {expected}"

    @rule(flow_id=st.sampled_from(RECORD_IDS), onto=st.sampled_from([None, None, -1, 0]))
    def flow_show(self, flow_id: str, onto: int | None) -> None:
        # Sometimes first onto its record's expiry (or 1 ms before): the `<` versus `<=`.
        expires = self.model.flow_expiry.get(flow_id)
        if onto is not None and expires is not None and expires + onto >= self.now:
            self.set_clock(expires + onto)
        got = self.q.flow_show(flow_id, now_ms=self.now)
        expected = self.model.flow_show(flow_id, self.now)
        assert (got and (got.record, got.expires_ms)) == expected, f"flow_show {flow_id!r}: {got}, model {expected}"


class ProgressLifecycleMachine(LifecycleMachine):
    """The machine with the progress of running jobs (lua/README.md section 2.3): values
    written under current leases, by zombies and with forged receipts, sent twice, read
    while and after their leases run, and the trim, beside every rule of the plain
    machine."""

    @rule(data=st.data(), value=st.sampled_from([b"", b"{}", b"x" * 10, b"\x00|\xff", "é|5|"]), sent_twice=SENT_TWICE)
    def progress(self, data: st.DataObject, value: bytes | str, sent_twice: bool) -> None:
        # Up to 14 leases (current ones mostly) report at one clock: enough entries for
        # a trim to look at both running and ended ones.
        data_bytes = value.encode() if isinstance(value, str) else value
        for job in self.draw_jobs(data, 14):
            for _ in range(1 + sent_twice):
                got = self.q.progress(job, value, now_ms=self.now)
                expected = self.model.progress(job.receipt, data_bytes, self.now)
                assert got.value == expected, f"progress {job.receipt!r} answered {got}, model {expected}"

    @rule(ids=st.lists(st.sampled_from(IDS + (NEVER_ENQUEUED,)), min_size=1, max_size=5))
    def progress_show(self, ids: list[str]) -> None:
        got = self.q.progress_of(ids)
        expected = self.model.progress_show(ids)
        assert {i: (p.receipt, p.written_ms, p.value) for i, p in got.items()} == expected, (
            f"progress_of {ids}: {got}, model {expected}"
        )


class StepsLifecycleMachine(LifecycleMachine):
    """The machine with durable steps (lua/README.md section 2.6): steps committed under
    current leases, by zombies and with forged receipts, sent twice; sleeps and waits
    that park jobs (a name is always parked as one kind: `nap` sleeps, `go` and `later`
    wait); signals before, during and after waits, to jobs in every state; the reads of
    what a job kept; beside every rule of the plain machine (whose acks, cancels and
    purges delete a job's step data)."""

    @rule(data=st.data(), name=st.sampled_from(["a", "b", "go"]), value=st.sampled_from([b"", b"j1", b"\x00|\n"]),
          lease_ms=st.sampled_from([1, 100, 10_000]), sent_twice=SENT_TWICE)
    def step(self, data: st.DataObject, name: str, value: bytes, lease_ms: int, sent_twice: bool) -> None:
        for job in self.draw_jobs(data, 3):
            for _ in range(1 + sent_twice):
                got = self.q.step(job, name, value, lease_ms=lease_ms, now_ms=self.now)
                expected = self.model.step(job.receipt, lease_ms, name, value, self.now)
                assert (got.status, got.deadline_ms) == expected, f"step {job.receipt!r} {name}: {got}, model {expected}"

    @rule(data=st.data(), how=st.sampled_from([("sleep", "nap"), ("wait", "go"), ("wait", "later")]),
          for_ms=st.sampled_from([0, 5, 100, 10_000]), lease_ms=st.sampled_from([1, 10_000]), sent_twice=SENT_TWICE)
    def park(self, data: st.DataObject, how: tuple[str, str], for_ms: int, lease_ms: int, sent_twice: bool) -> None:
        kind, name = how
        for job in self.draw_jobs(data, 2):
            for _ in range(1 + sent_twice):
                got = self.q.park(job, kind, name, for_ms, lease_ms=lease_ms, now_ms=self.now)  # type: ignore[arg-type]
                expected = self.model.park(job.receipt, kind, name, for_ms, lease_ms, self.now)
                assert (got.status, got.value, got.at_ms) == expected, (
                    f"park {job.receipt!r} {kind} {name}: {got}, model {expected}"
                )

    @rule(job_id=st.sampled_from(IDS + (NEVER_ENQUEUED,)), name=st.sampled_from(["go", "later", "other"]),
          payload=st.sampled_from([b"", b"jx"]), sent_twice=SENT_TWICE)
    def signal(self, job_id: str, name: str, payload: bytes, sent_twice: bool) -> None:
        for _ in range(1 + sent_twice):
            got = self.q.signal(job_id, name, payload, now_ms=self.now)
            expected = self.model.signal(job_id, name, payload, self.now)
            assert got.status == expected, f"signal {job_id!r} {name}: {got}, model {expected}"

    @rule(job_id=st.sampled_from(IDS + (NEVER_ENQUEUED,)))
    def check_steps(self, job_id: str) -> None:
        got = self.q.steps(job_id, now_ms=self.now)
        expected = self.model.job_steps(job_id, self.now)
        assert got == expected, f"steps {job_id!r}: {got}, model {expected}"


class EventsLifecycleMachine(LifecycleMachine):
    """The machine with one more rule: ``set_events``, which changes the event stream's
    bound (a smaller one trims at once), opts out (0: no more events, the stream kept)
    and in again (its numbering goes on). A machine of its own, so that the other
    machines' derandomized examples (and the mutants they catch) stay as they were."""

    @rule(bound=st.sampled_from([0, 1, 2, 5, EVENTS_BOUND, 1000]), sent_twice=SENT_TWICE)
    def set_events(self, bound: int, sent_twice: bool) -> None:
        for _ in range(1 + sent_twice):
            got = self.q.set_events(bound)
            expected = EventsSetting(*self.model.set_events(bound))
            assert got == expected, f"set_events({bound}) answered {got}, model {expected}"


class BrowseLifecycleMachine(FairLifecycleMachine):
    """The fair machine (jobs with and without groups and priorities in READY, leases,
    tombstones, results) with one more rule: ``browse`` of every state against the
    model, pages of every size and start. A machine of its own, so that the other
    machines' derandomized examples (and the mutants they catch) stay as they were."""

    @rule(state=st.sampled_from(["ready", "ready", "scheduled", "running", "done"]),
          start=st.sampled_from([0, 1, 2, 3, 5]), count=st.sampled_from([1, 2, 3, 500]))
    def check_browse(self, state: str, start: int, count: int) -> None:
        got = self.q.browse(state, start, count, now_ms=self.now)
        expected = self.model.browse(state, start, count, self.now)
        assert got == expected, f"browse {state} {start} {count}: {got}, model {expected}"


def machine_for(
    backend: Backend, lua_directory: Path | None = None, without: Sequence[str] = (), fair: bool = False,
    flows: bool = False, progress: bool = False, browse: bool = False, events: bool = False, steps: bool = False,
) -> type[LifecycleMachine]:
    """The machine bound to a backend and, for mutation tests, a scripts directory;
    ``without``: rules left out (each shadowed by a plain method, which Hypothesis does
    not collect); ``fair``: the machine with fair scheduling's rules too; ``flows``: the
    machine with flows' rules too; ``browse``: the fair one with browse's rule too."""
    unknown = set(without) - set(JOB_CONTROL_RULES)
    assert not unknown, f"only job-control rules may be left out, not {unknown}"
    assert fair + flows + progress + browse + events + steps <= 1, (
        "one machine at a time: fair, flows, progress, browse, events or steps"
    )
    shadows = {name: (lambda self, *args, **kwargs: None) for name in without}
    base = (FairLifecycleMachine if fair else FlowLifecycleMachine if flows else ProgressLifecycleMachine if progress
            else BrowseLifecycleMachine if browse else EventsLifecycleMachine if events else StepsLifecycleMachine if steps
            else LifecycleMachine)
    # The name does not say the backend: a derandomized run draws its examples from it,
    # so the same examples run on fakeredis and on redis-server (tests/test_mutations.py).
    kind = ("Fair" if fair else "Flow" if flows else "Progress" if progress else "Browse" if browse
            else "Events" if events else "Steps" if steps else "")
    return type(f"{kind}LifecycleMachine", (base,), {"backend": backend, "lua_directory": lua_directory, **shadows})


def run_machine(
    backend: Backend, options: settings, lua_directory: Path | None = None, without: Sequence[str] = (),
    fair: bool = False, flows: bool = False, progress: bool = False, browse: bool = False, events: bool = False,
    steps: bool = False,
) -> type[LifecycleMachine]:
    """Run the machine on ``backend`` with ``options`` (raises what the first failing
    example raised); returns the machine class, whose counters say what ran."""
    machine = machine_for(backend, lua_directory, without, fair, flows, progress, browse, events, steps)
    run_state_machine_as_test(machine, settings=options)  # type: ignore[no-untyped-call]
    return machine
