"""The one error hierarchy of pyqueue, and the one place that maps Redis errors into it.

::

    PyQueueError                     base of everything pyqueue raises
    ├── InvalidArgument (ValueError) bad input, rejected before anything is written (PQ_BADARG)
    │   ├── ContractMismatch         a call with another number of KEYS or ARGV than the
    │   │                            script's contract version lists (PQ_CONTRACT)
    │   └── PayloadTooLarge          a payload over ``max_payload_bytes``, refused before
    │                                anything is sent
    ├── QueueFull                    an enqueue past the queue's byte budget, refused with
    │                                nothing written (PQ_FULL)
    ├── WrongTypeError               a queue key holds another Redis type (WRONGTYPE)
    ├── CorruptRecord                a job record does not parse (PQ_CORRUPT)
    ├── ServiceError                 service lifecycle (registration, renewal)
    │   ├── ServiceExists            a new service id's key already exists (PQ_EXISTS)
    │   └── ServiceLost              the service key is gone or was changed (the
    │                                service_renew answer 'lost')
    ├── OutOfMemory                  Redis refused a write at its memory limit (OOM)
    ├── TLSError                     a certificate did not verify: the server's (against
    │                                ssl_ca_certs), or the client's (the server refused it)
    ├── AuthenticationFailed         Redis refused the credentials (no command ran)
    ├── LeaseLost                    a running job's durable step was refused: its lease
    │                                has ended (nothing written; the run no longer counts)
    ├── SignalTimeout                a task's wait for a signal timed out
    ├── ScriptError                  any other error reply from a script
    │   └── PermissionDenied         the ACL user may not use a key or a command (NOPERM)
    └── OutcomeUnknown               the connection failed during a call: the script may
        │                            or may not have run (every script is replay-safe,
        │                            so sending the same call again is safe); also a
        │                            cluster that stayed in motion (TRYAGAIN,
        │                            CLUSTERDOWN) past the driver's retry budget
        ├── NotReplicated            the call ran on the primary, but fewer replicas than
        │                            ``wait_replicas`` confirmed it in time
        └── ScriptNotLoaded          the server answered NOSCRIPT after each of the
                                     driver's reloads of the script (NOSCRIPT_RELOADS):
                                     the script never ran, nothing was written

Scripts report errors as ``redis.error_reply("PQ_CODE detail")``; :data:`CODES` is the
table of those codes, and :func:`map_redis_error` turns a redis-py exception into the
matching class above.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions

T = TypeVar("T")


class PyQueueError(Exception):
    """Base class of every error pyqueue raises."""


class InvalidArgument(PyQueueError, ValueError):
    """An argument is malformed or out of range. Nothing was written."""


class LeaseLost(PyQueueError):
    """A running job's lease has ended without it (cancelled, expired and reclaimed,
    scrubbed): a fenced write of its run (a durable step) was refused, and nothing was
    written. Raised to stop the run: what it does from here on no longer counts, and
    its worker neither acks nor nacks it (another worker may run the job)."""


class SignalTimeout(PyQueueError):
    """``current_job().wait_signal(name, timeout)``: no signal ``name`` came within the
    timeout. Kept as the wait's outcome: every later run of the job gets it again at
    that wait. Catch it to go on without the signal."""


class ContractMismatch(InvalidArgument):
    """A script was called with another number of KEYS or ARGV than its contract lists
    (PQ_CONTRACT, lua/README.md section 10): the caller was written for another contract
    version of the scripts. A refusal: the script checks the counts first, so nothing
    was read or written, and sending the same call again gets the same answer."""


class PayloadTooLarge(InvalidArgument):
    """A payload over the queue object's ``max_payload_bytes`` (64 MiB by default), or
    one ``enqueue_many`` call's payloads over 256 MiB together. Refused before anything
    is sent: nothing was written."""


class QueueFull(PyQueueError):
    """An enqueue that would take the queue's payload bytes past its budget
    (``Queue.set_budget``): the script refused the whole call before writing anything,
    so nothing was added. A definite answer, never ``OutcomeUnknown``: retry once the
    queue has drained, or raise the budget."""


class WrongTypeError(PyQueueError):
    """A key of the queue holds another Redis type (planted by another program).

    Scripts check types before their first write, so nothing was written.
    """


class CorruptRecord(PyQueueError):
    """A job record or receipt in Redis does not parse. Nothing was written."""


class ServiceError(PyQueueError):
    """A service lifecycle call failed."""


class ServiceExists(ServiceError):
    """Registration found the new service id's key already present (misconfiguration)."""


