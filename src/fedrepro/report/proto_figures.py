"""Prototype figures of FedAdapterProto (paper Fig. 3: an image of the held-out site; Fig. 4: APTOS
images), ProtoPNet-style: for each chosen image and each client model, the client's most activated
prototype is shown as a red box on the image (the region where its upsampled activation is in the
top 5 %, ProtoPNet's high-activation crop), the upsampled activation map over the image, and the
training patch the prototype was projected onto by the push (so the figure reads "this looks like
that").

The figure loads the run's checkpoint (``results/checkpoints/<run>/model.pt``, written by
:meth:`FedAdapterProto.final_model`: every client's model, its pushed copy and the push record), takes the
pushed copies (the prototypes are then training patches; the evaluated models are unpushed), rebuilds the model
family from the run config and re-runs each client's network on the images. Options
(``figures.<name>.options``): ``images_from`` (global_test | external), ``class`` (a class name, or
null for any), ``count`` (images), ``seed`` (which training seed's models; default the first),
``prototype`` (any = the most activated prototype of all classes, label = of the image's class).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..config import ConfigError, Project, RunKey, check_choice
from ..data import registry
from ..data.images import load_rgb
from ..data.manifest import read_manifest
from ..data.partition import Split
from ..fl.federation import _client_order as client_order
from ..io import read_json
from ..models.families import build_family
from ..models.protoadapter import distance_to_similarity
from ..seeding import numpy_rng
from .figures import _plt, save_figure

OPTIONS = {"images_from": ("global_test", "external"), "prototype": ("any", "label")}


def high_activation_box(activation: np.ndarray, percentile: float = 95.0) -> tuple[int, int, int, int]:
    """(top, bottom, left, right), inclusive, of the pixels at or above the ``percentile`` of ``activation``."""
    mask = activation >= np.percentile(activation, percentile)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    return int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])


def upsampled(activation: torch.Tensor, size: int) -> np.ndarray:
    """An H' x W' activation map resized (bicubic) to size x size."""
    return F.interpolate(activation[None, None].float(), size=(size, size), mode="bicubic", align_corners=False)[0, 0].numpy()


def _options(spec: dict, name: str, project: Project, classes: list[str]) -> dict:
    opts = {"images_from": "global_test", "class": None, "count": 1, "seed": project.config["seeds"][0],
            "prototype": "any", **(spec.get("options") or {})}
    unknown = sorted(set(opts) - {"images_from", "class", "count", "seed", "prototype"})
    if unknown:
        raise ConfigError(f"figures/{name}/options: unknown key(s) {unknown}; allowed: images_from, class, count, seed, prototype")
    for key, allowed in OPTIONS.items():
        check_choice(opts[key], allowed, f"figures/{name}/options/{key}")
    if opts["class"] is not None:
        check_choice(opts["class"], classes, f"figures/{name}/options/class")
    if len(spec.get("settings", [])) != 1 or len(spec.get("methods", [])) != 1:
        raise ConfigError(f"figures/{name}: a prototypes figure takes exactly one setting and one method")
    return opts


def _pick_rows(split: Split, manifest, opts: dict, classes: list[str], name: str) -> list[int]:
    rows = split.global_test if opts["images_from"] == "global_test" else split.external
    if opts["class"] is not None:
        rows = rows[manifest["label"].to_numpy()[rows] == classes.index(opts["class"])]
    if len(rows) < opts["count"]:
        raise ValueError(f"figures/{name}: {opts['images_from']} has {len(rows)} image(s) of class {opts['class']}, "
                         f"{opts['count']} requested")
    return [int(r) for r in numpy_rng(opts["seed"], "figure", name).permutation(rows)[:opts["count"]]]


class _ClientNets:
    """Every client's network from the checkpoint, and what it says about one image."""

    def __init__(self, family, checkpoint: dict, activation: str):
        self.family, self.activation = family, activation
        self.transform = family.eval_transform()
        self.nets = {}
        models = checkpoint.get("pushed") or checkpoint["clients"]        # pushed copies when the run pushed
        for client, state in sorted(models.items(), key=lambda kv: client_order(kv[0])):
            net = family.build()
            net.load_state_dict(state)
            self.nets[client] = net.eval()
        self.push = checkpoint.get("push", {})

    @torch.no_grad()
    def activation_of(self, client: str, image, prototype: int | None, label: int | None):
        """-> (prototype index, its activation map H' x W', similarity, predicted class)."""
        net = self.nets[client]
        out = net(self.transform(image)[None])
        maps = distance_to_similarity(out["distance_maps"][0], self.activation)
        if prototype is None:
            scores = distance_to_similarity(out["min_distances"][0], self.activation)
            if label is not None:
                scores = scores.masked_fill(~net.head.class_identity[:, label].bool(), float("-inf"))
            prototype = int(scores.argmax())
        return prototype, maps[prototype], float(maps[prototype].max()), int(out["logits"][0].argmax())


