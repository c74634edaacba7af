"""FedAdapterProto's ``params`` schema (:mod:`.fedadapterproto`): what a configuration may say about it, defaults included; the configuration is
validated against it."""

FEDADAPTERPROTO_PARAMS = {
    "lambda_clst": {
        "type": "number",
        "minimum": 0,
        "default": 0.8,
        "description": "weight of the cluster cost (code 0.8; paper: no value)",
    },
    "lambda_sep": {
        "type": "number",
        "minimum": 0,
        "default": 0.08,
        "description": "weight of the separation cost (code 0.08; subtracted)",
    },
    "gamma_l1": {
        "type": "number",
        "minimum": 0,
        "default": 0.0001,
        "description": "L1 on the wrong-class prototype->class weights (code 1e-4)",
    },
    "beta_adapter": {
        "type": "number",
        "minimum": 0,
        "default": 1e-05,
        "description": "adapter norm penalty beta (code 1e-5)",
    },
    "adapter_norm": {
        "description": "l2 = beta * sum over adapter tensors of ||p||_2 (official code, default); squared_l2 = "
                       "beta * ||alpha||_2^2 (paper text)",
        "enum": ["l2", "squared_l2"],
        "default": "l2",
    },
    "mu_adapter": {
        "type": "number",
        "minimum": 0,
        "default": 0.01,
        "description": "mu_1: proximal weight towards the global adapters (code --prox 0.01; 0 = FedAdapter "
                       "without the proximal term)",
    },
    "mu_head": {
        "type": "number",
        "minimum": 0,
        "default": 0.01,
        "description": "mu_2: proximal weight towards the global prototype layer (or linear head) (code --prox "
                       "0.01)",
    },
    "client_start": {
        "description": "local = every client starts from its own separately built model and then resumes from "
                       "its own adapters and head, the aggregate only anchors the proximal terms (official "
                       "code, default: it never loads the aggregate into the clients); global = the clients "
                       "load the server's adapters and head at the start of every round, the first included "
                       "(paper text).",
        "enum": ["local", "global"],
        "default": "local",
    },
    "adapter_weights": {
        "description": "Aggregation weights of the adapters: steps_x_size = local steps x client size (the "
                       "code's --adapt_agg fednova_weighted_agg of run.sh, default; not FedNova's normalised "
                       "averaging); train_size = |D_i|/|D| (paper text); steps (the code's fednova_agg); "
                       "uniform (simple_agg).",
        "enum": ["uniform", "train_size", "steps", "steps_x_size"],
        "default": "steps_x_size",
    },
    "head_weights": {
        "description": "Aggregation weights of the prototype layer / head: uniform (code's param_aggregation, "
                       "default) or train_size (paper text)",
        "enum": ["uniform", "train_size", "steps", "steps_x_size"],
        "default": "uniform",
    },
    "push": {
        "description": "last_round = after the last round a copy of every client's model has its prototypes "
                       "projected onto the nearest latent patch of the client's training images of the "
                       "prototype's class (ProtoPNet's push), for the prototype figures only; the evaluated "
                       "models stay unpushed, as the official code evaluates without any push. none = no copy.",
        "enum": ["none", "last_round"],
        "default": "last_round",
    },
}
