"""CLIMB (FedIIC Table 1 baseline; (eta_d, eps) = (0.1, 0.1) for ISIC from the supplementary Table 1).

Specification: CLIMB's official code (shenzebang/Federated-Learning-Pytorch), primal-dual FedAvg with
FedIIC's shared training recipe (:mod:`tests.parity.spec_fediic`), ``core/imbalance_fl.py::
ImbalanceFL.step`` repeated: with duals lambda (0 at the start) and n_p_steps = 5,

1. ``weights = 1 + lambda - mean(lambda)`` (the uniform objective: base weights 1, normalised by N);
2. ``client_losses = clients_evaluate()``: f_k of the current global model on client k's training
   loader (``utils/general_utils.py::_evaluate``: the sum of the batch-mean cross-entropies; the loader
   of ``utils/data_utils.py::make_dataloader``: batches of n_k // 5, shuffled; the model in train mode,
   as nothing switches it to eval);
3. ``fit(weights, n_p_steps)``: 5 rounds of FedAvg averaging with those weights;
4. ``lambda <- clamp(lambda + lambda_lr (f - mean f - eps) / N, 0, 100)``.

So the duals and the weights change once per 5 rounds, with the losses measured at the block's start.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from fedrepro.data.loader import batches
from fedrepro.seeding import seed_global

from .harness import assert_close, configured_model, drive, paper_run
from .spec_fedavg import averaged, check_global, local_models
from .spec_fediic import ADAM, SIZE, cross_entropy, drive_tiny, federation, logits

pytestmark = pytest.mark.usefixtures("one_thread")

ETA, EPS, LAMBDA_MAX, BLOCK = 0.1, 0.1, 100.0, 5


@torch.no_grad()
def evaluate_loss(run, model, client, rnd: int) -> float:
    """``_evaluate`` on client k's loader: sum of batch-mean CE, batches of n_k // 5, train mode. The order
    and the items' draws are the project's loader's (plumbing), new at every measurement like the code's
    loader's: keyed by (seed, "augment", "climb-loss", round, k)."""
    model = copy.deepcopy(model).train()
    seed_global(run["seed"], "augment", "climb-loss", rnd, client.index)
    order = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
    total = 0.0
    for batch in batches(client.train, len(client.train) // 5, shuffle=True, generator=order):
        total += float(F.cross_entropy(logits(model, batch["x"]), batch["y"]))
    return total


def test_first_rounds_match_the_specification(tmp_path):
    """Rounds 0 and 1 of the first block: f_k measured on the initial model, uniform weights, no dual step yet."""
    run, fed, server, driven = drive_tiny("climb", tmp_path, rounds=2)
    losses = {c.name: evaluate_loss(run, server, c, 0) for c in fed.clients}
    for rnd in range(2):
        models, _ = local_models(run, fed, server, cross_entropy, rnd, ADAM)
        server = averaged(server, [m.state_dict() for m in models], [1.0] * len(models))
    assert driven.method.block_losses == pytest.approx(losses, rel=1e-6)
    assert (driven.method.lambdas == 0).all()
    check_global(driven, fed, server, logits)


def test_weights_follow_the_code_on_a_known_sequence_of_losses(tmp_path):
    """The CLIMB method driven through the engine with its f_k replaced by a known sequence (measurement
    j of client k returns ``LOSSES[j][k]``): every round's aggregation weights and the final duals are
    ``ImbalanceFL.step``'s. A dual step every round (a 5x faster dual) would differ from round 1 on."""
    LOSSES = [[0.5, 9.0, 2.0], [6.0, 0.2, 3.0], [1.0, 1.0, 8.0]]
    rounds = 11                                     # blocks 0-4, 5-9 and the start of the third
    model = configured_model("fediic", "climb", "isic", backbone="test_efficientnet", image_size=SIZE,
                             projector={"hidden": 32, "out": 16})
    run = paper_run("fediic", "climb", "isic", train={"rounds": rounds, "batch_size": 8, "local": {"steps": 1},
                                                      "eval_every": rounds}, model=model)
    fed = federation()
    recorded, measured = [], {c.name: 0 for c in fed.clients}

    def observe(method):
        def known_loss(model, client, rnd):
            measured[client.name] += 1
            return LOSSES[measured[client.name] - 1][client.index]

        weights = method.aggregation_weights

        def record(updates):
            out = weights(updates)
            recorded.append(out)
            return out

        method.global_loss, method.aggregation_weights = known_loss, record

    driven = drive(run, fed, tmp_path, observe=observe)

    lambdas, expected = torch.zeros(3, dtype=torch.float64), []
    for block, losses in enumerate(torch.tensor(LOSSES, dtype=torch.float64)):
        weights = 1.0 + lambdas - lambdas.mean()
        expected += [weights.tolist()] * min(BLOCK, rounds - BLOCK * block)
        if BLOCK * (block + 1) <= rounds:          # the block ran its n_p_steps rounds: the dual update
            lambdas = (lambdas + ETA * (losses - losses.mean() - EPS) / 3).clamp(0.0, LAMBDA_MAX)
    assert measured == {c.name: 3 for c in fed.clients}
    assert_close(torch.tensor(recorded), torch.tensor(expected), "aggregation weights")
    assert_close(driven.method.lambdas, lambdas, "duals")
