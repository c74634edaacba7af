#!/usr/bin/env bash
# Set up (if needed) and run the whole pipeline on the embedded demo data: download/prepare -> split
# -> features -> train -> tables -> figures -> Snakemake report, all in results/demo/. Extra arguments go to Snakemake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate

# shellcheck disable=SC1091
. scripts/lib/forkserver.sh

snakemake --cores "${CORES:-2}" --configfile=config/demo.yaml all "$@"
# the demo's results live in their own folder (config/demo.yaml: results_dir), never among the full grid's
out=results/demo
snakemake --cores 1 --configfile=config/demo.yaml --report "$out/report.html"
echo
echo "Learning bar: $(grep -m1 'clear the bar' "$out/evidence/index.md" | tr -d '*') ($out/evidence/index.html)"
echo "Scorecards: $out/scorecards/<paper>.html (did each published number reproduce?)"
echo "Tables:  $out/tables/<protocol>/<paper>/<table>.{md,csv,tex}"
echo "Figures: $out/figures/<protocol>/<paper>/<figure>.{png,pdf}"
echo "Report:  $out/report.html"
