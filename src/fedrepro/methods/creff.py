"""CReFF (Shang, Lu, Huang and Wang, "Federated Learning on Heterogeneous and Long-Tailed Data via
Classifier Re-training with Federated Features", IJCAI 2022), a baseline of FedIIC's Table 1.

Training of the model is FedAvg. Besides, the server keeps m learnable *federated features* per
class, F_c (m x d), and a re-trained classifier phi (d -> L) that answers for the global model:

1. Client k computes, with the round's global feature extractor (eval mode) and the current
   re-trained classifier phi, the gradient of the cross-entropy w.r.t. phi's weight and bias for each
   class c it holds, on ``batch_real`` random images of that class (averaged over
   ``gradient_repeats`` draws), and uploads these per-class gradients g_k^c next to its model. As in
   the CReFF code, the images are the client's un-augmented ones (the deterministic eval transform)
   passed through Differentiable Siamese Augmentation (``dsa_strategy``, :mod:`.dsa`: one group of
   color / crop / cutout / flip / scale / rotate per draw, the same parameters for the whole batch).
2. The server averages them over the clients holding c (uniformly, as in the code):
   g^c = mean_k g_k^c.
3. Feature matching, ``match_epochs`` SGD steps (lr ``lr_features``) on the federated features:

       min_F sum_c D( grad_phi CE(phi(F_c), c), g^c ),
       D(a, b) = sum over rows r of the weight (and the bias as one row) of 1 - cos(a_r, b_r).

4. Classifier re-training: a fresh linear classifier is trained on (F, labels) for
   ``retrain_epochs`` epochs (SGD lr ``lr_classifier``, the local batch size). It becomes phi for
   the next round's client gradients and replaces the aggregated classifier in the evaluated global
   model (``evaluate_with: retrained``). The next round still starts from the FedAvg model.

Defaults are the CReFF code's: m = 100, 100 matching steps, 300 re-training epochs, lr 0.1 / 0.01,
32 real images per class, 10 gradient draws, DSA strategy color_crop_cutout_flip_scale_rotate (the
code seeds each DSA draw from the clock; here from (seed, round, client, class, draw)).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import default_collate

from ..data.images import with_transform
from ..device import fp32
from ..fl.evaluation import dataset_labels
from ..fl.method import ModelAveraging
from ..registry import register_method
from ..seeding import derive_seed, numpy_rng, torch_generator
from ._common.dsa import diff_augment, strategy_groups
from ._common.imbalance import fixed_randomness, head_of, split_payload
from .creff_params import CREFF_PARAMS


def classifier_gradients(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor, create_graph: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """d CE(features W^T + b, labels) / d(W, b)."""
    with torch.enable_grad():
        if not create_graph:
            weight, bias = weight.detach().requires_grad_(True), bias.detach().requires_grad_(True)
        loss = F.cross_entropy(F.linear(features, weight, bias), labels)
        gw, gb = torch.autograd.grad(loss, (weight, bias), create_graph=create_graph)
    return gw, gb


def gradient_distance(synthetic: tuple[torch.Tensor, ...], real: tuple[torch.Tensor, ...], eps: float = 1e-6) -> torch.Tensor:
    """sum over layers and output rows of 1 - cos(synthetic row, real row); a bias is one row."""
    total = synthetic[0].new_zeros(())
    for gs, gr in zip(synthetic, real):
        gs, gr = gs.reshape(1, -1) if gs.dim() == 1 else gs, gr.reshape(1, -1) if gr.dim() == 1 else gr
        cos = (gs * gr).sum(-1) / (gs.norm(dim=-1) * gr.norm(dim=-1) + eps)
        total = total + (1.0 - cos).sum()
    return total


@register_method("creff", params=CREFF_PARAMS)
class CReFF(ModelAveraging):
    HEAD = "creff.head."
    GRAD = "creff.grad."

    def setup(self) -> None:
        super().setup()
        p = self.params
        strategy_groups(p["dsa_strategy"])                  # an unknown augmentation fails before round 0
        head = head_of(self.server)
        dim, num = head.in_features, self.fed.num_classes
        gen = torch_generator(self.ctx.seed, "init", "creff-features")
        self.features = torch.randn(num * p["num_features"], dim, generator=gen).to(self.device).requires_grad_(True)
        self.feature_labels = torch.arange(num, device=self.device).repeat_interleave(p["num_features"])
        self.feature_optimizer = torch.optim.SGD([self.features], lr=p["lr_features"])
        self.retrained = copy.deepcopy(head)               # phi; fresh init at round 0 = the model's head init
        self.eval_model = copy.deepcopy(self.server)
        self.grad_model = copy.deepcopy(self.server)
        self._refresh_eval_model()

    # ---- protocol -----------------------------------------------------------------------
    def broadcast(self, rnd):
        message = super().broadcast(rnd)
        message[self.HEAD + "weight"] = self.retrained.weight.detach().clone()
        message[self.HEAD + "bias"] = self.retrained.bias.detach().clone()
        return message

    def local_update(self, client, message, rnd):
        model_part, head = split_payload(message, self.HEAD)
        gradients = self.client_gradients(client, model_part, head[self.HEAD + "weight"], head[self.HEAD + "bias"], rnd)
        update = super().local_update(client, model_part, rnd)
        for c, (gw, gb) in gradients.items():
            update.payload[f"{self.GRAD}{c}.weight"] = gw
            update.payload[f"{self.GRAD}{c}.bias"] = gb
        return update

    def client_gradients(self, client, model_state, weight, bias, rnd) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per-class classifier gradients of the global extractor + phi on the client's images."""
        p = self.params
        self.grad_model.load_state_dict(model_state, strict=False)
        self.grad_model.eval()
        labels = dataset_labels(client.train)
        rng = numpy_rng(self.ctx.seed, "sampling", "creff", rnd, client.index)
        images = with_transform(client.train, self.family.eval_transform())      # un-augmented, as the code's
        out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with fixed_randomness(self.ctx.seed, "augment", "creff-gradients", rnd, client.index):
            for c in np.unique(labels):
                members = np.flatnonzero(labels == c)
                draws = []
                for repeat in range(p["gradient_repeats"]):
                    pick = rng.permutation(members)[: p["batch_real"]]
                    batch = self.to_device(gather(images, pick))
                    if batch["x"].dim() == 5:
                        batch["x"] = batch["x"][:, 0]
                    if batch["x"].dim() == 4:            # images (cached features are not augmented)
                        seed = derive_seed(self.ctx.seed, "augment", "creff-dsa", rnd, client.index, int(c), repeat)
                        batch["x"] = diff_augment(batch["x"], p["dsa_strategy"], seed % 2**31)
                    with torch.no_grad(), self.autocast():
                        feats = self.family.forward(self.grad_model, batch).features
                    feats = fp32(feats)       # the classifier gradients are taken in fp32
                    draws.append(classifier_gradients(feats, batch["y"], weight.to(self.device), bias.to(self.device)))
                out[int(c)] = (torch.stack([d[0] for d in draws]).mean(0), torch.stack([d[1] for d in draws]).mean(0))
        return out

    def aggregate(self, updates, rnd):
        per_class: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for u in updates:
            u.payload, grads = split_payload(u.payload, self.GRAD)
            for c in sorted({int(k[len(self.GRAD):].split(".")[0]) for k in grads}):
                per_class.setdefault(c, []).append((grads[f"{self.GRAD}{c}.weight"], grads[f"{self.GRAD}{c}.bias"]))
        super().aggregate(updates, rnd)
        real = {c: (torch.stack([g[0] for g in gs]).mean(0), torch.stack([g[1] for g in gs]).mean(0))
                for c, gs in per_class.items()}
        self.match_features(real)
        self.retrain_classifier(rnd)
        self._refresh_eval_model()

    # ---- server-side steps --------------------------------------------------------------
    def match_features(self, real: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        m = self.params["num_features"]
        weight = self.retrained.weight.detach().requires_grad_(True)
        bias = self.retrained.bias.detach().requires_grad_(True)
        with torch.enable_grad():
            for _ in range(self.params["match_epochs"]):
                loss = self.features.new_zeros(())
                for c, target in real.items():
                    feats = self.features[c * m:(c + 1) * m]
                    synthetic = classifier_gradients(feats, self.feature_labels[c * m:(c + 1) * m], weight, bias, create_graph=True)
                    loss = loss + gradient_distance(synthetic, tuple(t.to(self.device) for t in target))
                if not loss.requires_grad:
                    return
                self.feature_optimizer.zero_grad()
                loss.backward()
                self.feature_optimizer.step()

    def retrain_classifier(self, rnd: int) -> None:
        p = self.params
        head = head_of(self.server)
        classifier = nn.Linear(head.in_features, head.out_features).to(self.device)   # fresh (server-seeded) init
        optimizer = torch.optim.SGD(classifier.parameters(), lr=p["lr_classifier"])
        feats, labels = self.features.detach(), self.feature_labels
        size = p["retrain_batch_size"] or self.ctx.train["batch_size"]
        gen = torch_generator(self.ctx.seed, "shuffle", "creff-retrain", rnd)
        with torch.enable_grad():
            for _ in range(p["retrain_epochs"]):
                order = torch.randperm(len(feats), generator=gen).to(self.device)
                for start in range(0, len(feats), size):
                    idx = order[start:start + size]
                    loss = F.cross_entropy(classifier(feats[idx]), labels[idx])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        self.retrained = classifier

    def _refresh_eval_model(self) -> None:
        self.eval_model.load_state_dict(self.server.state_dict())
        if self.params["evaluate_with"] == "retrained":
            head_of(self.eval_model).load_state_dict(self.retrained.state_dict())

    def model_for(self, client):
        return self.eval_model

    # ---- checkpointing ------------------------------------------------------------------
    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["device_models"] += 2                 # the evaluated model and the gradient model
        return layout

    def state_dict(self):
        return {**super().state_dict(), "features": self.features.detach().cpu().clone(),
                "retrained": {k: v.cpu().clone() for k, v in self.retrained.state_dict().items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        with torch.no_grad():
            self.features.copy_(state["features"].to(self.device))
        self.retrained.load_state_dict(state["retrained"])
        self._refresh_eval_model()

    def final_model(self):
        return {"server": {k: v.cpu().clone() for k, v in self.eval_model.state_dict().items()},
                "aggregated_head": {k: v.cpu().clone() for k, v in head_of(self.server).state_dict().items()}}


def gather(dataset, rows) -> dict:
    """A batch of the given positions of a dataset (cached features are sliced directly)."""
    if hasattr(dataset, "batch"):
        return dataset.batch(torch.as_tensor(rows, dtype=torch.long))
    return default_collate([dataset[int(i)] for i in rows])
