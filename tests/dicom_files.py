"""DICOM files for tests, written with pydicom in the transfer syntaxes the RSNA sets use (and a few more)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# syntax name -> transfer syntax UID
SYNTAXES = {"explicit": "1.2.840.10008.1.2.1", "implicit": "1.2.840.10008.1.2", "big": "1.2.840.10008.1.2.2",
            "jpeg": "1.2.840.10008.1.2.4.50", "rle": "1.2.840.10008.1.2.5"}
CT_STORAGE, SECONDARY_CAPTURE = "1.2.840.10008.5.1.4.1.1.2", "1.2.840.10008.5.1.4.1.1.7"
DECIMALS = {"center": "WindowCenter", "width": "WindowWidth", "intercept": "RescaleIntercept", "slope": "RescaleSlope"}


def write_dicom(path: Path, pixels: np.ndarray | None = None, jpeg: bytes | None = None, size: tuple[int, int] | None = None,
                explicit: bool = True, bits_stored: int | None = None, syntax: str | None = None,
                photometric: str = "MONOCHROME2", preamble: bool = True, **decimals: str) -> None:
    """Native ``pixels`` (uint8, uint16 or int16) in explicit VR little endian (or implicit with
    ``explicit=False``, or ``syntax`` big / rle), or a JPEG baseline stream ``jpeg`` of ``size`` (rows,
    columns), as RSNA Pneumonia's files hold it; ``decimals`` sets CT attributes as DICOM decimal strings:
    center, width, intercept, slope (``center="40\\50"``: two values); ``bits_stored`` BitsStored (default:
    BitsAllocated); ``preamble=False`` leaves out the Part-10 header."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import generate_uid

    syntax = "jpeg" if jpeg is not None else (syntax or ("explicit" if explicit else "implicit"))
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = SYNTAXES["explicit" if syntax == "rle" else syntax]
    ds.file_meta.MediaStorageSOPClassUID = SECONDARY_CAPTURE if jpeg is not None else CT_STORAGE
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SOPClassUID, ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID
    ds.Modality = "CR" if jpeg is not None else "CT"
    ds.ReferencedImageSequence = [Dataset()]          # a sequence before the pixels: the reader has to skip it
    ds.ReferencedImageSequence[0].ReferencedSOPInstanceUID = "1.2"
    rows, columns = size if jpeg is not None else pixels.shape
    bits = 8 if jpeg is not None or pixels.dtype == np.uint8 else 16
    ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.Rows, ds.Columns = 1, photometric, rows, columns
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = bits, bits_stored or bits, (bits_stored or bits) - 1
    ds.PixelRepresentation = int(jpeg is None and pixels.dtype.kind == "i")
    for name, keyword in DECIMALS.items():
        if name in decimals:
            values = decimals[name].split("\\")
            setattr(ds, keyword, values if len(values) > 1 else values[0])
    if jpeg is not None:
        ds.PixelData = encapsulate([jpeg])
    else:
        ds.PixelData = pixels.astype(pixels.dtype.newbyteorder(">" if syntax == "big" else "<")).tobytes()
        if syntax == "rle":
            ds.compress(SYNTAXES["rle"])
    path.parent.mkdir(parents=True, exist_ok=True)
    transfer = ds.file_meta.TransferSyntaxUID
    if preamble:
        ds.save_as(path, enforce_file_format=True)
    else:
        ds.file_meta = FileMetaDataset()
        ds.save_as(path, implicit_vr=transfer.is_implicit_VR, little_endian=transfer.is_little_endian)
