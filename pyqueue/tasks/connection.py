"""How a :class:`~pyqueue.tasks.Tasks` object reaches Redis: its clients (blocking and
asyncio, each made from the other when needed), its queues, and its estimate of the
server's clock. Made so that the registry (``app.py``) does not also hold the wiring."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import redis as redis_lib

from pyqueue.aio import AsyncQueue
from pyqueue.drivers.clients import Client, connect, default_client, is_cluster
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.drivers.queue import MAX_PARTITIONS, Queue, check_int

#: How long a measured offset between this process's clock and the server's is trusted.
CLOCK_REFRESH_S = 60.0
#: TIME reads per measurement of that offset (the shortest round trip is kept).
CLOCK_READS = 3


def check_partition_counts(partitions: Mapping[str, int] | None, what: str) -> dict[str, int]:
    """``partitions`` (queue name -> partition count, 1..MAX_PARTITIONS) as a dict.

    Raises:
        InvalidArgument: not a mapping of queue names to counts.
    """
    if partitions is None:
        return {}
    if not isinstance(partitions, Mapping):
        raise InvalidArgument(f"{what} takes a mapping of queue name to partition count, got {type(partitions).__name__}")
    for name, count in partitions.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{what}: a queue name is a non-empty str, got {name!r}")
        check_int(count, f"{what} count of {name!r}", 1, MAX_PARTITIONS)
    return dict(partitions)


class Connection:
    """A Tasks object's clients, queues and server clock (see the module docstring)."""

    def __init__(self, url: str | None, client: Any, prefix: str, partitions: Mapping[str, int] | None = None) -> None:
        if url is not None and client is not None:
            raise InvalidArgument("give Tasks a url or a client, not both")
        self.prefix = prefix
        #: The partitioned queues' partition counts (a queue not named has one).
        self.partitions = check_partition_counts(partitions, "Tasks(partitions=)")
        self._url = url
        self._made: list[Any] = []  # clients this object made, and closes (close/aclose)
        self._client: Client | None = None
        self._aclient: Any = None
        if client is not None:
            if _is_async_client(client):
                self._aclient = client
            elif isinstance(client, (redis_lib.Redis, redis_lib.RedisCluster)):
                self._client = client
            else:
                raise InvalidArgument(f"Tasks(client=) takes a redis-py client, blocking or asyncio, got {type(client).__name__}")
        self._queues: dict[str, Queue] = {}
        self._aqueues: dict[str, AsyncQueue] = {}
        self._lock = threading.Lock()
        self._offset_ms: int | None = None  # server clock minus this process's clock
        self._offset_at = 0.0

    def adopt(self, client: Client) -> None:
        """Use ``client`` if this connection was told nothing and has not connected yet
        (``pyqueue worker --url``: tasks that send tasks send them where it serves)."""
        with self._lock:
            if self._client is None and self._aclient is None and self._url is None:
                self._client = client

    def forget_clock(self) -> None:
        """Measure the server's clock again at the next use (the testing clock moved)."""
        self._offset_ms = None

    @property
    def redis(self) -> Client:
        """The blocking client (made on first use)."""
        with self._lock:
            if self._client is None:
                if self._aclient is not None:
                    self._client = _twin(self._aclient, redis_lib.Redis)
                    self._made.append(self._client)
                elif self._url is not None:
                    self._client = connect(self._url)
                    self._made.append(self._client)
                else:
                    self._client = default_client()  # the process's, shared: never closed here
            return self._client

    @property
    def aredis(self) -> Any:
        """The asyncio client (made on first use, from the blocking one's settings)."""
        with self._lock:
            if self._aclient is None:
                client = self._client if self._client is not None else None
            else:
                return self._aclient
        if client is None:
            client = self.redis
        import redis.asyncio as aredis

        with self._lock:
            if self._aclient is None:
                self._aclient = _twin(client, aredis.Redis)
                self._made.append(self._aclient)
            return self._aclient

    def close(self) -> None:
        """Close the blocking clients this object made (from ``url=``, or twins of the
        client it was given); a given client, and the process's default one, are the
        caller's. Use :meth:`aclose` for asyncio ones."""
        with self._lock:
            made = [c for c in self._made if not _is_async_client(c)]
            self._made = [c for c in self._made if _is_async_client(c)]
            self._forget(made)
        for client in made:
            client.close()

    async def aclose(self) -> None:
        """:meth:`close`, and the asyncio clients this object made."""
        self.close()
        with self._lock:
            made, self._made = self._made, []
            self._forget(made)
        for client in made:
            await client.aclose()

    def _forget(self, clients: list[Any]) -> None:
        """Stop using ``clients`` (a later call connects again)."""
        if self._client in clients:
            self._client, self._queues = None, {}
        if self._aclient in clients:
            self._aclient, self._aqueues = None, {}

    def queue(self, name: str) -> Queue:
        """The :class:`~pyqueue.Queue` named ``name`` on this connection."""
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = Queue(name, self.redis, prefix=self.prefix,
                                               partitions=self.partitions.get(name, 1))
        return queue

    def aqueue(self, name: str) -> AsyncQueue:
        """The :class:`~pyqueue.aio.AsyncQueue` named ``name`` on the asyncio client."""
        queue = self._aqueues.get(name)
        if queue is None:
            queue = self._aqueues[name] = AsyncQueue(name, self.aredis, prefix=self.prefix,
                                                     partitions=self.partitions.get(name, 1))
        return queue

    def server_now_ms(self) -> int:
        """The Redis server's clock now, as this process estimates it: its own clock
        plus an offset read with ``TIME`` (again every minute), so within about a round
        trip of the server's. Enqueue times and ``send_at`` use it."""
        if self._offset_ms is None or time.monotonic() - self._offset_at > CLOCK_REFRESH_S:
            reads = []
            for _ in range(CLOCK_READS):
                sent = time.time()
                seconds, micros = self.redis.time()
                reads.append((sent, time.time(), int(seconds) * 1000 + int(micros) // 1000))
            self._set_offset(reads)
        assert self._offset_ms is not None
        return int(time.time() * 1000) + self._offset_ms

    async def aserver_now_ms(self) -> int:
        """:meth:`server_now_ms` on the asyncio client."""
        if self._offset_ms is None or time.monotonic() - self._offset_at > CLOCK_REFRESH_S:
            reads = []
            for _ in range(CLOCK_READS):
                sent = time.time()
                seconds, micros = await self.aredis.time()
                reads.append((sent, time.time(), int(seconds) * 1000 + int(micros) // 1000))
            self._set_offset(reads)
        assert self._offset_ms is not None
        return int(time.time() * 1000) + self._offset_ms

    def _set_offset(self, reads: list[tuple[float, float, int]]) -> None:
        """The offset from the read with the shortest round trip (the first may include
        connecting): the server's time against the middle of that round trip."""
        sent, received, server_ms = min(reads, key=lambda r: r[1] - r[0])
        self._offset_ms, self._offset_at = round(server_ms - (sent + received) * 500), time.monotonic()


    def bind(self, client: Any, *, prefix: str | None = None) -> None:
        """Send and serve through ``client`` (blocking or asyncio) from now on, and under
        ``prefix`` if given: for a program that makes its client from its own settings
        after the module defining the tasks was imported."""
        self.restore((None, None, {}, {}, None, 0.0))
        if prefix is not None:
            self.prefix = prefix
        with self._lock:
            if _is_async_client(client):
                self._aclient = client
            else:
                self._client = client

    def swap(self, client: Client | None, aclient: Any) -> tuple[Any, ...]:
        """Point this object at another server (the testing helper); the old state."""
        with self._lock:
            old = (self._client, self._aclient, self._queues, self._aqueues, self._offset_ms, self._offset_at)
            self._client, self._aclient, self._queues, self._aqueues = client, aclient, {}, {}
            self._offset_ms = None
        return old

    def restore(self, old: tuple[Any, ...]) -> None:
        with self._lock:
            self._client, self._aclient, self._queues, self._aqueues, self._offset_ms, self._offset_at = old


def _is_async_client(client: object) -> bool:
    """Whether ``client`` is an asyncio redis-py client (fakeredis's ``FakeAsyncRedis``
    is one: it subclasses ``redis.asyncio.Redis``)."""
    import redis.asyncio as aredis

    return isinstance(client, (aredis.Redis, aredis.RedisCluster))


def _twin(client: Any, cls: Any) -> Any:
    """A client of class ``cls`` (blocking or asyncio ``Redis``) with ``client``'s
    connection settings.

    Raises:
        InvalidArgument: a cluster client (give Tasks a URL instead) or a fakeredis one
            of the other kind (the embedded server is reached through both kinds by
            :func:`pyqueue.drivers.clients.embedded_redis` and the async driver).
    """
    if is_cluster(client) or type(client).__name__ == "RedisCluster":
        raise InvalidArgument("Tasks(client=) with a cluster client can only be used as given: pass Tasks(url=...) instead")
    module = type(client).__module__
    if module.startswith("fakeredis"):
        import fakeredis

        fake_server = client.connection_pool.connection_kwargs.get("server")
        if fake_server is None:
            raise InvalidArgument("this fakeredis client has no server to share: pass FakeRedis(server=...)")
        return (fakeredis.FakeRedis if cls is redis_lib.Redis else fakeredis.FakeAsyncRedis)(server=fake_server)
    pool = client.connection_pool
    # Only the settings both kinds mean the same way: the rest (the parser, the retry
    # object, maintenance handlers, registries) are objects of one kind, and the other
    # kind breaks on them.
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _SHARED_SETTINGS}
    old_retry = pool.connection_kwargs.get("retry")
    name = pool.connection_class.__name__
    if hasattr(pool, "sentinel_manager"):  # a redis+sentinel:// client (either kind)
        return _sentinel_twin(pool, cls, kwargs, old_retry)
    if cls is redis_lib.Redis:
        import redis.connection as sync_connection
        from redis.retry import Retry as SyncRetry

        _carry_retry(old_retry, SyncRetry, kwargs)
        connection_class: Any = getattr(sync_connection, name, sync_connection.Connection)
        # from_pool: the client owns its pool, so close() disconnects it.
        return redis_lib.Redis.from_pool(redis_lib.ConnectionPool(connection_class=connection_class, **kwargs))
    import redis.asyncio as aredis
    import redis.asyncio.connection as async_connection
    from redis.asyncio.retry import Retry as AsyncRetry

    _carry_retry(old_retry, AsyncRetry, kwargs)
    connection_class = getattr(async_connection, name, async_connection.Connection)
    return aredis.Redis.from_pool(aredis.ConnectionPool(connection_class=connection_class, **kwargs))


def _sentinel_twin(pool: Any, cls: Any, kwargs: dict[str, Any], old_retry: Any) -> Any:
    """A client of class ``cls`` (blocking or asyncio) of the master a Sentinel-managed
    ``pool`` serves: a Sentinel of that kind over the same sentinels, with their
    settings taken over the same way, so the twin follows a failover too."""
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.retry import Retry as SyncRetry

    from pyqueue.drivers.clients import SentinelURL, sentinel_master

    manager = pool.sentinel_manager
    sentinels = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in manager.sentinels
    ]
    sentinel_kwargs = {k: v for k, v in manager.sentinel_kwargs.items() if k in _SHARED_SETTINGS or k == "ssl"}
    kwargs["ssl"] = "SSL" in pool.connection_class.__name__
    retry_class = SyncRetry if cls is redis_lib.Redis else AsyncRetry
    _carry_retry(old_retry, retry_class, kwargs)
    _carry_retry(manager.sentinel_kwargs.get("retry"), retry_class, sentinel_kwargs)
    parsed = SentinelURL(sentinels, pool.service_name, kwargs, sentinel_kwargs)
    return sentinel_master(parsed, {}, asyncio=cls is not redis_lib.Redis)


#: Connection settings a twin client takes over (plain values, the same in both kinds).
_SHARED_SETTINGS = frozenset({
    "host", "port", "path", "db", "username", "password", "credential_provider",
    "socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
    "retry_on_timeout", "retry_on_error", "encoding", "encoding_errors", "decode_responses",
    "socket_read_size", "health_check_interval", "client_name", "lib_name", "lib_version", "protocol",
    "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path",
    "ssl_check_hostname", "ssl_password", "ssl_min_version", "ssl_ciphers",
})


def _carry_retry(retry: Any, retry_class: Any, kwargs: dict[str, Any]) -> None:
    """The retry policy of one kind of client as the other kind's ``Retry`` (the same
    backoff and count: pyqueue's re-sends are what make a lost reply safe)."""
    backoff, retries = getattr(retry, "_backoff", None), getattr(retry, "_retries", None)
    if backoff is not None and isinstance(retries, int):
        kwargs["retry"] = retry_class(backoff, retries)
