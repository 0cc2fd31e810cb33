"""Redis clients the way pyqueue needs them: one server or a Redis Cluster, undecoded,
with explicit retries and timeouts, and a twin for blocking waits.

Every other module takes a :data:`Client` (a ``redis.Redis`` or a
``redis.cluster.RedisCluster``) and asks this module what differs between the two:

* :func:`connect` builds either from a URL. ``redis+cluster://`` (or
  ``rediss+cluster://``) asks for a cluster explicitly; a plain ``redis://`` URL is
  probed with ``INFO cluster`` and becomes a cluster client when the server is in
  cluster mode (a user not allowed to run INFO gets a one-server client: use the
  explicit scheme then).
* :func:`bytes_client` and :func:`blocking_twin` make siblings with other connection
  settings (no reply decoding; a socket timeout that outlasts a blocking wait).
* :func:`primaries` lists one plain client per primary: for what must ask every node
  (SCAN-based discovery, configuration checks).
* :func:`default_client` is what ``Queue(name)`` talks through when given no client:
  the server named by ``PYQUEUE_URL``, else the embedded fakeredis (:func:`default_url`
  reads the variable; the async driver's ``pyqueue.aio.default_client`` does the same).

On a cluster every script call names keys of one hash tag, so redis-py routes it to the
slot's primary and follows MOVED and ASK itself; :mod:`pyqueue.scripts` retries the
transient answers of a cluster in motion (TRYAGAIN, CLUSTERDOWN, a node lost).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any, Union
from urllib.parse import urlsplit

import redis as redis_lib
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from pyqueue.errors import InvalidArgument

log = logging.getLogger("pyqueue")

#: What pyqueue accepts wherever it takes a client.
Client = Union[redis_lib.Redis, RedisCluster]

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

_embedded_lock = threading.Lock()
_embedded_server: Any = None  # a fakeredis.FakeServer, created on first use

#: The environment variable that names the server every entry point uses by default.
URL_VARIABLE = "PYQUEUE_URL"
#: The URL schemes :func:`connect` takes (besides ``embedded``).
URL_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)

# default_client's clients, one per URL (under _default_lock), and the URLs whose choice
# has been logged ("embedded" included); emptied by reset_default_clients.
_default_lock = threading.Lock()
_default_clients: dict[str, Client] = {}
_default_announced: set[str] = set()

# Connection settings a cluster client keeps per node that must not be copied into a
# new client's constructor: redis-py sets them itself, and refuses `db` (a URL's "/0").
_CLUSTER_INTERNAL_KWARGS = ("redis_connect_func", "oss_cluster_maint_notifications_handler", "db")


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a Redis Cluster client."""
    return isinstance(client, RedisCluster)


def embedded_redis() -> redis_lib.Redis:
    """A client of the process-wide embedded fakeredis server (created on first use).

    Every ``Queue(name)`` made without a client shares this server, so producers and
    workers in one process see the same queues. Nothing is persisted.
    """
    import fakeredis  # only the embedded default needs it: keep it off the import path

    client: redis_lib.Redis = fakeredis.FakeRedis(server=embedded_server())
    return client


def embedded_server() -> Any:
    """The process-wide embedded ``fakeredis.FakeServer`` (created on first use); the
    async driver's embedded client talks to the same one."""
    import fakeredis

    global _embedded_server
    with _embedded_lock:
        if _embedded_server is None:
            _embedded_server = fakeredis.FakeServer()
        return _embedded_server


def default_url() -> str:
    """The URL a queue made without a client uses: ``PYQUEUE_URL`` if it is set (and not
    empty), else ``embedded``. The first time each choice is made in a process it is
    logged at INFO on the ``pyqueue`` logger, a password in the URL hidden.

    Raises:
        InvalidArgument: ``PYQUEUE_URL`` is not a URL :func:`connect` takes (the message
            names the variable).
    """
    url = os.environ.get(URL_VARIABLE, "").strip()
    if url in ("embedded", "fakeredis://"):
        _announce("embedded", f"{URL_VARIABLE}={url}: using the embedded in-process server (fakeredis)")
        return "embedded"
    if not url:
        _announce(
            "embedded",
            f"no {URL_VARIABLE}: using the embedded in-process server (fakeredis); "
            f"set {URL_VARIABLE} to share queues between processes",
        )
        return "embedded"
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in URL_SCHEMES:
        raise InvalidArgument(
            f"{URL_VARIABLE}={redact_url(url)!r} is not a URL pyqueue can connect to: it must start with "
            + ", ".join(f"{s}://" for s in URL_SCHEMES)
            + ", or be 'embedded'"
        )
    _announce(url, f"using {URL_VARIABLE}={redact_url(url)} (from the environment)")
    return url


