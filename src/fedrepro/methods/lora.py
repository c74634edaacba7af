"""LoRA baseline of FAA-CLIP (Table II-IX, "LoRA r=3"): FedAvg over low-rank adapters of a frozen CLIP.

LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022) replaces a frozen weight W
by W + (alpha / r) B A with A in R^{r x d_in}, B in R^{d_out x r}, B = 0 at the start. Clients train only
the factors (A, B) with the CLIP contrastive loss of the ``clip_lora`` family (which layers carry them, and
the resulting parameter count, is documented in :mod:`fedrepro.models.clip_tuning`); the server averages
the factors like FedAvg (McMahan et al., AISTATS 2017), and only they are communicated. FAA-CLIP gives
r = 3 and nothing else [GAP]; averaging A and B separately is the usual federated LoRA (e.g. FedIT).
"""

from __future__ import annotations

from ..registry import register_method
from ._common.tuning import TrainableOnly


@register_method("lora")
class FedLoRA(TrainableOnly):
    families = ("clip_lora",)
