"""PromptFL (Guo, Guo, Wang, Tang, Xu, "PromptFL: Let Federated Participants Cooperatively Learn Prompts
Instead of Models", IEEE TMC 2023), the prompt-learning baseline of FAA-CLIP.

Both CLIP encoders stay frozen. The prompt of class c is [SOS] v_1 ... v_M [name_c] [EOS] with M learnable
context vectors shared by all classes (CoOp, Zhou et al., IJCV 2022; the ``clip_prompt`` family). Clients
train v with the CLIP contrastive loss; the server averages the context vectors like FedAvg, and only they
are communicated (2 x Sigma_prompt values per client and round, Table II).
"""

from __future__ import annotations

from ..registry import register_method
from ._common.tuning import TrainableOnly


@register_method("promptfl")
class PromptFL(TrainableOnly):
    families = ("clip_prompt",)
