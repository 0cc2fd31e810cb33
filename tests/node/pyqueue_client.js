'use strict';
// A minimal Node.js client of the pyqueue Lua scripts, written from lua/README.md and
// the scripts' header comments (the contract for other languages). It exists to prove
// that another language can load lua/*.lua verbatim and share queues with the Python
// driver; tests/test_node_conformance.py drives it through conformance.js.

const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');
const Redis = require('ioredis');

const LUA_DIR = path.resolve(__dirname, '..', '..', 'lua');

// KEYS of each script, in the order its header lists them (README §4.2). A script
// never builds a key name: the client passes every key.
const SCRIPT_KEYS = {
  enqueue: ['jobs', 'ready', 'scheduled', 'counters', 'wake', 'done', 'meta', 'gready', 'ring', 'groups', 'events',
    'keyed', 'windows', 'expires', 'sequenced', 'index'],
  lease: ['jobs', 'ready', 'scheduled', 'leased', 'owners', 'dead', 'errors', 'counters', 'wake', 'done',
    'meta', 'gready', 'ring', 'groups', 'events', 'steps', 'waiting', 'expires', 'expired', 'keyed', 'sequenced',
    'windows', 'index'],
  ack: ['jobs', 'leased', 'owners', 'done', 'wake', 'meta', 'gready', 'ring', 'groups', 'counters', 'events',
    'steps', 'waiting', 'scheduled', 'keyed', 'sequenced', 'index'],
  nack: ['jobs', 'scheduled', 'leased', 'owners', 'dead', 'errors', 'counters', 'wake', 'finished',
    'meta', 'gready', 'ring', 'groups', 'events', 'keyed', 'sequenced'],
  extend: ['jobs', 'leased'],
  release: ['jobs', 'ready', 'leased', 'owners', 'counters', 'wake', 'meta', 'gready', 'ring', 'groups', 'events'],
  stats: ['jobs', 'ready', 'scheduled', 'leased', 'dead', 'counters', 'done', 'gready', 'ring', 'waiting', 'sequenced'],
  scrub: ['jobs', 'ready', 'leased', 'owners', 'dead', 'errors', 'counters', 'wake', 'meta', 'gready', 'ring', 'groups',
    'events', 'scheduled', 'keyed', 'sequenced'],
  cancel: ['jobs', 'ready', 'scheduled', 'leased', 'owners', 'dead', 'errors', 'counters', 'done', 'wake',
    'meta', 'gready', 'ring', 'groups', 'events', 'steps', 'waiting', 'expires', 'keyed', 'sequenced', 'index'],
  limit: ['counters', 'wake'],
  set_group_limit: ['counters', 'wake', 'ring', 'groups'],
  set_rate_limit: ['keyed'],
  defer_key: ['leased', 'keyed', 'windows'],
  set_budget: ['counters'],
  set_result_budget: ['counters'],
  set_tombstone_limit: ['counters'],
  set_indexes: ['counters'],
  search: ['jobs', 'ready', 'scheduled', 'leased', 'dead', 'errors', 'counters', 'index', 'keyed', 'waiting', 'gready'],
  promote_now: ['jobs', 'scheduled', 'waiting', 'wake'],
  dead_purge: ['jobs', 'dead', 'errors', 'counters', 'meta', 'steps', 'waiting', 'scheduled', 'wake', 'keyed',
    'sequenced', 'index'],
  ack_result: ['jobs', 'leased', 'owners', 'done', 'results', 'result_expiry', 'finished', 'wake',
    'meta', 'gready', 'ring', 'groups', 'counters', 'events', 'steps', 'waiting', 'scheduled', 'keyed', 'sequenced',
    'index'],
  signal: ['jobs', 'scheduled', 'dead', 'steps', 'waiting', 'counters', 'wake', 'events'],
  result: ['jobs', 'dead', 'errors', 'done', 'results', 'result_expiry', 'finished'],
  flow_done: ['jobs', 'scheduled', 'wake', 'fwait', 'fpending'],
  set_events: ['counters', 'events'],
};

