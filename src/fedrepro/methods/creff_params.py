"""CReFF's ``params`` schema (:mod:`.creff`): what a configuration may say about it, defaults included; the configuration is
validated against it."""

CREFF_PARAMS = {
    "num_features": {
        "type": "integer",
        "minimum": 1,
        "default": 100,
        "description": "federated features per class (CReFF code)",
    },
    "match_epochs": {
        "type": "integer",
        "minimum": 0,
        "default": 100,
        "description": "gradient-matching steps per round (CReFF code)",
    },
    "retrain_epochs": {
        "type": "integer",
        "minimum": 0,
        "default": 300,
        "description": "classifier re-training epochs per round (CReFF code crt_epoch)",
    },
    "lr_features": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.1,
        "description": "SGD lr of the federated features",
    },
    "lr_classifier": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.01,
        "description": "SGD lr of the re-trained classifier (lr_net)",
    },
    "batch_real": {
        "type": "integer",
        "minimum": 1,
        "default": 32,
        "description": "real images per class and repeat for the client gradients",
    },
    "gradient_repeats": {
        "type": "integer",
        "minimum": 1,
        "default": 10,
        "description": "gradient draws averaged per class (CReFF code: 10)",
    },
    "dsa_strategy": {
        "type": "string",
        "default": "color_crop_cutout_flip_scale_rotate",
        "description": "Differentiable Siamese Augmentation of the real images before the client gradients "
                       "(CReFF code: --method DSA, this strategy, single mode: one group per draw); names "
                       "joined by '_' from color, crop, cutout, flip, scale, rotate; none = the un-augmented "
                       "images.",
    },
    "retrain_batch_size": {
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
        "default": None,
        "description": "batch size of the re-training (null = the local batch size, as in the code)",
    },
    "evaluate_with": {
        "enum": ["retrained", "aggregated"],
        "default": "retrained",
        "description": "classifier of the evaluated global model: the re-trained one (CReFF) or the FedAvg one",
    },
}
