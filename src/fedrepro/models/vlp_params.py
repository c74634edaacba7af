"""The ``vlp`` family's ``train.model`` schema (:mod:`.vlp`): what a configuration may say about the dual encoder,
its objective and its pixels, defaults included; the configuration is validated against it."""

from __future__ import annotations

from .text_tower import GENERATED

VLP_PARAMS = {
    "objective": {
        "description": "convirt = image-text InfoNCE; gloria = + word-region contrast; mgca = + token and "
                       "prototype alignment",
        "enum": ["convirt", "gloria", "mgca"],
        "default": "convirt",
    },
    "temperature": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.07,
        "description": "InfoNCE temperature (fixed, code --softmax_temperature)",
    },
    "image": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "backbone": {
                "type": "string",
                "default": "deit_base_patch16_224",
                "description": "a timm ViT; the code initialises ViT-B/16 from DeiT-base",
            },
            "pretrained": {
                "description": "false, true (timm hub weights) or a checkpoint path",
                "oneOf": [{"type": "boolean"}, {"type": "string"}],
                "default": True,
            },
            "image_size": {"type": "integer", "minimum": 8, "default": 224},
            "resize": {
                "type": "integer",
                "minimum": 8,
                "default": 256,
                "description": "longer side resized to this, zero-padded to a square, then cropped to "
                               "image_size (MGCA)",
            },
            "patch_size": {
                "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "default": None,
                "description": "override the ViT's patch size (random-init models only)",
            },
            "normalize": {
                "enum": ["imagenet", "clip", "half"],
                "default": "half",
                "description": "MGCA normalises with mean = std = 0.5",
            },
            "augment": {
                "enum": ["crop", "none"],
                "default": "crop",
                "description": "crop = RandomCrop for training, CenterCrop for evaluation (MGCA)",
            },
            "cnn_tokens": {
                "enum": ["head", "last_stage"],
                "default": "head",
                "description": "a CNN image tower's tokens (the stand-in towers of the demo and the evidence run): "
                               "head = its final feature map after the 1x1 head convolution (EfficientNet-Lite0: "
                               "1280 channels, so A_I alone has 20M parameters, six times the tower); last_stage = "
                               "the last stage's map, without the head convolution (Lite0: 320 channels)",
            },
        },
    },
    "text": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "name": {
                "description": "Hugging Face id or local folder of the BERT weights/config, or package:<module>"
                               " for a model folder a Python package ships. An id is fetched once by the weights "
                               "rule (resources/weights/hf--<id>--model); random init needs only its architecture "
                               "(shipped for bert-base-cased)",
                "type": "string",
                "default": "bert-base-cased",
            },
            "tokenizer": {
                "description": "tokenizer id/folder (null = the model's own); the code tokenizes with "
                               "emilyalsentzer/Bio_ClinicalBERT (the same cased vocabulary as bert-base-cased). "
                               f"{GENERATED}: a made-up WordPiece vocabulary of the model's vocab size, no download, "
                               "for random-init smoke tests only (refused with pretrained: true)",
                "oneOf": [{"type": "string"}, {"type": "null"}],
                "default": None,
            },
            "pretrained": {"type": "boolean", "default": True},
            "layers": {
                "description": "Number of BERT layers kept. Default 6 = the official code's bert_config.json "
                               "(MGCA's), which produced the published numbers; the paper text says \"Bert-base\""
                               " (12).",
                "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "default": 6,
            },
            "max_length": {"type": "integer", "minimum": 4, "default": 112},
            "config": {
                "type": "object",
                "default": {},
                "description": "extra BERT config overrides (e.g. hidden_dropout_prob)",
            },
        },
    },
    "alignment": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "mlp_ratio": {"type": "number", "exclusiveMinimum": 0, "default": 4.0},
            "init": {
                "description": "how A_I and A_T start: huggingface = as the code's freshly built ViTLayer / BertLayer "
                               "(SLIA_module.py; weights N(0, 0.02), biases 0, LayerNorm eps 1e-12); pytorch = "
                               "PyTorch's module defaults (LayerNorm eps 1e-6 for A_I, the text tower's for A_T)",
                "enum": ["huggingface", "pytorch"],
                "default": "huggingface",
            },
            "image_dropout": {
                "description": "dropout of A_I (attention and residual branches); the code's A_I is a ViTLayer of "
                               "google/vit-base-patch16-224's config: 0",
                "type": "number", "minimum": 0, "maximum": 1, "default": 0.0,
            },
            "text_dropout": {
                "description": "dropout of A_T (attention probabilities and residual branches); the code's A_T is a "
                               "BertLayer of bert-base-uncased's config: 0.1",
                "type": "number", "minimum": 0, "maximum": 1, "default": 0.1,
            },
            "text_tokens": {
                "description": "what A_T reads after [CLS]: words = MGCA's aggregate_tokens (the code's "
                               "BertEncoder): the word pieces of a word summed into one token, [SEP] kept, then "
                               "zero vectors up to the tokenized length; pieces = BERT's word pieces as they are",
                "enum": ["words", "pieces"],
                "default": "words",
            },
            "text_mask": {
                "description": "none = the code: A_T is called without an attention mask, so [CLS] and the words "
                               "also attend to the zero-padding (reports are then padded to max_length, as the "
                               "code's tokenizer does); padding = padding positions are masked out",
                "enum": ["none", "padding"],
                "default": "none",
            },
        },
    },
    "head": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "hidden": {"type": "integer", "minimum": 1, "default": 2048},
            "dim": {"type": "integer", "minimum": 1, "default": 128},
        },
    },
    "gloria": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "local_weight": {"type": "number", "minimum": 0, "default": 1.0},
            "gamma1": {"type": "number", "exclusiveMinimum": 0, "default": 4.0},
            "gamma2": {"type": "number", "exclusiveMinimum": 0, "default": 5.0},
            "gamma3": {"type": "number", "exclusiveMinimum": 0, "default": 10.0},
            "global_temperature": {
                "description": "temperature of GLoRIA's global image-text loss; GLoRIA's code multiplies the "
                               "cosine by temp3 = 10 (0.1); null = the family's temperature (0.07, FedDRA's "
                               "ConVIRT)",
                "oneOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
                "default": 0.1,
            },
            "aggregation": {
                "description": "word-to-report score Z: code = log sum_i exp(gamma2 R_i) (GLoRIA's code); paper"
                               " = the same divided by gamma2, as the GLoRIA paper writes it",
                "enum": ["code", "paper"],
                "default": "code",
            },
        },
    },
    "mgca": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "token_weight": {
                "type": "number",
                "minimum": 0,
                "default": 1.0,
                "description": "weight of L_word + L_patch (MGCA lambda_2)",
            },
            "proto_weight": {"type": "number", "minimum": 0, "default": 1.0, "description": "MGCA lambda_3"},
            "prototypes": {"type": "integer", "minimum": 2, "default": 500},
            "attention": {
                "description": "softmax = MGCA's code (use_local_atten off): parameter-free softmax(q k / "
                               "token_temperature) attention between the normalised word and patch embeddings; "
                               "multihead = its option of a learned one-head attention layer per direction",
                "enum": ["softmax", "multihead"],
                "default": "softmax",
            },
            "freeze_prototypes_steps": {
                "description": "the prototypes get no gradient (and no AdamW step) during the model's first "
                               "this many local steps. MGCA freezes them for its first epoch (1 of 50); "
                               "FedDRA's step-based local training has no epoch boundary, so the default is one"
                               " communication turn's 50 local batches",
                "type": "integer",
                "minimum": 0,
                "default": 50,
            },
            "token_temperature": {
                "type": "number",
                "exclusiveMinimum": 0,
                "default": 0.1,
                "description": "MGCA local_temperature (attention and token InfoNCE)",
            },
            "proto_temperature": {"type": "number", "exclusiveMinimum": 0, "default": 0.2},
            "sinkhorn_eps": {"type": "number", "exclusiveMinimum": 0, "default": 0.05},
            "sinkhorn_iterations": {"type": "integer", "minimum": 1, "default": 3},
        },
    },
    "retrieval": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "split": {
                "description": "the split of every client that the eval keys <client> report: test (the paper's "
                               "\"test splits of client datasets\"), or val, as the code's retrieval loader "
                               "(DataModule.val_dataloader, and the paper's appendix); the other split is reported "
                               "as <client>.val or <client>.test",
                "enum": ["test", "val"],
                "default": "test",
            },
            "pool": {
                "description": "Recall@k ranks each text against the images of its pool (\"batch\") of this many "
                               "pairs; the code's training batch is 72, its validation loader's 32",
                "type": "integer",
                "minimum": 2,
                "default": 72,
            },
            "pools": {
                "description": "shuffled = consecutive pairs of one fixed shuffle of the split (the same for every "
                               "method), so a pool rarely holds two images of one study; ordered = consecutive pairs "
                               "in the split's file order, as the code's unshuffled loader (a study's images and "
                               "their identical report stay together)",
                "enum": ["shuffled", "ordered"],
                "default": "shuffled",
            },
            "drop_last": {
                "description": "drop the last pool when it holds fewer than pool pairs (the code's loader: drop_last)",
                "type": "boolean",
                "default": False,
            },
            "direction": {
                "description": "t2i = texts retrieve images (the paper); both = mean of text->image and "
                               "image->text (the code's precision_at_k)",
                "enum": ["t2i", "both"],
                "default": "t2i",
            },
            "ties": {
                "description": "against = a candidate as similar as the pair ranks above it (a collapsed model "
                               "scores 0); index = ties are broken by position, the lower first, as a top-k "
                               "over the scores (the code's precision_at_k) returns them",
                "enum": ["against", "index"],
                "default": "against",
            },
        },
    },
}
