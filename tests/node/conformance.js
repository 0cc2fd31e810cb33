'use strict';
// Conformance scenarios for tests/test_node_conformance.py.
//
//   node conformance.js <scenario> <unix:///path/redis.sock | /path/redis.sock | redis://...>
//
// The first line of stdin is a JSON object of options; the result is one JSON object
// on stdout (payloads and receipts as hex, since they are bytes). Scenarios:
//   keys     the KEYS table this client uses, to compare with the scripts' headers
//   produce  enqueue the given calls; Python's worker then runs the jobs
//   consume  lease/ack/ack-and-lease/nack/extend/release jobs Python enqueued, and
//            wait for a delayed one with the blocking wait
//   share    lease -> ack (one round trip) with the blocking wait, next to a Python
//            worker on the same queue, until a second stdin line (or EOF) says stop
//   service  a registered service (README §7) serving one queue: register, renew on a
//            timer, scrub and forget dead services, lease with the owner
//            <ns>.<id>.<registration>, wait on the queue's and its own wake key; on a
//            remote stop deregister and exit 0, on a lost registration exit 75. Prints
//            one JSON event per line while it runs ({"event": "registered", ...},
//            {"event": "running", ...}), then the result. A job whose payload is
//            "sleep:<ms>" takes that long.
//   control  job control on a queue Python filled: cancel, limit, ack with a result,
//            read the result back, nack the last job final (to DEAD at once)
//   task-produce  send task envelopes (README §9) of the conf.* tasks a Python worker
//            runs, then wait for and read back each result
//   task-work  a task worker: lease the task jobs Python sent, run the JS conf.* tasks,
//            ack with their results; nack an unknown task name final, an envelope of
//            another version with backoff
//   task-decode  decode a payload and a stored result, encode them again, and compute
//            the payload's unique id (the README §9.7 example)
//   contract the contract version (README §10) every loaded script states; what the
//            scripts answer calls of the earlier contract (nack with 8 KEYS, service_register
//            without its registration token) and a call with no keys; and whether a script
//            directory of another version is refused

const readline = require('readline');
const {
  Queue, Service, ScriptRunner, PqError, SCRIPT_KEYS, SERVICE_SCRIPT_KEYS, connect, newCall, seconds, monotonicMs,
  CONTRACT_VERSION, contractVersion, loadScripts,
} = require('./pyqueue_client');
const tasks = require('./tasks');

const hex = (b) => b.toString('hex');
const text = (b) => b.toString('utf8'); // ids: the tests use UTF-8 ids, as Python requires
const str = (b) => b.toString('latin1'); // statuses and key names are ASCII

function jobJson(job) {
  return {
    id: text(job.id), payload_hex: hex(job.payload), receipt_hex: hex(job.receipt),
    fence: job.fence, attempt: job.attempt, max_attempts: job.maxAttempts, deadline_ms: job.deadlineMs,
    enqueued_ms: job.enqueuedMs,
  };
}

async function produce(q, opts) {
  const replies = [];
  for (const call of opts.calls) {
    const jobs = call.map((j) => ({
      id: j.id, payload: Buffer.from(j.payload_hex, 'hex'), delayMs: j.delay_ms, maxAttempts: j.max_attempts,
    }));
    replies.push(await q.enqueue(jobs));
  }
  return { replies, stats: await q.stats() };
}

async function consume(q, opts, redis) {
  const out = {};
  if (opts.flush_scripts) await redis.script('FLUSH'); // the next call must go through NOSCRIPT
  // A receipt Python leased is just bytes to us: ack it as is.
  out.python_ack = await q.ack([Buffer.from(opts.python_receipt_hex, 'hex')]);

  const two = await q.lease({ count: 2, leaseMs: 30000 });
  out.leased = two.jobs.map(jobJson);
  const [a, b] = two.jobs;
  out.extend = (await q.extend([a.receipt], 60000)).map((e) => ({ status: e.status, deadline_ms: e.deadlineMs }));
  out.ack = await q.ack([a.receipt]);
  out.ack_again = await q.ack([a.receipt]);

  // Ack-and-lease: ack b and lease the next job in the same call.
  const next = await q.lease({ count: 1, acks: [b.receipt] });
  out.ack_and_lease = { acks: next.acks, jobs: next.jobs.map(jobJson) };
  const nacked = await q.nack(next.jobs[0].receipt, opts.error);
  out.nack = { status: nacked.status, state: nacked.state, at_ms: nacked.atMs };

  // A re-sent lease (same call token) returns the same lease instead of a new one.
  const call = newCall();
  const first = await q.lease({ count: 1, call });
  const resent = await q.lease({ count: 1, call });
  out.lease_first = first.jobs.map(jobJson);
  out.lease_resent = resent.jobs.map(jobJson);
  out.release = await q.release([first.jobs[0].receipt]);
  out.release_again = await q.release([first.jobs[0].receipt]);
  out.stats = await q.stats();

  // The blocking wait timed by next_due_ms, on another queue holding one delayed job:
  // lease (nothing ready) -> BZPOPMIN until its due time -> lease it. Bounded rounds.
  const later = new Queue(redis, opts.later_queue, { owner: q.owner });
  const blocker = redis.duplicate();
  const waits = [];
  let leased = await later.lease({ count: 1 });
  for (let round = 0; leased.jobs.length === 0 && round < 10; round += 1) {
    waits.push(await later.waitForWork(blocker, leased, 5000));
    leased = await later.lease({ count: 1 });
  }
  blocker.disconnect();
  out.later = { waits, jobs: leased.jobs.map(jobJson), leased_at_ms: leased.nowMs };
  out.later.ack = leased.jobs.length ? await later.ack(leased.jobs.map((j) => j.receipt)) : [];
  return out;
}

