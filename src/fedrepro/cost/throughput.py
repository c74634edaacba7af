"""The throughput table: images per second and peak GPU memory of every model family of the grid on one
device, as ``benchmarks/train_step.py`` measures them, and where the pipeline finds it.

One CSV per device, one row per (model family, architecture, precision, memory layout). A GPU's table
lives in ``benchmarks/gpu/<device>.csv`` (``paths.throughput_table``): ``train_step.py --device cuda`` writes
it there, and the SLURM requests (``fedrepro.cost.runtime``), ``fedrepro estimate`` and ``benchmarks/gpu_hours.py``
read it. Columns (:data:`COLUMNS`):

- ``device`` (``cuda`` or ``cpu``), ``device_name`` (the GPU model as CUDA names it, e.g. ``NVIDIA H200``; the
  CPU's name on a CPU), ``torch``, ``cuda`` (torch's CUDA version, blank on a CPU), ``date`` (of the measurement);
- ``family`` and ``architecture``: a model block's family and backbone or CLIP encoder (:func:`family_key`);
  ``encode`` is a frozen CLIP image tower alone (what a feature cache costs per image);
- ``precision`` (fp32, bf16, fp16), ``channels_last``, ``batch`` and ``eval_batch`` (images per step);
- ``train_img_s``: a training step (forward, base loss, backward, Adam) in images/s; ``eval_img_s``: a no-grad
  forward; ``peak_gpu_mb`` / ``eval_peak_gpu_mb``: the allocator's peak (``torch.cuda.max_memory_reserved``,
  MiB; the CUDA context is not in it) during the training steps / the evaluation at those batches;
- the input pipeline on the same machine, 1024 x 768 JPEGs through the family's transform:
  ``loader_img_s`` (the project's loader over the decode-once cache, ``loader_workers`` worker processes),
  ``decode_img_s`` (one process decoding the original files: what the authors' loaders and the ``features``
  job do), ``cache_img_s`` (one process building the decode-once cache: the ``image_cache`` job); ``host_cpus``:
  the CPUs of the machine that measured them.

A blank cell is "not measured" (a CPU has no peak GPU memory; a family on cached features has no loader).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import paths
from ..io import atomic_path

COLUMNS = ("device", "device_name", "torch", "cuda", "date", "family", "architecture", "precision",
           "channels_last", "batch", "eval_batch", "train_img_s", "eval_img_s", "peak_gpu_mb", "eval_peak_gpu_mb",
           "loader_img_s", "loader_workers", "decode_img_s", "cache_img_s", "host_cpus")
NUMBERS = ("train_img_s", "eval_img_s", "peak_gpu_mb", "eval_peak_gpu_mb", "loader_img_s", "loader_workers",
           "decode_img_s", "cache_img_s", "host_cpus", "batch", "eval_batch")
REQUIRED = ("device", "device_name", "family", "architecture", "precision", "channels_last", "train_img_s", "eval_img_s")
MEASURE = "python benchmarks/train_step.py --device cuda"


class ThroughputError(ValueError):
    """A throughput table that cannot be read, or lacks a figure an estimate needs; the message names the
    file and what to do."""


def family_key(model: dict) -> str:
    """The throughput key of a model block: family and backbone (or CLIP encoder), ``<family>:<architecture>``."""
    name = model.get("backbone") or (model.get("encoder") or {}).get("name") or (model.get("image") or {}).get("backbone")
    return f"{model['family']}:{name}"


def slug(device_name: str) -> str:
    """``NVIDIA A100-SXM4-80GB`` -> ``nvidia-a100-sxm4-80gb`` (the table's file name)."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"


def _row_key(row: dict) -> tuple:
    return row["family"], row["architecture"], row["precision"], str(row["channels_last"])


def write(rows: list[dict], out: str | Path) -> None:
    """Write measured rows as a throughput table, atomically: every row gets every column (blank = not
    measured); rows of an existing table of the same device that were not measured again stay."""
    out = Path(out)
    kept = []
    if out.exists():
        with open(out, newline="") as fh:
            old = list(csv.DictReader(line for line in fh if not line.startswith("#")))
        theirs, ours = {r.get("device_name") for r in old}, {r["device_name"] for r in rows}
        if old and theirs != ours:
            raise ThroughputError(f"{out} holds rows of {sorted(map(str, theirs))}, not of {sorted(ours)}: "
                                  f"write this device's table elsewhere (--out)")
        measured = {_row_key(r) for r in rows}
        kept = [r for r in old if _row_key(r) not in measured]
    with atomic_path(out) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in [*kept, *rows]:
            writer.writerow({c: _cell(row.get(c)) for c in COLUMNS})


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


@dataclass
class Table:
    """One device's rows: ``rows[(family key, precision, channels_last)]`` -> the numeric columns (nan = blank)."""

    path: str
    device: str
    device_name: str
    torch: str = ""
    cuda: str = ""
    date: str = ""
    rows: dict = field(default_factory=dict)

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def describe(self) -> str:
        versions = ", ".join(filter(None, [f"torch {self.torch}" if self.torch else "",
                                           f"CUDA {self.cuda}" if self.cuda else "",
                                           f"measured {self.date}" if self.date else ""]))
        return f"{self.device_name} ({versions}; {self.path})" if versions else f"{self.device_name} ({self.path})"

    def families(self) -> set[str]:
        return {key for key, _, _ in self.rows}

    def row(self, key: str, precision: str, channels_last: bool | None = None) -> dict | None:
        """The row of ``key`` at ``precision``; ``channels_last`` None = channels-last where the table has it
        (``train.channels_last: auto``: on for CNNs, and only CNNs have a channels-last row)."""
        layouts = [True, False] if channels_last in (None, True) else [False, True]
        return next((self.rows[k] for k in ((key, precision, cl) for cl in layouts) if k in self.rows), None)

    def value(self, key: str, precision: str, channels_last: bool | None, what: str) -> float:
        """One figure, or :class:`ThroughputError` naming the family, the column and how to measure it."""
        row = self.row(key, precision, channels_last)
        value = row.get(what, math.nan) if row else math.nan
        if math.isnan(value) or value <= 0 and what.endswith("_img_s"):
            family = key.split(":")[0]
            raise ThroughputError(f"{self.path} has no {what} for {key} at {precision}: measure it ({MEASURE} "
                                  f"--families {family} --precisions {precision}) or fill it in")
        return value


def read(path: str | Path, device_name: str | None = None) -> Table:
    """A throughput table (its first device's rows, or those of the device whose name contains ``device_name``)."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    except OSError as error:
        raise ThroughputError(f"cannot read the throughput table {path}: {error.strerror or error}") from None
    header = set(rows[0]) if rows else set()
    missing = [c for c in REQUIRED if c not in header]
    if not rows or missing:
        raise ThroughputError(f"{path}: not a throughput table ({'no rows' if not rows else 'no column ' + ', '.join(missing)}); "
                              f"its columns are {', '.join(COLUMNS)} ({MEASURE} writes it)")
    names = list(dict.fromkeys(r["device_name"] for r in rows))
    chosen = next((n for n in names if device_name is None or device_name.lower() in n.lower()), None)
    if chosen is None:
        raise ThroughputError(f"{path} has no rows of device {device_name!r}; devices there: {names}")
    first = next(r for r in rows if r["device_name"] == chosen)
    table = Table(str(path), first["device"], chosen, first.get("torch") or "", first.get("cuda") or "",
                  first.get("date") or "")
    for line, r in enumerate(rows, start=2):
        if r["device_name"] != chosen or not (r.get("train_img_s") or r.get("eval_img_s")):
            continue          # another device, or a template row nobody filled in
        values = {}
        for column in NUMBERS:
            text = (r.get(column) or "").strip()
            try:
                values[column] = float(text) if text not in ("", "nan") else math.nan
            except ValueError:
                raise ThroughputError(f"{path}, line {line}: {column} is {text!r}, not a number "
                                      f"(leave it blank when it was not measured)") from None
        key = f"{r['family']}:{r['architecture']}"
        table.rows[(key, r["precision"], r["channels_last"].strip().lower() in ("true", "1"))] = values
    return table


def repository_tables() -> list[Path]:
    """The GPU throughput tables kept in the repository (``benchmarks/gpu/*.csv``)."""
    return sorted(Path(paths.throughput_dir()).glob("*.csv"))


def for_gpu(gpu_model: str | None) -> tuple[Table | None, str]:
    """The repository's table of the GPU a SLURM profile names (``gpu_model: a100`` matches ``NVIDIA
    A100-SXM4-80GB``: every word of the model is a word of the table's device name) -> (table, why).
    None (and why) where no GPU is named or no table of it is here; several tables of the model: the first,
    and ``why`` says so."""
    if not gpu_model:
        return None, "the SLURM profile names no GPU model (gpu_model under set-resources)"
    words = set(slug(str(gpu_model)).split("-"))
    tables = [t for t in (read(p) for p in repository_tables()) if t.gpu]
    found = [t for t in tables if words <= set(slug(t.device_name).split("-"))]
    if not found:
        have = ", ".join(t.device_name for t in tables) or "none"
        return None, (f"no throughput table of GPU {gpu_model!r} in {paths.throughput_dir()}/ (tables there: {have}); "
                      f"measure one on that GPU: {MEASURE}")
    why = f"GPU {gpu_model!r}: {found[0].describe()}"
    if len(found) > 1:
        why += f"; also matching: {', '.join(t.path for t in found[1:])} (name the GPU model more exactly)"
    return found[0], why


def profile_gpu_model(rule: str = "train", profile: str | Path | None = None) -> str | None:
    """The GPU model the SLURM profile asks for ``rule`` (``set-resources: <rule>: gpu_model``), read from the
    profile file (what ``fedrepro estimate`` uses; inside Snakemake the rules read the profile Snakemake loaded)."""
    try:
        config = yaml.safe_load(Path(profile or paths.SLURM_PROFILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    value = ((config.get("set-resources") or {}).get(rule) or {}).get("gpu_model")
    return str(value) if value else None


def choose(file: str | None = None, gpu_model: str | None = None) -> tuple[Table | None, str]:
    """The table an estimate reads -> (table, why): ``file`` if given; else the repository's table of
    ``gpu_model`` (default: the SLURM profile's ``train`` GPU model); a profile that names no GPU model takes the
    repository's only GPU table, if there is exactly one."""
    if file:
        table = read(file)
        return table, table.describe()
    gpu_model = gpu_model or profile_gpu_model("train")
    if gpu_model:
        return for_gpu(gpu_model)
    tables = [t for t in (read(p) for p in repository_tables()) if t.gpu]
    if len(tables) == 1:
        return tables[0], f"the repository's only GPU table (the SLURM profile names no GPU model): {tables[0].describe()}"
    if not tables:
        return None, f"no GPU throughput table in {paths.throughput_dir()}/ (none has been measured in this repository)"
    return None, (f"several GPU tables in {paths.throughput_dir()}/ and no GPU model named: pick one with --gpu "
                  f"({', '.join(t.device_name for t in tables)})")
