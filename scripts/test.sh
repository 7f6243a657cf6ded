#!/usr/bin/env bash
# Every test: install dependencies, build everything, run the lit suite
# (check-attnres).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" all check-attnres
