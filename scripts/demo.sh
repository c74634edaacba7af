#!/usr/bin/env bash
# Set up (if needed) and run the whole pipeline on the embedded demo data: download/prepare -> split
# -> features -> train -> tables -> figures -> the report. Extra arguments go to Snakemake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate

# shellcheck disable=SC1091
. scripts/lib/forkserver.sh

snakemake --cores "${CORES:-2}" --configfile=config/demo.yaml all "$@"
snakemake --cores 1 --configfile=config/demo.yaml report
echo
echo "Learning bar: $(grep -m1 'clear the bar' results/evidence/index.md | tr -d '*') (results/evidence/index.html)"
echo "Scorecards: results/scorecards/<paper>.html (did each published number reproduce?)"
echo "Tables:  results/tables/<protocol>/<paper>/<table>.{md,csv,tex}"
echo "Figures: results/figures/<protocol>/<paper>/<figure>.{png,pdf}"
echo "Report:  results/report.html"
