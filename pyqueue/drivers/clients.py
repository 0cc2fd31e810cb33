"""Redis clients the way pyqueue needs them: one server (possibly found through Redis
Sentinel) or a Redis Cluster, undecoded, with explicit retries and timeouts, and a twin
for blocking waits.

Every other module takes a :data:`Client` (a ``redis.Redis`` or a
``redis.cluster.RedisCluster``) and asks this module what differs between the two:

* :func:`connect` builds either from a URL. ``redis+cluster://`` (or
  ``rediss+cluster://``) asks for a cluster explicitly; a plain ``redis://`` URL is
  probed with ``INFO cluster`` and becomes a cluster client when the server is in
  cluster mode (a user not allowed to run INFO gets a one-server client: use the
  explicit scheme then). ``redis+sentinel://`` (``rediss+sentinel://``) asks Sentinel
  where the master of a service is, and follows it across failovers (grammar below).
* :func:`bytes_client` and :func:`blocking_twin` make siblings with other connection
  settings (no reply decoding; a socket timeout that outlasts a blocking wait).
* :func:`primaries` lists one plain client per primary: for what must ask every node
  (SCAN-based discovery, configuration checks).
* :func:`default_client` is what ``Queue(name)`` talks through when given no client:
  the server named by ``PYQUEUE_URL``, else the embedded fakeredis (:func:`default_url`
  reads the variable; the async driver's ``pyqueue.aio.default_client`` does the same).

On a cluster every script call names keys of one hash tag, so redis-py routes it to the
slot's primary and follows MOVED and ASK itself; :mod:`pyqueue.drivers.scripts` retries the
transient answers of a cluster in motion (TRYAGAIN, CLUSTERDOWN, a node lost).

**URLs** (what :func:`connect`, ``Queue.from_url``, ``Tasks(url=)``, ``--url`` and
``PYQUEUE_URL`` take)::

    redis://[[user]:password@]host[:port][/db][?option=value&...]
    rediss://...                    the same over TLS
    unix://[[user]:password@]/path/to/redis.sock[?db=N&...]
    redis+cluster://[[user]:password@]host[:port][?...]     (rediss+cluster://: TLS)
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[?...]
    rediss+sentinel://...           TLS to the master, its replicas and the sentinels
    embedded                        the in-process fakeredis

The options are redis-py's (``redis.connection.parse_url``): ``db``,
``socket_timeout``, ``client_name``, ``protocol``, ... and, with ``rediss``, the TLS
ones: ``ssl_ca_certs`` (a PEM file of the CA that signed the server's certificate),
``ssl_certfile`` and ``ssl_keyfile`` (a client certificate and its key, for servers
started with ``tls-auth-clients yes``), ``ssl_cert_reqs`` (``required``, the default;
``optional``; ``none``: no verification at all), ``ssl_check_hostname``
(``true``/``false``; default true: the certificate must name the host), ``ssl_ca_path``,
``ssl_password``, ``ssl_min_version``, ``ssl_ciphers``. A certificate that does not
verify raises :class:`~pyqueue.protocol.errors.TLSError` (nothing was sent, retrying does not
help). An option in the URL wins over the keyword argument of :func:`connect` that sets
the same thing (``socket_timeout`` over ``socket_timeout_s``).

A **Sentinel URL** lists the sentinels (port 26379 when omitted; IPv6 in brackets) and
names the service (the ``sentinel monitor <service_name> ...`` of their
configuration). ``user:password@`` are the credentials of the master (and replicas),
as in a ``redis://`` URL; the sentinels are asked without AUTH unless the options
``sentinel_username=`` / ``sentinel_password=`` say otherwise (``requirepass`` or an
ACL user in the sentinels' configuration). ``db=N`` picks the master's database (the
path is the service name, not a database). The other options apply to the master's
connections, and the TLS ones to the sentinels' too. The client asks the sentinels for
the master's address at every new connection, and a connection that finds its server
demoted to a replica (``READONLY``) is dropped and re-made, so workers follow a
failover by themselves (calls in flight meanwhile raise
:class:`~pyqueue.protocol.errors.OutcomeUnknown`, which a worker retries).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Union
from urllib.parse import parse_qsl, unquote, urlsplit

import redis as redis_lib
import redis.asyncio
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection

from pyqueue.protocol.errors import InvalidArgument

log = logging.getLogger("pyqueue")

#: What pyqueue accepts wherever it takes a client.
Client = Union[redis_lib.Redis, RedisCluster]

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: Sentinel URL schemes (see the module docstring), and the transport each means.
SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
#: The port of a sentinel a Sentinel URL names without one.
SENTINEL_PORT = 26379

_embedded_lock = threading.Lock()
_embedded_server: Any = None  # a fakeredis.FakeServer, created on first use

#: The environment variable that names the server every entry point uses by default.
URL_VARIABLE = "PYQUEUE_URL"
#: The URL schemes :func:`connect` takes (besides ``embedded``).
URL_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)

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
        # A WARNING (on stderr too, when the application configured no logging): a
        # producer that forgot the variable sends to a server no worker can see.
        _announce(
            "embedded",
            f"no {URL_VARIABLE}: using the embedded in-process server (fakeredis), which no other process sees "
            f"(a worker elsewhere will not get these jobs); set {URL_VARIABLE}=redis://host:6379/0 to share queues "
            "between processes",
            logging.WARNING,
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


def _announce(key: str, message: str, level: int = logging.INFO) -> None:
    """Log ``message`` (at INFO by default) unless the choice ``key`` was announced before."""
    with _default_lock:
        if key in _default_announced:
            return
        _default_announced.add(key)
    log.log(level, message)


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (in the user part and in a
    ``password=``, ``sentinel_password=`` or ``ssl_password=`` query parameter): fit for
    a log line or an error message."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable (a bad IPv6 host): show nothing but the scheme
        return url.partition("://")[0] + "://..."
    if parts.password is not None:  # the netloc comes first after "<scheme>://"
        url = url.replace(parts.netloc, f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}", 1)
    return re.sub(r"([?&](?:sentinel_|ssl_)?password=)[^&#]*", r"\1***", url)


#: The URL each client :func:`connect` made was made from, passwords hidden
#: (:func:`client_url`).
_client_urls: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def client_url(client: Any) -> str:
    """The server (or cluster) ``client`` talks to, as a URL fit for a log line: the
    one :func:`connect` made it from with its passwords hidden (:func:`redact_url`), else
    one built from the client's settings, never with a password (``:***@`` where one is
    set); ``embedded`` for the in-process fakeredis."""
    try:
        known = _client_urls.get(client)
    except TypeError:  # not weakly referenceable: not one connect() made
        known = None
    if known is not None:
        return known
    manager = getattr(client, "nodes_manager", None)  # a cluster client, sync or asyncio
    if manager is not None:
        return "redis+cluster://" + ",".join(sorted(manager.startup_nodes))
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {})
    if "server" in kwargs or type(client).__module__.startswith("fakeredis"):
        return "embedded"
    user = kwargs.get("username") or ""
    userinfo = f"{user}:***@" if kwargs.get("password") else (f"{user}@" if user else "")
    db = kwargs.get("db") or 0
    service = getattr(pool, "service_name", None)  # a Sentinel pool: the service it follows
    if service is not None:
        return f"redis+sentinel://{userinfo}<sentinels>/{service}" + (f"?db={db}" if db else "")
    if kwargs.get("path"):
        return f"unix://{userinfo}{kwargs['path']}" + (f"?db={db}" if db else "")
    connection_class = getattr(pool, "connection_class", None)
    scheme = "rediss" if connection_class is not None and issubclass(connection_class, redis_lib.SSLConnection) else "redis"
    return f"{scheme}://{userinfo}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


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
            ``rediss+cluster://``, ``redis+sentinel://``, ``rediss+sentinel://``, or
            ``embedded`` (the in-process fakeredis); the grammar and the options are
            in the module docstring.
        retries: redis-py re-sends a command up to this many times after a connection
            error or timeout, with jittered exponential backoff (10 ms doubling, capped
            at 1 s). Re-sending is safe because every script is replay-safe. After the
            last retry the call raises :class:`~pyqueue.protocol.errors.OutcomeUnknown` (on a
            cluster, pyqueue keeps retrying for its weather budget first, see
            :mod:`pyqueue.drivers.scripts`). ``retries=0`` raises at once.
        socket_timeout_s: how long one reply may take; blocking waits use their own
            connection with a longer timeout (see :func:`blocking_twin`).
        cluster: ``True``/``False`` to say whether the server is a Redis Cluster;
            ``None`` (default) takes a ``+cluster`` scheme as yes and otherwise asks
            the server (``INFO cluster``). A Sentinel URL is never a cluster.

    Raises:
        InvalidArgument: ``url`` is not a URL pyqueue can connect to (an unknown scheme,
            a malformed host or port, an option redis-py cannot read).
    """
    if url in ("embedded", "fakeredis://"):
        return embedded_redis()
    given = url
    url, cluster, settings = client_settings(
        url,
        retries=retries,
        socket_timeout_s=socket_timeout_s,
        socket_connect_timeout_s=socket_connect_timeout_s,
        cluster=cluster,
    )
    try:
        client: Client
        if is_sentinel_url(url):
            client = sentinel_master(parse_sentinel_url(url), {**settings, **ONE_SERVER_SETTINGS})
        elif cluster:
            client = RedisCluster.from_url(url, **settings)
        else:
            client = redis_lib.Redis.from_url(url, **settings, **ONE_SERVER_SETTINGS)
    except InvalidArgument:
        raise
    except ValueError as exc:  # redis-py's word on a URL it cannot read
        raise unreadable_url(url, exc) from exc
    _client_urls[client] = redact_url(given)
    return client


