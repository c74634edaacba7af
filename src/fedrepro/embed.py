"""What a figure needs from a trained model, extracted once into a small file (the ``embed`` rule).

Some figures look inside trained models: FedIIC's t-SNE of the feature extractor's outputs, and
FedAdapterProto's prototype figures (which image patch each client's most activated prototype is).
Their drawing code must not rerun models, and their rule must declare every file it reads, so this
job loads ``results/checkpoints/<run>/model.pt`` with the run's data once and writes
``results/embeddings/<run>/<figure>.npz``; the figure reads only that file, which DVC tracks.

An extractor registers with :func:`register_extractor` under the figure kind it serves.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from . import records
from .config import ConfigError, check_choice
from .data.manifest import read_manifest
from .data.partition import Split, read_split_file, task_classes
from .io import atomic_path, content_digest, torch_load
from .registry import EXTRACTORS, register_extractor
from .seeding import numpy_rng
from .train import check_model, check_own_split, model_rebuild


def embed(job: dict, out: str | Path) -> None:
    """Run the extractor of ``job["figure"]["kind"]`` and write its arrays to ``out`` (.npz)."""
    from .models.weights import require, weight_specs

    require(weight_specs(model_config(job["run"])))    # the pretrained files the model is built from, before any data
    arrays = EXTRACTORS.get(job["figure"]["kind"]).obj(job)
    # what it was made from, which a figure compares with the run it draws (fedrepro.report.consistency)
    arrays[records.NPZ_MEMBER] = np.array(json.dumps({"config_hash": job["run"]["config_hash"],
                                              "model.pt": content_digest(job["checkpoint"])}, sort_keys=True))
    with atomic_path(out) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)


def _checkpoint(job: dict) -> dict:
    path = Path(job["checkpoint"])
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: the figure {job['figure']['name']} needs the trained model "
                                f"({model_rebuild(path)})")
    checkpoint = torch_load(path, model_rebuild(path))
    check_model(path, job["run"], checkpoint)
    return checkpoint["model"]


def model_config(run: dict) -> dict:
    """The model an embed job rebuilds to load a trained checkpoint into: a backbone's pretrained
    weights (``pretrained``) are off, the checkpoint provides every weight of it; a frozen CLIP
    encoder, which the checkpoint does not hold, is still loaded."""
    cfg = {**run["train"]["model"]}
    if "pretrained" in cfg:
        cfg["pretrained"] = False
    return cfg


def _family(run: dict, classes: list[str]):
    from .models.families import build_family

    return build_family(model_config(run), classes, {})


# --------------------------------------------------------------------------------------------
# t-SNE input: the final global model's features on the global test set (FedIIC supplementary Figs. 1-2)

@register_extractor("tsne")
def global_test_features(job: dict) -> dict:
    """Feature-extractor outputs of the run's final global model on (a sample of) its global test set."""
    from .data.loader import batches
    from .device import Compute, resolve_device
    from .train import load_federation

    run, options = job["run"], job["figure"].get("options") or {}
    max_points, seed = int(options.get("max_points", 2000)), run["seed"]
    fed, _ = load_federation(run)
    if fed.global_test is None:
        raise ValueError(f"setting {run['setting']!r} has no global test set to embed")
    family = _family(run, fed.class_names)
    model = family.build()
    model.load_state_dict(_checkpoint(job)["server"])
    device = resolve_device(run["device"])
    compute = Compute.for_run(run["train"], device).with_model(run["train"].get("channels_last", "auto"), model)
    compute.prepare(model.to(device).eval())
    dataset = fed.global_test
    keep = np.sort(np.random.default_rng(seed).permutation(len(dataset))[:max_points])
    subset = torch.utils.data.Subset(dataset, keep.tolist())
    subset.labels = np.asarray(dataset.labels)[keep]
    feats = []
    with torch.no_grad():
        for batch in batches(subset, run["train"]["eval_batch_size"], shuffle=False):
            with compute.autocast():
                feats.append(family.forward(model, compute.batch(batch)).features.float().cpu())
    return {"features": torch.cat(feats).numpy(), "labels": subset.labels, "classes": np.array(fed.class_names)}


# --------------------------------------------------------------------------------------------
# prototype figures (FedAdapterProto Figs. 3-4): each client's most activated prototype on chosen images