// The service scripts' KEYS (README §7): namespace keys <prefix>:{<ns>}:service:<role>,
// and the keys of one service id, ...:service:<id> (role "service") and
// ...:service:<id>:wake (role "wake").
const SERVICE_SCRIPT_KEYS = {
  service_register: ['seq', 'ids', 'expiry', 'queues', 'service'],
  service_renew: ['service', 'expiry', 'queues'],
  service_stop: ['service', 'wake'],
  service_deregister: ['service', 'ids', 'expiry', 'queues', 'wake'],
};

// The Python driver's default (README §2, tombstones): every acker of a queue should
// pass the same keep_done_ms, so producers get the same protection whoever acks.
const DEFAULT_KEEP_DONE_MS = 300000;
const NAME_RE = /^[!-~]{1,128}$/; // printable ASCII without space (braces: below)
const TOKEN_RE = /^[A-Za-z0-9_.:-]{1,64}$/; // owner and call (README §6)
const NAMESPACE_RE = /^[A-Za-z0-9_.:-]{1,40}$/; // part of lease owners (README §6 defaults)
const REGISTRATION_RE = /^[A-Za-z0-9]{1,16}$/; // README §7

// Python's values (README §6, defaults), which a service sharing a namespace matches.
const SERVICE_DEFAULTS = { namespace: 'workers', expireMs: 60000, capacity: 1000, gcLimit: 10, deadLimit: 20 };

class PqError extends Error {
  // Error replies are "<CODE> <detail>" (README §5): dispatch on the first word.
  constructor(err) {
    super(err.message);
    this.code = err.message.split(' ', 1)[0];
  }
}

// The contract version this client is written for (README §10): the KEYS and ARGV of
// every script as SCRIPT_KEYS and the calls below send them.
const CONTRACT_VERSION = 6;

// The contract version a script's header states (its line "Contract v<n>"), or null.
function contractVersion(source) {
  const header = source.toString('latin1').split('\n]]\n', 1)[0];
  const m = /^Contract v(\d+)\b/m.exec(header);
  return m ? Number(m[1]) : null;
}

// Scripts as the bytes of their files: the SHA1 of those bytes is the SHA every
// language computes (README §1), so Python and Node share one loaded copy. Scripts of
// another contract version are refused here, before any call can send them counts of
// KEYS or ARGV they do not take.
function loadScripts(dir = LUA_DIR) {
  const scripts = {};
  for (const name of [...Object.keys(SCRIPT_KEYS), ...Object.keys(SERVICE_SCRIPT_KEYS)]) {
    const source = fs.readFileSync(path.join(dir, `${name}.lua`)); // a Buffer, never decoded
    const version = contractVersion(source);
    if (version !== CONTRACT_VERSION) {
      throw new Error(`${name}.lua states contract v${version}, this client speaks v${CONTRACT_VERSION}`);
    }
    scripts[name] = { source, sha: crypto.createHash('sha1').update(source).digest('hex') };
  }
  return scripts;
}

// EVALSHA with our own SHA; on NOSCRIPT (fresh server, restart, SCRIPT FLUSH) load the
// exact bytes and re-send the identical call. Replies come back as Buffers: a payload is
// arbitrary bytes, and decoding it as UTF-8 would corrupt it. One runner may serve
// several Queue and Service objects on one connection.
class ScriptRunner {
  constructor(redis) {
    this.redis = redis;
    this.scripts = loadScripts();
    this.reloads = 0; // how often NOSCRIPT made us SCRIPT LOAD (reported by tests)
  }

  async run(name, keys, args) {
    const { source, sha } = this.scripts[name];
    const call = () => this.redis.evalshaBuffer(sha, keys.length, ...keys, ...args);
    try {
      return await call();
    } catch (err) {
      if (!String(err.message).startsWith('NOSCRIPT')) throw new PqError(err);
      const loaded = await this.redis.script('LOAD', source);
      if (loaded !== sha) throw new Error(`SCRIPT LOAD ${name}: server says ${loaded}, we computed ${sha}`);
      this.reloads += 1;
      try {
        return await call();
      } catch (err2) {
        throw new PqError(err2);
      }
    }
  }
}

// "unix:///path", "/path" or "redis://host:port/db". protocol 2 (ioredis 6 defaults to
// RESP3): the wire the README's examples and the Python driver use. The scripts reply
// integers and strings only, so RESP3 gives the same values.
function connect(target) {
  const options = { protocol: 2, maxRetriesPerRequest: 3 };
  if (target.startsWith('unix://')) return new Redis({ ...options, path: target.slice('unix://'.length) });
  if (target.startsWith('/')) return new Redis({ ...options, path: target });
  return new Redis(target, options);
}