class ServiceLost(ServiceError):
    """The service key expired, was deleted (remote shutdown) or was changed by another
    process. The service must stop leasing and exit."""


class OutOfMemory(PyQueueError):
    """Redis is at its ``maxmemory`` limit and refused the write. Nothing was written."""


class TLSError(PyQueueError):
    """The TLS handshake with Redis failed on a certificate: the server's did not verify
    (not signed by a CA in ``ssl_ca_certs``, or not naming the host), or the server
    refused the client's (``ssl_certfile``: a CA it does not trust). No command ran, and
    sending one again fails the same way until the certificates or the URL's ``ssl_*``
    options are fixed, so this is not an :class:`OutcomeUnknown` (README, "Deploying")."""


class AuthenticationFailed(PyQueueError):
    """Redis refused the connection's credentials: a wrong password, an unknown or
    disabled ACL user, or none given to a server that requires one. No command ran, and
    sending it again fails the same way until the URL's credentials are fixed, so this is
    not an :class:`OutcomeUnknown`. A worker starting up waits out a few seconds of it (a
    password being rotated), then exits 2."""


class ScriptError(PyQueueError):
    """An error reply from Redis that none of the other classes describes."""


class PermissionDenied(ScriptError):
    """The Redis ACL user may not touch one of the call's keys, or run a command the
    script calls (``ACL LOG`` names which). See README's least-privilege recipe."""


class OutcomeUnknown(PyQueueError):
    """The connection failed while a call was in flight, after the driver's retries.

    The script may have run or not. Every pyqueue script is replay-safe: sending the same
    call again (same arguments, so the same job ids and call token) has the effect of one
    call.
    """


_CLUSTER_IN_MOTION = (
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.ClusterError,
)

class NotReplicated(OutcomeUnknown):
    """The call ran on the primary, but ``WAIT`` counted fewer replicas than the
    ``wait_replicas`` asked for within its timeout: a failover now could lose it. Treat
    it as a lost reply: send the same call again (replay-safe; its ``WAIT`` then covers
    the first run too), or accept the risk. ``replicas`` is how many confirmed;
    ``reply`` is the script's reply on the primary (None if unknown). A queue object
    remembers the jobs such an ack completed, so that the ack sent again answers OK for
    them, not GONE (see :mod:`pyqueue.protocol.unconfirmed`)."""

    def __init__(self, message: str, replicas: int, reply: object = None) -> None:
        super().__init__(message)
        self.replicas = replicas
        self.reply = reply


class ScriptNotLoaded(OutcomeUnknown):
    """The server answered ``NOSCRIPT`` to a script call again and again: the driver
    loaded the script (``SCRIPT LOAD`` of its exact source) and sent the call again
    :data:`pyqueue.drivers.scripts.NOSCRIPT_RELOADS` times, and every time the script was gone
    again. Something empties the server's script cache between the load and the call
    (``SCRIPT FLUSH`` in a loop, a storm of failovers or restarts), or the load and the
    call reach different servers (a proxy that routes them apart). ``script`` names the
    script (``lua/<script>.lua``), ``reloads`` counts the loads.

    NOSCRIPT means the script did not run: unlike its base class, nothing was written.
    It is an :class:`OutcomeUnknown` so that whatever sends a lost call again sends this
    one again too: the same call later has the effect of one call (a worker waits it
    out with backoff, as a lost connection, and logs each retry)."""

    def __init__(self, message: str, script: str = "", reloads: int = 0) -> None:
        super().__init__(message)
        self.script = script
        self.reloads = reloads


