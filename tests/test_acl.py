"""Least privilege: an ACL recipe for the three roles that use a queue (producer, worker,
admin), proven on a real redis-server (fakeredis does not enforce ACLs).

What a Redis ACL can and cannot bound, and so how the recipe is built:

* A script runs with its caller's permissions: Redis checks the keys ``EVALSHA`` declares
  and then every command the script calls, with the keys it names. So a role holds the
  commands *inside* the scripts it runs, plus the few commands the driver sends itself.
* ACLs bound commands and keys, not scripts. Any role may run any script whose commands
  it holds (the worker's commands cover ``enqueue``'s). The recipe is therefore checked
  to be *closed*: a script outside a role's work either runs whole or is refused before
  it writes anything. That needs care: Redis never rolls a script back, so a role
  missing a command a script calls only after its first write would leave it half done
  (a worker without ZCARD running ``dead_purge``, for one).
* ACL key patterns are globs. ``{`` and ``}`` are literal there, so ``~pq:{emails}:*``
  is exactly the keys of queue ``emails``; but ``*``, ``?``, ``[``, ``]`` and ``\\``,
  which queue names may contain, must be escaped with a backslash.

The server is this module's own (the users must not leak into other tests); ``default``
stays unrestricted and prepares the data.
"""

from __future__ import annotations

import logging
import re
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer, require_redis_server
from helpers import T0, busy_queue, calls_touching_every_key, dump_all, restore_all

from pyqueue.protocol.core import enqueue_call, stats_call
from pyqueue import Job, NewJob, Outcome, Queue, QueueFull, ScriptError
from pyqueue.protocol.keys import QueueKeys, ServiceKeys
from pyqueue.drivers.clients import check_server, forget_server_checks
from pyqueue.drivers.scripts import SCRIPT_KEYS, lua_source
from pyqueue.ops.service import Services
from pyqueue.worker import Retry, Worker
from pyqueue.drivers.queue import transport_of

#: The recipe, as README.md gives it: queue ``emails``, service namespace ``workers``,
#: prefix ``pq``. ``reset`` clears earlier rules (passwords, keys, channels, commands:
#: it implies ``resetkeys`` and ``-@all``); ``resetchannels`` also holds when
#: ``acl-pubsub-default`` is ``allchannels``.
RECIPE = """\
ACL SETUSER pq-producer reset on >producer-secret resetchannels ~pq:{emails}:* -@all +ping +evalsha +script|load +script|exists +multi +exec +time +type +hget +hmget +hset +hsetnx +hincrby +rpush +lindex +llen +zadd +zcard +zcount +zrange +zmscore +xread +xrevrange +zscore +hexists +xadd "(~pq:{emails}:flows ~pq:{emails}:flow_expiry ~pq:{emails}:keyed ~pq:{emails}:windows ~pq:{emails}:expires ~pq:{emails}:meta ~pq:{emails}:index +zrangebyscore +hdel +zrem)"
ACL SETUSER pq-worker reset on >worker-secret resetchannels ~pq:{emails}:* ~pq:{workers}:service:* -@all +ping +evalsha +script|load +bzpopmin +time +type +exists +get +incr +pexpire +persist +del +hget +hmget +hexists +hset +hsetnx +hincrby +hdel +llen +lrange +ltrim +lpop +lpush +rpush +lrem +zadd +zrem +zscore +zcard +zcount +zrange +zrangebyscore +zrangebylex +zlexcount +zremrangebyrank +zremrangebylex +xadd +zmscore
ACL SETUSER pq-admin reset on >admin-secret resetchannels ~pq:{emails}:* ~pq:{workers}:service:* -@all +ping +evalsha +script|load +time +type +pexpire +pttl +hget +hgetall +hmget +hexists +hset +hsetnx +hincrby +hdel +rpush +lpush +lindex +llen +lrange +lrem +zadd +zrem +zscore +zmscore +zrank +zscan +hscan +zcard +zcount +zrange +zrangebyscore +zrangebylex +zlexcount +zremrangebyrank +xrevrange +xadd +xtrim +xlen +xrange +xread
"""

ROLES = ("producer", "worker", "admin")

#: The scripts each role runs through the driver.
ROLE_SCRIPTS: dict[str, tuple[str, ...]] = {
    # flow_record: a flow's sender keeps its record before sending its steps.
    # signal: a webhook or an approval screen signals a task waiting for it.
    "producer": ("enqueue", "stats", "result", "flow_wait", "flow_record", "signal"),
    "worker": (
        # enqueue: the periodic jobs a worker's schedules enqueue (pyqueue.ops.schedules).
        "enqueue", "lease", "ack", "ack_result", "nack", "extend", "release", "promote", "scrub", "peek",
        "service_register", "service_renew", "service_deregister",
        # flow_done: the end of a flow's step, reported by its worker and by flow checks.
        "flow_done",
        # progress: a running task's current_job().progress(...); step, park, steps: its
        # durable steps, sleeps and waits (current_job().step, .sleep, .wait_signal).
        "progress", "step", "park", "steps",
        # defer_key: a running task holds its rate key after a downstream's 429
        # (current_job().defer_key).
        "defer_key",
    ),
    "admin": ("stats", "get", "result", "cancel", "limit", "set_group_limit", "groups", "pause", "resume", "dead_list", "dead_replay", "dead_purge", "service_stop",
              # flow_show: `pyqueue flow show` and the dashboard's flow view; progress_show:
              # the running jobs' progress (Queue.progress_of); browse: the dashboard's
              # Jobs panel (Queue.browse), the only script of the role that calls LRANGE.
              "flow_show", "progress_show", "browse",
              # set_events: opting a queue in to its event stream (Queue.set_events).
              "set_events",
              # steps: a job's durable steps (pyqueue job, the dashboard's job view).
              "steps",
              # sequence_skip: letting a sequence blocked by its dead head go on.
              "sequence_skip",
              # set_rate_limit: a rate key's limit at run time (pyqueue limit QUEUE RATE --key).
              "set_rate_limit",
              # set_budget: a queue's byte budget (pyqueue budget QUEUE SIZE).
              "set_budget",
              # set_result_budget: a queue's results budget (pyqueue budget QUEUE SIZE --results).
              "set_result_budget",
              # set_tombstone_limit: a queue's tombstone limit (pyqueue tombstones QUEUE N|off).
              "set_tombstone_limit",
              # set_indexes, search, promote_now: finding jobs by task, group, state or
              # error (Queue.search, pyqueue.ops.find) and running scheduled ones now; the
              # only scripts of the role that call HSCAN, ZRANK and ZMSCORE (search).
              "set_indexes", "search", "promote_now"),
}