// Integers travel as decimal strings (README §6); Number.isSafeInteger keeps them exact.
function int(value, name, lo, hi) {
  if (!Number.isSafeInteger(value) || value < lo || value > hi) {
    throw new RangeError(`${name} must be an integer in [${lo}, ${hi}], got ${value}`);
  }
  return String(value);
}

// A job's task name (README §2.8): 1..256 UTF-8 bytes without control characters.
function taskName(name) {
  const bytes = Buffer.byteLength(String(name));
  if (typeof name !== 'string' || bytes < 1 || bytes > 256 || /[\x00-\x1f\x7f]/.test(name)) {
    throw new RangeError(`a task name is 1..256 bytes without control characters, got ${JSON.stringify(name)}`);
  }
  return name;
}

// A fresh random token per logical lease call; a retry must re-send the same one
// (README §1). ioredis re-sends a queued command unchanged after a reconnect, which
// keeps that promise for us.
function newCall() {
  return crypto.randomBytes(8).toString('hex');
}

const str = (b) => b.toString('latin1'); // statuses are ASCII ('ok', 'stale', ...)

class Queue {
  // owner: who holds the leases. A registered service passes its lease owner
  // <ns>.<id>.<registration> (Service.owner, README §7), so its leases can be scrubbed
  // when it dies. The default is a random owner no service can have (README §6): its
  // leases are recovered by expiry only, never by a scrub.
  constructor(redis, name, { prefix = 'pq', owner = `node-${crypto.randomBytes(6).toString('hex')}`,
    keepDoneMs = DEFAULT_KEEP_DONE_MS, runner = new ScriptRunner(redis) } = {}) {
    for (const [what, value] of [['prefix', prefix], ['queue name', name]]) {
      // Braces would break the {<queue>} hash tag; the scripts do not check names.
      if (!NAME_RE.test(value) || /[{}]/.test(value)) throw new RangeError(`bad ${what} ${JSON.stringify(value)}`);
    }
    if (!TOKEN_RE.test(owner)) throw new RangeError(`bad owner ${JSON.stringify(owner)}`);
    this.redis = redis;
    this.name = name;
    this.owner = owner;
    this.keepDoneMs = keepDoneMs;
    this.prefix = prefix;
    this.runner = runner;
  }

  get reloads() {
    return this.runner.reloads;
  }

  key(role) {
    return `${this.prefix}:{${this.name}}:${role}`;
  }

  async run(name, args) {
    return this.runner.run(name, SCRIPT_KEYS[name].map((role) => this.key(role)), args);
  }

  // jobs: [{id, payload (Buffer or string), delayMs, maxAttempts, priority, group, expiresMs,
  // key}], 1..1000 per call; priority (-5..5) and group (README §2.1), expiresMs and key
  // are optional. key (README §2.7): a flow key ("debounce|<window_ms>|<key>",
  // "throttle|<window_ms>|<key>" or "sequence|<block or skip>|<key>"), a rate key
  // ("rate|<count>/<period_ms>/<burst>/<cost>|<key>", cost 1..burst), or both joined by
  // a newline, the flow key first. task: a task name (README §2.8), sent as a line
  // "task|<name>" of key: a queue that keeps indexes lists the job under it.
  // flags[i]: 1 added, 0 a duplicate, or the id of the job its key gave the send to.
  // Under a byte budget (setBudget) a send past it throws a PqError with code PQ_FULL,
  // and nothing of the call was written (README §2.7).
  async enqueue(jobs) {
    if (jobs.length < 1 || jobs.length > 1000) throw new RangeError('1..1000 jobs per enqueue');
    const args = ['', String(jobs.length)]; // '' = the server clock (production)
    for (const j of jobs) {
      args.push(j.id, Buffer.from(j.payload), int(j.delayMs ?? 0, 'delay_ms', 0, 2 ** 40),
        int(j.maxAttempts ?? 5, 'max_attempts', 1, 10000),
        j.priority ? int(j.priority, 'priority', -5, 5) : '', j.group ?? '',
        j.expiresMs ? int(j.expiresMs, 'expires_ms', 1, 2 ** 40) : '',
        [j.key, j.task === undefined ? undefined : `task|${taskName(j.task)}`].filter((line) => line).join('\n'));
    }
    const [added, duplicates, ...flags] = await this.run('enqueue', args);
    return { added, duplicates, flags: flags.map((f) => (typeof f === 'number' ? f : f.toString('utf8'))) };
  }

