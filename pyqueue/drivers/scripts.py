"""The blocking transport of the script calls that plans (:mod:`pyqueue.protocol.core`) yield.

The script ABI itself, one builder per ``lua/*.lua`` with keys and arguments in the
order its header lists them, is in :mod:`pyqueue.protocol.core`. :class:`Scripts` registers every script on one redis-py client with
``register_script`` (its SHA1 and exact source) and calls it with ``EVALSHA``. A call
answered ``NOSCRIPT`` (the server lost its script cache: a restart, a failover,
``SCRIPT FLUSH``) loads the script (``SCRIPT LOAD`` of its exact source) and is sent
again, for as long as the answer is NOSCRIPT, up to :data:`NOSCRIPT_RELOADS` loads; past
that it raises :class:`~pyqueue.protocol.errors.ScriptNotLoaded`, naming the script. Replies are
returned raw (lists of bytes and ints); the plans parse them.
:meth:`Scripts.execute` raises pyqueue errors (mapped); :meth:`Scripts.run` and
:meth:`Scripts.call` raise redis-py's own (tests and tools).

On a Redis Cluster, redis-py follows MOVED and ASK, but gives up on the answers of a
cluster in motion within about half a second: TRYAGAIN (a multi-key call during a slot
migration, which pyqueue's scripts are: they declare keys that are often absent),
CLUSTERDOWN and a slot not covered (during a failover), and a node it cannot reach.
:meth:`Scripts.run` keeps re-sending such a call with capped backoff for
``weather_budget_s`` (30 s by default). That is safe: TRYAGAIN and CLUSTERDOWN mean the
script did not run, and every script is replay-safe for the cases where it may have.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script

from pyqueue.drivers.clients import Client, is_cluster, node_for_key
from pyqueue.drivers.coalescing import ThreadBatcher
from pyqueue.protocol.core import (
    Arg,
    Keys,
    Pipelined,
    ScriptCall,
    Step,
    coalescable,
    enqueue_weight,
    merge_enqueues,
    split_enqueue_reply,
)
from pyqueue.protocol.errors import ContractMismatch, NotReplicated, ScriptError, ScriptNotLoaded, map_redis_error


#: The version of the scripts' contract (the KEYS and ARGV of every script, lua/README.md
#: section 10) this driver is written for: the one number to change with the scripts.
#: Every script's header states it (a line ``Contract v5``), :class:`ScriptTable` refuses
#: scripts whose header states another, and a script called with other counts of KEYS or
#: ARGV answers ``PQ_CONTRACT <script> expects ... (contract v5), got ...``.
CONTRACT_VERSION = 6
_CONTRACT_LINE = re.compile(r"^Contract v(\d+)\b", re.M)


def contract_version(source: str) -> int | None:
    """The contract version a script's header comment states, or None if it states none."""
    m = _CONTRACT_LINE.search(source.split("\n]]\n", 1)[0])
    return int(m.group(1)) if m else None


