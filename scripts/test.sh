#!/usr/bin/env bash
# Runs every test: the lit suite of the build tree (scripts/build.sh), then
# the same suite again in a second tree built with AddressSanitizer and
# UndefinedBehaviorSanitizer (clang, ATTNRES_SANITIZE=ON; any report fails
# its test), then each libFuzzer target of that tree for 50 seconds from its
# seed corpus with a fixed seed (test/Fuzz/run.sh). This is the second half
# of the README's test command and what .ci/run runs.
#
#   scripts/test.sh               both suites
#   scripts/test.sh --no-sanitize the plain suite only (a quick local run)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ATTNRES_BUILD_DIR:-$root/build}
sanitized=${ATTNRES_SANITIZE_BUILD_DIR:-$root/build-san}
jobs=${ATTNRES_JOBS:-$(nproc)}
lit=/usr/lib/llvm-22/bin/lit

"$lit" -sv "$build/test"
[ "${1:-}" = "--no-sanitize" ] && exit 0

if [ ! -f "$sanitized/build.ninja" ]; then
  CC=/usr/lib/llvm-22/bin/clang CXX=/usr/lib/llvm-22/bin/clang++ \
    cmake -G Ninja -S "$root" -B "$sanitized" \
    -DCMAKE_BUILD_TYPE=Release -DATTNRES_SANITIZE=ON \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT="$lit" \
    -DPython3_EXECUTABLE=/usr/bin/python3
fi
ninja -C "$sanitized" -j "$jobs"
"$lit" -sv "$sanitized/test"
"$root/test/Fuzz/run.sh" 50
