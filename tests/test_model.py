"""The model-based test (DESIGN §8): a Hypothesis state machine drives every transition
of the lifecycle through the driver, on both backends, and after every step the whole
keyspace must equal a plain-Python model and every invariant of DESIGN §3 must hold.

The machine and the model live in ``tests/model.py``. Size: 200 examples x 50 steps per
backend (CI); ``PYQUEUE_DEEP=1`` runs 5000 x 100; ``PYQUEUE_MODEL_EXAMPLES`` and
``PYQUEUE_MODEL_STEPS`` set either figure; ``PYQUEUE_MODEL_REPORT=<dir>`` writes what
ran (examples, checks, seconds) to ``<dir>/model-<backend>.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from model import FakeBackend, LifecycleMachine, RealBackend, model_settings, model_size, run_machine

from conftest import RedisServer

#: Garbage that earlier tests left is collected before each (long) model run.
pytestmark = pytest.mark.usefixtures("collected_garbage")

EXAMPLES, STEPS = model_size()
#: The fair machine (groups, priorities, caps) runs every rule of the plain one and its
#: own: half the examples in CI keeps the suite's time; PYQUEUE_DEEP runs it in full.
FAIR_EXAMPLES = EXAMPLES if os.environ.get("PYQUEUE_DEEP", "") == "1" else max(1, EXAMPLES // 2)
#: Generous: CI size takes well under a minute per backend; a deep run takes far longer.
TIMEOUT_S = 600 if os.environ.get("PYQUEUE_DEEP", "") != "1" else 6 * 3600


def report(backend: str, machine: type[LifecycleMachine], started: float) -> None:
    """Say what ran (pytest -s shows it); with PYQUEUE_MODEL_REPORT=<dir>, also write it
    to <dir>/model-<backend>.json, for the record of a deep run."""
    figures = {
        "backend": backend,
        "max_examples": EXAMPLES,
        "steps_per_example": STEPS,
        "examples_run": machine.examples_run,
        "checks_run": machine.checks_run,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"\nmodel test: {figures}")
    directory = os.environ.get("PYQUEUE_MODEL_REPORT")
    if directory:
        (Path(directory) / f"model-{backend}.json").write_text(json.dumps(figures) + "\n")


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_the_scripts_behave_like_the_model_on_every_step_on_fakeredis() -> None:
    started = time.monotonic()
    report("fakeredis", run_machine(FakeBackend(), model_settings(EXAMPLES, STEPS)), started)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_the_scripts_behave_like_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    started = time.monotonic()
    try:
        report("redis-server", run_machine(RealBackend(client), model_settings(EXAMPLES, STEPS)), started)
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_fair_scheduling_behaves_like_the_model_on_every_step_on_fakeredis() -> None:
    started = time.monotonic()
    report("fakeredis-fair", run_machine(FakeBackend(), model_settings(FAIR_EXAMPLES, STEPS), fair=True), started)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_fair_scheduling_behaves_like_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    started = time.monotonic()
    try:
        report("redis-server-fair", run_machine(RealBackend(client), model_settings(FAIR_EXAMPLES, STEPS), fair=True),
               started)
    finally:
        client.close()


#: The flows machine (jobs that wait for others) runs every rule of the plain one and
#: its own: a quarter of the examples in CI; PYQUEUE_DEEP runs it in full.
FLOW_EXAMPLES = EXAMPLES if os.environ.get("PYQUEUE_DEEP", "") == "1" else max(1, EXAMPLES // 4)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_flows_behave_like_the_model_on_every_step_on_fakeredis() -> None:
    started = time.monotonic()
    report("fakeredis-flows", run_machine(FakeBackend(), model_settings(FLOW_EXAMPLES, STEPS), flows=True), started)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_flows_behave_like_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    started = time.monotonic()
    try:
        report("redis-server-flows", run_machine(RealBackend(client), model_settings(FLOW_EXAMPLES, STEPS), flows=True),
               started)
    finally:
        client.close()


#: The progress machine (values on running jobs) runs every rule of the plain one and its
#: own: a quarter of the examples in CI; PYQUEUE_DEEP runs it in full.
PROGRESS_EXAMPLES = FLOW_EXAMPLES


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_progress_behaves_like_the_model_on_every_step_on_fakeredis() -> None:
    started = time.monotonic()
    report("fakeredis-progress", run_machine(FakeBackend(), model_settings(PROGRESS_EXAMPLES, STEPS), progress=True),
           started)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_progress_behaves_like_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    started = time.monotonic()
    try:
        report("redis-server-progress",
               run_machine(RealBackend(client), model_settings(PROGRESS_EXAMPLES, STEPS), progress=True), started)
    finally:
        client.close()


#: The steps machine (durable steps, sleeps, waits and signals): as the progress one.
STEPS_EXAMPLES = FLOW_EXAMPLES


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_durable_steps_behave_like_the_model_on_every_step_on_fakeredis() -> None:
    started = time.monotonic()
    report("fakeredis-steps", run_machine(FakeBackend(), model_settings(STEPS_EXAMPLES, STEPS), steps=True), started)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_durable_steps_behave_like_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    started = time.monotonic()
    try:
        report("redis-server-steps",
               run_machine(RealBackend(client), model_settings(STEPS_EXAMPLES, STEPS), steps=True), started)
    finally:
        client.close()


#: The browse machine (the fair one, with browse of every state checked against the
#: model): a quarter of the examples in CI; PYQUEUE_DEEP runs it in full.
BROWSE_EXAMPLES = FLOW_EXAMPLES


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_browse_answers_as_the_model_on_every_step_on_fakeredis() -> None:
    started = time.monotonic()
    report("fakeredis-browse", run_machine(FakeBackend(), model_settings(BROWSE_EXAMPLES, STEPS), browse=True),
           started)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_browse_answers_as_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    started = time.monotonic()
    try:
        report("redis-server-browse",
               run_machine(RealBackend(client), model_settings(BROWSE_EXAMPLES, STEPS), browse=True), started)
    finally:
        client.close()


#: The events machine (the plain one, with set_events changing the stream's bound and
#: opting out and in): a quarter of the examples in CI; PYQUEUE_DEEP runs it in full.
#: Every machine checks the event stream on every step; this one also its bound's changes.
EVENTS_EXAMPLES = FLOW_EXAMPLES


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_the_event_stream_is_as_the_model_on_every_step_on_fakeredis() -> None:
    started = time.monotonic()
    report("fakeredis-events", run_machine(FakeBackend(), model_settings(EVENTS_EXAMPLES, STEPS), events=True),
           started)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_the_event_stream_is_as_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    started = time.monotonic()
    try:
        report("redis-server-events",
               run_machine(RealBackend(client), model_settings(EVENTS_EXAMPLES, STEPS), events=True), started)
    finally:
        client.close()
