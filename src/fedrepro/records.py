"""What a file a job wrote holds and what it was made from, in a record beside it, and the check a job that reads
the file makes before using it.

The jobs that make the files everything else is made from (``prepare``: the manifest; ``split``; ``image_cache``;
``features``) write ``<file>.provenance`` (:func:`fedrepro.paths.provenance`) last::

    {"files": {"<name>": "<digest>", ...}, "made_from": {"<path>": "<digest>", ...}, <what the job was asked for>}

A digest is :func:`fedrepro.io.content_digest` (the CRC-32s a zip archive's directory lists, or a SHA-256); an image
cache's pixel file is listed by its size, its images' CRC-32s being in its index, which is listed and which the
reader checks image by image. A record holds no time: the same content gives the same record, byte for byte.
That is what lets the rules decide by content (:meth:`fedrepro.dag.Dag.by_content`): the big file is read as
``ancient`` (its modification time is not compared) and its record, a small file, is an ordinary input whose
checksum Snakemake compares when its time is newer, so a file rebuilt with the same bytes, pulled, or stamped with
a skewed clock reruns nothing, and one with other bytes reruns what reads it.

:func:`verify` is the reader's check: every file the record lists still has its digest, and what the record says
it was made from is what the reader expects (:func:`expect`); a mismatch is refused by name, with what it should
have been made from and the command that rebuilds it. Files made before records existed have none and are read
as before (Snakemake rebuilds them anyway: the record is one of their rule's outputs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from . import paths
from .io import StaleInput, canonical_json, content_digest, read_json, write_json

# an embedding (.npz, the embed job's) carries its record as this member: {"config_hash", "model.pt": digest}
NPZ_MEMBER = "provenance"


class ChangedFile(StaleInput):
    """A file differs from what its record says its job wrote, or was made from something other than what its
    reader expects."""


def digest(path: str | os.PathLike) -> str:
    """A listed file's digest: :func:`fedrepro.io.content_digest`; an image cache's pixel file (``.u8``, many
    gigabytes, no directory of its own) by its size, its per-image CRC-32s living in its index."""
    path = Path(path)
    if path.suffix == ".u8":
        return f"size:{path.stat().st_size}"
    return content_digest(path)


def write(primary: str | os.PathLike, files: Iterable[str | os.PathLike], made_from: dict[str, str] | None = None,
          **facts) -> dict:
    """Record ``files`` (``primary`` and the job's other outputs) with their digests, what they were ``made_from``
    (path -> digest) and ``facts`` (the spec, seed, encoder the job was given): written last, after the files."""
    record = {"files": {Path(f).name: digest(f) for f in files}, "made_from": dict(made_from or {}), **facts}
    write_json(paths.provenance(str(primary)), record)
    return record


def read(primary: str | os.PathLike) -> dict | None:
    """The record of ``primary``, or None where there is none (made before records existed)."""
    record = Path(paths.provenance(str(primary)))
    if not record.is_file():
        return None
    try:
        value = read_json(record)
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("files"), dict):
        raise ChangedFile(f"{record} is not a readable record (cut off or edited); rebuild {primary}: "
                          f"snakemake --cores all --forcerun {primary}")
    return value


def changed(primary: str | os.PathLike, record: dict) -> list[str]:
    """The files of ``record`` (beside ``primary``) whose digest is not the recorded one, each as "<file> (what)"."""
    folder = Path(primary).parent
    out = []
    for name, recorded in record["files"].items():
        path = folder / name
        if not path.is_file():
            out.append(f"{path} (missing)")
        elif (now := digest(path)) != recorded:
            out.append(f"{path} (holds {now[:19]}…, its job wrote {recorded[:19]}…)")
    return out


def verify(primary: str | os.PathLike, rebuild: str | None = None, **expected) -> dict | None:
    """``primary``'s record, after checking that every file it lists holds what its job wrote and that its facts
    are ``expected`` (e.g. ``seed=0``, compared as canonical JSON); None without a record. Refuses a mismatch with
    the file, what it should be and ``rebuild`` (default: force its own rule)."""
    record = read(primary)
    if record is None:
        return None
    rebuild = rebuild or f"snakemake --cores all --forcerun {primary}"
    damaged = changed(primary, record)
    if damaged:
        raise ChangedFile(f"{', '.join(damaged)}: not what {paths.provenance(str(primary))} says its job wrote "
                          f"(changed or replaced since). Rebuild it: {rebuild}")
    expect(primary, record, rebuild, **expected)
    return record


def expect(primary: str | os.PathLike, record: dict, rebuild: str, **expected) -> None:
    """Refuse ``primary`` when its record's facts differ from ``expected`` (a split of another seed copied over
    this one, a cache of another encoder)."""
    wrong = [f"{key} {canonical_json(record.get(key))} where {canonical_json(value)} was expected"
             for key, value in expected.items() if canonical_json(record.get(key)) != canonical_json(value)]
    if wrong:
        raise ChangedFile(f"{primary} was made for something else: its record ({paths.provenance(str(primary))}) "
                          f"says {'; '.join(wrong)}. Rebuild it: {rebuild}")


def made_from(*files: str | os.PathLike) -> dict[str, str]:
    """path -> digest of the inputs a job read, for :func:`write`."""
    return {str(f): digest(f) for f in files}


def embedded(path: str | os.PathLike) -> dict | None:
    """The record an ``.npz`` carries as :data:`NPZ_MEMBER` (an embedding: which model of which configuration it
    was extracted from), or None (made before records existed)."""
    import json

    import numpy as np

    with np.load(path) as archive:
        return json.loads(str(archive[NPZ_MEMBER])) if NPZ_MEMBER in archive.files else None
