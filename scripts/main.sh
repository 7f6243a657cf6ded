#!/usr/bin/env bash
# The main job: install dependencies, build, and run attnres-opt on every
# example module in examples/, printing the verified, canonical IR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ATTNRES_BUILD_DIR:-$root/build}

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" attnres-opt

for example in "$root"/examples/*.mlir; do
  echo "// ===== $(basename "$example"): parsed, verified, printed by attnres-opt"
  "$build/bin/attnres-opt" "$example"
done
