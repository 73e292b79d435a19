// Type declarations of sluice-client. Every duration is a number of seconds.

import type {
  ChannelCredentials, ChannelOptions, Metadata, ServerInterceptingCallInterface, ServerInterceptor,
} from '@grpc/grpc-js';
import type { IncomingMessage, ServerResponse } from 'node:http';

/** How a leased call ended (the server's Outcome enum). */
export type Outcome = 'success' | 'dropped' | 'ignored' | 'failed' | 'timeout' | 'overload';
export const OUTCOMES: readonly Outcome[];

/** What a cascade policy is told of a call: a release's outcome, as cascade() reports it. */
export type CascadeOutcome = 'success' | 'timeout' | 'overload' | 'failed' | 'ignored';
export const CASCADE_OUTCOMES: readonly CascadeOutcome[];

/** Seconds on the monotonic clock (performance.now()) of Lease.admittedAt and Lease.deadline. */
export function now(): number;

/** The proto file a Client loads when given no protoPath: $SLUICE_PROTO, else the copy a packed
 *  tarball carries, else ../../proto/sluice/v1/sluice.proto of the checkout. */
export function defaultProtoPath(): string;

/** A rate policy's answer for one key. */
export class Decision {
  readonly allowed: boolean;
  /** The most hits the key may spend at once (GCRA: the burst). */
  readonly limit: number;
  /** Hits still allowed now, after this request. */
  readonly remaining: number;
  /** Seconds until the key's allowance is whole again. */
  readonly resetAfter: number;
  /** 0 when allowed; denied: seconds until the same request would pass; null: it never can. */
  readonly retryAfter: number | null;
  /** Denied for more than the key's own limit: why ("budget_spent", ...); "" otherwise. */
  readonly reason: string;
  /** With a reason, from check(): what the policy says of it; "" otherwise. */
  readonly detail: string;
  /** Allowed only because the policy runs in shadow: it would have refused. */
  readonly wouldDeny: boolean;
}

/** A key's allowance after charge() (or a release with a cost). */
export class Charge {
  readonly limit: number;
  readonly remaining: number;
  /** Hits charged past the limit that the key's later checks are waiting out. */
  readonly overdraft: number;
  /** Federated: hits beyond this region's escrow, being taken from the global budget. */
  readonly pending: number;
  readonly resetAfter: number;
  /** Seconds until a check of one hit could pass (0: now). */
  readonly retryAfter: number;
}

/** An admitted call. Release it, or let client.lease() (or the middleware) do it. */
export class Lease {
  /** 32 hex digits; whoever knows it can release or extend the lease. */
  readonly leaseId: string;
  /** Seconds the lease lives without a heartbeat. */
  ttl: number;
  readonly policy: string;
  /** now() when the admission returned. */
  readonly admittedAt: number;
  /** Set it to choose the outcome reported at release; null: decided at the end. */
  outcome: Outcome | null;
  /** Set once released through the client. */
  released: boolean;
  /** What the policy chose (a cascade's node); "" when it names nothing. */
  readonly chosen: string;
  /** now() by which the call must have ended (a fleet policy's call deadline); null: none. */
  readonly deadline: number | null;
  /** Seconds the call waited in a queue before it was admitted (0: none). */
  readonly waited: number;
  /** What the policy's kind answered beyond the above, by name. */
  readonly attributes: Record<string, string | string[]>;
  /** Admitted only because the policy runs in shadow; rejection says what it would have done. */
  readonly wouldDeny: boolean;
  readonly rejection: Refused | null;
  /** Set it to what the call cost the chained rate policy, in hits; charged at the release. */
  cost: number | null;
  /** After a release with a cost: the chained rate key's Charge. */
  charged: Charge | null;
  /** The lease may carry its holder's next call (an adaptive policy's, chaining no rate
   *  policy): see keep() and the adapters' leaseReuse. */
  readonly reusable: boolean;
  /** Seconds until deadline (never negative); null: no deadline. */
  timeLeft(): number | null;
  toString(): string;
}

/** One policy as policies() reports it. */
export class PolicyState {
  readonly name: string;
  /** rate, federated, adaptive, fleet, concurrency, cascade, throttler */
  readonly kind: string;
  /** The chained rate policy's name, or "". */
  readonly rate: string;
  /** Concurrency kinds: calls holding a permit (leases included). */
  readonly inFlight: number;
  /** Rate: hits per period; adaptive/fleet: the concurrency ceiling in force. */
  readonly limit: number;
  /** Every other detail, as GET /v1/policies shows it. */
  readonly state: Record<string, unknown>;
}

