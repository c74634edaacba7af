#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest (e.g. -m "not slow").
# On 2 or more cores it runs as 2 shards side by side, each in its own copy of the checkout (scripts/test-shards.py):
# most tests keep one core busy. FEDREPRO_TEST_SHARDS=N sets the number (1: one plain pytest); with test paths among
# the arguments it runs them as one plain pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
SHARDS=${FEDREPRO_TEST_SHARDS:-$(( $(nproc) >= 2 ? 2 : 1 ))}
if [ "$SHARDS" -gt 1 ]; then
    exec python scripts/test-shards.py "$SHARDS" "$@"
fi
python -m pytest "$@"
