'use strict';
// Where the proto is and how it is loaded. The client reads proto/sluice/v1/sluice.proto at
// run time (no generated code): from the copy a packed tarball carries (scripts/copy-proto.js
// makes it at `npm pack`), else from the checkout this package sits in (clients/node), unless
// the SLUICE_PROTO environment variable or the client's `protoPath` option names another file.

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PACKAGE_DIR = path.resolve(__dirname, '..');
const PROTO_IN_TREE = path.join('sluice', 'v1', 'sluice.proto');
const BUNDLED_PROTO = path.join(PACKAGE_DIR, 'proto', PROTO_IN_TREE);
const CHECKOUT_PROTO = path.resolve(PACKAGE_DIR, '..', '..', 'proto', PROTO_IN_TREE);

/** The proto file a client loads when given no `protoPath`. */
function defaultProtoPath() {
  if (process.env.SLUICE_PROTO) return path.resolve(process.env.SLUICE_PROTO);
  if (fs.existsSync(BUNDLED_PROTO)) return BUNDLED_PROTO;
  return CHECKOUT_PROTO;
}

const LOAD_OPTIONS = {
  keepCase: true, // field names as in the proto (lease_id); the client maps them to camelCase
  longs: Number, // int64/uint64 as numbers: every count and duration here fits in 2^53
  enums: String, // Outcome as its name ("OUTCOME_SUCCESS")
  defaults: true, // unset scalars read as their defaults; an unset message reads as null
  oneofs: true,
};

const cache = new Map(); // resolved path -> the sluice.v1 package object

/** The `sluice.v1` package (service constructors and message types) of the proto at `file`. */
function loadSluice(file) {
  const resolved = path.resolve(file || defaultProtoPath());
  let pkg = cache.get(resolved);
  if (pkg) return pkg;
  if (!fs.existsSync(resolved)) {
    throw new Error(
      `sluice-client: the proto ${resolved} does not exist. Install the package from a sluice ` +
        'checkout or a tarball made by `npm pack`, or name the file with the protoPath option ' +
        'or the SLUICE_PROTO environment variable.');
  }
  const definition = protoLoader.loadSync(resolved, LOAD_OPTIONS);
  pkg = grpc.loadPackageDefinition(definition).sluice.v1;
  cache.set(resolved, pkg);
  return pkg;
}

module.exports = { defaultProtoPath, loadSluice, BUNDLED_PROTO, CHECKOUT_PROTO };
