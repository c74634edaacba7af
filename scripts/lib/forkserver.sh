# Sourced by scripts/demo.sh and scripts/evidence.sh: start a warm fork-server for the many short jobs, so each
# starts in well under a second instead of ~7 s (see src/fedrepro/forkserver.py). Without it everything still
# works, only slower. Expects the environment to be active.
mkdir -p .snakemake
export FEDREPRO_FORKSERVER="$PWD/.snakemake/fedrepro-forkserver.sock"
python -m fedrepro.forkserver serve "$FEDREPRO_FORKSERVER" 2> .snakemake/forkserver.log &
FORKSERVER_PID=$!
trap 'kill "$FORKSERVER_PID" 2>/dev/null || true' EXIT
if ! python -c "import sys; from fedrepro.forkclient import wait_ready; sys.exit(not wait_ready('$FEDREPRO_FORKSERVER', 180))"; then
    echo "fork-server did not start (see .snakemake/forkserver.log); running jobs without it" >&2
    unset FEDREPRO_FORKSERVER
fi