PROTOTYPE_OPTIONS = {"images_from": ("global_test", "external"), "prototype": ("any", "label")}


def prototype_options(spec: dict, name: str, seeds: list[int], classes: list[str]) -> dict:
    opts = {"images_from": "global_test", "class": None, "count": 1, "seed": seeds[0], "prototype": "any",
            **(spec.get("options") or {})}
    unknown = sorted(set(opts) - {"images_from", "class", "count", "seed", "prototype"})
    if unknown:
        raise ConfigError(f"figures/{name}/options: unknown key(s) {unknown}; allowed: images_from, class, count, seed, prototype")
    for key, allowed in PROTOTYPE_OPTIONS.items():
        check_choice(opts[key], allowed, f"figures/{name}/options/{key}")
    if opts["class"] is not None:
        check_choice(opts["class"], classes, f"figures/{name}/options/class")
    if len(spec.get("settings", [])) != 1 or len(spec.get("methods", [])) != 1:
        raise ConfigError(f"figures/{name}: a prototypes figure takes exactly one setting and one method")
    return opts


def high_activation_box(activation: np.ndarray, percentile: float = 95.0) -> tuple[int, int, int, int]:
    """(top, bottom, left, right), inclusive, of the pixels at or above the ``percentile`` of ``activation``."""
    mask = activation >= np.percentile(activation, percentile)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    return int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])


# ProtoPNet resizes a 7 x 7 map bicubically and boxes its top 5 %. A map of at most this many cells (the demo's 2 x 2)
# has its top 5 % inside one cell, where bicubic interpolation would overshoot towards the image's corner: it is shown
# cell by cell (nearest), and the box is the cell of highest similarity, the image region that cell stands for.
FEW_CELLS = 20


def upsampling(activation: torch.Tensor) -> str:
    """How a similarity map is resized to the image: ``bicubic`` (ProtoPNet), ``nearest`` for a map of few cells."""
    return "nearest" if activation.numel() <= FEW_CELLS else "bicubic"


def upsampled(activation: torch.Tensor, size: int) -> np.ndarray:
    """An H' x W' activation map resized to size x size (:func:`upsampling`)."""
    import torch.nn.functional as F

    mode = upsampling(activation)
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    return F.interpolate(activation[None, None].float(), size=(size, size), mode=mode, **kwargs)[0, 0].numpy()


def _pick_rows(split: Split, labels: np.ndarray, opts: dict, classes: list[str], name: str) -> list[int]:
    rows = split.global_test if opts["images_from"] == "global_test" else split.external
    if opts["class"] is not None:
        rows = rows[labels[rows] == classes.index(opts["class"])]
    if len(rows) < opts["count"]:
        raise ValueError(f"figures/{name}: {opts['images_from']} has {len(rows)} image(s) of class {opts['class']}, "
                         f"{opts['count']} requested")
    return [int(r) for r in numpy_rng(opts["seed"], "figure", name).permutation(rows)[:opts["count"]]]


class ClientNets:
    """Every client's network from the checkpoint (the pushed copies: their prototypes are training
    patches), and what it says about one image."""

    def __init__(self, family, checkpoint: dict, activation: str):
        from .fl.federation import client_order

        self.family, self.activation = family, activation
        self.transform = family.eval_transform()
        self.nets = {}
        models = checkpoint.get("pushed") or checkpoint["clients"]
        for client, state in sorted(models.items(), key=lambda kv: client_order(kv[0])):
            net = family.build()
            net.load_state_dict(state)
            self.nets[client] = net.eval()
        self.push = checkpoint.get("push", {})

    @torch.no_grad()
    def activation_of(self, client: str, image, prototype: int | None, label: int | None):
        """-> (prototype index, its activation map H' x W', similarity, predicted class)."""
        from .models.protoadapter import distance_to_similarity

        net = self.nets[client]
        out = net(self.transform(image)[None])
        maps = distance_to_similarity(out["distance_maps"][0], self.activation)
        if prototype is None:
            scores = distance_to_similarity(out["min_distances"][0], self.activation)
            if label is not None:
                scores = scores.masked_fill(~net.head.class_identity[:, label].bool(), float("-inf"))
            prototype = int(scores.argmax())
        return prototype, maps[prototype], float(maps[prototype].max()), int(out["logits"][0].argmax())

    def prototype_class(self, client: str, prototype: int) -> int:
        return int(self.nets[client].head.class_identity[prototype].argmax())


