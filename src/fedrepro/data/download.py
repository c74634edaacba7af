"""Fetch a dataset's sources into ``resources/raw/<dataset>/`` and verify them.

- Complete or not at all: every :class:`~fedrepro.data.spec.Source` says which files it provides
  (:func:`source_files`); ``.complete`` is written only when the files of every source are there,
  a source placed by hand never stands in for another, and a marker whose files have gone missing
  since is dropped on the next run.
- Resumable: a partial download lives in ``<file>.part`` and continues with an HTTP Range request
  (with ``If-Range``, so a file that changed on the server starts over). Kaggle's API answers with a
  redirect to its storage, PhysioNet serves its files directly; both honour Range, so Kaggle and
  PhysioNet downloads resume like any other.
- Unpacked once: an archive is unpacked member by member, each written whole (temporary file, then
  renamed) and skipped when a file of its size is already in place, so a rerun after an interrupted or
  misplaced unpack writes only what is missing; a fully unpacked archive is marked
  (``downloads/<archive>.unpacked``) and never touched again. An archive's own top folder
  (``Source.top``) is stripped; a tree unpacked by hand is recognised by its contents wherever the
  preparers read it (with or without that top folder, with or without the marker) and only what is
  missing from it is written, into the same tree. Before unpacking, the free disk space is checked
  against what the archive still has to write (the message says what is already in place).
- Verified: every archive is checked against its pinned SHA-256 (or, for unpinned archives, against
  the digest recorded on first use in ``SHA256SUMS``); a mismatch is an error naming the file. A digest
  is recorded on first use only for a file verified whole (:func:`archive_problem`: every zip member
  read and its CRC checked, every tar member read up to the end-of-archive marker, a compressed stream
  read to its end), so an interrupted download placed by hand is refused by name, with nothing
  recorded, and the complete copy put in its place is accepted. ``--reverify`` re-checks an archive
  whose recorded digest no longer matches (a copy replaced on purpose) and records its new digest if
  it is whole. A digest, once computed, is kept with the file's size and modification time
  (``downloads/.verified.json``), so a 180 GB archive is not hashed again on every run.
- Complete means complete: before ``.complete`` is written, the dataset's preparer check runs
  (:func:`fedrepro.data.prepare.check_listed`): every label table readable with its columns, every
  part and every image the tables list in place.
- Dataverse files (Harvard Dataverse, ...) are found by name in the dataset's file listing
  (Native API) and also checked against the checksum the server publishes for them.
- Credentials (Kaggle token, PhysioNet login) are read from their standard places or the
  environment, passed only to the HTTP client, and never logged or written anywhere.
- Missing credentials, unaccepted licences, by-request datasets, archives only linked from a
  landing page, and servers that answer with a web page instead of the archive end in
  :class:`ManualStepRequired` (after every source that can be fetched has been), whose message names
  the files, where they come from, where to place them and the command to run next.
- :func:`check_dataset` (``fedrepro download <dataset> --check``) reports on a placed tree without
  changing anything.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import logging
import lzma
import netrc
import os
import shutil
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ..io import NO_SPACE, read_json, sha256_file, write_json, write_text
from .spec import DatasetSpec, Source

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
CHECKSUM_FILE = "SHA256SUMS"
VERIFIED_CACHE = ".verified.json"
UNPACKED_SUFFIX = ".unpacked"
KAGGLE_API = "https://www.kaggle.com/api/v1"
PHYSIONET_FILES = "https://physionet.org/files"


class DownloadError(RuntimeError):
    pass


class ChecksumMismatch(DownloadError):
    def __init__(self, path: Path, expected: str, actual: str, where: str, algorithm: str = "sha256",
                 advice: str | None = None):
        advice = advice or ("The file is corrupt, truncated or a different release. Delete it and download again; "
                            "if the new release is intended, update the pinned digest.")
        super().__init__(f"checksum mismatch for {path}: expected {algorithm} {expected} ({where}), got {actual}. {advice}")
        self.path, self.expected, self.actual = path, expected, actual


class BrokenArchive(DownloadError):
    """An archive (or compressed file) that is not whole: no digest is recorded for it, nothing unpacked."""

    def __init__(self, path: Path, problem: str, advice: str):
        super().__init__(f"{path} is not whole: {problem}. Nothing was recorded for it and nothing unpacked. {advice}")
        self.path, self.problem = path, problem


class IncompleteDataset(DownloadError):
    """Every source is in place, but a label table or a file it lists is not: not marked complete."""


class ManualStepRequired(DownloadError):
    """Something only the user can do: get credentials, accept a licence, place files by hand.
    ``steps``: (reason, what to do) of each source concerned."""

    def __init__(self, message: str, steps: list[tuple[str, str]] = ()):
        super().__init__(message)
        self.steps = list(steps)


class NotEnoughSpace(DownloadError):
    """The disk cannot hold what a download or an unpack would write."""


@dataclass
class Credentials:
    username: str
    secret: str

    def __repr__(self) -> str:  # never let a secret reach a log line or a traceback
        return f"Credentials(username={self.username!r}, secret=<hidden>)"


# --------------------------------------------------------------------------------------------
# credentials

def kaggle_credentials(env: dict | None = None, home: Path | None = None) -> Credentials | None:
    """``KAGGLE_USERNAME``/``KAGGLE_KEY``, else ``$KAGGLE_CONFIG_DIR/kaggle.json`` or ``~/.kaggle/kaggle.json``."""
    env = os.environ if env is None else env
    if env.get("KAGGLE_USERNAME") and env.get("KAGGLE_KEY"):
        return Credentials(env["KAGGLE_USERNAME"], env["KAGGLE_KEY"])
    config_dir = Path(env["KAGGLE_CONFIG_DIR"]) if env.get("KAGGLE_CONFIG_DIR") else (home or Path.home()) / ".kaggle"
    token = config_dir / "kaggle.json"
    if token.is_file():
        data = json.loads(token.read_text())
        if data.get("username") and data.get("key"):
            return Credentials(data["username"], data["key"])
    return None


def physionet_credentials(env: dict | None = None, home: Path | None = None) -> Credentials | None:
    """``PHYSIONET_USERNAME``/``PHYSIONET_PASSWORD``, else the ``physionet.org`` entry of ``~/.netrc``."""
    env = os.environ if env is None else env
    if env.get("PHYSIONET_USERNAME") and env.get("PHYSIONET_PASSWORD"):
        return Credentials(env["PHYSIONET_USERNAME"], env["PHYSIONET_PASSWORD"])
    netrc_path = (home or Path.home()) / ".netrc"
    if netrc_path.is_file():
        entry = netrc.netrc(netrc_path).authenticators("physionet.org")
        if entry and entry[0] and entry[2]:
            return Credentials(entry[0], entry[2])
    return None


# --------------------------------------------------------------------------------------------
# disk space

def free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def size_text(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def require_space(needed: int, where: Path, what: str) -> None:
    free = free_bytes(where)
    if needed > free:
        raise NotEnoughSpace(
            f"{what} needs {size_text(needed)} ({needed:,} bytes) on the disk of {where}, which has "
            f"{size_text(free)} ({free:,} bytes) free. Free space there, or move resources/raw to a larger "
            f"disk (--raw-dir), then run again: what is already downloaded or unpacked is kept.")


# --------------------------------------------------------------------------------------------
# HTTP with resume

def http_download(url: str, dest: Path, auth: Credentials | None = None, chunk: int = 1 << 20,
                  session=None, progress: bool = True) -> Path:
    """Download ``url`` to ``dest``, continuing a previous partial download in ``dest.part``.

    The validator of the first response (ETag or Last-Modified) is kept in ``dest.part.json`` and
    sent as ``If-Range``: a server whose file changed since answers with the whole new file."""
    import requests
    from tqdm import tqdm

    session = session or requests.Session()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    validator_file = part.with_name(part.name + ".json")
    offset = part.stat().st_size if part.exists() else 0
    headers = {}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        validator = read_json(validator_file).get("validator") if validator_file.exists() else None
        if validator:
            headers["If-Range"] = validator
    basic = (auth.username, auth.secret) if auth else None
    with session.get(url, headers=headers, auth=basic, stream=True, timeout=60, allow_redirects=True) as resp:
        if resp.status_code in (401, 403):
            raise PermissionError(resp.status_code)
        if resp.status_code == 416:  # the part file is already complete
            part.rename(dest)
            validator_file.unlink(missing_ok=True)
            return dest
        resp.raise_for_status()
        if offset and resp.status_code != 206:  # server ignored the range, or the file changed: start over
            offset = 0
        validator = resp.headers.get("ETag") or resp.headers.get("Last-Modified")
        if validator and not offset:
            write_json(validator_file, {"url_path": urlsplit(url).path, "validator": validator})
        total = resp.headers.get("Content-Length")
        total = int(total) + offset if total else None
        if total:
            require_space(total - offset, dest.parent, f"downloading {dest.name}")
        with open(part, "ab" if offset else "wb") as fh, tqdm(
            total=total, initial=offset, unit="B", unit_scale=True, desc=dest.name, disable=not progress
        ) as bar:
            for block in resp.iter_content(chunk):
                fh.write(block)
                bar.update(len(block))
    part.rename(dest)
    validator_file.unlink(missing_ok=True)
    return dest


# --------------------------------------------------------------------------------------------
# verification

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


def download_command(dataset_dir: Path, *flags: str) -> str:
    return " ".join((f"fedrepro download {Path(dataset_dir).name} --raw-dir {Path(dataset_dir).parent}", *flags))


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


# --------------------------------------------------------------------------------------------
# Dataverse (Native API: the dataset's file listing, then /api/access/datafile/<id>)

DATAVERSE_HASHES = {"MD5": "md5", "SHA-1": "sha1", "SHA-256": "sha256", "SHA-512": "sha512"}


def dataverse_file(page_url: str, filename: str, session=None) -> tuple[str, dict]:
    """The download URL and file record of ``filename`` in the Dataverse dataset shown at ``page_url``
    (``https://<server>/dataset.xhtml?persistentId=doi:...``). A file matches by its name, its
    original name (tabular files are ingested as ``.tab``), or its name without extension."""
    import requests

    parts = urlsplit(page_url)
    pid = parse_qs(parts.query).get("persistentId", [""])[0]
    if not pid:
        raise DownloadError(f"{page_url!r} is not a Dataverse dataset page (it has no persistentId=...)")
    base = f"{parts.scheme}://{parts.netloc}"
    session = session or requests.Session()
    resp = session.get(f"{base}/api/datasets/:persistentId/versions/:latest-published/files",
                       params={"persistentId": pid}, timeout=60)
    if resp.status_code in (401, 403):
        raise PermissionError(resp.status_code)
    resp.raise_for_status()
    records = [entry.get("dataFile", {}) | {"label": entry.get("label", "")} for entry in resp.json().get("data", [])]

    def names(record):
        return {n for n in (record.get("label"), record.get("filename"), record.get("originalFileName")) if n}

    exact = [r for r in records if filename in names(r)]
    loose = [r for r in records if Path(filename).stem in {Path(n).stem for n in names(r)}]
    found = exact or loose
    if len(found) != 1:
        listing = sorted(n for r in records for n in names(r))
        raise DownloadError(f"{pid} lists {len(found)} files matching {filename!r} (need exactly one); files: {listing}")
    record = found[0]
    original = "?format=original" if record.get("tabularData") else ""
    return f"{base}/api/access/datafile/{record['id']}{original}", record


def verify_published_checksum(path: Path, record: dict) -> None:
    """Check a downloaded Dataverse file against the checksum the server lists for it. Ingested
    tabular files are skipped: the listed checksum belongs to the upload, the bytes served for
    ``format=original`` are not guaranteed to be identical."""
    checksum = record.get("checksum") or ({"type": "MD5", "value": record["md5"]} if record.get("md5") else None)
    if not checksum or record.get("tabularData") or checksum.get("type") not in DATAVERSE_HASHES:
        return
    algorithm = DATAVERSE_HASHES[checksum["type"]]
    digest = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != checksum["value"].lower():
        raise ChecksumMismatch(path, checksum["value"], digest.hexdigest(), "published by the Dataverse server", algorithm)


# --------------------------------------------------------------------------------------------
# what a source provides

def source_files(spec: DatasetSpec, source: Source) -> tuple[str, ...]:
    """The paths (relative to the dataset folder; globs allowed, ``a|b`` = either) whose presence
    shows that ``source`` is in place: its ``provides``; for the only source of a dataset, the
    dataset's ``expected_files``; for a file that is not unpacked, the file itself (in ``downloads/``
    or anywhere in the dataset folder)."""
    if source.provides:
        return source.provides
    if len(spec.sources) == 1 and spec.expected_files:
        return spec.expected_files
    if source.filename and not source.extract:
        return (f"**/{source.filename}",)
    return ()  # declares nothing: its archive, downloaded and unpacked, is the only evidence


def _present(dataset_dir: Path, pattern: str, top: str = "") -> bool:
    """``pattern`` (``a|b``: either) is a path relative to the dataset dir or a glob (``**/Train``); a
    source's archive top folder ``top`` is accepted above it (unpacked by hand, folder kept)."""
    for alternative in pattern.split("|"):
        for candidate in (alternative, f"{top}/{alternative}") if top else (alternative,):
            if any(c in candidate for c in "*?["):
                if next(iter(dataset_dir.glob(candidate)), None) is not None:
                    return True
            elif (dataset_dir / candidate).exists():
                return True
    return False


