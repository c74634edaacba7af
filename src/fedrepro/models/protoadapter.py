"""The FedAdapterProto network (Ofosu Mensah, Djoumessi and Berens, arXiv 2507.05852, §2.1):
a timm ResNet with a residual bottleneck adapter after each of its four stages and a ProtoPNet
prototype layer (Chen et al., "This Looks Like That", NeurIPS 2019) as the classifier. Paper text vs the authors'
code: docs/papers/fedadapterproto.md.

Adapter (after stage s, D_s channels, r = D_s / reduction):

    h' = h + W_up( ReLU( W_down h ) ),   W_down: 1x1 conv D -> r,  W_up: 1x1 conv r -> D

Prototype layer on the last feature map f (D x H x W): add-on layers z = sigmoid(conv(relu(conv(f))))
with P channels, m = K x (prototypes per class) prototypes p_j (P x k x k, initialised U(0,1)),

    d_j^(h,w) = || z^(h,w) - p_j ||^2      (every k x k patch of z)
    s_j = -min_(h,w) d_j^(h,w)             (activation 'linear', the authors' code; 'log' =
                                            log((d+1)/(d+1e-4)) as in ProtoPNet)
    logits = W_last s (+ b),  W_last[c, j] = 1 if p_j belongs to class c else -0.5 at init
                              (b: torch's default init; the code never resets it).

The code skips the ResNet max-pool (``skip_maxpool``), so the map is 14 x 14 at 224 px. The same
family without adapters and with a linear head on the pooled features is the plain ResNet of the
baselines (FedAvg, FedProx, FedNova, FedProto), and with adapters and a linear head it is FedAdapter.

A timm EfficientNet (the offline demo's pretrained EfficientNet-Lite0) works the same way: its four
stages are the block groups that end at strides 4, 8, 16 and 32 (``feature_info``), and the last feature
map is the one after its head convolution. ``output_stride: 16`` dilates its last stage instead of striding it (the same
weights), as the code's skipped max-pool halves the ResNet's stride: at the demo's 32 px the map is 2 x 2, not one
cell, so a prototype's activation map shows where on the image it fires.

``push_prototypes`` is ProtoPNet's prototype projection: every prototype is replaced by the latent
patch nearest to it among the training images of its own class, so it *is* an image patch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..device import full_precision
from ..registry import register_model
from . import encoders
from .decoding import adapter_protonet_specs
from .families import Output, TimmClassifierFamily
from .protoadapter_params import ADAPTER_PROTONET_PARAMS
from .weights import timm_weights

STAGES = ("layer1", "layer2", "layer3", "layer4")
RESNET_PARTS = ("conv1", "bn1", "act1", "maxpool", *STAGES)
EFFICIENTNET_PARTS = ("conv_stem", "bn1", "blocks", "conv_head", "bn2")


def stage_plan(backbone: nn.Module) -> tuple[str, list[list[int]], list[int]]:
    """(kind, the block indices of each of the four stages, their output channels). ``resnet``: layer1..4;
    ``efficientnet``: ``blocks`` split after the blocks that end at strides 4, 8, 16, 32."""
    if all(hasattr(backbone, p) for p in RESNET_PARTS):
        channels = {info["module"]: info["num_chs"] for info in backbone.feature_info}
        return "resnet", [[i] for i in range(4)], [channels[s] for s in STAGES]
    if all(hasattr(backbone, p) for p in EFFICIENTNET_PARTS):
        ends = [int(info["module"].split(".")[1]) for info in backbone.feature_info if info["reduction"] >= 4]
        channels = [info["num_chs"] for info in backbone.feature_info if info["reduction"] >= 4]
        starts = [0, *[e + 1 for e in ends[:-1]]]
        return "efficientnet", [list(range(a, b + 1)) for a, b in zip(starts, ends)], channels
    raise ValueError(f"backbone {type(backbone).__name__} is neither a timm ResNet (conv1/bn1/act1/maxpool/layer1..4, "
                     f"e.g. resnet50) nor a timm EfficientNet (conv_stem/bn1/blocks/conv_head/bn2)")


class BottleneckAdapter(nn.Module):
    def __init__(self, channels: int, reduction: int, init: str = "kaiming"):
        super().__init__()
        hidden = max(1, channels // reduction)
        self.down = nn.Conv2d(channels, hidden, kernel_size=1)
        self.up = nn.Conv2d(hidden, channels, kernel_size=1)
        for conv in (self.down, self.up):
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(conv.bias)
        if init == "identity":            # the adapted network starts as the pretrained one
            nn.init.zeros_(self.up.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.up(F.relu(self.down(h)))


@full_precision
def prototype_distances(z: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """Squared L2 distance between every k x k patch of ``z`` (B x P x H x W) and every prototype
    (m x P x k x k): ||z||^2 - 2 z.p + ||p||^2 with convolutions -> B x m x (H-k+1) x (W-k+1), >= 0."""
    patch_sq = F.conv2d(z ** 2, torch.ones_like(prototypes[:1]))
    cross = F.conv2d(z, prototypes)
    proto_sq = (prototypes ** 2).sum(dim=(1, 2, 3)).view(1, -1, 1, 1)
    return F.relu(patch_sq - 2 * cross + proto_sq)


@full_precision
def distance_to_similarity(distances: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "linear":
        return -distances
    if activation == "log":
        return torch.log((distances + 1) / (distances + 1e-4))
    raise ValueError(f"unknown prototype_activation {activation!r}; allowed: linear, log")


def class_identity(num_classes: int, per_class: int) -> torch.Tensor:
    """m x K one-hot: prototype j belongs to class j // per_class."""
    return F.one_hot(torch.arange(num_classes * per_class) // per_class, num_classes).float()


def last_layer_init(identity: torch.Tensor, incorrect: float = -0.5) -> torch.Tensor:
    """K x m weights: +1 from a prototype to its own class, ``incorrect`` to every other class."""
    return identity.t() + incorrect * (1 - identity.t())


class PrototypeHead(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, per_class: int, dim: int, size: int = 1,
                 activation: str = "linear", bias: bool = True, init: str = "protopnet"):
        super().__init__()
        self.activation = activation
        self.add_on = nn.Sequential(nn.Conv2d(in_channels, dim, 1), nn.ReLU(), nn.Conv2d(dim, dim, 1), nn.Sigmoid())
        identity = class_identity(num_classes, per_class)
        self.prototypes = nn.Parameter(torch.rand(len(identity), dim, size, size))
        self.register_buffer("class_identity", identity, persistent=False)   # a constant: never communicated
        self.last_layer = nn.Linear(len(identity), num_classes, bias=bias)
        if init == "protopnet":
            for module in self.add_on:
                if isinstance(module, nn.Conv2d):
                    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                    nn.init.zeros_(module.bias)
            with torch.no_grad():      # the bias keeps torch's default init, as in the code
                self.last_layer.weight.copy_(last_layer_init(identity))

    def forward(self, features: torch.Tensor) -> dict:
        latent = self.add_on(features)
        distances = prototype_distances(latent, self.prototypes)
        min_distances = distances.flatten(2).min(dim=2).values
        return {"logits": self.last_layer(distance_to_similarity(min_distances, self.activation)),
                "min_distances": min_distances, "distance_maps": distances, "latent": latent}


class AdapterProtoNet(nn.Module):
    """backbone (private) -> adapters (``adapters.*``) -> head (``head.*``: prototypes or linear)."""

    def __init__(self, backbone: nn.Module, num_classes: int, cfg: dict):
        super().__init__()
        self.kind, self.stage_blocks, channels = stage_plan(backbone)
        self.backbone = backbone
        self.skip_maxpool = cfg["skip_maxpool"]
        self.adapters = nn.ModuleList([BottleneckAdapter(c, cfg["adapter_reduction"], cfg["adapter_init"])
                                       for c in channels]) if cfg["adapters"] else None
        self.has_prototypes = cfg["head"] == "prototypes"
        if self.has_prototypes:
            self.head = PrototypeHead(backbone.num_features, num_classes, cfg["prototypes_per_class"], cfg["prototype_dim"],
                                      cfg["prototype_size"], cfg["prototype_activation"], cfg["last_layer_bias"],
                                      cfg["prototype_init"])
        else:
            self.head = nn.Linear(backbone.num_features, num_classes)
        if cfg["freeze_backbone"]:
            backbone.requires_grad_(False)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        b = self.backbone
        if self.kind == "resnet":
            x = b.act1(b.bn1(b.conv1(x)))
            if not self.skip_maxpool:
                x = b.maxpool(x)
            stages = [getattr(b, s) for s in STAGES]
        else:
            x = b.bn1(b.conv_stem(x))
            stages = [nn.Sequential(*(b.blocks[i] for i in blocks)) for blocks in self.stage_blocks]
        for i, stage in enumerate(stages):
            x = stage(x)
            if self.adapters is not None:
                x = self.adapters[i](x)
        return x if self.kind == "resnet" else b.bn2(b.conv_head(x))

    def forward(self, x: torch.Tensor) -> dict:
        fmap = self.feature_map(x)
        pooled = fmap.mean(dim=(2, 3))
        if self.has_prototypes:
            return {"pooled": pooled, **self.head(fmap)}
        return {"pooled": pooled, "logits": self.head(pooled)}


@register_model("adapter_protonet", input="images", params=ADAPTER_PROTONET_PARAMS, decode=adapter_protonet_specs,
                weights=timm_weights)
class AdapterProtoFamily(TimmClassifierFamily):
    """Images -> AdapterProtoNet. ``augment: fundus`` is the authors' training augmentation."""

    def build(self) -> nn.Module:
        cfg = self.cfg
        stride = {"output_stride": cfg["output_stride"]} if cfg.get("output_stride") else {}
        backbone = encoders.create_timm(cfg["backbone"], num_classes=0, pretrained=cfg["pretrained"], in_chans=cfg["in_chans"],
                                        **stride)
        return AdapterProtoNet(backbone, self.num_classes, cfg)

    def forward(self, model, batch) -> Output:
        out = model(batch["x"])
        objective = [(out["logits"], batch["y"])] if batch["y"].min() >= 0 else []
        extra = {k: out[k] for k in ("min_distances", "distance_maps", "latent") if k in out}
        return Output(logits=out["logits"], features=out["pooled"], objective=objective, extra=extra)

    # The authors' pipeline works on float tensors (berenslab/FedAdapterProto lib/eyepacs.py::FundusDataset.__getitem__:
    # cv2.imread -> RGB -> float32 / 255; lib/update.py::LocalUpdate.train_val: Resize(img_size) and the augmentations
    # on that tensor, then Normalize): under the authors' pixels ours does the same (ToTensor is their / 255), from the
    # full-resolution image; the fast pixels resize a PIL image to the square once, cached.
    def _authors(self) -> bool:
        return self.cfg.get("pixels", "authors") == "authors"

    def _augment(self) -> list:
        from torchvision import transforms as T

        size = self.cfg["image_size"]
        return {
            "none": [],
            "flip": [T.RandomHorizontalFlip()],
            "standard": [T.RandomResizedCrop(size, scale=(0.6, 1.0)), T.RandomHorizontalFlip()],
            # the official code's: flips, 5 degree rotations, mild colour jitter (lib/update.py::LocalUpdate.train_val)
            "fundus": [T.RandomHorizontalFlip(p=0.5), T.RandomVerticalFlip(p=0.5), T.RandomRotation(degrees=5),
                       T.ColorJitter(brightness=0.05, hue=0.05, saturation=[0.8, 1.2], contrast=0.9)],
        }[self.cfg["augment"]]

    def eval_transform(self):
        if not self._authors():
            return super().eval_transform()
        from torchvision import transforms as T

        return T.Compose([T.ToTensor(), T.Resize(self.cfg["image_size"]), self._normalise()])

    def train_transform(self):
        from torchvision import transforms as T

        size = self.cfg["image_size"]
        if self._authors():
            augment = self._augment()
            resize = [] if self.cfg["augment"] == "standard" else [T.Resize(size)]   # the random crop resizes itself
            return T.Compose([T.ToTensor(), *resize, *augment, self._normalise()])
        if self.cfg["augment"] != "fundus":
            return super().train_transform()
        return T.Compose([T.Resize((size, size)), *self._augment(), T.ToTensor(), self._normalise()])


@torch.no_grad()
def push_prototypes(model: AdapterProtoNet, batches, device) -> dict[str, torch.Tensor]:
    """ProtoPNet's projection: replace every prototype by its nearest latent patch among the images
    (of ``batches``: dicts with x, y, index) of the prototype's own class.

    -> {"index": manifest row of the chosen image (-1 if the class had none), "position": (h, w) of
    the patch in the distance map, "distance": squared distance before the projection}.
    """
    head = model.head
    identity = head.class_identity.bool()                       # m x K
    m, k = head.prototypes.shape[0], head.prototypes.shape[-1]
    best = torch.full((m,), float("inf"), device=device)
    index = torch.full((m,), -1, dtype=torch.long)
    position = torch.zeros((m, 2), dtype=torch.long)
    patches = head.prototypes.detach().clone()
    was_training = model.training
    model.eval()
    for batch in batches:
        x, y = batch["x"].to(device), torch.as_tensor(batch["y"]).to(device)
        out = model(x)
        dist = out["distance_maps"]                                # B x m x H' x W'
        own = identity[:, y].t()                                   # B x m: the image shows p_j's class
        dist = dist.masked_fill(~own[:, :, None, None], float("inf"))
        width = dist.shape[-1]
        flat = dist.permute(1, 0, 2, 3).reshape(m, -1)            # m x (B H' W')
        value, arg = flat.min(dim=1)
        for j in torch.nonzero(value < best).flatten().tolist():
            b, rest = divmod(int(arg[j]), dist.shape[-2] * width)
            h, w = divmod(rest, width)
            best[j] = value[j]
            index[j] = int(torch.as_tensor(batch["index"])[b])
            position[j] = torch.tensor([h, w])
            patches[j] = out["latent"][b, :, h:h + k, w:w + k]
    found = index >= 0
    head.prototypes.data[found.to(head.prototypes.device)] = patches[found.to(patches.device)]
    model.train(was_training)
    return {"index": index, "position": position, "distance": best.cpu()}