#: The keys each script takes, by role, in header order (tests compare with the headers).
SCRIPT_KEYS: dict[str, tuple[str, ...]] = {
    "enqueue": ("jobs", "ready", "scheduled", "counters", "wake", "done", "meta", "gready", "ring", "groups", "events",
                "keyed", "windows", "expires", "sequenced", "index"),
    "lease": ("jobs", "ready", "scheduled", "leased", "owners", "dead", "errors", "counters", "wake", "done",
              "meta", "gready", "ring", "groups", "events", "steps", "waiting", "expires", "expired", "keyed", "sequenced",
              "windows", "index"),
    "ack": ("jobs", "leased", "owners", "done", "wake", "meta", "gready", "ring", "groups", "counters", "events",
            "steps", "waiting", "scheduled", "keyed", "sequenced", "index"),
    "ack_result": ("jobs", "leased", "owners", "done", "results", "result_expiry", "finished", "wake",
                   "meta", "gready", "ring", "groups", "counters", "events", "steps", "waiting", "scheduled", "keyed",
                   "sequenced", "index"),
    "nack": ("jobs", "scheduled", "leased", "owners", "dead", "errors", "counters", "wake", "finished",
             "meta", "gready", "ring", "groups", "events", "keyed", "sequenced"),
    "extend": ("jobs", "leased"),
    "release": ("jobs", "ready", "leased", "owners", "counters", "wake", "meta", "gready", "ring", "groups", "events"),
    "promote": ("jobs", "ready", "scheduled", "leased", "owners", "dead", "errors", "counters", "wake",
                "meta", "gready", "ring", "groups", "events", "keyed", "sequenced"),
    "stats": ("jobs", "ready", "scheduled", "leased", "dead", "counters", "done", "gready", "ring", "waiting",
              "sequenced"),
    "peek": ("ready", "scheduled", "leased", "counters", "gready", "ring"),
    "get": ("jobs", "scheduled", "leased", "dead", "errors", "done", "waiting", "expired", "keyed"),
    "result": ("jobs", "dead", "errors", "done", "results", "result_expiry", "finished"),
    "cancel": ("jobs", "ready", "scheduled", "leased", "owners", "dead", "errors", "counters", "done", "wake",
               "meta", "gready", "ring", "groups", "events", "steps", "waiting", "expires", "keyed", "sequenced",
               "index"),
    "limit": ("counters", "wake"),
    "set_group_limit": ("counters", "wake", "ring", "groups"),
    "set_rate_limit": ("keyed",),
    "set_budget": ("counters",),
    "set_result_budget": ("counters",),
    "set_tombstone_limit": ("counters",),
    "set_indexes": ("counters",),
    "search": ("jobs", "ready", "scheduled", "leased", "dead", "errors", "counters", "index", "keyed", "waiting",
               "gready"),
    "promote_now": ("jobs", "scheduled", "waiting", "wake"),
    "defer_key": ("leased", "keyed", "windows"),
    "groups": ("gready", "ring", "groups"),
    "pause": ("counters",),
    "resume": ("counters", "wake"),
    "dead_list": ("jobs", "dead", "errors"),
    "dead_replay": ("jobs", "ready", "dead", "errors", "counters", "wake", "meta", "gready", "ring", "groups", "events"),
    "dead_purge": ("jobs", "dead", "errors", "counters", "meta", "steps", "waiting", "scheduled", "wake", "keyed",
                   "sequenced", "index"),
    "sequence_skip": ("dead", "counters", "events", "scheduled", "wake", "keyed", "sequenced"),
    "scrub": ("jobs", "ready", "leased", "owners", "dead", "errors", "counters", "wake", "meta", "gready", "ring", "groups",
              "events", "scheduled", "keyed", "sequenced"),
    "flow_wait": ("jobs", "scheduled", "counters", "done", "meta", "fwait", "fpending", "events", "keyed", "index"),
    "flow_done": ("jobs", "scheduled", "wake", "fwait", "fpending"),
    "flow_record": ("flows", "flow_expiry"),
    "flow_show": ("flows", "flow_expiry"),
    "browse": ("jobs", "ready", "scheduled", "leased", "done", "results", "result_expiry", "gready"),
    "progress": ("leased", "progress", "progress_at", "counters", "events"),
    "progress_show": ("leased", "progress"),
    "set_events": ("counters", "events"),
    "step": ("jobs", "leased", "steps", "waiting", "counters", "events"),
    "park": ("jobs", "scheduled", "leased", "owners", "steps", "waiting", "counters", "wake",
             "meta", "gready", "ring", "groups", "events"),
    "signal": ("jobs", "scheduled", "dead", "steps", "waiting", "counters", "wake", "events"),
    "steps": ("steps",),
    "service_register": ("seq", "ids", "expiry", "queues", "service"),
    "service_renew": ("service", "expiry", "queues"),
    "service_deregister": ("service", "ids", "expiry", "queues", "wake"),
    "service_stop": ("service", "wake"),
}