  // The whole lease call: ack `acks` (receipts) first, then lease up to `count`.
  async lease({ count = 1, leaseMs = 30000, limit = 100, acks = [], call = newCall() } = {}) {
    if (!TOKEN_RE.test(call)) throw new RangeError(`bad call token ${call}`);
    const reply = await this.run('lease', [
      '', this.owner, call, int(count, 'count', 0, 1000), int(leaseMs, 'lease_ms', 1, 604800000),
      int(limit, 'limit', 1, 1000), int(this.keepDoneMs, 'keep_done_ms', 0, 2 ** 40), ...acks,
    ]);
    // Flat reply: now_ms, next_due_ms, r, r statuses, m, then m groups of 8 (README §4.2).
    const [nowMs, nextDueMs, r] = reply;
    const ackStatuses = reply.slice(3, 3 + r).map(str);
    const m = reply[3 + r];
    const jobs = [];
    for (let i = 0, at = 4 + r; i < m; i += 1, at += 8) {
      const [receipt, id, payload, fence, attempt, maxAttempts, deadlineMs, sent] = reply.slice(at, at + 8);
      // enqueuedMs: when the job was sent, server clock; null for a record older than contract v5.
      jobs.push({ receipt, id, payload, fence, attempt, maxAttempts, deadlineMs, enqueuedMs: sent < 0 ? null : sent });
    }
    return { nowMs, nextDueMs, acks: ackStatuses, jobs, call };
  }

  // Send job `id` the signal `name` (README §2.6): its payload as the task layer reads
  // it, 'j' + JSON. Answers 'woke', 'kept', or a refusal ('unknown', 'dead', 'duplicate',
  // 'closed').
  async signal(id, name, data) {
    const payload = Buffer.concat([Buffer.from('j'), Buffer.from(JSON.stringify(data ?? null))]);
    const [status] = await this.run('signal', ['', id, name, payload]);
    return str(status);
  }

  // Receipts are opaque Buffers, passed back exactly as lease returned them.
  async ack(receipts) {
    return (await this.run('ack', ['', int(this.keepDoneMs, 'keep_done_ms', 0, 2 ** 40), ...receipts])).map(str);
  }

  // delayMs null: the script's backoff with jitter (base/cap as the Python defaults).
  // final: the job goes to DEAD now, whatever its attempt (ARGV 7 '1'); without it the
  // call sends the 6 ARGV nack has always taken.
  async nack(receipt, error, { delayMs = null, baseMs = 1000, capMs = 3600000, final = false } = {}) {
    if (typeof final !== 'boolean') throw new TypeError('final must be a boolean');
    const delay = delayMs === null ? '' : int(delayMs, 'delay_ms', 0, 2 ** 40);
    const [status, state, atMs] = await this.run('nack', [
      '', receipt, Buffer.from(error), delay, int(baseMs, 'base_ms', 1, 2 ** 40), int(capMs, 'cap_ms', 1, 2 ** 40),
      ...(final ? ['1'] : []),
    ]);
    return { status: str(status), state: str(state), atMs };
  }

  async extend(receipts, leaseMs) {
    const reply = await this.run('extend', ['', int(leaseMs, 'lease_ms', 1, 604800000), ...receipts]);
    const out = [];
    for (let i = 0; i < reply.length; i += 2) out.push({ status: str(reply[i]), deadlineMs: reply[i + 1] });
    return out;
  }

  async release(receipts) {
    return (await this.run('release', ['', ...receipts])).map(str);
  }

  // Name/value pairs (38 under contract v6, README §4.2), read by name: a later contract
  // may add pairs.
  async stats() {
    const reply = await this.run('stats', ['']);
    const out = {};
    for (let i = 0; i < reply.length; i += 2) out[str(reply[i])] = reply[i + 1];
    return out;
  }

