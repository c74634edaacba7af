# One federated training job per (protocol, paper, setting, method, seed).


rule train:
    """Run the rounds; checkpoint every round (a killed job resumes); write metrics and provenance."""
    input:
        unpack(train_inputs),
    output:
        metrics=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "metrics.json"),
        history=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "history.csv"),
        predictions=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "predictions.npz"),
        manifest=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "run_manifest.json"),
        model=paths.model_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}")),
    params:
        run=lambda wc: json.dumps(run_config(wc), sort_keys=True),
        config_hash=lambda wc: run_config(wc)["config_hash"],
        checkpoint_dir=lambda wc: paths.checkpoint_dir(run_key(wc)),
    group:
        train_group
    threads: lambda wc: 1 if on_features(wc) else 8   # image runs: one CPU trains, the rest decode and augment
    resources:
        gpu=lambda wc: 0 if on_features(wc) else 1,
        mem_mb=lambda wc, attempt: attempt * (4000 if on_features(wc) else 32000),
        runtime=lambda wc, attempt: attempt * (15 if on_features(wc) else 720),
    log:
        paths.log("train", "{protocol}/{paper}/{setting}/{method}/seed{seed}"),
    conda:
        ENV
    shell:
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 FEDREPRO_CPUS={threads}; "
        "fedrepro train --run {params.run:q} --out $(dirname {output.metrics}) "
        "--checkpoint-dir {params.checkpoint_dir} 2> {log}"
