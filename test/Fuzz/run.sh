#!/usr/bin/env bash
# Runs the libFuzzer targets of the sanitizer tree (scripts/test.sh builds it
# in build-san/) from their seed corpora, with a fixed seed:
#
#   test/Fuzz/run.sh SECONDS [TARGET...]     (targets: mlir spec bundle)
#
# ATTNRES_FUZZ_SEED picks another seed (1 by default: CI's runs repeat).
# The seeds of attnres-fuzz-mlir are the example modules and the round-trip
# test's ops, one file each (test/Dialect/AttnRes/roundtrip.mlir); mlir.dict
# gives its mutations the ops' words, so that more of them parse, verify and
# reach the pipelines. New inputs go to a scratch folder, not into the repository's corpus; a
# crash leaves its input in the current folder (crash-*), to be added to
# test/Fuzz/corpus/<target>/ as a regression once fixed. Exits non-zero when
# a target finds a crash.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${ATTNRES_SANITIZE_BUILD_DIR:-$here/../../build-san}/bin
seconds=${1:?seconds per target}
shift
targets=${*:-mlir spec bundle}
# The project's libraries are instrumented, the fuzzers' dependencies are
# not: the shared ASan runtime must come first.
export LD_PRELOAD=$(/usr/lib/llvm-22/bin/clang++ -print-file-name=libclang_rt.asan-x86_64.so)
export ASAN_OPTIONS=detect_leaks=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in $targets; do
  mkdir -p "$scratch/$target"
  # A target's dictionary (the words of its input language), where it has one.
  dict=()
  [ -f "$here/$target.dict" ] && dict=(-dict="$here/$target.dict")
  "$bin/attnres-fuzz-$target" -seed="${ATTNRES_FUZZ_SEED:-1}" "${dict[@]}" \
    -max_total_time="$seconds" \
    -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
    "$scratch/$target" "$here/corpus/$target" 2>&1 |
    grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)|ERROR|runtime error|SUMMARY|crash-" |
    sed "s/^/$target: /"
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
done
