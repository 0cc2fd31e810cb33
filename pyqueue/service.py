"""Service lifecycle: workers register in a namespace, renew a heartbeat, deregister,
and find the dead among them (lua/service_*.lua; DESIGN §5).

A namespace's keys share the hash tag ``{<namespace>}`` and may live on another Redis
server than the queues (the seed's ``serviceRedis``). A service's lease owner in every
queue is ``<namespace>.<id>``, so a dead service's leases can be scrubbed by owner.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib

from pyqueue.errors import InvalidArgument, ServiceExists, ServiceLost, mapped
from pyqueue.keys import ServiceKeys, check_name
from pyqueue.queue import bytes_client, check_int, embedded_redis
from pyqueue.scripts import Scripts

DEFAULT_NAMESPACE = "workers"
DEFAULT_EXPIRE_MS = 60_000
DEFAULT_CAPACITY = 1_000
GC_LIMIT = 10
DEAD_LIMIT = 20


@dataclass
class Service:
    """A registered service (this process's registration). Not thread-safe: one
    heartbeat thread renews it."""

    namespace: str
    id: int
    started_ms: int
    keys: ServiceKeys
    #: The renewal token written last; renewal succeeds only while the key still holds it.
    renewal: str = field(repr=False)
    #: The token a renewal sent but did not hear back about (OutcomeUnknown): the next
    #: renewal sends it again, so a renewal that did apply is not mistaken for a loss.
    pending_renewal: str | None = field(default=None, repr=False)

    @property
    def owner(self) -> str:
        """The lease owner this service uses in every queue."""
        return f"{self.namespace}.{self.id}"


@dataclass(frozen=True)
class DeadService:
    """A service whose registration expired: its leases are to be scrubbed."""

    id: int
    owner: str
    queues: list[str]


@dataclass(frozen=True)
class ServiceInfo:
    """A listed service, as ``pyqueue services`` shows it."""

    id: int
    alive: bool
    expires_ms: int
    queues: list[str]
    host: str = ""
    pid: int = 0
    started_ms: int = 0
    renewed_ms: int = 0


class Services:
    """A service namespace on one Redis server.

    Args:
        redis: a client; ``None`` uses the embedded fakeredis.
        namespace: 1..128 printable ASCII characters, no spaces or braces.
        prefix: the first part of every key.
    """

    def __init__(self, redis: redis_lib.Redis | None = None, *, namespace: str = DEFAULT_NAMESPACE, prefix: str = "pq") -> None:
        self.namespace = check_name(namespace, "namespace")
        if not all(c.isalnum() or c in "_.:-" for c in namespace):
            raise InvalidArgument("namespace must be made of [A-Za-z0-9_.:-] (it is part of lease owners)")
        self.keys = ServiceKeys(check_name(prefix, "prefix"), namespace)
        self.redis = bytes_client(redis if redis is not None else embedded_redis())
        self.scripts = Scripts(self.redis)

    def _call(self, fn: Any, *args: Any) -> Any:
        return mapped(fn, *args)

    def register(
        self,
        queues: list[str],
        *,
        expire_ms: int = DEFAULT_EXPIRE_MS,
        capacity: int = DEFAULT_CAPACITY,
        host: str | None = None,
        pid: int | None = None,
        now_ms: int | None = None,
    ) -> Service:
        """Register this process (lua/service_register.lua): a new id, its key written
        and expiring after ``expire_ms`` unless renewed.

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
        expected = int(self.redis.get(self.keys.role("seq")) or 0) + 1
        for _ in range(100):
            keys = self.keys.of(expected)
            reply = self._call(
                self.scripts.service_register,
                keys,
                now_ms,
                host or socket.gethostname(),
                os.getpid() if pid is None else pid,
                ",".join(queues),
                expire_ms,
                capacity,
                GC_LIMIT,
                renewal,
            )
            status = reply[0].decode()
            if status == "ok":
                return Service(self.namespace, int(reply[1]), int(reply[2]), keys, renewal)
            # 'retry': another service took the id; or a re-sent call after a lost reply
            # (then the key holds our own token: we are registered under that id).
            if self.redis.hget(keys.role("service"), "renewal") == renewal.encode():
                started = int(self.redis.hget(keys.role("service"), "started") or 0)
                return Service(self.namespace, expected, started, keys, renewal)
            expected = int(reply[1])
        raise ServiceExists("could not allocate a service id after 100 tries")

    def renew(self, service: Service, *, expire_ms: int = DEFAULT_EXPIRE_MS, now_ms: int | None = None) -> list[DeadService]:
        """Renew ``service`` (lua/service_renew.lua) and return dead services found.

        Raises:
            ServiceLost: the key expired, was deleted (remote shutdown) or holds another
                renewal token. The service must stop leasing and exit.
        """
        next_renewal = service.pending_renewal or secrets.token_hex(8)
        service.pending_renewal = next_renewal
        reply = self._call(
            self.scripts.service_renew, service.keys, now_ms, service.renewal, next_renewal, expire_ms, DEAD_LIMIT
        )
        service.pending_renewal = None
        if reply[0] != b"ok":
            raise ServiceLost(f"service {service.owner} lost its registration (expired, deleted or overwritten)")
        service.renewal = next_renewal
        return self._dead(reply[3:])

    def _dead(self, flat: list[Any]) -> list[DeadService]:
        out = []
        for i in range(0, len(flat), 2):
            sid = int(flat[i])
            queues = [q for q in flat[i + 1].decode().split(",") if q]
            out.append(DeadService(sid, f"{self.namespace}.{sid}", queues))
        return out

    def deregister(self, service: Service, *, now_ms: int | None = None) -> tuple[int, int]:
        """Remove ``service`` (lua/service_deregister.lua) after it released its leases.
        Returns (key deleted, ids list entries removed)."""
        deleted, removed = self._call(self.scripts.service_deregister, service.keys, now_ms, False)
        return int(deleted), int(removed)

    def forget_dead(self, service_id: int, *, now_ms: int | None = None) -> bool:
        """Forget a dead service once its leases were scrubbed in every queue it served.
        Does nothing (returns False) if it renewed meanwhile."""
        deleted, _ = self._call(self.scripts.service_deregister, self.keys.of(service_id), now_ms, True)
        return int(deleted) >= 0

    def stop(self, service_id: int) -> bool:
        """Remote shutdown: delete the service's key (the seed's ``del``) and wake it.
        The worker notices before its next blocking wait or renewal and stops cleanly."""
        keys = self.keys.of(service_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.role("service"))
        pipe.zadd(keys.role("wake"), {"stop": 0})
        pipe.pexpire(keys.role("wake"), 60_000)
        deleted, _, _ = pipe.execute()
        return bool(deleted)

    def alive(self, service: Service) -> bool:
        """Whether the service key still exists (remote shutdown deletes it)."""
        return bool(self.redis.exists(service.keys.role("service")))

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
            out.append(
                ServiceInfo(
                    id=sid,
                    alive=bool(fields) and expires > now,
                    expires_ms=int(expires),
                    queues=[q for q in queues.get(raw_id, b"").decode().split(",") if q],
                    host=fields.get(b"host", b"").decode(),
                    pid=int(fields.get(b"pid", 0)),
                    started_ms=int(fields.get(b"started", 0)),
                    renewed_ms=int(fields.get(b"renewed", 0)),
                )
            )
        return out
