#!/bin/bash
# The GPU checks of one pipeline in one run on a machine without MLIR: the
# keep-host programs of every decomposition test/Integration/GPU's lit
# tests compile (host-layer.test, host-forward.test, host-backward.test),
# the bundle cases (cases.test), the PyTorch ops eagerly, compiled and
# replayed from CUDA graphs (torch-op.test), the residual history
# (history.test) and the speed benchmark (benchmarks/run.py),
# each result checked against float64 (the benchmark's against float32),
# and the benchmark's speed against the committed one of the same card
# (docs/performance/h200.json; on an H100, the H100 run in
# docs/performance/runs/2026-12-05-acceptance-h100.json; benchmarks/compare.py:
# no measure slower by more than 3 % of its fraction of the byte floor).
#
#   scripts/gpu-acceptance.sh stage DIR      here, after scripts/build.sh:
#                                            compiles everything into DIR
#   scripts/gpu-acceptance.sh run DIR OUT    there, on the GPU (PyTorch with
#                                            CUDA): runs it, results in OUT
#
# The decompositions listed here are those of the lit tests (whose RUN
# lines say what each covers): a variant added to a test belongs here too.
# Where a GPU machine has MLIR, `lit build/test` runs the same checks.
# CUDA_TOOLKIT, LLVM_TOOLS, CC and TORCH_PYTHON override /usr/local/cuda,
# /usr/lib/llvm-22/bin, cc and /usr/bin/python3 (the build's Python, with
# Debian's PyTorch, which torch_op.py and history.py import even to list
# their bundles).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() {
  sed -n '/^#   scripts\/gpu-acceptance.sh stage/,/results in OUT$/p' "$0"
  exit 2
}

# name|pipeline options|passes run before|static tokens|saved o_pre
layers=(
  "d0||||"
  "d1|forward-partitions=2 backward-blocks=7|||"
  "d2|forward-partitions=4 backward-partitions=4|||"
  "d3|forward-partitions=1 backward-blocks=1|||"
  "d4||--attnres-split-sources=partitions=3 --attnres-split-reduction=blocks=5||"
  "d5|tile-sizes=1,37 forward-partitions=2 backward-blocks=4|||"
  "d6|tile-sizes=3|||"
  "d7||--attnres-split-sources=partitions=2 --attnres-tile=tile-sizes=1,64||"
  "d8|transform-library=$root/examples/tile_sequence.transform.mlir|||"
  "d9|forward-partitions=2 transform-library=$root/test/Conversion/AttnResToGPU/Inputs/tile-merges-1-16.transform.mlir|||"
  "d10|forward-partitions=2 transform-library=$root/test/Conversion/AttnResToGPU/Inputs/tile-forwards-16.transform.mlir|||"
  "r1||||recompute"
  "r2|backward-blocks=6|||recompute"
  "s1|||257|"
  "s2|forward-partitions=2 backward-blocks=5 tile-sizes=1,64||257|"
)
forwards=(
  "f0|"
  "t1|tile-sizes=50"
  "t2|tile-sizes=7 forward-partitions=3"
  "t3|forward-partitions=3 transform-library=$root/test/Conversion/AttnResToGPU/Inputs/tile-merges-16.transform.mlir"
)

stage() {
  local build=$root/build tools=${LLVM_TOOLS:-/usr/lib/llvm-22/bin}
  local toolkit=${CUDA_TOOLKIT:-/usr/local/cuda} cc=${CC:-cc}
  local gpu=$root/test/Integration/GPU
  # Only what an earlier staging wrote is removed (DIR may hold more).
  rm -rf "$dir/lib" "$dir/host" "$dir/hb" "$dir/cases" "$dir/bundles" \
    "$dir/history" "$dir/torch-op"
  mkdir -p "$dir/lib" "$dir/host"
  cp -P "$build"/lib/libAttnResRuntime.so* "$dir/lib/"
  for entry in "${layers[@]}"; do
    IFS='|' read -r name options passes tokens saved <<<"$entry"
    echo "host-layer $name: $options $passes $tokens $saved"
    sh "$gpu/Inputs/build-host-layer.sh" "$build/bin/attnres-opt" "$tools" "$cc" \
      "$root" "$build/lib" "$dir/host/$name" "$toolkit" "$options" "$passes" \
      "$tokens" "$saved"
  done
  for entry in "${forwards[@]}"; do
    IFS='|' read -r name options <<<"$entry"
    echo "host-forward $name: $options"
    sh "$gpu/Inputs/build-host-forward.sh" "$build/bin/attnres-opt" "$tools" \
      "$cc" "$root" "$build/lib" "$dir/host/$name" "$toolkit" "$options"
  done
  # Only the programs and libraries travel.
  find "$dir/host" -type f ! -perm -u+x -delete
  python3 "$gpu/host_backward.py" build --opt "$build/bin/attnres-opt" \
    --tools "$tools" --cc "$cc" --lib "$build/lib" --toolkit "$toolkit" \
    --out "$dir/hb"
  python3 "$gpu/make_bundles.py" --compiler "$build/bin/attnres-compile" \
    --target sm_90 --out "$dir/cases" --jobs 2
  PYTHONPATH=$root/python ATTNRES_LIBRARY_DIR=$build/lib \
    python3 "$root/benchmarks/prebuild.py" "$dir/bundles"
  PYTHONPATH=$root/python ATTNRES_LIBRARY_DIR=$build/lib \
    "${TORCH_PYTHON:-/usr/bin/python3}" "$gpu/history.py" --prebuild \
    "$dir/history"
  PYTHONPATH=$root/python ATTNRES_LIBRARY_DIR=$build/lib \
    "${TORCH_PYTHON:-/usr/bin/python3}" "$gpu/torch_op.py" --prebuild \
    "$dir/torch-op"
  du -sh "$dir"
}