  // End a job in any state (README §4.2 cancel): the state it was cancelled in, or
  // 'done' / 'unknown' with nothing changed.
  async cancel(id) {
    const [state] = await this.run('cancel', ['', id, int(this.keepDoneMs, 'keep_done_ms', 0, 2 ** 40)]);
    return str(state);
  }

  // At most `count` leases per `periodMs` across all workers (0 lifts the cap).
  async limit(count, periodMs = 1000, burst = 1) {
    const [c, p, b, changed] = await this.run('limit', [
      int(count, 'count', 0, 1000000), int(periodMs, 'period_ms', 1, 86400000), int(burst, 'burst', 1, 1000000),
    ]);
    return { count: c, periodMs: p, burst: b, changed: changed === 1 };
  }

  // Set the limit of one rate key at run time (README §2.7): it wins over the limit its
  // jobs carry. limit null goes back to theirs; count 0 lets the key's jobs through.
  async setRateLimit(key, limit = null) {
    const arg = limit === null ? '' : [int(limit.count, 'count', 0, 1000000),
      int(limit.periodMs ?? 1000, 'period_ms', 1, 86400000), int(limit.burst ?? 1, 'burst', 1, 1000000)].join('/');
    const [changed] = await this.run('set_rate_limit', [key, arg]);
    return changed === 1;
  }

  // The rate key of a job this client holds (its receipt) takes no job until now + forMs
  // (README §2.7): {status: 'deferred' | 'unlimited' | 'lost', untilMs}.
  async deferKey(receipt, forMs) {
    const [status, untilMs] = await this.run('defer_key', ['', receipt, int(forMs, 'for_ms', 0, 2 ** 40)]);
    return { status: str(status), untilMs };
  }

  // Cap the payload bytes the queue holds (README §2.7): an enqueue that would take it
  // past maxBytes is refused with PQ_FULL. null (or 0) lifts the cap. Jobs sent without a
  // budget are not counted. {changed, bytes}: whether the cap changed, and the bytes the
  // queue's sized jobs hold now.
  async setBudget(maxBytes = null) {
    const [changed, bytes] = await this.run('set_budget', [int(maxBytes ?? 0, 'max_bytes', 0, 2 ** 50)]);
    return { changed: changed === 1, bytes };
  }

  // Cap the bytes of results the queue keeps (README §2, results): under the cap
  // ack_result keeps each result's size and deletes the oldest-expiring results before
  // their sum would pass it. null (or 0) lifts the cap. Results stored without a budget
  // are not counted. {changed, bytes}: whether the cap changed, and the bytes of the
  // queue's sized results now.
  async setResultBudget(maxBytes = null) {
    const [changed, bytes] = await this.run('set_result_budget', [int(maxBytes ?? 0, 'max_bytes', 0, 2 ** 50)]);
    return { changed: changed === 1, bytes };
  }

  // Cap how many tombstones the queue keeps (README §2, tombstones): past the cap the
  // scripts that write them (ack, ack_result, lease, cancel) delete the earliest-expiring
  // first, at most n + 10 a call; an id whose tombstone went is no longer a duplicate.
  // null (or 0) lifts the cap. Whether this call changed it.
  async setTombstoneLimit(maxCount = null) {
    const [changed] = await this.run('set_tombstone_limit', [int(maxCount ?? 0, 'max_count', 0, 2 ** 40)]);
    return changed === 1;
  }

  // Keep the indexes search reads by task and group (README §2.8), or stop: since when
  // the queue keeps them (null: none).
  async setIndexes(on = true) {
    const [, sinceMs] = await this.run('set_indexes', ['', on ? '1' : '0']);
    return sinceMs < 0 ? null : sinceMs;
  }

