"""Fetch a dataset's sources into ``resources/raw/<dataset>/`` and verify them.

- Resumable: a partial download lives in ``<file>.part`` and continues with an HTTP Range request.
- Verified: every archive is checked against its pinned SHA-256 (or, for unpinned Kaggle archives,
  against the digest recorded on first use in ``SHA256SUMS``); a mismatch is an error naming the file.
- Dataverse files (Harvard Dataverse, ...) are found by name in the dataset's file listing
  (Native API) and also checked against the checksum the server publishes for them.
- Credentials (Kaggle token, PhysioNet login) are read from their standard places or the
  environment, passed only to the HTTP client, and never logged or written anywhere.
- Missing credentials, unaccepted licences, by-request datasets, archives only linked from a
  landing page, and servers that answer with a web page instead of the archive end in
  :class:`ManualStepRequired`, whose message says exactly what to do and where to place files by hand.
"""

from __future__ import annotations

import hashlib
import json
import logging
import netrc
import os
import shutil
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ..io import sha256_file, write_text
from .spec import DatasetSpec, Source

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
CHECKSUM_FILE = "SHA256SUMS"
KAGGLE_API = "https://www.kaggle.com/api/v1"


class DownloadError(RuntimeError):
    pass


class ChecksumMismatch(DownloadError):
    def __init__(self, path: Path, expected: str, actual: str, where: str, algorithm: str = "sha256"):
        super().__init__(
            f"checksum mismatch for {path}: expected {algorithm} {expected} ({where}), got {actual}. "
            f"The file is corrupt, truncated or a different release. Delete it and download again; "
            f"if the new release is intended, update the pinned digest."
        )
        self.path, self.expected, self.actual = path, expected, actual


class ManualStepRequired(DownloadError):
    """Something only the user can do: get credentials, accept a licence, place files by hand."""


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
# HTTP with resume

def http_download(url: str, dest: Path, auth: Credentials | None = None, chunk: int = 1 << 20,
                  session=None, progress: bool = True) -> Path:
    """Download ``url`` to ``dest``, continuing a previous partial download in ``dest.part``."""
    import requests
    from tqdm import tqdm

    session = session or requests.Session()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    basic = (auth.username, auth.secret) if auth else None
    with session.get(url, headers=headers, auth=basic, stream=True, timeout=60, allow_redirects=True) as resp:
        if resp.status_code in (401, 403):
            raise PermissionError(resp.status_code)
        if resp.status_code == 416:  # the part file is already complete
            part.rename(dest)
            return dest
        resp.raise_for_status()
        if offset and resp.status_code != 206:  # server ignored the range: start over
            offset = 0
        total = resp.headers.get("Content-Length")
        total = int(total) + offset if total else None
        with open(part, "ab" if offset else "wb") as fh, tqdm(
            total=total, initial=offset, unit="B", unit_scale=True, desc=dest.name, disable=not progress
        ) as bar:
            for block in resp.iter_content(chunk):
                fh.write(block)
                bar.update(len(block))
    part.rename(dest)
    return dest


# --------------------------------------------------------------------------------------------
# verification and extraction

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


def verify_archive(path: Path, source: Source, dataset_dir: Path) -> str:
    """Check ``path`` against the pinned digest, or the one recorded on first use; record it if new."""
    actual = sha256_file(path)
    if source.sha256:
        if actual != source.sha256:
            raise ChecksumMismatch(path, source.sha256, actual, "pinned in the dataset registry")
        return actual
    recorded = recorded_checksums(dataset_dir)
    if path.name in recorded:
        if recorded[path.name] != actual:
            raise ChecksumMismatch(path, recorded[path.name], actual, f"recorded on first use in {dataset_dir / CHECKSUM_FILE}")
        return actual
    recorded[path.name] = actual
    write_text(dataset_dir / CHECKSUM_FILE, "".join(f"{d}  {n}\n" for n, d in sorted(recorded.items())))
    log.warning("%s has no pinned digest; recorded sha256 %s on first use", path.name, actual)
    return actual


def extract(archive: Path, dest: Path) -> None:
    """Unpack zip or tar archives, refusing members that would land outside ``dest``."""
    dest = dest.resolve()
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                _check_inside(dest, member)
            zf.extractall(dest)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            try:
                tf.extractall(dest, filter="data")  # 'data' rejects absolute paths, links out, devices
            except tarfile.FilterError as exc:
                raise DownloadError(f"{archive}: archive member would be written outside {dest} ({exc})") from None
    else:
        raise DownloadError(f"{archive} is neither a zip nor a tar archive")