def default_client() -> Client:
    """The client of a queue (or partitioned queue) made without one: a client of the
    server named by ``PYQUEUE_URL`` (see :func:`default_url`), made once per URL and
    process with :func:`connect`'s settings and shared by every such queue (one
    connection pool; the server's eviction policy is checked once, as ``from_url``
    does); without the variable a client of the embedded fakeredis, as before.

    Raises:
        InvalidArgument: ``PYQUEUE_URL`` is not a URL pyqueue can connect to.
    """
    url = default_url()
    if url == "embedded":
        return embedded_redis()
    with _default_lock:
        client = _default_clients.get(url)
        if client is None:
            try:
                client = connect(url)
            except ValueError as exc:  # redis-py's word on a URL it cannot parse
                raise InvalidArgument(f"{URL_VARIABLE}={redact_url(url)!r}: {exc}") from exc
            check_server(client)
            _default_clients[url] = client
        return client


def reset_default_clients() -> None:
    """Forget :func:`default_client`'s clients (closing them) and which choices were
    logged, as in a new process. For tests."""
    with _default_lock:
        clients = list(_default_clients.values())
        _default_clients.clear()
        _default_announced.clear()
    for client in clients:
        client.close()


def _announce(key: str, message: str) -> None:
    """Log ``message`` at INFO unless the choice ``key`` was announced before."""
    with _default_lock:
        if key in _default_announced:
            return
        _default_announced.add(key)
    log.info(message)


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (in the user part and in a
    ``password=`` query parameter): fit for a log line or an error message."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable (a bad IPv6 host): show nothing but the scheme
        return url.partition("://")[0] + "://..."
    if parts.password is not None:  # the netloc comes first after "<scheme>://"
        url = url.replace(parts.netloc, f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}", 1)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url)


def connect(
    url: str,
    *,
    retries: int = 3,
    socket_timeout_s: float = 10.0,
    socket_connect_timeout_s: float = 5.0,
    cluster: bool | None = None,
) -> Client:
    """A redis-py client configured the way pyqueue expects.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
            ``rediss+cluster://``, or ``embedded`` (the in-process fakeredis).
        retries: redis-py re-sends a command up to this many times after a connection
            error or timeout, with jittered exponential backoff (10 ms doubling, capped
            at 1 s). Re-sending is safe because every script is replay-safe. After the
            last retry the call raises :class:`~pyqueue.errors.OutcomeUnknown` (on a
            cluster, pyqueue keeps retrying for its weather budget first, see
            :mod:`pyqueue.scripts`). ``retries=0`` raises at once.
        socket_timeout_s: how long one reply may take; blocking waits use their own
            connection with a longer timeout (see :func:`blocking_twin`).
        cluster: ``True``/``False`` to say whether the server is a Redis Cluster;
            ``None`` (default) takes a ``+cluster`` scheme as yes and otherwise asks
            the server (``INFO cluster``).
    """
    if url in ("embedded", "fakeredis://"):
        return embedded_redis()
    url, cluster, settings = client_settings(
        url,
        retries=retries,
        socket_timeout_s=socket_timeout_s,
        socket_connect_timeout_s=socket_connect_timeout_s,
        cluster=cluster,
    )
    if cluster:
        return RedisCluster.from_url(url, **settings)
    return redis_lib.Redis.from_url(url, **settings, **ONE_SERVER_SETTINGS)


#: What a one-server client gets beyond :func:`client_settings` (a cluster client
#: refuses these: it retries and checks its nodes itself).
ONE_SERVER_SETTINGS: dict[str, Any] = {
    "retry_on_error": [redis_lib.ConnectionError, redis_lib.TimeoutError],
    "health_check_interval": 30,
}


def client_settings(
    url: str,
    *,
    retries: int = 3,
    socket_timeout_s: float = 10.0,
    socket_connect_timeout_s: float = 5.0,
    cluster: bool | None = None,
    retry_class: Any = Retry,
) -> tuple[str, bool, dict[str, Any]]:
    """What both drivers' ``connect`` derive from a URL and pyqueue's settings: the URL
    to pass redis-py, whether it names a cluster, and the client keyword arguments,
    the retry policy included (``retry_class``: redis-py's sync or asyncio ``Retry``)."""
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        url, cluster = f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}", True
    settings: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_connect_timeout_s,
        "decode_responses": False,
        "retry": retry_class(ExponentialWithJitterBackoff(base=0.01, cap=1.0), retries),
    }
    if not url.startswith("unix:"):
        settings["socket_keepalive"] = True
    if url.startswith("unix:"):
        cluster = False
    elif cluster is None:
        probe = {k: v for k, v in settings.items() if k != "retry"}
        cluster = _server_is_cluster(url, probe)
    return url, bool(cluster), settings


