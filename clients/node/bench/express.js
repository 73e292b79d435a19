'use strict';
// A trivial Express handler without and with the sluice middleware, under the same load in the
// same run: median and p99 latency of each, and their ratios to the handler alone.
//
//   node bench/express.js [--requests N] [--concurrency C] [--rounds R] [--warmup W]
//
// Three processes: this one (the load: keep-alive HTTP requests, C at a time, sequential for
// C = 1), the Express app (a child: GET /plain, GET /rate behind a check on a rate policy,
// GET /rate-allowance behind the same with an allowance of 128 (a check per 128 requests),
// GET /lease behind an admit and a release on a concurrency policy, GET /lease-reuse the same
// with leaseReuse: 0.02), and `sluice serve` (from $SLUICE_BIN, as the tests start it). The
// variants take turns in R rounds, in an order shuffled per round (a fixed seed), so that any
// drift of the machine falls on all of them; the paired columns are the median over rounds of
// each round's ratio to the handler alone in the same round. Last, the gRPC check alone is
// timed from this process: the floor of what the middleware can add.

const { fork } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const { performance } = require('node:perf_hooks');
const path = require('node:path');

const VARIANTS = [
  ['/plain', 'handler alone'],
  ['/rate', 'rate policy: check'],
  ['/rate-allowance', 'rate policy: allowance 128'],
  ['/lease', 'concurrency policy: admit + release'],
  ['/lease-reuse', 'concurrency policy: lease reuse'],
];

const CONFIG = `
policies:
  bench-rate:
    kind: rate
    strategy: gcra
    limit: 1000000
    period: 1s
    burst: 1000000
  bench-pool:
    kind: adaptive
    algorithm: fixed
    limit: 1000
`;

function args() {
  const out = { requests: 5000, concurrency: 1, rounds: 10, warmup: 500 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    if (!(name in out) || argv[i + 1] === undefined) {
      console.error('usage: node bench/express.js [--requests N] [--concurrency C] [--rounds R] [--warmup W]');
      process.exit(2);
    }
    out[name] = Number(argv[i + 1]);
  }
  return out;
}

// ---- the Express app (child process) ----

function serveApp(target) {
  const express = require('express');
  const sluice = require('..');
  const client = new sluice.Client(target, { timeout: 2 });
  const app = express();
  app.set('etag', false);
  const handler = (req, res) => res.send('ok');
  app.get('/plain', handler);
  app.get('/rate', sluice.express({ client, policy: 'bench-rate', key: 'bench', mode: 'check' }), handler);
  // One check of 128 hits per 128 requests, each spent within 0.1 s; the rest admitted here.
  app.get('/rate-allowance', sluice.express({
    client, policy: 'bench-rate', key: 'bench-allowance', mode: 'check', allowance: 128, allowanceHold: 0.1,
  }), handler);
  app.get('/lease', sluice.express({ client, policy: 'bench-pool', key: 'bench', mode: 'admit' }), handler);
  // A request takes the lease the one before it freed (kept 20 ms; reported once per 20 ms).
  app.get('/lease-reuse', sluice.express({
    client, policy: 'bench-pool', key: 'bench-reuse', mode: 'admit', leaseReuse: 0.02,
  }), handler);
  const srv = http.createServer({ keepAliveTimeout: 60000 }, app);
  srv.listen(0, '127.0.0.1', () => process.send({ port: srv.address().port }));
  process.on('message', (m) => {
    if (m === 'stop') { client.close(); srv.closeAllConnections(); srv.close(); process.exit(0); }
  });
}

// ---- the load (this process) ----

function quantile(sorted, q) {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}

async function load(port, pathname, n, concurrency, agent, samples) {
  let next = 0;
  async function worker() {
    while (next < n) {
      next++;
      const t0 = performance.now();
      await new Promise((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port, path: pathname, agent }, (res) => {
          res.resume();
          res.on('end', () => {
            if (res.statusCode !== 200) reject(new Error(`${pathname}: HTTP ${res.statusCode}`));
            else resolve();
          });
        });
        req.on('error', reject);
      });
      if (samples) samples.push(performance.now() - t0);
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
}

function stats(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return { median: quantile(s, 0.5) * 1000, p99: quantile(s, 0.99) * 1000, n: s.length };
}

/** CPU microseconds a process has used (Linux: /proc; null elsewhere). */
function processCpu(pid) {
  try {
    const fields = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(fields[11]) + Number(fields[12])) * (1e6 / CLOCK_TICKS);
  } catch {
    return null;
  }
}
const CLOCK_TICKS = 100; // sysconf(_SC_CLK_TCK) on Linux

/** `n` sequential calls of fn after `warmup`: latency, and CPU per call here and in `pid`. */
async function timed(n, warmup, fn, pid) {
  for (let i = 0; i < warmup; i++) await fn();
  const xs = [];
  const cpu0 = process.cpuUsage();
  const server0 = processCpu(pid);
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await fn();
    xs.push(performance.now() - t0);
  }
  const cpu = process.cpuUsage(cpu0);
  const server1 = processCpu(pid);
  return {
    ...stats(xs),
    clientCpu: (cpu.user + cpu.system) / n,
    serverCpu: server0 === null || server1 === null ? null : (server1 - server0) / n,
  };
}

