"""Aggregation and the generic algorithms' losses against hand-computed values on tiny tensors."""

import math

import pytest
import torch

from fedrepro.fl.comm import CommLedger, payload_size
from fedrepro.fl.method import weighted_average
from fedrepro.methods.fedfocal import focal_loss
from fedrepro.methods.fedprox import proximal_term
from fedrepro.methods.moon import model_contrastive_loss


def test_weighted_average_by_hand():
    a = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "steps": torch.tensor(6)}
    out = weighted_average([a, b], [1.0, 3.0])  # weights 1/4, 3/4
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert out["steps"].dtype == torch.int64 and int(out["steps"]) == 5  # 0.75 + 4.5 = 5.25 -> 5
    uniform = weighted_average([a, b], [1.0, 1.0])
    assert torch.allclose(uniform["w"], torch.tensor([2.0, 4.0]))


def test_proximal_term_squared_and_not():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 4.0]]))
    anchor = {"weight": torch.zeros(1, 2)}
    # ||w - 0||^2 = 25, ||w - 0|| = 5
    assert proximal_term(model, anchor, mu=0.1, squared=True).item() == pytest.approx(0.05 * 25)
    assert proximal_term(model, anchor, mu=0.1, squared=False).item() == pytest.approx(0.05 * 5, rel=1e-5)
    # gradient of (mu/2)||w||^2 is mu * w
    proximal_term(model, anchor, mu=0.1, squared=True).backward()
    assert torch.allclose(model.weight.grad, torch.tensor([[0.3, 0.4]]))


def test_moon_loss_by_hand():
    z = torch.tensor([[1.0, 0.0]])
    z_glob = torch.tensor([[1.0, 0.0]])   # cos = 1
    z_prev = torch.tensor([[0.0, 1.0]])   # cos = 0
    tau = 0.5
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0 / tau)))
    assert model_contrastive_loss(z, z_glob, z_prev, tau).item() == pytest.approx(expected)


def test_focal_loss_by_hand():
    scores = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))  # softmax gives back the probabilities
    target = torch.tensor([0])
    # no smoothing: -(1 - 0.7)^2 log 0.7
    assert focal_loss(scores, target, gamma=2.0).item() == pytest.approx(-(0.3 ** 2) * math.log(0.7), rel=1e-5)
    # gamma 0, no smoothing = cross-entropy
    assert focal_loss(scores, target, gamma=0.0).item() == pytest.approx(-math.log(0.7), rel=1e-5)
    # smoothing 0.3 over 3 classes as FACMIC's FocalLossWithSmoothing: q = (0.7, 0.15, 0.15); the focal
    # factor (1 - p)^gamma only on the label's term (gamma 1)
    expected = -(0.7 * (1 - 0.7) * math.log(0.7) + 0.15 * math.log(0.2) + 0.15 * math.log(0.1))
    assert focal_loss(scores, target, gamma=1.0, smoothing=0.3).item() == pytest.approx(expected, rel=1e-5)


def test_comm_accounting_counts_tensors():
    payload = {"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.float16), "nested": [torch.zeros(2)]}
    assert payload_size(payload) == (12 + 5 + 2, 12 * 4 + 5 * 2 + 2 * 4)
    ledger = CommLedger()
    ledger.record(0, "down", payload)
    ledger.record(0, "up", {"a": torch.zeros(3, 4)})
    assert ledger.round_totals(0) == {"down_params": 19, "down_bytes": 66, "up_params": 12, "up_bytes": 48}
