#!/usr/bin/env bash
# Installs everything attnres needs to build and test, from Debian's packages
# (plus the pinned Python test packages in python/requirements-test.txt from PyPI).
# Idempotent: packages already present are left alone.
set -euo pipefail

packages=(
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools clang-22 lld-22
  nlohmann-json3-dev libclang-rt-22-dev
  cmake ninja-build pkgconf rocm-device-libs python3-numpy python3-pytest python3-pip
  python3-torch python3-venv
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -f "$here/python/requirements-test.txt" ]; then
  /usr/bin/python3 -m pip install --quiet --break-system-packages \
    -r "$here/python/requirements-test.txt" 2>/dev/null ||
    /usr/bin/python3 -m pip install --quiet -r "$here/python/requirements-test.txt"
fi