  // One page of the jobs that match every filter given (README §2.8, §4.2 search):
  // {nowMs, cursor ('' when the source is exhausted), examined, indexedSinceMs, jobs}.
  // A page may hold no match and still have a cursor: call again with it.
  async search({ state = '', task = '', group = '', error = '', sinceMs = null, untilMs = null, cursor = '',
    count = 100 } = {}) {
    const reply = await this.run('search', ['', state, task, group, error,
      sinceMs === null ? '' : int(sinceMs, 'since_ms', 0, 2 ** 50),
      untilMs === null ? '' : int(untilMs, 'until_ms', 0, 2 ** 50), cursor, int(count, 'count', 1, 500)]);
    const [nowMs, next, examined, since] = reply;
    const jobs = [];
    for (let at = 4; at < reply.length; at += 10) {
      const [id, st, attempts, maxAttempts, enqueuedMs, atMs, t, g, extra, payloadBytes] = reply.slice(at, at + 10);
      const utf8 = (b) => b.toString('utf8');
      jobs.push({ id: utf8(id), state: str(st), attempts, maxAttempts, enqueuedMs, atMs, task: utf8(t), group: utf8(g),
        extra: utf8(extra), payloadBytes });
    }
    return { nowMs, cursor: str(next), examined, indexedSinceMs: since < 0 ? null : since, jobs };
  }

  // Make scheduled jobs due now (README §2.8): the ids that were SCHEDULED for later.
  async promoteNow(ids) {
    if (ids.length < 1 || ids.length > 1000) throw new RangeError('1..1000 ids per call');
    const [, ...promoted] = await this.run('promote_now', ['', ...ids]);
    return promoted.map(str);
  }

  // Delete dead jobs for good (README §4.2 dead_purge): [purged, remaining].
  async deadPurge(ids) {
    return this.run('dead_purge', ids);
  }

  // Cap how many jobs of one group run at once (README §2.1): group '' is the default.
  async setGroupLimit(cap, group = '') {
    const [changed, unparked] = await this.run('set_group_limit', [group, int(cap, 'cap', 0, 1000000)]);
    return { changed: changed === 1, unparked };
  }

  // Opt this queue in to its event stream (README §2.5), keeping the newest `bound`
  // events; 0 opts out.
  async setEvents(bound) {
    const [previous, length] = await this.run('set_events', [int(bound, 'bound', 0, 10000000)]);
    return { previous, length };
  }

  // Up to `count` events after event number `since` (README §2.5): entry IDs are 0-<n>,
  // so a gap in the numbers is what the stream's bound trimmed before this read.
  async events(since = 0, count = 100) {
    const entries = await this.redis.xrange(this.key('events'), `(0-${int(since, 'since', 0, 2 ** 53)}`, '+',
      'COUNT', int(count, 'count', 1, 1000));
    const events = entries.map(([id, fields]) => {
      const event = { seq: Number(id.split('-')[1]) };
      for (let i = 0; i < fields.length; i += 2) event[fields[i]] = fields[i + 1];
      return event;
    });
    return { events, missed: events.length ? events[0].seq - since - 1 : 0 };
  }

  // Ack with results: pairs of [receipt, value]; a value is pyqueue's encoding (README
  // §2 `results`): 'b' + bytes, 's' + UTF-8 text, or 'j' + JSON.
  async ackResult(pairs, { resultTtlMs = 3600000, maxResults = 10000 } = {}) {
    const args = ['', int(this.keepDoneMs, 'keep_done_ms', 0, 2 ** 40), int(resultTtlMs, 'result_ttl_ms', 1, 2 ** 40),
      int(maxResults, 'max_results', 1, 10000000)];
    for (const [receipt, value] of pairs) args.push(receipt, Buffer.from(value));
    return (await this.run('ack_result', args)).map(str);
  }

  async result(id) {
    const [nowMs, state, finishedMs, value, lastId] = await this.run('result', ['', id]);
    return { nowMs, state: str(state), finishedMs, value, lastId: str(lastId) };
  }

  // Report that jobs the waiting job `id` of this queue waits for have ended (README
  // §2.2): ended is [[queue, jobId, 'ok' | 'failed'], ...] (0..1000). Idempotent: a job
  // reported before counts 0; the report that ends the wait releases the job.
  async flowDone(id, ended, { policy = 'fail', checkMs = 10000 } = {}) {
    if (policy !== 'fail' && policy !== 'continue') throw new RangeError(`bad policy ${JSON.stringify(policy)}`);
    const args = ['', id, policy, int(checkMs, 'check_ms', 1, 2 ** 40)];
    for (const [queue, jobId, how] of ended) args.push(`${queue}\t${jobId}`, how);
    const [state, counted] = await this.run('flow_done', args);
    return { state: str(state), counted };
  }

