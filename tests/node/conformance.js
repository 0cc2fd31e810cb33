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

const readline = require('readline');
const {
  Queue, Service, ScriptRunner, SCRIPT_KEYS, SERVICE_SCRIPT_KEYS, connect, newCall, seconds, monotonicMs,
} = require('./pyqueue_client');

const hex = (b) => b.toString('hex');
const text = (b) => b.toString('utf8'); // ids: the tests use UTF-8 ids, as Python requires
const str = (b) => b.toString('latin1'); // statuses and key names are ASCII

function jobJson(job) {
  return {
    id: text(job.id), payload_hex: hex(job.payload), receipt_hex: hex(job.receipt),
    fence: job.fence, attempt: job.attempt, max_attempts: job.maxAttempts, deadline_ms: job.deadlineMs,
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
    const scenarios = { produce, consume, share, service, control };
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
