"""The dashboard without a browser: its JSON against the driver's own answers, dead
letters and their actions, pause and resume, the job lookup, the jobs panel's pages by
state, a flow's tree and states, a
queue's groups and their caps, the search box and its bulk actions (CSRF, the confirmed
count, read-only mode), the token, CSRF and Host rules, the sampler's history, and ``pyqueue dashboard`` / ``pyqueue demo --dashboard``
as commands. (The page in a real
browser: tests/test_dashboard_browser.py.)"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import fakeredis
import pytest
from conftest import RedisServer, dump_all
from tasks_support import Serving

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from starlette.testclient import TestClient  # noqa: E402

from pyqueue import NewJob, Queue  # noqa: E402
from pyqueue.dashboard import app as app_module  # noqa: E402
from pyqueue.dashboard.app import DashboardConfig, create_app  # noqa: E402
from pyqueue.dashboard.history import Sampler  # noqa: E402
from pyqueue.dashboard.security import CSRF_COOKIE, DashboardRefused, check_bind  # noqa: E402
from pyqueue.ops.service import RunningJob, Services  # noqa: E402
from pyqueue.tasks import TaskDead, Tasks, chord  # noqa: E402
from helpers import queue_parts
from pyqueue.ops.find import JobFilter, matching  # noqa: E402


#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True
TOKEN = "correct-horse-battery-staple"
BASE = "http://127.0.0.1:8080"


def kill(q: Queue, ids: list[str], payload: bytes = b'{"email": "ada@example.com"}') -> None:
    """Make ``ids`` dead letters of ``q``: one attempt each, nacked with an error."""
    q.enqueue_many([NewJob(payload, job_id=i, max_attempts=1) for i in ids])
    left = set(ids)
    while left:
        for job in q.lease(count=len(left)):
            q.nack(job, f"ValueError: no such mailbox for {job.id}")
            left.discard(job.id)


def busy(r: Any) -> tuple[Queue, Queue]:
    """A plain queue in every state, and a partitioned one with dead letters."""
    q = Queue("emails", r)
    kill(q, ["d1", "d2", "d3"])  # first: kill() nacks whatever it leases
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(5)])
    q.enqueue(b"", job_id="later", delay_ms=60_000)
    a, _b = q.lease(count=2)
    q.ack(a)
    p = Queue("orders", r, partitions=3)
    kill(p, ["o1", "o2", "o3", "o4"])
    p.enqueue_many([NewJob(b"") for _ in range(7)])
    return q, p


@pytest.fixture
def open_dashboard(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``open_dashboard(redis, **config)`` -> a TestClient of a dashboard that reads
    anew at every request; closed at the end of the test."""
    clients: list[TestClient] = []

    def make(redis: Any, **kwargs: Any) -> TestClient:
        config = DashboardConfig(redis, fresh_s=0, **kwargs)
        client = TestClient(create_app(config), base_url=BASE)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def csrf_of(client: TestClient, **kwargs: Any) -> str:
    """Load the page (which sets the CSRF cookie) and return the token of its <meta>."""
    page = client.get("/", **kwargs)
    assert page.status_code == 200, page.text
    token = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert token is not None
    assert client.cookies.get(CSRF_COOKIE) == token.group(1)
    return token.group(1)


def post(client: TestClient, queue: str, action: str, body: object, token: str | None, **kwargs: Any) -> Any:
    headers = {"content-type": "application/json", **({"x-csrf-token": token} if token else {}),
               **kwargs.pop("headers", {})}
    return client.post(f"/api/queues/{queue}/actions/{action}", content=json.dumps(body), headers=headers, **kwargs)


def fake() -> Any:
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


# -- what the page shows ------------------------------------------------------------------


def test_the_overview_numbers_are_the_driver_stats_with_a_partitioned_queue_once_summed(r: Any, open_dashboard: Any) -> None:
    q, p = busy(r)
    overview = open_dashboard(r).get("/api/overview").json()
    by_name = {row["name"]: row for row in overview["queues"]}
    assert sorted(by_name) == ["emails", "orders"]  # no orders#0..2 rows
    for queue in (q, p):
        stats = queue.stats()
        row = by_name[queue.name]
        assert row["partitions"] == queue.spec.partitions
        for field in ("ready", "scheduled", "leased", "dead", "done", "enqueued", "acked", "nacked", "dead_total",
                      "reclaimed", "scrubbed", "leased_total"):
            assert row[field] == getattr(stats, field), (queue.name, field)
        assert 0 <= row["lag_ms"] <= stats.lag_ms
        assert row["paused_ms"] == stats.paused_ms == 0
    assert by_name["orders"]["dead"] == 4 and by_name["emails"]["dead"] == 3
    assert overview["error"] == "" and overview["now_ms"] > 0


def test_the_page_inlines_the_same_figures_and_a_csrf_token_that_matches_its_cookie(open_dashboard: Any) -> None:
    r = fake()
    busy(r)
    client = open_dashboard(r, label="redis://db.example:6379/0")
    token = csrf_of(client)
    page = client.get("/").text
    initial = json.loads(re.search(r'<script type="application/json" id="initial">(.*?)</script>', page, re.S)
                         .group(1))  # type: ignore[union-attr]
    assert [row["name"] for row in initial["overview"]["queues"]] == ["emails", "orders"]
    assert initial["overview"]["queues"][0]["ready"] == Queue("emails", r).stats().ready
    assert initial["config"]["actions"] == ["cancel", "dead_purge", "dead_replay", "group_limit", "pause",
                                            "resume"]
    assert "redis://db.example:6379/0" in page and token in page
    # Every asset comes from the package, none from another host.
    assert not re.search(r'(src|href)="(https?:)?//', page)
    for asset in ("static/dashboard.js", "static/dashboard.css", "static/favicon.svg"):
        assert f'"{asset}"' in page and client.get("/" + asset).status_code == 200


def test_workers_are_listed_with_host_pid_queues_started_and_last_heartbeat(r: Any, open_dashboard: Any) -> None:
    services = Services(r)
    a = services.register(["emails", "orders"], host="box-1", pid=4242)
    services.register(["emails"], host="box-2", pid=7)
    services.stop(a.id)
    workers = open_dashboard(r).get("/api/overview").json()["workers"]
    by_id = {w["id"]: w for w in workers}
    listed = {i.id: i for i in services.list()}
    assert set(by_id) == set(listed)
    first = by_id[a.id]
    assert (first["host"], first["pid"], first["queues"], first["state"]) == ("box-1", 4242, ["emails", "orders"],
                                                                             "stopping")
    assert first["started_ms"] == listed[a.id].started_ms and first["renewed_ms"] == listed[a.id].renewed_ms
    assert {w["state"] for w in workers} == {"alive", "stopping"} and {w["namespace"] for w in workers} == {"workers"}


def test_workers_are_listed_with_the_task_names_they_advertise(r: Any, open_dashboard: Any) -> None:
    services = Services(r)
    a = services.register(["billing"], tasks=["billing.charge", "billing.refund"])
    b = services.register(["emails"])  # a worker of raw jobs, or of an older version: none
    by_id = {w["id"]: w for w in open_dashboard(r).get("/api/overview").json()["workers"]}
    assert by_id[a.id]["tasks"] == ["billing.charge", "billing.refund"]  # in the order registered
    assert by_id[b.id]["tasks"] == []


def task_jobs(q: Queue, task: str, count: int, **enqueue: Any) -> None:
    """``count`` jobs of the task ``task`` in ``q`` (task envelopes, as Tasks sends them)."""
    from pyqueue.tasks import envelope

    for i in range(count):
        q.enqueue(envelope.encode(task, [i], {}, {"enqueued_ms": 0}), **enqueue)


def unserved(client: TestClient) -> dict[str, list[tuple[str, int]]]:
    """Per queue, the task names with jobs waiting that no live worker serves."""
    rows = client.get("/api/overview").json()["queues"]
    return {row["name"]: [(t["task"], t["jobs"]) for t in row["unserved_tasks"]] for row in rows}


def test_a_queue_lists_the_task_names_waiting_that_no_live_worker_serves(r: Any, open_dashboard: Any) -> None:
    billing, emails, orders = Queue("billing", r), Queue("emails", r), Queue("orders", r, partitions=3)
    task_jobs(billing, "billing.charge", 12)
    task_jobs(billing, "billing.refund", 2)
    task_jobs(billing, "billing.invoice", 1, delay_ms=3_600_000)  # scheduled jobs are sampled too
    billing.enqueue(b"not an envelope")  # raw jobs are left out
    emails.enqueue_many([NewJob(b"{}") for _ in range(5)])  # a queue of raw jobs shows nothing
    task_jobs(orders, "orders.ship", 6)  # counted over every partition
    services = Services(r)
    services.register(["billing"], tasks=["billing.refund"])
    services.register(["emails"], tasks=["billing.charge"])  # serves another queue: does not count
    gone = services.register(["billing"], tasks=["billing.invoice"])
    services.deregister(gone)  # no longer live
    census_s = 1.5
    not_before = time.monotonic()  # the census is read after this (by the first sample)...
    client = open_dashboard(r, census_s=census_s)
    assert unserved(client) == {"billing": [("billing.charge", 12), ("billing.invoice", 1)], "emails": [],
                                "orders": [("orders.ship", 6)]}
    not_after = time.monotonic()  # ...and before this
    row = next(q for q in client.get("/api/overview").json()["queues"] if q["name"] == "billing")
    assert 0 < row["census_ms"] <= client.get("/api/overview").json()["now_ms"]

    # A worker that serves them registers: the next poll compares with it (the job
    # sample is not read again for that; the workers are listed at every sample).
    services.register(["billing", "orders"], tasks=["billing.charge", "billing.invoice", "orders.ship"])
    assert unserved(client) == {"billing": [], "emails": [], "orders": []}

    # Jobs of a new task: the sample is read again only after census_s.
    task_jobs(billing, "billing.export", 3)
    before = unserved(client)
    assert time.monotonic() - not_before < census_s, "too slow to see the cached census"
    assert before["billing"] == []
    time.sleep(max(0.0, not_after + census_s - time.monotonic()) + 0.05)
    assert unserved(client)["billing"] == [("billing.export", 3)]