@register_extractor("prototypes")
def prototype_activations(job: dict) -> dict:
    """For each chosen image and client: the image, the prototype of highest similarity (its upsampled similarity map,
    on the model's own scale: -d for the code's linear activation, and its high-activation box), and the training image
    the prototype was pushed onto with its box; the activation function and the map's size (``map_shape``)."""
    from .data.images import load_rgb
    from .fl.federation import task_labels

    run, figure = job["run"], job["figure"]
    model_cfg = run["train"]["model"]
    if model_cfg["family"] != "adapter_protonet" or model_cfg["head"] != "prototypes":
        raise ConfigError(f"figures/{figure['name']}: method {run['method']!r} has no prototype layer (model family "
                          f"{model_cfg['family']!r}, head {model_cfg.get('head')!r})")
    from .registry import DATASETS

    split_file = read_split_file(run["paths"]["split"])
    check_own_split(run, split_file)
    everything = list(DATASETS.get(run["dataset"]).obj.classes)
    kept = task_classes(everything, split_file.get("spec") or {})     # the classes the model was trained on
    classes = [everything[c] for c in kept]
    opts = prototype_options(figure, figure["name"], [run["seed"]], classes)
    nets = ClientNets(_family(run, classes), _checkpoint(job), model_cfg["prototype_activation"])
    manifest = read_manifest(run["paths"]["manifest"])
    labels = task_labels(manifest["label"].to_numpy(), kept)
    split = Split.from_json(split_file)
    raw = Path(run["paths"]["raw_dir"])
    size = model_cfg["image_size"]
    picked = _pick_rows(split, labels, opts, classes, figure["name"])
    clients = list(nets.nets)
    shape = (len(picked), len(clients))
    out = {"clients": np.array(clients), "classes": np.array(classes), "rows": np.array(picked),
           "activation": np.array(model_cfg["prototype_activation"]), "map_shape": np.zeros(2, np.int32),
           "upsampling": np.array("bicubic"),
           "paths": np.array([Path(manifest["path"][r]).name for r in picked]),
           "labels": np.array([int(labels[r]) for r in picked]),
           "images": np.zeros((len(picked), size, size, 3), np.uint8),
           "heat": np.zeros((*shape, size, size), np.float32), "box": np.zeros((*shape, 4), np.int32),
           "prototype": np.zeros(shape, np.int32), "prototype_class": np.zeros(shape, np.int32),
           "similarity": np.zeros(shape, np.float32), "predicted": np.zeros(shape, np.int32),
           "source_image": np.zeros((*shape, size, size, 3), np.uint8), "source_box": np.full((*shape, 4), -1, np.int32),
           "source_path": np.full(shape, "", dtype=object)}
    for i, row in enumerate(picked):
        image = load_rgb(raw / manifest["path"][row])
        out["images"][i] = np.asarray(image.resize((size, size)))
        label = int(labels[row])
        for c, client in enumerate(clients):
            j, act, sim, pred = nets.activation_of(client, image, None, label if opts["prototype"] == "label" else None)
            heat = upsampled(act, size)
            out["heat"][i, c], out["box"][i, c] = heat, high_activation_box(heat)
            out["map_shape"], out["upsampling"] = np.array(act.shape, np.int32), np.array(upsampling(act))
            out["prototype"][i, c], out["prototype_class"][i, c] = j, nets.prototype_class(client, j)
            out["similarity"][i, c], out["predicted"][i, c] = sim, pred
            record = nets.push.get(client)
            source = int(record["index"][j]) if record is not None else -1
            if source >= 0:
                source_image = load_rgb(raw / manifest["path"][source])
                _, source_act, _, _ = nets.activation_of(client, source_image, j, None)
                out["source_image"][i, c] = np.asarray(source_image.resize((size, size)))
                out["source_box"][i, c] = high_activation_box(upsampled(source_act, size))
                out["source_path"][i, c] = Path(manifest["path"][source]).name
    out["source_path"] = out["source_path"].astype(str)
    return out
