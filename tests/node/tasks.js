'use strict';
// The task layer for Node, written from lua/README.md §9 (the task envelope) only: the
// tagged JSON codec, the envelope, a producer that sends tasks Python workers run, a
// reader of their results, and a small worker that runs tasks Python sent. Driven by
// conformance.js (scenarios task-produce, task-work, task-decode).

const crypto = require('crypto');
const { Queue } = require('./pyqueue_client');

const TAG = '$pq';
const VERSION = 1;
const MAX_DEPTH = 100; // README §9.2: deeper data is refused
const MAX_ERROR_CHARS = 4000; // Python's error text limit (README §9.5)
const MAX_RESULT_BYTES = 524288; // ack_result's value limit (README §4.2)
// Python's worker defaults (README §6): the script's backoff base and cap.
const DEFAULT_BACKOFF = { baseMs: 1000, capMs: 3600000 };

// A tagged value Node has no type for (README §9.2): datetime, date, time, timedelta,
// uuid, decimal. It keeps the tag and the value exactly as they travelled.
const TEXT_TAGS = new Set(['datetime', 'date', 'time', 'uuid', 'decimal']);
class Tagged {
  constructor(tag, value) {
    if (TEXT_TAGS.has(tag)) {
      if (typeof value !== 'string') throw new CodecError(`a ${tag} travels as text, got ${JSON.stringify(value)}`);
    } else if (tag === 'timedelta') {
      if (typeof value !== 'number' || !Number.isFinite(value)) throw new CodecError(`a timedelta is seconds, got ${value}`);
    } else {
      throw new CodecError(`no Tagged type for the tag ${JSON.stringify(tag)}`);
    }
    this.tag = tag;
    this.value = value;
  }

  // A datetime as a JS Date (milliseconds: microseconds are cut; a naive datetime has no
  // offset and is read as UTC here).
  toDate() {
    if (this.tag !== 'datetime') throw new CodecError(`a ${this.tag} is not a datetime`);
    const m = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?([+-]\d\d:\d\d(?::\d\d(?:\.\d+)?)?|Z)?$/.exec(this.value);
    if (!m) throw new CodecError(`not an ISO datetime: ${this.value}`);
    const ms = (m[2] ?? '').padEnd(3, '0').slice(0, 3);
    return new Date(`${m[1]}.${ms}${(m[3] ?? 'Z').slice(0, 6)}`);
  }

  toJSON() {
    return { [TAG]: this.tag, v: this.value };
  }
}

class CodecError extends Error {}
class EnvelopeError extends Error {}

function isPlainObject(value) {
  if (value === null || typeof value !== 'object') return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

// Compare by code point (Python's str order), not by UTF-16 code unit.
function byCodePoint(a, b) {
  const x = Array.from(a);
  const y = Array.from(b);
  for (let i = 0; i < Math.min(x.length, y.length); i += 1) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

// Canonical JSON text (README §9.2): keys sorted by code point, no spaces, non-ASCII
// as itself. Of plain JSON data (already tagged).
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (isPlainObject(value)) {
    const keys = Object.keys(value).sort(byCodePoint);
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

// A JS value as plain JSON data, extra types tagged (README §9.2). Date -> datetime
// (aware, UTC, written "+00:00" for Python 3.10), Buffer/Uint8Array -> bytes, Set ->
// set (sorted by canonical text), Tagged -> its tag. Refuses anything else.
function toJson(value, where = 'argument', depth = 0) {
  if (depth > MAX_DEPTH) throw new CodecError(`${where}: nested more than ${MAX_DEPTH} levels deep`);
  const next = depth + 1;
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return value;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new CodecError(`${where}: ${value} is not JSON (NaN and infinities do not travel)`);
    return value;
  }
  if (Array.isArray(value)) return value.map((v) => toJson(v, where, next));
  if (value instanceof Tagged) return value.toJSON();
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw new CodecError(`${where}: an invalid Date`);
    return { [TAG]: 'datetime', v: value.toISOString().replace(/Z$/, '+00:00') };
  }
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) {
    return { [TAG]: 'bytes', v: Buffer.from(value).toString('base64') };
  }
  if (value instanceof Set) {
    const items = [...value].map((v) => toJson(v, where, next));
    const texts = new Map(items.map((item) => [item, canonical(item)]));
    items.sort((a, b) => byCodePoint(texts.get(a), texts.get(b)));
    return { [TAG]: 'set', v: items };
  }
  if (isPlainObject(value)) {
    const out = {};
    for (const [k, v] of Object.entries(value)) {
      if (k === TAG) throw new CodecError(`${where}: a key ${JSON.stringify(TAG)} is reserved for tagged types`);
      out[k] = toJson(v, where, next);
    }
    return out;
  }
  const kind = value === undefined ? 'undefined' : (value.constructor?.name ?? typeof value);
  throw new CodecError(`${where}: ${kind} does not travel as JSON; pass plain data, a Date, Buffer, Set or Tagged`);
}

