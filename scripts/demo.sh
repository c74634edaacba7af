#!/usr/bin/env bash
# Set up (if needed) and run the whole pipeline on the embedded demo data: download/prepare -> split
# -> features -> train -> tables -> figures -> the report, all in results/demo/. Extra arguments go to Snakemake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate

# shellcheck disable=SC1091
. scripts/lib/forkserver.sh

# Stopped (Ctrl-C, a closed terminal)? Running this script again resumes: finished jobs are kept, a training job that
# was cut off continues from its last checkpoint (resume.pt), and --rerun-incomplete restarts the jobs Snakemake marked
# incomplete instead of refusing them (every output is written to a temporary name and renamed, so none is half-written)
trap 'echo >&2; echo "Stopped: run bash scripts/demo.sh again to resume where it stopped." >&2' INT
snakemake --cores "${CORES:-2}" --configfile=config/demo.yaml all --rerun-incomplete "$@"
# the demo's results live in their own folder (config/demo.yaml: results_dir), never among the full grid's
out=results/demo
snakemake --cores 1 --configfile=config/demo.yaml report
echo
echo "Learning bar: $(grep -m1 'clear the bar' "$out/evidence/index.md" | tr -d '*') ($out/evidence/index.html)"
echo "Scorecards: $out/scorecards/<paper>.html (published vs measured; stand-in data, so no reproduction verdict)"
echo "Tables:  $out/tables/<protocol>/<paper>/<table>.{md,csv,tex}"
echo "Figures: $out/figures/<protocol>/<paper>/<figure>.{png,pdf}"
echo "Report:  $out/report.html (start here: one row per paper, what reproduced and what learned)"
