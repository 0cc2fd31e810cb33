'use strict';
// A minimal Node.js client of the pyqueue Lua scripts, written from lua/README.md and
// the scripts' header comments (the contract for other languages). It exists to prove
// that another language can load lua/*.lua verbatim and share queues with the Python
// driver; tests/test_node_conformance.py drives it through conformance.js.

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const Redis = require('ioredis');

const LUA_DIR = path.resolve(__dirname, '..', '..', 'lua');

// KEYS of each script, in the order its header lists them (README §4.2). A script
// never builds a key name: the client passes every key.
const SCRIPT_KEYS = {
  enqueue: ['jobs', 'ready', 'scheduled', 'counters', 'wake', 'done'],
  lease: ['jobs', 'ready', 'scheduled', 'leased', 'owners', 'dead', 'errors', 'counters', 'wake', 'done'],
  ack: ['jobs', 'leased', 'owners', 'done'],
  nack: ['jobs', 'scheduled', 'leased', 'owners', 'dead', 'errors', 'counters', 'wake'],
  extend: ['jobs', 'leased'],
  release: ['jobs', 'ready', 'leased', 'owners', 'counters', 'wake'],
  stats: ['jobs', 'ready', 'scheduled', 'leased', 'dead', 'counters', 'done'],
};

// The Python driver's default (README §2, tombstones): every acker of a queue should
// pass the same keep_done_ms, so producers get the same protection whoever acks.
const DEFAULT_KEEP_DONE_MS = 300000;
const NAME_RE = /^[!-~]{1,128}$/; // printable ASCII without space (braces: below)
const TOKEN_RE = /^[A-Za-z0-9_.:-]{1,64}$/; // owner and call (README §6)

class PqError extends Error {
  // Error replies are "<CODE> <detail>" (README §5): dispatch on the first word.
  constructor(err) {
    super(err.message);
    this.code = err.message.split(' ', 1)[0];
  }
}

