"""Every distinct combination of the full grid at its real architecture, one round on synthetic data,
measured: the table of docs/fullsize.md.

Runs what tests/test_fullsize.py runs (tests/fullsize_support.py: random weights, real widths, input
shapes, class counts and token lengths, one round of one local step on two clients through the
``train`` job) and prints, per combination, seconds, peak RSS and the parameters trained and
communicated; writes them as CSV and as the Markdown table of docs/fullsize.md.

    python benchmarks/fullsize_smoke.py                          # every combination, depth cut to 2 blocks
    python benchmarks/fullsize_smoke.py --depth full --architectures   # one per architecture, full depth
    python benchmarks/fullsize_smoke.py --depth full --device cuda     # all of them, full depth, on a GPU
    python benchmarks/fullsize_smoke.py -k feddra --threads 2          # a subset (substring of the name)
    python benchmarks/fullsize_smoke.py --numerics authors --device cuda   # the authors' precision (fp16 CLIP weights)

``--out`` (default: docs/fullsize-<depth>.csv) and ``--markdown`` (default:
docs/fullsize.md, the section of this depth replaced) choose where the results go. Run from the
repository root with the package importable (``pip install -e .`` or ``PYTHONPATH=src``).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from docblock import replace_block  # noqa: E402

import fullsize_support as F  # noqa: E402

COLUMNS = ("combination", "architecture", "algorithm", "classes", "input", "depth", "precision", "seconds", "peak_rss_gb",
           "peak_gpu_gb", "loss", "params_total", "params_trained", "params_communicated")


def markdown_table(rows: list[dict]) -> str:
    lines = ["| combination | architecture | classes | s | peak RSS (GB) | parameters (M) | trained (M) | "
             "communicated per client and round (M) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['combination']} | {r['architecture']} | {r['classes']} | {float(r['seconds']):.1f} | "
                     f"{float(r['peak_rss_gb']):.2f} | {int(r['params_total']) / 1e6:.2f} | "
                     f"{int(r['params_trained']) / 1e6:.3f} | {float(r['params_communicated']) / 1e6:.3f} |")
    return "\n".join(lines)


def update_markdown(path: Path, depth: str, header: str, rows: list[dict]) -> None:
    """Replace (or append) the block of this depth in ``path``."""
    replace_block(path, f"fullsize:{depth}", f"{header}\n\n{markdown_table(rows)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", default="2", help="blocks per stack, or 'full' (default 2)")
    parser.add_argument("--architectures", action="store_true", help="one combination per distinct architecture")
    parser.add_argument("-k", dest="keyword", help="only combinations whose name contains this")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per combination")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--protocol", help="run each combination under this protocol; default: the grid's first")
    parser.add_argument("--numerics", choices=("fast", "authors"), default="fast",
                        help="authors: the authors' precision (e.g. CLIP fine-tuned with fp16 weights, slow on a CPU) "
                             "and pixels; default fast (fp32 on a CPU)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs/fullsize.md")
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    depth = None if args.depth == "full" else int(args.depth)
    label = "full" if depth is None else f"depth{depth}"
    combos = F.architectures() if args.architectures else F.combinations()
    if args.keyword:
        combos = [c for c in combos if args.keyword in c.name]
    out = args.out or ROOT / f"docs/fullsize-{label}{'-arch' if args.architectures else ''}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, failed = [], []
    started, load_before = time.time(), os.getloadavg()[1]
    with tempfile.TemporaryDirectory() as tmp:
        for i, combo in enumerate(combos, 1):
            try:
                row = F.run_combination(combo, Path(tmp) / combo.name, depth=depth, threads=args.threads,
                                        device=args.device, protocol=args.protocol, numerics=args.numerics)
            except Exception as error:   # noqa: BLE001 - report every failure, go on with the others
                failed.append(combo.name)
                print(f"[{i}/{len(combos)}] {combo.name}: FAILED\n{error}", file=sys.stderr, flush=True)
                continue
            rows.append(row)
            print(f"[{i}/{len(combos)}] {combo.name:45} {row['precision']:12} {row['seconds']:7.1f} s  {row['peak_rss_gb']:5.2f} GB  "
                  f"trained {row['params_trained'] / 1e6:8.3f} M  communicated {row['params_communicated'] / 1e6:8.3f} M",
                  flush=True)
    with open(out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    total = time.time() - started
    print(f"{len(rows)} combination(s) in {total:.0f} s ({label}); {len(failed)} failed {failed or ''}; -> {out}")
    if not args.no_markdown and rows and not args.keyword:
        what = "one combination per architecture" if args.architectures else "every combination"
        header = (f"**{what.capitalize()}, {'full depth' if depth is None else f'depth cut to {depth} blocks per stack'}**, "
                  f"device {args.device}, {args.threads} torch thread(s): {F.machine()}; {time.strftime('%Y-%m-%d')}; "
                  f"{len(rows)} combinations in {total / 60:.1f} min, load average {load_before:.1f} -> "
                  f"{os.getloadavg()[1]:.1f} (5-min, the machine was shared) "
                  f"(`python benchmarks/fullsize_smoke.py --depth {args.depth}{' --architectures' if args.architectures else ''}`).")
        update_markdown(args.markdown, label + ("-arch" if args.architectures else ""), header, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
