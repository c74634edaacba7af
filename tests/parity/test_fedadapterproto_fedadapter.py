"""FedAdapter (FedAdapterProto Table 1 baseline: Cai et al.'s adapters, with the proximal term), two rounds.

Specification: no baseline code exists; FedAdapter is FedAdapterProto's algorithm (the authors'
code, see :mod:`tests.parity.spec_fedadapterproto`) on the model with a linear head on the pooled
features instead of the prototype layer: one model built per client; local loss CE + 1e-5 sum
||adapter tensor||_2 + (0.01/2) ||theta - theta_g||^2 over adapters and head from the second round;
fresh Adam (1e-4, wd 5e-4), one class-balanced epoch; adapters averaged with weights local steps x
site size, the head uniformly; the aggregate is never loaded into the clients; every client is
evaluated with its own model.
"""

import pytest

from .spec_fedadapterproto import verify

pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_rounds_match_the_specification(tmp_path, monkeypatch):
    verify("fedadapter", tmp_path, monkeypatch)
