"""Task calls and the workflows made of them: :class:`Signature` (``fn.s(...)``: one call,
checked and encoded, not yet sent; what ``send_many`` takes), and chains, groups and
chords of calls, kept in Redis (DESIGN section 14).

``chain(a.s(1), b.s(), c.s())`` runs each step after the one before, **its result
passed as the first argument** of the next (Celery's rule; ``.si(...)`` makes a step
that ignores it). ``group([...])`` runs its members in parallel; its result is the list
of theirs, in order. ``chord(group, callback.s())`` (the same as ``chain(group,
callback.s())``) calls the callback with that list. They nest: a chain's step may be a
group, a group's member a chain. ``a.s() | b.s()`` is ``chain(a.s(), b.s())``.

How it is kept: every step is a job whose id is ``<flow id>.<n>``. A step that waits for
others is added at send time as a *waiting* job (``Queue.flow_wait``: in SCHEDULED,
never due by time) with one pending member per job it waits for; its envelope names
those jobs (``meta.flow.input``), so its message carries references, never the results
or the rest of the flow. When a step's job ends, the worker that acked it (or nacked it
dead) reports it to each step waiting for it (``Queue.flow_done``, a set removal: a
report sent twice counts once); the report that empties the set makes the waiting job
due now, so it runs exactly once. If that worker dies between its ack and its report, a
flow check of the waiting job's queue finds the ended job and reports it
(:mod:`pyqueue.worker.flows`). When the waiting step runs, it reads the results it
needs (each step's result is kept: ``keep_result`` of at least :data:`FLOW_RESULT_S`).

Failure (``on_failure=`` of ``chain``, ``group`` and ``chord``, for the steps they
create): ``"fail"`` (the default): a step waiting for a job that went dead, was
cancelled, or lost its result does not call its function; it fails at once (dead, with
the failed job's error), and so do the steps waiting for it. ``"continue"``: it runs
once everything it waits for has ended, a failed job's value replaced by the
:class:`~pyqueue.tasks.handle.TaskDead` (or :class:`TaskResultMissing`) that reading it
raises.

A flow's send is several calls (its record, a waiting step per queue call, then the
first steps together), in an order that never lets a step run before what waits for it
is armed. Sending the same flow object twice sends two flows. Send middleware sees each
step as a send of its own, all entered before anything is written (a refusal of any
step sends nothing of the flow); run middleware runs around each step. A step whose
queue is at its byte budget raises :class:`~pyqueue.QueueFull`, and the steps that
send had added are cancelled first, so no part of a refused flow runs.

Its record (``Queue.flow_record``, in the queue of its first step, kept
:data:`FLOW_RECORD_S`) names every step, its task and how the steps nest, so that
``pyqueue flow show QUEUE ID``, the dashboard and :meth:`FlowHandle.load` find a flow
by its id from any process (:mod:`pyqueue.tasks.flowview`). No step needs it to run.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import inspect
import json
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, Union

from pyqueue.drivers.clients import Client
from pyqueue.protocol.core import new_id
from pyqueue.protocol.errors import InvalidArgument, QueueFull
from pyqueue.protocol.models import Job, NewJob
from pyqueue.drivers.facade import client_of
from pyqueue.drivers.queue import Queue, partition_name, partition_of, physical_queue
from pyqueue.tasks import envelope
from pyqueue.tasks.codec import canonical, from_json, to_json, to_json_args
from pyqueue.tasks.flowview import RECORD_VERSION, FlowView, show_flow, step_states
from pyqueue.tasks.handle import QueueSource, ResultTimeout, SentTask, TaskDead, TaskResultMissing
from pyqueue.tasks.middleware import RESERVED_META, Hook, Sending, TaskInfo, enter_sends, resume_sends
from pyqueue.tasks.policy import TaskOptions
from pyqueue.protocol.verbs.flows import DEFAULT_FLOW_CHECK_MS, POLICIES
from pyqueue.worker import Fail


class Sender(QueueSource, Protocol):
    """What calls and flows use of the Tasks object their tasks belong to (a
    :class:`~pyqueue.tasks.Tasks`, declared above this module): its send hooks, its
    queues, its client and the server's clock."""

    @property
    def send_hooks(self) -> tuple[Hook, ...]: ...

    @property
    def redis(self) -> Client: ...

    @property
    def prefix(self) -> str: ...

    def server_now_ms(self) -> int: ...