def missing_files(spec: DatasetSpec, source: Source, dataset_dir: Path) -> list[str]:
    return [p for p in source_files(spec, source) if not _present(dataset_dir, p, source.top)]


def placed_by_hand(spec: DatasetSpec, dataset_dir: Path) -> bool:
    """Every source's files are in the dataset folder (however they got there)."""
    return all(not missing_files(spec, s, dataset_dir) for s in spec.sources)


def _archive(source: Source, dataset_dir: Path) -> Path | None:
    return dataset_dir / "downloads" / source.filename if source.filename else None


def source_done(spec: DatasetSpec, source: Source, dataset_dir: Path, reverify: bool = False) -> bool:
    """Its files are there, and if its archive is in ``downloads/`` (so it was unpacked here), that
    archive (still the verified one) was unpacked completely: a partial unpack leaves the folders but
    not every file."""
    if missing_files(spec, source, dataset_dir):
        return False
    archive = _archive(source, dataset_dir)
    if archive is None or not archive.exists():
        return bool(source_files(spec, source))  # placed by hand, if it says what that means
    try:
        digest = verify_archive(archive, source, dataset_dir, reverify=reverify)  # not hashed again unless it changed
    except BrokenArchive as error:
        if not source_files(spec, source):
            raise
        raise BrokenArchive(archive, error.problem, (
            f"Its files are in place already (unpacked by hand?): move {archive.name} out of {archive.parent} and they "
            f"are taken as they are, or put a complete copy in its place; then run `{download_command(dataset_dir)}`."
        )) from None
    marker = unpacked_marker(archive)
    return not source.extract or (marker.exists() and marker.read_text().strip() == digest)


