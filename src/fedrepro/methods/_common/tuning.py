"""Helpers shared by the CLIP methods: which model family a method trains, and FedAvg over the
trainable part of a partly frozen model (LoRA factors, prompt context vectors)."""

from __future__ import annotations

from ...fl.method import MethodContext, ModelAveraging
from ...models.clip_tuning import trainable_keys


def require_family(ctx: MethodContext, allowed: tuple[str, ...]) -> None:
    family = ctx.train["model"]["family"]
    if family not in allowed:
        raise ValueError(f"{ctx.run['algorithm']['name']} (methods/{ctx.run['method']}) trains the model family "
                         f"{' or '.join(allowed)}, but train.model.family is {family!r}")


class TrainableOnly(ModelAveraging):
    """FedAvg (McMahan et al., AISTATS 2017) over the parameters that require gradients: only they are
    communicated and averaged; the frozen pretrained weights never leave the clients."""

    families: tuple[str, ...] = ()

    def setup(self) -> None:
        require_family(self.ctx, self.families)
        super().setup()

    def shared_keys(self) -> list[str]:
        return trainable_keys(self.server)