def test_the_census_of_waiting_task_names_is_read_at_most_once_per_period(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.flushall()
    for i in range(3):
        task_jobs(Queue(f"q{i}", r), "billing.charge", 5)
    Queue("empty", r).enqueue(b"")
    Queue("empty", r).ack(Queue("empty", r).lease()[0])  # a queue with nothing waiting
    sampler = Sampler(r, fresh_s=0, census_s=3600)
    first = sampler.snapshot()  # discovery, and the census of every queue with jobs waiting
    assert {q.name: q.unserved for q in first.queues} == {
        "empty": (), "q0": (("billing.charge", 5),), "q1": (("billing.charge", 5),), "q2": (("billing.charge", 5),)}
    r.config_resetstat()
    sampler.snapshot()
    calls = {name: v["calls"] for name, v in r.info("commandstats").items()}
    assert calls["cmdstat_evalsha"] == 4 and "cmdstat_lrange" not in calls  # stats only
    sampler.census_s = 0  # every sample reads again: a get per sampled job, none for "empty"
    r.config_resetstat()
    sampler.snapshot()
    calls = {name: v["calls"] for name, v in r.info("commandstats").items()}
    assert calls["cmdstat_evalsha"] == 4 + 3 * 5 and calls["cmdstat_lrange"] == 3


def test_a_sample_reads_censuses_for_at_most_its_budget_never_read_queues_first() -> None:
    r = fake()
    for name in ("a", "b", "c"):
        task_jobs(Queue(name, r), f"{name}.run", 2)
    sampler = Sampler(r, fresh_s=0, census_s=0, census_budget_s=0)  # one queue per sample
    read: list[str] = []
    for _ in range(4):
        before = dict(sampler.censuses)
        sampler.snapshot()
        read += [name for name, census in sampler.censuses.items() if before.get(name) is not census]
    assert read == ["a", "b", "c", "a"]  # then the oldest again
    assert [q.unserved for q in sampler.snapshot().queues] == [(("a.run", 2),), (("b.run", 2),), (("c.run", 2),)]


def test_dead_letters_show_their_error_text_and_hide_payloads_by_default(r: Any, open_dashboard: Any) -> None:
    busy(r)
    page = open_dashboard(r).get("/api/queues/emails/dead").json()
    assert page["total"] == 3 and [j["id"] for j in page["jobs"]] == ["d1", "d2", "d3"]
    first = page["jobs"][0]
    assert first["error"] == "ValueError: no such mailbox for d1" and first["attempts"] == first["max_attempts"] == 1
    assert "payload" not in first and first["payload_bytes"] == len(b'{"email": "ada@example.com"}')
    # A partitioned queue's dead letters over every partition, by its logical name.
    orders = open_dashboard(r).get("/api/queues/orders/dead?limit=2&offset=1").json()
    assert orders["total"] == 4 and len(orders["jobs"]) == 2


def test_payloads_are_shown_only_when_the_dashboard_is_started_with_show_payloads(open_dashboard: Any) -> None:
    r = fake()
    busy(r)
    shown = open_dashboard(r, show_payloads=True).get("/api/queues/emails/dead").json()["jobs"][0]
    assert shown["payload"] == '{"email": "ada@example.com"}' and shown["payload_truncated"] is False
    hidden_page = open_dashboard(r).get("/").text
    assert "ada@example.com" not in hidden_page


# -- actions --------------------------------------------------------------------------------


def test_replaying_one_dead_job_moves_it_to_ready(r: Any, open_dashboard: Any) -> None:
    q, _ = busy(r)
    client = open_dashboard(r)
    answer = post(client, "emails", "dead_replay", {"ids": ["d2"]}, csrf_of(client))
    assert answer.status_code == 200, answer.text
    assert answer.json()["count"] == 1 and answer.json()["message"] == "1 replayed"
    assert [j.id for j in q.dead_list().jobs] == ["d1", "d3"]
    assert q.stats().ready == 3 + 1  # j2..j4 and d2
    assert client.get("/api/overview").json()["queues"][0]["dead"] == 2


def test_replaying_and_purging_selected_dead_jobs_touch_only_those(r: Any, open_dashboard: Any) -> None:
    _, p = busy(r)
    client = open_dashboard(r)
    token = csrf_of(client)
    assert post(client, "orders", "dead_replay", {"ids": ["o1", "o3"]}, token).json()["count"] == 2
    assert post(client, "orders", "dead_purge", {"ids": ["o2", "nope"]}, token).json()["count"] == 1
    assert [j.id for j in p.dead_list().jobs] == ["o4"]
    stats = p.stats()
    assert (stats.ready, stats.replayed, stats.purged) == (7 + 2, 2, 1)


def test_replaying_all_and_purging_all_empty_the_dead_letters_in_batches(
    r: Any, open_dashboard: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, p = busy(r)
    monkeypatch.setattr(app_module, "ALL_BATCH", 2)  # 3 and 4 dead jobs: several batches each
    client = open_dashboard(r)
    token = csrf_of(client)
    replayed = post(client, "emails", "dead_replay", {"all": True}, token).json()
    assert (replayed["count"], replayed["more"]) == (3, False)
    assert q.stats().dead == 0 and q.stats().replayed == 3
    assert post(client, "orders", "dead_purge", {"all": True}, token).json()["count"] == 4
    assert p.stats().dead == 0 and p.stats().purged == 4


def test_unknown_queues_actions_and_malformed_bodies_are_refused_and_change_nothing(open_dashboard: Any) -> None:
    r = fake()
    q, _ = busy(r)
    client = open_dashboard(r)
    token = csrf_of(client)
    assert post(client, "nowhere", "dead_replay", {"all": True}, token).status_code == 404
    assert post(client, "emails", "explode", {"all": True}, token).status_code == 404
    for body in ({}, {"ids": []}, {"ids": "d1"}, {"ids": [1]}, {"ids": ["d1"], "all": True}, {"all": "yes"},
                 ["d1"], {"ids": ["x"] * 1001}):
        assert post(client, "emails", "dead_replay", body, token).status_code == 400, body
    assert client.get("/api/queues/emails/dead?limit=0").status_code == 400
    assert client.get("/api/queues/emails/dead?offset=x").status_code == 400
    assert q.stats().dead == 3 and q.stats().replayed == 0


def test_cancelling_jobs_from_the_dashboard(r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    q.enqueue_many([NewJob(b"{}", job_id=f"j{i}") for i in range(3)])
    client = open_dashboard(r)
    token = csrf_of(client)
    answer = post(client, "emails", "cancel", {"ids": ["j0", "j2", "nope"]}, token)
    assert answer.status_code == 200 and answer.json()["message"] == "2 cancelled"
    assert post(client, "emails", "cancel", {"all": True}, token).status_code == 400  # never "every job"
    assert [job.id for job in q.lease(count=5)] == ["j1"] and q.stats().cancelled == 2


def test_pausing_and_resuming_a_queue_from_the_dashboard(r: Any, open_dashboard: Any) -> None:
    q, p = busy(r)
    client = open_dashboard(r)
    token = csrf_of(client)
    paused = post(client, "emails", "pause", {}, token)
    assert paused.status_code == 200, paused.text
    assert (paused.json()["count"], paused.json()["message"]) == (1, "emails paused")
    assert q.stats().paused and q.lease() == []
    q.enqueue(b"", job_id="while-paused")  # enqueue goes on
    row = client.get("/api/overview").json()["queues"][0]
    assert row["name"] == "emails" and row["paused_ms"] == q.stats().paused_ms > 0
    again = post(client, "emails", "pause", {}, token).json()
    assert (again["count"], again["message"]) == (0, "emails was paused already")
    resumed = post(client, "emails", "resume", {}, token).json()
    assert (resumed["count"], resumed["message"]) == (1, "emails resumed")
    assert not q.stats().paused and len(q.lease()) == 1
    assert post(client, "emails", "resume", {}, token).json()["message"] == "emails was not paused"
    # A partitioned queue, by its logical name: every partition.
    assert post(client, "orders", "pause", {"ids": ["ignored"]}, token).json()["count"] == 1
    assert p.stats().paused and p.lease(count=10) == [] and not q.stats().paused
    assert post(client, "orders", "resume", {}, token).json()["count"] == 1
    assert not p.stats().paused and len(p.lease()) == 1


# -- groups (fair scheduling) -------------------------------------------------------------


def tenants(q: Queue, backlog: dict[str, int]) -> None:
    """``backlog[group]`` jobs of each group in ``q``."""
    q.enqueue_many([NewJob(b"{}", group=group) for group, count in backlog.items() for _ in range(count)])


def groups_of(client: TestClient, queue: str, **params: Any) -> Any:
    answer = client.get(f"/api/queues/{queue}/groups", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


def caps(q: Queue) -> tuple[int, dict[str, int]]:
    """The default cap and each listed group's cap in force, as the driver reads them."""
    page = q.groups()
    return page.default_cap, {g.name: g.cap for g in page.groups}


def test_a_queues_groups_show_ready_running_cap_and_whether_parked(r: Any, open_dashboard: Any) -> None:
    q = Queue("webhooks", r)
    tenants(q, {"acme": 5, "globex": 2, "initech": 1, "umbrella": 3})
    q.set_group_limit(2)
    q.set_group_limit(1, group="globex")
    q.set_group_limit(0, group="umbrella")  # exempt from the default
    leased = q.lease(count=20)  # each group up to its cap; lease parks acme and globex at theirs
    assert len(leased) == 2 + 1 + 1 + 3
    Queue("emails", r).enqueue(b"{}")  # no groups
    client = open_dashboard(r)
    page = groups_of(client, "webhooks")
    assert (page["queue"], page["partitions"], page["total"], page["default_cap"]) == ("webhooks", 1, 2, 2)
    # initech and umbrella have nothing ready: not listed, as in Queue.groups.
    assert page["groups"] == [
        {"name": "acme", "ready": 3, "running": 2, "cap": 2, "own_cap": False, "parked": True, "partition": "webhooks"},
        {"name": "globex", "ready": 1, "running": 1, "cap": 1, "own_cap": True, "parked": True,
         "partition": "webhooks"},
    ]
    driver = q.groups()
    assert [(g["name"], g["ready"], g["running"], g["cap"], g["parked"]) for g in page["groups"]] == sorted(
        ((g.name, g.ready, g.running, g.cap, g.parked) for g in driver.groups), key=lambda t: (-t[1], t[0]))
    # The overview says which queues have groups (from stats: no call per group).
    rows = {row["name"]: row for row in client.get("/api/overview").json()["queues"]}
    stats = q.stats()
    assert (rows["webhooks"]["groups_waiting"], rows["webhooks"]["groups_at_cap"]) == \
        (stats.groups_waiting, stats.groups_at_cap) == (0, 2)
    assert (rows["emails"]["groups_waiting"], rows["emails"]["groups_at_cap"]) == (0, 0)
    empty = groups_of(client, "emails")
    assert (empty["total"], empty["groups"]) == (0, [])
    # A group's own cap shows as its own; groups that wait show as waiting.
    q.ack_many(leased)
    q.set_group_limit(4, group="acme")
    acme = groups_of(client, "webhooks")["groups"][0]
    assert (acme["name"], acme["cap"], acme["own_cap"], acme["parked"], acme["running"]) == ("acme", 4, True, False, 0)


def test_the_groups_table_is_limited_to_the_largest_backlogs_of_the_first_n(r: Any, open_dashboard: Any) -> None:
    q = Queue("webhooks", r)
    tenants(q, {f"t{i:02}": 1 + i % 4 for i in range(12)})
    p = Queue("orders", r, partitions=3)
    tenants(p, {f"shop-{i}": 1 + i for i in range(9)})
    client = open_dashboard(r)
    assert groups_of(client, "webhooks")["total"] == 12 and len(groups_of(client, "webhooks")["groups"]) == 12
    page = groups_of(client, "webhooks", limit=5)
    assert (page["total"], page["limit"], len(page["groups"])) == (12, 5, 5)
    first = sorted(q.groups(0, 5).groups, key=lambda g: (-g.ready, g.name))
    assert [g["name"] for g in page["groups"]] == [g.name for g in first]
    # A partitioned queue: each group in its partition, at most `limit` rows in all.
    both = groups_of(client, "orders", limit=4)
    assert (both["partitions"], both["total"], len(both["groups"])) == (3, 9, 4)
    where = {g.name: g.queue for g in p.groups().groups}
    assert all(g["partition"] == where[g["name"]] != "orders" for g in both["groups"])
    assert [g["ready"] for g in both["groups"]] == sorted((g["ready"] for g in both["groups"]), reverse=True)
    for bad in ("0", "1001", "x"):
        assert client.get(f"/api/queues/webhooks/groups?limit={bad}").status_code == 400, bad
    assert client.get("/api/queues/nowhere/groups").status_code == 404


def test_setting_group_caps_from_the_dashboard(r: Any, open_dashboard: Any) -> None:
    q = Queue("webhooks", r)
    tenants(q, {"acme": 3, "globex": 1})
    p = Queue("orders", r, partitions=3)
    tenants(p, {f"shop-{i}": 2 for i in range(6)})
    client = open_dashboard(r)
    token = csrf_of(client)

    def cap(body: dict[str, Any]) -> Any:
        answer = post(client, "webhooks", "group_limit", body, token)
        assert answer.status_code == 200, answer.text
        return answer.json()

    assert cap({"cap": 3}) == {"action": "group_limit", "queue": "webhooks", "count": 1, "more": False,
                               "message": "webhooks: every group: at most 3 running at once"}
    assert caps(q) == (3, {"acme": 3, "globex": 3})
    assert cap({"cap": "3"})["message"] == "webhooks: every group: at most 3 running at once (unchanged)"
    assert cap({"cap": "1", "group": "acme"})["message"] == "webhooks: group 'acme': at most 1 running at once"
    assert caps(q) == (3, {"acme": 1, "globex": 3})
    assert groups_of(client, "webhooks")["groups"][0] == {"name": "acme", "ready": 3, "running": 0, "cap": 1,
                                                          "own_cap": True, "parked": False, "partition": "webhooks"}
    assert cap({"cap": "off", "group": "acme"})["message"] == "webhooks: group 'acme': no cap"  # exempt
    assert caps(q) == (3, {"acme": 0, "globex": 3})
    assert cap({"cap": "default", "group": "acme"})["message"] == "webhooks: group 'acme': the default cap"
    assert caps(q) == (3, {"acme": 3, "globex": 3})
    assert cap({"cap": "off"})["message"] == "webhooks: every group: no cap"
    assert caps(q) == (0, {"acme": 0, "globex": 0})
    assert cap({"cap": 0})["count"] == 0  # 0 is off too
    # The cap holds: with a default of 1, one lease per group.
    cap({"cap": 1, "group": None})
    assert len(q.lease(count=10)) == 2
    # A partitioned queue, by its logical name: every partition.
    answer = post(client, "orders", "group_limit", {"cap": 2}, token).json()
    assert (answer["count"], answer["message"]) == (1, "orders: every group: at most 2 running at once")
    assert [part.groups().default_cap for part in queue_parts(p)] == [2, 2, 2]


def test_bad_group_caps_are_refused_with_a_reason_and_change_nothing(open_dashboard: Any) -> None:
    r = fake()
    q = Queue("webhooks", r)
    tenants(q, {"acme": 2})
    q.set_group_limit(2)
    q.set_group_limit(5, group="acme")
    client = open_dashboard(r)
    token = csrf_of(client)
    for body, reason in (
        ({"cap": -1}, "cap must be in [0, 1000000], got -1"),
        ({"cap": "-1"}, "a cap is a number of jobs"),
        ({"cap": 1.5}, "a cap is a number of jobs"),
        ({"cap": "2.5"}, "a cap is a number of jobs"),
        ({"cap": "three"}, "a cap is a number of jobs"),
        ({"cap": ""}, "a cap is a number of jobs"),
        ({"cap": None}, "a cap is a number of jobs"),
        ({"cap": True}, "a cap is a number of jobs"),
        ({"cap": "\u0663"}, "a cap is a number of jobs"),  # an Arabic-Indic 3: digits are ASCII
        ({"cap": 1_000_001}, "cap must be in [0, 1000000], got 1000001"),
        ({"cap": "99999999999"}, "a cap is a number of jobs"),
        ({"cap": "default"}, "default applies to one group"),
        ({"cap": 3, "group": ""}, "group must be 1..128 bytes"),
        ({"cap": 3, "group": "a|b"}, "group must be 1..128 bytes"),
        ({"cap": 3, "group": 7}, "group must be a str"),
        ({"cap": 3, "grup": "acme"}, 'send {"cap"'),  # a misspelt key must not set every group's cap
        ({"group": "acme"}, 'send {"cap"'),
        (["acme", 3], 'send {"cap"'),
    ):
        answer = post(client, "webhooks", "group_limit", body, token)
        assert answer.status_code == 400, (body, answer.text)
        assert reason in answer.json()["error"], (body, answer.json())
    assert post(client, "nowhere", "group_limit", {"cap": 3}, token).status_code == 404
    assert client.post("/api/queues/webhooks/actions/group_limit", content="{", headers={
        "content-type": "application/json", "x-csrf-token": token}).status_code == 400
    assert caps(q) == (2, {"acme": 5})


def test_a_group_cap_follows_the_rules_of_every_action(open_dashboard: Any) -> None:
    r = fake()
    q = Queue("webhooks", r)
    tenants(q, {"acme": 2})
    client = open_dashboard(r, token=TOKEN)
    auth = basic(TOKEN)
    token = csrf_of(client, headers=auth)
    body = {"cap": 1, "group": "acme"}
    assert post(client, "webhooks", "group_limit", body, token).status_code == 401  # no dashboard token
    assert post(client, "webhooks", "group_limit", body, None, headers=auth).status_code == 403  # no CSRF header
    assert post(client, "webhooks", "group_limit", body, token + "0", headers=auth).status_code == 403
    evil = {**auth, "origin": "http://evil.example"}
    assert post(client, "webhooks", "group_limit", body, token, headers=evil).status_code == 403
    form = client.post("/api/queues/webhooks/actions/group_limit", content="cap=1&group=acme",
                       headers={**auth, "x-csrf-token": token, "content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    assert client.get("/api/queues/webhooks/actions/group_limit", headers=auth).status_code == 405
    assert caps(q) == (0, {"acme": 0})
    # The page's own request, and a script's with the Bearer token, are let through.
    assert post(client, "webhooks", "group_limit", body, token, headers={**auth, "origin": BASE}).json()["count"] == 1
    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert post(client, "webhooks", "group_limit", {"cap": 4}, None, headers=bearer).json()["count"] == 1
    assert caps(q) == (4, {"acme": 1})


def expected_info(q: Queue, job_id: str, with_payload: bool = False) -> dict[str, Any]:
    """What the lookup should answer: ``Queue.get`` as JSON, but ``now_ms``."""
    info = q.get(job_id, with_payload=with_payload)
    want = {**dataclasses.asdict(info), "exists": info.exists, "error_truncated": False}
    del want["payload"], want["now_ms"]
    progress = q.progress_of([job_id]).get(job_id) if info.state == "leased" else None
    want["progress"] = None if progress is None else progress.value.decode()
    want["progress_written_ms"] = None if progress is None else progress.written_ms
    want["steps"] = []  # no durable steps here (tests/test_tasks_steps.py: the job view's steps)
    return want


def test_a_job_lookup_answers_what_queue_get_does_in_every_state(r: Any, open_dashboard: Any) -> None:
    q, p = busy(r)
    client = open_dashboard(r)
    states = {}
    for job_id in ("j2", "j1", "d1", "nope", "j0", "later", "a/b?c#d é"):
        answer = client.get("/api/queues/emails/job", params={"id": job_id})
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert "payload" not in got and got.pop("now_ms") > 0
        assert got == expected_info(q, job_id), job_id
        states[job_id] = got["state"]
    assert states == {"j2": "ready", "j1": "leased", "d1": "dead", "nope": "unknown", "j0": "done",
                      "later": "scheduled", "a/b?c#d é": "unknown"}
    dead = client.get("/api/queues/emails/job?id=d1").json()
    assert dead["error"] == "ValueError: no such mailbox for d1" and dead["payload_bytes"] == 28
    leased = client.get("/api/queues/emails/job?id=j1").json()
    assert leased["deadline_ms"] > 0 and leased["fence"] >= 0 and leased["exists"] is True
    assert leased["progress"] is None
    (running,) = [job for job in q.lease(count=3) if job.id == "j2"] or [None]
    assert running is not None and q.progress(running, '{"done": 7}')
    shown = client.get("/api/queues/emails/job?id=j2").json()
    assert shown["progress"] == '{"done": 7}' and shown["progress_written_ms"] > 0
    # A partitioned queue: the id's partition answers, and names itself.
    o1 = client.get("/api/queues/orders/job?id=o1").json()
    assert o1["state"] == "dead" and o1["queue"].startswith("orders") and o1["queue"] != "orders"
    assert o1["queue"] == p.get("o1").queue
    # Bad ids are the caller's (400), an unknown queue is not found (404).
    for bad in ("", "x\x01y", "x" * 257):
        assert client.get("/api/queues/emails/job", params={"id": bad}).status_code == 400, bad
    assert client.get("/api/queues/emails/job").status_code == 400
    assert client.get("/api/queues/nowhere/job?id=d1").status_code == 404


def test_a_lookup_lists_a_jobs_durable_steps_and_their_values_only_with_show_payloads(
    r: Any, open_dashboard: Any
) -> None:
    q = Queue("emails", r)
    q.enqueue(b"x", job_id="s1")
    (job,) = q.lease(lease_ms=60_000)
    q.step(job, "charge", b'j{"id": 7}', lease_ms=60_000)
    q.signal("s1", "early", b'j"hi"')
    parked = q.park(job, "wait", "approved", 3_600_000, lease_ms=60_000)
    hidden = open_dashboard(r).get("/api/queues/emails/job?id=s1").json()
    assert hidden["state"] == "waiting"
    assert hidden["steps"] == [
        {"kind": "step", "name": "charge", "until_ms": -1},
        {"kind": "wait", "name": "approved", "until_ms": parked.at_ms},
        {"kind": "signal", "name": "early", "until_ms": -1},
    ]
    shown = open_dashboard(r, show_payloads=True).get("/api/queues/emails/job?id=s1").json()["steps"]
    assert [(s["name"], s.get("value")) for s in shown] == [("charge", '{"id": 7}'), ("approved", None),
                                                              ("early", '"hi"')]


def test_a_lookup_shows_the_payload_only_with_show_payloads_as_text(open_dashboard: Any) -> None:
    r = fake()
    q, _ = busy(r)
    q.enqueue(b"\xff\xfeok", job_id="binary")
    hidden = open_dashboard(r).get("/api/queues/emails/job?id=d1").json()
    assert "payload" not in hidden and hidden["payload_bytes"] == len(b'{"email": "ada@example.com"}')
    client = open_dashboard(r, show_payloads=True)
    shown = client.get("/api/queues/emails/job?id=d1").json()
    assert shown["payload"] == '{"email": "ada@example.com"}' and shown["payload_truncated"] is False
    shown.pop("now_ms"), shown.pop("payload"), shown.pop("payload_truncated")
    assert shown == expected_info(q, "d1", with_payload=True)
    assert client.get("/api/queues/emails/job?id=binary").json()["payload"] == "\ufffd\ufffdok"
    assert client.get("/api/queues/emails/job?id=nope").json()["payload"] is None  # unknown: none to show
    # Clipped at 4,096 characters, not bytes: 3,000 two-byte characters are shown whole.
    q.enqueue_many([NewJob("é" * 3000, job_id="short"), NewJob("é" * 5000, job_id="long")])
    short, long = (client.get(f"/api/queues/emails/job?id={i}").json() for i in ("short", "long"))
    assert (short["payload"], short["payload_truncated"]) == ("é" * 3000, False)
    assert (long["payload"], long["payload_truncated"]) == ("é" * 4096, True)


# -- the jobs panel ---------------------------------------------------------------------------


def expected_page(q: Queue, state: str, start: int = 0, count: int = 50) -> list[dict[str, Any]]:
    """What the jobs panel should list: ``Queue.browse``'s jobs as JSON."""
    jobs = [{**dataclasses.asdict(job), "waiting": job.waiting} for job in q.browse(state, start, count).jobs]
    if state == "running":  # and what no worker reported (these leases are no worker's), and no progress
        jobs = [{**job, "leased_ms": None, "limit_ms": None, "progress": None} for job in jobs]
    return jobs


def jobs_of(client: TestClient, queue: str, **params: Any) -> Any:
    answer = client.get(f"/api/queues/{queue}/jobs", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_jobs_panel_pages_each_state_as_queue_browse_does(r: Any, open_dashboard: Any) -> None:
    q, p = busy(r)
    q.flow_wait(NewJob(b"", job_id="w0"), [("emails", "j2")])
    client = open_dashboard(r, show_payloads=True)  # payloads are never listed, shown or not
    totals = {}
    for state in ("ready", "scheduled", "running", "done"):
        page = jobs_of(client, "emails", state=state)
        assert (page["queue"], page["state"], page["start"], page["count"]) == ("emails", state, 0, 50)
        assert page["now_ms"] > 0 and page["jobs"] == expected_page(q, state), state
        assert all("payload" not in job for job in page["jobs"])
        totals[state] = page["total"]
    assert totals == {"ready": 3, "scheduled": 2, "running": 1, "done": 1}
    assert [(j["id"], j["waiting"]) for j in jobs_of(client, "emails", state="scheduled")["jobs"]] == [
        ("later", False), ("w0", True)
    ]
    dead = jobs_of(client, "emails", state="dead")
    assert dead["total"] == 3 and [j["id"] for j in dead["jobs"]] == ["d1", "d2", "d3"]
    assert dead["jobs"][0] == {"id": "d1", "dead_ms": q.dead_list().jobs[0].dead_ms, "attempts": 1, "max_attempts": 1,
                               "error": "ValueError: no such mailbox for d1", "error_truncated": False}
    # pages: start and count, the total of the whole state each time
    second = jobs_of(client, "emails", state="ready", start=1, count=2)
    assert second["total"] == 3 and second["jobs"] == expected_page(q, "ready", 1, 2)
    assert [j["id"] for j in jobs_of(client, "emails", state="dead", start=2, count=5)["jobs"]] == ["d3"]
    # a partitioned queue: pages over its partitions in order, each job naming its own
    whole = jobs_of(client, "orders", state="ready")
    assert whole["total"] == 7 and whole["jobs"] == expected_page(p, "ready")
    assert {job["queue"] for job in whole["jobs"]} <= {"orders#0", "orders#1", "orders#2"}
    pages = [jobs_of(client, "orders", state="ready", start=s, count=3)["jobs"] for s in (0, 3, 6)]
    assert [j["id"] for page in pages for j in page] == [j["id"] for j in whole["jobs"]]
    assert jobs_of(client, "orders", state="dead")["total"] == 4
    # refused: a state it does not know, a count past the cap, a bad start; no such queue
    for params in ({"state": "leased"}, {"count": 201}, {"count": 0}, {"start": -1}, {"start": "x"}):
        assert client.get("/api/queues/emails/jobs", params=params).status_code == 400, params
    assert client.get("/api/queues/nowhere/jobs").status_code == 404


def test_a_done_jobs_kept_result_is_shown_on_request_clipped(r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    q.enqueue_many([NewJob(b"", job_id=i) for i in ("json", "bytes", "long", "none")])
    by_id = {job.id: job for job in q.lease(count=4)}
    q.ack_result(by_id["json"], {"sent": 3, "to": "ada"})
    q.ack_result(by_id["bytes"], b"\xff\xfeok")
    q.ack_result(by_id["long"], "é" * 5000)
    q.ack(by_id["none"])
    client = open_dashboard(r)
    done = jobs_of(client, "emails", state="done")
    assert {j["id"]: j["has_result"] for j in done["jobs"]} == {"json": True, "bytes": True, "long": True,
                                                                 "none": False}
    shown = {i: client.get("/api/queues/emails/result", params={"id": i}).json()
             for i in ("json", "bytes", "long", "none")}
    assert (shown["json"]["state"], shown["json"]["value"]) == ("ok", '{"sent": 3, "to": "ada"}')
    assert shown["json"]["finished_ms"] == q.result("json").finished_ms
    assert shown["bytes"]["value"] == "\ufffd\ufffdok"
    assert (shown["long"]["value"], shown["long"]["value_truncated"]) == ("é" * 4096, True)
    assert (shown["none"]["state"], shown["none"]["value"]) == ("done", None)
    assert client.get("/api/queues/emails/result").status_code == 400
    assert client.get("/api/queues/nowhere/result?id=json").status_code == 404


def test_the_jobs_panel_names_the_queues_tasks_no_live_worker_serves(r: Any, open_dashboard: Any) -> None:
    billing, emails = Queue("billing", r), Queue("emails", r)
    task_jobs(billing, "billing.charge", 2)
    emails.enqueue(b"raw")
    Services(r).register(["billing"], tasks=["billing.refund"])
    client = open_dashboard(r)
    page = jobs_of(client, "billing", state="ready")
    assert page["unserved_tasks"] == [{"task": "billing.charge", "jobs": 2}] and page["census_ms"] > 0
    assert jobs_of(client, "emails")["unserved_tasks"] == []


# -- flows ---------------------------------------------------------------------------------


def flow_app(r: Any) -> Tasks:
    """A task app for flows: ``add`` and ``boom`` (it fails at its first attempt) in math,
    ``total`` in sums."""
    tasks = Tasks(client=r)

    @tasks.task(name="add", queue="math")
    def add(x: int, y: int = 0) -> int:
        return x + y

    @tasks.task(name="boom", queue="math", max_attempts=1)
    def boom(n: int) -> int:
        raise ValueError(f"boom {n}")

    @tasks.task(name="total", queue="sums")
    def total(xs: list[int]) -> int:
        return sum(xs)

    return tasks


def test_a_flow_shows_its_tree_and_each_steps_state_as_pyqueue_flow_show_does(r: Any, open_dashboard: Any) -> None:
    app = flow_app(r)
    add, boom, total = (app.tasks[name] for name in ("add", "boom", "total"))
    flow = chord([add.s(1, 1), add.s(2, 2)], total.s()).send()
    client = open_dashboard(r)
    answer = client.get("/api/queues/math/flow", params={"id": flow.id})
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"
    got = answer.json()
    view = flow.show()
    assert (got["id"], got["queue"], got["created_ms"], got["expires_ms"]) == \
        (flow.id, "math", view.created_ms, view.expires_ms)
    assert got["created_ms"] < got["expires_ms"]
    assert got["tree"] == {"chain": [{"group": [0, 1]}, 2]}
    assert got["counts"] == {"ready": 2, "waiting": 1}
    assert [(s["n"], s["id"], s["task"], s["queue"], s["state"], s["describe"]) for s in got["steps"]] == [
        (0, f"{flow.id}.0", "add", "math", "ready", "ready"),
        (1, f"{flow.id}.1", "add", "math", "ready", "ready"),
        (2, f"{flow.id}.2", "total", "sums", "waiting", "waiting"),
    ]
    for step, shown in zip(view.steps, got["steps"]):
        assert (shown["attempts"], shown["max_attempts"]) == (step.info.attempts, step.info.max_attempts)
        assert (shown["error"], shown["error_truncated"]) == ("", False)

    # A flow that fails: its dead step says why.
    failing = chord([add.s(3, 3), boom.s(7)], total.s()).send()
    serving = Serving(app, concurrency=2, block_ms=50)
    try:
        assert flow.result(timeout=20) == 2 + 4
        with pytest.raises(TaskDead):
            failing.result(timeout=20)
    finally:
        serving.stop()
    done = client.get("/api/queues/math/flow", params={"id": flow.id}).json()
    assert done["counts"] == {"done": 3}
    assert [(s["state"], s["describe"]) for s in done["steps"]] == [("done", "done")] * 3
    failed = client.get(f"/api/queues/math/flow?id={failing.id}").json()
    assert failed["counts"] == {"done": 1, "dead": 2}
    step = failed["steps"][1]
    assert (step["task"], step["state"], step["attempts"], step["max_attempts"]) == ("boom", "dead", 1, 1)
    assert (step["error"], step["error_truncated"], step["describe"]) == \
        ("ValueError: boom 7", False, "dead: ValueError: boom 7")
    callback = failed["steps"][2]  # it waited for a dead step: it goes dead with its error
    assert callback["state"] == "dead" and callback["describe"].endswith("is dead: ValueError: boom 7")


def test_a_flow_is_found_in_the_partition_of_its_id_and_its_steps_where_they_are(r: Any, open_dashboard: Any) -> None:
    # A record as the task layer keeps it, of steps in a partitioned queue: the logical
    # queue finds it in the partition of the flow's id, each step in its own partition.
    p = Queue("orders", r, partitions=3)
    p.enqueue(b"", job_id="flow-p.2", max_attempts=1)
    (job,) = p.lease()
    long_error = "RuntimeError: " + "é" * 5000  # a nack of another client (a worker clips at 4,000)
    p.nack(job, long_error)
    p.enqueue_many([NewJob(b"", job_id=f"flow-p.{n}") for n in range(2)])
    where = [p.get(f"flow-p.{n}").queue for n in range(3)]
    record = {"v": 1, "id": "flow-p", "created_ms": 1, "tree": {"group": [0, 1, 2]},
              "steps": [[where[n], f"flow-p.{n}", "ship"] for n in range(3)], "output": None}
    p.flow_record("flow-p", json.dumps(record), 60_000)
    got = open_dashboard(r).get("/api/queues/orders/flow?id=flow-p").json()
    assert got["queue"] == "orders" and got["counts"] == {"ready": 2, "dead": 1}
    assert [s["queue"] for s in got["steps"]] == where and all(q.startswith("orders#") for q in where)
    dead = got["steps"][2]  # its error and its words clipped as a job lookup's error is
    assert (dead["state"], dead["error"], dead["error_truncated"]) == \
        ("dead", long_error[:app_module.TEXT_LIMIT], True)
    assert dead["describe"] == ("dead: " + long_error)[:app_module.TEXT_LIMIT]


def test_a_flow_not_kept_in_the_queue_named_is_not_found_and_a_bad_id_is_refused(r: Any, open_dashboard: Any) -> None:
    app = flow_app(r)
    flow = chord([app.tasks["add"].s(1, 1)], app.tasks["total"].s()).send()
    client = open_dashboard(r)
    assert client.get(f"/api/queues/math/flow?id={flow.id}").status_code == 200
    # Its record is in its first step's queue only; an id never sent is in none.
    for queue, flow_id in (("sums", flow.id), ("math", "flow-0000"), ("math", "a/b?c#d é")):
        answer = client.get(f"/api/queues/{queue}/flow", params={"id": flow_id})
        assert answer.status_code == 404, (queue, flow_id)
        assert answer.json() == {"error": f"no record of flow {flow_id} in {queue}: never sent from it "
                                          "(its first step's queue), or expired"}
    missing = client.get(f"/api/queues/nowhere/flow?id={flow.id}")
    assert (missing.status_code, missing.json()) == (404, {"error": "no queue 'nowhere'"})
    for bad in ("", "x\x01y", "x" * 257):
        refused = client.get("/api/queues/math/flow", params={"id": bad})
        assert refused.status_code == 400, bad
        assert refused.json()["error"].startswith("a flow id is 1..256 bytes")
    assert client.get("/api/queues/math/flow").json() == {"error": "name the flow: ?id=<flow id>"}
    assert client.get("/api/queues/math/flow").status_code == 400


# -- who may do what -------------------------------------------------------------------------


def basic(password: str, user: str = "ops") -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_with_a_token_every_request_without_it_is_refused_with_a_basic_challenge(open_dashboard: Any) -> None:
    r = fake()
    busy(r)
    client = open_dashboard(r, token=TOKEN)
    for path in ("/", "/api/overview", "/api/queues/emails/dead", "/api/queues/emails/job?id=d1",
                 "/api/queues/emails/groups", "/static/dashboard.js"):
        refused = client.get(path)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"].startswith("Basic realm=")
        assert client.get(path, headers=basic("wrong-token-wrong-token")).status_code == 401
        assert client.get(path, headers={"authorization": f"Bearer {TOKEN}x"}).status_code == 401
        assert client.get(path, headers=basic(TOKEN)).status_code == 200
        assert client.get(path, headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    token = csrf_of(client, headers=basic(TOKEN))
    # The CSRF token alone is not enough: an action needs the dashboard token too.
    assert post(client, "emails", "dead_replay", {"all": True}, token).status_code == 401
    assert Queue("emails", r).stats().dead == 3
    assert post(client, "emails", "dead_replay", {"ids": ["d1"]}, token, headers=basic(TOKEN)).status_code == 200
    for action in ("pause", "resume"):
        assert post(client, "emails", action, {}, token).status_code == 401
    assert not Queue("emails", r).stats().paused


def test_an_action_without_a_valid_csrf_token_or_from_another_origin_is_refused(open_dashboard: Any) -> None:
    r = fake()
    q, _ = busy(r)
    client = open_dashboard(r, token=TOKEN)
    auth = basic(TOKEN)
    token = csrf_of(client, headers=auth)
    body = {"all": True}
    assert post(client, "emails", "dead_purge", body, None, headers=auth).status_code == 403  # no header
    assert post(client, "emails", "dead_purge", body, token + "0", headers=auth).status_code == 403  # not the cookie
    forged = "attacker-nonce.0000"
    client.cookies.set(CSRF_COOKIE, forged)
    assert post(client, "emails", "dead_purge", body, forged, headers=auth).status_code == 403  # not signed here
    client.cookies.set(CSRF_COOKIE, token)
    evil = {**auth, "origin": "http://evil.example"}
    assert post(client, "emails", "dead_purge", body, token, headers=evil).status_code == 403
    form = client.post("/api/queues/emails/actions/dead_purge", content="all=true",
                       headers={**auth, "x-csrf-token": token, "content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    assert client.get("/api/queues/emails/actions/dead_purge", headers=auth).status_code == 405
    assert q.stats().dead == 3 and q.stats().purged == 0
    for action in ("pause", "resume"):  # the same rules for pause and resume
        assert post(client, "emails", action, {}, None, headers=auth).status_code == 403
        assert post(client, "emails", action, {}, token + "0", headers=auth).status_code == 403
        assert post(client, "emails", action, {}, token, headers=evil).status_code == 403
    assert not q.stats().paused
    q.pause()
    assert post(client, "emails", "resume", {}, None, headers=auth).status_code == 403
    assert q.stats().paused
    q.resume()
    same = {**auth, "origin": BASE}
    assert post(client, "emails", "dead_purge", {"ids": ["d1"]}, token, headers=same).json()["count"] == 1


def test_a_bearer_request_needs_no_csrf_token(open_dashboard: Any) -> None:
    r = fake()
    q, _ = busy(r)
    client = open_dashboard(r, token=TOKEN)
    answer = post(client, "emails", "dead_replay", {"all": True}, None, headers={"authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200 and answer.json()["count"] == 3 and q.stats().dead == 0


def test_a_loopback_dashboard_answers_loopback_host_names_only(open_dashboard: Any) -> None:
    # A page whose own DNS name was rebound to 127.0.0.1 sends its own name as Host.
    client = open_dashboard(fake(), allowed_hosts=frozenset({"127.0.0.1", "localhost", "::1"}))
    assert client.get("/api/overview").status_code == 200
    assert client.get("/api/overview", headers={"host": "localhost:8080"}).status_code == 200
    assert client.get("/api/overview", headers={"host": "[::1]:8080"}).status_code == 200
    assert client.get("/api/overview", headers={"host": "rebound.evil.example:8080"}).status_code == 400


def test_binding_beyond_loopback_needs_a_token_of_sixteen_characters() -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", TOKEN)
    for host, token in (("0.0.0.0", None), ("192.0.2.7", None), ("::", None), ("dash.example", ""),
                        ("127.0.0.1", "short")):
        with pytest.raises(DashboardRefused):
            check_bind(host, token)


def test_pyqueue_dashboard_refuses_loudly_to_listen_beyond_loopback_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYQUEUE_DASHBOARD_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "pyqueue", "dashboard", "--bind", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 2
    assert "refusing to serve the dashboard on '0.0.0.0' without a token" in done.stderr
    assert "--token" in done.stderr


def test_without_the_dashboard_extra_the_command_names_the_extra() -> None:
    # starlette made unimportable, as on a machine with only `pip install .`
    code = "import sys; sys.modules['starlette'] = None; from pyqueue.cli import main; sys.exit(main(sys.argv[1:]))"
    for argv in (["dashboard"], ["demo", "--dashboard"]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, done.stderr
        assert "the dashboard needs the dashboard extra (missing: starlette)" in done.stderr
        assert 'pip install "pyqueue-redis[dashboard]"' in done.stderr


# -- the sampler -------------------------------------------------------------------------------


def test_history_is_a_bounded_ring_buffer_and_throughput_is_the_slope_of_acked() -> None:
    r = fake()
    q = Queue("emails", r)
    q.enqueue_many([NewJob(b"") for _ in range(40)])
    sampler = Sampler(r, every_s=0.01, history_s=0.05, fresh_s=0)
    assert sampler.points.maxlen == 6
    for _ in range(3):
        for job in q.lease(count=5):
            q.ack(job)
        time.sleep(0.011)
        sampler.snapshot()
    assert [p.values["emails"][-1] for p in sampler.points] == [5, 10, 15]  # acked at each point
    snapshot = sampler.snapshot()
    first = sampler.points[0]  # acked 5; now 15
    assert snapshot.queues[0].acked_per_s == pytest.approx((15 - 5) * 1000 / (snapshot.now_ms - first.t_ms))
    for _ in range(20):
        time.sleep(0.011)
        sampler.snapshot()
    assert len(sampler.points) == 6
    assert sampler.history(since_ms=sampler.points[-2].t_ms) == [sampler.points[-1]]


def test_a_sample_costs_one_stats_call_per_queue(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.flushall()
    for i in range(50):
        Queue(f"q{i}", r).enqueue(b"")
    sampler = Sampler(r, fresh_s=0)
    sampler.snapshot()  # discovery (a SCAN), once per rediscover_s; the task census, once per census_s
    r.config_resetstat()
    assert len(sampler.snapshot().queues) == 50
    calls = {name: v["calls"] for name, v in r.info("commandstats").items()}
    assert calls["cmdstat_evalsha"] == 50 and "cmdstat_scan" not in calls


def test_an_unreachable_redis_is_reported_on_the_page_not_raised(open_dashboard: Any) -> None:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from conftest import free_ports

    gone = redis.Redis(port=free_ports(1)[0], socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    overview = open_dashboard(gone).get("/api/overview")
    assert overview.status_code == 200 and "ConnectionError" in overview.json()["error"]


# -- the commands ------------------------------------------------------------------------------


def read_url(proc: subprocess.Popen[str], marker: str, timeout_s: float = 30) -> str:
    """The first http:// URL on a line of ``proc``'s stdout that contains ``marker``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        if marker in line:
            found = re.search(r"http://127\.0\.0\.1:\d+/", line)
            assert found is not None, line
            return found.group(0)
    raise AssertionError(f"no {marker!r} line from the process")


def test_pyqueue_dashboard_serves_over_http_and_exits_0_on_sigterm(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.flushall()
    busy(r)
    env = dict(os.environ, PYQUEUE_DASHBOARD_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "pyqueue", "--url", redis_server.url(), "dashboard", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = read_url(proc, "serving the pyqueue dashboard")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "api/overview", timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        request = urllib.request.Request(url + "api/overview", headers={"authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            names = [row["name"] for row in json.load(response)["queues"]]
        assert names == ["emails", "orders"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert code == 0


def test_pyqueue_dashboard_read_only_refuses_every_action(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.flushall()
    busy(r)
    before = dump_all(r)
    env = dict(os.environ, PYQUEUE_DASHBOARD_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "pyqueue", "--url", redis_server.url(), "dashboard", "--port", "0",
                             "--read-only"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = read_url(proc, "read-only: no action")
        request = urllib.request.Request(url + "api/queues/emails/actions/pause", data=b"{}", method="POST",
                                         headers={"authorization": f"Bearer {TOKEN}",
                                                  "content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
        refused.value.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert code == 0 and dump_all(r) == before


def test_pyqueue_demo_dashboard_serves_the_demo_queues_while_it_runs_and_after() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "pyqueue", "demo", "--jobs", "150", "--dashboard",
                             "--dashboard-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = read_url(proc, "dashboard:")
        with urllib.request.urlopen(url + "api/overview", timeout=10) as response:
            assert {row["name"] for row in json.load(response)["queues"]} <= {"demo-emails", "demo-reports"}
        read_url(proc, "keeps serving", timeout_s=90)
        deadline = time.monotonic() + 10
        while True:  # a poll may get the previous sample (up to a second old)
            with urllib.request.urlopen(url + "api/overview", timeout=10) as response:
                overview = json.load(response)
            if sum(row["acked"] for row in overview["queues"]) == 150 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert {row["name"] for row in overview["queues"]} == {"demo-emails", "demo-reports"}
        assert sum(row["acked"] for row in overview["queues"]) == 150
        assert sum(row["scrubbed"] for row in overview["queues"]) >= 1  # the killed worker's jobs came back
        assert len(overview["history"]["t"]) >= 2
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(20)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0


def test_the_events_endpoint_reads_the_newest_then_what_follows(open_dashboard: Any) -> None:
    r = fakeredis.FakeRedis()
    q = Queue("emails", r)
    q.enqueue(b"", job_id="before")  # not opted in yet: no event
    Queue("orders", r, partitions=3).enqueue(b"")
    client = open_dashboard(r)
    assert client.get("/api/queues/emails/events").json() == {"events": [], "last": 0, "missed": 0}
    q.set_events(5)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(7)])  # 7 events, 5 kept
    newest = client.get("/api/queues/emails/events?count=3").json()
    assert [e["seq"] for e in newest["events"]] == [5, 6, 7] and newest["last"] == 7
    assert newest["events"][0] == {"seq": 5, "type": "enqueued", "id": "j4", "at_ms": newest["events"][0]["at_ms"]}
    (job,) = q.lease()
    q.ack(job)
    after = client.get("/api/queues/emails/events?since=7").json()
    assert [(e["seq"], e["type"], e["id"], e["attempt"]) for e in after["events"]] == [
        (8, "leased", "before", 1), (9, "acked", "before", 1)]
    assert client.get("/api/queues/emails/events?since=1").json()["missed"] == 3  # 2..4 trimmed
    assert client.get("/api/queues/nope/events").status_code == 404
    assert client.get("/api/queues/emails/events?count=0").status_code == 400
    refused = client.get("/api/queues/orders/events")
    assert refused.status_code == 400 and "partitions" in refused.json()["error"]


def test_running_jobs_show_what_their_worker_reported_and_their_progress(open_dashboard: Any) -> None:
    r = fakeredis.FakeRedis()
    services = Services(r)
    svc = services.register(["emails"])
    q = Queue("emails", r, owner=svc.owner)
    q.enqueue_many([NewJob(b"", job_id=i) for i in ("reported", "fresh")])
    reported, fresh = q.lease(count=2)
    q.progress(reported, '{"done": 3}')
    services.renew(svc, running=[RunningJob("emails", "reported", reported.deadline_ms - 30_000,
                                            reported.deadline_ms + 60_000)])
    client = open_dashboard(r)
    page = client.get("/api/queues/emails/jobs?state=running").json()
    by_id = {job["id"]: job for job in page["jobs"]}
    assert by_id["reported"]["leased_ms"] == reported.deadline_ms - 30_000
    assert by_id["reported"]["limit_ms"] == reported.deadline_ms + 60_000
    assert by_id["reported"]["progress"] == '{"done": 3}'
    # Leased after the worker's last report: nothing known yet, and no progress.
    assert (by_id["fresh"]["leased_ms"], by_id["fresh"]["limit_ms"], by_id["fresh"]["progress"]) == (None, None, None)


# -- the search box and its bulk actions (#39) -------------------------------------------------


def rows_of(page: str) -> list[tuple[str, str]]:
    """The (id, state) of each row of a search page's results."""
    return [(html.unescape(i), s) for i, s in re.findall(r'<tr data-job="([^"]*)" data-state="([^"]*)">', page)]


def text_of(page: str, element_id: str) -> str:
    """The text of the element with ``element_id`` (tags dropped, entities decoded)."""
    found = re.search(rf'<(\w+)[^>]* id="{element_id}"[^>]*>(.*?)</\1>', page, re.S)
    assert found is not None, f"no #{element_id} in the page"
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(2))).strip()


def link_of(page: str, element_id: str) -> str:
    found = re.search(rf'<a id="{element_id}" href="([^"]*)"', page)
    assert found is not None, f"no link #{element_id} in the page"
    return "/" + html.unescape(found.group(1))


def confirmation(client: TestClient, status: int = 200, **params: str) -> tuple[Any, dict[str, str]]:
    """GET a bulk action's confirmation page; its answer and its form's fields."""
    page = client.get("/bulk", params=params)
    assert page.status_code == status, page.text
    form = re.search(r'<form id="bulk-confirm"(.*?)</form>', page.text, re.S)
    fields = {} if form is None else {k: html.unescape(v) for k, v in re.findall(
        r'<input type="hidden" name="(\w+)" value="([^"]*)">', form.group(1))}
    return page, fields


def bulk(client: TestClient, fields: dict[str, str], **kwargs: Any) -> Any:
    return client.post("/bulk", content=urlencode(fields),
                       headers={"content-type": "application/x-www-form-urlencoded", **kwargs.pop("headers", {})},
                       **kwargs)


def task_dead(q: Queue, task: str, ids: list[str], error: str) -> None:
    """Make ``ids`` dead letters of the task ``task`` (no other job may be ready)."""
    q.enqueue_many([NewJob(b"{}", job_id=i, max_attempts=1, task=task) for i in ids])
    left = set(ids)
    while left:
        for job in q.lease(count=len(left)):
            q.nack(job, error.format(id=job.id))
            left.discard(job.id)


def test_the_search_box_shows_what_queue_search_finds_a_page_at_a_time(r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    q.set_indexes(True)
    task_dead(q, "send_invoice", ["dead-1"], "TimeoutError: smtp")
    q.enqueue_many([NewJob(b"{}", job_id=f"inv{i:02}", task="send_invoice") for i in range(60)])
    q.enqueue_many([NewJob(b"{}", job_id=f"rep{i}", task="report", group="acme") for i in range(3)])
    q.enqueue(b"{}", job_id="inv-later", task="send_invoice", delay_ms=3_600_000)
    p = Queue("orders", r, partitions=3)
    p.set_indexes(True)
    p.enqueue_many([NewJob(b"", task="ship") for _ in range(7)] + [NewJob(b"", task="bill") for _ in range(2)])
    client = open_dashboard(r)
    assert 'id="search-form"' in client.get("/").text  # the box is on the dashboard's page

    first = client.get("/search", params={"queue": "emails", "task": "send_invoice", "state": "ready"})
    assert first.status_code == 200, first.text
    expected = q.search(task="send_invoice", state="ready", count=50)
    assert rows_of(first.text) == [(job.id, "ready") for job in expected.jobs] and len(expected.jobs) == 50
    assert 'href="./?queue=emails&amp;job=inv00#lookup"' in first.text  # an id opens the job view
    # the form keeps what was asked; "more" carries the cursor, and the last page has none
    assert 'name="task" value="send_invoice"' in first.text and '<option value="ready" selected>' in first.text
    more = link_of(first.text, "search-more")
    assert "cursor=" in more and "task=send_invoice" in more and "state=ready" in more
    second = client.get(more)
    assert second.status_code == 200 and len(rows_of(second.text)) == 10
    assert 'id="search-more"' not in second.text
    assert {i for i, _ in rows_of(first.text) + rows_of(second.text)} == {f"inv{i:02}" for i in range(60)}
    # any state: the dead and the scheduled ones too, with the dead one's error
    every = client.get("/search", params={"queue": "emails", "task": "send_invoice"}).text
    rest = client.get(link_of(every, "search-more")).text
    assert {s for _, s in rows_of(every) + rows_of(rest)} == {"dead", "ready", "scheduled"}
    assert len(rows_of(every) + rows_of(rest)) == 62 and "TimeoutError: smtp" in every + rest
    # by group; by error class (any queue); the bulk actions a state allows
    by_group = client.get("/search", params={"queue": "emails", "group": "acme"}).text
    assert rows_of(by_group) == [(f"rep{i}", "ready") for i in range(3)]
    assert re.findall(r'data-action="(\w+)"', by_group) == ["replay", "purge", "cancel", "promote"]
    dead = client.get("/search", params={"queue": "emails", "error": "TimeoutError"}).text
    assert rows_of(dead) == [("dead-1", "dead")]
    assert re.findall(r'data-action="(\w+)"', dead) == ["replay", "purge", "cancel"]
    ready = client.get("/search", params={"queue": "emails", "state": "ready", "task": "report"}).text
    assert re.findall(r'data-action="(\w+)"', ready) == ["cancel"]
    # a partitioned queue: every partition, by its logical name
    ship = client.get("/search", params={"queue": "orders", "task": "ship"}).text
    assert sorted(i for i, _ in rows_of(ship)) == sorted(job.id for job in matching(p, JobFilter(task="ship")))
    assert len(rows_of(ship)) == 7
    assert client.get("/search", params={"queue": "nope"}).status_code == 404


def test_the_search_page_escapes_task_names_and_error_texts(r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    q.set_indexes(True)
    task_dead(q, '<img src=x onerror="alert(1)">', ["x1"], 'ValueError: <script>alert("{id}")</script>')
    client = open_dashboard(r)
    page = client.get("/search", params={"queue": "emails", "task": '<img src=x onerror="alert(1)">'})
    assert page.status_code == 200 and rows_of(page.text) == [("x1", "dead")]
    assert "<script>" not in page.text and "<img" not in page.text
    assert "&lt;script&gt;alert(&#34;x1&#34;)&lt;/script&gt;" in page.text
    _, fields = confirmation(client, queue="emails", action="purge", task='<img src=x onerror="alert(1)">')
    assert fields["task"] == '<img src=x onerror="alert(1)">' and fields["count"] == "1"


def test_a_search_by_task_or_group_without_indexes_says_how_to_turn_them_on(r: Any, open_dashboard: Any) -> None:
    q, _ = busy(r)  # no indexes
    client = open_dashboard(r)
    before = dump_all(r)
    for field in ("task", "group"):
        page = client.get("/search", params={"queue": "emails", field: "send_invoice"})
        assert page.status_code == 400
        said = text_of(page.text, "search-message")
        assert "emails keeps no indexes" in said and "`pyqueue indexes emails on`" in said
        refused, fields = confirmation(client, 400, queue="emails", action="cancel", **{field: "send_invoice"})
        assert "`pyqueue indexes emails on`" in text_of(refused.text, "bulk-message") and fields == {}
    assert dump_all(r) == before
    # the other filters work on any queue
    dead = client.get("/search", params={"queue": "emails", "state": "dead"})
    assert rows_of(dead.text) == [(job.id, "dead") for job in q.search(state="dead").jobs]
    assert [i for i, _ in rows_of(dead.text)] == ["d1", "d2", "d3"]


def test_bad_search_input_is_refused_with_the_reason_and_changes_nothing(r: Any, open_dashboard: Any) -> None:
    busy(r)
    client = open_dashboard(r)
    before = dump_all(r)
    for params, reason in (({"state": "bogus"}, "state must be one of"),
                           ({"error": "Timeout:Error"}, "error is an exception class name"),
                           ({"state": "ready", "error": "ValueError"}, "only dead jobs have an error"),
                           ({"since": "25:99"}, "since is HH:MM"),
                           ({"until": "yesterday"}, "until is HH:MM"),
                           ({"cursor": "not-a-cursor"}, "cursor")):
        page = client.get("/search", params={"queue": "emails", **params})
        assert page.status_code == 400, params
        assert reason in text_of(page.text, "search-message"), params
        if "cursor" not in params:
            refused, fields = confirmation(client, 400, queue="emails", action="cancel", **params)
            assert reason in text_of(refused.text, "bulk-message") and fields == {}
    _, fields = confirmation(client, queue="emails", action="replay", state="dead")
    for bad, reason in (({"action": "explode"}, "action must be one of"), ({"state": "ready"}, "replay acts on dead"),
                        ({"count": "many"}, "count is the number"), ({"since_ms": "noon"}, "since_ms is a time")):
        refused = bulk(client, {**fields, **bad})
        assert refused.status_code == 400 and reason in text_of(refused.text, "bulk-message"), bad
    refused, _ = confirmation(client, 400, queue="emails", action="promote", state="dead")
    assert "promote acts on scheduled jobs" in text_of(refused.text, "bulk-message")
    assert dump_all(r) == before


def test_a_bulk_cancel_needs_the_csrf_token_and_without_it_changes_nothing(r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    q.set_indexes(True)
    q.enqueue_many([NewJob(b"{}", job_id=f"inv{i}", task="send_invoice") for i in range(5)])
    q.enqueue_many([NewJob(b"{}", job_id=f"rep{i}", task="report") for i in range(2)])
    client = open_dashboard(r)
    page, fields = confirmation(client, queue="emails", action="cancel", task="send_invoice")
    assert text_of(page.text, "bulk-count") == "The filter finds 5 jobs of emails now."
    assert "Cancel 5 jobs of emails?" in page.text and text_of(page.text, "bulk-filter") == "task send_invoice"
    assert fields == {"csrf": client.cookies.get(CSRF_COOKIE), "queue": "emails", "action": "cancel", "state": "",
                      "task": "send_invoice", "group": "", "error": "", "since_ms": "", "until_ms": "", "count": "5"}
    before = dump_all(r)
    token = fields["csrf"]
    without = {k: v for k, v in fields.items() if k != "csrf"}
    for refused in (
        bulk(client, without),                                                      # no token
        bulk(client, {**fields, "csrf": token + "0"}),                              # not the cookie's
        bulk(client, without, headers={"x-csrf-token": token}),                     # a form's token is its field
        bulk(client, fields, headers={"origin": "http://evil.example"}),            # another origin
        bulk(client, fields, headers={"origin": "null"}),                           # an opaque one
        client.post("/bulk", json=fields, headers={"x-csrf-token": token}),         # not a form
    ):
        assert refused.status_code == 403, refused.text
        assert "refused" in text_of(refused.text, "bulk-message") or "CSRF" in text_of(refused.text, "bulk-message")
    client.cookies.set(CSRF_COOKIE, "attacker-nonce.0000")
    assert bulk(client, {**fields, "csrf": "attacker-nonce.0000"}).status_code == 403  # not signed here
    client.cookies.set(CSRF_COOKIE, token)
    assert dump_all(r) == before

    done = bulk(client, fields, headers={"origin": BASE})
    assert done.status_code == 200, done.text
    assert text_of(done.text, "bulk-result") == "cancelled 5 of 5 found"
    assert {i: q.get(i).state for i in [f"inv{n}" for n in range(5)] + ["rep0", "rep1"]} == {
        **{f"inv{n}": "done" for n in range(5)}, "rep0": "ready", "rep1": "ready"}
    assert q.stats().cancelled == 5
    # a script with the Bearer token needs no CSRF token (as the JSON actions)
    scripted = open_dashboard(r, token=TOKEN)
    answer = bulk(scripted, {**without, "task": "report", "count": "2"}, headers={"authorization": f"Bearer {TOKEN}"})
    assert text_of(answer.text, "bulk-result") == "cancelled 2 of 2 found" and q.stats().ready == 0


def test_a_bulk_action_never_acts_on_more_than_confirmed_and_counts_what_others_moved(
        r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    task_dead(q, "send_invoice", [f"t{i}" for i in range(5)], "TimeoutError: smtp {id}")
    task_dead(q, "send_invoice", ["v1", "v2"], "ValueError: no mailbox {id}")
    client = open_dashboard(r)
    page, fields = confirmation(client, queue="emails", action="replay", error="TimeoutError")
    assert (fields["count"], fields["state"], fields["error"]) == ("5", "dead", "TimeoutError")
    assert text_of(page.text, "bulk-filter") == "state dead, error TimeoutError"
    task_dead(q, "send_invoice", ["t5"], "TimeoutError: late")  # found after the confirmation
    before = dump_all(r)
    again = bulk(client, fields)
    assert again.status_code == 409
    assert "finds 6 jobs now, more than the 5 you confirmed: nothing was changed" in text_of(again.text, "bulk-message")
    assert dump_all(r) == before
    fields = {k: html.unescape(v) for k, v in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">',
                                                          again.text)}
    assert fields["count"] == "6"
    assert q.dead_replay(["t0"]) == 1  # another client moves one meanwhile
    done = bulk(client, fields)
    assert text_of(done.text, "bulk-result") == "replayed 5 of 6 found (1 moved meanwhile by others)"
    assert sorted(job.id for job in q.dead_list().jobs) == ["v1", "v2"]
    assert q.stats().replayed == 6


def test_bulk_purge_and_promote_act_on_exactly_the_jobs_found(r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    q.set_indexes(True)
    task_dead(q, "send_invoice", ["d1", "d2"], "ValueError: {id}")
    task_dead(q, "report", ["d3"], "ValueError: {id}")
    q.enqueue_many([NewJob(b"{}", job_id=f"s{i}", task="report", delay_ms=3_600_000) for i in range(3)])
    q.enqueue(b"{}", job_id="s-other", task="send_invoice", delay_ms=3_600_000)
    client = open_dashboard(r)
    _, fields = confirmation(client, queue="emails", action="purge", task="send_invoice")
    assert (fields["count"], fields["state"]) == ("2", "dead")  # purge finds dead jobs only
    assert text_of(bulk(client, fields).text, "bulk-result") == "purged 2 of 2 found"
    assert [q.get(i).state for i in ("d1", "d2", "d3", "s-other")] == ["unknown", "unknown", "dead", "scheduled"]
    _, fields = confirmation(client, queue="emails", action="promote", task="report")
    assert (fields["count"], fields["state"]) == ("3", "scheduled")
    assert text_of(bulk(client, fields).text, "bulk-result") == "promoted 3 of 3 found"
    for job_id, promoted in (("s0", True), ("s1", True), ("s2", True), ("s-other", False)):
        info = q.get(job_id)
        assert (info.due_ms <= info.now_ms) is promoted, job_id
    # a filter that finds nothing offers nothing to confirm
    page, fields = confirmation(client, queue="emails", action="purge", task="nothing")
    assert fields == {} and text_of(page.text, "bulk-count") == "The filter finds 0 jobs of emails now."


def test_since_and_until_are_the_servers_time_and_confirmed_as_ms(r: Any, open_dashboard: Any) -> None:
    from pyqueue.dashboard.search import SearchForm, parse_when

    noon = 1_795_953_600_000  # 2026-11-29 12:00:00 UTC
    assert parse_when("10:00", "since", noon) == noon - 2 * 3_600_000  # today by the clock given
    assert parse_when("2026-11-29T10:00", "since", None) == noon - 2 * 3_600_000  # datetime-local: UTC
    assert parse_when("2026-11-29T11:00+01:00", "since", None) == noon - 2 * 3_600_000
    assert not SearchForm(since="2026-11-29T10:00").needs_clock() and SearchForm(until="9:30").needs_clock()
    q = Queue("emails", r)
    q.enqueue(b"{}", job_id="j1")
    client = open_dashboard(r)
    _, fields = confirmation(client, queue="emails", action="cancel", since="00:00", until="23:59:59")
    now_ms = q.peek().now_ms
    midnight = now_ms - now_ms % 86_400_000
    assert (fields["since_ms"], fields["until_ms"], fields["count"]) == (
        str(midnight), str(midnight + 86_399_000), "1")


def test_a_read_only_dashboard_offers_no_action_and_refuses_every_post(r: Any, open_dashboard: Any) -> None:
    q = Queue("emails", r)
    q.set_indexes(True)
    task_dead(q, "send_invoice", ["d1", "d2"], "ValueError: {id}")
    q.enqueue_many([NewJob(b"{}", job_id=f"r{i}", task="send_invoice") for i in range(3)])
    writable = open_dashboard(r)
    _, fields = confirmation(writable, queue="emails", action="cancel", task="send_invoice")
    client = open_dashboard(r, read_only=True)
    token = csrf_of(client)
    home = client.get("/").text
    initial = json.loads(re.search(r'<script type="application/json" id="initial">(.*?)</script>', home, re.S)
                         .group(1))  # type: ignore[union-attr]
    assert initial["config"]["actions"] == [] and initial["config"]["read_only"] is True
    assert "data-action=" not in home and 'id="search-form"' in home  # searching is reading
    found = client.get("/search", params={"queue": "emails", "task": "send_invoice"})
    assert found.status_code == 200 and len(rows_of(found.text)) == 5 and 'id="bulk-actions"' not in found.text
    before = dump_all(r)
    refused, form = confirmation(client, 403, queue="emails", action="cancel", task="send_invoice")
    assert form == {} and "read-only" in text_of(refused.text, "bulk-message")
    answer = bulk(client, {**fields, "csrf": token})
    assert answer.status_code == 403 and "read-only" in text_of(answer.text, "bulk-message")
    for action, body in (("dead_replay", {"all": True}), ("dead_purge", {"ids": ["d1"]}), ("cancel", {"ids": ["r1"]}),
                         ("pause", {})):
        assert post(client, "emails", action, body, token).status_code == 403
    scripted = open_dashboard(r, read_only=True, token=TOKEN)  # a Bearer token is no way round it
    assert bulk(scripted, fields, headers={"authorization": f"Bearer {TOKEN}"}).status_code == 403
    assert dump_all(r) == before
