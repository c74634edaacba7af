"""Minimal DICOM Part-10 files for tests of the project's DICOM reader (no pydicom needed)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

LONG_VRS = (b"OB", b"OW", b"SQ", b"UN", b"UT")
US_TAGS = {"samples": (0x0028, 0x0002), "rows": (0x0028, 0x0010), "columns": (0x0028, 0x0011),
           "bits": (0x0028, 0x0100), "bits_stored": (0x0028, 0x0101), "signed": (0x0028, 0x0103)}
DS_TAGS = {"center": (0x0028, 0x1050), "width": (0x0028, 0x1051), "intercept": (0x0028, 0x1052),
           "slope": (0x0028, 0x1053)}


def _even(value: bytes, pad: bytes = b" ") -> bytes:
    return value + pad if len(value) % 2 else value


def element(group: int, number: int, vr: bytes, value: bytes, explicit: bool = True) -> bytes:
    tag = struct.pack("<HH", group, number)
    if not explicit:
        return tag + struct.pack("<I", len(value)) + value
    if vr in LONG_VRS:
        return tag + vr + b"\0\0" + struct.pack("<I", len(value)) + value
    return tag + vr + struct.pack("<H", len(value)) + value


def write_dicom(path: Path, pixels: np.ndarray | None = None, jpeg: bytes | None = None, size: tuple[int, int] | None = None,
                explicit: bool = True, bits_stored: int | None = None, **decimals: str) -> None:
    """Native ``pixels`` (uint8, uint16 or int16) in explicit or implicit VR little endian, or a JPEG
    baseline stream of ``size`` (rows, columns); ``decimals`` sets CT attributes given as DICOM decimal
    strings: center, width, intercept, slope (e.g. ``center="40\\50"``); ``bits_stored`` BitsStored
    (default: BitsAllocated)."""
    if jpeg is not None:
        syntax, explicit = b"1.2.840.10008.1.2.4.50", True
    else:
        syntax = b"1.2.840.10008.1.2.1" if explicit else b"1.2.840.10008.1.2"
    meta = element(0x0002, 0x0010, b"UI", _even(syntax, b"\0"))
    meta = element(0x0002, 0x0000, b"UL", struct.pack("<I", len(meta))) + meta
    rows, columns = size if jpeg is not None else pixels.shape
    bits = 8 if jpeg is not None or pixels.dtype == np.uint8 else 16
    signed = int(jpeg is None and pixels.dtype.kind == "i")
    # an undefined-length sequence with one undefined-length item: the reader has to skip it
    sequence = (struct.pack("<HH", 0x0008, 0x1140) + (b"SQ\0\0" if explicit else b"") + struct.pack("<I", 0xFFFFFFFF)
                + struct.pack("<HHI", 0xFFFE, 0xE000, 0xFFFFFFFF) + element(0x0008, 0x1150, b"UI", b"1.2\0", explicit)
                + struct.pack("<HHI", 0xFFFE, 0xE00D, 0) + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0))
    body = element(0x0008, 0x0060, b"CS", b"CT", explicit) + sequence
    body += element(0x0028, 0x0004, b"CS", b"MONOCHROME2 ", explicit)
    values = {"samples": 1, "rows": rows, "columns": columns, "bits": bits, "bits_stored": bits_stored or bits,
              "signed": signed}
    for name, (group, number) in US_TAGS.items():
        body += element(group, number, b"US", struct.pack("<H", values[name]), explicit)
    for name, (group, number) in DS_TAGS.items():
        if name in decimals:
            body += element(group, number, b"DS", _even(decimals[name].encode("ascii")), explicit)
    if jpeg is not None:
        fragment = _even(jpeg, b"\0")
        body += (struct.pack("<HH", 0x7FE0, 0x0010) + b"OB\0\0" + struct.pack("<I", 0xFFFFFFFF)
                 + struct.pack("<HHI", 0xFFFE, 0xE000, 0) + struct.pack("<HHI", 0xFFFE, 0xE000, len(fragment)) + fragment
                 + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0))
    else:
        body += element(0x7FE0, 0x0010, b"OW" if bits == 16 else b"OB", pixels.astype(pixels.dtype.newbyteorder("<")).tobytes(),
                        explicit)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * 128 + b"DICM" + meta + body)
