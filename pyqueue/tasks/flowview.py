"""A flow shown by its id: its record (``Queue.flow_show``, kept by the flow's sender in
the queue of its first step) with the state of each of its steps (``Queue.get``), as
data (:class:`FlowView`, for the dashboard) or as a tree of text (``pyqueue flow
show``). Read only: nothing here changes a flow.

The record (written by :func:`pyqueue.tasks.flows.record_of`) is JSON:
``{"v": 1, "id", "created_ms", "tree", "steps", "output"}``. ``steps`` lists each step
as ``[physical queue, job id, task name]``; ``tree`` nests ``{"chain": [...]}``,
``{"group": [...]}`` and step numbers; ``output`` is the flow's result reference (what
:meth:`FlowHandle.result` reads).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyqueue.drivers.clients import Client
from pyqueue.protocol.core import MAX_BATCH
from pyqueue.protocol.errors import CorruptRecord
from pyqueue.protocol.models import JobInfo
from pyqueue.drivers.queue import Queue, physical_queue
from pyqueue.protocol.verbs.flows import WAIT_DUE_MS

#: The record format this module reads and :func:`pyqueue.tasks.flows.record_of` writes.
RECORD_VERSION = 1


@dataclass(frozen=True)
class StepView:
    """One step of a shown flow: where it runs, its task, what ``get`` says of it, and
    its state (:func:`step_states`: 'waiting' for a step still waiting for others,
    'cancelled' for one that ended without its result)."""

    n: int
    queue: str  # physical: a partition's name for a partitioned queue
    job_id: str
    task: str
    state: str
    info: JobInfo


@dataclass(frozen=True)
class FlowView:
    """A flow as its record and its steps' states show it."""

    id: str
    queue: str  # where its record is kept: the queue of its first step
    created_ms: int
    expires_ms: int
    tree: Any
    steps: list[StepView]
    output: Any

    def counts(self) -> dict[str, int]:
        """How many steps are in each state."""
        return dict(Counter(step.state for step in self.steps))

    def as_json(self, text_limit: int | None = None) -> dict[str, Any]:
        """The flow as JSON (``pyqueue flow show --json`` and the dashboard's
        ``/api/queues/{queue}/flow``): ``id``, ``queue``, ``created_ms``, ``expires_ms``
        (when the record goes), ``counts`` (steps per state), ``tree`` (``{"chain":
        [...]}`` and ``{"group": [...]}`` nesting step numbers) and ``steps``, each with
        ``n``, ``queue`` (the partition that holds it), ``id``, ``task``, ``state``
        ('waiting' for a step still waiting for others, 'cancelled' for one that ended
        without its result, else what ``Queue.get`` says: see :func:`step_states`),
        ``describe`` (that state in words), ``attempts`` and ``max_attempts`` (-1 where
        ``Queue.get`` knows none: a step done or forgotten), ``error`` and
        ``error_truncated``. With ``text_limit``, ``error`` and ``describe`` are clipped
        to that many characters. Payloads are never read."""
        steps = []
        for step in self.steps:
            error, said = step.info.error, describe(step)
            if text_limit is not None:
                error, said = error[:text_limit], said[:text_limit]
            steps.append({"n": step.n, "queue": step.queue, "id": step.job_id, "task": step.task, "state": step.state,
                          "describe": said, "attempts": step.info.attempts, "max_attempts": step.info.max_attempts,
                          "error": error, "error_truncated": len(error) < len(step.info.error)})
        return {"id": self.id, "queue": self.queue, "created_ms": self.created_ms, "expires_ms": self.expires_ms,
                "counts": self.counts(), "tree": self.tree, "steps": steps}

    def render(self) -> str:
        """The flow as a tree of text, one line per chain, group and step."""
        counts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts().items()))
        lines = [f"flow {self.id} (record in {self.queue}): {len(self.steps)} steps: {counts}"]
        width = max(len(step.task) for step in self.steps) if self.steps else 0
        self._render(self.tree, "", "", lines, width)
        return "\n".join(lines)

    def _render(self, node: Any, first: str, rest: str, lines: list[str], width: int) -> None:
        if isinstance(node, int):
            step = self.steps[node]
            lines.append(f"{first}{step.n:>3} {step.task:<{width}}  {step.job_id}  {step.queue}  {describe(step)}")
            return
        kind, children = next(iter(node.items()))
        lines.append(f"{first}{kind}")
        for i, child in enumerate(children):
            last = i == len(children) - 1
            self._render(child, rest + ("└─ " if last else "├─ "), rest + ("   " if last else "│  "), lines, width)


