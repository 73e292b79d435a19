#!/usr/bin/env bash
# validate_non_configs.sh SLUICE: `sluice validate` exits 1 with one clear error, naming the
# file, for what is not a config: a directory, an empty file, a file of only comments, a
# config without policies and one that names a policy twice.
set -uo pipefail
sluice=$1
dir=$(mktemp -d /tmp/sluice-validate.XXXXXX)
trap 'rm -rf "$dir"' EXIT
: >"$dir/empty.yaml"
printf '# policies:\n#   a: {kind: rate, limit: 5}\n' >"$dir/comments.yaml"
printf 'server:\n  grpc: 127.0.0.1:7070\n' >"$dir/no-policies.yaml"
printf 'policies:\n  a: {kind: rate, limit: 5}\n  a: {kind: rate, limit: 6}\n' >"$dir/twice.yaml"
check() {  # check FILE EXPECTED-LINE
  out=$("$sluice" validate "$1" 2>&1); rc=$?
  [ "$rc" = 1 ] || { echo "validate $1: expected exit code 1, got $rc: $out"; exit 1; }
  grep -qxF -- "$2" <<<"$out" || { echo "validate $1: missing '$2' in:"; echo "$out"; exit 1; }
}
check "$dir" "error: $dir: is a directory, not a config file"
check "$dir/empty.yaml" \
  "error: $dir/empty.yaml: the file is empty (a config needs at least one policy, under policies:)"
check "$dir/comments.yaml" \
  "error: $dir/comments.yaml: the file has only comments (a config needs at least one policy, under policies:)"
check "$dir/no-policies.yaml" \
  "error: $dir/no-policies.yaml:1:1: policies: is required (a config needs at least one policy)"
check "$dir/twice.yaml" "error: $dir/twice.yaml:3:3: policies.a: duplicate key (first at line 2)"
echo "validate non-configs: ok"
