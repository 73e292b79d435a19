// rate-limiter-flexible's RateLimiterRedis (on ioredis), measured the way
// sluice_shared_rate_load measures sluice: --concurrency closed loops of one consume() at a time
// on keys drawn from --keys, for --seconds, against the Redis at 127.0.0.1:--port, under the
// limit (1,000,000 per second per key) or over it (1 per 1000 s; every key hit once first), with
// its in-memory block of refused keys (inMemoryBlockOnConsumed) when --block. Prints one line of
// key=value pairs, as sluice_shared_rate_load does. Run by bench/peers/shared_rate.sh, which
// installs the two npm packages into a directory of its own (NODE_PATH).
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

function args() {
  const o = { port: 6379, seconds: 5, concurrency: 32, keys: 1000, over: false, block: false };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const v = a[i + 1];
    switch (a[i]) {
      case '--port': o.port = Number(v); i++; break;
      case '--seconds': o.seconds = Number(v); i++; break;
      case '--concurrency': o.concurrency = Number(v); i++; break;
      case '--keys': o.keys = Number(v); i++; break;
      case '--mode': o.over = v === 'over'; i++; break;
      case '--block': o.block = true; break;
      default: throw new Error('unknown option ' + a[i]);
    }
  }
  return o;
}

async function commands(client) {
  const info = await client.info('stats');
  const m = /total_commands_processed:(\d+)/.exec(info);
  return m ? Number(m[1]) : -1;
}

async function main() {
  const o = args();
  const client = new Redis({ host: '127.0.0.1', port: o.port, enableOfflineQueue: true });
  const opts = { storeClient: client, keyPrefix: 'rlflx', points: o.over ? 1 : 1000000,
                 duration: o.over ? 1000 : 1 };
  if (o.block) opts.inMemoryBlockOnConsumed = opts.points;
  const limiter = new RateLimiterRedis(opts);
  const keys = [];
  for (let k = 0; k < o.keys; k++) keys.push('user:' + k);
  for (const k of keys) await limiter.consume(k).catch(() => {});

  const before = await commands(client);
  let decisions = 0, allowed = 0, errors = 0;
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(o.seconds * 1e9));
  // Each loop runs until the time is up (read from the clock: a limiter that answers from memory
  // never yields to a timer).
  async function loop(seed) {
    let x = seed;
    while (process.hrtime.bigint() < end) {
      x = (x * 1103515245 + 12345) % 2147483648;
      try {
        await limiter.consume(keys[x % keys.length]);
        allowed++;
      } catch (e) {
        if (e instanceof Error) errors++;  // a refusal is a RateLimiterRes, not an Error
      }
      decisions++;
    }
  }
  const loops = [];
  for (let i = 0; i < o.concurrency; i++) loops.push(loop(i + 1));
  await Promise.all(loops);
  const took = Number(process.hrtime.bigint() - start) / 1e9;
  const after = await commands(client);
  const perDecision = before >= 0 && after >= 0 ? (after - before - 1) / decisions : -1;
  console.log(`tool=rate-limiter-flexible mode=${o.over ? 'over' : 'under'} ` +
              `block=${o.block ? 'on' : 'off'} concurrency=${o.concurrency} keys=${o.keys} ` +
              `decisions=${decisions} per_second=${Math.round(decisions / took)} ` +
              `allowed=${allowed} errors=${errors} ` +
              `redis_commands_per_decision=${perDecision.toFixed(4)}`);
  client.disconnect();
  process.exit(errors === 0 && decisions > 0 ? 0 : 1);
}

main().catch((e) => { console.error(e); process.exit(1); });
