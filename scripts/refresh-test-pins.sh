#!/usr/bin/env bash
# Rewrites tests/constraints.txt, the versions README's test command and .ci/run install,
# from the newest releases: a fresh venv gets torch (the CI's), the [test] extra and the
# engines .ci/run adds (Ray, Spark) with no constraint, and its `pip freeze` becomes the
# file (header kept; torch and what it brings, the build tools and stoker left out).
# Run it on purpose, when scripts/test-latest.sh says the newest releases pass (or after
# adapting stoker to what they changed), then run README's test command and commit.
#
#   bash scripts/refresh-test-pins.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv="build/pins-venv"
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q torch==2.13.0
PYTHON="$py" bash scripts/install-deps.sh
# Held back on purpose (tests/constraints.txt's header says why): kept below these.
holds=("opencv-python-headless<4.14")
"$py" -m pip install -q --no-build-isolation ".[test]" "ray[data]>=2.9" "pyspark>=3.4" \
  "${holds[@]}"
header=$(sed -n '/^#/p' tests/constraints.txt)  # the comment lines, holds' reasons included
# torch's own requirements (whatever torch the user has brings them), the build tools, stoker
skip=$("$py" - <<'PY'
import importlib.metadata as md, re
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
seen, stack = set(), ["torch"]
while stack:
    name = stack.pop()
    if norm(name) in seen:
        continue
    seen.add(norm(name))
    try:
        reqs = md.requires(name) or []
    except md.PackageNotFoundError:
        continue
    stack += [re.split(r"[<>=!~\[; (]", r.strip())[0] for r in reqs if "extra ==" not in r]
seen |= {"stoker", "pip", "setuptools", "wheel", "scikit-build-core", "pybind11", "pathspec",
         "ninja", "cmake"}
print("\n".join(sorted(seen)))
PY
)
{
  echo "$header"
  "$py" -m pip freeze --exclude-editable | grep '==' | while IFS= read -r line; do
    name=$(echo "${line%%==*}" | tr 'A-Z_.' 'a-z--')
    grep -qx "$name" <<<"$skip" || echo "$line"
  done
} >tests/constraints.txt
echo "tests/constraints.txt: $(grep -c '==' tests/constraints.txt) pins; git diff shows what changed"
