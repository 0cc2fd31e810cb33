"""A FastAPI service that enqueues jobs with the async driver, and the worker that runs
them. Run it (``pip install fastapi uvicorn``)::

    PYQUEUE_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_app:app
    PYQUEUE_URL=redis://127.0.0.1:6379/0 pyqueue worker examples.fastapi_app:send_email -q emails

``POST /emails`` answers 202 as soon as the job is in Redis (one script call, shared
with the other requests enqueueing at the same moment). The client's
``Idempotency-Key`` header becomes the job id, so a request the client sends again
(after a timeout, say) enqueues nothing twice: the second answer says ``added: false``.
``send_email`` is an ``async def`` handler, so ``pyqueue worker`` runs it on the
AsyncWorker.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Header, Request
from pydantic import BaseModel, Field

from pyqueue import Job
from pyqueue.aio import AsyncQueue


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One queue object (and client) for the whole process, closed at shutdown.
    async with AsyncQueue.from_url(os.environ.get("PYQUEUE_URL", "embedded"), "emails") as queue:
        app.state.queue = queue
        yield


app = FastAPI(lifespan=lifespan)


class Email(BaseModel):
    to: str = Field(min_length=3, max_length=320)
    subject: str = Field(max_length=200)
    body: str = ""


@app.post("/emails", status_code=202)
async def enqueue_email(
    email: Email, request: Request, idempotency_key: str | None = Header(default=None, max_length=200)
) -> dict[str, object]:
    queue: AsyncQueue = request.app.state.queue
    enqueued = await queue.enqueue_json(email.model_dump(), job_id=idempotency_key)
    return {"job_id": enqueued.job_id, "added": enqueued.added}


async def send_email(job: Job) -> None:
    """The worker's handler: at least once, so a real one passes ``job.id`` to the mail
    provider as its own idempotency key."""
    email = job.json()
    print(f"sending {email['subject']!r} to {email['to']} (job {job.id}, attempt {job.attempt})")
