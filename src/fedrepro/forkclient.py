"""The client side of the fork-server (:mod:`fedrepro.forkserver`): hand a ``fedrepro`` command to a
warm server when ``FEDREPRO_FORKSERVER`` names one, and the wire format both sides speak.

Imports nothing of the package, so ``fedrepro <command>`` reaches a running server in milliseconds.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

ENV_VAR = "FEDREPRO_FORKSERVER"
SERVED_COMMANDS = {"download", "prepare", "split", "image-cache", "features", "train", "embed", "table", "figure",
                   "scorecard", "evidence", "downstream"}
_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")
_KILLED_BY_CLIENT_LOSS = 137


def _send_blob(conn: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        socket.send_fds(conn, [data], fds)
    else:
        conn.sendall(data)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks = b""
    while len(chunks) < n:
        chunk = conn.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks += chunk
    return chunks


def command_of(argv: list[str]) -> str | None:
    """The subcommand of ``fedrepro [-v] [--log FILE] <command> ...``: global options come before it (every rule
    passes ``--log``)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--log" else 1
    return argv[i] if i < len(argv) else None


def run_via_server(argv: list[str]) -> int | None:
    """Run ``fedrepro <argv>`` in a child of the fork-server; None if no server is usable."""
    path = os.environ.get(ENV_VAR)
    if not path or command_of(argv) not in SERVED_COMMANDS or not Path(path).exists():
        return None
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        _send_blob(conn, request, [0, 1, 2])
    except OSError:
        return None  # no server after all: the caller runs the command itself
    # from here on the command runs in the server's child; our own exit status mirrors the child's
    try:
        return _STATUS.unpack(_recv_exact(conn, _STATUS.size))[0]
    except (ConnectionError, OSError):
        print("fedrepro: the fork-server went away while running the command", file=sys.stderr)
        return 1
    finally:
        conn.close()


def wait_ready(path: str | Path, timeout: float = 120.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if Path(path).exists():
            return True
        time.sleep(0.2)
    return False
