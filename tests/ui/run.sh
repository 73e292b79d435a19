#!/usr/bin/env bash
# run.sh: the /ui page's browser test (browser_test.mjs). Installs its one dependency,
# puppeteer-core (exact version in package-lock.json), from the npm registry when absent, then
# runs it with Node's own test runner against $SLUICE_BIN in Debian's /usr/bin/chromium.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -d node_modules/puppeteer-core ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
exec node --test browser_test.mjs
