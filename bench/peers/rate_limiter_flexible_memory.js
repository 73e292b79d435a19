// rate-limiter-flexible's in-memory limiter (RateLimiterMemory), one hot key, measured the way
// bench_rate_limiter's BM_Hot_Gcra_ClockPerCall measures sluice's RateLimiter::check: one
// decision after another on the same key, under its limit (points far above what a run spends),
// the limiter reading its own clock on each. consume() answers a promise; each is awaited before
// the next, as a request handler would. --repetitions runs of --seconds each (after a warm-up of
// one run's length); prints one line of key=value pairs per run: ns_per_op, ops.
// Run by bench/peers/memory_rate.sh, which installs the npm package into a directory of its own.
'use strict';
const { RateLimiterMemory } = require('rate-limiter-flexible');

function args() {
  const o = { seconds: 1, repetitions: 3 };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i += 2) {
    const name = a[i].replace(/^--/, '');
    if (!(name in o) || !(Number(a[i + 1]) > 0)) {
      console.error('usage: rate_limiter_flexible_memory.js [--seconds S] [--repetitions R]');
      process.exit(2);
    }
    o[name] = Number(a[i + 1]);
  }
  return o;
}

async function run(limiter, seconds) {
  const end = process.hrtime.bigint() + BigInt(Math.round(seconds * 1e9));
  const start = process.hrtime.bigint();
  let ops = 0;
  let now = start;
  while (now < end) {
    for (let i = 0; i < 1000; i++) await limiter.consume('tenant-0', 1);
    ops += 1000;
    now = process.hrtime.bigint();
  }
  return { ops, ns: Number(now - start) };
}

(async () => {
  const o = args();
  // Never binds: more points than a run can spend, in a window of a day (its expiry is a
  // setTimeout, which takes at most 2^31 - 1 ms: a longer window would expire the key at once).
  const limiter = new RateLimiterMemory({ points: Number.MAX_SAFE_INTEGER, duration: 24 * 3600 });
  await run(limiter, o.seconds);  // warm-up (the JIT)
  for (let r = 0; r < o.repetitions; r++) {
    const { ops, ns } = await run(limiter, o.seconds);
    console.log(`ns_per_op=${(ns / ops).toFixed(1)} ops=${ops}`);
  }
})();