# --------------------------------------------------------------------------------------------
# what to do by hand

def next_command(spec: DatasetSpec, dataset_dir: Path) -> str:
    return f"fedrepro download {spec.name} --raw-dir {dataset_dir.parent}"


def manual_step(spec: DatasetSpec, source: Source, dataset_dir: Path) -> str:
    """What to do for one source: which files, from where, where to put them."""
    files = ", ".join(" or ".join(p.split("|")) for p in source_files(spec, source))
    lines = [f"files: {files}" + (f" (the archive's top folder {source.top}/ may stay or go)" if source.top else ""),
             f"from: {source.where()}" + (f"; {source.note}" if source.note else "")]
    if source.filename:
        what = "it is verified and unpacked" if source.extract else "it is verified"
        lines.append(f"place: put {source.filename} into {dataset_dir / 'downloads'}/ ({what}), "
                     f"or put the files themselves under {dataset_dir}/ as listed above")
    else:
        lines.append(f"place: under {dataset_dir}/ so that the files above are there")
    return "\n".join(lines)


def manual_required(spec: DatasetSpec, dataset_dir: Path, steps: list[tuple[str, str]]) -> ManualStepRequired:
    """One message for every source that needs a hand: the dataset, each step, the layout, the next command."""
    others = len(spec.sources) - len(steps)
    lines = [f"{spec.name} ({spec.title}): {len(steps)} of {len(spec.sources)} source(s) need a step only you can do"
             + (f" (the other {others} are in place)" if others else "") + ":"]
    for i, (reason, step) in enumerate(steps, 1):
        said = [r for r, _ in steps[:i - 1]]
        lines.append(f"{i}. " + ("the same" if reason in said else reason))
        lines += [f"   {line}" for line in step.splitlines()]
    if spec.homepage:
        lines.append(f"dataset page: {spec.homepage}")
    lines.append(f"layout of the whole dataset: {spec.layout}")
    lines.append(f"then run: {next_command(spec, dataset_dir)} (or run Snakemake again)")
    return ManualStepRequired("\n".join(lines), steps)


