#!/usr/bin/env bash
# The quick loop while editing: lint, the tests but the slow ones, and the C++ unit tests
# (plain build). What it leaves to README's test command (every test) and to .ci/run (the
# full tier): the tests marked slow or soak (framework runs, the docs' pages, tests over
# 5 s: pyproject.toml's markers), the clean-clone install, the wheel and its tests from
# outside the tree, the build without images, the sanitizer builds, fuzzing, Ray and Spark.
#
#   bash scripts/test-fast.sh            # in the venv stoker is developed in
#
# The package is reinstalled first (incrementally: only what changed recompiles, in
# build/<wheel tag>/), since the tests run against the installed stoker. The C++ tests build
# in build/cpp (Debug), also incrementally. Each step prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
step_start=$SECONDS
step() {
  printf '\n== test-fast: %s (previous step: %ss)\n' "$1" "$((SECONDS - step_start))"
  step_start=$SECONDS
}

step "lint: ruff, clang-format (the versions CI pins)"
lint="build/ci-lint"
[ -x "$lint/bin/python" ] || python -m venv "$lint"
"$lint/bin/pip" install -q ruff==0.17.6 clang-format==18.1.8
"$lint/bin/ruff" check .
xargs "$lint/bin/clang-format" --dry-run --Werror <scripts/clang-format-files.txt

step "install (incremental), with the test-only extension stoker._testing"
pip install -q --no-build-isolation -Ccmake.define.STOKER_TESTING_MODULE=ON ".[test]" \
  -c tests/constraints.txt

step "the tests but the slow ones, with the C++ unit tests (plain) beside it"
# The C++ tests build and run in the background while pytest runs (pytest's time is partly
# spent waiting on subprocesses and sleeps of the tests). Their output goes to
# build/cpp-tests.log, printed at the end.
cpp_log="build/cpp-tests.log"
mkdir -p build
(
  cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSTOKER_BUILD_PYTHON=OFF \
    -DSTOKER_BUILD_TESTS=ON -DSTOKER_WERROR=ON >/dev/null &&
    cmake --build build/cpp &&
    ctest --test-dir build/cpp --output-on-failure
) >"$cpp_log" 2>&1 &
cpp=$!
trap 'kill "$cpp" 2>/dev/null || true' EXIT
pytest_rc=0
python -m pytest tests -q -m "not slow and not soak" || pytest_rc=$?
cpp_rc=0
wait "$cpp" || cpp_rc=$?
trap - EXIT

step "C++ unit tests (plain): $cpp_log"
tail -n 25 "$cpp_log"
if [ "$pytest_rc" -ne 0 ] || [ "$cpp_rc" -ne 0 ]; then
  echo "test-fast FAILED: pytest exit $pytest_rc, C++ tests exit $cpp_rc (full log: $cpp_log)"
  exit 1
fi

step "done"
echo "test-fast passed in $((SECONDS - start)) s"
