"""Getting a file over HTTP: resumable downloads, the Kaggle and PhysioNet addresses, Dataverse listings.

- Resumable: a partial download lives in ``<file>.part`` and continues with an HTTP Range request
  (with ``If-Range``, so a file that changed on the server starts over). Kaggle's API answers with a
  redirect to its storage, PhysioNet serves its files directly; both honour Range, so Kaggle and
  PhysioNet downloads resume like any other.
- Dataverse files (Harvard Dataverse, ...) are found by name in the dataset's file listing
  (Native API) and also checked against the checksum the server publishes for them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ...io import read_json, write_json
from ..spec import Source
from .base import ChecksumMismatch, DownloadError, require_space
from .credentials import Credentials

KAGGLE_API = "https://www.kaggle.com/api/v1"
PHYSIONET_FILES = "https://physionet.org/files"


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


def kaggle_url(source: Source) -> str:
    if source.kind == "kaggle_dataset":
        version = f"?datasetVersionNumber={source.version}" if source.version else ""
        return f"{KAGGLE_API}/datasets/download/{source.ref}{version}"
    competition, _, member = source.ref.partition("/")
    if member:
        return f"{KAGGLE_API}/competitions/data/download/{competition}/{member}"
    return f"{KAGGLE_API}/competitions/data/download-all/{competition}"


def physionet_url(source: Source) -> str:
    return f"{PHYSIONET_FILES}/{source.ref}"


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


