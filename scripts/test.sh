#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest (e.g. -m "not slow").
# FEDREPRO_TEST_SHARDS=N runs it as N shards side by side, each in its own copy of the checkout (CI: 2 on 2 cores;
# scripts/test-shards.py); with test paths among the arguments it runs them as one plain pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
if [ "${FEDREPRO_TEST_SHARDS:-1}" -gt 1 ]; then
    exec python scripts/test-shards.py "$FEDREPRO_TEST_SHARDS" "$@"
fi
python -m pytest "$@"
