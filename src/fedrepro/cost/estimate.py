"""What building one target takes, before running it: its jobs, their GPU-hours and their memory
(``fedrepro estimate <target file>``).

Which jobs a target needs is the workflow's own answer (:meth:`fedrepro.dag.Dag.target`: the configuration's
tables, figures and runs, a report item's declared inputs), found without planning the DAG; this module counts
what of them is already on disk as done and prices the rest. Every figure printed says where it comes from:
*measured* (a throughput table, :mod:`fedrepro.cost.throughput`), *estimated* (the memory estimate from the
configs, :mod:`fedrepro.cost.memory`), *assumed* (image counts from ``benchmarks/dataset_sizes.csv``) or *guess*
(what a job asks for without a table).
"""

from __future__ import annotations

from pathlib import Path

from .. import paths
from . import runtime as cost
from .throughput import Table


def _exists(path: str | None) -> bool:
    return bool(path) and Path(path).exists()


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 360 else f"{seconds / 60:.0f} min"


def summary(project, target, table: Table | None, table_why: str,
            authors: cost.AuthorsWay = cost.AuthorsWay()) -> list[str]:
    """The lines ``fedrepro estimate <target>`` prints for ``target`` (a :class:`fedrepro.dag.Target`: the jobs it
    needs)."""
    from .memory import fmt, planned

    runs = target.runs
    todo = [k for k in runs if not _exists(paths.run_file(k))]
    configs = {k: project.resolver.run_config(k) for k in runs}
    image_runs = [k for k in todo if configs[k]["input"] != "features"]
    feature_runs = [k for k in todo if configs[k]["input"] == "features"]
    caches = {(configs[k]["dataset"], configs[k]["features"]["key"]): configs[k]["paths"]["features"] for k in feature_runs}
    caches_todo = {c: p for c, p in caches.items() if not _exists(p)}
    pixels = {p for k in image_runs for p in (configs[k]["paths"]["images"] or {}).values()}
    pixels_todo = [p for p in pixels if not _exists(p)]
    downstream_todo = [d for d in target.downstream if not _exists(paths.downstream(*d))]
    embeds_todo = [e for e in target.embeds if not _exists(paths.embedding(*e))]

    out = [f"target: {target.path}: {target.what}",
           f"jobs it needs (to build / in all; what is on disk is done; `snakemake -n {target.path}` lists them):",
           f"  train, image runs (1 GPU each)                  {len(image_runs):>5} / {sum(configs[k]['input'] != 'features' for k in runs)}",
           f"  train, runs on cached features (CPU, packed)    {len(feature_runs):>5} / {sum(configs[k]['input'] == 'features' for k in runs)}",
           f"  features: frozen-encoder caches (1 GPU each)    {len(caches_todo):>5} / {len(caches)}",
           f"  image_cache: decode-once caches (CPU)           {len(pixels_todo):>5} / {len(pixels)}"]
    if target.downstream:
        out.append(f"  downstream evaluations (1 GPU each)             {len(downstream_todo):>5} / {len(target.downstream)}")
    if target.embeds:
        out.append(f"  embed: figure extractions (CPU)                 {len(embeds_todo):>5} / {len(target.embeds)}")

    # memory: one estimate per (protocol, paper, setting, method): seeds share it
    workers = project.config["image_run_threads"] - 1
    first = {}
    for k in todo:
        first.setdefault((k.protocol, k.paper, k.setting, k.method), k)
    estimates = {k: planned(project, k, workers=workers) for k in first.values()}

    out.append("GPU-hours of what is to build:")
    requests = {}
    if table is None:
        out.append(f"  cannot be given in GPU-hours: {table_why}.")
        out.append("  No GPU figure has been measured in this repository yet. On a GPU node, "
                   "`python benchmarks/train_step.py --device cuda` writes benchmarks/gpu/<gpu>.csv; then run this again.")
    else:
        kind = "GPU" if table.gpu else "device (not a GPU)"
        out.append(f"  rates measured on {table.describe()} [{kind}]")
        costs = [cost.run_cost(project, k, table, authors, profile=_profile(estimates, first, k)) for k in todo]
        missing = sorted({m for c in costs for m in c.missing})
        ours = sum(c.ours_s or 0 for c in costs if c.on_gpu)
        built = set()
        for c in costs:
            if c.cache in caches_todo and c.cache not in built and c.cache_s is not None:
                ours += c.cache_s
                built.add(c.cache)
        authors_s = sum(c.authors_s or 0 for c in costs)
        sources = sorted({c.source for c in costs if c.source})
        partial = " (partial: see 'not measured')" if missing else ""
        out.append(f"  ours: {_hours(ours)}{partial}: image runs on the GPU and {len(built)} feature cache(s); "
                   f"the {len(feature_runs)} runs on cached features train on CPUs and are not in it")
        out.append(f"  the authors' way (fp32, no feature cache, decoding every epoch): {_hours(authors_s)}{partial}"
                   + (f" ({authors_s / ours:.1f}x)" if ours and not missing else ""))
        if sources:
            out.append(f"  image counts from: {', '.join(sources)}")
        out.append("  not in it: downstream heads, figure extractions (not measured); methods' extra "
                   "forward passes are counted from the copies they keep")
        for m in missing:
            out.append(f"  not measured: {m}")
        for k in image_runs:
            key = first[(k.protocol, k.paper, k.setting, k.method)]
            requests.setdefault(key, cost.train_request(project, key, estimates[key], table))
    if estimates:
        host_key = max(estimates, key=lambda k: estimates[k].host_bytes)
        out.append("memory per run (estimated from the configs, not measured; `fedrepro estimate <paper> <setting> "
                   "<method>` prints the parts):")
        out.append(f"  largest host memory: {fmt(estimates[host_key].host_bytes)} ({host_key.path})")
        gpu_runs = [k for k in estimates if estimates[k].gpu]
        if gpu_runs:
            gpu_key = max(gpu_runs, key=lambda k: estimates[k].gpu_bytes)
            out.append(f"  largest GPU memory: {fmt(estimates[gpu_key].gpu_bytes)} ({gpu_key.path})")
            if table is not None:
                measured = cost.measured_gpu_mb(table, configs[gpu_key], estimates[gpu_key])
                out.append("  that run by its family's measured peak: "
                           + (f"{measured / 1024:.2f} GiB on {table.device_name} (the estimate: "
                              f"{fmt(estimates[gpu_key].gpu_bytes)})"
                              if measured is not None else f"not measured (no peak GPU memory of its family in {table.path})"))
    out.append("SLURM requests of the image runs (attempt 1; each retry multiplies them):")
    if requests:
        minutes = [r.runtime for r in requests.values()]
        gpu = [r.gpu_mem_mb for r in requests.values()]
        measured = sum(r.measured for r in requests.values())
        rest = f"; the other {len(requests) - measured}: guesses" if measured < len(requests) else ""
        out.append(f"  runtime {_span(minutes)} min, gpu_mem_mb {_span(gpu)}: {measured} of "
                   f"{len(requests)} run variants (first seed) from the measured rates ({cost.RUNTIME_MARGIN}x + "
                   f"{cost.RUNTIME_OVERHEAD_MIN} min; GPU memory {cost.GPU_MEMORY_MARGIN}x the measured peak, at least "
                   f"the estimate){rest}")
    elif image_runs:
        gpu = [estimates[k].gpu_mb() for k in estimates if estimates[k].gpu]
        out.append(f"  runtime {cost.FALLBACK_RUNTIME['train_images']} min each (a guess: no throughput table), "
                   f"gpu_mem_mb {_span(gpu)} (the estimate)")
    else:
        out.append("  none to build")
    return out


def _span(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _profile(estimates: dict, first: dict, key) -> dict:
    return estimates[first[(key.protocol, key.paper, key.setting, key.method)]].profile
