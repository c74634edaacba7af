"""Archives: verified before anything is read from them, unpacked once, member by member.

- Verified: every archive is checked against its pinned SHA-256 (or, for unpinned archives, against
  the digest recorded on first use in ``SHA256SUMS``); a mismatch is an error naming the file. A digest
  is recorded on first use only for a file verified whole (:func:`archive_problem`: every zip member
  read and its CRC checked, every tar member read up to the end-of-archive marker, a compressed stream
  read to its end), so an interrupted download placed by hand is refused by name, with nothing
  recorded, and the complete copy put in its place is accepted. ``--reverify`` re-checks an archive
  whose recorded digest no longer matches (a copy replaced on purpose) and records its new digest if
  it is whole. A digest, once computed, is kept with the file's size and modification time
  (``downloads/.verified.json``), so a 180 GB archive is not hashed again on every run.
- Unpacked once: an archive is unpacked member by member, each written whole (temporary file, then
  renamed) and skipped when a file of its size is already in place, so a rerun after an interrupted or
  misplaced unpack writes only what is missing; a fully unpacked archive is marked
  (``downloads/<archive>.unpacked``) and never touched again. An archive's own top folder
  (``Source.top``) is stripped; a tree unpacked by hand is recognised by its contents wherever the
  preparers read it (with or without that top folder, with or without the marker) and only what is
  missing from it is written, into the same tree. Before unpacking, the free disk space is checked
  against what the archive still has to write (the message says what is already in place).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path

from ...io import NO_SPACE, read_json, sha256_file, write_json, write_text
from ..spec import Source
from .base import (
    CHECKSUM_FILE,
    UNPACKED_SUFFIX,
    VERIFIED_CACHE,
    BrokenArchive,
    ChecksumMismatch,
    DownloadError,
    NotEnoughSpace,
    download_command,
    log,
    require_space,
    size_text,
)


def recorded_checksums(dataset_dir: Path) -> dict[str, str]:
    sums = dataset_dir / CHECKSUM_FILE
    if not sums.exists():
        return {}
    out = {}
    for line in sums.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.strip().lstrip("*")] = digest
    return out


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def archive_digest(path: Path) -> str:
    """SHA-256 of ``path``; taken from ``downloads/.verified.json`` when the file's size and
    modification time are those it was hashed with (hashing 180 GB again on every run is not free)."""
    cache_file = path.parent / VERIFIED_CACHE
    cache = read_json(cache_file) if cache_file.exists() else {}
    entry = cache.get(path.name)
    if entry and {k: entry.get(k) for k in ("size", "mtime_ns")} == _stat_key(path):
        return entry["sha256"]
    return sha256_file(path)


def remember_digest(path: Path, digest: str) -> None:
    """Keep the digest of an accepted file with its size and modification time (``.verified.json``)."""
    cache_file = path.parent / VERIFIED_CACHE
    cache = read_json(cache_file) if cache_file.exists() else {}
    if cache.get(path.name) != {**_stat_key(path), "sha256": digest}:
        cache[path.name] = {**_stat_key(path), "sha256": digest}
        write_json(cache_file, cache)


# errors that reading a damaged archive raises (the writing side's OSErrors, a full disk, are not among them)
READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, tarfile.TarError, gzip.BadGzipFile, lzma.LZMAError,
               NotImplementedError, RuntimeError, ValueError)
COMPRESSED = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ\x00": lzma.open}   # magic bytes -> opener


def is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except READ_ERRORS + (OSError,):   # a cut-off .tar.gz makes is_tarfile itself raise (EOFError)
        return False


def _drain(stream, bar=None) -> None:
    for block in iter(lambda: stream.read(1 << 20), b""):
        if bar is not None:
            bar.update(len(block))


def archive_problem(path: Path, extract: bool = True, progress: bool = True) -> str | None:
    """Why ``path`` is not whole, or None if it is: every member of a zip read and its CRC checked;
    every member of a tar read and its end-of-archive marker found (a compressed tar's stream read to its
    end, which checks its own CRC); a single compressed file (.gz, .bz2, .xz) read to its end. A file
    with no structure to check (a plain CSV) is whole by definition; a file to unpack (``extract``)
    that is neither zip nor tar is not."""
    from tqdm import tqdm

    with open(path, "rb") as fh:
        head = fh.read(8)
    bar = dict(unit="B", unit_scale=True, desc=f"checking {path.name}", disable=not progress)
    if zipfile.is_zipfile(path):
        member = None
        try:
            with zipfile.ZipFile(path) as zf:
                infos = [i for i in zf.infolist() if not i.is_dir()]
                with tqdm(total=sum(i.file_size for i in infos), **bar) as progress_bar:
                    for member in infos:
                        with zf.open(member) as stream:
                            _drain(stream, progress_bar)
        except READ_ERRORS as exc:
            where = f"member {member.filename!r}" if member is not None else "its central directory"
            return f"{where} cannot be read ({type(exc).__name__}: {exc})"
        return None
    if is_tar(path):
        member = None
        try:
            with tarfile.open(path) as tf, tqdm(**bar) as progress_bar:
                for member in tf:
                    if member.isfile():
                        _drain(tf.extractfile(member), progress_bar)
                member = None
                tf.fileobj.seek(tf.offset)
                if tf.fileobj.read(512) != b"\0" * 512:
                    return "it ends without tar's end-of-archive marker (cut off after a member)"
                _drain(tf.fileobj)                     # a compressed tar: the stream's own check, at its end
        except READ_ERRORS as exc:
            where = f"after member {member.name!r}" if member is not None else "its data"
            return f"{where} cannot be read ({type(exc).__name__}: {exc})"
        return None
    opener = next((o for magic, o in COMPRESSED.items() if head.startswith(magic)), None)
    if opener is not None:
        try:
            with opener(path, "rb") as stream, tqdm(**bar) as progress_bar:
                _drain(stream, progress_bar)
        except READ_ERRORS + (OSError,) as exc:
            return f"its compressed data cannot be read to the end ({type(exc).__name__}: {exc})"
        return None
    if not extract:
        return None
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive without its central directory, which is at the end of the file: it was cut off"
    return "it is neither a zip nor a tar archive (cut off in its first block, or another kind of file)"


def verify_archive(path: Path, source: Source, dataset_dir: Path, record: bool = True, reverify: bool = False) -> str:
    """Check ``path`` against the pinned digest, or the one recorded on first use. A new digest is recorded
    only for a file that is whole (:func:`archive_problem`); ``reverify``: an archive whose recorded digest
    no longer matches is checked whole again and, if it is, its new digest replaces the old one.
    ``record=False``: report only, as ``--check`` does (nothing is written)."""
    actual = archive_digest(path)
    sums = dataset_dir / CHECKSUM_FILE
    if source.sha256:
        if actual != source.sha256:
            raise ChecksumMismatch(path, source.sha256, actual, "pinned in the dataset registry", advice=(
                f"The file is corrupt, truncated or another release. Delete it and run `{download_command(dataset_dir)}` "
                f"to download it again (or put a good copy there); if the new release is intended, update the "
                f"pinned digest of {dataset_dir.name} in src/fedrepro/data/datasets/."))
    else:
        recorded = recorded_checksums(dataset_dir)
        known = recorded.get(path.name)
        if known is not None and known != actual and not reverify:
            raise ChecksumMismatch(path, known, actual, f"recorded on first use in {sums}", advice=(
                f"The file changed since its digest was recorded. If you replaced it on purpose with a complete copy "
                f"(say the first one was cut off), run `{download_command(dataset_dir, '--reverify')}`: it checks "
                f"the archive whole (every member read, CRCs checked) and records its new digest. Otherwise it is "
                f"corrupt or another release: delete it and run `{download_command(dataset_dir)}` to download it again."))
        if known != actual:
            problem = archive_problem(path, source.extract)
            if problem:
                raise BrokenArchive(path, problem, (
                    f"Put a complete copy in its place ({source.filename} from {source.where()}; an interrupted "
                    f"download is the usual cause), then run `{download_command(dataset_dir)}`."))
            if record:
                recorded[path.name] = actual
                write_text(sums, "".join(f"{d}  {n}\n" for n, d in sorted(recorded.items())))
                if known is None:
                    log.warning("%s has no pinned digest; read it whole, then recorded sha256 %s on first use",
                                path.name, actual)
                else:
                    log.warning("%s re-verified whole (--reverify): sha256 %s replaces the recorded %s in %s",
                                path.name, actual, known, sums)
    if record:
        remember_digest(path, actual)
    return actual


# --------------------------------------------------------------------------------------------
# unpacking: member by member, resumable, never twice

def _check_inside(root: Path, member: str) -> None:
    target = (root / member).resolve()
    if root != target and root not in target.parents:
        raise DownloadError(f"archive member {member!r} would be written outside {root}")


def _strip(name: str, top: str) -> str:
    """``top/x/y`` -> ``x/y`` (the archive's own top folder); other names stay as they are."""
    if top and name.strip("/") == top:
        return ""
    return name[len(top) + 1:] if top and name.startswith(top + "/") else name


def _members(archive: Path, top: str) -> list[tuple[str, int, object]]:
    """(name after stripping ``top``, size, handle) of every regular file; directories and the top
    folder itself are left out (they are made as files need them)."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                return [(_strip(i.filename, top), i.file_size, i) for i in zf.infolist()
                        if not i.is_dir() and _strip(i.filename, top)]
        if is_tar(archive):
            with tarfile.open(archive) as tf:
                return [(_strip(m.name, top), m.size, m) for m in tf.getmembers()
                        if not m.isdir() and _strip(m.name, top)]
    except READ_ERRORS as exc:
        raise BrokenArchive(archive, f"its list of members cannot be read ({type(exc).__name__}: {exc})",
                            f"Put a complete copy in its place, then run `{download_command(archive.parent.parent)}`.") from None
    raise BrokenArchive(archive, "it is neither a zip nor a tar archive",
                        f"Put the archive itself in its place, then run `{download_command(archive.parent.parent)}`.")


def _write_member(stream, target: Path, archive: Path, member: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.unpacking")
    try:
        with open(tmp, "wb") as fh:
            shutil.copyfileobj(stream, fh, 1 << 20)
        os.replace(tmp, target)
    except READ_ERRORS as exc:
        tmp.unlink(missing_ok=True)
        raise BrokenArchive(archive, f"member {member!r} cannot be read ({type(exc).__name__}: {exc})",
                            f"What was unpacked before it is kept. Put a complete copy of {archive.name} in its place, "
                            f"then run `{download_command(archive.parent.parent)}`: only what is missing is written.") from None
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno not in NO_SPACE:
            raise
        raise NotEnoughSpace(f"the disk of {target.parent} filled up while unpacking {member!r} of {archive.name}. "
                             f"Free space there (or move resources/raw to a larger disk, --raw-dir), then run "
                             f"`{download_command(archive.parent.parent)}`: what is unpacked is kept.") from None


def _in_place(root: Path, name: str, size: int) -> bool:
    return (root / name).is_file() and (root / name).stat().st_size == size


def unpacked_root(dest: Path, top: str, members: list[tuple[str, int, object]]) -> Path:
    """Where the archive's tree is (or goes): ``dest``, or ``dest/top`` where the archive was unpacked by hand
    keeping its top folder (the preparers read both) and more of its files are there than in ``dest``."""
    if not top:
        return dest
    kept = dest / top
    count = lambda root: sum(_in_place(root, name, size) for name, size, _ in members)  # noqa: E731
    return kept if kept.is_dir() and count(kept) > count(dest) else dest


def extract(archive: Path, dest: Path, top: str = "") -> int:
    """Unpack a zip or tar archive into ``dest``, stripping its top folder ``top`` (or into ``dest/top``
    where a tree unpacked by hand with that folder is already: :func:`unpacked_root`); members already in
    place with their size are skipped, the others are written whole (temporary file, then renamed).
    Refuses members that would land outside ``dest`` (before writing anything) and an unpack the disk
    cannot hold. -> the number of files written."""
    dest = Path(dest).resolve()
    members = _members(archive, top)
    root = unpacked_root(dest, top, members)
    for name, _, _ in members:
        _check_inside(root, name)
    todo = [(name, size, handle) for name, size, handle in members if not _in_place(root, name, size)]
    if not todo:
        return 0
    done = len(members) - len(todo)
    kept = (f"; {done:,} of its files ({size_text(sum(s for _, s, _ in members) - sum(s for _, s, _ in todo))}) "
            f"are already in place under {root} and are kept" if done else "")
    require_space(sum(size for _, size, _ in todo), dest,
                  f"unpacking {archive.name} ({len(todo):,} of {len(members):,} files still to write{kept})")
    root.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for name, _, info in todo:
                try:
                    stream = zf.open(info)
                except READ_ERRORS as exc:
                    raise BrokenArchive(archive, f"member {info.filename!r} cannot be read ({type(exc).__name__}: {exc})",
                                        f"Put a complete copy in its place, then run `{download_command(dest)}`.") from None
                with stream:
                    _write_member(stream, root / name, archive, info.filename)
    else:
        with tarfile.open(archive) as tf:
            for name, _, member in todo:
                try:
                    safe = tarfile.data_filter(member.replace(name=name), str(root))
                except tarfile.FilterError as exc:
                    raise DownloadError(f"{archive}: archive member would be written outside {root} ({exc})") from None
                if safe.isfile():
                    _write_member(tf.extractfile(member), root / name, archive, member.name)
                else:  # links inside the folder
                    tf.extract(safe, root, filter="data")
    return len(todo)


def unpacked_marker(archive: Path) -> Path:
    return archive.with_name(archive.name + UNPACKED_SUFFIX)


def unpack_once(archive: Path, dest: Path, digest: str, top: str = "") -> None:
    """Unpack ``archive`` unless it is marked as completely unpacked (with this digest)."""
    marker = unpacked_marker(archive)
    if marker.exists() and marker.read_text().strip() == digest:
        return
    log.info("unpacking %s", archive.name)
    written = extract(archive, dest, top)
    log.info("%s: %d file(s) written", archive.name, written)
    write_text(marker, digest + "\n")


def is_archive(path: Path) -> bool:
    return zipfile.is_zipfile(path) or is_tar(path)