  // End every lease of a dead service's owner in this queue (README §7): each job goes
  // to the head of READY with the attempt counted, or to DEAD at max_attempts.
  async scrub(owner, { limit = 100 } = {}) {
    if (!TOKEN_RE.test(owner)) throw new RangeError(`bad owner ${JSON.stringify(owner)}`);
    const [scrubbed, dead, more] = await this.run('scrub', ['', owner, int(limit, 'limit', 1, 1000)]);
    return { scrubbed, dead, more: more === 1 };
  }

  // The timeout of the blocking wait of README §2 "Wake marker": next_due_ms - now_ms
  // (both from the same lease reply, both server clock), capped at blockMs, or blockMs
  // when next_due_ms is -1. 0 means the time is already up (next_due_ms = now_ms means
  // "call again at once"): lease again without blocking, since a BZPOPMIN timeout of 0
  // would block forever.
  waitMs(leased, blockMs) {
    let ms = blockMs;
    if (leased.nextDueMs >= 0) ms = Math.min(blockMs, leased.nextDueMs - leased.nowMs);
    return Math.max(0, ms);
  }

  // BZPOPMIN on the wake key for waitMs(). Redis ends a timed block on its hz tick, so a
  // wait may run up to ~100 ms past next_due_ms; that costs latency, never correctness.
  async waitForWork(blocker, leased, blockMs) {
    const ms = this.waitMs(leased, blockMs);
    if (ms < 1) return 'due';
    const popped = await blocker.bzpopminBuffer(this.key('wake'), seconds(ms));
    return popped === null ? 'timeout' : 'woken';
  }
}

// A BZPOPMIN timeout in seconds, for ms >= 1 (never '0.000': that blocks forever).
function seconds(ms) {
  if (!(ms >= 1)) throw new RangeError(`a blocking wait needs at least 1 ms, got ${ms}`);
  return (ms / 1000).toFixed(3);
}

const hexToken = (bytes) => crypto.randomBytes(bytes).toString('hex');
const monotonicMs = () => performance.now();

// A registration in a service namespace (README §7): register, renew, read its own key,
// deregister; forget dead services once scrubbed. Keys: <prefix>:{<ns>}:service:<role>.
class Service {
  constructor(redis, { namespace = SERVICE_DEFAULTS.namespace, prefix = 'pq', runner = new ScriptRunner(redis) } = {}) {
    if (!NAMESPACE_RE.test(namespace)) throw new RangeError(`bad namespace ${JSON.stringify(namespace)}`);
    if (!NAME_RE.test(prefix) || /[{}]/.test(prefix)) throw new RangeError(`bad prefix ${JSON.stringify(prefix)}`);
    this.redis = redis;
    this.namespace = namespace;
    this.prefix = prefix;
    this.runner = runner;
    this.id = null; // set by register()
  }

  // A namespace key (seq, ids, expiry, queues) or, with an id, that service's own key
  // ("service") or private wake key ("wake").
  key(role, id = this.id) {
    const base = `${this.prefix}:{${this.namespace}}:service:`;
    if (['seq', 'ids', 'expiry', 'queues'].includes(role)) return base + role;
    if (!Number.isSafeInteger(id) || id < 1) throw new RangeError(`the ${role} key needs a service id`);
    if (role === 'service') return `${base}${id}`;
    if (role === 'wake') return `${base}${id}:wake`;
    throw new RangeError(`unknown service key role ${role}`);
  }

  async run(name, id, args) {
    return this.runner.run(name, SERVICE_SCRIPT_KEYS[name].map((role) => this.key(role, id)), args);
  }

  // The lease owner of this registration in every queue.
  get owner() {
    return `${this.namespace}.${this.id}.${this.registration}`;
  }

