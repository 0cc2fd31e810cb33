"""The ``real`` backend runs the server it was asked for: redis-server, or with
``PYQUEUE_REAL_SERVER=valkey`` valkey-server (tests/run.sh runs the verbs' real-server
tests a second time that way; conftest.real_server_binary finds the binary). Without
this check a Valkey pass could silently test redis-server twice."""

from __future__ import annotations

from conftest import REAL_SERVER, RedisServer


def test_the_real_backend_runs_the_server_asked_for(redis_server: RedisServer) -> None:
    info = redis_server.client(decode_responses=True).info("server")
    if REAL_SERVER == "valkey":
        assert "valkey_version" in info or info.get("server_name") == "valkey", info
    else:
        assert "valkey_version" not in info and info.get("server_name", "redis") == "redis", info
    # ZMSCORE needs 6.2 (Valkey reports the Redis version it is compatible with).
    assert tuple(int(part) for part in info["redis_version"].split(".")[:2]) >= (6, 2), info
