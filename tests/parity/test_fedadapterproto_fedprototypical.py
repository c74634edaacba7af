"""FedPrototypical (FedAdapterProto Table 1: the prototype layer without adapters), two rounds.

Specification: FedAdapterProto's algorithm (the authors' code, see
:mod:`tests.parity.spec_fedadapterproto`) on the ResNet without adapters: one model built per
client; local loss CE + 0.8 Clst - 0.08 Sep + 1e-4 L1(wrong-class weights) + (0.01/2) ||phi -
phi_g||^2 over the prototype layer from the second round; fresh Adam (1e-4, wd 5e-4), one
class-balanced epoch; the prototype layer averaged uniformly and never loaded into the clients;
every client evaluated with its own model, unpushed.
"""

import pytest

from .spec_fedadapterproto import verify

pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_rounds_match_the_specification(tmp_path, monkeypatch):
    _, driven = verify("fedprototypical", tmp_path, monkeypatch)
    assert set(driven.method.pushed) == {"client0", "client1", "client2"}     # the figures' copies exist
