"""FedAdapterProto ("Ours", FedAdapterProto Table 1, APTOS, text_vs_code and index_bug rows), two rounds.

Specification: the authors' code (see :mod:`tests.parity.spec_fedadapterproto` for the equations):
a ResNet with an adapter after each stage and a ProtoPNet prototype layer, one model built per
client; local loss CE + 0.8 Clst - 0.08 Sep + 1e-4 L1(wrong-class weights) + 1e-5 sum ||adapter
tensor||_2 + (0.01/2) ||theta - theta_g||^2 over adapters and prototype layer from the second round;
fresh Adam (1e-4, wd 5e-4) over all parameters, one class-balanced epoch; the server averages the
adapters with weights local steps x site size and the prototype layer uniformly, and never loads
the aggregate into the clients. The second round is where the proximal anchor acts; after it every
client is evaluated with its own model, unpushed (the prototype push is for the figures only).
"""

import pytest

from .spec_fedadapterproto import verify

pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_rounds_match_the_specification(tmp_path, monkeypatch):
    run, driven = verify("fedadapterproto", tmp_path, monkeypatch)
    assert run["train"]["local"]["epochs"] == 1 and run["train"]["local"]["sampler"] == "class_balanced"
    assert set(driven.method.pushed) == {"client0", "client1", "client2"}     # the figures' copies exist