def step_states(steps: Sequence[tuple[Queue, JobInfo]]) -> list[str]:
    """The state of each flow step, from what ``get`` said of it (``(physical queue,
    JobInfo)`` pairs), told apart further than ``get`` can: 'waiting' for a step still
    waiting for others (SCHEDULED, never due by time); and for a step ``get`` finds
    ended ('done') or forgotten ('unknown'), its result decides, since every flow step
    keeps one (``keep_result`` of at least FLOW_RESULT_S): one kept is 'done' (acked,
    also once its tombstone is gone); none while its tombstone is in force is
    'cancelled' (cancel deletes the record and tombstones the id as an ack does, but
    keeps no result; so would a result trimmed already by the queue's ``max_results``,
    which the steps waiting for it treat the same: TaskResultMissing); else 'unknown'.
    One ``result`` read per queue for the ended steps (pipelined)."""
    states = ["waiting" if info.state == "scheduled" and info.due_ms >= WAIT_DUE_MS else info.state for _, info in steps]
    ended: dict[str, tuple[Queue, list[int]]] = {}
    for i, (reader, info) in enumerate(steps):
        if info.state in ("done", "unknown"):
            ended.setdefault(reader.name, (reader, []))[1].append(i)
    for reader, indexes in ended.values():
        for start in range(0, len(indexes), MAX_BATCH):
            chunk = indexes[start : start + MAX_BATCH]
            for i, found in zip(chunk, reader.results([steps[i][1].id for i in chunk])):
                if found.state == "ok":
                    states[i] = "done"
                elif found.state == "done" and steps[i][1].state == "done":
                    states[i] = "cancelled"
    return states


def describe(step: StepView) -> str:
    """A step's state in words, with what makes it useful: attempts (counted from 1),
    the error of a dead one."""
    info = step.info
    if step.state == "leased":
        return f"running (attempt {info.attempts_made}/{info.max_attempts}, {info.owner})"
    if step.state == "dead":
        return f"dead: {info.error.splitlines()[0] if info.error else 'no error text'}"
    if step.state in ("ready", "scheduled") and info.attempts:
        return f"{step.state} (attempt {info.attempts} ended, {info.max_attempts} allowed)"
    if step.state == "cancelled":
        return "cancelled (ended without its result)"
    if step.state == "unknown":
        return "unknown (ended and forgotten, or cancelled before it ran)"
    return step.state


def no_record_message(queue: str, flow_id: str) -> str:
    """Why a flow cannot be shown (``show_flow`` answered None), in words for people."""
    return f"no record of flow {flow_id} in {queue}: never sent from it (its first step's queue), or expired"


def show_flow(client: Client, queue: Queue, flow_id: str, *, prefix: str = "pq") -> FlowView | None:
    """The flow ``flow_id`` whose record is in ``queue`` (the queue of its first step), or
    None if no record of it is kept there (never sent from there, or expired).

    Raises:
        CorruptRecord: the record is not one this version reads.
    """
    found = queue.flow_show(flow_id)
    if found is None:
        return None
    try:
        record = json.loads(found.record)
        if record.get("v") != RECORD_VERSION:
            raise ValueError(f"version {record.get('v')!r}")
        refs = [(str(q), str(job_id), str(task)) for q, job_id, task in record["steps"]]
        tree, output, created_ms = record["tree"], record["output"], int(record["created_ms"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(f"flow {flow_id}: its record in {queue.name} does not parse ({exc})") from None
    readers: dict[str, Queue] = {}
    got: list[tuple[Queue, JobInfo]] = []
    for physical, job_id, _ in refs:
        reader = readers.get(physical)
        if reader is None:
            reader = readers[physical] = physical_queue(physical, client, prefix=prefix)
        got.append((reader, reader.get(job_id)))
    steps = [
        StepView(n, physical, job_id, task, state, info)
        for n, ((physical, job_id, task), (_, info), state) in enumerate(zip(refs, got, step_states(got)))
    ]
    return FlowView(flow_id, queue.name, created_ms, found.expires_ms, tree, steps, output)
