#!/usr/bin/env bash
# Installs the system libraries that building stoker needs, and only those that
# are missing: the libjpeg-turbo, libpng and xxHash development headers.
# Where the compiler already finds all three, it does nothing (and needs no root).
#
#   bash scripts/install-deps.sh           # then: pip install .
#
# Package managers: apt-get (Debian, Ubuntu), dnf/yum (Fedora, RHEL), apk (Alpine).
# In a conda environment, install them with conda instead:
#   conda install -c conda-forge libjpeg-turbo libpng xxhash
set -euo pipefail

cc="${CC:-cc}"
command -v "$cc" >/dev/null || cc=gcc

has_header() {  # preprocess only: the header must be on the compiler's include path
  printf '#include <stdio.h>\n#include <%s>\n' "$1" | "$cc" -E -x c - >/dev/null 2>&1
}

missing=()
for h in jpeglib.h png.h xxhash.h; do
  has_header "$h" || missing+=("$h")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: libjpeg-turbo, libpng and xxHash headers found; nothing to do"
  exit 0
fi
echo "install-deps: missing ${missing[*]}"

sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null; then
    # at a terminal sudo may ask for a password; elsewhere (CI) it must fail, not wait
    if [ -t 0 ]; then sudo="sudo"; else sudo="sudo -n"; fi
  else
    echo "install-deps: not root and no sudo: install libjpeg-turbo, libpng and xxHash" \
         "development packages as root, then run pip install again" >&2
    exit 1
  fi
fi

if command -v apt-get >/dev/null; then
  # libjpeg-dev is libjpeg62-turbo-dev on Debian and libjpeg-turbo8-dev on Ubuntu
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
    libjpeg-dev libpng-dev libxxhash-dev
elif command -v dnf >/dev/null; then
  $sudo dnf install -y libjpeg-turbo-devel libpng-devel xxhash-devel
elif command -v yum >/dev/null; then
  $sudo yum install -y libjpeg-turbo-devel libpng-devel xxhash-devel
elif command -v apk >/dev/null; then
  $sudo apk add --no-cache libjpeg-turbo-dev libpng-dev xxhash-dev
else
  echo "install-deps: no known package manager: install the development packages of" \
       "libjpeg-turbo, libpng and xxHash, then run pip install again" >&2
  exit 1
fi

for h in "${missing[@]}"; do
  if ! has_header "$h"; then
    echo "install-deps: $h is still not found by $cc after installing" >&2
    exit 1
  fi
done
echo "install-deps: done"
