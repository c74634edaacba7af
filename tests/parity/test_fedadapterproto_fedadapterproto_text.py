"""FedAdapterProto as the paper text describes it (table text_vs_code, "Ours (paper text)"), two rounds.

Specification: the paper's description where it differs from the authors' code (see
:mod:`tests.parity.spec_fedadapterproto`): the backbone is frozen (BatchNorm statistics still adapt
in training mode), every client loads theta_g = (alpha_g, phi_g) at the start of every round (the
server's initial adapters and prototype layer in the first), the adapter penalty is squared
(1e-5 ||alpha||_2^2), and both parts are averaged with weights |D_i| / |D| (site sizes). The losses
are otherwise the code's (CE + 0.8 Clst - 0.08 Sep + 1e-4 L1 + (0.01/2) proximal terms from the
second round). After the last round every client holds the aggregate (with its own backbone).
"""

import pytest

from .spec_fedadapterproto import verify

pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_rounds_match_the_specification(tmp_path, monkeypatch):
    verify("fedadapterproto_text", tmp_path, monkeypatch, paper_text=True)
