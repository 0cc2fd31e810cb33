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

const readline = require('readline');
const { Queue, SCRIPT_KEYS, connect, newCall } = require('./pyqueue_client');

const hex = (b) => b.toString('hex');
const text = (b) => b.toString('utf8'); // ids: the tests use UTF-8 ids, as Python requires

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

async function main() {
  const [scenario, target] = process.argv.slice(2);
  if (scenario === 'keys') {
    process.stdout.write(`${JSON.stringify(SCRIPT_KEYS)}\n`);
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
    const scenarios = { produce, consume, share };
    if (!scenarios[scenario]) throw new Error(`unknown scenario ${scenario}`);
    const result = await scenarios[scenario](q, opts, redis, input);
    result.reloads = q.reloads;
    result.owner = q.owner;
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
