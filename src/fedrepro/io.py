"""Atomic file output, hashing, and files that cannot be written or read back.

Every file the pipeline produces is written to a temporary sibling (``.<name>.<random>.tmp``) and moved into
place with ``os.replace``, so a killed job never leaves a half-written file that looks complete; the temporary
files a killed job leaves are removed when a job for the same outputs starts again (:func:`clear_temporaries`).
A write that fails for lack of space says where and how much it needed (:class:`DiskFull`), whatever the
writer made of the error (torch turns it into its own "unexpected pos" on close). A file made earlier that
turns out truncated or corrupt is set aside under another name, kept for inspection, and reported with the
command that makes it again (:func:`broken`); with it gone, Snakemake's next run rebuilds it.

What a run reads back carries a digest recorded when it was written, checked when it is read:

- files of :func:`torch_save` (checkpoints, per-client states, feature caches) and ``np.savez`` are zip
  archives whose every member has the CRC-32 of its bytes in the archive's directory, written by torch and
  numpy themselves; torch never checks them on load, :func:`archive_damage` does (one sequential read, about
  1.5 GB/s per core: benchmarks/README.md);
- JSON files (splits) carry the SHA-256 of their own content (:func:`with_content_digest`), checked by
  :func:`content_damage`.

Every file is published with the permissions the user's umask gives a new file (``0666 & ~umask``, as any other
tool's output on a shared project space), not the 0600 of the temporary file it was written to.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterator

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RuntimeError):
    """A write failed because its file system (or quota) is full; names the folder and the space needed."""


class BrokenFile(RuntimeError):
    """A file made earlier (a cache, split, manifest, checkpoint) cannot be read as what it should be."""


class StaleInput(RuntimeError):
    """A file was made from other versions of its inputs than those here now; names it and the command that
    rebuilds it."""


def temporary_name(path: str | os.PathLike) -> str:
    """The prefix of the temporary files :func:`atomic_path` writes for ``path``."""
    return f".{Path(path).name}."


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, size: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it over ``path`` only if the block succeeds. ``size``:
    about how many bytes the block writes, for the message when the disk is full."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temporary_name(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:  # make the bytes durable before the rename publishes them
            os.fsync(fh.fileno())
        # mkstemp made it 0600: colleagues sharing the folder could not read a table, a run or the report
        os.chmod(tmp_path, 0o666 & ~umask())
        os.replace(tmp_path, path)
    except Exception as error:
        full = out_of_space(error)
        if full is None:
            raise
        written = tmp_path.stat().st_size if tmp_path.exists() and not tmp_path.is_symlink() else 0
        tmp_path.unlink(missing_ok=True)          # before counting what is free: the partial file holds space
        raise disk_full(path, size, written) from full
    finally:
        tmp_path.unlink(missing_ok=True)


_UMASK: list[int] = []


def umask() -> int:
    """This process's umask, read once: from /proc (Linux), else by setting it and putting it back at once (a file
    another thread created between the two calls would get 0022 for that instant's umask: /proc avoids it)."""
    if not _UMASK:
        try:
            with open("/proc/self/status") as fh:
                value = next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
        except (OSError, StopIteration, ValueError, IndexError):
            value = os.umask(0o022)
            os.umask(value)
        _UMASK.append(value)
    return _UMASK[0]


def out_of_space(error: BaseException) -> OSError | None:
    """The "no space left" (or quota) error behind ``error``, if there is one. Writers re-raise it as their own:
    torch's archive writer, handed the OSError by its file object, fails again on close with a RuntimeError
    ("[enforce fail at inline_container.cc] unexpected pos ...") whose context is the OSError."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            return error
        error = error.__cause__ or error.__context__
    return None


def disk_full(path: Path, size: int | None, written: int) -> DiskFull:
    folder = path.parent
    free = shutil.disk_usage(folder).free
    mb = lambda n: max(1, round(n / 2**20))  # noqa: E731
    needs = f"needs ~{mb(size)} MB" if size is not None else f"needs more than the {mb(written)} MB it had written"
    return DiskFull(f"no space left on {folder} (writing {path.name}), {needs}; {free / 2**20:.0f} MB free there. "
                    f"Free some space and start the job again (a training run resumes after its last finished round).")


def clear_temporaries(*targets: str | os.PathLike) -> list[Path]:
    """Remove what a killed writer of ``targets`` left: their ``.<name>.<random>.tmp`` siblings, or, for a folder the
    caller owns (a run's output or checkpoint folder), every such file in it. Call it where one job owns the
    targets (its outputs), never on a file other jobs may be writing."""
    removed = []
    for target in map(Path, targets):
        if target.is_dir():
            leftovers = [p for p in target.glob(".*.tmp") if p.is_file() or p.is_symlink()]
        else:
            leftovers = list(target.parent.glob(f"{temporary_name(target)}*.tmp")) if target.parent.is_dir() else []
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def set_aside(path: str | os.PathLike, why: str = "broken") -> Path:
    """Rename ``path`` to ``<path>.<why>`` (``.<why>-2``, ... if taken): kept for a look, out of the way."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.{why}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.{why}-{n}")
    os.replace(path, aside)
    return aside


