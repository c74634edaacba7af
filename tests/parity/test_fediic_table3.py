"""FedIIC's parameter study (Table 3: orthogonalisation off, t = 0, d = 0), one round each.

Specification: the FedIIC round of :mod:`tests.parity.spec_fediic` (the authors' code) with the
prototypes only row-normalised (no SGD on their cosines; a different server path), with t = 0 (the
intra-client temperature max((p_i p_j)^0, 0.07) = 1) or with d = 0 (the DALA margin log p(y) -
log(1 + 1e-5), no difficulty).
"""

import pytest

from .spec_fedavg import check_global
from .spec_fediic import drive_tiny, fediic_rounds, logits

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("method, options", [("fediic_noorth", {"orthogonalize": False}),
                                             ("fediic_t0", {"t": 0.0}),
                                             ("fediic_d0", {"q": 0.0})])
def test_one_round_matches_the_specification(tmp_path, method, options):
    run, fed, start, driven = drive_tiny(method, tmp_path, rounds=1)
    check_global(driven, fed, fediic_rounds(run, fed, start, rounds=1, **options), logits)
