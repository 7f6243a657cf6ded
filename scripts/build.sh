#!/usr/bin/env bash
# Configures (once) and builds attnres into ${ATTNRES_BUILD_DIR:-build} with
# Ninja. Extra arguments are Ninja targets.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ATTNRES_BUILD_DIR:-$root/build}
jobs=${ATTNRES_JOBS:-$(nproc)}

if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
    -DPython3_EXECUTABLE=/usr/bin/python3 \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
fi
ninja -C "$build" -j "$jobs" "$@"
