# Downstream evaluations of pre-trained checkpoints (FedDRA: few-shot linear probes, U-Net segmentation).
# One job = one pre-training run x one task; a table cell with `task:` reads its result.


rule downstream:
    """Load a pre-trained checkpoint, freeze its image encoder, train the task's head on a fraction
    of the downstream training split, and score it on the test split."""
    input:
        unpack(lambda wc: ancient_model(by_content(JOBS.downstream_inputs(wc)))),
    output:
        result=paths.downstream(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "{task}"),
    params:
        job=lambda wc: json.dumps(JOBS.downstream_job(wc), sort_keys=True),
        config_hash=lambda wc: JOBS.downstream_job(wc)["config_hash"],
    resources:
        gpu=1,
        # the pre-trained encoder's pass over the downstream images at the measured rate, never below 60 minutes
        # (the heads and decoders it trains are not measured; fedrepro.cost)
        runtime=lambda wc, attempt: attempt * JOBS.requests.downstream_request(wc).runtime,
        gpu_mem_mb=lambda wc: JOBS.requests.downstream_request(wc).gpu_mem_mb,
    log:
        paths.log("downstream", "{protocol}/{paper}/{setting}/{method}/seed{seed}/{task}"),
    conda:
        ENV
    shell:
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8; "
        "fedrepro --log {log} downstream --job {params.job:q} --out {output.result}"