#: Error codes a script may return, the class each maps to, and what it means.
CODES: dict[str, tuple[type[PyQueueError], str]] = {
    "PQ_BADARG": (InvalidArgument, "an argument is malformed or out of range"),
    "PQ_CONTRACT": (ContractMismatch, "the call's number of KEYS or ARGV is not the one the script's contract lists"),
    "PQ_CORRUPT": (CorruptRecord, "a stored record or receipt does not parse"),
    "PQ_EXISTS": (ServiceExists, "the key of a newly allocated service id already exists"),
    "PQ_FULL": (QueueFull, "the call would take the queue past its byte budget: nothing written"),
    "WRONGTYPE": (WrongTypeError, "a key holds another Redis type"),
}


def map_redis_error(exc: Exception) -> PyQueueError:
    """Return the pyqueue error for a redis-py exception raised by a script call (a
    pyqueue error, such as NotReplicated, is returned as it is).

    The caller raises it ``from exc`` so the original stays attached.
    """
    if isinstance(exc, PyQueueError):
        return exc
    certificate = tls_certificate_failure(exc)
    if certificate is not None:
        return TLSError(f"TLS: a certificate did not verify ({certificate}): check the URL's ssl_* options: {exc}")
    if is_authentication_failure(exc):
        return AuthenticationFailed(f"Redis refused the credentials (check the URL's user and password): {exc}")
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return OutcomeUnknown(f"connection failed during the call, outcome unknown: {exc}")
    if isinstance(exc, _CLUSTER_IN_MOTION):
        # The call did not run (TRYAGAIN, CLUSTERDOWN) or may have (a redirect loop):
        # either way the caller's move is the same as for a lost connection.
        return OutcomeUnknown(f"the cluster did not take the call in time (slots moving or failing over): {exc}")
    message = str(exc)
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or message.startswith("OOM"):
        return OutOfMemory(message)
    if isinstance(exc, redis.exceptions.NoPermissionError) or "no permissions" in message or (
        "can't run this command" in message
    ):
        return PermissionDenied(message)
    code = message.split(" ", 1)[0]
    if code in CODES:
        return CODES[code][0](message)
    return ScriptError(message)


#: Replies of a server refusing credentials (redis-py raises some as connection errors).
_AUTH_REPLIES = ("WRONGPASS", "NOAUTH", "invalid username-password pair", "invalid password",
                 "HELLO must be called with the client already authenticated", "Client sent AUTH, but no password is set")


def is_authentication_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing the connection's credentials (the call never ran)."""
    if isinstance(exc, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
                        redis.exceptions.AuthenticationWrongNumberOfArgsError)):
        return True
    return isinstance(exc, redis.exceptions.RedisError) and any(reply in str(exc) for reply in _AUTH_REPLIES)


def tls_certificate_failure(exc: BaseException) -> str | None:
    """What failed, if the connection error ``exc`` (redis-py keeps the ``ssl`` error as
    its cause) is a certificate that did not verify: ``CERTIFICATE_VERIFY_FAILED`` here,
    or the server's TLS alert refusing the client's certificate (``UNKNOWN_CA``,
    ``BAD_CERTIFICATE``, ``CERTIFICATE_REQUIRED``...); else None. A server that just
    closes the connection (as redis-server does to a client without a certificate when
    ``tls-auth-clients yes``) is indistinguishable from a lost connection: not this."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain is short; never loop on a cycle
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return str(seen.verify_message or seen.reason or seen)
        if isinstance(seen, ssl.SSLError) and "ALERT" in str(seen.reason) and any(
            word in str(seen.reason) for word in ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED")
        ):
            return f"the server refused the client certificate: {seen.reason}"
        seen = seen.__cause__ or seen.__context__
    return None


def mapped(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, with redis-py errors raised as pyqueue errors (``from`` the original)."""
    try:
        return fn(*args)
    except PyQueueError:
        raise
    except redis.exceptions.RedisError as exc:
        raise map_redis_error(exc) from exc
