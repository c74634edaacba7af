"""FedProc (FedIIC Table 1 baseline; tau = 0.5, FedIIC gives no value), two rounds.

Specification: FedProc (Mu et al., FGCS'23) with FedIIC's shared recipe (:mod:`tests.parity.spec_fediic`),
the projector h of the shared model giving the representations r = h(g(x)):

- local loss in round r (of R): alpha_r L_GPC + (1 - alpha_r) CE(f(dropout(g(x))), y), alpha_r = 1 - r / R,
  L_GPC = CE(cos(r, c^j) / tau over the classes j, y) against the global prototypes c^j; without
  global prototypes (the first round) the cross-entropy alone; classes no client holds are left out;
- after local training each client computes its class prototypes, the mean of r over its training
  images of each class with the trained model (eval mode), and uploads them with its class counts;
- the server averages the models as FedAvg (client sizes) and the prototypes weighted by the counts:
  c^j = sum_k n_k^j c_k^j / sum_k n_k^j.

The second round is where the prototype loss acts (alpha_1 = 1/2 with R = 2).
"""

import pytest
import torch
import torch.nn.functional as F

from .harness import assert_close, train_sizes
from .spec_fedavg import averaged, check_global, local_models
from .spec_fediic import ADAM, CLASSES, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

TAU = 0.5


@torch.no_grad()
def class_means(model, dataset):
    model.eval()
    x = torch.stack([dataset[i]["x"] for i in range(len(dataset))])
    y = torch.as_tensor(dataset.labels)
    r = model.projector(model(x)[1]).double()         # the exact mean, rounded to fp32 once
    counts = torch.bincount(y, minlength=CLASSES).double()
    sums = torch.zeros(CLASSES, r.shape[1], dtype=torch.float64).index_add_(0, y, r)
    return (sums / counts.clamp_min(1)[:, None]).float(), counts.float()


# A client's prototypes are exact class means (summed in float64, rounded to fp32 once), like FedProc's:
# then the prototypes of a round whose models agree are the same to the last bit or nearly (FIRST_ROUND),
# whatever the batching and the order of the sums.
FIRST_ROUND = 1e-7
# Later rounds' features come from models whose last bits differ (the loss's sums run in another order, and Adam
# turns rounding noise into steps; below): 5e-7 after round 2 and 2e-6 after round 3 on one CPU, less on another.
# A defect moves them by far more: the weight alpha = 1 - r/R instead of 1 - r/(R-1) by 8e-3 after round 2.
LATER_ROUNDS = 1e-5


def prototypes_per_round(monkeypatch) -> list[torch.Tensor]:
    """The driven run's global prototypes after each round's aggregation."""
    from fedrepro.methods.fedproc import FedProc

    history, aggregate = [], FedProc.aggregate

    def recording(self, updates, rnd):
        aggregate(self, updates, rnd)
        history.append(self.global_prototypes.clone())

    monkeypatch.setattr(FedProc, "aggregate", recording)
    return history


def test_two_rounds_match_the_specification(tmp_path, monkeypatch):
    history = prototypes_per_round(monkeypatch)
    run, fed, server, driven = drive_tiny("fedproc", tmp_path, rounds=2)
    rounds, prototypes = 2, None
    for rnd in range(rounds):
        alpha = 1 - rnd / rounds

        def loss(model, batch, client, global_model):
            out, features = model(batch["x"])
            ce = F.cross_entropy(out, batch["y"])
            if prototypes is None:
                return ce
            protos, known = prototypes
            r = model.projector(features)
            scores = F.normalize(r, dim=1) @ F.normalize(protos, dim=1).t() / TAU
            gpc = F.cross_entropy(scores.masked_fill(~known, float("-inf")), batch["y"])
            return alpha * gpc + (1 - alpha) * ce

        models, _ = local_models(run, fed, server, loss, rnd, ADAM)
        means, counts = zip(*[class_means(m, c.train) for m, c in zip(models, fed.clients)])
        n = torch.stack(counts)
        prototypes = ((torch.stack(means) * n[:, :, None]).sum(0) / n.sum(0).clamp_min(1)[:, None], n.sum(0) > 0)
        server = averaged(server, [m.state_dict() for m in models], train_sizes(fed))
        assert_close(history[rnd], prototypes[0], f"round {rnd}'s global prototypes", FIRST_ROUND)
    assert_close(driven.method.global_prototypes, prototypes[0], "global prototypes", FIRST_ROUND)
    check_global(driven, fed, server, logits)


