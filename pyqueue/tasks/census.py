"""Which task names wait in a queue, and which of them no live worker serves.

Workers advertise the task names they run in their service registration
(``Services.register(tasks=...)``); ``pyqueue stats`` and the dashboard compare that with
the names of the jobs waiting in each queue, so a task that no deployed worker knows
(a typo, a worker not yet rolled out, a task removed while jobs still name it) is seen
before its jobs reach the dead letters. Read-only: nothing here changes state.

The waiting names are a *sample*: the first ``sample`` jobs of READY and of SCHEDULED
(retries of an unknown task wait there between attempts), read with ``get``. A queue
with a million jobs is not decoded in full.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from pyqueue.drivers.facade import client_of
from pyqueue.protocol.errors import PyQueueError
from pyqueue.ops.service import ServiceInfo
from pyqueue.tasks import envelope

#: How many jobs of READY and of SCHEDULED are decoded per queue (each).
DEFAULT_SAMPLE = 100


def waiting_tasks(queue: Any, sample: int = DEFAULT_SAMPLE) -> Counter[str]:
    """Task names of the first ``sample`` ready and scheduled jobs of ``queue`` (each of
    its partitions for a partitioned one), with how many of the sampled jobs name each.
    Jobs that are not task envelopes are left out."""
    names: Counter[str] = Counter()
    redis = client_of(queue)
    for part in queue.spec.partition_specs():
        ids: list[Any] = list(redis.lrange(part.keys.ready, 0, sample - 1))
        ids += list(redis.zrange(part.keys.scheduled, 0, sample - 1))
        for raw in ids:
            job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                info = queue.get(job_id, with_payload=True)  # in the id's partition
                if info.payload is None:
                    continue  # leased or acked meanwhile
                names[envelope.decode(info.payload).task] += 1
            except PyQueueError:
                continue  # not an envelope (a raw job), or gone
    return names


def served_tasks(services: Iterable[ServiceInfo]) -> dict[str, set[str]]:
    """Queue name -> the task names the live services serving it advertise."""
    served: dict[str, set[str]] = {}
    for info in services:
        if info.alive:
            for name in info.queues:
                served.setdefault(name.split("#")[0], set()).update(info.tasks)  # a partition: its queue
    return served


def unserved_tasks(queue: Any, services: Iterable[ServiceInfo], sample: int = DEFAULT_SAMPLE) -> Counter[str]:
    """The task names with jobs waiting in ``queue`` (sampled) that no live worker of
    the queue advertises, with their sampled job counts."""
    served = served_tasks(services).get(queue.name, set())
    waiting = waiting_tasks(queue, sample)
    return Counter({name: n for name, n in waiting.items() if name not in served})
