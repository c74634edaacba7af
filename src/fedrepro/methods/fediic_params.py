"""FedIIC's ``params`` schema (:mod:`.fediic`): what a configuration may say about it, defaults included; the configuration is
validated against it."""

FEDIIC_PARAMS = {
    "k1": {
        "type": "number",
        "minimum": 0,
        "default": 2.0,
        "description": "weight of the intra-client contrastive loss (0 = off)",
    },
    "k2": {
        "type": "number",
        "minimum": 0,
        "default": 2.0,
        "description": "weight of the inter-client prototype loss (0 = off)",
    },
    "dala": {
        "type": "boolean",
        "default": True,
        "description": "difficulty-aware logit adjustment (false = plain cross-entropy on view 1)",
    },
    "q": {
        "type": "number",
        "minimum": 0,
        "default": 0.25,
        "description": "difficulty exponent q (the code's --d; Table 3 studies d = 0)",
    },
    "t": {
        "type": "number",
        "minimum": 0,
        "default": 0.5,
        "description": "exponent of the class-prior temperature (p_i p_j)^t (Table 3 studies t = 0)",
    },
    "intra_tau": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 1.0,
        "description": "base temperature of L_intra. Default 1.0 = the authors' code, which stores tau = 0.1 "
                       "but never applies it (so the published numbers used tau' = max((p_i p_j)^t, 0.07)); 0.1"
                       " = the paper's reading tau' = (p_i p_j)^t * tau.",
    },
    "intra_tau_floor": {
        "type": "number",
        "minimum": 0,
        "default": 0.07,
        "description": "lower clamp of the pairwise temperature (code: 0.07; the paper has none: use 0)",
    },
    "inter_tau": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.1,
        "description": "temperature of L_inter (paper and code)",
    },
    "reduction": {
        "enum": ["mean", "sum"],
        "default": "mean",
        "description": "over anchors: mean (the code) or sum (eqs. 2-4 as printed)",
    },
    "orthogonalize": {
        "type": "boolean",
        "default": True,
        "description": "orthogonalise the prototypes (eq. 5); Table 3 studies false",
    },
    "orth_steps": {
        "type": "integer",
        "minimum": 0,
        "default": 1000,
        "description": "SGD steps of the orthogonalisation (code)",
    },
    "orth_lr": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.1,
        "description": "SGD learning rate of the orthogonalisation (code)",
    },
    "orth_zero_diagonal": {
        "type": "boolean",
        "default": True,
        "description": "true = the code: the max over j != i is taken with the diagonal set to 0 (so it stops "
                       "once every cosine is negative); false = max over j != i exactly (eq. 5).",
    },
    "difficulty_augment": {
        "enum": ["fixed", "fresh"],
        "default": "fixed",
        "description": "images the per-class losses are measured on: fixed = the same augmented first view "
                       "every round (the code augments once at start-up); fresh = a new augmentation every "
                       "round.",
    },
    "dala_eps": {
        "type": "number",
        "minimum": 0,
        "default": 1e-05,
        "description": "added to l^q in the margin and to the class counts (code)",
    },
}
