'use strict';
// `npm pack` (prepack/postpack): bundles a copy of the sluice proto into the package, so that a
// tarball installed anywhere finds it (lib/proto.js prefers the bundled copy when there is one).
//
//   node scripts/copy-proto.js copy    ../../proto/sluice/v1/sluice.proto -> proto/sluice/v1/
//   node scripts/copy-proto.js clean   removes the copy again (only where the checkout's proto
//                                      exists: in an unpacked tarball the copy is all there is)
//
// SLUICE_PROTO names another source file.

const fs = require('node:fs');
const path = require('node:path');

const PACKAGE_DIR = path.resolve(__dirname, '..');
const IN_TREE = path.join('sluice', 'v1', 'sluice.proto');
const SOURCE = process.env.SLUICE_PROTO
  ? path.resolve(process.env.SLUICE_PROTO)
  : path.resolve(PACKAGE_DIR, '..', '..', 'proto', IN_TREE);
const COPY_ROOT = path.join(PACKAGE_DIR, 'proto');
const COPY = path.join(COPY_ROOT, IN_TREE);

function copy() {
  if (!fs.existsSync(SOURCE)) {
    if (fs.existsSync(COPY)) {
      console.error(`copy-proto: ${SOURCE} is absent; packing the copy already here`);
      return;
    }
    console.error(`copy-proto: ${SOURCE} does not exist (pack from a sluice checkout, or set SLUICE_PROTO)`);
    process.exit(1);
  }
  fs.mkdirSync(path.dirname(COPY), { recursive: true });
  const tmp = `${COPY}.${process.pid}.tmp`;
  fs.copyFileSync(SOURCE, tmp);
  fs.renameSync(tmp, COPY); // a reader never sees half a file
}

function clean() {
  if (fs.existsSync(SOURCE)) fs.rmSync(COPY_ROOT, { recursive: true, force: true });
}

const command = process.argv[2];
if (command === 'copy') copy();
else if (command === 'clean') clean();
else {
  console.error('usage: node scripts/copy-proto.js copy|clean');
  process.exit(2);
}