#: The commands each role's driver code sends itself, outside any script, and why.
SENT_BY_DRIVER: dict[str, dict[str, str]] = {
    "producer": {
        "ping": "redis-py health checks",
        "evalsha": "every script call",
        "script|load": "reload after NOSCRIPT (a restart, failover or SCRIPT FLUSH)",
        "script|exists": "a pipeline checks its scripts are loaded before sending them",
        "multi": "transactional pipelines (redis-py's default)",
        "exec": "transactional pipelines",
        "hsetnx": "records the queue's partition count at a queue object's first call",
        "hget": "reads the recorded partition count back",
        "xread": "wait_result blocks on the queue's finished stream",
    },
    "worker": {
        "ping": "redis-py health checks",
        "evalsha": "every script call",
        "script|load": "reload after NOSCRIPT",
        "bzpopmin": "the idle wait on the queues' and its own wake keys",
        "hmget": "reads its service key before a blocking wait: stopped, or registration lost?",
        "get": "the namespace's last id, before registering",
        "hget": "a re-sent registration recognises its own token; the recorded partition count",
        "hsetnx": "records the queue's partition count at start",
        "time": "flow checks: which checks of waiting jobs are due (pyqueue.worker.flows)",
        "zrangebyscore": "flow checks: the waiting jobs whose check is due",
        "zrangebylex": "flow checks: what each waiting job still waits for",
    },
    "admin": {
        "hsetnx": "records the queue's partition count at a queue object's first call",
        "hget": "reads the recorded partition count back (pyqueue commands open queues with it)",
        "ping": "redis-py health checks",
        "evalsha": "every script call",
        "script|load": "reload after NOSCRIPT",
        "time": "Services.list: which services are alive",
        "zrange": "Services.list: the expiry zset",
        "hgetall": "Services.list: the queues hash and each service key",
        "xrange": "Queue.events: a page of the queue's event stream",
        "xrevrange": "Queue.events(since='now'): the stream's newest event",
        "xread": "Queue.events(block_ms=...): waits for the next events",
    },
}

#: Granted although no script of the role needs them, to keep the recipe closed. A
#: script whose other commands a role holds must not stop half-way on a refused one:
#: dead_replay and dead_purge call nothing a worker lacks but ZCARD, after their
#: writes; service_renew calls nothing an admin lacks but ZRANGEBYSCORE, after its
#: writes; service_deregister nothing an admin lacks but LREM, after its first DEL;
#: ack_result nothing an admin lacks but XADD, after the ack's writes.
CLOSURE: dict[str, set[str]] = {"producer": set(), "worker": {"zcard"}, "admin": {"zrangebyscore", "lrem", "xadd"}}

QUEUE, NAMESPACE = "emails", "workers"
QUEUE_KEYS = QueueKeys("pq", QUEUE)
PASSWORDS = {role: f"{role}-secret" for role in ROLES}