def _check_inside(root: Path, member: str) -> None:
    target = (root / member).resolve()
    if root != target and root not in target.parents:
        raise DownloadError(f"archive member {member!r} would be written outside {root}")


def is_archive(path: Path) -> bool:
    return zipfile.is_zipfile(path) or tarfile.is_tarfile(path)


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
# per-source fetchers

def manual_instructions(spec: DatasetSpec, dataset_dir: Path, reason: str) -> str:
    archives = [s.filename for s in spec.sources if s.filename]
    lines = [
        f"dataset {spec.name!r} ({spec.title}) cannot be downloaded automatically: {reason}",
        f"  homepage: {spec.homepage or '(see the registry entry)'}",
        "  Either fix the above and run the download again, or place the data by hand:",
    ]
    if archives:
        lines.append(f"  - put the archive(s) {archives} into {dataset_dir / 'downloads'}/ (they are verified and unpacked), or")
    lines.append(f"  - unpack the data into {dataset_dir}/ so that it reads: {spec.layout}")
    if spec.expected_files:
        lines.append(f"    (checked by the presence of {list(spec.expected_files)})")
    lines.append("  then run the pipeline again.")
    return "\n".join(lines)


def fetch_source(spec: DatasetSpec, source: Source, dataset_dir: Path, env: dict | None = None) -> Path | None:
    """Make the source's archive present and verified under ``dataset_dir/downloads``; returns its path."""
    downloads = dataset_dir / "downloads"
    target = downloads / source.filename if source.filename else None
    if target is not None and target.exists():  # downloaded earlier or placed by hand
        verify_archive(target, source, dataset_dir)
        return target

    if source.kind == "url":
        _http_or_manual(spec, source.ref, target, None, dataset_dir, "the download failed")
    elif source.kind in ("kaggle_dataset", "kaggle_competition"):
        creds = kaggle_credentials(env)
        if creds is None:
            rules = (f"; this is a competition: also accept its rules at https://www.kaggle.com/competitions/"
                     f"{source.ref}/rules with the same account" if source.kind == "kaggle_competition" else "")
            raise ManualStepRequired(manual_instructions(
                spec, dataset_dir,
                "no Kaggle API token (set KAGGLE_USERNAME and KAGGLE_KEY, or save kaggle.json from "
                "https://www.kaggle.com/settings -> API -> Create New Token to ~/.kaggle/kaggle.json)" + rules))
        if source.kind == "kaggle_dataset":
            url = f"{KAGGLE_API}/datasets/download/{source.ref}"
            denied = "Kaggle refused the download (check the token; some datasets need their licence accepted on the dataset page)"
        else:
            url = f"{KAGGLE_API}/competitions/data/download-all/{source.ref}"
            denied = (f"Kaggle refused the download: accept the competition rules at "
                      f"https://www.kaggle.com/competitions/{source.ref}/rules with the account of your token")
        _http_or_manual(spec, url, target, creds, dataset_dir, denied)
    elif source.kind == "physionet":
        creds = physionet_credentials(env)
        if creds is None:
            raise ManualStepRequired(manual_instructions(
                spec, dataset_dir,
                "no PhysioNet login (credentialed access: complete the CITI training and sign the data use "
                "agreement on the project page, then set PHYSIONET_USERNAME/PHYSIONET_PASSWORD or add a "
                "'machine physionet.org login <user> password <pass>' line to ~/.netrc)"))
        url = f"https://physionet.org/files/{source.ref}"
        _http_or_manual(spec, url, target, creds, dataset_dir,
                        "PhysioNet refused the login: check the account has signed this project's data use agreement")
    elif source.kind == "dataverse":
        try:
            url, record = dataverse_file(source.ref, source.filename)
        except PermissionError:
            raise ManualStepRequired(manual_instructions(
                spec, dataset_dir, f"the Dataverse server refused the file listing (accept the dataset's terms at {source.ref})")) from None
        except OSError as exc:
            raise DownloadError(f"listing the files of {source.ref} failed ({type(exc).__name__}); run again, or see the "
                                f"manual instructions:\n{manual_instructions(spec, dataset_dir, 'network error')}") from None
        _http_or_manual(spec, url, target, None, dataset_dir,
                        f"the Dataverse server refused the download (accept the dataset's terms at {source.ref})")
        _refuse_web_page(spec, source, target, dataset_dir)
        try:
            verify_published_checksum(target, record)
        except ChecksumMismatch:
            target.unlink()  # else the next run would take the bad file as a first use
            raise
    elif source.kind == "request":
        raise ManualStepRequired(manual_instructions(spec, dataset_dir, f"access is by request ({source.note or spec.homepage})"))
    elif source.kind == "manual":
        raise ManualStepRequired(manual_instructions(
            spec, dataset_dir, f"the archive has no stable direct link; download it from {source.ref}"
                               + (f" ({source.note})" if source.note else "")))
    else:
        raise DownloadError(f"source kind {source.kind!r} is materialised by fedrepro.data.demo, not downloaded")
    if source.kind != "dataverse":
        _refuse_web_page(spec, source, target, dataset_dir)
    verify_archive(target, source, dataset_dir)
    return target


