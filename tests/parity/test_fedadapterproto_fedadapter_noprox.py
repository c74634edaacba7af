"""FedAdapter* (FedAdapterProto Table 1: FedAdapter without the proximal term), two rounds.

Specification: FedAdapter (see test_fedadapterproto_fedadapter.py and
:mod:`tests.parity.spec_fedadapterproto`) with mu = 0: the local loss is CE + 1e-5 sum ||adapter
tensor||_2 in every round, so the aggregate reaches the clients in no way (they continue from their
own models); the server still averages adapters (local steps x site size) and head (uniformly).
"""

import pytest

from .spec_fedadapterproto import verify

pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_rounds_match_the_specification(tmp_path, monkeypatch):
    verify("fedadapter_noprox", tmp_path, monkeypatch, mu=0.0)
