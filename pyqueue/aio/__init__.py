"""The asyncio driver: the same verbs and promises as :class:`pyqueue.Queue`, awaited.

::

    from pyqueue.aio import AsyncQueue

    async with AsyncQueue.from_url("redis://localhost:6379/0", "emails") as q:
        added = await q.enqueue(b"hello", job_id="welcome:42")
        jobs = await q.lease()

Every verb is the plan the sync driver runs (:mod:`pyqueue.drivers.facade` declares
them; validation, ARGV, reply parsing: :mod:`pyqueue.protocol`), run by :class:`AsyncScripts` over
``redis.asyncio``: a one-server ``Redis``, a ``RedisCluster``, or (``redis=None``,
:func:`default_client`) a client of ``PYQUEUE_URL``'s server, else of the process-wide
embedded fakeredis, the same server the sync driver's embedded default uses. Delivery
semantics are those stated in :mod:`pyqueue.drivers.queue`, word for word: the scripts are the
same, and so is the code that calls them.

Tasks: one ``AsyncQueue`` may be shared by any number of tasks of one event loop (its
client's connection pool hands each concurrent call its own connection).

:func:`connect` builds a client from a URL as :func:`pyqueue.drivers.clients.connect` does, with
the same retry policy and timeouts; an ``AsyncQueue`` made by ``from_url`` owns its
client and closes it on ``aclose()`` or when its ``async with`` block ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar, Union

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.commands.core import AsyncScript

from pyqueue.drivers.clients import (
    URL_VARIABLE, claim_server_check, client_settings, default_url, embedded_server, eviction_problems, is_sentinel_url, log,
    parse_sentinel_url, redact_url, sentinel_master,
)
from pyqueue.protocol.core import (
    MAX_BATCH,
    Arg,
    AsyncDriver,
    Batching,
    Commands,
    Keys,
    Pipelined,
    Plan,
    ScriptCall,
    Step,
    coalescable,
    drive_async,
    enqueue_weight,
    merge_enqueues,
    split_enqueue_reply,
)
from pyqueue.protocol.errors import InvalidArgument, OutcomeUnknown, ScriptNotLoaded, map_redis_error
from pyqueue.protocol.models import Peeked
from pyqueue.drivers.facade import QueueFacade, physical, plans_of
from pyqueue.protocol.verbs.reading import peek_many as plan_peek_many
from pyqueue.drivers.scripts import CLUSTER_WEATHER, DEFAULT_WEATHER_BUDGET_S, SCRIPT_KEYS, ScriptTable, Weather, lua_source

I = TypeVar("I")
R = TypeVar("R")
T = TypeVar("T")

#: What the async driver accepts wherever it takes a client.
AsyncClient = Union[redis.asyncio.Redis, AsyncRedisCluster]

__all__ = [
    "AsyncClient", "AsyncQueue", "AsyncScripts", "check_partitions", "connect", "default_client", "drive",
    "embedded_redis", "peek_many", "physical_queue", "transport_of",
]


def embedded_redis() -> redis.asyncio.Redis:
    """An asyncio client of the process-wide embedded fakeredis server (the one
    :func:`pyqueue.drivers.clients.embedded_redis` talks to)."""
    import fakeredis

    client: redis.asyncio.Redis = fakeredis.FakeAsyncRedis(server=embedded_server())
    return client


def connect(url: str, **options: Any) -> AsyncClient:
    """An asyncio client configured as :func:`pyqueue.drivers.clients.connect` configures a
    blocking one, with the same URL schemes and options (``retries``,
    ``socket_timeout_s``, ``socket_connect_timeout_s``, ``cluster``). Connections open
    lazily, at the first call; only a plain ``redis://`` URL with ``cluster=None`` asks
    the server once, now and blocking, whether it is a cluster (pass
    ``redis+cluster://`` or ``cluster=`` to skip that). A ``redis+sentinel://`` URL gives
    a client of ``redis.asyncio.sentinel``, which asks the sentinels where the master is."""
    if url in ("embedded", "fakeredis://"):
        return embedded_redis()
    url, is_cluster, settings = client_settings(url, retry_class=AsyncRetry, **options)
    if is_sentinel_url(url):
        client: AsyncClient = sentinel_master(parse_sentinel_url(url), {**settings, "health_check_interval": 30}, asyncio=True)
        return client
    if is_cluster:
        return AsyncRedisCluster.from_url(url, **settings)
    # redis.asyncio retries on connection errors and timeouts by default.
    return redis.asyncio.Redis.from_url(url, **settings, health_check_interval=30)


def default_client() -> AsyncClient:
    """The client of an :class:`AsyncQueue` made without one, as
    :func:`pyqueue.drivers.clients.default_client` chooses for the sync driver: a client of the
    server named by ``PYQUEUE_URL`` (:func:`connect`), else of the embedded fakeredis;
    the choice is logged once per process. Unlike the sync default, each call makes a
    client of its own (an asyncio client's connections belong to the event loop that
    opened them, so one client cannot be shared by every queue of a process): the
    queue that asked for it owns it and closes it on ``aclose()``.

    Raises:
        InvalidArgument: ``PYQUEUE_URL`` is not a URL pyqueue can connect to.
    """
    url = default_url()
    if url == "embedded":
        return embedded_redis()
    try:
        return connect(url)
    except ValueError as exc:  # redis-py's word on a URL it cannot parse
        raise InvalidArgument(f"{URL_VARIABLE}={redact_url(url)!r}: {exc}") from exc


def _undecoded(client: AsyncClient) -> AsyncClient:
    """``client``, which must not decode replies (payloads are bytes)."""
    if isinstance(client, AsyncRedisCluster):
        decodes = client.get_connection_kwargs().get("decode_responses")
    else:
        decodes = client.connection_pool.connection_kwargs.get("decode_responses")
    if decodes:
        raise InvalidArgument(
            "the async driver needs a client made with decode_responses=False (payloads are bytes): "
            "pass pyqueue.aio.connect(url) or a client of your own without reply decoding"
        )
    return client


@dataclass
class _Member(Generic[I, R]):
    item: I
    #: Made only for a member that waits: True, lead the next call; False, the answer is in.
    turn: asyncio.Future[bool] | None = None
    result: R | None = None
    error: BaseException | None = None


class AsyncBatcher(Generic[I, R]):
    """Items submitted by tasks at about the same time share calls of ``send`` (the
    asyncio counterpart of :class:`pyqueue.drivers.coalescing.ThreadBatcher`, same contract)."""

    def __init__(
        self,
        send: Callable[[list[I]], Awaitable[list[R]]],
        weigh: Callable[[I], int] = lambda item: 1,
        limit: int = MAX_BATCH,
    ) -> None:
        self._send_batch, self._weigh, self._limit = send, weigh, limit
        #: Who leads; also counts the calls sent and the items they carried.
        self.state: Batching[_Member[I, R]] = Batching()

    async def submit(self, item: I) -> R:
        """Send ``item`` in the next call (now, if none is in flight); its result."""
        me: _Member[I, R] = _Member(item)
        lead = self.state.join(me)
        if not lead:
            me.turn = asyncio.get_running_loop().create_future()
            lead = await me.turn
        if lead:
            await self._send()
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]  # set with the batch's results

    async def _send(self) -> None:
        batch = self.state.take(lambda m: self._weigh(m.item), self._limit)
        try:
            for member, result in zip(batch, await self._send_batch([m.item for m in batch])):
                member.result = result
        except BaseException as exc:  # each member raises it in its own task
            for member in batch:
                member.error = exc
            if isinstance(exc, asyncio.CancelledError):
                # The sending task (batch[0], this one) was cancelled, not the others:
                # for them the call may or may not have run.
                for member in batch[1:]:
                    member.error = OutcomeUnknown("the task that sent this enqueue with others was cancelled")
        leader = self.state.hand_over()
        if leader is not None and leader.turn is not None:  # it joined while a call was in flight
            leader.turn.set_result(True)
        for member in batch:
            if member.turn is not None and not member.turn.done():
                member.turn.set_result(False)


class AsyncScripts(ScriptTable):
    """Every script registered on one asyncio client: runs the steps of plans
    (:mod:`pyqueue.protocol.core`), with the re-sending and ``wait_replicas`` policies of
    :class:`~pyqueue.drivers.scripts.ScriptTable`."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, directory: Path | None = None, **settings: Any) -> None:
        super().__init__(client, directory, **settings)
        if self.cluster and self.wait_replicas:
            # WAIT must follow the call on its connection; redis.asyncio's cluster
            # client does not let a caller pin one.
            raise InvalidArgument("wait_replicas is not supported by the async driver on a Redis Cluster")
        self._enqueues: dict[Keys, AsyncBatcher[ScriptCall, Any]] = {}
        self._commands_in_flight: dict[tuple[str, tuple[Any, ...]], asyncio.Future[Any]] = {}

    @staticmethod
    def is_cluster(client: Any) -> bool:
        return isinstance(client, AsyncRedisCluster)

    def _enqueue_batcher(self, keys: Keys) -> AsyncBatcher[ScriptCall, Any]:
        batcher = self._enqueues.get(keys)
        if batcher is None:

            async def send(steps: list[ScriptCall]) -> list[Any]:
                merged = merge_enqueues(steps)
                return split_enqueue_reply(await self.run("enqueue", merged.keys, merged.args), steps)

            batcher = self._enqueues[keys] = AsyncBatcher(send, enqueue_weight)
        return batcher

    async def run(self, name: str, keys: Keys, args: Sequence[Arg]) -> Any:
        """Run script ``name`` once (EVALSHA); raw reply, redis-py errors. A call
        answered NOSCRIPT loads the script and is sent again, as the blocking driver's
        (:meth:`pyqueue.drivers.scripts.Scripts.run`), up to NOSCRIPT_RELOADS loads: past that
        it raises :class:`~pyqueue.protocol.errors.ScriptNotLoaded`."""
        script, key_list = self._scripts[name], self.key_list(name, keys)
        client: Any = self.client
        weather = Weather(self.weather_budget_s if self.cluster else 0.0)
        reloads, load = 0, False
        while True:
            try:
                if load:  # its exact source, on every primary of a cluster
                    self.check_loaded(name, script, await client.script_load(script.script))
                    load = False
                if self.waits(name):
                    return await self._run_and_wait(script, key_list, args)
                return await client.evalsha(script.sha, len(key_list), *key_list, *args)
            except CLUSTER_WEATHER:
                await asyncio.sleep(weather.pause())
            except redis.exceptions.NoScriptError as exc:
                # Load it and send the same call again, up to the bound. Safe: NOSCRIPT
                # means the script did not run, and every script is replay-safe anyway.
                reloads, load = self.count_reload(name, reloads, exc), True

    async def _run_and_wait(self, script: AsyncScript, key_list: list[str], args: Sequence[Arg]) -> Any:
        """EVALSHA then WAIT, pipelined on one connection (one server only, see
        ``__init__``): one round trip. A NOSCRIPT answer is raised (NoScriptError) for
        :meth:`run` to load the script and send again."""
        client: Any = self.client
        pipe = client.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(key_list), *key_list, *args)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        reply, replicas = list(await pipe.execute(raise_on_error=False))
        return self.replicated(reply, replicas)

    async def call(self, step: ScriptCall) -> Any:
        """Run one :class:`~pyqueue.protocol.core.ScriptCall`, raw (redis-py errors unmapped)."""
        return await self.run(step.script, step.keys, step.args)

    async def run_pipelined(self, name: str, calls: Sequence[tuple[Keys, Sequence[Arg]]]) -> list[Any]:
        """Run script ``name`` once per (keys, ARGV): on one server in one pipeline, on
        a cluster concurrently (each call on its slot's primary). One reply or exception
        instance per call, in order; for read-only or replay-safe scripts only (a call
        answered NOSCRIPT or with a redirect is sent again alone)."""
        script = self._scripts[name]
        if self.cluster:
            replies = await asyncio.gather(*(self.run(name, k, a) for k, a in calls), return_exceptions=True)
        else:
            pipe: Any = self.client.pipeline(transaction=False)
            for keys, args in calls:
                key_list = self.key_list(name, keys)
                pipe.evalsha(script.sha, len(key_list), *key_list, *args)
            replies = await pipe.execute(raise_on_error=False)
        out = list(replies)
        for i, reply in enumerate(out):
            if self.resend(reply):
                try:
                    out[i] = await self.run(name, *calls[i])
                except (redis.exceptions.RedisError, ScriptNotLoaded) as exc:
                    out[i] = exc
        return out

    async def execute(self, step: Step) -> Any:
        """Run one step of a plan; redis-py errors are raised as pyqueue errors."""
        try:
            if self.coalesce and coalescable(step):
                return await self._enqueue_batcher(step.keys).submit(step)
            if isinstance(step, ScriptCall):
                return await self.run(step.script, step.keys, step.args)
            if isinstance(step, Pipelined):
                return await self.run_pipelined(step.script, step.calls)
            return await self._commands(step)
        except redis.exceptions.RedisError as exc:
            raise map_redis_error(exc) from exc

    async def _commands(self, step: Commands) -> Any:
        """Plain commands (a queue object's first-call check of its partition count).
        Tasks that ask the same while it is in flight share its answer: a burst of first
        calls (a hundred tasks starting at once) costs one round trip, not a connection
        each."""
        key = (step.key, tuple(step.commands))
        shared = self._commands_in_flight.get(key)
        if shared is None:
            shared = self._commands_in_flight[key] = asyncio.ensure_future(self._send_commands(step))
            shared.add_done_callback(lambda _: self._commands_in_flight.pop(key, None))
        return await asyncio.shield(shared)

    async def _send_commands(self, step: Commands) -> Any:
        if self.cluster:  # every command names step.key: each goes to its primary
            return [await self.client.execute_command(*command) for command in step.commands]
        pipe: Any = self.client.pipeline(transaction=False)
        for command in step.commands:
            pipe.execute_command(*command)
        return await pipe.execute()


