"""A timm classifier with a contrastive projection head, trained on multi-view batches (FedIIC;
docs/papers/fediic.md).

The network is the classifier of :class:`~fedrepro.models.families.TimmClassifierNet` (backbone g ->
dropout -> linear head f) plus a projector h fed with the pooled features *before* dropout, as in
the FedIIC code. FedIIC calls h a "2-layer MLP as in SimCLR"; the authors' code stacks two Linear
layers with no non-linearity in between. ``projector.activation`` chooses: ``none`` (default, the
code that produced the published numbers) or ``relu`` (the text).

Multi-view batches: with ``views: 2`` the training transform returns two augmentations of every
image, stacked (``batch["x"]``: B x 2 x C x H x W). :meth:`ProjectedClassifierFamily.forward` runs
both views through the network in one pass (BatchNorm sees all 2B images, as in the code), returns
the first view's logits as the classification output and keeps every view's features for the
projector (:meth:`ProjectedClassifierFamily.project`, view-major order: all first views, then all
second views). Augmentations (FedIIC's code):

- ``skin`` (ISIC, Real): view 1 = RandomResizedCrop(scale 0.08-1) + flip + ColorJitter(0.4, 0.4,
  0.4) + RandAugment ``rand-n2-m10-mstd0.5``; view 2 = SimCLR's (RandomResizedCrop + flip +
  ColorJitter(0.4, 0.4, 0.4, 0.1) with p = 0.8 + grayscale with p = 0.2).
- ``ich``: both views Resize + RandomAffine(10 degrees, translate 0.02) + flip.
- ``none`` / ``flip`` / ``standard``: the generic classifier augmentations (every view drawn anew).

With ``views: 1`` only view 1 is produced: what the baselines train on ("all methods share the same
experimental details"; only FedIIC builds multi-view batches).

Pretrained weights: ``true`` = timm's hub weights; a path or ``package:<module>`` = a checkpoint file
(:func:`fedrepro.models.encoders.create_timm`, which also converts ``efficientnet_pytorch`` checkpoints
such as the offline EfficientNet-Lite0 ImageNet weights).

FedIIC's authors build ``EfficientNet.from_pretrained('efficientnet-b0')`` of efficientnet_pytorch 0.7.1:
the TensorFlow EfficientNet-B0 (TF "same" padding, BatchNorm eps 1e-3 and momentum 0.99 in TF's
convention, i.e. 0.01 in PyTorch's, drop-connect 0.2 growing linearly over the 16 blocks) with its
AutoAugment ImageNet weights. timm's ``tf_efficientnet_b0.aa_in1k`` is that network and those weights,
with PyTorch's BatchNorm momentum (0.1) and no stochastic depth unless asked: ``bn_momentum: 0.01`` and
``drop_path_rate: 0.2`` complete it (timm spreads the drop rate over the blocks as efficientnet_pytorch
does).
"""

from __future__ import annotations

import torch
from torch import nn

from ..registry import register_model
from . import encoders
from .decoding import projected_specs
from .families import Output, TimmClassifierFamily, TimmClassifierNet
from .projected_params import PROJ_CLASSIFIER_PARAMS
from .weights import timm_weights


class MultiView:
    """Apply each transform to the same image and stack the results (V x C x H x W)."""

    def __init__(self, *transforms):
        self.transforms = transforms

    @property
    def views(self) -> tuple:
        return self.transforms

    def __call__(self, image) -> torch.Tensor:
        return torch.stack([t(image) for t in self.transforms])

    def __repr__(self) -> str:
        return f"MultiView({', '.join(map(repr, self.transforms))})"


def make_projector(in_dim: int, hidden: int, out: int, activation: str) -> nn.Sequential:
    """h: Linear(in, hidden) [-> ReLU] -> Linear(hidden, out)."""
    if activation not in ("none", "relu"):
        raise ValueError(f"projector.activation = {activation!r}; allowed: none, relu")
    layers: list[nn.Module] = [nn.Linear(in_dim, hidden)]
    if activation == "relu":
        layers.append(nn.ReLU(inplace=True))
    layers.append(nn.Linear(hidden, out))
    return nn.Sequential(*layers)


def memory_efficient_swish(module: nn.Module) -> int:
    """Replace every ``nn.SiLU`` below ``module`` with timm's ``SwishMe`` (the forward ``x * sigmoid(x)`` and the
    backward of efficientnet_pytorch's ``utils.py::MemoryEfficientSwish``, which the FedIIC authors' B0 uses);
    -> how many were replaced."""
    from timm.layers.activations_me import SwishMe

    replaced = 0
    for name, child in module.named_children():
        if isinstance(child, nn.SiLU):
            setattr(module, name, SwishMe())
            replaced += 1
        else:
            replaced += memory_efficient_swish(child)
    return replaced


class ProjectedClassifierNet(TimmClassifierNet):
    """Backbone g, classifier f (``head``) and projector h (``projector``)."""

    def __init__(self, backbone: nn.Module, num_classes: int, drop_rate: float, projector: nn.Module):
        super().__init__(backbone, num_classes, drop_rate)
        self.projector = projector


