#!/usr/bin/env bash
# check_format_test.sh CHECK CLANG_FORMAT SOURCE_ROOT: the format check reads tracked files only,
# and it can fail. In a throwaway repository with the project's .clang-format: a badly formatted
# file in an untracked build directory passes; the same file once tracked fails.
set -uo pipefail
check=$(realpath "$1") clang_format=$2 src=$(realpath "$3")
repo=$(mktemp -d /tmp/sluice-format.XXXXXX)
trap 'rm -rf "$repo"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$repo" || exit 1
git init -q . && git config user.email t@localhost && git config user.name test
cp "$src/.clang-format" .
printf 'int main() { return 0; }\n' >good.cpp
git add .clang-format good.cpp && git commit -qm init || fail "git commit"
bash "$check" "$repo" "$clang_format" || fail "a clean tracked file must pass"
mkdir -p out-of-tree-build/gen
printf 'int   f( ) {return 1 ;}\n' >out-of-tree-build/gen/generated.pb.cc.cpp
bash "$check" "$repo" "$clang_format" || fail "an untracked build directory must not be checked"
git add -f out-of-tree-build/gen/generated.pb.cc.cpp
if bash "$check" "$repo" "$clang_format" 2>/dev/null; then
  fail "a tracked, badly formatted file must fail the check"
fi
rm out-of-tree-build/gen/generated.pb.cc.cpp  # tracked but deleted: not an error
bash "$check" "$repo" "$clang_format" || fail "a tracked file deleted from the work tree"
echo "format check: tracked files only, and it fails on a bad one: ok"
