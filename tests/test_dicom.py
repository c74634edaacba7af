"""DICOM through pydicom (fedrepro.data.dicom): every transfer syntax the RSNA sets use, and more; the
12-bit CT correction and the windows on each; damaged files named, never a traceback.

RSNA Pneumonia stores JPEG baseline (1.2.840.10008.1.2.4.50, 8-bit MONOCHROME2; see
fedrepro.data.datasets.chest); RSNA ICH stores uncompressed 16-bit slices, in explicit or implicit VR
little endian (both are tested, with and without the Part-10 header; fedrepro.data.datasets.head_ct).
Big endian and RLE are not in those sets, but a converted copy may be."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from dicom_files import write_dicom
from fedrepro.data.datasets import head_ct
from fedrepro.data.dicom import DicomError, convert_dicom, read_dicom, to_8bit

SLICE = np.array([[-1000 + 1024, 0], [40 + 1024, 2000]], dtype=np.int16) * np.ones((1, 1), dtype=np.int16)
NATIVE = [("explicit", True), ("implicit", True), ("explicit", False), ("implicit", False), ("big", True), ("rle", True)]


@pytest.mark.parametrize("syntax,preamble", NATIVE)
def test_a_ct_slice_reads_the_same_in_every_syntax(tmp_path, syntax, preamble):
    path = tmp_path / "slice.dcm"
    write_dicom(path, SLICE, syntax=syntax, preamble=preamble, intercept="-1024", slope="1", center="40\\50",
                width="80\\100")
    image = read_dicom(path)
    assert image.pixels.tolist() == SLICE.tolist() and image.jpeg is None and image.signed
    assert (image.slope, image.intercept, image.window) == (1.0, -1024.0, (40.0, 80.0))   # first of multi-valued DS
    stored, meta = head_ct.read_dicom(path)
    assert stored.tolist() == SLICE.tolist() and meta == {"slope": 1.0, "intercept": -1024.0, "center": 40.0, "width": 80.0}
    # air -1000 HU -> 0, brain 40 HU -> 127.5 -> 128 in the brain window
    assert head_ct.window_ct(stored, **{k: meta[k] for k in ("slope", "intercept")}, center=40, width=80)[:, 0].tolist() == [0, 128]


@pytest.mark.parametrize("syntax", ["explicit", "implicit", "big", "rle"])
def test_12bit_slices_are_corrected_in_every_syntax(tmp_path, syntax):
    """BitsStored 12, unsigned, intercept 0: air is stored as 3096 (= -1000 + 4096), which read as it is would
    be 3096 HU; corrected (head_ct.correct_12bit) it is -1000 HU."""
    path = tmp_path / "twelve.dcm"
    write_dicom(path, np.array([[3096, 40]], dtype=np.uint16), syntax=syntax, bits_stored=12, intercept="0", slope="1")
    stored, meta = head_ct.read_dicom(path)
    assert (stored * meta["slope"] + meta["intercept"]).tolist() == [[-1000.0, 40.0]]
    assert (meta["center"], meta["width"]) == head_ct.BRAIN_WINDOW              # no window in the file: the brain window


def test_jpeg_baseline_is_copied_byte_for_byte_or_decoded(tmp_path):
    buffer = io.BytesIO()
    Image.new("L", (16, 16), 100).save(buffer, format="JPEG")
    path = tmp_path / "cxr.dcm"
    write_dicom(path, jpeg=buffer.getvalue(), size=(16, 16))
    image = read_dicom(path)
    assert image.transfer_syntax == "1.2.840.10008.1.2.4.50" and image.pixels is None
    out = convert_dicom(path, tmp_path / "images" / "cxr")
    assert out.suffix == ".jpg" and out.read_bytes() == buffer.getvalue()
    decoded = read_dicom(path, keep_jpeg=False)
    assert decoded.jpeg is None and decoded.pixels.shape == (16, 16) and abs(float(decoded.pixels.mean()) - 100) < 2


def test_native_pixels_convert_to_a_min_max_png_monochrome1_inverted(tmp_path):
    pixels = np.array([[0, 50], [100, 200]], dtype=np.uint8)
    write_dicom(tmp_path / "m2.dcm", pixels)
    write_dicom(tmp_path / "m1.dcm", pixels, photometric="MONOCHROME1")
    out = convert_dicom(tmp_path / "m2.dcm", tmp_path / "m2")
    assert out.suffix == ".png" and np.asarray(Image.open(out)).tolist() == [[0, 64], [128, 255]]
    assert to_8bit(read_dicom(tmp_path / "m1.dcm")).tolist() == [[255, 191], [128, 0]]


def damaged(tmp_path) -> dict[str, tuple[bytes | None, str]]:
    write_dicom(tmp_path / "good.dcm", SLICE, intercept="-1024")
    good = (tmp_path / "good.dcm").read_bytes()
    return {"truncated.dcm": (good[:-3], "cannot decode its pixel data"),
            "cut-in-header.dcm": (good[:200], "no pixel data"),
            "text.dcm": (b"not a DICOM file at all\n" * 10, "no pixel data"),
            "empty.dcm": (b"", "no pixel data"),
            "missing.dcm": (None, "file not found")}


@pytest.mark.parametrize("name", ["truncated.dcm", "cut-in-header.dcm", "text.dcm", "empty.dcm", "missing.dcm"])
def test_a_damaged_dicom_is_one_error_naming_the_file(tmp_path, name):
    data, reason = damaged(tmp_path)[name]
    if data is not None:
        (tmp_path / name).write_bytes(data)
    with pytest.raises(DicomError) as err:
        head_ct.read_dicom(tmp_path / name)
    assert str(err.value).startswith(f"{tmp_path / name}: ") and reason in str(err.value)
    with pytest.raises(DicomError):
        convert_dicom(tmp_path / name, tmp_path / "out" / "x")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())     # nothing half-written
