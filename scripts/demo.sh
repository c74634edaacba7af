#!/usr/bin/env bash
# Set up (if needed) and run the whole pipeline on the embedded demo data: download/prepare -> split
# -> features -> train -> tables -> figures -> Snakemake report. Extra arguments go to Snakemake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate

# A warm fork-server makes each of the ~hundred short jobs start in well under a second instead of
# ~7 s (see src/fedrepro/forkserver.py). Without it everything still works, only slower.
mkdir -p .snakemake
export FEDREPRO_FORKSERVER="$PWD/.snakemake/fedrepro-forkserver.sock"
python -m fedrepro.forkserver serve "$FEDREPRO_FORKSERVER" 2> .snakemake/forkserver.log &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
if ! python -c "import sys; from fedrepro.forkclient import wait_ready; sys.exit(not wait_ready('$FEDREPRO_FORKSERVER', 180))"; then
    echo "fork-server did not start (see .snakemake/forkserver.log); running jobs without it" >&2
    unset FEDREPRO_FORKSERVER
fi

snakemake --cores "${CORES:-2}" --configfile=config/demo.yaml all "$@"
snakemake --cores 1 --configfile=config/demo.yaml --report results/report.html
echo
echo "Learning bar: $(grep -m1 'clear the bar' results/evidence/index.md | tr -d '*') (results/evidence/index.html)"
echo "Scorecards: results/scorecards/<paper>.html (did each published number reproduce?)"
echo "Tables:  results/tables/<protocol>/<paper>/<table>.{md,csv,tex}"
echo "Figures: results/figures/<protocol>/<paper>/<figure>.{png,pdf}"
echo "Report:  results/report.html"
