#!/usr/bin/env bash
# Installs what building stoker from source needs, and only what is missing:
#   - system packages: the development files of libjpeg-turbo, libpng, FFmpeg (libavformat,
#     libavcodec, libswscale, libswresample: video and audio fields) and xxHash, each
#     installed only if the compiler does not find its header;
#   - Python build tools, into the Python that builds stoker ($PYTHON, default python3):
#     scikit-build-core and pybind11, plus ninja and cmake when none is found. They let
#     `pip install --no-build-isolation .` reuse build/ from one install to the next.
# It says what it will install before installing it, and does nothing (needs no root)
# when everything is there. It never installs or upgrades torch or numpy.
#
#   bash scripts/install-deps.sh           # then: pip install --no-build-isolation -v .
#   bash scripts/install-deps.sh --check   # only say what is missing (exit 1 if anything)
#
# Package managers: apt-get (Debian, Ubuntu), dnf/yum (Fedora, RHEL), apk (Alpine).
# In a conda environment, install the libraries with conda instead:
#   conda install -c conda-forge libjpeg-turbo libpng xxhash ffmpeg
set -euo pipefail

cc="${CC:-cc}"
command -v "$cc" >/dev/null || cc=gcc
python="${PYTHON:-python3}"
check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: bash scripts/install-deps.sh [--check]" >&2; exit 2 ;;
esac
lacking=0

has_header() {  # preprocess only: the header must be on the compiler's include path
  printf '#include <stdio.h>\n#include <%s>\n' "$1" | "$cc" -E -x c - >/dev/null 2>&1
}

# header, then its package for: apt-get, dnf/yum, apk
deps=(
  "jpeglib.h libjpeg-dev libjpeg-turbo-devel libjpeg-turbo-dev"
  "png.h libpng-dev libpng-devel libpng-dev"
  "xxhash.h libxxhash-dev xxhash-devel xxhash-dev"
  "libavformat/avformat.h libavformat-dev ffmpeg-free-devel ffmpeg-dev"
  "libavcodec/avcodec.h libavcodec-dev ffmpeg-free-devel ffmpeg-dev"
  "libswscale/swscale.h libswscale-dev ffmpeg-free-devel ffmpeg-dev"
  "libswresample/swresample.h libswresample-dev ffmpeg-free-devel ffmpeg-dev"
)

if command -v apt-get >/dev/null; then
  pm=apt-get col=1
elif command -v dnf >/dev/null; then
  pm=dnf col=2
elif command -v yum >/dev/null; then
  pm=yum col=2
elif command -v apk >/dev/null; then
  pm=apk col=3
else
  pm="" col=1
fi

missing=() packages=()
for d in "${deps[@]}"; do
  read -r -a f <<<"$d"
  if ! has_header "${f[0]}"; then
    missing+=("${f[0]}")
    # one package may provide several headers (dnf's ffmpeg-free-devel): listed once
    case " ${packages[*]} " in
      *" ${f[$col]} "*) ;;
      *) packages+=("${f[$col]}") ;;
    esac
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: libjpeg-turbo, libpng, FFmpeg and xxHash headers found"
else
  echo "install-deps: missing ${missing[*]}"
  lacking=1
  if [ -z "$pm" ]; then
    echo "install-deps: no known package manager: install the development packages for" \
         "${missing[*]} (libjpeg-turbo, libpng, FFmpeg, xxHash), then run pip install again" >&2
    exit 1
  fi
  sudo=""
  if [ "$check" = 1 ]; then
    echo "install-deps: would install with $pm: ${packages[*]}"
  elif [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then
      # at a terminal sudo may ask for a password; elsewhere (CI) it must fail, not wait
      if [ -t 0 ]; then sudo="sudo"; else sudo="sudo -n"; fi
    else
      echo "install-deps: not root and no sudo: install ${packages[*]} as root" \
           "(the development files of ${missing[*]}), then run pip install again" >&2
      exit 1
    fi
  fi
  [ "$check" = 1 ] || echo "install-deps: installing with $pm: ${packages[*]}"
  [ "$check" = 1 ] || case "$pm" in
    apt-get)
      # libjpeg-dev is libjpeg62-turbo-dev on Debian and libjpeg-turbo8-dev on Ubuntu
      $sudo apt-get update -q
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
        "${packages[@]}" ;;
    dnf | yum) $sudo "$pm" install -y "${packages[@]}" ;;
    apk) $sudo apk add --no-cache "${packages[@]}" ;;
  esac
  for h in "${missing[@]}"; do
    if [ "$check" = 0 ] && ! has_header "$h"; then
      echo "install-deps: $h is still not found by $cc after installing" >&2
      exit 1
    fi
  done
fi

# Python build tools: the requirements of pyproject.toml's [build-system], and ninja and
# cmake where neither a program nor the Python package is found.
py_missing=$("$python" - <<'EOF'
import importlib.metadata as md
import importlib.util
import re
import shutil
import subprocess

def version(name):
    try:
        return tuple(int(p) for p in re.findall(r"\d+", md.version(name))[:2])
    except md.PackageNotFoundError:
        return None

for name, low in (("scikit-build-core", (0, 10)), ("pybind11", (2, 12))):
    v = version(name)
    if v is None or v < low:
        print(f"{name}>={low[0]}.{low[1]}")
if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
    print("ninja")
cmake = shutil.which("cmake")
out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout if cmake else ""
m = re.search(r"(\d+)\.(\d+)", out)
if m is None or (int(m[1]), int(m[2])) < (3, 18):
    print("cmake>=3.18")
EOF
)
if [ -z "$py_missing" ]; then
  echo "install-deps: scikit-build-core, pybind11, ninja and cmake found for $python"
else
  read -r -d '' -a specs <<<"$py_missing" || true
  prefix=$("$python" -c 'import sys; print(sys.prefix)')
  if [ "$check" = 1 ]; then
    echo "install-deps: would install into $prefix: ${specs[*]}"
    lacking=1
  else
    echo "install-deps: installing into $prefix: ${specs[*]}"
    "$python" -m pip install "${specs[@]}"
  fi
fi
if [ "$check" = 1 ]; then
  [ "$lacking" = 0 ] && echo "install-deps: nothing missing"
  exit "$lacking"
fi
echo "install-deps: done"
