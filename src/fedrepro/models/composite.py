"""Composite CLIPs: open_clip's custom-tower CLIP built from two towers that were pretrained apart.

No CLIP weights can be had offline, but real pretrained weights of an image network and of a text
network ship as Python packages: the EfficientNet-Lite0 ImageNet weights and MiniLM (a 6-layer BERT
sentence encoder). ``fedrepro-lite0-minilm`` (``models/configs/composite/``) joins them the way
open_clip joins any timm image tower and Hugging Face text tower: image features (1280, pooled) and
mean-pooled text features (384) are each mapped by a linear projection into one 256-d embedding
space, where cos(image, text) x exp(t) scores a pair. The families that run real CLIP
(``clip_fam``, ``clip_adapter``, ``clip_full``, ``clip_lora``, ``clip_prompt``, and the image-path
twins) run it unchanged.

The image tower's BatchNorm layers keep their pretrained statistics, in training too
(:func:`freeze_norm_statistics`; config ``freeze_norm_statistics``).

``pretrained`` of a composite:

- ``towers``: each tower's own pretrained weights; the projections and the temperature fresh (seeded).
  The towers have never seen each other, so the model is *not* aligned: zero-shot scores are chance.
- ``aligned``: the towers as above, plus projections and temperature fitted once with the CLIP loss,
  both towers frozen, on held-out image-caption pairs (a miniature CLIP pre-training; :func:`align`):
  for ``fedrepro-lite0-minilm``, 2,000 Fashion-MNIST training images that no demo dataset contains
  (images 1,000-1,199 of each class; the demo sets take theirs from rows below 400 and, for
  ``demo_scanners``, from 1,500 on), each captioned by a template and its class name. Zero-shot transfer is then meaningful on
  the original domain and degrades on the demo's shifted domains (inverted, rotated, edges), which is
  what the domain-adaptation methods are for. The fit takes seconds; its result is a weights resource
  (``composite--<name>--aligned``, with a SHA-256 manifest) built by the ``weights`` step before any
  job that loads the model, like a download.
- ``none``: everything random (tests).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from .packaged import convert_efficientnet_pytorch, is_efficientnet_pytorch_state, resolve_weights

COMPOSITE_DIR = Path(__file__).parent / "configs" / "composite"
PRETRAINED = ("towers", "aligned", "none")
ALIGNED_FILE = "aligned.pt"


def config(name: str) -> dict | None:
    """The config of a composite CLIP (``models/configs/composite/<name>.json``), or None."""
    path = COMPOSITE_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def weights(name: str, pretrained: str, where: str = "") -> list:
    """The weights resources a composite loads: the fitted projections for ``aligned`` (the towers'
    weights ship as packages and need no step)."""
    from .weights import WeightSpec

    if pretrained not in PRETRAINED:
        raise ValueError(f"{where or name}: a composite CLIP takes pretrained {' | '.join(PRETRAINED)}, not {pretrained!r}")
    return [WeightSpec("composite", name, "aligned", where=where)] if pretrained == "aligned" else []


def build(name: str, pretrained: str, device: str = "cpu"):
    """-> (CustomTextCLIP in eval mode, eval preprocess, tokenizer) with the towers' weights (``towers``,
    ``aligned``) or random ones (``none``); the projections are fresh here (see :func:`load`)."""
    import open_clip
    import torch
    from transformers.utils import logging as hf_logging

    if pretrained not in PRETRAINED:
        raise ValueError(f"composite CLIP {name}: pretrained must be one of {list(PRETRAINED)}, not {pretrained!r}")
    cfg = copy.deepcopy(config(name))
    extra = cfg.pop("fedrepro")
    text = cfg["text_cfg"]
    text.update(hf_model_name=resolve_weights(text["hf_model_name"]), hf_tokenizer_name=resolve_weights(text["hf_tokenizer_name"]),
                hf_model_pretrained=pretrained != "none")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = open_clip.CustomTextCLIP(**cfg)
    if pretrained != "none":
        trunk = model.visual.trunk
        source = extra["image_weights"]
        state = torch.load(resolve_weights(source), map_location="cpu", weights_only=True)
        if is_efficientnet_pytorch_state(state):
            state = convert_efficientnet_pytorch(state, trunk.state_dict(), source)
        missing, unexpected = trunk.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{source} does not fit the image tower {cfg['vision_cfg']['timm_model_name']}: "
                             f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    if extra.get("freeze_norm_statistics"):
        freeze_norm_statistics(model.visual)
    size = cfg["vision_cfg"]["image_size"]
    preprocess = open_clip.image_transform(size, is_train=False, mean=tuple(extra["mean"]), std=tuple(extra["std"]))
    tokenizer = open_clip.tokenizer.HFTokenizer(text["hf_tokenizer_name"], context_length=text["context_length"])
    return model.to(device).eval(), preprocess, tokenizer


def _keep_statistics(module, inputs) -> None:
    module.eval()


def freeze_norm_statistics(tower) -> int:
    """Make every BatchNorm of ``tower`` normalise with its pretrained running statistics, in training
    too (its scale and shift still train). CLIP's towers normalise per sample (LayerNorm) and have no
    statistics to drift; a BatchNorm CNN fine-tuned on small batches of a new domain would otherwise
    replace ImageNet's statistics within a few steps and lose the features the projections were fitted
    to. -> the number of BatchNorm layers."""
    from torch import nn

    norms = [m for m in tower.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.register_forward_pre_hook(_keep_statistics)
    return len(norms)


def projection_keys(model) -> list[str]:
    """What :func:`align` fits: the two projections and the temperature."""
    return [k for k in model.state_dict() if k.startswith(("visual.head.", "text.proj.")) or k == "logit_scale"]


def load(name: str, pretrained: str, device: str = "cpu"):
    """A composite CLIP as :func:`fedrepro.models.encoders.load_open_clip` returns it; ``aligned`` loads the
    fitted projections from their verified local copy (``fedrepro.models.weights``: a missing, truncated
    or changed file is refused by name, with the command that builds it)."""
    model, preprocess, tokenizer = build(name, "towers" if pretrained == "aligned" else pretrained, device)
    if pretrained == "aligned":
        from .weights import WeightSpec, local_path

        spec = WeightSpec("composite", name, "aligned")
        model.load_state_dict(read_alignment(spec, local_path(spec), model), strict=False)
    return model, preprocess, tokenizer


def read_alignment(spec, path: Path, model=None) -> dict:
    """The fitted projections in ``path``; a file that does not hold them is refused by name."""
    import torch

    from .weights import WeightsCorrupt, fetch_command

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise WeightsCorrupt(f"{path} cannot be read ({error}); build it again:\n{fetch_command(spec, force=True)}") from None
    model = model if model is not None else build(spec.name, "none")[0]
    if sorted(saved.get("state", {})) != sorted(projection_keys(model)):
        raise WeightsCorrupt(f"{path} does not hold the projections of {spec.name}; build it again:\n"
                             f"{fetch_command(spec, force=True)}")
    return saved["state"]


def align(name: str, seed: int = 0, spec: dict | None = None) -> dict:
    """Fit the projections and the temperature of a composite CLIP with the CLIP loss on its held-out
    image-caption pairs (``spec``, default: config ``fedrepro.align``), both towers frozen. -> {"state":
    fitted tensors, "report": what was fitted on, and its zero-shot accuracy on those pairs}."""
    import torch
    import torch.nn.functional as F

    from ..seeding import seed_global, torch_generator

    spec = spec or config(name)["fedrepro"]["align"]
    seed_global(seed, "composite", name)
    model, preprocess, tokenizer = build(name, "towers")
    images, labels, class_names = alignment_pairs(spec)
    with torch.no_grad():
        pixels = torch.stack([preprocess(image) for image in images])
        image_features = torch.cat([model.visual.trunk(chunk) for chunk in pixels.split(256)])
        prompts = [t.format(c) for c in class_names for t in spec["templates"]]
        ids = tokenizer(prompts)
        mask = (ids != model.text.config.pad_token_id).long()
        pooled = model.text.pooler(model.text.transformer(input_ids=ids, attention_mask=mask), mask)
        text_features = pooled.view(len(class_names), len(spec["templates"]), -1)
    heads = [*model.visual.head.parameters(), *model.text.proj.parameters(), model.logit_scale]
    optimizer = torch.optim.Adam(heads, lr=spec["lr"])
    generator = torch_generator(seed, "composite", name)
    labels_t = torch.as_tensor(labels)
    for _ in range(spec["steps"]):
        rows = torch.randint(0, len(labels_t), (spec["batch_size"],), generator=generator)
        template = torch.randint(0, len(spec["templates"]), (spec["batch_size"],), generator=generator)
        image = F.normalize(model.visual.head(image_features[rows]), dim=-1)
        text = F.normalize(model.text.proj(text_features[labels_t[rows], template]), dim=-1)
        logits = model.logit_scale.exp() * image @ text.t()
        target = torch.arange(len(rows))
        loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        image = F.normalize(model.visual.head(image_features), dim=-1)
        text = F.normalize(model.text.proj(text_features[:, 0]), dim=-1)
        accuracy = float(((image @ text.t()).argmax(1) == labels_t).float().mean())
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if k in projection_keys(model)}
    return {"state": state, "report": {"pairs": len(labels), "classes": list(class_names), "steps": spec["steps"],
                                       "final_loss": float(loss.detach()), "zero_shot_accuracy_on_pairs": accuracy,
                                       "source": spec["source"]}}


def alignment_pairs(spec: dict) -> tuple[list, np.ndarray, list[str]]:
    """The held-out images (PIL, RGB), their labels and the class names of an alignment spec."""
    from PIL import Image

    if spec["source"] != "fashion-mnist-train":
        raise ValueError(f"unknown alignment source {spec['source']!r}; allowed: fashion-mnist-train")
    from ..data.datasets.demo_sets import FASHION_CLASSES
    from ..data.demo import fashion_arrays

    pixels, labels = fashion_arrays("train")
    start, stop = spec["rows_per_class"]
    rows = np.concatenate([np.flatnonzero(labels == c)[start:stop] for c in range(len(FASHION_CLASSES))])
    images = [Image.fromarray(pixels[i]).convert("RGB") for i in rows]
    return images, labels[rows].astype(np.int64), list(FASHION_CLASSES)
