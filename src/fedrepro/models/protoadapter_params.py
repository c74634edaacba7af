"""The ``adapter_protonet`` family's ``train.model`` schema (:mod:`.protoadapter`): what a configuration may say about it, defaults included; the configuration is
validated against it."""

ADAPTER_PROTONET_PARAMS = {
    "backbone": {
        "type": "string",
        "default": "resnet50.tv_in1k",
        "description": "a timm ResNet (conv1..layer4), e.g. resnet50.tv_in1k (torchvision ImageNet weights) or "
                       "test_resnet, or a timm EfficientNet (the offline demo: tf_efficientnet_lite0)",
    },
    "pretrained": {
        "description": "false, true (timm hub weights), or a checkpoint file (a path or package:<module>)",
        "oneOf": [{"type": "boolean"}, {"type": "string"}],
        "default": False,
    },
    "image_size": {"type": "integer", "minimum": 8, "default": 224},
    "in_chans": {"type": "integer", "default": 3},
    "normalize": {"enum": ["imagenet", "clip", "half"], "default": "imagenet"},
    "augment": {
        "description": "fundus = the official code's Resize, H/V flips, rotation 5 deg, colour jitter; the rest"
                       " as the classifier family",
        "enum": ["none", "flip", "standard", "fundus"],
        "default": "none",
    },
    "freeze_backbone": {
        "description": "false = the backbone is fine-tuned locally and never communicated (official code, "
                       "--fine_tune 1, default); true = frozen weights (paper text; as in the code's freeze, "
                       "BatchNorm statistics still adapt in training mode)",
        "type": "boolean",
        "default": False,
    },
    "skip_maxpool": {
        "type": "boolean",
        "default": True,
        "description": "skip the ResNet max-pool as the official forward does (14x14 maps at 224 px); "
                       "EfficientNets have none",
    },
    "output_stride": {
        "description": "the stride of the feature map the prototypes compare against (timm's output_stride: the last "
                       "stage dilated instead of strided, the same weights); null = the backbone's own (ResNet with "
                       "skip_maxpool: 16, the code's 14 x 14 map at 224 px; EfficientNet: 32). The offline demo sets 16, "
                       "so that its 32-px images give a 2 x 2 map that a prototype figure can show (32: one cell, the "
                       "whole image)",
        "oneOf": [{"type": "null"}, {"enum": [8, 16]}],
        "default": None,
    },
    "adapters": {
        "type": "boolean",
        "default": True,
        "description": "false = no adapters (FedPrototypical, plain baselines)",
    },
    "adapter_reduction": {
        "type": "integer",
        "minimum": 1,
        "default": 16,
        "description": "r = D / adapter_reduction (code --red_factor 16)",
    },
    "adapter_init": {
        "description": "kaiming = Kaiming-normal on both convs (code --init_weight_adapter 1, default); "
                       "identity = the up-projection starts at zero",
        "enum": ["kaiming", "identity"],
        "default": "kaiming",
    },
    "head": {
        "enum": ["prototypes", "linear"],
        "default": "prototypes",
        "description": "linear = FedAdapter and the plain baselines",
    },
    "prototypes_per_class": {"type": "integer", "minimum": 1, "default": 5},
    "prototype_dim": {
        "type": "integer",
        "minimum": 1,
        "default": 512,
        "description": "channels of the add-on layers and prototypes (code 512)",
    },
    "prototype_size": {
        "type": "integer",
        "minimum": 1,
        "default": 1,
        "description": "spatial size k of the k x k prototypes (code 1)",
    },
    "prototype_activation": {
        "enum": ["linear", "log"],
        "default": "linear",
        "description": "similarity = -d (code) or log((d+1)/(d+1e-4)) (ProtoPNet)",
    },
    "prototype_init": {
        "description": "protopnet = Kaiming add-ons and last layer +1 own class / -0.5 others (code "
                       "--init_weight_proto 1, default); default = torch's init",
        "enum": ["protopnet", "default"],
        "default": "protopnet",
    },
    "last_layer_bias": {
        "type": "boolean",
        "default": True,
        "description": "the code's prototype->class layer has a bias (ProtoPNet's has none)",
    },
}