def _kaggle_token_reason(source: Source) -> str:
    rules = (f"; this is a competition: also accept its rules at https://www.kaggle.com/competitions/"
             f"{source.ref.split('/')[0]}/rules with the same account" if source.kind == "kaggle_competition" else "")
    return ("no Kaggle API token (set KAGGLE_USERNAME and KAGGLE_KEY, or save kaggle.json from "
            "https://www.kaggle.com/settings -> API -> Create New Token to ~/.kaggle/kaggle.json)" + rules)


def _kaggle_url(source: Source) -> str:
    if source.kind == "kaggle_dataset":
        version = f"?datasetVersionNumber={source.version}" if source.version else ""
        return f"{KAGGLE_API}/datasets/download/{source.ref}{version}"
    competition, _, member = source.ref.partition("/")
    if member:
        return f"{KAGGLE_API}/competitions/data/download/{competition}/{member}"
    return f"{KAGGLE_API}/competitions/data/download-all/{competition}"


# --------------------------------------------------------------------------------------------
# per-source fetchers

def fetch_source(spec: DatasetSpec, source: Source, dataset_dir: Path, env: dict | None = None,
                 reverify: bool = False) -> Path | None:
    """Make the source's archive present and verified under ``dataset_dir/downloads``; returns its path."""
    target = _archive(source, dataset_dir)

    def manual(reason: str) -> ManualStepRequired:
        return manual_required(spec, dataset_dir, [(reason, manual_step(spec, source, dataset_dir))])

    if target is not None and target.exists():  # downloaded earlier or placed by hand
        verify_archive(target, source, dataset_dir, reverify=reverify)
        return target

    if source.kind == "url":
        _http_or_manual(spec, source, source.ref, target, None, dataset_dir, "the download failed")
    elif source.kind in ("kaggle_dataset", "kaggle_competition"):
        creds = kaggle_credentials(env)
        if creds is None:
            raise manual(_kaggle_token_reason(source))
        if source.kind == "kaggle_dataset":
            denied = "Kaggle refused the download (check the token; some datasets need their licence accepted on the dataset page)"
        else:
            denied = (f"Kaggle refused the download: accept the competition rules at https://www.kaggle.com/"
                      f"competitions/{source.ref.split('/')[0]}/rules with the account of your token")
        _http_or_manual(spec, source, _kaggle_url(source), target, creds, dataset_dir, denied)
    elif source.kind == "physionet":
        creds = physionet_credentials(env)
        if creds is None:
            raise manual("no PhysioNet login (credentialed access: complete the CITI training and sign the data use "
                         "agreement on the project page, then set PHYSIONET_USERNAME/PHYSIONET_PASSWORD or add a "
                         "'machine physionet.org login <user> password <pass>' line to ~/.netrc)")
        _http_or_manual(spec, source, f"{PHYSIONET_FILES}/{source.ref}", target, creds, dataset_dir,
                        "PhysioNet refused the login: check the account has signed this project's data use agreement")
    elif source.kind == "dataverse":
        try:
            url, record = dataverse_file(source.ref, source.filename)
        except PermissionError:
            raise manual(f"the Dataverse server refused the file listing (accept the dataset's terms at {source.ref})") from None
        except OSError as exc:
            raise DownloadError(f"{spec.name}: listing the files of {source.ref} failed ({type(exc).__name__}); run "
                                f"`{next_command(spec, dataset_dir)}` again, or place the file by hand:\n"
                                f"{manual_step(spec, source, dataset_dir)}") from None
        _http_or_manual(spec, source, url, target, None, dataset_dir,
                        f"the Dataverse server refused the download (accept the dataset's terms at {source.ref})")
        _refuse_web_page(spec, source, target, dataset_dir)
        try:
            verify_published_checksum(target, record)
        except ChecksumMismatch:
            target.unlink()  # else the next run would take the bad file as a first use
            raise
    elif source.kind == "request":
        raise manual("credentialed access, and no single archive to download: placed by hand" if spec.access == "credentialed"
                     else "access is by request or registration, so the files are placed by hand")
    elif source.kind == "manual":
        raise manual("the archive has no stable direct link, so it is placed by hand")
    else:
        raise DownloadError(f"source kind {source.kind!r} is materialised by fedrepro.data.demo, not downloaded")
    if source.kind != "dataverse":
        _refuse_web_page(spec, source, target, dataset_dir)
    try:
        verify_archive(target, source, dataset_dir)
    except BrokenArchive as error:    # what this run downloaded: set aside (not deleted), so the next run fetches it anew
        kept = target.with_name(target.name + ".broken")
        os.replace(target, kept)
        raise BrokenArchive(kept, error.problem, f"The download was set aside as {kept.name} (delete it when you like); "
                                                 f"run `{download_command(dataset_dir)}` to download it again.") from None
    return target


