#!/usr/bin/env bash
# Set up (if needed) and run the evidence run: every method variant of the full grid on the offline data, 3 seeds,
# and the page that says whether each learns (results/evidence-run/evidence/index.html). More than two hours on 2
# CPU cores (not yet measured to its end: benchmarks/README.md); it resumes where it stopped. Arguments: more config files, merged over
# config/evidence.yaml, e.g. the slice
# the tests run (one seed, a few variants per paper):
#   bash scripts/evidence.sh
#   bash scripts/evidence.sh tests/data/evidence-slice.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
# shellcheck disable=SC1091
. scripts/lib/forkserver.sh

configs=(config/evidence.yaml "$@")
snakemake all --cores "${CORES:-2}" --configfile "${configs[@]}"
page=$(python -c 'import sys; from fedrepro import paths; from fedrepro.config import load_project
load_project(sys.argv[1:]); print(paths.evidence("index.md"))' "${configs[@]}")
echo
echo "Learning bar: $(grep -m1 'clear the bar' "$page" | tr -d '*') (${page%.md}.html)"