class TaskLike(TaskInfo, Protocol):
    """What a call and a flow use of their task (a :class:`~pyqueue.tasks.Task`,
    declared above this module)."""

    @property
    def app(self) -> Sender: ...

    @property
    def signature(self) -> inspect.Signature: ...

    @property
    def positional_arity(self) -> int: ...

    @property
    def argument_where(self) -> str: ...

    @property
    def encode_envelope(self) -> envelope.Encoder: ...

    @property
    def batch(self) -> object: ...

#: Each step of a flow keeps its result at least this long (seconds): the steps waiting
#: for it read it when they run.
FLOW_RESULT_S = 86_400
#: A waiting step's first check is due this long after it was sent (ms), then every
#: check interval of the workers (:mod:`pyqueue.worker.flows`).
FLOW_CHECK_MS = DEFAULT_FLOW_CHECK_MS
#: A flow's record is kept this long from its send (seconds): the view of a flow that
#: runs longer goes before it ends (the flow itself runs on).
FLOW_RECORD_S = 7 * 86_400
#: What stands for one job in a flow's references: "<physical queue>\t<job id>".
SEP = "\t"

#: A reference to the result(s) a step takes: one job's, or a list (a group's).
Spec = Union[str, list["Spec"]]


def unfit_arguments(signature: inspect.Signature, kwargs: dict[str, Any]) -> str:
    """Why ``kwargs`` cannot be bound, when a keyword names no parameter: that keyword,
    and the parameter it may be a misspelling of (Python's own message would name the
    parameter left missing instead: ``widht=640`` reads as "missing 'width'"). '' when
    every keyword names a parameter, or the function takes ``**kwargs``."""
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return ""
    named = [n for n, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY]
    for key in kwargs:
        if key not in named:
            close = difflib.get_close_matches(key, named, n=1)
            return f"unexpected keyword argument {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    return ""


