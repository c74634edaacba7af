"""FedDRA's ``params`` schema (:mod:`.feddra`): the constraint, the distributionally robust weights and the
authors' code's choices, defaults included; the configuration is validated against it."""

FEDDRA_PARAMS = {
    "constraint_weight": {
        "description": "lambda_c, the constraint degree. Default 5 = the paper's main setting (appendix Table "
                       "9: the row 5 equals the main results); the official code's --lambda_2 defaults to 1.",
        "type": "number",
        "minimum": 0,
        "default": 5.0,
    },
    "constraint_distance": {
        "description": "mse = mean over batch and dimensions of (u - u_bar)^2 (+ same for w), as the code's "
                       "F.mse_loss; sq_l2 = the paper's ||u - u_bar||^2, summed over dimensions, mean over the "
                       "batch.",
        "enum": ["mse", "sq_l2"],
        "default": "mse",
    },
    "constraint_space": {
        "description": "normalized = u, w, u_bar, w_bar are L2-normalised before the distance, as the authors' "
                       "code does (embeddings on the unit sphere); raw = the heads' outputs as they are (they "
                       "end in a non-affine BatchNorm, so ||u||^2 is about the embedding dimension and the "
                       "constraint ~128x stronger).",
        "enum": ["normalized", "raw"],
        "default": "normalized",
    },
    "anchor": {
        "description": "Which model gives u_bar, w_bar. code = the official code's separate global_* modules: "
                       "built on their own (independent random alignment blocks and heads), alignment blocks "
                       "and heads set to the aggregate after each stage-1 round, everything but the alignment "
                       "blocks after each stage-2 round (so stage 1 is anchored to the previous turn's stage-1 "
                       "alignment blocks); received = the paper's reading, the global model the client "
                       "received.",
        "enum": ["code", "received"],
        "default": "code",
    },
    "anchor_mode": {
        "description": "Mode of the frozen global (anchor) model when it embeds the batch. train = like the "
                       "code, whose anchors are submodules of the training Lightning module (BatchNorm on batch"
                       " statistics, BERT dropout active); eval = running statistics, no dropout.",
        "enum": ["train", "eval"],
        "default": "train",
    },
    "two_stage": {
        "description": "false = every round trains everything (ablation \"w/o two-stage\").",
        "type": "boolean",
        "default": True,
    },
    "schedule": {
        "description": "alternate = the official code: every communication turn is a stage-1 round (aggregated)"
                       " followed by a stage-2 round (aggregated), so train.rounds counts stage rounds (25 "
                       "turns = 50 rounds); staged = one reading of the paper: the first stage1_rounds rounds "
                       "are stage 1, the rest stage 2.",
        "enum": ["alternate", "staged"],
        "default": "alternate",
    },
    "stage1_rounds": {
        "type": "integer",
        "minimum": 0,
        "default": 0,
        "description": "staged schedule: rounds of stage 1",
        "x-counts": "rounds",
    },
    "stage1_steps": {
        "description": "Local steps of a stage-1 round (code max_steps=20); null = train.local.",
        "x-counts": "steps",
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
        "default": None,
    },
    "stage2_start": {
        "description": "Where a client's stage-2 round starts. own = its own model at the end of its stage-1 round, "
                       "as the official code (FedAvg_SLIA_HC.py: the stage-1 aggregate only goes into the anchor's "
                       "global_* alignment blocks and heads; the server then sends only those); aggregate = the "
                       "stage-1 aggregate the server broadcasts.",
        "enum": ["own", "aggregate"],
        "default": "own",
    },
    "stage2_steps": {
        "description": "Local steps of a stage-2 round (code max_steps=50, paper \"50 batches per turn\"); null ="
                       " train.local.",
        "x-counts": "steps",
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
        "default": None,
    },
    "dro": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "enabled": {
                "type": "boolean",
                "default": True,
                "description": "false = ablation 'w/o DRO weighting' (uniform, fixed lambda)",
            },
            "radius": {
                "description": "rho of the chi-square ball (1/(2K)) sum_k (K lambda_k - 1)^2 <= rho. Default "
                               "0.1 = the paper's main setting (appendix Table 8); the code uses 1.",
                "type": "number",
                "minimum": 0,
                "default": 0.1,
            },
            "step_size": {
                "description": "eta_lambda of the mirror ascent lambda_k <- lambda_k exp(eta R_k) / Z; the code"
                               " uses gamma * step_per_com = 0.01 * 50 = 0.5.",
                "type": "number",
                "minimum": 0,
                "default": 0.5,
            },
            "apply": {
                "description": "How lambda acts on training. step_size (default) = client k's learning rate is "
                               "scaled by K lambda_k, the paper's update theta_k <- theta_k - eta lambda_k grad"
                               " R_k, which also changes Adam's steps; loss_scale = the official code: client "
                               "k's loss is multiplied by lambda_k, which Adam's scale invariance almost "
                               "cancels; aggregation_weight = the server averages the client models with "
                               "weights lambda.",
                "enum": ["step_size", "loss_scale", "aggregation_weight"],
                "default": "step_size",
            },
            "carry_over": {
                "description": "true = lambda carries over from turn to turn (the paper's update); false = the "
                               "released code: client_ratio_list is a plain attribute of the server module, not "
                               "saved with its state dict, and every turn runs in a new process that rebuilds the "
                               "server, so every turn trains with lambda = 1/K and the mirror step starts from "
                               "uniform (the lambda it computes is logged and saved, never used).",
                "type": "boolean",
                "default": True,
            },
            "risk_fraction": {
                "description": "R_k is scored on a fixed random subset (this fraction, floored) of client k's "
                               "training split with the evaluation transform (code 10%).",
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 1,
                "default": 0.1,
            },
            "risk": {
                "description": "code = the code's test loss of the aggregated model, mean over batches of "
                               "InfoNCE + L_con against the anchor (evaluation mode); contrastive = the InfoNCE"
                               " term alone.",
                "enum": ["code", "contrastive"],
                "default": "code",
            },
            "risk_max_batches": {
                "description": "at most this many batches of the subset are scored; null = all of them (code)",
                "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "default": None,
            },
        },
    },
}
