#!/usr/bin/env bash
# The main job: install dependencies, build, and compile the example AttnRes
# module (examples/full_attnres_layer.mlir, a Full AttnRes layer's forward and
# backward) to GPU kernels for the default target, sm_90, printing the bundle
# it wrote (binaries, manifest, kernels and their arguments).
#
#   ATTNRES_TARGET=gfx942 ./scripts/main.sh   # another target
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ATTNRES_BUILD_DIR:-$root/build}
target=${ATTNRES_TARGET:-sm_90}

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" attnres-compile

"$build/bin/attnres-compile" "$root/examples/full_attnres_layer.mlir" \
  --target="$target" -o "$build/bundles/full_attnres_layer.$target"
