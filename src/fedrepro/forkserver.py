"""A warm process that has already imported torch & co. and forks one child per ``fedrepro`` command.

Why: every pipeline job is a fresh Python process, and here (CPU, 2 cores) a process needs ~3.5 s to
import torch, pandas and the package and ~3 s more on its first optimizer step (torch imports its
compiler stack lazily there). The demo and CI run over a hundred jobs of a second or two of real
work each, so start-up would dominate. With ``FEDREPRO_FORKSERVER=<socket path>`` in the environment,
``fedrepro <command>`` (the thin client in :mod:`fedrepro.forkclient`) hands its argv, working directory,
environment and stdin/stdout/stderr file descriptors to this server, which forks a child that runs
the command exactly as the CLI would and reports its exit status back. Without the variable (on a
cluster, for users) nothing changes; if the server cannot be reached the client runs the command
itself.

If the client dies (Snakemake cancels a job, a test kills it), the child notices the closed
connection and exits too, so no orphan keeps writing outputs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from .forkclient import _HEADER, _KILLED_BY_CLIENT_LOSS, _STATUS, ENV_VAR, _recv_exact

# --------------------------------------------------------------------------------------------
# server

def preload() -> None:
    """Import everything jobs need, so children start warm (no torch op runs here: forking after
    the intra-op thread pool has started is unsafe)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import pandas  # noqa: F401
    import seaborn  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (what the first optimizer step would import)
    import torch.optim  # noqa: F401

    from . import cli, embed, features, registry, train  # noqa: F401

    for catalogue in registry.REGISTRIES:
        # imports every built-in method, model, dataset and report module once, here; plug-ins are each child's
        # own (its job's FEDREPRO_PLUGINS, and the entry points installed when the job starts)
        catalogue.load_builtin()
    _SITE["pth"] = _pth_files()

    for optional in ("torchvision", "timm", "open_clip", "transformers", "sklearn.manifold", "scipy.stats",
                     "transformers.models.bert.modeling_bert", "fedrepro.cost.memory"):
        try:
            __import__(optional)
        except ImportError:
            pass


_SITE: dict[str, set] = {"pth": set()}


def _pth_files() -> set[str]:
    """The .pth files of the interpreter's site directories (editable installs add one each)."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {str(p) for d in dirs if Path(d).is_dir() for p in Path(d).glob("*.pth")}


def refresh_import_path() -> None:
    """Make a child import what a fresh process of the client's environment would: the folders of the client's
    PYTHONPATH that the server's path lacks, and what .pth files written since the server started add (a plug-in
    installed with ``pip install -e`` while the server was running)."""
    import importlib
    import site

    for folder in reversed([f for f in os.environ.get("PYTHONPATH", "").split(os.pathsep) if f]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    for pth in sorted(_pth_files() - _SITE["pth"]):
        site.addpackage(str(Path(pth).parent), Path(pth).name, None)
    importlib.invalidate_caches()


def _child(conn: socket.socket, listener: socket.socket, request: dict, fds: list[int]) -> None:
    """Runs in the forked child: become the client's process, run the command, exit."""
    listener.close()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = os.fdopen(0, "r", closefd=False)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.pop(ENV_VAR, None)  # the child runs the command itself
    refresh_import_path()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)

    def watch_client() -> None:
        # the client sends nothing more; EOF means it died: stop working for nobody
        try:
            conn.recv(1)
        finally:
            os._exit(_KILLED_BY_CLIENT_LOSS)

    threading.Thread(target=watch_client, daemon=True).start()
    code = 0
    try:
        from . import cli

        cli.main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - report like the interpreter would, then exit non-zero
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve_one(conn: socket.socket, listener: socket.socket) -> None:
    try:
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
        (length,) = _HEADER.unpack(header)
        request = json.loads(_recv_exact(conn, length))
    except (OSError, ValueError, ConnectionError):
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(conn, listener, request, fds)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(_STATUS.pack(code if code >= 0 else 128 - code))
    except OSError:
        pass
    conn.close()


def serve(path: str | Path) -> None:
    path = Path(path)
    preload()
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: (path.unlink(missing_ok=True), os._exit(0)))
    print(f"fedrepro fork-server ready on {path} (pid {os.getpid()})", file=sys.stderr, flush=True)
    try:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_serve_one, args=(conn, listener), daemon=True).start()
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: python -m fedrepro.forkserver serve <socket path>")
    serve(sys.argv[2])
