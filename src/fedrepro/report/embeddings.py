"""Figure kinds drawn from what the ``embed`` rule extracted from trained models (:mod:`fedrepro.embed`):

- ``tsne``: t-SNE of the final global models' feature-extractor outputs on the global test set, a
  panel per setting x method, coloured by class, first seed (FedIIC supplementary Figs. 1-2).
  Options: ``max_points`` (extraction), ``perplexity``.
- ``prototypes``: ProtoPNet-style prototype figures (FedAdapterProto Figs. 3-4), drawn as the paper draws them: for
  each chosen image and each client model, the client's prototype of highest similarity as a red box on the image
  (its top 5 % upsampled similarity), its similarity map over the image on the model's own scale with the boxed part
  enlarged, and the training patch the prototype was projected onto by the push ("this looks like that"). Options: ``images_from`` (global_test |
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


def _draw_box(ax, shown: np.ndarray, box, colour: str = "red") -> None:
    from matplotlib.patches import Rectangle

    top, bottom, left, right = (int(v) for v in box)
    ax.imshow(shown)
    ax.add_patch(Rectangle((left - 0.5, top - 0.5), right - left + 1, bottom - top + 1, fill=False, edgecolor=colour,
                           linewidth=2))


def _enlarged(ax, image: np.ndarray, box) -> None:
    """The boxed patch, enlarged in the panel's corner farthest from it (the paper: "the prototype part of the image is
    enlarged ... for clarity"), small enough to leave every cell of a coarse map visible."""
    top, bottom, left, right = (int(v) for v in box)
    height, width = image.shape[:2]
    x = 0.02 if (left + right) / 2 > width / 2 else 0.65      # axes coordinates: y grows upwards, rows downwards
    y = 0.65 if (top + bottom) / 2 > height / 2 else 0.02
    inset = ax.inset_axes([x, y, 0.33, 0.33])
    inset.imshow(image[top:bottom + 1, left:right + 1], interpolation="nearest")
    inset.set_xticks([])
    inset.set_yticks([])
    for spine in inset.spines.values():
        spine.set_edgecolor("red")
        spine.set_linewidth(1.5)


SIMILARITY = {"linear": "similarity = −‖z − p‖² (the code's; 0 = identical)",
              "log": "similarity = log((d + 1) / (d + 1e-4)) (ProtoPNet's)"}


@register_figure_kind("prototypes", inputs=prototype_inputs)
def prototype_activations(item: ReportItem, out_png: Path) -> None:
    """As the paper draws its Figs. 3-4, one column per client and, per chosen image, three rows: the image with a red
    box where the client's prototype of highest similarity fires (the top 5 % of its upsampled similarity map, or its
    best cell for a map of few cells: :func:`fedrepro.embed.upsampling`); that
    map over the image, on the model's own similarity scale (a colour bar per image, shared by the clients), with the
    boxed part enlarged; and the training image the prototype was projected onto by the push (the prototype *is* its
    boxed patch: "this looks like that")."""
    setting, method = item.spec["settings"][0], item.spec["methods"][0]
    seed = _prototype_seed(item)
    with np.load(item.embedding(setting, method, seed)) as data:
        d = {k: data[k] for k in data.files}
    classes, clients = [str(c) for c in d["classes"]], [str(c) for c in d["clients"]]
    activation = str(d["activation"]) if "activation" in d else "linear"
    map_shape = " x ".join(str(int(v)) for v in d["map_shape"]) if "map_shape" in d else "?"
    resized = ("shown cell by cell, the box its cell of highest similarity" if str(d.get("upsampling", "")) == "nearest"
               else "upsampled (bicubic) to the image, the box its top 5 %")
    plt = pyplot()
    n_rows = 3 * len(d["rows"])
    fig, axes = plt.subplots(n_rows, len(clients), figsize=(2.9 * len(clients) + 0.8, 2.9 * n_rows), squeeze=False)
    for i in range(len(d["rows"])):
        shown = d["images"][i]
        vmin, vmax = float(d["heat"][i].min()), float(d["heat"][i].max())
        label = classes[int(d["labels"][i])]
        for c in range(len(clients)):
            j = int(d["prototype"][i, c])
            ax = axes[3 * i, c]
            _draw_box(ax, shown, d["box"][i, c])
            ax.set_title(f"Client {c + 1}: prototype {j} ({classes[int(d['prototype_class'][i, c])]})\n"
                         f"predicts {classes[int(d['predicted'][i, c])]}", fontsize=9)
            ax = axes[3 * i + 1, c]
            ax.imshow(shown.mean(axis=2), cmap="gray")
            heat = ax.imshow(d["heat"][i, c], cmap="jet", alpha=0.55, vmin=vmin, vmax=vmax)
            _enlarged(ax, shown, d["box"][i, c])
            ax.set_title(f"similarity map: max {d['similarity'][i, c]:.3g}", fontsize=9)
            ax = axes[3 * i + 2, c]
            if d["source_box"][i, c][0] < 0:
                ax.text(0.5, 0.5, "no push record", ha="center", va="center", fontsize=8, transform=ax.transAxes)
            else:
                _draw_box(ax, d["source_image"][i, c], d["source_box"][i, c])
                ax.set_title(f"prototype {j} = this training patch\n({d['source_path'][i, c]})", fontsize=8)
        bar = axes[3 * i + 1, -1].inset_axes([1.05, 0.0, 0.06, 1.0])       # beside the row: every panel the same size
        fig.colorbar(heat, cax=bar, label="similarity")
        axes[3 * i, 0].set_ylabel(f"{d['paths'][i]}\n(true class: {label})", fontsize=8)
        axes[3 * i + 1, 0].set_ylabel("over the image", fontsize=8)
        axes[3 * i + 2, 0].set_ylabel("the prototype's source", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    suptitle(fig, item.title, f"{item.method_label(method)}, seed {seed}; its {map_shape} similarity map {resized}; "
                              f"{SIMILARITY.get(activation, activation)}")
    lines = fig.get_suptitle().count("\n") + 1           # room for the title's lines and the first row's two
    fig.subplots_adjust(top=1 - (0.35 + 0.2 * lines + 0.45) / fig.get_figheight(), hspace=0.35, wspace=0.12)
    save_figure(fig, out_png)
    plt.close(fig)
