"""Figure kinds drawn from what the ``embed`` rule extracted from trained models (:mod:`fedrepro.embed`):

- ``tsne``: t-SNE of the final global models' feature-extractor outputs on the global test set, a
  panel per setting x method, coloured by class, first seed (FedIIC supplementary Figs. 1-2).
  Options: ``max_points`` (extraction), ``perplexity``.
- ``prototypes``: ProtoPNet-style prototype figures (FedAdapterProto Figs. 3-4): for each chosen image
  and each client model, the client's most activated prototype as a red box on the image (its top 5 %
  upsampled activation), the activation map over the image, and the training patch the prototype was
  projected onto by the push ("this looks like that"). Options: ``images_from`` (global_test |
  external), ``class``, ``count``, ``seed`` (which training seed's models), ``prototype`` (any | label).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import paths
from ..registry import register_figure_kind
from .item import ReportItem, embedding_inputs
from .plotting import pyplot, save_figure, suptitle


@register_figure_kind("tsne", inputs=embedding_inputs())
def tsne(item: ReportItem, out_png: Path) -> None:
    from sklearn.manifold import TSNE

    plt, spec = pyplot(), item.spec
    options = spec.get("options") or {}
    seed = item.seeds[0]
    panels = [(s, m) for s in spec["settings"] for m in spec["methods"]]
    fig, axes = plt.subplots(len(spec["settings"]), len(spec["methods"]),
                             figsize=(4.2 * len(spec["methods"]), 4.0 * len(spec["settings"])), squeeze=False)
    for ax, (setting, method) in zip(axes.flat, panels):
        with np.load(item.embedding(setting, method, seed)) as data:
            feats, labels, classes = data["features"], data["labels"], [str(c) for c in data["classes"]]
        perplexity = min(float(options.get("perplexity", 30.0)), max(2.0, (len(feats) - 1) / 3))
        embedded = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(feats)
        for c, class_name in enumerate(classes):
            members = labels == c
            if members.any():
                ax.scatter(embedded[members, 0], embedded[members, 1], s=6, label=class_name)
        ax.set_title(f"{item.method_label(method)} — {item.setting_label(setting)}")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.legend(fontsize=6, markerscale=2, loc="best")
    suptitle(fig, item.title, f"seed {seed}, global test set")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)


def _prototype_seed(item: ReportItem) -> int:
    return int((item.spec.get("options") or {}).get("seed", item.seeds[0]))


def prototype_inputs(item: ReportItem) -> list[str]:
    seed = _prototype_seed(item)
    return [paths.embedding(item.key(s, m, seed), item.name) for s in item.spec["settings"] for m in item.spec["methods"]]


def _draw_box(ax, shown: np.ndarray, box) -> None:
    from matplotlib.patches import Rectangle

    top, bottom, left, right = (int(v) for v in box)
    ax.imshow(shown)
    ax.add_patch(Rectangle((left - 0.5, top - 0.5), right - left + 1, bottom - top + 1, fill=False, edgecolor="red", linewidth=1.5))


@register_figure_kind("prototypes", inputs=prototype_inputs)
def prototype_activations(item: ReportItem, out_png: Path) -> None:
    setting, method = item.spec["settings"][0], item.spec["methods"][0]
    seed = _prototype_seed(item)
    with np.load(item.embedding(setting, method, seed)) as data:
        d = {k: data[k] for k in data.files}
    classes, clients = [str(c) for c in d["classes"]], [str(c) for c in d["clients"]]
    plt = pyplot()
    n_rows = 3 * len(d["rows"])
    fig, axes = plt.subplots(n_rows, len(clients), figsize=(2.6 * len(clients), 2.6 * n_rows), squeeze=False)
    for i in range(len(d["rows"])):
        shown = d["images"][i]
        for c in range(len(clients)):
            j = int(d["prototype"][i, c])
            _draw_box(axes[3 * i, c], shown, d["box"][i, c])
            axes[3 * i, c].set_title(f"Client {c + 1}: prototype {j} ({classes[int(d['prototype_class'][i, c])]})\n"
                                     f"similarity {d['similarity'][i, c]:.3g}, predicts {classes[int(d['predicted'][i, c])]}",
                                     fontsize=7)
            axes[3 * i + 1, c].imshow(shown)
            axes[3 * i + 1, c].imshow(d["heat"][i, c], cmap="jet", alpha=0.5)
            axes[3 * i + 1, c].set_title("upsampled activation", fontsize=7)
            ax = axes[3 * i + 2, c]
            if d["source_box"][i, c][0] < 0:
                ax.text(0.5, 0.5, "no push record", ha="center", va="center", fontsize=7, transform=ax.transAxes)
            else:
                _draw_box(ax, d["source_image"][i, c], d["source_box"][i, c])
                ax.set_title(f"prototype {j} = patch of\n{d['source_path'][i, c]}", fontsize=7)
        axes[3 * i, 0].set_ylabel(f"{d['paths'][i]}\n({classes[int(d['labels'][i])]})", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{item.title} ({method}, seed {seed})", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