def _refuse_web_page(spec: DatasetSpec, source: Source, target: Path, dataset_dir: Path) -> None:
    """A server that answers with a login, licence or confirmation page instead of the archive
    (Google Drive does for large files) must not get its page recorded as the archive's digest."""
    if source.extract and target.exists() and not is_archive(target):
        with open(target, "rb") as fh:
            head = fh.read(64).lstrip().lower()
        what = "a web page" if head.startswith((b"<!doctype", b"<html")) else "a file that is neither zip nor tar"
        target.unlink()
        raise ManualStepRequired(manual_instructions(
            spec, dataset_dir, f"the server sent {what} instead of the archive {source.filename} "
                               f"(a login, licence-acceptance or download-confirmation page?)"))


def _http_or_manual(spec, url, target, creds, dataset_dir, denied_reason) -> None:
    try:
        http_download(url, target, auth=creds)
    except PermissionError:
        raise ManualStepRequired(manual_instructions(spec, dataset_dir, denied_reason)) from None
    except OSError as exc:  # network down, DNS, connection reset: resumable later
        raise DownloadError(
            f"downloading {spec.name} failed ({type(exc).__name__}); run again to resume from "
            f"{target}.part, or see the manual instructions:\n{manual_instructions(spec, dataset_dir, 'network error')}"
        ) from None


# --------------------------------------------------------------------------------------------
# entry point

def _present(dataset_dir: Path, pattern: str) -> bool:
    """``pattern`` is a path relative to the dataset dir, or a glob (``**/Train``) for archives
    whose top-level folder is not fixed."""
    if any(c in pattern for c in "*?["):
        return next(iter(dataset_dir.glob(pattern)), None) is not None
    return (dataset_dir / pattern).exists()


def placed_by_hand(spec: DatasetSpec, dataset_dir: Path) -> bool:
    return bool(spec.expected_files) and all(_present(dataset_dir, f) for f in spec.expected_files)


def download_dataset(spec: DatasetSpec, raw_root: Path, env: dict | None = None) -> Path:
    """Fetch, verify and unpack every source; write the completion marker last. Idempotent."""
    from . import demo

    dataset_dir = Path(raw_root) / spec.name
    marker = dataset_dir / COMPLETE_MARKER
    if marker.exists():
        return dataset_dir
    dataset_dir.mkdir(parents=True, exist_ok=True)
    if spec.materialise:
        demo.materialise(spec, dataset_dir)
    elif spec.depends_on:
        pass  # derived datasets have no files of their own; their preparer reads other manifests
    else:
        for source in spec.sources:
            archive_here = bool(source.filename) and (dataset_dir / "downloads" / source.filename).exists()
            if placed_by_hand(spec, dataset_dir) and not archive_here:
                # unpacked by hand (no credentials, no internet, a by-request dataset): nothing to fetch
                log.info("%s: using the files placed by hand in %s", spec.name, dataset_dir)
                continue
            archive = fetch_source(spec, source, dataset_dir, env)
            if archive is not None and source.extract:
                log.info("unpacking %s", archive.name)
                extract(archive, dataset_dir)
        if spec.expected_files and not placed_by_hand(spec, dataset_dir):
            missing = [f for f in spec.expected_files if not _present(dataset_dir, f)]
            raise DownloadError(f"{spec.name}: after unpacking, {missing} are missing in {dataset_dir}; "
                                f"expected layout: {spec.layout}")
    write_text(marker, "verified\n")
    return dataset_dir


def remove_partial(dataset_dir: Path) -> None:
    """Used by tests and ``fedrepro download --force``: drop everything but finished archives."""
    for item in dataset_dir.iterdir():
        if item.name != "downloads":
            shutil.rmtree(item) if item.is_dir() else item.unlink()
