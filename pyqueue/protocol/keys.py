"""The key schema: every key a queue uses, named ``<prefix>:{<queue>}:<role>``.

All keys of one queue share the hash tag ``{<queue>}``, so each script call touches one
Redis Cluster slot. ``lua/README.md`` documents what each role holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyqueue.protocol.errors import InvalidArgument

#: Queue names and prefixes: printable ASCII without spaces or braces (braces would
#: break the hash tag), 1..128 characters.
_NAME = re.compile(r"^[!-z|~]{1,128}$")


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a valid queue name or prefix, else raise InvalidArgument."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidArgument(
            f"{what} must be 1..128 printable ASCII characters without spaces or braces, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class QueueKeys:
    """The Redis keys of one queue."""

    prefix: str
    queue: str

    def __post_init__(self) -> None:
        check_name(self.prefix, "prefix")
        check_name(self.queue, "queue name")

    def _key(self, role: str) -> str:
        return f"{self.prefix}:{{{self.queue}}}:{role}"

    @property
    def jobs(self) -> str:
        """hash: id -> "<attempts>|<max_attempts>|<due_ms>:<enqueued_ms>|<payload>"."""
        return self._key("jobs")

    @property
    def ready(self) -> str:
        """list: ids ready to lease, head first."""
        return self._key("ready")

    @property
    def scheduled(self) -> str:
        """zset: id -> due_ms."""
        return self._key("scheduled")

    @property
    def leased(self) -> str:
        """zset: receipt -> deadline_ms."""
        return self._key("leased")

    @property
    def owners(self) -> str:
        """zset: receipt -> 0, a lexicographic index of leases by owner and call."""
        return self._key("owners")

    @property
    def dead(self) -> str:
        """zset: id -> dead_ms."""
        return self._key("dead")

    @property
    def errors(self) -> str:
        """hash: id -> last error text of a dead job."""
        return self._key("errors")

    @property
    def counters(self) -> str:
        """hash: counter name -> integer."""
        return self._key("counters")

    @property
    def wake(self) -> str:
        """zset: the member "wake" while a blocked worker should wake up."""
        return self._key("wake")

    @property
    def done(self) -> str:
        """zset: id -> ms until which an acked id stays a duplicate for enqueue (tombstones)."""
        return self._key("done")

    @property
    def results(self) -> str:
        """hash: id -> "<finished_ms>|<value>", the results ack_result keeps."""
        return self._key("results")

    @property
    def result_expiry(self) -> str:
        """zset: id -> ms at which its result is deleted."""
        return self._key("result_expiry")

    @property
    def finished(self) -> str:
        """stream: one entry {id: <job id>} per result stored; wait_result blocks on it."""
        return self._key("finished")

    @property
    def meta(self) -> str:
        """hash: id -> "<priority>|<pos>|<group>" of jobs with a group or a priority."""
        return self._key("meta")

    @property
    def gready(self) -> str:
        """zset: "<group>|<rank>|<id>" -> 0, the READY jobs that have meta (lexicographic)."""
        return self._key("gready")

    @property
    def ring(self) -> str:
        """zset: group -> turn (>= 1), or -1 while the group is parked at its cap."""
        return self._key("ring")

    @property
    def groups(self) -> str:
        """hash: r:<group> (leases running), c:<group> (its cap), cap, turn, seq, uturn."""
        return self._key("groups")

    @property
    def steps(self) -> str:
        """hash: the jobs' durable steps, parks and signals (lua/README.md section 2.6):
        "<id>" -> the job's index of entries, "<id>\\n<entry>" -> its value."""
        return self._key("steps")

    @property
    def waiting(self) -> str:
        """zset: id -> until_ms, the jobs parked for a signal (park.lua)."""
        return self._key("waiting")

    @property
    def keyed(self) -> str:
        """hash: "d:<key>" / "t:<key>" -> the id of the job holding a debounce / throttle key (lua/README.md section 2.7)."""
        return self._key("keyed")

    @property
    def index(self) -> str:
        """zset: "<t or g>\\n<task or group>\\n<enqueued_ms>\\n<id>" -> 0, the jobs of a queue that keeps indexes (set_indexes.lua)."""
        return self._key("index")

    @property
    def windows(self) -> str:
        """zset: "d:<key>" / "t:<key>" -> ms until which that job holds the key."""
        return self._key("windows")

    @property
    def expires(self) -> str:
        """zset: id -> deadline_ms of a job sent with an expiry, until its first lease."""
        return self._key("expires")

    @property
    def expired(self) -> str:
        """zset: id -> ms it expired (the newest 10000 jobs that expired)."""
        return self._key("expired")

    @property
    def sequenced(self) -> str:
        """zset: "<key>\\n<seq>\\n<id>" -> 0, the jobs of sequences waiting behind their head (lex)."""
        return self._key("sequenced")

    @property
    def fwait(self) -> str:
        """zset: id -> ms of its next check, the jobs waiting for others (flow_wait.lua)."""
        return self._key("fwait")

    @property
    def fpending(self) -> str:
        """zset: "<id>\t<queue>\t<job id>" -> 0, what each waiting job waits for (lexicographic)."""
        return self._key("fpending")

    @property
    def flows(self) -> str:
        """hash: flow id -> the record of a flow whose first step is in this queue (flow_record.lua)."""
        return self._key("flows")

    @property
    def flow_expiry(self) -> str:
        """zset: flow id -> ms at which its record is deleted."""
        return self._key("flow_expiry")

    @property
    def progress(self) -> str:
        """hash: id -> "<written_ms>|<bytes of receipt>|<receipt><value>": running jobs' progress (progress.lua)."""
        return self._key("progress")

    @property
    def progress_at(self) -> str:
        """zset: id -> ms its progress was written or last looked at by progress.lua's trim."""
        return self._key("progress_at")

    @property
    def events(self) -> str:
        """stream: the queue's events, ID 0-<n>, when it has opted in (set_events.lua; lua/README.md section 2.5)."""
        return self._key("events")

    def role(self, name: str) -> str:
        """The key for a role by name (as listed in a script header)."""
        if name not in ROLES:
            raise InvalidArgument(f"unknown key role {name!r}")
        return self._key(name)

    def all(self) -> list[str]:
        """Every key of the queue."""
        return [self._key(r) for r in ROLES]


