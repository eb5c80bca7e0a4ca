#!/usr/bin/env bash
# Measures the numbers the README quotes about installing and testing, on this machine:
#   - the wheel's size (builds it: scripts/build-wheel.sh),
#   - a full compile of the extension (a fresh Release build directory, ninja, all cores),
#   - what the [test] extra adds to a venv that has torch (pip's dry-run report),
#   - `stoker --help` and `stoker inspect` start-up (median of 5 runs each),
#   - the fast tier's wall time (scripts/test-fast.sh).
# Run it in the development venv (stoker installed). It takes about 20 minutes on 2 cores;
# STEPS="wheel compile extra startup fast" picks some.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${STEPS:-wheel compile extra startup fast}"
out="build/readme-numbers.txt"
mkdir -p build
: >"$out"
note() { echo "$*" | tee -a "$out"; }
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
  bash scripts/build-wheel.sh >build/readme-numbers-wheel.log 2>&1
  tag=$(python -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  wheel=$(ls dist/stoker-*-"$tag"-*.whl)
  note "wheel: $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
  if unzip -l "$wheel" | grep -q "_token_reference\|tests/"; then
    note "wheel: WARNING: test files inside"; fi
fi

if [[ $steps == *compile* ]]; then
  dir=build/readme-numbers-compile
  rm -rf "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=OFF \
    -Dpybind11_DIR="$(python -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DPython_EXECUTABLE="$(command -v python)" >/dev/null
  s=$SECONDS
  cmake --build "$dir" >/dev/null
  note "full compile (Release, $(nproc) jobs): $((SECONDS - s)) s"
  rm -rf "$dir"
fi

if [[ $steps == *extra* ]]; then
  python - <<'PY' | tee -a "$out"
import json, os, subprocess, sys, tempfile, tomllib, venv

import torch

extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]
base = [f"torch=={torch.__version__.split('+')[0]}", "numpy"]
with tempfile.TemporaryDirectory() as tmp:
    venv.create(tmp, with_pip=True)
    names = []
    for what in (base, base + extra):
        report = os.path.join(tmp, "report.json")
        subprocess.run([os.path.join(tmp, "bin", "pip"), "install", "-q", "--dry-run",
                        "--ignore-installed", "--report", report, *what], check=True)
        names.append({i["metadata"]["name"].lower() for i in json.load(open(report))["install"]})
print(f"[test] extra: {len(names[1] - names[0])} packages beyond torch and numpy")
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