async function share(q, opts, redis, input) {
  let stopping = false;
  input.on('line', () => { stopping = true; });
  input.on('close', () => { stopping = true; });
  // A blocked BZPOPMIN holds its connection, so the wait gets a connection of its own.
  const blocker = redis.duplicate();
  const ran = [];
  const acks = { ok: 0, stale: 0, gone: 0 };
  const waits = { due: 0, timeout: 0, woken: 0 };
  const tally = (statuses) => statuses.forEach((s) => { acks[s] += 1; });
  process.stdout.write(`${JSON.stringify({ ready: true })}\n`);

  let pending = []; // receipts of jobs run but not yet acked: acked by the next lease
  while (!stopping) {
    const leased = await q.lease({ count: 1, acks: pending, leaseMs: 30000 });
    tally(leased.acks);
    pending = [];
    if (leased.jobs.length > 0) {
      for (const job of leased.jobs) {
        ran.push(text(job.id)); // "running" the job is recording that we ran it
        pending.push(job.receipt);
      }
      continue;
    }
    waits[await q.waitForWork(blocker, leased, opts.block_ms)] += 1;
  }
  if (pending.length > 0) tally(await q.ack(pending));
  blocker.disconnect();
  return { ran, acks, waits };
}

// Exit code of a service whose registration was lost (sysexits EX_TEMPFAIL, as Python's
// worker): a supervisor restarts it. A stopped service exits 0.
const EXIT_REGISTRATION_LOST = 75;
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });
const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);

