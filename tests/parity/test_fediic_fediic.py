"""FedIIC (Table 1 "FedIIC", Table 2 row 5, Table 3 t = 0.5 / orth. w / d = 0.25), two rounds.

Specification: the authors' code (wnn2000/FedIIC; see :mod:`tests.parity.spec_fediic`). Each round:

- the server turns the global classifier's weight rows into prototypes through the global
  projector, V = h_g(W_fc), lowers their largest mutual cosine by 1000 SGD steps (lr 0.1) on
  sum_i max_j (cos(v_i, v_j) (1 - I_ij)) and sends them L2-normalised;
- every client measures the received model (eval mode) on its view-1 images: per-class CE sums and
  counts; l(y) = sum over clients / (1e-5 + total count);
- every client trains the global model with a fresh Adam (lr 3e-4, wd 5e-4) for one epoch on
  batches of both views ([all first views; all second views] in one forward):
      L = CE(f(view 1) + log(p(y) / (l(y)^0.25 + 1e-5)), y)                       (DALA, p = local prior)
        + 2 * IntraSCL(z, y)   temperature tau_ij = max((p_i p_j)^0.5, 0.07), mean over the 2B anchors
        + 2 * InterSCL(z, V)   CE(z V^T / 0.1, y) over the 2B anchors
  with z = normalise(h(g(x))) (the projector on the features before dropout);
- the server averages every floating-point entry of the state with weights n_k.

Client 0 lacks class 3 (its DALA margin is -inf there). The second round uses prototypes and
class losses of an aggregated model.
"""

import pytest

from .spec_fedavg import check_global
from .spec_fediic import drive_tiny, fediic_rounds, logits

pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_rounds_match_the_authors_code(tmp_path):
    run, fed, start, driven = drive_tiny("fediic", tmp_path, rounds=2)
    assert run["train"]["model"]["views"] == 2
    check_global(driven, fed, fediic_rounds(run, fed, start, rounds=2), logits)