def prototype_activations(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    setting, method = spec["settings"][0], spec["methods"][0]
    dataset = project.papers[paper]["settings"][setting]["dataset"]
    classes = list(registry.get(dataset).classes)
    opts = _options(spec, name, project, classes)
    key = RunKey(paper, setting, method, opts["seed"])
    run = project.run_config(key)
    model_cfg = run["train"]["model"]
    if model_cfg["family"] != "adapter_protonet" or model_cfg["head"] != "prototypes":
        raise ConfigError(f"figures/{name}: method {method!r} has no prototype layer (model family "
                          f"{model_cfg['family']!r}, head {model_cfg.get('head')!r})")
    checkpoint = torch.load(Path("results/checkpoints") / key.path / "model.pt", map_location="cpu", weights_only=False)["model"]
    family = build_family(run["impl"]["model"], model_cfg, classes, {})
    nets = _ClientNets(family, checkpoint, model_cfg["prototype_activation"])
    manifest = read_manifest(run["paths"]["manifest"])
    split = Split.from_json(read_json(run["paths"]["split"]))
    raw = Path(run["paths"]["raw_dir"])
    size = model_cfg["image_size"]
    picked = _pick_rows(split, manifest, opts, classes, name)

    plt = _plt()
    clients = list(nets.nets)
    n_rows = 3 * len(picked)
    fig, axes = plt.subplots(n_rows, len(clients), figsize=(2.6 * len(clients), 2.6 * n_rows), squeeze=False)
    for i, row in enumerate(picked):
        image = load_rgb(raw / manifest["path"][row])
        shown = np.asarray(image.resize((size, size)))
        label = int(manifest["label"][row])
        for c, client in enumerate(clients):
            j, act, sim, pred = nets.activation_of(client, image, None, label if opts["prototype"] == "label" else None)
            heat = upsampled(act, size)
            _draw_box(axes[3 * i, c], shown, high_activation_box(heat))
            axes[3 * i, c].set_title(f"Client {c + 1}: prototype {j} ({classes[net_class(nets, client, j)]})\n"
                                     f"similarity {sim:.3g}, predicts {classes[pred]}", fontsize=7)
            axes[3 * i + 1, c].imshow(shown)
            axes[3 * i + 1, c].imshow(heat, cmap="jet", alpha=0.5)
            axes[3 * i + 1, c].set_title("upsampled activation", fontsize=7)
            _draw_source_patch(axes[3 * i + 2, c], nets, client, j, manifest, raw, size)
        axes[3 * i, 0].set_ylabel(f"{Path(manifest['path'][row]).name}\n({classes[label]})", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{spec.get('title', name)} ({method}, seed {opts['seed']})", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)


def net_class(nets: _ClientNets, client: str, prototype: int) -> int:
    return int(nets.nets[client].head.class_identity[prototype].argmax())


def _draw_box(ax, shown: np.ndarray, box: tuple[int, int, int, int]) -> None:
    from matplotlib.patches import Rectangle

    top, bottom, left, right = box
    ax.imshow(shown)
    ax.add_patch(Rectangle((left - 0.5, top - 0.5), right - left + 1, bottom - top + 1, fill=False, edgecolor="red", linewidth=1.5))


def _draw_source_patch(ax, nets: _ClientNets, client: str, prototype: int, manifest, raw: Path, size: int) -> None:
    """The training image the prototype was pushed onto, with the patch boxed."""
    record = nets.push.get(client)
    row = int(record["index"][prototype]) if record is not None else -1
    if row < 0:
        ax.text(0.5, 0.5, "no push record", ha="center", va="center", fontsize=7, transform=ax.transAxes)
        return
    image = load_rgb(raw / manifest["path"][row])
    _, act, _, _ = nets.activation_of(client, image, prototype, None)
    _draw_box(ax, np.asarray(image.resize((size, size))), high_activation_box(upsampled(act, size)))
    ax.set_title(f"prototype {prototype} = patch of\n{Path(manifest['path'][row]).name}", fontsize=7)
