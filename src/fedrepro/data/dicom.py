"""A small DICOM reader for single-frame radiographs and CT slices (RSNA Pneumonia's
``stage_2_train_images``, RSNA ICH's ``stage_2_train``): the one DICOM path of the project.

It parses the Part-10 file format (preamble, ``DICM``, explicit-VR file meta group) and a dataset
in explicit or implicit VR little endian, skipping sequences, and returns the pixel data either as
the JPEG stream of an encapsulated (JPEG baseline) image — written to disk as-is, no re-encoding —
or as a native 8/16-bit array, with the rescale (slope, intercept) and the file's own display window
(center, width) that CT windowing needs, and BitsStored / PixelRepresentation (some CT slices store
12-bit values whose rescale is off; :mod:`fedrepro.data.datasets.head_ct` corrects them). Big-endian and other compressed transfer syntaxes are refused with a
clear error (convert such files with pydicom/dcmtk and place PNGs instead).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EXPLICIT_LE = "1.2.840.10008.1.2.1"
IMPLICIT_LE = "1.2.840.10008.1.2"
JPEG_BASELINE = "1.2.840.10008.1.2.4.50"
LONG_VRS = {b"OB", b"OW", b"OF", b"SQ", b"UT", b"UN", b"UC", b"UR", b"OD", b"OL", b"OV", b"SV", b"UV"}
UNDEFINED = 0xFFFFFFFF
ITEM, ITEM_END, SEQ_END = (0xFFFE, 0xE000), (0xFFFE, 0xE00D), (0xFFFE, 0xE0DD)
WANTED = {(0x0028, 0x0002): "samples", (0x0028, 0x0004): "photometric", (0x0028, 0x0010): "rows",
          (0x0028, 0x0011): "columns", (0x0028, 0x0100): "bits", (0x0028, 0x0101): "bits_stored",
          (0x0028, 0x0103): "signed",
          (0x0028, 0x1050): "center", (0x0028, 0x1051): "width", (0x0028, 0x1052): "intercept",
          (0x0028, 0x1053): "slope"}
TEXT_TAGS = {(0x0028, 0x0004)}
# Decimal strings (VR DS); multi-valued ones ("40\80") keep their first value, as viewers do.
DECIMAL_TAGS = {(0x0028, 0x1050), (0x0028, 0x1051), (0x0028, 0x1052), (0x0028, 0x1053)}
PIXEL_DATA = (0x7FE0, 0x0010)


class DicomError(ValueError):
    pass


@dataclass
class DicomImage:
    transfer_syntax: str
    rows: int
    columns: int
    photometric: str
    pixels: np.ndarray | None      # native pixel data (rows x columns[, samples])
    jpeg: bytes | None             # the encapsulated JPEG stream
    slope: float = 1.0             # stored value -> modality value (Hounsfield units for CT)
    intercept: float = 0.0
    window: tuple[float, float] | None = None   # the file's (center, width), when it has one
    bits_stored: int | None = None  # BitsStored (0028,0101): the significant bits of each stored value
    signed: bool = False            # PixelRepresentation (0028,0103) = 1


def _decode(tag: tuple[int, int], raw: bytes):
    if tag in TEXT_TAGS:
        return raw.rstrip(b"\x00 ").decode("ascii")
    if tag in DECIMAL_TAGS:
        first = raw.decode("ascii", errors="replace").split("\\")[0].strip(" \x00")
        try:
            return float(first) if first else None
        except ValueError:
            return None      # a malformed optional attribute: fall back to the default
    return struct.unpack_from("<H", raw)[0]


def _element_header(buf: bytes, pos: int, explicit: bool) -> tuple[tuple[int, int], bytes | None, int, int]:
    group, element = struct.unpack_from("<HH", buf, pos)
    if (group, element) in (ITEM, ITEM_END, SEQ_END):
        return (group, element), None, struct.unpack_from("<I", buf, pos + 4)[0], pos + 8
    if explicit:
        vr = buf[pos + 4:pos + 6]
        if vr in LONG_VRS:
            return (group, element), vr, struct.unpack_from("<I", buf, pos + 8)[0], pos + 12
        return (group, element), vr, struct.unpack_from("<H", buf, pos + 6)[0], pos + 8
    return (group, element), None, struct.unpack_from("<I", buf, pos + 4)[0], pos + 8


def _skip_sequence(buf: bytes, pos: int, explicit: bool) -> int:
    """Skip an undefined-length sequence (items until the sequence delimiter); -> position after it."""
    while pos < len(buf):
        tag, _, length, pos = _element_header(buf, pos, explicit)
        if tag == SEQ_END:
            return pos
        if tag != ITEM:
            raise DicomError(f"unexpected tag {tag} inside a sequence")
        if length != UNDEFINED:
            pos += length
            continue
        while True:  # an item of undefined length: elements until the item delimiter
            tag, vr, length, pos = _element_header(buf, pos, explicit)
            if tag == ITEM_END:
                break
            pos = _skip_sequence(buf, pos, explicit) if length == UNDEFINED else pos + length
    raise DicomError("sequence without delimiter")


def _fragments(buf: bytes, pos: int) -> tuple[list[bytes], int]:
    """Encapsulated pixel data: basic offset table item, then fragments, then the delimiter."""
    out = []
    while pos < len(buf):
        tag, _, length, pos = _element_header(buf, pos, True)
        if tag == SEQ_END:
            return out[1:], pos
        out.append(buf[pos:pos + length])
        pos += length
    raise DicomError("encapsulated pixel data without delimiter")


def read_dicom(path: str | Path) -> DicomImage:
    buf = Path(path).read_bytes()
    if len(buf) < 132 or buf[128:132] != b"DICM":
        raise DicomError(f"{path}: not a DICOM Part-10 file (no DICM marker)")
    pos, syntax, info = 132, None, {}
    while pos < len(buf):                            # file meta group: always explicit VR LE
        group = struct.unpack_from("<H", buf, pos)[0]
        if group != 0x0002:
            break
        tag, vr, length, pos = _element_header(buf, pos, True)
        if tag == (0x0002, 0x0010):
            syntax = buf[pos:pos + length].rstrip(b"\x00 ").decode("ascii")
        pos += length
    if syntax not in (EXPLICIT_LE, IMPLICIT_LE, JPEG_BASELINE):
        raise DicomError(f"{path}: transfer syntax {syntax} is not supported (explicit/implicit VR little endian "
                         f"or JPEG baseline); convert it with pydicom or dcmtk")
    explicit = syntax != IMPLICIT_LE
    pixels = jpeg = None
    while pos < len(buf):
        tag, vr, length, pos = _element_header(buf, pos, explicit)
        if tag == PIXEL_DATA:
            if length == UNDEFINED:
                frames, pos = _fragments(buf, pos)
                jpeg = b"".join(frames)
            else:
                pixels = buf[pos:pos + length]
                pos += length
            break
        if length == UNDEFINED:
            pos = _skip_sequence(buf, pos, explicit)
            continue
        if tag in WANTED:
            value = _decode(tag, buf[pos:pos + length])
            if value is not None:
                info[WANTED[tag]] = value
        pos += length
    if pixels is None and jpeg is None:
        raise DicomError(f"{path}: no pixel data")
    rows, columns = info.get("rows"), info.get("columns")
    array = None
    if pixels is not None:
        bits, samples = info.get("bits", 8), info.get("samples", 1)
        dtype = {8: np.uint8, 16: np.uint16}.get(bits)
        if dtype is None:
            raise DicomError(f"{path}: {bits}-bit pixels are not supported")
        if info.get("signed"):
            dtype = np.int8 if bits == 8 else np.int16
        shape = (rows, columns) if samples == 1 else (rows, columns, samples)
        if rows is None or columns is None or len(pixels) < np.dtype(dtype).itemsize * int(np.prod(shape)):
            raise DicomError(f"{path}: pixel data is shorter than Rows x Columns says (truncated file?)")
        array = np.frombuffer(pixels, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
    window = (info["center"], info["width"]) if "center" in info and "width" in info else None
    return DicomImage(syntax, rows, columns, info.get("photometric", "MONOCHROME2"), array, jpeg,
                      info.get("slope", 1.0), info.get("intercept", 0.0), window,
                      info.get("bits_stored"), bool(info.get("signed", 0)))


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
    pixels); -> the written file."""
    from PIL import Image

    image = read_dicom(path)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    if image.jpeg is not None:
        out = out_stem.with_suffix(".jpg")
        out.write_bytes(image.jpeg)
        return out
    out = out_stem.with_suffix(".png")
    Image.fromarray(to_8bit(image)).save(out)
    return out