def _server_is_cluster(url: str, settings: dict[str, Any]) -> bool:
    """Ask the server at ``url`` whether it runs in cluster mode (``INFO cluster``).
    A server that refuses (an ACL user without INFO) or cannot be reached now is taken
    as one server, so that connecting stays lazy: the first call reports the error."""
    probe = redis_lib.Redis.from_url(url, **settings)
    try:
        return bool(probe.info("cluster").get("cluster_enabled"))
    except redis_lib.RedisError as exc:
        log.info("could not ask whether %s is a cluster (%s): taking it as one server; "
                 "use redis+cluster:// for a cluster", redact_url(url), exc)
        return False
    finally:
        probe.close()


def _cluster_sibling(client: RedisCluster, **overrides: Any) -> RedisCluster:
    """A new cluster client of the same cluster with some connection settings changed."""
    kwargs = {k: v for k, v in client.nodes_manager.connection_kwargs.items() if k not in _CLUSTER_INTERNAL_KWARGS}
    kwargs.update(overrides)
    nodes = [ClusterNode(node.host, node.port) for node in client.get_primaries()]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=nodes, retry=client.retry, **kwargs)


def bytes_client(client: Client) -> Client:
    """``client`` itself, or a sibling on the same server(s) that does not decode replies.

    Payloads are bytes; a client made with ``decode_responses=True`` would decode them
    (and fail on non-UTF-8 payloads), so pyqueue talks through an undecoded twin that
    shares the original's connection settings.
    """
    if isinstance(client, RedisCluster):
        if not client.nodes_manager.connection_kwargs.get("decode_responses"):
            return client
        return _cluster_sibling(client, decode_responses=False)
    pool = client.connection_pool
    if not pool.connection_kwargs.get("decode_responses"):
        return client
    kwargs = dict(pool.connection_kwargs)
    kwargs["decode_responses"] = False
    twin_pool = pool.__class__(connection_class=pool.connection_class, **kwargs)
    return redis_lib.Redis(connection_pool=twin_pool)


def blocking_twin(client: Client, socket_timeout_s: float) -> Client:
    """A client of the same server(s) for blocking waits: its socket timeout outlasts
    every wait (with redis-py's usual 5 s, a 6 s BZPOPMIN would time out on the socket
    before the server answers), and it never re-sends a wait by itself, so that
    :func:`disconnect` ends a blocked wait (the waiting loop decides what comes next).
    """
    once = Retry(ExponentialWithJitterBackoff(base=0.01, cap=1.0), 0)
    if isinstance(client, RedisCluster):
        twin = _cluster_sibling(client, socket_timeout=socket_timeout_s)
        twin.retry = once
        return twin
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = socket_timeout_s
    kwargs["retry"] = once
    return redis_lib.Redis(connection_pool=pool.__class__(connection_class=pool.connection_class, **kwargs))


def disconnect(client: Client) -> None:
    """Close every connection of ``client``, also those another thread is blocked on:
    that thread's call then raises ConnectionError. How a worker ends its own blocking
    wait without writing to Redis."""
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
        return
    client.connection_pool.disconnect()


def primaries(client: Client) -> list[redis_lib.Redis]:
    """One plain client per primary: the client itself on one server."""
    if isinstance(client, RedisCluster):
        out = []
        for node in client.get_primaries():  # type: ignore[no-untyped-call]
            if node.redis_connection is None:
                client.nodes_manager.initialize()
            out.append(node.redis_connection)
        return [c for c in out if c is not None]
    return [client]


def node_for_key(client: Client, key: str) -> redis_lib.Redis:
    """A plain client of the server that holds ``key`` (its slot's primary on a
    cluster): for commands sent on a raw connection."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        if node.redis_connection is None:
            client.nodes_manager.initialize()
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        plain: redis_lib.Redis = node.redis_connection
        return plain
    return client


def check_server(client: Client) -> list[str]:
    """Warn (log) about server settings that break pyqueue's promises; return them.

    Any ``maxmemory-policy`` but ``noeviction`` lets Redis evict keys at its memory
    limit, silently dropping jobs. Every primary of a cluster is asked. A client not
    allowed to run CONFIG (a least-privilege ACL user) skips the check.
    """
    problems: list[str] = []
    for node in primaries(client):
        try:
            policy = node.config_get("maxmemory-policy").get("maxmemory-policy")
        except redis_lib.RedisError as exc:
            log.info("could not check maxmemory-policy (%s); it must be 'noeviction'", exc)
            return problems
        kwargs = node.get_connection_kwargs()
        problems += eviction_problems(policy, f"{kwargs.get('host')}:{kwargs.get('port')}" if is_cluster(client) else "")
    for problem in problems:
        log.warning(problem)
    return problems


def eviction_problems(policy: object, where: str = "") -> list[str]:
    """The problem with a server's ``maxmemory-policy``, if any (see :func:`check_server`)."""
    if isinstance(policy, bytes):
        policy = policy.decode()
    if policy in (None, "noeviction"):
        return []
    return [
        f"maxmemory-policy is {policy!r}{' on ' + where if where else ''}: at the memory limit Redis may evict "
        "queue keys, silently dropping jobs; set it to 'noeviction'"
    ]