#: Every role of a queue key, in the order lua/README.md lists them.
ROLES = ("jobs", "ready", "scheduled", "leased", "owners", "dead", "errors", "counters", "wake", "done", "results",
         "result_expiry", "finished", "meta", "gready", "ring", "groups", "fwait", "fpending", "flows", "flow_expiry",
         "progress", "progress_at", "events", "steps", "waiting", "keyed", "windows", "expires", "expired",
         "sequenced", "index")


@dataclass(frozen=True)
class ServiceKeys:
    """The Redis keys of a service namespace, ``<prefix>:{<namespace>}:service:<role>``.

    ``id`` selects one service's own keys (``service``, ``wake``); the namespace keys
    (``seq``, ``ids``, ``expiry``, ``queues``) do not depend on it.
    """

    prefix: str
    namespace: str
    id: int | None = None

    def __post_init__(self) -> None:
        check_name(self.prefix, "prefix")
        check_name(self.namespace, "namespace")

    def role(self, name: str) -> str:
        """The key for a role by name (as listed in a script header)."""
        base = f"{self.prefix}:{{{self.namespace}}}:service:"
        if name in ("seq", "ids", "expiry", "queues"):
            return base + name
        if name not in ("service", "wake"):
            raise InvalidArgument(f"unknown service key role {name!r}")
        if self.id is None:
            raise InvalidArgument("this key needs a service id")
        return f"{base}{self.id}" if name == "service" else f"{base}{self.id}:wake"

    def of(self, service_id: int) -> ServiceKeys:
        """The keys of service ``service_id`` in this namespace."""
        return ServiceKeys(self.prefix, self.namespace, service_id)
