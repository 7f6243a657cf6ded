#!/bin/sh
# One compute-sanitizer tool over every GPU case, in parallel groups: racecheck
# and initcheck take 3-50 s a case, so the 221 cases one after another need
# more device time than a session has; eight groups at once share the GPU
# (each case's kernels are small) and finish in under ten minutes.
#
#   TOOLS=initcheck test/Integration/GPU/sanitize_all.sh CASES OUT [JOBS] [SECONDS-PER-GROUP]
#
# Cases are grouped by the first three characters of their id (m00, e01, r0..)
# and each group runs test/Integration/GPU/sanitize.sh with that prefix; OUT/<group>/ holds
# its reports. Prints one summary line per group and tool; exits non-zero when
# any group reports an error or does not finish.
set -u
cases=$1
out=$2
jobs=${3:-8}
limit=${4:-540}
here=$(dirname "$0")
mkdir -p "$out"
groups=$(python3 -c "
import json, sys
ids = [c['id'] for c in json.load(open(sys.argv[1] + '/cases.json'))]
print('\n'.join(sorted({i[:3] for i in ids})))" "$cases") || exit 1
# Each group's summary goes to OUT/<group>.log; xargs reports a failed group
# through its own exit status.
echo "$groups" | xargs -P "$jobs" -I{} sh -c \
  'sh "$0/sanitize.sh" "$1" "$2/{}" {} "$3" > "$2/{}.log" 2>&1' \
  "$here" "$cases" "$out" "$limit"
status=$?
for group in $groups; do
  sed "s/^/$group: /" "$out/$group.log"
done
exit $status
