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
    r = model.projector(model(x)[1])
    counts = torch.bincount(y, minlength=CLASSES).float()
    sums = torch.zeros(CLASSES, r.shape[1]).index_add_(0, y, r)
    return sums / counts.clamp_min(1)[:, None], counts


def test_two_rounds_match_the_specification(tmp_path):
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
    assert_close(driven.method.global_prototypes, prototypes[0], "global prototypes")
    check_global(driven, fed, server, logits)
