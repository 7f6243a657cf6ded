#!/bin/sh
# compute-sanitizer's four tools (memcheck, racecheck, initcheck, synccheck)
# over the GPU correctness cases, checking the attnres kernels only (PyTorch
# computes the references on the GPU too; initcheck checks every kernel, see
# below). Each tool's report goes to
# OUT/<tool>.txt; the summary lines are printed at the end. Exits non-zero
# when a tool reports an error or does not finish.
#
#   test/Integration/GPU/sanitize.sh CASES OUT [ID-PREFIX] [SECONDS-PER-TOOL]
#
# TOOLS="racecheck initcheck" runs some of the tools; PYTHON names the
# interpreter with PyTorch (default python3). memcheck and synccheck
# take under a minute over all cases on an H200; racecheck and initcheck
# about 4 s a case.
# CASES is the folder test/Integration/GPU/make_bundles.py wrote; ID-PREFIX limits the
# cases as run_cases.py --filter does.
set -u
cases=$1
out=$2
filter=${3:-}
limit=${4:-900}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
here=$(dirname "$0")
mkdir -p "$out"
status=0
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  start=$(date +%s)
  # initcheck would also report PyTorch copying tensors it allocated and has
  # not filled yet (host API accesses): only kernel accesses are checked.
  # It instruments every kernel: a kernel left out of the check is also left
  # out of the tracking, so what PyTorch's kernels write (the saved o_pre,
  # lse) would read as uninitialized in the attnres kernels.
  extra="--kernel-name kns=attnres"
  [ "$tool" = initcheck ] && extra="--check-api-memory-access no"
  timeout "$limit" "$sanitizer" --tool "$tool" \
    --error-exitcode 99 --print-limit 50 $extra \
    "${PYTHON:-python3}" "$here/run_cases.py" --cases "$cases" --filter "$filter" \
    > "$out/$tool.txt" 2>&1
  code=$?
  seconds=$(( $(date +%s) - start ))
  passed=$(grep -E "cases passed" "$out/$tool.txt" | tail -1)
  summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$out/$tool.txt" | tail -1)
  echo "$tool: exit $code in ${seconds}s; ${summary:-no summary}; ${passed:-no case summary}"
  [ "$code" -eq 0 ] || status=1
done
exit $status