def test_rethinkfl_implementation_three_rounds(tmp_path, monkeypatch):
    """``implementation: rethinkfl``: FedProc as WenkeHuang/RethinkFL ``models/fedproc.py`` implements it
    (``FedProc._train_net``, ``agg_func``, ``proto_aggregation``), in FedIIC's shared recipe:

    - alpha = 1 - r / (R - 1) (``epoch_index / (communication_epoch - 1)``): 1, 1/2, 0 for R = 3;
    - loss = alpha L + (1 - alpha) CE with f = the backbone's features; without global prototypes L = 0 * CE
      (so round 0's loss is 0); else, for every sample whose class has a global prototype,
      -log(exp(cos(f_i, c^y)) / sum_j exp(cos(f_i, c^j))) over the known classes, summed and divided by the
      batch size;
    - a client's prototype of class j = the mean of the features f its training batches of class j produced
      during local training; the global one = the plain mean over the clients holding class j.
    """
    from .harness import configured_model, drive, floating, initial_server, paper_run, probabilities
    from .spec_fediic import SIZE, federation

    rounds = 3
    model = configured_model("fediic", "fedproc", "isic", backbone="test_efficientnet", image_size=SIZE,
                             projector={"hidden": 32, "out": 16})
    run = paper_run("fediic", "fedproc", "isic", train={"rounds": rounds, "batch_size": 4}, model=model,
                    params={"implementation": "rethinkfl"})
    fed = federation()
    history = prototypes_per_round(monkeypatch)
    server, driven = initial_server(run, fed), drive(run, fed, tmp_path)
    protos = None                                  # class -> global prototype
    for rnd in range(rounds):
        alpha = 1 - rnd / (rounds - 1)
        seen = {}                                  # (client, class) -> features during training

        def loss(model, batch, client, global_model):
            outputs, f = model(batch["x"])
            ce = F.cross_entropy(outputs, batch["y"])
            info = 0 * ce
            if protos is not None:
                keys = sorted(protos)
                info, i = None, 0
                for label in batch["y"].tolist():
                    if label in protos:
                        others = torch.stack([protos[k] for k in keys if k != label])
                        l = torch.cosine_similarity(f[i:i + 1], torch.cat([protos[label][None], others]), dim=1)
                        term = -torch.log(torch.exp(l)[0] / torch.exp(l).sum())
                        info = term if info is None else info + term
                    i += 1
                info = info / i
            for j, label in enumerate(batch["y"].tolist()):
                seen.setdefault((client.name, label), []).append(f[j].detach())
            return alpha * info + (1 - alpha) * ce

        models, _ = local_models(run, fed, server, loss, rnd, ADAM)
        local = {key: torch.stack(v).double().mean(0) for key, v in seen.items()}
        protos = {label: torch.stack([p for (_, c), p in local.items() if c == label]).float().mean(0)
                  for label in sorted({c for _, c in local})}
        server = averaged(server, [m.state_dict() for m in models], train_sizes(fed))
        expected = torch.stack([protos[c] for c in range(CLASSES)])
        # round 0's loss is 0: its features are the initial model's in both, the means alone can differ
        assert_close(history[rnd], expected, f"round {rnd}'s global prototypes", FIRST_ROUND if rnd == 0 else LATER_ROUNDS)
    assert_close(driven.method.global_prototypes, expected, "global prototypes", LATER_ROUNDS)
    # The code's loss is a loop over samples, fedrepro's one batch: the last bits of the gradients differ,
    # and Adam turns the rounding noise of gradients that are 0 in exact arithmetic (a BatchNorm bias
    # before another BatchNorm) into steps of up to lr. So the model's function is compared tightly, its
    # weights up to a few such steps.
    assert_close(floating(driven.method.server.state_dict()), floating(server.state_dict()), "global model", 1e-3)
    model = server.eval()
    assert_close(driven.probs("global"), probabilities(lambda x: logits(model, x), fed.global_test), "global probs", 1e-5)