async function service(_q, opts, redis) {
  const prefix = opts.prefix ?? 'pq';
  const expireMs = opts.expire_ms ?? 60000;
  const renewMs = opts.renew_ms ?? 15000;
  const blockMs = opts.block_ms ?? 10000;
  const leaseMs = opts.lease_ms ?? 30000;
  if (renewMs * 2 > expireMs) throw new RangeError('renew_ms must be at most half of expire_ms (README §6)');
  const runner = new ScriptRunner(redis);
  const svc = new Service(redis, { namespace: opts.namespace ?? 'workers', prefix, runner });
  const report = {
    ran: [], // {id, attempt, fence, payload_hex} per job run
    acks: { ok: 0, stale: 0, gone: 0 },
    extends: { ok: 0, stale: 0, gone: 0 },
    renewals: { ok: 0, stop: 0, lost: 0, failed: 0 },
    checks: { ok: 0, stop: 0, lost: 0 }, // HMGET <service> renewal stop before waits
    waits: { due: 0, timeout: 0, woken_queue: 0, woken_private: 0, interrupted: 0 },
    scrubbed: [], // dead services this one scrubbed: {owner, queues, leases, forgotten}
    stopped_by: null, // 'wake' | 'key' | 'renewal' | 'signal'
    lost_by: null, // 'key' | 'renewal'
  };
  const tally = (counts, statuses) => statuses.forEach((s) => { counts[s] += 1; });
  const st = { stopping: false, lost: false, finished: false, renewedAt: -Infinity, running: null };
  let wakeLocal = () => {}; // ends the current blocking wait from inside this process
  const onStop = (how) => {
    if (!st.stopping) { st.stopping = true; report.stopped_by = how; }
    wakeLocal();
  };
  const onLost = (how) => {
    if (!st.lost) { st.lost = true; report.lost_by = how; }
    wakeLocal();
  };
  // README §7 step 3: lease only while the last renewal answered ok/stop was sent less
  // than 3/4 of expire_ms ago (monotonic clock), as Python does.
  const confirmed = () => monotonicMs() - st.renewedAt < expireMs * 0.75;

  // Renewals run one at a time (the timer and the loop both renew).
  let renewChain = Promise.resolve();
  const renewNow = () => {
    const p = renewChain.then(async () => {
      if (st.lost) return; // never renew a lost registration
      const sentAt = monotonicMs();
      let renewed;
      try {
        renewed = await svc.renew({ expireMs });
      } catch (err) {
        report.renewals.failed += 1;
        process.stderr.write(`renewal failed: ${err.message}\n`);
        return;
      }
      report.renewals[renewed.status] += 1;
      if (renewed.status === 'lost') { onLost('renewal'); return; }
      st.renewedAt = sentAt;
      if (renewed.status === 'stop') onStop('renewal');
      // README §7 step 2: scrub each queue a dead service served, then forget it.
      for (const dead of renewed.dead) {
        if (dead.id === svc.id && dead.registration === svc.registration) continue;
        try {
          let leases = 0;
          for (const name of dead.queues) {
            const dq = new Queue(redis, name, { prefix, runner });
            for (;;) {
              const scrubbed = await dq.scrub(dead.owner);
              leases += scrubbed.scrubbed;
              if (!scrubbed.more) break;
            }
          }
          const forgotten = await svc.forgetDead(dead.id, dead.registration);
          report.scrubbed.push({ owner: dead.owner, queues: dead.queues, leases, forgotten });
        } catch (err) {
          process.stderr.write(`scrub of ${dead.owner} failed: ${err.message}\n`);
        }
      }
    });
    renewChain = p.catch(() => {});
    return p;
  };

  const registeredAt = monotonicMs();
  await svc.register([opts.queue], { expireMs });
  st.renewedAt = registeredAt;
  const q = new Queue(redis, opts.queue, { prefix, owner: svc.owner, runner });
  emit({ event: 'registered', id: svc.id, registration: svc.registration, owner: svc.owner, pid: process.pid,
    started_ms: svc.startedMs });
  for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => onStop('signal'));

  // Timers: renew every renew_ms; extend a running job every lease_ms / 3.
  let renewTimer = null;
  const scheduleRenewal = () => {
    renewTimer = setTimeout(() => { renewNow().finally(() => { if (!st.finished) scheduleRenewal(); }); }, renewMs);
  };
  const extendTimer = setInterval(() => {
    const job = st.running;
    if (job === null) return;
    q.extend([job.receipt], leaseMs).then((out) => tally(report.extends, out.map((e) => e.status)),
      (err) => process.stderr.write(`extend failed: ${err.message}\n`));
  }, Math.max(1, Math.floor(leaseMs / 3)));

  const runJob = async (job) => {
    st.running = job;
    emit({ event: 'running', id: text(job.id), attempt: job.attempt, fence: job.fence });
    const sleepFor = /^sleep:(\d+)$/.exec(job.payload.toString('latin1'));
    if (sleepFor) await sleep(Number(sleepFor[1]));
    report.ran.push({ id: text(job.id), attempt: job.attempt, fence: job.fence, payload_hex: hex(job.payload) });
    st.running = null;
  };

  // A blocked BZPOPMIN holds its connection, so the wait gets a connection of its own.
  let blocker = redis.duplicate();
  const queueWake = q.key('wake');
  const privateWake = svc.key('wake');
  let pending = []; // receipts of jobs run but not yet acked: acked by the next lease
  try {
    await renewNow(); // start-up: find dead services before leasing (as Python's worker)
    scheduleRenewal();
    while (!st.stopping && !st.lost) {
      if (!confirmed()) {
        await renewNow();
        if (st.stopping || st.lost) break;
        if (!confirmed()) { await sleep(100); continue; } // the renewal did not get through
      }
      const leased = await q.lease({ count: 1, acks: pending, leaseMs });
      tally(report.acks, leased.acks);
      pending = [];
      if (leased.jobs.length > 0) {
        for (const job of leased.jobs) {
          await runJob(job);
          pending.push(job.receipt);
        }
        continue;
      }
      // README §7 step 4: read our own key before each wait.
      const state = await svc.check();
      report.checks[state] += 1;
      if (state === 'lost') { onLost('key'); break; }
      if (state === 'stop') { onStop('key'); break; }
      const ms = q.waitMs(leased, blockMs);
      if (ms < 1) { report.waits.due += 1; continue; }
      // No await between arming the interrupt and sending BZPOPMIN, so a stop or loss
      // the timer learns of either is seen here or ends the wait.
      const interrupt = new Promise((resolve) => { wakeLocal = () => resolve('interrupted'); });
      if (st.stopping || st.lost) break;
      // One server: one BZPOPMIN over the queue's wake key and our private one (§2).
      const pop = blocker.bzpopminBuffer(queueWake, privateWake, seconds(ms));
      const popped = await Promise.race([pop, interrupt]);
      wakeLocal = () => {};
      if (popped === 'interrupted') {
        report.waits.interrupted += 1;
        pop.catch(() => {}); // disconnecting rejects the abandoned BZPOPMIN
        blocker.disconnect();
        blocker = redis.duplicate();
      } else if (popped === null) {
        report.waits.timeout += 1;
      } else if (str(popped[0]) === privateWake) {
        // A remote stop raised our marker: read the key before leasing again.
        report.waits.woken_private += 1;
        const after = await svc.check();
        report.checks[after] += 1;
        if (after === 'stop') onStop('wake');
        if (after === 'lost') onLost('key');
      } else {
        report.waits.woken_queue += 1;
      }
    }
  } finally {
    st.finished = true;
    clearTimeout(renewTimer);
    clearInterval(extendTimer);
    blocker.disconnect();
  }
  // Stop leasing; what ran is acked (fenced: a scrubbed lease answers stale).
  if (pending.length > 0) tally(report.acks, await q.ack(pending));
  await renewChain;
  if (st.lost) {
    process.exitCode = EXIT_REGISTRATION_LOST;
  } else {
    report.deregister = await svc.deregister();
  }
  return { ...report, id: svc.id, registration: svc.registration, owner: svc.owner, reloads: runner.reloads };
}

