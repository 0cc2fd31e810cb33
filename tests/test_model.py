"""The model-based test (DESIGN §8): a Hypothesis state machine drives every transition
of the lifecycle through the driver, on both backends, and after every step the whole
keyspace must equal a plain-Python model and every invariant of DESIGN §3 must hold.

The machine and the model live in ``tests/model.py``. Size: 200 examples x 50 steps per
backend (CI); ``PYQUEUE_DEEP=1`` runs 5000 x 100; ``PYQUEUE_MODEL_EXAMPLES`` and
``PYQUEUE_MODEL_STEPS`` set either figure.
"""

from __future__ import annotations

import os

import pytest
from model import FakeBackend, RealBackend, model_settings, model_size, run_machine

from conftest import RedisServer

EXAMPLES, STEPS = model_size()
#: Generous: CI size takes well under a minute per backend; a deep run takes far longer.
TIMEOUT_S = 600 if os.environ.get("PYQUEUE_DEEP", "") != "1" else 6 * 3600


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_the_scripts_behave_like_the_model_on_every_step_on_fakeredis() -> None:
    run_machine(FakeBackend(), model_settings(EXAMPLES, STEPS))


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_the_scripts_behave_like_the_model_on_every_step_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    try:
        run_machine(RealBackend(client), model_settings(EXAMPLES, STEPS))
    finally:
        client.close()