/** Every policy of the server by name, plus the leases held and the config generation. */
export class Policies extends Map<string, PolicyState> {
  readonly leases: number;
  readonly configGeneration: number;
  /** The policies' names, sorted. */
  names(): string[];
}

/** One metric of a throttler's answer. */
export class ThrottlerMetric {
  readonly name: string;
  /** 200 or 429 (0: the HTTP body did not say). */
  readonly status: number;
  readonly value: number | null;
  readonly threshold: number | null;
  /** ok, threshold_exceeded, probe_failed, stale_sample, no_sample */
  readonly reason: string;
  /** A failed probe's error, or how stale. */
  readonly message: string;
  readonly scope: string;
  /** The host that decided. */
  readonly host: string;
}

/** The throttler's answer to one check (client.throttlerCheck(), ThrottlerClient.check()). */
export class CheckResult {
  /** Go ahead with one chunk of work; false: hold back and ask again later. */
  readonly ok: boolean;
  /** 200, 429, 417, 404, 400, 5xx; 0 when the HTTP throttler could not be reached at all. */
  readonly status: number;
  /** "ok", "exempt", "threshold_exceeded", "low_priority", "app_throttled", ...; "unreachable: <why>". */
  readonly reason: string;
  /** The deciding metric's value (gRPC: 0 when none; HTTP: null when the body has none). */
  readonly value: number | null;
  /** The deciding metric's threshold (gRPC: 0 when none; HTTP: null when the body has none). */
  readonly threshold: number | null;
  /** The deciding metric's name, or null. */
  readonly metric: string | null;
  readonly message: string;
  /** The app the throttler answered for ("default" for none). */
  readonly app: string;
  readonly scope: string;
  readonly recentlyChecked: boolean;
  readonly metrics: readonly ThrottlerMetric[];
  /** Not the throttler's answer but the ThrottlerClient's onUnreachable policy's. */
  readonly unreachable: boolean;
}

export interface CheckManyResult {
  /** Every check passed, and all were debited; if not, none was. */
  allowed: boolean;
  /** One per check, in order, up to and including the first denial. */
  decisions: Decision[];
  /** The first denied check; null when allowed. */
  deniedIndex: number | null;
}

export interface CallOptions {
  /** Seconds this call may take (default: the client's timeout). */
  timeout?: number;
}

export interface CheckOptions extends CallOptions {
  /** Hits to spend, >= 1 (default 1). */
  hits?: number;
}

export type CheckSpec = [policy: string, key: string, hits?: number] | { policy: string; key: string; hits?: number };

export interface AdmitOptions extends CallOptions {
  /** The caller's key, for a chained rate policy (a concurrency policy falls back to tenant). */
  key?: string;
  tenant?: string;
  upstream?: string;
  route?: string;
  /** Seconds the lease lives without a heartbeat (default: the server's lease_ttl). */
  ttl?: number;
  /** A cascade's nodes not to choose (those a retry already tried). */
  exclude?: string[];
  /** Seconds to wait in an upstream's queue (0: do not wait); adds to the call's deadline. */
  maxWait?: number;
  /** What else the policy's kind reads, by name (an array for a list). */
  attributes?: Record<string, string | string[]>;
}

export interface ReleaseOptions extends CallOptions {
  /** Default "success". */
  outcome?: Outcome;
  /** The call's latency in seconds (default: the time the lease was held). */
  rtt?: number;
  /** What the call cost the chained rate policy, in hits (0 to 1e9). */
  cost?: number;
  /** A reusable lease: the calls it carried before this one since it was last kept, oldest first. */
  earlier?: { outcome?: Outcome; rtt: number }[];
}

export interface KeepOptions extends CallOptions {
  /** Default "success". */
  outcome?: Outcome;
  /** The call's latency in seconds (default: the time since the lease was admitted or kept). */
  rtt?: number;
  /** The calls the lease carried before this one since it was last kept, oldest first. */
  earlier?: { outcome?: Outcome; rtt: number }[];
}

export interface HeartbeatOptions extends CallOptions {
  /** Seconds from now (default: the lease's current TTL). */
  ttl?: number;
}