function httpCheck(port, agent) {
  const body = JSON.stringify({ policy: 'bench-rate', key: 'bench' });
  return () => new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port, path: '/v1/check', method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`/v1/check: HTTP ${res.statusCode}`))));
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function main() {
  const opts = args();
  const { startServer } = require('../test/helpers');
  const sluice = require('..');
  const server = await startServer(CONFIG);
  const child = fork(__filename, ['--serve', server.grpcTarget], { stdio: 'inherit' });
  const { port } = await new Promise((r) => child.once('message', r));
  const agent = new http.Agent({ keepAlive: true, maxSockets: opts.concurrency });
  const client = new sluice.Client(server.grpcTarget, { timeout: 2 });
  try {
    for (const [p] of VARIANTS) await load(port, p, opts.warmup, opts.concurrency, agent, null);
    const samples = Object.fromEntries(VARIANTS.map(([p]) => [p, []]));
    // Per variant, each round's median and p99 over the handler alone's in the same round.
    const paired = Object.fromEntries(VARIANTS.map(([p]) => [p, { median: [], p99: [] }]));
    const perRound = Math.ceil(opts.requests / opts.rounds);
    const order = VARIANTS.map(([p]) => p);
    let seed = 20261203; // a fixed shuffle of the variants' order in each round
    const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
    for (let r = 0; r < opts.rounds; r++) {
      for (let i = order.length - 1; i > 0; i--) {
        const j = Math.floor(rnd() * (i + 1));
        [order[i], order[j]] = [order[j], order[i]];
      }
      const round = {};
      for (const p of order) {
        round[p] = [];
        await load(port, p, perRound, opts.concurrency, agent, round[p]);
        samples[p].push(...round[p]);
      }
      const floor = stats(round['/plain']);
      for (const p of order) {
        const mine = stats(round[p]);
        paired[p].median.push(mine.median / floor.median);
        paired[p].p99.push(mine.p99 / floor.p99);
      }
    }
    // The last releases go out after their responses: give them a moment.
    let left;
    for (let i = 0; i < 100 && (left = (await client.policies()).get('bench-pool').inFlight) > 0; i++) {
      await new Promise((r) => setTimeout(r, 20));
    }

    // Where the time goes: one check alone, sequential, from this process, over gRPC (this
    // client) and over the server's HTTP/1.1 JSON mirror (POST /v1/check), with the CPU time
    // each call costs this process and the server.
    const n = perRound * opts.rounds;
    const grpcStats = await timed(n, opts.warmup, () => client.check('bench-rate', 'bench'), server.proc.pid);
    const httpStats = await timed(n, opts.warmup, httpCheck(server.httpPort, agent), server.proc.pid);

    const base = stats(samples['/plain']);
    const expressVersion = require('express/package.json').version;
    console.log(`node ${process.version}, express ${expressVersion}, @grpc/grpc-js ${require('@grpc/grpc-js/package.json').version}; ` +
      `${n} requests per variant (${opts.rounds} rounds, after ${opts.warmup} warm-up), ` +
      `${opts.concurrency === 1 ? 'sequential' : `${opts.concurrency} at a time`}, keep-alive, loopback`);
    console.log('variant                                    median µs   p99 µs   median ×   p99 ×   added (median)' +
      '   paired median ×   paired p99 ×');
    const mid = (xs) => quantile([...xs].sort((a, b) => a - b), 0.5);
    for (const [p, label] of VARIANTS) {
      const r = stats(samples[p]);
      console.log(`${label.padEnd(40)} ${r.median.toFixed(0).padStart(11)} ${r.p99.toFixed(0).padStart(8)}` +
        ` ${(r.median / base.median).toFixed(2).padStart(10)} ${(r.p99 / base.p99).toFixed(2).padStart(7)}` +
        ` ${`${(r.median - base.median).toFixed(0)} µs`.padStart(16)}` +
        ` ${mid(paired[p].median).toFixed(2).padStart(17)} ${mid(paired[p].p99).toFixed(2).padStart(14)}`);
    }
    console.log('one check alone, sequential                median µs   p99 µs   CPU µs/call: client  server');
    for (const [label, r] of [['gRPC (this client)', grpcStats], ['HTTP/1.1 JSON (POST /v1/check)', httpStats]]) {
      console.log(`${label.padEnd(40)} ${r.median.toFixed(0).padStart(11)} ${r.p99.toFixed(0).padStart(8)}` +
        ` ${r.clientCpu.toFixed(0).padStart(20)} ${r.serverCpu === null ? '     ?' : r.serverCpu.toFixed(0).padStart(7)}`);
    }
    console.log(`leases still held after the run: ${left}`);
  } finally {
    child.send('stop');
    await new Promise((r) => child.once('exit', r));
    agent.destroy();
    client.close();
    await server.stop();
  }
}

if (process.argv[2] === '--serve') serveApp(process.argv[3]);
else main().catch((err) => { console.error(err); process.exit(1); });
