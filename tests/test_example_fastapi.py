"""examples/fastapi_app.py runs: requests through httpx's ASGI transport (with the
app's lifespan) enqueue jobs, a repeated Idempotency-Key adds nothing, bad input is
refused, and the AsyncWorker runs the handler on what was enqueued."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from conftest import RedisServer

from pyqueue import Queue
from pyqueue.worker.aio import AsyncWorker
from pyqueue.drivers.clients import embedded_redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples import fastapi_app  # noqa: E402


@pytest.fixture(params=["fake", "real"])
def server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    """The app's server: the embedded fakeredis, or a real redis-server (PYQUEUE_URL)."""
    if request.param == "fake":
        client = embedded_redis()
        monkeypatch.delenv("PYQUEUE_URL", raising=False)
    else:
        real: RedisServer = request.getfixturevalue("redis_server")
        client = real.client()
        monkeypatch.setenv("PYQUEUE_URL", real.url())
    client.flushall()
    yield client


async def post_emails() -> list[httpx.Response]:
    app = fastapi_app.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            email = {"to": "ada@example.org", "subject": "welcome"}
            return [
                await http.post("/emails", json=email, headers={"Idempotency-Key": "welcome:ada"}),
                await http.post("/emails", json=email, headers={"Idempotency-Key": "welcome:ada"}),
                await http.post("/emails", json={"to": "x"}),
                *await asyncio.gather(*(http.post("/emails", json={**email, "subject": f"s{i}"}) for i in range(20))),
            ]


def test_the_fastapi_example_enqueues_once_per_key_and_its_worker_runs_the_jobs(
    server: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    first, again, bad, *burst = asyncio.run(post_emails())
    assert first.status_code == 202 and first.json() == {"job_id": "welcome:ada", "added": True}
    assert again.status_code == 202 and again.json() == {"job_id": "welcome:ada", "added": False}
    assert bad.status_code == 422
    assert all(r.status_code == 202 and r.json()["added"] for r in burst)
    q = Queue("emails", server)
    assert q.stats().ready == 21

    worker = AsyncWorker(["emails"], fastapi_app.send_email, redis=server, concurrency=8, block_ms=100)
    assert asyncio.run(worker.run(burst=True)) == 0
    assert q.stats().acked == 21
    assert "sending 'welcome' to ada@example.org (job welcome:ada, attempt 1)" in capsys.readouterr().out
