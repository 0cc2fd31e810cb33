"""Prometheus metrics from what the scripts already count.

:class:`PyQueueCollector` is a custom collector (prometheus_client): at every scrape it
runs ``stats`` once per queue (lua/stats.lua, one atomic read of the queue's counters
and state counts; all of them pipelined, one round trip per primary) and lists each
service namespace's workers, so a scrape costs O(queues) script calls, never O(jobs),
and there is no second set of counters to keep in sync. An app that already serves
``/metrics`` adds pyqueue's with::

    from prometheus_client import REGISTRY
    from pyqueue.ops.metrics import PyQueueCollector
    REGISTRY.register(PyQueueCollector(redis_client))

and ``pyqueue metrics --port 9808`` serves them alone. Needs the ``metrics`` extra
(``pip install "pyqueue-redis[metrics]"``).

Per queue (label ``queue``; a partitioned queue once, summed over its partitions):
every script-kept counter as a counter (``pyqueue_<name>_total``: enqueued, duplicates,
leased, acked, nacked, promoted, reclaimed, scrubbed, released, dead, replayed, purged,
cancelled, parked, and flow control's expired, debounced, throttled, skipped and
deferred);
the jobs in each state as a gauge (``pyqueue_jobs{state=ready|scheduled|leased|dead|
done}``); due-but-unpromoted jobs and expired leases; the lag of the oldest due job in
seconds; the partition count; whether it is paused; its rate limit in leases per second;
its byte budget and the payload bytes it counts (``pyqueue_budget_bytes``,
``pyqueue_payload_bytes``); its results budget and the result bytes it counts
(``pyqueue_result_budget_bytes``, ``pyqueue_result_bytes``);
fair scheduling's groups with ready jobs (``pyqueue_groups{state=waiting|at_cap}``) and,
for a queue that has any, the ready jobs of its largest groups
(``pyqueue_group_ready_jobs{group}``: the TOP_GROUPS largest among the first 1000 groups
``groups`` lists, one more call per such queue only). Per service namespace (label
``namespace``): the live workers and those stopping.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pyqueue.drivers.clients import Client, bytes_client, check_server
from pyqueue.ops.discovery import discover_queues, logical_queues
from pyqueue.drivers.queue import DEFAULT_PREFIX, Queue, stats_many
from pyqueue.ops.service import DEFAULT_NAMESPACE, Services

#: Counter name (without _total) -> the Stats field it comes from, and its help text.
COUNTERS: dict[str, tuple[str, str]] = {
    "enqueued": ("enqueued", "jobs added by enqueue"),
    "duplicates": ("duplicates", "enqueues skipped as duplicates (existing or tombstoned id)"),
    "leased": ("leased_total", "leases handed out"),
    "acked": ("acked", "leases completed by an ack answered OK"),
    "nacked": ("nacked", "leases failed by nack"),
    "promoted": ("promoted", "scheduled jobs moved to ready"),
    "reclaimed": ("reclaimed", "expired leases ended by maintenance"),
    "scrubbed": ("scrubbed", "leases of dead services ended"),
    "released": ("released", "leases given back without penalty"),
    "dead": ("dead_total", "jobs that entered the dead letters"),
    "replayed": ("replayed", "dead jobs replayed to ready"),
    "purged": ("purged", "dead jobs deleted"),
    "cancelled": ("cancelled", "jobs ended by cancel, in any state"),
    "parked": ("parked", "leases ended by a durable sleep or wait (no attempt used)"),
    "expired": ("expired_total", "jobs ended unrun: not leased before their expiry"),
    "debounced": ("debounced", "sends merged into their debounce key's pending job"),
    "throttled": ("throttled", "sends dropped inside their throttle key's window"),
    "skipped": ("skipped", "dead heads of sequences skipped (pyqueue sequence skip)"),
    "deferred": ("deferred", "leases put off to their rate key's next permit (the job scheduled then)"),
}
#: The ``state`` label of pyqueue_jobs -> the Stats field.
STATES = ("ready", "scheduled", "waiting", "sequenced", "leased", "dead", "done")
#: How many of a queue's largest groups pyqueue_group_ready_jobs reports (a bound on its
#: label values), chosen among the first GROUPS_SCANNED groups of its ring.
TOP_GROUPS = 10
GROUPS_SCANNED = 1000


class PyQueueCollector(Collector):
    """Reads pyqueue's state at scrape time (see the module docstring).

    Args:
        redis: a client of the queues' server or cluster.
        queues: the queues to report; default every queue found at each scrape (a
            SCAN of every primary: O(keys), ten keys per queue at most). Name them when
            the client may not SCAN (a least-privilege ACL user).
        prefix: the key prefix.
        namespaces: the service namespaces whose workers to count.
        services_redis: the namespaces' server, when it is not ``redis``.
    """

    def __init__(
        self,
        redis: Client,
        *,
        queues: Sequence[str] | None = None,
        prefix: str = DEFAULT_PREFIX,
        namespaces: Sequence[str] = (DEFAULT_NAMESPACE,),
        services_redis: Client | None = None,
    ) -> None:
        self.redis = bytes_client(redis)
        check_server(self.redis)  # the eviction-policy warning, once per process and server
        self.queue_names = list(queues) if queues else None
        self.prefix = prefix
        self._opened: dict[str, Queue] = {}
        self.services = [
            Services(services_redis if services_redis is not None else self.redis, namespace=ns, prefix=prefix)
            for ns in namespaces
        ]

    def _queues(self) -> list[Queue]:
        """The queues to report, each opened once and kept between scrapes (opening one
        reads its recorded partition count: a round trip). Found again at each scrape
        unless named; a queue gone from Redis drops out."""
        names = self.queue_names or discover_queues(self.redis, self.prefix)
        fresh = [name for name in names if name not in self._opened]
        if fresh:
            for q in logical_queues(self.redis, self.prefix, fresh):
                self._opened[q.name] = q
        partitions = {part.name for q in self._opened.values() if q.spec.partitions > 1 for part in q.spec.partition_specs()}
        wanted = set(names)
        return [q for name, q in sorted(self._opened.items()) if name in wanted and name not in partitions]

    def collect(self) -> Iterator[Metric]:
        counters = {
            name: CounterMetricFamily(f"pyqueue_{name}", help_text, labels=["queue"])
            for name, (_, help_text) in COUNTERS.items()
        }
        jobs = GaugeMetricFamily("pyqueue_jobs", "jobs in each state (done: acked ids still tombstoned)",
                                 labels=["queue", "state"])
        due = GaugeMetricFamily("pyqueue_due_jobs", "scheduled jobs already due, not yet promoted", labels=["queue"])
        expired = GaugeMetricFamily("pyqueue_expired_leases", "leases past their deadline, not yet reclaimed",
                                    labels=["queue"])
        lag = GaugeMetricFamily("pyqueue_lag_seconds", "how long the oldest due job has been waiting",
                                labels=["queue"])
        partitions = GaugeMetricFamily("pyqueue_partitions", "partitions of the queue", labels=["queue"])
        paused = GaugeMetricFamily("pyqueue_paused", "1 while the queue is paused (it leases nothing)", labels=["queue"])
        rate = GaugeMetricFamily("pyqueue_rate_limit_per_second",
                                 "the queue's lease rate limit in leases per second (0: none)", labels=["queue"])
        groups = GaugeMetricFamily("pyqueue_groups", "groups with ready jobs: with a free slot (waiting) and at their "
                                   "cap (at_cap)", labels=["queue", "state"])
        largest = GaugeMetricFamily("pyqueue_group_ready_jobs", f"ready jobs of the queue's {TOP_GROUPS} largest groups",
                                    labels=["queue", "group"])
        payload = GaugeMetricFamily("pyqueue_payload_bytes", "payload bytes of the jobs its byte budget counts "
                                    "(Queue.set_budget)", labels=["queue"])
        budget = GaugeMetricFamily("pyqueue_budget_bytes", "the queue's byte budget (0: none): an enqueue past it "
                                   "is refused", labels=["queue"])
        results = GaugeMetricFamily("pyqueue_result_bytes", "bytes of the results its results budget counts "
                                    "(Queue.set_result_budget)", labels=["queue"])
        results_budget = GaugeMetricFamily("pyqueue_result_budget_bytes", "the queue's results budget (0: none): "
                                           "past it the oldest-expiring results are deleted", labels=["queue"])
        queues = self._queues()
        for q, stats in zip(queues, stats_many(queues)):
            for name, (field, _) in COUNTERS.items():
                counters[name].add_metric([q.name], getattr(stats, field))
            for state in STATES:
                jobs.add_metric([q.name, state], getattr(stats, state))
            due.add_metric([q.name], stats.due)
            expired.add_metric([q.name], stats.expired)
            lag.add_metric([q.name], stats.lag_ms / 1000)
            partitions.add_metric([q.name], q.spec.partitions)
            paused.add_metric([q.name], int(stats.paused))
            rate.add_metric([q.name], stats.rate_limit * 1000 / stats.rate_period_ms if stats.rate_limit else 0)
            payload.add_metric([q.name], stats.bytes)
            budget.add_metric([q.name], stats.budget_bytes)
            results.add_metric([q.name], stats.result_bytes)
            results_budget.add_metric([q.name], stats.result_budget_bytes)
            groups.add_metric([q.name, "waiting"], stats.groups_waiting)
            groups.add_metric([q.name, "at_cap"], stats.groups_at_cap)
            if stats.groups_waiting + stats.groups_at_cap:
                page = q.groups(0, GROUPS_SCANNED)
                for group in sorted(page.groups, key=lambda g: (-g.ready, g.name))[:TOP_GROUPS]:
                    largest.add_metric([q.name, group.name], group.ready)
        yield from counters.values()
        yield from (jobs, due, expired, lag, partitions, paused, rate, payload, budget, results, results_budget, groups,
                    largest)

        workers = GaugeMetricFamily("pyqueue_workers", "registered workers by state (alive, stopping)",
                                    labels=["namespace", "state"])
        for services in self.services:
            listed = [info for info in services.list() if info.alive]
            workers.add_metric([services.namespace, "alive"], sum(1 for i in listed if not i.stopping))
            workers.add_metric([services.namespace, "stopping"], sum(1 for i in listed if i.stopping))
        yield workers
