"""Issue 25, case 6: `fedrepro weights <id> --force` of the same bytes leaves weights.json as it was (bytes and
modification time), so Snakemake reruns nothing made from it; other bytes change it. When it was fetched, and with
which libraries, lives beside it (.fetch.json)."""

from __future__ import annotations

import json

from fedrepro.models import weights as W


class OneFile(W.WeightSource):
    """A source that serves one file, whatever ``payload`` holds at the time of the fetch."""

    needs_internet = False
    payload = b"weights v1"

    def fetch(self, spec, dest):
        (dest / "model.bin").write_bytes(self.payload)
        return {"primary": "model.bin", "source": {"url": "file:///model.bin", "revision": "r1"}}


def test_refetching_the_same_bytes_leaves_the_weights_manifest_untouched(tmp_path, monkeypatch):
    source = OneFile()
    monkeypatch.setattr(W, "weight_source", lambda kind: source)
    spec = W.WeightSpec("timm", "tiny_net")
    W.fetch(spec, tmp_path)
    manifest = W.manifest_path(spec, tmp_path)
    before = manifest.read_bytes(), manifest.stat().st_mtime_ns
    assert "fetched_at" not in json.loads(before[0])

    W.fetch(spec, tmp_path, force=True)
    assert (manifest.read_bytes(), manifest.stat().st_mtime_ns) == before
    assert "fetched_at" in json.loads((W.folder(spec, tmp_path) / W.FETCH_RECORD).read_text())
    W.check(spec, tmp_path)

    source.payload = b"weights v2"                                   # other content: a new manifest
    W.fetch(spec, tmp_path, force=True)
    assert manifest.read_bytes() != before[0] and manifest.stat().st_mtime_ns != before[1]
    W.check(spec, tmp_path)