// Job control from Node on a queue Python filled: cancel a ready and a leased job, cap
// the lease rate, ack a job with a result Python reads, read it back, lift the cap,
// and nack the last job final: DEAD on its first attempt.
async function control(q, opts) {
  const out = {};
  out.cancel_ready = await q.cancel(opts.ready_id);
  out.cancel_leased = await q.cancel(opts.leased_id);
  out.cancel_again = await q.cancel(opts.ready_id);
  out.limit = await q.limit(1, 60000, 1);
  const first = await q.lease({ count: 5 });
  const second = await q.lease({ count: 5 });
  out.leased = first.jobs.map(jobJson);
  out.limited = { jobs: second.jobs.length, next_due_ms: second.nextDueMs, now_ms: second.nowMs };
  const job = first.jobs[0];
  out.ack_result = await q.ackResult([[job.receipt, `j${JSON.stringify({ from: 'node', n: 7 })}`]]);
  const read = await q.result(text(job.id));
  out.result = { state: read.state, value: text(read.value), finished_ms: read.finishedMs };
  out.unlimit = await q.limit(0);
  // A final nack: the next job goes to DEAD on its first attempt (Python reads it).
  const last = await q.lease({ count: 1 });
  out.nack_final = await q.nack(last.jobs[0].receipt, 'node gives up', { final: true });
  out.nack_final.id = text(last.jobs[0].id);
  out.stats = await q.stats();
  return out;
}

// The versioned contract (README §10). Every loaded script states the version this
// client speaks (the runner refuses others). Calls a client of the earlier contract sent
// (nack with 8 KEYS, before `finished`; service_register with 9 ARGV, before the
// registration token), one argument too many, and a call with no keys are each answered
// PQ_CONTRACT naming the version, and write nothing (Python compares the keyspace).
async function contract(q, opts, redis) {
  const out = { client_version: CONTRACT_VERSION, versions: {}, calls: {} };
  for (const [name, { source }] of Object.entries(q.runner.scripts)) out.versions[name] = contractVersion(source);
  const call = async (what, name, keys, args) => {
    try {
      out.calls[what] = { reply: String(await q.runner.run(name, keys, args)) };
    } catch (err) {
      out.calls[what] = { code: err.code, message: err.message };
    }
  };
  const nackKeys = SCRIPT_KEYS.nack.map((role) => q.key(role));
  await call('nack_v1_keys', 'nack', nackKeys.slice(0, 8), ['', opts.receipt, 'v1 client', '', '1000', '60000']);
  await call('nack_extra_argument', 'nack', nackKeys, ['', opts.receipt, 'e', '', '1000', '60000', '0', 'extra']);
  const svc = new Service(redis, { namespace: opts.namespace, runner: q.runner });
  const id = Number((await redis.get(svc.key('seq'))) ?? 0) + 1;
  await call('service_register_v1_arguments', 'service_register',
    SERVICE_SCRIPT_KEYS.service_register.map((role) => svc.key(role, id)),
    ['', String(id), 'node-host', String(process.pid), opts.queue, '60000', '1000', '10', 'renewal1']);
  await call('stats_no_keys', 'stats', [], ['']);
  const answered = /\(contract v(\d+)\)/.exec(out.calls.stats_no_keys.message ?? '');
  out.version_from_an_answer = answered ? Number(answered[1]) : null;
  try {
    loadScripts(opts.other_dir);
    out.other_dir = 'loaded';
  } catch (err) {
    out.other_dir = err.message;
  }
  return out;
}

// ---- Tasks (README §9) ----------------------------------------------------------------