def unreadable_url(url: str, exc: ValueError) -> InvalidArgument:
    """The error for a URL redis-py cannot read (its ValueError)."""
    return InvalidArgument(f"{redact_url(url)!r} is not a URL pyqueue can connect to: {exc}")


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
    if not sep or scheme not in URL_SCHEMES:
        raise InvalidArgument(
            f"{redact_url(url)!r} is not a URL pyqueue can connect to: it must start with "
            + ", ".join(f"{s}://" for s in URL_SCHEMES) + ", or be 'embedded'"
        )
    _check_tls_options(url)
    if scheme in CLUSTER_SCHEMES:
        url, cluster = f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}", True
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)  # a malformed URL fails here, before anything connects
        cluster = False
    settings: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_connect_timeout_s,
        "decode_responses": False,
        "retry": retry_class(ExponentialWithJitterBackoff(base=0.01, cap=1.0), retries),
    }
    if not url.startswith("unix:"):
        settings["socket_keepalive"] = True
    if url.startswith("unix:") or scheme in SENTINEL_SCHEMES:
        cluster = False
    elif cluster is None:
        probe = {k: v for k, v in settings.items() if k != "retry"}
        cluster = _server_is_cluster(url, probe)
    return url, bool(cluster), settings


#: The TLS options of a URL that name a file (or, ``ssl_ca_path``, a directory).
TLS_FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")


