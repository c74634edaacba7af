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

With a real dataset, run `fedrepro download <ds>` and `fedrepro prepare <ds> --out resources/manifests/<ds>.csv`
first (or let Snakemake do it); offline demo datasets are materialised into a scratch folder as needed.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="demo_domains", help="a registered dataset (default: demo_domains)")
    p.add_argument("--manifest", help="manifest CSV (default: resources/manifests/<dataset>.csv if it exists)")
    p.add_argument("--raw-dir", default="resources/raw")
    p.add_argument("--limit", type=int, default=0, help="use only the N images drawn at random from the manifest (0 = all)")
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


def prepare(args, workdir: Path):
    """-> (manifest DataFrame, raw root, class names, split)."""
    from fedrepro.data.download import download_dataset
    from fedrepro.data.manifest import read_manifest
    from fedrepro.data.partition import make_split
    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    spec = dataset(args.dataset)
    manifest_path = Path(args.manifest or f"resources/manifests/{args.dataset}.csv")
    raw = Path(args.raw_dir)
    if manifest_path.exists():
        manifest = read_manifest(manifest_path)
    else:
        if not spec.materialise:
            raise SystemExit(f"{manifest_path} not found: run `fedrepro download {args.dataset}` and "
                             f"`fedrepro prepare {args.dataset} --out {manifest_path}` first")
        raw = workdir / "raw"
        download_dataset(spec, raw)
        manifest = prepare_dataset(spec, raw)
    if args.limit:
        manifest = manifest.sample(n=min(args.limit, len(manifest)), random_state=0).sort_index().reset_index(drop=True)
    has_test = (manifest["split"] == "test").any()
    split = make_split(manifest, {"kind": "iid", "clients": args.clients, "ratios": {"train": 0.8, "val": 0.1, "test": 0.1},
                                  "global_test": "official" if has_test else {"fraction": 0.2},
                                  "reference_fraction": 0.5}, seed=0)
    return manifest, raw, list(spec.classes), split


def run_config(args, family: str, encoder: dict) -> dict:
    from fedrepro.config import catalog, validate

    cat = catalog(Path(__file__).resolve().parents[1])
    local = {"steps": args.local_steps, "drop_last": True} if args.local_steps else {"epochs": 1, "drop_last": True}
    return {
        "paper": "benchmark", "setting": args.dataset, "method": f"facmic[{family}]", "seed": 0, "protocol": "clean",
        "config_hash": f"benchmark-{family}",
        "algorithm": {"name": "facmic", "params": validate({}, cat.method_schema("facmic"), "params")},
        "impl": {"model": cat.implementation("model", family)},
        "train": {"rounds": args.rounds, "batch_size": args.batch_size, "eval_batch_size": 256, "eval_every": args.eval_every,
                  "local": local, "num_workers": 0, "aggregation": {"weights": "train_size"},
                  "optimizer": {"name": "adam", "lr": 5e-5, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.02, "persist": True},
                  "model": validate({"family": family, "encoder": dict(encoder)}, cat.model_schema(family), "model"),
                  "selection": {"rule": "last", "metric": "acc", "k": 1}},
    }


def train(run: dict, fed, checkpoint: Path) -> tuple[float, float]:
    """-> (seconds for the rounds, last global accuracy)."""
    from fedrepro.fl.comm import CommLedger
    from fedrepro.fl.engine import run_rounds
    from fedrepro.fl.method import MethodContext
    from fedrepro.methods.facmic import FACMIC

    device = torch.device(run.get("device", "cpu"))
    log = logging.getLogger("benchmark")
    method = FACMIC(MethodContext(run=run, federation=fed, device=device, comm=CommLedger(), log=log))
    checkpoint.unlink(missing_ok=True)          # time every round: never resume an earlier benchmark
    start = time.perf_counter()
    result = run_rounds(method, fed, run, checkpoint, log)
    elapsed = time.perf_counter() - start
    return elapsed, float(result.history["global/acc"].dropna().iloc[-1])


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from fedrepro.features import encode_dataset
    from fedrepro.fl.federation import build_feature_federation, build_image_federation
    from fedrepro.models.families import build_family
    from fedrepro.seeding import configure_determinism, seed_global

    configure_determinism(True)
    # one-off imports (the first optimizer pulls in torch._dynamo, seconds on a CPU) must not count as training
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="facmic-cache-"))
    workdir.mkdir(parents=True, exist_ok=True)
    manifest, raw, classes, split = prepare(args, workdir)
    encoder = {"name": args.encoder, "pretrained": args.pretrained, "preprocess": args.preprocess, "prompt": "a picture of a {}"}
    device = torch.device(args.device)

    # the uncached family loads (and caches) the frozen encoder first, so neither timing includes loading it
    uncached_run = run_config(args, "clip_fam_images", encoder)
    family = build_family(uncached_run["impl"]["model"], uncached_run["train"]["model"], classes, {}).to(device)

    seed_global(0, "init")              # what `fedrepro features` does (random-init encoders match)
    start = time.perf_counter()
    cache = encode_dataset(manifest, raw, classes, encoder, device, progress=False)
    extract_s = time.perf_counter() - start

    cached_run = run_config(args, "clip_fam", encoder)
    for run in (cached_run, uncached_run):
        run["device"] = args.device
    cached_s, cached_acc = train(cached_run, build_feature_federation(split, "clean", cache, classes), workdir / "cached.pt")
    images = build_image_federation(split, "clean", manifest, raw, classes, family.train_transform(), family.eval_transform())
    uncached_s, uncached_acc = train(uncached_run, images, workdir / "uncached.pt")

    total = extract_s + cached_s
    per_round = cached_s / args.rounds
    budget_rounds = 0.5 * extract_s / per_round if per_round > 0 else float("inf")
    report = {
        "images": len(manifest), "rounds": args.rounds, "extract_s": extract_s, "cached_rounds_s": cached_s,
        "cached_total_s": total, "uncached_s": uncached_s, "speedup": uncached_s / total,
        "cached_total_over_extract": total / extract_s, "rounds_within_1.5x": budget_rounds,
        "cached_acc": cached_acc, "uncached_acc": uncached_acc,
    }
    print(f"FACMIC, {args.encoder} ({args.pretrained}), {args.dataset}: {len(manifest)} images, {args.clients} clients, "
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
