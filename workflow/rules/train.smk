# One federated training job per (protocol, paper, setting, method, seed).


rule train:
    """Run the rounds; checkpoint every round (a killed job resumes); write metrics and provenance."""
    input:
        unpack(lambda wc: by_content(JOBS.train_inputs(wc))),
    output:
        metrics=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "metrics.json"),
        history=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "history.csv"),
        predictions=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "predictions.npz"),
        manifest=paths.run_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}"), "run_manifest.json"),
        model=paths.model_file(RunKey("{paper}", "{protocol}", "{setting}", "{method}", "{seed}")),
    params:
        run=lambda wc: json.dumps(JOBS.run_config(wc), sort_keys=True),
        config_hash=lambda wc: JOBS.run_config(wc)["config_hash"],
        checkpoint_dir=lambda wc: paths.checkpoint_dir(JOBS.run_key(wc)),
    group:
        train_group
    threads: JOBS.train_threads   # image runs: one CPU trains, the rest decode
    resources:
        gpu=lambda wc: 0 if JOBS.on_features(wc) else 1,
        # host memory from the run's own estimate (fedrepro.cost.memory; `fedrepro estimate <paper> <setting>
        # <method>` prints its parts), x the attempt: a job killed for memory gets more on its retry
        mem_mb=lambda wc, attempt: attempt * JOBS.requests.run_resources(wc)["mem_mb"],
        # GPU memory the run needs (MiB): not a SLURM request by itself; map it to a constraint or GPU model
        # in the profile if your cluster mixes GPU sizes (workflow/profiles/slurm/config.yaml, EDIT 3). From the
        # estimate, or the measured peak of its family x a margin where benchmarks/gpu/ has the profile's GPU
        gpu_mem_mb=lambda wc: JOBS.requests.run_resources(wc)["gpu_mem_mb"],
        # minutes: the measured rates of the profile's GPU x a margin (fedrepro.cost.runtime); without a table, 720 for
        # image runs and 15 for runs on cached features (unmeasured guesses)
        runtime=lambda wc, attempt: attempt * JOBS.requests.run_resources(wc)["runtime"],
    log:
        paths.log("train", "{protocol}/{paper}/{setting}/{method}/seed{seed}"),
    conda:
        ENV
    shell:
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 FEDREPRO_CPUS={threads}; "
        "fedrepro --log {log} train --run {params.run:q} --out $(dirname {output.metrics}) "
        "--checkpoint-dir {params.checkpoint_dir}"