export interface CascadeOptions<T> {
  /** The outcome of a call that resolved (default: "success"). */
  classify?: (result: T) => CascadeOutcome | PromiseLike<CascadeOutcome>;
  /** How many times a failure is retried on another node (default 0). */
  retries?: number;
  /** Retries are made only while it allows (default: the client's own). */
  budget?: RetryBudget;
  /** The lease's TTL, seconds (default: the server's lease_ttl). */
  ttl?: number;
  /** The caller's key, for a chained rate policy. */
  key?: string;
  /** Seconds each admit and release may take (default: the client's timeout). */
  timeout?: number;
}

export interface ThrottlerCheckOptions extends CallOptions {
  /** Default "": the throttler's default app. */
  app?: string;
  /** Default "": the first throttler of the config. */
  shard?: string;
  /** "self", "shard", or "" (default): the throttler's default. */
  scope?: string;
  /** p=low: yields while a normal-priority check was refused recently. */
  lowPriority?: boolean;
  /** > 0: this check's own threshold for every metric; 0 (default): the metrics' own. */
  threshold?: number;
}

export interface ClientOptions {
  /** Seconds each call may take (default 5). */
  timeout?: number;
  /** Default: insecure. */
  credentials?: ChannelCredentials;
  channelOptions?: ChannelOptions;
  /** The sluice.proto to load (default: defaultProtoPath()). */
  protoPath?: string;
}

export class Client {
  constructor(target?: string, options?: ClientOptions);
  readonly target: string;
  readonly timeout: number;
  close(): void;
  /** Resolves once connected; rejects with Unavailable after `timeout` seconds. */
  waitReady(timeout?: number): Promise<void>;

  /** Spends hits for key if all are allowed now; a denial resolves with allowed === false. */
  check(policy: string, key: string, options?: CheckOptions): Promise<Decision>;
  /** The decision check() would give now, spending nothing. */
  peek(policy: string, key: string, options?: CheckOptions): Promise<Decision>;
  /** Several checks, all or nothing. */
  checkMany(checks: Iterable<CheckSpec>, options?: CallOptions): Promise<CheckManyResult>;
  /** Charges hits (negative: gives back) after the fact; never refused. */
  charge(policy: string, key: string, hits: number, options?: CallOptions): Promise<Charge>;

  /** Admits one call; rejects with Refused (429 or 503) when not admitted. */
  admit(policy: string, options?: AdmitOptions): Promise<Lease>;
  /** Ends a lease; resolves to the seconds it was held. */
  release(lease: Lease | string, options?: ReleaseOptions | Outcome): Promise<number>;
  /** Reports a call a reusable lease carried and keeps its permit for the holder's next call
   *  (a Release with keep); resolves to whether that call is within the policy's limit (false:
   *  release the lease once it ends). */
  keep(lease: Lease | string, options?: KeepOptions): Promise<boolean>;
  /** Extends a lease; resolves to the TTL applied. */
  heartbeat(lease: Lease | string, options?: HeartbeatOptions): Promise<number>;
  /** Admits, awaits fn(lease), releases with the outcome and the RTT; resolves to fn's result. */
  lease<T>(policy: string, options: AdmitOptions | undefined, fn: (lease: Lease) => T | Promise<T>): Promise<T>;
  lease<T>(policy: string, fn: (lease: Lease) => T | Promise<T>): Promise<T>;

  /** Picks a node of a cascade policy, calls fn(node), reports how it went (retrying a failure
   *  on untried nodes while the budget allows); resolves to fn's result. */
  cascade<T>(policy: string, fn: (node: string) => T | PromiseLike<T>, options?: CascadeOptions<Awaited<T>>): Promise<Awaited<T>>;

  /** One throttler check over gRPC (sluice.v1.Throttler/Check). */
  throttlerCheck(options?: ThrottlerCheckOptions): Promise<CheckResult>;

  /** Every policy's state. */
  policies(options?: CallOptions): Promise<Policies>;
}

export interface RetryBudgetOptions {
  /** Retries per first attempt, 0..1 (default 0.1). */
  ratio?: number;
  /** Retries a second allowed on top (default 10). */
  perSecond?: number;
  /** Seconds counted (default 10). */
  window?: number;
  /** Seconds, monotonic (default now()). */
  clock?: () => number;
}

