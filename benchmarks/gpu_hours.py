"""GPU-hours of the whole grid, from a throughput table, ours next to the authors' way.

For every run of the configured grid (``fedrepro validate``'s list: ``project.plan.runs()``), from its
resolved config:

    hours(run) = R x (train images per round / train rate + E/R x eval images per evaluation / eval rate) / 3600

- R = ``rounds``; E = evaluated rounds (every ``eval_every``-th and the last).
- train images per round = the participants' local work: ``local.steps`` x ``batch_size`` per client,
  or ``local.epochs`` x the client's training images (from the split file when it exists, else from
  ``benchmarks/dataset_sizes.csv`` x the split's train ratio: an assumption, see that file).
- eval images per evaluation = every image not trained on (clients' val/test, the global test set;
  the external set); personalized methods score each client model on the global set too (counted 2x).
- rates (images/s) per model family (``train_step.family_key``: family and backbone) from a
  throughput CSV written by ``benchmarks/train_step.py --out`` (measured) or filled in by hand:

  ours:  bf16 (``precision: auto`` on a GPU), channels-last for CNNs, the decode-once cache: the train
         rate is min(step rate, loader rate) where the table has a loader rate; runs on cached
         features train at the features family's rate, plus one pass of the frozen encoder per
         (dataset, encoder) feature cache, counted once for the grid;
  authors': fp32, no feature cache (the frozen encoder runs on every batch and every evaluation:
         1 / (1/encoder rate + 1/head rate)), images decoded from the original files every epoch by
         ``--authors-loader-cores`` processes at ``--decode-img-s`` images/s per core (their code's
         loaders: FACMIC/FAA-CLIP run with num_workers 0).

Nothing here is measured on a GPU unless the throughput table was: the device column of the table is
printed with the result. A family the table lacks stops the script with its name.

    python benchmarks/gpu_hours.py --throughput my_cpu.csv          # written by train_step.py --out my_cpu.csv
    python benchmarks/gpu_hours.py --throughput my_gpu.csv --device "H100" --decode-img-s 110

The last line reads ``grid: <N> runs, <X> device-hours ours vs <Y> the authors' way (<r>x)``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from train_step import family_key  # noqa: E402

from fedrepro.config import load_project  # noqa: E402
from fedrepro.registry import MODELS  # noqa: E402

SIZES = ROOT / "benchmarks/dataset_sizes.csv"


def read_throughput(files: list[str], device: str | None) -> tuple[dict, str]:
    """{(family key, precision, channels_last): row} of the first device matching ``device``."""
    rows = []
    for name in files:
        with open(name, newline="") as fh:
            rows += list(csv.DictReader(fh))
    devices = list(dict.fromkeys(r["device"] for r in rows))
    chosen = next((d for d in devices if device is None or device.lower() in d.lower()), None)
    if chosen is None:
        raise SystemExit(f"no rows for device {device!r} in {files}; devices there: {devices}")
    table = {}
    for r in rows:
        if r["device"] != chosen:
            continue
        if not r.get("train_img_s") and not r.get("eval_img_s"):
            continue          # a template row nobody filled in
        table[(r["family"], r["precision"], r["channels_last"] in ("True", "true", "1"))] = {
            k: float(r[k]) if r.get(k) not in (None, "", "nan") else math.nan
            for k in ("train_img_s", "eval_img_s", "loader_img_s")}
    return table, chosen


def rate(table: dict, key: str, precision: str, channels_last: bool, what: str) -> float:
    for cl in ([True, False] if channels_last else [False, True]):
        row = table.get((key, precision, cl))
        if row and not math.isnan(row[what]):
            return row[what]
    raise SystemExit(f"the throughput table has no {what} for {key} at {precision}: measure it "
                     f"(python benchmarks/train_step.py --families {key.split(':')[0]} --out ...) or fill it in")


def dataset_sizes() -> dict[str, int]:
    with open(SIZES, newline="") as fh:
        return {r["dataset"]: int(r["images"]) for r in csv.DictReader(line for line in fh if not line.startswith("#"))}


def client_images(project, key, run: dict, sizes: dict) -> tuple[list[int], int, str]:
    """(training images per client, images evaluated per evaluation, where the numbers come from)."""
    split_file = ROOT / run["paths"]["split"]
    if split_file.exists():
        data = json.loads(split_file.read_text())
        train = [len(c["train"]) for c in data["clients"].values()]
        held = sum(len(c.get("val", [])) + len(c.get("test", [])) for c in data["clients"].values())
        return train, held + len(data["global_test"]) + len(data.get("external", [])), "split file"
    if run["dataset"] not in sizes:
        raise SystemExit(f"{run['dataset']}: no split file ({split_file}) and no row in {SIZES}")
    from fedrepro.fl.memory import client_count

    spec = project.papers[key.paper]["settings"][key.setting]["split"]
    n, clients = sizes[run["dataset"]], client_count(spec)
    ratio = (spec.get("ratios") or {}).get("train", 0.8)
    if spec.get("global_test", "none") != "none":
        ratio *= 0.8                 # a global test set is carved first (assumed a fifth of the data)
    train = int(n * ratio)
    return [train // clients] * clients, n - train, "dataset_sizes.csv (assumption)"


def run_hours(project, key, table, sizes, args, cache_passes: dict) -> tuple[float, float, str]:
    run = project.resolver.run_config(key)
    train = run["train"]
    model = train["model"]
    fkey = family_key(model)
    kind = MODELS.get(model["family"])["input"]
    per_client, held, source = client_images(project, key, run, sizes)
    participants = 1 if run["algorithm"]["name"] == "centralized" else len(per_client)
    local = train["local"]
    if "steps" in local:
        train_images = participants * local["steps"] * train["batch_size"]
    else:
        train_images = local.get("epochs", 1) * sum(per_client)
    personalized = train.get("client_eval") == "local" or run["algorithm"]["name"] in (
        "fedproto", "fedadapterproto", "decentralized")
    eval_images = held * (2 if personalized else 1)      # personalized: client models on the global set too (~2x)
    rounds = train["rounds"]
    evaluated = len({r for r in range(1, rounds + 1) if r % train.get("eval_every", 1) == 0} | {rounds})

    cnn = model["family"] in ("classifier", "proj_classifier", "adapter_protonet")
    ours_train = rate(table, fkey, "bf16", cnn, "train_img_s")
    ours_eval = rate(table, fkey, "bf16", cnn, "eval_img_s")
    authors_train = rate(table, fkey, "fp32", False, "train_img_s")
    authors_eval = rate(table, fkey, "fp32", False, "eval_img_s")
    if kind == "features":
        encoder = f"encode:{model['encoder']['name']}"
        enc_fp32 = rate(table, encoder, "fp32", False, "eval_img_s")
        cache_key = (run["dataset"], run["features"]["key"])
        if cache_key not in cache_passes:      # the feature cache: one pass of the frozen encoder (fp32)
            cache_passes[cache_key] = (sum(per_client) + held) / enc_fp32
        authors_train = 1 / (1 / enc_fp32 + 1 / authors_train)
        authors_eval = 1 / (1 / enc_fp32 + 1 / authors_eval)
    else:
        loader = table.get((fkey, "bf16", cnn)) or table.get((fkey, "bf16", False)) or {}
        if not math.isnan(loader.get("loader_img_s", math.nan)):
            ours_train = min(ours_train, loader["loader_img_s"])
        authors_train = min(authors_train, args.decode_img_s * args.authors_loader_cores)
        authors_eval = min(authors_eval, args.decode_img_s * args.authors_loader_cores)
    ours = rounds * train_images / ours_train + evaluated * eval_images / ours_eval
    authors = rounds * train_images / authors_train + evaluated * eval_images / authors_eval
    return ours / 3600, authors / 3600, source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--throughput", nargs="+", required=True, help="CSV(s) written by train_step.py --out")
    parser.add_argument("--device", help="pick this device's rows (substring; default: the first in the table)")
    parser.add_argument("--configfile", nargs="*", help="default config/config.yaml")
    parser.add_argument("--decode-img-s", type=float, default=100.0,
                        help="the authors' loader: images/s per core decoding an original JPEG and transforming it "
                             "(input_pipeline.py's 'original files' figure; default 100 = ISIC-size order on this machine)")
    parser.add_argument("--authors-loader-cores", type=int, default=1, help="their data-loading processes (num_workers 0: 1)")
    args = parser.parse_args()
    table, device = read_throughput(args.throughput, args.device)
    project = load_project(args.configfile or [ROOT / "config/config.yaml"], root=ROOT)
    sizes = dataset_sizes()
    per_paper: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    cache_passes: dict = {}
    sources = set()
    for key in project.plan.runs():
        ours, authors, source = run_hours(project, key, table, sizes, args, cache_passes)
        sources.add(source)
        entry = per_paper[key.paper]
        entry[0] += 1
        entry[1] += ours
        entry[2] += authors
    caches = sum(cache_passes.values()) / 3600
    print(f"throughput of: {device}; image counts from: {', '.join(sorted(sources))}")
    print(f"{'paper':<18} {'runs':>5} {'ours (h)':>12} {'authors (h)':>12} {'ratio':>7}")
    for paper, (runs, ours, authors) in per_paper.items():
        print(f"{paper:<18} {runs:>5} {ours:>12.1f} {authors:>12.1f} {authors / ours:>6.1f}x")
    total_runs = sum(v[0] for v in per_paper.values())
    ours = sum(v[1] for v in per_paper.values()) + caches
    authors = sum(v[2] for v in per_paper.values())
    print(f"feature caches (ours only, {len(cache_passes)} of them): {caches:.1f} h")
    print(f"grid: {total_runs} runs, {ours:.0f} device-hours ours vs {authors:.0f} the authors' way ({authors / ours:.1f}x)")


if __name__ == "__main__":
    main()