// What a decoded value is, for the report: 'Tagged:<tag>', 'Buffer', 'Set', 'Date',
// 'array', 'object', or the typeof of a JSON value.
function jsType(value) {
  if (value instanceof tasks.Tagged) return `Tagged:${value.tag}`;
  if (Buffer.isBuffer(value)) return 'Buffer';
  if (value instanceof Set) return 'Set';
  if (value instanceof Date) return 'Date';
  if (Array.isArray(value)) return 'array';
  return value === null ? 'null' : typeof value;
}

// The calls Node sends (each {task, args, kwargs, options}): JS values, as a Node
// program would pass them.
function producedCalls() {
  return [
    { name: 'add', task: 'conf.add', args: [2, 3] },
    // unique: every argument given, the default b=10 too (README §9.4).
    { name: 'add_once', task: 'conf.add_once', args: [2, 10], options: { unique: true } },
    {
      name: 'invoice', task: 'conf.invoice',
      args: [new Date(Date.UTC(2024, 1, 29, 23, 30, 0, 123)), new tasks.Tagged('decimal', '19.99')],
      kwargs: { tags: new Set(['vip', 'eu']), pdf: Buffer.from([0x25, 0x50, 0x44, 0x46, 0x00, 0xff]) },
    },
    { name: 'greet', task: 'conf.greet', args: ['Zo\u00eb \u2713'] },
    {
      name: 'echo', task: 'conf.echo',
      args: [
        new tasks.Tagged('uuid', '1b4e28ba-2fa1-11d2-883f-0016d3cca427'), new tasks.Tagged('date', '2024-02-29'),
        new tasks.Tagged('time', '23:59:59.000001'), new tasks.Tagged('timedelta', -1.5),
        new tasks.Tagged('decimal', '-0.50'), new Set([[1, 2], [1, 'a'], 'x']), Buffer.alloc(0),
        2 ** 53 - 1, null, true, { nested: [{ deep: 'caf\u00e9' }] },
      ],
      kwargs: { when: new tasks.Tagged('datetime', '2024-02-29T12:00:00'), none: null },
    },
    // Registered without keep_result: this send asks for one (meta.opts), with a trace
    // context in meta and 7 attempts.
    {
      name: 'context', task: 'conf.context',
      options: { opts: { keep_result_ms: 60000 }, maxAttempts: 7,
        meta: { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', tenant: 'acme' } },
    },
    // Fails its first attempt; the send's backoff (fixed 1.5 s) sets the retry's delay.
    { name: 'flaky', task: 'conf.flaky', options: { opts: { backoff: { fixed: [1500, 0] } } } },
  ];
}

async function taskProduce(_q, opts, redis) {
  const client = new tasks.TaskClient(redis);
  try {
    const sent = [];
    for (const call of producedCalls()) {
      const { opts: taskOpts = null, meta = {}, unique = false, maxAttempts = 5 } = call.options ?? {};
      const s = await client.send(call.task, call.args ?? [], call.kwargs ?? {},
        { queue: opts.queue, opts: taskOpts, meta, unique, maxAttempts });
      sent.push({ name: call.name, task: call.task, id: s.id, added: s.added, payload_hex: hex(s.payload),
        max_attempts: maxAttempts });
    }
    const offsetMs = client.offsetMs;
    const results = {};
    for (const s of sent) {
      try {
        const r = await client.result(s.id, { queue: opts.queue, timeoutMs: opts.timeout_ms });
        const out = { state: r.state };
        if (r.state === 'ok') {
          out.kind = String.fromCharCode(r.raw[0]);
          out.value = tasks.toJson(r.value); // the decoded value, encoded again
          out.type = jsType(r.value);
          if (out.type === 'object') {
            out.types = Object.fromEntries(Object.entries(r.value).map(([k, v]) => [k, jsType(v)]));
          }
          if (r.value?.due instanceof tasks.Tagged) out.due_as_date = r.value.due.toDate().toISOString();
        }
        results[s.name] = out;
      } catch (err) {
        if (!(err instanceof tasks.TaskDead)) throw err;
        results[s.name] = { state: 'dead', error: err.error };
      }
    }
    return { sent, results, offset_ms: offsetMs };
  } finally {
    client.close();
  }
}

// Decimal text times a small integer, exactly (scaled BigInt): '19.99' * 2 = '39.98',
// '-0.50' * 2 = '-1.00', as Python's Decimal keeps the exponent.
function decimalTimes(tagged, factor) {
  const m = /^(-?)(\d+)(?:\.(\d+))?$/.exec(tagged.value);
  if (!m) throw new RangeError(`this worker multiplies plain decimals only, got ${tagged.value}`);
  const scale = (m[3] ?? '').length;
  const product = BigInt(`${m[1]}${m[2]}${m[3] ?? ''}`) * BigInt(factor);
  const negative = product < 0n || (m[1] === '-' && product === 0n);
  const digits = (product < 0n ? -product : product).toString().padStart(scale + 1, '0');
  const whole = digits.slice(0, digits.length - scale);
  return new tasks.Tagged('decimal', `${negative ? '-' : ''}${whole}${scale ? `.${digits.slice(-scale)}` : ''}`);
}

// A datetime plus whole days, as Python's datetime + timedelta(days=n): the same wall
// time and offset on another date.
function addDays(tagged, days) {
  const m = /^(\d{4})-(\d\d)-(\d\d)(T.*)$/.exec(tagged.value);
  if (!m) throw new RangeError(`not an ISO datetime: ${tagged.value}`);
  const date = new Date(Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]) + days));
  return new tasks.Tagged('datetime', `${date.toISOString().slice(0, 10)}${m[4]}`);
}

