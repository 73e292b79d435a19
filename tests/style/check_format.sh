#!/usr/bin/env bash
# check_format.sh ROOT CLANG_FORMAT: every C++ source and header git tracks under ROOT is
# clang-format clean (ROOT/.clang-format). Only tracked files: a build directory inside the tree,
# whatever its name, holds generated code that is not ours to format.
set -euo pipefail
root=$1 clang_format=$2
cd "$root"
git ls-files -z -- '*.h' '*.cpp' | while IFS= read -r -d '' f; do
  if [ -f "$f" ]; then printf '%s\0' "$f"; fi  # tracked but deleted from the work tree: skip
done | xargs -0 -r "$clang_format" --dry-run -Werror