def _refuse_web_page(spec: DatasetSpec, source: Source, target: Path, dataset_dir: Path) -> None:
    """A server that answers with a login, licence or confirmation page instead of the archive
    (Google Drive does for large files) must not get its page recorded as the archive's digest."""
    if source.extract and target.exists() and not is_archive(target):
        with open(target, "rb") as fh:
            head = fh.read(64).lstrip().lower()
        what = "a web page" if head.startswith((b"<!doctype", b"<html")) else "a file that is neither zip nor tar"
        target.unlink()
        reason = (f"the server sent {what} instead of the archive {source.filename} "
                  f"(a login, licence-acceptance or download-confirmation page?)")
        raise manual_required(spec, dataset_dir, [(reason, manual_step(spec, source, dataset_dir))])


def _http_or_manual(spec, source, url, target, creds, dataset_dir, denied_reason) -> None:
    try:
        http_download(url, target, auth=creds)
    except PermissionError:
        raise manual_required(spec, dataset_dir, [(denied_reason, manual_step(spec, source, dataset_dir))]) from None
    except OSError as exc:  # network down, DNS, connection reset: resumable later
        raise DownloadError(
            f"downloading {spec.name} failed ({type(exc).__name__}); run `{next_command(spec, dataset_dir)}` again to "
            f"resume from {target}.part, or place the file by hand:\n{manual_step(spec, source, dataset_dir)}"
        ) from None


