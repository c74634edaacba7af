"""Reading DICOM with pydicom, the field's standard reader: the one DICOM path of the project
(RSNA Pneumonia's ``stage_2_train_images``, RSNA ICH's ``stage_2_train``).

:func:`read_dicom` returns either the JPEG stream of a JPEG baseline image (RSNA Pneumonia's syntax:
written to disk as it is, no re-encoding; or decoded, on request) or the decoded stored pixel values of any other transfer
syntax pydicom decodes (explicit or implicit VR little endian, big endian, RLE, and the JPEG family
through Pillow), with what CT windowing needs: the rescale (slope, intercept), the file's own display
window (center, width; the first value of a multi-valued one, as viewers do), BitsStored and
PixelRepresentation (some RSNA ICH slices store 12-bit values whose rescale is off;
:mod:`fedrepro.data.datasets.head_ct` corrects them). Files without the Part-10 preamble are read too.

Whatever is wrong with a file (not DICOM, truncated, no pixel data, a compressed syntax without a
decoder) is one :class:`DicomError` naming the file and the reason; preparers list such files as
unreadable (``data.corrupt_images``), they do not stop on them.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

JPEG_BASELINE = "1.2.840.10008.1.2.4.50"


class DicomError(ValueError):
    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


@dataclass
class DicomImage:
    transfer_syntax: str
    rows: int
    columns: int
    photometric: str
    pixels: np.ndarray | None      # stored pixel values (rows x columns[, samples]), no rescale applied
    jpeg: bytes | None             # the encapsulated JPEG baseline stream
    slope: float = 1.0             # stored value -> modality value (Hounsfield units for CT)
    intercept: float = 0.0
    window: tuple[float, float] | None = None   # the file's (center, width), when it has one
    bits_stored: int | None = None  # BitsStored (0028,0101): the significant bits of each stored value
    signed: bool = False            # PixelRepresentation (0028,0103) = 1


def _number(ds, keyword: str) -> float | None:
    """A decimal-string attribute as a float (the first of several values); None where it is absent or
    malformed (an optional attribute falls back to its default)."""
    value = ds.get(keyword)
    if value is None or value == "":
        return None
    if not isinstance(value, (str, bytes, int, float)):   # MultiValue
        value = value[0] if len(value) else None
    try:
        return float(str(value).split("\\")[0].strip())
    except (TypeError, ValueError):
        return None


def _dataset(path: Path):
    import pydicom
    from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian, ImplicitVRLittleEndian

    if not path.is_file():
        raise DicomError(path, "file not found")
    try:
        with warnings.catch_warnings():    # pydicom warns about every odd element; the error below is what counts
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(path, force=True)
    except Exception as exc:  # noqa: BLE001 - pydicom raises many types on damaged input; each becomes one message
        raise DicomError(path, f"not a readable DICOM file ({type(exc).__name__}: {exc})") from None
    if "PixelData" not in ds:
        raise DicomError(path, "no pixel data (not a DICOM image, or a truncated file)")
    if not ds.file_meta.get("TransferSyntaxUID"):        # no Part-10 header: the encoding pydicom read it with
        implicit, little = getattr(ds, "original_encoding", (True, True))
        ds.file_meta.TransferSyntaxUID = (ImplicitVRLittleEndian if implicit else
                                          ExplicitVRLittleEndian if little else ExplicitVRBigEndian)
    return ds


def read_dicom(path: str | Path, keep_jpeg: bool = True) -> DicomImage:
    """``keep_jpeg``: a JPEG baseline image comes back as its stream (``jpeg``), not decoded; with
    ``keep_jpeg=False`` every image is decoded into ``pixels``."""
    from pydicom.encaps import generate_frames

    path = Path(path)
    ds = _dataset(path)
    syntax = str(ds.file_meta.TransferSyntaxUID)
    frames = int(_number(ds, "NumberOfFrames") or 1)
    if frames != 1:
        raise DicomError(path, f"{frames} frames; a single image is expected")
    pixels = jpeg = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if syntax == JPEG_BASELINE and keep_jpeg:
                jpeg = next(generate_frames(ds.PixelData, number_of_frames=1))
            else:
                pixels = ds.pixel_array
    except Exception as exc:  # noqa: BLE001 - a short pixel stream, an unknown syntax, a missing decoder, ...
        logging.getLogger(__name__).debug("pixel data of %s", path, exc_info=True)
        raise DicomError(path, f"cannot decode its pixel data, transfer syntax {syntax} "
                               f"({type(exc).__name__}: {exc})") from None
    center, width = _number(ds, "WindowCenter"), _number(ds, "WindowWidth")
    bits_stored = ds.get("BitsStored")
    return DicomImage(syntax, int(ds.get("Rows") or 0), int(ds.get("Columns") or 0),
                      str(ds.get("PhotometricInterpretation") or "MONOCHROME2"), pixels, jpeg,
                      _number(ds, "RescaleSlope") or 1.0, _number(ds, "RescaleIntercept") or 0.0,
                      (center, width) if center is not None and width is not None else None,
                      int(bits_stored) if bits_stored is not None else None, int(ds.get("PixelRepresentation") or 0) == 1)


def to_8bit(image: DicomImage) -> np.ndarray:
    """Native pixels scaled to 0..255 (min-max), MONOCHROME1 inverted."""
    pixels = image.pixels.astype(np.float64)
    lo, hi = pixels.min(), pixels.max()
    scaled = (pixels - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(pixels)
    if image.photometric == "MONOCHROME1":
        scaled = 255.0 - scaled
    return scaled.round().astype(np.uint8)


def convert_dicom(path: str | Path, out_stem: Path) -> Path:
    """Write ``out_stem``.jpg (the encapsulated JPEG, byte for byte) or ``out_stem``.png (native
    pixels), each atomically; -> the written file. An unreadable file raises :class:`DicomError`."""
    from PIL import Image

    from ..io import atomic_path

    image = read_dicom(path)
    out = out_stem.with_suffix(".jpg" if image.jpeg is not None else ".png")
    with atomic_path(out) as tmp:
        if image.jpeg is not None:
            Path(tmp).write_bytes(image.jpeg)
        else:
            Image.fromarray(to_8bit(image)).save(tmp, format="PNG")
    return out
