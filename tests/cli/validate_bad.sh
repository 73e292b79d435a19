#!/usr/bin/env bash
# validate_bad.sh SLUICE BAD_YAML: `sluice validate` must exit 1 and name each error's line.
set -uo pipefail
out=$("$1" validate "$2" 2>&1); rc=$?
echo "$out"
[ "$rc" = 1 ] || { echo "expected exit code 1, got $rc"; exit 1; }
for want in 'bad.yaml:4:5: policies.a.limt: unknown key' 'bad.yaml:7:12: policies.b.limit' \
            'bad.yaml:11:18: policies.c.coordinator' 'bad.yaml:15:11: policies.d.kind' \
            'bad.yaml:20:16: policies.f.upstreams[0].owner'; do
  grep -qF -- "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