# --------------------------------------------------------------------------------------------
# entry points

def download_dataset(spec: DatasetSpec, raw_root: Path, env: dict | None = None, reverify: bool = False) -> Path:
    """Fetch, verify and unpack every source, check every listed file (:func:`check_listed_files`); write
    the completion marker last. Idempotent: a source whose files are in place is skipped; manual steps are
    collected and raised together after every source that can be fetched has been. ``reverify``: archives
    whose recorded digest no longer matches are checked whole again and their new digest recorded."""
    from . import demo, folder

    dataset_dir = Path(raw_root) / spec.name
    marker = dataset_dir / COMPLETE_MARKER
    if folder.is_folder(spec):      # the user's own files: checked and linked in, every time (the CSV may be new)
        folder.link_folder(spec, dataset_dir)
        write_text(marker, "verified\n")
        return dataset_dir
    if marker.exists() and not reverify:
        if spec.materialise or spec.depends_on or placed_by_hand(spec, dataset_dir):
            return dataset_dir
        log.warning("%s: %s is there but files are missing; downloading again what is missing", spec.name, marker)
        marker.unlink()
    dataset_dir.mkdir(parents=True, exist_ok=True)
    if spec.materialise:
        demo.materialise(spec, dataset_dir)
    elif not spec.depends_on:  # derived datasets have no files of their own; their preparer reads other manifests
        steps = []
        for source in spec.sources:
            if source_done(spec, source, dataset_dir, reverify):
                log.info("%s: %s is in place", spec.name, source.filename or source.ref)
                continue
            try:
                archive = fetch_source(spec, source, dataset_dir, env, reverify)
            except ManualStepRequired as step:
                steps += step.steps
                continue
            if archive is not None and source.extract:
                if missing_files(spec, source, dataset_dir):  # files went missing since an unpack: redo what is missing
                    unpacked_marker(archive).unlink(missing_ok=True)
                unpack_once(archive, dataset_dir, archive_digest(archive), source.top)
        if steps:
            raise manual_required(spec, dataset_dir, steps)
        missing = {s.filename or s.ref: missing_files(spec, s, dataset_dir) for s in spec.sources}
        missing = {k: v for k, v in missing.items() if v}
        if missing:
            raise IncompleteDataset(
                f"{spec.name}: after unpacking, files are missing in {dataset_dir}: {missing}; expected layout: "
                f"{spec.layout}. Nothing is marked complete: is an archive of another release there? Put the files "
                f"in place, then run `{next_command(spec, dataset_dir)}`")
        check_listed_files(spec, dataset_dir)
    write_text(marker, "verified\n")
    return dataset_dir


