"""Is a dataset's every file in place? What each source provides, found on disk (however it got there),
and the preparer's check of every file its label tables list, before ``.complete`` is written.

- Complete or not at all: ``.complete`` is written only when the files of every source are there,
  a source placed by hand never stands in for another, and a marker whose files have gone missing
  since is dropped on the next run.
- Complete means complete: before ``.complete`` is written, the dataset's preparer check runs
  (:func:`fedrepro.data.prepare.check_listed`): every label table readable with its columns, every
  part and every image the tables list in place.
- :func:`check_dataset` (``fedrepro download <dataset> --check``) reports on a placed tree without
  changing anything.
"""

from __future__ import annotations

from pathlib import Path

from ..spec import DatasetSpec, Source
from .archives import recorded_checksums, unpacked_marker, verify_archive
from .base import (
    COMPLETE_MARKER,
    BrokenArchive,
    ChecksumMismatch,
    IncompleteDataset,
    download_command,
    next_command,
    source_files,
)


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


def archive_path(source: Source, dataset_dir: Path) -> Path | None:
    return dataset_dir / "downloads" / source.filename if source.filename else None


def source_done(spec: DatasetSpec, source: Source, dataset_dir: Path, reverify: bool = False) -> bool:
    """Its files are there, and if its archive is in ``downloads/`` (so it was unpacked here), that
    archive (still the verified one) was unpacked completely: a partial unpack leaves the folders but
    not every file."""
    if missing_files(spec, source, dataset_dir):
        return False
    archive = archive_path(source, dataset_dir)
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


def check_listed_files(spec: DatasetSpec, dataset_dir: Path) -> None:
    """The dataset's preparer check (:func:`fedrepro.data.prepare.check_listed`): its label tables readable
    with their columns, every part and every image they list in place; else :class:`IncompleteDataset`."""
    from ..manifest import ManifestError
    from ..prepare import check_listed

    try:
        check_listed(spec, dataset_dir.parent)
    except (ManifestError, FileNotFoundError) as error:
        raise IncompleteDataset(f"{spec.name}: {error}\nNothing is marked complete; once that is fixed, run "
                                f"`{next_command(spec, dataset_dir)}` (or Snakemake again).") from None


def check_dataset(spec: DatasetSpec, raw_root: Path) -> tuple[bool, list[str]]:
    """Is the dataset in place? -> (complete, report lines), changing nothing: archives are checked
    against their pinned or recorded digests (an unrecorded one is checked whole; none is recorded), each
    source's files looked for, and, when they are all there, every file the label tables list."""
    from .. import folder

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
        archive = archive_path(source, dataset_dir)
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

