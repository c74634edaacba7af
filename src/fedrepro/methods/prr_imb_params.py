"""PRR-Imb's ``params`` schema (:mod:`.prr_imb`): what a configuration may say about it, defaults included; the configuration is
validated against it."""

PRR_IMB_PARAMS = {
    "band_start": {
        "type": "number",
        "minimum": 0,
        "maximum": 0.95,
        "default": 0.7,
        "description": "PFA low-frequency band at round 0; grows linearly to 0.95 (code l_rate)",
    },
    "alpha1": {
        "type": "number",
        "minimum": 0,
        "default": 0.7,
        "description": "DET recover -> exchange threshold on the F1 ratio (code)",
    },
    "alpha2": {
        "type": "number",
        "minimum": 0,
        "default": 0.9,
        "description": "DET exchange -> sublimate threshold (code)",
    },
    "beta": {
        "type": "number",
        "minimum": 0,
        "default": 0.8,
        "description": "CPA mitigation exponent (code loss_beta)",
    },
    "init_rounds": {
        "type": "integer",
        "minimum": 0,
        "default": 15,
        "description": "rounds of the plain CPA loss before the prototype factor (code init_iter)",
        "x-counts": "rounds",
    },
    "tau": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 3.0,
        "description": "CPA prototype factor (1 + tau)/(cos + tau) (code)",
    },
    "global_prototype": {
        "enum": ["gaussian", "mean"],
        "default": "gaussian",
        "description": "global prototypes: a draw from N(mean, max(std, 1)) over clients (code default) or the "
                       "mean",
    },
    "prototypes": {
        "enum": ["reset", "carry"],
        "default": "reset",
        "description": "local prototypes of the CPA factor: reset = every round starts from 1-vectors as the "
                       "code (learned prototypes only reach later local epochs of the same round, so with one "
                       "local epoch the factor compares ones with the round's global draw); carry = the "
                       "previous round's learned prototypes and their global combination.",
    },
    "reset_stage": {
        "type": "boolean",
        "default": True,
        "description": "with more than one local epoch: restart DET at 'recover' every round (code) or keep "
                       "each client's stage across rounds; with one local epoch both models learn from each "
                       "other every round (the code's wk_iters < 2 branch)",
    },
    "evaluate": {
        "enum": ["global", "personalized"],
        "default": "global",
        "description": "global = the size-weighted average of the uploaded models (what FedIIC evaluates); "
                       "personalized = each client's own model",
    },
}