def check_listed_files(spec: DatasetSpec, dataset_dir: Path) -> None:
    """The dataset's preparer check (:func:`fedrepro.data.prepare.check_listed`): its label tables readable
    with their columns, every part and every image they list in place; else :class:`IncompleteDataset`."""
    from .manifest import ManifestError
    from .prepare import check_listed

    try:
        check_listed(spec, dataset_dir.parent)
    except (ManifestError, FileNotFoundError) as error:
        raise IncompleteDataset(f"{spec.name}: {error}\nNothing is marked complete; once that is fixed, run "
                                f"`{next_command(spec, dataset_dir)}` (or Snakemake again).") from None


def check_dataset(spec: DatasetSpec, raw_root: Path) -> tuple[bool, list[str]]:
    """Is the dataset in place? -> (complete, report lines), changing nothing: archives are checked
    against their pinned or recorded digests (an unrecorded one is checked whole; none is recorded), each
    source's files looked for, and, when they are all there, every file the label tables list."""
    from . import folder

    dataset_dir = Path(raw_root) / spec.name
    if spec.depends_on:
        return True, [f"derived from {', '.join(spec.depends_on)} (check those)"]
    if folder.is_folder(spec):
        folder.check_folder(spec, f"dataset {spec.name!r}")
        return (dataset_dir / COMPLETE_MARKER).exists(), [f"your folder {spec.options['images']} and labels "
                                                          f"{spec.options['labels']}: every image listed reads"]
    if spec.materialise:
        return (dataset_dir / COMPLETE_MARKER).exists(), ["offline demo data, built by `fedrepro download`"]
    ok, lines = True, []
    for source in spec.sources:
        name = source.filename or source.ref
        archive = _archive(source, dataset_dir)
        if archive is not None and archive.exists():
            try:
                digest = verify_archive(archive, source, dataset_dir, record=False)
                pinned = source.sha256 or recorded_checksums(dataset_dir).get(archive.name)
                lines.append(f"{name}: archive {'verified' if pinned else 'whole, no digest recorded yet'} "
                             f"(sha256 {digest[:12]}...)")
            except (ChecksumMismatch, BrokenArchive) as err:
                ok = False
                lines.append(f"{name}: {err}")
            if source.extract and not unpacked_marker(archive).exists():
                lines.append(f"{name}: not marked as completely unpacked ({next_command(spec, dataset_dir)} finishes it)")
                ok = False
        missing = missing_files(spec, source, dataset_dir)
        if missing:
            ok = False
            lines.append(f"{name}: MISSING {missing} under {dataset_dir} (from {source.where()})")
        else:
            lines.append(f"{name}: files in place")
    if ok:
        try:
            check_listed_files(spec, dataset_dir)
            lines.append("label tables and every file they list: in place")
        except IncompleteDataset as err:
            ok = False
            lines.append(str(err).split("\nNothing is marked complete")[0])
    if ok and not (dataset_dir / COMPLETE_MARKER).exists():
        lines.append(f"complete but not marked: {next_command(spec, dataset_dir)} marks it")
    return ok, lines


def remove_partial(dataset_dir: Path) -> None:
    """Used by tests and ``fedrepro download --force``: drop everything but finished archives."""
    for item in dataset_dir.iterdir():
        if item.name != "downloads":
            shutil.rmtree(item) if item.is_dir() else item.unlink()