class AsyncQueue(QueueFacade, AsyncDriver):
    """One named queue, driven with ``redis.asyncio`` (arguments: see
    :class:`pyqueue.Queue`; ``redis`` is an asyncio client, or ``None`` for
    :func:`default_client`: ``PYQUEUE_URL``'s server, else the embedded fakeredis).
    Every verb of :class:`pyqueue.Queue` is here, awaited, with the same semantics,
    for one partition or (``partitions=K``) for K."""

    _scripts: AsyncScripts
    #: Whether this object made its client (``from_url``, or made without one), and so
    #: closes it.
    _owns_client = False
    #: Whether no call has started the server check yet (see ``_execute``).
    _server_unchecked = True

    def _open(self, redis: Any, lua_directory: Path | None) -> None:
        if redis is None:  # a client of its own (see default_client): this queue closes it
            redis, self._owns_client = default_client(), True
        spec = self.spec
        self._scripts = AsyncScripts(
            _undecoded(redis), lua_directory, wait_replicas=spec.wait_replicas, wait_timeout_ms=spec.wait_timeout_ms,
            coalesce=spec.coalesce_enqueues,
        )

    async def _execute(self, step: Step) -> Any:
        if self._server_unchecked:
            # The eviction-policy check a sync Queue makes in its constructor; one cannot
            # await, so the first call starts it (once per process and server), as a task
            # of its own: it must not delay this call, nor reorder it among others.
            self._server_unchecked = False
            self._server_check = asyncio.ensure_future(self.check_server())
        return await self._scripts.execute(step)

    @classmethod
    def from_url(cls, url: str, name: str, *, retries: int = 3, **options: Any) -> AsyncQueue:
        """A queue on the server or cluster at ``url`` (see :func:`connect`), owning its
        client: ``aclose()`` or the end of ``async with`` closes it. ``options``: those
        of the constructor. Entering ``async with`` logs a warning if the server may
        evict keys (see :func:`pyqueue.drivers.clients.check_server`)."""
        queue: AsyncQueue = cls(name, connect(url, retries=retries), **options)
        queue._owns_client = True
        return queue

    async def check_server(self) -> list[str]:
        """:func:`pyqueue.drivers.clients.check_server` for this queue's client: the problems
        with the server's settings (logged as warnings)."""
        client: Any = self._scripts.client
        if claim_server_check(client) is None:  # once per process and server, never the embedded one
            return []
        try:
            if self._scripts.cluster:
                policies = (await client.config_get("maxmemory-policy", target_nodes="primaries")).values()
            else:
                policies = [(await client.config_get("maxmemory-policy")).get("maxmemory-policy")]
        except redis.exceptions.RedisError as exc:
            log.info("could not check maxmemory-policy (%s); it must be 'noeviction'", exc)
            return []
        problems = [p for policy in policies for p in eviction_problems(policy)]
        for problem in problems:
            log.warning(problem)
        return problems

    async def aclose(self) -> None:
        """Close the client if this queue made it (``from_url``, or made without a
        client)."""
        if self._owns_client:
            await self._scripts.client.aclose()

    async def __aenter__(self) -> AsyncQueue:
        await self.check_server()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def transport_of(queue: AsyncQueue) -> AsyncScripts:
    """The transport ``queue`` runs its plans on: its scripts on its client
    (``.client``), for the floors above that send steps of their own."""
    return queue._scripts


async def drive(queue: AsyncQueue, plan: Plan[T]) -> T:
    """Run ``plan`` (a plan of ``queue``'s own, :func:`~pyqueue.drivers.facade.plans_of`,
    or one over its spec) to its end on ``queue``'s transport, as a verb runs its plan."""
    return await drive_async(queue._execute, plan)


async def check_partitions(queue: AsyncQueue) -> None:
    """:func:`pyqueue.drivers.queue.check_partitions`, awaited."""
    await drive(queue, plans_of(queue).check_partitions())


def physical_queue(name: str, redis: AsyncClient, **kwargs: Any) -> AsyncQueue:
    """:func:`pyqueue.drivers.queue.physical_queue` of the async driver."""
    return physical(AsyncQueue(name, redis, **kwargs))


async def peek_many(queues: Sequence[AsyncQueue]) -> list[Peeked]:
    """:func:`pyqueue.protocol.verbs.reading.peek_many` on the queues' shared client."""
    return await drive(queues[0], plan_peek_many([q.spec for q in queues])) if queues else []
