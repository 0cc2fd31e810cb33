"""Many nacks in one round trip: the failed jobs of a batch, or a batch ended at its time
limit.

``lua/nack.lua`` takes one receipt per call (its backoff, error and final flag are per
job), so N failed jobs are N script calls. They go in one pipelined round trip (one
``EVALSHA`` each), which a fenced nack allows: each call is replay-safe on its own, and
a re-sent one finds its receipt gone and changes nothing. Each job gets its own answer,
exactly as from :meth:`Queue.nack`. With ``wait_replicas`` the calls go one by one,
each followed by its ``WAIT`` (a pipeline would skip them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, TypeVar

from pyqueue.protocol.core import Finished, Pipelined, Plan, ScriptCall, Step, resume
from pyqueue.protocol.errors import PyQueueError, map_redis_error
from pyqueue.protocol.models import Job, Nacked
from pyqueue.drivers.queue import Queue, drive, plans_of, transport_of

T = TypeVar("T")


class NackTerms(NamedTuple):
    """One job's nack: its error text, and the retry it asks for."""

    job: Job
    error: str
    #: Retry after this long; None: the backoff.
    delay_ms: int | None = None
    #: To the dead letters now, whatever the attempt.
    final: bool = False


def nack_all(queue: Queue, nacks: Sequence[NackTerms], *, backoff_base_ms: int, backoff_cap_ms: int) -> list[Nacked]:
    """Nack every job of ``nacks`` (leased from ``queue``); one answer each, in order.

    Raises:
        the mapped error of the first call that failed: the others may have run, and
        sending them all again is safe (fenced: a nack that ran answers GONE or STALE).
    """
    plans = [
        plans_of(queue).nack(
            n.job, n.error, delay_ms=n.delay_ms, final=n.final, backoff_base_ms=backoff_base_ms,
            backoff_cap_ms=backoff_cap_ms,
        )
        for n in nacks
    ]
    if len(plans) == 1 or queue.spec.wait_replicas:
        return [drive(queue, plan) for plan in plans]
    return drive_together(queue, plans)


def drive_together(queue: Queue, plans: Sequence[Plan[T]]) -> list[T]:
    """Run ``plans`` (of replay-safe verbs) on ``queue``'s transport: their first steps in
    one pipelined round trip when they are calls of one script, then each plan to its
    end on its own (a plan with more steps, such as a queue object's first call that
    checks its partition count, goes on as :meth:`Queue.drive` would run it)."""
    steps: list[Step | Finished[T]] = [resume(plan) for plan in plans]
    firsts = [s for s in steps if isinstance(s, ScriptCall)]
    if len(firsts) == len(steps) and len({s.script for s in firsts}) == 1:
        replies = transport_of(queue).execute(Pipelined(firsts[0].script, [(s.keys, s.args) for s in firsts]))
        steps = [
            resume(plan, error=map_redis_error(reply)) if isinstance(reply, Exception) else resume(plan, reply)
            for plan, reply in zip(plans, replies)
        ]
    out: list[T] = []
    for plan, step in zip(plans, steps):
        while not isinstance(step, Finished):
            try:
                step = resume(plan, transport_of(queue).execute(step))
            except PyQueueError as exc:
                step = resume(plan, error=exc)
        out.append(step.value)
    return out
