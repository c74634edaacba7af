"""What several methods share and none registers: the helpers of ``fedrepro.methods`` (a leading underscore, as
timm marks its own). ``tuning`` (which parameters a CLIP-tuning method trains), ``global_anchor`` (a frozen global
model as a term of the local loss: FedProx, MOON), ``imbalance`` (class counts, logit adjustment, fixed-randomness
passes: the long-tail methods), ``selfsup`` (BYOL and relational losses, augmentations: the self-supervised
methods), ``target_domain`` (a pass over unlabeled target images: FACMIC, FAA-CLIP) and ``dsa`` (differentiable
Siamese augmentation: CReFF)."""
