"""Service lifecycle: workers register in a namespace, renew a heartbeat, are stopped
remotely, deregister, and find the dead among them (lua/service_*.lua; DESIGN §5).

A namespace's keys share the hash tag ``{<namespace>}`` and may live on another Redis
server than the queues (the seed's ``serviceRedis``). Each registration has an id (from
the namespace's counter) and a random registration token; its lease owner in every
queue is ``<namespace>.<id>.<registration>``, so a dead service's leases can be
scrubbed by owner, and a service that got a reused id (the counter starts again when
Redis loses its data) never shares leases, renewal, stop or deregistration with the
old holder of that id.

A registration ends in one of three ways, which a worker tells apart:

* **stopped**: ``Services.stop`` (``pyqueue stop``) marked the key; renewal answers
  ``Renewed.stop`` and the worker drains, deregisters and exits 0;
* **lost**: the key expired or holds another registration (the process was paused or
  cut off past ``expire_ms``, or Redis lost its data); renewal raises
  :class:`~pyqueue.protocol.errors.ServiceLost` and the worker stops leasing at once and exits
  non-zero, so a supervisor restarts it;
* **deregistered**: the service removed itself.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib

from pyqueue.protocol.errors import InvalidArgument, ServiceExists, ServiceLost
from pyqueue.protocol.keys import ServiceKeys, check_name
from pyqueue.drivers.clients import Client, bytes_client, default_client
from pyqueue.drivers.queue import check_int
from pyqueue.protocol.core import (
    ScriptCall,
    service_deregister_call,
    service_register_call,
    service_renew_call,
    service_stop_call,
)
from pyqueue.drivers.scripts import Scripts

DEFAULT_NAMESPACE = "workers"
DEFAULT_EXPIRE_MS = 60_000
DEFAULT_CAPACITY = 1_000
GC_LIMIT = 10
DEAD_LIMIT = 20
#: Lease owners are ``<namespace>.<id>.<registration>`` and at most 64 bytes: a
#: namespace of up to 40 bytes leaves room for a 14-digit id and the 8-byte token.
MAX_NAMESPACE = 40
#: A task name a service advertises (lua/service_register.lua, ARGV 11).
TASK_NAME = re.compile(r"[A-Za-z0-9_.:<>-]{1,200}")
#: The most bytes of all task names of one service, comma-separated.
MAX_TASKS_BYTES = 65536
#: The most bytes of a service's report of what it runs (lua/service_renew.lua, ARGV 7).
MAX_RUNNING_BYTES = 65536


#: How many of its latest renewal tokens a registration remembers (Service.recent_renewals):
#: a check() sees the key as its own while it holds one of them, however many renewals
#: ran while its read was in flight (one every renew_ms).
RECENT_RENEWALS = 16


@dataclass
class Service:
    """A registered service (this process's registration). Not thread-safe: one
    heartbeat thread renews it."""

    namespace: str
    id: int
    started_ms: int
    keys: ServiceKeys
    #: Random, fixed for this registration: part of the lease owner; fences renewal,
    #: stop, deregistration and scrub against a later service given the same id.
    registration: str
    #: The renewal token written last; renewal succeeds only while the key still holds it.
    renewal: str = field(repr=False)
    #: The token a renewal sent but did not hear back about (OutcomeUnknown): the next
    #: renewal sends it again, so a renewal that did apply is not mistaken for a loss.
    pending_renewal: str | None = field(default=None, repr=False)
    #: The last tokens this registration's renewals sent (the newest last; replaced,
    #: never mutated, so another thread reads it whole): what check() accepts.
    recent_renewals: tuple[str, ...] = field(default=(), repr=False)

    @property
    def owner(self) -> str:
        """The lease owner this service uses in every queue."""
        return f"{self.namespace}.{self.id}.{self.registration}"


@dataclass(frozen=True)
class DeadService:
    """A service whose registration expired: its leases are to be scrubbed."""

    id: int
    registration: str
    owner: str
    queues: list[str]


@dataclass(frozen=True)
class Renewed:
    """The answer of a successful renewal."""

    #: A remote stop asked this service to stop (the renewal still applied): stop
    #: leasing, finish or release running jobs, deregister.
    stop: bool
    #: Services of the namespace whose registration expired: scrub, then forget them.
    dead: list[DeadService]


@dataclass(frozen=True)
class RunningJob:
    """A job a service said it runs, at its last renewal (``Services.renew(running=)``)."""

    queue: str
    job_id: str
    #: When its lease was taken (ms, server clock).
    leased_ms: int
    #: When its time limit ends it (ms, server clock); None: no time limit.
    limit_ms: int | None = None


def encode_running(jobs: Sequence[RunningJob]) -> str:
    """``jobs`` as lua/service_renew.lua's ARGV 7: one line per job,
    ``<queue>\t<job id>\t<leased_ms>\t<limit_ms or ''>``, the longest-running first; the
    lines past MAX_RUNNING_BYTES are left out (a report, not a record)."""
    lines: list[str] = []
    size = 0
    for job in sorted(jobs, key=lambda j: (j.leased_ms, j.queue, j.job_id)):
        line = f"{job.queue}\t{job.job_id}\t{job.leased_ms}\t{'' if job.limit_ms is None else job.limit_ms}"
        size += len(line.encode()) + (1 if lines else 0)
        if size > MAX_RUNNING_BYTES:
            break
        lines.append(line)
    return "\n".join(lines)


def decode_running(text: str) -> tuple[RunningJob, ...]:
    """The inverse of :func:`encode_running`; a malformed line is left out."""
    out = []
    for line in text.split("\n") if text else ():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2].isdigit() and (parts[3] == "" or parts[3].isdigit()):
            out.append(RunningJob(parts[0], parts[1], int(parts[2]), int(parts[3]) if parts[3] else None))
    return tuple(out)


@dataclass(frozen=True)
class ServiceInfo:
    """A listed service, as ``pyqueue services`` shows it."""

    id: int
    alive: bool
    expires_ms: int
    queues: list[str]
    registration: str = ""
    #: Its lease owner in every queue, ``<namespace>.<id>.<registration>``.
    owner: str = ""
    #: A remote stop was asked and the service has not deregistered yet.
    stopping: bool = False
    host: str = ""
    pid: int = 0
    started_ms: int = 0
    renewed_ms: int = 0
    #: The task names it said it runs when it registered (``register(tasks=...)``), in
    #: that order; empty when it named none, or once its key expired.
    tasks: tuple[str, ...] = ()
    #: What it said it runs at its last renewal (``renew(running=)``), the longest-running first.
    running: tuple[RunningJob, ...] = ()


def check_tasks(tasks: Sequence[str]) -> str:
    """``tasks`` as ARGV 11 of lua/service_register.lua: the names, comma-separated.

    Raises:
        InvalidArgument: not a sequence of names of 1..200 characters of
            ``[A-Za-z0-9_.:<>-]``, or more than MAX_TASKS_BYTES in all.
    """
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
        raise InvalidArgument(f"tasks must be a sequence of task names, got {tasks!r}")
    for name in tasks:
        if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
            raise InvalidArgument(f"a task name must be 1..200 characters of [A-Za-z0-9_.:<>-], got {name!r}")
    joined = ",".join(tasks)
    if len(joined) > MAX_TASKS_BYTES:
        raise InvalidArgument(f"the task names may hold at most {MAX_TASKS_BYTES} bytes comma-separated, got {len(joined)}")
    return joined


class Services:
    """A service namespace on one Redis server.

    Args:
        redis: a client; ``None`` uses the embedded fakeredis.
        namespace: 1..128 printable ASCII characters, no spaces or braces.
        prefix: the first part of every key.
        wait_replicas: as ``Queue(wait_replicas=)``: every registration, renewal and
            deregistration waits for this many replicas (NotReplicated if fewer confirm).
            A worker passes its own, so that a renewal answered by a master that was
            just failed over (a Sentinel failover leaves the old master writable for a
            while) is sent again instead of leaving the promoted replica an older
            renewal token, which would make the worker's next renewal find itself lost.
    """

    def __init__(
        self, redis: Client | None = None, *, namespace: str = DEFAULT_NAMESPACE, prefix: str = "pq",
        wait_replicas: int = 0,
    ) -> None:
        self.namespace = check_name(namespace, "namespace")
        if not all(c.isalnum() or c in "_.:-" for c in namespace) or len(namespace) > MAX_NAMESPACE:
            raise InvalidArgument(
                f"namespace must be 1..{MAX_NAMESPACE} characters of [A-Za-z0-9_.:-] (it is part of lease owners)"
            )
        self.keys = ServiceKeys(check_name(prefix, "prefix"), namespace)
        self.redis = bytes_client(redis if redis is not None else default_client())
        self.scripts = Scripts(self.redis, wait_replicas=wait_replicas)

    def _call(self, step: ScriptCall) -> Any:
        return self.scripts.execute(step)

    def register(
        self,
        queues: list[str],
        *,
        expire_ms: int = DEFAULT_EXPIRE_MS,
        capacity: int = DEFAULT_CAPACITY,
        host: str | None = None,
        pid: int | None = None,
        registration: str | None = None,
        tasks: Sequence[str] = (),
        now_ms: int | None = None,
    ) -> Service:
        """Register this process (lua/service_register.lua): a new id, its key written
        and expiring after ``expire_ms`` unless renewed.

        ``registration``: tests only (deterministic owners); default 8 random hex digits.
        ``tasks``: the names of the tasks this process runs, kept in its key and shown
        by :meth:`list` (:attr:`ServiceInfo.tasks`), so callers can tell which task
        names the live workers of a queue serve; each 1..200 characters of
        ``[A-Za-z0-9_.:<>-]``.

        Raises:
            ServiceExists: the new id's key exists already (another program writes in
                this namespace); nothing was written.
        """
        check_int(expire_ms, "expire_ms", 1000, 86_400_000)
        check_int(capacity, "capacity", 1, 100_000)
        if not queues:
            raise InvalidArgument("a service serves at least one queue")
        for name in queues:
            check_name(name, "queue name")
            if "," in name:
                raise InvalidArgument("queue names served by a service cannot contain ','")
        renewal = secrets.token_hex(8)
        registration = secrets.token_hex(4) if registration is None else registration
        if not 1 <= len(registration) <= 16 or not (registration.isascii() and registration.isalnum()):
            raise InvalidArgument("registration must be 1..16 characters of [A-Za-z0-9]")
        served_tasks = check_tasks(tasks)
        expected = int(self.redis.get(self.keys.role("seq")) or 0) + 1
        for _ in range(100):
            keys = self.keys.of(expected)
            reply = self._call(
                service_register_call(
                keys,
                now_ms,
                host or socket.gethostname(),
                os.getpid() if pid is None else pid,
                ",".join(queues),
                expire_ms,
                capacity,
                GC_LIMIT,
                renewal,
                registration,
                served_tasks,
                )
            )
            status = reply[0].decode()
            if status == "ok":
                return Service(self.namespace, int(reply[1]), int(reply[2]), keys, registration, renewal)
            # 'retry': another service took the id; or a re-sent call after a lost reply
            # (then the key holds our own token: we are registered under that id).
            if self.redis.hget(keys.role("service"), "renewal") == renewal.encode():
                started = int(self.redis.hget(keys.role("service"), "started") or 0)
                return Service(self.namespace, expected, started, keys, registration, renewal)
            expected = int(reply[1])
        raise ServiceExists("could not allocate a service id after 100 tries")

    def renew(
        self, service: Service, *, expire_ms: int = DEFAULT_EXPIRE_MS, now_ms: int | None = None,
        running: Sequence[RunningJob] | None = None,
    ) -> Renewed:
        """Renew ``service`` (lua/service_renew.lua): whether a remote stop was asked,
        and the dead services found. ``running``: what it runs now, kept in its key for
        ``list()`` (and the dashboard) until the next renewal that reports; None leaves
        the last report as it was.

        Raises:
            ServiceLost: the key expired, was deleted or holds another registration
                (nothing written). The service must stop leasing at once and exit.
        """
        next_renewal = service.pending_renewal or secrets.token_hex(8)
        # Known before it is sent: a check() whose read the server runs after this
        # write must find the token ours.
        service.recent_renewals = (*service.recent_renewals[-(RECENT_RENEWALS - 1):], next_renewal)
        service.pending_renewal = next_renewal
        reply = self._call(
            service_renew_call(service.keys, now_ms, service.renewal, next_renewal, expire_ms, DEAD_LIMIT,
                               None if running is None else encode_running(running))
        )
        if reply[0] == b"lost":
            service.pending_renewal = None
            raise ServiceLost(
                f"service {service.owner} lost its registration: its key expired (the process was paused or cut "
                "off for longer than expire_ms, or Redis lost its data) or holds another registration"
            )
        service.renewal = next_renewal
        service.pending_renewal = None
        return Renewed(stop=reply[0] == b"stop", dead=self._dead(reply[3:]))

    def _dead(self, flat: list[Any]) -> list[DeadService]:
        out = []
        for i in range(0, len(flat), 3):
            sid, registration = int(flat[i]), flat[i + 1].decode()
            queues = [q for q in flat[i + 2].decode().split(",") if q]
            out.append(DeadService(sid, registration, f"{self.namespace}.{sid}.{registration}", queues))
        return out

    def check(self, service: Service) -> str:
        """Read (never write) the service key: ``'ok'``, ``'stop'`` (a remote stop was
        asked) or ``'lost'`` (the key is gone or holds another registration). Safe to
        call while another thread renews: the key holds this registration while it holds
        a token one of its renewals sent (each is random), whichever renewal the read
        ran between. (Reading only the tokens current before the read once took a
        renewal sent meanwhile for a loss, and the worker stopped with exit 75.)"""
        client: Any = self.redis  # undecoded (bytes_client); redis-py types it loosely
        current, stop = client.hmget(service.keys.role("service"), ["renewal", "stop"])
        ours = (service.renewal, service.pending_renewal, *service.recent_renewals)
        if current is None or current.decode() not in ours:
            return "lost"
        return "stop" if stop is not None else "ok"

    def deregister(self, service: Service, *, now_ms: int | None = None) -> tuple[int, int]:
        """Remove ``service`` (lua/service_deregister.lua) after it released its leases.
        Returns (key deleted, ids list entries removed); (-1, 0) if its id now belongs to
        another registration (nothing is removed: that one is not ours)."""
        deleted, removed = self._call(service_deregister_call(service.keys, now_ms, False, service.registration))
        return int(deleted), int(removed)

    def forget_dead(self, service_id: int, registration: str, *, now_ms: int | None = None) -> bool:
        """Forget a dead service once its leases were scrubbed in every queue it served.
        Does nothing (returns False) if it renewed meanwhile, or if its id now belongs to
        another registration."""
        deleted, _ = self._call(service_deregister_call(self.keys.of(service_id), now_ms, True, registration))
        return int(deleted) >= 0

    def deregister_dead(self, service_id: int, registration: str, *, now_ms: int | None = None) -> bool:
        """Forget a service whose process is known to have ended (its supervisor reaped
        it) once its leases were scrubbed, without waiting for its key to expire. Does
        nothing (returns False) if its id now belongs to another registration."""
        deleted, _ = self._call(service_deregister_call(self.keys.of(service_id), now_ms, False, registration))
        return int(deleted) >= 0

    def stop(self, service_id: int, registration: str = "", *, now_ms: int | None = None) -> bool:
        """Remote shutdown (lua/service_stop.lua): mark the service's key and wake it.
        The worker learns of it before its next blocking wait or at its next renewal,
        finishes (or, after its grace period, releases) its running jobs, deregisters
        and exits 0. Returns False if there is no such live service. ``registration``:
        stop only that registration of the id (default: whichever holds it)."""
        stopped, _ = self._call(service_stop_call(self.keys.of(service_id), now_ms, registration))
        return bool(stopped)

    def list(self, *, now_ms: int | None = None) -> list[ServiceInfo]:
        """Every service the namespace remembers (alive, or dead and not yet scrubbed),
        newest first, with the fields of the live ones' keys. Read-only, not atomic."""
        client: Any = self.redis  # redis-py's reply types are too loose to be useful here
        now = now_ms
        if now is None:
            seconds, micros = client.time()
            now = seconds * 1000 + micros // 1000
        expiry = client.zrange(self.keys.role("expiry"), 0, -1, withscores=True)
        queues = client.hgetall(self.keys.role("queues"))
        out = []
        for raw_id, expires in sorted(expiry, key=lambda e: -int(e[0])):
            sid = int(raw_id)
            fields = client.hgetall(self.keys.of(sid).role("service"))
            registration, _, served = queues.get(raw_id, b"").decode().partition(" ")
            out.append(
                ServiceInfo(
                    id=sid,
                    alive=bool(fields) and expires > now,
                    expires_ms=int(expires),
                    queues=[q for q in served.split(",") if q],
                    registration=registration,
                    owner=f"{self.namespace}.{sid}.{registration}",
                    stopping=b"stop" in fields,
                    host=fields.get(b"host", b"").decode(),
                    pid=int(fields.get(b"pid", 0)),
                    started_ms=int(fields.get(b"started", 0)),
                    renewed_ms=int(fields.get(b"renewed", 0)),
                    tasks=tuple(t for t in fields.get(b"tasks", b"").decode().split(",") if t),
                    running=decode_running(fields.get(b"running", b"").decode("utf-8", "replace")),
                )
            )
        return out
