"""Enqueue: a queue's verbs that add jobs (lua/enqueue.lua)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyqueue.protocol.core import JobTuple, Plan, Verb, check_now, enqueue_call, new_batch
from pyqueue.protocol.models import Enqueued, NewJob
from pyqueue.protocol.verbs.base import QueueVerbs


class ProduceVerbs(QueueVerbs):
    """Enqueue verbs (see :class:`pyqueue.drivers.queue.QueueCore`)."""

    def plan_enqueue(
        self,
        payload: bytes | str,
        *,
        job_id: str | None = None,
        delay_ms: int = 0,
        max_attempts: int | None = None,
        priority: int = 0,
        group: str | None = None,
        now_ms: int | None = None,
    ) -> Plan[Enqueued]:
        """Add one job (lua/enqueue.lua).

        Args:
            payload: bytes, or str (stored as UTF-8). Never pickled.
            job_id: a caller-chosen id makes enqueue idempotent: if a job with this id
                exists in any state, or was acked less than ``keep_done_ms`` ago (the
                acking queue object's setting), nothing changes and ``added`` is false.
                Default: 128 random bits in hex.
            delay_ms: run no earlier than this long after now (server clock).
            max_attempts: leases that may fail (nack, expiry, scrub) before the job goes
                to DEAD; default 5.
            priority: -5..5, default 0. Lease takes ready jobs of a higher level first,
                first in first out within a level (within a group, with ``group``).
            group: a key (1..128 bytes, no ``|`` or control characters: a tenant, an
                account) for fair scheduling: lease serves the groups with ready jobs
                round-robin, and never more of one group at once than its cap
                (:meth:`set_group_limit`). Jobs without a group share one turn of
                the round, as if they were one group without a cap.
            now_ms: tests only: override the server clock.

        Returns:
            The job id and whether it was added. A call re-sent after a lost reply
            reports ``added=False`` for the job it added the first time, and adds
            nothing even if that job has run and been acked since (within
            ``keep_done_ms``).

        Raises:
            InvalidArgument, WrongTypeError, OutcomeUnknown.
        """
        new = NewJob(payload, job_id, delay_ms, max_attempts, priority, group)
        (added,) = yield from self.plan_enqueue_many([new], now_ms=now_ms)
        return added

    enqueue = Verb(plan_enqueue)

    def plan_enqueue_json(
        self,
        obj: Any,
        *,
        job_id: str | None = None,
        delay_ms: int = 0,
        max_attempts: int | None = None,
        priority: int = 0,
        group: str | None = None,
        now_ms: int | None = None,
    ) -> Plan[Enqueued]:
        """``enqueue`` the JSON encoding of ``obj`` (compact, UTF-8); read it with ``Job.json()``."""
        from json import dumps

        payload = dumps(obj, separators=(",", ":"), ensure_ascii=False)
        plan = self.plan_enqueue(payload, job_id=job_id, delay_ms=delay_ms, max_attempts=max_attempts,
                                 priority=priority, group=group, now_ms=now_ms)
        return (yield from plan)

    enqueue_json = Verb(plan_enqueue_json)

    def plan_enqueue_many(self, jobs: Iterable[NewJob | bytes | str], *, now_ms: int | None = None) -> Plan[list[Enqueued]]:
        """Add up to 1000 jobs in one atomic call (lua/enqueue.lua).

        Duplicates (of existing jobs, or repeated ids within ``jobs``) are skipped and
        reported with ``added=False``; everything else is added.

        Raises:
            InvalidArgument (nothing sent), WrongTypeError, OutcomeUnknown.
        """
        batch = new_batch(jobs, self.max_payload_bytes, self.partitions)
        check_now(now_ms)
        return (yield from self.plan_enqueue_batch(batch, now_ms))

    enqueue_many = Verb(plan_enqueue_many)

    def plan_enqueue_batch(self, batch: Sequence[JobTuple], now_ms: int | None) -> Plan[list[Enqueued]]:
        """``enqueue_many`` of jobs already validated (:func:`pyqueue.protocol.core.new_batch`)."""
        reply = yield from self._run(enqueue_call(self.keys, now_ms, batch))
        return [Enqueued(job[0], flag == 1) for job, flag in zip(batch, reply[2:])]
