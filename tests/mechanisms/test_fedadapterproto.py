"""Mechanism test of FedAdapterProto's prototype push (ProtoPNet's projection, which makes every
prototype an explainable part of a training image: "this looks like that").

Claim: after the push, every prototype p_j *is* a latent patch of a training image of its own class,
and it is the own-class patch nearest to the prototype before the push.

How it is measured: FedAdapterProto ("Ours") of the paper file, driven through the engine for two
rounds on test_resnet at 32 px and three clients of long-tailed two-class images; ``push:
last_round`` (the default) pushes a copy of every client's final model. The test loads each pushed
copy into a fresh network, computes the latent map z = add_on(feature map) of every training image
of the client itself, cuts it into all k x k patches, and checks for every prototype that

- the nearest patch among the images of its own class is the prototype itself (max |difference|
  <= 1e-6, measured 0), while no patch of the other class is (squared distance > 1e-3; the nearest
  one measured at 0.014-3.2 over seeds 0-2; the prototypes before the push are 40-59 from every
  patch, so the push did move them onto the data);
- that patch is the one nearest to the unpushed prototype (the client's evaluated model) among all
  its own-class patches (ProtoPNet's rule), to float rounding;
- the push record names that image (manifest row) and position.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parity.harness import configured_model, drive, image_federation, paper_run, stacked
from parity.spec_fedadapterproto import tensors_as_they_are

pytestmark = pytest.mark.usefixtures("one_thread")


def latent_patches(net, x: torch.Tensor, k: int) -> torch.Tensor:
    """B x L x (P k k): every k x k patch of every image's latent map, in distance-map order (h, w)."""
    with torch.no_grad():
        z = net.eval().head.add_on(net.feature_map(x))
    return F.unfold(z, kernel_size=k).transpose(1, 2)


def pushed_run(tmp_path, monkeypatch, seed: int = 0):
    tensors_as_they_are(monkeypatch)      # the in-memory images already are network inputs
    model = configured_model("fedadapterproto", "fedadapterproto", backbone="test_resnet", image_size=32)
    run = paper_run("fedadapterproto", "fedadapterproto", seed=seed, model=model,
                    train={"rounds": 2, "eval_every": 2, "batch_size": 8})
    assert run["algorithm"]["params"]["push"] == "last_round"
    fed = image_federation(size=32, classes=2, sizes=(8, 10, 12), val=2, test=2, global_test=4, skew=0.8, seed=seed)
    return fed, drive(run, fed, tmp_path).method


def test_every_pushed_prototype_is_a_latent_patch_of_its_own_class(tmp_path, monkeypatch):
    fed, method = pushed_run(tmp_path, monkeypatch)
    for client in fed.clients:
        net = method.family.build()
        net.load_state_dict(method.pushed[client.name])
        unpushed = method.final_local[client.name]["head.prototypes"]
        prototypes = net.head.prototypes.detach()
        m, _, k, _ = prototypes.shape
        x, y = stacked(client.train)
        y = torch.as_tensor(y)
        patches = latent_patches(net, x, k)                              # B x L x D
        width = int(round(patches.shape[1] ** 0.5))
        identity = net.head.class_identity.argmax(1)                     # class of each prototype
        record = method.push_record[client.name]
        assert not torch.allclose(prototypes, unpushed)                  # the push moved them
        for j in range(m):
            own = patches[y == identity[j]]                              # the own class's images
            assert len(own), f"{client.name}: no image of class {identity[j]}"
            flat = own.reshape(-1, own.shape[-1])
            exact = (flat - prototypes[j].flatten()).abs().max(dim=1).values
            assert exact.min() <= 1e-6, f"{client.name} prototype {j}: nearest own-class patch {exact.min():.3g} away"
            before = ((flat - unpushed[j].flatten()) ** 2).sum(dim=1)    # ProtoPNet: the patch nearest the old p_j
            chosen = int(exact.argmin())
            assert before[chosen] <= before.min() + 1e-5, f"{client.name} prototype {j}: not the nearest own-class patch"
            image, position = divmod(chosen, patches.shape[1])
            rows = torch.as_tensor(client.train.rows)[y == identity[j]]
            assert int(record["index"][j]) == int(rows[image])
            assert record["position"][j].tolist() == list(divmod(position, width))
            others = patches[y != identity[j]].reshape(-1, own.shape[-1])
            if len(others):                                              # and not a patch of the other class
                assert ((others - prototypes[j].flatten()) ** 2).sum(dim=1).min() > 1e-3
