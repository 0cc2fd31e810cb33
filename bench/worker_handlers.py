"""Handlers for the worker processes bench_worker.py starts (``PYTHONPATH=bench``)."""

from __future__ import annotations

import os
import time

import redis

from pyqueue import Job

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["BENCH_URL"])
    return _client


def noop(job: Job) -> None:
    """Does nothing: the drain figures measure pyqueue alone."""


def parse_json(job: Job) -> None:
    """Parses the payload as JSON and does nothing else: the least a handler of
    structured payloads does (bench_tasks.py's context for task jobs)."""
    job.json()


def stamp(job: Job) -> None:
    """Records this host's wall clock at handler start (ns) for the latency figure."""
    started_ns = time.time_ns()
    _redis().rpush("bench:{stamps}", started_ns)


def server_stamp(job: Job) -> None:
    """Records the Redis server's clock at handler start (ms) with the job id."""
    seconds, micros = _redis().time()
    _redis().rpush("bench:{stamps}", f"{job.id} {seconds * 1000 + micros // 1000}")


def hold(job: Job) -> None:
    """Marks the job started, then holds it (the recovery figure kills this worker)."""
    _redis().rpush("bench:{started}", job.id)
    time.sleep(float(os.environ.get("BENCH_HOLD_S", "600")))


def hold_first(job: Job) -> None:
    """Its first attempt marks the job started (with this process's pid) and holds it;
    a later one stamps it (this host's wall clock, ns): the supervised recovery figure
    kills the holding child and times the jobs' next run in the other one."""
    if job.attempt == 1:
        _redis().rpush("bench:{started}", f"{job.id} {os.getpid()}")
        time.sleep(float(os.environ.get("BENCH_HOLD_S", "600")))
    else:
        _redis().rpush("bench:{stamps}", time.time_ns())


async def noop_async(job: Job) -> None:
    """Does nothing, as an ``async def`` handler: ``pyqueue worker`` runs it on the
    AsyncWorker (the async drain figures)."""


def noop_batch(jobs: list[Job]) -> list[None]:
    """Does nothing, as a batch handler (``pyqueue worker ... --batch N``): one result
    per job (bench_tasks.py's ``raw_batch`` drain)."""
    return [None] * len(jobs)
