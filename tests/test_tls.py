"""TLS (issue #19): ``rediss://`` URLs with ``ssl_ca_certs``, client certificates
(mutual TLS), and certificates that do not verify, on a real redis-server with a TLS
port (conftest's ``redis_tls``: certificates made by ``openssl`` for the session, the
server at ``tls-auth-clients optional``; the mutual-TLS tests switch it to ``yes``).

What the tests hold pyqueue to: the verbs, a Worker (its blocking waits included) and
the async driver work over TLS; a server certificate that does not verify raises
:class:`pyqueue.TLSError` -- not OutcomeUnknown, which a worker would retry forever --
from a call, from ``Worker.run`` and from the CLI; a client certificate the server
refuses writes nothing; a TLS option that names a missing file, or one on a URL without
TLS, is refused when the URL is read.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from conftest import RedisTLSServer
from redis.connection import SSLConnection

from pyqueue import InvalidArgument, Job, NewJob, Outcome, OutcomeUnknown, Queue, TLSError, connect
from pyqueue.aio import AsyncQueue
from pyqueue.cli import main
from pyqueue.worker import EXIT_OK, Worker


@pytest.fixture
def tls(redis_tls: RedisTLSServer) -> RedisTLSServer:
    redis_tls.admin().flushall()
    return redis_tls


def drain(url: str, count: int) -> list[str]:
    """Run a Worker on ``url`` until it handled ``count`` jobs, the last ``count // 2``
    of them enqueued while it blocks (its blocking twin waits over TLS too)."""
    client = connect(url)
    seen: list[str] = []
    done = threading.Event()

    def handler(job: Job) -> None:
        seen.append(job.id)
        if len(seen) == count:
            done.set()

    q = Queue("q", client)
    q.enqueue_many([NewJob(b"x", job_id=f"a{i}") for i in range(count - count // 2)])
    worker = Worker(["q"], handler, redis=client, block_ms=5_000)
    exit_code: dict[str, int] = {}
    thread = threading.Thread(target=lambda: exit_code.setdefault("code", worker.run(install_signal_handlers=False)))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(seen) < count - count // 2:
            assert time.monotonic() < deadline, "the worker did not drain the preloaded jobs"
            time.sleep(0.01)
        time.sleep(0.2)  # the worker blocks on its wake key now
        q.enqueue_many([NewJob(b"x", job_id=f"b{i}") for i in range(count // 2)])
        assert done.wait(10), f"the worker handled {len(seen)} of {count}"
    finally:
        worker.stop("test finished")
        thread.join(15)
    assert not thread.is_alive() and exit_code.get("code") == EXIT_OK
    assert q.stats().acked == count
    client.close()
    return seen


def test_enqueue_lease_and_ack_over_tls(tls: RedisTLSServer) -> None:
    client = connect(tls.url())
    assert issubclass(client.connection_pool.connection_class, SSLConnection)
    q = Queue("q", client)
    assert q.enqueue(b"over tls", job_id="j1").added
    (job,) = q.lease(lease_ms=10_000)
    assert job.payload == b"over tls"
    assert q.ack(job) is Outcome.OK
    assert q.stats().acked == 1
    assert Queue("q", tls.admin()).get("j1").state == "done"  # as the server itself says
    client.close()


def test_a_worker_serves_over_tls_and_its_blocking_wait_is_woken_over_tls(tls: RedisTLSServer) -> None:
    assert sorted(drain(tls.url(), 20)) == sorted([f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)])


def test_the_async_driver_over_tls(tls: RedisTLSServer) -> None:
    async def main_() -> int:
        async with AsyncQueue.from_url(tls.url(), "aq") as q:
            assert (await q.enqueue(b"x", job_id="a1")).added
            return (await q.stats()).ready

    assert asyncio.run(main_()) == 1


def test_mutual_tls_a_client_certificate_the_ca_signed_is_let_in_others_write_nothing(tls: RedisTLSServer) -> None:
    certs = tls.certs
    with tls.require_client_certificates():
        mine = tls.url(ssl_certfile=certs.client, ssl_keyfile=certs.client_key)
        assert Queue("other", connect(mine)).enqueue(b"", job_id="ok").added
        assert len(drain(mine, 4)) == 4
        # No client certificate, or one of a CA the server does not trust: refused in the
        # handshake, so nothing runs. A refused certificate is a TLSError when the
        # server's alert is read first; under TLS 1.3 the client may instead find the
        # connection closed as it sends its first command (OutcomeUnknown, "EOF").
        for url in (tls.url(), tls.url(ssl_certfile=certs.other_client, ssl_keyfile=certs.other_client_key)):
            with pytest.raises((TLSError, OutcomeUnknown)) as raised:
                Queue("q", connect(url, retries=0)).enqueue(b"", job_id="refused")
            assert "SSL" in str(raised.value) or "EOF" in str(raised.value) or "TLS" in str(raised.value)
    assert Queue("q", tls.admin()).get("refused").state == "unknown"
    assert Queue("other", tls.admin()).get("ok").state == "ready"


@pytest.mark.parametrize("why", ["no ssl_ca_certs", "another CA"])
def test_a_server_certificate_that_does_not_verify_is_a_tls_error_everywhere(
    tls: RedisTLSServer, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = tls.url(ssl_ca_certs="") if why == "no ssl_ca_certs" else tls.url(ssl_ca_certs=tls.certs.other_ca)
    # A call: TLSError (a PyQueueError), never OutcomeUnknown -- nothing ran, and
    # sending it again would fail the same way.
    with pytest.raises(TLSError, match="certificate") as raised:
        Queue("q", connect(url)).enqueue(b"", job_id="j")
    assert not isinstance(raised.value, OutcomeUnknown)
    assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value)
    # A worker stops at once instead of retrying its registration forever.
    started = time.monotonic()
    with pytest.raises(TLSError):
        Worker(["q"], lambda job: None, redis=connect(url)).run(burst=True, install_signal_handlers=False)
    assert time.monotonic() - started < 10
    # The CLI: one line, exit 2.
    assert main(["--url", url, "enqueue", "q", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyqueue: TLSError:") and "Traceback" not in err
    # The async driver too.

    async def from_asyncio() -> None:
        async with AsyncQueue.from_url(url, "aq") as q:
            await q.enqueue(b"", job_id="j")

    with pytest.raises(TLSError):
        asyncio.run(from_asyncio())
    assert tls.admin().dbsize() == 0
    # Verification off (ssl_cert_reqs=none: encrypted, anyone's certificate accepted).
    assert Queue("q", connect(tls.url(ssl_ca_certs="", ssl_cert_reqs="none"))).enqueue(b"", job_id="j").added


@pytest.mark.parametrize("url, says", [
    ("rediss://127.0.0.1:1/0?ssl_ca_certs=/nonexistent/ca.pem", "ssl_ca_certs='/nonexistent/ca.pem': no such file"),
    ("rediss://127.0.0.1:1/0?ssl_certfile=/nonexistent/c.crt&ssl_keyfile=/nonexistent/c.key", "no such file"),
    ("redis://127.0.0.1:1/0?ssl_ca_certs=/etc/hostname", "does not use TLS: write rediss://"),
    ("redis+cluster://127.0.0.1:1?ssl_cert_reqs=none", "does not use TLS: write rediss+cluster://"),
])
def test_tls_options_are_checked_when_the_url_is_read(url: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says.replace("+", r"\+").replace("?", r"\?")):
        connect(url)


def test_the_url_names_the_host_the_certificate_names(tls: RedisTLSServer) -> None:
    # The server certificate names localhost and 127.0.0.1: both verify.
    client: Any = connect(tls.url(host="localhost"))
    assert Queue("q", client).enqueue(b"", job_id="by-name").added
    client.close()