const BASE64_RE = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

// One tagged object back to its value; exactly the keys $pq and v (README §9.2).
function untag(obj) {
  const keys = Object.keys(obj);
  if (keys.length !== 2 || !keys.includes('v')) throw new CodecError(`malformed tagged value ${JSON.stringify(obj)}`);
  const tag = obj[TAG];
  const v = obj.v;
  if (tag === 'bytes') {
    if (typeof v !== 'string' || !BASE64_RE.test(v)) throw new CodecError(`tagged bytes are not base64: ${JSON.stringify(v)}`);
    return Buffer.from(v, 'base64');
  }
  if (tag === 'set') {
    if (!Array.isArray(v)) throw new CodecError(`a tagged set holds an array, got ${JSON.stringify(v)}`);
    return new Set(v); // items are decoded already (fromJson works bottom-up)
  }
  if (TEXT_TAGS.has(tag) || tag === 'timedelta') return new Tagged(tag, v);
  throw new CodecError(`unknown tagged value ${JSON.stringify(obj)}`);
}

// Plain JSON data (parsed) back to values, tags decoded.
function fromJson(value) {
  if (Array.isArray(value)) return value.map(fromJson);
  if (isPlainObject(value)) {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = fromJson(v);
    return Object.prototype.hasOwnProperty.call(out, TAG) ? untag(out) : out;
  }
  return value;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

// The payload of a task job (README §9.1): compact JSON, UTF-8, fields in Python's
// order. args and kwargs are JS values (encoded here); meta is plain JSON.
function encodeEnvelope(task, args, kwargs, meta) {
  if (typeof task !== 'string' || !task) throw new EnvelopeError('a task name is a non-empty string');
  const where = `${task} argument`;
  return Buffer.from(JSON.stringify({
    v: VERSION, task, args: toJson(args, where), kwargs: toJson(kwargs, where), meta,
  }), 'utf8');
}

// A payload (Buffer) as {task, args, kwargs, meta}, values decoded; EnvelopeError with
// the error texts of README §9.1 when it is not an envelope this worker reads.
function decodeEnvelope(payload) {
  let obj;
  try {
    obj = fromJson(JSON.parse(utf8.decode(payload)));
  } catch (err) {
    throw new EnvelopeError(`not a task envelope: ${err.message}`);
  }
  if (!isPlainObject(obj) || !('task' in obj)) {
    throw new EnvelopeError("not a task envelope: a JSON object with 'v' and 'task' is expected");
  }
  if (obj.v !== VERSION) {
    throw new EnvelopeError(`task envelope version ${JSON.stringify(obj.v)} is not known to this worker (it reads ${VERSION})`);
  }
  const { task, args = [], kwargs = {}, meta = {} } = obj;
  if (typeof task !== 'string' || !Array.isArray(args) || !isPlainObject(kwargs) || !isPlainObject(meta)) {
    throw new EnvelopeError('malformed task envelope: task must be a string, args a list, kwargs and meta objects');
  }
  return { task, args, kwargs, meta };
}

// A stored result (README §9.6): 'j' + JSON (tags decoded), 's' + UTF-8 text, 'b' + bytes.
function decodeResult(value) {
  const kind = String.fromCharCode(value[0]);
  const body = value.subarray(1);
  if (kind === 'j') return fromJson(JSON.parse(utf8.decode(body)));
  if (kind === 's') return utf8.decode(body);
  if (kind === 'b') return Buffer.from(body);
  throw new CodecError(`a stored result has an unknown kind ${JSON.stringify(kind)}`);
}

// The value ack_result stores for a task's return value: 'j' + the tagged JSON.
function encodeResult(value, task) {
  const encoded = Buffer.from(`j${JSON.stringify(toJson(value === undefined ? null : value, `${task} result`))}`, 'utf8');
  if (encoded.length > MAX_RESULT_BYTES) {
    throw new CodecError(`a result may hold at most ${MAX_RESULT_BYTES} bytes encoded, got ${encoded.length}`);
  }
  return encoded;
}

// unique=True's job id (README §9.4): "<task>:" + 32 hex digits of the SHA-256 of the
// canonical text of [task, args, kwargs], every argument given as Python binds it.
function uniqueId(task, args, kwargs) {
  const where = `${task} argument`;
  const text = canonical([task, toJson(args, where), toJson(kwargs, where)]);
  return `${task}:${crypto.createHash('sha256').update(text, 'utf8').digest('hex').slice(0, 32)}`;
}

class TaskError extends Error {}
class TaskDead extends TaskError {
  constructor(id, error) {
    super(`task job ${id} is dead: ${error}`);
    this.id = id;
    this.error = error;
  }
}

// Sends tasks (README §9.4) and reads their results (§9.6). One connection for calls;
// waiting on the finished stream blocks, so it takes a duplicate of its own.
class TaskClient {
  constructor(redis, { prefix = 'pq', clockRefreshMs = 60000 } = {}) {
    this.redis = redis;
    this.prefix = prefix;
    this.clockRefreshMs = clockRefreshMs;
    this.queues = new Map();
    this.offsetMs = null; // the server's clock minus ours
    this.offsetAt = -Infinity;
    this.blocker = null;
  }

  queue(name) {
    if (!this.queues.has(name)) this.queues.set(name, new Queue(this.redis, name, { prefix: this.prefix }));
    return this.queues.get(name);
  }

  // Our clock plus an offset read with TIME, taken against the middle of the round
  // trip and read again every clockRefreshMs (README §9.3, enqueued_ms). Of three reads
  // the one with the shortest round trip counts: the first may wait for the connection.
  async serverNowMs() {
    if (this.offsetMs === null || performance.now() - this.offsetAt > this.clockRefreshMs) {
      let best = null;
      for (let i = 0; i < 3; i += 1) {
        const sent = Date.now();
        const [seconds, micros] = await this.redis.time();
        const received = Date.now();
        const serverMs = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
        if (best === null || received - sent < best.roundTrip) {
          best = { roundTrip: received - sent, offset: Math.round(serverMs - (sent + received) / 2) };
        }
      }
      this.offsetMs = best.offset;
      this.offsetAt = performance.now();
    }
    return Date.now() + this.offsetMs;
  }

  // One enqueue of the envelope. Options: queue, id (else random, or unique), unique
  // (true: uniqueId), maxAttempts (default 5, as Python's), delayMs, opts (meta.opts,
  // plain JSON), meta (more meta keys: traceparent...). Returns {id, added, payload}.
  async send(task, args = [], kwargs = {}, {
    queue = 'default', id = null, unique = false, maxAttempts = 5, delayMs = 0, opts = null, meta = {},
  } = {}) {
    const fullMeta = { enqueued_ms: await this.serverNowMs() };
    if (opts && Object.keys(opts).length > 0) fullMeta.opts = opts;
    for (const [k, v] of Object.entries(meta)) {
      if (k in fullMeta) throw new EnvelopeError(`meta.${k} is written by the producer itself`);
      fullMeta[k] = v;
    }
    const payload = encodeEnvelope(task, args, kwargs, fullMeta);
    const jobId = id ?? (unique ? uniqueId(task, args, kwargs) : crypto.randomBytes(10).toString('hex'));
    const { flags } = await this.queue(queue).enqueue([{ id: jobId, payload, delayMs, maxAttempts }]);
    return { id: jobId, added: flags[0] === 1, payload };
  }

  // Wait up to timeoutMs for the job to end: {state: 'ok', value} | {state: 'done'} |
  // throws TaskDead; {state: 'pending'|'unknown'} when the time ran out. Reads again
  // when the finished stream moves, and 50 ms after the first read, then twice as long
  // each time up to 2 s apart (an ack without a result adds no stream entry).
  async result(id, { queue = 'default', timeoutMs = 10000 } = {}) {
    const q = this.queue(queue);
    const end = performance.now() + timeoutMs;
    let sliceMs = 50;
    for (;;) {
      const r = await q.result(id);
      if (r.state === 'ok') return { state: 'ok', value: decodeResult(r.value), raw: r.value, finishedMs: r.finishedMs };
      if (r.state === 'dead') throw new TaskDead(id, r.value.toString('utf8'));
      if (r.state === 'done') return { state: 'done', value: null };
      const left = end - performance.now();
      if (left <= 0) return { state: r.state, value: null };
      this.blocker ??= this.redis.duplicate();
      const ms = Math.max(1, Math.floor(Math.min(left, sliceMs)));
      await this.blocker.xreadBuffer('BLOCK', ms, 'STREAMS', q.key('finished'), r.lastId);
      sliceMs = Math.min(2000, sliceMs * 2);
    }
  }

  close() {
    if (this.blocker) this.blocker.disconnect();
  }
}

// Python's error text, "<type>: <message>" (README §9.5).
function errorText(err) {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : `Error: ${String(err)}`;
  return text.slice(0, MAX_ERROR_CHARS);
}

function seconds(ms) {
  return String(ms / 1000);
}

// Runs task jobs (README §9.5). registry: {name: {fn(args, kwargs, job), keepResultMs}}:
// keepResultMs (null: no result kept) must match the producer's registration. Applies
// opts keep_result_ms, max_age_ms and the fixed/exponential backoffs; reports the other
// keys (time_limit_ms, backoff.function, retry_on, fail_on, unknown ones) as ignored.
// An unknown task name is nacked final (this worker knows no other version serves
// the queue); an envelope it cannot read is nacked with backoff, never acked.
class TaskWorker {
  constructor(queue, registry, { log = () => {} } = {}) {
    this.queue = queue;
    this.registry = registry;
    this.log = log;
  }

  // Lease up to `count` jobs and run them; the report of each.
  async runOnce({ count = 1, leaseMs = 30000 } = {}) {
    const leased = await this.queue.lease({ count, leaseMs });
    const reports = [];
    for (const job of leased.jobs) reports.push(await this.reportFlow(job, await this.handle(job, leased.nowMs)));
    return { reports, leased };
  }

  // A flow's step (README §2.2, its envelope's meta.flow.then lists the steps waiting
  // for it): once its ack answered ok, or its nack sent it to DEAD, report its end to
  // each of them (flow_done in the waiting step's queue). A worker that dies first
  // leaves the report to the Python workers' flow checks.
  async reportFlow(job, report) {
    const then = report.flowThen;
    delete report.flowThen;
    const acked = (report.how === 'ack' || report.how === 'ack_result') && report.status === 'ok';
    const dead = report.state === 'dead' && report.status === 'ok';
    if (!Array.isArray(then) || !(acked || dead)) return report;
    report.flow = [];
    for (const [queue, id, policy] of then) {
      const waiting = new Queue(this.queue.redis, queue, { prefix: this.queue.prefix, runner: this.queue.runner });
      const done = await waiting.flowDone(id, [[this.queue.name, job.id.toString('utf8'), acked ? 'ok' : 'failed']],
        { policy });
      report.flow.push({ queue, id, ...done });
    }
    return report;
  }

  async handle(job, nowMs) {
    const report = { id: job.id.toString('utf8'), attempt: job.attempt, ignored: [] };
    let env;
    try {
      env = decodeEnvelope(job.payload);
    } catch (err) {
      if (!(err instanceof EnvelopeError)) throw err;
      return this.end(report, 'nack', await this.queue.nack(job.receipt, err.message));
    }
    report.task = env.task;
    if (isPlainObject(env.meta.flow)) report.flowThen = env.meta.flow.then;
    const entry = Object.prototype.hasOwnProperty.call(this.registry, env.task) ? this.registry[env.task] : null;
    if (entry === null) {
      return this.end(report, 'nack final',
        await this.queue.nack(job.receipt, `unknown task '${env.task}'`, { final: true }));
    }
    const policy = { keepResultMs: entry.keepResultMs ?? null, backoff: entry.backoff ?? null, maxAgeMs: null };
    const opts = isPlainObject(env.meta.opts) ? env.meta.opts : {};
    for (const [key, value] of Object.entries(opts)) {
      if (key === 'keep_result_ms' && (value === null || (Number.isSafeInteger(value) && value >= 0))) {
        policy.keepResultMs = value;
      } else if (key === 'max_age_ms' && (value === null || (Number.isSafeInteger(value) && value >= 0))) {
        policy.maxAgeMs = value;
      } else if (key === 'backoff' && value === null) {
        policy.backoff = null;
      } else if (key === 'backoff' && isPlainObject(value) && Array.isArray(value.fixed)) {
        policy.backoff = { fixedMs: value.fixed[0] };
      } else if (key === 'backoff' && isPlainObject(value) && Array.isArray(value.exponential)) {
        policy.backoff = { baseMs: value.exponential[0], capMs: value.exponential[1] };
      } else {
        report.ignored.push(key);
        this.log(`job ${report.id} [${env.task}]: ignoring opts.${key} = ${JSON.stringify(value)} (not applied by this worker)`);
      }
    }
    const enqueuedMs = Number.isSafeInteger(env.meta.enqueued_ms) ? env.meta.enqueued_ms : null;
    if (policy.maxAgeMs !== null && enqueuedMs !== null && nowMs - enqueuedMs > policy.maxAgeMs) {
      const error = `max_age exceeded: sent ${((nowMs - enqueuedMs) / 1000).toFixed(3)}s ago, max_age is `
        + `${seconds(policy.maxAgeMs)}s; not run`;
      return this.end(report, 'nack final', await this.queue.nack(job.receipt, error, { final: true }));
    }
    let value;
    try {
      value = await entry.fn(env.args, env.kwargs, { id: report.id, attempt: job.attempt, maxAttempts: job.maxAttempts,
        fence: job.fence, enqueuedMs, meta: env.meta });
    } catch (err) {
      const b = policy.backoff;
      const nackOpts = b === null ? { ...DEFAULT_BACKOFF }
        : b.fixedMs !== undefined ? { delayMs: b.fixedMs } : { baseMs: b.baseMs, capMs: b.capMs };
      return this.end(report, 'nack', await this.queue.nack(job.receipt, errorText(err), nackOpts));
    }
    if (policy.keepResultMs === null) return this.end(report, 'ack', { status: (await this.queue.ack([job.receipt]))[0] });
    let encoded;
    try {
      encoded = encodeResult(value, env.task);
    } catch (err) {
      return this.end(report, 'nack final', await this.queue.nack(job.receipt,
        `the result cannot be stored: ${err.message}`, { final: true }));
    }
    const [status] = await this.queue.ackResult([[job.receipt, encoded]], { resultTtlMs: Math.max(1, policy.keepResultMs) });
    report.result = encoded.toString('utf8');
    return this.end(report, 'ack_result', { status });
  }

  end(report, how, reply) {
    return { ...report, how, status: reply.status, state: reply.state ?? null };
  }
}

module.exports = {
  TAG, VERSION, Tagged, CodecError, EnvelopeError, TaskError, TaskDead, TaskClient, TaskWorker, toJson, fromJson,
  canonical, encodeEnvelope, decodeEnvelope, encodeResult, decodeResult, uniqueId, errorText,
};
