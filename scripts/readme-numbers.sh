#!/usr/bin/env bash
# Measures the numbers the README quotes about installing and testing, on this machine:
#   - the wheel's size, and the time scripts/build-wheel.sh takes to build it (sdist, wheel
#     from the sdist in an isolated build environment, auditwheel),
#   - the first build of the README's install command (a fresh build directory: what
#     `pip install --no-build-isolation .` takes in a new clone; -v shows its progress),
#     then what the test command adds to it (stoker._testing, in the same build directory),
#   - the README's test command, `python -m pytest tests -q` (stoker installed), with its
#     summary line,
#   - the [test] extra: the packages it adds to a venv that has torch, and the time pip
#     takes to install them there (a new venv, pip's cache not used: downloads included),
#   - `stoker --help` and `stoker inspect` start-up (median of 5 runs each),
#   - the fast tier's wall time (scripts/test-fast.sh).
# Run it in the development venv (stoker installed, with stoker._testing). All of it takes
# about 45 minutes on 2 cores; STEPS="wheel build tests extra startup fast" picks some. The
# load average is noted before and after each timed step: on a machine busy with other work
# the wall time grows, the CPU time much less; quote each figure with the load it had.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${STEPS:-wheel build tests extra startup fast}"
out="build/readme-numbers.txt"
mkdir -p build
: >"$out"
note() { echo "$*" | tee -a "$out"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
# Runs "$@" (output to the log $1), and sets `took` to a line with its wall time, its CPU
# time (user + system, children included) and the load average before and after it: on a
# machine shared with other work the wall time grows, the CPU time much less.
timed() {
  local log=$1 before rc=0
  shift
  before=$(load)
  /usr/bin/time -f "%e %U %S" -o build/readme-numbers-time.txt "$@" >"$log" 2>&1 || rc=$?
  # (GNU time writes "Command exited with non-zero status N" first when it fails)
  read -r wall user sys < <(tail -n 1 build/readme-numbers-time.txt)
  took=$(awk -v w="$wall" -v c="$(echo "$user + $sys" | bc)" -v b="${before%% *}" \
    -v a="$(load | cut -d' ' -f1)" 'BEGIN { printf "%.1f min wall, %.1f min CPU (load \
average %s before, %s after)", w / 60, c / 60, b, a }')
  return $rc
}
median5() {  # median wall seconds of 5 runs of "$@"
  local t=()
  for _ in 1 2 3 4 5; do
    local s e
    s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N)
    t+=("$(echo "$e - $s" | bc)")
  done
  printf '%s\n' "${t[@]}" | sort -n | sed -n 3p
}
note "machine: $(nproc) cores, $(uname -m), load average $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ $steps == *wheel* ]]; then
  timed build/readme-numbers-wheel.log env -u CMAKE_CXX_COMPILER_LAUNCHER bash scripts/build-wheel.sh
  tag=$(python -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  wheel=$(ls dist/stoker-*-"$tag"-*.whl)
  note "wheel: $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB; scripts/build-wheel.sh: $took"
  if unzip -l "$wheel" | grep -q "_token_reference\|tests/"; then
    note "wheel: WARNING: test files inside"; fi
fi

if [[ $steps == *build* ]]; then
  # The README's install command in a new clone: configure and compile from nothing (a
  # fresh build directory), then package; `pip wheel` leaves the installed stoker alone.
  dir=build/readme-numbers-build
  rm -rf "$dir" build/readme-numbers-wheel
  # No compiler cache and no extra CMake options of this shell: a new clone has neither.
  clean=(env -u CMAKE_CXX_COMPILER_LAUNCHER -u SKBUILD_CMAKE_DEFINE)
  timed build/readme-numbers-build.log "${clean[@]}" pip wheel -q --no-build-isolation \
    --no-deps -Cbuild-dir="$dir" -w build/readme-numbers-wheel .
  note "first build (pip install --no-build-isolation ., a fresh build dir, $(nproc) cores): $took"
  # README's test command then builds the test-only extension in the same build directory
  timed build/readme-numbers-build-testing.log "${clean[@]}" pip wheel -q \
    --no-build-isolation --no-deps -Cbuild-dir="$dir" \
    -Ccmake.define.STOKER_TESTING_MODULE=ON -w build/readme-numbers-wheel .
  note "the test command's addition (stoker._testing, in that build dir): $took"
  rm -rf "$dir" build/readme-numbers-wheel
fi

if [[ $steps == *tests* ]]; then
  rc=0
  timed build/readme-numbers-tests.log python -m pytest tests -q -p no:cacheprovider || rc=$?
  summary=$(grep -E "^=*.* (passed|failed)" build/readme-numbers-tests.log | tail -n 1 | tr -d '=')
  note "test command (python -m pytest tests -q): $took; exit $rc:$summary"
fi

if [[ $steps == *extra* ]]; then
  python - <<'PY' | tee -a "$out"
import json, os, subprocess, sys, tempfile, time, tomllib, venv

import torch

extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]
base = [f"torch=={torch.__version__.split('+')[0]}", "numpy"]
pins = ["-c", "tests/constraints.txt"]
load = lambda: open("/proc/loadavg").read().split()[0]  # noqa: E731
with tempfile.TemporaryDirectory() as tmp:
    venv.create(tmp, with_pip=True)
    pip = [os.path.join(tmp, "bin", "python"), "-m", "pip"]
    names = []
    for what in (base, base + extra):
        report = os.path.join(tmp, "report.json")
        subprocess.run([*pip, "install", "-q", "--dry-run", "--ignore-installed", "--report",
                        report, *pins, *what], check=True)
        names.append({i["metadata"]["name"].lower() for i in json.load(open(report))["install"]})
    # what README's test command does after the torch the reader has: torch first (not
    # timed), then the extra, fetched anew (no cache) as on a new machine
    subprocess.run([*pip, "install", "-q", *base], check=True)
    before, t0 = load(), time.perf_counter()
    subprocess.run([*pip, "install", "-q", "--no-cache-dir", *pins, *extra], check=True)
    took = (time.perf_counter() - t0) / 60
print(f"[test] extra: {len(names[1] - names[0])} packages beyond torch and numpy; installing "
      f"them into a venv that has torch: {took:.1f} min wall, downloads included (load "
      f"average {before} before, {load()} after)")
PY
fi

if [[ $steps == *startup* ]]; then
  data=$(mktemp -d)
  python -c "import numpy as np, stoker
with stoker.ShardWriter('$data/d', {'x': stoker.ndarray('uint8', (64,)), 'y': stoker.scalar('int64')}) as w:
    [w.write({'x': np.zeros(64, np.uint8), 'y': i}) for i in range(1000)]"
  note "stoker --help: median of 5: $(median5 stoker --help) s"
  note "stoker inspect: median of 5: $(median5 stoker inspect "$data/d") s"
  note "stoker inspect --verify: median of 5: $(median5 stoker inspect "$data/d" --verify) s"
  rm -rf "$data"
fi

if [[ $steps == *fast* ]]; then
  s=$SECONDS
  bash scripts/test-fast.sh >build/readme-numbers-fast.log 2>&1
  note "scripts/test-fast.sh: $((SECONDS - s)) s"
fi
echo "(also in $out)"