  // service_register: GET seq, then the script with the key of seq + 1; on
  // {'retry', next} call again with that id. A 'retry' for the id we asked for may
  // also be our own earlier send whose reply was lost (ioredis re-sends after a
  // reconnect): then that id's key holds our renewal token, and it is ours.
  async register(queues, { expireMs = SERVICE_DEFAULTS.expireMs, capacity = SERVICE_DEFAULTS.capacity,
    gcLimit = SERVICE_DEFAULTS.gcLimit, host = os.hostname(), pid = process.pid,
    registration = hexToken(4) } = {}) {
    if (this.id !== null) throw new Error('this Service object is registered already');
    if (queues.length < 1) throw new RangeError('a service serves at least one queue');
    for (const name of queues) {
      if (!NAME_RE.test(name) || /[{},]/.test(name)) throw new RangeError(`bad queue name ${JSON.stringify(name)}`);
    }
    if (!REGISTRATION_RE.test(registration)) throw new RangeError(`bad registration ${JSON.stringify(registration)}`);
    const renewal = hexToken(8);
    let expected = Number((await this.redis.get(this.key('seq'))) ?? 0) + 1;
    for (let tries = 0; tries < 100; tries += 1) {
      const reply = await this.run('service_register', expected, [
        '', String(expected), host, int(pid, 'pid', 0, 2 ** 31), queues.join(','),
        int(expireMs, 'expire_ms', 1000, 86400000), int(capacity, 'capacity', 1, 100000),
        int(gcLimit, 'gc_limit', 0, 1000), renewal, registration,
      ]);
      let startedMs = null;
      if (str(reply[0]) === 'ok') {
        startedMs = reply[2];
      } else if ((await this.redis.hget(this.key('service', expected), 'renewal')) === renewal) {
        startedMs = Number(await this.redis.hget(this.key('service', expected), 'started'));
      }
      if (startedMs !== null) {
        Object.assign(this, { id: expected, registration, renewal, pendingRenewal: null, startedMs, queues });
        return this;
      }
      expected = reply[1];
    }
    throw new Error('could not allocate a service id after 100 tries');
  }

  // service_renew with a fresh token; a renewal whose answer was lost is re-sent with
  // the same token (pendingRenewal), so one that did apply is not taken for 'lost'.
  // Returns {status: 'ok'|'stop'|'lost', renewedMs, dead: [{id, registration, owner, queues}]}.
  async renew({ expireMs = SERVICE_DEFAULTS.expireMs, limit = SERVICE_DEFAULTS.deadLimit } = {}) {
    const next = this.pendingRenewal ?? hexToken(8);
    this.pendingRenewal = next;
    const reply = await this.run('service_renew', this.id, [
      '', String(this.id), this.renewal, next, int(expireMs, 'expire_ms', 1000, 86400000), int(limit, 'limit', 0, 100),
    ]);
    const status = str(reply[0]);
    const dead = [];
    for (let i = 0, at = 3; i < reply[2]; i += 1, at += 3) {
      const id = Number(str(reply[at]));
      const registration = str(reply[at + 1]);
      dead.push({ id, registration, owner: `${this.namespace}.${id}.${registration}`,
        queues: str(reply[at + 2]).split(',').filter((q) => q) });
    }
    if (status !== 'lost') this.renewal = next;
    this.pendingRenewal = null;
    return { status, renewedMs: reply[1], dead };
  }

  // README §7 step 4: HMGET <service> renewal stop, read only. 'lost' when the token is
  // missing or neither the one sent last nor a pending one; else 'stop' or 'ok'.
  async check() {
    const before = [this.renewal, this.pendingRenewal];
    const [current, stop] = await this.redis.hmget(this.key('service'), 'renewal', 'stop');
    const ours = new Set([...before, this.renewal, this.pendingRenewal].filter((t) => t));
    if (current === null || !ours.has(current)) return 'lost';
    return stop === null ? 'ok' : 'stop';
  }

  // service_deregister of this registration (require_expired 0): {deleted, removed},
  // or {deleted: -1} when the id now belongs to another registration.
  async deregister() {
    const [deleted, removed] = await this.run('service_deregister', this.id,
      ['', String(this.id), '0', this.registration]);
    return { deleted, removed };
  }

  // service_deregister of a dead service after every queue it served was scrubbed
  // (require_expired 1): false if it renewed meanwhile or its id was reused.
  async forgetDead(id, registration) {
    const [deleted] = await this.run('service_deregister', id, ['', String(id), '1', registration]);
    return deleted >= 0;
  }
}

module.exports = {
  Queue, Service, ScriptRunner, PqError, SCRIPT_KEYS, SERVICE_SCRIPT_KEYS, SERVICE_DEFAULTS, connect, newCall,
  loadScripts, seconds, monotonicMs, CONTRACT_VERSION, contractVersion,
};