// The JS implementations of the conf.* tasks Python registers (same names, same
// keep_result), for the task-work scenario.
function workerRegistry(logged) {
  return {
    'conf.add': { keepResultMs: 60000, fn: ([a, b]) => a + b },
    'conf.invoice': {
      keepResultMs: 60000,
      fn: ([when, amount], { days = 30, tags = new Set(), pdf = Buffer.alloc(0) }) => ({
        due: addDays(when, days), total: decimalTimes(amount, 2), tags: new Set([...tags, 'invoiced']),
        pdf: Buffer.from(pdf).reverse(),
      }),
    },
    'conf.greet': { keepResultMs: 60000, fn: ([name]) => `hello ${name}` },
    'conf.log': { keepResultMs: null, fn: ([message]) => { logged.push(message); } },
    'conf.context': {
      keepResultMs: null,
      fn: (_args, _kwargs, ctx) => ({
        enqueued_ms: ctx.enqueuedMs, traceparent: ctx.meta.traceparent ?? null, attempt: ctx.attempt,
        max_attempts: ctx.maxAttempts, meta_keys: Object.keys(ctx.meta).sort(),
      }),
    },
    'conf.fresh': { keepResultMs: 60000, fn: () => 'ran' },
    'conf.explode': { keepResultMs: null, fn: () => { throw new Error('boom'); } },
  };
}

async function taskWork(q, opts) {
  const logged = [];
  const log = [];
  const worker = new tasks.TaskWorker(q, workerRegistry(logged), { log: (line) => log.push(line) });
  const handled = [];
  for (let round = 0; round < (opts.max_rounds ?? 100); round += 1) {
    const { reports, leased } = await worker.runOnce({ count: 1 });
    handled.push(...reports);
    if (reports.length === 0 && leased.nextDueMs === -1) break;
  }
  return { handled, logged, log };
}

async function taskDecode(_q, opts) {
  const payload = Buffer.from(opts.payload_hex, 'hex');
  const env = tasks.decodeEnvelope(payload);
  const again = tasks.encodeEnvelope(env.task, env.args, env.kwargs, env.meta);
  const result = tasks.decodeResult(Buffer.from(opts.result, 'utf8'));
  return {
    task: env.task,
    arg_types: env.args.map(jsType),
    kwarg_types: Object.fromEntries(Object.entries(env.kwargs).map(([k, v]) => [k, jsType(v)])),
    reencoded_hex: hex(again),
    unique_id: tasks.uniqueId(env.task, env.args, { ...opts.defaults, ...env.kwargs }),
    result_types: Object.fromEntries(Object.entries(result).map(([k, v]) => [k, jsType(v)])),
    result_reencoded: tasks.encodeResult(result, env.task).toString('utf8'),
  };
}

// Fair scheduling from Node (README §2.1): a cap per group, then grouped and prioritized
// jobs and one lease round; Python reads what Node wrote and leases after it.
async function fair(q) {
  const out = {};
  out.limit = await q.setGroupLimit(1);
  out.enqueue = await q.enqueue([
    { id: 'a1', payload: 'a', group: 'A' }, { id: 'a2', payload: 'a', group: 'A' },
    { id: 'b1', payload: 'b', group: 'B' }, { id: 'p1', payload: 'p', priority: 5 }, { id: 'u1', payload: 'u' },
  ]);
  const first = await q.lease({ count: 10 });
  out.leased = first.jobs.map((j) => text(j.id));
  out.receipts = Object.fromEntries(first.jobs.map((j) => [text(j.id), text(j.receipt)]));
  return out;
}

// The event stream across languages (README §2.5): Node opts the queue in, enqueues,
// leases, acks one job and nacks the other final; its scripts write the events, which
// Node reads back here and Python reads with its own driver.
async function events(q) {
  const out = {};
  out.set = await q.setEvents(3);
  await q.enqueue([{ id: 'e1', payload: 'a' }, { id: 'e2', payload: 'b' }]);
  const leased = await q.lease({ count: 2 });
  await q.ack([leased.jobs[0].receipt]);
  await q.nack(leased.jobs[1].receipt, 'node says no', { final: true });
  out.all = await q.events(0);
  out.after = await q.events(out.all.events[0].seq);
  return out;
}