def lua_dir() -> Path:
    """The directory holding the ``*.lua`` files.

    In a wheel they are shipped inside the package (``pyqueue/lua``); in a source or
    editable checkout they are the repository's top-level ``lua/``.
    """
    packaged = Path(str(resources.files("pyqueue"))) / "lua"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "lua"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("pyqueue's lua/ scripts are missing from this installation")


def lua_source(name: str, directory: Path | None = None) -> str:
    """The source text of ``lua/<name>.lua``, byte for byte as other languages load it
    (from ``directory`` instead, for tests that load altered copies). The installed
    scripts are read once per process: a process that opens many queues (the metrics
    exporter, the dashboard) does not read 17 files for each."""
    if directory is None:
        return _installed_source(name)
    return (directory / f"{name}.lua").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _installed_source(name: str) -> str:
    return (lua_dir() / f"{name}.lua").read_text(encoding="utf-8")


#: What a cluster answers while it moves slots or fails over: the call did not run, or
#: ran at most once (replay-safe); send it again after a pause.
CLUSTER_WEATHER: tuple[type[Exception], ...] = (
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.ClusterError,  # "TTL exhausted": too many redirections in a row
    redis.exceptions.ConnectionError,  # a primary lost before its replica took over
    redis.exceptions.TimeoutError,
)
def _is_redirect_or_weather(reply: Exception) -> bool:
    """A reply that says "send it again elsewhere or later" rather than the script's own
    error: MOVED, ASK, TRYAGAIN, CLUSTERDOWN, a connection lost."""
    if isinstance(reply, (redis.exceptions.MovedError, redis.exceptions.AskError, *CLUSTER_WEATHER)):
        return True
    return str(reply).split(" ", 1)[0] in ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _node_pool() -> ThreadPoolExecutor:
    """Threads that send one pipeline per cluster primary at once (shared, created on
    first use; a pipeline's thread does nothing but wait for its replies)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(16, thread_name_prefix="pyqueue-nodes")
        return _pool


#: Scripts that write nothing: wait_replicas sends no WAIT after them.
READ_ONLY = frozenset({"stats", "peek", "dead_list", "get", "result", "flow_show", "progress_show", "browse", "groups",
                       "search"})

#: How long a cluster call keeps retrying weather before it raises.
DEFAULT_WEATHER_BUDGET_S = 30.0
#: How many times one call answered NOSCRIPT loads its script (``SCRIPT LOAD`` of its
#: exact source) and is sent again before it raises ScriptNotLoaded: the first load
#: follows a restart, failover or SCRIPT FLUSH; each further one a cache emptied again
#: between the load and the call (SCRIPT FLUSH in a loop, a failover storm). Both
#: drivers, every path (a call, a call followed by WAIT, a pipelined call sent again
#: alone), one server or a cluster.
NOSCRIPT_RELOADS = 5
_WEATHER_BACKOFF_CAP_S = 1.0


class Weather:
    """How long a cluster call keeps re-sending while the cluster is in motion: capped
    exponential pauses within a budget (0: no re-sending, as on one server)."""

    def __init__(self, budget_s: float) -> None:
        self.deadline, self.delay = time.monotonic() + budget_s, 0.01

    def pause(self) -> float:
        """The pause before sending again; called while handling the weather error, it
        re-raises that error once the budget is spent."""
        delay = self.delay
        if time.monotonic() + delay > self.deadline:
            raise  # noqa: PLE0704 - the weather error being handled
        self.delay = min(delay * 2, _WEATHER_BACKOFF_CAP_S)
        return delay


class ScriptTable:
    """What the blocking and the asyncio transports share: the scripts' key lists and
    the policies of ``wait_replicas`` and of re-sending.

    ``weather_budget_s``: on a cluster, how long a call keeps retrying TRYAGAIN,
    CLUSTERDOWN and lost nodes (see the module docstring). Unused on one server, where
    redis-py's own retry policy (:func:`pyqueue.drivers.clients.connect`) handles connections.

    ``wait_replicas`` (opt-in durability): after every script call that writes, send
    ``WAIT <wait_replicas> <wait_timeout_ms>`` on the same connection (pipelined with
    the call, so no extra round trip), and raise
    :class:`~pyqueue.protocol.errors.NotReplicated` when fewer replicas confirmed. What it gives:
    a call that returned had reached that many replicas, so a failover to one of them
    keeps it. What it does not: replication stays asynchronous (a replica that confirmed
    may itself be lost, and Redis may still elect a replica that had not: WAIT does not
    make Redis strongly consistent); it narrows the window in which an acknowledged
    write can be lost, and it costs the replicas' round trip on every write.
    """

    def __init__(
        self,
        client: Any,
        directory: Path | None = None,
        *,
        weather_budget_s: float = DEFAULT_WEATHER_BUDGET_S,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        coalesce: bool = False,
    ) -> None:
        self.client = client
        self.cluster = self.is_cluster(client)
        self.weather_budget_s = weather_budget_s
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.coalesce = coalesce
        sources = {name: lua_source(name, directory) for name in SCRIPT_KEYS}
        for name, source in sources.items():
            if contract_version(source) != CONTRACT_VERSION:
                raise ContractMismatch(
                    f"{name}.lua states contract v{contract_version(source)}, this driver speaks "
                    f"v{CONTRACT_VERSION}: install the scripts of its own version"
                )
        # Both redis-py clients register scripts alike (EVALSHA, reloaded on NOSCRIPT).
        self._scripts: dict[str, Any] = {name: client.register_script(source) for name, source in sources.items()}
        # (script, keys) -> the KEYS list: built once, not formatted on every call.
        self._key_lists: dict[tuple[str, Keys], list[str]] = {}

    @staticmethod
    def is_cluster(client: Any) -> bool:
        """Whether ``client`` is a cluster client (each transport knows its own)."""
        raise NotImplementedError

    def key_list(self, name: str, keys: Keys) -> list[str]:
        """The keys script ``name`` takes, in header order."""
        key_list = self._key_lists.get((name, keys))
        if key_list is None:
            key_list = self._key_lists[(name, keys)] = [keys.role(r) for r in SCRIPT_KEYS[name]]
        return key_list

    def waits(self, name: str) -> bool:
        """Whether a call of ``name`` is followed by WAIT."""
        return bool(self.wait_replicas) and name not in READ_ONLY

    def replicated(self, reply: Any, replicas: Any) -> Any:
        """The reply of a call followed by WAIT, once enough replicas confirmed it."""
        if isinstance(reply, Exception):
            raise reply
        if isinstance(replicas, Exception):
            # The call ran; WAIT itself failed: a primary demoted to a replica while the
            # WAIT blocked answers UNBLOCKED (a Sentinel failover), so nothing confirmed it.
            raise NotReplicated(f"the call ran, but its WAIT failed ({replicas}): send it again", 0, reply) from replicas
        if int(replicas) < self.wait_replicas:
            raise NotReplicated(
                f"the call ran, but {int(replicas)} of {self.wait_replicas} replicas confirmed it within "
                f"{self.wait_timeout_ms} ms: send it again, or accept that a failover may lose it",
                int(replicas),
                reply,
            )
        return reply

    @staticmethod
    def count_reload(name: str, reloads: int, noscript: Exception) -> int:
        """Called as a call of script ``name`` is answered NOSCRIPT after ``reloads``
        loads of it (both drivers' ``run``): the number of the load to make now, or,
        past :data:`NOSCRIPT_RELOADS`, :class:`ScriptNotLoaded` raised.

        Loading and sending again is safe: NOSCRIPT means the script did not run (the
        server found no script by that SHA1, so nothing was read or written), and every
        script is replay-safe anyway for the case where an earlier send did run."""
        if reloads >= NOSCRIPT_RELOADS:
            raise ScriptNotLoaded(
                f"script {name!r} (lua/{name}.lua): the server answered NOSCRIPT after each of {reloads} loads of "
                "it (SCRIPT LOAD, then the call again): something empties its script cache between the load and "
                "the call (SCRIPT FLUSH, failovers), or they reach different servers (a proxy). The script did "
                "not run: nothing was written, and the same call can be sent again",
                name,
                reloads,
            ) from noscript
        return reloads + 1

    @staticmethod
    def check_loaded(name: str, script: Any, answer: Any) -> None:
        """Check the SHA1 that ``SCRIPT LOAD`` answered for script ``name``: another than
        the one computed from its file means its bytes were changed on the way
        (lua/README.md section 1.1), and the call would never find it.

        Raises:
            ScriptError: the SHA1s differ.
        """
        loaded = answer.decode() if isinstance(answer, bytes) else str(answer)
        if loaded != script.sha:
            raise ScriptError(
                f"script {name!r}: SCRIPT LOAD answered SHA1 {loaded}, not {script.sha}, the SHA1 of "
                f"lua/{name}.lua: its bytes were changed on the way"
            )

    def resend(self, reply: Any) -> bool:
        """Whether a pipelined call's reply asks for the call to be sent again alone: a
        NOSCRIPT (a restarted or flushed server), or on a cluster a redirect or weather."""
        return isinstance(reply, redis.exceptions.NoScriptError) or (
            self.cluster and isinstance(reply, Exception) and _is_redirect_or_weather(reply)
        )


class Scripts(ScriptTable):
    """Every script registered on one blocking client (see :class:`ScriptTable` for
    the settings). Thread-safe as the client is."""

    client: Client

    def __init__(self, client: Client, directory: Path | None = None, **settings: Any) -> None:
        super().__init__(client, directory, **settings)
        self._enqueues: dict[Keys, ThreadBatcher[ScriptCall, Any]] = {}
        self._enqueues_lock = threading.Lock()

    @staticmethod
    def is_cluster(client: Any) -> bool:
        return is_cluster(client)

    def sha(self, name: str) -> str:
        """The SHA1 a script is called by (EVALSHA)."""
        return str(self._scripts[name].sha)

    def _enqueue_batcher(self, keys: Keys) -> ThreadBatcher[ScriptCall, Any]:
        batcher = self._enqueues.get(keys)
        if batcher is not None:
            return batcher
        with self._enqueues_lock:
            batcher = self._enqueues.get(keys)
            if batcher is None:

                def send(steps: list[ScriptCall]) -> list[Any]:
                    merged = merge_enqueues(steps)
                    return split_enqueue_reply(self.run("enqueue", merged.keys, merged.args), steps)

                batcher = self._enqueues[keys] = ThreadBatcher(send, enqueue_weight)
            return batcher

    def run(self, name: str, keys: Keys, args: Sequence[Arg], client: Any = None) -> Any:
        """Run script `name` with the keys its header lists and raw ARGV (tests, tools).

        ``client``: a pipeline to queue the call on instead (redis-py's ``Script``,
        which makes sure the script is loaded before the pipeline runs).

        Raises:
            ScriptNotLoaded: answered NOSCRIPT after every one of NOSCRIPT_RELOADS
                loads (see :meth:`ScriptTable.count_reload`).
        """
        script, key_list = self._scripts[name], self.key_list(name, keys)
        if client is not None:
            return script(keys=key_list, args=args, client=client)
        waits = self.waits(name)
        weather = Weather(self.weather_budget_s if self.cluster else 0.0)
        reloads, load = 0, False
        while True:
            try:
                if load:
                    # The exact source, on every primary of a cluster (redis-py sends
                    # SCRIPT LOAD to all of them): its SHA1 is the one sent.
                    self.check_loaded(name, script, self.client.script_load(script.script))
                    load = False
                if waits:
                    return self._run_and_wait(script, key_list, args)
                return self.client.evalsha(script.sha, len(key_list), *key_list, *args)
            except CLUSTER_WEATHER:
                time.sleep(weather.pause())
            except redis.exceptions.NoScriptError as exc:
                # Load it and send the same call again, as long as the answer is NOSCRIPT,
                # up to the bound. Safe: NOSCRIPT means the script did not run (nothing
                # was read or written), and every script is replay-safe anyway.
                reloads, load = self.count_reload(name, reloads, exc), True

    def _run_and_wait(self, script: Script, key_list: list[str], args: Sequence[Arg]) -> Any:
        """EVALSHA then WAIT, pipelined on one connection of the keys' server (WAIT
        counts the replicas that have this connection's writes). A NOSCRIPT answer is
        raised (NoScriptError) for :meth:`run` to load the script and send again."""
        node = node_for_key(self.client, key_list[0])
        pipe = node.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(key_list), *key_list, *args)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)  # type: ignore[no-untyped-call]
        reply, replicas = pipe.execute(raise_on_error=False)
        return self.replicated(reply, replicas)

    def run_pipelined(self, name: str, calls: Sequence[tuple[Keys, Sequence[Arg]]]) -> list[Any]:
        """Run script ``name`` once per (keys, ARGV) in ``calls``, in one round trip per
        server; one reply (or exception instance) per call, in order.

        redis-py's pipelines send ``SCRIPT EXISTS`` before every pipeline that holds a
        ``Script`` (a second round trip), and its cluster pipelines refuse ``EVALSHA``;
        so this sends plain ``EVALSHA`` on a pipeline of each primary, for the calls
        whose keys it holds. A call answered ``NOSCRIPT`` (a restarted or flushed
        server), or with a redirection or a cluster error (a slot moved meanwhile), is
        sent again alone through :meth:`run`, which loads the script (up to
        NOSCRIPT_RELOADS times: past that its reply is a ScriptNotLoaded), follows
        redirects and waits out weather. Use it for read-only or replay-safe scripts
        only: a call can be sent twice.
        """
        script = self._scripts[name]
        key_lists = [self.key_list(name, keys) for keys, _ in calls]
        groups: dict[int, tuple[redis.Redis, list[int]]] = {}  # one pipeline per server
        for i, key_list in enumerate(key_lists):
            node = node_for_key(self.client, key_list[0])
            groups.setdefault(id(node), (node, []))[1].append(i)
        replies: list[Any] = [None] * len(calls)

        def send(node: redis.Redis, indexes: list[int]) -> None:
            pipe = node.pipeline(transaction=False)
            for i in indexes:
                pipe.evalsha(script.sha, len(key_lists[i]), *key_lists[i], *calls[i][1])
            for i, reply in zip(indexes, pipe.execute(raise_on_error=False)):
                replies[i] = reply

        if len(groups) == 1:
            send(*next(iter(groups.values())))
        else:
            # Several primaries: their round trips overlap instead of adding up.
            for future in [_node_pool().submit(send, node, indexes) for node, indexes in groups.values()]:
                future.result()
        for i, reply in enumerate(replies):
            if self.resend(reply):
                try:
                    replies[i] = self.run(name, calls[i][0], calls[i][1])
                except (redis.exceptions.RedisError, ScriptNotLoaded) as exc:
                    replies[i] = exc
        return replies

    def call(self, step: ScriptCall, client: Any = None) -> Any:
        """Run one :class:`~pyqueue.protocol.core.ScriptCall`, raw (redis-py errors unmapped);
        ``client``: a pipeline to queue it on instead (tests, tools)."""
        return self.run(step.script, step.keys, step.args, client)

    def execute(self, step: Step) -> Any:
        """Run one step of a plan (:mod:`pyqueue.protocol.core`); redis-py errors are raised as
        pyqueue errors."""
        try:
            if self.coalesce and coalescable(step):
                return self._enqueue_batcher(step.keys).submit(step)
            if isinstance(step, ScriptCall):
                return self.run(step.script, step.keys, step.args)
            if isinstance(step, Pipelined):
                return self.run_pipelined(step.script, step.calls)
            pipe = node_for_key(self.client, step.key).pipeline(transaction=False)
            for command in step.commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            return pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise map_redis_error(exc) from exc
