"""Fetch a dataset's sources into ``resources/raw/<dataset>/`` and verify them, one concern a module:
:mod:`.base` (errors, file names, free space, what a source provides, the manual-step message),
:mod:`.credentials` (Kaggle, PhysioNet), :mod:`.transfer` (resumable HTTP, Dataverse), :mod:`.archives`
(digests, whole-archive checks, unpacking once), :mod:`.completeness` (is every file there; ``--check``) and
:mod:`.fetch` (every source of a dataset, then the completion marker). The names below are its API."""

from .archives import (
    archive_digest,
    archive_problem,
    extract,
    is_archive,
    recorded_checksums,
    unpack_once,
    unpacked_marker,
    verify_archive,
)
from .base import (
    CHECKSUM_FILE,
    COMPLETE_MARKER,
    BrokenArchive,
    ChecksumMismatch,
    DownloadError,
    IncompleteDataset,
    ManualStepRequired,
    NotEnoughSpace,
    manual_required,
    manual_step,
    source_files,
)
from .completeness import check_dataset, check_listed_files, missing_files, placed_by_hand
from .credentials import Credentials, kaggle_credentials, physionet_credentials
from .fetch import download_dataset, fetch_source, remove_partial
from .transfer import dataverse_file, http_download

__all__ = ["CHECKSUM_FILE", "COMPLETE_MARKER", "BrokenArchive", "ChecksumMismatch", "Credentials", "DownloadError",
           "IncompleteDataset", "ManualStepRequired", "NotEnoughSpace", "archive_digest", "archive_problem",
           "check_dataset", "check_listed_files", "dataverse_file", "download_dataset", "extract", "fetch_source",
           "http_download", "is_archive", "kaggle_credentials", "manual_required", "manual_step", "missing_files",
           "physionet_credentials", "placed_by_hand", "recorded_checksums", "remove_partial", "source_files",
           "unpack_once", "unpacked_marker", "verify_archive"]
