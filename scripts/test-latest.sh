#!/usr/bin/env bash
# The framework tests against the newest releases, in a venv of their own: the tests whose
# outcome depends on another project's behaviour (Lightning, accelerate, transformers' Trainer,
# HF datasets/tokenizers, the docs' framework recipes). README's test command pins those
# projects (tests/constraints.txt), so a new release cannot turn it red overnight; this run is
# how a release that changed behaviour is noticed, before the pins are refreshed
# (scripts/refresh-test-pins.sh). .ci/run runs it and reports the result without failing on it.
#
#   bash scripts/test-latest.sh                 # builds the wheel first (scripts/build-wheel.sh)
#   bash scripts/test-latest.sh dist/stoker-...whl
#   STOKER_LATEST_QUICK=1 bash scripts/test-latest.sh ...   # one process per test only
#     (.ci/run: each framework's API, without the tests that start several processes)
#
# Prints the packages whose newest release differs from the pin, then pytest's summary; exits
# with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="${1:-}"
if [ -z "$wheel" ]; then
  bash scripts/build-wheel.sh
  tag=$("${PYTHON:-python3}" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  wheel=$(ls dist/stoker-*-"$tag"-*.whl)
fi
venv="$PWD/build/latest-venv"  # absolute: the tests run from a copy elsewhere
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q torch==2.13.0
"$py" -m pip install -q --upgrade "$wheel[test]"
echo "== newer than tests/constraints.txt:"
"$py" -m pip freeze | grep '==' | while IFS= read -r line; do
  name=${line%%==*}
  pin=$(grep -i -E "^${name//[-_.]/[-_.]}==" tests/constraints.txt || true)
  [ -z "$pin" ] || [ "${pin,,}" = "${line,,}" ] || echo "  ${line} (pinned: ${pin#*==})"
done
# The tests import stoker from the venv (the wheel), not from the source tree: run them from
# a copy of tests/ outside it.
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
cp -r tests "$run/tests"
cp pyproject.toml "$run/"
mkdir -p "$run/docs" && cp -r docs/. "$run/docs/"
cp README.md "$run/"
select=()
if [ "${STOKER_LATEST_QUICK:-0}" = 1 ]; then
  select=(-k "not two_processes and not elastic and not killed_run and not torchrun and not more_processes")
fi
(cd "$run" && "$py" -m pytest -q -p no:cacheprovider tests/test_frameworks.py \
  tests/test_docs_frameworks.py "${select[@]}")