class Signature:
    """One call of a task, checked and encoded, not yet sent: ``fn.s(*args, **kwargs)``.
    ``send_many`` takes a list of them."""

    def __init__(
        self, task: TaskLike, args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions,
        partial: bool = False,
    ) -> None:
        bound: inspect.BoundArguments | None = None
        #: Its arguments fit only with one more before them: a flow's step that takes the
        #: result before it as its first argument (``partial``: made by ``fn.s``).
        self.awaits_input = False
        self.args: list[Any]
        self.kwargs: dict[str, Any]
        if not kwargs and len(args) == task.positional_arity:
            # Every parameter given by position: bound as given, which is what bind
            # returns (bind costs more than the rest of a send's Python; unique=True
            # binds when it needs to).
            self.args, self.kwargs = list(args), {}
        else:
            try:
                bound = task.signature.bind(*args, **kwargs)
            except TypeError as exc:
                try:
                    if not partial:
                        raise
                    task.signature.bind(None, *args, **kwargs)
                except TypeError:
                    raise TypeError(f"{task.name}: {unfit_arguments(task.signature, kwargs) or exc}") from None
                self.awaits_input = True
            self.args, self.kwargs = (list(bound.args), dict(bound.kwargs)) if bound else (list(args), dict(kwargs))
        self.task, self.options = task, options
        #: Made with ``.si``: as a flow's step, it does not take the result before it.
        self.immutable = False
        self.json_args = to_json_args(self.args, task.argument_where)
        self.json_kwargs = to_json(self.kwargs, task.argument_where) if self.kwargs else {}
        self._bound = bound

    def job_id(self) -> str:
        """The job id this call is sent under: its ``job_id`` option's, else
        ``unique``'s, else a random one (128 bits in hex, as the engine draws them:
        :func:`pyqueue.protocol.core.new_id`)."""
        if self.options.job_id is not None:
            return self.options.job_id
        unique = self.options.unique
        if unique is None or unique is False:
            return new_id()
        if unique is True:
            # The task and its arguments, canonically: the same call is the same job,
            # whether an argument was given by position or keyword, or left to its
            # default, and whatever the order of a dict's keys.
            call = self.with_defaults()
            try:
                args, kwargs = to_json(list(call.args)), to_json(call.kwargs)
            except InvalidArgument:  # a default that does not travel: the call as given
                args, kwargs = self.json_args, self.json_kwargs
            digest = hashlib.sha256(canonical([self.task.name, args, kwargs]).encode()).hexdigest()
            return f"{self.task.name}:{digest[:32]}"
        job_id = self.call_by_name(unique)
        if not isinstance(job_id, str):
            raise InvalidArgument(f"{self.task.name}: unique must return the job id as a str, got {job_id!r}")
        return job_id

    def with_defaults(self) -> inspect.BoundArguments:
        """This call's arguments bound to the function's parameters, defaults applied."""
        bound = self._bound if self._bound is not None else self.task.signature.bind(*self.args, **self.kwargs)
        call = inspect.BoundArguments(bound.signature, bound.arguments.copy())
        call.apply_defaults()
        return call

    def call_by_name(self, fn: Callable[..., Any]) -> Any:
        """``fn`` (a ``group`` or ``unique`` function) called with this call's arguments
        by name, defaults included: ``lambda account_id, **_: ...`` reads the argument
        ``account_id`` whether the call gave it by position or by keyword. (Positional-
        only parameters and ``*args`` go by position, ``**kwargs`` as keywords.)"""
        call = self.with_defaults()
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, value in call.arguments.items():
            kind = call.signature.parameters[name].kind
            if kind is inspect.Parameter.POSITIONAL_ONLY:
                args.append(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                args.extend(value)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                kwargs.update(value)
            else:
                kwargs[name] = value
        return fn(*args, **kwargs)

    def new_job(
        self, now_ms: int, delay_ms: int, extra_meta: dict[str, Any] | None = None, *,
        job_id: str | None = None, flow: dict[str, Any] | None = None,
    ) -> NewJob:
        """The job of this call, sent at ``now_ms`` (server clock) to run ``delay_ms``
        later; ``extra_meta``: the keys middleware adds to the envelope's meta. A flow's
        step gives its ``job_id`` and its ``flow`` meta (:mod:`pyqueue.tasks.flows`).

        Raises:
            InvalidArgument: ``extra_meta`` names a key of the task layer's
                (``enqueued_ms``, ``delay_ms``, ``opts``, ``flow``) or is not plain JSON data;
                ``group`` or ``unique`` functions returning something else than a str.
        """
        meta: dict[str, Any] = {"enqueued_ms": now_ms}
        if delay_ms:
            meta["delay_ms"] = delay_ms
        # A send with the task's own options (most sends) overrides nothing.
        opts = {} if self.options is self.task.policy else self.options.overrides(self.task.policy)
        if opts:
            meta["opts"] = opts
        if flow is not None:
            meta["flow"] = flow
        if extra_meta:
            taken = sorted(RESERVED_META.intersection(extra_meta))
            if taken:
                raise InvalidArgument(f"{self.task.name}: middleware set the envelope's meta {taken}, which the task "
                                      "layer writes")
            meta.update(to_json(extra_meta, f"{self.task.name} meta set by middleware"))
        payload = self.task.encode_envelope(self.json_args, self.json_kwargs, meta)
        group = self.resolved(self.options.group, "group", "group")
        # A job without `job_id` or `unique` lets the engine draw its id
        # (pyqueue.protocol.core.new_id): a grouped one's must fall in its group's partition on a
        # partitioned queue, and an id drawn there needs no checks.
        if job_id is None:
            job_id = self.options.job_id
        if job_id is None and self.options.unique is not None and self.options.unique is not False:
            job_id = self.job_id()
        key = self.resolved(self.options.key, "key", "key")
        keyed = key is not None  # a key function's None: this send is neither debounced nor throttled
        sequence = self.resolved(self.options.sequence, "sequence", "key")
        rate_key, cost = self.rate_terms()
        return NewJob(payload, job_id=job_id, delay_ms=delay_ms, max_attempts=self.options.max_attempts,
                      priority=self.options.priority, group=group, expires_ms=self.options.expires_ms,
                      debounce_ms=self.options.debounce_ms if keyed else None,
                      throttle_ms=self.options.throttle_ms if keyed else None, key=key, sequence=sequence,
                      on_failure=self.options.on_failure if sequence is not None else "block",
                      rate_key=rate_key, rate_limit=self.options.rate_limit if rate_key is not None else None,
                      cost=cost if rate_key is not None else 1, task=self.task.name)

    def rate_terms(self) -> tuple[str | None, int]:
        """This call's rate key (None: not limited) and cost: the task's name when the
        limit has no key, else the key (a function's None: this send is not limited).

        Raises:
            InvalidArgument: a cost function that gives no int >= 1.
        """
        o = self.options
        if o.rate_limit is None:
            return None, 1
        rate_key = f"task:{self.task.name}" if o.rate_key is None else self.resolved(o.rate_key, "rate_key", "key")
        cost = self.call_by_name(o.cost) if callable(o.cost) else o.cost
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
            raise InvalidArgument(f"{self.task.name}: cost must give an int >= 1, got {cost!r}")
        return rate_key, cost

    def resolved(self, value: str | Callable[..., str | None] | None, option: str, noun: str) -> str | None:
        """An option that is a str, None, or a function of this call's arguments (by name,
        defaults included) giving one of those (``group``, ``key``, ``sequence``).

        Raises:
            InvalidArgument: the function gave something else.
        """
        if callable(value):
            value = self.call_by_name(value)
            if value is not None and not isinstance(value, str):
                raise InvalidArgument(f"{self.task.name}: {option} must return the {noun} as a str or None, got {value!r}")
        return value

    def handle(self, job_id: str, added: bool, by_key: str | None = None) -> SentTask[Any]:
        """The handle of the job this call was sent as (or, ``by_key``, given to)."""
        return SentTask(job_id, self.options.queue, self.task.name, added, self.options.keep_result_ms is not None,
                        self.task.app, by_key)

    def __or__(self, other: Any) -> Any:
        """``a.s() | b.s()``: the chain of the two (:func:`chain`)."""
        return chain(self, other)

    def __repr__(self) -> str:
        return f"{self.task.name}.{'si' if self.immutable else 's'}(*{self.args!r}, **{self.kwargs!r})"


class Flow:
    """A chain or a group of task calls, not yet sent."""

    on_failure: str

    def send(self) -> FlowHandle:
        """Send every step of the flow; returns its handle. See the module docstring.

        Raises:
            QueueFull: a step's queue is at its byte budget (the steps already sent
                are cancelled: nothing of the flow runs).
        """
        return _send(self)

    def __or__(self, other: Flow | Signature) -> Chain:
        return chain(self, other)


class Chain(Flow):
    """Steps run one after another, each given the result of the one before."""

    def __init__(self, steps: Sequence[Flow | Signature], on_failure: str) -> None:
        if not steps:
            raise InvalidArgument("a chain needs at least one step")
        self.steps, self.on_failure = list(steps), _policy(on_failure)

    def __repr__(self) -> str:
        return "chain(" + ", ".join(map(repr, self.steps)) + ")"


class Group(Flow):
    """Members run in parallel; the group's result is the list of theirs, in order."""

    def __init__(self, members: Sequence[Flow | Signature], on_failure: str) -> None:
        if not members:
            raise InvalidArgument("a group needs at least one member")
        self.members, self.on_failure = list(members), _policy(on_failure)

    def __repr__(self) -> str:
        return "group([" + ", ".join(map(repr, self.members)) + "])"


def chain(*steps: Flow | Signature, on_failure: str = "fail") -> Chain:
    """Run ``steps`` one after another, each called with the previous step's result as
    its first argument (unless made with ``.si``); the chain's result is the last's."""
    return Chain(steps, on_failure)


def group(members: Iterable[Flow | Signature], on_failure: str = "fail") -> Group:
    """Run ``members`` in parallel; the group's result is the list of their results."""
    return Group(list(members), on_failure)


def chord(header: Group | Iterable[Flow | Signature], body: Signature, on_failure: str = "fail") -> Chain:
    """Run the group ``header``, then ``body`` with the list of its results."""
    members = header if isinstance(header, Group) else group(header, on_failure)
    return Chain([members, body], on_failure)


def _policy(value: str) -> str:
    if value not in POLICIES:
        raise InvalidArgument(f"on_failure must be one of {POLICIES}, got {value!r}")
    return value


@dataclass
class Step:
    """One task call of a flow, compiled: its job id, where it runs, what it takes."""

    sig: Signature
    id: str
    queue: str  # logical
    physical: str
    input: Spec | None
    policy: str
    then: list[list[str]]  # [queue, job id, policy] of each step waiting for this one
    meta: dict[str, Any] | None = None  # what send middleware added to its envelope's meta

    def new_job(self, flow_id: str, now_ms: int) -> NewJob:
        sig = copy.copy(self.sig)
        keep = max(sig.options.keep_result_ms or 0, FLOW_RESULT_S * 1000)
        sig.options = replace(sig.options, keep_result_ms=keep)
        flow: dict[str, Any] = {"id": flow_id}
        if self.then:
            flow["then"] = self.then
        if self.input is not None:
            flow["input"], flow["policy"], flow["pass"] = self.input, self.policy, not self.sig.immutable
        return sig.new_job(now_ms, 0, self.meta, job_id=self.id, flow=flow)


class _Compiler:
    def __init__(self, app: Sender, flow_id: str) -> None:
        self.app, self.flow_id = app, flow_id
        self.steps: list[Step] = []
        self.by_ref: dict[str, Step] = {}

    def add(self, item: Flow | Signature, input: Spec | None, policy: str) -> Spec:
        """Compile ``item`` taking ``input``; returns the reference to its result."""
        if isinstance(item, Chain):
            spec = input
            for part in item.steps:
                spec = self.add(part, spec, item.on_failure)
            assert spec is not None
            return spec
        if isinstance(item, Group):
            return [self.add(member, input, item.on_failure) for member in item.members]
        if not isinstance(item, Signature):
            raise InvalidArgument(f"a flow holds task calls (fn.s(...)), chains and groups, got {item!r}")
        if item.task.app is not self.app:
            raise InvalidArgument("every task of a flow must belong to the same Tasks object")
        if item.task.batch is not None:
            raise InvalidArgument(f"{item.task.name} is a batch task: a flow's steps are plain tasks")
        if item.options.job_id is not None:
            raise InvalidArgument(
                f"{item!r} has job_id={item.options.job_id!r}: a flow names its steps' jobs (<flow id>.<n>), so a "
                "step takes no job_id"
            )
        if input is None and item.awaits_input and not item.immutable:
            raise TypeError(f"{item!r} lacks an argument, and as a first step nothing gives it one")
        if input is not None and not item.immutable:
            # It takes the result before it: it must fit with it (checked now, not when it runs).
            try:
                item.task.signature.bind(None, *item.args, **item.kwargs)
            except TypeError as exc:
                raise TypeError(f"{item!r} cannot take the result before it as its first argument: {exc}") from None
        job_id = f"{self.flow_id}.{len(self.steps)}"
        queue = item.options.queue
        step = Step(item, job_id, queue, physical_name(self.app.queue(queue), job_id), input, policy, [])
        self.steps.append(step)
        ref = step.physical + SEP + job_id
        self.by_ref[ref] = step
        for needed in flatten(input):
            self.by_ref[needed].then.append([queue, job_id, policy])
        return str(ref)


def physical_name(queue: Queue, job_id: str) -> str:
    """The name of the queue that holds ``job_id``: a partition of a partitioned queue."""
    partitions = queue.spec.partitions
    return partition_name(queue.name, partition_of(job_id, partitions), partitions)


def flatten(spec: Spec | None) -> list[str]:
    """The job references in ``spec``, in order."""
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    return [ref for item in spec for ref in flatten(item)]


def split(ref: str) -> tuple[str, str]:
    queue, job_id = ref.split(SEP, 1)
    return queue, job_id


def send_children(app: Sender, run: Any) -> FlowHandle:
    """Send the children a running task spawned (``TaskRun.spawn``/``then``) as one flow
    whose id is derived from the job's, so that a retried run re-sends the same ids
    (duplicates: each child runs once)."""
    steps, callback, policy = run.children
    if not steps:
        raise InvalidArgument("then() was given, but no child was spawned")
    children = group(steps, on_failure=policy)
    flow: Flow = children if callback is None else chain(children, callback, on_failure=policy)
    return _send(flow, children_flow_id(run.queue, run.id))


def children_flow_id(queue: str, job_id: str) -> str:
    """The id of the flow of the children that job ``job_id`` of ``queue`` spawned: its
    steps are ``<id>.0``, ``<id>.1``, ... in the order spawned, then the callback."""
    return "kids-" + hashlib.sha256(f"{queue}\t{job_id}".encode()).hexdigest()[:20]


def _send(flow: Flow, flow_id: str | None = None) -> FlowHandle:
    app = _app_of(flow)
    flow_id = flow_id or "flow-" + secrets.token_hex(8)
    compiler = _Compiler(app, flow_id)
    output = compiler.add(flow, None, flow.on_failure)
    hooks = app.send_hooks
    if not hooks:
        return _send_steps(app, flow, compiler, output, None)
    # The send middleware sees each step as a send of its own, all entered before
    # anything is written: a refusal of any step sends nothing of the flow.
    messages = [Sending(s.sig.task, s.sig.args, s.sig.kwargs, s.sig.options, 0) for s in compiler.steps]
    chains = enter_sends(hooks, messages)
    try:
        handle = _send_steps(app, flow, compiler, output, [m.meta for m in messages])
    except BaseException as exc:
        resume_sends(chains, None, exc)
        raise
    resume_sends(chains, [s.sig.handle(s.id, True) for s in compiler.steps], None)
    return handle


def _send_steps(
    app: Sender, flow: Flow, compiler: _Compiler, output: Spec, metas: list[dict[str, Any]] | None
) -> FlowHandle:
    """Keep the flow's record, arm its waiting steps, then enqueue its first steps;
    ``metas``: what send middleware added to each step's meta.

    Raises:
        QueueFull: a step's queue is at its byte budget. The steps this call had
            added are cancelled before it is raised (one a worker leased meanwhile
            may have started).
    """
    flow_id = compiler.flow_id
    for step in compiler.steps:
        o = step.sig.options
        if o.expires_ms is not None or o.debounce_ms is not None or o.throttle_ms is not None or o.sequence is not None \
                or o.rate_limit is not None:
            # A step's id is the flow's and what waits for it waits for that id: a key
            # could give its send to another job, an expiry or a sequence end it unreported
            # or hold it back. A waiting step is armed by flow_wait.lua, which keeps no key,
            # so a rate limit would hold for the first steps only: refused for all.
            raise InvalidArgument(f"{step.sig.task.name}: a flow's step cannot have expires, debounce, throttle, "
                                  "sequence or rate_limit (send it alone, or take them off for the flow: "
                                  "fn.options(expires=None).s())")
    for step, meta in zip(compiler.steps, metas or ()):
        step.meta = meta
    now_ms = app.server_now_ms()
    # The record first: a flow whose steps run can always be shown. A re-sent flow id
    # (a retried run's children) finds its record kept: 'duplicate', nothing written.
    first = compiler.steps[0].queue
    app.queue(first).flow_record(flow_id, record_of(flow, compiler, output, now_ms), FLOW_RECORD_S * 1000)
    # What this call added, by queue (not what an earlier send of this flow id did).
    added: dict[str, list[str]] = {}
    try:
        # Every waiting step is armed before any first step is enqueued: a report of a
        # first step's end always finds what waits for it.
        for step in compiler.steps:
            if step.input is not None:
                refs = [split(ref) for ref in flatten(step.input)]
                if app.queue(step.queue).flow_wait(step.new_job(flow_id, now_ms), refs, check_ms=FLOW_CHECK_MS) == "ok":
                    added.setdefault(step.queue, []).append(step.id)
        by_queue: dict[str, list[NewJob]] = {}
        for step in compiler.steps:
            if step.input is None:
                by_queue.setdefault(step.queue, []).append(step.new_job(flow_id, now_ms))
        for queue, jobs in by_queue.items():
            for sent in app.queue(queue).enqueue_many(jobs):
                if sent.added:
                    added.setdefault(queue, []).append(sent.job_id)
    except QueueFull:
        # A byte budget refused a step, writing nothing of it: withdraw the steps this
        # call added, so no part of a refused flow runs (its waiting steps would
        # otherwise be released by the checks, as if what they wait for had failed).
        for queue, ids in added.items():
            app.queue(queue).cancel_many(ids)
        raise
    return FlowHandle(flow_id, output, [(s.physical, s.id) for s in compiler.steps], app, first)


def record_of(flow: Flow, compiler: _Compiler, output: Spec, now_ms: int) -> bytes:
    """The flow's record (:mod:`pyqueue.tasks.flowview` reads it): its steps in the
    order of their ids, how they nest, and its output reference."""
    numbers = iter(range(len(compiler.steps)))

    def tree(item: Flow | Signature) -> Any:
        if isinstance(item, Chain):
            # (a | b) | c is one chain of three to whoever reads the tree.
            steps = [tree(step) for step in item.steps]
            flat = [node for step in steps for node in (step["chain"] if isinstance(step, dict) and "chain" in step else [step])]
            return {"chain": flat}
        if isinstance(item, Group):
            return {"group": [tree(member) for member in item.members]}
        return next(numbers)  # compiled in this same order: _Compiler.add

    record = {
        "v": RECORD_VERSION, "id": compiler.flow_id, "created_ms": now_ms, "tree": tree(flow),
        "steps": [[s.physical, s.id, s.sig.task.name] for s in compiler.steps], "output": output,
    }
    return json.dumps(record, separators=(",", ":")).encode()


def _app_of(flow: Flow | Signature) -> Sender:
    if isinstance(flow, Chain):
        return _app_of(flow.steps[0])
    if isinstance(flow, Group):
        return _app_of(flow.members[0])
    if isinstance(flow, Flow):
        raise InvalidArgument(f"not a flow: {flow!r}")
    return flow.task.app


@dataclass(frozen=True)
class FlowHandle:
    """A sent flow: its id, the state of its steps, its result, and cancel."""

    id: str
    output: Spec
    steps: list[tuple[str, str]]  # (physical queue, job id) of every step
    app: Sender
    #: The queue of its first step, where its record is kept.
    queue: str

    @classmethod
    def load(cls, app: Sender, queue: str, flow_id: str) -> FlowHandle:
        """The handle of flow ``flow_id`` sent from any process, found by its record in
        ``queue`` (the queue of its first step; :attr:`queue` of the sender's handle).

        Raises:
            LookupError: no record of it is kept there (never sent, or expired).
        """
        view = cls.view(app, queue, flow_id)
        return cls(flow_id, view.output, [(step.queue, step.job_id) for step in view.steps], app, queue)

    @staticmethod
    def view(app: Sender, queue: str, flow_id: str) -> FlowView:
        """The flow ``flow_id`` whose record is in ``queue``, with each step's state.

        Raises:
            LookupError: no record of it is kept there (never sent, or expired).
        """
        view = show_flow(app.redis, app.queue(queue), flow_id, prefix=app.prefix)
        if view is None:
            raise LookupError(f"no record of flow {flow_id!r} is kept in queue {queue!r} (never sent from it, or expired)")
        return view

    def show(self) -> FlowView:
        """This flow's steps, their tasks, how they nest and each one's state."""
        return self.view(self.app, self.queue, self.id)

    def status(self) -> dict[str, int]:
        """How many steps are in each state: ``waiting`` (for other steps), ``ready``,
        ``scheduled``, ``leased``, ``done`` (acked: its result is kept), ``dead``,
        ``cancelled`` (ended without its result: cancelled, see
        :func:`~pyqueue.tasks.flowview.step_states`), ``unknown`` (ended and forgotten).
        A ``get`` per step, and a ``result`` read per queue for the steps that ended."""
        got = [(reader, reader.get(job_id)) for reader, job_id in ((_reader(self.app, q), j) for q, j in self.steps)]
        return dict(Counter(step_states(got)))

    def result(self, timeout: float | None = None) -> Any:
        """The flow's result (its last step's; a group's is a list), waiting up to
        ``timeout`` seconds (None: for ever).

        Raises:
            TaskDead: the step it comes from went dead (under ``"fail"``, the first
                failure of the flow, passed on).
            TaskResultMissing: that step ended without a result (cancelled).
            ResultTimeout: not ended in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._resolve(self.output, deadline)

    def _resolve(self, spec: Spec, deadline: float | None) -> Any:
        if isinstance(spec, list):
            return [self._resolve(item, deadline) for item in spec]
        queue, job_id = split(spec)
        reader = _reader(self.app, queue)
        while True:
            left_ms = 3_600_000 if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
            found = reader.wait_result(job_id, max(1, left_ms))
            if found.finished:
                return result_value(found.state, found.value, found.error, job_id, queue)
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(f"flow {self.id}: step {job_id} had not ended in time")

    def cancel(self) -> int:
        """Cancel every step not ended: a waiting or ready step is removed, a running one
        is asked to stop (``Queue.cancel``). Returns how many steps this ended."""
        return sum(_reader(self.app, queue).cancel(job_id).cancelled for queue, job_id in self.steps)


def result_value(state: str, value: Any, error: str, job_id: str, queue: str) -> Any:
    """A step's value from its result, or the error reading it raises."""
    if state == "ok":
        return from_json(value)
    if state == "dead":
        raise TaskDead(job_id, "flow step", error)
    raise TaskResultMissing(f"step {job_id} in {queue} ended without a result ({state})")


_readers: dict[tuple[int, str], Queue] = {}


def _reader(app: Sender, queue: str) -> Queue:
    """A queue object for the physical queue ``queue`` on ``app``'s connection."""
    key = (id(app), queue)
    reader = _readers.get(key)
    if reader is None or client_of(reader) is not app.redis:
        reader = _readers[key] = physical_queue(queue, app.redis, prefix=app.prefix)
    return reader


# -- the worker's side (pyqueue.tasks.dispatch.Dispatcher calls these) ------------------


def take_input(app: Sender, env: envelope.Envelope, flow: dict[str, Any]) -> envelope.Envelope:
    """The envelope of a step that waited, its input read: the results it needs put
    before its arguments (unless it was made with ``.si``).

    Raises:
        Fail: under ``"fail"``, a job it waited for failed (its error passed on).
    """
    fail = flow.get("policy", "fail") == "fail"
    refs = flatten(flow["input"])
    by_queue: dict[str, list[str]] = {}
    for ref in refs:
        queue, job_id = split(ref)
        by_queue.setdefault(queue, []).append(job_id)
    found: dict[str, Any] = {}
    for queue, ids in by_queue.items():  # one round trip per queue (per 1000 results)
        for start in range(0, len(ids), 1000):
            chunk = ids[start:start + 1000]
            for job_id, info in zip(chunk, _reader(app, queue).results(chunk)):
                found[queue + SEP + job_id] = info

    def read(spec: Spec) -> Any:
        if isinstance(spec, list):
            return [read(item) for item in spec]
        queue, job_id = split(spec)
        info = found[spec]
        try:
            return result_value(info.state, info.value, info.error, job_id, queue)
        except (TaskDead, TaskResultMissing) as exc:
            if fail:
                raise Fail(f"flow {flow.get('id')}: {exc}") from None
            return exc

    if fail:
        # Under "fail" a step is released as soon as one input fails, while the others
        # may still be pending or running: pass on that failure, not the first input in
        # order that has not ended yet (the sort is stable: pending ones last).
        not_ok = [ref for ref in refs if found[ref].state != "ok"]
        for ref in sorted(not_ok, key=lambda ref: found[ref].state == "pending"):
            read(ref)

    value = read(flow["input"])
    meta = {k: v for k, v in env.meta.items() if k != "enqueued_ms"}  # no max_age: it waited by design
    args = [value, *env.args] if flow.get("pass", True) else env.args
    return envelope.Envelope(env.task, args, env.kwargs, meta)


def report_end(app: Sender, job: Job, how: str) -> None:
    """Report the end of a flow step's job to the steps waiting for it (the fast path of
    ``Queue.flow_done``; a flow check covers a worker that dies before)."""
    flow = envelope.decode(job.payload).meta.get("flow")
    if not isinstance(flow, dict):
        return
    ended = [(job.queue, job.id, "ok" if how == "ok" else "failed")]
    for queue, job_id, policy in flow.get("then", ()):
        app.queue(queue).flow_done(job_id, ended, policy=policy)
