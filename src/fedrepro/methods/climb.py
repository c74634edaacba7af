"""CLIMB (Shen, Cervino, Hassani and Ribeiro, "An Agnostic Approach to Federated Learning with Class
Imbalance", ICLR 2022), a baseline of FedIIC's Table 1.

CLIMB solves the constrained problem

    min_theta (1/N) sum_k f_k(theta)   s.t.   f_k(theta) - (1/N) sum_j f_j(theta) <= eps   for every client k

by primal-dual FedAvg. With duals lambda_k >= 0 the server averages the client models with weights

    w_k = 1 + lambda_k - mean(lambda)                         (times the base weights, see below)

and, from the losses f_k of the global model on each client's training data (a scalar upload per
client), takes a projected dual ascent step (CLIMB code, shenzebang/Federated-Learning-Pytorch
``core/imbalance_fl.py::ImbalanceFL.step``: divided by N, clamped to [0, lambda_max]):

    lambda_k <- clip(lambda_k + eta_d (f_k - mean_j f_j - eps) / N, 0, lambda_max).

Schedule (``dual_every``, the code's ``n_p_steps`` = 5): one dual step per block of 5 rounds. At the
start of a block the clients measure f_k on the global model they receive; the block's rounds all
average with the duals of its start; after its last round the duals take one step with those f_k
(``ImbalanceFL.step``: weights, ``clients_evaluate``, ``fit(weights, n_p_steps)``, then the dual update).
``dual_every: 1`` steps every round.

f_k (``client_loss``): the CLIMB code sums the mean cross-entropy of every mini-batch of the client's
training loader (``utils/general_utils.py::_evaluate``: ``loss += loss_fn(model(data), label)``), a loader
of batch size n_k // 5 (``utils/data_utils.py::make_dataloader``, ``client_step_per_epoch`` = 5:
``loss_batches``), shuffled, with the training augmentation, the model in train mode (BatchNorm on the
batch's statistics, dropout on; nothing calls eval()). So f_k is about 5 x the mean loss: ``batch_sum``
(default); ``mean`` = the mean loss per example (the paper's f_k). ``loss_mode: eval`` measures in eval
mode instead. The measurement changes no model: the BatchNorm statistics the train-mode pass
updates are restored, which is the code's behaviour in effect. With ``--use_ray`` (passed by
``run_experiment.sh`` and by every README command that gives flags; the README says the code uses ray
for multi-GPU runs) ``FedAlgorithm.clients_evaluate`` (``api.py``) hands the model to ``_evaluate_ray``,
which evaluates a serialized copy in a ray worker, and the copy's BatchNorm updates are lost; without
it, ``_evaluate`` updates the global model's running statistics in place, but nothing in the code reads
them (no module is ever put in eval mode; its test evaluation also runs in train mode).

lambda_max = 100 (the code since its commit "Update the maximum dual variable for CLIMB"; 5 before).

FedIIC uses (eta_d, eps) = (0.1, 0.1) for ISIC/ICH and (0.01, 0.1) for Real. The base weights are the
train block's ``aggregation.weights``: CLIMB's objective is the uniform client mean, so the
configs set ``uniform`` for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fl.method import ModelAveraging
from ..registry import register_method
from ._common.imbalance import fixed_randomness, outputs_over, split_payload


def climb_weights(lambdas: torch.Tensor) -> torch.Tensor:
    """w_k = 1 + lambda_k - mean(lambda)."""
    return 1.0 + lambdas - lambdas.mean()


def climb_dual_step(lambdas: torch.Tensor, losses: torch.Tensor, eta: float, eps: float, lambda_max: float) -> torch.Tensor:
    """lambda_k <- clip(lambda_k + eta (f_k - mean f - eps) / N, 0, lambda_max)."""
    step = eta * (losses - losses.mean() - eps) / len(losses)
    return torch.clamp(lambdas + step, min=0.0, max=lambda_max)


CLIMB_PARAMS = {
    "eta_d": {
        "type": "number",
        "minimum": 0,
        "default": 0.1,
        "description": "dual step size (FedIIC: 0.1 for ISIC/ICH, 0.01 for Real)",
    },
    "epsilon": {
        "type": "number",
        "minimum": 0,
        "default": 0.1,
        "description": "tolerance of the loss-gap constraint (FedIIC: 0.1)",
    },
    "lambda_max": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 100.0,
        "description": "upper clamp of the duals (CLIMB code: 100 since its last commit, 5 before)",
    },
    "client_loss": {
        "enum": ["batch_sum", "mean"],
        "default": "batch_sum",
        "description": "f_k of the dual step: batch_sum = the sum over the client's loss batches of their mean "
                       "cross-entropy, as the CLIMB code's _evaluate (default); mean = the mean cross-entropy per "
                       "example (the paper's f_k).",
    },
    "loss_batches": {
        "type": "integer",
        "minimum": 1,
        "default": 5,
        "description": "f_k is measured in batches of n_k // loss_batches (the CLIMB code's client_step_per_epoch, 5)",
    },
    "loss_mode": {
        "enum": ["train", "eval"],
        "default": "train",
        "description": "the model's mode while f_k is measured: train = the CLIMB code (BatchNorm batch statistics, "
                       "dropout on); eval",
    },
    "dual_every": {
        "type": "integer",
        "minimum": 1,
        "default": 5,
        "description": "rounds per dual step (the CLIMB code's n_p_steps, 5): f_k measured at the start of a block, "
                       "the duals stepped after its last round",
    },
}


@register_method("climb", params=CLIMB_PARAMS)
class CLIMB(ModelAveraging):
    LOSS = "climb.loss"

    def setup(self) -> None:
        super().setup()
        self.lambdas = torch.zeros(len(self.fed.clients), dtype=torch.float64)
        self.block_losses: dict[str, float] = {}       # f_k measured at the start of the current block

    def measures(self, rnd: int) -> bool:
        """Whether round ``rnd`` starts a block: the clients measure f_k on the model they receive."""
        return rnd % self.params["dual_every"] == 0

    def local_update(self, client, message, rnd):
        loss = self.global_loss(self.load_client_model(client, message), client, rnd) if self.measures(rnd) else None
        update = super().local_update(client, message, rnd)
        if loss is not None:
            update.payload[self.LOSS] = torch.tensor([loss], dtype=torch.float64)
        return update

    @torch.no_grad()
    def global_loss(self, model, client, rnd: int) -> float:
        """f_k: the sum over the client's loss batches of their mean loss (``batch_sum``), or the mean
        loss per example (``mean``). Each measurement draws its own order and augmentations, like the
        code's training loader, iterated again by every ``_evaluate``."""
        p = self.params
        batch_sum = p["client_loss"] == "batch_sum"
        size = max(1, len(client.train) // p["loss_batches"])
        total, n = 0.0, 0
        with fixed_randomness(self.ctx.seed, "augment", "climb-loss", rnd, client.index):
            for out, batch in outputs_over(self.family, model, client.train, self.ctx.train, self.compute, size,
                                           shuffle=True, train_mode=p["loss_mode"] == "train"):
                losses = [F.cross_entropy(s, t, reduction="mean" if batch_sum else "sum") for s, t in out.objective]
                total += float(sum(losses) / len(losses)) if batch_sum else float(sum(losses))
                n += len(batch["y"])
        return total if batch_sum else total / max(n, 1)

    def aggregation_weights(self, updates):
        base = torch.tensor(super().aggregation_weights(updates), dtype=torch.float64)
        index = [self.client_index[u.client] for u in updates]
        return (base * climb_weights(self.lambdas[index])).tolist()

    def aggregate(self, updates, rnd):
        for u in updates:
            u.payload, extra = split_payload(u.payload, "climb.")
            if self.LOSS in extra:
                self.block_losses[u.client] = float(extra[self.LOSS])
        super().aggregate(updates, rnd)          # weights use the duals of the block's start
        if (rnd + 1) % self.params["dual_every"] == 0 and self.block_losses:
            names = list(self.block_losses)
            index = [self.client_index[name] for name in names]
            losses = torch.tensor([self.block_losses[name] for name in names], dtype=torch.float64)
            self.lambdas[index] = climb_dual_step(self.lambdas[index], losses, self.params["eta_d"],
                                                  self.params["epsilon"], self.params["lambda_max"])
            self.block_losses = {}

    @property
    def client_index(self) -> dict[str, int]:
        return {c.name: c.index for c in self.fed.clients}

    def state_dict(self):
        return {**super().state_dict(), "lambdas": self.lambdas.clone(), "block_losses": dict(self.block_losses)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.lambdas = state["lambdas"].clone()
        self.block_losses = dict(state.get("block_losses", {}))