@register_model("proj_classifier", input="images", params=PROJ_CLASSIFIER_PARAMS, decode=projected_specs,
                weights=timm_weights)
class ProjectedClassifierFamily(TimmClassifierFamily):
    """Family ``proj_classifier``: a timm classifier with a projection head (params: PROJ_CLASSIFIER_PARAMS)."""

    def build(self) -> nn.Module:
        cfg = self.cfg
        stochastic = {"drop_path_rate": cfg["drop_path_rate"]} if cfg.get("drop_path_rate") else {}
        backbone = encoders.create_timm(cfg["backbone"], num_classes=0, pretrained=cfg["pretrained"],
                                        in_chans=cfg["in_chans"], **stochastic)
        if cfg.get("swish") == "memory_efficient":
            memory_efficient_swish(backbone)
        if cfg.get("bn_momentum") is not None:
            for module in backbone.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.momentum = cfg["bn_momentum"]
        proj = self.cfg["projector"]
        features = backbone.num_features
        projector = make_projector(features, proj.get("hidden") or features, proj["out"], proj["activation"])
        return ProjectedClassifierNet(backbone, self.num_classes, self.cfg["drop_rate"], projector)

    authors_layouts = {"fediic": "wnn2000/FedIIC networks/networks.py::efficientb0: efficientnet_pytorch's B0 as "
                                 "model.*, its classifier model._fc, the projector projector.0 / projector.1"}

    def authors_state(self, state: dict, layout: str | None, own: dict) -> dict:
        if layout != "fediic":
            return super().authors_state(state, layout, own)
        backbone = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
        mine = {k[len("backbone."):]: v for k, v in own.items() if k.startswith("backbone.")}
        mapped = {f"backbone.{k}": v for k, v in
                  encoders.convert_efficientnet_pytorch(backbone, mine, "the authors' initial model").items()}
        mapped |= {f"head.{k[len('model._fc.'):]}": v for k, v in state.items() if k.startswith("model._fc.")}
        mapped |= {k: v for k, v in state.items() if k.startswith("projector.")}
        missing = sorted(set(own) - set(mapped))
        wrong = [k for k in mapped if k in own and own[k].shape != mapped[k].shape]
        extra = sorted(set(mapped) - set(own))
        if missing or wrong or extra:
            raise ValueError(f"the authors' initial model ({layout} layout) does not fit this {self.cfg['backbone']} "
                             f"model: missing {missing[:4]}, wrong shape {wrong[:4]}, unknown {extra[:4]}")
        return mapped

    def forward(self, model, batch) -> Output:
        x, y = batch["x"], batch["y"]
        views = x.shape[1] if x.dim() == 5 else 1
        flat = x.transpose(0, 1).flatten(0, 1) if x.dim() == 5 else x   # view-major: all first views first
        logits_all, features_all = model(flat)
        b = len(y)
        logits = logits_all[:b]
        objective = [(logits, y)] if len(y) and y.min() >= 0 else []
        return Output(logits=logits, features=features_all[:b], objective=objective,
                      extra={"views": views, "features_all": features_all})

    def project(self, model, out: Output) -> torch.Tensor:
        """h(g(x)) for every view of the batch (views x B rows, view-major), not normalised."""
        return model.projector(out.extra.get("features_all", out.features))

    @staticmethod
    def view_labels(out: Output, labels: torch.Tensor) -> torch.Tensor:
        return labels.repeat(out.extra.get("views", 1))

    # ---- transforms ------------------------------------------------------------------------
    def eval_transform(self):
        from torchvision import transforms as T

        size = self.cfg["image_size"]
        if self.cfg["eval_crop"] == "center":   # Resize 256 + CenterCrop 224 at the paper's size
            return T.Compose([T.Resize(round(size * 256 / 224)), T.CenterCrop(size), T.ToTensor(), self._normalise()])
        return super().eval_transform()

    def view_transforms(self) -> list:
        from torchvision import transforms as T

        size, augment = self.cfg["image_size"], self.cfg["augment"]
        tail = [T.ToTensor(), self._normalise()]
        if augment == "skin":
            from timm.data.auto_augment import rand_augment_transform

            mean = tuple(round(255 * m) for m in encoders.IMAGENET_MEAN)
            randaug = rand_augment_transform(self.cfg["randaugment"], {"translate_const": int(0.45 * size), "img_mean": mean})
            # wnn2000/FedIIC dataset/get_dataset.py::get_datasets: the jitter inside RandomApply(p=1.0), which draws
            # one number of the random stream before it (always) applies
            view1 = T.Compose([T.RandomResizedCrop(size, scale=(0.08, 1.0)), T.RandomHorizontalFlip(),
                               T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.0)], p=1.0), randaug, *tail])
            view2 = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                               T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2), *tail])
            return [view1, view2]
        if augment == "ich":
            view = T.Compose([T.Resize((size, size)), T.RandomAffine(10, translate=(0.02, 0.02)), T.RandomHorizontalFlip(), *tail])
            return [view, view]
        view = super().train_transform()
        return [view, view]

    def train_transform(self):
        views = self.view_transforms()[: self.cfg["views"]]
        return views[0] if len(views) == 1 else MultiView(*views)
