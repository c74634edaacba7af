"""Unlabeled target batches for the domain-adaptation methods (FACMIC, FAA-CLIP).

Both papers align each client's features with a "global set of unlabeled images". Which images that
is depends on the protocol (engine: :func:`fedrepro.fl.federation.target_rows`): the global test set
itself under ``paper`` (what the authors' code did), a disjoint reference set under ``clean`` (or, on a
split without one and only with ``allow_test_selection: true``, the global test set). Either way the
method sees ``self.fed.reference`` with its labels hidden (y = -1).

Like the authors' infinite target loader, every local step draws the next batch of a stream that
reshuffles the target set on every pass; the stream of client k in round r is keyed by
(seed, "target", r, k), so runs are reproducible and resumable.
"""

from __future__ import annotations

from typing import Iterator

import torch

from ...data.loader import batches
from ...fl.method import ModelAveraging
from ...seeding import torch_generator
from .tuning import require_family

# shared by FACMIC and FAA-CLIP (their params schemas include it)
TARGET_PASS_PARAMS = {
    "target_pass": {
        "description": "with lambda_da = 0: true = every local step still passes a target batch through the FAM in "
                       "training mode (its BatchNorm statistics see the target), as both papers' code does with a zero "
                       "DA weight (the pass feeds L_DA's pseudo-labels or D); false = no target batch at all, so the "
                       "'without DA' run also loses that BatchNorm adaptation. No effect when lambda_da > 0.",
        "type": "boolean",
        "default": True,
    },
}


def target_stream(reference, train: dict, seed: int, rnd: int, client_index: int) -> Iterator[dict]:
    """Client ``client_index``'s endless stream of unlabeled target batches in round ``rnd``: full
    batches of ``train.batch_size``, the target set reshuffled on every pass (pass p keyed by
    (seed, "target", rnd, client, p))."""
    passes = 0
    while True:
        generator = torch_generator(seed, "target", rnd, client_index, passes)
        yield from batches(reference, train["batch_size"], shuffle=True, generator=generator, drop_last=True,
                           num_workers=train.get("num_workers", 0))
        passes += 1


class DomainAdaptation(ModelAveraging):
    """ModelAveraging of a feature attention module (``clip_fam`` on cached features, or ``clip_fam_images``)
    plus an endless stream of unlabeled target batches, one per local step."""

    families = ("clip_fam", "clip_fam_images")

    @classmethod
    def reads_target(cls, params: dict) -> bool:
        """Local steps draw target batches, unless lambda_da = 0 and ``target_pass`` is off."""
        return params["lambda_da"] > 0 or params["target_pass"]

    def uses_target(self) -> bool:
        return self.reads_target(self.params)

    def setup(self) -> None:
        require_family(self.ctx, self.families)
        super().setup()
        if self.uses_target() and (self.fed.reference is None or len(self.fed.reference) == 0):
            raise ValueError(
                f"{self.ctx.run['algorithm']['name']} needs unlabeled target images, but this split has none: "
                f"set split.reference_fraction > 0 (protocol clean) or use protocol: paper, which takes the "
                f"global test set as the target (setting {self.ctx.run['setting']!r})")

    def before_local_training(self, client, rnd):
        super().before_local_training(client, rnd)
        self.targets = self.target_stream(client.index, rnd) if self.uses_target() else None

    def target_stream(self, client_index: int, rnd: int) -> Iterator[dict]:
        for batch in target_stream(self.fed.reference, self.ctx.train, self.ctx.seed, rnd, client_index):
            yield self.to_device(batch)

    def next_target(self) -> dict:
        return next(self.targets)

    # ---- the local objective: task loss + lambda_da * adaptation loss ----------------------
    def target_needs_grad(self) -> bool:
        """Whether the FAM is differentiated through the target branch."""
        return False

    def adaptation_loss(self, model, source_masked: torch.Tensor, batch: dict, target_raw: torch.Tensor,
                        target_masked: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def local_loss(self, model, batch, client, rnd):
        masked = model(self.family.image_features(batch))
        out = self.family.output_from(masked, batch)
        loss = self.family.loss(out, batch)
        if not self.uses_target():
            return loss, out
        target_raw = self.family.image_features(self.next_target())
        # the target batch goes through the FAM in training mode, so (as in both papers' code) its
        # BatchNorm statistics also see target images, with or without L_DA
        lam = self.params["lambda_da"]
        with torch.set_grad_enabled(self.target_needs_grad() and lam > 0):
            target_masked = model(target_raw)
        if lam == 0:
            return loss, out
        return loss + lam * self.adaptation_loss(model, masked, batch, target_raw, target_masked), out