def _check_tls_options(url: str) -> None:
    """Refuse ``ssl_*`` options in a URL without TLS (``redis://``), and a TLS option
    that names a file that is not there: redis-py would fail on them only at the first
    connection, as a lost connection (``OutcomeUnknown``), far from the mistake."""
    scheme = url.partition("://")[0]
    query = urlsplit(url).query if "?" in url else ""
    options = parse_qsl(query)
    named = sorted({name for name, _ in options if name.startswith("ssl_")})
    if named and not scheme.startswith("rediss"):
        hint = f": write {scheme.replace('redis', 'rediss', 1)}://" if scheme.startswith("redis") else ""
        raise InvalidArgument(f"{redact_url(url)!r} sets {', '.join(named)} but {scheme}:// does not use TLS{hint}")
    for name, value in options:
        if name in TLS_FILE_OPTIONS and not os.path.exists(value):
            raise InvalidArgument(f"{redact_url(url)!r}: {name}={value!r}: no such file")


@dataclass(frozen=True)
class SentinelURL:
    """A ``redis+sentinel://`` URL taken apart (:func:`parse_sentinel_url`)."""

    #: The sentinels' (host, port), in the URL's order.
    sentinels: list[tuple[str, int]]
    #: The name the sentinels monitor the master under.
    service_name: str
    #: Connection options of the master and its replicas: the URL's credentials, ``db``,
    #: ``ssl`` and the other options (converted as redis-py converts a URL's options).
    master: dict[str, Any] = field(default_factory=dict)
    #: Connection options of the sentinels: ``sentinel_username``/``sentinel_password``
    #: (as ``username``/``password``) and the TLS options.
    sentinel: dict[str, Any] = field(default_factory=dict)


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` is a ``redis+sentinel://`` or ``rediss+sentinel://`` URL."""
    return url.partition("://")[0] in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """Take a Sentinel URL apart (the grammar is in the module docstring).

    Raises:
        InvalidArgument: not a Sentinel URL, no sentinel or no service named, a
            malformed host or port, an option value redis-py cannot read.
    """
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    scheme, sep, _ = url.partition("://")
    shown = redact_url(url)
    if not sep or scheme not in SENTINEL_SCHEMES:
        raise InvalidArgument(f"{shown!r} is not a Sentinel URL (redis+sentinel:// or rediss+sentinel://)")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidArgument(f"{shown!r} is not a Sentinel URL pyqueue can read: {exc}") from exc
    userinfo, at, hosts = parts.netloc.rpartition("@")
    service = unquote(parts.path[1:])
    if not service or "/" in service:
        raise InvalidArgument(
            f"{shown!r} names no service: write {scheme}://host:26379[,host:26379...]/<service_name> "
            "(the name in the sentinels' 'sentinel monitor'; a database is the option db=N)"
        )
    sentinels = [_sentinel_address(item, shown) for item in hosts.split(",")]
    master: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    if at:
        username, colon, password = userinfo.partition(":")
        if username:
            master["username"] = unquote(username)
        if colon and password:
            master["password"] = unquote(password)
    for name, value in parse_qsl(parts.query):
        if name in ("sentinel_username", "sentinel_password"):
            sentinel[name.removeprefix("sentinel_")] = value
            continue
        parser: Any = URL_QUERY_ARGUMENT_PARSERS.get(name)
        try:
            master[name] = parser(value) if parser else value
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{shown!r}: invalid value for {name!r}") from exc
        if name.startswith("ssl_"):
            sentinel[name] = master[name]
    if SENTINEL_SCHEMES[scheme] == "rediss":
        master["ssl"] = sentinel["ssl"] = True
    return SentinelURL(sentinels, service, master, sentinel)


def _sentinel_address(item: str, shown: str) -> tuple[str, int]:
    """``host[:port]`` or ``[ipv6][:port]`` of a Sentinel URL as (host, port)."""
    if item.startswith("["):
        host, bracket, port = item[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            host = ""
        port = port[1:]
    else:
        host, _, port = item.partition(":")
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise InvalidArgument(f"{shown!r}: {item!r} is not a sentinel's host[:port]")
    return unquote(host), int(port) if port else SENTINEL_PORT


class _DemotionAware:
    """How a Sentinel-managed connection of pyqueue's sees that its server was demoted.

    redis-py drops a master's connection when a write answers ``READONLY``; but a call
    that writes nothing there (a replayed renewal finding its own token) is answered,
    and only its ``WAIT`` says ``WAIT cannot be used with replica instances``. Without
    this the connection would stay on the demoted server, every call answered
    NotReplicated, until a write happened to go through it. Taken the same way: the
    connection is dropped and the call (replay-safe) is sent again, to the master the
    sentinels name now."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis_lib.ResponseError as exc:
            if str(exc).startswith("WAIT cannot be used with replica") and getattr(self, "connection_pool").is_master:
                getattr(self, "disconnect")()
                raise redis_lib.ConnectionError("the master is now a replica (WAIT refused)") from exc
            raise


class _SentinelConnection(_DemotionAware, SentinelManagedConnection):
    pass


class _SentinelSSLConnection(_DemotionAware, SentinelManagedSSLConnection):
    pass


#: How often a Sentinel client asks where the master is (besides at every new connection).
SENTINEL_CHECK_S = 1.0
#: ... and how long it waits after no sentinel answered.
SENTINEL_RECHECK_S = 5.0
#: The longest a sentinel may take to accept a connection or answer.
SENTINEL_TIMEOUT_S = 1.0


class _SentinelPool(SentinelConnectionPool):
    """redis-py's Sentinel pool, which asks the sentinels only for a new connection, so
    its pooled connections stay on a master that ``SENTINEL FAILOVER`` left behind until
    the sentinels demote it, about 10 s later (every write there is lost then). This one
    also asks at most once per :data:`SENTINEL_CHECK_S` when it hands out a connection:
    if the master moved, redis-py drops the idle connections at once and the others
    when they come back (``owns_connection``). A check no sentinel answered is tried
    again only after :data:`SENTINEL_RECHECK_S`: while the sentinels are away the
    master's clients keep working."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._next_check = 0.0

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if self.is_master and now >= self._next_check:
            self._next_check = now + SENTINEL_RECHECK_S
            try:
                self.get_master_address()  # type: ignore[no-untyped-call]
                self._next_check = now + SENTINEL_CHECK_S
            except (redis_lib.ConnectionError, redis_lib.TimeoutError) as exc:  # MasterNotFoundError too
                log.info("sentinels of %s not answering (%s): checking again in %.0f s",
                         self.service_name, exc, SENTINEL_RECHECK_S)
        return super().get_connection(*args, **kwargs)


class SentinelMaster(redis_lib.Redis):
    """The client :func:`connect` makes of a Sentinel URL: a ``redis.Redis`` of the
    master whose ``close()`` also closes its connections to the sentinels."""

    def close(self) -> None:
        super().close()
        for sentinel in getattr(self.connection_pool, "sentinel_manager").sentinels:
            sentinel.close()


class AsyncSentinelMaster(redis.asyncio.Redis):
    """:class:`SentinelMaster` of the async driver (``aclose()`` closes the sentinels'
    connections too: they belong to the event loop)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in getattr(self.connection_pool, "sentinel_manager").sentinels:
            await sentinel.aclose()


def sentinel_master(parsed: SentinelURL, settings: dict[str, Any], *, asyncio: bool = False) -> Any:
    """A client of the master of ``parsed``'s service (blocking, or with ``asyncio`` an
    asyncio one): redis-py's ``Sentinel`` over the sentinels, and its ``master_for``
    with ``settings`` (the URL's options win, as in ``from_url``).

    The sentinels are asked at most twice each, with socket timeouts of at most
    :data:`SENTINEL_TIMEOUT_S` (a sentinel that does not answer is skipped for the next
    one), with the URL's sentinel credentials and TLS options; the blocking client's
    pool also re-checks the master's address every second (``_SentinelPool``)."""
    retry = settings.get("retry")
    sentinel_kwargs: dict[str, Any] = {k: v for k, v in settings.items() if k.startswith("socket_")}
    for name in ("socket_timeout", "socket_connect_timeout"):
        sentinel_kwargs[name] = min(float(sentinel_kwargs.get(name) or SENTINEL_TIMEOUT_S), SENTINEL_TIMEOUT_S)
    if retry is not None:
        sentinel_kwargs["retry"] = type(retry)(ExponentialWithJitterBackoff(base=0.01, cap=0.1), 1)
    sentinel_kwargs.update(parsed.sentinel)
    kwargs = {**settings, **parsed.master}
    if asyncio:
        manager: Any = AsyncSentinel(parsed.sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        return manager.master_for(parsed.service_name, redis_class=AsyncSentinelMaster, **kwargs)
    manager = Sentinel(parsed.sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    kwargs["connection_class"] = _SentinelSSLConnection if kwargs.get("ssl") else _SentinelConnection
    return manager.master_for(parsed.service_name, redis_class=SentinelMaster, connection_pool_class=_SentinelPool, **kwargs)


def _server_is_cluster(url: str, settings: dict[str, Any]) -> bool:
    """Ask the server at ``url`` whether it runs in cluster mode (``INFO cluster``).
    A server that refuses (an ACL user without INFO) or cannot be reached now is taken
    as one server, so that connecting stays lazy: the first call reports the error."""
    try:
        probe = redis_lib.Redis.from_url(url, **settings)
    except ValueError as exc:  # a port not a number, say
        raise unreadable_url(url, exc) from exc
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
    return redis_lib.Redis(connection_pool=_pool_sibling(pool, decode_responses=False))


def _pool_sibling(pool: Any, **overrides: Any) -> Any:
    """A new connection pool to the same server as ``pool`` with some connection
    settings changed. A Sentinel-managed pool gets a sibling managed by the same
    sentinels for the same service, so it follows the master across failovers too."""
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(overrides)
    if isinstance(pool, SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # the pool's own proxy, which the new pool makes anew
        return type(pool)(
            pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class,
            is_master=pool.is_master, check_connection=pool.check_connection, **kwargs,
        )
    return pool.__class__(connection_class=pool.connection_class, **kwargs)


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
    return redis_lib.Redis(connection_pool=_pool_sibling(client.connection_pool, socket_timeout=socket_timeout_s, retry=once))


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


# The servers check_server has asked (server_identity), so that every entry point
# (a Queue, a worker, the CLI, the dashboard, the exporter) warns once per process.
_checked_lock = threading.Lock()
_checked_servers: set[str] = set()


def server_identity(client: Any) -> str | None:
    """Which server (or cluster) ``client`` talks to, as a string; None for the embedded
    fakeredis, which has no settings to check."""
    manager = getattr(client, "nodes_manager", None)  # a cluster client, sync or asyncio
    if manager is not None:
        return "cluster:" + ",".join(sorted(manager.startup_nodes))
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {})
    if "server" in kwargs or type(client).__module__.startswith("fakeredis"):
        return None
    service = getattr(pool, "service_name", None)  # a Sentinel pool: the service it follows
    if service is not None:
        return f"sentinel:{service}"
    return f"{kwargs.get('path') or kwargs.get('host')}:{kwargs.get('port')}"


def claim_server_check(client: Any) -> str | None:
    """The server identity of ``client`` if this process should check that server now
    (not the embedded one, not one already checked), else None (thread-safe; see
    :func:`check_server`)."""
    identity = server_identity(client)
    if identity is None:
        return None
    with _checked_lock:
        if identity in _checked_servers:
            return None
        _checked_servers.add(identity)
        return identity


def forget_server_checks() -> None:
    """Check every server again (tests)."""
    with _checked_lock:
        _checked_servers.clear()


def check_server(client: Client) -> list[str]:
    """Warn (log) about server settings that break pyqueue's promises; return them.
    Once per process and server: later calls for a server already asked return [] (and
    the embedded fakeredis is never asked).

    Any ``maxmemory-policy`` but ``noeviction`` lets Redis evict keys at its memory
    limit, silently dropping jobs. Every primary of a cluster is asked. A client not
    allowed to run CONFIG (a least-privilege ACL user) skips the check; one that cannot
    reach the server now leaves it for a later call.
    """
    identity = claim_server_check(client)
    if identity is None:
        return []
    problems: list[str] = []
    try:
        for node in primaries(client):
            kwargs = node.get_connection_kwargs()
            policy = node.config_get("maxmemory-policy").get("maxmemory-policy")
            problems += eviction_problems(policy, f"{kwargs.get('host')}:{kwargs.get('port')}" if is_cluster(client) else "")
    except (redis_lib.ConnectionError, redis_lib.TimeoutError) as exc:
        with _checked_lock:
            _checked_servers.discard(identity)
        log.debug("could not check maxmemory-policy yet (%s)", exc)
        return []
    except redis_lib.RedisError as exc:
        log.info("could not check maxmemory-policy (%s); it must be 'noeviction'", exc)
        return []
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
