"""FedCLIP (Lu et al., "FedCLIP: Fast Generalization and Personalization for CLIP in Federated
Learning", IEEE Data Eng. Bull. 2023), as FACMIC and FAA-CLIP run it as a baseline.

CLIP stays frozen; each client trains only an attention adapter a(.) on the image features
(Linear -> Tanh -> Linear -> Softmax) whose output masks them, I' = a(I) * I. Predictions are the
cosine similarities of I' with the frozen text features of "a picture of a {class}", scaled by
CLIP's logit scale (100). The local loss is the B x B image-text contrastive loss; only the adapter
is communicated and it is averaged (FACMIC's code: weights (n_i // B) x B; FAA-CLIP's: uniform).

Because CLIP is frozen and its preprocessing deterministic, training runs on cached image features
(``clip_adapter``: exactly what re-encoding every batch computes); ``clip_adapter_images`` runs the
encoder on every batch as the authors' code does (FAA-CLIP Table II times that path).
"""

from __future__ import annotations

from ..fl.method import ModelAveraging
from ..registry import register_method
from ._common.tuning import require_family


@register_method("fedclip")
class FedCLIP(ModelAveraging):
    def setup(self) -> None:
        require_family(self.ctx, ("clip_adapter", "clip_adapter_images"))
        super().setup()
