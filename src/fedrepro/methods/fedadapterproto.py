"""FedAdapterProto (Ofosu Mensah, Djoumessi and Berens, "Prototype-Guided and Lightweight Adapters for
Inherent Interpretation and Generalisation in Federated Learning", arXiv 2507.05852; paper text vs
the authors' code: docs/papers/fedadapterproto.md), and
the FedAdapter and FedPrototypical baselines it is compared with, which are the same algorithm on the
model without prototypes (a linear head) or without adapters.

Client i holds a ResNet backbone w_i (private), adapters alpha_i and a prototype layer phi_i
(:mod:`fedrepro.models.protoadapter`); only theta_i = (alpha_i, phi_i) is communicated. Local loss:

    l_i = CE + lambda_clst * Clst - lambda_sep * Sep + gamma * || W_last * (1 - I^T) ||_1
             + beta * ||alpha_i||  + (mu_1 / 2) ||alpha_i - alpha_g||^2 + (mu_2 / 2) ||phi_i - phi_g||^2

    Clst = mean_b min_{j in P(y_b)} d_bj,   Sep = mean_b min_{j not in P(y_b)} d_bj

with d_bj the minimum over positions of the squared distance of prototype j to image b (the code
takes both minima with ProtoPNet's max-distance trick, max_dist - max_j (max_dist - d_bj) with
max_dist = P k k, the largest distance of two latent patches in [0, 1]: the same unless every
distance exceeds max_dist), I the
prototype-class identity (only wrong-class connections of the last layer are penalised, as the
official code's active ``use_l1_mask``), and the proximal terms active from the second round on,
once global parameters exist. Server: theta_g = weighted mean of the theta_i.

Defaults are the official code's (``run.sh`` / ``lib/update.py``): lambda_clst 0.8, lambda_sep 0.08,
gamma 1e-4, beta 1e-5, mu_1 = mu_2 = 0.01. Where the paper text and the code disagree, a parameter
chooses, default = the code (it produced the published numbers):

- ``adapter_norm``: ``l2`` = beta * sum over adapter tensors of ||p||_2 (code), ``squared_l2`` =
  beta * ||alpha||_2^2 (paper).
- ``client_start``: ``local`` = every client resumes from its own previous adapters and prototypes;
  theta_g only anchors the proximal terms (code: the aggregate is never loaded into the clients);
  ``global`` = theta_i <- theta_g at the start of every round (paper).
- ``adapter_weights`` / ``head_weights``: adapters are averaged with weights tau_i * n_i (local steps
  x client size, the code's ``fednova_weighted_agg``, which is not FedNova's normalised averaging),
  the prototype layer uniformly (code); the paper's text is |D_i| / |D| for both (``train_size``).
- frozen vs fine-tuned backbone is the model option ``freeze_backbone`` (code: fine-tuned).

Every client's model is built on its own (seeded by (seed, "init", client)), as the code constructs
one ResNet per client: the pretrained backbone is the same, the adapters and the prototype layer
start from different random draws. With ``client_start: global`` the clients load the server's
adapters/head at every round, the first included. The code's aggregation weight n_i is the size of
the client's whole share (its site, before the 80/20 train/val split).

``push: last_round`` projects, after the last round, a *copy* of every client's prototypes onto its
nearest own-class training patch (ProtoPNet's push) for the prototype figures only: the authors
evaluate their models without any push, and the last layer is not retrained after one, so the
evaluated models are the unpushed ones. ``final_model`` saves every client's evaluated model
(``clients``), the pushed copies (``pushed``) and the push record (manifest row and position of each
prototype's patch).
"""

from __future__ import annotations

import copy

import torch

from ..data.images import with_transform
from ..data.loader import batches
from ..fl.method import ModelAveraging, weighted_average
from ..models.protoadapter import push_prototypes
from ..registry import register_method
from .fedadapterproto_params import FEDADAPTERPROTO_PARAMS
from .fedprox import proximal_term

ADAPTERS, HEAD = "adapters.", "head."


def _min_over(min_distances: torch.Tensor, chosen: torch.Tensor, max_dist: float | None) -> torch.Tensor:
    """mean_b min_{j chosen} d_bj; with ``max_dist`` as ProtoPNet computes it, max_dist - max_j
    (max_dist - d_bj) * chosen_bj (which reads max_dist where every chosen d_bj exceeds it)."""
    if max_dist is None:
        return min_distances.masked_fill(~chosen, float("inf")).min(dim=1).values.mean()
    inverted = ((max_dist - min_distances) * chosen).max(dim=1).values
    return (max_dist - inverted).mean()


