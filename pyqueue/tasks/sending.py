"""Sending: where ``Task.send`` and its siblings land. Each send is one ``enqueue`` of
its queue (``send_many`` groups its jobs by queue, one call each), wrapped in the
middleware's ``around_send`` hooks (``Tasks.send_hooks``); a send answers a
:class:`~pyqueue.tasks.handle.SentTask` per job, whose ``added`` is false for a
duplicate id (``unique``, or a send's ``job_id``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyqueue.tasks.flows import Sender, Signature
from pyqueue.tasks.handle import SentTask
from pyqueue.tasks.middleware import Sending, enter_sends, resume_sends


def send_many(
    app: Sender, signatures: Sequence[Signature], now_ms: int, delay_ms: int = 0,
    metas: Sequence[dict[str, Any]] | None = None,
) -> list[SentTask[Any]]:
    """Enqueue ``signatures``; ``metas``: what middleware adds to each one's meta
    (given by the send hooks' own call of this one)."""
    if app.send_hooks and metas is None:
        messages = [Sending(s.task, s.args, s.kwargs, s.options, delay_ms) for s in signatures]
        chains = enter_sends(app.send_hooks, messages)
        try:
            sent = send_many(app, signatures, now_ms, delay_ms, [m.meta for m in messages])
        except BaseException as exc:
            resume_sends(chains, None, exc)
            raise
        resume_sends(chains, sent, None)
        return sent
    if len(signatures) == 1:  # a send: one enqueue, none of the grouping below
        sig = signatures[0]
        (answer,) = app.queue(sig.options.queue).enqueue_many([sig.new_job(now_ms, delay_ms, metas[0] if metas else None)])
        return [sig.handle(answer.job_id, answer.added, answer.by_key)]
    jobs = [(sig, sig.new_job(now_ms, delay_ms, metas[i] if metas else None)) for i, sig in enumerate(signatures)]
    by_queue: dict[str, list[int]] = {}
    for i, (sig, _) in enumerate(jobs):
        by_queue.setdefault(sig.options.queue, []).append(i)
    out: list[SentTask[Any] | None] = [None] * len(jobs)
    for queue_name, indexes in by_queue.items():
        answers = app.queue(queue_name).enqueue_many([jobs[i][1] for i in indexes])
        for i, answer in zip(indexes, answers):
            out[i] = jobs[i][0].handle(answer.job_id, answer.added, answer.by_key)
    return [sent for sent in out if sent is not None]


async def asend(
    app: Sender, signatures: Sequence[Signature], now_ms: int, delay_ms: int,
    metas: Sequence[dict[str, Any]] | None = None,
) -> SentTask[Any]:
    """``send_many`` of one signature on the asyncio driver."""
    (sig,) = signatures
    if app.send_hooks and metas is None:
        message = Sending(sig.task, sig.args, sig.kwargs, sig.options, delay_ms)
        chains = enter_sends(app.send_hooks, [message])
        try:
            sent = await asend(app, signatures, now_ms, delay_ms, [message.meta])
        except BaseException as exc:
            resume_sends(chains, None, exc)
            raise
        resume_sends(chains, [sent], None)
        return sent
    new = sig.new_job(now_ms, delay_ms, metas[0] if metas else None)
    queue = app.aqueue(sig.options.queue)
    (answer,) = await queue.enqueue_many([new])
    return sig.handle(answer.job_id, answer.added, answer.by_key)

