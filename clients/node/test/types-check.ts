// Compiled (never run) by test/types.test.js: the declarations in index.d.ts accept the API as
// the README shows it and refuse what it does not take.
import express from 'express';
import * as sluice from 'sluice-client';
import { Client, Decision, Lease, NotFound, Refused, SluiceError } from 'sluice-client';

async function use(client: Client): Promise<void> {
  const d: Decision = await client.check('api-rate', 'user-42');
  const ok: boolean = d.allowed;
  const retry: number | null = d.retryAfter;
  await client.peek('api-rate', 'user-42', { hits: 5, timeout: 0.5 });
  const many = await client.checkMany([['api-rate', 'u'], ['per-minute', 'u', 3], { policy: 'x', key: 'k' }]);
  const idx: number | null = many.deniedIndex;
  const c = await client.charge('tokens', 'u', 1500);
  const overdraft: number = c.overdraft;
  const lease: Lease = await client.admit('gateway', { tenant: 'acme', upstream: 'llm', ttl: 30, attributes: { route: 'chat' } });
  await client.heartbeat(lease, { ttl: 10 });
  const held: number = await client.release(lease, { outcome: 'success', rtt: 0.12, cost: 3 });
  await client.release(lease.leaseId, 'dropped');
  const n: number = await client.lease('search', { key: 'u' }, async (l) => { l.outcome = 'dropped'; l.cost = 2; return 7; });
  const s: string = await client.lease('small', () => 'x');
  const ps = await client.policies();
  const inFlight: number | undefined = ps.get('small')?.inFlight;
  const names: string[] = ps.names();
  try {
    await client.admit('small');
  } catch (err) {
    if (err instanceof Refused) { const st: number = err.status; const p: Record<string, unknown> = err.problem; void st; void p; }
    if (err instanceof NotFound) { const f: string | null = err.field; void f; }
    if (err instanceof SluiceError) { const code: number = err.code; void code; }
  }
  void ok; void retry; void idx; void overdraft; void held; void n; void s; void inFlight; void names;
}

const app = express();
const client = new sluice.Client('127.0.0.1:7070', { timeout: 2 });
app.use(sluice.express({ client, policy: 'api-rate', key: (req) => req.get('x-api-key') ?? req.ip ?? '' }));
app.use(sluice.express({
  client, policy: 'gateway', admit: (req) => ({ tenant: String(req.headers['x-tenant']), upstream: 'llm' }),
  failOpen: false, timeout: 0.25, onError: (err) => console.error(err.message),
}));
app.get('/', (req, res) => {
  const lease = req.sluice;
  if (lease instanceof sluice.Lease) lease.outcome = 'dropped';
  res.send('ok');
});
void use;

// @ts-expect-error: hits is an option, not a positional argument
void client.check('api-rate', 'k', 3);
// @ts-expect-error: not an outcome
void client.release('0'.repeat(32), 'crashed');
// @ts-expect-error: the middleware needs a policy
sluice.express({ client });