def cluster_cost(min_distances: torch.Tensor, labels: torch.Tensor, identity: torch.Tensor,
                 max_dist: float | None = None) -> torch.Tensor:
    """mean_b min over the prototypes of class y_b of d_bj (B x m distances, m x K identity)."""
    return _min_over(min_distances, identity[:, labels].t().bool(), max_dist)


def separation_cost(min_distances: torch.Tensor, labels: torch.Tensor, identity: torch.Tensor,
                    max_dist: float | None = None) -> torch.Tensor:
    """mean_b min over the prototypes of the other classes of d_bj."""
    return _min_over(min_distances, ~identity[:, labels].t().bool(), max_dist)


def wrong_class_l1(last_weight: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
    """|| W_last (K x m) * (1 - I^T) ||_1: the connections from prototypes to classes they do not belong to."""
    return (last_weight * (1 - identity.t())).abs().sum()


def adapter_penalty(params, squared: bool) -> torch.Tensor:
    """sum ||p||_2^2 over the adapter tensors (paper) or sum ||p||_2 (code)."""
    terms = [(p ** 2).sum() if squared else p.norm(p=2) for p in params]
    return torch.stack(terms).sum() if terms else torch.zeros(())


def client_weights(rule: str, num_examples: list[int], steps: list[int]) -> list[float]:
    """Aggregation weights (normalised later): uniform, train_size n_i, steps tau_i, or steps_x_size tau_i n_i."""
    per_client = {"uniform": lambda n, t: 1.0, "train_size": lambda n, t: float(n), "steps": lambda n, t: float(t),
                  "steps_x_size": lambda n, t: float(n * t)}
    if rule not in per_client:
        raise ValueError(f"unknown aggregation weights {rule!r}; allowed: {sorted(per_client)}")
    return [per_client[rule](n, t) for n, t in zip(num_examples, steps)]


@register_method("fedadapterproto", params=FEDADAPTERPROTO_PARAMS)
class FedAdapterProto(ModelAveraging):
    personalized = True     # every client is evaluated with its own model (Table 1: one column per client)

    @classmethod
    def check_run(cls, params: dict, train: dict) -> list[str]:
        family = train["model"]["family"]
        if family != "adapter_protonet":
            return [f"train/model/family is {family!r}: fedadapterproto trains the adapter_protonet model family"]
        return []

    def setup(self) -> None:
        for problem in self.check_run(self.params, self.ctx.train):
            raise ValueError(problem)
        super().setup()
        self.anchor: dict[str, torch.Tensor] = {}
        self.own_shared = self.client_states("own_shared")     # client -> its own adapters/head (client_start: local)
        self.final_local = self.client_states("final_local")   # client -> its whole model after the last local update
        self.pushed = self.client_states("pushed")             # client -> a pushed copy of that model (figures only)
        self.push_record: dict[str, dict] = {}
        shared = set(self.shared)
        for name, state in self.separate_client_builds():   # one model built per client, as the code
            self.private[name] = {k: v for k, v in state.items() if k not in shared}
            if self.params["client_start"] == "local":
                self.own_shared[name] = {k: v for k, v in state.items() if k in shared}

    def shared_keys(self) -> list[str]:
        return [k for k in self.server.state_dict() if k.startswith((ADAPTERS, HEAD))]

    def load_client_model(self, client, message):
        model = super().load_client_model(client, message)
        own = self.own_shared.get(client.name)
        if own is not None and self.params["client_start"] == "local":
            model.load_state_dict({k: v.to(self.device) for k, v in own.items()}, strict=False)
        return model

    def local_update(self, client, message, rnd):
        trainable = dict(self.work.named_parameters())
        self.anchor = {k: v.detach().clone() for k, v in message.items() if k in trainable}   # theta_g of this round
        return super().local_update(client, message, rnd)

    def max_distance(self, model) -> float:
        """ProtoPNet's max_dist: prototype channels x k x k (the code's prototype_shape[1:] product)."""
        _, channels, kh, kw = model.head.prototypes.shape
        return float(channels * kh * kw)

    def local_loss(self, model, batch, client, rnd):
        p = self.params
        out = self.family.forward(model, batch)
        loss = self.family.loss(out, batch)
        if model.has_prototypes:
            identity, y, d = model.head.class_identity, batch["y"], out.extra["min_distances"]
            max_dist = self.max_distance(model)
            loss = (loss + p["lambda_clst"] * cluster_cost(d, y, identity, max_dist)
                    - p["lambda_sep"] * separation_cost(d, y, identity, max_dist)
                    + p["gamma_l1"] * wrong_class_l1(model.head.last_layer.weight, identity))
        if model.adapters is not None and p["beta_adapter"]:
            loss = loss + p["beta_adapter"] * adapter_penalty(model.adapters.parameters(), p["adapter_norm"] == "squared_l2")
        if rnd >= 1:   # global parameters exist from the first aggregation on
            for prefix, mu in ((ADAPTERS, p["mu_adapter"]), (HEAD, p["mu_head"])):
                if mu:
                    anchor = {k: v for k, v in self.anchor.items() if k.startswith(prefix)}
                    loss = loss + proximal_term(model, anchor, mu, squared=True)
        return loss, out

    def after_local_training(self, client, rnd):
        state = self.work.state_dict()
        if self.params["client_start"] == "local":
            self.own_shared[client.name] = {k: state[k].detach().cpu().clone() for k in self.shared}
        if rnd != self.ctx.train["rounds"] - 1:
            return
        self.final_local[client.name] = {k: v.detach().cpu().clone() for k, v in state.items()}
        if self.params["push"] == "last_round" and self.work.has_prototypes:
            copy_ = copy.deepcopy(self.work)          # the evaluated model stays unpushed
            data = with_transform(client.train, self.family.eval_transform())
            loader = batches(data, self.ctx.train["eval_batch_size"], shuffle=False, num_workers=self.ctx.train["num_workers"])
            with self.autocast():
                self.push_record[client.name] = push_prototypes(copy_, loader, self.device)
            self.pushed[client.name] = {k: v.detach().cpu().clone() for k, v in copy_.state_dict().items()}

    def aggregate(self, updates, rnd):
        share = {c.name: client_share(c) for c in self.fed.clients}
        sizes = [share[u.client] for u in updates]
        steps = [int(u.stats["steps"]) for u in updates]
        merged = {}
        for prefix, rule in ((ADAPTERS, self.params["adapter_weights"]), (HEAD, self.params["head_weights"])):
            keys = [k for k in self.shared if k.startswith(prefix)]
            if keys:
                merged.update(weighted_average([{k: u.payload[k] for k in keys} for u in updates],
                                               client_weights(rule, sizes, steps)))
        self.server.load_state_dict(merged, strict=False)

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        if self.params["client_start"] == "local":
            layout["per_client"]["own_shared"] = self.state_bytes(set(self.shared))
        layout["per_client"]["final_local"] = self.state_bytes()               # after the last round
        if self.params["push"] == "last_round":
            layout["per_client"]["pushed"] = self.state_bytes()
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "own_shared": self.own_shared.state_dict(),
                "final_local": self.final_local.state_dict(), "pushed": self.pushed.state_dict(), "push": self.push_record}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.own_shared.load_state_dict(state["own_shared"])
        self.final_local.load_state_dict(state["final_local"])
        self.pushed.load_state_dict(state["pushed"])
        self.push_record = state["push"]

    def final_model(self) -> dict:
        """The server's adapters/head, every client's evaluated model (after its last local update,
        unpushed), the pushed copies the prototype figures show, and the push record."""
        clients = self.final_local.materialise()
        for client in self.fed.clients:
            if client.name not in clients:
                clients[client.name] = {k: v.detach().cpu().clone() for k, v in self.model_for(client).state_dict().items()}
        return {"server": {k: v.detach().cpu().clone() for k, v in self.server.state_dict().items()},
                "clients": clients, "pushed": self.pushed.materialise(), "push": self.push_record}


def client_share(client) -> int:
    """The size of a client's whole share (train + val + test): the authors weigh by the size of the
    site's index list, which is cut 80/20 into train and validation only inside local training."""
    return sum(len(part) for part in (client.train, client.val, client.test) if part is not None)