def raw(client: redis.Redis, *args: Any) -> Any:
    """Send one command as it is (redis-py leaves ``execute_command`` untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def recipe_lines() -> dict[str, list[str]]:
    """Each role's ``ACL SETUSER`` line of :data:`RECIPE`, split into arguments as
    redis-cli splits them (a quoted selector is one argument)."""
    lines = {}
    for line in RECIPE.splitlines():
        words = shlex.split(line)
        assert words[:2] == ["ACL", "SETUSER"] and words[2].startswith("pq-")
        lines[words[2][3:]] = words
    return lines


def granted(role: str) -> set[str]:
    """The commands the recipe grants ``role`` (its ``+command`` rules, a selector's
    ``(~keys +command ...)`` included: those only on the selector's keys)."""
    words = [inner for word in recipe_lines()[role] for inner in word.strip("()").split()]
    return {word[1:].lower() for word in words if word.startswith("+")}


def script_commands(name: str) -> set[str]:
    """Every command ``lua/<name>.lua`` calls, lower case (read from the source).

    The include block holds exactly the helpers the script calls (lua/build.py), so
    every command in the file counts.
    """
    source = lua_source(name)
    # Every other redis.call is the body of call_chunked, whose commands are counted where it is called.
    dynamic = re.findall(r"redis\.p?call\((?!')([^,]*),", source)
    assert set(dynamic) <= {"cmd"}, f"{name}.lua calls a command this test cannot read: {dynamic}"
    code = re.sub(r"--.*", "", source.split("\n]]\n", 1)[1])  # no header, no comments
    found = set(re.findall(r"redis\.p?call\('([A-Za-z]+)'", code) + re.findall(r"call_chunked\('([A-Za-z]+)'", code))
    return {c.lower() for c in found}


def acl_key_pattern(text: str) -> str:
    """``text`` as a literal prefix in an ACL key pattern: glob characters escaped.

    Braces need no escape (Redis globs have no brace expansion); ``*``, ``?``, ``[``,
    ``]`` and ``\\`` do, and queue names may contain them.
    """
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def is_permission_error(exc: BaseException | str) -> bool:
    """Whether ``exc`` (a pyqueue or redis-py error, or its text) is an ACL refusal: of
    a key declared by EVALSHA, of a command called inside a script, or of a command a
    selector grants called on a key outside it (the producer's HDEL, ZREM)."""
    text = str(exc)
    return "no permissions" in text or "can't run this command" in text or "can't access at least one of the keys" in text


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A redis-server of this module's own with the recipe's users (in a short
    temporary path: a unix socket path must stay under about 100 bytes)."""
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pyqueue-acl-") as tmp:
        server = RedisServer(Path(tmp))
        try:
            client = server.client()
            try:
                for words in recipe_lines().values():
                    assert raw(client, *words) in (b"OK", "OK", True)
            finally:
                client.close()
            yield server
        finally:
            server.stop()


@pytest.fixture
def root(acl_server: RedisServer) -> Iterator[redis.Redis]:
    """The unrestricted ``default`` user, on an empty server with an empty ACL LOG."""
    client = acl_server.client()
    client.flushall()
    client.script_flush()
    client.acl_log_reset()
    yield client
    client.close()


@pytest.fixture
def login(acl_server: RedisServer) -> Iterator[Callable[[str], redis.Redis]]:
    """Factory: ``login(role)`` -> a client authenticated as that role's user."""
    clients: list[redis.Redis] = []

    def make(role: str) -> redis.Redis:
        client = acl_server.client(username=f"pq-{role}", password=PASSWORDS[role])
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def denied_commands(root: redis.Redis) -> set[str]:
    """What the ACL LOG recorded as refused since the test started: command names, or
    key names for key refusals."""
    return {str(entry["object"]) for entry in root.acl_log()}


def dead_jobs(q: Queue, ids: list[str]) -> None:
    """Put jobs ``ids`` in DEAD (one attempt each, nacked)."""
    q.enqueue_many([NewJob(b"d", job_id=i, max_attempts=1) for i in ids])
    for job in q.lease(count=len(ids)):
        q.nack(job, "failed for good")


# -- the recipe ------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_the_recipe_grants_each_role_the_commands_of_its_scripts_and_calls_and_nothing_more(role: str) -> None:
    needed = set(SENT_BY_DRIVER[role]) | CLOSURE[role]
    for name in ROLE_SCRIPTS[role]:
        needed |= script_commands(name)
    assert granted(role) == needed, (
        f"missing: {sorted(needed - granted(role))}, not needed: {sorted(granted(role) - needed)}"
    )


def test_the_roles_together_run_every_script() -> None:
    assert set().union(*ROLE_SCRIPTS.values()) == set(SCRIPT_KEYS)


def test_acl_key_patterns_take_braces_literally_but_glob_characters_must_be_escaped(root: redis.Redis) -> None:
    def allowed(user: str, key: str) -> bool:
        return raw(root, "ACL", "DRYRUN", user, "GET", key) in (b"OK", "OK")

    try:
        raw(root, "ACL", "SETUSER", "glob-plain", "on", "nopass", "~pq:{a*}:*", "+get")
        raw(root, "ACL", "SETUSER", "glob-escaped", "on", "nopass", f"~{acl_key_pattern('pq:{a*}:')}*", "+get")
        raw(root, "ACL", "SETUSER", "braces", "on", "nopass", "~pq:{emails}:*", "+get")
        assert allowed("braces", "pq:{emails}:jobs")
        assert not allowed("braces", "pq:{emails2}:jobs") and not allowed("braces", "pq:emails:jobs")
        # Queue "a*": an unescaped pattern also hands over queue "ab"; an escaped one does not.
        assert allowed("glob-plain", "pq:{a*}:jobs") and allowed("glob-plain", "pq:{ab}:jobs")
        assert allowed("glob-escaped", "pq:{a*}:jobs") and not allowed("glob-escaped", "pq:{ab}:jobs")
    finally:
        raw(root, "ACL", "DELUSER", "glob-plain", "glob-escaped", "braces")


def test_acl_key_pattern_escapes_exactly_the_glob_characters() -> None:
    assert acl_key_pattern("pq:{emails}:") == "pq:{emails}:"
    assert acl_key_pattern("pq:{a*b?c[d]e\\f}:") == "pq:{a\\*b\\?c\\[d\\]e\\\\f}:"


# -- every permitted operation works ---------------------------------------------------


def test_a_producer_enqueues_pipelines_scripts_and_reads_stats(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    q = Queue(QUEUE, login("producer"))
    assert q.enqueue(b"one", job_id="one").added  # loads the script itself (NOSCRIPT first)
    assert [e.added for e in q.enqueue_many([NewJob(b"", job_id="one"), NewJob(b"", job_id="two")])] == [False, True]
    q.enqueue(b"later", job_id="later", delay_ms=60_000)
    root.script_flush()
    for transaction in (True, False):
        pipe = transport_of(q).client.pipeline(transaction=transaction)
        for i in range(3):
            transport_of(q).call(enqueue_call(q.spec.keys, None, [(f"p{transaction}{i}", b"x", 0, 3, "", "", "", "")]), client=pipe)
        transport_of(q).call(stats_call(q.spec.keys, None), client=pipe)
        replies = pipe.execute()
        assert [reply[0] for reply in replies[:3]] == [1, 1, 1]
    stats = q.stats()
    assert (stats.ready, stats.scheduled, stats.enqueued, stats.duplicates) == (8, 1, 9, 1)
    # At most the eviction-policy check a queue object makes once per process and server,
    # which the recipe leaves out on purpose: CONFIG GET would also show the passwords.
    assert denied_commands(root) <= {"config|get"}


def test_a_producer_debounces_throttles_and_sequences_under_its_acl_user(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    q = Queue(QUEUE, login("producer"))
    first = q.enqueue(b"v1", debounce_ms=60_000, key="d", group="g", expires_ms=120_000)
    # The merge takes the meta and the expiry the last send did not give (HDEL, ZREM).
    assert q.enqueue(b"v2", debounce_ms=60_000, key="d").by_key == "debounced"
    assert root.hget(q.spec.keys.meta, first.job_id) is None and root.zscore(q.spec.keys.expires, first.job_id) is None
    q.enqueue(b"t", throttle_ms=1, key="t")
    time.sleep(0.01)
    q.enqueue(b"t", throttle_ms=1, key="t2")  # trims the stale window of "t" (ZRANGEBYSCORE, HDEL, ZREM)
    assert root.zscore(q.spec.keys.windows, "t:t") is None
    assert [q.enqueue(b"s", sequence="o").added for _ in range(2)] == [True, True]
    assert q.stats().sequenced == 1
    assert denied_commands(root) <= {"config|get"}


def test_under_a_byte_budget_a_producer_sends_and_is_refused_and_a_worker_ends_sized_jobs(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    admin = Queue(QUEUE, login("admin"))
    assert admin.set_budget(10) is True
    producer = Queue(QUEUE, login("producer"))
    # A sized send writes its size to `keyed` and the sum to `counters`; a debounced one
    # reads the size it replaces.
    assert producer.enqueue(b"abc", job_id="b0").added
    producer.enqueue(b"de", debounce_ms=60_000, key="d")
    assert producer.enqueue(b"fgh", debounce_ms=60_000, key="d").by_key == "debounced"
    with pytest.raises(QueueFull):
        producer.enqueue(b"x" * 5)
    assert producer.stats().bytes == 6
    worker = Queue(QUEUE, login("worker"))
    (job,) = worker.lease()
    assert job.id == "b0" and worker.ack(job) is Outcome.OK
    assert admin.stats().bytes == 3 and root.hget(QUEUE_KEYS.keyed, "b:b0") is None
    assert admin.set_budget(None) is True
    assert denied_commands(root) <= {"config|get"}


def test_under_a_results_budget_a_worker_sizes_and_trims_results_and_a_producer_reads_them(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    admin = Queue(QUEUE, login("admin"))
    producer = Queue(QUEUE, login("producer"))
    worker = Queue(QUEUE, login("worker"))
    # Each result "<finished_ms>|" + "b" + 20 bytes: a budget of two.
    size = len(f"{int(root.time()[0]) * 1000}|") + 21
    assert admin.set_result_budget(2 * size) is True
    producer.enqueue_many([NewJob(b"", job_id=f"k{i}") for i in range(3)])
    # Under a budget ack_result reads, writes and deletes sizes in `keyed` (HMGET, HSET,
    # HDEL) and writes the sum and the flag to `counters` (HSET); the third result takes
    # the sum past the budget, so the call also reads the oldest results (ZRANGE) and
    # deletes the first (HDEL, ZREM).
    for job in worker.lease(count=3):
        assert worker.ack_result(job, b"r" * 20, result_ttl_ms=3_600_000) is Outcome.OK
    assert [producer.result(f"k{i}").state for i in range(3)] == ["done", "ok", "ok"]
    assert root.hget(QUEUE_KEYS.keyed, "rb:k0") is None and int(root.hget(QUEUE_KEYS.keyed, "rb:k2")) == size
    assert int(root.hget(QUEUE_KEYS.counters, "result_bytes")) == 2 * size
    assert admin.set_result_budget(None) is True
    assert denied_commands(root) <= {"config|get"}


def test_under_a_tombstone_limit_a_worker_and_an_admin_trim_tombstones_and_a_producer_sends_again(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    admin = Queue(QUEUE, login("admin"))
    producer = Queue(QUEUE, login("producer"))
    worker = Queue(QUEUE, login("worker"))
    assert admin.set_tombstone_limit(2) is True
    producer.enqueue_many([NewJob(b"", job_id=f"t{i}") for i in range(4)])
    # Under a limit every writer of tombstones counts `done` after its ZADD (ZCARD) and,
    # past the limit, deletes the earliest-expiring (ZREMRANGEBYRANK): the worker's ack,
    # ack_result and ack-and-lease, and the admin's cancel.
    t0, t1, t2 = worker.lease(count=3)
    assert worker.ack(t0) is Outcome.OK
    assert worker.ack_result(t1, b"r") is Outcome.OK
    outcome, _ = worker.ack_and_lease(t2, count=0)
    assert outcome is Outcome.OK
    assert admin.cancel("t3").state == "ready"
    assert root.zrange(QUEUE_KEYS.done, 0, -1) == [b"t2", b"t3"]
    # t0's tombstone went for room: its re-send is added again; t3's is kept.
    assert producer.enqueue(b"", job_id="t0").added is True
    assert producer.enqueue(b"", job_id="t3").added is False
    assert admin.set_tombstone_limit(None) is True
    assert denied_commands(root) <= {"config|get"}


def test_under_indexes_a_producer_sends_listed_jobs_a_worker_ends_them_and_an_admin_finds_and_promotes(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    admin = Queue(QUEUE, login("admin"))
    assert admin.set_indexes(True) is not None
    producer = Queue(QUEUE, login("producer"))
    # A listed send writes its entry to `keyed` and its members to `index`; a debounced one
    # removes the members of the send it replaces (ZREM on `index`).
    assert producer.enqueue(b"a", job_id="i0", task="mail.send", group="g").added
    producer.enqueue(b"d1", debounce_ms=60_000, key="d", task="mail.digest")
    assert producer.enqueue(b"d2", debounce_ms=60_000, key="d", task="mail.digest", group="g").by_key == "debounced"
    page = admin.search(group="g")
    assert sorted(j.state for j in page.jobs) == ["ready", "scheduled"]
    (later,) = [j.id for j in page.jobs if j.state == "scheduled"]
    assert admin.promote_now([later]) == [later]
    worker = Queue(QUEUE, login("worker"))
    (job,) = worker.lease()
    assert job.id == "i0" and worker.ack(job) is Outcome.OK
    assert [j.id for j in admin.search(task="mail.send").jobs] == []
    assert root.hget(QUEUE_KEYS.keyed, "x:i0") is None
    assert [(j.id, j.state) for j in admin.search(task="mail.digest").jobs] == [(later, "ready")]  # promoted
    assert admin.set_indexes(False) is None
    assert denied_commands(root) <= {"config|get"}


def test_a_producer_cannot_take_or_delete_jobs(root: redis.Redis, login: Callable[[str], redis.Redis]) -> None:
    Queue(QUEUE, root).enqueue(b"", job_id="j")
    q = Queue(QUEUE, login("producer"))
    before = dump_all(root)
    with pytest.raises(ScriptError, match="can't run this command"):
        q.lease()
    for command in (("LPOP", q.spec.keys.ready), ("HDEL", q.spec.keys.jobs, "j"), ("DEL", q.spec.keys.jobs)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw(transport_of(q).client, *command)
    assert dump_all(root) == before


def test_a_worker_serves_its_queue_end_to_end_under_its_acl_user(
    root: redis.Redis, login: Callable[[str], redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pyqueue")
    setup = Queue(QUEUE, root)
    # A dead service of the namespace holds a lease: the worker's renewal finds it, and
    # the worker scrubs it and forgets the service.
    dead = Services(root).register([QUEUE], expire_ms=1_000)
    setup.enqueue(b"", job_id="orphan")
    (orphan,) = Queue(QUEUE, root, owner=dead.owner).lease(lease_ms=600_000)
    setup.enqueue_many(
        [NewJob(b"", job_id="slow"), NewJob(b"", job_id="fails", max_attempts=1), NewJob(b"", job_id="retry")]
        + [NewJob(b"", job_id=f"plain{i}") for i in range(3)]
    )
    while root.exists(dead.keys.role("service")):
        time.sleep(0.02)  # the dead service's key expires after 1 s
    seen: dict[str, list[Job]] = {}
    deadlines_while_running: list[float] = []

    def handler(job: Job) -> None:
        seen.setdefault(job.id, []).append(job)
        if job.id == "slow":
            time.sleep(1.0)  # more than three 300 ms leases: the heartbeat extends it
            deadlines_while_running.append(root.zscore(setup.spec.keys.leased, job.receipt) or 0)
        elif job.id == "fails":
            raise ValueError("no good")
        elif job.id == "retry" and job.attempt == 1:
            raise Retry(delay_ms=50)

    worker = Worker(
        [QUEUE], handler, redis=login("worker"), concurrency=2, lease_ms=300, block_ms=2_000,
        renew_ms=200, expire_ms=2_000,
    )
    assert worker.run(burst=True, install_signal_handlers=False) == 0

    assert seen["orphan"][0].attempt == orphan.attempt + 1  # scrubbed: the attempt counted
    assert [job.attempt for job in seen["retry"]] == [1, 2]
    assert deadlines_while_running[0] > seen["slow"][0].deadline_ms  # extended
    stats = setup.stats()
    assert (stats.acked, stats.nacked, stats.dead, stats.scrubbed, stats.reclaimed) == (6, 2, 1, 1, 0)
    assert (stats.ready, stats.scheduled, stats.leased) == (0, 0, 0)
    # Deregistered, and the dead service forgotten: nothing of either is left.
    assert root.keys(f"pq:{{{NAMESPACE}}}:*") == [b"pq:{workers}:service:seq"]
    # The one refusal: the eviction-policy check's CONFIG GET, which the driver skips.
    assert denied_commands(root) <= {"config|get"}  # at most the skipped check (once per process)
    # Only the skipped eviction-policy check mentions a refusal, at INFO; nothing worse.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and is_permission_error(r.getMessage())]


def test_an_admin_reads_stats_manages_dead_letters_lists_and_stops_a_worker(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    dead_jobs(Queue(QUEUE, root), ["d0", "d1", "d2"])
    admin = login("admin")
    q, services = Queue(QUEUE, admin), Services(admin)
    assert q.stats().dead == 3
    assert sorted(job.id for job in q.dead_list().jobs) == ["d0", "d1", "d2"]
    assert q.dead_replay(["d0"]) == 1
    assert q.dead_purge(["d1"]) == 1
    assert q.dead_replay() == 1  # the oldest dead jobs: lists, then replays
    stats = q.stats()
    assert (stats.ready, stats.dead, stats.replayed, stats.purged) == (2, 0, 2, 1)

    release = threading.Event()
    worker = Worker(
        [QUEUE], lambda job: release.wait(10), redis=login("worker"), concurrency=3, grace_ms=100,
        block_ms=10_000,
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while q.stats().leased < 2:
            assert time.monotonic() < deadline, "the worker did not lease the two jobs"
            time.sleep(0.01)
        (info,) = services.list()
        assert info.alive and info.queues == [QUEUE]
        time.sleep(0.2)  # the worker is blocked in its idle wait (a free slot) by now
        assert services.stop(info.id)
        thread.join(5)
        assert not thread.is_alive(), "the stop did not wake the worker"
    finally:
        release.set()
        thread.join(15)
    assert "remote stop requested" in worker.exit_reason
    stats = q.stats()
    assert (stats.released, stats.ready, stats.leased) == (2, 2, 0)
    assert services.list() == []
    assert denied_commands(root) <= {"config|get"}  # at most the skipped check (once per process)


def test_queue_from_url_with_a_producers_credentials_works_and_skips_the_server_check(
    acl_server: RedisServer, root: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    root.config_set("maxmemory-policy", "allkeys-lru")  # the check would warn about this
    forget_server_checks()  # ask this server again, as a new process would
    try:
        q = Queue.from_url(f"unix://pq-producer:{PASSWORDS['producer']}@{acl_server.socket}", QUEUE)
        try:
            assert q.enqueue(b"x").added
            forget_server_checks()
            assert check_server(transport_of(q).client) == []
        finally:
            transport_of(q).client.close()
    finally:
        root.config_set("maxmemory-policy", "noeviction")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- everything else is refused --------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "call"),
    [
        ("producer", lambda q: q.enqueue(b"x")),
        ("producer", lambda q: q.stats()),
        ("worker", lambda q: q.lease()),
        ("worker", lambda q: q.scrub("workers.1")),
        ("admin", lambda q: q.dead_list()),
        ("admin", lambda q: q.dead_purge(["x"])),
    ],
    ids=["producer-enqueue", "producer-stats", "worker-lease", "worker-scrub", "admin-dead_list", "admin-dead_purge"],
)
def test_each_role_is_refused_another_queues_keys_with_a_clear_error(
    root: redis.Redis, login: Callable[[str], redis.Redis], role: str, call: Callable[[Queue], Any]
) -> None:
    Queue("other", root).enqueue(b"", job_id="theirs")
    before = dump_all(root)
    with pytest.raises(ScriptError, match="no permissions to access one of the keys") as raised:
        call(Queue("other", login(role)))
    assert isinstance(raised.value.__cause__, redis.exceptions.NoPermissionError)  # NOPERM
    assert dump_all(root) == before
    # Refused at the queue object's first call: the partition-count check, before any script.
    assert denied_commands(root) == {"pq:{other}:counters"}


def test_a_worker_started_on_a_queue_it_may_not_use_fails_before_it_registers(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    worker = Worker(["other"], lambda job: None, redis=login("worker"), block_ms=1_000)
    with pytest.raises(ScriptError, match="no permissions to access one of the keys"):
        worker.run(burst=True, install_signal_handlers=False)  # at its partition-count check
    assert root.keys(f"pq:{{{NAMESPACE}}}:*") == []


def test_a_worker_cannot_scrub_a_dead_service_of_a_queue_outside_its_keys_and_says_so(
    root: redis.Redis, login: Callable[[str], redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    """Workers of one namespace scrub each other's queues: give every worker of a
    namespace the same queues, or each group of workers its own namespace."""
    caplog.set_level(logging.WARNING, logger="pyqueue")
    dead = Services(root).register(["other"], expire_ms=1_000)
    other = Queue("other", root, owner=dead.owner)
    other.enqueue(b"", job_id="stuck")
    other.lease(lease_ms=600_000)
    Queue(QUEUE, root).enqueue(b"", job_id="mine")
    while root.exists(dead.keys.role("service")):
        time.sleep(0.02)

    def handler(job: Job) -> None:
        time.sleep(0.5)  # several heartbeats: renew finds the dead service and fails to scrub

    Worker([QUEUE], handler, redis=login("worker"), renew_ms=100, expire_ms=1_000).run(
        burst=True, install_signal_handlers=False
    )
    assert Queue(QUEUE, root).stats().acked == 1  # its own queue is served
    assert other.stats().leased == 1  # the dead service's lease is left to expire
    assert root.zscore(f"pq:{{{NAMESPACE}}}:service:expiry", str(dead.id)) is not None  # not forgotten
    warnings = [r.getMessage() for r in caplog.records if r.name == "pyqueue.worker"]
    assert warnings and all("heartbeat" in w and is_permission_error(w) for w in warnings), warnings


SERVER_COMMANDS = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("CONFIG", "GET", "maxmemory-policy"),
    ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
    ("SCRIPT", "FLUSH"),
    ("EVAL", "return 1", "0"),
    ("FUNCTION", "FLUSH"),
    ("ACL", "LIST"),
    ("INFO",),
    ("SELECT", "1"),
    ("SUBSCRIBE", "anything"),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("command", SERVER_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_each_role_is_refused_server_wide_commands(
    root: redis.Redis, login: Callable[[str], redis.Redis], role: str, command: tuple[str, ...]
) -> None:
    root.set("precious", "1")
    client = login(role)
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw(client, *command)
    assert root.get("precious") == b"1"
    assert root.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


# -- the recipe is closed: a script outside a role's work runs whole or not at all -------


def script_calls(root: redis.Redis) -> dict[str, tuple[str, Any, list[Any]]]:
    """A busy queue and a live service; per script variant, (script, keys, ARGV) that
    reads or writes every key it takes."""
    q = Queue(QUEUE, root)
    handles = busy_queue(q)
    now = T0 + 60
    calls: dict[str, tuple[str, Any, list[Any]]] = {
        name: (script, q.spec.keys, args) for name, (script, args) in calls_touching_every_key(q, handles).items()
    }
    calls["scrub"] = ("scrub", q.spec.keys, [now, q.spec.owner, 100])
    calls["peek"] = ("peek", q.spec.keys, [now])
    calls["get"] = ("get", q.spec.keys, [now, "held", 1])  # a leased job: its lease is found with ZSCAN
    calls["cancel"] = ("cancel", q.spec.keys, [now, "held", 0])  # a leased job: its lease is found with ZSCAN
    calls["limit"] = ("limit", q.spec.keys, [50, 1000, 1])
    calls["set_group_limit"] = ("set_group_limit", q.spec.keys, ["g", 3])
    calls["groups"] = ("groups", q.spec.keys, [0, 10])
    calls["pause"] = ("pause", q.spec.keys, [now])
    calls["resume"] = ("resume", q.spec.keys, [now])  # after pause: it finds the queue paused
    q.flow_wait(NewJob(b"", job_id="w0"), [(QUEUE, "r0"), (QUEUE, "r1")], now_ms=T0)
    calls["flow_wait"] = ("flow_wait", q.spec.keys, [now, "w1", b"", 3, "", "", 1000, "", f"{QUEUE}\tr0"])
    calls["flow_done"] = ("flow_done", q.spec.keys, [now, "w0", "fail", 1000, f"{QUEUE}\tr0", "ok"])  # still waits
    calls["flow_done_release"] = ("flow_done", q.spec.keys, [now, "w0", "continue", 1000, f"{QUEUE}\tr0", "ok", f"{QUEUE}\tr1", "ok"])
    q.flow_record("f0", b"{}", 1000, now_ms=T0)  # expired at now: the next record trims it
    calls["flow_record"] = ("flow_record", q.spec.keys, [now, "f1", b"{}", 60_000])
    calls["flow_show"] = ("flow_show", q.spec.keys, [now, "f1"])
    # busy_queue's progress of 'poison' and 'held': this call's trim reads both and
    # moves them (their leases are still in `leased`), then writes 'held''s.
    calls["progress"] = ("progress", q.spec.keys, [now, handles["held"].receipt, b"{}"])
    calls["progress_show"] = ("progress_show", q.spec.keys, ["held", "poison"])
    calls["set_events"] = ("set_events", q.spec.keys, [10])  # busy_queue opted in with 1000: this trims
    # Durable steps: a commit, a park (a wait: it ends the lease), a signal kept for a
    # wait to come, and the read of what the job kept.
    q.step(handles["held"], "s0", b"j0", lease_ms=600_000, now_ms=T0)
    calls["step"] = ("step", q.spec.keys, [now, handles["held"].receipt, 600_000, "s1", b"j1"])
    calls["park"] = ("park", q.spec.keys, [now, handles["held"].receipt, "wait", "w", 1000, 600_000])
    calls["signal"] = ("signal", q.spec.keys, [now, "held", "go", b"j1"])
    calls["steps"] = ("steps", q.spec.keys, [now, "held"])
    # A sequence whose head (s0) is dead, with a job behind it: the skip hands the key on.
    q.enqueue(b"", job_id="s0", sequence="seq", now_ms=T0)
    q.enqueue(b"", job_id="s1", sequence="seq", now_ms=T0)
    root.lrem(q.spec.keys.ready, 1, "s0")
    root.zadd(q.spec.keys.dead, {"s0": T0})
    calls["sequence_skip"] = ("sequence_skip", q.spec.keys, [now, "seq"])
    # Rate keys: a key's limit set at run time, and a running job's key deferred ('held' as
    # if it was sent with a rate key).
    calls["set_rate_limit"] = ("set_rate_limit", q.spec.keys, ["api", "5/1000/1"])
    root.hset(q.spec.keys.keyed, "r:held", "10/1000/2/1||api")
    calls["defer_key"] = ("defer_key", q.spec.keys, [now, handles["held"].receipt, 5000])
    # A byte budget, and sizes for 'held' and 'corpse' as if they were sent under it: every
    # send below is sized (HSET of `keyed`, HINCRBY of `counters`), and the scripts that
    # end those two take their sizes off (HMGET and HDEL of `keyed`, HINCRBY).
    root.hset(q.spec.keys.counters, mapping={"budget": 1_000_000, "bytes": 2, "sized": 1})
    root.hset(q.spec.keys.keyed, mapping={"b:held": 1, "b:corpse": 1})
    calls["set_budget"] = ("set_budget", q.spec.keys, [2_000_000])
    # A results budget that the ack_result below passes: a sized result of 'r0' kept (it
    # expires first) and the sum at the budget, so the call reads and takes off sizes
    # (HMGET, HDEL of `keyed`), trims 'r0' (ZRANGE, HDEL, ZREM) and writes its own size
    # and the sum (HSET of `keyed` and `counters`).
    root.hset(q.spec.keys.counters, mapping={"result_budget": 100, "result_bytes": 100, "rsized": 1})
    root.hset(q.spec.keys.results, "r0", f"{T0}|b" + "x" * 91)
    root.zadd(q.spec.keys.result_expiry, {"r0": T0 + 1000})
    root.hset(q.spec.keys.keyed, "rb:r0", 100)
    calls["set_result_budget"] = ("set_result_budget", q.spec.keys, [200])
    # A tombstone limit of 2 with two tombstones in force (busy_queue's ten expired ones
    # go first, by the trim of expired ones): every call here that writes a tombstone (the
    # acks, ack_result and ack-and-lease, and a cancel that keeps one) takes `done` past
    # the limit, so it counts it (ZCARD) and deletes the earliest-expiring, kept0
    # (ZREMRANGEBYRANK).
    root.hset(q.spec.keys.counters, "done_max", 2)
    root.zadd(q.spec.keys.done, {"kept0": now + 1, "kept1": now + 2})  # in force, expiring first
    calls["set_tombstone_limit"] = ("set_tombstone_limit", q.spec.keys, [5])
    calls["cancel_tombstoned"] = ("cancel", q.spec.keys, [now, "held", 300_000])
    # Indexes, and index entries for 'held' and 'corpse' as if they were sent while the
    # queue kept them: every send below with a task or a group is listed (HSET of `keyed`,
    # ZADD of `index`), and the scripts that end those two remove their members (HMGET
    # and HDEL of `keyed`, ZREM of `index`). search reads by task (ZLEXCOUNT,
    # ZRANGEBYLEX), by state (ZCOUNT, ZRANGEBYSCORE, ZRANK past a cursor) and over every
    # job (HSCAN); promote_now makes 'due' due earlier than its time.
    root.hset(q.spec.keys.counters, mapping={"indexes": T0, "indexed": 1})
    root.hset(q.spec.keys.keyed, mapping={"x:held": f"{T0}\n\nt", "x:corpse": f"{T0}\ng\nt"})
    root.zadd(q.spec.keys.index, {f"t\nt\n{T0:015d}\nheld": 0, f"t\nt\n{T0:015d}\ncorpse": 0,
                                  f"g\ng\n{T0:015d}\ncorpse": 0})
    calls["set_indexes"] = ("set_indexes", q.spec.keys, [now, 0])
    calls["search_task"] = ("search", q.spec.keys, [now, "", "t", "", "", "", "", "", 10])
    calls["search_dead"] = ("search", q.spec.keys, [now, "dead", "", "", "", "", "", "", 1])
    calls["search_dead_page_2"] = ("search", q.spec.keys, [now, "dead", "", "", "", "", "", f"d{T0}\ncorpse", 1])
    calls["search_any"] = ("search", q.spec.keys, [now, "", "", "", "", "", "", "", 10])
    calls["promote_now"] = ("promote_now", q.spec.keys, [T0, "due"])
    for state in ("ready", "scheduled", "running", "done"):
        calls[f"browse_{state}"] = ("browse", q.spec.keys, [now, state, 0, 10])
    live = Services(root).register([QUEUE], now_ms=T0)
    ns = ServiceKeys("pq", NAMESPACE)
    calls["service_register"] = (
        "service_register", ns.of(live.id + 1), [now, live.id + 1, "host", 1, QUEUE, 60_000, 1000, 10, "token", "reg"]
    )
    calls["service_renew"] = ("service_renew", live.keys, [now, live.id, live.renewal, "next", 60_000, 20])
    calls["service_stop"] = ("service_stop", live.keys, [now, live.id, ""])
    calls["service_deregister"] = ("service_deregister", live.keys, [now, live.id, 0, live.registration])
    return calls


@pytest.mark.parametrize("role", ROLES)
def test_every_script_run_by_a_role_either_runs_whole_or_is_refused_before_writing(
    root: redis.Redis, login: Callable[[str], redis.Redis], role: str
) -> None:
    calls = script_calls(root)
    snapshot = dump_all(root)
    q = Queue(QUEUE, login(role))
    ran: set[str] = set()
    for variant, (script, keys, args) in calls.items():
        restore_all(root, snapshot)
        try:
            transport_of(q).run(script, keys, args)
        except redis.RedisError as exc:
            assert is_permission_error(exc), f"{role} running {variant}: {exc}"
            assert dump_all(root) == snapshot, f"{role} running {variant} wrote before it was refused"
        else:
            ran.add(script)
    assert set(ROLE_SCRIPTS[role]) <= ran


def test_a_role_missing_a_command_dead_replay_reads_is_refused_before_anything_moves(
    acl_server: RedisServer, root: redis.Redis
) -> None:
    """dead_replay reads ZCARD before its first write, so a user without ZCARD is refused
    with nothing written (Redis does not roll a script back: reads must come first)."""
    dead_jobs(Queue(QUEUE, root), ["d0"])
    line = recipe_lines()["worker"]
    try:
        raw(root, *["ACL", "SETUSER", "worker-without-zcard"] + line[3:] + ["-zcard"])
        client = acl_server.client(username="worker-without-zcard", password=PASSWORDS["worker"])
        try:
            with pytest.raises(ScriptError, match="can't run this command"):
                Queue(QUEUE, client).dead_replay(["d0"])
        finally:
            client.close()
        stats = Queue(QUEUE, root).stats()
        assert (stats.dead, stats.ready, stats.replayed) == (1, 0, 0)  # refused before writing
    finally:
        raw(root, "ACL", "DELUSER", "worker-without-zcard")


def test_a_worker_user_gets_the_usual_outcomes_from_every_fenced_call(
    root: redis.Redis, login: Callable[[str], redis.Redis]
) -> None:
    Queue(QUEUE, root).enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)])
    q = Queue(QUEUE, login("worker"))
    a, b, c = q.lease(count=3, lease_ms=60_000)
    assert q.ack(a) is Outcome.OK and q.ack(a) is Outcome.GONE
    assert [e.outcome for e in q.extend([b], 120_000)] == [Outcome.OK]
    assert q.release([b]) == [Outcome.OK] and q.release([b]) == [Outcome.STALE]
    assert q.nack(c, "e", delay_ms=0).outcome is Outcome.OK
    assert q.promote().promoted == 1
    # At most the eviction-policy check a queue object makes once per process and server,
    # which the recipe leaves out on purpose: CONFIG GET would also show the passwords.
    assert denied_commands(root) <= {"config|get"}
