"""Fetching a dataset: every source made present and verified, unpacked once, then the completion marker.
Manual steps are collected and raised together after every source that can be fetched has been
(:class:`~.base.ManualStepRequired`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...io import write_text
from ..spec import DatasetSpec, Source
from .archives import archive_digest, is_archive, unpack_once, unpacked_marker, verify_archive
from .base import (
    COMPLETE_MARKER,
    BrokenArchive,
    ChecksumMismatch,
    DownloadError,
    IncompleteDataset,
    ManualStepRequired,
    download_command,
    log,
    manual_required,
    manual_step,
    next_command,
)
from .completeness import archive_path, check_listed_files, missing_files, placed_by_hand, source_done
from .credentials import kaggle_credentials, physionet_credentials
from .transfer import dataverse_file, http_download, kaggle_url, physionet_url, verify_published_checksum


def _kaggle_token_reason(source: Source) -> str:
    rules = (f"; this is a competition: also accept its rules at https://www.kaggle.com/competitions/"
             f"{source.ref.split('/')[0]}/rules with the same account" if source.kind == "kaggle_competition" else "")
    return ("no Kaggle API token (set KAGGLE_USERNAME and KAGGLE_KEY, or save kaggle.json from "
            "https://www.kaggle.com/settings -> API -> Create New Token to ~/.kaggle/kaggle.json)" + rules)


# --------------------------------------------------------------------------------------------
# per-source fetchers

def fetch_source(spec: DatasetSpec, source: Source, dataset_dir: Path, env: dict | None = None,
                 reverify: bool = False) -> Path | None:
    """Make the source's archive present and verified under ``dataset_dir/downloads``; returns its path."""
    target = archive_path(source, dataset_dir)

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
        _http_or_manual(spec, source, kaggle_url(source), target, creds, dataset_dir, denied)
    elif source.kind == "physionet":
        creds = physionet_credentials(env)
        if creds is None:
            raise manual("no PhysioNet login (credentialed access: complete the CITI training and sign the data use "
                         "agreement on the project page, then set PHYSIONET_USERNAME/PHYSIONET_PASSWORD or add a "
                         "'machine physionet.org login <user> password <pass>' line to ~/.netrc)")
        _http_or_manual(spec, source, physionet_url(source), target, creds, dataset_dir,
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
    from .. import demo, folder

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


def remove_partial(dataset_dir: Path) -> None:
    """Used by tests and ``fedrepro download --force``: drop everything but finished archives."""
    for item in dataset_dir.iterdir():
        if item.name != "downloads":
            shutil.rmtree(item) if item.is_dir() else item.unlink()