// Durable steps across languages (README §2.6): Node signals a job a Python task
// waits for, twice (the second is refused as a duplicate), and one that does not exist.
async function signal(q, opts) {
  return {
    first: await q.signal(opts.id, opts.name, opts.data),
    again: await q.signal(opts.id, opts.name, 'not this'),
    nobody: await q.signal('no-such-job', opts.name, null),
  };
}

// Flow control across languages (README §2.7): Node debounces, throttles and sends a job
// with an expiry; Python reads what those sends decided and shares the keys.
async function keyed(q) {
  return {
    debounce: await q.enqueue([{ id: 'd1', payload: 'v1', key: 'debounce|60000|user-7' },
      { id: 'd2', payload: 'v2', key: 'debounce|60000|user-7' }]),
    throttle: await q.enqueue([{ id: 't1', payload: 'a', key: 'throttle|60000|acct' }]),
    throttled: await q.enqueue([{ id: 't2', payload: 'b', key: 'throttle|60000|acct' }]),
    expiring: await q.enqueue([{ id: 'e1', payload: 'x', expiresMs: 1 }]),
  };
}

// Keyed rate limits across languages (README §2.7): Node sends jobs with a rate key,
// leases (the second and third wait for later permits), defers the key as for a 429,
// and sets and lifts the key's run-time limit; Python's sends then share the key's state.
async function rates(q) {
  const key = 'rate|1/60000/1/1|api';
  const sent = await q.enqueue([{ id: 'r1', payload: 'a', key }, { id: 'r2', payload: 'b', key },
    { id: 'r9', payload: 'c', key: `sequence|block|order\n${key}` }]);
  const leased = await q.lease({ count: 10 });
  const [job] = leased.jobs;
  const deferred = await q.deferKey(job.receipt, 5000);
  const lost = await q.deferKey(`${q.owner}|gone|1|1|r1`, 5000);
  return {
    sent,
    leased: leased.jobs.map((j) => str(j.id)),
    nowMs: leased.nowMs,
    nextDueMs: leased.nextDueMs,
    deferred: { status: deferred.status, afterMs: deferred.untilMs - leased.nowMs },
    lost,
    override: [await q.setRateLimit('api', { count: 0 }), await q.setRateLimit('api', { count: 0 }),
      await q.setRateLimit('api', null)],
  };
}

// Byte budgets across languages (README §2.7): Node caps the queue's payload bytes, sends
// under the cap, and a send past it is refused with PQ_FULL, nothing written; Python's
// view of the count and its own sends then agree.
async function budget(q) {
  const set = [await q.setBudget(10), await q.setBudget(10)];
  const sent = await q.enqueue([{ id: 'b1', payload: 'sixsix' }]);
  let refused = null;
  try {
    await q.enqueue([{ id: 'b2', payload: 'fives' }, { id: 'b3', payload: '' }]);
  } catch (err) {
    if (!(err instanceof PqError)) throw err;
    refused = { code: err.code, message: err.message };
  }
  const stats = await q.stats();
  return { set, sent, refused, bytes: stats.bytes, budgetBytes: stats.budget_bytes };
}

// Results budgets across languages (README §2, results): Node caps the bytes of results
// the queue keeps at two results' worth, acks three jobs with results (one call each),
// and the third call deletes the oldest-expiring result first; Python then reads the
// same sizes and sum, and its own results meet the same cap.
async function resultBudget(q, opts, redis) {
  const set = [await q.setResultBudget(opts.budget), await q.setResultBudget(opts.budget)];
  const sent = await q.enqueue(opts.ids.map((id) => ({ id, payload: '' })));
  const acks = [];
  for (const id of opts.ids) {
    const { jobs } = await q.lease({ count: 1 });
    if (jobs.length !== 1 || str(jobs[0].id) !== id) throw new Error(`expected to lease ${id}`);
    acks.push(...await q.ackResult([[jobs[0].receipt, `b${opts.value}`]]));
  }
  const states = {};
  for (const id of opts.ids) states[id] = (await q.result(id)).state;
  const [budgetField, bytes, rsized] = await redis.hmget(q.key('counters'), 'result_budget', 'result_bytes', 'rsized');
  const sizes = {};
  const keyed = await redis.hgetall(q.key('keyed'));
  for (const [field, value] of Object.entries(keyed)) {
    if (field.startsWith('rb:')) sizes[field.slice(3)] = Number(value);
  }
  const stored = {};
  for (const id of Object.keys(sizes)) stored[id] = await redis.hstrlen(q.key('results'), id);
  return { set, sent, acks, states, budget: Number(budgetField), bytes: Number(bytes), rsized, sizes, stored };
}

