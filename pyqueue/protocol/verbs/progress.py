"""A running job's progress: lua/progress.lua stores a small value under the job's
current lease (fenced: a zombie cannot write), lua/progress_show.lua reads the values
of running jobs. The engine keeps the bytes it is given; the task layer writes JSON
(``current_job().progress(...)``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pyqueue.protocol.core import Plan, check_ids, check_now, progress_call, progress_show_call, text
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job, Outcome
from pyqueue.protocol.spec import QueueSpec, QueueMemory
from pyqueue.protocol.verbs.base import run

#: The most bytes of one progress value (lua/progress.lua).
MAX_PROGRESS_BYTES = 4096


@dataclass(frozen=True)
class Progress:
    """A running job's latest progress value, as its current lease wrote it."""

    value: bytes
    #: When it was written (ms, server clock).
    written_ms: int
    #: The lease that wrote it (the job's current one).
    receipt: str

    @property
    def owner(self) -> str:
        """The service (worker) whose lease wrote it."""
        return self.receipt.split("|", 1)[0]


def check_progress_ids(ids: Iterable[str]) -> list[str]:
    """1..1000 valid job ids (``progress_of``), else InvalidArgument."""
    checked = check_ids(ids)
    if not checked:
        raise InvalidArgument("progress_of takes 1..1000 job ids")
    return checked


def check_progress_job(job: object) -> Job:
    """The Job from lease that ``progress`` takes, else InvalidArgument."""
    if not isinstance(job, Job):
        raise InvalidArgument(f"progress takes the Job from lease, got {type(job).__name__}")
    return job


def progress(spec: QueueSpec, memory: QueueMemory, job: Job, value: bytes | str, *, now_ms: int | None = None) -> Plan[Outcome]:
    """Store ``value`` (0..4096 bytes; a str as UTF-8) as the progress of ``job``,
    a job this worker holds: the latest value wins, and it is shown (``progress_of``)
    while this lease runs. Fenced: once the lease has ended (acked, failed, expired,
    scrubbed, cancelled) nothing is written and the answer is ``Outcome.STALE``.
    Replay-safe: a re-sent call stores the same value again.

    Raises:
        InvalidArgument: not a leased Job, or a value too large (nothing sent).
    """
    check_progress_job(job)
    data = value.encode("utf-8") if isinstance(value, str) else value
    if not isinstance(data, bytes) or len(data) > MAX_PROGRESS_BYTES:
        raise InvalidArgument(f"a progress value is bytes or str of at most {MAX_PROGRESS_BYTES} bytes")
    check_now(now_ms)
    return Outcome(text((yield from run(memory, progress_call(spec.keys, now_ms, job.receipt, data)))))


def progress_of(spec: QueueSpec, memory: QueueMemory, ids: Iterable[str]) -> Plan[dict[str, Progress]]:
    """The progress of each of ``ids`` (1..1000 job ids) that is running and whose
    current lease reported some; the others are left out. Read only, one atomic
    read (lua/progress_show.lua)."""
    checked = check_progress_ids(ids)
    reply = yield from run(memory, progress_show_call(spec.keys, checked))
    found = {}
    for i, job_id in enumerate(checked):
        receipt, written_ms, value = reply[3 * i : 3 * i + 3]
        if int(written_ms) >= 0:
            found[job_id] = Progress(bytes(value), int(written_ms), text(receipt))
    return found

