"""FedProto (FedAdapterProto Table 1 baseline), two rounds.

Specification: the FedProto code (yuetan031/FedProto, ``update_weights_het`` and
``proto_aggregation``), from which FedAdapterProto's code base derives, on the baselines' model of
FedAdapterProto's grid (a ResNet with a linear head on the pooled features f(x), no adapters):

- no weights are exchanged; every client's model is built separately (one model per client) and
  kept across rounds;
- local work: fresh Adam (lr 1e-4, weight decay 5e-4, FedAdapterProto's recipe), one class-balanced
  epoch on CE(head(f(x)), y) + lambda MSE(f(x), c_y) with lambda = 1, where c_y is the global
  prototype of the sample's class (the sample's own feature, i.e. no term, if the class has none);
  in the first round there are no global prototypes, only CE;
- a client's prototype of class y is the mean of f(x) over the samples of y it trained on in the
  round (the features of each forward pass, before that step's update);
- the server's prototype of class y is the plain mean over the clients that have y (the code, not
  the paper's count-weighted mean);
- evaluation: each client's own head; the global key is the mean of the clients' probabilities.
The second round is where the prototype regulariser acts.
"""

import pytest
import torch
import torch.nn.functional as F

from .harness import (
    assert_close,
    built_model,
    client_batches,
    configured_model,
    drive,
    floating,
    image_federation,
    paper_run,
    probabilities,
    seed_client,
    sgd_steps,
)

pytestmark = pytest.mark.usefixtures("one_thread")

ADAM = {"name": "adam", "lr": 1.0e-4, "weight_decay": 5.0e-4}
LAMBDA = 1.0


def reference_rounds(run, fed, rounds):
    classes = len(fed.class_names)
    models = {c.name: built_model(run, fed, c.index) for c in fed.clients}
    global_protos = {}
    for rnd in range(rounds):
        local = []
        for client in fed.clients:
            collected = {c: [] for c in range(classes)}

            def loss_fn(model, batch):
                out = model(batch["x"])
                f, y = out["pooled"], batch["y"]
                target = f.detach().clone()
                for i, label in enumerate(y.tolist()):
                    if label in global_protos:
                        target[i] = global_protos[label]
                    collected[label].append(f[i].detach())
                return F.cross_entropy(out["logits"], y) + LAMBDA * ((f - target) ** 2).mean(dim=1).mean()   # MSELoss

            seed_client(run, rnd, client)
            sgd_steps(models[client.name], client_batches(run, client, rnd), loss_fn, ADAM)
            # means as sum / count, the server's in float64: Adam turns float32 rounding differences into
            # visible ones on parameters whose gradients are near zero, so the arithmetic follows the code's
            local.append({c: torch.stack(v).sum(0) / len(v) for c, v in collected.items() if v})
        global_protos = {c: torch.stack([p[c] for p in local if c in p]).double().mean(0).float()
                         for c in range(classes) if any(c in p for p in local)}
    return models, global_protos


def test_two_rounds_match_the_fedproto_code(tmp_path):
    model = configured_model("fedadapterproto", "fedproto", backbone="test_resnet", image_size=32)
    run = paper_run("fedadapterproto", "fedproto", train={"rounds": 2, "batch_size": 4, "num_workers": 0}, model=model)
    fed = image_federation(size=32, classes=2, sizes=(8, 10, 12), val=2, test=4, global_test=6, skew=0.8)
    driven = drive(run, fed, tmp_path)
    models, protos = reference_rounds(run, fed, rounds=2)
    assert_close(driven.method.global_protos, torch.stack([protos[c] for c in range(2)]), "global prototypes")
    ensemble = 0
    for client in fed.clients:
        model = models[client.name].eval()
        assert_close(floating(driven.method.model_for(client).state_dict()), floating(model.state_dict()), client.name)
        p = probabilities(lambda x: model(x)["logits"], fed.global_test)
        assert_close(driven.probs(f"{client.name}@global"), p, f"{client.name}@global")
        ensemble = ensemble + p / len(fed.clients)
    assert_close(driven.probs("global"), ensemble, "global (mean of the clients)")