/** Retries allowed while retries <= ratio * calls + perSecond * window over the last window. */
export class RetryBudget {
  constructor(options?: RetryBudgetOptions);
  readonly ratio: number;
  readonly perSecond: number;
  readonly window: number;
  /** A first attempt was made. */
  recordCall(): void;
  /** Spends one retry if it fits; false: make no retry. */
  tryRetry(): boolean;
}

/** 429 and 503 overload; 408 and 504 timeout; another 5xx failed; else success. */
export function outcomeOfHttp(status: number): CascadeOutcome;
/** RESOURCE_EXHAUSTED, UNAVAILABLE overload; DEADLINE_EXCEEDED timeout; CANCELLED ignored;
 *  UNKNOWN, UNIMPLEMENTED, INTERNAL, DATA_LOSS failed; else success. A number or its name. */
export function outcomeOfGrpc(code: number | string): CascadeOutcome;
/** The outcome of a call that threw err (a timeout, an AbortError, an HTTP status or gRPC code
 *  it carries; else failed). */
export function outcomeForException(err: unknown): CascadeOutcome;

export interface ThrottlerClientOptions {
  /** The app's name: per-app rules, exemptions and throttles key on it. */
  app: string;
  /** Default: the server's own. */
  shard?: string | null;
  /** Default: the server's. */
  scope?: 'self' | 'shard' | null;
  /** Send p=low. */
  lowPriority?: boolean;
  /** Seconds for connecting and each wait for data (default 1). */
  timeout?: number;
  /** What a check answers when the throttler cannot be asked (default "hold": ok false). */
  onUnreachable?: 'hold' | 'proceed';
}

/** Asks one sluice server's throttler, over HTTP, whether an app may do its next chunk of work. */
export class ThrottlerClient {
  constructor(url: string, options: ThrottlerClientOptions);
  readonly url: string;
  readonly app: string;
  readonly shard: string | null;
  readonly scope: 'self' | 'shard' | null;
  readonly lowPriority: boolean;
  readonly timeout: number;
  readonly onUnreachable: 'hold' | 'proceed';
  /** Asks once; never rejects for an HTTP or network failure. */
  check(): Promise<CheckResult>;
  /** Closes the kept-alive connection; a later check opens a new one. */
  close(): void;
}

export interface BackoffOptions {
  /** The first delay, seconds (default 1). */
  initial?: number;
  /** Each delay's multiple of the one before (default 2). */
  factor?: number;
  /** The longest delay before jitter, seconds (default 4). */
  cap?: number;
  /** The spread, in [0, 1) (default 0.2). */
  jitter?: number;
  /** The shortest delay, seconds (default 0.1). */
  minInterval?: number;
  /** A number in [0, 1) (default Math.random). */
  random?: () => number;
}

/** The delays between refused checks: bounded exponential, jittered, floored. */
export class Backoff {
  constructor(options?: BackoffOptions);
  readonly initial: number;
  readonly factor: number;
  readonly cap: number;
  readonly jitter: number;
  readonly minInterval: number;
  /** The next delay, seconds. */
  nextDelay(): number;
  /** Back to the first delay. */
  reset(): void;
}

/** What runInChunks() did. */
export class ChunkStats {
  constructor(fields?: Partial<ChunkStats>);
  chunks: number;
  checks: number;
  refusals: number;
  waitedSeconds: number;
  maxValueSeen: number | null;
}

/** The throttler did not allow the work before the deadline (not a timeout to isTimeout()). */
export class ThrottledTimeout extends SluiceError {
  constructor(result: CheckResult, deadline: number, stats?: ChunkStats | null);
  /** The last check's answer. */
  readonly result: CheckResult;
  readonly deadline: number;
  /** From runInChunks(): the stats up to the timeout; null from waitUntilAllowed(). */
  stats: ChunkStats | null;
}

export interface WaitOptions {
  /** Default: a new Backoff. */
  backoff?: Backoff;
  /** Seconds, monotonic (default now()). */
  clock?: () => number;
  /** Waits that many seconds (default a timer). */
  sleep?: (seconds: number) => void | PromiseLike<void>;
  /** Called before each sleep. */
  onWait?: (result: CheckResult, delay: number) => void;
}

/** Checks until allowed; rejects with ThrottledTimeout past the deadline (seconds). */
export function waitUntilAllowed(client: ThrottlerClient, options: WaitOptions & { deadline: number }): Promise<CheckResult>;

