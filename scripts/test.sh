#!/usr/bin/env bash
# Install everything the tests need, then run them. Usage: bash scripts/test.sh [pytest args]
# With no arguments it runs every tier (tests/unit, tests/model, tests/engines, tests/fuzz) and lists the 25 slowest
# tests; a bare `pytest` runs only tests/unit (pyproject.toml's testpaths).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test || exit 1
if [ $# -eq 0 ]; then
    python3 -m pytest -q --durations=25 tests
else
    python3 -m pytest -q "$@"
fi
rc=$?
[ $rc -eq 5 ] && { echo "pytest collected no tests" >&2; rc=1; }
exit $rc
