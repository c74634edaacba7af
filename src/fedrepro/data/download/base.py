"""What every part of the downloader shares: the marker and checksum file names, the errors, the free-space
check, and what a source provides and the message that asks for a step only the user can do.

- Complete or not at all: every :class:`~fedrepro.data.spec.Source` says which files it provides
  (:func:`source_files`); ``.complete`` is written only when the files of every source are there
  (:mod:`.completeness`).
- Missing credentials, unaccepted licences, by-request datasets, archives only linked from a
  landing page, and servers that answer with a web page instead of the archive end in
  :class:`ManualStepRequired` (after every source that can be fetched has been), whose message names
  the files, where they come from, where to place them and the command to run next (:func:`manual_required`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..spec import DatasetSpec, Source

log = logging.getLogger("fedrepro.data.download")     # one logger for every part of the downloader

COMPLETE_MARKER = ".complete"
CHECKSUM_FILE = "SHA256SUMS"
VERIFIED_CACHE = ".verified.json"
UNPACKED_SUFFIX = ".unpacked"


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


def download_command(dataset_dir: Path, *flags: str) -> str:
    return " ".join((f"fedrepro download {Path(dataset_dir).name} --raw-dir {Path(dataset_dir).parent}", *flags))


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


