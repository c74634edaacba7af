"""GPU-hours of the whole grid, per paper and per table, from a throughput table, ours next to the authors' way.

The cost of one run is ``fedrepro.cost.run_cost`` (the formula is in that module's docstring, and in
benchmarks/README.md): images through a training step and through evaluation, from the run's resolved config
and its split file (else ``benchmarks/dataset_sizes.csv``, labelled an assumption), at the rates of its model
family in the table. Ours: the run's precision (bf16 on a GPU), channels-last for CNNs, the decode-once cache,
runs on cached features (which train on CPUs: counted apart, not in the GPU-hours) plus one encoder pass per
feature cache. The authors' way: fp32, no feature cache (the frozen encoder on every batch), the original files
decoded every epoch by the loader processes of each paper's code (FACMIC and FAA-CLIP: one; FedIIC 4, FedDRA 16,
FedAdapterProto 64, at most the measured node's CPUs).

The table is ``--throughput FILE``, or the repository's table of the GPU ``--gpu`` names (default: the SLURM
profile's GPU model; a profile that names none takes the only table in benchmarks/gpu/). Where no GPU table is
in the repository the script says so and gives no hours. A family the table lacks stops it with its name.

    python benchmarks/train_step.py --device cuda      # on a GPU node: writes benchmarks/gpu/<gpu>.csv
    python benchmarks/gpu_hours.py                      # that table (the SLURM profile's GPU model)
    python benchmarks/gpu_hours.py --throughput my_table.csv --papers facmic
    python benchmarks/gpu_hours.py --throughput my_cpu.csv   # a CPU table (train_step.py --out): device-hours, not GPU

A table's hours count every run and feature cache it needs (runs shared by several tables are in each); the
grid's count each once. The last line reads
``grid: <N> runs, <X> GPU-hours ours vs <Y> the authors' way (<r>x)``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro import paths  # noqa: E402
from fedrepro.config import ConfigError, load_project  # noqa: E402
from fedrepro.cost import runtime as cost  # noqa: E402
from fedrepro.cost.memory import model_profile  # noqa: E402
from fedrepro.cost.throughput import MEASURE, ThroughputError, choose  # noqa: E402


def totals(costs: list) -> tuple[float, float, int]:
    """(ours, authors', feature caches) seconds of ``costs``: image runs on the GPU and each cache once."""
    ours = sum(c.ours_s for c in costs if c.on_gpu)
    caches = {c.cache: c.cache_s for c in costs if c.cache}
    return ours + sum(caches.values()), sum(c.authors_s for c in costs), len(caches)


def ratio(items: list, ours: float, authors: float) -> str:
    """authors' / ours, where ours has GPU runs (a table of runs on cached features trains on CPUs: no ratio)."""
    return f"{authors / ours:.1f}x" if ours and any(c.on_gpu for c in items) else "(CPU)"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f}" if seconds >= 360 else f"{seconds / 3600:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--throughput", help="a throughput table (default: benchmarks/gpu/'s table of --gpu)")
    parser.add_argument("--gpu", help="GPU model whose table in benchmarks/gpu/ to read (default: the SLURM profile's)")
    parser.add_argument("--configfile", nargs="*", help="default config/config.yaml")
    parser.add_argument("--papers", nargs="*", help="only these papers (default: every paper of the configuration)")
    parser.add_argument("--decode-img-s", type=float,
                        help="the authors' loader: images/s per process decoding an original JPEG (default: the table's "
                             "decode_img_s, measured on the GPU node's CPU)")
    parser.add_argument("--authors-loader-cores", type=int,
                        help="their data-loading processes (default: each paper's code's, fedrepro.cost.AUTHORS_LOADER_PROCESSES)")
    args = parser.parse_args(argv)
    try:
        project = load_project(args.configfile or [ROOT / "config/config.yaml"], root=ROOT)
        table, why = choose(args.throughput, args.gpu)
    except (ConfigError, ThroughputError) as error:
        print(f"gpu_hours.py: {error}", file=sys.stderr)
        return 1
    keys = [k for k in project.plan.runs() if not args.papers or k.paper in args.papers]
    if table is None:
        images = sum(project.resolver.run_config(k)["input"] != "features" for k in keys)
        print(f"GPU-hours cannot be given: {why}.")
        print(f"No GPU figure has been measured in this repository yet. The grid has {len(keys)} runs ({images} on "
              f"images, one GPU each; {len(keys) - images} on cached features, CPU jobs), and "
              f"{len(project.plan.features())} feature caches (GPU jobs).")
        print(f"On a GPU node: {MEASURE} (writes {paths.throughput_table('<gpu>')}), then this script again.")
        return 1
    authors = cost.AuthorsWay(args.authors_loader_cores, args.decode_img_s)
    costs = {}
    for key in keys:
        run = project.resolver.run_config(key)
        costs[key] = cost.run_cost(project, key, table, authors, profile=model_profile(run))
    missing = sorted({m for c in costs.values() for m in c.missing})
    if missing:
        print("the throughput table lacks figures the estimate needs:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    unit = "GPU-h" if table.gpu else "device-h (not a GPU)"
    print(f"throughput of: {table.describe()}")
    print(f"image counts from: {', '.join(sorted({c.source for c in costs.values()}))}")
    print(f"{'paper':<18} {'runs':>5} {'on GPU':>6} {'ours (' + unit + ')':>16} {'authors (' + unit + ')':>19} {'ratio':>6}")
    by_paper = defaultdict(list)
    for key, c in costs.items():
        by_paper[key.paper].append(c)
    for paper, items in by_paper.items():
        ours, theirs, _ = totals(items)
        print(f"{paper:<18} {len(items):>5} {sum(c.on_gpu for c in items):>6} {hours(ours):>16} {hours(theirs):>19} "
              f"{ratio(items, ours, theirs):>6}")
    print("\nper table (its runs and feature caches; a run shared by tables is in each):")
    print(f"{'table':<40} {'runs':>5} {'on GPU':>6} {'ours (' + unit + ')':>16} {'authors (' + unit + ')':>19} {'ratio':>6}")
    for protocol, paper, name in project.plan.tables():
        if args.papers and paper not in args.papers:
            continue
        items = [costs[k] for k in project.plan.table_runs(paper, name, protocol) if k in costs]
        if not items:
            continue        # a table of split counts or class balance: no training
        ours, theirs, _ = totals(items)
        print(f"{protocol + '/' + paper + '/' + name:<40} {len(items):>5} {sum(c.on_gpu for c in items):>6} "
              f"{hours(ours):>16} {hours(theirs):>19} {ratio(items, ours, theirs):>6}")
    ours, theirs, caches = totals(list(costs.values()))
    cache_s = sum({c.cache: c.cache_s for c in costs.values() if c.cache}.values())
    on_cpu = sum(not c.on_gpu for c in costs.values())
    downstream = sum(1 for k, _ in project.plan.downstream_jobs().values() if k in costs)
    print(f"\nfeature caches (ours only, {caches} of them): {hours(cache_s)} h, in the totals")
    print(f"not in the hours: {on_cpu} runs on cached features (CPU jobs, ours), {downstream} downstream evaluations "
          f"(their heads are not measured)")
    print(f"grid: {len(costs)} runs, {ours / 3600:.0f} {unit} ours vs {theirs / 3600:.0f} the authors' way "
          f"({ratio(list(costs.values()), ours, theirs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
