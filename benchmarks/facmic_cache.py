"""Benchmark: FACMIC on cached CLIP features vs. the authors' way (frozen encoder run on every batch).

Same data, same split, same model, same hardware, same engine: N rounds of FACMIC (contrastive loss + LMMD
towards the unlabeled reference set, evaluation of every client and the global set after every round)

  cached:    one feature-extraction pass over every image of the dataset (what `fedrepro features` does),
             then the rounds on the cached features (model family clip_fam);
  uncached:  the rounds with the frozen CLIP encoder applied to every batch of images, as in the
             authors' code (model family clip_fam_images).

It prints both times, their ratio, and the cached run's whole cost (extraction included) relative to one
extraction pass, plus the number of rounds after which that cost would pass 1.5 passes. Both runs see
the same batches, so their final accuracies must agree (up to float rounding): the script checks it.

Defaults finish in well under two minutes on two CPU cores (tiny random-init CLIP, demo data):

    python benchmarks/facmic_cache.py
    python benchmarks/facmic_cache.py --rounds 10
    # a real backbone (weights download once), on a prepared dataset:
    python benchmarks/facmic_cache.py --dataset bt --encoder ViT-B-16 --pretrained openai --rounds 100 \\
        --local-steps 199 --device cuda

Both runs are the pipeline's own jobs (`fedrepro prepare`, `split`, `features`, `image-cache` and the `train`
job) in a scratch folder, on a paper file that trains FACMIC as config/papers/facmic.yaml does: its defaults,
params and optimizer, with this encoder, dataset and budget. A real dataset is read from resources/raw (download
it first: `fedrepro download <dataset>`); offline demo datasets are materialised in the scratch folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="demo_domains", help="a registered dataset (default: demo_domains)")
    p.add_argument("--raw-dir", default=None, help="where its raw files are (default: resources/raw of the repository "
                                                   "for real datasets, a scratch folder for offline demo data)")
    p.add_argument("--encoder", default="fedrepro-tiny-clip", help="open_clip model name")
    p.add_argument("--pretrained", default="none", help="open_clip pretrained tag or checkpoint path")
    p.add_argument("--preprocess", default="clip", choices=["clip", "resize_imagenet"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=0, help="local iterations per round (0 = one epoch)")
    p.add_argument("--eval-every", type=int, default=1, help="evaluate every k rounds (the authors: every round)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default; tiny models run fastest on 1)")
    p.add_argument("--workdir", help="scratch folder (default: a temporary one)")
    return p.parse_args(argv)


def benchmark_paper(args) -> dict:
    """A paper file with FACMIC exactly as config/papers/facmic.yaml trains it (its defaults, params, optimizer),
    on ``--dataset`` with this encoder and budget, twice: on cached features (``clip_fam``) and with the encoder on
    every batch (``clip_fam_images``, the authors' code's path)."""
    facmic = yaml.safe_load((ROOT / "config/papers/facmic.yaml").read_text())
    encoder = {"name": args.encoder, "pretrained": args.pretrained, "preprocess": args.preprocess,
               "prompt": facmic["defaults"]["model"]["encoder"]["prompt"]}
    local = {"steps": args.local_steps, "drop_last": True} if args.local_steps else {"epochs": 1, "drop_last": True}
    variant = facmic["methods"]["facmic"]
    return {
        "paper": "benchmark", "title": "FACMIC: cached features vs the encoder on every batch",
        "defaults": {**facmic["defaults"], "rounds": args.rounds, "batch_size": args.batch_size, "local": local,
                     "eval_every": args.eval_every,
                     "model": {"family": "clip_fam", "encoder": encoder},
                     "selection": {"rule": "last", "metric": "acc"}},
        "settings": {"bench": {"dataset": args.dataset, "split": {
            "kind": "iid", "clients": args.clients, "ratios": {"train": 0.8, "val": 0.1, "test": 0.1},
            "global_test": {"fraction": 0.2}, "reference_fraction": 0.5}}},
        "methods": {"cached": {**variant, "method": "facmic", "label": "FACMIC (cached features)"},
                    "uncached": {**variant, "method": "facmic", "label": "FACMIC (encoder on every batch)",
                                 "train": {"model": {"family": "clip_fam_images", "encoder": encoder}}}},
        "tables": {"times": {"title": "FACMIC both ways", "metric": "acc", "eval": "global",
                             "rows": [{"method": "cached"}, {"method": "uncached"}],
                             "columns": [{"label": args.dataset, "setting": "bench"}]}},
    }


def rounds_seconds(out: Path) -> float:
    """Training and evaluation time of the rounds, from the run's history (the job's start-up is not in it)."""
    history = pd.read_csv(out / "history.csv")
    return float(history["train_s"].sum() + history.get("eval_s", pd.Series(dtype=float)).fillna(0).sum())


def last_accuracy(out: Path) -> float:
    return float(pd.read_csv(out / "history.csv")["global/acc"].dropna().iloc[-1])


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from fedrepro import paths
    from fedrepro.cli import main as fedrepro
    from fedrepro.config import load_project
    from fedrepro.registry import dataset
    from fedrepro.train import train_run

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="facmic-cache-")).resolve()
    (workdir / "papers").mkdir(parents=True, exist_ok=True)
    (workdir / "papers/benchmark.yaml").write_text(yaml.safe_dump(benchmark_paper(args), sort_keys=False))
    spec = dataset(args.dataset)
    raw = args.raw_dir or (str(workdir / "raw") if spec.materialise else str(ROOT / "resources/raw"))
    overrides = {"papers": ["benchmark"], "paper_dir": str(workdir / "papers"), "seeds": [0], "threads": args.threads,
                 "data": {"raw_dir": raw}, "device": args.device, "results_dir": "results"}
    project = load_project([ROOT / "config/config.yaml"], overrides, root=ROOT)
    cached, uncached = (project.resolver.run_config(project.resolver.run_key("benchmark", "bench", m, 0))
                        for m in ("cached", "uncached"))
    split = project.plan.splits()[cached["split_id"]]
    weights = workdir / paths.WEIGHTS_DIR          # pretrained weights: the repository's fetched copies
    if (ROOT / paths.WEIGHTS_DIR).is_dir() and not weights.exists():
        weights.parent.mkdir(parents=True, exist_ok=True)
        weights.symlink_to(ROOT / paths.WEIGHTS_DIR)
    with contextlib.chdir(workdir):          # every job of the pipeline, in the scratch folder
        run_paths = cached["paths"]
        if not (Path(raw) / args.dataset / ".complete").exists():
            fedrepro(["download", args.dataset, "--raw-dir", raw])
        fedrepro(["prepare", args.dataset, "--raw-dir", raw, "--out", run_paths["manifest"]])
        fedrepro(["split", "--dataset", args.dataset, "--manifest", run_paths["manifest"], "--spec",
                  json.dumps(split["spec"]), "--seed", str(split["seed"]), "--out", run_paths["split"]])
        for pixels in (uncached["paths"]["images"] or {}).values():    # decode once, as the image_cache rule does
            if not Path(pixels).exists():
                fedrepro(["image-cache", "--manifest", run_paths["manifest"], "--raw-dir", raw, "--spec",
                          Path(pixels).name.removesuffix(".u8"), "--out", pixels])
        start = time.perf_counter()
        fedrepro(["features", "--dataset", args.dataset, "--manifest", run_paths["manifest"], "--raw-dir", raw,
                  "--encoder", json.dumps(cached["features"]["encoder"]), "--device", args.device,
                  "--out", run_paths["features"]])
        extract_s = time.perf_counter() - start
        outs = {}
        for run in (cached, uncached):
            key = project.resolver.run_key("benchmark", "bench", run["method"], 0)
            train_run(run, paths.run_dir(key), paths.checkpoint_dir(key), logging.getLogger("benchmark"))
            outs[run["method"]] = Path(paths.run_dir(key))
        cached_s, uncached_s = rounds_seconds(outs["cached"]), rounds_seconds(outs["uncached"])
        cached_acc, uncached_acc = last_accuracy(outs["cached"]), last_accuracy(outs["uncached"])
        images = len(pd.read_csv(run_paths["manifest"]))

    total = extract_s + cached_s
    per_round = cached_s / args.rounds
    budget_rounds = 0.5 * extract_s / per_round if per_round > 0 else float("inf")
    report = {
        "images": images, "rounds": args.rounds, "extract_s": extract_s, "cached_rounds_s": cached_s,
        "cached_total_s": total, "uncached_s": uncached_s, "speedup": uncached_s / total,
        "cached_total_over_extract": total / extract_s, "rounds_within_1.5x": budget_rounds,
        "cached_acc": cached_acc, "uncached_acc": uncached_acc,
    }
    print(f"FACMIC, {args.encoder} ({args.pretrained}), {args.dataset}: {images} images, {args.clients} clients, "
          f"{args.rounds} rounds, device {args.device}, torch threads {torch.get_num_threads()}")
    print(f"  one feature-extraction pass (every image once)   {extract_s:9.2f} s")
    print(f"  cached:   {args.rounds} rounds on cached features          {cached_s:9.2f} s   ({per_round:.3f} s/round)")
    print(f"  cached:   total, extraction included              {total:9.2f} s   = {total / extract_s:.2f} x one extraction pass")
    print(f"  uncached: {args.rounds} rounds, encoder on every batch      {uncached_s:9.2f} s   ({uncached_s / args.rounds:.3f} s/round)")
    print(f"  uncached / cached total                           {uncached_s / total:9.2f} x")
    print(f"  the cached total stays within 1.5 extraction passes up to ~{budget_rounds:.0f} rounds at this round cost")
    print(f"  last-round global accuracy: cached {cached_acc:.4f}, uncached {uncached_acc:.4f}")
    if abs(cached_acc - uncached_acc) > 0.02:
        print("  WARNING: the two runs disagree more than float rounding explains")
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