/** Runs chunk() until it returns false, waiting for the throttler before each call. */
export function runInChunks(
  client: ThrottlerClient,
  chunk: () => boolean | PromiseLike<boolean>,
  options: WaitOptions & { deadlinePerChunk: number },
): Promise<ChunkStats>;

/** A call failed: the server (or the channel) answered with a gRPC error status. */
export class SluiceError extends Error {
  constructor(message: string, code?: number);
  /** The gRPC status code (grpc.status.NOT_FOUND is 5). */
  readonly code: number;
  /** Its name: "NOT_FOUND". */
  readonly codeName: string;
  /** The field the server's message names first ("key", "checks[1].hits"), or null. */
  readonly field: string | null;
  readonly metadata?: Metadata;
  static readonly code: number;
}
export class InvalidArgument extends SluiceError {}
export class NotFound extends SluiceError {}
export class FailedPrecondition extends SluiceError {}
export class PermissionDenied extends SluiceError {}
export class Unavailable extends SluiceError {}
export class DeadlineExceeded extends SluiceError {}

/** An admit answered "not admitted". Not a SluiceError: flow control, not a failure. */
export class Refused extends Error {
  constructor(status: number, fields?: Partial<Omit<Refused, 'status' | 'problem' | 'name' | 'message'>>);
  /** 429: a chained rate policy is over its rate; 503: a concurrency limit is reached. */
  readonly status: number;
  readonly title: string;
  readonly type: string;
  readonly detail: string;
  /** Seconds until trying again makes sense; null: the same call can never pass. */
  readonly retryAfter: number | null;
  readonly policy: string;
  readonly level: string;
  readonly current: number;
  readonly limit: number;
  /** The RFC 9457 problem+json document the server sent. */
  readonly problemJson: string;
  /** It parsed ({} if none). */
  readonly problem: Record<string, unknown>;
  /** Seconds waited in a queue before the refusal (0: none). */
  readonly waited: number;
}

/** Whether err says a call timed out (what lease() reports as "dropped"). */
export function isTimeout(err: unknown): boolean;

/** The outcome the middleware reports for a finished response's status. */
export function outcomeOfStatus(status: number): Outcome;

export interface MiddlewareOptions<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> {
  client: Client;
  policy: string;
  /** The key checked (rate) or passed to admit (default: req.ip). */
  key?: string | ((req: Req) => string);
  /** Hits a check takes (rate; default 1). */
  hits?: number | ((req: Req) => number);
  /** What else an admit sends (concurrency). */
  admit?: Omit<AdmitOptions, 'key' | 'timeout'> | ((req: Req) => Omit<AdmitOptions, 'key' | 'timeout'>);
  /** Default: from the policy's kind, asked once. */
  mode?: 'check' | 'admit';
  /** true (default): a request goes through when sluice cannot answer; false: 503. */
  failOpen?: boolean;
  /** Seconds each call to sluice may take (default 1). */
  timeout?: number;
  /** Seconds sluice is not asked after it failed to answer: the failure mode applies at once
   *  (default 1; 0: always ask). Failing closed, also the refusal's Retry-After. */
  unreachableRetry?: number;
  /** The outcome reported for a finished response (default: outcomeOfStatus(res.statusCode)). */
  outcome?: (req: Req, res: Res) => Outcome;
  /** true: the request goes through unasked. */
  skip?: (req: Req) => boolean;
  /** Told of the errors the middleware absorbs (default: a process warning, one a minute). */
  onError?: (err: Error, req: Req) => void;
  /** Rate policies: hits taken from the server at once and spent here (default 0: none). */
  allowance?: number;
  /** Seconds a hit taken so may wait to be spent (default 0.05). */
  allowanceHold?: number;
  /** Adaptive policies: seconds a finished request's lease waits for the next request of its
   *  key, which then goes without an admit (default 0: an admit per request). */
  leaseReuse?: number;
}

/** An allowance's counters: requests admitted and refused in the adapter, blocks granted and
 *  refused to a request that waited for them, hits dropped at their hold's end, requests that
 *  waited for the server, refills (blocks asked in the background) granted and refused or
 *  unanswered; and now: hits held, refills not answered yet. */