// Scripts as the bytes of their files: the SHA1 of those bytes is the SHA every
// language computes (README §1), so Python and Node share one loaded copy.
function loadScripts() {
  const scripts = {};
  for (const name of Object.keys(SCRIPT_KEYS)) {
    const source = fs.readFileSync(path.join(LUA_DIR, `${name}.lua`)); // a Buffer, never decoded
    scripts[name] = { source, sha: crypto.createHash('sha1').update(source).digest('hex') };
  }
  return scripts;
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

// A fresh random token per logical lease call; a retry must re-send the same one
// (README §1). ioredis re-sends a queued command unchanged after a reconnect, which
// keeps that promise for us.
function newCall() {
  return crypto.randomBytes(8).toString('hex');
}

const str = (b) => b.toString('latin1'); // statuses are ASCII ('ok', 'stale', ...)

class Queue {
  // owner: who holds the leases, normally a service id (README §6). This client does not
  // register a service (section 7 is out of scope here), so it uses a random owner;
  // its leases are then recovered by expiry only, never by a scrub.
  constructor(redis, name, { prefix = 'pq', owner = `node-${crypto.randomBytes(6).toString('hex')}`,
    keepDoneMs = DEFAULT_KEEP_DONE_MS } = {}) {
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
    this.scripts = loadScripts();
    this.reloads = 0; // how often NOSCRIPT made us SCRIPT LOAD (reported by tests)
  }

  key(role) {
    return `${this.prefix}:{${this.name}}:${role}`;
  }

  // EVALSHA with our own SHA; on NOSCRIPT (fresh server, restart, SCRIPT FLUSH) load
  // the exact bytes and re-send the identical call. Replies come back as Buffers: a
  // payload is arbitrary bytes, and decoding it as UTF-8 would corrupt it.
  async run(name, args) {
    const { source, sha } = this.scripts[name];
    const keys = SCRIPT_KEYS[name].map((role) => this.key(role));
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

  // jobs: [{id, payload (Buffer or string), delayMs, maxAttempts}], 1..1000 per call.
  async enqueue(jobs) {
    if (jobs.length < 1 || jobs.length > 1000) throw new RangeError('1..1000 jobs per enqueue');
    const args = ['', String(jobs.length)]; // '' = the server clock (production)
    for (const j of jobs) {
      args.push(j.id, Buffer.from(j.payload), int(j.delayMs ?? 0, 'delay_ms', 0, 2 ** 40),
        int(j.maxAttempts ?? 5, 'max_attempts', 1, 10000));
    }
    const [added, duplicates, ...flags] = await this.run('enqueue', args);
    return { added, duplicates, flags };
  }

  // The whole lease call: ack `acks` (receipts) first, then lease up to `count`.
  async lease({ count = 1, leaseMs = 30000, limit = 100, acks = [], call = newCall() } = {}) {
    if (!TOKEN_RE.test(call)) throw new RangeError(`bad call token ${call}`);
    const reply = await this.run('lease', [
      '', this.owner, call, int(count, 'count', 0, 1000), int(leaseMs, 'lease_ms', 1, 604800000),
      int(limit, 'limit', 1, 1000), int(this.keepDoneMs, 'keep_done_ms', 0, 2 ** 40), ...acks,
    ]);
    // Flat reply: now_ms, next_due_ms, r, r statuses, m, then m groups of 7 (README §4.2).
    const [nowMs, nextDueMs, r] = reply;
    const ackStatuses = reply.slice(3, 3 + r).map(str);
    const m = reply[3 + r];
    const jobs = [];
    for (let i = 0, at = 4 + r; i < m; i += 1, at += 7) {
      const [receipt, id, payload, fence, attempt, maxAttempts, deadlineMs] = reply.slice(at, at + 7);
      jobs.push({ receipt, id, payload, fence, attempt, maxAttempts, deadlineMs });
    }
    return { nowMs, nextDueMs, acks: ackStatuses, jobs, call };
  }

  // Receipts are opaque Buffers, passed back exactly as lease returned them.
  async ack(receipts) {
    return (await this.run('ack', ['', int(this.keepDoneMs, 'keep_done_ms', 0, 2 ** 40), ...receipts])).map(str);
  }

  // delayMs null: the script's backoff with jitter (base/cap as the Python defaults).
  async nack(receipt, error, { delayMs = null, baseMs = 1000, capMs = 3600000 } = {}) {
    const delay = delayMs === null ? '' : int(delayMs, 'delay_ms', 0, 2 ** 40);
    const [status, state, atMs] = await this.run('nack', [
      '', receipt, Buffer.from(error), delay, int(baseMs, 'base_ms', 1, 2 ** 40), int(capMs, 'cap_ms', 1, 2 ** 40),
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
    return (await this.run('release', receipts)).map(str);
  }

  // 21 name/value pairs, in a fixed order (README §4.2).
  async stats() {
    const reply = await this.run('stats', ['']);
    const out = {};
    for (let i = 0; i < reply.length; i += 2) out[str(reply[i])] = reply[i + 1];
    return out;
  }

  // The blocking wait of README §2 "Wake marker": BZPOPMIN on the wake key for
  // next_due_ms - now_ms (both from the same lease reply, both server clock), capped
  // at blockMs, or blockMs when next_due_ms is -1. Returns without blocking when the
  // time is already up (next_due_ms = now_ms means "call again at once"): a timeout
  // of 0 would block forever. Redis ends a timed block on its hz tick, so a wait may
  // run up to ~100 ms past next_due_ms; that costs latency, never correctness.
  async waitForWork(blocker, leased, blockMs) {
    let ms = blockMs;
    if (leased.nextDueMs >= 0) ms = Math.min(blockMs, leased.nextDueMs - leased.nowMs);
    if (ms < 1) return 'due';
    const popped = await blocker.bzpopminBuffer(this.key('wake'), (ms / 1000).toFixed(3));
    return popped === null ? 'timeout' : 'woken';
  }
}

module.exports = { Queue, PqError, SCRIPT_KEYS, connect, newCall, loadScripts };
