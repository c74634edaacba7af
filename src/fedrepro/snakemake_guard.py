"""One line instead of Snakemake's traceback when ``--configfile`` swallowed a target.

``snakemake --configfile config/demo.yaml all`` reads ``all`` as a second config file and fails in Snakemake's own
argument handling, before the workflow (where every other check of this project lives) is read. This module runs at
the start of every Python of the environment (``scripts/setup.sh`` writes a one-line ``.pth`` file that imports it),
returns at once unless the process is ``snakemake`` given ``--configfile``, and then stops it with one line saying
which words were taken for config files and how to write the command (:func:`fedrepro.targets.swallowed_message`).
"""

from __future__ import annotations

import os
import sys

PTH = "fedrepro_snakemake_guard.pth"        # sorts after the editable install's own .pth, which puts src/ on the path
PTH_LINE = "import sys; exec('try:\\n import fedrepro.snakemake_guard\\nexcept ImportError:\\n pass')\n"


def snakemake_args() -> list[str] | None:
    """The arguments of this process when it is `snakemake` (the command, or ``python -m snakemake``), else None."""
    argv = getattr(sys, "argv", None) or []
    if argv and os.path.basename(argv[0]) == "snakemake":
        return argv[1:]
    orig = getattr(sys, "orig_argv", None) or []
    if orig[1:3] == ["-m", "snakemake"]:
        return orig[3:]
    return None


def check() -> None:
    args = snakemake_args()
    if not args or not any(a in ("--configfile", "--configfiles") for a in args):
        return
    from .targets import swallowed_message

    message = swallowed_message(args)
    if message:
        print(message, file=sys.stderr, flush=True)
        os._exit(1)       # at interpreter start-up a SystemExit would be reported as a broken start-up file


check()
