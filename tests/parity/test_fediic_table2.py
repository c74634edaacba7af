"""FedIIC's component study (Table 2 rows 2-4: FedAvg+DALA, +DALA+Intra, +DALA+Inter), one round each.

Specification: the FedIIC round of :mod:`tests.parity.spec_fediic` (the authors' code) with the
switched-off terms' weights at 0: k1 = k2 = 0 (DALA alone: only the first view's logits enter the
loss, but both views pass through the network, so BatchNorm sees 2B images), k2 = 0 (no prototypes
are needed) or k1 = 0. Row identity of rows 3 and 4 follows the column order (the check marks were
lost in the paper's text).
"""

import pytest

from .spec_fedavg import check_global
from .spec_fediic import drive_tiny, fediic_rounds, logits

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("method, weights", [("fediic_dala", {"k1": 0.0, "k2": 0.0}),
                                             ("fediic_dala_intra", {"k2": 0.0}),
                                             ("fediic_dala_inter", {"k1": 0.0})])
def test_one_round_matches_the_specification(tmp_path, method, weights):
    run, fed, start, driven = drive_tiny(method, tmp_path, rounds=1)
    check_global(driven, fed, fediic_rounds(run, fed, start, rounds=1, **weights), logits)