export interface AllowanceStats {
  localAdmits: number;
  localRefusals: number;
  blocksGranted: number;
  blocksRefused: number;
  hitsDropped: number;
  callsAsked: number;
  refillsGranted: number;
  refillsRefused: number;
  hitsHeld: number;
  refillsInFlight: number;
}

/** The middleware: (req, res, next) for Express, connect or node:http; close() releases the
 *  leases it keeps (leaseReuse); allowanceStats() is null without an allowance. */
export function express<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  options: MiddlewareOptions<Req, Res>,
): ((req: Req, res: Res, next: (err?: unknown) => void) => void) & {
  close(): Promise<void>;
  allowanceStats(): AllowanceStats | null;
};

/** What the gRPC server interceptor's functions (key, hits, admit, skip, onError) are given of a call. */
export interface GrpcRequest {
  /** The method's full path: '/pkg.Service/Method' (the default key). */
  readonly path: string;
  /** 'pkg.Service'. */
  readonly service: string;
  /** 'Method'. */
  readonly method: string;
  /** The call's metadata. */
  readonly metadata: Metadata;
  readonly requestStream: boolean;
  readonly responseStream: boolean;
  /** The interceptor's view of the call (getDeadline(), getHost(), getAuthContext()...). */
  readonly call: ServerInterceptingCallInterface;
  /** The client's address ('127.0.0.1:51234'), or 'unknown'. */
  readonly peer: string;
  /** The first string value of metadata key `name` (case-insensitive); undefined: none. */
  get(name: string): string | undefined;
}

export interface GrpcInterceptorOptions {
  client: Client;
  policy: string;
  /** The key checked (rate) or passed to admit (default: the method's path). An empty or
   *  undefined key is refused INVALID_ARGUMENT by the server: give a default yourself. */
  key?: string | ((request: GrpcRequest) => string | undefined);
  /** Hits a check takes (rate; default 1). */
  hits?: number | ((request: GrpcRequest) => number);
  /** What else an admit sends (concurrency). */
  admit?: Omit<AdmitOptions, 'key' | 'timeout'> | ((request: GrpcRequest) => Omit<AdmitOptions, 'key' | 'timeout'>);
  /** Default: from the policy's kind, asked once. */
  mode?: 'check' | 'admit';
  /** true (default): a call goes through when sluice cannot answer; false: UNAVAILABLE. */
  failOpen?: boolean;
  /** Seconds each call to sluice may take (default 1). */
  timeout?: number;
  /** Seconds sluice is not asked after it failed to answer: the failure mode applies at once
   *  (default 1; 0: always ask). Failing closed, also the refusal's Retry-After. */
  unreachableRetry?: number;
  /** true: the call goes through unasked. Default: skipHealthAndReflection; null: none skipped. */
  skip?: ((request: GrpcRequest) => boolean) | null;
  /** Told of the errors the interceptor absorbs or ends a call with (default: a process
   *  warning, one a minute). */
  onError?: (err: Error, request: GrpcRequest) => void;
  /** Rate policies: hits taken from the server at once and spent here (default 0: none). */
  allowance?: number;
  /** Seconds a hit taken so may wait to be spent (default 0.05). */
  allowanceHold?: number;
  /** Adaptive policies: as the middleware's. */
  leaseReuse?: number;
}

/** The interceptor, for `new grpc.Server({ interceptors: [...] })` (@grpc/grpc-js 1.10 or later);
 *  close() releases the leases it keeps (leaseReuse); allowanceStats() as the middleware's. */
export function grpcServerInterceptor(options: GrpcInterceptorOptions): ServerInterceptor & {
  close(): Promise<void>;
  allowanceStats(): AllowanceStats | null;
};

/** In a handler: the Decision (rate) or the Lease (concurrency; set its outcome or cost) its
 *  call was admitted with, given the handler's call (or its metadata); null when sluice could
 *  not answer and the call failed open; undefined when the interceptor did not admit it. */
export function grpcAdmission(call: { readonly metadata: Metadata } | Metadata): Decision | Lease | null | undefined;

/** The interceptor's default skip: the gRPC health and reflection services. */
export function skipHealthAndReflection(request: { readonly path: string }): boolean;

declare module 'http' {
  interface IncomingMessage {
    /** Set by the sluice middleware: the Decision (rate) or the Lease (concurrency); null when
     *  sluice could not answer and the request failed open, or the admit was refused. */
    sluice?: Decision | Lease | null;
  }
}
