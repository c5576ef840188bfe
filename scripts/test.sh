#!/usr/bin/env bash
# Install everything the tests need, then run them. Usage: bash scripts/test.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test || exit 1
python3 -m pytest -q "$@"
rc=$?
[ $rc -eq 5 ] && { echo "pytest collected no tests" >&2; rc=1; }
exit $rc