// Tombstone limits across languages (README §2, tombstones): Node caps the tombstones
// the queue keeps at opts.limit, acks the jobs one call each (each later tombstone
// expires later), and each ack past the cap deletes the earliest-expiring; a re-sent
// enqueue of an id whose tombstone went is added again, one whose tombstone is kept is
// still a duplicate. Python then reads the same `done` and its acks meet the same cap.
async function tombstoneLimit(q, opts, redis) {
  const set = [await q.setTombstoneLimit(opts.limit), await q.setTombstoneLimit(opts.limit)];
  const sent = await q.enqueue(opts.ids.map((id) => ({ id, payload: '' })));
  const acks = [];
  const kept = [];
  for (const id of opts.ids) {
    const { jobs } = await q.lease({ count: 1 });
    if (jobs.length !== 1 || str(jobs[0].id) !== id) throw new Error(`expected to lease ${id}`);
    acks.push(...await q.ack([jobs[0].receipt]));
    kept.push(await redis.zrange(q.key('done'), 0, -1));
  }
  const limit = await redis.hget(q.key('counters'), 'done_max');
  const first = opts.ids[0];
  const last = opts.ids[opts.ids.length - 1];
  const resent = await q.enqueue([{ id: first, payload: 'again' }]);
  const duplicate = await q.enqueue([{ id: last, payload: 'again' }]);
  return { set, sent, acks, kept, limit: Number(limit), resent, duplicate };
}

// Indexes across languages (README §2.8): Node turns a queue's indexes on, sends jobs
// with a task name and a group, finds them by task, by group and by state, acks one (its
// members leave `index`) and makes a delayed one due now; Python then finds the same.
async function indexes(q, _opts, redis) {
  const since = [await q.setIndexes(true), await q.setIndexes(true)];
  const sent = await q.enqueue([
    { id: 'i1', payload: 'a', task: 'mail.send', group: 'acme' },
    { id: 'i2', payload: 'b', task: 'mail.send', key: 'rate|100/1000/1/1|smtp' },
    { id: 'i3', payload: 'c', task: 'mail.digest', group: 'acme', delayMs: 3600000 },
    { id: 'i4', payload: 'd' },
  ]);
  const index = async () => (await redis.zrange(q.key('index'), 0, -1)).map((m) => m.split('\n'));
  const listed = await index();
  const byTask = await q.search({ task: 'mail.send' });
  const byGroup = await q.search({ group: 'acme' });
  const scheduled = await q.search({ state: 'scheduled' });
  const leased = await q.lease({ count: 1 });
  const [job] = leased.jobs;
  const acked = await q.ack([job.receipt]);
  const afterAck = await index();
  const entry = await redis.hget(q.key('keyed'), `x:${str(job.id)}`);
  const promoted = [await q.promoteNow(['i3', 'i2', 'nothing']), await q.promoteNow(['i3'])];
  let refused = null;
  try {
    await q.search({ task: 'mail.send', state: 'done' });
  } catch (err) {
    if (!(err instanceof PqError)) throw err;
    refused = err.code;
  }
  const summary = (page) => ({
    ids: page.jobs.map((j) => j.id), states: page.jobs.map((j) => j.state), tasks: page.jobs.map((j) => j.task),
    groups: page.jobs.map((j) => j.group), cursor: page.cursor, indexed: page.indexedSinceMs === since[0],
  });
  return {
    since: since.map((s) => s !== null && s === since[0]), sent, listed, byTask: summary(byTask),
    byGroup: summary(byGroup), scheduled: summary(scheduled), leased: str(job.id), acked, afterAck,
    entry, promoted, refused,
  };
}

async function main() {
  const [scenario, target] = process.argv.slice(2);
  if (scenario === 'keys') {
    process.stdout.write(`${JSON.stringify({ ...SCRIPT_KEYS, ...SERVICE_SCRIPT_KEYS })}\n`);
    return;
  }
  const input = readline.createInterface({ input: process.stdin });
  const lines = input[Symbol.asyncIterator]();
  const first = await lines.next();
  if (first.done) throw new Error('expected a JSON line of options on stdin');
  const opts = JSON.parse(first.value);
  const redis = connect(target);
  try {
    const q = new Queue(redis, opts.queue);
    const scenarios = {
      produce, consume, share, service, control, contract, fair, events, signal, keyed, rates, budget, indexes,
      'result-budget': resultBudget, 'tombstone-limit': tombstoneLimit, 'task-produce': taskProduce, 'task-work': taskWork, 'task-decode': taskDecode,
    };
    if (!scenarios[scenario]) throw new Error(`unknown scenario ${scenario}`);
    const result = await scenarios[scenario](q, opts, redis, input);
    result.reloads ??= q.reloads;
    result.owner ??= q.owner;
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } finally {
    input.close();
    redis.disconnect();
  }
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