def broken(path: str | os.PathLike, problem: str, rebuild: str | None = None) -> BrokenFile:
    """Set ``path`` aside and -> the error that says what is wrong with it and which command makes it again
    (default: the Snakemake target itself; the next Snakemake run that needs it rebuilds it anyway)."""
    path = Path(path)
    try:
        aside = set_aside(path) if path.exists() else None
    except FileNotFoundError:        # another reader of the same file (a loader worker) set it aside first
        aside = None
    moved = f"; set aside as {aside}" if aside else ""
    return BrokenFile(f"{path} is {problem}{moved}. Rebuild it: {rebuild or f'snakemake --cores all {path}'}")


def write_text(path: str | os.PathLike, text: str) -> None:
    data = text.encode("utf-8")
    with atomic_path(path, len(data)) as tmp:
        tmp.write_bytes(data)


def json_text(obj: Any) -> str:
    """What :func:`write_json` writes for ``obj``: a caller that records the file's digest before writing it
    (a run manifest records that of metrics.json, written last) hashes this."""
    return json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json_text(obj))


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_csv(path: str | os.PathLike, frame) -> None:
    """Write a pandas DataFrame atomically (no index)."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def torch_save(path: str | os.PathLike, obj: Any) -> None:
    """``torch.save`` atomically, with the CRC-32 of every member recorded (torch's default, kept on here:
    :func:`archive_damage` checks them when the file is read back)."""
    import torch
    from torch.utils.serialization import config

    # through a Python file object: the archive is named "archive" inside, not after the temporary file, so the
    # same object gives the same bytes
    with atomic_path(path, state_bytes(obj)) as tmp, config.patch({"save.compute_crc32": True}):
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)


def state_bytes(obj) -> int:
    """Bytes of the tensors in a nested dict / list (shared storages counted once)."""
    import torch

    seen, total = set(), 0

    def walk(x):
        nonlocal total
        if isinstance(x, torch.Tensor):
            key = (x.untyped_storage().data_ptr(), x.device) if x.device.type != "meta" else id(x)
            if key not in seen:
                seen.add(key)
                total += x.untyped_storage().nbytes() if x.device.type != "meta" else x.numel() * x.element_size()
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return total


def archive_damage(path: str | os.PathLike) -> str | None:
    """What is wrong with a zip archive (a :func:`torch_save` file, an ``.npz``), or None when every member is
    there and its bytes match the CRC-32 the writer recorded for it: a truncated file, a replaced one and a
    flipped byte are all caught before anything is loaded from it."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()          # reads every member and compares its CRC-32 (first failing one)
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as error:
        return f"truncated or not a complete archive ({type(error).__name__}: {error})"
    if bad is not None:
        return (f"corrupt: the bytes of its member {bad!r} do not match the CRC-32 recorded when it was written "
                f"(changed on disk since)")
    return None


def torch_load(path: str | os.PathLike, rebuild: str | None = None) -> Any:
    """A :func:`torch_save` file, after :func:`archive_damage` found it intact; a damaged one is set aside and named
    with the command that makes it again (:func:`broken`), never loaded."""
    import torch

    damage = archive_damage(path)
    if damage:
        raise broken(path, damage, rebuild)
    return torch.load(path, map_location="cpu", weights_only=False)


CONTENT_DIGEST = "content_sha256"


def with_content_digest(obj: dict) -> dict:
    """``obj`` with the SHA-256 of its canonical JSON (:func:`canonical_json`) under ``content_sha256``."""
    body = {k: v for k, v in obj.items() if k != CONTENT_DIGEST}
    return {**body, CONTENT_DIGEST: hashlib.sha256(canonical_json(body).encode()).hexdigest()}


def content_damage(obj: dict) -> str | None:
    """What is wrong with a JSON object written by :func:`with_content_digest`, or None: it matches its recorded
    digest, or it carries none (written before digests were recorded)."""
    recorded = obj.get(CONTENT_DIGEST)
    if recorded is None or with_content_digest(obj)[CONTENT_DIGEST] == recorded:
        return None
    return "corrupt: its content does not match the SHA-256 recorded in it when it was written (changed since)"


def canonical_json(obj: Any) -> str:
    """The one serialisation used for hashing configs: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def hash_obj(obj: Any, length: int = 12) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


_DIGESTS: dict[tuple, str] = {}


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file, computed once per process for an unchanged file (inode, size, mtime and ctime: a file put
    back with its old mtime, ``cp -p``, has a new ctime)."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def text_digest(text: str) -> str:
    """The :func:`content_digest` a file holding ``text`` (UTF-8) will have."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_digest(path: str | os.PathLike) -> str:
    """What a file holds, as one string. A zip archive (a :func:`torch_save` file, an ``.npz``): ``crc32:`` and the
    SHA-256 of its members' names, sizes and CRC-32s, read from its directory without reading the members (a
    model or cache of gigabytes costs microseconds); the members' bytes are compared with those CRC-32s whenever
    the archive is read (:func:`archive_damage`, numpy's reader), so the two together vouch for every byte. Any
    other file: ``sha256:`` and the SHA-256 of its bytes (:func:`file_digest`)."""
    try:
        with open(path, "rb") as fh:
            zipped = fh.read(4) == b"PK\x03\x04"
        if zipped:
            with zipfile.ZipFile(path) as archive:
                listing = [[i.filename, i.file_size, i.CRC] for i in archive.infolist()]
            return "crc32:" + hashlib.sha256(canonical_json(listing).encode()).hexdigest()
    except (zipfile.BadZipFile, ValueError, EOFError):
        pass                 # a damaged archive: its bytes' digest, which differs from the one recorded
    return "sha256:" + file_digest(path)


def _json_default(value: Any) -> Any:
    # numpy scalars and arrays appear in metrics; paths in configs
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
