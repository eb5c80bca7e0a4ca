#!/usr/bin/env bash
# GPU checks for device="cuda": run from the repo root after `pip install .` on a
# machine with an NVIDIA GPU.
#   1. the C++ transfer/cuda unit tests, built here, including the real-driver round trip
#   2. the GPU pytest suite (tests/gpu)
#   3. both again under compute-sanitizer (memcheck, then synccheck), if it is installed
# Exit status is non-zero if any step fails. Extra CMake arguments for the C++ build can be
# passed in STOKER_CMAKE_ARGS (e.g. -DXXHASH_INCLUDE_DIR=/path/to/xxhash).
set -euo pipefail
cd "$(dirname "$0")/../.."

python - <<'PY'
import stoker._core as c
ok, n, why = c.cuda_status()
print(f"cuda_status: available={ok} devices={n} ({why})")
raise SystemExit(0 if ok else 1)
PY

# An extension linked with a static libstdc++ (some toolchains' default, e.g. a GCC under
# /opt) makes every C++ exception that reaches Python crash once torch is imported: torch's
# pybind11 translators rethrow it with another C++ runtime. Build with the system g++.
CORE=$(python -c "import stoker._core as c; print(c.__file__)")
if command -v readelf >/dev/null && ! readelf -d "$CORE" | grep -q "libstdc++"; then
  echo "ERROR: $CORE does not link libstdc++ dynamically; rebuild with" \
       "CXX=/usr/bin/g++ CC=/usr/bin/gcc pip install ." >&2
  exit 1
fi

BUILD=build/gpu-checks
cmake -S . -B "$BUILD" -DSTOKER_BUILD_PYTHON=OFF -DSTOKER_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo $(command -v ninja >/dev/null && echo -G Ninja) \
  ${STOKER_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target test_transfer_engine test_cuda_fake test_cuda_driver
for t in test_transfer_engine test_cuda_fake test_cuda_driver; do
  echo "== $t"; "$BUILD/$t"
done

echo "== pytest tests/gpu"
python -m pytest -q -p no:cacheprovider tests/gpu tests/test_transfer_fake.py

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -z "$SAN" ]; then
  echo "compute-sanitizer not found: skipped the sanitizer runs"
  exit 0
fi
# API errors PyTorch provokes on purpose (capability probes) are not ours: not reported.
for tool in memcheck synccheck; do
  echo "== compute-sanitizer --tool $tool: test_cuda_driver"
  "$SAN" --tool "$tool" --error-exitcode 99 --report-api-errors no "$BUILD/test_cuda_driver"
  echo "== compute-sanitizer --tool $tool: pytest tests/gpu"
  "$SAN" --tool "$tool" --error-exitcode 99 --report-api-errors no --target-processes all \
    python -m pytest -q -p no:cacheprovider -x tests/gpu
done
echo "all GPU checks passed"
