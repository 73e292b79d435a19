// Compiled (never run) by test/types.test.js: the declarations in index.d.ts accept the API as
// the README shows it and refuse what it does not take.
import express from 'express';
import * as grpc from '@grpc/grpc-js';
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

  // The cascade helper, its budget and the outcome helpers.
  const budget = new sluice.RetryBudget({ ratio: 0.2, perSecond: 0, window: 30, clock: () => 0 });
  const status: number = await client.cascade('replicas', async (node: string) => node.length,
    { classify: (r: number) => sluice.outcomeOfHttp(r), retries: 2, budget, key: 'u', ttl: 5, timeout: 1 });
  const plain: string = await client.cascade('replicas', (node) => node);
  const o: sluice.CascadeOutcome = sluice.outcomeForException(new Error('x'));
  const g: sluice.CascadeOutcome = sluice.outcomeOfGrpc('UNAVAILABLE');
  const retried: boolean = budget.tryRetry();
  const outcomes: readonly sluice.CascadeOutcome[] = sluice.CASCADE_OUTCOMES;

  // The throttler, over gRPC and over HTTP.
  const r: sluice.CheckResult = await client.throttlerCheck({ app: 'purge', shard: 'main', scope: 'self', lowPriority: true, threshold: 2, timeout: 1 });
  const value: number | null = r.value;
  const metric: string | null = r.metric;
  const host: string | undefined = r.metrics[0]?.host;
  const throttler = new sluice.ThrottlerClient('http://127.0.0.1:8080', { app: 'purge', shard: 'main', onUnreachable: 'proceed' });
  const unreachable: boolean = (await throttler.check()).unreachable;
  await sluice.waitUntilAllowed(throttler, { deadline: 10, backoff: new sluice.Backoff({ jitter: 0 }) });
  try {
    const stats: sluice.ChunkStats = await sluice.runInChunks(throttler, async () => false, {
      deadlinePerChunk: 600, onWait: (res, delay) => console.log(res.reason, delay),
      clock: () => 0, sleep: async () => {},
    });
    const max: number | null = stats.maxValueSeen;
    void max;
  } catch (err) {
    if (err instanceof sluice.ThrottledTimeout) { const last: sluice.CheckResult = err.result; void last; }
  }
  throttler.close();
  void status; void plain; void o; void g; void retried; void outcomes; void value; void metric; void host; void unreachable;
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

// The gRPC server interceptor, and what a handler finds of its admission.
const grpcServer = new grpc.Server({
  interceptors: [
    sluice.grpcServerInterceptor({ client, policy: 'search' }),
    sluice.grpcServerInterceptor({
      client, policy: 'gateway', key: (r) => r.get('x-api-key'), hits: (r) => (r.responseStream ? 2 : 1),
      admit: (r) => ({ tenant: r.get('x-tenant') ?? 'anonymous', upstream: 'llm' }),
      mode: 'admit', failOpen: false, timeout: 0.25,
      skip: (r) => sluice.skipHealthAndReflection(r) || r.method === 'Ping' || r.peer === 'unknown',
      onError: (err, r) => console.error(r.path, r.service, err.message),
    }),
    sluice.grpcServerInterceptor({ client, policy: 'api-rate', key: 'shared', allowance: 64, allowanceHold: 0.1, skip: null }),
  ],
});
const echo: grpc.handleUnaryCall<Buffer, Buffer> = (call, callback) => {
  const admission = sluice.grpcAdmission(call);
  if (admission instanceof sluice.Lease) admission.outcome = 'dropped';
  const allowed: boolean | undefined = admission instanceof sluice.Decision ? admission.allowed : undefined;
  void allowed;
  callback(null, call.request);
};
void grpcServer; void echo;

// @ts-expect-error: hits is an option, not a positional argument
void client.check('api-rate', 'k', 3);
// @ts-expect-error: not an outcome
void client.release('0'.repeat(32), 'crashed');
// @ts-expect-error: the middleware needs a policy
sluice.express({ client });
// @ts-expect-error: not a cascade outcome
void client.cascade('replicas', (node) => node, { classify: () => 'dropped' });
// @ts-expect-error: the throttler client needs an app
new sluice.ThrottlerClient('http://127.0.0.1:8080', {});
// @ts-expect-error: a chunk says whether more work remains
void sluice.runInChunks(new sluice.ThrottlerClient('http://h', { app: 'a' }), () => undefined, { deadlinePerChunk: 1 });
// @ts-expect-error: the interceptor needs a client
sluice.grpcServerInterceptor({ policy: 'search' });
// @ts-expect-error: a key function is given the call's GrpcRequest
sluice.grpcServerInterceptor({ client, policy: 'search', key: (path: number) => String(path) });
