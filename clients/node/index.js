'use strict';
// sluice-client: the Node.js client of `sluice serve` (gRPC services sluice.v1.Sluice and
// sluice.v1.Throttler), an Express middleware, a gRPC server interceptor, and a client of the
// throttler's HTTP check API for batch jobs. See README.md.
//
//   const sluice = require('sluice-client');
//   const client = new sluice.Client('127.0.0.1:7070', { timeout: 2 });
//   const d = await client.check('api-rate', 'user-42');
//   app.use(sluice.express({ client, policy: 'search', key: (req) => req.ip }));
//   new grpc.Server({ interceptors: [sluice.grpcServerInterceptor({ client, policy: 'search' })] });
//
// Every export is a plain identifier below, so that `import { Client } from 'sluice-client'`
// finds it in this CommonJS module.

const { Client } = require('./lib/client');
const {
  SluiceError, InvalidArgument, NotFound, FailedPrecondition, PermissionDenied, Unavailable,
  DeadlineExceeded, Refused, isTimeout,
} = require('./lib/errors');
const {
  OUTCOMES, Decision, Charge, Lease, PolicyState, Policies, CheckResult, ThrottlerMetric, now,
} = require('./lib/types');
const { expressMiddleware, outcomeOfStatus } = require('./lib/express');
const {
  grpcServerInterceptor, grpcAdmission, skipHealthAndReflection,
} = require('./lib/grpc_interceptor');
const {
  CASCADE_OUTCOMES, RetryBudget, outcomeOfHttp, outcomeOfGrpc, outcomeForException,
} = require('./lib/cascade');
const {
  ThrottlerClient, Backoff, ChunkStats, ThrottledTimeout, waitUntilAllowed, runInChunks,
} = require('./lib/throttler');
const { defaultProtoPath } = require('./lib/proto');

module.exports = {
  Client,
  express: expressMiddleware,
  outcomeOfStatus,
  grpcServerInterceptor,
  grpcAdmission,
  skipHealthAndReflection,
  isTimeout,
  defaultProtoPath,
  OUTCOMES,
  Decision,
  Charge,
  Lease,
  PolicyState,
  Policies,
  CheckResult,
  ThrottlerMetric,
  now,
  CASCADE_OUTCOMES,
  RetryBudget,
  outcomeOfHttp,
  outcomeOfGrpc,
  outcomeForException,
  ThrottlerClient,
  Backoff,
  ChunkStats,
  ThrottledTimeout,
  waitUntilAllowed,
  runInChunks,
  SluiceError,
  InvalidArgument,
  NotFound,
  FailedPrecondition,
  PermissionDenied,
  Unavailable,
  DeadlineExceeded,
  Refused,
};
