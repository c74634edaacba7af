"""Per-client state that a method keeps between a client's turns, in memory or one file per client.

Full fine-tuning of CLIP with persistent Adam states keeps ~1.2 GB per client (plus a previous model
per client for MOON, a personal model for personalized methods); 15 clients would hold 18-27 GB in
RAM and rewrite all of it into ``resume.pt`` every round. A :class:`ClientStates` is a mapping
``client name -> state`` (a nested dict of tensors) that keeps each entry either in memory or in a
file under the run's checkpoint directory (``paths.client_states``), loaded when the client trains and
written (atomically) after, so at most one client's entry of each store is held at a time.

``train.client_state``: ``memory``, ``disk``, or ``auto`` = an entry goes to disk when its size times
the number of clients exceeds :data:`AUTO_SPILL_BYTES` (256 MiB): full-model and optimizer states of
image models go to disk, the few-KB states of feature-level runs stay in memory.

Checkpointing is incremental and safe against a kill at any moment:

- a write never replaces a file: every entry written gets a new file
  ``<store>/<client>.r<round>.<session>-<n>.pt`` (the round it belongs to, a token of this process);
- ``resume.pt`` holds the store's *index* (client -> file name), not the tensors; a round rewrites only
  the files of the clients whose state changed;
- after ``resume.pt`` is written (:meth:`ClientStates.committed`), files no longer in the index are
  deleted; on resume, the index of ``resume.pt`` is adopted and every file it does not name (written in
  a round that was never committed) is deleted, so state of an uncommitted round is never read.

Every file is checked against the CRC-32s recorded in it when it was written (:func:`fedrepro.io.archive_damage`)
before it is loaded: on resume, every file the index names (:func:`check_committed`; one that is missing or
changed makes the engine start the run over), and again at every load.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from pathlib import Path

import torch

from ..io import BrokenFile, archive_damage, state_bytes, torch_save

MODES = ("memory", "disk", "auto")
AUTO_SPILL_BYTES = 256 * 2**20
INDEX_KEY = "__client_state_files__"


class ClientStateError(BrokenFile):
    """A client-state file that a checkpoint names cannot be used."""


class MissingClientState(ClientStateError):
    pass


class CorruptClientState(ClientStateError):
    pass


class ClientStates(MutableMapping):
    """``client -> state``, each entry in memory or in its own file (see the module docstring)."""

    def __init__(self, name: str, mode: str = "memory", directory: str | Path | None = None, num_clients: int = 1):
        if mode not in MODES:
            raise ValueError(f"train.client_state: {mode!r} is not one of {', '.join(MODES)}")
        if mode != "memory" and directory is None:
            mode = "memory"          # no checkpoint directory (a method driven without files): nothing to spill to
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"client state store name {name!r}: letters, digits, '_', '.', '-' only")
        self.name, self.mode, self.num_clients = name, mode, max(1, num_clients)
        self.directory = Path(directory) / name if directory is not None else None
        self.memory: dict[str, object] = {}
        self.files: dict[str, str] = {}          # client -> file name (in self.directory)
        self.round = -1                          # the round entries being written belong to (-1 = set-up)
        self.session = os.urandom(4).hex()
        self.writes = 0
        self.loads = 0                           # files read (for tests and logs)

    # ---- where an entry goes ------------------------------------------------------------
    def spills(self, value) -> bool:
        if self.mode == "memory":
            return False
        if self.mode == "disk":
            return True
        return state_bytes(value) * self.num_clients > AUTO_SPILL_BYTES

    # ---- the mapping --------------------------------------------------------------------
    def __getitem__(self, client: str):
        if client in self.memory:
            return self.memory[client]
        if client in self.files:
            path = self.directory / self.files[client]
            if not path.exists():
                raise MissingClientState(f"{path}: client state of {client!r} ({self.name}) is missing; the "
                                         f"checkpoint directory was changed while the run was unfinished. Delete "
                                         f"{self.directory.parent} to start the run again.")
            damage = archive_damage(path)
            if damage:
                raise CorruptClientState(f"{path}: client state of {client!r} ({self.name}) is {damage}. Start the "
                                         f"job again: its resume.pt names this file, so it starts over from round 1")
            self.loads += 1
            saved = torch.load(path, map_location="cpu", weights_only=False)
            if saved.get("client") != client or saved.get("store") != self.name:
                raise MissingClientState(f"{path} holds {saved.get('store')}/{saved.get('client')}, not "
                                         f"{self.name}/{client}")
            return saved["state"]
        raise KeyError(client)

    def __setitem__(self, client: str, value) -> None:
        if self.spills(value):
            self.writes += 1
            name = f"{_safe(client)}.r{self.round}.{self.session}-{self.writes}.pt"
            torch_save(self.directory / name, {"store": self.name, "client": client, "round": self.round,
                                               "state": value})
            self.memory.pop(client, None)
            self.files[client] = name            # the previous file stays until the next commit
        else:
            self.files.pop(client, None)
            self.memory[client] = value

    def __delitem__(self, client: str) -> None:
        if client not in self:
            raise KeyError(client)
        self.memory.pop(client, None)
        self.files.pop(client, None)

    def __contains__(self, client) -> bool:
        return client in self.memory or client in self.files

    def __iter__(self):
        return iter(sorted({*self.memory, *self.files}))

    def __len__(self) -> int:
        return len({*self.memory, *self.files})

    def resident(self) -> int:
        """Entries held in memory."""
        return len(self.memory)

    # ---- checkpointing ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What ``resume.pt`` holds: in-memory entries as they are, spilled ones by file name."""
        if not self.files:
            return dict(self.memory)
        return {**self.memory, INDEX_KEY: dict(self.files)}

    def load_state_dict(self, state: dict) -> None:
        """Adopt a committed index (and in-memory entries); files it does not name are deleted."""
        state = dict(state or {})
        files = state.pop(INDEX_KEY, {})
        self.memory, self.files = state, dict(files)
        if self.files and self.directory is None:
            raise MissingClientState(f"resume.pt references client state files of {self.name!r} but this run "
                                     f"has no checkpoint directory")
        for client, name in self.files.items():
            if not (self.directory / name).exists():
                raise MissingClientState(f"resume.pt references {self.directory / name} ({self.name} of "
                                         f"{client!r}), which is missing; delete {self.directory.parent} and "
                                         f"resume.pt to start the run again")
        self.committed()

    def committed(self) -> None:
        """``resume.pt`` now names exactly the current files: delete every other file of this store."""
        if self.directory is None or not self.directory.exists():
            return
        keep = set(self.files.values())
        for path in self.directory.iterdir():
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def materialise(self) -> dict:
        """Every entry, loaded (for a final model file)."""
        return {client: self[client] for client in self}


def check_committed(state_dir: str | Path | None, state) -> None:
    """Every client-state file that a checkpoint's method ``state`` names (the index of each store in it) is in
    its store's folder under ``state_dir`` and matches the CRC-32s recorded when it was written; raises
    :class:`MissingClientState` or :class:`CorruptClientState` naming the first that is not."""
    folders = [d for d in Path(state_dir).iterdir() if d.is_dir()] if state_dir and Path(state_dir).is_dir() else []
    for client, name in _indexed(state):
        found = [folder / name for folder in folders if (folder / name).is_file()]
        if not found:
            raise MissingClientState(f"resume.pt names the client state file {name} of {client!r}, which is not "
                                     f"in {state_dir}")
        damage = archive_damage(found[0])
        if damage:
            raise CorruptClientState(f"{found[0]} (client state of {client!r}, named by resume.pt) is {damage}")


def _indexed(state):
    """(client, file name) of every index in a nested method state."""
    if isinstance(state, dict):
        for client, name in (state.get(INDEX_KEY) or {}).items():
            yield client, name
        for key, value in state.items():
            if key != INDEX_KEY:
                yield from _indexed(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _indexed(value)


def _safe(client: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", client)