run() {
  local out=$1
  local failed=0
  mkdir -p "$out"
  rm -f "$out/run.json"
  export LD_LIBRARY_PATH=$dir/lib:$dir/host${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local gpu baseline=$root/docs/performance/h200.json
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)
  echo "$gpu"
  # Fractions of the floor differ from card to card: the speed is compared
  # with the committed run of the same kind of card.
  [[ $gpu == *H100* ]] &&
    baseline=$root/docs/performance/runs/2026-12-05-acceptance-h100.json
  echo "speed baseline: ${baseline#"$root"/}"
  # Each check's output goes to OUT/checks.log; its last line here.
  local log=$out/checks.log part=$out/part.log
  : >"$log"
  check() { # name, command...: FAILED where it exits non-zero
    local name=$1
    shift
    if "$@" >"$part" 2>&1; then
      echo "ok      $name: $(tail -n 1 "$part")"
    else
      echo "FAILED  $name: $(tail -n 3 "$part" | tr '\n' ' ')"
      failed=1
    fi
    { echo "== $name: $*"; cat "$part"; } >>"$log"
  }
  for entry in "${layers[@]}"; do
    check "host-layer-${entry%%|*}" "$dir/host/${entry%%|*}"
  done
  check memcheck-host-layer-d5 compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$dir/host/d5"
  check host-layer-d1-no-clusters env ATTNRES_NO_CLUSTERS=1 "$dir/host/d1"
  check host-layer-d4-no-clusters env ATTNRES_NO_CLUSTERS=1 "$dir/host/d4"
  for entry in "${forwards[@]}"; do
    check "host-forward-${entry%%|*}" "$dir/host/${entry%%|*}"
  done
  check host-forward-f0-no-clusters env ATTNRES_NO_CLUSTERS=1 "$dir/host/f0"
  misaligned() { # refused with the message host-forward.test expects
    "$dir/host/f0" misaligned | grep "must be aligned to 16 bytes for \
kernel mix_0_forward; the launch was skipped"
  }
  check host-forward-misaligned misaligned
  check host-backward python3 "$root/test/Integration/GPU/host_backward.py" \
    run --lib "$dir/lib" --out "$dir/hb"
  check cases env ATTNRES_LIBRARY_DIR="$dir/lib" python3 \
    "$root/test/Integration/GPU/run_cases.py" --cases "$dir/cases" \
    --out "$out/cases"
  check torch-op env PYTHONPATH="$root/python" ATTNRES_LIBRARY_DIR="$dir/lib" \
    ATTNRES_BUNDLE_DIR="$dir/torch-op" python3 \
    "$root/test/Integration/GPU/torch_op.py" --out "$out/torch-op"
  check history env PYTHONPATH="$root/python" ATTNRES_LIBRARY_DIR="$dir/lib" \
    ATTNRES_BUNDLE_DIR="$dir/history" python3 \
    "$root/test/Integration/GPU/history.py"
  check benchmark env PYTHONPATH="$root/python" ATTNRES_LIBRARY_DIR="$dir/lib" \
    ATTNRES_BUNDLE_DIR="$dir/bundles" python3 "$root/benchmarks/run.py" \
    --json "$out/run.json" --no-chart
  # No shape slower than the committed benchmark by more than 3 %.
  [ -f "$out/run.json" ] && check speed python3 "$root/benchmarks/compare.py" \
    "$baseline" "$out/run.json"
  rm -f "$part"
  [ "$failed" = 0 ] && echo "all passed" || echo "SOME FAILED"
  return "$failed"
}

case ${1:-} in
stage) [ $# = 2 ] || usage; dir=$2; stage ;;
run) [ $# = 3 ] || usage; dir=$2; run "$3" ;;
*) usage ;;
esac
